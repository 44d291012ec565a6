"""Cluster state: nodes, their GPUs and the MiB reserved on each GPU.

The state is the scheduler's cache ("assume, then commit", as in Kueue): a placement is
reserved here as soon as it is decided, and released when the task finishes, is deleted,
evicted, or when the API write that would have made it real fails.

Invariants (checked by :meth:`ClusterState.violations` and the property tests):
- on every GPU, reserved MiB + foreign MiB never exceed the GPU's memory for reservations
  made here (foreign use reported later can exceed it: that is the agent's truth);
- an exclusive (whole-GPU) reservation is the only one on its GPU;
- the shared reservations on one GPU all belong to one share group (``GpuRequest.share_group``);
- each pod of a task is reserved on one node (a task of several pods may span nodes, and its pods may
  share a node).

For speed at thousands of nodes the state also keeps a :class:`NodeIndex`: per-node
aggregates in name order (free CPU and memory, idle GPUs, largest free share) refreshed on
every change, which let placement skip nodes that cannot fit in O(1) and evaluate each group
of identical nodes once. It is a cache: it never changes what placement decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gputask.core.errors import OverCommitError, UnknownNodeError
from gputask.core.model import (
    MILLI_PER_GPU,
    Gpu,
    GpuSlot,
    Node,
    NodeName,
    Placement,
    PodPlacement,
    PodSet,
    Task,
    TaskKey,
)


@dataclass(slots=True)
class Reservation:
    """A task's reservation: the task and its placement (one pod per :attr:`Task.pods` entry)."""

    task: Task
    placement: Placement


@dataclass(slots=True, eq=False)
class NodeState:
    """Mutable per-node accounting.

    ``reserved_mib[i]`` is the MiB reserved by gputask tasks on ``node.gpus[i]``;
    ``exclusive[i]`` is True while a whole-GPU task holds it; ``groups[i]`` counts the shared
    reservations on it per share group. ``tasks`` holds, per task with pods here, those pods' GPUs as one
    :class:`PodPlacement` (every slot of its pods on this node); ``pods_used`` counts the pods.
    ``generation`` increases on every change so snapshots and caches can refresh only changed nodes.
    """

    node: Node
    reserved_mib: list[int]
    exclusive: list[bool]
    position: dict[int, int]
    groups: list[dict[str, int]] = field(default_factory=list)
    grouped: int = 0  # shared reservations of a group other than "" on the node (0: groups say nothing new)
    tasks: dict[TaskKey, PodPlacement] = field(default_factory=dict)
    pods_used: int = 0
    cpu_used: int = 0
    memory_used_mib: int = 0
    ephemeral_used_mib: int = 0
    generation: int = 0

    @classmethod
    def of(cls, node: Node) -> NodeState:
        """Return an empty state for ``node``."""
        n = len(node.gpus)
        return cls(node, [0] * n, [False] * n, {g.index: i for i, g in enumerate(node.gpus)}, [{} for _ in range(n)])

    @property
    def name(self) -> NodeName:
        """The node's name."""
        return self.node.name

    def copy(self) -> NodeState:
        """An independent copy (reservations, counts and generation as they are now), for preemption trials on a
        snapshot (:mod:`gputask.core.snapshot`): changing it leaves this state as it is."""
        return NodeState(
            self.node, list(self.reserved_mib), list(self.exclusive), self.position, [dict(g) for g in self.groups],
            self.grouped, dict(self.tasks), self.pods_used, self.cpu_used, self.memory_used_mib,
            self.ephemeral_used_mib, self.generation,
        )

    def free_mib(self, pos: int) -> int:
        """Free MiB on the GPU at position ``pos`` (0 when unhealthy or exclusively held)."""
        return self.room_mib(pos) if self.node.gpus[pos].healthy else 0

    def room_mib(self, pos: int) -> int:
        """MiB of the GPU at position ``pos`` that nothing reserves or uses, healthy or not (0 when exclusively
        held): what a departing workload's hold may keep of it (a failed GPU's old pods still run on it)."""
        gpu = self.node.gpus[pos]
        if self.exclusive[pos]:
            return 0
        return max(0, gpu.memory_mib - gpu.foreign_mib - self.reserved_mib[pos])

    def admits(self, pos: int, group: str) -> bool:
        """True when the GPU at ``pos`` may take a shared reservation of share group ``group``: it holds no
        shared reservation of another group."""
        held = self.groups[pos]
        return not held or (len(held) == 1 and group in held)

    def hold(self, pos: int, group: str, count: int) -> None:
        """Count ``count`` (+1 or -1) shared reservations of ``group`` on the GPU at ``pos``."""
        held = self.groups[pos]
        left = held.get(group, 0) + count
        if left > 0:
            held[group] = left
        else:
            held.pop(group, None)
        if group:
            self.grouped += count

    def is_idle(self, pos: int) -> bool:
        """True when the GPU at ``pos`` is healthy and holds nothing (ours or foreign)."""
        gpu = self.node.gpus[pos]
        return gpu.healthy and self.reserved_mib[pos] == 0 and gpu.foreign_mib == 0

    @property
    def cpu_free(self) -> int | None:
        """Free millicores (allocatable less ours and foreign pods'), or None when CPU is not tracked."""
        cap = self.node.cpu_milli
        return None if cap is None else cap - self.node.foreign_use.cpu_milli - self.cpu_used

    @property
    def memory_free_mib(self) -> int | None:
        """Free host memory (MiB), or None when it is not tracked."""
        cap = self.node.memory_mib
        return None if cap is None else cap - self.node.foreign_use.memory_mib - self.memory_used_mib

    @property
    def ephemeral_free_mib(self) -> int | None:
        """Free ephemeral-storage (MiB), or None when it is not tracked."""
        cap = self.node.ephemeral_mib
        return None if cap is None else cap - self.node.foreign_use.ephemeral_mib - self.ephemeral_used_mib

    @property
    def pods_free(self) -> int | None:
        """Pod slots left (one per reserved pod and per foreign pod), or None when pods are not tracked."""
        cap = self.node.pods
        return None if cap is None else cap - self.node.foreign_use.pods - self.pods_used


UNTRACKED = 1 << 62
"""Free CPU or memory of a node that does not track it: larger than any request."""


class NodeIndex:
    """Per-node aggregates in name order, so placement can filter and group nodes cheaply.

    ``states[i]`` is the i-th node in name order; the other lists are columns of that row:
    - ``free_cpu`` / ``free_memory``: free millicores / MiB (:data:`UNTRACKED` when the node does
      not track it, -1 when the node is unschedulable, so nothing passes);
    - ``idle``: GPUs that are healthy and hold nothing;
    - ``max_free_mib``: the most free MiB on one GPU;
    - ``max_free_milli``: the largest free share of one GPU, in milli of that GPU, rounded down
      (``gpu_fraction`` f fits a GPU exactly when this share of it is >= f);
    - ``group``: equal for two rows exactly when everything placement reads of the two nodes,
      except their names and GPU uuids, is equal (ids of interned keys, never reused).

    ``memos`` is placement's scratch space: evaluations remembered by group id, per policy
    object; it lives and dies with the index, so a group id always means one node state.
    ``log`` lists the rows refreshed since the index was built (the entry at position
    ``log_start + k`` is ``log[k]``; old entries are dropped past a bound), so placement can
    update what it derived from the index by looking only at the rows that changed.

    :class:`ClusterState` refreshes a row on every change of its node and drops the index when
    nodes are added or removed.
    """

    def __init__(self, states: list[NodeState]) -> None:
        self.states = list(states)
        self.row = {s.name: i for i, s in enumerate(self.states)}
        n = len(self.states)
        self.free_cpu = [0] * n
        self.free_memory = [0] * n
        self.idle = [0] * n
        self.max_free_mib = [0] * n
        self.max_free_milli = [0] * n
        self.group = [0] * n
        self.products: Counter[str] = Counter(g.product for s in self.states for g in s.node.gpus)
        self.memos: dict[int, tuple[object, int, dict[Any, Any]]] = {}
        self.summaries: dict[object, tuple[int, Any]] = {}  # reasons' per-node wait counts, by log position
        self._ids: dict[tuple[object, ...], int] = {}
        self._next_id = 0
        for i, state in enumerate(self.states):
            self._fill(i, state)
        self.log: list[int] = []
        self.log_start = 0

    @property
    def log_end(self) -> int:
        """Position just past the newest entry of :attr:`log`."""
        return self.log_start + len(self.log)

    def refresh(self, state: NodeState) -> None:
        """Recompute the row of ``state`` (after a reservation changed it)."""
        self._fill(self.row[state.name], state)
        self._logged(self.row[state.name])

    def _logged(self, row: int) -> None:
        self.log.append(row)
        if len(self.log) > 4 * len(self.states) + 1024:  # bound memory; laggards rebuild in full
            drop = len(self.log) // 2
            del self.log[:drop]
            self.log_start += drop

    def replace(self, state: NodeState) -> None:
        """Put a new state object in place of the node's old one (``set_node`` of a known node)."""
        i = self.row[state.name]
        self.products.subtract(g.product for g in self.states[i].node.gpus)
        self.products.update(g.product for g in state.node.gpus)
        self.states[i] = state
        self._fill(i, state)
        self._logged(i)

    def has_product(self, products: Iterable[str]) -> bool:
        """True when some node has a GPU of one of ``products``."""
        return any(self.products[p] > 0 for p in products)

    def _fill(self, i: int, state: NodeState) -> None:
        node = state.node
        idle = max_mib = max_milli = 0
        for pos, gpu in enumerate(node.gpus):
            free = state.free_mib(pos)
            idle += state.is_idle(pos)
            max_mib = max(max_mib, free)
            max_milli = max(max_milli, free * MILLI_PER_GPU // gpu.memory_mib if gpu.memory_mib else MILLI_PER_GPU)
        cpu, memory = state.cpu_free, state.memory_free_mib
        self.free_cpu[i] = -1 if not node.schedulable else UNTRACKED if cpu is None else cpu
        self.free_memory[i] = -1 if not node.schedulable else UNTRACKED if memory is None else memory
        self.idle[i], self.max_free_mib[i], self.max_free_milli[i] = idle, max_mib, max_milli
        self.group[i] = self._intern(_placement_key(state))

    def _intern(self, key: tuple[object, ...]) -> int:
        found = self._ids.get(key)
        if found is None:
            if len(self._ids) > 4 * len(self.states) + 1024:
                self._ids.clear()  # bound memory; fresh ids keep "same id => same key" true
            found = self._ids[key] = self._next_id
            self._next_id += 1
        return found


def _placement_key(state: NodeState) -> tuple[object, ...]:
    """Everything placement may read of a node except its name and GPU uuids."""
    node = state.node
    return (
        node.schedulable,
        node.cpu_milli,
        node.memory_mib,
        node.labels,
        node.taints,
        node.ephemeral_mib,
        node.pods,
        node.foreign_use,
        state.ephemeral_used_mib,
        state.pods_used if node.pods is not None else 0,
        tuple((g.index, g.product, g.memory_mib, g.healthy, g.foreign_mib) for g in node.gpus),
        tuple(state.reserved_mib),
        tuple(state.exclusive),
        # Groups tell placement more than reserved_mib and exclusive only where a group other than "" holds a GPU.
        tuple(tuple(sorted(held)) for held in state.groups) if state.grouped else (),
        state.cpu_used,
        state.memory_used_mib,
    )


class ClusterState:
    """All nodes and reservations. Not thread-safe: one scheduler owns it.

    Nodes are kept in name order (``sorted_nodes``) because ties in placement go to the
    smallest node name.
    """

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._nodes: dict[NodeName, NodeState] = {}
        self._sorted: list[NodeState] | None = None
        self._index: NodeIndex | None = None
        self._reservations: dict[TaskKey, Reservation] = {}
        self.generation = 0
        self.nodes_version = 0  # changes when a node is set or removed (not on reservations)
        self._deferred: set[NodeName] | None = None  # nodes whose index rows wait (deferred_index)
        for node in nodes:
            self.set_node(node)

    def copy(self) -> ClusterState:
        """A trial copy: the same nodes and reservations, changed independently of this state (placement of a
        task of several pods reserves its pods on it one by one). O(nodes)."""
        out = ClusterState()
        out._nodes = {name: state.copy() for name, state in self._nodes.items()}
        out._reservations = dict(self._reservations)
        out.generation, out.nodes_version = self.generation, self.nodes_version
        return out

    # -- nodes -------------------------------------------------------------------------
    def set_node(self, node: Node) -> list[TaskKey]:
        """Add or update a node, keeping reservations on GPUs that still exist.

        Returns the keys of tasks whose GPUs vanished (their reservation is kept: the
        caller decides whether to evict them).
        """
        old = self._nodes.get(node.name)
        state = NodeState.of(node)
        lost: list[TaskKey] = []
        if old is not None:
            state.tasks, state.pods_used = old.tasks, old.pods_used
            for key in old.tasks:
                res = self._reservations[key]
                for pod, placed in zip(res.task.pods, res.placement.pods, strict=True):
                    if placed.node != node.name:
                        continue
                    exclusive = pod.request.exclusive
                    for slot in placed.gpus:
                        pos = state.position.get(slot.index)
                        if pos is None or node.gpus[pos].uuid != slot.uuid:
                            lost.append(key)
                            continue
                        state.reserved_mib[pos] += slot.memory_mib
                        state.exclusive[pos] = state.exclusive[pos] or exclusive
                        if not exclusive:
                            state.hold(pos, pod.request.share_group, 1)
            state.cpu_used, state.memory_used_mib = old.cpu_used, old.memory_used_mib
            state.ephemeral_used_mib = old.ephemeral_used_mib
            state.generation = old.generation + 1
        else:
            self._sorted = self._index = None
        self._nodes[node.name] = state
        if self._sorted is not None:
            self._sorted = [state if s.name == node.name else s for s in self._sorted]
        if self._index is not None:
            self._index.replace(state)
        self.generation += 1
        self.nodes_version += 1
        return sorted(set(lost))

    def remove_node(self, name: NodeName) -> list[TaskKey]:
        """Remove a node; returns the keys of tasks still reserved on it (not released)."""
        state = self._nodes.pop(name, None)
        if state is None:
            return []
        self._sorted = self._index = None
        self.generation += 1
        self.nodes_version += 1
        return sorted(state.tasks)

    def node(self, name: NodeName) -> NodeState:
        """Return the state of ``name``; raises UnknownNodeError."""
        try:
            return self._nodes[name]
        except KeyError:
            raise UnknownNodeError(name) from None

    def has_node(self, name: NodeName) -> bool:
        """True when the node is known."""
        return name in self._nodes

    def sorted_nodes(self) -> list[NodeState]:
        """Node states in name order (cached until a node is added or removed)."""
        if self._sorted is None:
            self._sorted = [self._nodes[n] for n in sorted(self._nodes)]
        return self._sorted

    def index(self) -> NodeIndex:
        """The per-node aggregates in name order (built on first use, then kept up to date)."""
        if self._index is None:
            self._index = NodeIndex(self.sorted_nodes())
        return self._index

    def _touched(self, state: NodeState) -> None:
        state.generation += 1
        self.generation += 1
        if self._deferred is not None:
            self._deferred.add(state.name)
        elif self._index is not None:
            self._index.refresh(state)

    @contextmanager
    def deferred_index(self) -> Iterator[None]:
        """Index rows of the nodes whose reservations change inside are refreshed once, on leaving.

        For preemption trials, which release and restore victims many times and search only the
        node states themselves (never the index's columns) in between. Nested use is one deferral.
        """
        if self._deferred is not None:
            yield
            return
        self._deferred = set()
        try:
            yield
        finally:
            names, self._deferred = self._deferred, None
            if self._index is not None:
                for name in sorted(names):
                    if name in self._nodes:
                        self._index.refresh(self._nodes[name])

    def __iter__(self) -> Iterator[NodeState]:
        return iter(self.sorted_nodes())

    def __len__(self) -> int:
        return len(self._nodes)

    # -- reservations --------------------------------------------------------------------
    def reserve(self, task: Task, placement: Placement, *, force: bool = False) -> None:
        """Reserve ``placement`` for ``task``.

        Raises OverCommitError when the task is already reserved, a GPU is unknown,
        unhealthy, exclusively held, or would exceed its memory; nothing changes then.
        With ``force`` an existing placement (rebuilt after a restart, or a departing workload)
        is recorded even if it over-commits, and a task already reserved is left as it is: the
        API is the truth, and refusing it would forget work that runs. Over-commit then shows in
        :meth:`violations`; a slot counts only on the very GPU (index and uuid) it names.
        """
        if task.key in self._reservations:
            if force:
                return
            raise OverCommitError(f"{task.key} is already reserved")
        pods = task.pods
        if len(pods) != len(placement.pods):
            raise OverCommitError(f"{task.key} has {len(pods)} pods, its placement {len(placement.pods)}")
        states = [self.node(placed.node) for placed in placement.pods]  # every node known before any change
        done: list[int] = []
        try:
            for i, (pod, placed, state) in enumerate(zip(pods, placement.pods, states, strict=True)):
                exclusive = pod.request.exclusive
                positions = (
                    self._known(state, placed)
                    if force
                    else self._check_fits(state, placed, exclusive, pod.request.share_group)
                )
                self._apply(state, pod, positions, 1)
                done.append(i)
        except OverCommitError:  # all or nothing: undo the pods already reserved
            for i in reversed(done):
                self._apply(states[i], pods[i], self._known(states[i], placement.pods[i]), -1)
            raise
        self._reservations[task.key] = Reservation(task, placement)
        if len(states) == 1:
            states[0].tasks[task.key] = placement.pods[0]
            self._touched(states[0])
            return
        for state in dict.fromkeys(states):
            slots = tuple(slot for placed in placement.on(state.name) for slot in placed.gpus)
            state.tasks[task.key] = PodPlacement(state.name, slots)
            self._touched(state)

    @staticmethod
    def _apply(state: NodeState, pod: PodSet, positions: list[tuple[int, GpuSlot]], sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) one pod's reservation of ``positions`` on ``state``."""
        exclusive = pod.request.exclusive
        for pos, slot in positions:
            state.reserved_mib[pos] += sign * slot.memory_mib
            if exclusive:
                state.exclusive[pos] = sign > 0
            else:
                state.hold(pos, pod.request.share_group, sign)
        state.cpu_used += sign * pod.cpu_milli
        state.memory_used_mib += sign * pod.memory_mib
        state.ephemeral_used_mib += sign * pod.ephemeral_mib
        state.pods_used += sign

    @staticmethod
    def _known(state: NodeState, placement: PodPlacement) -> list[tuple[int, GpuSlot]]:
        """(position, slot) of the slots that name a GPU the node still has (index and uuid)."""
        found = ((state.position.get(slot.index), slot) for slot in placement.gpus)
        return [(pos, slot) for pos, slot in found if pos is not None and state.node.gpus[pos].uuid == slot.uuid]

    def _check_fits(
        self, state: NodeState, placement: PodPlacement, exclusive: bool, group: str
    ) -> list[tuple[int, GpuSlot]]:
        positions: list[tuple[int, GpuSlot]] = []
        for slot in placement.gpus:
            pos = state.position.get(slot.index)
            if pos is None or any(pos == p for p, _ in positions):
                raise OverCommitError(f"{state.name}: GPU {slot.index} unknown or repeated")
            gpu: Gpu = state.node.gpus[pos]
            if gpu.uuid != slot.uuid:
                raise OverCommitError(f"{state.name}: GPU {slot.index} is {gpu.uuid}, not {slot.uuid}")
            if exclusive and not state.is_idle(pos):
                raise OverCommitError(f"{state.name}: GPU {slot.index} is not idle")
            if not exclusive and not state.admits(pos, group):
                held = sorted(state.groups[pos])
                raise OverCommitError(f"{state.name}: GPU {slot.index} is shared by share group {held}, not {group!r}")
            if slot.memory_mib > state.free_mib(pos):
                raise OverCommitError(
                    f"{state.name}: GPU {slot.index} has {state.free_mib(pos)} MiB free, {slot.memory_mib} MiB asked"
                )
            positions.append((pos, slot))
        return positions

    def release(self, key: TaskKey) -> Placement | None:
        """Release a task's reservation; returns its placement, or None if it had none."""
        res = self._reservations.pop(key, None)
        if res is None:
            return None
        touched = False
        for name in res.placement.nodes:
            state = self._nodes.get(name)
            if state is None or state.tasks.pop(key, None) is None:
                continue  # its node was removed (and maybe added again, empty)
            for pod, placed in zip(res.task.pods, res.placement.pods, strict=True):
                if placed.node == name:
                    # A GPU replaced under the same index (set_node) never held this slot's MiB: known slots only.
                    self._apply(state, pod, self._known(state, placed), -1)
            self._touched(state)
            touched = True
        if not touched:
            self.generation += 1
        return res.placement

    def reservation(self, key: TaskKey) -> Reservation | None:
        """The reservation of ``key``, if any."""
        return self._reservations.get(key)

    def reservations(self) -> dict[TaskKey, Reservation]:
        """All reservations by task key (a read-only view by convention)."""
        return self._reservations

    # -- checks ----------------------------------------------------------------------------
    def overcommitted(self, placement: Placement) -> bool:
        """Whether a GPU of ``placement`` holds more MiB than it has, is shared while held whole, or is shared by
        two share groups."""
        return any(self._overcommitted(pod) for pod in placement.pods)

    def _overcommitted(self, placement: PodPlacement) -> bool:
        if not self.has_node(placement.node):
            return False
        state = self.node(placement.node)
        for slot in placement.gpus:
            pos = state.position.get(slot.index)
            if pos is None:
                continue
            holders = sum(1 for p in state.tasks.values() if slot.index in p.indices)
            if state.reserved_mib[pos] > state.node.gpus[pos].memory_mib or (state.exclusive[pos] and holders > 1):
                return True
            if len(state.groups[pos]) > 1:
                return True
        return False

    def violations(self, names: Iterable[NodeName] | None = None) -> list[str]:
        """Broken invariants as human-readable lines (empty when all hold), on every node or on ``names``
        (the nodes changed since a previous check: what did not change cannot have broken)."""
        states = self.sorted_nodes() if names is None else [self._nodes[n] for n in sorted(names) if n in self._nodes]
        out: list[str] = []
        for state in states:
            holders: Counter[int] | None = None
            for pos, gpu in enumerate(state.node.gpus):
                if state.reserved_mib[pos] > gpu.memory_mib:
                    out.append(
                        f"{state.name} GPU {gpu.index}: {state.reserved_mib[pos]} MiB reserved > {gpu.memory_mib} MiB"
                    )
                if len(state.groups[pos]) > 1:
                    out.append(f"{state.name} GPU {gpu.index}: shared by share groups {sorted(state.groups[pos])}")
                if state.exclusive[pos]:
                    if holders is None:
                        holders = Counter(i for p in state.tasks.values() for i in set(p.indices))
                    if holders[gpu.index] > 1:
                        keys = [k for k, p in state.tasks.items() if gpu.index in p.indices]
                        out.append(f"{state.name} GPU {gpu.index}: exclusive GPU shared by {keys}")
        return out


def slots_for(state: NodeState, task: Task, positions: Iterable[int]) -> tuple[GpuSlot, ...]:
    """The GpuSlots a task gets on ``positions`` of ``state`` (MiB per the request's shape)."""
    gpus = state.node.gpus
    return tuple(GpuSlot(gpus[p].index, gpus[p].uuid, task.request.mib_on(gpus[p])) for p in positions)
