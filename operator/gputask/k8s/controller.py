"""The operator's state: task and Job records around the core scheduler. Synchronous, no I/O.

Watch handlers feed it (:meth:`Controller.on_task`, :meth:`on_job`, ... ); it feeds the core and
never writes to the API itself. What must be reported (an invalid spec, a finished Job, a pod
that started) is queued in :attr:`Controller.outbox` for the scheduling loop to publish through
:class:`~gputask.k8s.tasks.Transitions`. Everything here can be rebuilt from GPUTasks, Jobs,
Nodes, GPUNodes, GPUClusterQueues, PriorityClasses and Namespaces (:meth:`Controller.rebuild`),
which is what a restarted (or newly elected) operator does before it admits anything.

A live Job of ours always holds its GPUs in the books: the current Job of a placed task through the task's
booking, one being created through the booking of the admission that sends it (``TaskRecord.creating``), and
any other (being deleted, the Job of a task that no longer claims it, or one whose create answer was lost while
its task waits) under :func:`holding_key` until it is gone and so are its pods bound to a node
(:mod:`gputask.k8s.lingering`: pods on an unreachable node outlive their Job), so neither a requeued task nor a
restart can double-book them. A Job that finished while its task did not know (attempt newer than the task's)
finishes the task: it is never run again.

A pod of ours that the system disrupted (its ``DisruptionTarget`` condition: the taint manager, node-pressure
eviction by the kubelet, preemption by kube-scheduler, the Eviction API, pod garbage collection) makes its Job's
failure a disruption, not the workload's: the task is evicted under that reason (counted against maxReschedules)
and requeued instead of failing.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from gputask.config import Config
from gputask.core import InvalidTaskError, Scheduler, Task, TaskKey, make_policy, task_key
from gputask.core.budget import MemoryBudget
from gputask.core.defrag import DefragConfig
from gputask.k8s import records
from gputask.k8s.foreign import ForeignPods
from gputask.k8s.inventory import Inventory
from gputask.k8s.jobrecords import SYSTEM_DISRUPTIONS, JobRecord, holding_key, job_record
from gputask.k8s.localqueues import LocalQueues
from gputask.k8s.records import (
    ADMITTED,
    FAILED,
    FINISHED_PHASES,
    JOB_DELETED,
    PENDING,
    PLACED_PHASES,
    PLACEMENT_CONFLICT,
    PODS_NOT_STARTING,
    PRIORITY_CLASS_NOT_FOUND,
    RUNNING,
    SUCCEEDED,
    WAITING_REASONS,
    TaskRecord,
    TaskRecords,
)
from gputask.k8s.reports import Report, ReportKind
from gputask.k8s.restart import Restart
from gputask.k8s.specs import Specs
from gputask.k8s.taskpods import TaskPods

log = logging.getLogger("gputask.controller")


def operator_defragmentation(config: Config) -> DefragConfig:
    """The core's defragmentation settings in the operator: an Enabled plan is proposed first, and applied only once
    the Eviction API has evicted every moved pod within its PodDisruptionBudgets (:mod:`gputask.k8s.evictions`,
    issue 32)."""
    return replace(config.defragmentation.core(), ask_budgets=True)


class Controller:
    """Task and Job records, the inventory and the core scheduler. Never raises on bad input."""

    def __init__(self, config: Config | None = None, *, foreign: ForeignPods | None = None) -> None:
        self.config = config or Config()
        self.foreign = foreign or ForeignPods()  # reset from a listing at each rebuild, then fed by pod events
        self.reset()

    def reset(self) -> None:
        """Forget everything but the configuration and the foreign-pod index (before a rebuild)."""
        budget = self.config.memory_budget
        self.scheduler = Scheduler(
            policy=make_policy(self.config.policy),
            node_failure_grace_s=self.config.node_failure_grace_period_s,
            preemption_strategies=self.config.fair_sharing.preemption_strategies,
            tracked_positions=self.config.queue_positions_tracked,
            memory_budget=MemoryBudget(budget.action, budget.tolerance_mib),
            defragmentation=operator_defragmentation(self.config),
        )
        self.pods = TaskPods(self)  # the pods of our Jobs, disruptions, pod-start deadlines, memory budgets
        self.task_pods, self.pods_of_jobs, self.over_budget = (  # (pod uid -> Job key, for the pods of our Jobs)
            self.pods.task_pods, self.pods.pods_of_jobs, self.pods.over_budget)
        self.pod_problems, self.disrupted = self.pods.pod_problems, self.pods.disrupted
        self.inventory = Inventory(self.scheduler, self.config, self.foreign, our_pods=self.task_pods)
        self.local_queues = LocalQueues()
        self.records = TaskRecords()  # the one owner of task records (gputask.k8s.records)
        self.tasks, self.by_uid, self.in_namespace = self.records.tasks, self.records.by_uid, self.records.in_namespace
        self.jobs: dict[str, JobRecord] = {}  # by "namespace/name"
        self.jobs_of_task: dict[str, dict[str, JobRecord]] = {}  # task uid -> Job key -> Job
        self.held: dict[str, TaskKey] = {}  # departing Job key -> holding key in the scheduler
        self.blocked_on: dict[str, set[TaskKey]] = {}  # (Workload)PriorityClass name -> tasks waiting for it
        self.outbox: list[Report] = []
        self.specs = Specs(self)  # spec conversion, queue resolution, blocked tasks
        self.restart = Restart(self)  # the rebuild from listed objects

    # -- what the pods, the specs and the restart do (their own classes) ----------------------------
    def on_task_pod(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """A pod of one of our Jobs changed (:meth:`TaskPods.on_task_pod`)."""
        self.pods.on_task_pod(pod, deleted)

    def keep_task_pods(self, uids: Collection[str]) -> None:
        """Forget the pods of our Jobs not among ``uids`` (:meth:`TaskPods.keep_task_pods`)."""
        self.pods.keep_task_pods(uids)

    def held_for(self, key: TaskKey) -> list[str]:
        """What is held for Jobs of task ``key`` gone before their pods (:meth:`TaskPods.held_for`)."""
        return self.pods.held_for(key)

    def overdue(self, now: float) -> list[TaskRecord]:
        """Admitted tasks past their pod-start deadline (:meth:`TaskPods.overdue`)."""
        return self.pods.overdue(now)

    def convert_task(self, obj: Mapping[str, Any]) -> Task:
        """Core Task of a GPUTask body (:meth:`Specs.convert_task`); raises InvalidTaskError."""
        return self.specs.convert_task(obj)

    def on_priority_class(self, obj: Mapping[str, Any], *, kueue: bool, deleted: bool = False) -> None:
        """A (Workload)PriorityClass changed (:meth:`Specs.on_priority_class`)."""
        self.specs.on_priority_class(obj, kueue=kueue, deleted=deleted)

    def on_local_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """A GPULocalQueue changed (:meth:`Specs.on_local_queue`)."""
        self.specs.on_local_queue(obj, deleted)

    def on_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """A GPUClusterQueue changed (:meth:`Specs.on_queue`)."""
        self.specs.on_queue(obj, deleted)

    def rebuild(self, objects: Mapping[str, Iterable[dict[str, Any]]], now: float | None = None) -> None:
        """Start over from listed objects, in dependency order (:meth:`Restart.rebuild`)."""
        self.restart.rebuild(objects, now)

    # -- lookups ------------------------------------------------------------------------------------
    def record_by_uid(self, uid: str) -> TaskRecord | None:
        """The task record with metadata.uid ``uid``."""
        return self.by_uid.get(uid)

    def job_of(self, record: TaskRecord) -> JobRecord | None:
        """The newest live (not terminating) Job of ``record``, if one exists."""
        jobs = [j for j in self.jobs_of_task.get(record.uid, {}).values() if not j.terminating]
        return max(jobs, key=lambda j: j.attempt, default=None)

    def take_reports(self) -> list[Report]:
        """What is to be published, in the order it happened; the outbox is emptied."""
        reports, self.outbox = self.outbox, []
        return reports

    # -- jobs ---------------------------------------------------------------------------------------
    def on_job(self, obj: Mapping[str, Any]) -> JobRecord | None:
        """One of our Jobs was added or changed: remember it; report its end (a disruption of its pod requeues
        the task instead); hold its GPUs when no booking of its task covers them."""
        job = job_record(obj)
        if job is None:
            return None
        self._remember(job)
        record = self.by_uid.get(job.task_uid)
        current = record is not None and record.job_name == job.lead and record.phase in PLACED_PHASES
        creating = record is not None and record.creating == job.lead  # the booking of its admission covers it
        if not current and not creating and (job.terminating or self.config.queueing != "kueue"):
            self.hold(job)  # Kueue mode: Kueue books the GPUs of a suspended Job; gputask holds only departing ones
            if record is not None and self._unseen_end(record, job):
                self.scheduler.finish(record.key)  # its run ended while nobody knew: done, never run again
                records.ended_unseen(record, job.name, job.attempt)
                self.outbox.append(Report(ReportKind.FINISHED, record, job.outcome or ""))
        if current and job.outcome is not None:
            assert record is not None
            disruption = self.disrupted.get(job.key) if job.outcome == FAILED else None
            if disruption is not None:
                self.scheduler.evict(record.key, *disruption, failure=True)
                return job
            live = gang_end(self, record, job) if job.gang else []
            if live is None:
                return job  # a gang succeeds when every Job of it has
            self.scheduler.finish(record.key)
            for other in live:
                self.hold(other)  # its pods run until it is gone
            self.outbox.append(Report(ReportKind.FINISHED, record, job.outcome))
        return job

    def _unseen_end(self, record: TaskRecord, job: JobRecord) -> bool:
        """True when ``job`` finished as an attempt of a waiting task newer than any it recorded: a create whose
        answer was lost ran to its end (gputask mode; a Job of an earlier attempt was evicted, not the task's end)."""
        return (job.outcome is not None and record.phase == PENDING and not record.deleting
                and job.attempt > record.attempt and self.config.queueing != "kueue")

    def adopting(self, job: JobRecord) -> None:
        """A Job found to be its task's (a lost create answer, a 409 on create): the task's booking takes its GPUs,
        so any hold of it ends."""
        self._remember(job)
        held = self.held.pop(job.key, None)
        if held is not None:
            self.scheduler.finish(held)

    # -- the task's pods ----------------------------------------------------------------------------

    # -- GPU memory budgets -------------------------------------------------------------------------
    def on_gpunode(self, obj: Mapping[str, Any], now: float, deleted: bool = False) -> None:
        """A GPUNode changed: the inventory takes its GPUs; the memory its agent reports per pod is judged
        against our tasks' reservations (:meth:`judge_memory`)."""
        self.inventory.on_gpunode(obj, now, deleted)
        name = (obj.get("metadata") or {}).get("name")
        if not deleted and isinstance(name, str):
            self.pods.judge_memory(name, obj.get("status"))

    def pods_not_starting(self, record: TaskRecord, message: str, retry_at: float) -> None:
        """Evict a task whose pods never started (counted against maxReschedules); retry it at ``retry_at``."""
        if record.phase != ADMITTED:
            return
        self.scheduler.evict(record.key, PODS_NOT_STARTING, message, failure=True)
        if record.key in self.scheduler.pending:
            self.scheduler.defer(record.key, retry_at, PODS_NOT_STARTING, message)

    def _remember(self, job: JobRecord) -> None:
        self.jobs[job.key] = job
        self.jobs_of_task.setdefault(job.task_uid, {})[job.key] = job

    def hold(self, job: JobRecord, *, fit: bool = False) -> None:
        """Keep a departing Job's GPUs reserved until it is gone (after an eviction or at a restart).

        ``fit`` holds only what is free of each GPU now (what a nominated preemptor took is its own).
        """
        if job.key in self.held or job.placement is None or job.outcome is not None:
            return
        key = holding_key(job)
        if self.scheduler.hold(key, job.placement, fit=fit) is not None:
            self.held[job.key] = key

    def holds_gpus(self, job_key: str) -> bool:
        """True when the Job ``namespace/name`` has GPUs reserved in the books: the unfinished Job of a placed task,
        or a departing Job held until it is gone."""
        job = self.jobs.get(job_key)
        if job is None:
            return False
        if job_key in self.held:
            return True
        record = self.by_uid.get(job.task_uid)
        return (record is not None and record.job_name == job.lead and record.phase in PLACED_PHASES
                and job.outcome is None)

    def departing(self, job: JobRecord | None, held: TaskKey | None, gang: Iterable[JobRecord] = ()) -> None:
        """An evicted task's Job goes away: the core's hold of its GPUs (``held``) lasts until the Job is
        gone; with no Job to wait for, it ends now. An evicted gang's Jobs (``gang``): the hold of the whole gang
        becomes one hold per Job, of its own pods' GPUs, each lasting until that Job is gone (:meth:`hold`)."""
        gang = list(gang)
        if gang:
            if held is not None:
                self.scheduler.finish(held)
            for each in gang:
                self.hold(each)
            return
        if held is None:
            return
        if job is None or job.key in self.held:
            self.scheduler.finish(held)
        else:
            self.held[job.key] = held

    def on_job_deleted(self, obj: Mapping[str, Any]) -> JobRecord | None:
        """A Job is gone: release what it held; a placed task whose current Job it was is evicted."""
        meta = obj["metadata"]
        job = self.jobs.get(f"{meta.get('namespace') or 'default'}/{meta['name']}") or job_record(obj)
        if job is not None:
            self.job_gone(job)
        return job

    def job_gone(self, job: JobRecord) -> None:
        """Forget a Job that no longer exists (its DELETED event, or a delete that found nothing)."""
        self.jobs.pop(job.key, None)
        siblings = self.jobs_of_task.get(job.task_uid, {})
        siblings.pop(job.key, None)
        if not siblings:
            self.jobs_of_task.pop(job.task_uid, None)
        held = self.held.pop(job.key, None)
        if not self.pods.pods_outlive(job, held) and held is not None:
            self.scheduler.finish(held)
        self.disrupted.pop(job.key, None)
        self.pods.early_starts.pop(job.key, None)
        self.pods.gang_started.pop(f"{job.namespace}/{job.lead}", None)
        record = self.by_uid.get(job.task_uid)
        if record is None:
            return
        self.scheduler.victim_gone(record.key)
        if record.job_name == job.lead and record.phase in PLACED_PHASES and job.outcome is None:
            message = f"Job {job.name} was deleted while the task ran; requeued"
            self.scheduler.evict(record.key, JOB_DELETED, message)

    # -- tasks --------------------------------------------------------------------------------------

    def is_echo(self, obj: Mapping[str, Any]) -> bool:
        """True when ``obj`` (a GPUTask from a watch) is exactly what its record already holds: the same uid at the
        resourceVersion our own status write produced (the write's echo), so it carries no change to take."""
        meta = obj["metadata"]
        record = self.tasks.get(task_key(meta.get("namespace") or "default", meta["name"]))
        version = meta.get("resourceVersion")
        return record is not None and version is not None and record.whole_at == version and record.uid == meta.get(
            "uid"
        )

    def on_task(self, obj: dict[str, Any]) -> TaskRecord:
        """Take a GPUTask body (added or modified) and return its record.

        A new or changed pending task is (re)queued; an invalid one is reported; a placed one is
        left alone, and a spec change is reported as applying only when it is requeued (its next
        admission converts the spec again); a finished one stays finished.
        """
        meta = obj["metadata"]
        key = task_key(meta.get("namespace") or "default", meta["name"])
        record = self.tasks.get(key)
        if record is not None and record.uid != meta.get("uid"):
            self._forget(record)  # re-created under the same name: a new task
            record = None
        if record is None:
            record = self.records.add(key, str(meta.get("uid")), obj)
            self.restart.adopt_status(record, obj)
        old_spec, old_labels = record.obj.get("spec"), (record.obj["metadata"].get("labels") or {})
        records.took_object(record, obj)
        changed = old_spec != obj.get("spec") or old_labels != (meta.get("labels") or {})
        if record.phase in PLACED_PHASES:
            if changed:
                self.specs.revise(record, spec_changed=old_spec != obj.get("spec"))
            return record
        if record.deleting or (record.phase in FINISHED_PHASES and record.invalid is None):
            return record
        if changed or (record.task is None and record.invalid is None and record.blocked is None):
            self.requeue(record)
        return record

    def requeue(self, record: TaskRecord) -> None:
        """(Re)convert a task from its current spec and queue it, or report why it cannot be.

        A task the core has just admitted (a cycle's decisions not applied yet, so its phase still says
        Pending) is placed: the new spec waits for its next admission, as for any placed task."""
        if self.scheduler.ledger.get(record.key) is not None:
            self.specs.revise(record, spec_changed=False)
            return
        self.specs.unblock(record)
        try:
            task = self.specs.queued(record, self.specs.convert_task(record.obj))
        except InvalidTaskError as exc:
            records.converted(record, None)
            self.scheduler.finish(record.key)
            if exc.reason in WAITING_REASONS:
                self.specs.block(record, exc)
            else:
                records.refused(record, exc.reason, exc.message)
                self.outbox.append(Report(ReportKind.INVALID, record))
            return
        records.converted(record, task)
        if records.queued(record):  # a new spec: its Job is tried at once
            self.scheduler.undefer(record.key)
        if self.config.queueing == "kueue":
            return  # Kueue admits; gputask places when Kueue asks (gputask.k8s.kueue_admission)
        self.scheduler.set_reschedules(record.key, record.reschedules)
        self.scheduler.submit(task)

    # -- queues -------------------------------------------------------------------------------------

    def on_task_deleted(self, obj: Mapping[str, Any]) -> TaskRecord | None:
        """A GPUTask is gone (or being deleted): forget it; its Job keeps its GPUs until it is gone too."""
        meta = obj["metadata"]
        key = task_key(meta.get("namespace") or "default", meta["name"])
        record = self.tasks.get(key)
        if record is None or record.uid != meta.get("uid"):
            return None
        records.deleting(record)
        job = self.job_of(record)
        if job is not None and job.outcome is None and (record.phase in PLACED_PHASES or record.creating == job.lead):
            self.scheduler.finish(key)
            for each in self.jobs_of_task.get(record.uid, {}).values():  # a gang's every Job; a lone Job itself
                if each.lead == job.lead:
                    self.hold(each)  # the Job's pods still run until it is gone
        self._forget(record)
        return record

    def _forget(self, record: TaskRecord) -> None:
        self.specs.unblock(record)
        self.local_queues.forget(record.key)
        self.scheduler.finish(record.key)
        self.records.forget(record)

    # -- restart ------------------------------------------------------------------------------------

def gang_end(ctl: Controller, record: TaskRecord, job: JobRecord) -> list[JobRecord] | None:
    """A Job of a gang ended: None while that does not end the gang (it succeeded, others run on), else the
    gang's other Jobs still live: a failure stops them (reported), each holding its GPUs until it is gone."""
    gang = [j for j in ctl.jobs_of_task.get(record.uid, {}).values() if j.lead == job.lead]
    if job.outcome == SUCCEEDED:
        done = len(gang) >= job.gang_jobs and all(j.outcome == SUCCEEDED for j in gang)
        return [] if done else None
    live = [other for other in gang if other.outcome is None]
    for other in live:
        if not other.terminating:
            ctl.outbox.append(Report(ReportKind.GANG_ENDED, record, other.key))
    return live


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


__all__ = [
    "ADMITTED",
    "FAILED",
    "FINISHED_PHASES",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "JOB_DELETED",
    "PLACEMENT_CONFLICT",
    "PODS_NOT_STARTING",
    "PRIORITY_CLASS_NOT_FOUND",
    "SYSTEM_DISRUPTIONS",
    "WAITING_REASONS",
    "Controller",
    "JobRecord",
    "job_record",
    "Report",
    "ReportKind",
    "TaskRecord",
]
