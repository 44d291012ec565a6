"""A restarted (or newly elected) operator's controller, rebuilt from listed objects before its first cycle: each
task's stored status adopted, placements restored from our Jobs in Job creation order (a later Job over-committing
a GPU is evicted, PlacementConflict), a task's second live Job reported as a stray, departing Jobs held.
Synchronous, no I/O."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gputask.core import InvalidTaskError, Placement, Task
from gputask.k8s import records
from gputask.k8s.jobrecords import (
    JobRecord,
    job_record,
)
from gputask.k8s.jobs import TASK_LABEL
from gputask.k8s.records import (
    ADMITTED,
    PLACED_PHASES,
    PLACEMENT_CONFLICT,
    RUNNING,
    TaskRecord,
)
from gputask.k8s.reports import Report, ReportKind
from gputask.k8s.tasks import status_behind
from gputask.manifests import convert

if TYPE_CHECKING:
    from gputask.k8s.controller import Controller

log = logging.getLogger("gputask.controller")


class Restart:
    """The rebuild of a controller from listed objects (one per controller, :attr:`Controller.restart`)."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self._restoring: list[tuple[str, TaskRecord]] | None = None  # during a rebuild: (Job created, record)

    def rebuild(self, objects: Mapping[str, Iterable[dict[str, Any]]], now: float | None = None) -> None:
        """Start over from listed objects, in dependency order.

        ``objects`` maps kinds (priorityclasses, workloadpriorityclasses, namespaces, nodes,
        gpunodes, flavors, queues, localqueues, jobs, tasks) to lists of object dicts.
        """
        self.ctl.reset()
        self._restoring = []
        now = time.time() if now is None else now
        inv, pods = self.ctl.inventory, self.ctl.pods
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
            self.ctl.local_queues.on_local_queue(obj)
        jobs = [j for j in map(job_record, objects.get("jobs", ())) if j is not None]
        for job in jobs:
            self.ctl._remember(job)
        for pod in objects.get("pods", ()):
            if TASK_LABEL in ((pod.get("metadata") or {}).get("labels") or {}):
                pods.note_task_pod(pod, pods.job_of_pod(pod) or pods.gone_job_of_pod(pod), deleted=False)
        tasks = sorted(objects.get("tasks", ()), key=lambda o: o["metadata"].get("creationTimestamp") or "")
        for obj in tasks:
            if not obj["metadata"].get("deletionTimestamp"):
                self.ctl.on_task(obj)
        restoring, self._restoring = sorted(self._restoring, key=lambda item: (item[0], item[1].key)), None
        for _, record in restoring:
            self._restore(record)
        for pod in objects.get("pods", ()):  # a pod that started while no replica led (a failover, an API server
            if TASK_LABEL in ((pod.get("metadata") or {}).get("labels") or {}) and pods.job_of_pod(pod):  # restart)
                pods.on_task_pod(pod)  # its task, still Admitted in its status, is Running now
        for job in jobs:
            record = self.ctl.by_uid.get(job.task_uid)
            if job.terminating or record is None or record.job_name != job.lead:
                self.ctl.hold(job)  # an old attempt, or a deleted task's Job, still on its GPUs
        self.ctl.pods.hold_gone_jobs()
        for name in list(inv.gpunodes):  # GPUNodes came before the tasks: memory our restored tasks use was
            inv.refresh_node(name, now)  # counted as foreign; recount it against their reservations now
        for record in self.ctl.tasks.values():
            if record.phase in PLACED_PHASES and status_behind(record):
                # a restart between creating the Job and writing the status: finish the write
                message = f"Admitted (Job {record.job_name} found at restart)"
                self.ctl.outbox.append(Report(ReportKind.RESTORED, record, message))

    def adopt_status(self, record: TaskRecord, obj: Mapping[str, Any]) -> None:
        """After a restart: take attempt and conditions from status and the placement from our Job."""
        status = obj.get("status") or {}
        attempt, reschedules = _int(status.get("attempt")), _int(status.get("reschedules"))
        if records.adopt_status(record, status, attempt=attempt, reschedules=reschedules):
            return  # finished
        job = self._booked_job(record, status.get("jobName"))
        if job is None or job.placement is None:
            return
        placement = job.placement
        if job.outcome is not None:  # it ended while no operator watched: say so now
            records.ended_unseen(record, job.name, job.attempt, phase=ADMITTED)
            self.ctl.outbox.append(Report(ReportKind.FINISHED, record, job.outcome))
            return
        try:
            task = self.ctl.specs.placed_in(record, self.ctl.specs.convert_task(obj), status.get("queue"))
        except InvalidTaskError:
            return
        if job.gang:
            gang_placement = self._gang_placement(record, job, task)
            if gang_placement is None:
                return
            placement = gang_placement
        records.restored(
            record, task, generation=int(status.get("observedGeneration") or obj["metadata"].get("generation") or 0),
            phase=RUNNING if status.get("phase") == RUNNING else ADMITTED, job_name=job.name, attempt=job.attempt,
            placement=placement, flavor=job.flavor or str(status.get("flavor") or ""),  # restored where charged
        )
        self.ctl.scheduler.set_reschedules(record.key, record.reschedules)
        if self._restoring is not None:
            self._restoring.append((job.created, record))  # restored in Job creation order (rebuild)
        else:
            self._restore(record)
        if record.phase == ADMITTED:  # the pod-start deadline runs on from the admission, not the restart
            self.ctl.pods.started(record, convert.timestamp(record.admitted_at) or time.time())

    def _gang_placement(self, record: TaskRecord, lead: JobRecord, task: Task) -> Placement | None:
        """A gang's placement from its Jobs (each carries its PodSet's pods), in the task's PodSet order; None when a
        Job of it is missing, ended or does not match its PodSet: then every live Job of it is reported a stray (the
        gang runs whole or not at all) and the task waits to be placed again."""
        gang = {j.pod_set: j for j in self.ctl.jobs_of_task.get(record.uid, {}).values() if j.lead == lead.lead}
        pods = []
        for pod_set in task.podsets:
            job = gang.get(pod_set.name)
            whole = job is not None and job.placement is not None and len(job.placement.pods) == pod_set.count
            if job is None or job.placement is None or job.outcome is not None or not whole:
                for each in gang.values():
                    if not each.terminating and each.outcome is None:
                        self.ctl.outbox.append(Report(ReportKind.STRAY_JOB, record, each.key))
                log.warning("task %s: its gang's Jobs are not whole at the restart (PodSet %s); requeued",
                            record.key, pod_set.name)
                return None
            pods.extend(job.placement.pods)
        return Placement(tuple(pods))

    def _booked_job(self, record: TaskRecord, named: Any) -> JobRecord | None:
        """The Job the books (status.jobName) name if it is live, else the newest live one; any other live
        Job of the task is a stray (a lost create answer, a stale leader) and is reported for deletion."""
        jobs = self.ctl.jobs_of_task.get(record.uid, {}).values()
        live = [j for j in jobs if not j.terminating and j.outcome is None]
        booked = next((j for j in live if j.name == named), None) or self.ctl.job_of(record)
        if booked is not None and booked.gang and booked.name != booked.gang:  # the gang's lead stands for it
            booked = next((j for j in live if j.name == booked.gang), booked)
        for job in live:
            if booked is not None and job.lead != booked.lead:  # a gang's Jobs are one
                self.ctl.outbox.append(Report(ReportKind.STRAY_JOB, record, job.key))
        return booked

    def _restore(self, record: TaskRecord) -> None:
        """Put a placed task back in the books; one that over-commits a GPU with what came before it
        (two Jobs on one GPU's memory) is evicted: the earlier Job keeps the GPU."""
        assert record.task is not None and record.placement is not None
        restored = self.ctl.scheduler.restore(record.task, record.placement, time.time(), flavor=record.flavor or None)
        entry = self.ctl.scheduler.ledger.get(record.key)
        records.charged_in(record, entry.task.flavor if entry is not None else "")
        if not restored:
            node = ", ".join(record.placement.nodes)
            message = f"Job {record.job_name} shares a GPU of {node} with an earlier Job beyond its memory"
            self.ctl.scheduler.evict(record.key, PLACEMENT_CONFLICT, message)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
