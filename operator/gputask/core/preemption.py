"""Placement-aware preemption with Kueue's ClusterQueue policies.

Who may be preempted (Kueue documentation, "Cluster Queue" > Preemption):
- same queue: ``withinClusterQueue`` LowerPriority (strictly lower priority) or
  LowerOrNewerEqualPriority (lower, or equal and created later);
- other queues of the cohort, only while that queue borrows (uses more than its nominalQuota):
  ``reclaimWithinCohort`` when the preemptor stays within its own nominal quota (Any: any
  priority; LowerPriority: lower only), ``borrowWithinCohort`` LowerPriority when the preemptor
  must borrow (lower priority, and at most ``maxPriorityThreshold`` when set).
- fair sharing (``fairSharing`` on the queues): another queue's task may be preempted only if
  the preemptor's queue share after admission stays at or below the victim queue's share after
  the preemption, and strictly below its share before it (Kueue's LessThanOrEqualToFinalShare
  then LessThanInitialShare), so admission and preemption never contradict each other.

Unlike Kueue, victims are chosen on ONE node so that the preemptor really fits there: on each
node, candidates are removed lowest priority first (most recently admitted, then newest, first)
until the preemptor fits (a task of another queue only while that queue, its earlier victims
gone, still borrows: :func:`borrowing_after`), then each removed one is put back while the preemptor still fits
("reprieve", as in Kueue and kube-scheduler). The node whose victim set is smallest, then has
the lowest priorities, then the most recently admitted, wins; ties go to the smallest name.
Planning works on the live state with undo steps: it leaves the state exactly as it found it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gputask.core.cluster import ClusterState, NodeState
from gputask.core.fit import static_refusal
from gputask.core.ledger import Entry
from gputask.core.model import Placement, Task
from gputask.core.placement import Policy, QuotaCheck, find_placement
from gputask.core.quota import QueueSpec, QuotaBook, Usage, add_usage


@dataclass(slots=True)
class Victim:
    """A running task that may be preempted: task, placement, usage, admission time (s)."""

    task: Task
    placement: Placement
    usage: Usage
    admitted_at: float


@dataclass(frozen=True, slots=True)
class Plan:
    """Preempt ``victims`` on ``placement.node`` so ``placement`` fits the preemptor."""

    placement: Placement
    victims: tuple[Victim, ...]


def victim_allowed(
    preemptor: Task,
    victim: Task,
    *,
    quotas: QuotaBook,
    borrowing: bool,
    share_ok: Callable[[Victim], bool] | None = None,
    victim_entry: Victim | None = None,
    victim_borrowing: bool | None = None,
) -> bool:
    """True when the queues' policies let ``preemptor`` preempt ``victim`` (see module doc).

    ``borrowing`` says whether the preemptor would use more than its nominal quota;
    ``share_ok`` is the fair-sharing rule, given when the cohort shares fairly; ``victim_borrowing``
    whether the victim's queue borrows, when the caller knows (None: asked of ``quotas``).
    """
    spec = quotas.specs.get(preemptor.queue)
    if spec is None:
        return False
    policy = spec.preemption
    if victim.queue == preemptor.queue:
        if policy.within_cluster_queue == "LowerPriority":
            return victim.priority < preemptor.priority
        if policy.within_cluster_queue == "LowerOrNewerEqualPriority":
            return victim.priority < preemptor.priority or (
                victim.priority == preemptor.priority
                and (victim.created, victim.key) > (preemptor.created, preemptor.key)
            )
        return False
    other = quotas.specs.get(victim.queue)
    if spec.cohort is None or other is None or other.cohort != spec.cohort:
        return False
    if not (quotas.is_borrowing(victim.queue) if victim_borrowing is None else victim_borrowing):
        return False
    if share_ok is not None:
        return policy.reclaim_within_cohort != "Never" and victim_entry is not None and share_ok(victim_entry)
    if not borrowing:
        if policy.reclaim_within_cohort == "Any":
            return True
        return policy.reclaim_within_cohort == "LowerPriority" and victim.priority < preemptor.priority
    if policy.reclaim_within_cohort == "Never" or policy.borrow_within_cohort != "LowerPriority":
        return False
    threshold = policy.max_priority_threshold
    return victim.priority < preemptor.priority and (threshold is None or victim.priority <= threshold)


def any_preemption(spec: QueueSpec) -> bool:
    """True when the queue's policy could ever preempt something."""
    p = spec.preemption
    return p.within_cluster_queue != "Never" or p.reclaim_within_cohort != "Never"


class Planner:
    """Plans one preemption on the live cluster and quota book, undoing every trial step."""

    def __init__(self, cluster: ClusterState, quotas: QuotaBook, policy: Policy) -> None:
        self.cluster = cluster
        self.quotas = quotas
        self.policy = policy

    @contextmanager
    def _without(self, victims: list[Victim]) -> Iterator[None]:
        """Temporarily release ``victims`` (GPUs and quota), restoring them on exit."""
        for v in victims:
            self.cluster.release(v.task.key)
            self.quotas.charge(v.task.queue, v.usage, -1)
        try:
            yield
        finally:
            for v in reversed(victims):
                self.cluster.reserve(v.task, v.placement, force=True)
                self.quotas.charge(v.task.queue, v.usage)

    def _fits(self, task: Task, state: NodeState, quota: QuotaCheck, victims: list[Victim]) -> Placement | None:
        if not could_fit_without(state, task, victims):
            return None  # the node filters would refuse it anyway: skip releasing and re-reserving
        with self._without(victims):
            return find_placement(self.cluster, task, self.policy, quota=quota, nodes=[state]).placement

    def plan(
        self,
        task: Task,
        candidates_by_node: dict[str, list[Victim]],
        quota: QuotaCheck,
    ) -> Plan | None:
        """The best single-node plan for ``task`` among ``candidates_by_node``, or None."""
        with self.cluster.deferred_index():  # trials touch node states only; the index catches up once
            return self._plan(task, candidates_by_node, quota)

    def _plan(self, task: Task, candidates_by_node: dict[str, list[Victim]], quota: QuotaCheck) -> Plan | None:
        best: tuple[tuple[object, ...], Plan] | None = None
        for name in sorted(candidates_by_node):
            state = self.cluster.node(name)  # type: ignore[arg-type]
            candidates = sorted(candidates_by_node[name], key=_removal_order)
            if not candidates or self._fits(task, state, quota, candidates) is None:
                continue
            found = self._minimal(task, state, quota, candidates)
            if found is None:
                continue
            victims, placement = found
            score = (
                len(victims),
                tuple(sorted((v.task.priority for v in victims), reverse=True)),
                tuple(sorted(-v.admitted_at for v in victims)),
                name,
            )
            if best is None or score < best[0]:
                best = (score, Plan(placement, tuple(victims)))
        return None if best is None else best[1]

    def _minimal(
        self, task: Task, state: NodeState, quota: QuotaCheck, ordered: list[Victim]
    ) -> tuple[list[Victim], Placement] | None:
        """Remove candidates in order until the task fits, then reprieve those not needed.

        Returns the victims with the placement found for exactly that set (policies such as
        random may answer differently on each call, so the placement is never recomputed).
        The victims taken so far stay released between trials (each trial releases or restores one
        task, not the whole set) and are all restored before returning.
        """
        victims: list[Victim] = []
        placement: Placement | None = None
        try:
            for candidate in ordered:
                # (victims are released, so their usage is already off their queues)
                if candidate.task.queue != task.queue and not borrowing_after(self.quotas, candidate.task.queue, []):
                    continue  # taking it would push its queue below its nominal quota (Kueue re-checks each one)
                self._release(candidate)
                victims.append(candidate)
                placement = self._fits_released(task, state, quota)
                if placement is not None:
                    break
            if placement is None:
                return None
            for candidate in reversed(list(victims)):  # reprieve: highest priority first
                self._restore(candidate)
                found = self._fits_released(task, state, quota)
                if found is not None:
                    victims, placement = [v for v in victims if v is not candidate], found
                else:
                    self._release(candidate)
            return victims, placement
        finally:
            for v in reversed(victims):
                self._restore(v)

    def _release(self, victim: Victim) -> None:
        self.cluster.release(victim.task.key)
        self.quotas.charge(victim.task.queue, victim.usage, -1)

    def _restore(self, victim: Victim) -> None:
        self.cluster.reserve(victim.task, victim.placement, force=True)
        self.quotas.charge(victim.task.queue, victim.usage)

    def _fits_released(self, task: Task, state: NodeState, quota: QuotaCheck) -> Placement | None:
        """Where ``task`` goes on ``state`` as it is now (the trial's victims already released)."""
        if not could_fit_without(state, task, []):
            return None
        return find_placement(self.cluster, task, self.policy, quota=quota, nodes=[state]).placement


def could_fit_without(state: NodeState, task: Task, victims: list[Victim]) -> bool:
    """Whether ``task`` could pass the node filters and find enough GPUs on ``state`` once ``victims`` are
    gone, reckoned without touching the state. Never False where the real search (``node_fits`` and
    ``feasible_gpus`` after releasing them) would find enough: so skipping a trial it refuses changes
    nothing, not even a random policy's draws (they happen only once a node has enough GPUs)."""
    node, req = state.node, task.request
    if not node.schedulable or len(node.gpus) < req.count:
        return False
    if (node.taints or task.constraints is not None) and static_refusal(
        task.constraints, node.labels, node.taints, node.name
    ) is not None:
        return False
    freed = {"cpu": 0, "memory": 0, "storage": 0}
    mib = [0] * len(node.gpus)
    held = [False] * len(node.gpus)
    for victim in victims:
        freed["cpu"] += victim.task.cpu_milli
        freed["memory"] += victim.task.memory_mib
        freed["storage"] += victim.task.ephemeral_mib
        for slot in victim.placement.gpus:
            pos = state.position.get(slot.index)
            if pos is not None and node.gpus[pos].uuid == slot.uuid:
                mib[pos] += slot.memory_mib
                held[pos] = True
    for free, need, key in ((state.cpu_free, task.cpu_milli, "cpu"), (state.memory_free_mib, task.memory_mib, "memory"),
                            (state.ephemeral_free_mib, task.ephemeral_mib, "storage")):
        if free is not None and need > free + freed[key]:
            return False
    pods = state.pods_free
    if pods is not None and pods + len(victims) < 1:
        return False
    usable = 0
    for pos, gpu in enumerate(node.gpus):
        if not gpu.healthy or not req.allows(gpu.product):
            continue
        reserved = state.reserved_mib[pos] - mib[pos]
        exclusive = state.exclusive[pos] and not held[pos]
        if req.exclusive:
            usable += reserved <= 0 and gpu.foreign_mib == 0
        elif not exclusive and gpu.memory_mib - gpu.foreign_mib - reserved >= req.mib_on(gpu):
            usable += req.mib_on(gpu) <= gpu.memory_mib
    return usable >= req.count


def borrowing_after(quotas: QuotaBook, queue: str, removed: list[Victim]) -> bool:
    """True when ``queue`` still uses more than its nominal quota of some resource once ``removed`` are gone.

    Kueue takes a task of another queue only while that queue borrows, judged again after every victim
    already chosen (pkg/scheduler/preemption: candidates are re-validated as the plan grows).
    """
    spec = quotas.specs.get(queue)
    if spec is None:
        return False
    used = dict(quotas.usage.get(queue, {}))
    for victim in removed:
        if victim.task.queue == queue:
            add_usage(used, victim.usage, -1)
    return any(used.get(r, 0) > q.nominal for r, q in spec.quotas.items())


def _removal_order(victim: Victim) -> tuple[object, ...]:
    """Lowest priority first; among equals the most recently admitted, then the newest task."""
    return (victim.task.priority, -victim.admitted_at, -victim.task.created, victim.task.key)


# -- eligibility: who may be preempted, and whether a plan keeps the queues' rules -------------------


def candidates(
    task: Task,
    running: Iterable[Entry] | Callable[[set[str]], Iterable[Entry]],
    quotas: QuotaBook,
    *,
    borrowing: bool,
    least: Usage,
) -> dict[str, list[Victim]]:
    """Running tasks the queues' policies let ``task`` preempt, by node name.

    ``running``: the running entries, or a function giving those of some queues (the ledger's
    ``running_in``), so only the queues whose tasks could be victims are read.
    ``borrowing`` says whether the preemptor would use more than its nominal quota; ``least``
    is the least it can charge (for the fair-sharing rule, judged per victim before planning).
    Entries whose quota someone else books (Kueue mode) are never candidates.
    """
    share_ok = None
    if quotas.fair_sharing(task.queue):
        mine_after = quotas.share(task.queue, least)

        def share_ok(victim: Victim) -> bool:
            return share_allows(quotas, mine_after, victim.task.queue, victim.usage)

    out: dict[str, list[Victim]] = {}
    queues = _victim_queues(task, quotas)
    if not queues:
        return out
    for entry in running(queues) if callable(running) else running:
        if not entry.charged or entry.task.queue not in queues:
            continue
        victim = Victim(entry.task, entry.placement, entry.usage, entry.admitted_at)
        other_queue = entry.task.queue != task.queue  # then in ``queues`` only because it borrows now
        if victim_allowed(task, entry.task, quotas=quotas, borrowing=borrowing, share_ok=share_ok,
                          victim_entry=victim, victim_borrowing=True if other_queue else None):
            out.setdefault(entry.placement.node, []).append(victim)
    return out


def _victim_queues(task: Task, quotas: QuotaBook) -> set[str]:
    """Queues whose tasks :func:`victim_allowed` could let ``task`` preempt at all: its own (unless
    ``withinClusterQueue: Never``), and the other queues of its cohort that borrow now (unless
    ``reclaimWithinCohort: Never``). A necessary condition, so candidates need not test every entry."""
    spec = quotas.specs.get(task.queue)
    if spec is None:
        return set()
    policy = spec.preemption
    out = {task.queue} if policy.within_cluster_queue != "Never" else set()
    if spec.cohort is not None and policy.reclaim_within_cohort != "Never":
        others = (m.name for m in quotas.cohort_members(spec.cohort) if m.name != task.queue)
        out |= {name for name in others if quotas.is_borrowing(name)}
    return out


def share_allows(quotas: QuotaBook, mine_after: float, queue: str, freed: Usage) -> bool:
    """Kueue's fair-sharing rule for taking ``freed`` from ``queue``: the preemptor's share after
    (``mine_after``) is at most that queue's share after, and below its share before."""
    after = quotas.share(queue, {r: -a for r, a in freed.items()})
    return mine_after <= after and mine_after < quotas.share(queue)


def borrows_with(task: Task, plan: Plan, quotas: QuotaBook, usage: Usage) -> bool:
    """Would ``task``'s queue use more than its nominal quota after ``plan`` (``usage`` = the
    preemptor's charge on the plan's placement), its own victims given back?"""
    spec = quotas.specs[task.queue]
    used = dict(quotas.usage.get(task.queue, {}))
    for victim in plan.victims:
        if victim.task.queue == task.queue:
            add_usage(used, victim.usage, -1)
    return any(used.get(r, 0) + usage.get(r, 0) > q.nominal for r, q in spec.quotas.items())


def fair_with(task: Task, plan: Plan, quotas: QuotaBook, usage: Usage) -> bool:
    """The fair-sharing rule (:func:`share_allows`) checked on the real plan, for every victim queue."""
    if not quotas.fair_sharing(task.queue):
        return True
    freed: dict[str, Usage] = {}
    for victim in plan.victims:
        add_usage(freed.setdefault(victim.task.queue, {}), victim.usage)
    mine = dict(usage)
    add_usage(mine, freed.get(task.queue, {}), -1)
    mine_after = quotas.share(task.queue, mine)
    return all(share_allows(quotas, mine_after, q, u) for q, u in freed.items() if q != task.queue)
