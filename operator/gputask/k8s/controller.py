"""The operator's in-memory view: the core Scheduler plus what it needs from the API.

Watch handlers call the ``on_*`` methods here; they only feed the scheduler and never decide
(STYLE: Kueue). Everything here can be rebuilt from GPUTasks, Jobs, Nodes, GPUNodes,
GPUClusterQueues, PriorityClasses and Namespaces (:meth:`Controller.rebuild_from`), which is
what a restarted (or newly elected) operator does before it admits anything.

A Job that is being deleted (an evicted task's) keeps its GPUs reserved under a separate key
until it is gone, so neither a requeued task nor a restart can double-book them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gputask.config import Config
from gputask.core import GpuRequest, InvalidTaskError, Placement, Scheduler, Task, TaskKey, make_policy, task_key
from gputask.k8s import convert
from gputask.k8s.inventory import WORKLOAD_PRIORITY_LABEL, Inventory
from gputask.k8s.jobs import ATTEMPT_ANNOTATION, PLACEMENT_ANNOTATION, TASK_UID_ANNOTATION, parse_placement

log = logging.getLogger("gputask.controller")

PENDING, ADMITTED, RUNNING, SUCCEEDED, FAILED = "Pending", "Admitted", "Running", "Succeeded", "Failed"
FINISHED_PHASES = (SUCCEEDED, FAILED)
HOLD_PRIORITY = 2**31 - 1


@dataclass(slots=True)
class TaskRecord:
    """What the operator knows of one GPUTask (by ``namespace/name``)."""

    key: TaskKey
    uid: str
    obj: dict[str, Any]
    task: Task | None = None
    phase: str = PENDING
    attempt: int = 0
    job_name: str | None = None
    placement: Placement | None = None
    invalid: tuple[str, str] | None = None
    deleting: bool = False
    reschedules: int = 0
    spec_ignored: bool = False
    queue_position: int | None = None
    last_wait: tuple[str, str] | None = None
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class JobRecord:
    """One of our Jobs: its task uid, attempt, placement, outcome, and whether it is being deleted."""

    name: str
    namespace: str
    task_uid: str
    attempt: int
    placement: Placement | None
    outcome: str | None = None  # Succeeded | Failed | None while running
    terminating: bool = False

    @property
    def key(self) -> str:
        """``namespace/name`` of the Job."""
        return f"{self.namespace}/{self.name}"


def job_outcome(job: Mapping[str, Any]) -> str | None:
    """Succeeded/Failed from a Job's conditions (Complete/Failed True), else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return SUCCEEDED
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return FAILED
    return None


def job_record(obj: Mapping[str, Any]) -> JobRecord | None:
    """The JobRecord of one of our Jobs; None when it carries no task uid annotation."""
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    uid = annotations.get(TASK_UID_ANNOTATION)
    if not uid:
        return None
    try:
        attempt = int(annotations.get(ATTEMPT_ANNOTATION, "1"))
    except ValueError:
        attempt = 1
    return JobRecord(
        meta["name"],
        meta.get("namespace") or "default",
        uid,
        attempt,
        parse_placement(annotations.get(PLACEMENT_ANNOTATION)),
        job_outcome(obj),
        bool(meta.get("deletionTimestamp")),
    )


def holding_key(job: JobRecord) -> TaskKey:
    """Scheduler key under which a terminating Job keeps its GPUs until it is gone."""
    return TaskKey(f"{job.key}#terminating")


class Controller:
    """Scheduler plus API-derived lookups. Synchronous; never raises on bad input."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self.scheduler = Scheduler(
            policy=make_policy(self.config.policy), node_failure_grace_s=self.config.node_failure_grace_period_s
        )
        self.inventory = Inventory(self.scheduler, self.config)
        self.tasks: dict[TaskKey, TaskRecord] = {}
        self.by_uid: dict[str, TaskRecord] = {}
        self.jobs: dict[str, JobRecord] = {}  # by "namespace/name"
        self.jobs_of_task: dict[str, dict[str, JobRecord]] = {}  # task uid -> Job key -> Job
        self.held: dict[str, TaskKey] = {}  # terminating Job key -> holding key in the scheduler

    # -- lookups ------------------------------------------------------------------------
    def record_by_uid(self, uid: str) -> TaskRecord | None:
        """The task record with metadata.uid ``uid``."""
        return self.by_uid.get(uid)

    def job_of(self, record: TaskRecord) -> JobRecord | None:
        """The newest live (not terminating) Job of ``record``, if one exists."""
        jobs = [j for j in self.jobs_of_task.get(record.uid, {}).values() if not j.terminating]
        return max(jobs, key=lambda j: j.attempt, default=None)

    # -- jobs -----------------------------------------------------------------------------
    def on_job(self, obj: Mapping[str, Any]) -> JobRecord | None:
        """Record one of our Jobs (None for a Job without our task-uid annotation)."""
        job = job_record(obj)
        if job is not None:
            self._remember(job)
        return job

    def _remember(self, job: JobRecord) -> None:
        self.jobs[job.key] = job
        self.jobs_of_task.setdefault(job.task_uid, {})[job.key] = job

    def _hold(self, job: JobRecord) -> None:
        """Keep a terminating Job's GPUs reserved until it is gone (after a deletion or a restart).

        The hold has no queue, so it charges no quota and no preemption can pick it.
        """
        if job.key in self.held or job.placement is None or job.outcome is not None:
            return
        key = holding_key(job)
        slots = job.placement.gpus
        request = GpuRequest(len(slots), memory_mib=max((g.memory_mib for g in slots), default=0))
        self.scheduler.hold(key, Task(key, "", request, priority=HOLD_PRIORITY), job.placement)
        self.held[job.key] = key

    def on_job_deleted(self, obj: Mapping[str, Any]) -> JobRecord | None:
        """Forget a Job and release what it held; returns what was known of it."""
        meta = obj["metadata"]
        job = self.jobs.pop(f"{meta.get('namespace') or 'default'}/{meta['name']}", None) or job_record(obj)
        if job is None:
            return None
        siblings = self.jobs_of_task.get(job.task_uid, {})
        siblings.pop(job.key, None)
        if not siblings:
            self.jobs_of_task.pop(job.task_uid, None)
        held = self.held.pop(job.key, None)
        if held is not None:
            self.scheduler.finish(held)
        record = self.by_uid.get(job.task_uid)
        if record is not None:
            self.scheduler.victim_gone(record.key)
        return job

    # -- tasks ----------------------------------------------------------------------------
    def convert_task(self, obj: Mapping[str, Any]) -> Task:
        """Core Task of a GPUTask body; raises InvalidTaskError (also for a missing pod template)."""
        spec = obj.get("spec") or {}
        template = spec.get("template") if isinstance(spec, Mapping) else None
        pod_spec = (template or {}).get("spec") if isinstance(template, Mapping) else None
        containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
        if not isinstance(containers, list) or not containers:
            raise InvalidTaskError("InvalidSpec", "spec.template.spec.containers must list at least one container")
        inv = self.inventory
        namespace = obj["metadata"].get("namespace") or "default"
        return convert.task_from_manifest(
            obj,
            priority_of=lambda name: inv.priority_of(name, kueue=False),
            workload_priority_of=lambda name: inv.priority_of(name, kueue=True),
            namespace_labels=inv.labels_of(namespace),
        )

    def on_task(self, obj: dict[str, Any]) -> TaskRecord:
        """Take a GPUTask body (added or modified) and return its record.

        A new or changed pending task is (re)queued; an invalid one is recorded in
        ``record.invalid`` for the executor to report; a running or finished one is left alone
        (its resolved priority never changes under it).
        """
        meta = obj["metadata"]
        key = task_key(meta.get("namespace") or "default", meta["name"])
        record = self.tasks.get(key)
        if record is not None and record.uid != meta.get("uid"):
            self._forget(record)  # re-created under the same name: a new task
            record = None
        if record is None:
            record = TaskRecord(key, str(meta.get("uid")), obj)
            self.tasks[key], self.by_uid[record.uid] = record, record
            self._adopt_status(record, obj)
        old_spec, old_labels = (record.obj.get("spec"), (record.obj["metadata"].get("labels") or {}))
        record.obj = obj
        if record.phase in (ADMITTED, RUNNING) and old_spec != obj.get("spec"):
            record.spec_ignored = True  # a running Job cannot change; the executor says so once
        if record.deleting or (record.phase != PENDING and record.invalid is None):
            return record
        same = old_spec == obj.get("spec") and old_labels == (meta.get("labels") or {})
        if same and (record.task is not None or record.invalid is not None):
            return record
        self.requeue(record)
        return record

    def requeue(self, record: TaskRecord) -> None:
        """(Re)convert a pending task and queue it, or record why it is invalid."""
        try:
            record.task = self.convert_task(record.obj)
            record.invalid, record.phase = None, PENDING
            if self.config.queueing == "kueue":
                return  # Kueue admits; gputask places when Kueue asks (gputask.k8s.kueue_admission)
            self.scheduler.set_reschedules(record.key, record.reschedules)
            self.scheduler.submit(record.task)
        except InvalidTaskError as exc:
            record.task, record.invalid = None, (exc.reason, exc.message)
            self.scheduler.finish(record.key)

    def _adopt_status(self, record: TaskRecord, obj: Mapping[str, Any]) -> None:
        """After a restart: take attempt and conditions from status and the placement from our Job."""
        status = obj.get("status") or {}
        record.attempt = _int(status.get("attempt"))
        record.reschedules = _int(status.get("reschedules"))
        for cond in status.get("conditions") or []:
            if isinstance(cond, Mapping) and "type" in cond:
                record.conditions[cond["type"]] = dict(cond)
        if status.get("phase") in FINISHED_PHASES:
            record.phase = status["phase"]
            return
        job = self.job_of(record)
        if job is None or job.placement is None:
            return
        if job.outcome is not None:
            record.phase = job.outcome
            return
        try:
            record.task = self.convert_task(obj)
        except InvalidTaskError:
            return
        record.phase = RUNNING if status.get("phase") == RUNNING else ADMITTED
        record.attempt, record.job_name, record.placement = job.attempt, job.name, job.placement
        self.scheduler.set_reschedules(record.key, record.reschedules)
        self.scheduler.restore(record.task, job.placement, time.time())

    def on_task_deleted(self, obj: Mapping[str, Any]) -> TaskRecord | None:
        """A GPUTask is gone: forget it; its GPUs are released once its Job is gone too."""
        meta = obj["metadata"]
        key = task_key(meta.get("namespace") or "default", meta["name"])
        record = self.tasks.get(key)
        if record is None or record.uid != meta.get("uid"):
            return None
        record.deleting = True
        job = self.job_of(record)
        if job is not None and job.outcome is None and record.phase in (ADMITTED, RUNNING):
            self.scheduler.finish(key)
            self._hold(job)  # the Job's pods still run until it is gone
        self._forget(record)
        return record

    def _forget(self, record: TaskRecord) -> None:
        self.scheduler.finish(record.key)
        if self.tasks.get(record.key) is record:
            del self.tasks[record.key]
        self.by_uid.pop(record.uid, None)

    def current_job_gone(self, job: JobRecord) -> TaskRecord | None:
        """A live task whose current Job disappeared under it (someone deleted it), else None."""
        record = self.by_uid.get(job.task_uid)
        if record is None or record.job_name != job.name or record.phase not in (ADMITTED, RUNNING):
            return None
        return record

    def finish_task(self, record: TaskRecord, outcome: str) -> None:
        """A task's Job finished: release its GPUs and quota."""
        self.scheduler.finish(record.key)
        record.phase = outcome

    # -- restart ----------------------------------------------------------------------------
    def rebuild_from(self, objects: Mapping[str, Iterable[dict[str, Any]]], now: float | None = None) -> None:
        """Rebuild everything from listed objects, in dependency order.

        ``objects`` maps kinds (priorityclasses, workloadpriorityclasses, namespaces, nodes,
        gpunodes, queues, jobs, tasks) to lists of object dicts.
        """
        now = time.time() if now is None else now
        inv = self.inventory
        for obj in objects.get("priorityclasses", ()):
            inv.on_priority_class(obj)
        for obj in objects.get("workloadpriorityclasses", ()):
            inv.on_workload_priority_class(obj)
        for obj in objects.get("namespaces", ()):
            inv.on_namespace(obj)
        for obj in objects.get("gpunodes", ()):
            inv.on_gpunode(obj, now)
        for obj in objects.get("nodes", ()):
            inv.on_node(obj, now)
        for obj in objects.get("queues", ()):
            inv.on_queue(obj)
        jobs = [j for j in map(job_record, objects.get("jobs", ())) if j is not None]
        for job in jobs:
            self._remember(job)
        tasks = sorted(objects.get("tasks", ()), key=lambda o: o["metadata"].get("creationTimestamp") or "")
        for obj in tasks:
            if not obj["metadata"].get("deletionTimestamp"):
                self.on_task(obj)
        for job in jobs:
            record = self.by_uid.get(job.task_uid)
            if job.terminating or record is None or record.job_name != job.name:
                self._hold(job)  # an old attempt, or a deleted task's Job, still on its GPUs


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


__all__ = [
    "ADMITTED",
    "FAILED",
    "FINISHED_PHASES",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "WORKLOAD_PRIORITY_LABEL",
    "Controller",
    "JobRecord",
    "TaskRecord",
]
