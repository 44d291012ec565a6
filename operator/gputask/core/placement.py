"""Placement: filter nodes and GPUs, then score them with a pluggable policy.

Shaped like the kube-scheduler framework (filter, score, reserve): :func:`feasible_gpus`
filters the GPUs of one node, a :class:`Policy` picks GPUs on a node and scores the
result (lower is better), and :func:`find_placement` returns the best node, ties going to
the smallest node name (then the lowest GPU index inside the node). Policies are plain
objects so the trace benchmark can compete them (issue "Beat FGD").

Speed (the trace replay places ~10,000 tasks on 1,213 nodes per run; the operator may hold
50,000 pending tasks on 5,000 nodes). For a policy whose choice depends only on a node's state
(``scores_by_state``) and the task's shape, :func:`find_placement` keeps a
:class:`~gputask.core.search.Board` per task shape: every node's evaluation in a heap, best
first, updated only for the nodes that changed since the shape's last search (the index logs
them), with evaluations shared by identical nodes (the index's groups). A search is then a heap
lookup, not a scan. Other policies (random) first keep the nodes whose aggregates in the
:class:`NodeIndex` allow a fit (a necessary condition, checked in C over the columns), then
visit them. None of this changes the result; property tests compare it with a plain scan.
A quota check is asked once per distinct set of picked GPU sizes (:data:`QuotaCheck`).

A task of several pods (:attr:`~gputask.core.model.Task.pods`) is placed all or nothing
(:mod:`gputask.core.gang`): pod by pod on a copy-on-write trial of the cluster, each pod seeing what
the earlier pods of the task took (pods may share a node), fewest nodes first, inside its topology
domain; admitted only when every pod has its node and GPUs; the live cluster never holds part of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import ge
from typing import TYPE_CHECKING, Protocol

from gputask.core.cluster import ClusterState, NodeIndex, NodeState, slots_for
from gputask.core.filters import feasible_gpus as feasible_gpus
from gputask.core.filters import node_fits as node_fits
from gputask.core.gang import GangOutcome, place_gang
from gputask.core.model import MILLI_PER_GPU, GpuRequest, Placement, PodPlacement, Task
from gputask.core.search import Evaluation, board_for, refuser

if TYPE_CHECKING:
    from gputask.core.policies.workload import TaskShape

QuotaCheck = Callable[[NodeState, PodPlacement], "str | None"]
"""Returns None when a candidate placement of a one-pod task fits quota, else the name of the resource that binds.

Contract: the answer depends only on the task and the sizes (MiB) of the GPUs the placement
picks (so on the MiB it puts on each), as quota usage does (``usage_of``); never on the node's
name, GPU indices or uuids, or on other nodes. :func:`find_placement` therefore asks it once per
distinct set of picked GPU sizes in a search and reuses the answer for alike candidates.
"""


TotalQuotaCheck = Callable[[Placement], "str | None"]
"""The quota test of a whole placement of a task of several pods (its pods' usage summed): None when it fits,
else the name of the resource that binds."""


def free_milli_after(state: NodeState, picked: Sequence[int], request: GpuRequest) -> int:
    """Free GPU capacity left on the node after placing, in milli-GPU summed over GPUs."""
    total = 0
    for pos, gpu in enumerate(state.node.gpus):
        if not gpu.healthy:
            continue
        free = state.free_mib(pos)
        if pos in picked:
            free = 0 if request.exclusive else free - request.mib_on(gpu)
        total += free * MILLI_PER_GPU // gpu.memory_mib if gpu.memory_mib else 0
    return total


def tightest(state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
    """Best fit inside a node: the ``count`` GPUs with the least free MiB, lowest index on ties."""
    ranked = sorted(feasible, key=lambda p: (state.free_mib(p), state.node.gpus[p].index))
    return tuple(ranked[: task.request.count])


class Policy(Protocol):
    """A placement policy: chooses GPUs on one node and scores the choice (lower is better).

    The hooks :func:`find_placement` and the trace replay call (:class:`PolicyBase` gives each a
    default, so a policy states only what it changes):
    - ``stop_at_first``: take the first fitting node visited, score nothing more;
    - ``scores_by_state``: ``choose`` and ``score`` depend only on the node's state and the
      task's request, CPU and memory, never on the node's name, GPU uuids, other task fields or
      earlier calls; their results are then remembered per group of identical node states and
      task shape;
    - ``node_order(count)``: the order in which to visit the ``count`` candidate nodes
      (positions in name order); None = name order;
    - ``prepare(cluster, task)``: called once per search, before any ``choose``/``score``: the
      policy may update what its scores depend on besides the node (a target workload learnt
      from the tasks it sees, the cluster's GPU capacity by product);
    - ``generation``: changes whenever the meaning of ``score`` changed (after ``prepare``);
      remembered evaluations of a ``scores_by_state`` policy are then dropped;
    - ``learns``: ``prepare`` learns from every task it sees (a recent workload), so trying a task
      again is not a no-op for it: a scheduler then never skips a cycle nor tries new tasks alone;
    - ``reseed(seed)``: start a policy that draws random numbers over from ``seed``;
    - ``set_workload(shapes)``: the target workload a fragmentation policy packs for (trace replay).
    """

    name: str
    stop_at_first: bool
    scores_by_state: bool
    learns: bool

    @property
    def generation(self) -> int:
        """Changes whenever what ``score`` means changed."""
        ...

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Pick ``task.request.count`` positions out of ``feasible``."""
        ...

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Score placing ``task`` on ``picked`` of ``state``; lower is better."""
        ...

    def node_order(self, count: int) -> Iterable[int] | None:
        """The visiting order of ``count`` candidate nodes, or None for name order."""
        ...

    def prepare(self, cluster: ClusterState, task: Task) -> None:
        """Called once per search, before any choose or score."""
        ...

    def reseed(self, seed: int) -> None:
        """Start the random draws over from ``seed`` (deterministic policies ignore it)."""
        ...

    def set_workload(self, shapes: Iterable[TaskShape]) -> None:
        """Fix the target workload (policies without one ignore it)."""
        ...


class PolicyBase:
    """The defaults of every :class:`Policy` hook: name order, no preparation, nothing random."""

    stop_at_first: bool = False
    scores_by_state: bool = False
    learns: bool = False

    @property
    def generation(self) -> int:
        """Never changes: scores mean the same thing for the policy's life."""
        return 0

    def node_order(self, count: int) -> Iterable[int] | None:
        """Name order."""
        return None

    def prepare(self, cluster: ClusterState, task: Task) -> None:
        """Nothing to prepare."""

    def reseed(self, seed: int) -> None:
        """Nothing random to re-seed."""

    def set_workload(self, shapes: Iterable[TaskShape]) -> None:
        """No target workload to set."""


@dataclass
class BestFit(PolicyBase):
    """Best fit: the node left with the least free GPU capacity (milli-GPU), tightest GPUs.

    The classic bin-packing heuristic (Johnson 1974); FGD's baseline "05-BestFit".
    """

    name: str = "bestfit"
    scores_by_state: bool = True

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Tightest GPUs first."""
        return tightest(state, task, feasible)

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Free milli-GPU left on the node after placing."""
        return float(free_milli_after(state, picked, task.request))


@dataclass
class FirstFit(PolicyBase):
    """First fit: the first feasible node in name order, lowest-index feasible GPUs."""

    name: str = "firstfit"
    stop_at_first: bool = True
    scores_by_state: bool = True

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Lowest indices first."""
        return tuple(feasible[: task.request.count])

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Constant: the name order decides."""
        return 0.0


@dataclass
class RandomFit(PolicyBase):
    """Random: a uniformly random feasible node (FGD's "01-Random"), seeded for repeatability.

    It visits the candidate nodes in a random order (a lazy Fisher-Yates shuffle) and takes
    the first that fits: the first feasible node of a uniformly random order is uniformly
    random among the feasible nodes, and the search usually ends after a node or two.
    Random GPUs among the feasible ones of that node.
    """

    seed: int = 0
    name: str = "random"
    stop_at_first: bool = True

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def reseed(self, seed: int) -> None:
        """Start over from ``seed`` (the trace replay seeds each run with its trace seed)."""
        self.seed = seed
        self._rng = random.Random(seed)

    def node_order(self, count: int) -> Iterator[int]:  # a visiting order always, never None
        """Positions 0..count-1 in a uniformly random order, drawn as they are consumed."""
        order = list(range(count))
        for i in range(count):
            j = self._rng.randrange(i, count)
            order[i], order[j] = order[j], order[i]
            yield order[i]

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Random GPUs among the feasible ones."""
        return tuple(sorted(self._rng.sample(list(feasible), task.request.count)))

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Constant: the random visiting order decides."""
        return 0.0


POLICIES: dict[str, Callable[[], Policy]] = {
    "bestfit": BestFit,
    "firstfit": FirstFit,
    "random": RandomFit,
}
"""Policy factories by name; other modules register more (see :func:`register_policy`)."""

DEFAULT_POLICY = "packing"
"""The operator's and the scenario runner's default: ``packing`` (:mod:`gputask.core.policies.packing`,
registered when :mod:`gputask.core` is imported). On the 17 pod lists of ``make bench`` it leaves
no more GPUs unallocated than FGD on 16 and fewer than ``bestfit`` on 16 (bench/results/summary.md).
``bestfit``, ``firstfit`` and ``random`` stay available by name."""


def register_policy(name: str, factory: Callable[[], Policy]) -> None:
    """Make a policy available by name to the operator, scenarios and the simulator."""
    POLICIES[name] = factory


def make_policy(name: str, *, seed: int | None = None) -> Policy:
    """Return a new policy instance; raises KeyError naming the known policies.

    ``seed`` re-seeds a policy that draws random numbers (one with a ``reseed(seed)`` method);
    deterministic policies ignore it.
    """
    try:
        policy = POLICIES[name]()
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    if seed is not None:
        policy.reseed(seed)
    return policy


@dataclass(frozen=True, slots=True)
class Outcome:
    """Result of a placement search.

    ``placement`` is set when a node fits. Otherwise ``fits_somewhere`` says whether any node
    fitted physically (then ``quota_resource`` names the quota that refused every one).
    ``product_seen`` is False when no node carries an allowed product. ``gang``: for a task placed by
    :mod:`gputask.core.gang`, its outcome (the best partial try, for the wait messages).
    """

    placement: Placement | None
    fits_somewhere: bool = False
    quota_resource: str | None = None
    product_seen: bool = True
    gang: GangOutcome | None = None


def candidate_rows(index: NodeIndex, task: Task) -> list[int]:
    """Rows of ``index`` (name order) whose aggregates allow ``task`` to fit.

    A necessary condition only (schedulable, CPU, host memory, and enough idle GPUs or one
    GPU with enough free MiB or share); :func:`node_fits` and :func:`feasible_gpus` decide.
    """
    req = task.request
    column, need = index.idle, 0  # CPU/memory only when count is 0
    if req.count and req.exclusive:
        need = req.count
    elif req.count and req.memory_mib is not None:
        column, need = index.max_free_mib, req.memory_mib
    elif req.count:
        column, need = index.max_free_milli, req.fraction_milli or 0
    cpu, memory, free_cpu, free_memory = task.cpu_milli, task.memory_mib, index.free_cpu, index.free_memory
    gpu_rows = compress(range(len(column)), map(ge, column, repeat(need)))  # in C: the hot loop
    return [i for i in gpu_rows if free_cpu[i] >= cpu and free_memory[i] >= memory]


@dataclass(slots=True)
class _Search:
    """Running state of one placement search."""

    best: tuple[float, str, NodeState, tuple[int, ...]] | None = None
    fits_somewhere: bool = False
    quota_resource: str | None = None


def find_placement(
    cluster: ClusterState,
    task: Task,
    policy: Policy,
    *,
    quota: QuotaCheck | None = None,
    nodes: Sequence[NodeState] | None = None,
    refused_anyway: bool = False,
    total_quota: TotalQuotaCheck | None = None,
) -> Outcome:
    """Find the best placement of ``task`` over ``nodes`` (default: every node, name order).

    The best is the lowest ``(score, node name)``; ``quota`` rejects candidates that
    would exceed a queue's quota. ``refused_anyway`` says the caller knows ``quota`` refuses every
    candidate (it refuses even the least the task could charge, and refusals are monotone in
    usage): a board search then only looks for the node a refusal is reported for, instead of
    asking ``quota`` about every fitting node; the outcome is the same. Pure: the cluster is not
    changed (only its caches).

    A task of several pods, or with a required topology, is placed by :func:`gputask.core.gang.place_gang`:
    ``quota`` is not asked (it judges one pod); ``total_quota`` judges the whole placement once every pod has one.
    """
    if task.gang:
        found = place_gang(cluster, task, policy, nodes=nodes, total_quota=total_quota)
        return Outcome(found.placement, found.fits_somewhere, found.quota_resource, found.product_seen, found)
    req = task.request
    search = _Search()
    policy.prepare(cluster, task)
    if nodes is None:
        index = cluster.index()
        by_board = policy.scores_by_state and policy.node_order(0) is None  # (a lazy order draws nothing)
        rows = [] if by_board else candidate_rows(index, task)
        order = policy.node_order(len(rows))
        visits = range(len(rows)) if order is None else order
        if by_board:
            _search_board(search, index, task, policy, quota, refused_anyway=refused_anyway)
        else:
            _search(search, index.states, rows, visits, task, policy, quota)
        product_seen = not req.products or index.has_product(req.products)
    else:
        order = policy.node_order(len(nodes))
        visits = range(len(nodes)) if order is None else order
        _search(search, nodes, range(len(nodes)), visits, task, policy, quota)
        product_seen = not req.products or any(req.allows(g.product) for s in nodes for g in s.node.gpus)
    if search.best is not None:
        state, picked = search.best[2], search.best[3]
        return Outcome(Placement.one(state.name, slots_for(state, task, picked)), True)
    return Outcome(None, search.fits_somewhere, search.quota_resource, product_seen)


def _choose(state: NodeState, task: Task, policy: Policy) -> tuple[int, ...] | None:
    """Filter one node, then let the policy pick GPUs; None when the node does not fit."""
    if not node_fits(state, task):
        return None
    feasible = feasible_gpus(state, task)
    if len(feasible) < task.request.count:
        return None
    return policy.choose(state, task, feasible)


def _consider(
    search: _Search,
    state: NodeState,
    task: Task,
    policy: Policy,
    picked: tuple[int, ...],
    score: float | None,
    quota: QuotaCheck | None,
) -> bool:
    """Quota-check and score one fitting node; True when the search should stop here."""
    search.fits_somewhere = True
    if quota is not None:
        refused = quota(state, PodPlacement(state.name, slots_for(state, task, picked)))
        if refused is not None:
            search.quota_resource = search.quota_resource or refused
            return False
    if score is None:
        score = policy.score(state, task, picked)
    if search.best is None or (score, state.name) < search.best[:2]:
        search.best = (score, state.name, state, picked)
        return policy.stop_at_first
    return False


def _search(
    search: _Search,
    states: Sequence[NodeState],
    rows: Sequence[int],
    visits: Iterable[int],
    task: Task,
    policy: Policy,
    quota: QuotaCheck | None,
) -> None:
    """Evaluate every visited candidate ``states[rows[k]]`` (any policy)."""
    for k in visits:
        state = states[rows[k]]
        picked = _choose(state, task, policy)
        if picked is not None and _consider(search, state, task, policy, picked, None, quota):
            return


def _search_board(
    search: _Search, index: NodeIndex, task: Task, policy: Policy, quota: QuotaCheck | None, *, refused_anyway: bool
) -> None:
    """Best-first search on the shape's board (see :mod:`gputask.core.search`)."""
    board, memo = board_for(index, policy, task)
    states, groups = index.states, index.group
    by_name = task.constraints is not None and task.constraints.by_name  # then identical nodes may differ

    def evaluate(row: int) -> Evaluation:
        found = _UNSEEN if by_name else memo.get(groups[row], _UNSEEN)
        if found is _UNSEEN:
            state = states[row]
            picked = _choose(state, task, policy)
            found = None if picked is None else (picked, policy.score(state, task, picked))
            if not by_name:
                memo[groups[row]] = found
        return found

    board.sync(index, evaluate)
    refuse = None if quota is None else refuser(index, task, quota)
    if refuse is not None and refused_anyway:
        first = board.first()  # every fitting node is refused: best() would report the first one's reason
        why = None if first is None else refuse(first)
        if first is None or why is not None:
            search.fits_somewhere, search.quota_resource = first is not None, why
            return
    entry, search.fits_somewhere, search.quota_resource = board.best(refuse)
    if entry is not None:
        state = states[entry[1]]
        search.best = (entry[0], state.name, state, entry[2])


_UNSEEN: Evaluation = ((-1,), float("nan"))
"""Marker for "not remembered" (never a real evaluation: a position is never -1)."""
