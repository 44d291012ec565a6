"""The one writer: every API write of the operator goes through :class:`Writer`.

Each write is fenced by leadership twice: before it is started, and again in the client's worker
thread right before the request is sent (the ``guard``), so a replica that lost the Lease while a
write waited for a thread abandons it (:class:`~gputask.k8s.client.Fenced`) instead of finishing
it under an old leadership (client-go's rule; issue "nothing lost, nothing double-booked").
Failed writes are counted in ``gputask_api_errors_total``; the caller decides what a failure
means. Reads go to the client directly: they need no fence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gputask.k8s.client import EVENTS, ApiError, Fenced, KubeApi, Resource
from gputask.k8s.timestamps import now_rfc3339 as now_rfc3339  # re-exported: its home before timestamps.py
from gputask.metrics import OperatorMetrics

COMPONENT = "gputask-operator"


def eviction_of(pod: str) -> Resource:
    """The eviction subresource of ``pod``, as a resource one POSTs to (``/api/v1/namespaces/NS/pods/POD/eviction``);
    RBAC: ``pods/eviction`` create (:mod:`gputask.k8s.rbac`)."""
    return Resource("", "v1", f"pods/{pod}/eviction")
EVENT_MESSAGE_LIMIT = 1024


class Writer:
    """Creates, patches, replaces and deletes objects and posts Events, while ``leading()`` holds."""

    def __init__(
        self, client: KubeApi, metrics: OperatorMetrics | None = None, *, leading: Callable[[], bool] = lambda: True
    ) -> None:
        self.client = client
        self.metrics = metrics or OperatorMetrics()
        self.leading = leading

    def _guard(self) -> bool:
        return self.leading()

    def _check(self) -> None:
        if not self.leading():
            raise Fenced()

    def failed(self, exc: ApiError) -> None:
        """Count a failed write (not a fenced one: that is no API error)."""
        if not isinstance(exc, Fenced):
            self.metrics.api_errors.inc()

    async def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create an object; raises ApiError (AlreadyExists on 409, Fenced when not leading)."""
        self._check()
        try:
            return await self.client.create(res, body, namespace, guard=self._guard)
        except ApiError as exc:
            self.failed(exc)
            raise

    async def patch(
        self, res: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None, *, status: bool = False
    ) -> dict[str, Any]:
        """Merge-patch an object or its status; raises ApiError (Conflict on a stale resourceVersion)."""
        self._check()
        try:
            return await self.client.patch(res, name, patch, namespace, status=status, guard=self._guard)
        except ApiError as exc:
            self.failed(exc)
            raise

    async def replace(
        self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Replace a whole object; raises ApiError."""
        self._check()
        try:
            return await self.client.replace(res, name, body, namespace, guard=self._guard)
        except ApiError as exc:
            self.failed(exc)
            raise

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, *, propagation: str = "Background"
    ) -> bool:
        """Delete an object; False when it was already gone; raises ApiError."""
        self._check()
        try:
            return await self.client.delete(res, name, namespace, propagation=propagation, guard=self._guard)
        except ApiError as exc:
            self.failed(exc)
            raise

    async def evict(self, pod: str, namespace: str, *, dry_run: bool = False) -> None:
        """Ask the Eviction API to evict ``pod`` (POST pods/{name}/eviction, a policy/v1 Eviction), with
        ``dry_run`` only asked (``deleteOptions.dryRun: [All]``: every check made, the budget included, nothing
        deleted). Raises ApiError: 429 TooManyRequests when a PodDisruptionBudget refuses it (its ``causes`` name
        the budget), NotFound when the pod is gone."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": pod, "namespace": namespace}}
        if dry_run:
            body["deleteOptions"] = {"dryRun": ["All"]}
        await self.create(eviction_of(pod), body, namespace)

    async def event(self, involved: Mapping[str, Any], etype: str, reason: str, message: str) -> bool:
        """Post a core/v1 Event about ``involved`` (apiVersion, kind, name, namespace, uid); False when it failed.

        An Event is a report, never a reason to retry: failures are counted and logged by the caller's
        metrics only.
        """
        namespace = involved.get("namespace") or "default"
        stamp = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "type": etype,
            "reason": reason,
            "message": message[:EVENT_MESSAGE_LIMIT],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.create(EVENTS, body, namespace)
        except ApiError:
            return False
        return True
