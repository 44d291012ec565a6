"""An in-process fake of :class:`gputask.k8s.client.KubeApi`, for unit tests of the adapter.

:class:`FakeKubeClient` keeps objects as the API server would (uid, resourceVersion, generation,
creationTimestamp, ``generateName``, an isolated ``/status``, 409 on a stale resourceVersion or
a name taken, 404 with the server's message) and records every call. Refusals are injected with
:meth:`FakeKubeClient.fail` (``served=True``: the call is carried out and its answer lost, raising
:class:`~gputask.k8s.client.Unanswered`, as when the API server dies after committing a write), worded
as the API server words them (``jobs.batch "x" is forbidden: ...``). Watches replay a bounded history
of changes from a resourceVersion (410 Expired when it is older than what is kept:
:meth:`FakeKubeClient.compact`). No HTTP, no controllers: a test feeds the
operator's handlers itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import itertools
import uuid
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gputask.k8s.client import (
    PODS,
    WATCH_TIMEOUT_S,
    AlreadyExists,
    ApiError,
    Conflict,
    Expired,
    Fenced,
    Guard,
    Listed,
    NotFound,
    Resource,
    Unanswered,
)
from gputask.testing._patches import merge_patch

Key = tuple[str, str, str | None, str]  # group, plural, namespace, name
NO_STATUS = frozenset({"events", "configmaps", "leases", "priorityclasses", "workloadpriorityclasses", "secrets"})
REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass
class Failure:
    """An injected refusal: the next ``times`` calls of ``verb`` on matching objects raise it."""

    verb: str
    plural: str | None
    name: str | None
    status: int
    message: str
    times: int
    retry_after_s: float | None = None
    served: bool = False  # carried out, then its answer lost (Unanswered)

    def matches(self, verb: str, res: Resource, name: str | None) -> bool:
        """True when this failure applies to the call."""
        return (
            self.times > 0
            and self.verb in (verb, "*")
            and self.plural in (None, res.plural)
            and (self.name is None or self.name == name)
        )


def _qualified(res: Resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


def _qualified_kind(res: Resource, obj: Mapping[str, Any]) -> str:
    """``Kind.group`` as the API server names an object in a 422 (``Job.batch``)."""
    return f"{obj.get('kind')}.{res.group}" if res.group else str(obj.get("kind"))


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubeClient:
    """In-memory :class:`~gputask.k8s.client.KubeApi` with API-server semantics and injectable refusals."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str | None]] = []  # (verb, plural, name)
        self.failures: list[Failure] = []
        self._rv = itertools.count(1)
        self.latest = 0  # the last resourceVersion given out
        # (resourceVersion, key, type, object, the object's previous state or None)
        self.history: list[tuple[int, Key, str, dict[str, Any], dict[str, Any] | None]] = []
        self._last: dict[Key, dict[str, Any]] = {}  # each live object's last recorded state
        self.compacted = 0  # the resourceVersion up to which history was dropped (older watches get 410)
        self._changed = asyncio.Event()  # set (and replaced) at each change: watches wait on it

    # -- test helpers ------------------------------------------------------------------------------
    def fail(
        self,
        verb: str,
        plural: str | None = None,
        name: str | None = None,
        *,
        status: int = 500,
        message: str = "",
        times: int = 1,
        retry_after_s: float | None = None,
        served: bool = False,
    ) -> None:
        """Make the next ``times`` ``verb`` calls (``*`` = any verb) on ``plural``/``name`` raise ``status``
        (with the Retry-After the server asked for, when given). ``served``: the call is carried out first and
        then raises :class:`~gputask.k8s.client.Unanswered` (status 0 unless given: the connection dropped after
        the server committed it)."""
        self.failures.append(Failure(verb, plural, name, status if not served or status != 500 else 0, message,
                                     times, retry_after_s, served))

    def put(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Store an object as if it had been created (status included); no call is recorded."""
        return self._store(res, copy.deepcopy(dict(body)), namespace, keep_status=True)

    def all(self, res: Resource, namespace: str | None = None) -> list[dict[str, Any]]:
        """Copies of the stored objects of ``res`` (in ``namespace``, or all), by namespace and name."""
        found = [(k, o) for k, o in self.objects.items() if k[:2] == (res.group, res.plural)]
        found = [(k, o) for k, o in found if namespace is None or k[2] == namespace]
        return [copy.deepcopy(o) for _, o in sorted(found, key=lambda item: (item[0][2] or "", item[0][3]))]

    def compact(self) -> None:
        """Drop the change history, as etcd compaction does: a watch from an earlier resourceVersion gets 410."""
        self.compacted = self.latest
        self.history.clear()

    def _next_rv(self) -> str:
        self.latest = next(self._rv)
        return str(self.latest)

    def _record(self, key: Key, etype: str, obj: dict[str, Any]) -> None:
        state = copy.deepcopy(obj)
        old = self._last.pop(key, None) if etype == "DELETED" else self._last.get(key)
        if etype != "DELETED":
            self._last[key] = state
        self.history.append((int(obj["metadata"]["resourceVersion"]), key, etype, state, old))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def writes(self) -> list[tuple[str, str, str | None]]:
        """The recorded calls that write (create, patch, patch-status, replace, delete)."""
        return [c for c in self.calls if c[0] not in ("get", "list")]

    # -- KubeApi -----------------------------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """GET one object."""
        self._enter("get", res, name)
        return copy.deepcopy(self._live(res, namespace, name))

    async def list(
        self, res: Resource, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> list[dict[str, Any]]:
        """LIST objects; equality, inequality and existence label selectors, equality field selectors."""
        self._enter("list", res, None)
        return [o for o in self.all(res, namespace) if _labels_match(o, labels) and _fields_match(o, fields)]

    async def list_versioned(
        self, res: Resource, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> Listed:
        """LIST with the resourceVersion of the moment (one page: the fake keeps everything in memory)."""
        self._enter("list", res, None)
        items = [o for o in self.all(res, namespace) if _labels_match(o, labels) and _fields_match(o, fields)]
        return Listed(items, str(self.latest))

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        labels: str | None = None,
        fields: str | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        """The changes after ``resource_version`` from the kept history, then new ones as they happen, until
        ``timeout_s``; Expired when that resourceVersion was compacted away."""
        self._enter("watch", res, None)
        since = int(resource_version or 0)
        if since < self.compacted:
            raise Expired(410, "Expired", f"too old resource version: {since} ({self.compacted})")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            changed = self._changed
            batch = [seen for rv, key, etype, obj, old in self.history
                     if rv > since and key[:2] == (res.group, res.plural) and namespace in (None, key[2])
                     and (seen := _seen_as(etype, obj, old, labels, fields)) is not None]
            if batch:
                since = int(batch[-1]["object"]["metadata"]["resourceVersion"])
                yield batch
                continue
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return

    async def create(
        self, res: Resource, body: Mapping[str, Any], namespace: str | None = None, *, guard: Guard | None = None
    ) -> dict[str, Any]:
        """POST a new object (status dropped when the kind has a status subresource)."""
        name = (body.get("metadata") or {}).get("name")
        lost = self._enter("create", res, name, guard)
        if res.plural.startswith("pods/") and res.plural.endswith("/eviction"):  # the Eviction API (no budgets here:
            with self._answer_lost(lost):  # a test refuses with fail("create", "pods/NAME/eviction", status=429))
                self._live(PODS, namespace, res.plural.split("/")[1])
                if "All" not in ((body.get("deleteOptions") or {}).get("dryRun") or ()):
                    self._delete(PODS, res.plural.split("/")[1], namespace)
                return {"kind": "Status", "status": "Success"}
        with self._answer_lost(lost):
            return copy.deepcopy(self._store(res, copy.deepcopy(dict(body)), namespace, keep_status=False))

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
        """JSON merge patch of the object, or of its status only."""
        lost = self._enter("patch-status" if status else "patch", res, name, guard)
        with self._answer_lost(lost):
            current = self._live(res, namespace, name)
            return copy.deepcopy(self._update(res, current, merge_patch(current, dict(patch)), status=status))

    async def replace(
        self,
        res: Resource,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        guard: Guard | None = None,
    ) -> dict[str, Any]:
        """PUT a whole object."""
        lost = self._enter("replace", res, name, guard)
        with self._answer_lost(lost):
            current = self._live(res, namespace, name)
            return copy.deepcopy(self._update(res, current, copy.deepcopy(dict(body)), status=False))

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
        guard: Guard | None = None,
    ) -> bool:
        """DELETE an object (it lingers with a deletionTimestamp while it has finalizers)."""
        lost = self._enter("delete", res, name, guard)
        with self._answer_lost(lost):
            return self._delete(res, name, namespace)

    def _delete(self, res: Resource, name: str, namespace: str | None) -> bool:
        key = (res.group, res.plural, namespace if res.namespaced else None, name)
        current = self.objects.get(key)
        if current is None:
            return False
        if current["metadata"].get("finalizers"):
            current["metadata"].setdefault("deletionTimestamp", _now())
            current["metadata"]["resourceVersion"] = self._next_rv()
            self._record(key, "MODIFIED", current)
        else:
            del self.objects[key]
            current["metadata"]["resourceVersion"] = self._next_rv()
            self._record(key, "DELETED", current)
        return True

    async def close(self) -> None:
        """Nothing to release."""

    # -- the store -----------------------------------------------------------------------------------
    def _enter(self, verb: str, res: Resource, name: str | None, guard: Guard | None = None) -> Unanswered | None:
        """Record the call; raise an injected refusal, or return the Unanswered to raise once it is carried out."""
        self.calls.append((verb, res.plural, name))
        if guard is not None and not guard():
            raise Fenced()
        for failure in self.failures:
            if failure.matches(verb.removesuffix("-status"), res, name) or failure.matches(verb, res, name):
                failure.times -= 1
                if failure.served or failure.status == 0:  # status 0: sent, no answer (served only with ``served``)
                    said = failure.message or "Server disconnected (injected: no answer)"
                    lost = Unanswered(failure.status, "Unreachable" if not failure.status else "InternalError", said)
                    if not failure.served:
                        raise lost
                    return lost
                message = failure.message or f'{_qualified(res)} "{name}" is refused (injected {failure.status})'
                raise ApiError(failure.status, REASONS.get(failure.status, "Unknown"), message,
                               retry_after_s=failure.retry_after_s)
        return None

    @staticmethod
    @contextlib.contextmanager
    def _answer_lost(lost: Unanswered | None) -> Iterator[None]:
        """Carry the call out; when its answer is to be lost, raise ``lost`` instead of what it returned or raised."""
        if lost is None:
            yield
            return
        with contextlib.suppress(ApiError):
            yield
        raise lost

    def _live(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        found = self.objects.get((res.group, res.plural, namespace if res.namespaced else None, name))
        if found is None:
            raise NotFound(404, "NotFound", f'{_qualified(res)} "{name}" not found')
        return found

    def _store(self, res: Resource, obj: dict[str, Any], namespace: str | None, *, keep_status: bool) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        key = (res.group, res.plural, meta.get("namespace") if res.namespaced else None, str(meta.get("name")))
        if key in self.objects:
            raise AlreadyExists(409, "AlreadyExists", f'{_qualified(res)} "{key[3]}" already exists')
        if not keep_status and res.plural not in NO_STATUS:
            obj.pop("status", None)
        meta.update(
            uid=meta.get("uid") or str(uuid.uuid4()),
            resourceVersion=self._next_rv(),
            generation=1,
            creationTimestamp=meta.get("creationTimestamp") or _now(),
        )
        self.objects[key] = obj
        self._record(key, "ADDED", obj)
        return obj

    def _update(
        self, res: Resource, current: dict[str, Any], proposed: dict[str, Any], *, status: bool
    ) -> dict[str, Any]:
        wanted = (proposed.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise Conflict(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {_qualified(res)} "
                f'"{current["metadata"]["name"]}": the object has been modified; please apply your '
                "changes to the latest version and try again",
            )
        given = (proposed.get("metadata") or {}).get("uid")
        if given and given != current["metadata"].get("uid"):  # a precondition: that object was replaced since
            raise ApiError(422, "Invalid", f'{_qualified_kind(res, current)} "{current["metadata"]["name"]}" is '
                                           f'invalid: metadata.uid: Invalid value: "{given}": field is immutable')
        new = copy.deepcopy(current)
        if status:
            new["status"] = proposed.get("status")
        else:
            kept = current.get("status")
            new = {**proposed, "metadata": {**proposed.get("metadata", {}), **_immutable(current)}}
            if res.plural not in NO_STATUS:
                new.pop("status", None)
                if kept is not None:
                    new["status"] = kept
            spec_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
                k: v for k, v in current.items() if k not in ("metadata", "status")
            }
            if spec_changed:
                new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if new == current:
            return current
        new["metadata"]["resourceVersion"] = self._next_rv()
        current.clear()
        current.update(new)
        meta = current["metadata"]
        self._record((res.group, res.plural, meta.get("namespace") if res.namespaced else None, meta["name"]),
                     "MODIFIED", current)
        return current


def _immutable(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    keep = ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion", "deletionTimestamp")
    return {k: meta[k] for k in keep if k in meta}


def _seen_as(
    etype: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None, labels: str | None, fields: str | None = None
) -> dict[str, Any] | None:
    """The event a watch with label selector ``labels`` and field selector ``fields`` sees (a copy), None when it
    does not see it: as the API server does, a change that makes an object match is ADDED and one that makes it stop
    matching is DELETED carrying the previous state (which matched) at the event's resourceVersion (the watch cache's
    filter, k8s.io/apiserver/pkg/storage/cacher, cacheWatcher.convertToWatchEvent)."""

    def matches(o: Mapping[str, Any]) -> bool:
        return _labels_match(o, labels) and _fields_match(o, fields)

    now, was = matches(obj), old is not None and matches(old)
    if etype == "MODIFIED" and now != was:
        if now:
            return {"type": "ADDED", "object": copy.deepcopy(obj)}
        assert old is not None
        previous = copy.deepcopy(dict(old))
        previous["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
        return {"type": "DELETED", "object": previous}
    seen = (was or (old is None and now)) if etype == "DELETED" else now
    return {"type": etype, "object": copy.deepcopy(obj)} if seen else None


def _labels_match(obj: Mapping[str, Any], selector: str | None) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(obj: Mapping[str, Any], selector: str | None) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        negate = "!=" in term
        path, value = term.split("!=" if negate else "=", 1)
        found: Any = obj
        for part in path.lstrip("=").split("."):
            found = found.get(part) if isinstance(found, Mapping) else None
        if (("" if found is None else str(found)) == value) == negate:  # a missing field reads as "" (the API server)
            return False
    return True
