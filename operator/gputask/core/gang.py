"""Gang placement: every pod of a task placed at once, all or nothing, inside a topology domain (issue 30).

A task of several pods (Kueue's Workload of PodSets; a gang, as coscheduling and Volcano call it) is admitted
only when every pod has a node and GPUs at the same instant. :func:`place_gang` finds such a placement without
changing the cluster it reads: the pods are reserved one by one on a copy-on-write trial
(:class:`~gputask.core.snapshot.TrialCluster`: only the nodes the gang touches are copied), so each pod sees what
the earlier ones took, and nothing of a try survives it (no partial hold, ever).

Packing across nodes, PodSet by PodSet (pods of one PodSet are alike):
1. how many pods of the PodSet each node could take now (:func:`pods_fitting`; exact for whole-GPU pods, an upper
   bound for shared ones, whose GPUs the policy then picks);
2. fewest nodes first: while no node can take every pod left, the node that takes the most (ties: a node holding
   a pod of the gang already, then the configured policy's score for one pod there, lower first, then the node
   name); then, of the nodes that take every pod left, the best scored (a node of the gang's first, then the
   name);
3. on the chosen node the policy picks each pod's GPUs (its ``choose``), as for a one-pod task.

Topology (:attr:`~gputask.core.model.Task.topology_required` / ``topology_preferred``, a node label key): the
domains are the label's values. Required tries each domain with room for every PodSet, best first (fewest nodes
needed, then the least room, then the value: the tightest domain that holds the gang), and takes the first where
the whole gang fits, and its quota when asked; a node without the label takes no pod. Preferred tries the
domains the same way, then every node, filling the domains with the most room first (nodes without the label
last): as few domains as possible, greedily.

Cost: one capacity and one score per node and PodSet in a try (shared by identical nodes through the cluster
index's groups), plus one reservation per pod on the trial: O(nodes x PodSets + pods), linear in pods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gputask.core.cluster import ClusterState, NodeState, slots_for
from gputask.core.filters import feasible_gpus, node_fits
from gputask.core.fit import static_refusal
from gputask.core.model import NodeName, Placement, PodPlacement, PodSet, Task, TaskKey
from gputask.core.snapshot import TrialCluster


class Chooser(Protocol):
    """What gang placement reads of a placement policy (:class:`~gputask.core.placement.Policy`)."""

    scores_by_state: bool

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Pick ``task.request.count`` positions out of ``feasible``."""
        ...

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Score placing ``task`` on ``picked`` of ``state``; lower is better."""
        ...

    def prepare(self, cluster: ClusterState, task: Task) -> None:
        """Called once per PodSet, before any choose or score."""
        ...


TotalQuota = Callable[[Placement], "str | None"]
"""The quota test of a whole placement: None when it fits, else the resource that binds."""


@dataclass(frozen=True, slots=True)
class GangOutcome:
    """The result of :func:`place_gang`.

    ``placement``: every pod's node and GPUs, or None. Otherwise ``fits_somewhere`` says a try placed every pod but
    quota (``quota_resource``) refused it; ``product_seen`` is False when a PodSet's products are on no node.
    ``partial`` is the try that placed the most pods (pods in :attr:`Task.pods` order, None where no node took
    one; empty when no try was made), ``domain`` its topology domain (the label's value; None: no topology, or the
    fallback over every node).
    """

    placement: Placement | None
    fits_somewhere: bool = False
    quota_resource: str | None = None
    product_seen: bool = True
    partial: tuple[PodPlacement | None, ...] = ()
    domain: str | None = None

    @property
    def placed(self) -> int:
        """How many pods the best try placed together."""
        return sum(1 for p in self.partial if p is not None)


def pods_fitting(state: NodeState, pod: PodSet, limit: int) -> int:
    """How many pods of ``pod`` (at most ``limit``) ``state`` could take now, each on distinct GPUs of its own.

    The node filters of :func:`~gputask.core.filters.node_fits` (schedulable, taints and affinity, cpu, memory,
    ephemeral-storage, pod slots) and the GPU filters of :func:`~gputask.core.filters.feasible_gpus`; exact for
    whole GPUs, an upper bound for shared ones (k pods of ``count`` GPUs fit GPUs offering ``s_i`` slots each when
    ``sum(min(s_i, k)) >= k x count``, as long as the GPUs are picked well).
    """
    node, req = state.node, pod.request
    if limit <= 0 or not node.schedulable or len(node.gpus) < req.count:
        return 0
    if (node.taints or pod.constraints is not None) and static_refusal(
        pod.constraints, node.labels, node.taints, node.name
    ) is not None:
        return 0
    most = limit
    for free, need in ((state.cpu_free, pod.cpu_milli), (state.memory_free_mib, pod.memory_mib),
                       (state.ephemeral_free_mib, pod.ephemeral_mib), (state.pods_free, 1)):
        if free is not None:
            if need > free:
                return 0
            if need > 0:
                most = min(most, free // need)
    if req.count == 0:
        return most
    allows, gpus = req.allows, node.gpus
    if req.exclusive:
        idle = sum(1 for pos, gpu in enumerate(gpus) if allows(gpu.product) and state.is_idle(pos))
        return min(most, idle // req.count)
    slots: list[int] = []
    for pos, gpu in enumerate(gpus):
        need = req.mib_on(gpu)
        if allows(gpu.product) and need <= gpu.memory_mib and state.admits(pos, req.share_group):
            free = state.free_mib(pos)
            slots.append(most if need <= 0 else free // need)
    most = min(most, sum(slots) // req.count)
    while most > 0 and sum(min(s, most) for s in slots) < most * req.count:
        most -= 1
    return most


def domain_of(state: NodeState, key: str) -> str | None:
    """The value of label ``key`` on the node, None when it has none."""
    for name, value in state.node.labels:
        if name == key:
            return value
    return None


@dataclass(slots=True)
class _Candidate:
    name: NodeName
    capacity: int
    score: float


@dataclass(slots=True)
class _Try:
    """One try of the whole gang on a copy-on-write trial of ``cluster``: the pods placed so far."""

    cluster: ClusterState
    task: Task
    chooser: Chooser
    base: dict[NodeName, NodeState]
    groups: dict[NodeName, int] | None
    trial: TrialCluster = field(init=False)
    pods: list[PodPlacement | None] = field(init=False)
    memo: dict[tuple[int, int, int], tuple[int, float | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.trial = TrialCluster(self.cluster)
        self.pods = [None] * self.task.pod_count

    def state(self, name: NodeName) -> NodeState:
        """The node as the try sees it (its copy once a pod of the gang is reserved there)."""
        return self.trial.copied(name) or self.base[name]

    def run(self, sets: list[list[NodeName]]) -> bool:
        """Place every PodSet over ``sets`` (node lists filled in order); True when every pod got a node."""
        start = 0
        for number, pod in enumerate(self.task.podsets):
            self.chooser.prepare(self.cluster, self.one(pod, start))
            left = pod.count
            for names in sets:
                left -= self._place_set(number, pod, start + pod.count - left, names, left)
                if left == 0:
                    break
            if left:
                return False
            start += pod.count
        return True

    def one(self, pod: PodSet, index: int) -> Task:
        """The one-pod task of pod ``index`` (of PodSet ``pod``) that the trial reserves."""
        return replace(self.task.pod_task(pod), key=TaskKey(f"{self.task.key}#{index}"),
                       topology_required=None, topology_preferred=None)

    def _evaluate(self, number: int, pod: PodSet, name: NodeName, limit: int) -> tuple[int, float | None]:
        """(pods of ``pod`` the node takes, the policy's score for one there); shared by identical untouched nodes."""
        copied = self.trial.copied(name)
        group = None if copied is not None or self.groups is None else self.groups[name]
        if group is not None and self.chooser.scores_by_state:
            found = self.memo.get((number, group, limit))
            if found is not None:
                return found
        state = copied or self.base[name]
        capacity = pods_fitting(state, pod, limit)
        score: float | None = None
        if capacity:
            probe = self.one(pod, 0)
            feasible = feasible_gpus(state, probe) if node_fits(state, probe) else []
            if len(feasible) >= pod.request.count:
                score = self.chooser.score(state, probe, self.chooser.choose(state, probe, feasible))
        result = (capacity, score)
        if group is not None and self.chooser.scores_by_state:
            self.memo[(number, group, limit)] = result
        return result

    def _place_set(self, number: int, pod: PodSet, first: int, names: list[NodeName], left: int) -> int:
        """Place up to ``left`` pods of ``pod`` (task indices from ``first``) on ``names``, fewest nodes first."""
        found = []
        for name in names:
            capacity, score = self._evaluate(number, pod, name, left)
            if capacity and score is not None:
                found.append(_Candidate(name, capacity, score))
        taken = {p.node for p in self.pods if p is not None}  # nodes the gang holds already go first on ties
        by_capacity = sorted(found, key=lambda c: (-c.capacity, c.name not in taken, c.score, c.name))
        by_score: list[_Candidate] | None = None
        used: set[NodeName] = set()
        placed, i = 0, 0
        while placed < left:
            while i < len(by_capacity) and by_capacity[i].name in used:
                i += 1
            if i == len(by_capacity):
                break
            pick = by_capacity[i]
            if pick.capacity >= left - placed:  # a node takes every pod left: the best scored of those
                by_score = by_score or sorted(found, key=lambda c: (c.name not in taken, c.score, c.name))
                pick = next(c for c in by_score if c.capacity >= left - placed and c.name not in used)
            used.add(pick.name)
            placed += self._fill(pod, first + placed, pick.name, min(left - placed, pick.capacity))
        return placed

    def _fill(self, pod: PodSet, first: int, name: NodeName, count: int) -> int:
        """Reserve up to ``count`` pods of ``pod`` on ``name`` (the policy picks their GPUs); how many it took."""
        for k in range(count):
            one = self.one(pod, first + k)
            state = self.trial.node(name)
            feasible = feasible_gpus(state, one) if node_fits(state, one) else []
            if len(feasible) < pod.request.count:
                return k
            placement = Placement.one(name, slots_for(state, one, self.chooser.choose(state, one, feasible)))
            self.trial.reserve(one, placement)
            self.pods[first + k] = placement.only()
        return count


def place_gang(
    cluster: ClusterState,
    task: Task,
    chooser: Chooser,
    *,
    nodes: Sequence[NodeState] | None = None,
    total_quota: TotalQuota | None = None,
) -> GangOutcome:
    """All-or-nothing placement of every pod of ``task`` over ``nodes`` (default: every node of ``cluster``), in
    its topology (module doc); ``total_quota`` judges each whole placement found. ``cluster`` is not changed."""
    base, groups = _base(cluster, task, nodes)
    states = list(base.values())
    product_seen = all(
        not pod.request.products or any(pod.request.allows(g.product) for s in states for g in s.node.gpus)
        for pod in task.podsets
    )
    best: GangOutcome | None = None
    fitted_quota: str | None = None
    for domain, sets in _tries(task, base, groups, chooser, cluster):
        attempt = _Try(cluster, task, chooser, base, groups)
        complete = attempt.run(sets)
        if complete:
            placement = Placement(tuple(p for p in attempt.pods if p is not None))
            refused = None if total_quota is None else total_quota(placement)
            if refused is None:
                return GangOutcome(placement, True)
            fitted_quota = fitted_quota or refused
        tried = GangOutcome(None, partial=tuple(attempt.pods), domain=domain)
        if best is None or tried.placed > best.placed:
            best = tried
    partial = () if best is None else best.partial
    return GangOutcome(None, fitted_quota is not None, fitted_quota, product_seen, partial,
                       None if best is None else best.domain)


def _base(
    cluster: ClusterState, task: Task, nodes: Sequence[NodeState] | None
) -> tuple[dict[NodeName, NodeState], dict[NodeName, int] | None]:
    """The node states to read by name (name order), and the index's group per node when they are the live
    cluster's own states (identical nodes then share evaluations; not when the task's affinity reads names)."""
    if nodes is not None:
        return {s.name: s for s in sorted(nodes, key=lambda s: s.name)}, None
    if isinstance(cluster, TrialCluster):
        live = cluster.index().states
        return {s.name: cluster.current(s.name) for s in live}, None
    index = cluster.index()
    by_name = any(p.constraints is not None and p.constraints.by_name for p in task.podsets)
    groups = None if by_name else {s.name: g for s, g in zip(index.states, index.group, strict=True)}
    return {s.name: s for s in index.states}, groups


def _tries(
    task: Task,
    base: dict[NodeName, NodeState],
    groups: dict[NodeName, int] | None,
    chooser: Chooser,
    cluster: ClusterState,
) -> list[tuple[str | None, list[list[NodeName]]]]:
    """The tries in order: (domain, node lists filled in order). No topology: one try over every node."""
    key = task.topology
    names = list(base)
    if key is None:
        return [(None, [names])]
    domains: dict[str, list[NodeName]] = {}
    for name in names:
        value = domain_of(base[name], key)
        if value is not None:
            domains.setdefault(value, []).append(name)
    probe = _Try(cluster, task, chooser, base, groups)
    room: dict[str, list[int]] = {}
    ranked = []
    for value, members in domains.items():
        sums, needed = [], 0
        for number, pod in enumerate(task.podsets):
            caps = sorted((probe._evaluate(number, pod, n, pod.count)[0] for n in members), reverse=True)
            sums.append(sum(caps))
            covered = 0
            for cap in caps:
                if covered >= pod.count or not cap:
                    break
                covered += cap
                needed += 1
        room[value] = sums
        if all(s >= pod.count for s, pod in zip(sums, task.podsets, strict=True)):
            ranked.append(((needed, sum(sums), value), value))
    tries: list[tuple[str | None, list[list[NodeName]]]] = [(v, [domains[v]]) for _, v in sorted(ranked)]
    if task.topology_preferred is not None:
        roomiest = sorted(domains, key=lambda v: (-sum(room[v]), v))
        unlabelled = [n for n in names if domain_of(base[n], key) is None]
        tries.append((None, [domains[v] for v in roomiest] + [unlabelled]))
    elif not tries and domains:  # no domain has room: one try in the roomiest, to say how far it gets
        roomiest_value = min(domains, key=lambda v: (-sum(room[v]), v))
        tries.append((roomiest_value, [domains[roomiest_value]]))
    return tries
