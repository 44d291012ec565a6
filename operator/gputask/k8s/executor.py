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
- Pending: the wait reason; Evict: the task requeued, its Job stopped through its workload (deleted, retried with
  backoff until it is gone, its GPUs held meanwhile); Fail: Failed for good.

The API calls run here, concurrently; each answer becomes a typed outcome (:mod:`gputask.k8s.outcomes`: Created,
Adopted, Rejected, Fenced, Creating, Gone, ...) that :class:`~gputask.k8s.outcomes.Outcomes` applies to the core and
the records under the core gate; this module changes neither (``tests/unit/test_outcomes.py``). Every write goes
through the :class:`~gputask.k8s.writer.Writer`; every status and Event through
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

from gputask.core import Admit, Decision, Pending
from gputask.core.scheduler import Evict, Fail
from gputask.k8s import outcomes
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
from gputask.k8s.gangwrites import GangWrites
from gputask.k8s.jobrecords import JobRecord, job_record
from gputask.k8s.outcomes import (
    BACKOFF_REASONS,
    FAILURE_REASONS,
    JOB_REJECTED,
    Admitting,
    Adopted,
    Created,
    Creating,
    Evicting,
    FailedForGood,
    Gone,
    NotStarting,
    Outcome,
    Outcomes,
    Rejected,
    Reported,
    Step,
    Stop,
    Stopping,
    Waiting,
)
from gputask.k8s.phases import GPU_MEMORY_WITHIN_BUDGET
from gputask.k8s.pinner import PINNING_UNAVAILABLE, Pinner
from gputask.k8s.pinning import Pinning
from gputask.k8s.queue_status import QueueUpkeep
from gputask.k8s.relabel import JobFeed, Relabeler
from gputask.k8s.reports import Report
from gputask.k8s.tasks import TaskRecord, Transitions
from gputask.k8s.workload import Workload, workload_of
from gputask.k8s.writer import Writer, now_rfc3339
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.executor")

CONCURRENCY = 16
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
CONFIRM_RETRY_S = 1.0  # a create whose answer was lost is looked up after 1 s, doubling ...
CONFIRM_RETRY_MAX_S = 30.0  # ... up to 30 s while the API server does not answer
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # metav1.Condition's reason pattern


POD_RESOURCES_AVAILABLE = "PodResourcesAvailable"
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
    """A Job to stop until it is gone: the workload that stops it and why, failures so far, next try (monotonic
    s)."""

    job: JobRecord
    workload: Workload
    reason: str
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
    """Applies decisions and reports through the API; owns no scheduling state but the Job deletions still to retry
    and the Job creates whose answer was lost. What each answer changes in the core and the records is applied
    under the ``gate`` by :class:`~gputask.k8s.outcomes.Outcomes`, never here."""

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
        self.gate = gate or asyncio.Lock()  # the core gate (the loop's and the handlers')
        self.transitions = Transitions(writer)
        self.metrics = metrics or writer.metrics
        self.deletions: dict[str, Deletion] = {}  # Job key -> deletion to retry
        self.creating: dict[str, Unconfirmed] = {}  # task key -> a Job create whose answer was lost
        self._due: list[tuple[float, str]] = []  # heap of (retry_at, Job key) of failed deletions; outdated skipped
        self.queues = QueueUpkeep(controller, writer)
        self.pinner = Pinner(controller.config, writer, self.metrics)
        self.relabel = Relabeler(controller, writer, gate=self.gate, feed=job_feed)  # Jobs that lost the task label
        self.gangs = GangWrites(writer, self._apply, self.carry_out)  # a gang's Service, other Jobs, pod pins
        self.outcomes = Outcomes(controller, self.metrics, self.gate, creating=self.creating, backoff_s=backoff_s,
                                 forget_job=self.relabel.drop)
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
        self.gangs.reset()

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
                elif isinstance(decision, Pending):  # why it waits (an Event only for a new reason)
                    await self._apply(Waiting(decision))
                elif isinstance(decision, Evict):  # requeued, its Job stopped; its GPUs held until the Job is gone
                    await self._apply(Evicting(decision))
                elif isinstance(decision, Fail):  # Failed for good (MaxReschedulesExceeded), a Warning Event
                    await self._apply(FailedForGood(decision))

    async def admit(self, decision: Admit) -> None:
        """Create the Job of an admission, then record it; a refusal backs the task off."""
        if not (await self.outcomes.apply(Admitting(decision))).go:
            return  # its task is gone: its booking was released
        record = self.controller.tasks[decision.task.key]
        attempt = record.attempt + 1
        flavor = self.controller.scheduler.flavors.get(decision.task.flavor) if decision.task.flavor else None
        unpinnable = await self.pinner.refusal(decision.placement)
        if unpinnable is not None:
            await self._apply(Rejected(record, unpinnable, PINNING_UNAVAILABLE))
            return
        workload = workload_of(record)
        try:
            jobs = workload.jobs_for(
                decision.placement, attempt=attempt, queue=decision.task.queue, flavor=decision.task.flavor,
                tolerations=flavor.tolerations if flavor else (), pinning=self.pinning, request=decision.task.request)
            service = workload.service_for(decision.placement)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # conversion should have refused it
            log.error("building the Job of %s failed: %r", record.key, exc)
            await self._apply(Rejected(record, f"the pod template cannot be made into a Job: {exc!r}"))
            return
        job = jobs[0]
        name = job["metadata"]["name"]
        gang = len(jobs) > 1 or service is not None  # a gang: its Service and the Jobs of its other PodSets first
        if gang and not await self.gangs.prepare(record, workload, service, jobs[1:], attempt):
            return
        try:
            refused = await self.pinner.prepare(record.obj, name, decision.task.request, decision.placement)
        except Fenced:
            await self._apply(outcomes.Fenced(record))  # not leading any more: the next leader decides
            return
        except ApiError as exc:
            await self.pinner.job_deleted(record.namespace, name)
            await self._apply(Rejected(
                record, f"the API server refused Job {name}: {exc.status} {exc.reason}: {exc.message}"))
            return
        if refused is not None:
            await self._apply(Rejected(record, refused))
            return
        await self._create(record, Unconfirmed(decision, job, attempt))

    async def _apply(self, outcome: Outcome) -> None:
        """Apply ``outcome`` under the gate (:meth:`Outcomes.apply`), then carry out its steps."""
        await self.carry_out((await self.outcomes.apply(outcome)).steps)

    async def carry_out(self, steps: Iterable[Step]) -> None:
        """Write what is said and stop the Jobs to stop, in order (the gate not held)."""
        for step in steps:
            if isinstance(step, Stop):
                self.deletions[step.job.key] = Deletion(step.job, step.workload, step.reason)
                await self.delete(step.job.key)
            else:
                await self.transitions.say(step)

    async def _create(self, record: TaskRecord, sent: Unconfirmed) -> None:
        """POST the Job of an admission: created (recorded), 409 (adopted), refused (backed off), fenced
        (requeued), or unanswered (the booking kept until :meth:`confirm_creates` finds out)."""
        job, name = sent.job, sent.job["metadata"]["name"]
        await self._apply(Creating(record, name))
        try:
            await workload_of(record).start(self.writer, job, record.namespace)  # created, or an existing Job patched
        except AlreadyExists:
            await self._adopt(record, sent)
            return
        except Fenced:
            await self._apply(outcomes.Fenced(record, settled=True))  # not leading any more: the next leader decides
            return
        except Unanswered as exc:
            log.warning("creating Job %s/%s got no answer (%s): its GPUs stay booked until a read says whether it "
                        "exists", record.namespace, name, exc)
            await self._unconfirmed(record, sent)
            return
        except ApiError as exc:
            await self.pinner.job_deleted(record.namespace, name)  # its ResourceClaimTemplate, made just before
            why = f"the API server refused Job {name}: {exc.status} {exc.reason}: {exc.message}"
            await self.gangs.abandon(record, sent.job)  # a gang's other Jobs, created just before
            await self._apply(Rejected(record, why, settled=True))
            return
        await self._apply(Created(record, sent.decision, sent.decision.placement, name, sent.attempt))
        self.gangs.sent_whole(record)

    async def _unconfirmed(self, record: TaskRecord, sent: Unconfirmed) -> None:
        """Keep the booking of a create whose outcome is unknown; look the Job up after the next backoff step."""
        sent.retry_at = time.monotonic() + doubling_backoff_s(sent.failures, CONFIRM_RETRY_S, CONFIRM_RETRY_MAX_S)
        await self._apply(Creating(record, sent.job["metadata"]["name"], lost=sent))

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
                await self._unconfirmed(record, sent)
                return
        self.creating.pop(key, None)
        if job is None:
            log.info("Job %s/%s was never created: sent again", meta["namespace"], meta["name"])
            await self._create(record, Unconfirmed(sent.decision, sent.job, sent.attempt))
            return
        log.info("Job %s/%s exists after a create whose answer was lost: adopted", meta["namespace"], meta["name"])
        await self._adopt(record, sent, job)

    async def _adopt(self, record: TaskRecord, sent: Unconfirmed, job: JobRecord | None = None) -> None:
        """A Job of that name exists (a lost create answer, or another replica's): applied as :class:`Adopted`.
        ``job``: the Job as known (None: GET it; a GET that fails leaves the create unconfirmed, looked up again
        later)."""
        meta = sent.job["metadata"]
        if job is None:
            try:
                job = job_record(await self.writer.client.get(JOBS, meta["name"], meta["namespace"]))
            except NotFound:
                job = None
            except ApiError as exc:
                log.info("reading Job %s/%s after a 409 failed (%s); looked up again later", meta["namespace"],
                         meta["name"], exc)
                await self._unconfirmed(record, sent)
                return
        await self._apply(Adopted(record, sent, job))
        self.gangs.sent_whole(record)

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
            await self._apply(NotStarting(record, await self.start_problem(record)))

    # -- Job deletions ------------------------------------------------------------------------------
    async def delete(self, job_key: str) -> None:
        """Try one deletion (its workload stops it); on failure try again after a backoff
        (:meth:`retry_deletions`)."""
        deletion = self.deletions.get(job_key)
        if deletion is None:
            return
        job = deletion.job
        try:
            existed = await deletion.workload.stop(self.writer, job, deletion.reason)
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
            await self._apply(Gone(job))

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
        await self._apply(Stopping(record))

    # -- reports -------------------------------------------------------------------------------------
    async def publish(self, reports: Iterable[Report]) -> None:
        """Publish what the controller queued: invalid specs, waits, finished Jobs, running pods (each applied as
        :class:`Reported`)."""
        for report in reports:
            await self._apply(Reported(report))

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


__all__ = ["BACKOFF_REASONS", "FAILURE_REASONS", "GPU_MEMORY_WITHIN_BUDGET", "JOB_REJECTED", "Executor",
           "backoff_s"]
