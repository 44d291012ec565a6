"""kopf handlers: feed the controller from watch events and wake the scheduling loop.

Handlers never decide. All are ``async def`` (sync handlers would run in threads and race).
They use ``kopf.on.event`` (no finalizers, no kopf state annotations), so no GPUTask deletion
can ever hang on gputask. Handlers are registered on a registry per operator instance, so
tests can run two operators in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import kopf

from gputask.core.scheduler import Evict
from gputask.k8s.client import (
    GPUCLUSTERQUEUES,
    GPUNODES,
    GPUTASKS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
    ApiError,
    KubeClient,
    Resource,
)
from gputask.k8s.controller import ADMITTED, PENDING, RUNNING, Controller
from gputask.k8s.executor import Executor
from gputask.k8s.foreign import UNFINISHED_PODS, may_claim
from gputask.k8s.jobs import TASK_LABEL, TASK_UID_ANNOTATION
from gputask.k8s.kueue import KueueSupport
from gputask.k8s.leader import LeaderElector
from gputask.k8s.loop import SchedulingLoop
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.handlers")

Handler = Callable[..., Coroutine[Any, Any, None]]

REBUILD_ORDER: dict[str, tuple[Resource, str | None]] = {
    "priorityclasses": (PRIORITYCLASSES, None),
    "workloadpriorityclasses": (WORKLOADPRIORITYCLASSES, None),
    "namespaces": (NAMESPACES, None),
    "nodes": (NODES, None),
    "gpunodes": (GPUNODES, None),
    "queues": (GPUCLUSTERQUEUES, None),
    "jobs": (JOBS, "gputask.io/task"),
    "tasks": (GPUTASKS, None),
}


class Operator:
    """One operator instance: controller, executor, loop, optional leader election, kopf registry.

    Without leader election the instance leads from the start. With it, a standby keeps its
    watches open but ignores their events; once elected it rebuilds a fresh controller from
    the API, and only then schedules.
    """

    def __init__(self, controller: Controller, client: KubeClient, *, identity: str | None = None) -> None:
        self.controller = controller
        self.client = client
        self.metrics = OperatorMetrics()
        self.executor = Executor(client, controller, self.metrics)
        self.loop = SchedulingLoop(controller, self.executor)
        self.kueue = KueueSupport(client, self.executor)
        self.foreign = controller.inventory.foreign  # foreign GPU pods, kept across rebuilds
        self.registry = kopf.OperatorRegistry()
        self.leading = False
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._elector: asyncio.Task[None] | None = None
        self._register()

    async def rebuild(self) -> None:
        """List everything and rebuild a fresh controller before the first cycle."""
        objects: dict[str, list[dict[str, Any]]] = {}
        kueue_mode = self.controller.config.queueing == "kueue"
        lists = {**REBUILD_ORDER, "pods": (PODS, None), **({"workloads": (WORKLOADS, None)} if kueue_mode else {})}
        for kind, (resource, labels) in lists.items():
            fields = UNFINISHED_PODS if resource == PODS else None
            try:
                objects[kind] = await self.client.list(resource, labels=labels, fields=fields)
            except ApiError as exc:
                if exc.status != 404:
                    raise kopf.TemporaryError(f"listing {kind} failed: {exc}", delay=5) from exc
                objects[kind] = []  # e.g. no Kueue WorkloadPriorityClass API in this cluster
        self.foreign.reset(objects["pods"])
        controller = Controller(self.controller.config)
        controller.inventory.foreign = self.foreign
        controller.rebuild_from(objects)
        self.controller = self.executor.controller = self.loop.controller = controller
        await self.kueue.rebuild(objects.get("workloads", []))
        for record in list(controller.tasks.values()):
            if record.invalid is not None:
                await self.executor.invalid(record)
            elif record.phase in (ADMITTED, RUNNING) and _status_behind(record):
                # a restart between creating the Job and writing the status: finish the write
                await self.executor.patch_status(record, message=f"Admitted (Job {record.job_name} found at restart)")

    async def lead(self) -> None:
        """Become the scheduling instance: rebuild, then run the loop."""
        await self.rebuild()
        self.leading = True
        self.loop.start()
        self.loop.wake()
        self.kueue.start()

    async def step_down(self) -> None:
        """Stop scheduling (lost the Lease, or shutting down)."""
        self.leading = False
        await self.loop.stop()
        await self.kueue.stop()

    # -- handlers -----------------------------------------------------------------------
    async def on_startup(self, **_: Any) -> None:
        """Lead at once, or campaign for the Lease when leader election is configured."""
        config = self.controller.config
        if not config.leader_election:
            await self.lead()
            return
        elector = LeaderElector(
            self.client,
            identity=self.identity,
            name=config.lease_name,
            namespace=config.lease_namespace or os.environ.get("POD_NAMESPACE", "default"),
            lease_s=config.lease_duration_s,
            renew_s=config.lease_renew_s,
        )
        self._elector = asyncio.create_task(elector.run(self.lead, self.step_down), name="gputask-leader-election")

    async def on_cleanup(self, **_: Any) -> None:
        """Stop campaigning and scheduling."""
        if self._elector is not None:
            self._elector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._elector
        await self.step_down()

    async def on_task(self, event: dict[str, Any], **_: Any) -> None:
        """GPUTask added, modified or deleted."""
        if not self.leading:
            return
        obj = event["object"]
        if event.get("type") == "DELETED" or obj["metadata"].get("deletionTimestamp"):
            record = self.controller.on_task_deleted(obj)
            if record is not None and record.job_name and record.phase in (ADMITTED, RUNNING):
                await self.executor.delete_job(record)
        else:
            record = self.controller.on_task(obj)
            if record.invalid is not None and record.phase == PENDING:
                await self.executor.invalid(record)
            elif record.spec_ignored:
                record.spec_ignored = False
                message = (
                    f"spec changed while Job {record.job_name} runs: the change applies only if the task is "
                    "requeued; delete and re-create the GPUTask to apply it now"
                )
                await self.executor.event(record, "Warning", "SpecChangeIgnored", message)
        self.loop.wake()
        self.kueue.wake()

    async def on_job(self, event: dict[str, Any], **_: Any) -> None:
        """One of our Jobs changed: track running, completion and disappearance."""
        if not self.leading:
            return
        obj = event["object"]
        self.kueue.on_job(obj, deleted=event.get("type") == "DELETED")
        if event.get("type") == "DELETED":
            await self._job_deleted(obj)
            self.kueue.wake()
            return
        job = self.controller.on_job(obj)
        if job is None:
            return
        record = self.controller.record_by_uid(job.task_uid)
        if record is None or record.job_name != job.name or record.phase not in (ADMITTED, RUNNING):
            return
        if job.outcome is None:
            if record.phase == ADMITTED and ((obj.get("status") or {}).get("active") or 0) > 0:
                record.phase = RUNNING
                await self.executor.patch_status(record, message=f"Job {job.name} is running")
            return
        self.controller.finish_task(record, job.outcome)
        await self.executor.finished(record, job.outcome)
        self.loop.wake()

    async def _job_deleted(self, obj: dict[str, Any]) -> None:
        job = self.controller.on_job_deleted(obj)
        lost = self.controller.current_job_gone(job) if job is not None else None
        if lost is not None and lost.task is not None and lost.placement is not None:
            message = f"Job {lost.job_name} was deleted while the task ran; requeued"
            self.controller.scheduler.requeue(lost.key)
            await self.executor.evict(Evict(lost.task, lost.placement, "JobDeleted", message))
        self.loop.wake()

    async def on_pod(self, event: dict[str, Any], **_: Any) -> None:
        """A pod that may hold GPUs changed: update the foreign-use index and that node's GPUs."""
        node = self.foreign.on_pod(event["object"], deleted=event.get("type") == "DELETED")
        if node is not None and self.leading:
            self.controller.inventory.refresh_node(node, time.time())
            self.loop.wake()

    async def on_local_queue(self, event: dict[str, Any], **_: Any) -> None:
        """A Kueue LocalQueue changed (gputask mode: it may make Kueue suspend our Jobs)."""
        self.kueue.on_local_queue(event["object"], deleted=event.get("type") == "DELETED")

    async def on_workload(self, event: dict[str, Any], **_: Any) -> None:
        """A Kueue Workload changed (Kueue mode: it may wait for our placement check)."""
        if self.leading:
            self.kueue.admission.on_workload(event["object"], deleted=event.get("type") == "DELETED")
            self.kueue.wake()

    def _track(self, method: str, *, timed: bool = False) -> Handler:
        """A handler that passes the object to ``controller.inventory.<method>`` (looked up per event)."""

        async def handler(event: dict[str, Any], **_: Any) -> None:
            if not self.leading:
                return
            call = getattr(self.controller.inventory, method)
            deleted = event.get("type") == "DELETED"
            if timed:
                call(event["object"], time.time(), deleted=deleted)
            else:
                call(event["object"], deleted=deleted)
            self.loop.wake()

        return handler

    def _register(self) -> None:
        reg = self.registry
        kopf.on.startup(registry=reg)(self.on_startup)
        kopf.on.cleanup(registry=reg)(self.on_cleanup)
        kopf.on.event("gputask.io", "v1alpha1", "gputasks", registry=reg)(self.on_task)
        kopf.on.event("batch", "v1", "jobs", registry=reg, annotations={TASK_UID_ANNOTATION: kopf.PRESENT})(self.on_job)
        kopf.on.event("v1", "pods", registry=reg, labels={TASK_LABEL: kopf.ABSENT}, when=may_claim)(self.on_pod)
        if self.controller.config.queueing == "kueue":
            kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", registry=reg)(self.on_workload)
        else:
            kopf.on.event("kueue.x-k8s.io", "v1beta2", "localqueues", registry=reg)(self.on_local_queue)
        for resource, handler in (
            (("gputask.io", "v1alpha1", "gpunodes"), self._track("on_gpunode", timed=True)),
            (("v1", "nodes"), self._track("on_node", timed=True)),
            (("gputask.io", "v1alpha1", "gpuclusterqueues"), self._track("on_queue")),
            (("v1", "namespaces"), self._track("on_namespace")),
            (("scheduling.k8s.io", "v1", "priorityclasses"), self._track("on_priority_class")),
            (("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses"), self._track("on_workload_priority_class")),
        ):
            kopf.on.event(*resource, registry=reg, id=f"track-{resource[-1]}")(handler)


def _status_behind(record: Any) -> bool:
    """True when the stored status does not yet say what the record knows (phase, Job name)."""
    status = record.obj.get("status") or {}
    return status.get("jobName") != record.job_name or status.get("phase") not in (ADMITTED, RUNNING)
