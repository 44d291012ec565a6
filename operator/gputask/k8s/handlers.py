"""kopf handlers: feed the controller from watch events and wake the scheduling loop.

Handlers never decide. All are ``async def`` (sync handlers would run in threads and race).
They use ``kopf.on.event`` (no finalizers, no kopf state annotations), so no GPUTask deletion
can ever hang on gputask. Handlers are registered on a registry per operator instance, so
tests can run two operators in one process.
"""

from __future__ import annotations

import logging
import time
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
    PRIORITYCLASSES,
    WORKLOADPRIORITYCLASSES,
    ApiError,
    KubeClient,
    Resource,
)
from gputask.k8s.controller import ADMITTED, PENDING, RUNNING, Controller
from gputask.k8s.executor import Executor
from gputask.k8s.jobs import TASK_UID_ANNOTATION
from gputask.k8s.loop import SchedulingLoop

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
    """One operator instance: controller, executor, loop and its kopf registry."""

    def __init__(self, controller: Controller, client: KubeClient) -> None:
        self.controller = controller
        self.client = client
        self.executor = Executor(client, controller)
        self.loop = SchedulingLoop(controller, self.executor)
        self.registry = kopf.OperatorRegistry()
        self._register()

    async def rebuild(self) -> None:
        """List everything and rebuild the controller's state before the first cycle."""
        objects: dict[str, list[dict[str, Any]]] = {}
        for kind, (resource, labels) in REBUILD_ORDER.items():
            try:
                objects[kind] = await self.client.list(resource, labels=labels)
            except ApiError as exc:
                if exc.status != 404:
                    raise kopf.TemporaryError(f"listing {kind} failed: {exc}", delay=5) from exc
                objects[kind] = []  # e.g. no PriorityClass API in a minimal cluster
        self.controller.rebuild_from(objects)
        for record in list(self.controller.tasks.values()):
            if record.invalid is not None:
                await self.executor.invalid(record)

    # -- handlers -----------------------------------------------------------------------
    async def on_startup(self, **_: Any) -> None:
        """Rebuild state, then start the scheduling loop."""
        await self.rebuild()
        self.loop.start()
        self.loop.wake()

    async def on_cleanup(self, **_: Any) -> None:
        """Stop the loop."""
        await self.loop.stop()

    async def on_task(self, event: dict[str, Any], **_: Any) -> None:
        """GPUTask added, modified or deleted."""
        obj = event["object"]
        if event.get("type") == "DELETED" or obj["metadata"].get("deletionTimestamp"):
            record = self.controller.on_task_deleted(obj)
            if record is not None and record.job_name and record.key in self.controller.tasks:
                await self.executor.delete_job(record)
        else:
            record = self.controller.on_task(obj)
            if record.invalid is not None and record.phase == PENDING:
                await self.executor.invalid(record)
        self.loop.wake()

    async def on_job(self, event: dict[str, Any], **_: Any) -> None:
        """One of our Jobs changed: track running, completion and disappearance."""
        obj = event["object"]
        if event.get("type") == "DELETED":
            await self._job_deleted(obj)
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
            self.controller.scheduler.evict(lost.key)
            await self.executor.evict(Evict(lost.task, lost.placement, "JobDeleted", message))
        self.loop.wake()

    def _simple(self, method: Callable[..., None]) -> Handler:
        async def handler(event: dict[str, Any], **_: Any) -> None:
            method(event["object"], deleted=event.get("type") == "DELETED")
            self.loop.wake()

        return handler

    def _timed(self, method: Callable[..., None]) -> Handler:
        async def handler(event: dict[str, Any], **_: Any) -> None:
            method(event["object"], time.time(), deleted=event.get("type") == "DELETED")
            self.loop.wake()

        return handler

    def _register(self) -> None:
        reg = self.registry
        kopf.on.startup(registry=reg)(self.on_startup)
        kopf.on.cleanup(registry=reg)(self.on_cleanup)
        kopf.on.event("gputask.io", "v1alpha1", "gputasks", registry=reg)(self.on_task)
        kopf.on.event("batch", "v1", "jobs", registry=reg, annotations={TASK_UID_ANNOTATION: kopf.PRESENT})(self.on_job)
        inv = self.controller.inventory
        for resource, handler in (
            (("gputask.io", "v1alpha1", "gpunodes"), self._timed(inv.on_gpunode)),
            (("v1", "nodes"), self._timed(inv.on_node)),
            (("gputask.io", "v1alpha1", "gpuclusterqueues"), self._simple(inv.on_queue)),
            (("v1", "namespaces"), self._simple(inv.on_namespace)),
            (("scheduling.k8s.io", "v1", "priorityclasses"), self._simple(inv.on_priority_class)),
            (("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses"), self._simple(inv.on_workload_priority_class)),
        ):
            kopf.on.event(*resource, registry=reg, id=f"track-{resource[-1]}")(handler)
