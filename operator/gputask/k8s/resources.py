"""The API's vocabulary, without I/O: the resources gputask reads and writes, a whole LIST, and the errors an API
call raises (:mod:`gputask.k8s.client` re-exports them all; records, reports and the workload interface import
them from here, so they import no client).

Errors::

    ApiError                 an API call failed (``status``: HTTP code, 0 = unreachable; ``retry_after_s``, ``causes``)
    ├── NotFound             404
    ├── Expired              410: a watch's resourceVersion is older than the server keeps (list again)
    ├── AlreadyExists        409 on create: an object of that name exists
    ├── Conflict             409 on update: the resourceVersion was stale
    ├── Unanswered           sent, but its answer was lost (connection reset, server disconnected, timeout, a 5xx
    │                        that is no Status, a 504 Timeout): a write may have been served, so its caller finds
    │                        out (a GET) before it believes either outcome
    └── Fenced               not sent: the guard (leadership) said no just before sending
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """An API call failed; ``status`` is the HTTP code (0 when the server was unreachable), ``reason`` the Status
    reason (``NotFound``, ``Invalid``, ``TooManyRequests``, ...), ``message`` what the server said;
    ``retry_after_s`` the seconds the server asked to wait (``Retry-After``, else ``details.retryAfterSeconds``;
    None when it said nothing), ``causes`` the Status's ``details.causes`` (field errors of a 422: each a dict with
    ``reason``, ``message``, ``field``)."""

    def __init__(
        self, status: int, reason: str, message: str = "", *, retry_after_s: float | None = None,
        causes: tuple[dict[str, Any], ...] = (),
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message
        self.retry_after_s, self.causes = retry_after_s, causes


class NotFound(ApiError):
    """404: the object does not exist."""


class AlreadyExists(ApiError):
    """409 on create: an object of that name exists."""


class Conflict(ApiError):
    """409 on update: the resourceVersion was stale."""


class Expired(ApiError):
    """410 Gone / Expired: a watch (or a LIST's continue token) asked for a resourceVersion older than the
    server's event window; only a new LIST can say what changed since."""


class Unanswered(ApiError):
    """A request that was sent but whose answer was lost (``status`` 0: connection reset, server disconnected,
    timeout; or a 5xx whose body is no Kubernetes Status, from a proxy or a dying server): the server may have
    served it. A write failing so is neither done nor refused until a read says which (the issue "nothing lost
    when the API server drops an answer")."""


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


@dataclass(frozen=True, slots=True)
class Listed:
    """A whole LIST (every page): the objects, and the collection's resourceVersion at that moment, from which a
    watch sees every later change."""

    items: list[dict[str, Any]]
    resource_version: str


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
SERVICES = Resource("", "v1", "services")
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


def doubling_backoff_s(failures: int, base_s: float, max_s: float) -> float:
    """Seconds to wait after the ``failures``-th failure in a row: ``base_s`` doubling with each, at most ``max_s``
    (the one backoff of the operator's retries: connections, watches, status writes, Job creates and deletes,
    relabels)."""
    return float(min(max_s, base_s * 2.0 ** max(0, failures - 1)))
