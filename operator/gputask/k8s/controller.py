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

import heapq
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gputask.config import Config
from gputask.core import InvalidTaskError, NodeName, Placement, Scheduler, Task, TaskKey, make_policy, task_key
from gputask.core.budget import MemoryBudget, Overuse, overuse_text
from gputask.core.reasons import Reason
from gputask.k8s.foreign import ForeignPods
from gputask.k8s.inventory import Inventory
from gputask.k8s.jobs import (
    ATTEMPT_ANNOTATION,
    FLAVOR_ANNOTATION,
    PLACEMENT_ANNOTATION,
    TASK_LABEL,
    TASK_UID_ANNOTATION,
    parse_placement,
)
from gputask.k8s.lingering import GoneJob, PodsOfJobs
from gputask.k8s.localqueues import LocalQueues
from gputask.k8s.names import fit_name
from gputask.k8s.tasks import (
    ADMITTED,
    FAILED,
    FINISHED_PHASES,
    PENDING,
    PLACED_PHASES,
    POSITION_SUFFIX,
    RUNNING,
    SUCCEEDED,
    Backoff,
    TaskRecord,
    status_behind,
)
from gputask.k8s.usage import pod_memory, sound_pod_memory
from gputask.manifests import convert

log = logging.getLogger("gputask.controller")

PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
WAITING_REASONS = (PRIORITY_CLASS_NOT_FOUND, Reason.QUEUE_NOT_FOUND, Reason.QUEUE_INACTIVE)  # kept Pending, not Failed
JOB_DELETED = "JobDeleted"
PODS_NOT_STARTING = "PodsNotStarting"
PLACEMENT_CONFLICT = "PlacementConflict"
STARTED_POD_PHASES = ("Running", "Succeeded", "Failed")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
DISRUPTION_TARGET = "DisruptionTarget"
# The DisruptionTarget reasons of pods the system, not the workload, ended (k8s.io/api/core/v1: PodReason*;
# pod garbage collection's DeletionByPodGC too): their Job's failure requeues the task.
SYSTEM_DISRUPTIONS = (
    "DeletionByTaintManager",  # a NoExecute taint the pod does not tolerate (the taint manager)
    "TerminationByKubelet",  # node-pressure eviction, or a graceful node shutdown
    "PreemptionByScheduler",  # kube-scheduler preempted it for a higher-priority pod
    "EvictionByEvictionAPI",  # the Eviction API (kubectl drain, the cluster autoscaler)
    "DeletionByPodGC",  # its node is gone (pod garbage collection)
)


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
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as time)
    flavor: str = ""  # the ResourceFlavor it was admitted in (annotation gputask.io/flavor)
    uid: str = ""  # the Job's own metadata.uid ("" when not known)
    why: str = ""  # a failed Job's Failed condition, "reason: message"

    @property
    def key(self) -> str:
        """``namespace/name`` of the Job."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Report:
    """Something the loop must publish about a task: ``kind`` is invalid, blocked, spec-ignored,
    deprecated-queue (``detail`` = the GPUClusterQueue it names directly),
    finished (``detail`` = outcome), running, restored (``detail`` = message), delete-job,
    stray-job (``detail`` = the Job to delete: a second live Job of the task), over-budget or
    within-budget (``detail`` = message: its pods' GPU memory against its reservation), gpus-held or
    gpus-released (``detail`` = :func:`~gputask.k8s.lingering.held_note`: an old Job of the task is gone, its
    pods are not, and its GPUs stay held until they are)."""

    kind: str
    record: TaskRecord
    detail: str = ""


def job_outcome(job: Mapping[str, Any]) -> str | None:
    """Succeeded/Failed from a Job's conditions (Complete/Failed True), else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return SUCCEEDED
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return FAILED
    return None


def job_failure(job: Mapping[str, Any]) -> str:
    """The Job's Failed condition when True as "reason: message" (BackoffLimitExceeded, ...), else ""."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return ": ".join(str(p) for p in (cond.get("reason"), cond.get("message")) if p)
    return ""


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
        str(meta.get("creationTimestamp") or ""),
        str(annotations.get(FLAVOR_ANNOTATION) or ""),
        str(meta.get("uid") or ""),
        job_failure(obj),
    )


def holding_key(job: JobRecord) -> TaskKey:
    """Scheduler key under which a departing Job keeps its GPUs until it is gone."""
    return TaskKey(f"{job.key}#terminating")


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
        )
        self.task_pods: dict[str, str] = {}  # pod uid -> Job key, for the pods of our Jobs (not finished)
        self.pods_of_jobs = PodsOfJobs()  # the bound ones by Job, and Jobs gone before them (their GPUs held)
        self.over_budget: dict[TaskKey, tuple[Overuse, ...]] = {}  # running tasks over their GPU memory budget
        self.inventory = Inventory(self.scheduler, self.config, self.foreign, our_pods=self.task_pods)
        self.local_queues = LocalQueues()
        self.tasks: dict[TaskKey, TaskRecord] = {}
        self.by_uid: dict[str, TaskRecord] = {}
        self.in_namespace: dict[str, set[TaskKey]] = {}  # task keys by namespace (a namespace's event touches these)
        self.jobs: dict[str, JobRecord] = {}  # by "namespace/name"
        self.jobs_of_task: dict[str, dict[str, JobRecord]] = {}  # task uid -> Job key -> Job
        self.held: dict[str, TaskKey] = {}  # departing Job key -> holding key in the scheduler
        self.blocked_on: dict[str, set[TaskKey]] = {}  # (Workload)PriorityClass name -> tasks waiting for it
        self.outbox: list[Report] = []
        self.start_deadlines: list[tuple[float, TaskKey, int]] = []  # heap: (deadline s, task, attempt)
        self._restoring: list[tuple[str, TaskRecord]] | None = None  # during a rebuild: (Job created, record)
        self.pod_problems: dict[str, str] = {}  # Job key -> why its pod does not start (Unschedulable)
        self.disrupted: dict[str, tuple[str, str]] = {}  # Job key -> (DisruptionTarget reason, message) of its pod
        # Job key -> "pod P of Job J is Running": a pod that started while its Job's create was still unconfirmed
        # (its answer lost, or not back yet); said once the task is admitted with that Job (:meth:`admitted_with`).
        self.early_starts: dict[str, str] = {}

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
        current = record is not None and record.job_name == job.name and record.phase in PLACED_PHASES
        creating = record is not None and record.creating == job.name  # the booking of its admission covers it
        if not current and not creating and (job.terminating or self.config.queueing != "kueue"):
            self.hold(job)  # Kueue mode: Kueue books the GPUs of a suspended Job; gputask holds only departing ones
            if record is not None and self._unseen_end(record, job):
                self.scheduler.finish(record.key)  # its run ended while nobody knew: done, never run again
                record.job_name, record.attempt, record.placement = job.name, job.attempt, None
                self.outbox.append(Report("finished", record, job.outcome or ""))
        if current and job.outcome is not None:
            assert record is not None
            disruption = self.disrupted.get(job.key) if job.outcome == FAILED else None
            if disruption is not None:
                self.scheduler.evict(record.key, *disruption, failure=True)
                return job
            self.scheduler.finish(record.key)
            self.outbox.append(Report("finished", record, job.outcome))
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
    def on_task_pod(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """A pod of one of our Jobs changed: Running once it runs; remember why it cannot be scheduled."""
        job = self._job_of_pod(pod)
        self._note_task_pod(pod, job, deleted)
        if job is None:
            return
        record = self.by_uid.get(job.task_uid)
        status = pod.get("status") or {}
        if record is not None and record.creating == job.name and record.job_name != job.name:
            if not deleted and status.get("phase") in STARTED_POD_PHASES:
                name = (pod.get("metadata") or {}).get("name")
                self.early_starts[job.key] = f"pod {name} of Job {job.name} is {status['phase']}"
            return
        if record is None or record.job_name != job.name:
            return
        self._note_disruption(pod, job)
        if not deleted and status.get("phase") in STARTED_POD_PHASES:
            self.pod_problems.pop(job.key, None)
            if record.phase == ADMITTED:
                name = (pod.get("metadata") or {}).get("name")
                self.outbox.append(Report("running", record, f"pod {name} of Job {job.name} is {status['phase']}"))
            return
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
                name = (pod.get("metadata") or {}).get("name")
                self.pod_problems[job.key] = f"pod {name} is {cond['reason']}: {cond.get('message') or ''}".rstrip(": ")

    def admitted_with(self, record: TaskRecord) -> None:
        """The task was just admitted with its Job (created, or found after a lost answer): a pod of that Job seen
        started before (while the create was unconfirmed) makes it Running now, as no later pod event may come."""
        message = self.early_starts.pop(f"{record.namespace}/{record.job_name}", None)
        if message is not None and record.phase == ADMITTED:
            self.outbox.append(Report("running", record, message))

    def _note_disruption(self, pod: Mapping[str, Any], job: JobRecord) -> None:
        """Remember a pod the system disrupted (``DisruptionTarget`` True with a reason of
        :data:`SYSTEM_DISRUPTIONS`): its Job's failure then requeues the task."""
        for cond in (pod.get("status") or {}).get("conditions") or []:
            reason = cond.get("reason")
            if cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True" and reason in SYSTEM_DISRUPTIONS:
                name = (pod.get("metadata") or {}).get("name")
                said = f": {cond['message']}" if cond.get("message") else ""
                self.disrupted[job.key] = (str(reason), f"pod {name} of Job {job.name} was disrupted by the system "
                                                        f"({reason}{said}); requeued")

    def keep_task_pods(self, uids: Collection[str]) -> None:
        """Forget the pods of our Jobs not among ``uids`` (a new listing of them: the rest were deleted meanwhile);
        when any was forgotten every GPUNode is recounted, as a forgotten pod's node is not known."""
        gone = [uid for uid in self.task_pods if uid not in uids]
        for uid in gone:
            self._pod_gone(self.task_pods.pop(uid), uid)
        if gone:
            now = time.time()
            for node in list(self.inventory.gpunodes):
                self.inventory.refresh_node(node, now)

    def _note_task_pod(self, pod: Mapping[str, Any], job: JobRecord | None, deleted: bool) -> None:
        """Keep :attr:`task_pods` (the pods whose GPU memory is gputask's own); a node whose set changed is
        recounted (its memory moves between ours and foreign)."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid = str(meta.get("uid") or "")
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if not uid:
            return
        before = self.task_pods.get(uid)
        node = spec.get("nodeName")
        if deleted or finished or job is None:
            self.task_pods.pop(uid, None)
        else:
            self.task_pods[uid] = job.key
        if job is not None and uid in self.task_pods and isinstance(node, str) and node:
            self.pods_of_jobs.present(job.key, uid, str(meta.get("name") or uid))
        elif before is not None:
            self._pod_gone(before, uid)
        if before != self.task_pods.get(uid) and isinstance(node, str) and node in self.inventory.gpunodes:
            self.inventory.refresh_node(node, time.time())

    # -- GPU memory budgets -------------------------------------------------------------------------
    def on_gpunode(self, obj: Mapping[str, Any], now: float, deleted: bool = False) -> None:
        """A GPUNode changed: the inventory takes its GPUs; the memory its agent reports per pod is judged
        against our tasks' reservations (:meth:`judge_memory`)."""
        self.inventory.on_gpunode(obj, now, deleted)
        name = (obj.get("metadata") or {}).get("name")
        if not deleted and isinstance(name, str):
            self.judge_memory(name, obj.get("status"))

    def judge_memory(self, node: str, status: Any) -> None:
        """Sum each running task's pods' memory per GPU of ``node`` (GPUs the agent split by pod) and let the
        core judge it; a task that goes over budget, or back within, is reported (over-budget / within-budget)
        once per change of the GPUs it overuses, not per figure. A task the core evicts for it (memoryBudget
        Evict) is not reported here: its eviction (reason GPUMemoryExceeded) carries the same figures."""
        cluster = self.scheduler.cluster
        if not cluster.has_node(NodeName(node)):
            return
        raw = pod_memory(status if isinstance(status, Mapping) else None)
        split, _ = sound_pod_memory(raw, cluster.node(NodeName(node)).node)  # the inventory reports the lies
        if not split:
            return
        usage: dict[TaskKey, dict[int, int]] = {}
        for index, pods in split.items():
            for uid, mib in pods.items():
                record = self._running_task_of_pod(uid)
                if record is not None:
                    usage.setdefault(record.key, {})[index] = usage.get(record.key, {}).get(index, 0) + mib
        flagged = [k for k, found in self.over_budget.items() if found and found[0].node == node]
        for key in sorted(set(usage) | set(flagged)):
            self._judge(key, usage.get(key, {}))

    def _running_task_of_pod(self, pod_uid: str) -> TaskRecord | None:
        job = self.jobs.get(self.task_pods.get(pod_uid, ""))
        record = self.by_uid.get(job.task_uid) if job is not None else None
        if record is None or job is None or record.job_name != job.name or record.phase not in PLACED_PHASES:
            return None
        return record

    def _judge(self, key: TaskKey, used: dict[int, int]) -> None:
        record = self.tasks.get(key)
        found = self.scheduler.memory_used(key, used)
        if record is None or found is None:
            self.over_budget.pop(key, None)
            return
        before = self.over_budget.get(key, ())
        tolerance = self.scheduler.memory_budget.tolerance_mib
        if found and key not in self.scheduler.running:
            self.over_budget.pop(key, None)  # evicted (memoryBudget Evict): the eviction says why, with the figures
            return
        if found:
            self.over_budget[key] = found
            if [o.index for o in found] != [o.index for o in before]:
                self.outbox.append(Report("over-budget", record, overuse_text(found, tolerance)))
        elif before:
            del self.over_budget[key]
            self.outbox.append(Report("within-budget", record, "its pods use at most the GPU memory it reserved "
                                                               f"(+{tolerance} MiB tolerance) again"))

    def _job_of_pod(self, pod: Mapping[str, Any]) -> JobRecord | None:
        """The Job of one of our pods: a live one, else one gone before its pods (:mod:`gputask.k8s.lingering`)."""
        meta = pod.get("metadata") or {}
        keys = [f"{meta.get('namespace') or 'default'}/{name}" for name in _job_names(meta)]
        gone = self.pods_of_jobs.gone
        return next((self.jobs[k] for k in keys if k in self.jobs), None) or next(
            (gone[k].job for k in keys if k in gone), None)

    def _pod_gone(self, job_key: str, uid: str) -> None:
        """Pod ``uid`` of Job ``job_key`` is gone (deleted, finished, unbound): when it was the last pod of a Job gone
        before it, that Job's GPUs are released and its task told."""
        ended = self.pods_of_jobs.absent(job_key, uid)
        if ended is None or ended.hold is None:
            return
        self.scheduler.finish(ended.hold)
        record = self._task_of_gone(ended)
        if record is not None and ended.job.placement is not None:
            nodes = ", ".join(ended.job.placement.nodes)
            message = f"GPUs on node {nodes} released: the pods of Job {ended.job.name} are gone"
            self.outbox.append(Report("gpus-released", record, message))

    def _task_of_gone(self, gone: GoneJob) -> TaskRecord | None:
        """The task of a gone Job: by its uid, or (found at a restart) by its pods' task label."""
        record = self.by_uid.get(gone.job.task_uid)
        if record is not None or not gone.task_label:
            return record
        for key in sorted(self.in_namespace.get(gone.job.namespace, set())):
            if fit_name(self.tasks[key].name) == gone.task_label:
                return self.tasks[key]
        return None

    def _pods_outlive(self, job: JobRecord, held: TaskKey | None) -> bool:
        """Job ``job`` is gone; True when pods of it are still bound to a node: its GPUs (``held``) stay held until
        they are gone, and its task is told what waits for what."""
        earlier = self.pods_of_jobs.gone.get(job.key)
        if not self.pods_of_jobs.job_gone(job, held):
            return False
        if earlier is not None and earlier.hold not in (None, held) and held is not None:
            self.scheduler.finish(earlier.hold)  # held twice over: the newer hold stands
        gone = self.pods_of_jobs.gone[job.key]
        note, record = self.pods_of_jobs.note_of(gone), self._task_of_gone(gone)
        if note is not None and record is not None and gone.hold in self.scheduler.ledger.held:
            self.outbox.append(Report("gpus-held", record, note))
        return True

    def held_for(self, key: TaskKey) -> list[str]:
        """What is held for Jobs of task ``key`` that are gone before their pods: one
        :func:`~gputask.k8s.lingering.held_note` each, while the core still holds the GPUs (a deleted Node's are
        released with it)."""
        held = self.scheduler.ledger.held
        notes = []
        for gone in self.pods_of_jobs.gone.values():
            record = self._task_of_gone(gone)
            note = self.pods_of_jobs.note_of(gone)
            if record is not None and record.key == key and note is not None and gone.hold in held:
                notes.append(note)
        return sorted(notes)

    def started(self, record: TaskRecord, admitted_at: float) -> None:
        """An admitted task must have a running pod by ``admitted_at`` + podStartTimeout (seconds)."""
        deadline = admitted_at + self.config.pod_start_timeout_s
        heapq.heappush(self.start_deadlines, (deadline, record.key, record.attempt))

    def overdue(self, now: float) -> list[TaskRecord]:
        """Admitted tasks still without a running pod past their deadline (each reported once)."""
        out = []
        while self.start_deadlines and self.start_deadlines[0][0] <= now:
            _, key, attempt = heapq.heappop(self.start_deadlines)
            record = self.tasks.get(key)
            job = self.jobs.get(f"{record.namespace}/{record.job_name}") if record is not None else None
            if job is not None and job.outcome is not None:
                continue  # it ran to its end: no pod is to be expected, the Job is never deleted for it
            if record is not None and record.phase == ADMITTED and record.attempt == attempt:
                out.append(record)
        return out

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
        return (record is not None and record.job_name == job.name and record.phase in PLACED_PHASES
                and job.outcome is None)

    def departing(self, job: JobRecord | None, held: TaskKey | None) -> None:
        """An evicted task's Job goes away: the core's hold of its GPUs (``held``) lasts until the Job is
        gone; with no Job to wait for, it ends now."""
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
        if not self._pods_outlive(job, held) and held is not None:
            self.scheduler.finish(held)
        self.disrupted.pop(job.key, None)
        self.early_starts.pop(job.key, None)
        record = self.by_uid.get(job.task_uid)
        if record is None:
            return
        self.scheduler.victim_gone(record.key)
        if record.job_name == job.name and record.phase in PLACED_PHASES and job.outcome is None:
            message = f"Job {job.name} was deleted while the task ran; requeued"
            self.scheduler.evict(record.key, JOB_DELETED, message)

    # -- tasks --------------------------------------------------------------------------------------
    def convert_task(self, obj: Mapping[str, Any]) -> Task:
        """Core Task of a GPUTask body; raises InvalidTaskError (a pod template the Job API refuses, or none;
        also, logged, for anything else the converter raises on odd input)."""
        spec = obj.get("spec")
        if isinstance(spec, Mapping) and spec.get("template") is None:
            raise InvalidTaskError("InvalidSpec", "spec.template: Required value: the task runs as a Job of it")
        inv = self.inventory
        namespace = obj["metadata"].get("namespace") or "default"
        try:
            return convert.task_from_manifest(
                obj,
                priority_of=lambda name: inv.priority_of(name, kueue=False),
                workload_priority_of=lambda name: inv.priority_of(name, kueue=True),
                namespace_labels=inv.labels_of(namespace),
                share_per_namespace=self.config.pinning == "dra",
            )
        except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError, IndexError) as exc:
            # A converter bug on odd input must fail this task, not the handler or every rebuild.
            log.exception("GPUTask %s/%s: conversion failed", namespace, obj["metadata"].get("name"))
            raise InvalidTaskError("InvalidSpec", f"the spec cannot be read ({type(exc).__name__}: {exc})") from None

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
            record = TaskRecord(key, str(meta.get("uid")), obj)
            self.tasks[key], self.by_uid[record.uid] = record, record
            self.in_namespace.setdefault(record.namespace, set()).add(key)
            self._adopt_status(record, obj)
        old_spec, old_labels = record.obj.get("spec"), (record.obj["metadata"].get("labels") or {})
        record.obj, record.whole_at = obj, meta.get("resourceVersion")
        changed = old_spec != obj.get("spec") or old_labels != (meta.get("labels") or {})
        if record.phase in PLACED_PHASES:
            if changed:
                self._revise(record, spec_changed=old_spec != obj.get("spec"))
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
            self._revise(record, spec_changed=False)
            return
        self._unblock(record)
        try:
            record.task = self._queued(record, self.convert_task(record.obj))
        except InvalidTaskError as exc:
            record.task = None
            self.scheduler.finish(record.key)
            if exc.reason in WAITING_REASONS:
                self._block(record, exc)
            else:
                record.invalid, record.blocked = (exc.reason, exc.message), None
                self.outbox.append(Report("invalid", record))
            return
        record.generation = int(record.obj["metadata"].get("generation") or 0)
        record.invalid = record.blocked = None
        if record.backoff.failures and record.backoff.generation != record.generation:
            record.backoff = Backoff()  # a new spec: its Job is tried at once
            self.scheduler.undefer(record.key)
        if record.phase == FAILED:  # an invalid spec mended: it is a pending task again
            record.phase = PENDING
        if self.config.queueing == "kueue":
            return  # Kueue admits; gputask places when Kueue asks (gputask.k8s.kueue_admission)
        self.scheduler.set_reschedules(record.key, record.reschedules)
        self.scheduler.submit(record.task)

    def _queued(self, record: TaskRecord, task: Task) -> Task:
        """``task`` with its queue name resolved to the GPUClusterQueue that admits it (gputask mode; in Kueue
        mode the name is Kueue's LocalQueue and stays). Raises InvalidTaskError QueueNotFound or QueueInactive
        when it must wait outside the queues; a task naming a GPUClusterQueue directly gets a deprecation
        Event, once."""
        if self.config.queueing == "kueue":
            return task
        lqs = self.local_queues
        lqs.ask(record.key, task.queue)
        found = lqs.resolve(record.namespace, task.queue, self.inventory.queue_meta)
        if found.cluster_queue is None:
            raise InvalidTaskError(found.reason, found.message)
        published = (record.obj.get("status") or {}).get("queue")  # an earlier leader queued it there, and warned
        if found.local_queue is None and record.key not in lqs.warned and published != found.cluster_queue:
            lqs.warned.add(record.key)
            self.outbox.append(Report("deprecated-queue", record, task.queue))
        return replace(task, queue=found.cluster_queue, local_queue=found.local_queue)

    def _placed_in(self, record: TaskRecord, task: Task, queue: Any) -> Task:
        """``task`` of a placed task, in the GPUClusterQueue it was admitted in (``status.queue``), which
        outlives a GPULocalQueue pointed elsewhere since; resolved anew when the status names none."""
        if self.config.queueing == "kueue" or not isinstance(queue, str) or not queue:
            return self._queued(record, task)
        self.local_queues.ask(record.key, task.queue)
        local = self.local_queues.queues.get((record.namespace, task.queue))
        via = task.queue if local is not None and local.cluster_queue == queue else None
        return replace(task, queue=queue, local_queue=via)

    def _revise(self, record: TaskRecord, *, spec_changed: bool) -> None:
        """A placed task's spec changed: it runs on as admitted; its next admission takes the new spec
        (in the queue it then names; in its current one while that name leads nowhere)."""
        try:
            task = self.convert_task(record.obj)
            try:
                task = self._queued(record, task)
            except InvalidTaskError:
                current = record.task
                if current is not None:
                    task = replace(task, queue=current.queue, local_queue=current.local_queue)
        except InvalidTaskError as exc:
            record.revision, record.revision_error = None, (exc.reason, exc.message)
            self.scheduler.revise(record.key, None)
        else:
            record.revision = (task, int(record.obj["metadata"].get("generation") or 0))
            record.revision_error = None
            self.scheduler.revise(record.key, task)
        if spec_changed:
            self.outbox.append(Report("spec-ignored", record))

    def _block(self, record: TaskRecord, exc: InvalidTaskError) -> None:
        """Wait outside the queues until the named priority class exists, or the queue name leads to a
        GPUClusterQueue (GitOps order: tasks applied before their queues)."""
        record.blocked, record.invalid = (exc.reason, exc.message), None
        if exc.reason == PRIORITY_CLASS_NOT_FOUND:
            self.blocked_on.setdefault(convert.priority_class_name(record.obj) or "", set()).add(record.key)
        self.outbox.append(Report("blocked", record))

    def _unblock(self, record: TaskRecord) -> None:
        if record.blocked is not None:
            waiting = self.blocked_on.get(convert.priority_class_name(record.obj) or "")
            if waiting is not None:
                waiting.discard(record.key)

    def on_priority_class(self, obj: Mapping[str, Any], *, kueue: bool, deleted: bool = False) -> None:
        """A (Workload)PriorityClass changed: tasks waiting for that name are converted again."""
        if kueue:
            self.inventory.on_workload_priority_class(obj, deleted)
        else:
            self.inventory.on_priority_class(obj, deleted)
        name = str((obj.get("metadata") or {}).get("name"))
        for key in sorted(self.blocked_on.pop(name, set())) if not deleted else ():
            record = self.tasks.get(key)
            if record is not None and record.blocked is not None:
                record.blocked = None
                self.requeue(record)

    # -- queues -------------------------------------------------------------------------------------
    def on_local_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """A GPULocalQueue changed: the waiting tasks of its namespace that name it are resolved again
        (placed ones keep the GPUClusterQueue they were admitted in)."""
        where = self.local_queues.on_local_queue(obj, deleted)
        if where is not None:
            self._reresolve(self.local_queues.asking(where[1], where[0]))

    def on_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """A GPUClusterQueue changed. When one appears or goes, tasks that name it directly (or wait for a
        name that leads nowhere) are resolved again."""
        name = (obj.get("metadata") or {}).get("name")
        known = name in self.inventory.queue_meta
        self.inventory.on_queue(obj, deleted)
        if isinstance(name, str) and known != (name in self.inventory.queue_meta):
            self._reresolve(
                key for key in self.local_queues.asking(name)
                if (r := self.tasks.get(key)) is not None and (r.task is None or r.task.local_queue is None)
            )  # fmt: skip

    def _reresolve(self, keys: Iterable[TaskKey]) -> None:
        for key in list(keys):
            record = self.tasks.get(key)
            if record is None or record.deleting or record.phase != PENDING or record.invalid is not None:
                continue
            if record.blocked is not None and record.blocked[0] == PRIORITY_CLASS_NOT_FOUND:
                continue  # waits for its priority class first
            self.requeue(record)

    def _adopt_status(self, record: TaskRecord, obj: Mapping[str, Any]) -> None:
        """After a restart: take attempt and conditions from status and the placement from our Job."""
        status = obj.get("status") or {}
        record.attempt = _int(status.get("attempt"))
        record.reschedules = _int(status.get("reschedules"))
        record.admitted_at = status.get("admittedAt") if isinstance(status.get("admittedAt"), str) else None
        for cond in status.get("conditions") or []:
            if isinstance(cond, Mapping) and "type" in cond:
                record.conditions[cond["type"]] = dict(cond)
        if status.get("phase") in FINISHED_PHASES:
            record.phase = status["phase"]
            return
        waited = record.conditions.get("Admitted")
        if status.get("phase") == PENDING and waited and waited.get("status") == "False":
            # the wait it was last told, so the first cycle after a restart posts no Event and writes no status
            # for a task that still waits for the same reason (tens of thousands of them, at scale)
            message = POSITION_SUFFIX.sub("", str(waited.get("message") or ""))
            record.last_wait = (str(waited.get("reason") or ""), message)
        job = self._booked_job(record, status.get("jobName"))
        if job is None or job.placement is None:
            return
        if job.outcome is not None:  # it ended while no operator watched: say so now
            record.phase, record.job_name, record.attempt = ADMITTED, job.name, job.attempt
            self.outbox.append(Report("finished", record, job.outcome))
            return
        try:
            record.task = self._placed_in(record, self.convert_task(obj), status.get("queue"))
        except InvalidTaskError:
            return
        record.generation = int(status.get("observedGeneration") or obj["metadata"].get("generation") or 0)
        record.phase = RUNNING if status.get("phase") == RUNNING else ADMITTED
        record.attempt, record.job_name, record.placement = job.attempt, job.name, job.placement
        record.flavor = job.flavor or str(status.get("flavor") or "")  # where it was charged: restored there
        self.scheduler.set_reschedules(record.key, record.reschedules)
        if self._restoring is not None:
            self._restoring.append((job.created, record))  # restored in Job creation order (rebuild)
        else:
            self._restore(record)
        if record.phase == ADMITTED:  # the pod-start deadline runs on from the admission, not the restart
            self.started(record, convert.timestamp(record.admitted_at) or time.time())

    def _booked_job(self, record: TaskRecord, named: Any) -> JobRecord | None:
        """The Job the books (status.jobName) name if it is live, else the newest live one; any other live
        Job of the task is a stray (a lost create answer, a stale leader) and is reported for deletion."""
        live = [j for j in self.jobs_of_task.get(record.uid, {}).values() if not j.terminating and j.outcome is None]
        booked = next((j for j in live if j.name == named), None) or self.job_of(record)
        for job in live:
            if booked is not None and job.key != booked.key:
                self.outbox.append(Report("stray-job", record, job.key))
        return booked

    def _restore(self, record: TaskRecord) -> None:
        """Put a placed task back in the books; one that over-commits a GPU with what came before it
        (two Jobs on one GPU's memory) is evicted: the earlier Job keeps the GPU."""
        assert record.task is not None and record.placement is not None
        restored = self.scheduler.restore(record.task, record.placement, time.time(), flavor=record.flavor or None)
        entry = self.scheduler.ledger.get(record.key)
        record.flavor = entry.task.flavor if entry is not None else ""
        if not restored:
            node = ", ".join(record.placement.nodes)
            message = f"Job {record.job_name} shares a GPU of {node} with an earlier Job beyond its memory"
            self.scheduler.evict(record.key, PLACEMENT_CONFLICT, message)

    def on_task_deleted(self, obj: Mapping[str, Any]) -> TaskRecord | None:
        """A GPUTask is gone (or being deleted): forget it; its Job keeps its GPUs until it is gone too."""
        meta = obj["metadata"]
        key = task_key(meta.get("namespace") or "default", meta["name"])
        record = self.tasks.get(key)
        if record is None or record.uid != meta.get("uid"):
            return None
        record.deleting = True
        job = self.job_of(record)
        if job is not None and job.outcome is None and (record.phase in PLACED_PHASES or record.creating == job.name):
            self.scheduler.finish(key)
            self.hold(job)  # the Job's pods still run until it is gone
        self._forget(record)
        return record

    def _forget(self, record: TaskRecord) -> None:
        self._unblock(record)
        self.local_queues.forget(record.key)
        self.scheduler.finish(record.key)
        if self.tasks.get(record.key) is record:
            del self.tasks[record.key]
            keys = self.in_namespace.get(record.namespace, set())
            keys.discard(record.key)
            if not keys:
                self.in_namespace.pop(record.namespace, None)
        self.by_uid.pop(record.uid, None)

    # -- restart ------------------------------------------------------------------------------------
    def _gone_job_of_pod(self, pod: Mapping[str, Any]) -> JobRecord | None:
        """At a restart: the Job of an unfinished pod of ours bound to a node when the Job is gone (neither listed nor
        found by name), as its pod tells it (the placement its annotation names); None for any other pod."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        names = _job_names(meta)
        placement = parse_placement(annotations.get(PLACEMENT_ANNOTATION))
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if not names or placement is None or finished or not spec.get("nodeName"):
            return None
        job = JobRecord(names[0], str(meta.get("namespace") or "default"), "", 0, placement)
        self.pods_of_jobs.gone.setdefault(job.key, GoneJob(job, task_label=str(labels.get(TASK_LABEL) or "")))
        return self.pods_of_jobs.gone[job.key].job

    def _hold_gone_jobs(self) -> None:
        """At a restart, after the tasks: hold the GPUs of the Jobs gone before their pods (even over-committed, as
        they run), and tell each task whose condition does not say so yet."""
        for gone in self.pods_of_jobs.gone.values():
            placement = gone.job.placement
            key = holding_key(gone.job)
            if gone.hold is None and placement is not None and self.scheduler.hold(key, placement) is not None:
                gone.hold = key
            note, record = self.pods_of_jobs.note_of(gone), self._task_of_gone(gone)
            evicted = record.conditions.get("Evicted") if record is not None else None
            if note is not None and record is not None and not str((evicted or {}).get("message", "")).endswith(note):
                self.outbox.append(Report("gpus-held", record, note))

    def rebuild(self, objects: Mapping[str, Iterable[dict[str, Any]]], now: float | None = None) -> None:
        """Start over from listed objects, in dependency order.

        ``objects`` maps kinds (priorityclasses, workloadpriorityclasses, namespaces, nodes,
        gpunodes, flavors, queues, localqueues, jobs, tasks) to lists of object dicts.
        """
        self.reset()
        self._restoring = []
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
        for obj in objects.get("flavors", ()):
            inv.on_flavor(obj)
        for obj in objects.get("queues", ()):
            inv.on_queue(obj)
        for obj in objects.get("localqueues", ()):
            self.local_queues.on_local_queue(obj)
        jobs = [j for j in map(job_record, objects.get("jobs", ())) if j is not None]
        for job in jobs:
            self._remember(job)
        for pod in objects.get("pods", ()):
            if TASK_LABEL in ((pod.get("metadata") or {}).get("labels") or {}):
                self._note_task_pod(pod, self._job_of_pod(pod) or self._gone_job_of_pod(pod), deleted=False)
        tasks = sorted(objects.get("tasks", ()), key=lambda o: o["metadata"].get("creationTimestamp") or "")
        for obj in tasks:
            if not obj["metadata"].get("deletionTimestamp"):
                self.on_task(obj)
        restoring, self._restoring = sorted(self._restoring, key=lambda item: (item[0], item[1].key)), None
        for _, record in restoring:
            self._restore(record)
        for pod in objects.get("pods", ()):  # a pod that started while no replica led (a failover, an API server
            if TASK_LABEL in ((pod.get("metadata") or {}).get("labels") or {}) and self._job_of_pod(pod):  # restart)
                self.on_task_pod(pod)  # its task, still Admitted in its status, is Running now
        for job in jobs:
            record = self.by_uid.get(job.task_uid)
            if job.terminating or record is None or record.job_name != job.name:
                self.hold(job)  # an old attempt, or a deleted task's Job, still on its GPUs
        self._hold_gone_jobs()
        for name in list(inv.gpunodes):  # GPUNodes came before the tasks: memory our restored tasks use was
            inv.refresh_node(name, now)  # counted as foreign; recount it against their reservations now
        for record in self.tasks.values():
            if record.phase in PLACED_PHASES and status_behind(record):
                # a restart between creating the Job and writing the status: finish the write
                self.outbox.append(Report("restored", record, f"Admitted (Job {record.job_name} found at restart)"))


def _job_names(meta: Mapping[str, Any]) -> list[str]:
    """The names of a pod's Job: its ownerReferences of kind Job, then the Job controller's job-name labels."""
    owners = [str(r.get("name")) for r in meta.get("ownerReferences") or [] if r.get("kind") == "Job"]
    labels = meta.get("labels") or {}
    return owners + [str(labels[k]) for k in JOB_NAME_LABELS if k in labels]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


__all__ = [
    "ADMITTED",
    "FAILED",
    "FINISHED_PHASES",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "Controller",
    "JobRecord",
    "Report",
    "TaskRecord",
]
