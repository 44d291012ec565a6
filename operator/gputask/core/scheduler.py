"""The scheduling cycle: queue heads in order, quota, placement, decisions.

Watch handlers never decide (Kueue's shape): they feed :class:`Scheduler` with tasks,
nodes and queues; :meth:`Scheduler.cycle` reads the pending tasks in order and returns
decisions for the adapter to carry out. An admission is assumed at once (reserved in the
cluster state and charged to quota) so later tasks of the same cycle see it; the adapter
calls :meth:`Scheduler.unadmit` if the API write fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gputask.core.cluster import ClusterState, NodeState
from gputask.core.model import Node, NodeName, Placement, Task, TaskKey
from gputask.core.placement import (
    DEFAULT_POLICY,
    Outcome,
    Policy,
    QuotaCheck,
    find_placement,
    make_policy,
)
from gputask.core.queues import QueueManager
from gputask.core.quota import GPU, GPU_MEMORY, QueueSpec, QuotaBook, Usage, usage_of

# Condition reasons of a pending task (DESIGN.md: every wait has a reason).
QUEUE_NOT_FOUND = "QueueNotFound"
QUEUE_HELD = "QueueHeld"
NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"
QUOTA_EXCEEDED = "QuotaExceeded"
NO_FIT = "NoFit"
PRODUCT_UNAVAILABLE = "ProductUnavailable"
INADMISSIBLE = "Inadmissible"
WAITING_FOR_HEAD = "StrictFIFOBlocked"


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit ``task`` with ``placement``; ``usage`` is what it charges its queue."""

    task: Task
    placement: Placement
    usage: Usage


@dataclass(frozen=True, slots=True)
class Pending:
    """``task`` stays pending; emitted only when ``reason`` or ``message`` changes."""

    task: Task
    reason: str
    message: str


Decision = Admit | Pending


@dataclass(slots=True)
class _Running:
    task: Task
    placement: Placement
    usage: Usage


@dataclass(slots=True)
class _CycleMemo:
    """What failed earlier in this cycle; valid all cycle because capacity only shrinks."""

    outcomes: dict[tuple[object, ...], tuple[str, str]] = field(default_factory=dict)
    blocked_queues: set[str] = field(default_factory=set)


class Scheduler:
    """Owns the cluster state, the queues and quota; decides in :meth:`cycle`.

    Deterministic: the same calls in the same order give the same decisions.
    """

    def __init__(self, *, policy: Policy | None = None, nodes: Iterable[Node] = ()) -> None:
        self.policy = policy or make_policy(DEFAULT_POLICY)
        self.cluster = ClusterState(nodes)
        self.quotas = QuotaBook()
        self.pending = QueueManager()
        self.running: dict[TaskKey, _Running] = {}
        self.reasons: dict[TaskKey, tuple[str, str]] = {}

    # -- inputs ---------------------------------------------------------------------------
    def set_queue(self, spec: QueueSpec) -> None:
        """Add or update a GPUClusterQueue."""
        self.quotas.set_queue(spec)

    def remove_queue(self, name: str) -> None:
        """Remove a queue; its pending tasks wait with reason QueueNotFound."""
        self.quotas.remove_queue(name)

    def set_node(self, node: Node) -> list[TaskKey]:
        """Add or update a node; returns running tasks whose GPUs vanished."""
        return self.cluster.set_node(node)

    def remove_node(self, name: NodeName) -> list[TaskKey]:
        """Remove a node; returns the running tasks that were placed on it."""
        return self.cluster.remove_node(name)

    def submit(self, task: Task) -> None:
        """Queue a task (or replace its pending version). Running tasks are left alone."""
        if task.key not in self.running:
            self.pending.push(task)

    def restore(self, task: Task, placement: Placement) -> None:
        """Record a task already running with ``placement`` (after a restart): never refused."""
        if task.key in self.running or not self.cluster.has_node(placement.node):
            return
        self.pending.discard(task.key)
        self.cluster.force_reserve(task, placement)
        usage = self._usage(placement)
        self.quotas.charge(task.queue, usage)
        self.running[task.key] = _Running(task, placement, usage)

    def finish(self, key: TaskKey) -> Placement | None:
        """Forget a task (finished, deleted or evicted): release GPUs and quota."""
        self.pending.discard(key)
        self.reasons.pop(key, None)
        run = self.running.pop(key, None)
        if run is None:
            return None
        self.cluster.release(key)
        self.quotas.charge(run.task.queue, run.usage, -1)
        return run.placement

    def evict(self, key: TaskKey) -> Task | None:
        """Evict a running task: release GPUs and quota, queue it again in its old place.

        The task keeps its creation time, so it goes ahead of newer work. Returns the task,
        or None when it was not running. The adapter records the reason and the attempt.
        """
        run = self.running.get(key)
        if run is None:
            return None
        self.finish(key)
        self.pending.push(run.task)
        return run.task

    def unadmit(self, key: TaskKey) -> None:
        """Undo an admission whose API write failed: release and queue the task again."""
        run = self.running.get(key)
        self.finish(key)
        if run is not None:
            self.pending.push(run.task)

    def placement_of(self, key: TaskKey) -> Placement | None:
        """Placement of a running task."""
        run = self.running.get(key)
        return None if run is None else run.placement

    # -- the cycle ------------------------------------------------------------------------
    def cycle(self, now: float = 0.0) -> list[Decision]:
        """Run one scheduling cycle at time ``now`` (seconds); returns decisions in order.

        1. take pending tasks in order (priority, creation time);
        2. check the queue (exists, not held, namespace allowed, StrictFIFO head);
        3. find a placement that fits quota (memoised per shape within the cycle);
        4. admit it (assume) or record why it waits.
        """
        memo = _CycleMemo()
        decisions: list[Decision] = []
        for task in self.pending:
            decision = self._try(task, memo)
            if isinstance(decision, Admit):
                decisions.append(decision)
            elif self.reasons.get(task.key) != (decision.reason, decision.message):
                self.reasons[task.key] = (decision.reason, decision.message)
                decisions.append(decision)
        return decisions

    def _try(self, task: Task, memo: _CycleMemo) -> Decision:
        blocked = self._queue_gate(task, memo)
        if blocked is not None:
            return blocked
        shape = (task.queue, task.request, task.cpu_milli, task.memory_mib)
        known = memo.outcomes.get(shape)
        if known is None:
            outcome = find_placement(self.cluster, task, self.policy, quota=self._quota_check(task))
            if outcome.placement is not None:
                return self._admit(task, outcome.placement)
            known = self._explain(task, outcome)
            memo.outcomes[shape] = known
        if self.quotas.specs[task.queue].strategy == "StrictFIFO":
            memo.blocked_queues.add(task.queue)
        return Pending(task, *known)

    def _queue_gate(self, task: Task, memo: _CycleMemo) -> Pending | None:
        spec = self.quotas.specs.get(task.queue)
        if spec is None:
            return Pending(task, QUEUE_NOT_FOUND, f"GPUClusterQueue {task.queue!r} does not exist")
        if spec.stop_policy != "None":
            return Pending(task, QUEUE_HELD, f"GPUClusterQueue {task.queue!r} is stopped ({spec.stop_policy})")
        if not spec.namespace_selector.matches(dict(task.namespace_labels)):
            return Pending(
                task,
                NAMESPACE_NOT_ALLOWED,
                f"namespace {task.namespace!r} is not selected by GPUClusterQueue {task.queue!r}",
            )
        if task.queue in memo.blocked_queues:
            return Pending(task, WAITING_FOR_HEAD, f"StrictFIFO: waiting behind the head of {task.queue!r}")
        return None

    def _quota_check(self, task: Task) -> QuotaCheck:
        name = task.queue

        def check(state: NodeState, placement: Placement) -> str | None:
            return self.quotas.refuses(name, usage_of(placement, _memory_by_index(state)))

        return check

    def _admit(self, task: Task, placement: Placement) -> Admit:
        self.pending.discard(task.key)
        self.reasons.pop(task.key, None)
        self.cluster.reserve(task, placement)
        usage = self._usage(placement)
        self.quotas.charge(task.queue, usage)
        self.running[task.key] = _Running(task, placement, usage)
        return Admit(task, placement, usage)

    def _usage(self, placement: Placement) -> Usage:
        return usage_of(placement, _memory_by_index(self.cluster.node(placement.node)))

    def _explain(self, task: Task, outcome: Outcome) -> tuple[str, str]:
        req = task.request
        if not outcome.product_seen:
            return PRODUCT_UNAVAILABLE, f"no node has a GPU of product {sorted(req.products)}"
        if outcome.quota_resource is not None:
            spec = self.quotas.specs[task.queue]
            free = self.quotas.available(task.queue, outcome.quota_resource)
            unit = "milli-GPU" if outcome.quota_resource == GPU else "MiB"
            return QUOTA_EXCEEDED, (
                f"quota of {outcome.quota_resource} in GPUClusterQueue {spec.name!r} "
                f"has {free} {unit} left"
            )
        need = "idle" if req.exclusive else (
            f"{req.memory_mib} MiB free" if req.memory_mib is not None
            else f"{req.fraction_milli / 10:g}% free"
        )
        if not any(_could_ever_fit(s, task) for s in self.cluster.sorted_nodes()):
            return INADMISSIBLE, f"no node has {req.count} GPU(s) that could ever be {need}"
        return NO_FIT, f"no node has {req.count} GPU(s) {need} each"

    # -- reports ------------------------------------------------------------------------------
    def queue_status(self) -> dict[str, dict[str, object]]:
        """Per queue: usage (milli-GPU, MiB), borrowed, pending and admitted counts."""
        pending = self.pending.count_by_queue()
        admitted: dict[str, int] = {}
        for run in self.running.values():
            admitted[run.task.queue] = admitted.get(run.task.queue, 0) + 1
        names = sorted(set(self.quotas.specs) | set(pending) | set(admitted))
        return {
            n: {
                "usage": {r: self.quotas.usage.get(n, {}).get(r, 0) for r in (GPU, GPU_MEMORY)},
                "borrowed": self.quotas.borrowed(n),
                "pending": pending.get(n, 0),
                "admitted": admitted.get(n, 0),
            }
            for n in names
        }

    def violations(self, extra: Mapping[str, str] | None = None) -> list[str]:
        """Broken invariants: GPU over-commit and quota beyond nominal + borrowing limit."""
        out = self.cluster.violations()
        for name, spec in self.quotas.specs.items():
            used = self.quotas.usage.get(name, {})
            for resource, quota in spec.quotas.items():
                cap = None if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit
                if spec.cohort is None:
                    cap = quota.nominal
                if cap is not None and used.get(resource, 0) > cap:
                    out.append(f"queue {name}: {resource} usage {used.get(resource, 0)} > {cap}")
        return out


def _memory_by_index(state: NodeState) -> dict[int, int]:
    return {g.index: g.memory_mib for g in state.node.gpus}


def _could_ever_fit(state: NodeState, task: Task) -> bool:
    req = task.request
    node = state.node
    if node.cpu_milli is not None and task.cpu_milli > node.cpu_milli:
        return False
    if node.memory_mib is not None and task.memory_mib > node.memory_mib:
        return False
    usable = [g for g in node.gpus if req.allows(g.product) and req.mib_on(g) <= g.memory_mib]
    return len(usable) >= req.count
