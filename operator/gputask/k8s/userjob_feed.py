"""The labelled Jobs' feed (issue 31): each batch/v1 Job carrying ``gputask.io/queue-name`` that gputask admits
(:func:`~gputask.k8s.userjobs.opted_in`) gets its workload object, stays suspended until admitted, and gives its GPUs
back once it is suspended again.

For each such Job event:

- a Job not suspended that gputask has not admitted (created without the webhook, or while it was off) is suspended
  (``spec.suspend: true``) with a Warning Event ``SuspendedOnSight`` on the Job saying its pods may have started;
- a Job gputask cannot run (:func:`~gputask.k8s.userjobs.refusal`: several pods at once, dra pinning, a container
  still requesting ``nvidia.com/gpu``, no GPU) stays suspended with a Warning Event ``NotAdmissible`` (once per Job
  and reason);
- otherwise its GPUTask (:func:`~gputask.k8s.userjobs.workload_task`, owned by the Job) is created when it has none;
  the GPUTask is queued, placed and admitted like any other, and its workload
  (:class:`~gputask.k8s.userjobs.UserJobWorkload`) writes the placement into the Job;
- a Job gputask stopped (suspended, its admission annotations removed) with no active pod is gone as far as the
  books go: :meth:`~gputask.k8s.controller.Controller.on_job_deleted` ends the hold of its GPUs (still held while a
  pod of it stays bound to a node, :mod:`gputask.k8s.lingering`).

While admitted the Job carries the task label, so the Jobs informer (:class:`~gputask.k8s.feeds.JobFeed`) and the
pods informer see it and its pods as they see the Jobs gputask makes: running, completion and deletion go the usual
way. The feed decides nothing about scheduling; its writes (the suspension, the GPUTask, the Events) go through the
:class:`~gputask.k8s.writer.Writer` once the gate is released.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gputask.core.model import task_key
from gputask.k8s.client import GPUTASKS, AlreadyExists, ApiError, Fenced, Listed
from gputask.k8s.feeds import Feed, Host, job_key
from gputask.k8s.jobrecords import job_outcome
from gputask.k8s.jobs import TASK_UID_ANNOTATION
from gputask.k8s.tasks import PLACED_PHASES
from gputask.k8s.userjobs import opted_in, refusal, suspend, task_name, workload_task

log = logging.getLogger("gputask.userjobs")

SUSPENDED_ON_SIGHT = "SuspendedOnSight"
NOT_ADMISSIBLE = "NotAdmissible"


def suspended(job: dict[str, Any]) -> bool:
    """True when the Job's ``spec.suspend`` is true."""
    return bool((job.get("spec") or {}).get("suspend"))


def admitted(job: dict[str, Any]) -> bool:
    """True while gputask's admission is written in the Job (its task-uid annotation)."""
    return bool(((job.get("metadata") or {}).get("annotations") or {}).get(TASK_UID_ANNOTATION))


def involved(job: dict[str, Any]) -> dict[str, Any]:
    """The Job as an Event's ``involvedObject``."""
    meta = job["metadata"]
    return {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
            "namespace": meta.get("namespace") or "default", "uid": meta.get("uid")}


class UserJobFeed(Feed):
    """The labelled Jobs' informer sink (see the module's docstring)."""

    def __init__(self, operator: Host) -> None:
        super().__init__(operator)
        self.said: dict[str, str] = {}  # Job uid -> the refusal said in its NotAdmissible Event
        self.asked: set[str] = set()  # Job uids whose GPUTask was created by this instance

    def seed(self, items: Iterable[dict[str, Any]]) -> None:
        """Nothing to keep: each listed Job is fed again by the informer's first listing."""

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the Jobs of the events in order (a DELETED needs nothing here: the GPUTask goes with the Job by
        garbage collection, and the Jobs informer sees the Job go)."""
        await self._take([e["object"] for e in events if e["type"] != "DELETED"])

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed Job fed again."""
        await self._take(list(listed.items))

    def _mine(self, job: dict[str, Any]) -> bool:
        config = self.operator.controller.config
        return opted_in(job, excluded=config.user_jobs.exclude_namespaces, queueing=config.queueing)

    async def _take(self, jobs: list[dict[str, Any]]) -> None:
        op = self.operator
        if not op.leading:
            return
        mine = [job for job in jobs if self._mine(job)]
        if not mine:
            return
        todo = []
        async with op.gate:
            for job in mine:
                self._release_if_stopped(job)
                todo.append((job, self._has_task(job)))
        op.loop.wake()
        for job, has_task in todo:
            try:
                await self._settle(job, has_task)
            except Fenced:
                return  # not leading: the next leader sees every labelled Job again
            except ApiError as exc:
                log.warning("Job %s: %s", job_key(job), exc)  # its next event (or the next listing) tries again

    def _release_if_stopped(self, job: dict[str, Any]) -> None:
        """The gate held: a Job gputask stopped (suspended, no admission) with no active pod gives back its hold."""
        controller, key = self.operator.controller, job_key(job)
        if not suspended(job) or admitted(job) or (job.get("status") or {}).get("active") or key not in \
                controller.jobs:
            return
        known = controller.jobs[key]
        record = controller.by_uid.get(known.task_uid)
        if record is not None and record.job_name == known.name and record.phase in PLACED_PHASES and \
                record.attempt > known.attempt:
            return  # admitted again meanwhile: its admission took over the Job
        controller.on_job_deleted(job)

    def _has_task(self, job: dict[str, Any]) -> bool:
        meta = job["metadata"]
        record = self.operator.controller.tasks.get(task_key(meta.get("namespace") or "default",
                                                             task_name(meta["name"])))
        return record is not None or meta.get("uid") in self.asked

    async def _settle(self, job: dict[str, Any], has_task: bool) -> None:
        """The writes one Job's event calls for (the gate released)."""
        writer, meta = self.operator.executor.writer, job["metadata"]
        name, namespace, uid = meta["name"], meta.get("namespace") or "default", str(meta.get("uid") or "")
        if job_outcome(job) is not None and not admitted(job):
            return  # ended before gputask admitted it (it ran unsuspended): nothing to queue
        if not suspended(job) and not admitted(job):
            await suspend(writer, name, namespace, _suspend, restore_template=False)  # startTime cleared too
            await writer.event(involved(job), "Warning", SUSPENDED_ON_SIGHT,
                               "gputask suspended this Job when it saw it: it was not created suspended (the "
                               "admission webhook was off or bypassed), so its pods may have started before; they "
                               "are removed, and it runs once gputask admits it")
        why = refusal(job, self.operator.executor.pinning)
        if why is not None:
            if self.said.get(uid) != why:
                self.said[uid] = why
                await writer.event(involved(job), "Warning", NOT_ADMISSIBLE, f"gputask cannot admit this Job: {why}")
            return
        if has_task:
            return
        self.asked.add(uid)
        try:
            await writer.create(GPUTASKS, workload_task(job), namespace)
        except AlreadyExists:
            pass
        except ApiError:
            self.asked.discard(uid)
            raise


def _suspend(job: dict[str, Any]) -> dict[str, Any]:
    job.setdefault("spec", {})["suspend"] = True
    return job


__all__ = ["NOT_ADMISSIBLE", "SUSPENDED_ON_SIGHT", "UserJobFeed", "admitted", "suspended"]
