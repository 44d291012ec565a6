"""The scheduling cycle: queue heads in order, quota, placement, preemption; it returns decisions.

:class:`Cycle` reads the cache (:class:`~gputask.core.cache.Cache`) and the queue manager
(:class:`~gputask.core.queueing.Queues`) and decides. An admission or a nomination is assumed in the cache at once
(Kueue's ``AssumeWorkload``) so later tasks of the same cycle see it; the adapter undoes it with
:meth:`~gputask.core.transitions.Transitions.requeue` if the API write fails. Preemption trials run on a snapshot
(:class:`~gputask.core.snapshot.Trial`), never on live state.

A preemptor is *nominated*: its placement is reserved at once, so nothing else can take the capacity its victims
free, and it is admitted by a later cycle once every victim has reported gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gputask.core.cache import Cache
from gputask.core.cluster import NodeState
from gputask.core.decisions import Admit, CycleStats, Decision, Evict, Pending, Wait
from gputask.core.defrag import Defragmenter, fragmented
from gputask.core.flavors import ineligible, variant
from gputask.core.model import NodeName, Placement, PodPlacement, Task, TaskKey
from gputask.core.placement import Outcome, Policy, QuotaCheck, TotalQuotaCheck, find_placement
from gputask.core.preemption import Plan, Planner, any_preemption, candidates, may_preempt, needing_preemption
from gputask.core.queueing import HeadKey, Queues
from gputask.core.queues import order_key
from gputask.core.quota import QueueSpec, Usage, usage_of
from gputask.core.reasons import (
    NAMESPACE_NOT_ALLOWED,
    PREEMPTING,
    QUEUE_HELD,
    QUEUE_INACTIVE,
    QUEUE_NOT_FOUND,
    WAITING_FOR_HEAD,
    Reason,
    explain,
    min_usage,
    namespace_refusal,
    never_fits_queue,
)
from gputask.core.snapshot import Trial
from gputask.core.transitions import Transitions


@dataclass(slots=True)
class _CycleMemo:
    """What failed earlier in this cycle; valid all cycle because capacity only shrinks."""

    outcomes: dict[tuple[object, ...], Wait] = field(default_factory=dict)
    blocked_queues: set[str] = field(default_factory=set)
    preemption_failed: set[tuple[object, ...]] = field(default_factory=set)
    namespaces: dict[tuple[str, tuple[tuple[str, str], ...]], Wait | None] = field(default_factory=dict)
    defrag_failed: set[tuple[object, ...]] = field(default_factory=set)


class _WouldChange(Exception):
    """Raised instead of admitting or preempting while new tasks are only probed (:meth:`Cycle.incremental`)."""


class Cycle:
    """Decides: :meth:`walk` tries every pending task in order, :meth:`incremental` only the new ones (module doc).

    Keeps across cycles only caches of what it found: the flavored variants of this cycle's tasks and the
    preemptions that found no plan in an unchanged world.
    """

    def __init__(
        self, cache: Cache, queues: Queues, moves: Transitions, policy: Policy, strategies: Sequence[str],
        tracked_positions: int, defrag: Defragmenter | None = None,
    ) -> None:
        self.cache = cache
        self.queues = queues
        self.moves = moves
        self.policy = policy
        self.strategies = tuple(strategies)
        self.tracked_positions = tracked_positions  # heads of each queue whose position changes are reported
        self.stats = CycleStats()
        self._variant_cache: dict[TaskKey, tuple[Task, QueueSpec, list[Task]]] = {}  # this cycle's flavored tasks
        # preemptions that found no plan, by (queue, shape, priority): the world then, the oldest task tried
        self._preemption_failed: dict[tuple[object, ...], tuple[tuple[int, int, int, int], tuple[float, str]]] = {}
        self._probing = False
        self.defrag = defrag or Defragmenter()  # moves for tasks waiting on fragmentation (core/defrag.py)

    # -- the walk ---------------------------------------------------------------------------------
    def walk(self, now: float) -> list[Decision]:
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
        self.defrag.wake_at = float("inf")
        decisions = self.moves.take_carry()
        decisions += self._failure_evictions(now)
        decisions += self._admit_nominated(now)
        decisions += self._drain()
        positions: dict[str, int] = {}
        tried = 0
        pending, waits = self.queues.pending, self.queues.waits
        for task in self.queues.ordered(self._cohorts(), self._head_key):
            if task.key not in pending:
                continue
            position = positions.get(task.queue, 0)  # still-pending tasks ahead in its queue that it may admit
            tried += 1
            for decision in self._try(task, memo, now):
                if not isinstance(decision, Pending):
                    decisions.append(decision)
                    continue
                if decision.reason == NAMESPACE_NOT_ALLOWED:  # never admitted here: no place in the queue
                    position = -1
                waits.note_filters(task.key, decision.filters)
                last = waits.reasons.get(task.key)
                moved = last is not None and last[2] != position and position < self.tracked_positions
                if last is None or last[:2] != (decision.reason, decision.message) or moved:
                    waits.say(task, decision.reason, decision.message, position)
                    decisions.append(replace(decision, position=position))
            if task.key in pending and position >= 0:
                positions[task.queue] = position + 1
        self.stats = CycleStats("full", tried, self.stats.skipped)
        return decisions

    def incremental(self, now: float) -> list[Decision] | None:
        """The cycle when only new tasks came since a cycle that changed nothing (O(new tasks x log pending), plus
        the tracked positions of the queues they joined); None when the walk must decide.

        Each new task is tried alone against the state the last cycle left (admitting or preempting raises
        :class:`_WouldChange` instead of doing it: an admission changes what every later task sees, so the walk
        then decides, in order). If every new task waits, the walk would emit the same: every task it tried
        before a state change finds what it found last time, so it emits a Pending for each new task (where
        it stands in its queue) and a new position for each waiting task a new one now stands ahead of (among
        the first ``tracked_positions`` of its queue), and nothing else, in the walk's order (with cohorts, from the
        keys the last walk gave each task as its queue's head: :meth:`Queues.merge_keys`). A new task in a StrictFIFO
        queue goes to the walk (whether its head blocks it is decided in order).
        """
        queues, specs = self.queues, self.cache.quotas.specs
        new = sorted((t for key in queues.new if (t := queues.pending.get(key)) is not None), key=order_key)
        if len(queues.waits.reasons) != len(queues.pending) - len(new) or any(
            (spec := specs.get(t.queue)) is not None and spec.strategy == "StrictFIFO" for t in new
        ):
            return None  # a waiting task without a reason said would be emitted by the walk
        memo, tried_all = _CycleMemo(), []
        self._variant_cache.clear()
        self._probing = True
        try:
            for task in new:
                tried_all.append(self._try(task, memo, now))
        except _WouldChange:
            return None
        finally:
            self._probing = False
        parked = {(t.queue, str(NAMESPACE_NOT_ALLOWED)) for t in new} & set(queues.waits.waiting_by_reason)
        if parked or any(
                isinstance(d, Pending) and d.reason == NAMESPACE_NOT_ALLOWED for tried in tried_all for d in tried):
            return None  # a rank would count tasks the queue never admits: the walk leaves them out
        out: list[Pending] = []
        for task, tried in zip(new, tried_all, strict=True):
            decision = tried[0]
            assert len(tried) == 1 and isinstance(decision, Pending)  # anything else raised _WouldChange
            out.append(replace(decision, position=queues.pending.rank(task)))
        out += queues.moved_behind(new, self.tracked_positions)
        if not self._cohorts():  # the walk's order is the queues' order
            out.sort(key=lambda d: order_key(d.task))
        else:
            where = queues.merge_keys(out, new, self._head_key)
            if where is None:
                return None
            out.sort(key=lambda d: where[d.task.key])
        for decision in out:  # nothing recorded before the order is known (the walk may still decide)
            queues.waits.note_filters(decision.task.key, decision.filters)
            queues.waits.say(decision.task, decision.reason, decision.message, decision.position)
        self.stats = CycleStats("incremental", len(new), self.stats.skipped)
        return list(out)

    def _failure_evictions(self, now: float) -> list[Decision]:
        self.cache.health.expired(now)
        return self.moves.evict_failed(self.cache.health.take())

    def _admit_nominated(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for key in self.cache.ledger.ready():
            entry = self.cache.promote(key, now)
            self.queues.waits.forget(key)  # it said Preempting while nominated
            out.append(Admit(entry.task, entry.placement, entry.usage))
        return out

    def _drain(self) -> list[Decision]:
        out: list[Decision] = []
        specs = self.cache.quotas.specs
        if not any(spec.stop_policy == "HoldAndDrain" for spec in specs.values()):
            return out  # nothing drains: no need to walk every running task
        for key, entry in list(self.cache.ledger.running.items()):
            spec = specs.get(entry.task.queue)
            if entry.charged and spec is not None and spec.stop_policy == "HoldAndDrain":
                self.moves.requeue(key)
                why = f"GPUClusterQueue {spec.name!r} is draining"
                held = self.moves.hold_departing(entry)
                out.append(Evict(entry.task, entry.placement, Reason.QUEUE_DRAINED, why, held=held))
        return out

    def _cohorts(self) -> bool:
        return any(s.cohort is not None for s in self.cache.quotas.specs.values())

    def _head_key(self, task: Task) -> HeadKey:
        quotas = self.cache.quotas
        spec = quotas.specs.get(task.queue)
        if spec is None or spec.cohort is None:
            return (False, 0.0, order_key(task))
        if spec.flavors:  # Kueue keys the head on its first flavor's assignment
            tried = self._variants(task, spec)
            task = tried[0] if tried else task
        least = self.min_usage(task)
        borrows = quotas.beyond_nominal(task.queue, least) is not None
        share = quotas.share(task.queue, least) if quotas.fair_sharing(task.queue) else 0.0
        return (borrows, share, order_key(task))

    # -- one task -----------------------------------------------------------------------------------
    def _try(self, task: Task, memo: _CycleMemo, now: float) -> list[Decision]:
        deferred = self.queues.backoff(task.key, now)
        if deferred is not None:
            return [Pending(task, deferred[1], deferred[2])]
        gate = self.queue_gate(task, memo)
        if gate is not None:
            return [gate]
        spec = self.cache.quotas.specs[task.queue]
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
                usage = self.cache.ledger.usage(placed, flavored_task)
                if spec.when_can_borrow == "Borrow" or self.cache.quotas.beyond_nominal(task.queue, usage) is None:
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
            quotas, cluster = self.cache.quotas, self.cache.cluster
            quota = self._quota_check(task)
            floor = quotas.refuses(task.queue, self.min_usage(task)) is not None
            whole = self._total_quota_check(task)
            outcome = find_placement(cluster, task, self.policy, quota=quota, refused_anyway=floor,
                                     total_quota=whole)
            if outcome.placement is not None:
                return outcome.placement, Wait("", "")
            known = never_fits_queue(task, quotas) or explain(task, outcome, quotas, cluster)
            if known.reason is Reason.NO_FIT:  # free GPUs enough, but on no one node: Fragmented
                known = fragmented(task, cluster, quotas, self.cache.largest_gpu_mib) or known
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
            plan = self.plan(task)
            if plan is not None:
                return self._start(task, plan, now)
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
        if self.defrag.enabled:
            stuck = next((t for t, k in tried if k.reason is Reason.FRAGMENTED), None)
            moved = [] if stuck is None else self.defrag.attempt(
                stuck, self.cache, self.queues, self.moves, self.policy, now, memo.defrag_failed, probing=self._probing)
            if moved is None:
                raise _WouldChange
            if moved:
                return moved
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
            plan = self.plan(flavored_task)
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
        flavors = self.cache.flavors
        found = [
            variant(base, flavors[name])
            for name in spec.flavors
            if name in flavors and ineligible(base, flavors[name]) is None
        ]
        self._variant_cache[base.key] = (base, spec, found)
        return found

    def _ineligible(self, task: Task, name: str) -> str:
        flavor = self.cache.flavors.get(name)
        return "does not exist" if flavor is None else (ineligible(task, flavor) or "eligible")

    def queue_gate(self, task: Task, memo: _CycleMemo | None = None) -> Pending | None:
        """The queue-level Pending ``task`` gets before any node is looked at (its queue missing, inactive or
        stopped, its namespace not selected, a StrictFIFO head ahead of it), else None."""
        memo = memo or _CycleMemo()
        cache = self.cache
        spec = cache.quotas.specs.get(task.queue)
        if spec is None and task.queue in cache.inactive:
            why = cache.inactive[task.queue]
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
        missing = [n for n in spec.flavors if n not in cache.flavors]
        if missing:  # Kueue: the ClusterQueue is inactive, FlavorNotFound
            why = "; ".join(f"{n} {cache.invalid_flavors.get(n, 'does not exist')}" for n in missing)
            return Pending(task, QUEUE_INACTIVE, f"GPUClusterQueue {task.queue!r} is inactive: GPUResourceFlavor {why}")
        uncovered = spec.uncovered()
        if uncovered is not None:
            return Pending(task, Reason.INADMISSIBLE, uncovered)
        if task.queue in memo.blocked_queues:
            return Pending(task, WAITING_FOR_HEAD, f"StrictFIFO: waiting behind the head of {task.queue!r}")
        return None

    def _quota_check(self, task: Task) -> QuotaCheck:
        name, quotas = task.queue, self.cache.quotas

        def check(state: NodeState, placement: PodPlacement) -> str | None:
            return quotas.refuses(name, usage_of(placement, _memory_by_index(state), task.flavor, task.card_mib))

        return check

    def _total_quota_check(self, task: Task) -> TotalQuotaCheck:
        quotas, ledger = self.cache.quotas, self.cache.ledger
        return lambda placement: quotas.refuses(task.queue, ledger.usage(placement, task))

    def _admit(self, task: Task, placement: Placement, now: float) -> Admit:
        if self._probing:
            raise _WouldChange
        self.queues.take(task.key)
        entry = self.cache.admit(task, placement, now)
        return Admit(task, placement, entry.usage)

    # -- preemption -----------------------------------------------------------------------------
    def _world(self) -> tuple[int, int, int, int]:
        """Changes whenever anything a preemption plan reads could have changed: reservations and quota
        charges (the ledger), nodes, queue specs, and what the policy's scores mean."""
        cache = self.cache
        return (cache.ledger.version, cache.cluster.nodes_version, cache.quotas.specs_version, self.policy.generation)

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

    def plan(self, task: Task) -> Plan | None:
        """The preemption that would make room for ``task`` (Kueue's ``GetTargets``, see
        :mod:`gputask.core.preemption`), None when none does. Tried on a snapshot: the cache is left as it was."""
        quotas = self.cache.quotas
        spec, least = quotas.specs[task.queue], self.min_usage(task)
        if not may_preempt(spec, least, fair=quotas.fair_sharing(task.queue)):
            return None
        needing = needing_preemption(quotas, task, least)
        found = candidates(task, self.cache.ledger.running_in, quotas, needing)
        if not found:
            return None
        trial = Trial.of(self.cache.cluster, quotas)
        planner = Planner(trial.cluster, trial.quotas, self.policy)
        if task.gang:
            planner.least = least
        return planner.targets(task, found, self.strategies, needing)

    def _start(self, task: Task, plan: Plan, now: float) -> list[Decision]:
        """Evict ``plan``'s victims and nominate ``task`` to their GPUs."""
        if self._probing:
            raise _WouldChange
        victims = [self.cache.ledger.get(v.task.key) for v in plan.victims]
        for victim in plan.victims:
            self.moves.requeue(victim.task.key)
        self.queues.take(task.key)
        self.cache.nominate(task, plan.placement, [v.task.key for v in plan.victims], now)
        decisions: list[Decision] = []
        message = f"preempted by {task.key} (priority {task.priority}) in GPUClusterQueue {task.queue!r}"
        for victim, entry in zip(plan.victims, victims, strict=True):  # the preemptor first takes its part
            held = self.moves.hold_departing(entry) if entry is not None else None
            decisions.append(Evict(victim.task, victim.placement, Reason.PREEMPTED, message, by=task.key, held=held))
        waiting = ", ".join(sorted(v.task.key for v in plan.victims))
        decisions.append(Pending(task, PREEMPTING, f"preempting {waiting} on {', '.join(plan.placement.nodes)}"))
        return decisions

    def min_usage(self, task: Task) -> Usage:
        """The least ``task`` can charge (:func:`~gputask.core.reasons.min_usage`)."""
        return min_usage(task, self.cache.largest_gpu_mib)

    # -- reads for reports (change nothing) ------------------------------------------------------
    def variants(self, task: Task) -> list[Task]:
        """``task`` in each flavor of its queue it may use, in the queue's order ([] when its queue is unknown
        or has none it may use)."""
        spec = self.cache.quotas.specs.get(task.queue)
        return [] if spec is None else self._variants(task, spec)

    def gate(self, task: Task) -> Wait | None:
        """The queue-level reason ``task`` would wait for before any node is looked at (its queue missing,
        inactive or stopped, its namespace not selected), else None. Changes nothing."""
        found = self.queue_gate(task)
        return None if found is None else Wait(found.reason, found.message)

    def place(self, task: Task) -> Outcome:
        """Where ``task`` would go now, with no queue or quota involved; nothing is reserved."""
        return find_placement(self.cache.cluster, task, self.policy)

    def try_place(self, task: Task, node: NodeName | None = None) -> tuple[Placement | None, Usage | None, str | None]:
        """Where a cycle would place ``task`` now (on ``node`` only, when given), ignoring quota; what that
        placement charges its queue; and the first quota key that refuses it (None: quota allows it).
        (None, None, None) when no node (or not ``node``) can take it. Changes nothing."""
        cluster, quotas = self.cache.cluster, self.cache.quotas
        if node is not None and not cluster.has_node(node):
            return None, None, None
        nodes = None if node is None else [cluster.node(node)]
        outcome = find_placement(cluster, task, self.policy, nodes=nodes)
        placement = outcome.placement
        if placement is None:
            return None, None, None
        usage = self.cache.ledger.usage(placement, task)
        refused = quotas.refuses(task.queue, usage) if task.queue in quotas.specs else None
        return placement, usage, refused

    def preemption_plan(self, task: Task) -> Plan | None:
        """The preemption a cycle would start for ``task`` (in its flavor) now, None when none makes room.
        Changes nothing (planned on a snapshot)."""
        if task.queue not in self.cache.quotas.specs:
            return None
        return self.plan(task)


def _memory_by_index(state: NodeState) -> dict[int, int]:
    return {g.index: g.memory_mib for g in state.node.gpus}
