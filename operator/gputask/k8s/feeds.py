"""The informers' feeds: each watched kind's events into the controller (or the Kueue support), a batch per gate and
wake of the scheduling loop.

Every kind the operator watches comes through an :class:`~gputask.k8s.informer.Informer` into one of these sinks:

- :class:`TaskFeed`, :class:`JobFeed`, :class:`TaskPodFeed`, :class:`ForeignPodFeed`: GPUTasks, our Jobs, the pods
  of our Jobs and foreign pods, each with what a relisting after a gap must do for that kind (the controller's
  records are what is known);
- :class:`KindFeed`: every other kind (Nodes, GPUNodes, GPUClusterQueues, GPULocalQueues, GPUResourceFlavors,
  PriorityClasses, Namespaces, Kueue's WorkloadPriorityClasses, LocalQueues and Workloads), one callback per object,
  and the last state of each object kept (client-go's informer store), so a relisting deletes what it lacks.

Feeds never decide and never write: each takes the core gate (the cycle runs on a worker thread while it is held)
around its synchronous feeding, and wakes the loop, which publishes what they queued. They feed only while the
operator leads: a standby drops every event, as a new leader's rebuild lists everything before its first cycle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from gputask.core.model import TaskKey, task_key
from gputask.k8s.client import Listed
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor
from gputask.k8s.jobs import TASK_UID_ANNOTATION
from gputask.k8s.kueue import KueueSupport
from gputask.k8s.loop import SchedulingLoop

Take = Callable[[dict[str, Any], bool, float], None]
"""What a :class:`KindFeed` does with one object: ``take(obj, deleted, now)`` (now in seconds since the epoch)."""


class Host(Protocol):
    """What the feeds feed: the operator (:class:`~gputask.k8s.handlers.Operator`)."""

    leading: bool
    gate: asyncio.Lock
    controller: Controller
    executor: Executor
    loop: SchedulingLoop
    kueue: KueueSupport

    def task_event(self, obj: dict[str, Any], *, deleted: bool) -> TaskKey | None:
        """A GPUTask added, changed or deleted (the gate held); its key, None for the echo of our status write."""
        ...

    def job_event(self, obj: dict[str, Any], *, deleted: bool) -> None:
        """One of our Jobs added, changed or deleted (the gate held)."""
        ...


class Feed:
    """What the feeds share: the operator they feed (only while it leads)."""

    def __init__(self, operator: Host) -> None:
        self.operator = operator

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Events (ADDED, MODIFIED, DELETED; each with ``object``) in the order the server sent them."""
        raise NotImplementedError

    async def replace(self, listed: Listed) -> None:
        """A new listing after a gap: everything that exists now (what is not in it is gone)."""
        raise NotImplementedError

    def seed(self, items: Iterable[dict[str, Any]]) -> None:
        """The rebuild's listing of this feed's kind, fed to the controller by the rebuild itself (nothing to keep
        here: the controller's records are what a relisting is compared with)."""


class KindFeed(Feed):
    """One kind's events into ``take`` (the gate held when ``gated``), a batch per gate and wake.

    ``then`` (if given) gets each object once the gate is released; ``wake`` is what to wake after a batch: the
    scheduling loop (``"loop"``), the Kueue support's loop (``"kueue"``) or nothing (``None``: ``take`` wakes
    what it must). The last state of each object seen is kept by ``namespace/name``, as client-go's informer store
    keeps it, so that :meth:`replace` feeds a DELETED (with that last state) for each object its listing lacks.
    """

    def __init__(
        self,
        operator: Host,
        take: Take,
        *,
        gated: bool = True,
        then: Callable[[dict[str, Any]], None] | None = None,
        wake: str | None = "loop",
    ) -> None:
        super().__init__(operator)
        self.take = take
        self.gated = gated
        self.then = then
        self.wake = wake
        self.known: dict[str, dict[str, Any]] = {}  # namespace/name -> the object as last fed

    def seed(self, items: Iterable[dict[str, Any]]) -> None:
        """The rebuild's listing (fed to the controller by the rebuild): what a relisting is compared with."""
        self.known = {_key(obj): obj for obj in items}

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order."""
        if not self.operator.leading:
            return
        changes = []
        for event in events:
            obj, deleted = event["object"], event["type"] == "DELETED"
            if deleted:
                self.known.pop(_key(obj), None)
            else:
                self.known[_key(obj)] = obj
            changes.append((obj, deleted))
        await self._feed(changes)

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed object fed again, every known object the listing lacks deleted (with the last
        state seen of it: client-go's DeletedFinalStateUnknown)."""
        if not self.operator.leading:
            return
        present = {_key(obj): obj for obj in listed.items}
        gone = [(obj, True) for key, obj in sorted(self.known.items()) if key not in present]
        self.known = present
        await self._feed([*((obj, False) for obj in listed.items), *gone])

    async def _feed(self, changes: list[tuple[dict[str, Any], bool]]) -> None:
        op, now = self.operator, time.time()
        if self.gated:
            async with op.gate:
                for obj, deleted in changes:
                    self.take(obj, deleted, now)
        else:
            for obj, deleted in changes:
                self.take(obj, deleted, now)
        if self.wake == "loop":
            op.loop.wake()
        elif self.wake == "kueue":
            op.kueue.wake()
        if self.then is not None:
            for obj, _ in changes:
                self.then(obj)


class TaskFeed(Feed):
    """GPUTask events from the tasks informer into the controller, a batch per gate and wake."""

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order; tasks that changed are due for the Kueue check."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            keys = [op.task_event(e["object"], deleted=e["type"] == "DELETED") for e in events]
        op.loop.wake()
        for key in keys:
            if key is not None:
                op.kueue.note_task(key)

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed task fed again (unchanged ones are echoes, dropped), every known task
        missing from the listing deleted."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            present = set()
            for obj in listed.items:
                op.task_event(obj, deleted=False)
                present.add(task_key(obj["metadata"].get("namespace") or "default", obj["metadata"]["name"]))
            for key, record in list(op.controller.tasks.items()):
                if key not in present:
                    op.task_event(record.obj, deleted=True)
        op.loop.wake()
        op.kueue.note_everyone()


class JobFeed(Feed):
    """Events of our Jobs from the jobs informer into the controller, a batch per gate and wake.

    A Job with GPUs booked is never released on a DELETED or on its absence from a relisting alone: either may
    mean that it only lost its task label (a real API server sends the same DELETED for both), so the
    :class:`~gputask.k8s.relabel.Relabeler` asks the server first, and puts the label back on a Job still there.
    """

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order (Jobs without our task-uid annotation are not ours: the controller skips
        them); the DELETED of a booked Job is confirmed with the server before it is fed."""
        op = self.operator
        if not op.leading:
            return
        relabel = op.executor.relabel
        async with op.gate:
            for event in events:
                obj, deleted = event["object"], event["type"] == "DELETED"
                key = job_key(obj)
                if deleted and op.controller.holds_gpus(key):
                    relabel.doubt(op.controller.jobs[key], obj)
                    continue
                relabel.drop(key)
                op.job_event(obj, deleted=deleted)
        await relabel.settle()
        op.loop.wake()

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed Job fed again, every known Job missing from the listing deleted (a booked one
        once the server confirms it is gone)."""
        op = self.operator
        if not op.leading:
            return
        relabel = op.executor.relabel
        async with op.gate:
            present = set()
            for obj in listed.items:
                key = job_key(obj)
                relabel.drop(key)
                op.job_event(obj, deleted=False)
                present.add(key)
            for key, job in list(op.controller.jobs.items()):
                if key in present:
                    continue
                if op.controller.holds_gpus(key):
                    relabel.doubt(job)
                    continue
                relabel.drop(key)
                gone = {"metadata": {"name": job.name, "namespace": job.namespace,
                                     "annotations": {TASK_UID_ANNOTATION: job.task_uid}}}
                op.job_event(gone, deleted=True)
        await relabel.settle()
        op.loop.wake()


class TaskPodFeed(Feed):
    """Events of the pods of our Jobs from the task-pods informer into the controller, a batch per gate and wake:
    a pod running (the task is Running), one that cannot be scheduled, the pods whose GPU memory is ours."""

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            for event in events:
                op.controller.on_task_pod(event["object"], deleted=event["type"] == "DELETED")
        op.loop.wake()

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed pod fed again, every known pod missing from the listing forgotten."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            for obj in listed.items:
                op.controller.on_task_pod(obj, deleted=False)
            op.controller.keep_task_pods({str(o["metadata"].get("uid") or "") for o in listed.items})
        op.loop.wake()


class ForeignPodFeed(Feed):
    """Events of foreign pods (no task label, bound, not finished: the informer's selectors) from their informer into
    the foreign-pod index, a batch per gate and wake; the nodes whose foreign pods changed are recounted.

    It runs only while this instance leads: a standby's index would be of no use, as the rebuild lists foreign pods
    again (:meth:`~gputask.k8s.foreign.ForeignPods.reset`) before the new leader's first cycle.
    """

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order; a pod that finishes leaves the field selector and comes as DELETED."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            changed = {op.controller.foreign.on_pod(e["object"], deleted=e["type"] == "DELETED") for e in events}
            self._recount(changed)

    async def replace(self, listed: Listed) -> None:
        """After a gap: the index is the listing (pods missing from it finished or were deleted meanwhile)."""
        op = self.operator
        if not op.leading:
            return
        foreign = op.controller.foreign
        async with op.gate:
            before = set(foreign.by_node)
            foreign.reset(listed.items)
            self._recount(before | set(foreign.by_node))

    def _recount(self, nodes: set[str | None]) -> None:
        """Recount the GPUs and room of ``nodes`` (the gate held) and wake the loop when there are any."""
        op, now = self.operator, time.time()
        for node in sorted(n for n in nodes if n is not None):
            op.controller.inventory.refresh_node(node, now)
        if nodes - {None}:
            op.loop.wake()


def job_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` of a Job (the controller's key of it)."""
    meta = obj["metadata"]
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


def _key(obj: dict[str, Any]) -> str:
    """``namespace/name`` of a namespaced object, ``name`` of a cluster-scoped one."""
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


__all__ = ["Feed", "ForeignPodFeed", "Host", "JobFeed", "KindFeed", "Take", "TaskFeed", "TaskPodFeed", "job_key"]
