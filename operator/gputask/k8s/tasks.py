"""Task transitions: each sets the record (:mod:`gputask.k8s.phases`, through :mod:`gputask.k8s.records`, the one
module that changes records), then writes the status and posts the Event in one call (:meth:`Transitions.say`).

A transition changes the record before any ``await``, so a watch event handled meanwhile sees the new state.
The record's phases are described in :mod:`gputask.k8s.records`; its names are re-exported here.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gputask.core import MILLI_PER_GPU, Placement, TaskKey
from gputask.k8s import phases, records
from gputask.k8s.client import ApiError, Conflict, Fenced, NotFound, doubling_backoff_s
from gputask.k8s.phases import Said
from gputask.k8s.records import (
    ADMITTED,
    FAILED,
    FINISHED_PHASES,
    JOB_FAILED,
    MAX_CONDITION_MESSAGE,
    PENDING,
    PLACED_PHASES,
    POSITION_SUFFIX,
    REQUEUE_CONDITIONS,
    RUNNING,
    SUCCEEDED,
    Backoff,
    TaskRecord,
    position_text,
    reset_requeue_conditions,
    set_condition,
)
from gputask.k8s.workload import workload_of
from gputask.k8s.writer import Writer

log = logging.getLogger("gputask.tasks")

CONFLICT_RETRIES = 5
STATUS_RETRY_S = 1.0  # a refused status write is tried again after 1 s, doubling ...
STATUS_RETRY_MAX_S = 60.0  # ... up to a minute
MAX_KEPT_EVENTS = 8  # Events kept with an unwritten status, posted once it is written
WRITTEN, REFUSED, GONE = "written", "refused", "gone"


@dataclass(slots=True)
class Unwritten:
    """A status the API server refused: the record, its message, the Events to post after it,
    failures so far and the next try (monotonic seconds)."""

    record: TaskRecord
    message: str
    events: list[tuple[str, str, str]]
    failures: int
    retry_at: float


def placement_status(placement: Placement | None) -> dict[str, Any] | None:
    """The ``status.placement`` object of a GPUTask's placement (one pod)."""
    if placement is None:
        return None
    if len(placement.pods) != 1:  # a gang (status.placement.pods is the gang API's; this keeps the status whole)
        return {"pods": [{"node": p.node, "gpus": [{"index": g.index, "uuid": g.uuid, "memory": g.memory_mib}
                                                  for g in p.gpus]} for p in placement.pods]}
    pod = placement.only()
    return {
        "node": pod.node,
        "gpus": [{"index": g.index, "uuid": g.uuid, "memory": g.memory_mib} for g in pod.gpus],
    }


def mib_quantity(mib: int) -> str:
    """MiB as a Kubernetes quantity: ``12Gi`` when whole GiB, else ``1536Mi``."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def memory_text(record: TaskRecord) -> str | None:
    """``status.gpuMemory``: MiB reserved on each GPU once placed, else what the task asks."""
    if record.placement is not None:
        slots = (g for pod in record.placement.pods for g in pod.gpus)
        return "/".join(dict.fromkeys(mib_quantity(g.memory_mib) for g in slots))
    if record.task is None:
        return None
    request = record.task.request
    if request.memory_mib is not None:
        return mib_quantity(request.memory_mib)
    if request.fraction_milli is not None and request.fraction_milli < MILLI_PER_GPU:
        return f"{request.fraction_milli / 10:g}%"
    return "whole GPU"


def describe(placement: Placement) -> str:
    """``node-a GPUs [0, 1] (12288 MiB each)``-style summary of a GPUTask's placement (one pod); ``8 pods on 2
    nodes (node-a, node-b)`` for several."""
    if len(placement.pods) != 1:
        nodes = placement.nodes
        return f"{len(placement.pods)} pods on {len(nodes)} node{'s' if len(nodes) != 1 else ''} ({', '.join(nodes)})"
    pod = placement.only()
    mib = sorted({g.memory_mib for g in pod.gpus})
    each = f"{mib[0]} MiB each" if len(mib) == 1 else f"{mib} MiB"
    return f"{pod.node} GPUs {list(pod.indices)} ({each})"


class Transitions:
    """Moves tasks between phases: sets the record, writes the status, posts the Event."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        self.conflicts = 0  # status writes answered 409, retried after a fresh read
        self.skipped = 0  # status writes left out: the stored status already said the same
        self.unwritten: dict[TaskKey, Unwritten] = {}  # refused status writes, tried again by retry()
        self._due: list[tuple[float, TaskKey]] = []  # heap of (retry_at, task) of those; outdated entries skipped

    # -- transitions (the record changed by gputask.k8s.phases, then what it says written) ----------------
    async def admitted(
        self, record: TaskRecord, placement: Placement, *, job_name: str | None, attempt: int, quota: str, message: str
    ) -> None:
        """Placed with quota reserved (``quota`` says by whom) and its Job created (or to come)."""
        await self.say(phases.admitted(record, placement, job_name=job_name, attempt=attempt, quota=quota,
                                       message=message))

    async def running(self, record: TaskRecord, message: str) -> None:
        """A pod of its Job runs."""
        await self.say(phases.running(record, message))

    async def waiting(self, record: TaskRecord, reason: str, message: str, position: int | None = None) -> None:
        """Pending for ``reason``; the Event is posted only for a new reason, not a new position."""
        await self.say(phases.waiting(record, reason, message, position))

    async def evicted(self, record: TaskRecord, reason: str, message: str) -> None:
        """Evicted from its placement and requeued (the Job is being deleted)."""
        await self.say(phases.evicted(record, reason, message))

    async def rejected(self, record: TaskRecord, reason: str, message: str) -> None:
        """Its Job was refused (or could not start): Pending, with the API's words, until it is retried."""
        await self.say(phases.rejected(record, reason, message))

    async def blocked(self, record: TaskRecord, reason: str, message: str) -> None:
        """Pending outside any queue until something it names exists (e.g. PriorityClassNotFound)."""
        await self.say(phases.blocked(record, reason, message))

    async def failed(self, record: TaskRecord, reason: str, message: str) -> None:
        """Failed for good (MaxReschedulesExceeded): it is no longer queued."""
        await self.say(phases.failed(record, reason, message))

    async def invalid(self, record: TaskRecord) -> None:
        """A spec that can never run: Failed with the reason, until the spec changes."""
        await self.say(phases.invalid(record))

    async def finished(self, record: TaskRecord, outcome: str, why: str = "") -> None:
        """Its Job completed (Succeeded) or failed (Failed; ``why``: the Job's Failed condition, "reason: message")
        (:func:`gputask.k8s.phases.finished`)."""
        await self.say(phases.finished(record, outcome, why))

    async def gpus_held(self, record: TaskRecord, note: str, *, held: bool) -> None:
        """Its GPUs stay ``held`` until an old Job's pods are gone, or are released now
        (:func:`gputask.k8s.phases.gpus_held`)."""
        said = phases.gpus_held(record, note, held=held)
        if said is not None:
            await self.say(said)

    async def condition(self, record: TaskRecord, ctype: str, status: bool, reason: str, message: str) -> None:
        """Set another condition (KueueConflict); a Warning Event when it turns True."""
        await self.say(phases.condition(record, ctype, status, reason, message))

    async def note(self, record: TaskRecord, etype: str, reason: str, message: str) -> None:
        """An Event only (e.g. SpecChangeIgnored): the status does not change."""
        await self.writer.event(record.involved(), etype, reason, message)

    async def say(self, said: Said) -> None:
        """Write what ``said`` says: the status and then its Event (:meth:`publish`), or its Event alone."""
        if said.status:
            await self.publish(said.record, said.message, said.event)
        elif said.event is not None:
            await self.writer.event(said.record.involved(), *said.event)

    # -- writing ------------------------------------------------------------------------------------
    def status_of(self, record: TaskRecord, message: str) -> dict[str, Any]:
        """The status a record stands for."""
        return {
            "phase": record.phase,
            "conditions": list(record.conditions.values()),
            "placement": placement_status(record.placement),
            "attempt": record.attempt,
            "reschedules": record.reschedules,
            "jobName": record.job_name,
            "priority": record.task.priority if record.task is not None else 0,
            "queuePosition": record.queue_position if record.phase == PENDING else None,
            "queue": record.task.queue if record.task is not None else None,
            "flavor": (record.flavor or None) if record.phase in PLACED_PHASES else None,
            "gpuMemory": memory_text(record),
            "admittedAt": record.admitted_at,
            "observedGeneration": record.generation or None,
            "message": message,
        }

    async def publish(self, record: TaskRecord, message: str, event: tuple[str, str, str] | None = None) -> None:
        """Write the status the record stands for, then post ``event`` (type, reason, message).

        A write the API server refused (5xx, 429, conflicts past :data:`CONFLICT_RETRIES`) is kept
        with its Events and tried again after a backoff (:meth:`retry`); a newer status for the
        same task replaces it. A task deleted meanwhile, or a write fenced because this replica
        stopped leading, is not kept: there is nothing to write, or the next leader writes it.
        """
        pending = self.unwritten.pop(record.key, None)
        events = [*(pending.events if pending else ()), *([event] if event else [])]
        if not events and _same_status(record.obj.get("status"), self.status_of(record, message)):
            self.skipped += 1  # the stored status says it already (a restart's first cycle, mostly)
            return
        outcome = await self.write_status(record, message)
        if outcome == WRITTEN:
            for each in events:
                await self.writer.event(record.involved(), *each)
        elif outcome == REFUSED:
            failures = (pending.failures if pending else 0) + 1
            retry_at = time.monotonic() + doubling_backoff_s(failures, STATUS_RETRY_S, STATUS_RETRY_MAX_S)
            self.unwritten[record.key] = Unwritten(record, message, events[-MAX_KEPT_EVENTS:], failures, retry_at)
            heapq.heappush(self._due, (retry_at, record.key))

    async def retry(self, now: float | None = None) -> None:
        """Write again the statuses whose backoff has passed (``now``: monotonic seconds): only those due, not a
        pass over every refused one."""
        now = time.monotonic() if now is None else now
        while self._due and self._due[0][0] <= now:
            at, key = heapq.heappop(self._due)
            pending = self.unwritten.get(key)
            if pending is not None and pending.retry_at == at:  # not written or replaced meanwhile
                await self.publish(pending.record, pending.message)

    async def write_status(self, record: TaskRecord, message: str) -> str:
        """Patch the GPUTask's status with optimistic concurrency: WRITTEN, REFUSED (try again) or GONE.

        The patch carries the resourceVersion last seen; on 409 Conflict the object is read
        again (GONE if it was deleted or re-created under a new uid) and the write retried.
        GONE also when this replica is fenced (not leading): the next leader writes it.
        """
        status = self.status_of(record, message)
        for _ in range(CONFLICT_RETRIES):
            meta = record.obj["metadata"]
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status}
            try:
                stored = await self.writer.patch(workload_of(record).status_resource, meta["name"], body,
                                                 record.namespace, status=True)
            except Conflict:
                self.conflicts += 1
                fresh = await self._refresh(record)
                if fresh != WRITTEN:
                    return fresh
                continue
            except (NotFound, Fenced):
                return GONE
            except ApiError as exc:
                log.warning("status patch of %s failed: %s; tried again later", record.key, exc)
                return REFUSED
            records.status_written(record, stored, status, body["metadata"]["resourceVersion"])
            return WRITTEN
        log.warning("status patch of %s kept conflicting; tried again later", record.key)
        return REFUSED

    async def _refresh(self, record: TaskRecord) -> str:
        """Re-read the GPUTask after a conflict: WRITTEN (read, write again), GONE (deleted, or another
        object now) or REFUSED (the read failed)."""
        try:
            fresh = await self.writer.client.get(workload_of(record).status_resource, record.name, record.namespace)
        except NotFound:
            return GONE
        except ApiError:
            return REFUSED
        if fresh["metadata"].get("uid") != record.uid:
            return GONE
        records.version_read(record, fresh["metadata"].get("resourceVersion"))
        return WRITTEN


def _same_status(stored: Any, wanted: Mapping[str, Any]) -> bool:
    """True when ``stored`` (a task's status as last read or written) already holds every field of ``wanted``
    (a field ``wanted`` sets to None must be absent or None there)."""
    if not isinstance(stored, Mapping):
        return False
    return all(stored.get(k) == v for k, v in wanted.items())


def status_behind(record: TaskRecord) -> bool:
    """True when the stored status does not yet say what the record knows (phase, Job name)."""
    status: Mapping[str, Any] = record.obj.get("status") or {}
    return status.get("jobName") != record.job_name or status.get("phase") != record.phase


__all__ = [
    "ADMITTED",
    "FAILED",
    "FINISHED_PHASES",
    "JOB_FAILED",
    "MAX_CONDITION_MESSAGE",
    "PENDING",
    "PLACED_PHASES",
    "POSITION_SUFFIX",
    "REQUEUE_CONDITIONS",
    "RUNNING",
    "SUCCEEDED",
    "Backoff",
    "TaskRecord",
    "Transitions",
    "position_text",
    "reset_requeue_conditions",
    "set_condition",
]
