"""The scheduler: a thin facade over the parts Kueue splits its scheduler into.

Watch handlers never decide (Kueue's shape): they feed :class:`Scheduler` with tasks, nodes and queues;
:meth:`Scheduler.cycle` reads the pending tasks in order and returns decisions for the adapter to carry out.

The parts, each the one writer of its state:

- :class:`~gputask.core.cache.Cache` (Kueue's pkg/cache): reservations and quota charges (its
  :class:`~gputask.core.ledger.Ledger`), nodes and their health, queue specs, flavors; its ``generation`` changes
  with every change;
- :class:`~gputask.core.queueing.Queues` (Kueue's pkg/queue): pending tasks in each ClusterQueue's order,
  new arrivals, backoffs, the waits said with positions, the order across cohorts; its own ``generation``;
- :class:`~gputask.core.transitions.Transitions`: a workload's moves between the two outside a cycle (requeue,
  finish, evictions) and the decisions they make before the next cycle;
- :class:`~gputask.core.cycle.Cycle`: decides; preemption trials run on snapshots
  (:mod:`gputask.core.snapshot`);
- :class:`~gputask.core.view.SchedulerView`: what reports read (this facade implements it).

A cycle is skipped when neither generation changed since a cycle that changed nothing (and no deadline passed,
and the policy scores by node state alone), tried incrementally when only new tasks came, else walks every
pending task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gputask.core.budget import MemoryBudget
from gputask.core.cache import Cache
from gputask.core.cycle import Cycle
from gputask.core.decisions import (
    MERGE_ADDED,
    TRACKED_POSITIONS,
    Admit,
    CycleStats,
    Decision,
    Evict,
    Fail,
    Pending,
)
from gputask.core.defrag import DefragConfig, Defragmenter, DefragPlan
from gputask.core.ledger import Entry
from gputask.core.model import Node, NodeName, Placement, Task, TaskKey
from gputask.core.placement import DEFAULT_POLICY, Policy, make_policy
from gputask.core.preemption import DEFAULT_STRATEGIES, strategies_of
from gputask.core.queueing import Queues
from gputask.core.reasons import NAMESPACE_NOT_ALLOWED, namespace_refusal, queue_status, violations
from gputask.core.transitions import Transitions

__all__ = [
    "MERGE_ADDED",
    "TRACKED_POSITIONS",
    "Admit",
    "CycleStats",
    "Decision",
    "Evict",
    "Fail",
    "Pending",
    "Scheduler",
]


class Scheduler:
    """The facade the adapter and the simulator call: inputs go to the part that owns them, :meth:`cycle` decides.

    Deterministic: the same calls in the same order give the same decisions, whether a cycle is skipped, tried
    incrementally or walks every pending task (``incremental=False`` always walks; :attr:`stats` says what the
    last cycle did). ``waiting_by_reason`` and ``waiting_by_filter`` count the waits said, as they change.

    The inputs and reads are the parts' own methods, bound here under the names the adapter has always called:
    :class:`~gputask.core.cache.Cache` (``set_queue``, ``remove_queue``, ``set_flavor``, ``remove_flavor``,
    ``set_node``, ``node_ready``, ``node_failed``, ``hold``, ``revise``, ``victim_gone``, ``admit_placed``,
    ``set_reschedules``, ``reschedules``, ``placement_of``), :class:`~gputask.core.queueing.Queues` (``defer``,
    ``undefer``), :class:`~gputask.core.transitions.Transitions` (``submit``, ``remove_node``, ``evict``,
    ``memory_used``, ``requeue``; :meth:`restore` and :meth:`finish` are methods here) and
    :class:`~gputask.core.cycle.Cycle` (``place``, ``gate``, ``variants``, ``try_place``, ``preemption_plan``).
    """

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        nodes: Iterable[Node] = (),
        node_failure_grace_s: float = 60.0,
        preemption_strategies: Sequence[str] = DEFAULT_STRATEGIES,
        tracked_positions: int = TRACKED_POSITIONS,
        memory_budget: MemoryBudget | None = None,
        incremental: bool = True,
        defragmentation: DefragConfig | None = None,
    ) -> None:
        chosen = policy or make_policy(DEFAULT_POLICY)
        self.memory_budget = memory_budget or MemoryBudget()
        self.incremental = incremental  # False: every cycle walks every pending task (the way before; benchmarks)
        self.strategies = strategies_of(preemption_strategies)
        self.tracked_positions = tracked_positions  # heads of each queue whose position changes are reported
        cache = self.cache = Cache(node_failure_grace_s)
        queues = self.queues = Queues()
        moves = self.moves = Transitions(cache, queues, self.memory_budget)
        self.defrag = Defragmenter(defragmentation)
        self.cycles = Cycle(cache, queues, moves, chosen, self.strategies, tracked_positions, self.defrag)
        # what reports read (SchedulerView), owned by the parts:
        self.cluster, self.quotas, self.ledger, self.health = cache.cluster, cache.quotas, cache.ledger, cache.health
        self.flavors, self.invalid_flavors, self.inactive = cache.flavors, cache.invalid_flavors, cache.inactive
        self.revisions = cache.revisions
        self.pending, self.deferred, waits = queues.pending, queues.deferred, queues.waits
        self.reasons, self.filters = waits.reasons, waits.filters
        self.waiting_by_reason, self.waiting_by_filter = waits.waiting_by_reason, waits.waiting_by_filter
        # inputs, each to its owner:
        self.set_queue, self.remove_queue = cache.set_queue, cache.remove_queue
        self.set_flavor, self.remove_flavor = cache.set_flavor, cache.remove_flavor
        self.set_node, self.node_ready, self.node_failed = cache.set_node, cache.node_ready, cache.node_failed
        self.hold, self.revise, self.victim_gone = cache.hold, cache.revise, cache.victim_gone
        self.admit_placed, self.placement_of = cache.admit_placed, cache.placement_of
        self.set_reschedules, self.reschedules = cache.set_reschedules, cache.reschedules
        self.defer, self.undefer = queues.defer, queues.undefer
        self.submit, self.remove_node = moves.submit, moves.remove_node
        self.evict, self.memory_used, self.requeue = moves.evict, moves.memory_used, moves.requeue
        self.place, self.gate, self.variants = self.cycles.place, self.cycles.gate, self.cycles.variants
        self.try_place, self.preemption_plan = self.cycles.try_place, self.cycles.preemption_plan
        self._seen: tuple[int, int] | None = None  # the generations after a cycle that changed nothing
        self._deadline = float("inf")  # the next time something changes by itself: a backoff ends, a grace period
        self._quiet_policy: int | None = None  # the policy's generation after a cycle that changed nothing
        for node in nodes:
            self.set_node(node)

    @property
    def running(self) -> dict[TaskKey, Entry]:
        """Admitted tasks by key (read-only by convention: the ledger writes it)."""
        return self.ledger.running

    @property
    def nominated(self) -> dict[TaskKey, Entry]:
        """Preemptors waiting for their victims, by key (read-only by convention)."""
        return self.ledger.nominated

    @property
    def policy(self) -> Policy:
        """The placement policy the cycle scores with."""
        return self.cycles.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.cycles.policy = policy

    @property
    def stats(self) -> CycleStats:
        """What the last :meth:`cycle` did."""
        return self.cycles.stats

    @property
    def largest_gpu_mib(self) -> int:
        """The largest GPU seen (MiB)."""
        return self.cache.largest_gpu_mib

    # -- inputs the adapter's restart and finish paths call (methods, so a test can wrap them) -------------
    def restore(
        self,
        task: Task,
        placement: Placement,
        admitted_at: float = 0.0,
        *,
        charge: bool = True,
        flavor: str | None = None,
    ) -> bool:
        """Record a task already running with ``placement`` after a restart (:meth:`Transitions.restore`)."""
        return self.moves.restore(task, placement, admitted_at, charge=charge, flavor=flavor)

    def finish(self, key: TaskKey) -> Placement | None:
        """Forget a task or a hold: release GPUs and quota (:meth:`Transitions.finish`)."""
        return self.moves.finish(key)

    # -- the cycle ------------------------------------------------------------------------
    def cycle(self, now: float = 0.0) -> list[Decision]:
        """Run one scheduling cycle at time ``now`` (seconds); returns decisions in order.

        A cycle costs what changed (:attr:`stats` says which way it went). When the last cycle changed nothing
        (it only said why tasks wait), neither the cache's nor the queues' generation changed since, and no
        deadline passed (a backoff's end, a node's grace period), a cycle would find what the last one found for
        every task: it is skipped. When only new tasks came, each is tried alone (:meth:`Cycle.incremental`); if
        every one waits, that is the whole cycle. Otherwise the walk (:meth:`Cycle.walk`) tries every pending task
        in order. Both shortcuts need a policy that scores by node state alone and learns nothing from the tasks
        it sees (``scores_by_state``, not ``learns``): a random or learning policy must see every try, as before.
        """
        cycles, queues = self.cycles, self.queues
        quiet = self._quiet(now)
        if quiet and not queues.new:
            cycles.stats = CycleStats("skipped", 0, cycles.stats.skipped + 1)
            return []
        decisions = cycles.incremental(now) if quiet else None
        if decisions is None:
            decisions = cycles.walk(now)
        queues.new.clear()
        changed = any(not isinstance(d, Pending) for d in decisions)
        self._seen = None if changed else self._generations()
        self._deadline = self._next_deadline(now)
        policy = self.policy
        self._quiet_policy = policy.generation if policy.scores_by_state and not policy.learns else None
        return decisions

    def _generations(self) -> tuple[int, int]:
        return (self.cache.generation, self.queues.generation)

    def _quiet(self, now: float) -> bool:
        """True when nothing but new tasks came since a cycle that changed nothing, and no deadline passed."""
        return (
            self.incremental
            and self._seen == self._generations()
            and not self.moves.carry
            and now < self._deadline
            and self._quiet_policy is not None
            and self._quiet_policy == self.policy.generation
        )

    def _next_deadline(self, now: float) -> float:
        """The first moment after ``now`` at which a waiting task's backoff ends or a NotReady node's grace
        period runs out (seconds; infinity when none)."""
        grace = self.health.failures.grace_s
        ends = self.queues.backoff_ends(now)
        ends += [since + grace for since in self.health.failures.down_since.values() if since + grace >= now]
        if self.defrag.wake_at > now:  # a refused move could be allowed by time alone (minRuntime, window, schedule)
            ends.append(self.defrag.wake_at)
        return min(ends, default=float("inf"))

    # -- reports ------------------------------------------------------------------------------
    def defrag_plan(self, task: Task, now: float) -> tuple[DefragPlan | None, str]:
        """The defragmentation a cycle at ``now`` would plan for waiting ``task`` and why none (``""`` with one),
        whatever the mode; changes nothing (planned on snapshots)."""
        return self.defrag.plan(task, self.cache, self.policy, now)

    def defrag_approved(self, plan: DefragPlan, now: float) -> list[Decision]:
        """Every PodDisruptionBudget allowed proposed ``plan``: apply it (:meth:`Defragmenter.approved`)."""
        return self.defrag.approved(plan, self.cache, self.queues, self.moves, now)

    def defrag_refused(self, plan: DefragPlan, task: TaskKey, why: str, now: float) -> None:
        """A PodDisruptionBudget refused the move of ``task`` in proposed ``plan`` (:meth:`Defragmenter.refused`);
        the next cycle looks again (another plan may hold) even if nothing else changed."""
        self.defrag.refused(plan, task, why, now)
        self._deadline = now

    def defrag_lines(self, task: Task, now: float) -> tuple[str, ...]:
        """What ``gputask explain`` says of defragmentation for ``task`` at ``now`` (:meth:`Defragmenter.explain`)."""
        return self.defrag.explain(task, self.cache, self.policy, now)

    def never_admits(self, task: Task) -> bool:
        """True when ``task``'s GPUClusterQueue exists and never admits it (its namespaceSelector does not select
        the task's namespace): such a task has no queue position and is not counted in the queue's pending work."""
        spec = self.quotas.specs.get(task.queue)
        return spec is not None and namespace_refusal(task, spec) is not None

    def parked_by_queue(self) -> dict[str, int]:
        """Per queue, its pending tasks it never admits (:meth:`never_admits`), as the last cycle said them
        (NamespaceNotAllowed): read off the waits' counts, so it costs the queues and reasons, not the tasks."""
        return {queue: n for (queue, reason), n in self.waiting_by_reason.items() if reason == NAMESPACE_NOT_ALLOWED}

    def queue_status(self) -> dict[str, dict[str, object]]:
        """Per queue: usage (milli-GPU, MiB), borrowed, pending and admitted counts."""
        return queue_status(self)

    def violations(
        self, *, nodes: Iterable[NodeName] | None = None, keys: Iterable[TaskKey] | None = None
    ) -> list[str]:
        """Broken invariants: GPU over-commit and quota beyond what the queue could ever hold; per-node and
        per-task checks on ``nodes`` and ``keys`` only when given (what changed since a previous check)."""
        return violations(self, nodes=nodes, keys=keys)


