"""The project's Kubernetes API emulator: kmock's ``KubernetesEmulator`` made faithful enough for kopf.

kmock 0.8 stores objects naively (no uid or resourceVersion, 200 on create, no PUT, no selectors,
no conflicts, no status isolation, no garbage collection). :class:`GpuTaskEmulator` keeps kmock's
object store (``emulator.objects[...]``), resource registry (``emulator.resources``), discovery
scaffolding and reaction DSL (``emulator['patch', ...] << 500`` still overrides any answer), and
replaces the CRUD handlers with ones that behave like kube-apiserver (see ``_store.py``).
DESIGN.md section 5 lists what it still does not do (no schema validation beyond unknown fields, no
defaulting, no controllers, no RBAC).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import collections
import copy
import dataclasses
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
from kmock import (
    KubernetesEmulator,
    KubernetesError,
    KubernetesScaffold,
    Request,
    ResourceInfo,
    action,
    headers,
    method,
    resource,
)

from gputask.testing import _fields, _http, _patches
from gputask.testing._kmock import Response, StreamingError
from gputask.testing._resources import builtin_infos, dra_builtins, group_version
from gputask.testing._selectors import SelectorError, make_matcher, parse_field_selector, parse_label_selector
from gputask.testing._store import (
    Event,
    Key,
    Obj,
    Store,
    Watch,
    bad_request,
    conflict,
    error,
    invalid,
    no_resource,
    not_found,
)

BOOKMARK_S = 60.0  # an open watch that asked for bookmarks gets one this often (the watch cache's bookmarkFrequency)
BOOKMARK_BEFORE_END_S = 2.0  # ... and one this long before its timeoutSeconds ends it (cacher: deadline - 2 s)
THROTTLED = "Too many requests, please try again later.\n"  # APF's and max-in-flight's 429 body (text/plain)
EXPIRED_CONTINUE = (  # k8s.io/apiserver/pkg/storage/etcd3/store.go, compactedContinue
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list.")
RECORDS_SIZE = 1  # requests kept in kmock's records: its dispatch filters them all for every reaction, every request
ANSWERS = 10_000  # writes kept in GpuTaskEmulator.answers
DISPATCH_S = 5.0  # requests in flight for less than this stay in kmock's records (their reaction is being found)


@dataclasses.dataclass(slots=True)
class Injection:
    """A refusal to answer instead of serving: method, a path fragment, status, how many times more."""

    method: str
    path: str
    status: int
    times: int
    message: str = ""
    retry_after: int | None = None
    served: bool = False  # served, then the connection dropped before the answer (the client cannot tell)


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """One write request as answered: method, path, HTTP status, the ``fieldManager`` it named, when
    (``time.monotonic()`` seconds)."""

    method: str
    path: str
    status: int
    manager: str | None = None
    at: float = 0.0


@attrs.define(kw_only=True)
class GpuTaskEmulator(KubernetesEmulator):
    """An in-memory Kubernetes API server for integration tests and ``make demo``.

    On top of kmock's emulator it adds: uid/creationTimestamp/resourceVersion/generation; 201 on
    create and 409 AlreadyExists; PUT; optimistic concurrency (stale resourceVersion = 409);
    merge, strategic-merge (as merge), apply (as merge) and JSON patches; generateName; label and
    field selectors on list and watch; an isolated ``/status`` subresource; finalizers and
    ownerReference garbage collection (background, or ``Orphan``); typed list responses; CRD
    installation into discovery; watches resumable from a resourceVersion; fields a CRD's schema does
    not declare pruned and, by ``fieldValidation``, refused or warned of (:mod:`gputask.testing._fields`).
    Unchanged writes are no-ops, as in the API server: no new resourceVersion, no watch event.
    """

    store: Store = attrs.field(init=False)
    answers: collections.deque[Answer] = attrs.field(init=False, factory=lambda: collections.deque(maxlen=ANSWERS))
    injected: list[Injection] = attrs.field(init=False, factory=list)
    _in_flight: dict[int, float] = attrs.field(init=False, factory=dict)  # requests being served: id -> since (s)
    _warnings: dict[int, list[str]] = attrs.field(init=False, factory=dict)  # Warning headers by request id
    _crud: dict[action, Any] = attrs.field(init=False, factory=dict)  # the emulator's own reactions, by action
    _put: Any = attrs.field(init=False, default=None)
    _own_reactions: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        # Skip KubernetesEmulator's own CRUD fallbacks; keep the scaffold's discovery and 404s.
        KubernetesScaffold.__attrs_post_init__(self)
        self.store = Store(self._objects, self._resources)
        for res, info in builtin_infos():
            self.resources[res] = info
        watch = self.fallback[action.WATCH] << headers({"Content-Type": "application/json"}) << self._serve_watch
        self._crud = {
            action.LIST: self.fallback[action.LIST] << self._serve_list,
            action.WATCH: watch,
            action.FETCH: self.fallback[action.FETCH] << self._serve_fetch,
            action.CREATE: self.fallback[action.CREATE] << self._serve_create,
            action.UPDATE: self.fallback[action.UPDATE] << self._serve_update,
            action.DELETE: self.fallback[action.DELETE] << self._serve_delete,
        }
        self._put = self.fallback[method.PUT] << self._serve_replace
        self._own_reactions = len(self._payloads)  # more: a test's reactions, which must see every request

    # -- public helpers -------------------------------------------------------------------------

    def install_crd(self, crd: Mapping[str, Any]) -> Obj:
        """Create or replace a CustomResourceDefinition and serve its resources; return it."""
        return self.store.install_crd(dict(crd))

    def serve_dra(self, versions: tuple[str, ...] = ("v1",)) -> None:
        """Serve ``resource.k8s.io`` (ResourceClaims, ResourceClaimTemplates, DeviceClasses) at ``versions``, as
        Kubernetes 1.34 does at v1 and 1.32/1.33 at v1beta1 once switched on (:mod:`gputask.testing._dra`)."""
        for version in versions:
            for res, info in builtin_infos(dra_builtins(version)):
                self.resources[res] = info

    def close_watches(self) -> None:
        """End every open watch stream (call before stopping the HTTP server)."""
        for watch in self.store.watches:
            watch.queue.put_nowait(None)

    def compact(self) -> None:
        """Drop the watch event log, as etcd compaction does: a watch resumed from an earlier resourceVersion is
        answered 410 Expired (its client must list again)."""
        self.store.log.clear()
        self.store.log_floor = self.store.rv

    @property
    def resource_version(self) -> int:
        """The latest resourceVersion handed out."""
        return self.store.rv

    # -- HTTP plumbing ------------------------------------------------------------------------

    def inject(
        self, method: str, path_part: str, status: int = 0, *, times: int = 1, message: str = "",
        retry_after: int | None = None, served: bool = False,
    ) -> None:
        """Answer the next ``times`` ``method`` requests whose path contains ``path_part`` with ``status``
        (a metav1 Status as the API server sends it: 409 Conflict, 500 InternalError, ...).

        429 is answered as API Priority and Fairness (and the max-in-flight filter) reject a request before
        serving it: ``Retry-After`` (``retry_after`` seconds, 1 unless given) and a text/plain body, no Status
        (k8s.io/apiserver/pkg/server/filters/maxinflight.go, ``tooManyRequests``). ``retry_after`` on another
        status adds the header and ``details.retryAfterSeconds``, as the API server writes a Status that has them
        (a 500 ServerTimeout, a 503 while it starts up).

        ``served=True`` (``status`` ignored): the request is served, then its connection is closed before the
        answer is written, as when an API server is killed between committing a write to etcd and answering
        (the client sees "Server disconnected" or "Connection reset" and cannot tell whether it was served)."""
        self.injected.append(Injection(method.upper(), path_part, status, times, message, retry_after, served))

    def _injection(self, raw_request: aiohttp.web.BaseRequest) -> Injection | None:
        """The injection that takes this request (one of its ``times`` used), if any."""
        for injection in self.injected:
            if injection.times > 0 and injection.method == raw_request.method and injection.path in raw_request.path:
                injection.times -= 1
                return injection
        return None

    def _injected(self, injection: Injection) -> aiohttp.web.StreamResponse:
        """The refusal ``injection`` answers with, instead of serving."""
        if injection.status == 429 and not injection.message:
            wait = 1 if injection.retry_after is None else injection.retry_after
            return aiohttp.web.Response(status=429, text=THROTTLED, headers={"Retry-After": str(wait)})
        reason = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests",
                  403: "Forbidden", 504: "Timeout"}.get(injection.status, "Unknown")
        extra = {"retryAfterSeconds": injection.retry_after} if injection.retry_after is not None else None
        body = _http.status_body(injection.status, reason, injection.message or f"injected {injection.status}", extra)
        headers = {"Retry-After": str(injection.retry_after)} if injection.retry_after is not None else None
        return aiohttp.web.json_response(body, status=injection.status, headers=headers)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Serve one HTTP request and log its answer in :attr:`answers` (writes only)."""
        injection = self._injection(raw_request)
        if injection is not None and injection.served:
            await self._serve_one(raw_request)
            if raw_request.transport is not None:
                raw_request.transport.close()  # the answer is lost: the client reads a dropped connection
            self.answers.append(Answer(raw_request.method, raw_request.path, 0, raw_request.query.get("fieldManager"),
                                       time.monotonic()))
            return aiohttp.web.Response(status=500)  # never reaches the client
        response = self._injected(injection) if injection is not None else await self._serve_one(raw_request)
        if raw_request.method not in ("GET", "HEAD"):
            manager, at = raw_request.query.get("fieldManager"), time.monotonic()
            self.answers.append(Answer(raw_request.method, raw_request.path, response.status, manager, at))
        return response

    async def _serve_one(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's flow, with our URL parser and bounded request records."""
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = await _http.parse_request(raw_request, len(self._requests))
            self._requests.append(request)
            self._in_flight[id(request)] = time.monotonic()
            self._trim_records()
            try:
                response = await self._handle(request)
                for warning in self._warnings.pop(id(request), ()):
                    response.headers.add("Warning", warning)
                return response
            except StreamingError as e:  # the response had started streaming
                raw_response = e.args[0]
                raise e.__cause__ or e from None
            finally:
                self._in_flight.pop(id(request), None)
                self._warnings.pop(id(request), None)
        except Exception as e:
            if not isinstance(e, KubernetesError) and self._errors:
                self._errors[-1].append(e)  # only real failures count for kmock's strict mode
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(e)
            await self._stream_error(e, raw_response)
            await raw_response.write_eof()
            return raw_response

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        if request.method == method.GET and request.url.path.startswith("/openapi/v3"):
            return self._serve_openapi(request.url.path.removeprefix("/openapi/v3").strip("/"))
        # Bypass KubernetesEmulator._handle, which stores objects naively before dispatching. While no test added
        # reactions, a request for a served resource goes straight to its handler: kmock's dispatch tries every
        # reaction's filters on every recorded request first (45% of the emulator's CPU in a 2,000-task burst).
        if len(self._payloads) == self._own_reactions and request.resource is not None and (
            request.resource in self.resources
        ):
            reaction = self._crud.get(request.action) if request.action is not None else (
                self._put if request.method == method.PUT else None)
            if reaction is not None:
                return await reaction(request)
        return await KubernetesScaffold._handle(self, request)

    def _trim_records(self) -> None:
        """Keep kmock's records short, but never drop a request whose reaction is still being found: kmock's
        dispatch looks for the request in the records, also after an await (a reaction that declines), and a
        request trimmed meanwhile matched nothing (a stalled answer under concurrent requests). Requests in flight
        for longer than :data:`DISPATCH_S` (watches) are past that and trimmed, so they cost nothing per request."""
        if len(self._requests) <= 2 * RECORDS_SIZE:
            return
        recent = time.monotonic() - DISPATCH_S  # a watch stays in flight for minutes, long past its dispatch
        flying = {key for key, since in self._in_flight.items() if since > recent}
        older = [r for r in self._requests[:-RECORDS_SIZE] if id(r) in flying]
        self._requests[:] = older + self._requests[-RECORDS_SIZE:]
        for payload in self._payloads:
            served = payload._requests
            keep = [r for r in served[:-RECORDS_SIZE] if id(r) in flying]
            served[:] = keep + served[-RECORDS_SIZE:]
        for errors in self._errors:
            del errors[:-RECORDS_SIZE]

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, KubernetesError):
            return _http.error_response(exc)
        return await super()._render_error(exc)

    # -- discovery ----------------------------------------------------------------------------

    def _served(self) -> list[tuple[resource, ResourceInfo]]:
        resources = KubernetesScaffold._get_resources(self)  # declared ones and the DSL's
        return [(r, self.resources[r]) for r in resources if r.plural and r.version]

    async def _serve_apis(self, request: Request) -> Any:
        return _http.api_group_list(self._served())

    async def _serve_group(self, request: Request) -> Any:
        found = _http.api_group(self._served(), str(request.resource and request.resource.group))
        if found is None:
            raise no_resource()
        return found

    async def _serve_version(self, request: Request) -> Any:
        gv = request.resource
        found = gv and _http.api_resource_list(self._served(), str(gv.group), str(gv.version))
        if not found:
            raise no_resource()
        return found

    def _serve_openapi(self, path: str) -> aiohttp.web.StreamResponse:
        found = _http.openapi_v3_group_version(self._served(), path) if path else _http.openapi_v3_root(self._served())
        if found is None:
            return _http.error_response(no_resource())
        return aiohttp.web.json_response(found)

    # -- request handlers ---------------------------------------------------------------------

    def _resolve(self, request: Request) -> tuple[resource, ResourceInfo]:
        res = request.resource
        if res is None or not res.plural or not res.version or res not in self.resources:
            raise no_resource()
        info = self.resources[res]
        if request.namespace is not None and not info.namespaced:
            raise no_resource()
        if request.subresource is not None and (
            request.subresource != "status" or "status" not in info.subresources
        ):
            raise no_resource()
        return res, info

    def _key(self, request: Request, res: resource, info: ResourceInfo) -> Key:
        if (info.namespaced and request.namespace is None) or request.name is None:
            raise no_resource()
        return (res, request.namespace if info.namespaced else None, request.name)

    @staticmethod
    def _body(request: Request) -> Obj:
        if "protobuf" in _http.content_type(request):
            raise error(
                415,
                "UnsupportedMediaType",
                "the emulator speaks JSON only; kubectl sends "
                "protobuf for built-in kinds from generators: use `kubectl apply -f`",
            )
        if not isinstance(request.data, dict) or not isinstance(request.data.get("metadata", {}), dict):
            raise bad_request("the request body must be a JSON object with an object in metadata")
        return copy.deepcopy(request.data)

    def _matcher(self, request: Request, res: resource) -> Callable[[Mapping[str, Any]], bool]:
        try:
            labels = parse_label_selector(request.params.get("labelSelector", ""))
            fields = parse_field_selector(
                request.params.get("fieldSelector", ""),
                str(res.group),
                str(res.plural),
                self.store.selectable.get(res, ()),
            )
            if request.name is not None:  # a watch on one named object
                fields += parse_field_selector(f"metadata.name={request.name}", "", "")
        except SelectorError as e:
            raise bad_request(str(e)) from None
        return make_matcher(labels, fields)

    async def _serve_list(self, request: Request) -> Response:
        """LIST, in pages when ``limit`` is given, as the API server serves it from etcd: every page is read from the
        snapshot at the first page's resourceVersion (which every page carries), so a paged list is one consistent
        state however the objects change meanwhile; the continue token names that version. A token older than the
        kept history (the API server: etcd compacted that revision, 5 minutes by default) is answered 410 Expired
        with the message and the "inconsistent" continue token the API server offers (k8s.io/apiserver storage,
        etcd3 ``compactedContinue``; https://kubernetes.io/docs/reference/using-api/api-concepts/
        #retrieving-large-results-sets-in-chunks)."""
        res, info = self._resolve(request)
        matches = self._matcher(request, res)
        namespace, token = request.namespace, request.params.get("continue", "")
        snapshot, after = self.store.rv, None
        if token:
            if request.params.get("resourceVersion"):
                raise bad_request("specifying resource version is not allowed when using continue")
            rv, after = _decode_continue(token)
            if 0 <= rv < self.store.log_floor:
                status = _http.status_body(410, "Expired", EXPIRED_CONTINUE)
                status["metadata"] = {"continue": _encode_continue(-1, (res, after[0] or None, after[1]))}
                return Response(status=410, payload=status)
            snapshot = rv if rv >= 0 else self.store.rv
        then = self._as_of(res, snapshot)  # the objects that changed since the snapshot, as they were then
        keys = self.store.live_keys(res)  # by namespace and name: a page reads only the objects it serves
        if then:
            keys = sorted(set(keys) | set(then), key=_by_name)

        def state(key: Key) -> Obj | None:
            return then[key] if key in then else self.store.live(key)

        at = bisect.bisect_right(keys, after, key=_by_name) if after else 0
        limit = int(request.params["limit"]) if request.params.get("limit", "").isdigit() else 0
        items: list[tuple[Key, Obj]] = []
        while at < len(keys) and (limit <= 0 or len(items) < limit):
            key = keys[at]
            if namespace in (None, key[1]) and (obj := state(key)) is not None and matches(obj):
                items.append((key, obj))
            at += 1
        meta: Obj = {"resourceVersion": str(snapshot)}
        rest = (o for k in itertools.islice(keys, at, None) if namespace in (None, k[1]) and (o := state(k)))
        if 0 < limit == len(items) and any(matches(obj) for obj in rest):
            meta["continue"] = _encode_continue(snapshot, items[-1][0])
            if not (request.params.get("labelSelector") or request.params.get("fieldSelector")):  # as the API server
                meta["remainingItemCount"] = sum(namespace in (None, k[1]) and (not then or state(k) is not None)
                                                 for k in itertools.islice(keys, at, None))  # live keys: no lookup
        body = {
            "kind": f"{info.kind}List",
            "apiVersion": group_version(res),
            "metadata": meta,
            "items": [obj for _, obj in items],
        }
        return Response(status=200, payload=body)

    def _as_of(self, res: resource, rv: int) -> dict[Key, Obj | None]:
        """The objects of ``res`` changed after resourceVersion ``rv``, each as it was at ``rv`` (None: it did not
        exist then), from the kept history (newest first, so the oldest change after ``rv`` says the state)."""
        then: dict[Key, Obj | None] = {}
        for event in reversed(self.store.log):
            if event.rv <= rv:
                break
            if event.res == res:
                meta = event.obj["metadata"]
                then[(res, meta.get("namespace"), meta["name"])] = None if event.type == "ADDED" else event.old
        return then

    async def _serve_watch(self, request: Request) -> AsyncIterator[Any]:
        res, info = self._resolve(request)
        matches, namespace = self._matcher(request, res), request.namespace
        since = request.params.get("resourceVersion", "")
        initial = request.params.get("sendInitialEvents") == "true"
        timeout_text = request.params.get("timeoutSeconds", "")
        if not re.fullmatch(r"\d*", since) or not re.fullmatch(r"\d*", timeout_text):
            raise bad_request("resourceVersion and timeoutSeconds must be non-negative integers")
        timeout = int(timeout_text) if timeout_text else None
        bookmarks = request.params.get("allowWatchBookmarks") == "true"
        # Snapshot and subscribe with no await in between, so that no event is lost or doubled.
        backlog: list[Event] | None
        if since in ("", "0") or initial:
            backlog = [Event(0, res, "ADDED", obj, None) for _, obj in self.store.items(res, namespace)]
        else:
            backlog = self.store.events_since(res, int(since))
        snapshot_rv, watch = self.store.rv, Watch(res)
        self.store.watches.add(watch)
        try:
            yield b""  # send the headers now: clients wait for them before reading events
            if backlog is None:
                message = f"too old resource version: {since}"
                yield {"type": "ERROR", "object": _http.status_body(410, "Expired", message)}
                return
            if replayed := _lines(e.seen_as(namespace, matches) for e in backlog):
                yield replayed
            if initial:
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": info.kind,
                        "apiVersion": group_version(res),
                        "metadata": {
                            "resourceVersion": str(snapshot_rv),
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                }
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            bookmark_at = _next_bookmark(loop.time(), deadline) if bookmarks else None
            while True:
                now = loop.time()
                remaining = None if deadline is None else deadline - now
                if remaining is not None and remaining <= 0:
                    break
                limits = [t for t in (remaining, None if bookmark_at is None else bookmark_at - now) if t is not None]
                until = max(0.0, min(limits)) if limits else None
                try:
                    next_event = await asyncio.wait_for(watch.queue.get(), until)
                except TimeoutError:
                    if bookmark_at is not None and loop.time() >= bookmark_at:
                        # nothing queued: every change up to the store's version was sent (or is not this watch's)
                        yield {"type": "BOOKMARK", "object": {"kind": info.kind, "apiVersion": group_version(res),
                                                              "metadata": {"resourceVersion": str(self.store.rv)}}}
                        bookmark_at = _next_bookmark(loop.time(), deadline)
                        continue
                    break
                ready = [next_event]  # and every event already queued: one write for all of them, as the API
                while ready[-1] is not None and not watch.queue.empty():  # server sends what it has at once
                    ready.append(watch.queue.get_nowait())
                if chunk := _lines(e.seen_as(namespace, matches) for e in ready if e is not None):
                    yield chunk
                if ready[-1] is None:
                    break
        finally:
            self.store.watches.discard(watch)

    async def _serve_fetch(self, request: Request) -> Response:
        res, info = self._resolve(request)
        key = self._key(request, res, info)
        obj = self.store.live(key)
        if obj is None:
            raise not_found(res, key[2])
        return Response(status=200, payload=obj)

    def _unknown_fields(self, request: Request, res: resource, obj: Obj) -> list[str]:
        """Prune ``obj``'s fields its CRD's schema does not declare; under Warn, queue a Warning header for
        each; return them (the caller refuses them under Strict). See :mod:`gputask.testing._fields`."""
        schema = self.store.schemas.get(res)
        if schema is None:
            return []
        mode = _fields.directive(request.params)
        fields = _fields.prune(obj, schema)
        if fields and mode == _fields.WARN:
            self._warnings.setdefault(id(request), []).extend(_fields.warnings(fields))
        return fields if mode == _fields.STRICT else []

    def _checked_body(self, request: Request, res: resource, info: ResourceInfo) -> Obj:
        """The body of a create or a PUT, pruned; 400 under Strict when it names unknown fields."""
        body = self._body(request)
        if unknown := self._unknown_fields(request, res, body):
            raise _fields.create_refusal(info.kind, str(res.version), unknown)
        return body

    async def _serve_create(self, request: Request) -> Response:
        res, info = self._resolve(request)
        if info.namespaced and request.namespace is None:
            raise no_resource()
        return Response(
            status=201, payload=self.store.create(res, info, request.namespace, self._checked_body(request, res, info))
        )

    async def _serve_update(self, request: Request) -> Response:
        res, info = self._resolve(request)
        key = self._key(request, res, info)
        content_type = _http.content_type(request)
        if content_type not in _patches.PATCH_TYPES:
            raise error(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown "
                f"format - accepted media types include: {', '.join(sorted(_patches.PATCH_TYPES))}",
            )
        current = self.store.live(key)
        if current is None and content_type == _patches.APPLY and request.subresource is None:
            body = self._body(request)
            body["metadata"]["name"] = key[2]
            self._check_patched(request, res, info, body, applied=True)
            return Response(status=201, payload=self.store.create(res, info, key[1], body))
        if current is None:
            raise not_found(res, key[2])
        try:
            patched = _patches.apply_patch(content_type, current, request.data)
        except _patches.PatchFormatError as e:
            raise bad_request(str(e)) from None
        except _patches.PatchError as e:
            raise invalid(res, key[2], str(e), kind=info.kind) from None
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise invalid(res, key[2], "the patched object is not an object with metadata", kind=info.kind)
        self._check_patched(request, res, info, patched, applied=content_type == _patches.APPLY)
        return Response(
            status=200, payload=self.store.update(res, info, key, current, patched, request.subresource)
        )

    def _check_patched(
        self, request: Request, res: resource, info: ResourceInfo, patched: Obj, *, applied: bool
    ) -> None:
        """Prune a patched object; under Strict refuse unknown fields as the API server refuses that patch."""
        strict = res in self.store.schemas and _fields.directive(request.params) == _fields.STRICT
        before = copy.deepcopy(patched) if strict else patched  # the refusal quotes the object as patched
        if unknown := self._unknown_fields(request, res, patched):
            name = str(patched["metadata"].get("name"))
            if applied:
                raise _fields.apply_refusal(name, f"{res.group}/{res.version}", info.kind, unknown)
            raise _fields.patch_refusal(before, unknown)

    async def _serve_replace(self, request: Request) -> Response:
        res, info = self._resolve(request)
        key = self._key(request, res, info)
        body = self._checked_body(request, res, info)
        name = body.setdefault("metadata", {}).get("name")
        if name not in (None, key[2]):
            raise bad_request(
                f"the name of the object ({name}) does not match the name on the URL ({key[2]})"
            )
        current = self.store.live(key)
        if current is None:
            raise not_found(res, key[2])
        return Response(
            status=200, payload=self.store.update(res, info, key, current, body, request.subresource)
        )

    async def _serve_delete(self, request: Request) -> Response:
        res, info = self._resolve(request)
        key = self._key(request, res, info)
        if request.subresource is not None:
            raise error(405, "MethodNotAllowed", "the server does not allow this method")
        current = self.store.live(key)
        if current is None:
            raise not_found(res, key[2])
        options = request.data if isinstance(request.data, dict) else {}
        preconditions = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            wanted, actual = preconditions.get(field), current["metadata"].get(field)
            if wanted and wanted != actual:
                raise conflict(
                    res,
                    key[2],
                    f"Precondition failed: {field} in precondition: "
                    f"{wanted}, {field} in object meta: {actual}",
                )
        policy = request.params.get("propagationPolicy") or options.get("propagationPolicy")
        orphan = policy == "Orphan" or options.get("orphanDependents") is True
        return Response(status=200, payload=self.store.delete(res, key, current, orphan=orphan))


def _lines(events: Iterable[Obj | None]) -> bytes:
    """Watch events as the API server streams them: one JSON object per line (None: not seen by this watch)."""
    return b"".join(json.dumps(event).encode() + b"\n" for event in events if event is not None)


def _next_bookmark(now: float, deadline: float | None) -> float | None:
    """When a watch that allows bookmarks gets its next one: every :data:`BOOKMARK_S`, and
    :data:`BOOKMARK_BEFORE_END_S` before its deadline (k8s.io/apiserver/pkg/storage/cacher, cacheWatcher's
    nextBookmarkTime); None when neither comes before the deadline."""
    at = now + BOOKMARK_S
    if deadline is not None:
        before_end = deadline - BOOKMARK_BEFORE_END_S
        at = min(at, before_end) if before_end > now else at
        if at >= deadline:
            return None
    return at


def _encode_continue(rv: int, after: Key) -> str:
    """A continue token: the snapshot's resourceVersion and the last key served, opaque to clients (base64 JSON,
    as the API server's ``{"v": "meta.k8s.io/v1", "rv": ..., "start": ...}``); ``rv`` -1 continues from the latest
    state (the inconsistent token of a 410)."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [after[1] or "", after[2]]})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    """The snapshot resourceVersion and last key of a continue token; 400 BadRequest when it is none."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        start = data["start"]
        if data.get("v") != "meta.k8s.io/v1" or not isinstance(data.get("rv"), int) or len(start) != 2:
            raise ValueError(token)
        return int(data["rv"]), (str(start[0]), str(start[1]))
    except (ValueError, TypeError, KeyError, binascii.Error) as e:
        raise bad_request(f"continue key is not valid: {e}") from None


def _by_name(key: Key) -> tuple[str, str]:
    """A stored key's place in a LIST: namespace, then name (the order continue tokens follow)."""
    return (key[1] or "", key[2])
