"""The scheduling cycle: queue heads in order, quota, placement, preemption, decisions.

Watch handlers never decide (Kueue's shape): they feed :class:`Scheduler` with tasks,
nodes and queues; :meth:`Scheduler.cycle` reads the pending tasks in order and returns
decisions for the adapter to carry out. An admission is assumed at once (reserved in the
cluster state and charged to quota) so later tasks of the same cycle see it; the adapter
calls :meth:`Scheduler.unadmit` if the API write fails.

A preemptor is *nominated*: its placement is reserved at once, so nothing else can take the
capacity its victims free, and it is admitted by a later cycle once every victim has reported
gone (:meth:`Scheduler.victim_gone`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from gputask.core.cluster import ClusterState, NodeState
from gputask.core.failures import (
    GPU_FAILURE,
    MAX_RESCHEDULES_EXCEEDED,
    NODE_FAILURE,
    FailureNotice,
    FailureTracker,
    tasks_on_bad_gpus,
)
from gputask.core.model import Node, NodeName, Placement, Task, TaskKey
from gputask.core.placement import DEFAULT_POLICY, Policy, QuotaCheck, find_placement, make_policy
from gputask.core.preemption import Plan, Planner, Victim, any_preemption, victim_allowed
from gputask.core.queues import QueueManager
from gputask.core.quota import QueueSpec, QuotaBook, Usage, add_usage, usage_of
from gputask.core.reasons import (
    INADMISSIBLE,
    PREEMPTING,
    QUEUE_HELD,
    QUEUE_NOT_FOUND,
    WAITING_FOR_HEAD,
    explain,
    min_usage,
    namespace_refusal,
    never_fits_queue,
    queue_status,
    violations,
)


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit ``task`` with ``placement``; ``usage`` is what it charges its queue."""

    task: Task
    placement: Placement
    usage: Usage


@dataclass(frozen=True, slots=True)
class Pending:
    """``task`` stays pending; emitted when ``reason`` or ``message`` changes, or when its
    ``position`` in its queue (0 = head) changes among the first :data:`TRACKED_POSITIONS`.

    ``position`` is left out of equality: it is a report, not a decision.
    """

    task: Task
    reason: str
    message: str
    position: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict running ``task`` from ``placement``; it is requeued in its old place.

    ``reason`` is Preempted, NodeFailure, GPUFailure or QueueDrained; ``by`` names the preemptor.
    """

    task: Task
    placement: Placement
    reason: str
    message: str
    by: TaskKey | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """``task`` failed for good (e.g. MaxReschedulesExceeded); it is no longer queued."""

    task: Task
    reason: str
    message: str


Decision = Admit | Pending | Evict | Fail

TRACKED_POSITIONS = 100
"""Queue positions are reported as they change for this many heads of each queue; further back,
only with a new reason (tens of thousands of pending tasks must not mean as many writes)."""


@dataclass(slots=True)
class _Running:
    task: Task
    placement: Placement
    usage: Usage
    admitted_at: float


@dataclass(slots=True)
class _Nominated:
    task: Task
    placement: Placement
    usage: Usage
    waiting_for: set[TaskKey]


@dataclass(slots=True)
class _CycleMemo:
    """What failed earlier in this cycle; valid all cycle because capacity only shrinks."""

    outcomes: dict[tuple[object, ...], tuple[str, str]] = field(default_factory=dict)
    blocked_queues: set[str] = field(default_factory=set)
    preemption_failed: set[tuple[object, ...]] = field(default_factory=set)


class Scheduler:
    """Owns the cluster state, the queues and quota; decides in :meth:`cycle`.

    Deterministic: the same calls in the same order give the same decisions.
    """

    def __init__(
        self, *, policy: Policy | None = None, nodes: Iterable[Node] = (), node_failure_grace_s: float = 60.0
    ) -> None:
        self.policy = policy or make_policy(DEFAULT_POLICY)
        self.cluster = ClusterState()
        self.failures = FailureTracker(node_failure_grace_s)
        self.not_ready: set[NodeName] = set()
        self._largest_gpu_mib = 0  # never decreases: min_usage stays a lower bound
        self._carry: list[Decision] = []  # decisions made outside a cycle, emitted by the next one
        self.quotas = QuotaBook()
        self.pending = QueueManager()
        self.running: dict[TaskKey, _Running] = {}
        self.nominated: dict[TaskKey, _Nominated] = {}
        self.reasons: dict[TaskKey, tuple[str, str, int]] = {}
        for node in nodes:
            self.set_node(node)

    # -- inputs ---------------------------------------------------------------------------
    def set_queue(self, spec: QueueSpec) -> None:
        """Add or update a GPUClusterQueue."""
        self.quotas.set_queue(spec)

    def remove_queue(self, name: str) -> None:
        """Remove a queue; its pending tasks wait with reason QueueNotFound."""
        self.quotas.remove_queue(name)

    def set_node(self, node: Node) -> list[TaskKey]:
        """Add or update a node; tasks on GPUs now unhealthy or gone are queued for GPUFailure.

        A node reported NotReady (:meth:`node_ready`) stays unschedulable whatever ``node`` says.
        Returns the keys of the tasks queued for eviction.
        """
        if node.name in self.not_ready and node.schedulable:
            node = replace(node, schedulable=False)
        self._largest_gpu_mib = max([self._largest_gpu_mib, *(g.memory_mib for g in node.gpus)])
        self.cluster.set_node(node)
        lost = tasks_on_bad_gpus(self.cluster.node(node.name))
        self.failures.notify(lost, GPU_FAILURE, f"a GPU of node {node.name} failed or disappeared")
        return lost

    def remove_node(self, name: NodeName) -> list[TaskKey]:
        """A node is deleted: its tasks are queued for eviction (NodeFailure) and it is forgotten."""
        lost = sorted(self.cluster.node(name).tasks) if self.cluster.has_node(name) else []
        self.failures.notify(lost, NODE_FAILURE, f"node {name} is not in the cluster any more", override=True)
        self._carry.extend(self._evict_failed(self.failures.take()))  # release before the node goes
        self.cluster.remove_node(name)
        self.failures.node_up(name)
        self.not_ready.discard(name)
        return lost

    def node_ready(self, name: NodeName, ready: bool, now: float) -> None:
        """Report a node's readiness at ``now``: NotReady stops new work at once and evicts
        its tasks after the grace period; Ready in time changes nothing."""
        if ready:
            self.not_ready.discard(name)
            self.failures.node_up(name)
        else:
            self.not_ready.add(name)
            self.failures.node_down(name, now)
        if self.cluster.has_node(name):
            state = self.cluster.node(name)
            self.set_node(replace(state.node, schedulable=ready))

    def node_failed(self, name: NodeName, why: str) -> list[TaskKey]:
        """Fail a node at once (out-of-service taint): queue its tasks for NodeFailure eviction."""
        self.node_ready(name, False, float("-inf"))
        lost = sorted(self.cluster.node(name).tasks) if self.cluster.has_node(name) else []
        self.failures.notify(lost, NODE_FAILURE, f"node {name} failed: {why}")
        return lost

    def submit(self, task: Task) -> None:
        """Queue a task (or replace its pending version). Running tasks are left alone."""
        if task.key not in self.running and task.key not in self.nominated:
            self.pending.push(task)

    def restore(self, task: Task, placement: Placement, admitted_at: float = 0.0) -> None:
        """Record a task already running with ``placement`` (after a restart): never refused."""
        if task.key in self.running:
            return
        if not self.cluster.has_node(placement.node):  # its node is gone: a node failure, not a loss
            self.running[task.key] = _Running(task, placement, {}, admitted_at)
            self.failures.notify([task.key], NODE_FAILURE, f"node {placement.node} is not in the cluster any more")
            self._carry.extend(self._evict_failed(self.failures.take()))
            return
        self.pending.discard(task.key)
        self.cluster.force_reserve(task, placement)
        usage = self._usage(placement)
        self.quotas.charge(task.queue, usage)
        self.running[task.key] = _Running(task, placement, usage, admitted_at)
        if task.key in tasks_on_bad_gpus(self.cluster.node(placement.node)):
            self.failures.notify([task.key], GPU_FAILURE, f"a GPU of node {placement.node} failed or disappeared")

    def set_reschedules(self, key: TaskKey, count: int) -> None:
        """Restore how many failure evictions a task has had (from its status, after a restart)."""
        if count > 0:
            self.failures.counts[key] = count

    def reschedules(self, key: TaskKey) -> int:
        """Failure evictions of ``key`` so far."""
        return self.failures.counts.get(key, 0)

    def finish(self, key: TaskKey) -> Placement | None:
        """Forget a task (finished, deleted or evicted): release GPUs and quota.

        Decisions about it made outside a cycle and not yet emitted are dropped: the adapter
        has moved on (e.g. the task was deleted right after its node was).
        """
        self.pending.discard(key)
        self.reasons.pop(key, None)
        if self._carry:  # in place: callers may hold the list (``self._carry.extend(...)``)
            self._carry[:] = [d for d in self._carry if d.task.key != key]
        held = self.running.pop(key, None) or self.nominated.pop(key, None)
        if held is None:
            return None
        self.cluster.release(key)
        self.quotas.charge(held.task.queue, held.usage, -1)
        return held.placement

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

    def victim_gone(self, key: TaskKey) -> None:
        """A preempted task's workload has terminated: its preemptor stops waiting for it."""
        for nominated in self.nominated.values():
            nominated.waiting_for.discard(key)

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

        0. evict tasks on failed GPUs and on nodes down past the grace period;
        1. admit nominated preemptors whose victims are gone;
        2. drain queues with stopPolicy HoldAndDrain;
        3. take pending tasks in order (fair share across a cohort, then priority, creation);
        4. check the queue (exists, not held, namespace allowed, StrictFIFO head);
        5. find a placement that fits quota (failures memoised per shape within the cycle);
        6. else plan a preemption on one node; 7. admit, nominate, or record why it waits.
        """
        memo = _CycleMemo()
        decisions, self._carry = self._carry, []
        decisions += self._failure_evictions(now)
        decisions += self._admit_nominated(now)
        decisions += self._drain()
        positions: dict[str, int] = {}
        for task in self._ordered():
            if task.key not in self.pending:
                continue
            position = positions.get(task.queue, 0)  # still-pending tasks ahead in its queue
            for decision in self._try(task, memo, now):
                if not isinstance(decision, Pending):
                    decisions.append(decision)
                    continue
                last = self.reasons.get(task.key)
                moved = last is not None and last[2] != position and position < TRACKED_POSITIONS
                if last is None or last[:2] != (decision.reason, decision.message) or moved:
                    self.reasons[task.key] = (decision.reason, decision.message, position)
                    decisions.append(replace(decision, position=position))
            if task.key in self.pending:
                positions[task.queue] = position + 1
        return decisions

    def _failure_evictions(self, now: float) -> list[Decision]:
        for name in self.failures.expired(now):
            if self.cluster.has_node(name):
                lost = sorted(self.cluster.node(name).tasks)
                grace = self.failures.grace_s
                self.failures.notify(lost, NODE_FAILURE, f"node {name} NotReady for more than {grace:g}s")
        return self._evict_failed(self.failures.take())

    def _evict_failed(self, notices: Iterable[FailureNotice]) -> list[Decision]:
        out: list[Decision] = []
        for notice in notices:
            held = self.running.get(notice.key) or self.nominated.get(notice.key)
            if held is None:
                continue
            count = self.failures.counts[notice.key] = self.failures.counts.get(notice.key, 0) + 1
            out.append(Evict(held.task, held.placement, notice.reason, notice.message))
            if count > held.task.max_reschedules:
                self.finish(notice.key)
                limit = held.task.max_reschedules
                out.append(
                    Fail(held.task, MAX_RESCHEDULES_EXCEEDED, f"{notice.message}; rescheduled {limit} times already")
                )
            else:
                self.finish(notice.key)
                self.pending.push(held.task)
        return out

    def _admit_nominated(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for key in [k for k, n in self.nominated.items() if not n.waiting_for]:
            nominated = self.nominated.pop(key)
            self.running[key] = _Running(nominated.task, nominated.placement, nominated.usage, now)
            out.append(Admit(nominated.task, nominated.placement, nominated.usage))
        return out

    def _drain(self) -> list[Decision]:
        out: list[Decision] = []
        for key, run in list(self.running.items()):
            spec = self.quotas.specs.get(run.task.queue)
            if spec is not None and spec.stop_policy == "HoldAndDrain":
                self.evict(key)
                out.append(Evict(run.task, run.placement, "QueueDrained", f"GPUClusterQueue {spec.name!r} is draining"))
        return out

    def _ordered(self) -> Iterable[Task]:
        """Pending tasks in order; with fair sharing, queues with the lower share go first."""
        if not any(s.fair_sharing_weight_milli is not None for s in self.quotas.specs.values()):
            return self.pending
        shares = {name: self.quotas.share(name) for name in self.quotas.specs}
        return sorted(self.pending, key=lambda t: shares.get(t.queue, 0.0))  # stable: order within a share

    def _try(self, task: Task, memo: _CycleMemo, now: float) -> list[Decision]:
        gate = self._queue_gate(task, memo)
        if gate is not None:
            return [gate]
        spec = self.quotas.specs[task.queue]
        shape = (task.queue, task.request, task.cpu_milli, task.memory_mib)
        known = memo.outcomes.get(shape)
        if known is None:
            quota = self._quota_check(task)
            outcome = find_placement(self.cluster, task, self.policy, quota=quota)
            if outcome.placement is not None:
                return [self._admit(task, outcome.placement, now)]
            known = never_fits_queue(task, self.quotas) or explain(task, outcome, self.quotas, self.cluster)
            memo.outcomes[shape] = known
        # Tasks come in priority order, then creation order: if preemption failed for this shape
        # at this priority, it fails for every later task of the same shape and priority.
        attempt = (shape, task.priority)
        if known[0] != INADMISSIBLE and any_preemption(spec) and attempt not in memo.preemption_failed:
            preempted = self._preempt(task, self._quota_check(task))
            if preempted:
                return preempted
            memo.preemption_failed.add(attempt)
        if spec.strategy == "StrictFIFO" and known[0] != INADMISSIBLE:  # what can never fit blocks nobody
            memo.blocked_queues.add(task.queue)
        return [Pending(task, *known)]

    def _queue_gate(self, task: Task, memo: _CycleMemo) -> Pending | None:
        spec = self.quotas.specs.get(task.queue)
        if spec is None:
            return Pending(task, QUEUE_NOT_FOUND, f"GPUClusterQueue {task.queue!r} does not exist")
        if spec.stop_policy != "None":
            return Pending(task, QUEUE_HELD, f"GPUClusterQueue {task.queue!r} is stopped ({spec.stop_policy})")
        refusal = namespace_refusal(task, spec)
        if refusal is not None:
            return Pending(task, *refusal)
        if task.queue in memo.blocked_queues:
            return Pending(task, WAITING_FOR_HEAD, f"StrictFIFO: waiting behind the head of {task.queue!r}")
        return None

    def _quota_check(self, task: Task) -> QuotaCheck:
        name = task.queue

        def check(state: NodeState, placement: Placement) -> str | None:
            return self.quotas.refuses(name, usage_of(placement, _memory_by_index(state)))

        return check

    def _admit(self, task: Task, placement: Placement, now: float) -> Admit:
        usage = self._reserve(task, placement)
        self.running[task.key] = _Running(task, placement, usage, now)
        return Admit(task, placement, usage)

    def _reserve(self, task: Task, placement: Placement) -> Usage:
        self.pending.discard(task.key)
        self.reasons.pop(task.key, None)
        self.cluster.reserve(task, placement)
        usage = self._usage(placement)
        self.quotas.charge(task.queue, usage)
        return usage

    def _usage(self, placement: Placement) -> Usage:
        return usage_of(placement, _memory_by_index(self.cluster.node(placement.node)))

    # -- preemption -----------------------------------------------------------------------------
    def _preempt(self, task: Task, quota: QuotaCheck) -> list[Decision]:
        """Plan and start a preemption for ``task``; [] when none helps.

        Reclaim rules apply only when the preemptor stays within its nominal quota. The first
        plan assumes what the task's smallest possible usage says; if its real placement would
        borrow after all, the plan is redone under the stricter borrowing rules.
        """
        borrowing = self.quotas.would_borrow(task.queue, self._min_usage(task))
        plan = self._plan(task, quota, borrowing)
        if plan is not None and not borrowing and self._borrows_with(task, plan):
            plan = self._plan(task, quota, True)
        if plan is None or not self._fair_with(task, plan):
            return []
        decisions: list[Decision] = []
        for victim in plan.victims:
            self.evict(victim.task.key)
            message = f"preempted by {task.key} (priority {task.priority}) in GPUClusterQueue {task.queue!r}"
            decisions.append(Evict(victim.task, victim.placement, "Preempted", message, by=task.key))
        usage = self._reserve(task, plan.placement)
        self.nominated[task.key] = _Nominated(task, plan.placement, usage, {v.task.key for v in plan.victims})
        waiting = ", ".join(sorted(v.task.key for v in plan.victims))
        decisions.append(Pending(task, PREEMPTING, f"preempting {waiting} on {plan.placement.node}"))
        return decisions

    def _plan(self, task: Task, quota: QuotaCheck, borrowing: bool) -> Plan | None:
        candidates = self._candidates(task, borrowing)
        if not candidates:
            return None
        return Planner(self.cluster, self.quotas, self.policy).plan(task, candidates, quota)

    def _borrows_with(self, task: Task, plan: Plan) -> bool:
        """Would ``task``'s queue use more than its nominal quota after ``plan``?"""
        spec = self.quotas.specs[task.queue]
        used = dict(self.quotas.usage.get(task.queue, {}))
        for victim in plan.victims:
            if victim.task.queue == task.queue:
                for resource, amount in victim.usage.items():
                    used[resource] = used.get(resource, 0) - amount
        usage = self._usage(plan.placement)
        return any(used.get(r, 0) + usage.get(r, 0) > q.nominal for r, q in spec.quotas.items())

    def _fair_with(self, task: Task, plan: Plan) -> bool:
        """Kueue's fair-sharing rule checked on the real plan: after it, the preemptor's queue
        share is at most each victim queue's share after, and below its share before."""
        if not self.quotas.fair_sharing(task.queue):
            return True
        freed: dict[str, Usage] = {}
        for victim in plan.victims:
            add_usage(freed.setdefault(victim.task.queue, {}), victim.usage)
        mine = dict(self._usage(plan.placement))
        add_usage(mine, freed.get(task.queue, {}), -1)
        mine_after = self.quotas.share(task.queue, mine)
        for queue, usage in freed.items():
            if queue == task.queue:
                continue
            after = self.quotas.share(queue, {r: -a for r, a in usage.items()})
            if not (mine_after <= after and mine_after < self.quotas.share(queue)):
                return False
        return True

    def _min_usage(self, task: Task) -> Usage:
        return min_usage(task, self._largest_gpu_mib)

    def _candidates(self, task: Task, borrowing: bool) -> dict[str, list[Victim]]:
        """Running tasks the policies allow ``task`` to preempt, by node."""
        fair = self.quotas.fair_sharing(task.queue)
        out: dict[str, list[Victim]] = {}
        share_ok = self._share_rule(task) if fair else None
        for run in self.running.values():
            victim = Victim(run.task, run.placement, run.usage, run.admitted_at)
            allowed = victim_allowed(
                task, run.task, quotas=self.quotas, borrowing=borrowing, share_ok=share_ok, victim_entry=victim
            )
            if allowed:
                out.setdefault(run.placement.node, []).append(victim)
        return out

    def _share_rule(self, task: Task) -> Callable[[Victim], bool]:
        """Kueue's fair-sharing preemption rule, evaluated for one victim at a time."""
        mine_after = self.quotas.share(task.queue, self._min_usage(task))

        def ok(victim: Victim) -> bool:
            before = self.quotas.share(victim.task.queue)
            after = self.quotas.share(victim.task.queue, {r: -a for r, a in victim.usage.items()})
            return mine_after <= after and mine_after < before

        return ok

    # -- reports ------------------------------------------------------------------------------
    def queue_status(self) -> dict[str, dict[str, object]]:
        """Per queue: usage (milli-GPU, MiB), borrowed, pending and admitted counts."""
        return queue_status(self)

    def violations(self) -> list[str]:
        """Broken invariants: GPU over-commit and quota beyond what the queue could ever hold."""
        return violations(self)


def _memory_by_index(state: NodeState) -> dict[int, int]:
    return {g.index: g.memory_mib for g in state.node.gpus}
