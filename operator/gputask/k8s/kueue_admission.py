"""Kueue mode (``queueing: kueue``): Kueue owns quota and admission, gputask places on devices.

1. Every valid GPUTask gets its Job at once (:func:`build_kueue_job`): suspended, labelled
   ``kueue.x-k8s.io/queue-name`` with the task's queue (a Kueue LocalQueue), with no node
   affinity; each container's ``NVIDIA_VISIBLE_DEVICES`` comes from the pod annotation
   ``gputask.io/visible-devices`` through the downward API (``void`` with ``pinning: cdi``), and a shared
   task's memory budget from ``gputask.io/gpu-memory-mib`` (and ``gputask.io/mps-pinned-device-mem-limit``).
2. Kueue creates a Workload for the Job and reserves quota in a ClusterQueue that lists the
   AdmissionCheck ``gputask-placement`` (controllerName ``gputask.io/placement``), which gputask
   creates and marks Active at start.
3. For each such Workload with quota reserved and the check Pending, gputask finds a placement
   with the core on its cluster state, reserves it under the task's key (so it is never
   double-booked), and answers the check: Ready with ``podSetUpdates`` (a hostname
   nodeSelector and the annotations ``gputask.io/placement``, ``gputask.io/visible-devices`` or the CDI
   annotation ``cdi.k8s.io/gputask``, and the budget's: :func:`~gputask.k8s.kueue_api.pod_set_annotations`),
   or Retry with the reason when no GPU has room (Kueue releases the quota and requeues the
   Workload; its check comes back Pending and is answered again).
4. Kueue merges the podSetUpdates into the Job's pod template and unsuspends it.

The reservation is released when the Workload is evicted, finishes or is deleted. After a
restart, reservations come back from the Workloads whose check is Ready (their placement is in
the podSetUpdates), so the API stays the only durable state.

The Kueue fields used are listed in :mod:`gputask.k8s.kueue_api`. ``status.admissionChecks``
is a list keyed by name, but a JSON merge patch replaces lists whole: each write sends the whole
list as read, with its resourceVersion, and a 409 Conflict reads it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from gputask.core import OverCommitError, Placement, TaskKey
from gputask.core.reasons import explain
from gputask.k8s import records
from gputask.k8s.client import ADMISSIONCHECKS, JOBS, WORKLOADS, AlreadyExists, ApiError, Conflict, KubeApi, NotFound
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor
from gputask.k8s.kueue_api import (
    CHECK_NAME,
    CHECK_PENDING,
    CHECK_READY,
    CHECK_RETRY,
    CONTROLLER_NAME,
    HOSTNAME_LABEL,
    admission_check,
    check_answer,
    check_state,
    condition,
    condition_true,
    owner_job,
    pod_set_annotations,
    pod_set_name,
    quota_reserved,
    ready_placement,
    workload_key,
)
from gputask.k8s.tasks import ADMITTED, FINISHED_PHASES, PLACED_PHASES, RUNNING, TaskRecord, describe
from gputask.k8s.workload import owner_uid, workload_of
from gputask.k8s.writer import now_rfc3339

log = logging.getLogger("gputask.kueue")

WAITING = "WaitingForKueue"
REGISTER_RETRY_S = 30.0
WRITE_RETRIES = 5


class KueueAdmission:
    """gputask as Kueue's AdmissionCheck controller: emits suspended Jobs and answers placement checks."""

    def __init__(self, client: KubeApi, controller: Controller, executor: Executor, gate: asyncio.Lock) -> None:
        self.client = client
        self.controller = controller
        self.executor = executor
        self.writer = executor.writer
        self.gate = gate
        self.workloads: dict[str, dict[str, Any]] = {}  # Workloads owned by Jobs, by namespace/name
        self.held: dict[str, TaskKey] = {}  # Workload key -> task key reserved for it
        self.registered = False
        self._register_at = float("-inf")
        # a pass looks at what events touched (issue 17: no pass over every task and Workload per wake)
        self._everything_due = True  # after a rebuild
        self.due_tasks: set[TaskKey] = set()  # tasks whose Job may have to be made, adopted or finished
        self.due_workloads: set[str] = set()  # Workloads to release or answer
        self._of_job: dict[str, set[str]] = {}  # owner Job key -> its Workloads (an answer waits for the Job)

    # -- inputs -----------------------------------------------------------------------------------
    def on_workload(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a Workload owned by a Job (releases happen in :meth:`sync`); it is due for the next pass."""
        key, job = workload_key(obj), owner_job(obj)
        if job is not None:
            owned = self._of_job.setdefault(job, set())
            owned.discard(key) if deleted else owned.add(key)
        if deleted or job is None:
            self.workloads.pop(key, None)
        else:
            self.workloads[key] = dict(obj)
        self.due_workloads.add(key)

    def note_task(self, key: TaskKey) -> None:
        """A task changed: its Job is looked at in the next pass."""
        self.due_tasks.add(key)

    def on_job(self, obj: Mapping[str, Any]) -> None:
        """One of our Jobs changed: its task and the Workloads it owns are due (an answer may have waited for it)."""
        meta = obj.get("metadata") or {}
        record = self.controller.record_by_uid(str(owner_uid(obj)))
        if record is not None:
            self.due_tasks.add(record.key)
        self.due_workloads |= self._of_job.get(f"{meta.get('namespace') or 'default'}/{meta.get('name')}", set())

    async def rebuild(self, workloads: list[dict[str, Any]]) -> None:
        """Re-reserve the placements of Workloads whose check is Ready; then register the check."""
        self.workloads, self.held, self._of_job = {}, {}, {}
        self._everything_due = True
        for wl in workloads:
            self.on_workload(wl)
        for key, wl in sorted(self.workloads.items()):
            placement = ready_placement(wl)
            record = self._record_of(wl)
            if placement is None or record is None or record.task is None or not quota_reserved(wl):
                continue
            if not all(map(self.controller.scheduler.cluster.has_node, placement.nodes)):
                continue  # its node is gone: Kueue's node-failure handling evicts it
            self.controller.scheduler.restore(record.task, placement, time.time(), charge=False)
            self.held[key] = record.key
            records.placed_again(record, placement, RUNNING if (record.obj.get("status") or {}).get("phase") == RUNNING
                                 else ADMITTED)
        await self.register()

    # -- the AdmissionCheck -----------------------------------------------------------------------
    async def register(self) -> None:
        """Make sure the AdmissionCheck ``gputask-placement`` exists and is Active."""
        self._register_at = time.monotonic()
        try:
            current = await self._admission_check()
        except ApiError as exc:
            log.warning("cannot register the Kueue AdmissionCheck %s (is Kueue installed?): %s", CHECK_NAME, exc)
            return
        owner = (current.get("spec") or {}).get("controllerName")
        if owner != CONTROLLER_NAME:
            log.error(
                "AdmissionCheck %s has controllerName %r, not %r: not answering it", CHECK_NAME, owner, CONTROLLER_NAME
            )
            return
        conditions = [c for c in (current.get("status") or {}).get("conditions") or [] if c.get("type") != "Active"]
        active = {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": "gputask places admitted Workloads on GPUs",
            "lastTransitionTime": now_rfc3339(),
            "observedGeneration": (current.get("metadata") or {}).get("generation", 1),
        }
        old: Mapping[str, Any] = next(
            (c for c in (current.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), {}
        )
        if old.get("status") != "True":
            try:
                await self.writer.patch(
                    ADMISSIONCHECKS, CHECK_NAME, {"status": {"conditions": [*conditions, active]}}, status=True
                )
            except ApiError as exc:
                log.warning("marking AdmissionCheck %s Active failed: %s", CHECK_NAME, exc)
                return
        self.registered = True

    async def _admission_check(self) -> dict[str, Any]:
        try:
            return await self.client.get(ADMISSIONCHECKS, CHECK_NAME)
        except NotFound:
            pass
        try:
            return await self.writer.create(ADMISSIONCHECKS, admission_check())
        except AlreadyExists:
            return await self.client.get(ADMISSIONCHECKS, CHECK_NAME)

    # -- the pass ---------------------------------------------------------------------------------
    async def sync(self) -> None:
        """Register if needed, emit missing Jobs, release what ended, answer Pending checks: for the tasks and
        Workloads events touched since the last pass (every one after a rebuild); what could not be settled
        (a Job not seen yet, a create refused) stays due."""
        if not self.registered and time.monotonic() - self._register_at > REGISTER_RETRY_S:
            await self.register()
        tasks, self.due_tasks = self.due_tasks, set()
        workloads, self.due_workloads = self.due_workloads, set()
        if self._everything_due:
            self._everything_due = False
            tasks, workloads = set(self.controller.tasks), set(self.workloads) | set(self.held)
        for key in sorted(tasks):
            record = self.controller.tasks.get(key)
            if record is not None and not await self._ensure_job(record):
                self.due_tasks.add(key)
        for key in sorted(workloads & set(self.held)):
            wl = self.workloads.get(key)
            if (
                wl is None
                or not quota_reserved(wl)
                or (check_state(wl) or {}).get("state") not in (CHECK_PENDING, CHECK_READY)
            ):
                await self._release(key, wl)
        for key in sorted(workloads):
            wl = self.workloads.get(key)
            pending = wl is not None and quota_reserved(wl) and (check_state(wl) or {}).get("state") == CHECK_PENDING
            if wl is not None and pending and not await self._answer(key, wl):
                self.due_workloads.add(key)

    async def _ensure_job(self, record: TaskRecord) -> bool:
        """Emit the suspended Job of a valid, unfinished task that has none; adopt the one it has. False when the
        create failed (the next pass tries again)."""
        controller = self.controller
        if record.task is None or record.deleting or record.phase in FINISHED_PHASES:
            return True
        namespace = record.obj["metadata"].get("namespace") or "default"
        job = controller.jobs.get(f"{namespace}/{record.job_name}") if record.job_name else None
        if job is None or job.terminating:
            job = controller.job_of(record)
        if job is not None:
            records.with_job(record, job.name, job.attempt)
            if job.outcome is not None:
                async with self.gate:
                    controller.scheduler.finish(record.key)
                await self.executor.transitions.finished(record, job.outcome)
            return True
        attempt = record.attempt + 1
        body = workload_of(record).suspended_job(attempt=attempt, queue=record.task.queue,
                                                 pinning=self.executor.pinning, request=record.task.request)
        namespace = body["metadata"]["namespace"]
        try:
            created = await self.writer.create(JOBS, body, namespace)
        except AlreadyExists:
            created = body
        except ApiError as exc:
            log.warning("creating the Job of %s failed (%s); retried next pass", record.key, exc)
            return False
        async with self.gate:
            controller.on_job(created)
        records.kueue_job(record, body["metadata"]["name"], attempt)
        message = (
            f"Job {record.job_name} waits suspended until Kueue admits it through LocalQueue {record.task.queue!r}"
        )
        await self.executor.transitions.waiting(record, WAITING, message)
        return True

    async def _answer(self, key: str, wl: dict[str, Any]) -> bool:
        """Place a reserved Workload's task and answer Ready, or Retry when nothing fits. False when it could not
        be answered yet (its Job not seen, its task not converted, a reservation refused): the next pass looks
        again."""
        record = self._record_of(wl)
        if record is None:
            return True  # not ours, or its Job is not seen yet (the Job's event makes this Workload due again)
        if record.task is None:
            return False  # its task cannot be placed yet: the next pass looks again
        scheduler = self.controller.scheduler
        for other in [k for k in self._held_for(record.key) if k != key]:
            await self._release(other, self.workloads.get(other))
        async with self.gate:
            placement = scheduler.placement_of(record.key) if self.held.get(key) == record.key else None
            refusal = None
            if placement is None:
                outcome = scheduler.place(record.task)
                placement = outcome.placement
                if placement is None:
                    refusal = explain(record.task, outcome, scheduler.quotas, scheduler.cluster)
                else:
                    try:
                        scheduler.admit_placed(record.task, placement, time.time())
                    except OverCommitError as exc:  # held by something not tracked here: look again later
                        log.warning("reserving %s for Workload %s failed: %s", record.key, key, exc)
                        return False
                    self.held[key] = record.key
        if refusal is not None:
            await self._retry(key, wl, record, refusal.reason, refusal.message)
            return True
        assert placement is not None
        message = f"placed on {describe(placement)}"
        answer = check_answer(check_state(wl), CHECK_READY, message, [self._pod_set_update(wl, placement)])
        if await self._write(key, wl, answer) is None:
            await self._release(key, None)
            return True
        await self._admitted(record, wl, placement)
        return True

    def _held_for(self, task: TaskKey) -> list[str]:
        """The Workloads holding a reservation for ``task``: of its Jobs' Workloads (no pass over every one held)."""
        record = self.controller.tasks.get(task)
        jobs = self.controller.jobs_of_task.get(record.uid, {}) if record is not None else {}
        return sorted(w for job in jobs for w in self._of_job.get(job, set()) if self.held.get(w) == task)

    def _pod_set_update(self, wl: Mapping[str, Any], placement: Placement) -> dict[str, Any]:
        pod = placement.only()  # a GPUTask's Job: one pod, one podSetUpdate
        node = self.controller.inventory.nodes.get(pod.node) or {}
        hostname = ((node.get("metadata") or {}).get("labels") or {}).get(HOSTNAME_LABEL, pod.node)
        record = self._record_of(wl)
        request = record.task.request if record is not None and record.task is not None else None
        return {
            "name": pod_set_name(wl),
            "nodeSelector": {HOSTNAME_LABEL: hostname},
            "annotations": pod_set_annotations(placement, self.executor.pinning, request),
        }

    async def _admitted(self, record: TaskRecord, wl: Mapping[str, Any], placement: Placement) -> None:
        if record.placement == placement and record.phase in PLACED_PHASES:
            return
        queue = str(((wl.get("status") or {}).get("admission") or {}).get("clusterQueue") or "")
        message = f"Kueue reserved quota in ClusterQueue {queue!r}; gputask placed it on {describe(placement)}"
        await self.executor.transitions.admitted(
            record, placement, job_name=record.job_name, attempt=record.attempt,
            quota=f"quota reserved by Kueue in ClusterQueue {queue!r}", message=message,
        )

    async def _retry(self, key: str, wl: dict[str, Any], record: TaskRecord, reason: str, why: str) -> None:
        message = f"{why}; Kueue requeues the Workload and asks again"
        if await self._write(key, wl, check_answer(check_state(wl), CHECK_RETRY, message)) is None:
            return
        old = record.conditions.get("Admitted") or {}
        if (old.get("reason"), old.get("message")) == (reason, message):
            return
        await self.executor.transitions.waiting(record, reason, message)

    async def _release(self, key: str, wl: Mapping[str, Any] | None) -> None:
        """Give back a Workload's GPUs; report an eviction when the Workload was evicted while placed."""
        task_key = self.held.pop(key, None)
        if task_key is None:
            return
        async with self.gate:
            self.controller.scheduler.finish(task_key)
        record = self.controller.tasks.get(task_key)
        if wl is None or record is None or condition_true(wl, "Finished") or record.phase not in PLACED_PHASES:
            return
        evicted = condition(wl, "Evicted") or {}
        reason = str(evicted.get("reason") or "QuotaReleased") if evicted.get("status") == "True" else "QuotaReleased"
        message = str(evicted.get("message") or f"Kueue released the quota of Workload {key}")
        job_name = record.job_name  # Kueue keeps the Job (suspended again): it stays the task's
        await self.executor.transitions.evicted(record, reason, message)
        records.with_job(record, job_name, record.attempt)

    async def _write(self, key: str, wl: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any] | None:
        """Write our admissionChecks entry (optimistic concurrency); the stored Workload, or None."""
        meta = wl["metadata"]
        for _ in range(WRITE_RETRIES):
            checks = [
                answer if c.get("name") == CHECK_NAME else c
                for c in (wl.get("status") or {}).get("admissionChecks") or []
            ]
            if check_state(wl) is None:
                checks.append(answer)
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": {"admissionChecks": checks}}
            try:
                stored = await self.writer.patch(WORKLOADS, meta["name"], body, meta.get("namespace"), status=True)
            except Conflict:
                try:
                    wl = await self.client.get(WORKLOADS, meta["name"], meta.get("namespace"))
                except ApiError:
                    return None
                meta = wl["metadata"]
                if not quota_reserved(wl) or (check_state(wl) or {}).get("state") != CHECK_PENDING:
                    self.workloads[key] = wl
                    return None
                continue
            except ApiError as exc:
                log.warning("answering the admission check of Workload %s failed: %s", key, exc)
                return None
            self.workloads[key] = stored
            return stored
        return None

    def _record_of(self, wl: Mapping[str, Any]) -> TaskRecord | None:
        """The task whose Job owns the Workload, or None."""
        job_key = owner_job(wl)
        job = self.controller.jobs.get(job_key) if job_key else None
        if job is None or job.terminating:
            return None  # not ours, not seen yet, or an old attempt on its way out
        return self.controller.record_by_uid(job.task_uid)
