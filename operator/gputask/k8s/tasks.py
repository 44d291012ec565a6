"""What the operator knows of each GPUTask, and the one owner of its state transitions.

:class:`TaskRecord` is the operator's view of one GPUTask. Its ``phase`` and conditions change
only through :class:`Transitions`: each transition sets them (before any ``await``, so a watch
event handled meanwhile sees the new state), then writes the status and posts the Event in one
call. The phases (DESIGN.md section 2):

- ``Pending``: waiting to be admitted; the ``Admitted`` condition's reason says why;
- ``Admitted``: placed, quota reserved, its Job created, no pod of it running yet;
- ``Running``: a pod of its Job is running (the pod's phase, not ``Job.status.active``,
  which also counts pods still Pending);
- ``Succeeded`` / ``Failed``: its Job completed or failed, or it failed for good (invalid spec,
  too many reschedules).
"""

from __future__ import annotations

import heapq
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gputask.core import MILLI_PER_GPU, Placement, Task, TaskKey
from gputask.k8s.client import GPUTASKS, ApiError, Conflict, Fenced, NotFound, doubling_backoff_s
from gputask.k8s.lingering import HELD_NOTE
from gputask.k8s.writer import Writer, now_rfc3339

log = logging.getLogger("gputask.tasks")

PENDING, ADMITTED, RUNNING, SUCCEEDED, FAILED = "Pending", "Admitted", "Running", "Succeeded", "Failed"
FINISHED_PHASES = (SUCCEEDED, FAILED)
PLACED_PHASES = (ADMITTED, RUNNING)
JOB_FAILED = "JobFailed"  # the Admitted condition's reason once its Job failed (kubectl get gt: REASON)
CONFLICT_RETRIES = 5
STATUS_RETRY_S = 1.0  # a refused status write is tried again after 1 s, doubling ...
STATUS_RETRY_MAX_S = 60.0  # ... up to a minute
MAX_KEPT_EVENTS = 8  # Events kept with an unwritten status, posted once it is written
WRITTEN, REFUSED, GONE = "written", "refused", "gone"
API_VERSION = "gputask.io/v1alpha1"
MAX_CONDITION_MESSAGE = 32768  # metav1.Condition's message maxLength
REQUEUE_CONDITIONS = ("Evicted", "Requeued")  # True from an eviction until the next quota reservation


@dataclass(slots=True)
class Backoff:
    """Retries of a task whose Job the API server refused: ``failures`` so far, next try at ``retry_at``
    (monotonic seconds), for the spec of ``generation`` (a new spec starts over)."""

    failures: int = 0
    retry_at: float = 0.0
    generation: int = 0


@dataclass(slots=True)
class Unwritten:
    """A status the API server refused: the record, its message, the Events to post after it,
    failures so far and the next try (monotonic seconds)."""

    record: TaskRecord
    message: str
    events: list[tuple[str, str, str]]
    failures: int
    retry_at: float


@dataclass(slots=True)
class TaskRecord:
    """What the operator knows of one GPUTask (by ``namespace/name``).

    ``task`` is the core Task converted from the spec of ``generation``; ``invalid`` a reason and
    message that make it Failed (a spec that can never run); ``blocked`` one that keeps it Pending
    outside any queue until something changes (a PriorityClass not created yet).
    """

    key: TaskKey
    uid: str
    obj: dict[str, Any]
    task: Task | None = None
    generation: int = 0
    phase: str = PENDING
    attempt: int = 0
    job_name: str | None = None
    placement: Placement | None = None
    admitted_at: str | None = None
    invalid: tuple[str, str] | None = None
    blocked: tuple[str, str] | None = None
    deleting: bool = False
    reschedules: int = 0
    queue_position: int | None = None
    last_wait: tuple[str, str] | None = None
    backoff: Backoff = field(default_factory=Backoff)
    revision: tuple[Task, int] | None = None  # the spec edited while placed: applies at the next admission
    revision_error: tuple[str, str] | None = None  # that edit is invalid: the task fails when requeued
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    flavor: str = ""  # the ResourceFlavor of its current admission ("" for a queue without resourceGroups)
    whole_at: str | None = None  # the resourceVersion at which ``obj`` is the whole stored object (None: unsure)
    creating: str | None = None  # the Job being created (sent, not yet known to exist): its GPUs stay booked

    @property
    def namespace(self) -> str:
        """The task's namespace."""
        return str(self.obj["metadata"].get("namespace") or "default")

    @property
    def name(self) -> str:
        """The task's name."""
        return str(self.obj["metadata"]["name"])

    def involved(self) -> dict[str, Any]:
        """The ``involvedObject`` of an Event about this task."""
        meta = self.obj["metadata"]
        return {
            "apiVersion": API_VERSION,
            "kind": "GPUTask",
            "name": meta["name"],
            "namespace": self.namespace,
            "uid": meta.get("uid"),
        }


def set_condition(record: TaskRecord, ctype: str, status: bool, reason: str, message: str) -> None:
    """Set a metav1.Condition, moving lastTransitionTime only when its status flips; ``observedGeneration``
    is the generation of the spec the decision was made for."""
    value = "True" if status else "False"
    old = record.conditions.get(ctype)
    changed = old is None or old.get("status") != value
    record.conditions[ctype] = {
        "type": ctype,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339() if changed else old["lastTransitionTime"],
        "observedGeneration": record.generation or record.obj["metadata"].get("generation", 1),
    }


def placement_status(placement: Placement | None) -> dict[str, Any] | None:
    """The ``status.placement`` object of a GPUTask's placement (one pod)."""
    if placement is None:
        return None
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
    """``node-a GPUs [0, 1] (12288 MiB each)``-style summary of a GPUTask's placement (one pod)."""
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

    # -- transitions -------------------------------------------------------------------------------
    async def admitted(
        self, record: TaskRecord, placement: Placement, *, job_name: str | None, attempt: int, quota: str, message: str
    ) -> None:
        """Placed with quota reserved (``quota`` says by whom) and its Job created (or to come)."""
        record.phase, record.placement, record.job_name, record.attempt = ADMITTED, placement, job_name, attempt
        record.admitted_at, record.queue_position, record.last_wait = now_rfc3339(), None, None
        record.backoff = Backoff()
        set_condition(record, "QuotaReserved", True, "QuotaReserved", quota)
        set_condition(record, "Admitted", True, "Admitted", message)
        reset_requeue_conditions(record)
        await self.publish(record, message, ("Normal", "Admitted", message))

    async def running(self, record: TaskRecord, message: str) -> None:
        """A pod of its Job runs."""
        record.phase = RUNNING
        await self.publish(record, message)

    async def waiting(self, record: TaskRecord, reason: str, message: str, position: int | None = None) -> None:
        """Pending for ``reason``; the Event is posted only for a new reason, not a new position."""
        queue = record.task.queue if record.task is not None else ""
        where = "" if position is None else position_text(position, queue)
        record.phase, record.queue_position = PENDING, position
        set_condition(record, "QuotaReserved", False, reason, message + where)
        set_condition(record, "Admitted", False, reason, message + where)
        new = record.last_wait != (reason, message)
        record.last_wait = (reason, message)
        await self.publish(record, message + where, ("Normal", reason, message) if new else None)

    async def evicted(self, record: TaskRecord, reason: str, message: str) -> None:
        """Evicted from its placement and requeued (the Job is being deleted)."""
        record.phase, record.placement, record.job_name, record.admitted_at = PENDING, None, None, None
        record.last_wait = None
        set_condition(record, "Evicted", True, reason, message)
        set_condition(record, "Requeued", True, reason, f"requeued after {reason}")
        set_condition(record, "Admitted", False, reason, message)
        set_condition(record, "QuotaReserved", False, reason, message)
        await self.publish(record, message, ("Warning", reason, message))

    async def rejected(self, record: TaskRecord, reason: str, message: str) -> None:
        """Its Job was refused (or could not start): Pending, with the API's words, until it is retried."""
        record.phase, record.placement, record.job_name, record.admitted_at = PENDING, None, None, None
        record.last_wait = (reason, message)
        set_condition(record, "Admitted", False, reason, message)
        set_condition(record, "QuotaReserved", False, reason, message)
        await self.publish(record, message, ("Warning", reason, message))

    async def blocked(self, record: TaskRecord, reason: str, message: str) -> None:
        """Pending outside any queue until something it names exists (e.g. PriorityClassNotFound)."""
        record.phase, record.queue_position = PENDING, None
        new = record.last_wait != (reason, message)
        record.last_wait = (reason, message)
        set_condition(record, "Admitted", False, reason, message)
        await self.publish(record, message, ("Warning", reason, message) if new else None)

    async def failed(self, record: TaskRecord, reason: str, message: str) -> None:
        """Failed for good (MaxReschedulesExceeded): it is no longer queued."""
        record.phase, record.placement = FAILED, None
        set_condition(record, "Finished", True, reason, message)
        set_condition(record, "Requeued", False, reason, message)
        await self.publish(record, message, ("Warning", reason, message))

    async def invalid(self, record: TaskRecord) -> None:
        """A spec that can never run: Failed with the reason, until the spec changes."""
        assert record.invalid is not None
        reason, message = record.invalid
        record.phase, record.placement = FAILED, None
        set_condition(record, "Admitted", False, reason, message)
        await self.publish(record, message, ("Warning", reason, message))

    async def finished(self, record: TaskRecord, outcome: str, why: str = "") -> None:
        """Its Job completed (Succeeded) or failed (Failed; ``why``: the Job's Failed condition, "reason: message").
        A failed task's Admitted condition turns False (reason JobFailed), so no column says Admitted any more."""
        message = f"Job {record.job_name} {'completed' if outcome == SUCCEEDED else 'failed'}"
        message += f" ({why})" if why else ""
        record.phase = outcome
        if outcome == FAILED:
            set_condition(record, "Admitted", False, JOB_FAILED, message)
        set_condition(record, "Finished", True, outcome, message)
        await self.publish(record, message, ("Normal" if outcome == SUCCEEDED else "Warning", outcome, message))

    async def gpus_held(self, record: TaskRecord, note: str, *, held: bool) -> None:
        """An old Job of the task is gone while its pods are not: its GPUs stay ``held`` until they are (``note``:
        :func:`~gputask.k8s.lingering.held_note`, added at the end of the Evicted condition's message), or are
        released now (``note`` says so; the condition's message loses what was added; nothing when it never said so).
        A Normal Event either way."""
        evicted = record.conditions.get("Evicted")
        said = str((evicted or {}).get("message") or "")
        if not held and not HELD_NOTE.search(said):
            return  # never said to be held (its node was deleted first): nothing to take back
        if evicted is not None:
            base = HELD_NOTE.sub("", said)
            text = f"{base}; {note}"[:MAX_CONDITION_MESSAGE] if held else base
            set_condition(record, "Evicted", evicted.get("status") == "True", str(evicted.get("reason")), text)
        summary = str((record.obj.get("status") or {}).get("message") or note)
        await self.publish(record, summary, ("Normal", "GPUsHeld" if held else "GPUsReleased", note))

    async def condition(self, record: TaskRecord, ctype: str, status: bool, reason: str, message: str) -> None:
        """Set another condition (KueueConflict); a Warning Event when it turns True."""
        set_condition(record, ctype, status, reason, message)
        summary = message if status else str((record.obj.get("status") or {}).get("message") or message)
        await self.publish(record, summary, ("Warning", reason, message) if status else None)

    async def note(self, record: TaskRecord, etype: str, reason: str, message: str) -> None:
        """An Event only (e.g. SpecChangeIgnored): the status does not change."""
        await self.writer.event(record.involved(), etype, reason, message)

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
                stored = await self.writer.patch(GPUTASKS, meta["name"], body, record.namespace, status=True)
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
            sent = meta.get("resourceVersion")
            meta["resourceVersion"] = (stored.get("metadata") or {}).get("resourceVersion", sent)
            record.obj["status"] = stored.get("status", status)
            # the write carried the version it changed (a conflict otherwise) and changes only the status: when
            # obj was the whole object at that version, it is the whole object at the new one too
            record.whole_at = meta["resourceVersion"] if sent is not None and record.whole_at == sent else None
            return WRITTEN
        log.warning("status patch of %s kept conflicting; tried again later", record.key)
        return REFUSED

    async def _refresh(self, record: TaskRecord) -> str:
        """Re-read the GPUTask after a conflict: WRITTEN (read, write again), GONE (deleted, or another
        object now) or REFUSED (the read failed)."""
        try:
            fresh = await self.writer.client.get(GPUTASKS, record.name, record.namespace)
        except NotFound:
            return GONE
        except ApiError:
            return REFUSED
        if fresh["metadata"].get("uid") != record.uid:
            return GONE
        # Only the resourceVersion: the spec and labels change through the watch, which compares them.
        record.obj["metadata"]["resourceVersion"] = fresh["metadata"].get("resourceVersion")
        return WRITTEN


def reset_requeue_conditions(record: TaskRecord) -> None:
    """Quota reserved again: Evicted and Requeued, when True, turn False with reason QuotaReserved and the message
    ``Previously: <their message>``, as Kueue resets Evicted (and Preempted) in ``workload.SetQuotaReservation``."""
    for ctype in REQUEUE_CONDITIONS:
        old = record.conditions.get(ctype)
        if old is not None and old.get("status") == "True":
            message = f"Previously: {old.get('message') or ''}"[:MAX_CONDITION_MESSAGE]
            set_condition(record, ctype, False, "QuotaReserved", message)


def position_text(position: int, queue: str) -> str:
    """What a wait's message ends with: `` (position 3 in GPUClusterQueue 'q')`` (:data:`POSITION_SUFFIX` reads
    it back)."""
    return f" (position {position} in GPUClusterQueue {queue!r})"


POSITION_SUFFIX = re.compile(r" \(position \d+ in GPUClusterQueue '[^']*'\)$")
""":func:`position_text` at the end of a message (to take a stored wait's message back without it)."""


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
