"""What the executor's API calls came to, as typed outcomes, and the one place they change the core and the records:
:meth:`Outcomes.apply`, under the core gate.

The executor (:mod:`gputask.k8s.executor`) sends the API calls, concurrently, and turns each answer into an outcome:

- :class:`Created`: the Job of an admission exists (201): the admission is recorded;
- :class:`Adopted`: a Job of that name exists (409 on create, or found after a lost answer): its placement wins, or
  it ends the task (finished), is held (terminating), is deleted and the task requeued (PlacementConflict), or is
  another task's (the task requeued);
- :class:`Rejected`: the API server (or the pinning) refused: the task requeued and held back for a backoff (10 s
  doubling to 5 min), Pending with the API's words;
- :class:`Fenced`: not leading any more: the task requeued, the next leader decides;
- :class:`Creating`: a Job create sent, or its answer lost (connection reset, timeout): the booking is kept, the
  task "creating" that Job until a lookup says whether it exists;
- :class:`Gone`: a Job delete found nothing (404): what the Job held is released.

And what the cycle and the controller asked of it, before any call: :class:`Admitting` (the task gone meanwhile: its
booking released), :class:`Waiting`, :class:`Evicting`, :class:`FailedForGood`, :class:`NotStarting` (pods never
started), :class:`Stopping` (a deleted task's Job) and :class:`Reported` (a report of the controller's outbox).

:meth:`Outcomes.apply` takes the gate (an ``asyncio.Lock`` every handler takes, and the loop while the cycle runs on
its worker thread), changes the Scheduler, the controller's Jobs and holds and the records (through
:mod:`gputask.k8s.phases` and :mod:`gputask.k8s.records`), and returns the :class:`Steps` to carry out after it is
released: statuses and Events to write (:class:`~gputask.k8s.phases.Said`) and Jobs to stop (:class:`Stop`). The
executor changes neither the core nor a record itself (``tests/unit/test_outcomes.py`` reads its calls).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gputask.core import Admit, Pending, Placement
from gputask.core.scheduler import Evict, Fail
from gputask.k8s import phases, records
from gputask.k8s.controller import Controller
from gputask.k8s.gangjobs import gang_job_name
from gputask.k8s.jobrecords import SYSTEM_DISRUPTIONS, JobRecord
from gputask.k8s.localqueues import DEPRECATED_QUEUE_NAME, deprecation_message
from gputask.k8s.phases import Said
from gputask.k8s.pinner import PINNING_UNAVAILABLE
from gputask.k8s.records import ADMITTED, PENDING, PLACED_PHASES, PLACEMENT_CONFLICT, TaskRecord
from gputask.k8s.reports import Report, ReportKind
from gputask.k8s.tasks import describe
from gputask.k8s.workload import Workload, workload_of
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.outcomes")

JOB_REJECTED = "JobRejected"
BACKOFF_REASONS = (JOB_REJECTED, PINNING_UNAVAILABLE)  # waits said once, when the admission was refused
FAILURE_REASONS = ("NodeFailure", "GPUFailure", "PodsNotStarting", "GPUMemoryExceeded", *SYSTEM_DISRUPTIONS)
STRAY_JOB = "StrayJob"  # why a second live Job of a task is stopped
TASK_DELETED = "TaskDeleted"  # why a deleted task's Job is stopped
GANG_ENDED = "GangEnded"  # why the other Jobs of a gang are stopped when one of its Jobs failed


class Sent(Protocol):
    """A Job create as the executor keeps it (:class:`~gputask.k8s.executor.Unconfirmed`): its admission, the Job
    (a dict) and the attempt."""

    decision: Admit
    job: dict[str, Any]
    attempt: int


# -- outcomes of API answers --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Creating:
    """The Job ``job_name`` is being created: sent, or its answer lost (``lost``: kept in ``creating``, looked up
    after the executor's backoff)."""

    record: TaskRecord
    job_name: str
    lost: Sent | None = None


@dataclass(frozen=True, slots=True)
class Created:
    """The Job ``job_name`` of ``decision`` exists on ``placement`` (201, or adopted with the books agreeing)."""

    record: TaskRecord
    decision: Admit
    placement: Placement
    job_name: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Adopted:
    """A Job of the name ``sent`` creates exists (409, or found after a lost answer): ``job`` as read (None: not
    found when read after the 409)."""

    record: TaskRecord
    sent: Sent
    job: JobRecord | None


@dataclass(frozen=True, slots=True)
class Rejected:
    """The API server (or the configured pinning) refused the admission's Job: ``why``, under ``reason``;
    ``settled``: a Job create was sent (the task no longer creates it)."""

    record: TaskRecord
    why: str
    reason: str = JOB_REJECTED
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Fenced:
    """A write was fenced (this replica no longer leads); ``settled`` as for :class:`Rejected`."""

    record: TaskRecord
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Gone:
    """A Job delete found the Job gone already (404)."""

    job: JobRecord


# -- what the cycle and the controller asked for ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Admitting:
    """An admission about to be carried out (before any call)."""

    decision: Admit


@dataclass(frozen=True, slots=True)
class Waiting:
    """A Pending decision."""

    decision: Pending


@dataclass(frozen=True, slots=True)
class Evicting:
    """An Evict decision."""

    decision: Evict


@dataclass(frozen=True, slots=True)
class FailedForGood:
    """A Fail decision."""

    decision: Fail


@dataclass(frozen=True, slots=True)
class NotStarting:
    """An admitted task's pods did not start in time (``message`` says why): evicted, retried after a backoff."""

    record: TaskRecord
    message: str


@dataclass(frozen=True, slots=True)
class Stopping:
    """A deleted task's Job is to be stopped."""

    record: TaskRecord


@dataclass(frozen=True, slots=True)
class Reported:
    """A report of the controller's outbox to publish."""

    report: Report


Outcome = (Creating | Created | Adopted | Rejected | Fenced | Gone | Admitting | Waiting | Evicting | FailedForGood
           | NotStarting | Stopping | Reported)


@dataclass(frozen=True, slots=True)
class Stop:
    """A Job to stop through its ``workload``, for ``reason``, until it is gone."""

    job: JobRecord
    workload: Workload
    reason: str


Step = Said | Stop


@dataclass(slots=True)
class Steps:
    """What to carry out, in order, once the gate is released; ``go``: False when an admission is not to be sent
    (its task is gone)."""

    steps: list[Step]
    go: bool = True


class Outcomes:
    """Applies outcomes under the core ``gate``; owns no state (the executor's ``creating``, Job creates whose
    answer was lost, is shared with it: an eviction abandons one)."""

    def __init__(self, controller: Controller, metrics: OperatorMetrics, gate: asyncio.Lock, *,
                 creating: MutableMapping[str, Any], backoff_s: Callable[[int], float],
                 forget_job: Callable[[str], None]) -> None:
        self.controller = controller
        self.metrics = metrics
        self.gate = gate
        self.creating = creating
        self.backoff_s = backoff_s  # seconds after the n-th failure in a row
        self.forget_job = forget_job  # the Relabeler's drop (gate held): nothing left to confirm or label
        self._appliers: dict[type, Callable[[Any], Steps]] = {
            Creating: self._creating, Created: self._created, Adopted: self._adopted, Rejected: self._rejected,
            Fenced: self._fenced, Gone: self._gone, Admitting: self._admitting, Waiting: self._waiting,
            Evicting: self._evicting, FailedForGood: self._failed, NotStarting: self._not_starting,
            Stopping: self._stopping, Reported: self._reported,
        }

    async def apply(self, outcome: Outcome) -> Steps:
        """Take the gate and apply ``outcome`` to the Scheduler, the controller and the records; the steps to carry
        out after the gate is released."""
        async with self.gate:
            return self._appliers[type(outcome)](outcome)

    # -- API answers -------------------------------------------------------------------------------------
    def _creating(self, outcome: Creating) -> Steps:
        records.creating(outcome.record, outcome.job_name)
        if outcome.lost is not None:
            self.creating[outcome.record.key] = outcome.lost
        return Steps([])

    def _created(self, outcome: Created) -> Steps:
        record, decision, placement = outcome.record, outcome.decision, outcome.placement
        if outcome.attempt == 1 and decision.task.created:
            self.metrics.latency.labels(decision.task.queue).observe(max(0.0, time.time() - decision.task.created))
        in_flavor = f" (flavor {decision.task.flavor})" if decision.task.flavor else ""
        message = f"Admitted by GPUClusterQueue {decision.task.queue!r}{in_flavor} on {describe(placement)}"
        quota = f"quota reserved in {decision.task.queue!r}{in_flavor}"
        records.created(record, attempt=outcome.attempt, flavor=decision.task.flavor)
        self.controller.pods.started(record, time.time())
        said = phases.admitted(record, placement, job_name=outcome.job_name, attempt=outcome.attempt, quota=quota,
                               message=message)
        self.controller.pods.admitted_with(record)  # its pod may have started while the create's answer was awaited
        return Steps([said])

    def _adopted(self, outcome: Adopted) -> Steps:
        """Its placement wins and is taken into the books (never two beliefs); one the books cannot hold is deleted
        and the task requeued (:meth:`_conflict`); one that finished ends the task; a Job of another task of that
        name (deleted, not yet garbage-collected) requeues the task."""
        record, job, scheduler = outcome.record, outcome.job, self.controller.scheduler
        meta = outcome.sent.job["metadata"]
        records.creating(record, None)
        if job is None or job.task_uid != record.uid or job.placement is None:
            log.info("Job %s/%s belongs to an earlier task of that name; requeued", meta["namespace"], meta["name"])
            scheduler.requeue(record.key)
            return Steps([])
        placement = job.placement
        if job.gang and len(outcome.sent.decision.placement.pods) > 1:  # a gang's lead Job carries its PodSet's pods
            chosen = outcome.sent.decision.placement
            placement = chosen if chosen.pods[:len(job.placement.pods)] == job.placement.pods else job.placement
        self.controller.adopting(job)
        if job.outcome is not None:  # it ran to its end while nobody knew: the task's end, never run again
            scheduler.finish(record.key)
            records.ended_unseen(record, job.name, job.attempt)
            return Steps([phases.finished(record, job.outcome, job.why)])
        if job.terminating:  # being deleted: held until it is gone; the next admission makes a Job of another name
            scheduler.requeue(record.key)
            records.with_job(record, record.job_name, job.attempt)
            self.controller.hold(job)
            return Steps([])
        entry = scheduler.ledger.get(record.key)
        if entry is not None and entry.placement != placement:
            log.warning("Job %s/%s exists on %s, not on the %s just chosen: adopting its placement",
                        meta["namespace"], meta["name"], describe(placement), describe(entry.placement))
            scheduler.finish(record.key)
            if not scheduler.restore(entry.task, placement, time.time()):
                return self._conflict(record, job)
            self.metrics.adopted.inc()
        else:
            log.info("Job %s/%s exists already: taking it as created", meta["namespace"], meta["name"])
        return self._created(Created(record, outcome.sent.decision, placement, job.name, job.attempt))

    def _conflict(self, record: TaskRecord, job: JobRecord) -> Steps:
        """A Job of the task exists on GPUs the books gave to others since (its create's answer was lost): it is
        deleted (what of its GPUs is free held until it is gone) and the task requeued, reason PlacementConflict
        with a Warning Event; no GPU is ever booked over its memory."""
        assert job.placement is not None
        self.controller.scheduler.requeue(record.key)  # the restored booking over-commits: released at once
        self.controller.hold(job, fit=True)
        records.with_job(record, job.name, job.attempt)
        message = (f"Job {job.name} exists on {describe(job.placement)}, which was booked for other tasks while its "
                   "create went unanswered (a GPU would be over its memory): the Job is deleted and the task requeued")
        self.metrics.evictions.labels(PLACEMENT_CONFLICT).inc()
        said = phases.evicted(record, PLACEMENT_CONFLICT, message)
        workload = workload_of(record)
        return Steps([said, *(Stop(j, workload, PLACEMENT_CONFLICT) for j in self._gang(record, job))])

    def _rejected(self, outcome: Rejected) -> Steps:
        """Give the task back to the core, held back for the next backoff step, and say why."""
        record, scheduler = outcome.record, self.controller.scheduler
        if outcome.settled:
            records.creating(record, None)
        failures = records.failed_again(record, per_spec=True)
        delay = self.backoff_s(failures)
        records.retry_at(record, time.monotonic() + delay)
        message = f"{outcome.why}; retried in {delay:g}s (attempt {failures})"
        scheduler.requeue(record.key)
        scheduler.defer(record.key, time.time() + delay, outcome.reason, message)
        log.warning("task %s: %s", record.key, message)
        return Steps([phases.rejected(record, outcome.reason, message)])

    def _fenced(self, outcome: Fenced) -> Steps:
        if outcome.settled:
            records.creating(outcome.record, None)
        self.controller.scheduler.requeue(outcome.record.key)  # not leading any more: the next leader decides
        return Steps([])

    def _gone(self, outcome: Gone) -> Steps:
        self.forget_job(outcome.job.key)  # nothing left to confirm or label
        self.controller.job_gone(outcome.job)
        return Steps([])

    # -- decisions and reports ---------------------------------------------------------------------------
    def _admitting(self, outcome: Admitting) -> Steps:
        decision = outcome.decision
        record = self.controller.tasks.get(decision.task.key)
        if record is None or record.deleting:
            self.controller.scheduler.finish(decision.task.key)
            return Steps([], go=False)
        if record.revision is not None and record.revision[0] is (decision.task.unflavored or decision.task):
            records.take_revision(record)  # admitted as edited: the status says so
        records.drop_condition(record, phases.GPU_MEMORY_WITHIN_BUDGET)  # judged anew for the new placement
        return Steps([])

    def _waiting(self, outcome: Waiting) -> Steps:
        decision = outcome.decision
        record = self.controller.tasks.get(decision.task.key)
        if record is None or record.phase != PENDING or record.blocked is not None or record.invalid is not None:
            return Steps([])
        if decision.reason in BACKOFF_REASONS and record.last_wait == (decision.reason, decision.message):
            return Steps([])  # said already when the Job was refused
        position = decision.position if decision.position >= 0 else None
        return Steps([phases.waiting(record, decision.reason, decision.message, position)])

    def _evicting(self, outcome: Evicting) -> Steps:
        """Requeue an evicted task (its current spec), stop its Job; its GPUs stay held until the Job is gone."""
        decision = outcome.decision
        record = self.controller.tasks.get(decision.task.key)
        if record is None:
            return Steps([])
        job = self._current_job(record)
        gang = self._gang(record, job) if job is not None else []
        # its pods keep their GPUs until the Job is gone; each Job of a gang its own pods' GPUs
        self.controller.departing(job, decision.held, gang if len(gang) > 1 else ())
        self.metrics.evictions.labels(decision.reason).inc()
        if decision.reason == "Preempted":
            self.metrics.preemptions.labels(decision.task.queue).inc()
        if decision.reason in FAILURE_REASONS:
            records.rescheduled(record)
            self.metrics.reschedules.inc()
        steps: list[Step] = [phases.evicted(record, decision.reason, decision.message)]
        if record.revision_error is not None and record.key not in self.controller.scheduler.pending:
            records.revision_invalid(record)  # its edited spec can never run
            steps.append(phases.invalid(record))
        workload = workload_of(record)
        steps.extend(Stop(j, workload, decision.reason) for j in gang)
        return Steps(steps)

    def _current_job(self, record: TaskRecord) -> JobRecord | None:
        if record.job_name is None and record.creating is not None:  # evicted before its create was confirmed
            sent = self.creating.pop(record.key, None)
            attempt = sent.attempt if sent is not None else record.attempt + 1
            name = records.create_abandoned(record, attempt)  # the next admission makes a Job of another name
            assert name is not None
            placement = sent.decision.placement if sent is not None else None
            return self.controller.jobs.get(f"{record.namespace}/{name}") or JobRecord(
                name, record.namespace, record.uid, attempt, placement)
        if record.job_name is None:
            return None
        return self.controller.jobs.get(f"{record.namespace}/{record.job_name}") or JobRecord(
            record.job_name, record.namespace, record.uid, record.attempt, record.placement
        )

    def _gang(self, record: TaskRecord, lead: JobRecord) -> list[JobRecord]:
        """The Jobs of ``lead``'s gang, lead first: each PodSet's (known, or as its create made it: the name of its
        attempt and its pods' part of the task's placement); ``[lead]`` for a lone Job."""
        task, placement = record.task, record.placement
        known = {j.name: j for j in self.controller.jobs_of_task.get(record.uid, {}).values() if j.lead == lead.name}
        if task is None or len(task.podsets) == 1 and not lead.gang:
            return [lead, *(j for name, j in sorted(known.items()) if name != lead.name)]
        names = [gang_job_name(record.name, lead.attempt, p.name) for p in task.podsets]
        parts: list[Placement | None] = [None] * len(names)
        if placement is not None and task.pod_count == len(placement.pods):
            start = 0
            for i, pod_set in enumerate(task.podsets):
                parts[i] = Placement(placement.pods[start:start + pod_set.count])
                start += pod_set.count
        if lead.key not in self.controller.jobs and parts[0] is not None:  # not seen yet: its own pods' part
            lead = replace(lead, placement=parts[0], gang=lead.name, gang_jobs=len(names), pod_set=task.podsets[0].name)
        out = [lead]
        for name, part, pod_set in zip(names[1:], parts[1:], task.podsets[1:], strict=True):
            out.append(known.pop(name, None) or JobRecord(name, record.namespace, record.uid, lead.attempt, part,
                                                          gang=lead.name, gang_jobs=len(names), pod_set=pod_set.name))
        return [*out, *(j for name, j in sorted(known.items()) if name != lead.name)]

    def _failed(self, outcome: FailedForGood) -> Steps:
        decision = outcome.decision
        record = self.controller.tasks.get(decision.task.key)
        return Steps([] if record is None else [phases.failed(record, decision.reason, decision.message)])

    def _not_starting(self, outcome: NotStarting) -> Steps:
        record = outcome.record
        delay = self.backoff_s(records.failed_again(record, per_spec=False))
        log.warning("task %s: %s; evicted, retried in %gs", record.key, outcome.message, delay)
        self.controller.pods_not_starting(record, outcome.message, time.time() + delay)
        return Steps([])

    def _stopping(self, outcome: Stopping) -> Steps:
        job = self._current_job(outcome.record)
        workload = workload_of(outcome.record)
        return Steps([] if job is None else [Stop(j, workload, TASK_DELETED) for j in self._gang(outcome.record, job)])

    def _reported(self, outcome: Reported) -> Steps:  # noqa: C901 - one branch per ReportKind, as the enum reads
        report = outcome.report
        record, kind = report.record, report.kind
        said: Said | None = None
        if kind == ReportKind.INVALID and record.invalid is not None:
            said = phases.invalid(record)
        elif kind == ReportKind.BLOCKED and record.blocked is not None:
            said = phases.blocked(record, *record.blocked)
        elif kind == ReportKind.SPEC_IGNORED and record.phase in PLACED_PHASES:
            message = (f"spec changed while Job {record.job_name} runs: it applies at the task's next admission "
                       "(after an eviction); delete and re-create the GPUTask to apply it now")
            said = phases.note(record, "Warning", "SpecChangeIgnored", message)
        elif kind == ReportKind.DEPRECATED_QUEUE and record.phase == PENDING:
            message = deprecation_message(record.namespace, report.detail)
            said = phases.note(record, "Warning", DEPRECATED_QUEUE_NAME, message)
        elif kind == ReportKind.FINISHED:
            jobs = self.controller.jobs_of_task.get(record.uid, {}).values()
            job = self.controller.jobs.get(f"{record.namespace}/{record.job_name}")
            why = next((j.why for j in jobs if j.lead == record.job_name and j.why), job.why if job else "")
            said = phases.finished(record, report.detail, why)
        elif kind == ReportKind.RUNNING and record.phase == ADMITTED:
            said = phases.running(record, report.detail)
        elif kind == ReportKind.RESTORED:
            said = Said(record, report.detail)
        elif kind == ReportKind.DELETE_JOB:
            return self._stopping(Stopping(record))
        elif kind in (ReportKind.GPUS_HELD, ReportKind.GPUS_RELEASED):
            said = phases.gpus_held(record, report.detail, held=kind == ReportKind.GPUS_HELD)
        elif kind in (ReportKind.OVER_BUDGET, ReportKind.WITHIN_BUDGET) and record.phase in PLACED_PHASES:
            said = phases.memory_budget(record, kind == ReportKind.WITHIN_BUDGET, report.detail)
        elif kind == ReportKind.GANG_ENDED and report.detail in self.controller.jobs:
            return Steps([Stop(self.controller.jobs[report.detail], workload_of(record), GANG_ENDED)])
        elif kind == ReportKind.STRAY_JOB and report.detail in self.controller.jobs:
            job = self.controller.jobs[report.detail]
            self.metrics.strays.inc()
            message = f"Job {job.name} was a second live Job of the task (its status names {record.job_name}); deleted"
            return Steps([Stop(job, workload_of(record), STRAY_JOB),
                          phases.note(record, "Warning", "StrayJobDeleted", message)])
        return Steps([] if said is None else [said])


__all__ = ["Adopted", "Admitting", "Created", "Creating", "Evicting", "FailedForGood", "Fenced", "Gone",
           "NotStarting", "Outcome", "Outcomes", "Rejected", "Reported", "Step", "Steps", "Stop", "Stopping",
           "Waiting"]
