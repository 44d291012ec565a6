"""Task records: what the operator knows of each workload, and the one module that changes them.

:class:`TaskRecord` is the operator's view of one workload (a GPUTask today, :mod:`gputask.k8s.workload`).
Every field of a record is set here and nowhere else: the controller, the transitions, the executor and Kueue
mode call the functions below, each named for what happened (``admitted``, ``evicted``, ``creating``, ...), and
``tests/unit/test_records.py`` fails when another module assigns a record's field. :class:`TaskRecords` is the
index of them (by ``namespace/name``, by uid, by namespace). No I/O: this module imports no client, writer or
executor (an import contract, ``tests/unit/test_imports.py``).

The phases (DESIGN.md section 2):

- ``Pending``: waiting to be admitted; the ``Admitted`` condition's reason says why;
- ``Admitted``: placed, quota reserved, its Job created, no pod of it running yet;
- ``Running``: a pod of its Job is running (the pod's phase, not ``Job.status.active``,
  which also counts pods still Pending);
- ``Succeeded`` / ``Failed``: its Job completed or failed, or it failed for good (invalid spec,
  too many reschedules).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gputask.core import Placement, Task, TaskKey
from gputask.core.reasons import Reason
from gputask.k8s.timestamps import now_rfc3339

PENDING, ADMITTED, RUNNING, SUCCEEDED, FAILED = "Pending", "Admitted", "Running", "Succeeded", "Failed"
FINISHED_PHASES = (SUCCEEDED, FAILED)
PLACED_PHASES = (ADMITTED, RUNNING)
JOB_FAILED = "JobFailed"  # the Admitted condition's reason once its Job failed (kubectl get gt: REASON)
MAX_CONDITION_MESSAGE = 32768  # metav1.Condition's message maxLength
REQUEUE_CONDITIONS = ("Evicted", "Requeued")  # True from an eviction until the next quota reservation
PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
WAITING_REASONS = (PRIORITY_CLASS_NOT_FOUND, Reason.QUEUE_NOT_FOUND, Reason.QUEUE_INACTIVE)  # Pending, not Failed
JOB_DELETED = "JobDeleted"
PODS_NOT_STARTING = "PodsNotStarting"
PLACEMENT_CONFLICT = "PlacementConflict"


@dataclass(slots=True)
class Backoff:
    """Retries of a task whose Job the API server refused: ``failures`` so far, next try at ``retry_at``
    (monotonic seconds), for the spec of ``generation`` (a new spec starts over)."""

    failures: int = 0
    retry_at: float = 0.0
    generation: int = 0


@dataclass(slots=True)
class TaskRecord:
    """What the operator knows of one workload (by ``namespace/name``); its fields change only here.

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
        """The ``involvedObject`` of an Event about this workload (:meth:`Workload.involved`)."""
        from gputask.k8s.workload import workload_of  # here: the interface module imports this one

        return workload_of(self).involved()


class TaskRecords:
    """The records, by ``namespace/name`` (:attr:`tasks`), by uid (:attr:`by_uid`) and by namespace
    (:attr:`in_namespace`: a namespace's event touches these)."""

    def __init__(self) -> None:
        self.tasks: dict[TaskKey, TaskRecord] = {}
        self.by_uid: dict[str, TaskRecord] = {}
        self.in_namespace: dict[str, set[TaskKey]] = {}

    def add(self, key: TaskKey, uid: str, obj: dict[str, Any]) -> TaskRecord:
        """A new record for the object ``obj`` (its metadata.uid ``uid``), indexed."""
        record = TaskRecord(key, uid, obj)
        self.tasks[key], self.by_uid[uid] = record, record
        self.in_namespace.setdefault(record.namespace, set()).add(key)
        return record

    def forget(self, record: TaskRecord) -> None:
        """Take ``record`` out of every index (it may already be replaced by a newer one of its name)."""
        if self.tasks.get(record.key) is record:
            del self.tasks[record.key]
            keys = self.in_namespace.get(record.namespace, set())
            keys.discard(record.key)
            if not keys:
                self.in_namespace.pop(record.namespace, None)
        self.by_uid.pop(record.uid, None)


# -- conditions ------------------------------------------------------------------------------------
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


def drop_condition(record: TaskRecord, ctype: str) -> None:
    """Forget condition ``ctype`` (GPUMemoryWithinBudget: judged anew for a new placement)."""
    record.conditions.pop(ctype, None)


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


# -- phase transitions (Transitions writes the status they stand for) ---------------------------------
def admitted(record: TaskRecord, placement: Placement, *, job_name: str | None, attempt: int, quota: str,
             message: str) -> None:
    """Placed with quota reserved (``quota`` says by whom) and its Job created (or to come)."""
    record.phase, record.placement, record.job_name, record.attempt = ADMITTED, placement, job_name, attempt
    record.admitted_at, record.queue_position, record.last_wait = now_rfc3339(), None, None
    record.backoff = Backoff()
    set_condition(record, "QuotaReserved", True, "QuotaReserved", quota)
    set_condition(record, "Admitted", True, "Admitted", message)
    reset_requeue_conditions(record)


def running(record: TaskRecord) -> None:
    """A pod of its Job runs."""
    record.phase = RUNNING


def waiting(record: TaskRecord, reason: str, message: str, position: int | None) -> tuple[str, bool]:
    """Pending for ``reason`` at ``position``: the message with its position, and whether the wait is new (not
    just a new position)."""
    queue = record.task.queue if record.task is not None else ""
    where = "" if position is None else position_text(position, queue)
    record.phase, record.queue_position = PENDING, position
    set_condition(record, "QuotaReserved", False, reason, message + where)
    set_condition(record, "Admitted", False, reason, message + where)
    new = record.last_wait != (reason, message)
    record.last_wait = (reason, message)
    return message + where, new


def evicted(record: TaskRecord, reason: str, message: str) -> None:
    """Evicted from its placement and requeued (the Job is being deleted)."""
    record.phase, record.placement, record.job_name, record.admitted_at = PENDING, None, None, None
    record.last_wait = None
    set_condition(record, "Evicted", True, reason, message)
    set_condition(record, "Requeued", True, reason, f"requeued after {reason}")
    set_condition(record, "Admitted", False, reason, message)
    set_condition(record, "QuotaReserved", False, reason, message)


def rejected(record: TaskRecord, reason: str, message: str) -> None:
    """Its Job was refused (or could not start): Pending, with the API's words, until it is retried."""
    record.phase, record.placement, record.job_name, record.admitted_at = PENDING, None, None, None
    record.last_wait = (reason, message)
    set_condition(record, "Admitted", False, reason, message)
    set_condition(record, "QuotaReserved", False, reason, message)


def blocked(record: TaskRecord, reason: str, message: str) -> bool:
    """Pending outside any queue until something it names exists; True when the wait is new."""
    record.phase, record.queue_position = PENDING, None
    new = record.last_wait != (reason, message)
    record.last_wait = (reason, message)
    set_condition(record, "Admitted", False, reason, message)
    return new


def failed(record: TaskRecord, reason: str, message: str) -> None:
    """Failed for good (MaxReschedulesExceeded): it is no longer queued."""
    record.phase, record.placement = FAILED, None
    set_condition(record, "Finished", True, reason, message)
    set_condition(record, "Requeued", False, reason, message)


def invalid(record: TaskRecord) -> tuple[str, str]:
    """A spec that can never run (``record.invalid``): Failed with its reason and message, which are returned."""
    assert record.invalid is not None
    reason, message = record.invalid
    record.phase, record.placement = FAILED, None
    set_condition(record, "Admitted", False, reason, message)
    return reason, message


def finished(record: TaskRecord, outcome: str, message: str) -> None:
    """Its Job completed (Succeeded) or failed (Failed): a failed task's Admitted condition turns False (reason
    JobFailed), so no column says Admitted any more."""
    record.phase = outcome
    if outcome == FAILED:
        set_condition(record, "Admitted", False, JOB_FAILED, message)
    set_condition(record, "Finished", True, outcome, message)


def status_written(record: TaskRecord, stored: Mapping[str, Any], status: Mapping[str, Any], sent: Any) -> None:
    """A status write that carried resourceVersion ``sent`` succeeded: ``stored`` is the object the API returned
    (``status``: what was sent)."""
    meta = record.obj["metadata"]
    meta["resourceVersion"] = (stored.get("metadata") or {}).get("resourceVersion", sent)
    record.obj["status"] = stored.get("status", status)
    # the write carried the version it changed (a conflict otherwise) and changes only the status: when
    # obj was the whole object at that version, it is the whole object at the new one too
    record.whole_at = meta["resourceVersion"] if sent is not None and record.whole_at == sent else None


def version_read(record: TaskRecord, version: Any) -> None:
    """After a conflict, only the resourceVersion is taken: the spec and labels change through the watch, which
    compares them."""
    record.obj["metadata"]["resourceVersion"] = version


# -- the watch (the controller) --------------------------------------------------------------------
def took_object(record: TaskRecord, obj: dict[str, Any]) -> None:
    """The object as the watch delivered it: the whole stored object at its resourceVersion."""
    record.obj, record.whole_at = obj, obj["metadata"].get("resourceVersion")


def converted(record: TaskRecord, task: Task | None) -> None:
    """The core Task of its current spec (None: it cannot be converted)."""
    record.task = task


def refused(record: TaskRecord, reason: str, message: str) -> None:
    """A spec that can never run: ``invalid`` says why (the task fails until its spec changes)."""
    record.invalid, record.blocked = (reason, message), None


def block(record: TaskRecord, reason: str, message: str) -> None:
    """It waits outside the queues until something it names exists (PriorityClassNotFound, QueueNotFound)."""
    record.blocked, record.invalid = (reason, message), None


def unblock(record: TaskRecord) -> None:
    """What it waited for exists now."""
    record.blocked = None


def queued(record: TaskRecord) -> bool:
    """Converted and queued: the generation taken, any invalid or blocked reason gone, a Failed (invalid) task
    Pending again. True when a backoff of an earlier spec ended (a new spec: its Job is tried at once)."""
    record.generation = int(record.obj["metadata"].get("generation") or 0)
    record.invalid = record.blocked = None
    reset = bool(record.backoff.failures and record.backoff.generation != record.generation)
    if reset:
        record.backoff = Backoff()
    if record.phase == FAILED:  # an invalid spec mended: it is a pending task again
        record.phase = PENDING
    return reset


def revised(record: TaskRecord, task: Task | None, error: tuple[str, str] | None = None) -> None:
    """A placed task's spec changed: ``task`` applies at its next admission (``error``: the edit is invalid)."""
    record.revision = (task, int(record.obj["metadata"].get("generation") or 0)) if task is not None else None
    record.revision_error = error


def take_revision(record: TaskRecord) -> None:
    """Admitted with its edited spec: the status says so."""
    assert record.revision is not None
    record.task, record.generation = record.revision
    record.revision = None


def revision_invalid(record: TaskRecord) -> None:
    """Evicted while its edited spec can never run: it is invalid now."""
    record.invalid, record.revision_error = record.revision_error, None


def deleting(record: TaskRecord) -> None:
    """Its object is gone or being deleted."""
    record.deleting = True


def adopt_status(record: TaskRecord, status: Mapping[str, Any], *, attempt: int, reschedules: int) -> bool:
    """After a restart: ``attempt`` and ``reschedules`` (read soundly from it), admittedAt and conditions from the
    stored status; a finished phase is kept (True returned); a wait's reason as last told (so the first cycle
    after a restart posts no Event and writes no status for a task that still waits for the same reason)."""
    record.attempt, record.reschedules = attempt, reschedules
    record.admitted_at = status.get("admittedAt") if isinstance(status.get("admittedAt"), str) else None
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and "type" in cond:
            record.conditions[cond["type"]] = dict(cond)
    if status.get("phase") in FINISHED_PHASES:
        record.phase = status["phase"]
        return True
    waited = record.conditions.get("Admitted")
    if status.get("phase") == PENDING and waited and waited.get("status") == "False":
        message = POSITION_SUFFIX.sub("", str(waited.get("message") or ""))
        record.last_wait = (str(waited.get("reason") or ""), message)
    return False


def restored(record: TaskRecord, task: Task, *, generation: int, phase: str, job_name: str, attempt: int,
             placement: Placement | None, flavor: str) -> None:
    """After a restart (or in Kueue mode, a Ready check): placed by its Job as the books and the Job say."""
    record.task, record.generation, record.phase = task, generation, phase
    record.attempt, record.job_name, record.placement, record.flavor = attempt, job_name, placement, flavor


def placed_again(record: TaskRecord, placement: Placement, phase: str) -> None:
    """Kueue mode after a restart: the placement of its Workload's Ready check, in ``phase``."""
    record.placement, record.phase = placement, phase


def charged_in(record: TaskRecord, flavor: str) -> None:
    """The ResourceFlavor its booking is charged in."""
    record.flavor = flavor


# -- its Job (the executor, Kueue mode) -----------------------------------------------------------------
def ended_unseen(record: TaskRecord, job_name: str, attempt: int, *, phase: str | None = None) -> None:
    """A Job of it ran to its end while nobody knew: that Job is its last (``phase``: the phase it had then)."""
    record.job_name, record.attempt, record.placement = job_name, attempt, None
    if phase is not None:
        record.phase = phase


def with_job(record: TaskRecord, job_name: str | None, attempt: int) -> None:
    """Its Job is ``job_name`` of ``attempt`` or later (a Job found, kept or being made)."""
    record.job_name, record.attempt = job_name, max(record.attempt, attempt)


def kueue_job(record: TaskRecord, job_name: str, attempt: int) -> None:
    """Kueue mode: its suspended Job was made; no placement until Kueue admits it."""
    record.attempt, record.job_name, record.placement = attempt, job_name, None


def creating(record: TaskRecord, job_name: str | None) -> None:
    """The Job being created (None: the create is settled, or abandoned)."""
    record.creating = job_name


def created(record: TaskRecord, *, attempt: int, flavor: str) -> None:
    """The Job of its admission exists: its attempt and flavor are the task's."""
    record.attempt, record.flavor, record.creating = attempt, flavor, None


def create_abandoned(record: TaskRecord, attempt: int) -> str | None:
    """Evicted before its Job's create was confirmed: the name of that Job, and the next admission makes a Job of
    another name (``attempt``: the unconfirmed create's)."""
    name, record.creating = record.creating, None
    record.attempt = max(record.attempt, attempt)
    return name


def rescheduled(record: TaskRecord) -> None:
    """Evicted for a failure (counted against maxReschedules)."""
    record.reschedules += 1


def failed_again(record: TaskRecord, *, per_spec: bool) -> int:
    """One more failure in a row; ``per_spec``: the count starts over for a new spec. The count."""
    if per_spec and record.backoff.generation != record.generation:
        record.backoff.failures = 0
    record.backoff.failures += 1
    if per_spec:
        record.backoff.generation = record.generation
    return record.backoff.failures


def retry_at(record: TaskRecord, at: float) -> None:
    """The next try of a backed-off task (monotonic seconds)."""
    record.backoff.retry_at = at


__all__ = [
    "ADMITTED",
    "FAILED",
    "FINISHED_PHASES",
    "PENDING",
    "PLACED_PHASES",
    "RUNNING",
    "SUCCEEDED",
    "Backoff",
    "TaskRecord",
    "TaskRecords",
    "set_condition",
]
