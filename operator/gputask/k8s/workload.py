"""The workload interface: what the adapter asks of a workload it admits, in the shape of Kueue's ``GenericJob``
(sigs.k8s.io/kueue pkg/controller/jobframework/interface.go: ``Object``, ``PodSets``, ``RunWithPodSetsInfo``,
``Suspend``, ``Finished``, ``IsActive``).

- what it is: :meth:`Workload.object` (the API object), :meth:`pod_sets` (today one PodSet of count 1, named
  ``main``, from the pod template), :meth:`priority` and :meth:`queue_name` (from its converted core Task);
- how a placement is applied: :meth:`job_for` (today: a new Job pinned to the node and GPUs, owned by the workload,
  :func:`gputask.k8s.jobs.build_job`; an existing Job would be unsuspended and patched instead) and, in Kueue mode,
  :meth:`suspended_job` (:func:`gputask.k8s.kueue_api.build_kueue_job`);
- how it is stopped: :meth:`stop` (today: its Job deleted through the writer, with :meth:`stop_propagation`,
  Foreground for a preemption; a workload that is an existing Job would be suspended instead);
- when it finished or failed: :meth:`finished` (the Job's Complete / Failed condition);
- where its status goes: :attr:`status_resource` (a status patch of that resource by name and namespace) and
  :meth:`involved` (the ``involvedObject`` of its Events); :func:`owner_uid` tells which workload a Job is of.

:class:`GPUTaskWorkload` is its one implementation; :func:`workload_of` gives a record's. No I/O here: the
transitions and the executor do the writes, and this module imports neither them nor the controller (an import
contract, ``tests/unit/test_imports.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gputask.core import GpuRequest, Placement
from gputask.core.fit import Toleration
from gputask.k8s.gangjobs import GangPodSet, build_gang_jobs, build_service
from gputask.k8s.jobrecords import JobRecord, job_failure, job_outcome
from gputask.k8s.jobs import TASK_UID_ANNOTATION, build_job
from gputask.k8s.kueue_api import build_kueue_job
from gputask.k8s.names import API_VERSION
from gputask.k8s.pinning import ENVVAR, Pinning
from gputask.k8s.records import TaskRecord
from gputask.k8s.resources import GPUTASKS, JOBS, Resource

MAIN_POD_SET = "main"


@dataclass(frozen=True, slots=True)
class PodSetInfo:
    """One PodSet of a workload: its name, how many pods, and their pod template (a dict)."""

    name: str
    count: int
    template: Mapping[str, Any]


class Deleter(Protocol):
    """What stopping a workload needs of the API: a delete (the :class:`~gputask.k8s.writer.Writer`'s, which checks
    leadership first)."""

    async def delete(self, res: Resource, name: str, namespace: str | None = None, *,
                     propagation: str = "Background") -> bool:
        """Delete an object; False when it was already gone; raises ApiError (Fenced when not leading)."""
        ...


@runtime_checkable
class Workload(Protocol):
    """What the adapter reads of and does to a workload it admits (Kueue's GenericJob)."""

    status_resource: Resource

    def object(self) -> Mapping[str, Any]:
        """The workload's API object as last seen."""
        ...

    def pod_sets(self) -> tuple[PodSetInfo, ...]:
        """Its PodSets, in order."""
        ...

    def priority(self) -> int:
        """Its priority (0 until its spec is converted)."""
        ...

    def queue_name(self) -> str:
        """The queue it names."""
        ...

    def job_for(self, placement: Placement, *, attempt: int, queue: str, flavor: str = "",
                tolerations: Iterable[Toleration] = (), pinning: Pinning = ENVVAR,
                request: GpuRequest | None = None) -> dict[str, Any]:
        """The Job that runs it on ``placement`` (to create)."""
        ...

    def jobs_for(self, placement: Placement, *, attempt: int, queue: str, flavor: str = "",
                 tolerations: Iterable[Toleration] = (), pinning: Pinning = ENVVAR,
                 request: GpuRequest | None = None) -> list[dict[str, Any]]:
        """The Jobs that run it on ``placement`` (to create; a gang's lead first)."""
        ...

    def service_for(self, placement: Placement) -> dict[str, Any] | None:
        """The Service its pods are named under (a gang's), or None."""
        ...

    def suspended_job(self, *, attempt: int, queue: str, pinning: Pinning,
                      request: GpuRequest | None) -> dict[str, Any]:
        """Kueue mode: the suspended Job Kueue admits."""
        ...

    async def start(self, api: Any, job: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Send ``job`` (from :meth:`job_for`) through the writer ``api``: a GPUTask's Job is created, an existing
        Job is patched and unsuspended (:class:`~gputask.k8s.userjobs.UserJobWorkload`); raises the API's
        errors."""
        ...

    def stop_propagation(self, reason: str) -> str:
        """How its Job is deleted when it is evicted for ``reason``."""
        ...

    async def stop(self, api: Deleter, job: JobRecord, reason: str) -> bool:
        """Stop ``job``, its run, for ``reason`` (an eviction's, or why it is no longer wanted); False when it was
        gone already; raises the API's errors (the caller retries)."""
        ...

    def finished(self, job: Mapping[str, Any]) -> tuple[str, str] | None:
        """(outcome, why) once its Job completed or failed, else None."""
        ...

    def involved(self) -> dict[str, Any]:
        """The ``involvedObject`` of an Event about it."""
        ...


class GPUTaskWorkload:
    """A GPUTask as a :class:`Workload`: its Jobs are new Jobs it owns; its status is the GPUTask's."""

    status_resource = GPUTASKS
    kind = "GPUTask"

    def __init__(self, record: TaskRecord) -> None:
        self.record = record

    def object(self) -> Mapping[str, Any]:
        """The GPUTask as last seen (watch or status write)."""
        return self.record.obj

    def pod_sets(self) -> tuple[PodSetInfo, ...]:
        """Its ``spec.podSets`` (name, count, template), or one PodSet ``main`` of one pod: ``spec.template``."""
        spec = self.record.obj.get("spec") or {}
        given = spec.get("podSets")
        if isinstance(given, list) and given:
            return tuple(PodSetInfo(str(p.get("name") or ""), int(p.get("count") or 1), p.get("template") or {})
                         for p in given)
        return (PodSetInfo(MAIN_POD_SET, 1, spec.get("template") or {}),)

    def priority(self) -> int:
        """The converted task's priority; 0 before conversion."""
        return self.record.task.priority if self.record.task is not None else 0

    def queue_name(self) -> str:
        """``spec.queueName`` as written (a GPULocalQueue, or a GPUClusterQueue named directly)."""
        return str((self.record.obj.get("spec") or {}).get("queueName") or "")

    def job_for(self, placement: Placement, *, attempt: int, queue: str, flavor: str = "",
                tolerations: Iterable[Toleration] = (), pinning: Pinning = ENVVAR,
                request: GpuRequest | None = None) -> dict[str, Any]:
        """A new Job owned by the GPUTask, pinned to ``placement`` (:func:`~gputask.k8s.jobs.build_job`; raises as
        it does)."""
        return build_job(self.record.obj, placement, attempt=attempt, queue=queue, flavor=flavor,
                         tolerations=tolerations, pinning=pinning, request=request)

    def jobs_for(self, placement: Placement, *, attempt: int, queue: str, flavor: str = "",
                 tolerations: Iterable[Toleration] = (), pinning: Pinning = ENVVAR,
                 request: GpuRequest | None = None) -> list[dict[str, Any]]:
        """The Jobs that run it on ``placement``: :meth:`job_for`'s one Job for one pod; for a gang (several pods) one
        Indexed Job per PodSet, lead first (:func:`~gputask.k8s.gangjobs.build_gang_jobs`; raises ValueError as it
        does, KeyError when the task is not converted)."""
        if len(placement.pods) == 1:
            return [self.job_for(placement, attempt=attempt, queue=queue, flavor=flavor, tolerations=tolerations,
                                 pinning=pinning, request=request)]
        task = self.record.task
        if task is None:
            raise KeyError("a gang's Jobs need its converted task")
        requests = {p.name: p.request for p in task.podsets}
        pod_sets = [GangPodSet(p.name, p.count, p.template, requests[p.name]) for p in self.pod_sets()]
        return build_gang_jobs(self.record.obj, pod_sets, placement, attempt=attempt, queue=queue, flavor=flavor,
                               tolerations=tolerations, pinning=pinning)

    def service_for(self, placement: Placement) -> dict[str, Any] | None:
        """The headless Service a gang's pods are named under (:func:`~gputask.k8s.gangjobs.build_service`); None
        for one pod."""
        return None if len(placement.pods) == 1 else build_service(self.record.obj)

    def suspended_job(self, *, attempt: int, queue: str, pinning: Pinning,
                      request: GpuRequest | None) -> dict[str, Any]:
        """The suspended Job of Kueue mode (:func:`~gputask.k8s.kueue_api.build_kueue_job`)."""
        return build_kueue_job(self.record.obj, attempt=attempt, queue=queue, pinning=pinning, request=request)

    async def start(self, api: Any, job: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Create ``job`` (raises AlreadyExists for a 409, the API's other errors)."""
        created: dict[str, Any] = await api.create(JOBS, job, namespace)
        return created

    def stop_propagation(self, reason: str) -> str:
        """Foreground for a preemption (its preemptor waits for the pods to go), else Background."""
        return "Foreground" if reason == "Preempted" else "Background"

    async def stop(self, api: Deleter, job: JobRecord, reason: str) -> bool:
        """Delete ``job`` with :meth:`stop_propagation` of ``reason`` (its pods go with it); False when it was gone
        already; raises ApiError."""
        return await api.delete(JOBS, job.name, job.namespace, propagation=self.stop_propagation(reason))

    def finished(self, job: Mapping[str, Any]) -> tuple[str, str] | None:
        """(Succeeded or Failed, the Failed condition's "reason: message") from its Job's conditions."""
        outcome = job_outcome(job)
        return None if outcome is None else (outcome, job_failure(job))

    def involved(self) -> dict[str, Any]:
        """The GPUTask as an Event's ``involvedObject``."""
        meta = self.record.obj["metadata"]
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "name": meta["name"],
            "namespace": self.record.namespace,
            "uid": meta.get("uid"),
        }


def owner_uid(job: Mapping[str, Any]) -> str | None:
    """The uid of the workload a Job of ours runs (its ``gputask.io/task-uid`` annotation), or None."""
    uid = ((job.get("metadata") or {}).get("annotations") or {}).get(TASK_UID_ANNOTATION)
    return str(uid) if uid else None


def workload_of(record: TaskRecord) -> Workload:
    """The workload a record stands for: an existing Job's (:class:`~gputask.k8s.userjobs.UserJobWorkload`) when
    its GPUTask's ``spec.workloadRef`` names one, else the GPUTask's own."""
    from gputask.k8s.userjobs import UserJobWorkload, is_user_job_task  # it imports this module's PodSetInfo

    if is_user_job_task(record.obj):
        return UserJobWorkload(record)
    return GPUTaskWorkload(record)


__all__ = ["Deleter", "GPUTaskWorkload", "PodSetInfo", "Workload", "owner_uid", "workload_of"]
