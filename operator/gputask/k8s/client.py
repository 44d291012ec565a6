"""The one narrow I/O boundary to the Kubernetes API (STYLE: httpx-like shape).

:class:`KubeApi` is the interface (plain dicts in and out); :class:`KubeClient` implements it
on the well-kept ``kubernetes`` client's generic ``call_api`` (no model classes) and runs each
call on a thread pool of its own, so the asyncio loop never blocks and the Lease's client
(a second instance) never waits behind scheduling writes. :class:`gputask.testing.FakeKubeClient`
is the in-process fake of the same interface.

Errors::

    ApiError                 an API call failed (``status``: HTTP code, 0 = unreachable)
    ├── NotFound             404
    ├── AlreadyExists        409 on create: an object of that name exists
    ├── Conflict             409 on update: the resourceVersion was stale
    └── Fenced               not sent: the guard (leadership) said no just before sending

Writes carry ``fieldManager`` (``gputask-operator``, ``gputask-agent``) and the client sends a
User-Agent of the same name, so managedFields name the writer instead of ``OpenAPI-Generator``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from gputask import __version__

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 30.0  # a request unanswered this long fails (ApiError 0 Unreachable) instead of holding a thread


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


class Fenced(ApiError):
    """A write not sent because its guard (this replica's leadership) was gone just before sending."""

    def __init__(self, message: str = "this replica does not hold the leader Lease") -> None:
        super().__init__(0, "NotLeader", message)


Guard = Callable[[], bool]
"""Asked in the worker thread right before a request is sent; False abandons it (:class:`Fenced`)."""


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
GPULOCALQUEUES = Resource("gputask.io", "v1alpha1", "gpulocalqueues")
GPURESOURCEFLAVORS = Resource("gputask.io", "v1alpha1", "gpuresourceflavors", namespaced=False)
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
RUNTIMECLASSES = Resource("node.k8s.io", "v1", "runtimeclasses", namespaced=False)
# Dynamic Resource Allocation: written at ``v1`` here; :func:`at_version` gives v1beta1 (Kubernetes 1.32 and 1.33).
DEVICECLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
RESOURCECLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims")
RESOURCECLAIMTEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates")


def at_version(res: Resource, version: str) -> Resource:
    """The same resource at another version of its group."""
    return Resource(res.group, version, res.plural, res.namespaced)


def load_api_client(
    kubeconfig: str | None = None,
    *,
    user_agent: str = "gputask-operator",
    pool_size: int = 16,
    context: str | None = None,
    retries: int | None = None,
) -> k8s_client.ApiClient:
    """An ApiClient from ``kubeconfig``, else the in-cluster config, else ~/.kube/config (``$KUBECONFIG``).

    ``context`` names a kubeconfig context (default: its current-context; given, the in-cluster config is
    not tried). ``pool_size`` bounds the HTTP connections kept per host (size it like the thread pool);
    ``retries`` the attempts urllib3 repeats a failed connection (None: its default, 3).
    Raises ``kubernetes.config.ConfigException`` for a missing file or context.
    """
    configuration = k8s_client.Configuration()
    if kubeconfig:
        if not os.path.isfile(os.path.expanduser(kubeconfig)):
            raise k8s_config.ConfigException(f"kubeconfig {kubeconfig}: no such file")
        k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    elif context:
        k8s_config.load_kube_config(context=context, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    if retries is not None:
        configuration.retries = retries
    api = k8s_client.ApiClient(configuration)
    api.user_agent = f"{user_agent}/{__version__}"
    return api


class KubeApi(Protocol):
    """The verbs the operator and the agent use; every method raises :class:`ApiError` on failure.

    ``guard`` (writes only) is asked right before the request is sent; False raises :class:`Fenced`.
    """

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """GET one object."""
        ...

    async def list(
        self, res: Resource, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> list[dict[str, Any]]:
        """LIST objects, optionally by label and field selector."""
        ...

    async def create(
        self, res: Resource, body: Mapping[str, Any], namespace: str | None = None, *, guard: Guard | None = None
    ) -> dict[str, Any]:
        """POST a new object; AlreadyExists on 409."""
        ...

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
        guard: Guard | None = None,
    ) -> dict[str, Any]:
        """JSON merge-patch an object or its /status; Conflict on a stale resourceVersion."""
        ...

    async def replace(
        self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None, *,
        guard: Guard | None = None,
    ) -> dict[str, Any]:
        """PUT a whole object; Conflict on a stale resourceVersion."""
        ...

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, *, propagation: str = "Background",
        guard: Guard | None = None,
    ) -> bool:
        """DELETE an object; False when it did not exist."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...


class KubeClient:
    """:class:`KubeApi` over a ``kubernetes`` ApiClient, on a thread pool of ``workers`` threads."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        workers: int = 16,
        field_manager: str = "gputask-operator",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._api = api
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=field_manager)
        self.field_manager = field_manager
        self.timeout_s = timeout_s  # per request, in all: a server that hangs costs a thread this long, no more

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        guard: Guard | None = None,
    ) -> dict[str, Any]:
        params = dict(query or {})
        if method in ("POST", "PUT", "PATCH"):
            params["fieldManager"] = self.field_manager

        def call() -> tuple[int, bytes, str]:
            if guard is not None and not guard():
                raise Fenced()
            verb, url, headers, payload, post = self._api.param_serialize(
                method,
                path,
                query_params=list(params.items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(
                verb, url, header_params=headers, body=payload, post_params=post, _request_timeout=self.timeout_s
            )
            response.read()
            return response.status, response.data or b"", response.reason or ""

        try:
            status, data, reason = await asyncio.get_running_loop().run_in_executor(self._pool, call)
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

    async def create(
        self, res: Resource, body: Mapping[str, Any], namespace: str | None = None, *, guard: Guard | None = None
    ) -> dict[str, Any]:
        """POST a new object; AlreadyExists on 409."""
        return await self._call("POST", res.path(namespace), body=dict(body), guard=guard)

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
        guard: Guard | None = None,
    ) -> dict[str, Any]:
        """JSON merge-patch an object (or its /status); Conflict when a given resourceVersion is stale."""
        path = res.path(namespace, name, "status" if status else None)
        return await self._call("PATCH", path, body=dict(patch), content_type=MERGE_PATCH, guard=guard)

    async def replace(
        self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None, *,
        guard: Guard | None = None,
    ) -> dict[str, Any]:
        """PUT a whole object; Conflict when its metadata.resourceVersion is stale."""
        return await self._call("PUT", res.path(namespace, name), body=dict(body), guard=guard)

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, *, propagation: str = "Background",
        guard: Guard | None = None,
    ) -> bool:
        """DELETE an object with the given propagation policy; False when it did not exist."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            await self._call("DELETE", res.path(namespace, name), body=body, guard=guard)
        except NotFound:
            return False
        return True

    async def close(self) -> None:
        """Release the connection pool and the threads."""
        await asyncio.to_thread(self._api.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


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
