"""The emulator's object store semantics: versions, conflicts, finalizers, GC, CRDs, watch events.

It works on kmock's own containers (``ObjectsArray`` for objects, ``ResourcesArray`` for what is
served), so that ``emulator.objects[...]`` assertions keep working. Everything here is synchronous:
in one event loop, each API call is applied atomically, and watch snapshots are consistent.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import random
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kmock import KubernetesError, ObjectsArray, ResourceInfo, ResourcesArray, resource

from gputask.testing._admission import RESOURCE_QUOTAS, quota_refusal, validation_problems
from gputask.testing._dra import immutable_spec
from gputask.testing._pods import pod_update_problems
from gputask.testing._resources import (
    CRD_RESOURCE,
    KEEP_STATUS_ON_CREATE,
    STATUS_ON_CREATE,
    InvalidCRD,
    crd_status,
    crd_versions,
    group_version,
)
from gputask.testing.crdrules import FieldError, aggregate, crd_problems

Obj = dict[str, Any]
Key = tuple[resource, str | None, str]

EVENT_LOG_SIZE = 10_000  # watch events kept for ?resourceVersion= resumption; older ones get 410
HISTORY_SIZE = 16  # versions kept per object in emulator.objects[...].history
DELETED_SIZE = 1_000  # deleted objects kept (soft-deleted, for assertions) before being forgotten
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the API server uses for generateName
_IMMUTABLE_META = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)


def now() -> str:
    """The current time as an RFC 3339 UTC timestamp, as the API server writes them."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def error(
    code: int, reason: str, message: str, res: resource | None = None, name: str | None = None
) -> KubernetesError:
    """A failure answered as a metav1 Status with this code and reason."""
    details = {"name": name, "group": res.group, "kind": res.plural} if res is not None else None
    return KubernetesError(status=code, reason=reason, message=message, details=details)


def _qualified(res: resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else str(res.plural)


def no_resource() -> KubernetesError:
    """404 for a URL that names no served resource."""
    return error(404, "NotFound", "the server could not find the requested resource")


def not_found(res: resource, name: str) -> KubernetesError:
    """404 for a missing object."""
    return error(404, "NotFound", f'{_qualified(res)} "{name}" not found', res, name)


def conflict(
    res: resource,
    name: str,
    why: str = "the object has been modified; please apply your changes to the latest version and try again",
) -> KubernetesError:
    """409 Conflict, as for a stale resourceVersion."""
    message = f'Operation cannot be fulfilled on {_qualified(res)} "{name}": {why}'
    return error(409, "Conflict", message, res, name)


def _qualified_kind(res: resource, kind: str) -> str:
    return f"{kind}.{res.group}" if res.group else kind


def invalid(res: resource, name: str | None, why: str, *, kind: str) -> KubernetesError:
    """422 Invalid, named by kind as the API server names it (``Job.batch "x" is invalid: ...``)."""
    message = f'{_qualified_kind(res, kind)} "{name}" is invalid: {why}'
    return KubernetesError(status=422, reason="Invalid", message=message, details={"name": name, "group": res.group,
                                                                                  "kind": kind})


def rejected(res: resource, name: str | None, errors: list[FieldError], *, kind: str) -> KubernetesError:
    """422 Invalid for field errors: the message joins them, ``details.causes`` lists each, as the API server does."""
    exc = invalid(res, name, aggregate(errors), kind=kind)
    exc.details["causes"] = [{"reason": e.cause_reason, "message": e.body, "field": e.field} for e in errors]
    return exc


def bad_request(message: str) -> KubernetesError:
    """400 BadRequest."""
    return error(400, "BadRequest", message)


@dataclass(frozen=True)
class Event:
    """One watch event, as logged for resumption and fanned out to open watches."""

    rv: int
    res: resource
    type: str
    obj: Obj
    old: Obj | None  # the previous state, to turn MODIFIED into ADDED/DELETED for selectors

    def seen_as(self, namespace: str | None, matches: Callable[[Mapping[str, Any]], bool]) -> Obj | None:
        """This event as a watch with a namespace and selectors sees it, or None if it does not.

        An object that starts or stops matching the selectors is ADDED or DELETED for that watch. The DELETED of
        one that stops matching carries its previous state (which matched) at this event's resourceVersion, as the
        watch cache sends it (k8s.io/apiserver/pkg/storage/cacher, ``cacheWatcher.convertToWatchEvent``: "return a
        delete event with the previous object content, but with the event's resource version"): a watcher cannot
        tell it from a deletion by the object alone.
        """
        if namespace is not None and self.obj["metadata"].get("namespace") != namespace:
            return None
        now_ok, was_ok = matches(self.obj), self.old is not None and matches(self.old)
        kind = self.type
        if kind == "MODIFIED" and now_ok != was_ok:
            if not now_ok:
                assert self.old is not None
                previous = copy.deepcopy(self.old)
                previous["metadata"]["resourceVersion"] = self.obj["metadata"]["resourceVersion"]
                return {"type": "DELETED", "object": previous}
            kind = "ADDED"
        elif not now_ok and not (kind == "DELETED" and was_ok):
            return None
        return {"type": kind, "object": self.obj}


@dataclass(eq=False)
class Watch:
    """An open watch stream's subscription: events of one resource; ``None`` ends it."""

    res: resource
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)


@dataclass(eq=False)
class Store:
    """Objects with API-server semantics; every state change goes through _write() or _remove()."""

    objects: ObjectsArray
    resources: ResourcesArray
    rv: int = 0
    log: collections.deque[Event] = field(default_factory=lambda: collections.deque(maxlen=EVENT_LOG_SIZE))
    log_floor: int = 0  # events up to this resourceVersion were dropped from the log
    watches: set[Watch] = field(default_factory=set)
    selectable: dict[resource, tuple[str, ...]] = field(default_factory=dict)  # CRD selectableFields
    schemas: dict[resource, Mapping[str, Any]] = field(default_factory=dict)  # CRD openAPIV3Schema per version
    _orphaning: set[str] = field(default_factory=set)  # uids being deleted with Orphan
    _crd_served: dict[str, list[resource]] = field(default_factory=dict)
    _deleted: collections.deque[Key] = field(default_factory=collections.deque)  # oldest first
    # Indexes, so a create, a LIST or a deletion costs what it touches, not every object stored (a 2,000-task
    # burst made each create scan all objects for ResourceQuotas, and each deletion scan them twice for owners):
    _by_res: dict[resource, dict[Key, None]] = field(default_factory=dict)  # every stored key, by resource
    _owned: dict[str, set[Key]] = field(default_factory=dict)  # owner uid -> live dependents naming it
    _uids: dict[str, Key] = field(default_factory=dict)  # uid -> key of the live object
    _live: dict[resource, dict[Key, None]] = field(default_factory=dict)  # live keys, by resource (a LIST's page)
    _sorted: dict[resource, list[Key]] = field(default_factory=dict)  # those by name, until one comes or goes

    def live(self, key: Key) -> Obj | None:
        """The current state of an object, or None; never mutate it (writes store new dicts)."""
        if key in self.objects and not (obj := self.objects[key]).deleted:
            return obj.last.raw
        return None

    def live_keys(self, res: resource) -> list[Key]:
        """The keys of the live objects of a resource by namespace and name (a LIST's order; sorted again only
        after an object came or went: a paged LIST of 60,000 tasks sorted them for each of its 120 pages).
        Read only."""
        keys = self._sorted.get(res)
        if keys is None:
            keys = self._sorted[res] = sorted(self._live.get(res, {}), key=lambda k: (k[1] or "", k[2]))
        return keys

    def items(self, res: resource, namespace: str | None = None) -> list[tuple[Key, Obj]]:
        """Live objects of a resource (in a namespace, or all), sorted by namespace and name."""
        objects = self.objects
        found = [
            (key, obj.last.raw)
            for key in self._by_res.get(res, ())
            if namespace in (None, key[1]) and not (obj := objects[key]).deleted
        ]
        return sorted(found, key=lambda item: (item[0][1] or "", item[0][2]))

    def events_since(self, res: resource, since: int) -> list[Event] | None:
        """Logged events of a resource after a resourceVersion; None if that is too old (410)."""
        if since < self.log_floor:
            return None
        return [event for event in self.log if event.rv > since and event.res == res]

    def create(self, res: resource, info: ResourceInfo, namespace: str | None, body: Obj) -> Obj:
        """Create an object from a request body (which it takes over); return the stored state."""
        obj, meta = body, body.setdefault("metadata", {})
        if info.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        name = meta.get("name")
        while not name and meta.get("generateName"):
            name = str(meta["generateName"])[:58] + "".join(random.choices(_SUFFIX_CHARS, k=5))
            name = None if self.live((res, namespace, name)) is not None else name
        if not name or not _NAME.fullmatch(str(name)):
            raise invalid(
                res,
                name,
                f"metadata.name: Invalid value: {name!r}: must be a lowercase "
                "RFC 1123 subdomain (or set metadata.generateName)",
                kind=info.kind,
            )
        key: Key = (res, namespace if info.namespaced else None, name)
        if self.live(key) is not None:
            raise error(409, "AlreadyExists", f'{_qualified(res)} "{name}" already exists', res, name)
        self._admit(res, info, key, obj)
        obj = {
            "apiVersion": group_version(res),
            "kind": info.kind,
            **{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")},
        }
        for dropped in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(dropped, None)
        meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        group_plural = (str(res.group), str(res.plural))
        if group_plural in STATUS_ON_CREATE:
            obj["status"] = copy.deepcopy(STATUS_ON_CREATE[group_plural])
        elif "status" in info.subresources and group_plural not in KEEP_STATUS_ON_CREATE:
            obj.pop("status", None)
        if res == CRD_RESOURCE:
            self._install(obj)
        return self._write(res, key, obj, None)

    def _admit(self, res: resource, info: ResourceInfo, key: Key, obj: Obj) -> None:
        """Validation (422) and object-count quota (403) of a create, as the API server applies them."""
        problems = validation_problems(res, obj)
        if problems:
            raise rejected(res, key[2], problems, kind=info.kind)
        quotas = [o for _, o in self.items(RESOURCE_QUOTAS, key[1])] if key[1] is not None else []
        refusal = quota_refusal(res, key[1], key[2], quotas, lambda: len(self.items(res, key[1])))
        if refusal is not None:
            raise refusal

    def update(
        self,
        res: resource,
        info: ResourceInfo,
        key: Key,
        current: Obj,
        proposed: Obj,
        subresource: str | None,
    ) -> Obj:
        """Replace an object with a proposed full state (a PUT body or a patched copy)."""
        version = proposed.get("metadata", {}).get("resourceVersion")
        if version and version != current["metadata"]["resourceVersion"]:
            raise conflict(res, key[2])
        given = proposed.get("metadata", {}).get("uid")
        if given and given != current["metadata"]["uid"]:  # a precondition (client-go's adoption patches send it)
            raise invalid(res, key[2], f'metadata.uid: Invalid value: "{given}": field is immutable', kind=info.kind)
        has_status = "status" in info.subresources
        new = copy.deepcopy(current if subresource == "status" else proposed)
        if subresource == "status" or has_status:  # status and the rest change separately
            source = proposed if subresource == "status" else current
            new.pop("status", None)
            if "status" in source:
                new["status"] = copy.deepcopy(source["status"])
        meta = new.setdefault("metadata", {})
        for immutable in _IMMUTABLE_META:
            meta.pop(immutable, None)
            if immutable in current["metadata"]:
                meta[immutable] = current["metadata"][immutable]
        new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        added = set(meta.get("finalizers") or []) - set(current["metadata"].get("finalizers") or [])
        if meta.get("deletionTimestamp") and added:
            raise invalid(
                res,
                key[2],
                "metadata.finalizers: Forbidden: no new finalizers can be "
                "added if the object is being deleted",
                kind=info.kind,
            )
        problems = [] if subresource is not None else immutable_spec(res, current, new) or pod_update_problems(
            res, current, new)
        if problems:
            raise rejected(res, key[2], problems, kind=info.kind)
        if res == CRD_RESOURCE and subresource is None:
            self._install(new)
        if new == current:
            return current  # a no-op: no new resourceVersion and no watch event, as in the API
        skipped = {"metadata", "status"} if has_status else {"metadata"}
        if {k: v for k, v in new.items() if k not in skipped} != {
            k: v for k, v in current.items() if k not in skipped
        }:
            meta["generation"] = int(meta.get("generation", 1)) + 1
        return self._write(res, key, new, current)

    def delete(self, res: resource, key: Key, current: Obj, *, orphan: bool) -> Obj:
        """Delete an object, or only mark it deleted while it has finalizers."""
        if orphan:
            self._orphaning.add(current["metadata"]["uid"])
        if current["metadata"].get("deletionTimestamp"):
            return current  # already being deleted, waiting for its finalizers
        if current["metadata"].get("finalizers"):
            new = copy.deepcopy(current)
            new["metadata"] |= {
                "deletionTimestamp": now(),
                "deletionGracePeriodSeconds": 0,
                "generation": int(new["metadata"].get("generation", 1)) + 1,
            }
            return self._write(res, key, new, current)
        return self._remove(res, key, copy.deepcopy(current), current)

    def install_crd(self, crd: dict[str, Any]) -> Obj:
        """Create or replace a CustomResourceDefinition object and serve its resources."""
        body = copy.deepcopy(crd)
        body.setdefault("metadata", {}).pop("resourceVersion", None)
        info = self.resources[CRD_RESOURCE]
        key: Key = (CRD_RESOURCE, None, str(body["metadata"].get("name")))
        current = self.live(key)
        if current is None:
            return self.create(CRD_RESOURCE, info, None, body)
        return self.update(CRD_RESOURCE, info, key, current, body, None)

    def _write(self, res: resource, key: Key, new: Obj, old: Obj | None) -> Obj:
        if (
            old is not None
            and new["metadata"].get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
        ):
            return self._remove(res, key, new, old)  # the last finalizer is gone: delete it now
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        self._store(key, new)
        self._emit(Event(self.rv, res, "ADDED" if old is None else "MODIFIED", new, old))
        return new

    def _remove(self, res: resource, key: Key, last: Obj, old: Obj) -> Obj:
        self.rv += 1
        last["metadata"]["resourceVersion"] = str(self.rv)
        self._store(key, last)
        self.objects[key].delete()
        self._index(key, last, live=False)
        self._deleted.append(key)
        while len(self._deleted) > DELETED_SIZE:  # bound the memory of long `make demo` runs
            forgotten = self._deleted.popleft()
            if forgotten in self.objects and self.objects[forgotten].deleted:
                del self.objects[forgotten]
                self._by_res.get(forgotten[0], {}).pop(forgotten, None)
        self._emit(Event(self.rv, res, "DELETED", last, old))
        if res == CRD_RESOURCE:
            self._uninstall(str(last["metadata"]["name"]))
        self._collect_garbage(last["metadata"].get("uid"))
        return last

    def _index(self, key: Key, obj: Obj, *, live: bool) -> None:
        """Keep the uid and owner indexes in step with ``obj``, the new state of ``key`` (``live``: not deleted)."""
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        previous = self.live(key) if live else None
        before = {r.get("uid") for r in ((previous or {}).get("metadata") or {}).get("ownerReferences") or []}
        for owner in before:
            self._owned.get(str(owner), set()).discard(key)
        if not live:
            for owner in {r.get("uid") for r in meta.get("ownerReferences") or []}:
                self._owned.get(str(owner), set()).discard(key)
            if uid and self._uids.get(uid) == key:
                del self._uids[uid]
            if self._live.get(key[0], {}).pop(key, "gone") is None:
                self._sorted.pop(key[0], None)
            return
        live = self._live.setdefault(key[0], {})
        if key not in live:
            live[key] = None
            self._sorted.pop(key[0], None)
        if uid:
            self._uids[uid] = key
        for ref in meta.get("ownerReferences") or []:
            if ref.get("uid"):
                self._owned.setdefault(str(ref["uid"]), set()).add(key)

    def _store(self, key: Key, obj: Obj) -> None:
        self._index(key, obj, live=True)
        if key not in self.objects:
            self.objects[key] = obj
            self._by_res.setdefault(key[0], {})[key] = None
            return
        history = self.objects[key].history
        history.append(obj)
        if len(history) > HISTORY_SIZE:
            del history[:-HISTORY_SIZE]

    def _emit(self, event: Event) -> None:
        if len(self.log) == self.log.maxlen:
            self.log_floor = self.log[0].rv
        self.log.append(event)
        for watch in self.watches:
            if watch.res == event.res:
                watch.queue.put_nowait(event)

    def _collect_garbage(self, uid: str | None) -> None:
        """Delete (or, for Orphan, release) the dependents of a removed owner, like kube's GC."""
        if not uid:
            return
        orphan = uid in self._orphaning
        self._orphaning.discard(uid)
        dependents = sorted(self._owned.pop(uid, set()), key=lambda k: (str(k[0]), k[1] or "", k[2]))
        for key in dependents:
            current = self.live(key)
            if current is None:
                continue  # already collected through another owner
            live_uids = self._uids
            refs = current["metadata"].get("ownerReferences") or []
            if not any(ref.get("uid") == uid for ref in refs):
                continue
            if orphan or any(ref.get("uid") in live_uids for ref in refs if ref.get("uid") != uid):
                kept = [
                    ref for ref in refs if ref.get("uid") != uid and (orphan or ref.get("uid") in live_uids)
                ]
                new = copy.deepcopy(current)
                new["metadata"]["ownerReferences"] = kept
                if not kept:
                    del new["metadata"]["ownerReferences"]
                self._write(key[0], key, new, current)
            else:
                self.delete(key[0], key, current, orphan=False)

    def _install(self, crd: Obj) -> None:
        name = str(crd["metadata"].get("name"))
        problems = crd_problems(crd)
        if problems:
            raise rejected(CRD_RESOURCE, name, problems, kind="CustomResourceDefinition")
        try:
            versions = crd_versions(crd)
        except InvalidCRD as e:
            raise invalid(CRD_RESOURCE, name, str(e), kind="CustomResourceDefinition") from None
        for res in self._crd_served.pop(name, []):
            if res not in [v.res for v in versions]:
                del self.resources[res]
                self.schemas.pop(res, None)
        for version in versions:
            self.resources[version.res] = version.info
            self.selectable[version.res] = version.selectable_fields
            if version.schema is not None:
                self.schemas[version.res] = version.schema
        self._crd_served[name] = [v.res for v in versions]
        conditions = (crd.get("status") or {}).get("conditions") or [{}]
        crd["status"] = crd_status(crd, conditions[0].get("lastTransitionTime") or now())

    def _uninstall(self, name: str) -> None:
        for res in self._crd_served.pop(name, []):
            for key, obj in self.items(res):
                self._remove(res, key, copy.deepcopy(obj), obj)
            del self.resources[res]
            self.selectable.pop(res, None)
            self.schemas.pop(res, None)
            for watch in self.watches:
                if watch.res == res:
                    watch.queue.put_nowait(None)
