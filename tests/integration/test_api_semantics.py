"""What a real kube-apiserver does that the operator's client and informer must survive, through the emulator (which
answers as the API server documents it) or through a small HTTP server that answers as a real one in front of it
would: paged LISTs as one snapshot and their expired continue tokens, watch bookmarks, throttling (429 with
Retry-After from API Priority and Fairness), Status bodies and bodies that are no Status."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes import client as k8s_client

from gputask.k8s import client as client_module
from gputask.k8s.client import (
    GPUTASKS,
    JOBS,
    LEASES,
    ApiError,
    Expired,
    Fenced,
    KubeClient,
    Listed,
    NotFound,
    Unanswered,
)
from gputask.k8s.informer import Informer
from gputask.k8s.leader import LeaderElector
from gputask.testing.emulator import EXPIRED_CONTINUE
from harness import Cluster, Recorder

TASKS_PATH = "/apis/gputask.io/v1alpha1/namespaces/ns/gputasks"


@pytest.fixture(autouse=True)
def no_throttle_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Retry-After of 0 is waited 0 s (instead of the 1 s floor), so throttled tests take no time."""
    monkeypatch.setattr(client_module, "RETRY_AFTER_MIN_S", 0.0)


def task(name: str) -> dict[str, Any]:
    """A GPUTask body."""
    return {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"gpus": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def job(name: str) -> dict[str, Any]:
    """A Job body."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox"}]}}}}


async def get(session: aiohttp.ClientSession, path: str, **params: str) -> tuple[int, dict[str, Any]]:
    """GET a path of the emulator: (status, JSON body)."""
    async with session.get(path, params=params) as response:
        return response.status, await response.json()


async def until(probe: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``probe()`` is true (fail after ``timeout_s``)."""
    async with asyncio.timeout(timeout_s):
        while not probe():
            await asyncio.sleep(0.01)


# -- item 1: LIST pagination ----------------------------------------------------------------------------------------


async def test_a_paged_list_is_one_snapshot_at_the_first_pages_version(cluster: Cluster) -> None:
    """Every page of a paged LIST shows the objects as they were at the first page's resourceVersion (a task
    deleted meanwhile is still served, one created meanwhile is not) and carries that version."""
    for name in ("a", "b", "c"):
        await cluster.client.create(GPUTASKS, task(name), "ns")
    async with aiohttp.ClientSession(cluster.server.url) as session:
        _, first = await get(session, TASKS_PATH, limit="2")
        await cluster.client.delete(GPUTASKS, "c", "ns")
        await cluster.client.create(GPUTASKS, task("bb"), "ns")
        _, second = await get(session, TASKS_PATH, limit="2", **{"continue": first["metadata"]["continue"]})
    pages = [([t["metadata"]["name"] for t in page["items"]], page["metadata"]["resourceVersion"],
              "continue" in page["metadata"]) for page in (first, second)]
    version = first["metadata"]["resourceVersion"]
    assert pages == [(["a", "b"], version, True), (["c"], version, False)]


async def test_an_expired_continue_token_is_410_expired_with_an_inconsistent_token(cluster: Cluster) -> None:
    """A continue token older than the kept history (etcd compacted) is answered 410 Expired with the API server's
    message and a continue token that serves the rest of the list as it is now."""
    for name in ("a", "b", "c"):
        await cluster.client.create(GPUTASKS, task(name), "ns")
    async with aiohttp.ClientSession(cluster.server.url) as session:
        _, first = await get(session, TASKS_PATH, limit="2")
        await cluster.client.create(GPUTASKS, task("d"), "ns")
        cluster.server.emulator.compact()
        status, expired = await get(session, TASKS_PATH, limit="2", **{"continue": first["metadata"]["continue"]})
        _, rest = await get(session, TASKS_PATH, **{"continue": expired["metadata"]["continue"]})
    assert (status, expired["code"], expired["reason"], expired["message"], [t["metadata"]["name"] for t in
            rest["items"]]) == (410, 410, "Expired", EXPIRED_CONTINUE, ["c", "d"])


async def test_a_list_whose_continue_token_expires_is_read_again_whole(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """list_versioned falls back to one LIST without limit when a later page's token expired (client-go's pager):
    every object as it is now, at that list's resourceVersion, instead of failing the rebuild or the relist."""
    monkeypatch.setattr(client_module, "PAGE_SIZE", 1)
    for name in ("a", "b", "c"):
        await cluster.client.create(GPUTASKS, task(name), "ns")
    client, queries = cluster.client, []
    call = client._call

    async def compacting_call(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        queries.append(sorted(kwargs.get("query") or {}))
        answer = await call(method, path, **kwargs)
        if len(queries) == 1:  # between the first page and the second: a change, then etcd compacts
            await call("POST", path, body=task("d"))
            cluster.server.emulator.compact()
        return answer

    monkeypatch.setattr(client, "_call", compacting_call)
    listed = await client.list_versioned(GPUTASKS, "ns")
    monkeypatch.undo()
    expected = Listed([await client.get(GPUTASKS, n, "ns") for n in ("a", "b", "c", "d")],
                      str(cluster.server.emulator.resource_version))
    assert (listed, queries) == (expected, [["limit"], ["continue", "limit"], []])


async def test_an_expired_first_page_is_raised() -> None:
    """Expired on a first page (no continue token: nothing to fall back from) is raised to the caller."""
    async with answering(lambda request: web.json_response(
            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
             "message": "too old resource version: 1 (5)"}, status=410)) as client:
        with pytest.raises(Expired) as expired:
            await client.list_versioned(GPUTASKS, "ns")
    assert (expired.value.status, expired.value.reason) == (410, "Expired")


# -- item 2: WATCH --------------------------------------------------------------------------------------------------


async def test_a_watch_that_allows_bookmarks_gets_one_before_its_timeout(cluster: Cluster) -> None:
    """A watch with allowWatchBookmarks gets a BOOKMARK (only metadata.resourceVersion: the store's latest, moved on
    by another resource's change) 2 s before its timeoutSeconds; a watch without it gets none."""
    rv = str(cluster.server.emulator.resource_version)
    async with aiohttp.ClientSession(cluster.server.url) as session:
        async def events(**extra: str) -> list[dict[str, Any]]:
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "3", **extra}
            async with session.get(TASKS_PATH, params=params) as response:
                return [json.loads(line) for line in (await response.read()).splitlines() if line.strip()]

        watches = asyncio.gather(events(allowWatchBookmarks="true"), events())
        await asyncio.sleep(0.2)
        await cluster.client.create(JOBS, job("j"), "ns")
        with_bookmarks, without = await watches
    latest = str(cluster.server.emulator.resource_version)
    bookmark = {"type": "BOOKMARK", "object": {"kind": "GPUTask", "apiVersion": "gputask.io/v1alpha1",
                                               "metadata": {"resourceVersion": latest}}}
    assert (with_bookmarks, without) == ([bookmark], [])


async def test_a_bookmark_lets_a_watch_resume_after_compaction_without_listing_again(cluster: Cluster) -> None:
    """The informer takes a bookmark's resourceVersion, so the watch it opens again after the server ended the
    first (timeoutSeconds) resumes past a compaction instead of getting 410 and listing everything again."""
    opened: list[str] = []
    client = cluster.client
    watch = client.watch

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(kwargs["resource_version"])
        return watch(*args, **kwargs)

    client.watch = counted  # type: ignore[method-assign]  # count the watches the informer opens
    sink = Recorder()
    informer = Informer(client, GPUTASKS, sink, namespace="ns", timeout_s=3)
    informer.start((await client.list_versioned(GPUTASKS, "ns")).resource_version)
    await until(lambda: len(opened) == 1)
    await client.create(JOBS, job("j"), "ns")  # the store's version moves on; no task changes
    await until(lambda: informer.resource_version == str(cluster.server.emulator.resource_version))
    cluster.server.emulator.compact()
    await until(lambda: len(opened) == 2)
    await client.create(GPUTASKS, task("t"), "ns")
    await until(lambda: bool(sink.events))
    await informer.stop()
    assert (sink.events, sink.listings, informer.relists) == ([("ADDED", "t")], [], 0)


def watch_stream(*writes: bytes, then_drop: bool = False) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A watch answer written in the given pieces (each flushed on its own), ended, or dropped when ``then_drop``."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for piece in writes:
            await response.write(piece)
            await asyncio.sleep(0.01)
        if then_drop:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    return answer


class answering:  # noqa: N801  (used as ``async with answering(...)``)
    """A KubeClient on a local HTTP server that answers every request with ``handler``."""

    def __init__(self, handler: Callable[[web.Request], Any]) -> None:
        self.handler = handler
        self.runner: web.AppRunner | None = None
        self.client: KubeClient | None = None

    async def __aenter__(self) -> KubeClient:
        app = web.Application()

        async def route(request: web.Request) -> web.StreamResponse:
            answer = self.handler(request)
            return await answer if asyncio.iscoroutine(answer) else answer  # type: ignore[no-any-return]

        app.router.add_route("*", "/{tail:.*}", route)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps it private
        configuration = k8s_client.Configuration()
        configuration.host = f"http://127.0.0.1:{port}"
        self.client = KubeClient(k8s_client.ApiClient(configuration))
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        assert self.client is not None and self.runner is not None
        await self.client.close()
        await self.runner.cleanup()


async def drain(client: KubeClient) -> tuple[list[list[dict[str, Any]]], ApiError | None]:
    """Every batch of one watch, and the error that ended it (None: the server ended it)."""
    batches: list[list[dict[str, Any]]] = []
    try:
        async for batch in client.watch(GPUTASKS, "ns", resource_version="5"):
            batches.append(batch)
    except ApiError as exc:
        return batches, exc
    return batches, None


async def test_a_watch_line_split_across_chunks_and_a_large_object_arrive_whole() -> None:
    """A watch event whose line arrives in several TCP writes, and one of 4 MiB, are each parsed once, whole."""
    big = {"type": "MODIFIED", "object": {"metadata": {"name": "big", "resourceVersion": "7"}, "x": "y" * (4 << 20)}}
    line = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}).encode()
    encoded = json.dumps(big).encode() + b"\n"
    pieces = [line[:9], line[9:20], line[20:] + b"\n", *(encoded[i:i + 65536] for i in range(0, len(encoded), 65536))]
    async with answering(watch_stream(*pieces)) as client:
        batches, error = await drain(client)
    events = [event for batch in batches for event in batch]
    assert (events, error) == ([json.loads(line), big], None)


async def test_a_410_in_the_stream_and_as_the_answer_are_both_expired() -> None:
    """410 Gone sent as an ERROR event (the watch cache) and as the HTTP answer (etcd) both raise Expired, after the
    events sent before it."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": "too old resource version: 5 (9)", "reason": "Expired", "code": 410}
    added = {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}
    in_stream = watch_stream(json.dumps(added).encode() + b"\n" + json.dumps({"type": "ERROR", "object": status})
                             .encode() + b"\n")
    async with answering(in_stream) as client:
        streamed = await drain(client)
    async with answering(lambda request: web.json_response({**status, "reason": "Gone"}, status=410)) as client:
        answered = await drain(client)
    assert [(batches, type(error), error and error.message) for batches, error in (streamed, answered)] == [
        ([[added]], Expired, "too old resource version: 5 (9)"), ([], Expired, "too old resource version: 5 (9)")]


async def test_a_watch_dropped_mid_line_is_unreachable_and_yields_no_half_event() -> None:
    """A connection dropped in the middle of a line ends the watch with ApiError 0 (the informer resumes from the
    last whole event), never with half an event."""
    added = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}).encode()
    async with answering(watch_stream(added + b"\n" + added[:15], then_drop=True)) as client:
        batches, error = await drain(client)
    assert (batches, error and (error.status, error.reason)) == ([[json.loads(added)]], (0, "Unreachable"))


async def test_a_watch_line_that_is_no_object_ends_the_watch_as_an_api_error() -> None:
    """A line of valid JSON that is no object (a proxy's garbage) ends the watch with ApiError 0, never an
    AttributeError that would kill the informer."""
    async with answering(watch_stream(b"null\n")) as client:
        batches, error = await drain(client)
    assert (batches, error and (error.status, error.reason)) == ([], (0, "Unreachable"))


# -- item 3: throttling ---------------------------------------------------------------------------------------------


async def test_the_emulator_throttles_as_api_priority_and_fairness_does(cluster: Cluster) -> None:
    """An injected 429 is answered as APF rejects: Retry-After and a text/plain body, no Status."""
    cluster.server.emulator.inject("GET", "/gputasks", 429, retry_after=3)
    async with aiohttp.ClientSession(cluster.server.url) as session, session.get(TASKS_PATH) as response:
        answer = (response.status, response.headers["Retry-After"], response.content_type, await response.text())
    assert answer == (429, "3", "text/plain", "Too many requests, please try again later.\n")


async def test_a_throttled_write_is_sent_again_after_retry_after(cluster: Cluster) -> None:
    """A create answered 429 with Retry-After twice is sent again each time and succeeds: one Job, no error."""
    cluster.server.emulator.inject("POST", "/jobs", 429, times=2, retry_after=0)
    created = await cluster.client.create(JOBS, job("j"), "ns")
    answers = [a.status for a in cluster.server.emulator.answers if a.path.endswith("/jobs")]
    assert (created["metadata"]["name"], answers) == ("j", [429, 429, 201])


async def test_throttling_that_lasts_is_an_api_error_with_the_servers_words(cluster: Cluster) -> None:
    """After 10 retries (client-go's limit) a 429 is raised: TooManyRequests, client-go's message and the body,
    the Retry-After the server asked for."""
    cluster.server.emulator.inject("POST", "/jobs", 429, times=11, retry_after=0)
    with pytest.raises(ApiError) as throttled:
        await cluster.client.create(JOBS, job("j"), "ns")
    error = throttled.value
    assert (error.status, error.reason, error.message, error.retry_after_s) == (
        429, "TooManyRequests", "the server has received too many requests and has asked us to try again later; "
        "429 Too Many Requests with a body that is no Status: Too many requests, please try again later.", 0.0)


async def test_a_throttled_write_asks_its_guard_again_before_it_is_sent_again(cluster: Cluster) -> None:
    """The leadership fence is asked before every send: a leader that lost the Lease while throttled does not send
    the write again (Fenced), and nothing is created."""
    cluster.server.emulator.inject("POST", "/jobs", 429, times=1, retry_after=0)
    asked: list[bool] = []

    def guard() -> bool:
        asked.append(not asked)  # leading when first asked, not any more after the 429
        return asked[-1]

    with pytest.raises(Fenced):
        await cluster.client.create(JOBS, job("j"), "ns", guard=guard)
    with pytest.raises(NotFound):
        await cluster.client.get(JOBS, "j", "ns")
    assert asked == [True, False]


async def test_a_throttled_lease_renewal_is_retried_within_the_renew_deadline(cluster: Cluster) -> None:
    """A Lease renewal answered 429 (APF: the operator's service account shares workload-low with every other
    Pod's) is sent again after Retry-After, inside the renew deadline: the leader keeps its lease."""
    elector = LeaderElector(cluster.client, identity="me", namespace="ns")
    assert await elector._attempt()
    cluster.server.emulator.inject("PUT", "/leases/", 429, times=2, retry_after=0)
    renewed = await elector._attempt()
    lease = await cluster.client.get(LEASES, "gputask-operator", "ns")
    assert (renewed, elector._fresh(), lease["spec"]["holderIdentity"]) == (True, True, "me")


async def test_a_5xx_with_retry_after_is_sent_again_and_one_without_is_not(cluster: Cluster) -> None:
    """A 503 with Retry-After (the API server starting up) is sent again (client-go's checkWait); a 500 without it
    is raised at once with the Status's reason and message."""
    cluster.server.emulator.inject("GET", "/gputasks", 503, times=1, retry_after=0)
    listed = await cluster.client.list(GPUTASKS, "ns")
    cluster.server.emulator.inject("GET", "/gputasks", 500, times=1, message="etcdserver: request timed out")
    with pytest.raises(ApiError) as failed:
        await cluster.client.list(GPUTASKS, "ns")
    answers = [a for a in (failed.value.status, failed.value.reason, failed.value.message)]
    assert (listed, answers) == ([], [500, "InternalError", "etcdserver: request timed out"])


# -- item 4: error bodies -------------------------------------------------------------------------------------------


def status_body(code: int, reason: str, message: str, **details: Any) -> bytes:
    """A metav1 Status as kube-apiserver writes it."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return json.dumps(body).encode()


CAUSE = {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.template"}
HTML_502 = b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>" \
           b"</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"


@pytest.mark.parametrize(("status", "http_reason", "body", "method", "retry_after", "expected"), [
    (404, "Not Found", status_body(404, "NotFound", 'jobs.batch "j" not found', name="j", group="batch", kind="jobs"),
     "GET", None, (NotFound, "NotFound", 'jobs.batch "j" not found', None, ())),
    (409, "Conflict", status_body(409, "AlreadyExists", 'jobs.batch "j" already exists'), "POST", None,
     (client_module.AlreadyExists, "AlreadyExists", 'jobs.batch "j" already exists', None, ())),
    (409, "Conflict", status_body(409, "Conflict", 'Operation cannot be fulfilled on leases.coordination.k8s.io "l": '
                                  "the object has been modified"), "PUT", None,
     (client_module.Conflict, "Conflict", 'Operation cannot be fulfilled on leases.coordination.k8s.io "l": the '
      "object has been modified", None, ())),
    (410, "Gone", status_body(410, "Expired", "too old resource version: 5 (9)"), "GET", None,
     (Expired, "Expired", "too old resource version: 5 (9)", None, ())),
    (422, "Unprocessable Entity", status_body(422, "Invalid", 'Job.batch "j" is invalid: spec.template: Required '
                                              "value", causes=[CAUSE]), "POST", None,
     (ApiError, "Invalid", 'Job.batch "j" is invalid: spec.template: Required value', None, (CAUSE,))),
    (429, "Too Many Requests", b"Too many requests, please try again later.\n", "PATCH", "1",
     (ApiError, "TooManyRequests", "the server has received too many requests and has asked us to try again later; "
      "429 Too Many Requests with a body that is no Status: Too many requests, please try again later.", 1.0, ())),
    (500, "Internal Server Error", status_body(500, "ServerTimeout", "The POST operation against jobs.batch could "
                                               "not be completed at this time, please try again.",
                                               retryAfterSeconds=2), "POST", None,
     (ApiError, "ServerTimeout", "The POST operation against jobs.batch could not be completed at this time, please "
      "try again.", 2.0, ())),
    (502, "Bad Gateway", HTML_502, "GET", None,
     (Unanswered, "InternalError", "an error on the server has prevented the request from succeeding; 502 Bad Gateway "
      "with a body that is no Status: 502 Bad Gateway 502 Bad Gateway nginx", None, ())),
    (503, "Service Unavailable", b"<html><body>no healthy upstream</body></html>", "GET", None,
     (Unanswered, "ServiceUnavailable", "the server is currently unable to handle the request; 503 Service "
      "Unavailable with a body that is no Status: no healthy upstream", None, ())),
    (504, "Gateway Timeout", status_body(504, "Timeout", "Timeout: request did not complete within requested "
                                         "timeout - context deadline exceeded"), "GET", None,
     (Unanswered, "Timeout", "Timeout: request did not complete within requested timeout - context deadline exceeded",
      None, ())),
    (503, "Service Unavailable", b"", "GET", None,
     (Unanswered, "ServiceUnavailable", "the server is currently unable to handle the request", None, ())),
    (500, "Internal Server Error", b"\xff\xfe[1, 2]", "GET", None,
     (Unanswered, "InternalError", "an error on the server has prevented the request from succeeding; 500 Internal "
      "Server Error with a body that is no Status: \ufffd\ufffd[1, 2]", None, ())),
    (413, "Request Entity Too Large", b'["not", "a", "status"]', "POST", None,
     (ApiError, "RequestEntityTooLarge", 'the request body is larger than the server accepts; 413 Request Entity Too '
      'Large with a body that is no Status: ["not", "a", "status"]', None, ())),
])
def test_every_error_answer_is_an_api_error_with_a_clear_message(
    status: int, http_reason: str, body: bytes, method: str, retry_after: str | None,
    expected: tuple[type[ApiError], str, str, float | None, tuple[dict[str, str], ...]],
) -> None:
    """Status bodies give their reason, message, causes and retryAfterSeconds; anything else (a load balancer's
    HTML, APF's text, JSON of another shape, bytes that are no UTF-8) gives client-go's reason and message for the
    code and the start of the body; nothing raises. A 5xx that is no Status, and a 504 Timeout, are Unanswered: the
    request may have been served."""
    error = client_module._error(status, http_reason, body, method, retry_after)
    assert (type(error), error.reason, error.message, error.retry_after_s, error.causes) == expected


async def test_a_load_balancers_html_page_reaches_the_caller_as_an_api_error() -> None:
    """A 502 HTML page from a proxy in front of the API server is an ApiError naming the code and the page's text."""
    async with answering(lambda request: web.Response(status=502, body=HTML_502, content_type="text/html")) as client:
        with pytest.raises(ApiError) as failed:
            await client.get(JOBS, "j", "ns")
    assert (failed.value.status, failed.value.reason) == (502, "InternalError")


# -- the informer's failures ----------------------------------------------------------------------------------------


async def test_a_watch_refused_in_several_ways_is_logged_once_per_way(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watches refused 403 three times, then 429, then served: one warning per kind of refusal, one note that it
    works again, and the events that follow arrive (no silent stop)."""
    from gputask.k8s import informer as informer_module

    monkeypatch.setattr(informer_module, "RETRY_S", 0.01)
    emulator = cluster.server.emulator
    emulator.inject("GET", "/gputasks", 403, times=3, message='gputasks.gputask.io is forbidden: User '
                    '"system:serviceaccount:gputask:gputask" cannot watch resource "gputasks"')
    emulator.inject("GET", "/gputasks", 429, times=1, retry_after=0)
    sink = Recorder()
    caplog.set_level(logging.DEBUG, logger="gputask.informer")
    informer = Informer(cluster.client, GPUTASKS, sink, namespace="ns")
    informer.start(str(emulator.resource_version))
    await cluster.client.create(GPUTASKS, task("t"), "ns")
    await until(lambda: bool(sink.events))
    await informer.stop()
    logged = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records if r.levelno >= logging.INFO]
    assert (logged, sink.events, informer.failures) == (
        [("WARNING", "watch of gputasks failed"), ("WARNING", "watch of gputasks failed"),
         ("INFO", "watch of gputasks works again")], [("ADDED", "t")], 4)


async def test_a_sink_that_fails_is_logged_and_the_informer_lists_again(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink that raises (a bug downstream) does not end the informer: the failure is logged with its traceback,
    the informer lists again (the batch may be half applied) and goes on watching."""
    from gputask.k8s import informer as informer_module

    monkeypatch.setattr(informer_module, "RETRY_S", 0.01)

    class Failing(Recorder):
        async def apply(self, events: list[dict[str, Any]]) -> None:
            if not self.listings:
                raise KeyError("metadata")
            await super().apply(events)

    sink = Failing()
    informer = Informer(cluster.client, GPUTASKS, sink, namespace="ns")
    informer.start(str(cluster.server.emulator.resource_version))
    await cluster.client.create(GPUTASKS, task("a"), "ns")
    await until(lambda: bool(sink.listings))
    await cluster.client.create(GPUTASKS, task("b"), "ns")
    await until(lambda: bool(sink.events))
    await informer.stop()
    tracebacks = [r.exc_info is not None for r in caplog.records if r.name == "gputask.informer"
                  and r.levelno == logging.ERROR]
    assert (sink.listings, sink.events, informer.relists, tracebacks) == ([["a"]], [("ADDED", "b")], 1, [True])



# -- item 5: connections --------------------------------------------------------------------------------------------


async def test_a_get_on_a_connection_the_server_closed_is_sent_again_and_a_write_is_not() -> None:
    """A kept-alive connection closed by the server (a load balancer's idle timeout) before it answered: a GET is
    sent again on a new connection and answered; a POST fails as Unreachable and is not sent twice."""
    seen: list[str] = []

    def answer(request: web.Request) -> web.Response:
        seen.append(request.method)
        if len(seen) in (1, 3):  # the first GET and the POST: the connection drops, nothing answered
            assert request.transport is not None
            request.transport.close()
        return web.json_response({"kind": "Job", "metadata": {"name": "j"}})

    async with answering(answer) as client:
        got = await client.get(JOBS, "j", "ns")
        with pytest.raises(ApiError) as dropped:
            await client.create(JOBS, job("j"), "ns")
    assert (got["metadata"], seen, dropped.value.status) == ({"name": "j"}, ["GET", "GET", "POST"], 0)
