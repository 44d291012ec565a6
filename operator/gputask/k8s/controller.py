"""The operator's in-memory view: the core Scheduler plus what it needs from the API.

Watch handlers call the ``on_*`` methods here; they only feed the scheduler and never decide
(STYLE: Kueue). Everything here can be rebuilt from GPUTasks, Jobs, Nodes, GPUNodes,
GPUClusterQueues, PriorityClasses and Namespaces (:meth:`Controller.rebuild_from`), which is
what a restarted operator does before it admits anything.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gputask.config import Config
from gputask.core import (
    InvalidQueueError,
    InvalidTaskError,
    NodeName,
    Placement,
    Scheduler,
    Task,
    TaskKey,
    make_policy,
    task_key,
)
from gputask.k8s import convert
from gputask.k8s.jobs import ATTEMPT_ANNOTATION, PLACEMENT_ANNOTATION, TASK_UID_ANNOTATION, parse_placement

log = logging.getLogger("gputask.controller")

PENDING, ADMITTED, RUNNING, SUCCEEDED, FAILED = "Pending", "Admitted", "Running", "Succeeded", "Failed"
FINISHED_PHASES = (SUCCEEDED, FAILED)


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
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class JobRecord:
    """One of our Jobs: its task uid, attempt, placement and whether it has finished."""

    name: str
    namespace: str
    task_uid: str
    attempt: int
    placement: Placement | None
    outcome: str | None = None  # Succeeded | Failed | None while running


def job_outcome(job: Mapping[str, Any]) -> str | None:
    """Succeeded/Failed from a Job's conditions (Complete/Failed True), else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return SUCCEEDED
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return FAILED
    return None


def node_ready(node: Mapping[str, Any]) -> bool:
    """True when a v1 Node's Ready condition is True (a node without conditions counts as ready)."""
    conds = (node.get("status") or {}).get("conditions") or []
    ready = [c for c in conds if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


class Controller:
    """Scheduler plus API-derived lookups. All methods are synchronous and never raise on bad input."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self.scheduler = Scheduler(policy=make_policy(self.config.policy))
        self.tasks: dict[TaskKey, TaskRecord] = {}
        self.jobs: dict[str, JobRecord] = {}  # by "namespace/name"
        self.priority_classes: dict[str, int] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.node_ready: dict[str, bool] = {}
        self.gpunodes: dict[str, Mapping[str, Any]] = {}
        self.queue_errors: dict[str, str] = {}
        self.gpunode_errors: dict[str, list[str]] = {}

    # -- lookups ------------------------------------------------------------------------
    def record_by_uid(self, uid: str) -> TaskRecord | None:
        """The task record with metadata.uid ``uid``."""
        return next((r for r in self.tasks.values() if r.uid == uid), None)

    def job_of(self, record: TaskRecord) -> JobRecord | None:
        """The newest Job of ``record`` (highest attempt), if one exists."""
        jobs = [j for j in self.jobs.values() if j.task_uid == record.uid]
        return max(jobs, key=lambda j: j.attempt, default=None)

    # -- cluster objects ------------------------------------------------------------------
    def on_priority_class(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a PriorityClass value by name."""
        name = obj["metadata"]["name"]
        if deleted:
            self.priority_classes.pop(name, None)
        elif isinstance(obj.get("value"), int):
            self.priority_classes[name] = obj["value"]

    def on_namespace(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a namespace's labels (for queues' namespaceSelector)."""
        name = obj["metadata"]["name"]
        if deleted:
            self.namespace_labels.pop(name, None)
        else:
            labels = dict(obj["metadata"].get("labels") or {})
            labels.setdefault("kubernetes.io/metadata.name", name)
            self.namespace_labels[name] = labels

    def on_node(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a v1 Node's readiness and refresh its GPUs' schedulability."""
        name = obj["metadata"]["name"]
        if deleted:
            self.node_ready[name] = False
        else:
            self.node_ready[name] = node_ready(obj) and not (obj.get("spec") or {}).get("unschedulable", False)
        self._refresh_node(name)

    def on_gpunode(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Take a GPUNode's GPU inventory into the scheduler (malformed GPU entries are dropped alone)."""
        name = obj["metadata"]["name"]
        if deleted:
            self.gpunodes.pop(name, None)
            self.scheduler.remove_node(NodeName(name))
            return
        self.gpunodes[name] = obj
        self._refresh_node(name)

    def _refresh_node(self, name: str) -> None:
        obj = self.gpunodes.get(name)
        if obj is None:
            return
        schedulable = self.node_ready.get(name, True)
        node, errors = convert.node_from_gpunode(name, obj.get("status"), schedulable=schedulable)
        self.gpunode_errors[name] = errors
        for line in errors:
            log.warning("GPUNode %s: rejected %s", name, line)
        self.scheduler.set_node(node)

    def on_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Add, update or remove a GPUClusterQueue; an invalid spec removes it with an error."""
        name = obj["metadata"]["name"]
        if deleted:
            self.scheduler.remove_queue(name)
            self.queue_errors.pop(name, None)
            return
        try:
            spec = convert.queue_from_manifest(name, obj.get("spec"))
        except (InvalidQueueError, ValueError) as exc:
            self.queue_errors[name] = str(exc)
            self.scheduler.remove_queue(name)
            return
        self.queue_errors.pop(name, None)
        self.scheduler.set_queue(spec)

    # -- jobs -----------------------------------------------------------------------------
    def on_job(self, obj: Mapping[str, Any]) -> JobRecord | None:
        """Record one of our Jobs (None if it carries no task uid)."""
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        uid = annotations.get(TASK_UID_ANNOTATION)
        if not uid:
            return None
        try:
            attempt = int(annotations.get(ATTEMPT_ANNOTATION, "1"))
        except ValueError:
            attempt = 1
        job = JobRecord(
            meta["name"],
            meta.get("namespace") or "default",
            uid,
            attempt,
            parse_placement(annotations.get(PLACEMENT_ANNOTATION)),
            job_outcome(obj),
        )
        self.jobs[f"{job.namespace}/{job.name}"] = job
        return job

    def on_job_deleted(self, obj: Mapping[str, Any]) -> JobRecord | None:
        """Forget a Job; returns what was known of it."""
        meta = obj["metadata"]
        return self.jobs.pop(f"{meta.get('namespace') or 'default'}/{meta['name']}", None)

    # -- tasks ----------------------------------------------------------------------------
    def convert_task(self, obj: Mapping[str, Any]) -> Task:
        """Core Task of a GPUTask body; raises InvalidTaskError (also for a missing pod template)."""
        spec = obj.get("spec") or {}
        template = spec.get("template") if isinstance(spec, Mapping) else None
        containers = ((template or {}).get("spec") or {}).get("containers") if isinstance(template, Mapping) else None
        if not isinstance(containers, list) or not containers:
            raise InvalidTaskError("InvalidSpec", "spec.template.spec.containers must list at least one container")
        namespace = obj["metadata"].get("namespace") or "default"
        labels = self.namespace_labels.get(namespace, {"kubernetes.io/metadata.name": namespace})
        return convert.task_from_manifest(obj, priority_of=self.priority_classes.get, namespace_labels=labels)

    def on_task(self, obj: dict[str, Any]) -> TaskRecord:
        """Take a GPUTask body (added or modified) and return its record.

        A new or changed pending task is (re)queued; an invalid one is recorded in
        ``record.invalid`` for the executor to report; a running or finished one is left alone.
        """
        meta = obj["metadata"]
        key = task_key(meta.get("namespace") or "default", meta["name"])
        record = self.tasks.get(key)
        if record is not None and record.uid != meta.get("uid"):
            self._forget(record)
            record = None
        if record is None:
            record = TaskRecord(key, str(meta.get("uid")), obj)
            self.tasks[key] = record
            self._adopt_status(record, obj)
        old_spec = record.obj.get("spec")
        record.obj = obj
        if record.deleting or (record.phase != PENDING and record.invalid is None):
            return record
        if old_spec == obj.get("spec") and (record.task is not None or record.invalid is not None):
            return record
        try:
            record.task = self.convert_task(obj)
            record.invalid, record.phase = None, PENDING
            self.scheduler.submit(record.task)
        except InvalidTaskError as exc:
            record.task, record.invalid = None, (exc.reason, exc.message)
            self.scheduler.finish(key)
        return record

    def _adopt_status(self, record: TaskRecord, obj: Mapping[str, Any]) -> None:
        """After a restart: take phase and attempt from status and the placement from our Job."""
        status = obj.get("status") or {}
        record.attempt = int(status.get("attempt") or 0)
        for cond in status.get("conditions") or []:
            if isinstance(cond, Mapping) and "type" in cond:
                record.conditions[cond["type"]] = dict(cond)
        job = self.job_of(record)
        if status.get("phase") in FINISHED_PHASES:
            record.phase = status["phase"]
            return
        if job is not None and job.outcome is None and job.placement is not None:
            try:
                record.task = self.convert_task(obj)
            except InvalidTaskError:
                return
            record.phase = RUNNING if status.get("phase") == RUNNING else ADMITTED
            record.attempt, record.job_name, record.placement = job.attempt, job.name, job.placement
            self.scheduler.restore(record.task, job.placement)
        elif job is not None and job.outcome is not None:
            record.phase = job.outcome

    def on_task_deleted(self, obj: Mapping[str, Any]) -> TaskRecord | None:
        """A GPUTask is gone: forget it; its GPUs are released once its Job is gone too."""
        meta = obj["metadata"]
        key = task_key(meta.get("namespace") or "default", meta["name"])
        record = self.tasks.get(key)
        if record is None or record.uid != meta.get("uid"):
            return None
        record.deleting = True
        if record.job_name is None or record.phase in FINISHED_PHASES:
            self._forget(record)
        return record

    def _forget(self, record: TaskRecord) -> None:
        self.scheduler.finish(record.key)
        if self.tasks.get(record.key) is record:
            del self.tasks[record.key]

    def job_gone(self, job: JobRecord) -> TaskRecord | None:
        """A Job disappeared: release a deleted task's GPUs; return a live task that lost its Job."""
        record = self.record_by_uid(job.task_uid)
        if record is None or record.job_name != job.name:
            return None
        if record.deleting:
            self._forget(record)
            return None
        return record if record.phase in (ADMITTED, RUNNING) else None

    def finish_task(self, record: TaskRecord, outcome: str) -> None:
        """A task's Job finished: release its GPUs and quota."""
        self.scheduler.finish(record.key)
        record.phase = outcome

    # -- restart ----------------------------------------------------------------------------
    def rebuild_from(self, objects: Mapping[str, Iterable[dict[str, Any]]]) -> None:
        """Rebuild everything from listed objects, in dependency order.

        ``objects`` maps kinds (priorityclasses, namespaces, nodes, gpunodes, queues, jobs,
        tasks) to lists of object dicts.
        """
        for obj in objects.get("priorityclasses", ()):
            self.on_priority_class(obj)
        for obj in objects.get("namespaces", ()):
            self.on_namespace(obj)
        for obj in objects.get("nodes", ()):
            self.on_node(obj)
        for obj in objects.get("gpunodes", ()):
            self.on_gpunode(obj)
        for obj in objects.get("queues", ()):
            self.on_queue(obj)
        for obj in objects.get("jobs", ()):
            self.on_job(obj)
        tasks = sorted(objects.get("tasks", ()), key=lambda o: o["metadata"].get("creationTimestamp") or "")
        for obj in tasks:
            if not (obj["metadata"].get("deletionTimestamp")):
                self.on_task(obj)
