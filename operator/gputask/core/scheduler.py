"""The scheduling cycle: queue heads in order, quota, placement, preemption, decisions.

Watch handlers never decide (Kueue's shape): they feed :class:`Scheduler` with tasks,
nodes and queues; :meth:`Scheduler.cycle` reads the pending tasks in order and returns
decisions for the adapter to carry out. An admission is assumed at once (reserved in the
ledger and charged to quota) so later tasks of the same cycle see it; the adapter calls
:meth:`Scheduler.requeue` if the API write fails.

A preemptor is *nominated*: its placement is reserved at once, so nothing else can take the
capacity its victims free, and it is admitted by a later cycle once every victim has reported
gone (:meth:`Scheduler.victim_gone`).

The parts: :class:`~gputask.core.ledger.Ledger` owns every reservation and quota charge;
:class:`~gputask.core.health.NodeHealth` owns the nodes and raises failure notices;
:class:`~gputask.core.queues.QueueManager` orders the pending tasks; the preemption rules are
in :mod:`gputask.core.preemption`. The scheduler ties them together in :meth:`Scheduler.cycle`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gputask.core.budget import EVICT, GPU_MEMORY_EXCEEDED, MemoryBudget, Overuse, overuse_text, overuses
from gputask.core.cluster import ClusterState, NodeState
from gputask.core.failures import MAX_RESCHEDULES_EXCEEDED, FailureNotice
from gputask.core.flavors import Flavor, holds, ineligible, variant
from gputask.core.health import NodeHealth
from gputask.core.ledger import Entry, Ledger
from gputask.core.model import Node, NodeName, Placement, PodPlacement, Task, TaskKey
from gputask.core.placement import (
    DEFAULT_POLICY,
    Outcome,
    Policy,
    QuotaCheck,
    TotalQuotaCheck,
    find_placement,
    make_policy,
)
from gputask.core.preemption import (
    DEFAULT_STRATEGIES,
    Plan,
    Planner,
    any_preemption,
    candidates,
    may_preempt,
    needing_preemption,
    strategies_of,
)
from gputask.core.queues import OrderKey, QueueManager, order_key
from gputask.core.quota import QueueSpec, QuotaBook, Usage, usage_of
from gputask.core.reasons import (
    NAMESPACE_NOT_ALLOWED,
    PREEMPTING,
    QUEUE_HELD,
    QUEUE_INACTIVE,
    QUEUE_NOT_FOUND,
    WAITING_FOR_HEAD,
    Reason,
    Wait,
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
    ``position`` in its queue (0 = head) changes among the first ``tracked_positions`` (:data:`TRACKED_POSITIONS`
    unless the scheduler was given another number).

    ``position`` is left out of equality: it is a report, not a decision; so is ``filters``
    (nodes refused per filter, see :class:`~gputask.core.reasons.Wait`), which is for metrics.
    """

    task: Task
    reason: str
    message: str
    position: int = field(default=-1, compare=False)
    filters: tuple[tuple[str, int], ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict running ``task`` from ``placement``; it is requeued in its old place.

    ``reason`` is Preempted, NodeFailure, GPUFailure, QueueDrained or GPUMemoryExceeded (and the adapter's
    own: JobDeleted, PodsNotStarting, PlacementConflict); ``by`` names the preemptor.
    ``held`` is the key under which the evicted workload keeps its GPUs (what a nominated
    preemptor did not take) until the adapter reports it gone with :meth:`Scheduler.finish`; a
    report, left out of equality.
    """

    task: Task
    placement: Placement
    reason: str
    message: str
    by: TaskKey | None = None
    held: TaskKey | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Fail:
    """``task`` failed for good (e.g. MaxReschedulesExceeded); it is no longer queued."""

    task: Task
    reason: str
    message: str


Decision = Admit | Pending | Evict | Fail

MERGE_ADDED = 1000
"""With cohorts, an incremental cycle orders what it emits from the keys of the tasks added since the last walk
(:meth:`Scheduler._merge_keys`); beyond this many, the walk decides (and starts the count over)."""

TRACKED_POSITIONS = 100
"""Queue positions are reported as they change for this many heads of each queue; further back,
only with a new reason (tens of thousands of pending tasks must not mean as many writes)."""


@dataclass(slots=True)
class _CycleMemo:
    """What failed earlier in this cycle; valid all cycle because capacity only shrinks."""

    outcomes: dict[tuple[object, ...], Wait] = field(default_factory=dict)
    blocked_queues: set[str] = field(default_factory=set)
    preemption_failed: set[tuple[object, ...]] = field(default_factory=set)
    namespaces: dict[tuple[str, tuple[tuple[str, str], ...]], Wait | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CycleStats:
    """What the last :meth:`Scheduler.cycle` did: ``mode`` is ``skipped`` (nothing changed since a cycle that
    changed nothing, and no deadline passed), ``incremental`` (only new tasks arrived: each tried alone) or
    ``full`` (every pending task walked in order); ``tried`` counts the pending tasks tried (queue, quota,
    placement, preemption); ``skipped`` the cycles skipped so far."""

    mode: str = "full"
    tried: int = 0
    skipped: int = 0


class _WouldChange(Exception):
    """Raised instead of admitting or preempting while new tasks are only probed (:meth:`Scheduler._incremental`)."""


class Scheduler:
    """Ties the ledger, node health, queues and quota together; decides in :meth:`cycle`.

    Deterministic: the same calls in the same order give the same decisions, whether a cycle is skipped, tried
    incrementally or walks every pending task (``incremental=False`` always walks; :attr:`stats` says what the
    last cycle did). ``waiting_by_reason`` and ``waiting_by_filter`` count the waits said, as they change.
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
    ) -> None:
        self.policy = policy or make_policy(DEFAULT_POLICY)
        self.memory_budget = memory_budget or MemoryBudget()
        self.incremental = incremental  # False: every cycle walks every pending task (the way before; benchmarks)
        self.strategies = strategies_of(preemption_strategies)
        self.tracked_positions = tracked_positions  # heads of each queue whose position changes are reported
        self.cluster = ClusterState()
        self.quotas = QuotaBook()
        self.ledger = Ledger(self.cluster, self.quotas)
        self.health = NodeHealth(self.cluster, node_failure_grace_s)
        self.pending = QueueManager()
        self.reasons: dict[TaskKey, tuple[str, str, int]] = {}
        self.filters: dict[TaskKey, tuple[tuple[str, int], ...]] = {}  # waiting tasks: nodes refused per filter
        # the waits said, counted as they change (metrics read these, not every waiting task):
        self.waiting_by_reason: dict[tuple[str, str], int] = {}  # (queue, reason) -> waiting tasks
        self.waiting_by_filter: dict[str, int] = {}  # filter -> waiting tasks some node refused by it
        self._said_in: dict[TaskKey, tuple[str, str]] = {}  # (queue, reason) each recorded reason is counted under
        self.deferred: dict[TaskKey, tuple[float, str, str]] = {}  # backoff: until (s), reason, message
        self.revisions: dict[TaskKey, Task | None] = {}  # what a placed task is requeued as (None: not at all)
        self.inactive: dict[str, str] = {}  # queues that exist but cannot be used: name -> why
        self.flavors: dict[str, Flavor] = {}  # GPUResourceFlavors by name
        self.invalid_flavors: dict[str, str] = {}  # flavors that exist but cannot be used: name -> why (a predicate)
        self._variant_cache: dict[TaskKey, tuple[Task, QueueSpec, list[Task]]] = {}  # this cycle's flavored tasks
        self._carry: list[Decision] = []  # decisions made outside a cycle, emitted by the next one
        self._departures = itertools.count(1)  # names the holds of evicted workloads
        # preemptions that found no plan, by (queue, shape, priority): the world then, the oldest task tried
        self._preemption_failed: dict[tuple[object, ...], tuple[tuple[int, int, int, int], tuple[float, str]]] = {}
        # what a cycle may skip (:meth:`cycle`): every input but a new task marks the scheduler changed
        self._changed = True
        self._new: dict[TaskKey, None] = {}  # tasks submitted since the last cycle (none pending before)
        self._deadline = float("inf")  # the next time something changes by itself: a backoff ends, a grace period
        self._quiet_policy: int | None = None  # the policy's generation after a cycle that changed nothing
        self._probing = False
        self._running_max: dict[TaskKey, tuple[bool, float, OrderKey]] = {}  # see _merged and _merge_keys
        self._added: dict[str, list[tuple[OrderKey, tuple[bool, float, OrderKey]]]] = {}
        self.stats = CycleStats()
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

    # -- inputs ---------------------------------------------------------------------------
    def set_queue(self, spec: QueueSpec) -> None:
        """Add or update a GPUClusterQueue."""
        self._changed = True
        self.quotas.set_queue(spec)
        self.inactive.pop(spec.name, None)

    def set_flavor(self, flavor: Flavor) -> None:
        """Add or update a ResourceFlavor (what each queue's quota of that flavor covers)."""
        self._changed = True
        self.flavors[flavor.name] = flavor
        self.invalid_flavors.pop(flavor.name, None)

    def remove_flavor(self, name: str, *, invalid: str | None = None) -> None:
        """Forget a ResourceFlavor: queues that list it admit nothing until it is back (Kueue: FlavorNotFound);
        ``invalid`` says why when it exists but cannot be used, as a predicate (``is invalid: ...``, ``is
        being deleted: ...``); None: it does not exist."""
        self._changed = True
        self.flavors.pop(name, None)
        if invalid is None:
            self.invalid_flavors.pop(name, None)
        else:
            self.invalid_flavors[name] = invalid

    def remove_queue(self, name: str, *, invalid: str | None = None) -> None:
        """Remove a queue; its pending tasks wait with reason QueueNotFound, or QueueInactive
        when the queue exists but its spec is ``invalid`` (the message says why)."""
        self._changed = True
        self.quotas.remove_queue(name)
        if invalid is None:
            self.inactive.pop(name, None)
        else:
            self.inactive[name] = invalid

    def set_node(self, node: Node) -> list[TaskKey]:
        """Add or update a node; tasks on GPUs now unhealthy or gone are queued for GPUFailure.

        A node reported NotReady (:meth:`node_ready`) stays unschedulable whatever ``node`` says.
        Returns the keys of the tasks queued for eviction. The same node again changes nothing.
        """
        before = self._node_generation(node.name)
        lost = self.health.set_node(node)
        if lost or before is None or self._node_generation(node.name) != before:
            self._changed = True
        return lost

    def remove_node(self, name: NodeName) -> list[TaskKey]:
        """A node is deleted: its tasks are queued for eviction (NodeFailure), what was held there for departing
        workloads is released (their pods go with the Node), and it is forgotten."""
        self._changed = True
        lost = self.health.node_removed(name)
        self._carry.extend(self._evict_failed(self.health.take()))  # release before the node goes
        self.ledger.release_holds_on(name)
        self.health.forget(name)
        return lost

    def node_ready(self, name: NodeName, ready: bool, now: float) -> None:
        """Report a node's readiness at ``now``: NotReady stops new work at once and evicts
        its tasks after the grace period; Ready in time changes nothing."""
        was = (self.health.is_down(name), self._node_generation(name))
        self.health.node_ready(name, ready, now)
        if was != (self.health.is_down(name), self._node_generation(name)):
            self._changed = True

    def node_failed(self, name: NodeName, why: str) -> list[TaskKey]:
        """Fail a node at once (out-of-service taint): queue its tasks for NodeFailure eviction."""
        self._changed = True
        return self.health.node_failed(name, why)

    def submit(self, task: Task) -> None:
        """Queue a task (or replace its pending version). Running tasks are left alone."""
        if self.ledger.get(task.key) is None:
            if task.key in self.pending:
                self._changed = True  # a new version of a waiting task: where it stands is tried anew
            else:
                self._new[task.key] = None
            self.pending.push(task)

    def restore(
        self,
        task: Task,
        placement: Placement,
        admitted_at: float = 0.0,
        *,
        charge: bool = True,
        flavor: str | None = None,
    ) -> bool:
        """Record a task already running with ``placement`` (after a restart): never refused.

        ``charge=False`` records a placement whose quota Kueue books (Kueue mode). ``flavor`` is the
        ResourceFlavor it was admitted in, as its Job or status says (None: found from the placement,
        :meth:`_flavor_of`). Returns False when the placement over-commits a GPU with what was restored
        before it (two beliefs about one GPU: the caller resolves it, e.g. by evicting the later one).
        """
        if task.key in self.ledger.running:
            return True
        self._changed = True
        self.pending.discard(task.key)
        task = self._flavor_of(task, placement, flavor)
        self.ledger.restore(task, placement, admitted_at, charge=charge)
        self.health.restored(task.key, placement)
        if not all(map(self.cluster.has_node, placement.nodes)):  # a node is gone: a node failure, not a loss
            self._carry.extend(self._evict_failed(self.health.take()))
            return True
        return not self.cluster.overcommitted(placement)

    def hold(self, key: TaskKey, placement: Placement, *, fit: bool = False) -> Placement | None:
        """Keep a departing workload's GPUs (a terminating Job) until :meth:`finish` of ``key``.

        ``fit``: hold only what is free now of each GPU (after an eviction, whatever a nominated
        preemptor did not take). Returns what is held.
        """
        self._changed = True
        return self.ledger.hold(key, placement, fit=fit)

    def evict(self, key: TaskKey, reason: str, message: str, *, failure: bool = False) -> None:
        """Evict a running task for something the adapter saw (its Job deleted, its pods never
        starting); the next cycle emits the Evict. ``failure`` counts it against maxReschedules."""
        entry = self.ledger.get(key)
        if entry is None:
            return
        self._changed = True
        if failure:
            self._carry.extend(self._evict_failed([FailureNotice(key, reason, message)]))
            return
        self.requeue(key)
        self._carry.append(Evict(entry.task, entry.placement, reason, message, held=self._hold_departing(entry)))

    def memory_used(self, key: TaskKey, used_by_index: Mapping[int, int]) -> tuple[Overuse, ...] | None:
        """Judge a running task's GPU memory use (MiB per GPU index of its node, what its pods use) against its
        placement (:mod:`gputask.core.budget`); returns its overuses, or None when it is not running (nothing
        to judge). With the Evict action an overusing task is evicted (GPUMemoryExceeded, counted against
        maxReschedules); the next cycle emits the Evict."""
        entry = self.ledger.running.get(key)
        if entry is None or len(entry.placement.pods) != 1:  # several pods: GPU indices alone name no node
            return None
        budget = self.memory_budget
        found = overuses(entry.placement.only(), used_by_index, budget.tolerance_mib)
        if found and budget.action == EVICT:
            message = f"uses more GPU memory than it reserved: {overuse_text(found, budget.tolerance_mib)}"
            self.evict(key, GPU_MEMORY_EXCEEDED, message, failure=True)
        return found

    def _hold_departing(self, entry: Entry) -> TaskKey | None:
        """Keep what an evicted workload still uses (its pods run until its Job is gone) under a new key."""
        key = TaskKey(f"{entry.task.key}#departing-{next(self._departures)}")
        return key if self.ledger.hold(key, entry.placement, fit=True) is not None else None

    def set_reschedules(self, key: TaskKey, count: int) -> None:
        """Restore how many failure evictions a task has had (from its status, after a restart)."""
        if count > 0 and self.health.failures.counts.get(key) != count:
            self._changed = True
            self.health.failures.counts[key] = count

    def reschedules(self, key: TaskKey) -> int:
        """Failure evictions of ``key`` so far."""
        return self.health.failures.counts.get(key, 0)

    def finish(self, key: TaskKey) -> Placement | None:
        """Forget a task (finished, deleted or evicted) or a hold: release GPUs and quota.

        Decisions about it made outside a cycle and not yet emitted are dropped: the adapter
        has moved on (e.g. the task was deleted right after its node was). Forgetting what it does not know
        changes nothing.
        """
        known = self.pending.discard(key) is not None
        self._forget_wait(key)
        known = self.deferred.pop(key, None) is not None or known
        known = key in self.revisions or known
        self.revisions.pop(key, None)
        if self._carry:  # in place: callers may hold the list (``self._carry.extend(...)``)
            self._carry[:] = [d for d in self._carry if d.task.key != key]
        released = self.ledger.release(key)
        if known or released is not None:
            self._changed = True
        return released.placement if isinstance(released, Entry) else released

    def requeue(self, key: TaskKey) -> Task | None:
        """Release a running (or nominated) task and queue it again in its old place.

        For an eviction, or to undo an admission whose API write failed. The task keeps its
        creation time, so it goes ahead of newer work; it is queued as its latest revision
        (:meth:`revise`). Returns the task queued, or None when it held nothing or its revision is
        None. The adapter records the reason and the attempt.
        """
        entry = self.ledger.get(key)
        if entry is None:
            return None
        self._changed = True
        revised = self.revisions.get(key, entry.task.unflavored or entry.task)
        self.finish(key)
        if revised is not None:
            self.pending.push(revised)
        return revised

    def revise(self, key: TaskKey, task: Task | None) -> None:
        """A placed task's spec changed: it is requeued as ``task`` (None: not requeued, its new spec
        is invalid) when it is next evicted. A running task itself never changes under its placement."""
        if self.ledger.get(key) is not None:
            self._changed = True
            self.revisions[key] = task

    def defer(self, key: TaskKey, until: float, reason: str, message: str) -> None:
        """Hold a pending task back until ``until`` (seconds, the cycle's clock): it waits with
        ``reason`` and is tried again at the first cycle at or after ``until`` (a backoff)."""
        self._changed = True
        self.deferred[key] = (until, reason, message)

    def undefer(self, key: TaskKey) -> None:
        """Try a deferred task at the next cycle."""
        if self.deferred.pop(key, None) is not None:
            self._changed = True

    def victim_gone(self, key: TaskKey) -> None:
        """A preempted task's workload has terminated: its preemptor stops waiting for it."""
        self._changed = True
        self.ledger.victim_gone(key)

    def placement_of(self, key: TaskKey) -> Placement | None:
        """Placement of a running task."""
        entry = self.ledger.running.get(key)
        return None if entry is None else entry.placement

    # -- placement only (Kueue mode: Kueue admits, gputask places) ---------------------------------
    def place(self, task: Task) -> Outcome:
        """Where ``task`` would go now, with no queue or quota involved; nothing is reserved."""
        return find_placement(self.cluster, task, self.policy)

    def admit_placed(self, task: Task, placement: Placement, now: float) -> None:
        """Reserve a placement whose quota Kueue booked: in the ledger, charged to no queue.

        Raises OverCommitError when the placement no longer fits.
        """
        self._changed = True
        self.ledger.admit(task, placement, now, charge=False)

    # -- the cycle ------------------------------------------------------------------------
    def cycle(self, now: float = 0.0) -> list[Decision]:
        """Run one scheduling cycle at time ``now`` (seconds); returns decisions in order.

        A cycle costs what changed (:attr:`stats` says which way it went). When the last cycle changed nothing
        (it only said why tasks wait), no input came since and no deadline passed (a backoff's end, a node's
        grace period), a cycle would find what the last one found for every task: it is skipped. When only new
        tasks came, each is tried alone (:meth:`_incremental`); if every one waits, that is the whole cycle.
        Otherwise the walk (:meth:`_walk`) tries every pending task in order. Both shortcuts need a policy that
        scores by node state alone and learns nothing from the tasks it sees (``scores_by_state``, not
        ``learns``): a random or learning policy must see every try, as before.
        """
        quiet = self._quiet(now)
        if quiet and not self._new:
            self.stats = CycleStats("skipped", 0, self.stats.skipped + 1)
            return []
        decisions = self._incremental(now) if quiet else None
        if decisions is None:
            decisions = self._walk(now)
        self._changed = any(not isinstance(d, Pending) for d in decisions)
        self._new.clear()
        self._deadline = self._next_deadline(now)
        policy = self.policy
        self._quiet_policy = policy.generation if policy.scores_by_state and not policy.learns else None
        return decisions

    def _quiet(self, now: float) -> bool:
        """True when nothing but new tasks came since a cycle that changed nothing, and no deadline passed."""
        return (
            self.incremental
            and not self._changed
            and not self._carry
            and now < self._deadline
            and self._quiet_policy is not None
            and self._quiet_policy == self.policy.generation
        )

    def _next_deadline(self, now: float) -> float:
        """The first moment after ``now`` at which a waiting task's backoff ends or a NotReady node's grace
        period runs out (seconds; infinity when none)."""
        grace = self.health.failures.grace_s
        ends = [until for until, _, _ in self.deferred.values() if until > now]
        ends += [since + grace for since in self.health.failures.down_since.values() if since + grace >= now]
        return min(ends, default=float("inf"))

    def _walk(self, now: float) -> list[Decision]:
        """Every pending task in order:

        0. evict tasks on failed GPUs and on nodes down past the grace period;
        1. admit nominated preemptors whose victims are gone;
        2. drain queues with stopPolicy HoldAndDrain;
        3. take pending tasks in order (fair share across a cohort, then priority, creation);
        4. check the queue (exists, not held, namespace allowed, StrictFIFO head);
        5. find a placement that fits quota (failures memoised per shape within the cycle);
        6. else plan a preemption on one node; 7. admit, nominate, or record why it waits.
        """
        memo = _CycleMemo()
        self._variant_cache.clear()  # flavors and queue specs change between cycles only
        decisions, self._carry = self._carry, []
        decisions += self._failure_evictions(now)
        decisions += self._admit_nominated(now)
        decisions += self._drain()
        positions: dict[str, int] = {}
        tried = 0
        for task in self._ordered():
            if task.key not in self.pending:
                continue
            position = positions.get(task.queue, 0)  # still-pending tasks ahead in its queue that it may admit
            tried += 1
            for decision in self._try(task, memo, now):
                if not isinstance(decision, Pending):
                    decisions.append(decision)
                    continue
                if decision.reason == NAMESPACE_NOT_ALLOWED:  # never admitted here: no place in the queue
                    position = -1
                self._note_filters(task.key, decision)
                last = self.reasons.get(task.key)
                moved = last is not None and last[2] != position and position < self.tracked_positions
                if last is None or last[:2] != (decision.reason, decision.message) or moved:
                    self._say(task, decision.reason, decision.message, position)
                    decisions.append(replace(decision, position=position))
            if task.key in self.pending and position >= 0:
                positions[task.queue] = position + 1
        self.stats = CycleStats("full", tried, self.stats.skipped)
        return decisions

    def _note_filters(self, key: TaskKey, decision: Pending) -> None:
        self._count_filters(self.filters.pop(key, ()), -1)
        if decision.filters:
            self.filters[key] = decision.filters
            self._count_filters(decision.filters, 1)

    def _count_filters(self, filters: tuple[tuple[str, int], ...], sign: int) -> None:
        for name, _ in filters:
            left = self.waiting_by_filter.get(name, 0) + sign
            if left:
                self.waiting_by_filter[name] = left
            else:
                del self.waiting_by_filter[name]

    def _say(self, task: Task, reason: str, message: str, position: int) -> None:
        """Record why ``task`` waits (and count it under its queue and reason)."""
        self._uncount_wait(task.key)
        self.reasons[task.key] = (reason, message, position)
        where = self._said_in[task.key] = (task.queue, str(reason))
        self.waiting_by_reason[where] = self.waiting_by_reason.get(where, 0) + 1

    def _uncount_wait(self, key: TaskKey) -> None:
        where = self._said_in.pop(key, None)
        if where is not None:
            left = self.waiting_by_reason[where] - 1
            if left:
                self.waiting_by_reason[where] = left
            else:
                del self.waiting_by_reason[where]

    def _forget_wait(self, key: TaskKey) -> None:
        """``key`` waits no more: drop its reason and filters (and their counts)."""
        self.reasons.pop(key, None)
        self._uncount_wait(key)
        self._count_filters(self.filters.pop(key, ()), -1)

    def _incremental(self, now: float) -> list[Decision] | None:
        """The cycle when only new tasks came since a cycle that changed nothing (O(new tasks x log pending), plus
        the tracked positions of the queues they joined); None when the walk must decide.

        Each new task is tried alone against the state the last cycle left (admitting or preempting raises
        :class:`_WouldChange` instead of doing it: an admission changes what every later task sees, so the walk
        then decides, in order). If every new task waits, the walk would emit the same: every task it tried
        before a state change finds what it found last time, so it emits a Pending for each new task (where
        it stands in its queue) and a new position for each waiting task a new one now stands ahead of (among
        the first ``tracked_positions`` of its queue), and nothing else, in the walk's order (with cohorts, from the
        keys the last walk gave each task as its queue's head: :meth:`_merge_keys`). A new task in a StrictFIFO
        queue goes to the walk (whether its head blocks it is decided in order).
        """
        new = sorted((t for key in self._new if (t := self.pending.get(key)) is not None), key=order_key)
        if len(self.reasons) != len(self.pending) - len(new) or any(
            (spec := self.quotas.specs.get(t.queue)) is not None and spec.strategy == "StrictFIFO" for t in new
        ):
            return None  # a waiting task without a reason said would be emitted by the walk
        memo, waits = _CycleMemo(), []
        self._variant_cache.clear()
        self._probing = True
        try:
            for task in new:
                waits.append(self._try(task, memo, now))
        except _WouldChange:
            return None
        finally:
            self._probing = False
        parked = {(t.queue, str(NAMESPACE_NOT_ALLOWED)) for t in new} & set(self.waiting_by_reason)
        if parked or any(
                isinstance(d, Pending) and d.reason == NAMESPACE_NOT_ALLOWED for tried in waits for d in tried):
            return None  # a rank would count tasks the queue never admits: the walk leaves them out
        out: list[Pending] = []
        for task, tried in zip(new, waits, strict=True):
            decision = tried[0]
            assert len(tried) == 1 and isinstance(decision, Pending)  # anything else raised _WouldChange
            out.append(replace(decision, position=self.pending.rank(task)))
        out += self._moved_behind(new)
        if not self._cohorts():  # the walk's order is the queues' order
            out.sort(key=lambda d: order_key(d.task))
        else:
            where = self._merge_keys(out, new)
            if where is None:
                return None
            out.sort(key=lambda d: where[d.task.key])
        for decision in out:  # nothing recorded before the order is known (the walk may still decide)
            self._note_filters(decision.task.key, decision)
            self._say(decision.task, decision.reason, decision.message, decision.position)
        self.stats = CycleStats("incremental", len(new), self.stats.skipped)
        return list(out)

    def _moved_behind(self, new: list[Task]) -> list[Pending]:
        """Waiting tasks that new ones now stand ahead of, at a new position among the tracked heads of their queue:
        a Pending with the same reason at the new position."""
        out: list[Pending] = []
        for queue in sorted({t.queue for t in new}):
            first = min(self.pending.rank(t) for t in new if t.queue == queue)
            for position, task in enumerate(self.pending.in_queue(queue, first, self.tracked_positions), first):
                last = self.reasons.get(task.key)
                if last is not None and task.key not in self._new and last[2] != position:
                    out.append(Pending(task, last[0], last[1], position, self.filters.get(task.key, ())))
        return out

    def _failure_evictions(self, now: float) -> list[Decision]:
        self.health.expired(now)
        return self._evict_failed(self.health.take())

    def _evict_failed(self, notices: Iterable[FailureNotice]) -> list[Decision]:
        """Evict what failure notices name; past ``maxReschedules`` the task fails for good.

        A task whose quota Kueue books (Kueue mode) is released, not queued here: Kueue requeues it.
        """
        out: list[Decision] = []
        for notice in notices:
            entry = self.ledger.get(notice.key)
            if entry is None:
                continue
            count = self.health.count_failure(notice.key)
            fails = count > entry.task.max_reschedules
            if entry.charged and not fails:
                self.requeue(notice.key)
            else:
                self.finish(notice.key)
            held = self._hold_departing(entry)
            out.append(Evict(entry.task, entry.placement, notice.reason, notice.message, held=held))
            if fails:
                limit = entry.task.max_reschedules
                out.append(
                    Fail(entry.task, MAX_RESCHEDULES_EXCEEDED, f"{notice.message}; rescheduled {limit} times already")
                )
        return out

    def _admit_nominated(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for key in self.ledger.ready():
            entry = self.ledger.promote(key, now)
            self._forget_wait(key)  # it said Preempting while nominated
            out.append(Admit(entry.task, entry.placement, entry.usage))
        return out

    def _drain(self) -> list[Decision]:
        out: list[Decision] = []
        if not any(spec.stop_policy == "HoldAndDrain" for spec in self.quotas.specs.values()):
            return out  # nothing drains: no need to walk every running task
        for key, entry in list(self.ledger.running.items()):
            spec = self.quotas.specs.get(entry.task.queue)
            if entry.charged and spec is not None and spec.stop_policy == "HoldAndDrain":
                self.requeue(key)
                why = f"GPUClusterQueue {spec.name!r} is draining"
                held = self._hold_departing(entry)
                out.append(Evict(entry.task, entry.placement, Reason.QUEUE_DRAINED, why, held=held))
        return out

    def _ordered(self) -> Iterable[Task]:
        """Pending tasks in Kueue's order: each queue's own in priority then creation order, and
        across the queues of cohorts the heads ordered as Kueue's ``entryOrdering``.

        Without cohorts that is the global order of :class:`QueueManager`; with them see
        :meth:`_merged`.
        """
        return self._merged() if self._cohorts() else self.pending

    def _cohorts(self) -> bool:
        return any(s.cohort is not None for s in self.quotas.specs.values())

    def _merged(self) -> Iterator[Task]:
        """Queue heads in Kueue's ``entryOrdering`` (pkg/scheduler): a head that fits its nominal quota
        before one that must borrow, then (fair sharing) the lower share after admitting the head
        (``DominantResourceShareWith``), then priority, then creation. A queue's next head is keyed
        after the previous one was decided (admitting it changes its queue's share), as Kueue's
        next cycle would. Keys: O(log queues) per task."""
        by_queue: dict[str, deque[Task]] = {}
        for task in self.pending:
            by_queue.setdefault(task.queue, deque()).append(task)
        heap = [(self._head_key(tasks[0]), name) for name, tasks in by_queue.items()]
        heapq.heapify(heap)
        self._running_max, self._added = {}, {}  # how _incremental puts what it emits in this order (_merge_keys)
        top: dict[str, tuple[bool, float, OrderKey]] = {}
        while heap:
            key, name = heapq.heappop(heap)
            tasks = by_queue[name]
            task = tasks.popleft()
            top[name] = max(top[name], key) if name in top else key
            self._running_max[task.key] = top[name]
            yield task
            if tasks:
                heapq.heappush(heap, (self._head_key(tasks[0]), name))

    def _merge_keys(self, emitted: list[Pending], new: list[Task]) -> dict[TaskKey, tuple[object, ...]] | None:
        """Sort keys that put ``emitted`` in :meth:`_merged`'s order while nothing changes its queues' keys (between
        cycles that admit nothing); None when one cannot be told, or when more than :data:`MERGE_ADDED` tasks came
        since the last walk (the walk then decides: it costs less than this does then).

        A merge that always takes the queue head with the lowest key yields the tasks in the order of the largest
        key of their queue up to them (each queue's keys being distinct from every other's; queue order breaks
        ties within a queue). So a task's sort key is that running maximum: the larger of the one the last walk
        recorded for the nearest task ahead that it walked and the largest key of the tasks added since that are
        ahead of it (a binary search in their running maxima), not a replay of the merge."""
        for task in new:
            bisect.insort(self._added.setdefault(task.queue, []), (order_key(task), self._head_key(task)))
        if sum(len(entries) for entries in self._added.values()) > MERGE_ADDED:
            return None
        added = {ok[2] for entries in self._added.values() for ok, _ in entries}
        ahead = {q: list(itertools.accumulate((k for _, k in entries), max)) for q, entries in self._added.items()}
        out: dict[TaskKey, tuple[object, ...]] = {}
        for decision in emitted:
            task = decision.task
            rank, entries = self.pending.rank(task), self._added.get(task.queue, [])
            keys = []
            if (at := bisect.bisect_right(entries, (order_key(task), (True, float("inf"), order_key(task))))) > 0:
                keys.append(ahead[task.queue][at - 1])
            walked = self._walked_ahead(task.queue, rank, added, len(entries))
            if walked is not None:
                if walked not in self._running_max:
                    return None
                keys.append(self._running_max[walked])
            out[task.key] = (max(keys), rank)
        return out

    def _walked_ahead(self, queue: str, rank: int, added: set[str], in_queue: int) -> TaskKey | None:
        """The nearest task at or ahead of ``rank`` in ``queue`` that the last walk saw (not one of the ``in_queue``
        tasks of ``added`` there); None when there is none."""
        for earlier in reversed(self.pending.in_queue(queue, max(0, rank - in_queue), rank + 1)):
            if earlier.key not in added:
                return earlier.key
        return None

    def _head_key(self, task: Task) -> tuple[bool, float, OrderKey]:
        spec = self.quotas.specs.get(task.queue)
        if spec is None or spec.cohort is None:
            return (False, 0.0, order_key(task))
        if spec.flavors:  # Kueue keys the head on its first flavor's assignment
            tried = self._variants(task, spec)
            task = tried[0] if tried else task
        least = self._min_usage(task)
        borrows = self.quotas.beyond_nominal(task.queue, least) is not None
        share = self.quotas.share(task.queue, least) if self.quotas.fair_sharing(task.queue) else 0.0
        return (borrows, share, order_key(task))

    def _try(self, task: Task, memo: _CycleMemo, now: float) -> list[Decision]:
        deferred = self.deferred.get(task.key)
        if deferred is not None:
            if now < deferred[0]:
                return [Pending(task, deferred[1], deferred[2])]
            del self.deferred[task.key]
        gate = self._queue_gate(task, memo)
        if gate is not None:
            return [gate]
        spec = self.quotas.specs[task.queue]
        if not spec.flavors:
            placed, known = self._place(task, memo)
            if placed is not None:
                return [self._admit(task, placed, now)]
            return self._preempt_or_wait(task, spec, [(task, known)], memo, now)
        tried: list[tuple[Task, Wait]] = []
        borrowing: tuple[Task, Placement] | None = None
        for flavored_task in self._variants(task, spec):
            placed, known = self._place(flavored_task, memo)
            if placed is not None:
                usage = self.ledger.usage(placed, flavored_task)
                if spec.when_can_borrow == "Borrow" or self.quotas.beyond_nominal(task.queue, usage) is None:
                    return [self._admit(flavored_task, placed, now)]
                borrowing = borrowing or (flavored_task, placed)  # TryNextFlavor: one that needs no borrowing?
                continue
            tried.append((flavored_task, known))
            if spec.when_can_preempt == "Preempt" and borrowing is None:
                preempted = self._preempt_in(flavored_task, known, spec, memo, now)
                if preempted:
                    return preempted
        if borrowing is not None:
            return [self._admit(*borrowing, now)]
        if not tried:
            why = "; ".join(f"{n}: {self._ineligible(task, n)}" for n in spec.flavors)
            message = f"no flavor of GPUClusterQueue {task.queue!r} can hold it ({why})"
            return [Pending(task, Reason.INADMISSIBLE, message)]
        return self._preempt_or_wait(task, spec, tried, memo, now, preempted_already=spec.when_can_preempt == "Preempt")

    def _place(self, task: Task, memo: _CycleMemo) -> tuple[Placement | None, Wait]:
        """A placement of ``task`` within its queue's quota now, else why not (remembered per shape)."""
        shape = (task.queue, task.fit_key)
        known = memo.outcomes.get(shape)
        if known is None:
            quota = self._quota_check(task)
            floor = self.quotas.refuses(task.queue, self._min_usage(task)) is not None
            whole = self._total_quota_check(task)
            outcome = find_placement(self.cluster, task, self.policy, quota=quota, refused_anyway=floor,
                                     total_quota=whole)
            if outcome.placement is not None:
                return outcome.placement, Wait("", "")
            known = never_fits_queue(task, self.quotas) or explain(task, outcome, self.quotas, self.cluster)
            memo.outcomes[shape] = known
        return None, known

    def _preempt_in(self, task: Task, known: Wait, spec: QueueSpec, memo: _CycleMemo, now: float) -> list[Decision]:
        """Plan a preemption for ``task`` (in its flavor), unless it cannot help; [] when none is found.

        Tasks come in priority order, then creation order: if preemption failed for this shape at this
        priority, it fails for every later task of the same shape and priority."""
        attempt = ((task.queue, task.fit_key), task.priority)
        if known.reason is Reason.INADMISSIBLE or not any_preemption(spec) or attempt in memo.preemption_failed:
            return []
        if not self._failed_before(attempt, task):
            preempted = self._preempt(task, now)
            if preempted:
                return preempted
            self._remember_failed(attempt, task)
        memo.preemption_failed.add(attempt)
        return []

    def _preempt_or_wait(
        self,
        task: Task,
        spec: QueueSpec,
        tried: list[tuple[Task, Wait]],
        memo: _CycleMemo,
        now: float,
        *,
        preempted_already: bool = False,
    ) -> list[Decision]:
        """Preempt in the first flavor where a plan is found (Kueue's whenCanPreempt TryNextFlavor: after
        every flavor was tried without), else wait with the first flavor's reason."""
        if not preempted_already and len(tried) == 1:
            preempted = self._preempt_in(tried[0][0], tried[0][1], spec, memo, now)
            if preempted:
                return preempted
        elif not preempted_already:
            preempted = self._preempt_best_flavor(task, spec, tried, memo, now)
            if preempted:
                return preempted
        known = tried[0][1]
        if len(tried) > 1:
            reasons = {k.reason for _, k in tried}
            if Reason.INADMISSIBLE in reasons and len(reasons) > 1:
                known = next(k for _, k in tried if k.reason is not Reason.INADMISSIBLE)
            known = Wait(known.reason, "; ".join(f"flavor {t.flavor}: {k.message}" for t, k in tried), known.filters)
        if spec.strategy == "StrictFIFO" and known.reason is not Reason.INADMISSIBLE:  # the never-fitting block nobody
            memo.blocked_queues.add(task.queue)
        return [Pending(task, known.reason, known.message, filters=known.filters)]

    def _preempt_best_flavor(
        self, task: Task, spec: QueueSpec, tried: list[tuple[Task, Wait]], memo: _CycleMemo, now: float
    ) -> list[Decision]:
        """Kueue's flavor assigner with whenCanPreempt TryNextFlavor: of the flavors where a preemption makes
        room, one that only reclaims from other queues of the cohort goes before one that preempts in the
        task's own queue by priority; then the queue's flavor order. [] when no flavor has a plan."""
        plans: list[tuple[int, int, Task, Plan]] = []
        for order, (flavored_task, known) in enumerate(tried):
            attempt = ((flavored_task.queue, flavored_task.fit_key), flavored_task.priority)
            if known.reason is Reason.INADMISSIBLE or not any_preemption(spec) or attempt in memo.preemption_failed:
                continue
            if self._failed_before(attempt, flavored_task):
                memo.preemption_failed.add(attempt)
                continue
            plan = self._plan(flavored_task)
            if plan is None:
                self._remember_failed(attempt, flavored_task)
                memo.preemption_failed.add(attempt)
                continue
            reclaims_only = all(v.task.queue != task.queue for v in plan.victims)
            plans.append((0 if reclaims_only else 1, order, flavored_task, plan))
        if not plans:
            return []
        _, _, chosen, plan = min(plans, key=lambda p: (p[0], p[1]))
        return self._start(chosen, plan, now)

    def _variants(self, task: Task, spec: QueueSpec) -> list[Task]:
        """``task`` in each flavor of ``spec`` it may use, in the queue's order (:mod:`gputask.core.flavors`);
        kept for the cycle (the head ordering and the try both ask)."""
        base = task.unflavored or task
        cached = self._variant_cache.get(base.key)
        if cached is not None and cached[0] is base and cached[1] is spec:
            return cached[2]
        found = [
            variant(base, self.flavors[name])
            for name in spec.flavors
            if name in self.flavors and ineligible(base, self.flavors[name]) is None
        ]
        self._variant_cache[base.key] = (base, spec, found)
        return found

    def _ineligible(self, task: Task, name: str) -> str:
        flavor = self.flavors.get(name)
        return "does not exist" if flavor is None else (ineligible(task, flavor) or "eligible")

    def _flavor_of(self, task: Task, placement: Placement, named: str | None = None) -> Task:
        """A restored task in the flavor it was admitted in, so it is charged there again: ``named`` (its Job
        says, or its status) when the queue lists it, even if that GPUResourceFlavor is gone now; a task
        already in a flavor stays there; else the queue's first flavor that holds the placement (the first
        flavor when none does any more)."""
        spec = self.quotas.specs.get(task.queue)
        if spec is None or not spec.flavors:
            return task
        if task.flavor and named is None:
            return task
        base = task.unflavored or task
        if named is not None and named in spec.flavors:
            flavor = self.flavors.get(named)
            return variant(base, flavor) if flavor is not None else replace(base, flavor=named, unflavored=base)
        if not all(map(self.cluster.has_node, placement.nodes)):
            return task
        pods = [(self.cluster.node(pod.node).node, pod) for pod in placement.pods]
        known = [self.flavors[n] for n in spec.flavors if n in self.flavors]
        chosen = next((f for f in known if all(holds(f, node, pod) for node, pod in pods)), known[0] if known else None)
        return variant(base, chosen) if chosen is not None else task

    def _queue_gate(self, task: Task, memo: _CycleMemo) -> Pending | None:
        spec = self.quotas.specs.get(task.queue)
        if spec is None and task.queue in self.inactive:
            why = self.inactive[task.queue]
            return Pending(task, QUEUE_INACTIVE, f"GPUClusterQueue {task.queue!r} is inactive: {why}")
        if spec is None:
            of = f" (of GPULocalQueue {task.namespace}/{task.local_queue})" if task.local_queue else ""
            return Pending(task, QUEUE_NOT_FOUND, f"GPUClusterQueue {task.queue!r}{of} does not exist")
        where = (task.queue, task.namespace_labels)  # a permanent refusal first: stopping the queue hides none
        if where not in memo.namespaces:
            memo.namespaces[where] = namespace_refusal(task, spec)
        refusal = memo.namespaces[where]
        if refusal is not None:
            return Pending(task, refusal.reason, refusal.message)
        if spec.stop_policy != "None":
            return Pending(task, QUEUE_HELD, f"GPUClusterQueue {task.queue!r} is stopped ({spec.stop_policy})")
        missing = [n for n in spec.flavors if n not in self.flavors]
        if missing:  # Kueue: the ClusterQueue is inactive, FlavorNotFound
            why = "; ".join(f"{n} {self.invalid_flavors.get(n, 'does not exist')}" for n in missing)
            return Pending(task, QUEUE_INACTIVE, f"GPUClusterQueue {task.queue!r} is inactive: GPUResourceFlavor {why}")
        uncovered = spec.uncovered()
        if uncovered is not None:
            return Pending(task, Reason.INADMISSIBLE, uncovered)
        if task.queue in memo.blocked_queues:
            return Pending(task, WAITING_FOR_HEAD, f"StrictFIFO: waiting behind the head of {task.queue!r}")
        return None

    def _quota_check(self, task: Task) -> QuotaCheck:
        name = task.queue

        def check(state: NodeState, placement: PodPlacement) -> str | None:
            return self.quotas.refuses(name, usage_of(placement, _memory_by_index(state), task.flavor, task.card_mib))

        return check

    def _total_quota_check(self, task: Task) -> TotalQuotaCheck:
        return lambda placement: self.quotas.refuses(task.queue, self.ledger.usage(placement, task))

    def _admit(self, task: Task, placement: Placement, now: float) -> Admit:
        if self._probing:
            raise _WouldChange
        self._unqueue(task.key)
        entry = self.ledger.admit(task, placement, now)
        return Admit(task, placement, entry.usage)

    def _unqueue(self, key: TaskKey) -> None:
        self.pending.discard(key)
        self._forget_wait(key)

    # -- preemption -----------------------------------------------------------------------------
    def _world(self) -> tuple[int, int, int, int]:
        """Changes whenever anything a preemption plan reads could have changed: reservations and quota
        charges (the ledger), nodes, queue specs, and what the policy's scores mean."""
        return (self.ledger.version, self.cluster.nodes_version, self.quotas.specs_version, self.policy.generation)

    def _failed_before(self, attempt: tuple[object, ...], task: Task) -> bool:
        """A plan for this shape and priority failed in an unchanged world for a task no newer than
        ``task``: it fails again (a newer task has no more victims: LowerOrNewerEqualPriority)."""
        seen = self._preemption_failed.get(attempt)
        return seen is not None and seen[0] == self._world() and seen[1] <= (task.created, task.key)

    def _remember_failed(self, attempt: tuple[object, ...], task: Task) -> None:
        if not self.policy.scores_by_state:
            return  # a policy that draws random numbers must see every trial, as before
        if len(self._preemption_failed) > 16384:
            self._preemption_failed.clear()
        self._preemption_failed[attempt] = (self._world(), (task.created, task.key))

    def _preempt(self, task: Task, now: float) -> list[Decision]:
        """Plan and start a preemption for ``task`` (Kueue's ``GetTargets``, see
        :mod:`gputask.core.preemption`); [] when none helps."""
        plan = self._plan(task)
        return [] if plan is None else self._start(task, plan, now)

    def _plan(self, task: Task) -> Plan | None:
        """The preemption that would make room for ``task``, None when none does (the state is left as it was)."""
        if not task.single_pod:  # preemption for a task of several pods: not yet (gangs, issue 30)
            return None
        spec, least = self.quotas.specs[task.queue], self._min_usage(task)
        if not may_preempt(spec, least, fair=self.quotas.fair_sharing(task.queue)):
            return None
        needing = needing_preemption(self.quotas, task, least)
        found = candidates(task, self.ledger.running_in, self.quotas, needing)
        return Planner(self.cluster, self.quotas, self.policy).targets(task, found, self.strategies, needing)

    def _start(self, task: Task, plan: Plan, now: float) -> list[Decision]:
        """Evict ``plan``'s victims and nominate ``task`` to their GPUs."""
        if self._probing:
            raise _WouldChange
        victims = [self.ledger.get(v.task.key) for v in plan.victims]
        for victim in plan.victims:
            self.requeue(victim.task.key)
        self._unqueue(task.key)
        self.ledger.nominate(task, plan.placement, [v.task.key for v in plan.victims], now)
        decisions: list[Decision] = []
        message = f"preempted by {task.key} (priority {task.priority}) in GPUClusterQueue {task.queue!r}"
        for victim, entry in zip(plan.victims, victims, strict=True):  # the preemptor first takes its part
            held = self._hold_departing(entry) if entry is not None else None
            decisions.append(Evict(victim.task, victim.placement, Reason.PREEMPTED, message, by=task.key, held=held))
        waiting = ", ".join(sorted(v.task.key for v in plan.victims))
        decisions.append(Pending(task, PREEMPTING, f"preempting {waiting} on {', '.join(plan.placement.nodes)}"))
        return decisions

    def _node_generation(self, name: NodeName) -> int | None:
        return self.cluster.node(name).generation if self.cluster.has_node(name) else None

    def _min_usage(self, task: Task) -> Usage:
        return min_usage(task, self.health.largest_gpu_mib)

    # -- reports ------------------------------------------------------------------------------
    def never_admits(self, task: Task) -> bool:
        """True when ``task``'s GPUClusterQueue exists and never admits it (its namespaceSelector does not select
        the task's namespace): such a task has no queue position and is not counted in the queue's pending work."""
        spec = self.quotas.specs.get(task.queue)
        return spec is not None and namespace_refusal(task, spec) is not None

    def parked_by_queue(self) -> dict[str, int]:
        """Per queue, its pending tasks it never admits (:meth:`never_admits`), as the last cycle said them
        (NamespaceNotAllowed): read off the waits' counts, so it costs the queues and reasons, not the tasks."""
        return {queue: n for (queue, reason), n in self.waiting_by_reason.items() if reason == NAMESPACE_NOT_ALLOWED}

    def gate(self, task: Task) -> Wait | None:
        """The queue-level reason ``task`` would wait for before any node is looked at (its queue missing,
        inactive or stopped, its namespace not selected), else None. Changes nothing."""
        found = self._queue_gate(task, _CycleMemo())
        return None if found is None else Wait(found.reason, found.message)

    def variants(self, task: Task) -> list[Task]:
        """``task`` in each flavor of its queue it may use, in the queue's order ([] when its queue is unknown
        or has none it may use)."""
        spec = self.quotas.specs.get(task.queue)
        return [] if spec is None else self._variants(task, spec)

    def try_place(self, task: Task, node: NodeName | None = None) -> tuple[Placement | None, Usage | None, str | None]:
        """Where a cycle would place ``task`` now (on ``node`` only, when given), ignoring quota; what that
        placement charges its queue; and the first quota key that refuses it (None: quota allows it).
        (None, None, None) when no node (or not ``node``) can take it. Changes nothing."""
        if node is not None and not self.cluster.has_node(node):
            return None, None, None
        nodes = None if node is None else [self.cluster.node(node)]
        outcome = find_placement(self.cluster, task, self.policy, nodes=nodes)
        placement = outcome.placement
        if placement is None:
            return None, None, None
        usage = self.ledger.usage(placement, task)
        refused = self.quotas.refuses(task.queue, usage) if task.queue in self.quotas.specs else None
        return placement, usage, refused

    def preemption_plan(self, task: Task) -> Plan | None:
        """The preemption a cycle would start for ``task`` (in its flavor) now, None when none makes room.
        Changes nothing (:meth:`Planner.targets` restores what it tries)."""
        if task.queue not in self.quotas.specs:
            return None
        return self._plan(task)

    def queue_status(self) -> dict[str, dict[str, object]]:
        """Per queue: usage (milli-GPU, MiB), borrowed, pending and admitted counts."""
        return queue_status(self)

    def violations(
        self, *, nodes: Iterable[NodeName] | None = None, keys: Iterable[TaskKey] | None = None
    ) -> list[str]:
        """Broken invariants: GPU over-commit and quota beyond what the queue could ever hold; per-node and
        per-task checks on ``nodes`` and ``keys`` only when given (what changed since a previous check)."""
        return violations(self, nodes=nodes, keys=keys)


def _memory_by_index(state: NodeState) -> dict[int, int]:
    return {g.index: g.memory_mib for g in state.node.gpus}
