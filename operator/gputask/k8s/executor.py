"""Carry out the core's decisions through the API: Jobs, GPUTask status, Events.

Admit: create the pinned Job (409 = already done), then patch the GPUTask's status and post an
``Admitted`` Event; if the Job cannot be created, undo the assumption in the core so the task
is tried again. Pending: patch the condition and post an Event when the reason changes.
API failures are logged and counted, never raised into the loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gputask.core import Admit, Decision, Pending, Placement
from gputask.core.scheduler import Evict, Fail
from gputask.k8s.client import (
    EVENTS,
    GPUCLUSTERQUEUES,
    GPUTASKS,
    JOBS,
    AlreadyExists,
    ApiError,
    Conflict,
    KubeClient,
    NotFound,
)
from gputask.k8s.controller import ADMITTED, FAILED, PENDING, Controller, TaskRecord
from gputask.k8s.jobs import TASK_UID_ANNOTATION, build_job, job_name
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.executor")

COMPONENT = "gputask-operator"
CONCURRENCY = 16
CONFLICT_RETRIES = 5


def now_rfc3339() -> str:
    """Current UTC time as RFC 3339 with a Z suffix."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(record: TaskRecord, ctype: str, status: bool, reason: str, message: str) -> None:
    """Set a metav1.Condition on the record, moving lastTransitionTime only when status flips."""
    value = "True" if status else "False"
    old = record.conditions.get(ctype)
    changed = old is None or old.get("status") != value
    record.conditions[ctype] = {
        "type": ctype,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339() if changed else old["lastTransitionTime"],
        "observedGeneration": record.obj["metadata"].get("generation", 1),
    }


def placement_status(placement: Placement | None) -> dict[str, Any] | None:
    """The ``status.placement`` object of a placement."""
    if placement is None:
        return None
    return {
        "node": placement.node,
        "gpus": [{"index": g.index, "uuid": g.uuid, "memory": g.memory_mib} for g in placement.gpus],
    }


def queue_statuses(controller: Controller) -> dict[str, dict[str, Any]]:
    """The ``status`` of every known GPUClusterQueue: counts, usage (quantities) and an Active condition."""
    out: dict[str, dict[str, Any]] = {}
    inventory = controller.inventory
    for name, report in controller.scheduler.queue_status().items():
        if name not in controller.scheduler.quotas.specs and name not in inventory.queue_errors:
            continue
        usage, borrowed = report["usage"], report["borrowed"]
        assert isinstance(usage, dict) and isinstance(borrowed, dict)
        error = inventory.queue_errors.get(name)
        active = error is None
        out[name] = {
            "pendingTasks": report["pending"],
            "admittedTasks": report["admitted"],
            "usage": [
                {"name": r, "total": _quantity(r, usage.get(r, 0)), "borrowed": _quantity(r, borrowed.get(r, 0))}
                for r in sorted(usage)
            ],
            "conditions": [
                {
                    "type": "Active",
                    "status": "True" if active else "False",
                    "reason": "Ready" if active else "InvalidSpec",
                    "message": "Can admit new tasks" if active else error,
                    "lastTransitionTime": now_rfc3339(),
                }
            ],
        }
    for name, error in inventory.queue_errors.items():
        out.setdefault(
            name,
            {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "False",
                        "reason": "InvalidSpec",
                        "message": error,
                        "lastTransitionTime": now_rfc3339(),
                    }
                ]
            },
        )
    return out


def _quantity(resource: str, amount: int) -> str:
    """A quota amount as a Kubernetes quantity: milli-GPU as ``1500m``, MiB as ``16384Mi``."""
    return f"{amount}m" if resource == "nvidia.com/gpu" else f"{amount}Mi"


def describe(placement: Placement) -> str:
    """``node-a GPUs [0, 1] (12288 MiB each)``-style summary."""
    mib = sorted({g.memory_mib for g in placement.gpus})
    each = f"{mib[0]} MiB each" if len(mib) == 1 else f"{mib} MiB"
    return f"{placement.node} GPUs {list(placement.indices)} ({each})"


class Executor:
    """Applies decisions and reports task state; owns no scheduling state of its own."""

    def __init__(self, client: KubeClient, controller: Controller, metrics: OperatorMetrics | None = None) -> None:
        self.client = client
        self.controller = controller
        self.metrics = metrics or OperatorMetrics()
        self.api_errors = 0
        self.conflicts = 0
        self._queue_reports: dict[str, dict[str, Any]] = {}
        self._limit = asyncio.Semaphore(CONCURRENCY)

    def _api_error(self) -> None:
        self.api_errors += 1
        self.metrics.api_errors.inc()

    async def apply(self, decisions: Iterable[Decision]) -> None:
        """Apply decisions: one task's in order (an Evict before its re-Admit), tasks concurrently."""
        per_task: dict[str, list[Decision]] = {}
        for decision in decisions:
            per_task.setdefault(decision.task.key, []).append(decision)
        await asyncio.gather(*(self._in_order(group) for group in per_task.values()))

    async def _in_order(self, group: list[Decision]) -> None:
        for decision in group:
            await self._guarded(decision)

    async def _guarded(self, decision: Decision) -> None:
        async with self._limit:
            if isinstance(decision, Admit):
                await self.admit(decision)
            elif isinstance(decision, Pending):
                await self.pending(decision)
            elif isinstance(decision, Evict):
                await self.evict(decision)
            elif isinstance(decision, Fail):
                await self.fail(decision)

    async def admit(self, decision: Admit) -> None:
        """Create the Job of an admission, then record it in the task's status."""
        key = decision.task.key
        record = self.controller.tasks.get(key)
        if record is None or record.deleting or record.uid is None:
            self.controller.scheduler.finish(key)
            return
        attempt = record.attempt + 1
        job = build_job(record.obj, decision.placement, attempt=attempt, queue=decision.task.queue)
        namespace = job["metadata"]["namespace"]
        try:
            await self.client.create(JOBS, job, namespace)
        except AlreadyExists:
            if not await self._ours(job, record.uid):
                # a Job of a deleted task of the same name, not yet garbage-collected: try again later
                log.info(
                    "Job %s/%s belongs to an earlier task of that name; requeued", namespace, job["metadata"]["name"]
                )
                self.controller.scheduler.requeue(key)
                return
            log.info("Job %s/%s exists already: taking it as created", namespace, job["metadata"]["name"])
        except ApiError as exc:
            self._api_error()
            log.warning("creating Job for %s failed (%s); requeued", key, exc)
            self.controller.scheduler.requeue(key)
            return
        if attempt == 1 and decision.task.created:
            self.metrics.latency.observe(max(0.0, time.time() - decision.task.created))
        record.attempt, record.job_name = attempt, job_name(record.obj["metadata"]["name"], attempt)
        record.placement, record.phase = decision.placement, ADMITTED
        where = describe(decision.placement)
        message = f"Admitted by GPUClusterQueue {decision.task.queue!r} on {where}"
        set_condition(record, "QuotaReserved", True, "QuotaReserved", f"quota reserved in {decision.task.queue!r}")
        set_condition(record, "Admitted", True, "Admitted", message)
        await self.patch_status(record, message=message)
        await self.event(record, "Normal", "Admitted", message)

    async def _ours(self, job: Mapping[str, Any], uid: str) -> bool:
        """Whether the existing Job of that name was made for the task with ``uid`` (409 = done)."""
        meta = job["metadata"]
        try:
            found = await self.client.get(JOBS, meta["name"], meta["namespace"])
        except ApiError:
            return False
        return bool((found["metadata"].get("annotations") or {}).get(TASK_UID_ANNOTATION) == uid)

    async def pending(self, decision: Pending) -> None:
        """Record why a task waits and post an Event for the new reason."""
        record = self.controller.tasks.get(decision.task.key)
        if record is None or record.phase != PENDING:
            return
        where = ""
        if decision.position >= 0:
            where = f" (position {decision.position} in GPUClusterQueue {decision.task.queue!r})"
        record.queue_position = decision.position if decision.position >= 0 else None
        set_condition(record, "QuotaReserved", False, decision.reason, decision.message + where)
        set_condition(record, "Admitted", False, decision.reason, decision.message + where)
        await self.patch_status(record, message=decision.message + where)
        if record.last_wait != (decision.reason, decision.message):  # a new reason, not just a new position
            record.last_wait = (decision.reason, decision.message)
            await self.event(record, "Normal", decision.reason, decision.message)

    async def evict(self, decision: Evict) -> None:
        """Delete an evicted task's Job and record the eviction; the task is already requeued.

        Preemption deletes in the foreground, so the Job disappears only after its pods have
        and the preemptor is admitted only then; failures delete in the background (the node
        may never answer).
        """
        key = decision.task.key
        if key.endswith("#terminating"):
            return
        record = self.controller.tasks.get(key)
        if record is None:
            return
        # Record the eviction before any await: the Job's DELETED event may be handled while the
        # delete call is in flight, and must not find the task still running on that Job.
        record.phase, record.placement = PENDING, None
        self.metrics.evictions.labels(decision.reason).inc()
        if decision.reason == "Preempted":
            self.metrics.preemptions.labels(decision.task.queue).inc()
        if decision.reason in ("NodeFailure", "GPUFailure"):
            record.reschedules += 1
            self.metrics.reschedules.inc()
        propagation = "Foreground" if decision.reason == "Preempted" else "Background"
        gone = await self.delete_job(record, propagation=propagation)
        if gone:
            self.controller.scheduler.victim_gone(key)
        set_condition(record, "Evicted", True, decision.reason, decision.message)
        set_condition(record, "Requeued", True, decision.reason, f"requeued after {decision.reason}")
        set_condition(record, "Admitted", False, decision.reason, decision.message)
        set_condition(record, "QuotaReserved", False, decision.reason, decision.message)
        await self.patch_status(record, message=decision.message)
        await self.event(record, "Warning", decision.reason, decision.message)

    async def fail(self, decision: Fail) -> None:
        """A task failed for good (MaxReschedulesExceeded): phase Failed, condition, Warning Event."""
        record = self.controller.tasks.get(decision.task.key)
        if record is None:
            return
        record.phase = FAILED
        set_condition(record, "Finished", True, decision.reason, decision.message)
        set_condition(record, "Requeued", False, decision.reason, decision.message)
        await self.patch_status(record, message=decision.message)
        await self.event(record, "Warning", decision.reason, decision.message)

    async def invalid(self, record: TaskRecord) -> None:
        """Report an invalid spec: phase Failed, condition Admitted=False with the reason, a Warning Event."""
        assert record.invalid is not None
        reason, message = record.invalid
        set_condition(record, "Admitted", False, reason, message)
        record.phase = FAILED  # the controller re-checks it when the spec changes
        await self.patch_status(record, message=message)
        await self.event(record, "Warning", reason, message)

    async def finished(self, record: TaskRecord, outcome: str) -> None:
        """Report a finished task (its Job completed or failed)."""
        message = f"Job {record.job_name} {'completed' if outcome == 'Succeeded' else 'failed'}"
        set_condition(record, "Finished", True, outcome, message)
        await self.patch_status(record, message=message)
        await self.event(record, "Normal" if outcome == "Succeeded" else "Warning", outcome, message)

    async def delete_job(self, record: TaskRecord, *, propagation: str = "Foreground") -> bool:
        """Delete a task's current Job; True when it was already gone."""
        if record.job_name is None:
            return True
        namespace = record.obj["metadata"].get("namespace") or "default"
        try:
            return not await self.client.delete(JOBS, record.job_name, namespace, propagation=propagation)
        except ApiError as exc:
            self._api_error()
            log.warning("deleting Job %s/%s failed: %s", namespace, record.job_name, exc)
            return False

    async def patch_status(self, record: TaskRecord, *, message: str) -> None:
        """Write the GPUTask status from the record, with optimistic concurrency.

        The patch carries the resourceVersion last seen; on 409 Conflict the object is read
        again (stopping if it was deleted or re-created under a new uid) and the write retried.
        """
        meta = record.obj["metadata"]
        status = {
            "phase": record.phase,
            "conditions": list(record.conditions.values()),
            "placement": placement_status(record.placement),
            "attempt": record.attempt,
            "reschedules": record.reschedules,
            "jobName": record.job_name,
            "priority": record.task.priority if record.task is not None else 0,
            "queuePosition": record.queue_position if record.phase == PENDING else None,
            "message": message,
        }
        name, namespace = meta["name"], meta.get("namespace")
        for _ in range(CONFLICT_RETRIES):
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status}
            try:
                stored = await self.client.patch(GPUTASKS, name, body, namespace, status=True)
            except Conflict:
                self.conflicts += 1
                if not await self._refresh(record):
                    return
                meta = record.obj["metadata"]
                continue
            except NotFound:
                log.debug("status patch of %s: the GPUTask is gone", record.key)  # deleted meanwhile
                return
            except ApiError as exc:
                self._api_error()
                log.warning("status patch of %s failed: %s", record.key, exc)
                return
            meta["resourceVersion"] = (stored.get("metadata") or {}).get("resourceVersion", meta.get("resourceVersion"))
            return
        log.warning("status patch of %s kept conflicting; the next change will write it", record.key)

    async def _refresh(self, record: TaskRecord) -> bool:
        """Re-read the GPUTask after a conflict; False when it is gone or is another object now."""
        meta = record.obj["metadata"]
        try:
            fresh = await self.client.get(GPUTASKS, meta["name"], meta.get("namespace"))
        except ApiError:
            return False
        if fresh["metadata"].get("uid") != record.uid:
            return False
        record.obj = fresh
        return True

    async def report_queues(self) -> None:
        """Patch each GPUClusterQueue's status when its counts or usage changed since the last write."""
        for name, status in queue_statuses(self.controller).items():
            seen = {**status, "conditions": [{**c, "lastTransitionTime": ""} for c in status["conditions"]]}
            if self._queue_reports.get(name) == seen:
                continue
            try:
                await self.client.patch(GPUCLUSTERQUEUES, name, {"status": status}, status=True)
            except ApiError as exc:
                if exc.status != 404:
                    self._api_error()
                    log.warning("status patch of GPUClusterQueue %s failed: %s", name, exc)
                continue
            self._queue_reports[name] = seen

    async def event(self, record: TaskRecord, etype: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about the task."""
        meta = record.obj["metadata"]
        namespace = meta.get("namespace") or "default"
        stamp = now_rfc3339()
        body: Mapping[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "gputask.io/v1alpha1",
                "kind": "GPUTask",
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": etype,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.client.create(EVENTS, body, namespace)
        except ApiError as exc:
            self._api_error()
            log.warning("event for %s failed: %s", record.key, exc)
