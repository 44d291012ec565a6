"""Carry out the core's decisions and the controller's reports through the API.

- Admit: create what the pinning needs (DRA claims, :class:`~gputask.k8s.pinner.Pinner`), then the pinned Job
  (409 with our placement = already done), then record the admission.
  A create whose answer was lost (:class:`~gputask.k8s.client.Unanswered`: connection reset, server disconnected,
  timeout, a 5xx that is no Status) is neither: the task keeps its GPUs and quota booked, "creating" that Job,
  until a GET (or the Jobs informer) says whether it exists (:meth:`Executor.confirm_creates`, 1 s doubling to
  30 s); then the Job is adopted, or the create is sent again. A Job adopted after a 409 whose placement the
  books cannot hold (a GPU over its memory) is deleted and its task requeued (PlacementConflict, a Warning
  Event); a Job found finished is its task's end (Succeeded or Failed), never run again.
  A Job (or claim) the API server refuses (422 Invalid, 403 quota, any error) gives the task back to the core,
  which holds it back for a backoff (10 s doubling to 5 min; a new spec starts over), and the task
  says why: condition ``Admitted=False`` reason ``JobRejected`` with the API's message, and a
  Warning Event. At most one failed Job create per task per backoff step. While the configured pinning cannot
  work in the cluster, admissions back off the same way with reason ``PinningUnavailable``.
- Pending: the wait reason; Evict: the task requeued, its Job deleted (retried with backoff until
  it is gone, its GPUs held meanwhile); Fail: Failed for good.
Every write goes through the :class:`~gputask.k8s.writer.Writer`; every task transition through
:class:`~gputask.k8s.tasks.Transitions`. API failures are handled here, never raised into the loop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gputask.core import Admit, Decision, Pending, Placement
from gputask.core.budget import GPU_MEMORY_EXCEEDED
from gputask.core.scheduler import Evict, Fail
from gputask.k8s import records
from gputask.k8s.client import (
    EVENTS,
    GPUNODES,
    JOBS,
    AlreadyExists,
    ApiError,
    Fenced,
    NotFound,
    Unanswered,
    doubling_backoff_s,
)
from gputask.k8s.controller import Controller
from gputask.k8s.jobrecords import SYSTEM_DISRUPTIONS, JobRecord, job_record
from gputask.k8s.localqueues import DEPRECATED_QUEUE_NAME, deprecation_message
from gputask.k8s.pinner import PINNING_UNAVAILABLE, Pinner
from gputask.k8s.pinning import Pinning
from gputask.k8s.queue_status import QueueUpkeep
from gputask.k8s.records import PLACEMENT_CONFLICT
from gputask.k8s.relabel import JobFeed, Relabeler
from gputask.k8s.reports import Report, ReportKind
from gputask.k8s.tasks import ADMITTED, PENDING, PLACED_PHASES, TaskRecord, Transitions, describe, set_condition
from gputask.k8s.workload import workload_of
from gputask.k8s.writer import Writer, now_rfc3339
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.executor")

CONCURRENCY = 16
JOB_REJECTED = "JobRejected"
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
FAILURE_REASONS = ("NodeFailure", "GPUFailure", "PodsNotStarting", "GPUMemoryExceeded", *SYSTEM_DISRUPTIONS)
CONFIRM_RETRY_S = 1.0  # a create whose answer was lost is looked up after 1 s, doubling ...
CONFIRM_RETRY_MAX_S = 30.0  # ... up to 30 s while the API server does not answer
BACKOFF_REASONS = (JOB_REJECTED, PINNING_UNAVAILABLE)  # waits said once, when the admission was refused
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # metav1.Condition's reason pattern


POD_RESOURCES_AVAILABLE = "PodResourcesAvailable"
GPU_MEMORY_WITHIN_BUDGET = "GPUMemoryWithinBudget"
COUNT_RULE = ("pods requesting nvidia.com/gpu on this node are counted on GPUs gputask chooses, not the devices the "
              "kubelet gave them (gputask.k8s.foreign, rule 3)")


def pod_resources_condition(available: bool, reason: str, message: str) -> dict[str, Any]:
    """The GPUNode condition PodResourcesAvailable for the agent's ``status.podResources``."""
    if available:
        text = "the GPUs of device-plugin pods are read from the kubelet's PodResources API"
    else:
        text = f"{message}; {COUNT_RULE}" if message else COUNT_RULE
    return {"type": POD_RESOURCES_AVAILABLE, "status": "True" if available else "False",
            "reason": reason if _REASON.match(reason or "") else "Unknown", "message": text[:32768],
            "lastTransitionTime": now_rfc3339()}


def backoff_s(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failure in a row: 10 s doubling, at most 5 min."""
    return doubling_backoff_s(failures, BACKOFF_BASE_S, BACKOFF_MAX_S)


@dataclass(slots=True)
class Deletion:
    """A Job to delete until it is gone: its propagation policy, failures so far, next try (monotonic s)."""

    job: JobRecord
    propagation: str
    failures: int = 0
    retry_at: float = 0.0


@dataclass(slots=True)
class Unconfirmed:
    """A Job create whose answer was lost: the admission it was for, the Job sent (a dict), its attempt, lookups
    failed so far and when the next is due (monotonic s). Its task keeps the admission's booking meanwhile."""

    decision: Admit
    job: dict[str, Any]
    attempt: int
    failures: int = 1
    retry_at: float = 0.0


class Executor:
    """Applies decisions and reports; owns no scheduling state but the Job deletions still to retry and the
    Job creates whose answer was lost."""

    def __init__(
        self,
        controller: Controller,
        writer: Writer,
        metrics: OperatorMetrics | None = None,
        *,
        concurrency: int = 16,
        gate: asyncio.Lock | None = None,
        job_feed: JobFeed | None = None,
    ) -> None:
        self.controller = controller
        self.writer = writer
        self.transitions = Transitions(writer)
        self.metrics = metrics or writer.metrics
        self.deletions: dict[str, Deletion] = {}  # Job key -> deletion to retry
        self.creating: dict[str, Unconfirmed] = {}  # task key -> a Job create whose answer was lost
        self._due: list[tuple[float, str]] = []  # heap of (retry_at, Job key) of failed deletions; outdated skipped
        self.queues = QueueUpkeep(controller, writer)
        self.pinner = Pinner(controller.config, writer, self.metrics)
        self.relabel = Relabeler(controller, writer, gate=gate, feed=job_feed)  # Jobs that lost the task label
        self._limit = asyncio.Semaphore(concurrency)

    @property
    def pinning(self) -> Pinning:
        """How Jobs are pinned (the configured mode, RuntimeClass and the DRA version the cluster serves)."""
        return self.pinner.pinning

    def reset(self) -> None:
        """Forget the deletions and status writes still to retry (a rebuild finds again what is owed)."""
        self.deletions.clear()
        self.creating.clear()
        self.transitions.unwritten.clear()
        self.queues.reset()
        self.relabel.reset()

    # -- decisions ------------------------------------------------------------------------------------
    async def apply(self, decisions: Iterable[Decision]) -> None:
        """Apply decisions: one task's in order (an Evict before its re-Admit), tasks concurrently."""
        per_task: dict[str, list[Decision]] = {}
        for decision in decisions:
            per_task.setdefault(decision.task.key, []).append(decision)
        await asyncio.gather(*(self._in_order(group) for group in per_task.values()))

    async def _in_order(self, group: list[Decision]) -> None:
        for decision in group:
            async with self._limit:
                if isinstance(decision, Admit):
                    await self.admit(decision)
                elif isinstance(decision, Pending):
                    await self.pending(decision)
                elif isinstance(decision, Evict):
                    await self.evict(decision)
                elif isinstance(decision, Fail):
                    await self.fail(decision)

    async def admit(self, decision: Admit) -> None:
        """Create the Job of an admission, then record it; a refusal backs the task off."""
        key, scheduler = decision.task.key, self.controller.scheduler
        record = self.controller.tasks.get(key)
        if record is None or record.deleting:
            scheduler.finish(key)
            return
        if record.revision is not None and record.revision[0] is (decision.task.unflavored or decision.task):
            records.take_revision(record)  # admitted as edited: the status says so
        attempt = record.attempt + 1
        records.drop_condition(record, GPU_MEMORY_WITHIN_BUDGET)  # judged anew for the new placement
        flavor = scheduler.flavors.get(decision.task.flavor) if decision.task.flavor else None
        unpinnable = await self.pinner.refusal(decision.placement)
        if unpinnable is not None:
            await self._rejected(record, unpinnable, PINNING_UNAVAILABLE)
            return
        try:
            job = workload_of(record).job_for(
                decision.placement, attempt=attempt, queue=decision.task.queue, flavor=decision.task.flavor,
                tolerations=flavor.tolerations if flavor else (), pinning=self.pinning, request=decision.task.request)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # conversion should have refused it
            log.error("building the Job of %s failed: %r", key, exc)
            await self._rejected(record, f"the pod template cannot be made into a Job: {exc!r}")
            return
        name = job["metadata"]["name"]
        try:
            refused = await self.pinner.prepare(record.obj, name, decision.task.request, decision.placement)
        except Fenced:
            scheduler.requeue(key)  # not leading any more: the next leader decides
            return
        except ApiError as exc:
            await self.pinner.job_deleted(record.namespace, name)
            await self._rejected(record, f"the API server refused Job {name}: {exc.status} {exc.reason}: {exc.message}")
            return
        if refused is not None:
            await self._rejected(record, refused)
            return
        await self._create(record, Unconfirmed(decision, job, attempt))

    async def _create(self, record: TaskRecord, sent: Unconfirmed) -> None:
        """POST the Job of an admission: created (recorded), 409 (adopted), refused (backed off), fenced
        (requeued), or unanswered (the booking kept until :meth:`confirm_creates` finds out)."""
        job, name = sent.job, sent.job["metadata"]["name"]
        records.creating(record, name)
        try:
            await self.writer.create(JOBS, job, record.namespace)
        except AlreadyExists:
            await self._adopt(record, sent)
            return
        except Fenced:
            records.creating(record, None)
            self.controller.scheduler.requeue(record.key)  # not leading any more: the next leader decides
            return
        except Unanswered as exc:
            log.warning("creating Job %s/%s got no answer (%s): its GPUs stay booked until a read says whether it "
                        "exists", record.namespace, name, exc)
            self._unconfirmed(record, sent)
            return
        except ApiError as exc:
            records.creating(record, None)
            await self.pinner.job_deleted(record.namespace, name)  # its ResourceClaimTemplate, made just before
            await self._rejected(record, f"the API server refused Job {name}: {exc.status} {exc.reason}: {exc.message}")
            return
        await self._created(record, sent.decision, sent.decision.placement, name, sent.attempt)

    async def _created(self, record: TaskRecord, decision: Admit, placement: Placement, name: str,
                       attempt: int) -> None:
        """Record an admission whose Job exists (``name``, on ``placement``)."""
        if attempt == 1 and decision.task.created:
            self.metrics.latency.labels(decision.task.queue).observe(max(0.0, time.time() - decision.task.created))
        in_flavor = f" (flavor {decision.task.flavor})" if decision.task.flavor else ""
        message = f"Admitted by GPUClusterQueue {decision.task.queue!r}{in_flavor} on {describe(placement)}"
        quota = f"quota reserved in {decision.task.queue!r}{in_flavor}"
        records.created(record, attempt=attempt, flavor=decision.task.flavor)
        self.controller.pods.started(record, time.time())
        await self.transitions.admitted(record, placement, job_name=name, attempt=attempt, quota=quota,
                                        message=message)
        self.controller.pods.admitted_with(record)  # its pod may have started while the create's answer was awaited

    def _unconfirmed(self, record: TaskRecord, sent: Unconfirmed) -> None:
        """Keep the booking of a create whose outcome is unknown; look the Job up after the next backoff step."""
        records.creating(record, sent.job["metadata"]["name"])
        sent.retry_at = time.monotonic() + doubling_backoff_s(sent.failures, CONFIRM_RETRY_S, CONFIRM_RETRY_MAX_S)
        self.creating[record.key] = sent

    async def confirm_creates(self) -> None:
        """Find out, for each Job create whose answer was lost and whose lookup is due, whether the Job exists (the
        Jobs informer's view, else a GET): adopted when it does, sent again when it does not; a lookup that fails
        too is tried again after a backoff."""
        now = time.monotonic()
        due = [key for key, sent in self.creating.items() if sent.retry_at <= now]
        await asyncio.gather(*(self._confirm(key) for key in due))

    async def _confirm(self, key: str) -> None:
        sent = self.creating.get(key)
        record = self.controller.tasks.get(sent.decision.task.key) if sent is not None else None
        if sent is None or record is None or record.creating != sent.job["metadata"]["name"]:
            self.creating.pop(key, None)  # deleted or evicted meanwhile: whoever did that owns the Job now
            return
        meta = sent.job["metadata"]
        job = self.controller.jobs.get(f"{meta['namespace']}/{meta['name']}")  # the informer's view
        if job is None or job.task_uid != record.uid:
            try:
                job = job_record(await self.writer.client.get(JOBS, meta["name"], meta["namespace"]))
            except NotFound:
                job = None
            except ApiError as exc:
                sent.failures += 1
                log.info("looking up Job %s/%s failed (%s); asked again later", meta["namespace"], meta["name"], exc)
                self._unconfirmed(record, sent)
                return
        del self.creating[key]
        if job is None:
            log.info("Job %s/%s was never created: sent again", meta["namespace"], meta["name"])
            await self._create(record, Unconfirmed(sent.decision, sent.job, sent.attempt))
            return
        log.info("Job %s/%s exists after a create whose answer was lost: adopted", meta["namespace"], meta["name"])
        await self._adopt(record, sent, job)

    async def _adopt(self, record: TaskRecord, sent: Unconfirmed, job: JobRecord | None = None) -> None:
        """A Job of that name exists (a lost create answer, or another replica's). When it is this task's, it is the
        admission's: its placement wins and is taken into the books (never two beliefs); one the books cannot hold
        is deleted and the task requeued (:meth:`_conflict`); one that finished ends the task. A Job of another task
        of that name (deleted, not yet garbage-collected) requeues the task. ``job``: the Job as known (None: GET
        it; a GET that fails leaves the create unconfirmed, looked up again later)."""
        meta, scheduler = sent.job["metadata"], self.controller.scheduler
        records.creating(record, None)
        if job is None:
            try:
                job = job_record(await self.writer.client.get(JOBS, meta["name"], meta["namespace"]))
            except NotFound:
                job = None
            except ApiError as exc:
                log.info("reading Job %s/%s after a 409 failed (%s); looked up again later", meta["namespace"],
                         meta["name"], exc)
                self._unconfirmed(record, sent)
                return
        if job is None or job.task_uid != record.uid or job.placement is None:
            log.info("Job %s/%s belongs to an earlier task of that name; requeued", meta["namespace"], meta["name"])
            scheduler.requeue(record.key)
            return
        placement = job.placement
        self.controller.adopting(job)
        if job.outcome is not None:  # it ran to its end while nobody knew: the task's end, never run again
            scheduler.finish(record.key)
            records.ended_unseen(record, job.name, job.attempt)
            await self.transitions.finished(record, job.outcome, job.why)
            return
        if job.terminating:  # being deleted: held until it is gone; the next admission makes a Job of another name
            scheduler.requeue(record.key)
            records.with_job(record, record.job_name, job.attempt)
            self.controller.hold(job)
            return
        entry = scheduler.ledger.get(record.key)
        if entry is not None and entry.placement != placement:
            log.warning("Job %s/%s exists on %s, not on the %s just chosen: adopting its placement",
                        meta["namespace"], meta["name"], describe(placement), describe(entry.placement))
            scheduler.finish(record.key)
            if not scheduler.restore(entry.task, placement, time.time()):
                await self._conflict(record, job)
                return
            self.metrics.adopted.inc()
        else:
            log.info("Job %s/%s exists already: taking it as created", meta["namespace"], meta["name"])
        await self._created(record, sent.decision, placement, job.name, job.attempt)

    async def _conflict(self, record: TaskRecord, job: JobRecord) -> None:
        """A Job of the task exists on GPUs the books gave to others since (its create's answer was lost): it is
        deleted (what of its GPUs is free held until it is gone) and the task requeued, reason PlacementConflict
        with a Warning Event; no GPU is ever booked over its memory."""
        assert job.placement is not None
        scheduler = self.controller.scheduler
        scheduler.requeue(record.key)  # the restored booking over-commits: released at once, the task queued again
        self.controller.hold(job, fit=True)
        records.with_job(record, job.name, job.attempt)
        message = (f"Job {job.name} exists on {describe(job.placement)}, which was booked for other tasks while its "
                   "create went unanswered (a GPU would be over its memory): the Job is deleted and the task requeued")
        self.metrics.evictions.labels(PLACEMENT_CONFLICT).inc()
        await self.transitions.evicted(record, PLACEMENT_CONFLICT, message)
        self.deletions[job.key] = Deletion(job, "Background")
        await self.delete(job.key)

    async def _rejected(self, record: TaskRecord, why: str, reason: str = JOB_REJECTED) -> None:
        """Give the task back to the core, held back for the next backoff step, and say why (``reason``)."""
        scheduler = self.controller.scheduler
        failures = records.failed_again(record, per_spec=True)
        delay = backoff_s(failures)
        records.retry_at(record, time.monotonic() + delay)
        message = f"{why}; retried in {delay:g}s (attempt {failures})"
        scheduler.requeue(record.key)
        scheduler.defer(record.key, time.time() + delay, reason, message)
        log.warning("task %s: %s", record.key, message)
        await self.transitions.rejected(record, reason, message)

    async def pending(self, decision: Pending) -> None:
        """Record why a task waits (an Event only for a new reason)."""
        record = self.controller.tasks.get(decision.task.key)
        if record is None or record.phase != PENDING or record.blocked is not None or record.invalid is not None:
            return
        if decision.reason in BACKOFF_REASONS and record.last_wait == (decision.reason, decision.message):
            return  # said already when the Job was refused
        position = decision.position if decision.position >= 0 else None
        await self.transitions.waiting(record, decision.reason, decision.message, position)

    async def evict(self, decision: Evict) -> None:
        """Requeue an evicted task (its current spec), delete its Job; its GPUs stay held until the Job is gone."""
        key = decision.task.key
        record = self.controller.tasks.get(key)
        if record is None:
            return
        job = self._current_job(record)
        self.controller.departing(job, decision.held)  # its pods keep their GPUs until the Job is gone
        self.metrics.evictions.labels(decision.reason).inc()
        if decision.reason == "Preempted":
            self.metrics.preemptions.labels(decision.task.queue).inc()
        if decision.reason in FAILURE_REASONS:
            records.rescheduled(record)
            self.metrics.reschedules.inc()
        await self.transitions.evicted(record, decision.reason, decision.message)
        if record.revision_error is not None and key not in self.controller.scheduler.pending:
            records.revision_invalid(record)  # its edited spec can never run
            await self.transitions.invalid(record)
        if job is not None:
            propagation = workload_of(record).stop_propagation(decision.reason)
            self.deletions[job.key] = Deletion(job, propagation)
            await self.delete(job.key)

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

    async def fail(self, decision: Fail) -> None:
        """A task failed for good (MaxReschedulesExceeded): Failed, with the reason and a Warning Event."""
        record = self.controller.tasks.get(decision.task.key)
        if record is not None:
            await self.transitions.failed(record, decision.reason, decision.message)

    # -- pods that never start -------------------------------------------------------------------------
    async def start_problem(self, record: TaskRecord) -> str:
        """Why a task's pod is not running: the Job's FailedCreate Event, or its pod's scheduling condition."""
        timeout = self.controller.config.pod_start_timeout_s
        job_key = f"{record.namespace}/{record.job_name}"
        details = self.controller.pod_problems.get(job_key)
        fields = f"involvedObject.kind=Job,involvedObject.name={record.job_name},reason=FailedCreate"
        try:
            events = await self.writer.client.list(EVENTS, record.namespace, fields=fields)
        except ApiError:
            events = []
        if events:
            last = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
            details = f"FailedCreate: {last.get('message')}"
        return f"no pod of Job {record.job_name} running {timeout:g}s after admission: {details or 'no pod seen'}"

    async def pods_not_starting(self, overdue: list[TaskRecord]) -> None:
        """Evict tasks past their pod-start deadline, with the reason; they are retried after a backoff."""
        for record in overdue:
            message = await self.start_problem(record)
            delay = backoff_s(records.failed_again(record, per_spec=False))
            log.warning("task %s: %s; evicted, retried in %gs", record.key, message, delay)
            self.controller.pods_not_starting(record, message, time.time() + delay)

    # -- Job deletions ------------------------------------------------------------------------------
    async def delete(self, job_key: str) -> None:
        """Try one deletion; on failure try again after a backoff (:meth:`retry_deletions`)."""
        deletion = self.deletions.get(job_key)
        if deletion is None:
            return
        job = deletion.job
        try:
            existed = await self.writer.delete(JOBS, job.name, job.namespace, propagation=deletion.propagation)
        except Fenced:
            return  # the next leader deletes it (its rebuild sees the Job of a requeued task)
        except ApiError as exc:
            deletion.failures += 1
            deletion.retry_at = time.monotonic() + backoff_s(deletion.failures)
            heapq.heappush(self._due, (deletion.retry_at, job_key))
            log.warning("deleting Job %s failed (%s); retried in %gs", job_key, exc, backoff_s(deletion.failures))
            return
        del self.deletions[job_key]
        await self.pinner.job_deleted(job.namespace, job.name)
        if not existed:
            self.relabel.drop(job.key)  # nothing left to confirm or label
            self.controller.job_gone(job)

    async def retry_deletions(self) -> None:
        """Retry the Job deletions whose backoff has passed (only those due, not a pass over every one)."""
        now, due = time.monotonic(), []
        while self._due and self._due[0][0] <= now:
            at, key = heapq.heappop(self._due)
            deletion = self.deletions.get(key)
            if deletion is not None and deletion.retry_at == at and deletion.failures > 0:
                due.append(key)
        await asyncio.gather(*(self.delete(k) for k in dict.fromkeys(due)))

    async def delete_job(self, record: TaskRecord) -> None:
        """Delete a deleted task's Job (its GPUs are held until it is gone)."""
        job = self._current_job(record)
        if job is not None:
            self.deletions[job.key] = Deletion(job, "Background")
            await self.delete(job.key)

    # -- reports -------------------------------------------------------------------------------------
    async def publish(self, reports: Iterable[Report]) -> None:
        """Publish what the controller queued: invalid specs, waits, finished Jobs, running pods."""
        for report in reports:
            record, t = report.record, self.transitions
            if report.kind == ReportKind.INVALID and record.invalid is not None:
                await t.invalid(record)
            elif report.kind == ReportKind.BLOCKED and record.blocked is not None:
                await t.blocked(record, *record.blocked)
            elif report.kind == ReportKind.SPEC_IGNORED and record.phase in PLACED_PHASES:
                message = (f"spec changed while Job {record.job_name} runs: it applies at the task's next admission "
                           "(after an eviction); delete and re-create the GPUTask to apply it now")
                await t.note(record, "Warning", "SpecChangeIgnored", message)
            elif report.kind == ReportKind.DEPRECATED_QUEUE and record.phase == PENDING:
                message = deprecation_message(record.namespace, report.detail)
                await t.note(record, "Warning", DEPRECATED_QUEUE_NAME, message)
            elif report.kind == ReportKind.FINISHED:
                job = self.controller.jobs.get(f"{record.namespace}/{record.job_name}")
                await t.finished(record, report.detail, job.why if job is not None else "")
            elif report.kind == ReportKind.RUNNING and record.phase == ADMITTED:
                await t.running(record, report.detail)
            elif report.kind == ReportKind.RESTORED:
                await t.publish(record, report.detail)
            elif report.kind == ReportKind.DELETE_JOB:
                await self.delete_job(record)
            elif report.kind in (ReportKind.GPUS_HELD, ReportKind.GPUS_RELEASED):
                await t.gpus_held(record, report.detail, held=report.kind == ReportKind.GPUS_HELD)
            elif report.kind in (ReportKind.OVER_BUDGET, ReportKind.WITHIN_BUDGET) and record.phase in PLACED_PHASES:
                await self.memory_budget(record, report.kind == ReportKind.WITHIN_BUDGET, report.detail)
            elif report.kind == ReportKind.STRAY_JOB and report.detail in self.controller.jobs:
                job = self.controller.jobs[report.detail]
                self.metrics.strays.inc()
                self.deletions[job.key] = Deletion(job, "Background")
                await self.delete(job.key)
                message = (f"Job {job.name} was a second live Job of the task (its status names "
                           f"{record.job_name}); deleted")
                await t.note(record, "Warning", "StrayJobDeleted", message)

    async def memory_budget(self, record: TaskRecord, within: bool, message: str) -> None:
        """The condition GPUMemoryWithinBudget: False (reason GPUMemoryExceeded, a Warning Event naming each GPU,
        what its pods use and the budget) or True again (reason GPUMemoryWithinBudget, a Normal Event). Set only
        once a task went over budget; a new admission starts without it."""
        if within:
            set_condition(record, GPU_MEMORY_WITHIN_BUDGET, True, GPU_MEMORY_WITHIN_BUDGET, message)
            kept = str((record.obj.get("status") or {}).get("message") or message)
            await self.transitions.publish(record, kept, ("Normal", GPU_MEMORY_WITHIN_BUDGET, message))
            return
        text = f"its pods use more GPU memory than it reserved: {message}"
        set_condition(record, GPU_MEMORY_WITHIN_BUDGET, False, GPU_MEMORY_EXCEEDED, text)
        await self.transitions.publish(record, text, ("Warning", GPU_MEMORY_EXCEEDED, text))

    async def report_gpunodes(self) -> None:
        """Write the conditions of each GPUNode whose refused entries or PodResources availability changed:
        Accepted (a Warning Event GPUNodeRefused when some entries are refused) and, where the agent reports
        it, PodResourcesAvailable (a Warning Event PodResourcesUnavailable when it turns False, unless the agent
        was configured not to read it: reason Disabled). The operator
        is the only writer of ``status.conditions`` (a merge patch replaces the list); the agent writes
        ``status.podResources``, which this condition reflects."""
        inventory = self.controller.inventory
        for name in sorted(inventory.to_report):
            errors = inventory.gpunode_errors.get(name, [])
            message = "; ".join(errors) if errors else "every GPU entry and the heartbeat are sound"
            conditions = [{"type": "Accepted", "status": "False" if errors else "True",
                           "reason": "RefusedEntries" if errors else "Sound", "message": message[:32768],
                           "lastTransitionTime": now_rfc3339()}]
            devices = inventory.device_reports.get(name)
            said = inventory.device_said.get(name)
            if devices is not None and devices.available is not None:
                conditions.append(pod_resources_condition(devices.available, devices.reason, devices.message))
            try:
                await self.writer.patch(GPUNODES, name, {"status": {"conditions": conditions}}, status=True)
            except ApiError as exc:
                if not isinstance(exc, (Fenced, NotFound)):
                    log.warning("status patch of GPUNode %s failed: %s", name, exc)
                    continue
            inventory.to_report.discard(name)
            involved = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUNode", "name": name}
            if errors:
                await self.writer.event(involved, "Warning", "GPUNodeRefused", message)
            if devices is not None and devices.available is not None:
                inventory.device_said[name] = (devices.available, devices.reason)
                if not devices.available and said != (False, devices.reason) and devices.reason != "Disabled":
                    await self.writer.event(involved, "Warning", "PodResourcesUnavailable", conditions[-1]["message"])

    async def collect_claims(self) -> None:
        """Delete the shared ResourceClaims (dra mode) no reservation uses any more (:meth:`Pinner.collect`)."""
        scheduler = self.controller.scheduler
        await self.pinner.collect(scheduler.cluster.reservations(), scheduler.ledger.version)

    async def keep_queue_finalizers(self) -> None:
        """The queue-in-use finalizer on every GPUClusterQueue and GPULocalQueue (:class:`QueueUpkeep`)."""
        await self.queues.keep_finalizers()

    async def report_queues(self) -> None:
        """Patch each queue's status when it changed since the last write (:class:`QueueUpkeep`)."""
        await self.queues.report()


__all__ = ["Executor", "backoff_s"]
