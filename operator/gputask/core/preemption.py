"""Placement-aware preemption with Kueue's ClusterQueue policies, Kueue's algorithm step by step.

Source: Kueue, pkg/scheduler/preemption (``GetTargets``, ``findCandidates``, ``minimalPreemptions``,
``fairPreemptions``, ``candidatesOrdering``) and the documentation's "Preemption" page; ported
case by case in ``tests/unit/test_kueue_parity.py``.

Who may be preempted (``findCandidates``):
- same queue: ``withinClusterQueue`` LowerPriority (strictly lower priority) or
  LowerOrNewerEqualPriority (lower, or equal and created strictly later);
- other queues of the cohort that borrow now (use more than nominalQuota): ``reclaimWithinCohort``
  Any (any priority) or LowerPriority (lower only).
Candidates are ordered: other queues' tasks first, then lower priority, then most recently
admitted (then the key, for determinism).

Which of them (``GetTargets``), with "fits" meaning the preemptor fits quota once the victims so
far are gone and, with borrowing not allowed, stays within its nominal quota:
1. only same-queue candidates: the minimal set, borrowing allowed;
2. fair sharing in the cohort: :meth:`Planner._fair` (strategies in order, queues with the highest
   share first; ``borrowWithinCohort`` is ignored);
3. ``borrowWithinCohort: LowerPriority``: unless the queue is under nominal in every resource,
   other queues' candidates must be below the threshold (the preemptor's priority, or
   maxPriorityThreshold + 1); the minimal set, borrowing allowed until a candidate at or above
   the threshold is taken;
4. otherwise, if the queue is under nominal in every resource: the minimal set of all candidates
   without borrowing (its own victims counted); failing that, same-queue candidates with borrowing.
The minimal set: remove candidates in order, skipping another queue's task once that queue no
longer borrows (checked again after every removal), until the preemptor fits; then put back,
newest removal first except the last, each one whose return still lets it fit.

Unlike Kueue, victims are chosen on ONE node so that the preemptor really fits there (Kueue
counts quota only): each step above runs per node over that node's candidates, "fits" also
asks for a placement on that node, and the node whose victim set is smallest, then has the
lowest priorities, then the most recently admitted, wins; ties go to the smallest name. On a
single node with room for everything this is Kueue's answer exactly. Planning works on a snapshot
(:mod:`gputask.core.snapshot`, as Kueue's preemptor works on its cycle's snapshot) with undo steps; the
cache is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gputask.core.cluster import ClusterState, NodeState
from gputask.core.gang import domain_of
from gputask.core.model import GpuSlot, NodeName, Placement, PodPlacement, Task, TaskKey
from gputask.core.placement import Policy, QuotaCheck, TotalQuotaCheck, find_placement
from gputask.core.quota import QueueSpec, QuotaBook, Usage, placement_usage, usage_of
from gputask.core.snapshot import TrialCluster
from gputask.core.victims import Plan as Plan
from gputask.core.victims import Victim as Victim
from gputask.core.victims import candidates as candidates
from gputask.core.victims import could_fit_without as could_fit_without
from gputask.core.victims import victim_allowed as victim_allowed

STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
DEFAULT_STRATEGIES = STRATEGIES
"""Kueue's fair-sharing ``preemptionStrategies`` (its Configuration), tried in order; the default."""


def strategies_of(names: Sequence[str]) -> tuple[str, ...]:
    """Validated fair-sharing preemption strategies; raises ValueError for an unknown name, an empty
    list, or a second strategy other than LessThanInitialShare (Kueue's API validation)."""
    out = tuple(names)
    if not out or len(out) > 2 or any(n not in STRATEGIES for n in out):
        raise ValueError(f"preemptionStrategies must be one or two of {', '.join(STRATEGIES)}, got {list(out)}")
    if len(out) == 2 and out != STRATEGIES:
        raise ValueError(f"the second preemption strategy can only be LessThanInitialShare, got {list(out)}")
    return out


def any_preemption(spec: QueueSpec) -> bool:
    """True when the queue's policy could ever preempt something."""
    p = spec.preemption
    return p.within_cluster_queue != "Never" or p.reclaim_within_cohort != "Never"


def may_preempt(spec: QueueSpec, least: Usage, *, fair: bool) -> bool:
    """Kueue's flavor assigner: a task may preempt only if its request alone fits its queue's nominal
    quota, unless the queue can preempt while borrowing (``borrowWithinCohort`` set, or fair sharing
    with ``reclaimWithinCohort`` not Never). ``least`` is the least the task can charge."""
    if all(least.get(r, 0) <= q.nominal for r, q in spec.quotas.items()):
        return True
    p = spec.preemption
    return p.borrow_within_cohort != "Never" or (fair and p.reclaim_within_cohort != "Never")


def borrow_threshold(spec: QueueSpec, task: Task) -> int | None:
    """Kueue's ``canBorrowWithinCohort``: with ``borrowWithinCohort: LowerPriority``, the priority
    other queues' victims must be below while the preemptor borrows (its own priority, or
    maxPriorityThreshold + 1 when that is lower); None when the policy is Never."""
    policy = spec.preemption
    if policy.borrow_within_cohort != "LowerPriority":
        return None
    threshold = task.priority
    if policy.max_priority_threshold is not None and policy.max_priority_threshold < threshold:
        threshold = policy.max_priority_threshold + 1
    return threshold


def needing_preemption(quotas: QuotaBook, task: Task, least: Usage) -> tuple[str, ...]:
    """Kueue's resources needing preemption: those of the queue's listed resources that ``least`` (the
    least the task charges) does not fit now; all of them when quota fits and only the placement
    does not (gputask preempts for room on a node too, where Kueue would admit). Only the keys of the
    task's own flavor count: borrowing in another flavor says nothing about this one."""
    spec = quotas.specs[task.queue]
    own = [r for r in spec.quotas if r in least]  # the task's flavor's keys (every key of a flat queue)
    short = []
    for resource in own:
        free = quotas.available(task.queue, resource)
        if free is not None and least.get(resource, 0) > free:
            short.append(resource)
    return tuple(short) if short else tuple(own)


def under_nominal(quotas: QuotaBook, queue: str, resources: Iterable[str]) -> bool:
    """Kueue's ``queueUnderNominalInResourcesNeedingPreemption``: ``queue`` uses less than its
    nominal quota of every resource of ``resources`` it lists."""
    spec = quotas.specs[queue]
    used = quotas.usage.get(queue, {})
    return all(used.get(r, 0) < spec.quotas[r].nominal for r in resources if r in spec.quotas)


@dataclass(slots=True)
class _Run:
    """One node's trial: the candidates taken so far (released), whether borrowing is still allowed, and
    under fair sharing the share the preemptor's queue must end below (:meth:`Planner._fair`; None: any).
    A gang's trial (``state`` None) runs over the nodes of ``scope`` (None: every node); ``useful`` are the
    candidates that free room a pod of the gang could use there (:meth:`Planner._gang_scopes`)."""

    state: NodeState | None
    allow_borrowing: bool
    taken: list[Victim] = field(default_factory=list)
    placement: Placement | None = None
    share_below: float | None = None
    scope: list[NodeName] | None = None
    useful: frozenset[TaskKey] = frozenset()


class Planner:
    """Plans one preemption on the cluster and quota book it is given (the cycle gives it a snapshot,
    :class:`~gputask.core.snapshot.Trial`), undoing every trial step."""

    def __init__(self, cluster: ClusterState, quotas: QuotaBook, policy: Policy) -> None:
        self.cluster = cluster
        self.quotas = quotas
        self.policy = policy
        self.needing: tuple[str, ...] | None = None  # resources needing preemption (None: all listed)
        self.least: Usage | None = None  # the least a gang preemptor charges (set by the cycle for a gang)

    @contextmanager
    def _without(self, victims: list[Victim]) -> Iterator[None]:
        """Temporarily release ``victims`` (GPUs and quota), restoring them on exit."""
        for v in victims:
            self._release(v)
        try:
            yield
        finally:
            for v in reversed(victims):
                self._restore(v)

    def targets(
        self, task: Task, found: list[Victim], strategies: Sequence[str], resources: Sequence[str]
    ) -> Plan | None:
        """Kueue's ``GetTargets`` (module doc) over ``found`` (from :func:`candidates`, in order);
        ``resources``: those needing preemption (:func:`needing_preemption`)."""
        if not found:
            return None
        self.needing = tuple(resources)
        spec = self.quotas.specs[task.queue]
        same = [v for v in found if v.task.queue == task.queue]
        threshold = borrow_threshold(spec, task)
        with self.cluster.deferred_index():  # trials touch node states only; the index catches up once
            if len(same) == len(found):
                return self._best(task, found, True, lambda run, on: self._minimal(task, run, on, None))
            if self.quotas.fair_sharing(task.queue):
                return self._best(task, found, True, lambda run, on: self._fair(task, run, on, strategies))
            if threshold is not None:
                if not under_nominal(self.quotas, task.queue, resources):
                    found = [v for v in found if v.task.queue == task.queue or v.task.priority < threshold]
                return self._best(task, found, True, lambda run, on: self._minimal(task, run, on, threshold))
            if under_nominal(self.quotas, task.queue, resources):
                plan = self._best(task, found, False, lambda run, on: self._minimal(task, run, on, None))
                if plan is not None:
                    return plan
            return self._best(task, same, True, lambda run, on: self._minimal(task, run, on, None))

    def _best(
        self, task: Task, found: list[Victim], allow_borrowing: bool, search: Callable[[_Run, list[Victim]], None]
    ) -> Plan | None:
        """On every node holding candidates, ``search`` takes candidates (that node's, in order) until the
        task fits, the victims not needed are put back, and every victim is restored; the best plan.

        A plan keeps the placement found for exactly its victims (policies such as random may answer
        differently on each call, so it is never recomputed).
        """
        best: tuple[tuple[object, ...], Plan] | None = None
        for name, run, on_node in self._runs(task, found, allow_borrowing):
            try:
                search(run, on_node)
                if run.placement is not None:
                    self._fill_back(task, run)
                    if not self._settles(task, run):
                        run.placement = None
                victims, placement = list(run.taken), run.placement
            finally:
                for v in reversed(run.taken):
                    self._restore(v)
            if placement is None:
                continue
            score = (
                len(victims),
                tuple(sorted((v.task.priority for v in victims), reverse=True)),
                tuple(sorted(-v.admitted_at for v in victims)),
                name,
            )
            if best is None or score < best[0]:
                best = (score, Plan(placement, tuple(victims)))
        return None if best is None else best[1]

    def _runs(self, task: Task, found: list[Victim], allow_borrowing: bool) -> Iterator[tuple[str, _Run, list[Victim]]]:
        """The trials of ``_best``: (name, run, its candidates in order). One per node holding candidates whose
        filters could take the task once they are gone; for a gang, one per domain of its required topology
        (every node when none) where some candidate frees room a pod of it could use."""
        if task.gang:
            for name, scope, useful in self._gang_scopes(task, found):
                yield name, _Run(None, allow_borrowing, scope=scope, useful=useful), found
            return
        by_node: dict[str, list[Victim]] = {}
        for victim in found:  # a victim of several pods is a candidate on each of its nodes; it goes whole
            for node in victim.placement.nodes:
                by_node.setdefault(node, []).append(victim)
        for name in sorted(by_node):
            state = self.cluster.node(name)  # type: ignore[arg-type]
            on_node = by_node[name]
            if could_fit_without(state, task, on_node):  # else the node filters refuse it with every candidate gone
                yield name, _Run(state, allow_borrowing), on_node

    def _gang_scopes(
        self, task: Task, found: list[Victim]
    ) -> list[tuple[str, list[NodeName] | None, frozenset[TaskKey]]]:
        """(domain, its nodes, the useful candidates) for a gang: a candidate is useful in a domain when one of
        its pods is on a node of the domain where some pod of the gang could pass the filters and find enough GPUs
        once every candidate there is gone (:func:`could_fit_without`). The others free room no pod of the gang
        can use (Kueue #5243: capacity split over nodes that fit no pod), so they are taken only while quota is
        what is short (:meth:`_minimal`). Without a required topology, one scope: every node."""
        on_node: dict[NodeName, list[Victim]] = {}
        for victim in found:
            for node in victim.placement.nodes:
                on_node.setdefault(node, []).append(victim)
        pods = [task.pod_task(pod) for pod in task.podsets]
        helps = {
            node: any(could_fit_without(self._current(node), pod, victims) for pod in pods)
            for node, victims in on_node.items() if self.cluster.has_node(node)
        }
        key = task.topology_required
        if key is None:
            useful = frozenset(v.task.key for v in found if any(helps.get(n, False) for n in v.placement.nodes))
            return [("", None, useful)]
        domains: dict[str, list[NodeName]] = {}
        for state in self.cluster.index().states:
            value = domain_of(self._current(state.name), key)
            if value is not None:
                domains.setdefault(value, []).append(state.name)
        out: list[tuple[str, list[NodeName] | None, frozenset[TaskKey]]] = []
        for value in sorted(domains):
            members = set(domains[value])
            useful = frozenset(
                v.task.key for v in found if any(n in members and helps.get(n, False) for n in v.placement.nodes)
            )
            if useful or self._quota_short(task):
                out.append((value, domains[value], useful))
        return out

    def _current(self, name: NodeName) -> NodeState:
        """A node's state to read (a trial's without copying it)."""
        cluster = self.cluster
        return cluster.current(name) if isinstance(cluster, TrialCluster) else cluster.node(name)

    def _quota_short(self, task: Task) -> bool:
        """True when the least the task charges (:attr:`least`) does not fit its queue's quota as the trial has it."""
        return self.least is not None and self.quotas.refuses(task.queue, self.least) is not None

    # -- Kueue's minimalPreemptions and fillBackWorkloads, on one node -------------------------------
    def _minimal(self, task: Task, run: _Run, ordered: list[Victim], threshold: int | None) -> None:
        """Take candidates in order until the task fits (Kueue's ``minimalPreemptions``, module doc).

        With ``threshold`` (borrowWithinCohort), taking another queue's task at or above it ends
        borrowing for the rest of the trial.
        """
        for candidate in ordered:
            if run.state is None and candidate.task.key not in run.useful and not self._quota_short(task):
                continue  # a gang: it frees only room no pod can use, and quota is not short (Kueue #5243)
            if candidate.task.queue != task.queue:
                if not self.quotas.is_borrowing(candidate.task.queue, self.needing):
                    continue  # taking it would push its queue below its nominal quota
                if threshold is not None and candidate.task.priority >= threshold:
                    run.allow_borrowing = False
            self._take(run, candidate)
            run.placement = self._fits(task, run)
            if run.placement is not None:
                return

    def _fill_back(self, task: Task, run: _Run) -> None:
        """Put victims back, newest removal first except the last, while the task still fits."""
        for candidate in reversed(run.taken[:-1]):
            self._restore(candidate)
            found = self._fits(task, run)
            if found is not None:
                run.taken.remove(candidate)
                run.placement = found
            else:
                self._release(candidate)

    # -- Kueue's fairPreemptions, on one node ------------------------------------------------------
    def _fair(self, task: Task, run: _Run, ordered: list[Victim], strategies: Sequence[str]) -> None:
        """Fair-sharing preemption (Kueue's ``fairPreemptions``; KEP-1714 rules S2-a and S2-b).

        Queues holding candidates are visited highest share first, the preemptor's own with its
        request counted (Kueue simulates it there while it orders the target ClusterQueues). A
        same-queue candidate is taken as it comes (the preemptor's share is then recomputed). Another
        queue's candidate is taken when the first strategy holds; that queue is visited again while it
        still borrows (``borrowWithinCohort`` plays no part: Kueue ignores it under fair sharing). When
        that is not enough, the second strategy (LessThanInitialShare) takes the first skipped
        candidate of each queue whose share is still above the preemptor's.

        The plan that comes out (after fill-back) must also pass :meth:`_settles`: the guard that keeps
        two queues from preempting each other back and forth.
        """
        mine = self._request_on(task, run.state)
        others = dict.fromkeys(v.task.queue for v in ordered if v.task.queue != task.queue)
        initial = {queue: self.quotas.share(queue) for queue in others}  # the target queues' shares before
        new_share = self.quotas.share(task.queue, mine)
        retry: list[Victim] = []
        heap = _QueueHeap(ordered, self.quotas, first_only=False, preemptor=(task.queue, mine))
        while heap and run.placement is None:
            queue, share, victims = heap.pop()
            if queue == task.queue:
                self._take(run, victims[0])
                run.placement = self._fits(task, run)
                if run.placement is not None:
                    break
                new_share = self.quotas.share(task.queue, mine)
                if victims[1:]:
                    heap.push(queue, new_share, victims[1:])
                continue
            for i, victim in enumerate(victims):
                after = self.quotas.share(queue, {r: -a for r, a in victim.usage.items()})
                if _strategy(strategies[0], new_share, share, after):
                    self._take_from(run, victim, initial[queue])
                    run.placement = self._fits(task, run)
                    if run.placement is None and victims[i + 1 :] and self.quotas.is_borrowing(queue, self.needing):
                        heap.push(queue, after, victims[i + 1 :])
                    break
                retry.append(victim)
        if run.placement is None and len(strategies) > 1:
            heap = _QueueHeap(retry, self.quotas, first_only=True)
            while heap and run.placement is None:
                queue, share, victims = heap.pop()
                if _strategy(strategies[1], new_share, share, 0):
                    self._take_from(run, victims[0], initial[queue])
                    run.placement = self._fits(task, run)

    # -- trial steps -------------------------------------------------------------------------------
    def _take(self, run: _Run, victim: Victim) -> None:
        self._release(victim)
        run.taken.append(victim)

    def _settles(self, task: Task, run: _Run) -> bool:
        """The guard beyond Kueue on a fair-sharing plan found and filled back on ``run`` (its victims
        released): when it takes another queue's task, the preemptor's queue, charged for the placement
        it really gets, must borrow nothing or end with a share strictly below the share every target
        queue had before the preemption (``_Run.share_below``).

        That is the conclusion of Kueue's proof that two workloads never preempt each other (docs,
        concepts/fair_sharing, Lemma 1), which its strategies give only when the share they judge is
        the share admitted. Here it is not always so. The strategies judge the preemptor on its
        cheapest GPUs (:meth:`_request_on`) while the policy may pack it on smaller ones that charge
        more milli-GPU. And a same-queue victim, taken first so that the preemptor's share drops and
        another queue's task passes a strategy, may be returned by fill-back, raising the share again
        (Kueue's own open issue 14543, "FairSharing: infinite preemption loop"; Kueue does the same).
        Either way the preemptor's queue could end above its target's, and the victim take its place
        back at the next cycle, and so on forever (an admit-evict loop of Jobs). With the guard each
        cross-queue preemption strictly lowers the highest share among the queues involved and leaves
        the preemptor's below its targets', as the proof assumes, so the victim's queue cannot take
        the place back while the shares stand. (Loops through plain admissions into quota that a
        preemption freed beyond its need lie outside that proof and this guard, as in Kueue.)
        A plan that fails it is dropped, not mended by keeping the returned victim out: that victim
        would be admitted again at once, in the quota the preemption freed.
        """
        if run.share_below is None or run.placement is None:
            return True
        usage = self._usage(task, run.placement)
        if self.quotas.share(task.queue, usage) < run.share_below:
            return True
        return self.quotas.beyond_nominal(task.queue, usage) is None and not self.quotas.is_borrowing(task.queue)

    def _take_from(self, run: _Run, victim: Victim, target_share: float) -> None:
        """Take another queue's ``victim`` under fair sharing; ``target_share``: its queue's share before
        the preemption, which the preemptor's queue must then end below."""
        self._take(run, victim)
        run.share_below = target_share if run.share_below is None else min(run.share_below, target_share)

    def _release(self, victim: Victim) -> None:
        for name in victim.placement.nodes:  # a snapshot copies a node on first read: the release must see it
            if self.cluster.has_node(name):
                self.cluster.node(name)
        self.cluster.release(victim.task.key)
        self.quotas.charge(victim.task.queue, victim.usage, -1)

    def _restore(self, victim: Victim) -> None:
        self.cluster.reserve(victim.task, victim.placement, force=True)
        self.quotas.charge(victim.task.queue, victim.usage)

    def _fits(self, task: Task, run: _Run) -> Placement | None:
        """Where ``task`` goes on the run's node as it is now (its victims released), within quota
        and, unless borrowing is allowed, within its queue's nominal quota."""
        if run.state is None:  # a gang: every pod, over the run's scope, its whole charge judged at once
            nodes = None if run.scope is None else [self._current(n) for n in run.scope]
            total = self.total_check(task, allow_borrowing=run.allow_borrowing)
            return find_placement(self.cluster, task, self.policy, nodes=nodes, total_quota=total).placement
        if not could_fit_without(run.state, task, []):
            return None
        quota = self.quota_check(task, allow_borrowing=run.allow_borrowing)
        return find_placement(self.cluster, task, self.policy, quota=quota, nodes=[run.state]).placement

    def quota_check(self, task: Task, *, allow_borrowing: bool = True) -> QuotaCheck:
        """The quota test of a candidate placement of ``task`` (Kueue's ``workloadFits``): the first
        resource it does not fit, else None."""
        name = task.queue

        def check(state: NodeState, placement: PodPlacement) -> str | None:
            usage = usage_of(placement, {g.index: g.memory_mib for g in state.node.gpus}, task.flavor, task.card_mib)
            refused = self.quotas.refuses(name, usage)
            if refused is None and not allow_borrowing:
                refused = self.quotas.beyond_nominal(name, usage)
            return refused

        return check

    def total_check(self, task: Task, *, allow_borrowing: bool = True) -> TotalQuotaCheck:
        """:meth:`quota_check` for the whole placement of a gang (its pods' charges summed)."""

        def check(placement: Placement) -> str | None:
            usage = self._usage(task, placement)
            refused = self.quotas.refuses(task.queue, usage)
            if refused is None and not allow_borrowing:
                refused = self.quotas.beyond_nominal(task.queue, usage)
            return refused

        return check

    def _usage(self, task: Task, placement: Placement) -> Usage:
        """What ``placement`` charges ``task``'s queue (every pod, on its node's GPU sizes)."""
        return placement_usage(placement, lambda n: {g.index: g.memory_mib for g in self._current(n).node.gpus},
                               task.flavor, task.card_mib)

    def _request_on(self, task: Task, state: NodeState | None) -> Usage:
        """What ``task`` would charge on ``state``'s largest allowed GPUs (its exact charge on a node
        of identical GPUs): the request Kueue's fair-sharing shares are computed with."""
        if state is None:  # a gang: the least it charges (the cycle's min_usage)
            return dict(self.least or {})
        req = task.request
        gpus = sorted((g for g in state.node.gpus if req.allows(g.product)), key=lambda g: -g.memory_mib)
        slots = tuple(GpuSlot(g.index, g.uuid, req.mib_on(g)) for g in gpus[: req.count])
        memory = {g.index: g.memory_mib for g in gpus}
        return usage_of(PodPlacement(state.name, slots), memory, task.flavor, task.card_mib)


def _strategy(name: str, preemptor_new: float, victim_queue_old: float, victim_queue_new: float) -> bool:
    """Kueue's fair-sharing strategies: LessThanOrEqualToFinalShare (rule S2-a) and
    LessThanInitialShare (rule S2-b), shares as :meth:`QuotaBook.share` gives them."""
    if name == "LessThanOrEqualToFinalShare":
        return preemptor_new <= victim_queue_new
    return preemptor_new < victim_queue_old


class _QueueHeap:
    """Queues holding candidates, highest share first (ties: the queue whose candidate came first),
    each with its candidates in order (Kueue's ``TargetClusterQueueOrdering``). ``preemptor``: the
    preemptor's queue and its request, counted in that queue's share as Kueue simulates it."""

    def __init__(
        self,
        victims: Iterable[Victim],
        quotas: QuotaBook,
        *,
        first_only: bool,
        preemptor: tuple[str, Usage] | None = None,
    ) -> None:
        self.entries: dict[str, tuple[float, list[Victim]]] = {}
        self.rank: dict[str, int] = {}
        for v in victims:
            queue = v.task.queue
            if queue not in self.entries:
                self.rank[queue] = len(self.rank)
                extra = preemptor[1] if preemptor is not None and preemptor[0] == queue else None
                self.entries[queue] = (quotas.share(queue, extra), [v])
            elif not first_only:
                self.entries[queue][1].append(v)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def pop(self) -> tuple[str, float, list[Victim]]:
        queue = min(self.entries, key=lambda q: (-self.entries[q][0], self.rank[q]))
        share, victims = self.entries.pop(queue)
        return queue, share, victims

    def push(self, queue: str, share: float, victims: list[Victim]) -> None:
        self.entries[queue] = (share, victims)
