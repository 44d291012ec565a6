"""The ledger: the one owner of every GPU reservation and every quota charge.

Every reservation in :class:`~gputask.core.cluster.ClusterState` and every charge in
:class:`~gputask.core.quota.QuotaBook` is made and undone here, and nowhere else, so what runs,
what is nominated and what is held can always be told from one place (``violations()``,
failure evictions and metrics all read it). Entries come in three kinds:

- **running**: admitted with a placement; ``usage`` is what it charges its queue. Tasks admitted
  by Kueue (Kueue mode) are running entries with ``charged=False``: Kueue owns their quota;
- **nominated**: a preemptor whose placement is reserved while it waits for its victims
  (``waiting_for``), promoted to running once they are gone;
- **held**: GPUs of a workload that is on its way out (a terminating Job whose task is gone or
  requeued, or the pods of a Job already gone): reserved until it is gone or its node is deleted
  (:meth:`Ledger.release_holds_on`), charged to no queue, never preempted.

Units: usage in milli-GPU and MiB (:data:`~gputask.core.quota.Usage`), times in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from gputask.core.cluster import ClusterState
from gputask.core.model import (
    MAIN_POD_SET,
    GpuRequest,
    GpuSlot,
    NodeName,
    Placement,
    PodPlacement,
    PodSet,
    Task,
    TaskKey,
)
from gputask.core.quota import QuotaBook, Usage, placement_usage

HOLD_PRIORITY = 2**31 - 1


@dataclass(slots=True)
class Entry:
    """One reservation: the task, its placement, its charge, when it was admitted (s).

    ``waiting_for`` is the set of victims a nominated preemptor waits for (empty once running);
    ``charged`` is False for placements whose quota someone else books (Kueue mode).
    """

    task: Task
    placement: Placement
    usage: Usage
    admitted_at: float
    charged: bool = True
    waiting_for: set[TaskKey] = field(default_factory=set)


Group = tuple[str, str, str | None, str]
"""Admitted tasks alike for queue reports: GPUClusterQueue, namespace, GPULocalQueue (None: named the
GPUClusterQueue directly), ResourceFlavor (``""``: the queue's implicit one)."""


def group_of(task: Task) -> Group:
    """The :data:`Group` of ``task``."""
    return (task.queue, task.namespace, task.local_queue, task.flavor)


@dataclass(slots=True)
class Tally:
    """The admitted tasks of one :data:`Group`: how many run, how many are nominated (waiting for victims),
    and the quota they are charged, by quota key (milli-GPU, MiB)."""

    running: int = 0
    nominated: int = 0
    usage: dict[str, int] = field(default_factory=dict)


class Ledger:
    """Running, nominated and held reservations over one cluster state and one quota book.

    ``tallies`` sums the admitted (running and nominated) tasks per :data:`Group`, kept as they come and go,
    so queue reports cost O(groups), never O(tasks).
    """

    def __init__(self, cluster: ClusterState, quotas: QuotaBook) -> None:
        self.cluster = cluster
        self.quotas = quotas
        self.running: dict[TaskKey, Entry] = {}
        self.nominated: dict[TaskKey, Entry] = {}
        self.held: dict[TaskKey, Placement] = {}
        self.by_queue: dict[str, dict[TaskKey, Entry]] = {}  # ``running`` by the task's queue
        self.tallies: dict[Group, Tally] = {}
        self.version = 0  # changes with every reservation, release, hold or promotion

    def _run(self, entry: Entry) -> None:
        self.version += 1
        self.running[entry.task.key] = entry
        self.by_queue.setdefault(entry.task.queue, {})[entry.task.key] = entry
        self._count(entry, running=1)

    def _count(self, entry: Entry, *, running: int = 0, nominated: int = 0) -> None:
        """Add (1) or take away (-1) ``entry`` in its group's tally."""
        group = group_of(entry.task)
        tally = self.tallies.setdefault(group, Tally())
        tally.running += running
        tally.nominated += nominated
        for key, amount in entry.usage.items():
            tally.usage[key] = tally.usage.get(key, 0) + (running + nominated) * amount
        if not tally.running and not tally.nominated:
            del self.tallies[group]

    def running_in(self, queues: Iterable[str]) -> Iterator[Entry]:
        """The running entries of tasks of ``queues``."""
        for queue in queues:
            yield from self.by_queue.get(queue, {}).values()

    # -- making reservations -------------------------------------------------------------------
    def usage(self, placement: Placement, task: Task | None = None) -> Usage:
        """What ``placement`` charges on its nodes' devices (milli-GPU, MiB), summed over its pods, in ``task``'s
        flavor. A GPU on a node the cluster does not hold counts whole (:func:`~gputask.core.quota.usage_of`)."""
        cluster = self.cluster

        def memory_of(name: NodeName) -> dict[int, int]:
            return {g.index: g.memory_mib for g in cluster.node(name).node.gpus} if cluster.has_node(name) else {}

        if task is None:
            return placement_usage(placement, memory_of)
        return placement_usage(placement, memory_of, task.flavor, task.card_mib)

    def admit(self, task: Task, placement: Placement, now: float, *, charge: bool = True) -> Entry:
        """Reserve ``placement`` and charge the queue; raises OverCommitError when it does not fit."""
        entry = self._book(task, placement, now, charge=charge, force=False)
        self._run(entry)
        return entry

    def nominate(self, task: Task, placement: Placement, victims: Iterable[TaskKey], now: float) -> Entry:
        """Reserve a preemptor's placement while its ``victims`` terminate."""
        entry = self._book(task, placement, now, charge=True, force=False)
        entry.waiting_for = set(victims)
        self.nominated[task.key] = entry
        self._count(entry, nominated=1)
        return entry

    def restore(self, task: Task, placement: Placement, admitted_at: float, *, charge: bool = True) -> Entry:
        """Record work that already runs (after a restart) even if it over-commits: never refused.

        A placement with a pod on a node the cluster does not hold is recorded without a reservation (the
        caller evicts it as a node failure: every pod goes).
        """
        if all(self.cluster.has_node(name) for name in placement.nodes):
            entry = self._book(task, placement, admitted_at, charge=charge, force=True)
        else:
            entry = Entry(task, placement, {}, admitted_at, charged=charge)
        self._run(entry)
        return entry

    def hold(self, key: TaskKey, placement: Placement, *, fit: bool = False) -> Placement | None:
        """Keep a departing workload's GPUs reserved (no queue, no quota) until :meth:`release`.

        With ``fit`` each GPU holds only what is free on it now, healthy or not, at most the slot's MiB (the
        part a nominated preemptor took is its own; a failed GPU's old pods still run on it); without it the
        whole placement is recorded even if it over-commits (found at a restart). Pods on nodes the cluster does
        not hold, and pods left with no GPU, are not held. Returns what is held, None when nothing is.
        """
        if key in self.held:
            return None
        pods = tuple(kept for pod in placement.pods if (kept := self._holdable(pod, fit=fit)) is not None)
        if not pods:
            return None
        held = Placement(pods)
        shapes = tuple(  # shared, never exclusive; one PodSet per pod (each its own GPU count)
            PodSet(f"{MAIN_POD_SET}-{i}" if i else MAIN_POD_SET, 1,
                   GpuRequest(len(pod.gpus), memory_mib=max(s.memory_mib for s in pod.gpus)))
            for i, pod in enumerate(pods)
        )
        if len(shapes) == 1:
            task = Task(key, "", shapes[0].request, priority=HOLD_PRIORITY)
        else:
            task = Task.of_pod_sets(key, "", shapes, priority=HOLD_PRIORITY)
        self.cluster.reserve(task, held, force=True)
        self.held[key] = held
        self.version += 1
        return held

    def _holdable(self, pod: PodPlacement, *, fit: bool) -> PodPlacement | None:
        """What :meth:`hold` keeps of one pod: None when its node is unknown or no GPU is left."""
        if not self.cluster.has_node(pod.node):
            return None
        slots: tuple[GpuSlot, ...] = pod.gpus
        if fit:
            state = self.cluster.node(pod.node)
            clipped = (
                replace(slot, memory_mib=min(slot.memory_mib, state.room_mib(state.position[slot.index])))
                for slot in slots
                if slot.index in state.position and state.node.gpus[state.position[slot.index]].uuid == slot.uuid
            )
            slots = tuple(slot for slot in clipped if slot.memory_mib > 0)
        return PodPlacement(pod.node, slots) if slots else None

    def release_holds_on(self, node: NodeName) -> list[TaskKey]:
        """Release every hold on ``node`` (its Node is deleted: what ran there is gone with it); returns their keys,
        sorted."""
        keys = sorted(key for key, placement in self.held.items() if node in placement.nodes)
        for key in keys:
            self.release(key)
        return keys

    def _book(self, task: Task, placement: Placement, now: float, *, charge: bool, force: bool) -> Entry:
        self.version += 1
        self.cluster.reserve(task, placement, force=force)
        usage = self.usage(placement, task) if charge else {}
        self.quotas.charge(task.queue, usage)
        return Entry(task, placement, usage, now, charged=charge)

    # -- changing and ending them ----------------------------------------------------------------
    def promote(self, key: TaskKey, now: float) -> Entry:
        """A nominated preemptor whose victims are gone becomes running at ``now``."""
        entry = self.nominated.pop(key)
        self._count(entry, nominated=-1)
        entry.admitted_at = now
        self._run(entry)
        return entry

    def victim_gone(self, key: TaskKey) -> None:
        """A preempted workload terminated: no nominated preemptor waits for it any more."""
        for entry in self.nominated.values():
            entry.waiting_for.discard(key)

    def release(self, key: TaskKey) -> Entry | Placement | None:
        """Give back whatever ``key`` reserves: GPUs and quota. Returns the entry (or a hold's placement)."""
        entry = self.running.pop(key, None)
        if entry is not None:
            queue = self.by_queue[entry.task.queue]
            del queue[key]
            if not queue:
                del self.by_queue[entry.task.queue]
            self._count(entry, running=-1)
        elif (entry := self.nominated.pop(key, None)) is not None:
            self._count(entry, nominated=-1)
        held = self.held.pop(key, None) if entry is None else None
        if entry is None and held is None:
            return None
        self.version += 1
        self.cluster.release(key)
        if entry is not None:
            self.quotas.charge(entry.task.queue, entry.usage, -1)
        return entry or held

    # -- reading -------------------------------------------------------------------------------
    def get(self, key: TaskKey) -> Entry | None:
        """The running or nominated entry of ``key``."""
        return self.running.get(key) or self.nominated.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.running or key in self.nominated or key in self.held

    def ready(self) -> Iterator[TaskKey]:
        """Nominated preemptors no victim is left for, in nomination order."""
        return iter([key for key, entry in self.nominated.items() if not entry.waiting_for])
