"""Our Jobs that leave the jobs informer's label selector: told from deleted ones, kept booked, labelled again.

The operator lists and watches its Jobs with the label selector ``gputask.io/task``. A real API server ends a
Job's life in such a watch in two ways that look alike: the Job was deleted, or it stopped matching the selector
(someone removed the label: kubectl, a GitOps tool pruning labels, a mutating webhook). Both arrive as DELETED
carrying the Job's last matching state, labels included (the watch cache sends "the previous object content, but
with the event's resource version": k8s.io/apiserver/pkg/storage/cacher, ``cacheWatcher.convertToWatchEvent``);
after a gap both are simply missing from the relisting, and after a restart from the rebuild's listing. Taking the
second for the first would free GPUs the Job's pods still run on: double-booking, and a second Job of the task.

So a Job with GPUs booked (:meth:`~gputask.k8s.controller.Controller.holds_gpus`) is never taken as gone on the
word of the watch or a listing: the server is asked (a GET by name, a quorum read). A 404, or an object of that
name with another uid, means it is gone, and it is released as before. Still there, it stays booked, and the label
is put back by a merge patch through the :class:`~gputask.k8s.writer.Writer` (fenced by leadership) that carries
the Job's ``metadata.uid`` as a precondition (another object of that name: 422 Invalid); the watch then sees it
ADDED again. A refused patch is tried again after a backoff (1 s doubling to 5 min) with nothing released
meanwhile; a 404 to it means the Job went while unlabelled (no watch would have said so). The task gets a Warning
Event ``JobLabelRestored`` once the label is back, and one ``JobLabelRemoved`` if putting it back was refused.

What this follows, and where it parts from client-go's controllers (k8s.io/kubernetes/pkg/controller/
controller_ref_manager.go, ``ClaimObject``, as the Job and ReplicaSet controllers claim their pods): ownership is
the controllerRef (an ownerReference with ``controller: true``; ours also carry the task's uid in the annotation
``gputask.io/task-uid``), not the label; an adoption or release is a patch carrying the dependent's uid, so that an
object deleted and re-created under the same name is never touched, and a 404 to it means there is nothing left to
do. Where a ReplicaSet *releases* a pod whose labels stopped matching (removes its controllerRef and makes a
replacement), gputask keeps the Job and restores the label: a released Job would go on running on GPUs the books
had freed. The selector only keeps the informer's watch narrow.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gputask.k8s.client import JOBS, ApiError, Fenced, NotFound, doubling_backoff_s
from gputask.k8s.controller import Controller
from gputask.k8s.jobrecords import JobRecord
from gputask.k8s.jobs import TASK_LABEL, TASK_UID_ANNOTATION
from gputask.k8s.names import fit_name
from gputask.k8s.writer import Writer

log = logging.getLogger("gputask.relabel")

RETRY_S = 1.0
RETRY_MAX_S = 300.0
CONCURRENCY = 16
LABEL_REMOVED = "JobLabelRemoved"
LABEL_RESTORED = "JobLabelRestored"

JobFeed = Callable[[dict[str, Any], bool], None]
"""Feeds one Job to the operator (the object, deleted?): :meth:`~gputask.k8s.handlers.Operator.job_event`."""


@dataclass(slots=True)
class Lost:
    """A booked Job out of the label selector (``found``: a GET saw it without the label), or in doubt (not
    ``found``: its DELETED or its absence from a listing is still to be confirmed)."""

    job: JobRecord
    obj: Mapping[str, Any] | None = None  # the latest state seen (the DELETED's, the GET's)
    found: bool = False
    failures: int = 0
    retry_at: float = 0.0  # monotonic seconds
    said: bool = False  # the Warning for a refused patch was posted


def labelled(obj: Mapping[str, Any]) -> bool:
    """True when ``obj`` carries the task label (it is in the jobs informer's selector)."""
    return TASK_LABEL in ((obj.get("metadata") or {}).get("labels") or {})


def ours(obj: Mapping[str, Any]) -> bool:
    """True when ``obj`` is a Job gputask made: it carries the task-uid annotation."""
    return bool(((obj.get("metadata") or {}).get("annotations") or {}).get(TASK_UID_ANNOTATION))


def backoff_s(failures: int) -> float:
    """Seconds before the next try after ``failures`` in a row: 1 s doubling, at most 5 min."""
    return doubling_backoff_s(failures, RETRY_S, RETRY_MAX_S)


class Relabeler:
    """Confirms doubtful Job deletions and puts the task label back on our Jobs that lost it.

    The watch feed calls :meth:`doubt` and :meth:`drop` with the core ``gate`` held, then :meth:`settle` without
    it; the scheduling loop calls :meth:`settle` every pass, which retries what is due. ``feed`` gives the operator
    what was learned (a Job gone, or its current state), with the gate held.
    """

    def __init__(
        self, controller: Controller, writer: Writer, *, gate: asyncio.Lock | None = None, feed: JobFeed | None = None
    ) -> None:
        self.controller = controller
        self.writer = writer
        self.gate = gate or asyncio.Lock()
        self.feed = feed or self._feed_controller
        self.lost: dict[str, Lost] = {}  # Job key -> what is to be done about it
        self.restored = 0  # labels put back
        self._busy = asyncio.Lock()
        self._limit = asyncio.Semaphore(CONCURRENCY)

    def _feed_controller(self, obj: dict[str, Any], deleted: bool) -> None:
        if deleted:
            self.controller.on_job_deleted(obj)
        else:
            self.controller.on_job(obj)

    def reset(self) -> None:
        """Forget everything (before a rebuild, which finds again what is owed)."""
        self.lost.clear()

    def doubt(self, job: JobRecord, obj: Mapping[str, Any] | None = None) -> None:
        """(gate held) A booked Job's DELETED (``obj``), or its absence from a relisting: to be confirmed with the
        server before anything is released."""
        lost = self.lost.setdefault(job.key, Lost(job))
        if obj is not None:
            lost.obj = obj

    def found(self, obj: Mapping[str, Any]) -> None:
        """(gate held) A Job of ours the rebuild found by name outside the selector: its label is to be put back."""
        job = self.controller.jobs.get(f"{obj['metadata'].get('namespace') or 'default'}/{obj['metadata']['name']}")
        if job is not None:
            self.lost[job.key] = Lost(job, obj, found=True)

    def drop(self, job_key: str) -> None:
        """(gate held) The Job is in the selector again, or is forgotten: nothing to confirm or restore."""
        self.lost.pop(job_key, None)

    async def settle(self) -> None:
        """Confirm the doubts and put back the labels that are due, concurrently (at most 16 requests at once)."""
        async with self._busy:
            now = time.monotonic()
            due = [lost for lost in self.lost.values() if lost.retry_at <= now]
            await asyncio.gather(*(self._settle(lost) for lost in due))

    async def _settle(self, lost: Lost) -> None:
        async with self._limit:
            try:
                if not lost.found and not await self._confirm(lost):
                    return
                patched = await self.writer.patch(JOBS, lost.job.name, self._patch(lost), lost.job.namespace)
            except Fenced:
                self._again(lost)  # the next leader's rebuild finds the Job
            except ApiError as exc:
                await self._refused(lost, exc)
            else:
                if labelled(patched):
                    await self._restored(lost, patched)
                else:
                    await self._refused(lost, ApiError(200, "LabelRemovedAgain",
                                                       "the patched Job came back without the label"))

    async def _confirm(self, lost: Lost) -> bool:
        """Ask the server about a doubtful Job: True when it is there without the label (to be labelled again);
        False when that is settled otherwise (gone: released; labelled: the watch brings it)."""
        try:
            current = await self.writer.client.get(JOBS, lost.job.name, lost.job.namespace)
        except NotFound:
            current = None
        if current is not None and lost.job.uid and current["metadata"].get("uid") != lost.job.uid:
            current = None  # another Job of that name: ours is gone
        async with self.gate:
            if self.lost.get(lost.job.key) is not lost:
                return False  # seen again in the selector meanwhile
            if current is None:
                self._gone(lost)
                return False
            self.feed(current, False)  # its state now (it may have finished while unlabelled)
            if labelled(current):
                del self.lost[lost.job.key]
                return False
            lost.obj, lost.found = current, True
        log.warning("Job %s lost its label %s but still exists: it keeps its GPUs and the label is put back",
                    lost.job.key, TASK_LABEL)
        return True

    def _gone(self, lost: Lost) -> None:
        """(gate held) The Job no longer exists: release it as its deletion."""
        del self.lost[lost.job.key]
        job = lost.job
        obj = dict(lost.obj or {"metadata": {"name": job.name, "namespace": job.namespace,
                                             "annotations": {TASK_UID_ANNOTATION: job.task_uid}}})
        self.feed(obj, True)

    def _patch(self, lost: Lost) -> dict[str, Any]:
        """The merge patch that puts the label back, with the Job's uid as a precondition."""
        meta: dict[str, Any] = {"labels": {TASK_LABEL: self._label_value(lost)}}
        if lost.job.uid:
            meta["uid"] = lost.job.uid
        return {"metadata": meta}

    def _label_value(self, lost: Lost) -> str:
        """The value the label had: the DELETED's, else the pod template's (our Jobs label their pods alike), else
        the task's name fitted to 63 characters."""
        obj = lost.obj or {}
        template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
        for labels in ((obj.get("metadata") or {}).get("labels") or {}, template.get("labels") or {}):
            if labels.get(TASK_LABEL):
                return str(labels[TASK_LABEL])
        owners = [r.get("name") for r in (obj.get("metadata") or {}).get("ownerReferences") or []
                  if r.get("kind") == "GPUTask" and r.get("name")]
        record = self.controller.record_by_uid(lost.job.task_uid)
        name = owners[0] if owners else record.key.split("/", 1)[-1] if record is not None else lost.job.name
        return fit_name(str(name))

    async def _refused(self, lost: Lost, exc: ApiError) -> None:
        """A refused GET or patch: a 404 (or a 422 for another object of that name) means the Job is gone;
        anything else is tried again after the backoff, nothing released; the first refused patch is said in a
        Warning Event."""
        if isinstance(exc, NotFound) or (lost.found and exc.status == 422 and not await self._exists(lost)):
            async with self.gate:
                if self.lost.get(lost.job.key) is lost:
                    self._gone(lost)
            return
        self._again(lost)
        wait = backoff_s(lost.failures)
        log.warning("Job %s: %s its label %s failed (%s); again in %gs, its GPUs kept", lost.job.key,
                    "putting back" if lost.found else "checking before releasing", TASK_LABEL, exc, wait)
        if lost.found and not lost.said:
            lost.said = True
            message = (f"label {TASK_LABEL} was removed from Job {lost.job.name}, which still runs on its GPUs (kept "
                       f"reserved); putting it back was refused ({exc.status} {exc.reason}: {exc.message}); "
                       f"retried in {wait:g}s")
            await self._event(lost.job, LABEL_REMOVED, message)

    async def _exists(self, lost: Lost) -> bool:
        """True unless a GET finds no Job of that name and uid (a GET that fails counts as existing)."""
        try:
            current = await self.writer.client.get(JOBS, lost.job.name, lost.job.namespace)
        except NotFound:
            return False
        except ApiError:
            return True
        return not lost.job.uid or current["metadata"].get("uid") == lost.job.uid

    def _again(self, lost: Lost) -> None:
        lost.failures += 1
        lost.retry_at = time.monotonic() + backoff_s(lost.failures)

    async def _restored(self, lost: Lost, patched: dict[str, Any]) -> None:
        async with self.gate:
            if self.lost.get(lost.job.key) is lost:
                del self.lost[lost.job.key]
            self.feed(patched, False)
        self.restored += 1
        log.info("Job %s has its label %s again", lost.job.key, TASK_LABEL)
        message = (f"label {TASK_LABEL} was removed from Job {lost.job.name} while it held its GPUs; restored (the Job "
                   "keeps its GPUs; without the label gputask would lose sight of it)")
        await self._event(lost.job, LABEL_RESTORED, message)

    async def _event(self, job: JobRecord, reason: str, message: str) -> None:
        """A Warning Event on the Job's task, or on the Job when its task is gone."""
        record = self.controller.record_by_uid(job.task_uid)
        involved = record.involved() if record is not None else {
            "apiVersion": "batch/v1", "kind": "Job", "name": job.name, "namespace": job.namespace, "uid": job.uid}
        await self.writer.event(involved, "Warning", reason, message)


__all__ = ["LABEL_REMOVED", "LABEL_RESTORED", "Relabeler", "labelled", "ours"]
