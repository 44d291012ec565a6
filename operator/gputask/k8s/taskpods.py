"""The pods of our Jobs, for the controller: which task runs (Running once a pod starts), why a pod does not
start, pods the system disrupted (their Job's failure requeues the task), the pod-start deadlines
(PodsNotStarting), each running task's GPU memory against its reservation (the core judges it), and Jobs gone
before their pods (their GPUs held until the pods are gone: :mod:`gputask.k8s.lingering`). Synchronous, no I/O:
the controller's handlers call it under the core gate; what must be said goes to the controller's outbox."""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from gputask.core import NodeName, TaskKey
from gputask.core.budget import Overuse, overuse_text
from gputask.k8s.gangjobs import pin_patch, pod_index
from gputask.k8s.jobrecords import (
    DISRUPTION_TARGET,
    STARTED_POD_PHASES,
    SYSTEM_DISRUPTIONS,
    JobRecord,
    holding_key,
    job_names,
)
from gputask.k8s.jobs import PLACEMENT_ANNOTATION, TASK_LABEL, parse_placement
from gputask.k8s.lingering import GoneJob, PodsOfJobs
from gputask.k8s.names import fit_name
from gputask.k8s.pinning import Pinning
from gputask.k8s.records import (
    ADMITTED,
    PLACED_PHASES,
    TaskRecord,
)
from gputask.k8s.reports import Report, ReportKind
from gputask.k8s.usage import pod_memory, sound_pod_memory

if TYPE_CHECKING:
    from gputask.k8s.controller import Controller

log = logging.getLogger("gputask.controller")


class TaskPods:
    """The pods of our Jobs and what they tell of their tasks (one per controller, :attr:`Controller.pods`)."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.task_pods: dict[str, str] = {}  # pod uid -> Job key, for the pods of our Jobs (not finished)
        self.pods_of_jobs = PodsOfJobs()  # the bound ones by Job, and Jobs gone before them (their GPUs held)
        self.over_budget: dict[TaskKey, tuple[Overuse, ...]] = {}  # running tasks over their GPU memory budget
        self.start_deadlines: list[tuple[float, TaskKey, int]] = []  # heap: (deadline s, task, attempt)
        self.pod_problems: dict[str, str] = {}  # Job key -> why its pod does not start (Unschedulable)
        self.disrupted: dict[str, tuple[str, str]] = {}  # Job key -> (DisruptionTarget reason, message) of its pod
        # Job key -> "pod P of Job J is Running": a pod that started while its Job's create was still unconfirmed
        # (its answer lost, or not back yet); said once the task is admitted with that Job (:meth:`admitted_with`).
        self.early_starts: dict[str, str] = {}
        self.gang_started: dict[str, set[str]] = {}  # a gang's lead Job key -> the names of its pods that started
        self.pins: dict[str, tuple[str, str, dict[str, Any]]] = {}  # pod key -> (namespace, name, pin patch) to send

    def _pin(self, pod: Mapping[str, Any], job: JobRecord) -> None:
        """Queue the patch that pins a gated pod of a gang's Job to its node and GPUs (:func:`pin_patch`)."""
        patch = pin_patch(pod, job.placement, Pinning(self.ctl.config.pinning))
        meta = pod.get("metadata") or {}
        if patch is not None and meta.get("name"):
            namespace = str(meta.get("namespace") or job.namespace)
            self.pins[f"{namespace}/{meta['name']}"] = (namespace, str(meta["name"]), patch)

    def take_pins(self) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """The pod pins to send (emptied)."""
        pins, self.pins = self.pins, {}
        return pins

    def on_task_pod(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """A pod of one of our Jobs changed: Running once it runs; remember why it cannot be scheduled."""
        job = self.job_of_pod(pod)
        self.note_task_pod(pod, job, deleted)
        if job is None:
            return
        record = self.ctl.by_uid.get(job.task_uid)
        status = pod.get("status") or {}
        if record is not None and job.gang and job.lead in (record.job_name, record.creating) and not deleted:
            self._pin(pod, job)  # a gang's pod waits behind its gate until pinned to its node and GPUs
        if record is not None and record.creating == job.lead and record.job_name != job.lead:
            if not deleted and status.get("phase") in STARTED_POD_PHASES and not job.gang:
                name = (pod.get("metadata") or {}).get("name")
                self.early_starts[job.key] = f"pod {name} of Job {job.name} is {status['phase']}"
            return
        if record is None or record.job_name != job.lead:
            return
        self._note_disruption(pod, job)
        if not deleted and status.get("phase") in STARTED_POD_PHASES:
            lead = f"{job.namespace}/{job.lead}"
            self.pod_problems.pop(lead, None)
            name = (pod.get("metadata") or {}).get("name")
            message = f"pod {name} of Job {job.name} is {status['phase']}"
            if job.gang:  # Running once every pod of the gang has started
                started = self.gang_started.setdefault(lead, set())
                started.add(f"{job.name}/{pod_index(pod)}")  # a pod replaced after a failure counts once
                total = record.task.pod_count if record.task is not None else 0
                if len(started) < total:
                    return
                message = f"all {total} pods of the gang started (the last: {message})"
            if record.phase == ADMITTED:
                self.ctl.outbox.append(Report(ReportKind.RUNNING, record, message))
            return
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
                name = (pod.get("metadata") or {}).get("name")
                said = f"pod {name} is {cond['reason']}: {cond.get('message') or ''}".rstrip(": ")
                self.pod_problems[f"{job.namespace}/{job.lead}"] = said

    def admitted_with(self, record: TaskRecord) -> None:
        """The task was just admitted with its Job (created, or found after a lost answer): a pod of that Job seen
        started before (while the create was unconfirmed) makes it Running now, as no later pod event may come."""
        message = self.early_starts.pop(f"{record.namespace}/{record.job_name}", None)
        if message is not None and record.phase == ADMITTED:
            self.ctl.outbox.append(Report(ReportKind.RUNNING, record, message))

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
            for node in list(self.ctl.inventory.gpunodes):
                self.ctl.inventory.refresh_node(node, now)

    def note_task_pod(self, pod: Mapping[str, Any], job: JobRecord | None, deleted: bool) -> None:
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
        if before != self.task_pods.get(uid) and isinstance(node, str) and node in self.ctl.inventory.gpunodes:
            self.ctl.inventory.refresh_node(node, time.time())

    def judge_memory(self, node: str, status: Any) -> None:
        """Sum each running task's pods' memory per GPU of ``node`` (GPUs the agent split by pod) and let the
        core judge it; a task that goes over budget, or back within, is reported (over-budget / within-budget)
        once per change of the GPUs it overuses, not per figure. A task the core evicts for it (memoryBudget
        Evict) is not reported here: its eviction (reason GPUMemoryExceeded) carries the same figures."""
        cluster = self.ctl.scheduler.cluster
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
        job = self.ctl.jobs.get(self.task_pods.get(pod_uid, ""))
        record = self.ctl.by_uid.get(job.task_uid) if job is not None else None
        if record is None or job is None or record.job_name != job.lead or record.phase not in PLACED_PHASES:
            return None
        return record

    def _judge(self, key: TaskKey, used: dict[int, int]) -> None:
        record = self.ctl.tasks.get(key)
        found = self.ctl.scheduler.memory_used(key, used)
        if record is None or found is None:
            self.over_budget.pop(key, None)
            return
        before = self.over_budget.get(key, ())
        tolerance = self.ctl.scheduler.memory_budget.tolerance_mib
        if found and key not in self.ctl.scheduler.running:
            self.over_budget.pop(key, None)  # evicted (memoryBudget Evict): the eviction says why, with the figures
            return
        if found:
            self.over_budget[key] = found
            if [o.index for o in found] != [o.index for o in before]:
                self.ctl.outbox.append(Report(ReportKind.OVER_BUDGET, record, overuse_text(found, tolerance)))
        elif before:
            del self.over_budget[key]
            message = f"its pods use at most the GPU memory it reserved (+{tolerance} MiB tolerance) again"
            self.ctl.outbox.append(Report(ReportKind.WITHIN_BUDGET, record, message))

    def job_of_pod(self, pod: Mapping[str, Any]) -> JobRecord | None:
        """The Job of one of our pods: a live one, else one gone before its pods (:mod:`gputask.k8s.lingering`)."""
        meta = pod.get("metadata") or {}
        keys = [f"{meta.get('namespace') or 'default'}/{name}" for name in job_names(meta)]
        gone = self.pods_of_jobs.gone
        return next((self.ctl.jobs[k] for k in keys if k in self.ctl.jobs), None) or next(
            (gone[k].job for k in keys if k in gone), None)

    def _pod_gone(self, job_key: str, uid: str) -> None:
        """Pod ``uid`` of Job ``job_key`` is gone (deleted, finished, unbound): when it was the last pod of a Job gone
        before it, that Job's GPUs are released and its task told."""
        ended = self.pods_of_jobs.absent(job_key, uid)
        if ended is None or ended.hold is None:
            return
        self.ctl.scheduler.finish(ended.hold)
        record = self.task_of_gone(ended)
        if record is not None and ended.job.placement is not None:
            nodes = ", ".join(ended.job.placement.nodes)
            message = f"GPUs on node {nodes} released: the pods of Job {ended.job.name} are gone"
            self.ctl.outbox.append(Report(ReportKind.GPUS_RELEASED, record, message))

    def task_of_gone(self, gone: GoneJob) -> TaskRecord | None:
        """The task of a gone Job: by its uid, or (found at a restart) by its pods' task label."""
        record = self.ctl.by_uid.get(gone.job.task_uid)
        if record is not None or not gone.task_label:
            return record
        for key in sorted(self.ctl.in_namespace.get(gone.job.namespace, set())):
            if fit_name(self.ctl.tasks[key].name) == gone.task_label:
                return self.ctl.tasks[key]
        return None

    def pods_outlive(self, job: JobRecord, held: TaskKey | None) -> bool:
        """Job ``job`` is gone; True when pods of it are still bound to a node: its GPUs (``held``) stay held until
        they are gone, and its task is told what waits for what."""
        earlier = self.pods_of_jobs.gone.get(job.key)
        if not self.pods_of_jobs.job_gone(job, held):
            return False
        if earlier is not None and earlier.hold not in (None, held) and held is not None:
            self.ctl.scheduler.finish(earlier.hold)  # held twice over: the newer hold stands
        gone = self.pods_of_jobs.gone[job.key]
        note, record = self.pods_of_jobs.note_of(gone), self.task_of_gone(gone)
        if note is not None and record is not None and gone.hold in self.ctl.scheduler.ledger.held:
            self.ctl.outbox.append(Report(ReportKind.GPUS_HELD, record, note))
        return True

    def held_for(self, key: TaskKey) -> list[str]:
        """What is held for Jobs of task ``key`` that are gone before their pods: one
        :func:`~gputask.k8s.lingering.held_note` each, while the core still holds the GPUs (a deleted Node's are
        released with it)."""
        held = self.ctl.scheduler.ledger.held
        notes = []
        for gone in self.pods_of_jobs.gone.values():
            record = self.task_of_gone(gone)
            note = self.pods_of_jobs.note_of(gone)
            if record is not None and record.key == key and note is not None and gone.hold in held:
                notes.append(note)
        return sorted(notes)

    def gone_job_of_pod(self, pod: Mapping[str, Any]) -> JobRecord | None:
        """At a restart: the Job of an unfinished pod of ours bound to a node when the Job is gone (neither listed nor
        found by name), as its pod tells it (the placement its annotation names); None for any other pod."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        names = job_names(meta)
        placement = parse_placement(annotations.get(PLACEMENT_ANNOTATION))
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if not names or placement is None or finished or not spec.get("nodeName"):
            return None
        job = JobRecord(names[0], str(meta.get("namespace") or "default"), "", 0, placement)
        self.pods_of_jobs.gone.setdefault(job.key, GoneJob(job, task_label=str(labels.get(TASK_LABEL) or "")))
        return self.pods_of_jobs.gone[job.key].job

    def hold_gone_jobs(self) -> None:
        """At a restart, after the tasks: hold the GPUs of the Jobs gone before their pods (even over-committed, as
        they run), and tell each task whose condition does not say so yet."""
        for gone in self.pods_of_jobs.gone.values():
            placement = gone.job.placement
            key = holding_key(gone.job)
            if gone.hold is None and placement is not None and self.ctl.scheduler.hold(key, placement) is not None:
                gone.hold = key
            note, record = self.pods_of_jobs.note_of(gone), self.task_of_gone(gone)
            evicted = record.conditions.get("Evicted") if record is not None else None
            if note is not None and record is not None and not str((evicted or {}).get("message", "")).endswith(note):
                self.ctl.outbox.append(Report(ReportKind.GPUS_HELD, record, note))

    def started(self, record: TaskRecord, admitted_at: float) -> None:
        """An admitted task must have a running pod by ``admitted_at`` + podStartTimeout (seconds)."""
        deadline = admitted_at + self.ctl.config.pod_start_timeout_s
        heapq.heappush(self.start_deadlines, (deadline, record.key, record.attempt))

    def overdue(self, now: float) -> list[TaskRecord]:
        """Admitted tasks still without a running pod past their deadline (each reported once)."""
        out = []
        while self.start_deadlines and self.start_deadlines[0][0] <= now:
            _, key, attempt = heapq.heappop(self.start_deadlines)
            record = self.ctl.tasks.get(key)
            job = self.ctl.jobs.get(f"{record.namespace}/{record.job_name}") if record is not None else None
            if job is not None and job.outcome is not None:
                continue  # it ran to its end: no pod is to be expected, the Job is never deleted for it
            if record is not None and record.phase == ADMITTED and record.attempt == attempt:
                out.append(record)
        return out
