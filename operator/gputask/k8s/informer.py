"""List, then watch: the operator's own informer, for every kind it watches.

Why not kopf's watches (kopf stays the operator's framework: start-up, login, probes, peering): in a 2,000-task burst
(``bench/e2e_burst.py --profile``, py-spy) the operator spent 48% of its CPU in kopf's per-event machinery
for the three events each task causes (its GPUTask added, the echo of our status write, its Job added): a
worker task per object, and per event a body, patch, logger, cause and memo built and the handler invoked
through context variables, while the handlers themselves took 6%. At 6.8 ms of CPU per task the operator
made Jobs at 0.3 times the rate the API server accepted GPUTasks. Here each event is parsed once (JSON to
plain dicts, as the lines of a chunk arrive) and handed over in batches: one lock of the core gate and one
wake of the scheduling loop per batch. The other kinds (Nodes, GPUNodes, queues, flavors, priority classes,
Namespaces, Kueue's objects) came through kopf too, until one ingestion path made every feed testable on
:class:`~gputask.testing.fake.FakeKubeClient` and the rebuild need no replay of events kept aside.

The rules are client-go's reflector's:

- LIST (in pages), then WATCH from the list's resourceVersion, so nothing that happens in between is lost
  (the operator's rebuild does the first LIST and starts the informer from its resourceVersion);
- every event, bookmarks included, moves the resourceVersion on; a watch the server ends (its timeout) is
  opened again from there;
- 410 Gone/Expired (that resourceVersion is older than the server keeps): LIST again and hand over the
  whole listing (:meth:`Sink.replace`): the consumer compares it with what it knows, as an informer's
  ``Replace`` does (objects missing from it were deleted meanwhile), and the watch goes on from the new list;
- any other failure (connection lost, 5xx, 401, 403, 404, 429) is retried from the same resourceVersion after a
  backoff of 1 s doubling to 30 s, or the server's Retry-After when that is longer (a 429 from API Priority and
  Fairness), and logged once per kind of failure (status and reason; the repeats at debug level, the recovery
  at info), so a cluster that refuses for an hour fills no log; the stream never stops for good while the
  informer runs;
- a sink that fails (a bug in what the events feed) is logged with its traceback and the informer lists again
  after the backoff: the events of that batch may be half applied, and only a new listing makes the consumer
  whole again (client-go's handlers cannot fail; ours can, and must not end the stream in silence).

An informer started without a resourceVersion (a kind the rebuild did not list, or whose listing was refused)
lists first and hands that listing over (:meth:`Sink.replace`), then watches. An ``optional`` kind (a Kueue CRD that
may not be installed) answered 404 is not served: that is said once at info level and it is looked for again every
30 s (kopf noticed a CRD installed later through its watch of CustomResourceDefinitions; the Kueue support reads
Kueue's LocalQueues and configuration every 30 s too).

A BOOKMARK (``allowWatchBookmarks``, its object carrying only ``metadata.resourceVersion``: "all changes up to
here were sent", https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks) only moves the
resourceVersion on: a watch resumed from there is far less likely to be answered 410 after a quiet spell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

from gputask.k8s.client import WATCH_TIMEOUT_S, ApiError, Expired, KubeApi, Listed, Resource, doubling_backoff_s

log = logging.getLogger("gputask.informer")

RETRY_S = 1.0
RETRY_MAX_S = 30.0
STOP_TIMEOUT_S = 10.0
ABSENT_RETRY_S = 30.0  # how often an optional resource that is not served is looked for again
SHORT_WATCH_S = 1.0  # a watch the server ends this soon without an event counts as a failure (no hot loop)


class Sink(Protocol):
    """What an informer feeds."""

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Events (ADDED, MODIFIED, DELETED; each with ``object``) in the order the server sent them."""
        ...

    async def replace(self, listed: Listed) -> None:
        """A new listing after a gap: everything that exists now (what is not in it is gone)."""
        ...


class Informer:
    """Keeps one resource's objects flowing into a :class:`Sink`, from a resourceVersion on.

    ``namespace`` None watches every namespace; ``labels`` and ``fields`` are a label and a field selector the
    server applies (an object that stops matching them comes as DELETED, with its previous state); ``name`` is what
    its log lines call the objects (the resource's plural unless given: two informers may watch one resource);
    ``optional`` a resource whose API may not be served (a 404 is its absence, not a failure).
    """

    def __init__(
        self,
        client: KubeApi,
        resource: Resource,
        sink: Sink,
        *,
        namespace: str | None = None,
        labels: str | None = None,
        fields: str | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
        name: str | None = None,
        optional: bool = False,
    ) -> None:
        self.client = client
        self.resource = resource
        self.sink = sink
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.name = name or resource.plural
        self.timeout_s = timeout_s
        self.optional = optional
        self.resource_version = ""
        self.relists = 0  # LISTs after a 410 (a gap in the watch)
        self.events = 0  # events handed over (bookmarks not counted)
        self.failures = 0  # watches and listings that failed, in all
        self._failing: tuple[str, int, str] | None = None  # the kind of failure last logged (what, status, reason)
        self._task: asyncio.Task[None] | None = None

    def start(self, resource_version: str) -> None:
        """Watch from ``resource_version`` (the LIST the sink was built from) until :meth:`stop`; with ``""`` (no
        such LIST), list first and hand the listing over."""
        self.resource_version = resource_version
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"gputask-informer-{self.name.replace(' ', '-')}")

    async def stop(self) -> None:
        """Stop watching and wait (at most 10 s) for the task to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        if not done:
            log.error("the %s informer did not stop within %gs of being cancelled", self.name,
                      STOP_TIMEOUT_S)
        elif not task.cancelled() and task.exception() is not None:
            log.error("the %s informer had failed", self.name, exc_info=task.exception())

    async def _run(self) -> None:
        # stale: the sink must be handed a new listing before the next watch (at once when started without a version)
        failures, stale = 0, not self.resource_version
        while True:
            started, seen = time.monotonic(), self.events
            try:
                if stale:
                    await self._relist()
                    stale = False
                await self._watch()
            except Expired as exc:
                log.info("watch of %s expired at resourceVersion %s (%s); listing again", self.name,
                         self.resource_version, exc.message)
                stale, failures = True, 0
                continue
            except ApiError as exc:
                failures += 1
                stale = stale or self._absent(exc)  # served again later: from a new listing
                await self._failed("watch", exc, failures)
                continue
            except Exception:  # the sink failed: a bug downstream; never end the stream in silence
                failures += 1
                log.exception("feeding %s to the operator failed; listing again in %gs", self.name,
                              _backoff_s(failures))
                stale = True
                await asyncio.sleep(_backoff_s(failures))
                continue
            self._recovered()
            if self.events == seen and time.monotonic() - started < SHORT_WATCH_S:
                failures += 1
                await asyncio.sleep(_backoff_s(failures))
            else:
                failures = 0

    async def _failed(self, what: str, exc: ApiError, failures: int) -> None:
        """Log a failed watch or listing (once per kind of failure in a row) and wait: the backoff, or the
        server's Retry-After when longer (at most :data:`RETRY_MAX_S`)."""
        self.failures += 1
        wait = _backoff_s(failures)
        if exc.retry_after_s is not None:
            wait = min(RETRY_MAX_S, max(wait, exc.retry_after_s))
        kind = (what, exc.status, exc.reason)
        if self._absent(exc):
            wait = ABSENT_RETRY_S
            if kind != self._failing:
                self._failing = kind
                log.info("%s are not served (API not installed: %s); looked for again every %gs", self.name, exc,
                         wait)
            else:
                log.debug("%s are still not served; looked for again in %gs", self.name, wait)
        elif kind != self._failing:
            self._failing = kind
            log.warning("%s of %s failed (%s); again from resourceVersion %s in %gs (repeats of this failure are "
                        "logged at debug level)", what, self.name, exc, self.resource_version or "-", wait)
        else:
            log.debug("%s of %s failed again (%s); again in %gs", what, self.name, exc, wait)
        await asyncio.sleep(wait)

    def _absent(self, exc: ApiError) -> bool:
        """True when ``exc`` says that an optional resource is not served (404)."""
        return self.optional and exc.status == 404

    def _recovered(self) -> None:
        if self._failing is not None:
            log.info("%s of %s works again", self._failing[0], self.name)
            self._failing = None

    async def _watch(self) -> None:
        """One watch request, from the current resourceVersion until the server ends it."""
        stream = self.client.watch(self.resource, self.namespace, resource_version=self.resource_version,
                                   labels=self.labels, fields=self.fields, timeout_s=self.timeout_s)
        try:
            async for batch in stream:
                events = []
                for event in batch:
                    version = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                    if version:
                        self.resource_version = str(version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        events.append(event)
                if self._failing is not None:
                    self._recovered()
                if events:
                    self.events += len(events)
                    await self.sink.apply(events)
        finally:
            with contextlib.suppress(Exception):  # closing a stream that failed raises its failure again
                await stream.aclose()

    async def _relist(self) -> None:
        """LIST again (retried with the backoff until it succeeds) and hand the listing over."""
        failures = 0
        while True:
            try:
                listed = await self.client.list_versioned(self.resource, self.namespace, labels=self.labels,
                                                          fields=self.fields)
                break
            except ApiError as exc:
                failures += 1
                await self._failed("listing", exc, failures)
        self._recovered()
        self.relists += 1
        await self.sink.replace(listed)
        self.resource_version = listed.resource_version


def _backoff_s(failures: int) -> float:
    """Seconds before the next try after ``failures`` in a row: 1 s doubling, at most 30 s."""
    return doubling_backoff_s(failures, RETRY_S, RETRY_MAX_S)


__all__ = ["Informer", "Sink"]
