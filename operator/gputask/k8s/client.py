"""The one narrow I/O boundary to the Kubernetes API (STYLE: httpx-like shape).

:class:`KubeApi` is the interface (plain dicts in and out); :class:`KubeClient` implements it
with aiohttp on the event loop (no threads, no model classes), configured and authenticated by the
well-kept ``kubernetes`` client's configuration (kubeconfig or in-cluster). The Lease's client is a
second instance with connections of its own, so it never waits behind scheduling writes.
:class:`gputask.testing.FakeKubeClient` is the in-process fake of the same interface.

The errors and the resources are in :mod:`gputask.k8s.resources` (re-exported here).

Writes carry ``fieldManager`` (``gputask-operator``, ``gputask-agent``) and the client sends a
User-Agent of the same name, so managedFields name the writer instead of ``OpenAPI-Generator``.

Throttling is answered as client-go's rest client answers it (k8s.io/client-go/rest/request.go,
``checkWait``/``retryAfterSeconds``): a 429, or any 5xx, that carries a ``Retry-After`` header is sent again
after that many seconds, at most :data:`THROTTLE_RETRIES` times (client-go: 10) and never past the request's
timeout in all. API Priority and Fairness and the max-in-flight filter reject with 429, ``Retry-After`` and a
text/plain body ("Too many requests, please try again later.", k8s.io/apiserver/pkg/server/filters/maxinflight.go):
the request was never served, so sending it again is safe whatever its verb. A PodDisruptionBudget's 429 from the
Eviction API is no throttling and is never sent again (:func:`_budget_refusal`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol

import aiohttp
from kubernetes import client as k8s_client

from gputask.k8s.kubeconfig import _proxy, _retries, _ssl_context, load_api_client
from gputask.k8s.resources import (
    ADMISSIONCHECKS,
    CONFIGMAPS,
    DEVICECLASSES,
    EVENTS,
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPUNODES,
    GPURESOURCEFLAVORS,
    GPUTASKS,
    JOBS,
    LEASES,
    LOCALQUEUES,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RUNTIMECLASSES,
    SERVICES,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
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
    at_version,
    doubling_backoff_s,
)

log = logging.getLogger("gputask.client")

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 30.0  # a request unanswered this long fails (ApiError 0 Unreachable) instead of holding a thread
AUTH_REFRESH_S = 10.0  # the configuration's token refresh hook runs at most this often (and after a 401)
PAGE_SIZE = 500  # objects per LIST page (client-go's reflector pages by 500 too)
WATCH_TIMEOUT_S = 300  # a watch asks the server to end it after this long (it is then resumed), as kopf's do
CONNECT_RETRY_S = 0.2  # a connection that could not be opened is tried again after 0.2 s, doubling ...
CONNECT_RETRY_MAX_S = 2.0  # ... up to 2 s (an API server restarting refuses connections for seconds)
THROTTLE_RETRIES = 10  # a request answered 429 (or 5xx) with Retry-After is sent again this often (client-go: 10)
RETRY_AFTER_MIN_S = 1.0  # a Retry-After of 0 still waits this long (no burst of retries at a throttled server)
RETRY_AFTER_MAX_S = 30.0  # a longer Retry-After is waited this long at most
BODY_SNIPPET = 200  # characters of a body that is no Kubernetes Status kept in an ApiError's message


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

    async def list_versioned(
        self, res: Resource, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> Listed:
        """LIST every object (in pages), optionally by label and field selector, with the list's resourceVersion."""
        ...

    def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        labels: str | None = None,
        fields: str | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        """Watch events after ``resource_version`` (optionally by label and field selector: an object that stops
        matching them comes as DELETED with its previous state), in batches of those that arrived together (each a
        dict with ``type``: ADDED, MODIFIED, DELETED or BOOKMARK, and ``object``); ends when the server ends the watch
        (after about ``timeout_s``). Raises Expired when that resourceVersion is too old, ApiError otherwise."""
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
    """:class:`KubeApi` over HTTP with aiohttp on the event loop, configured and authenticated by a ``kubernetes``
    ApiClient (its kubeconfig or in-cluster configuration: server, CA, client certificate, token and its refresh
    hook, proxy, TLS server name).

    Why aiohttp and not the ``kubernetes`` client's own (urllib3) calls: those block, so each ran on a thread of
    a pool, and against the API emulator a write then cost the client 0.8 ms of CPU and 9 to 10 context switches
    (the GIL passed between the loop and the thread), against 0.3 ms and under one on the loop with aiohttp
    (3,000 Event creates, 16 at a time; kopf talks to the API server with aiohttp too). With three writes per
    admitted task that was most of the operator's CPU in a burst (issue 17).

    ``workers`` bounds the requests in flight at once (watches are not counted); ``timeout_s`` bounds each
    request in all (a server that hangs costs this long, then ``ApiError(0, "Unreachable")``). A connection that
    cannot be opened is tried again ``configuration.retries`` times (3 when unset, as urllib3 does), after 0.2 s
    doubling to 2 s, before it fails as Unreachable: nothing was sent. The ``guard`` of a write is asked once a slot
    is free, right before the request is sent. Usable from one event loop at a time (a new loop gets new connections).
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        workers: int = 16,
        field_manager: str = "gputask-operator",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._api = api
        self.configuration = api.configuration
        self.field_manager = field_manager
        self.timeout_s = timeout_s  # per request, in all
        self.workers = workers
        self._retries = _retries(self.configuration.retries)
        self._ssl = _ssl_context(self.configuration)
        self._proxy = _proxy(self.configuration)
        self._session: aiohttp.ClientSession | None = None
        self._auth_headers: dict[str, str] | None = None
        self._auth_at = 0.0
        self._limit = asyncio.Semaphore(workers)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> aiohttp.ClientSession:
        """The session of the running loop (made on first use, again after close or on another loop)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._loop, self._limit = loop, asyncio.Semaphore(self.workers)
            connector = aiohttp.TCPConnector(limit=0, ssl=self._ssl)  # bounded by _limit; watches beside it
            self._session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": self._api.user_agent},
                                                  skip_auto_headers=("Accept-Encoding",))
        return self._session

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        """Accept, Content-Type and the authentication the configuration holds (:meth:`_auth`)."""
        return {"Accept": "application/json", **({"Content-Type": content_type} if content_type else {}),
                **self._auth()}

    def _auth(self, *, fresh: bool = False) -> dict[str, str]:
        """The Authorization header of the configuration, its token refreshed by the configuration's hook at most
        every :data:`AUTH_REFRESH_S` (or at once when ``fresh``: after a 401). The kubeconfig loader's hook
        resets the whole configuration each time it runs, 9% of the operator's CPU in a burst when run per
        request; a rotated token stays valid long after its successor is written (kubelet rotates projected
        tokens at 80% of their lifetime), so seconds of caching lose nothing."""
        now = time.monotonic()
        if fresh or self._auth_headers is None or now - self._auth_at >= AUTH_REFRESH_S:
            headers: dict[str, str] = {}
            self._api.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
            self._auth_headers, self._auth_at = headers, now
        return self._auth_headers

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
        params = list((query or {}).items())
        if method in ("POST", "PUT", "PATCH"):
            params.append(("fieldManager", self.field_manager))
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        async with self._limit:
            status, reason, payload, retry_after = await self._exchange(method, path, params, data, content_type,
                                                                        guard)
        if status >= 400:
            raise _error(status, reason, payload, method, retry_after)
        try:
            result = json.loads(payload) if payload else {}
        except ValueError:
            result = {}
        return result if isinstance(result, dict) else {}

    async def _exchange(
        self, method: str, path: str, params: list[tuple[str, str]], data: bytes | None, content_type: str,
        guard: Guard | None,
    ) -> tuple[int, str, bytes, str | None]:
        """Send one request (a slot held): (status, reason, body, its Retry-After header). A connection that cannot be
        opened is tried again after a doubling backoff (nothing was sent), unless TLS failed (a certificate the CA did
        not sign, a name it does not carry: no retry mends that); a 401 is sent once more when the refresh hook gives
        another token; a 429 or 5xx with Retry-After is sent again after that wait (:func:`_throttle_wait_s`), the slot
        kept (the server asked for fewer requests), the guard asked again before each send."""
        session, attempt, renewed, throttled, waited = self._http(), 0, False, 0, 0.0
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        while True:
            auth = self._auth()
            headers = {**self._headers(content_type if data is not None else None), **auth}
            if guard is not None and not guard():
                raise Fenced()
            try:
                async with session.request(method, self.configuration.host + path, params=params, data=data,
                                           headers=headers, timeout=timeout, **self._proxy) as response:
                    status, reason, payload = response.status, response.reason or "", await response.read()
                    retry_after = response.headers.get("Retry-After")
            except aiohttp.ClientConnectorCertificateError as exc:
                raise ApiError(0, "Unreachable", str(exc)) from None  # no retry mends a certificate
            except aiohttp.ClientConnectorError as exc:  # not connected, so not sent: try again after a backoff
                attempt += 1
                if attempt > self._retries:
                    raise ApiError(0, "Unreachable", str(exc)) from None
                await asyncio.sleep(doubling_backoff_s(attempt, CONNECT_RETRY_S, CONNECT_RETRY_MAX_S))
                continue
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A kept-alive connection the server (or a load balancer's idle timeout) closed: a GET is sent again
                # on a new one, as client-go does for a connection reset or EOF on GET only; a write may have been
                # served, so it fails (its caller knows whether sending it again is safe).
                attempt += 1
                if method != "GET" or attempt > self._retries:
                    raise Unanswered(0, "Unreachable", str(exc) or type(exc).__name__) from None
                continue
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:  # sent (maybe), no answer read
                raise Unanswered(0, "Unreachable", str(exc) or type(exc).__name__) from None
            if status == 401 and not renewed:  # the token may have rotated: ask the hook now
                renewed = True
                if self._auth(fresh=True) != auth:
                    continue
            wait = None if _budget_refusal(status, payload) else _throttle_wait_s(status, retry_after)
            if wait is not None and throttled < THROTTLE_RETRIES and waited + wait <= self.timeout_s:
                throttled, waited = throttled + 1, waited + wait
                log.debug("%s %s answered %d with Retry-After %s: sent again in %gs", method, path, status,
                          retry_after, wait)
                await asyncio.sleep(wait)
                continue
            return status, reason, payload, retry_after

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

    async def list_versioned(
        self, res: Resource, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> Listed:
        """LIST every object (optionally by label and field selector) in pages of :data:`PAGE_SIZE`
        (``limit``/``continue``: one snapshot, as the API server serves a paginated list), with the list's
        resourceVersion (every page carries the first page's).

        A continue token that outlived the server's window (410 Expired on a later page: etcd compacted the
        snapshot's revision, 5 minutes by default) is neither retried nor followed with the "inconsistent" token
        its Status offers: the list is read again whole, without ``limit``, as client-go's pager does
        (k8s.io/client-go/tools/pager/pager.go, ``FullListIfExpired``), so the result is always one consistent
        snapshot. Expired on the first page, or any other failure, is raised."""
        items: list[dict[str, Any]] = []
        selector = {"labelSelector": labels} if labels else {}
        if fields:
            selector["fieldSelector"] = fields
        query = {"limit": str(PAGE_SIZE), **selector}
        version = ""
        while True:
            try:
                page = await self._call("GET", res.path(namespace), query=query)
            except Expired as exc:
                if "continue" not in query:
                    raise
                log.info("the continue token of a paged LIST of %s expired (%s); listing it whole", res.plural,
                         exc.message)
                whole = await self._call("GET", res.path(namespace), query=selector or None)
                meta = whole.get("metadata") or {}
                return Listed(list(whole.get("items") or []), str(meta.get("resourceVersion") or ""))
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            if not meta.get("continue"):
                return Listed(items, version)
            query["continue"] = str(meta["continue"])

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
        """Watch events after ``resource_version`` (with bookmarks), in batches of the lines that arrived together,
        each parsed once into plain dicts. An ERROR event ends the stream: Expired for 410, else ApiError with its
        code; a broken connection is ApiError 0. A 401 refreshes the token (the configuration's hook) before it is
        raised, so the watch opened next carries the new one. Closing the iterator closes the connection."""
        params = [("watch", "true"), ("allowWatchBookmarks", "true"), ("resourceVersion", resource_version),
                  ("timeoutSeconds", str(timeout_s)), *((("labelSelector", labels),) if labels else ()),
                  *((("fieldSelector", fields),) if fields else ())]
        path = res.path(namespace)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=timeout_s + 30)
        try:
            async with self._http().get(self.configuration.host + path, params=params, timeout=timeout,
                                        headers=self._headers(), **self._proxy) as response:
                if response.status >= 400:
                    if response.status == 401:  # the token may have rotated: the next watch asks the hook anew
                        self._auth(fresh=True)
                    raise _error(response.status, response.reason or "", await response.read(), "WATCH",
                                 response.headers.get("Retry-After"))
                pending = b""
                async for chunk in response.content.iter_any():
                    *lines, pending = (pending + chunk).split(b"\n")
                    events = [json.loads(line) for line in lines if line.strip()]
                    at = next((i for i, e in enumerate(events) if not isinstance(e, dict) or e.get("type") == "ERROR"),
                              None)
                    if at is not None:
                        if events[:at]:
                            yield events[:at]
                        failed = events[at]
                        if not isinstance(failed, dict):
                            raise ValueError(f"a watch event that is no object: {str(failed)[:BODY_SNIPPET]}")
                        status = failed.get("object") or {}
                        code = status.get("code") if isinstance(status, dict) else None
                        raise _error(code if isinstance(code, int) else 0, "", json.dumps(status).encode(), "WATCH")
                    if events:
                        yield events
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise ApiError(0, "Unreachable", f"watch of {path} ended: {exc!r}") from None

    async def create(
        self, res: Resource, body: Mapping[str, Any], namespace: str | None = None, *, guard: Guard | None = None,
        field_validation: str | None = None,
    ) -> dict[str, Any]:
        """POST a new object; AlreadyExists on 409. ``field_validation`` (``Strict``, ``Warn``, ``Ignore``; the
        server's default, Warn, when None) says what the server does with fields the schema does not declare:
        Strict makes them a 400 ApiError, as ``kubectl apply`` does."""
        query = {"fieldValidation": field_validation} if field_validation else None
        return await self._call("POST", res.path(namespace), body=dict(body), query=query, guard=guard)

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
        guard: Guard | None = None,
        field_validation: str | None = None,
    ) -> dict[str, Any]:
        """JSON merge-patch an object (or its /status); Conflict when a given resourceVersion is stale;
        ``field_validation`` as for :meth:`create` (Strict: unknown fields are a 422)."""
        path = res.path(namespace, name, "status" if status else None)
        query = {"fieldValidation": field_validation} if field_validation else None
        return await self._call("PATCH", path, body=dict(patch), query=query, content_type=MERGE_PATCH, guard=guard)

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
        """Close the connections (of the running loop's session) and the kubernetes client's pool."""
        session, self._session = self._session, None
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()
        await asyncio.to_thread(self._api.close)


GENERIC_REASONS: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    401: ("Unauthorized", "the server has asked for the client to provide credentials"),
    403: ("Forbidden", "the server does not allow access to the requested resource"),
    404: ("NotFound", "the server could not find the requested resource"),
    405: ("MethodNotAllowed", "the server does not allow this method on the requested resource"),
    409: ("Conflict", "the server reported a conflict"),
    410: ("Expired", "the server no longer has that version"),
    413: ("RequestEntityTooLarge", "the request body is larger than the server accepts"),
    415: ("UnsupportedMediaType", "the server does not accept the body's content type"),
    422: ("Invalid", "the server rejected our request due to an error in our request"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted, but may still be processing "
                    "the request"),
}


def _throttle_wait_s(status: int, retry_after: str | None) -> float | None:
    """Seconds to wait before sending again a request answered ``status`` with header ``retry_after``; None when it
    is not to be sent again. As client-go's ``checkWait``: only a 429 or a 5xx, only with a Retry-After in whole
    seconds; here at least :data:`RETRY_AFTER_MIN_S`, at most :data:`RETRY_AFTER_MAX_S`."""
    if status != 429 and status < 500:
        return None
    seconds = _seconds(retry_after)
    return None if seconds is None else min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, seconds))


def _budget_refusal(status: int, payload: bytes) -> bool:
    """Whether an answer is the Eviction API's refusal by a PodDisruptionBudget (a 429 whose metav1 Status has a
    cause of reason ``DisruptionBudget``), not throttling: never sent again here, even with the Retry-After (10 s)
    of a budget the disruption controller has not processed yet; the caller decides (defragmentation refuses the plan
    and plans again in a later cycle, k8s.evictions)."""
    if status != 429 or not payload.startswith(b"{"):
        return False
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    causes = ((body.get("details") or {}).get("causes") or []) if isinstance(body, dict) else []
    return any(isinstance(c, dict) and c.get("reason") == "DisruptionBudget" for c in causes)


def _seconds(value: Any) -> float | None:
    """A Retry-After in whole seconds (header text or a number); None when there is none or it is no number (an
    HTTP date: the API server never sends one)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    text = str(value or "").strip()
    return float(text) if text.isdigit() else None


def _error(status: int, http_reason: str, body: Any, method: str, retry_after: str | None = None) -> ApiError:
    """The ApiError of an answer: from its metav1 Status (reason, message, details.causes, details.retryAfterSeconds)
    when the body is one; else client-go's reason and message for the code followed by the start of the body (HTML
    tags dropped), whatever it is: HTML, text, JSON of another shape, bytes that are no UTF-8. Never raises."""
    raw = body if isinstance(body, bytes) else str(body or "").encode()
    try:
        detail = json.loads(raw or b"null")
    except (TypeError, ValueError):
        detail = None
    is_status = isinstance(detail, dict) and (detail.get("kind") == "Status" or isinstance(detail.get("code"), int))
    if isinstance(detail, dict) and is_status:
        reason = str(detail.get("reason") or GENERIC_REASONS.get(status, (http_reason,))[0] or http_reason)
        message = str(detail.get("message") or "")
        found = detail.get("details")
        details: dict[str, Any] = found if isinstance(found, dict) else {}
    else:
        reason, said = GENERIC_REASONS.get(status, ("InternalError" if status >= 500 else (http_reason or "Unknown"),
                                                    "an error on the server has prevented the request from "
                                                    "succeeding" if status >= 500 else ""))
        text = " ".join(re.sub(r"<[^>]*>", " ", raw.decode("utf-8", errors="replace")).split())
        snippet = text[:BODY_SNIPPET] + ("..." if len(text) > BODY_SNIPPET else "")
        message = "; ".join(p for p in (said, f"{status} {http_reason} with a body that is no Status: {snippet}"
                                        if snippet else "") if p)
        details = {}
    causes = tuple(c for c in details.get("causes") or () if isinstance(c, dict))
    wait = _seconds(retry_after)
    if wait is None:
        wait = _seconds(details.get("retryAfterSeconds"))
    if status == 404:
        return NotFound(status, reason, message, retry_after_s=wait, causes=causes)
    if status == 410:
        return Expired(status, reason, message, retry_after_s=wait, causes=causes)
    if status == 409:
        cls = AlreadyExists if method == "POST" or reason == "AlreadyExists" else Conflict
        return cls(status, reason, message, retry_after_s=wait, causes=causes)
    if (status >= 500 and not is_status) or (status == 504 and reason == "Timeout"):
        # a 5xx that is no Status (a proxy's 502/504, a server dying mid-answer), or the API server's own 504 Timeout
        # (its timeout filter answers while the handler goes on and may still commit): it may have been served
        return Unanswered(status, reason, message, retry_after_s=wait, causes=causes)
    return ApiError(status, reason, message, retry_after_s=wait, causes=causes)


__all__ = [
    "Guard",
    "ADMISSIONCHECKS",
    "AlreadyExists",
    "ApiError",
    "CONFIGMAPS",
    "Conflict",
    "DEVICECLASSES",
    "EVENTS",
    "Expired",
    "Fenced",
    "GPUCLUSTERQUEUES",
    "GPULOCALQUEUES",
    "GPUNODES",
    "GPURESOURCEFLAVORS",
    "GPUTASKS",
    "JOBS",
    "KubeApi",
    "KubeClient",
    "LEASES",
    "LOCALQUEUES",
    "Listed",
    "NAMESPACES",
    "NODES",
    "NotFound",
    "PODS",
    "PRIORITYCLASSES",
    "RESOURCECLAIMS",
    "RESOURCECLAIMTEMPLATES",
    "RUNTIMECLASSES",
    "SERVICES",
    "Resource",
    "Unanswered",
    "WORKLOADPRIORITYCLASSES",
    "WORKLOADS",
    "at_version",
    "doubling_backoff_s",
    "load_api_client",
]
