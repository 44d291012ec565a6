"""The one narrow I/O boundary to the Kubernetes API (STYLE: httpx-like shape).

:class:`KubeClient` wraps the well-kept ``kubernetes`` client's generic ``call_api`` (plain
dicts in and out, no model classes) and runs each call in a worker thread so the asyncio
loop never blocks. Errors are :class:`ApiError` with the HTTP status; a create that answers
409 is :class:`AlreadyExists`, a stale resourceVersion is :class:`Conflict`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """An API call failed; ``status`` is the HTTP code (0 when the server was unreachable)."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class NotFound(ApiError):
    """404: the object does not exist."""


class AlreadyExists(ApiError):
    """409 on create: an object of that name exists."""


class Conflict(ApiError):
    """409 on update: the resourceVersion was stale."""


@dataclass(frozen=True, slots=True)
class Resource:
    """An API resource: group ('' for core), version, plural, and whether it is namespaced."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        """The URL path of the collection, an object, or its subresource."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


GPUTASKS = Resource("gputask.io", "v1alpha1", "gputasks")
GPUCLUSTERQUEUES = Resource("gputask.io", "v1alpha1", "gpuclusterqueues", namespaced=False)
GPUNODES = Resource("gputask.io", "v1alpha1", "gpunodes", namespaced=False)
JOBS = Resource("batch", "v1", "jobs")
EVENTS = Resource("", "v1", "events")
NODES = Resource("", "v1", "nodes", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
PRIORITYCLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)
LEASES = Resource("coordination.k8s.io", "v1", "leases")
WORKLOADPRIORITYCLASSES = Resource("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", namespaced=False)
PODS = Resource("", "v1", "pods")
CONFIGMAPS = Resource("", "v1", "configmaps")
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads")
LOCALQUEUES = Resource("kueue.x-k8s.io", "v1beta2", "localqueues")
ADMISSIONCHECKS = Resource("kueue.x-k8s.io", "v1beta2", "admissionchecks", namespaced=False)


def load_api_client(kubeconfig: str | None = None) -> k8s_client.ApiClient:
    """An ApiClient from ``kubeconfig``, else the in-cluster config, else ~/.kube/config."""
    configuration = k8s_client.Configuration()
    if kubeconfig:
        if not os.path.isfile(os.path.expanduser(kubeconfig)):
            raise k8s_config.ConfigException(f"kubeconfig {kubeconfig}: no such file")
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    return k8s_client.ApiClient(configuration)


class KubeClient:
    """Async CRUD on plain dicts. Every method raises ApiError (or a subclass) on failure."""

    def __init__(self, api: k8s_client.ApiClient) -> None:
        self._api = api

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        def call() -> tuple[int, bytes, str]:
            verb, url, headers, payload, post = self._api.param_serialize(
                method,
                path,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(verb, url, header_params=headers, body=payload, post_params=post)
            response.read()
            return response.status, response.data or b"", response.reason or ""

        try:
            status, data, reason = await asyncio.to_thread(call)
        except ApiException as exc:
            raise _error(int(exc.status or 0), exc.reason or "", exc.body, method) from None
        except OSError as exc:  # connection refused, DNS: the server is unreachable
            raise ApiError(0, "Unreachable", str(exc)) from None
        except Exception as exc:  # urllib3 wraps connection failures in its own types
            if type(exc).__module__.startswith("urllib3"):
                raise ApiError(0, "Unreachable", str(exc)) from None
            raise
        if status >= 400:
            raise _error(status, reason, data, method)
        try:
            result = json.loads(data) if data else {}
        except ValueError:
            result = {}
        return result if isinstance(result, dict) else {}

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """GET one object."""
        return await self._call("GET", res.path(namespace, name))

    async def list(
        self, res: Resource, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> list[dict[str, Any]]:
        """LIST objects (all namespaces when ``namespace`` is None), optionally by label and field selector."""
        query = {"labelSelector": labels} if labels else {}
        if fields:
            query["fieldSelector"] = fields
        result = await self._call("GET", res.path(namespace), query=query or None)
        return list(result.get("items") or [])

    async def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """POST a new object; AlreadyExists on 409."""
        return await self._call("POST", res.path(namespace), body=dict(body))

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        """JSON merge-patch an object (or its /status); Conflict when a given resourceVersion is stale."""
        path = res.path(namespace, name, "status" if status else None)
        return await self._call("PATCH", path, body=dict(patch), content_type=MERGE_PATCH)

    async def replace(
        self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """PUT a whole object; Conflict when its metadata.resourceVersion is stale."""
        return await self._call("PUT", res.path(namespace, name), body=dict(body))

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, *, propagation: str = "Background"
    ) -> bool:
        """DELETE an object with the given propagation policy; False when it did not exist."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            await self._call("DELETE", res.path(namespace, name), body=body)
        except NotFound:
            return False
        return True

    async def close(self) -> None:
        """Release the connection pool."""
        await asyncio.to_thread(self._api.close)


def _error(status: int, http_reason: str, body: Any, method: str) -> ApiError:
    try:
        detail = json.loads(body or "{}")
    except (TypeError, ValueError):
        detail = {}
    if not isinstance(detail, dict):
        detail = {}
    reason = str(detail.get("reason") or http_reason)
    message = str(detail.get("message") or (body.decode(errors="replace") if isinstance(body, bytes) else body) or "")
    if status == 404:
        return NotFound(status, reason, message)
    if status == 409:
        cls = AlreadyExists if method == "POST" or reason == "AlreadyExists" else Conflict
        return cls(status, reason, message)
    return ApiError(status, reason, message)
