"""The placement speed-ups (node index, groups of identical nodes, remembered evaluations) change nothing.

The reference below is the plain search the core had before the index: every node in name
order, filter, choose, score, lowest (score, name) wins. Property tests compare the two on
random clusters and task sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputask.core import (
    ClusterState,
    Gpu,
    GpuRequest,
    GpuSlot,
    Node,
    NodeName,
    Outcome,
    Placement,
    PodPlacement,
    Task,
    TaskKey,
    find_placement,
    make_policy,
)
from gputask.core.cluster import UNTRACKED, NodeState, slots_for
from gputask.core.placement import (
    BestFit,
    FirstFit,
    Policy,
    PolicyBase,
    QuotaCheck,
    RandomFit,
    candidate_rows,
    feasible_gpus,
    node_fits,
)
from gputask.core.preemption import Planner, Victim, could_fit_without
from gputask.core.quota import QuotaBook


def node(
    name: str,
    *mib: int,
    cpu: int | None = None,
    memory: int | None = None,
    product: str = "T4",
    schedulable: bool = True,
) -> Node:
    """A node whose GPUs 0..n-1 have the given MiB and uuids ``<name>-<index>``."""
    gpus = tuple(Gpu(i, f"{name}-{i}", product, m) for i, m in enumerate(mib))
    return Node(NodeName(name), gpus, cpu_milli=cpu, memory_mib=memory, schedulable=schedulable)


def task(
    name: str,
    count: int = 1,
    *,
    memory_mib: int | None = None,
    fraction: int | None = None,
    cpu: int = 0,
    memory: int = 0,
    products: Sequence[str] = (),
) -> Task:
    """A task: whole GPUs unless a memory or a fraction is given; ``count`` 0 = CPU/memory only."""
    request = GpuRequest(count, memory_mib=memory_mib, fraction_milli=fraction, products=frozenset(products))
    return Task(TaskKey(f"ns/{name}"), "q", request, cpu_milli=cpu, memory_mib=memory)


def plain_search(cluster: ClusterState, t: Task, policy: Policy, quota: QuotaCheck | None = None) -> Outcome:
    """The search without index, groups or memo: every node in name order (the reference)."""
    best: tuple[float, str, Placement] | None = None
    fits = False
    refused: str | None = None
    for state in cluster.sorted_nodes():
        if not node_fits(state, t):
            continue
        feasible = feasible_gpus(state, t)
        if len(feasible) < t.request.count:
            continue
        picked = policy.choose(state, t, feasible)
        fits = True
        if quota is not None and (why := quota(state, PodPlacement(state.name, slots_for(state, t, picked)))):
            refused = refused or why
            continue
        score = policy.score(state, t, picked)
        if best is None or (score, state.name) < best[:2]:
            best = (score, state.name, Placement.one(state.name, slots_for(state, t, picked)))
            if policy.stop_at_first:
                break
    products = t.request.products
    seen = not products or any(g.product in products for s in cluster for g in s.node.gpus)
    return Outcome(best[2], True) if best else Outcome(None, fits, refused, seen)


def test_cpu_only_task_takes_cpu_and_memory_and_no_gpu() -> None:
    """A task of 0 GPUs fits a node whose GPUs are all taken, needs only CPU and memory, and holds no GPU."""
    cluster = ClusterState([node("a", 1000, cpu=4000, memory=100), node("b", 1000, cpu=8000, memory=100)])
    cluster.reserve(task("whole", cpu=1000), Placement.one(NodeName("a"), (GpuSlot(0, "a-0", 1000),)))
    cpu_only = task("cpu", 0, cpu=3000, memory=50)
    outcomes = [find_placement(cluster, cpu_only, p) for p in (BestFit(), FirstFit())]
    cluster.reserve(cpu_only, Placement.one(NodeName("a"), ()))
    too_big = find_placement(cluster, task("big", 0, cpu=9000), BestFit())
    assert (outcomes, cluster.node(NodeName("a")).cpu_used, cluster.node(NodeName("a")).reserved_mib, too_big) == (
        [Outcome(Placement.one(NodeName("a"), ()), True)] * 2,
        4000,
        [1000],
        Outcome(None, False, None, True),
    )


def test_index_columns_follow_reservations_releases_and_node_updates() -> None:
    """The index's aggregates are refreshed on reserve, release and set_node, in name order."""
    cluster = ClusterState([node("b", 1000, 1000, cpu=8000, memory=64), node("a", 2000, schedulable=False)])
    index = cluster.index()
    first = (index.free_cpu[:], index.free_memory[:], index.idle[:], index.max_free_mib[:], index.max_free_milli[:])
    cluster.reserve(task("t", memory_mib=300, cpu=500, memory=4),
                    Placement.one(NodeName("b"), (GpuSlot(1, "b-1", 300),)))
    reserved = (index.free_cpu[:], index.free_memory[:], index.idle[:], index.max_free_mib[:], index.max_free_milli[:])
    cluster.set_node(node("b", 1000, 1000, cpu=8000, memory=64, product="A10"))
    cluster.release(TaskKey("ns/t"))
    assert (first, reserved, (index.idle, index.max_free_milli), dict(index.products)) == (
        ([-1, 8000], [-1, 64], [1, 2], [2000, 1000], [1000, 1000]),
        ([-1, 7500], [-1, 60], [1, 1], [2000, 1000], [1000, 1000]),
        ([1, 2], [1000, 1000]),
        {"T4": 1, "A10": 2},
    )


def test_untracked_cpu_and_memory_never_filter_a_node_out() -> None:
    """A node that does not track CPU or memory shows them as UNTRACKED, larger than any request."""
    cluster = ClusterState([node("a", 1000)])
    assert (cluster.index().free_cpu, cluster.index().free_memory) == ([UNTRACKED], [UNTRACKED])


def test_identical_nodes_share_a_group_until_one_changes() -> None:
    """Two nodes alike but for their names share a group; a reservation splits them, its release rejoins them."""
    cluster = ClusterState([node("a", 1000, 1000), node("b", 1000, 1000), node("c", 1000, 2000)])
    index = cluster.index()
    before = list(index.group)
    cluster.reserve(task("t", memory_mib=10), Placement.one(NodeName("a"), (GpuSlot(0, "a-0", 10),)))
    during = list(index.group)
    cluster.release(TaskKey("ns/t"))
    assert (before[0] == before[1] != before[2], during[0] != during[1], index.group == before) == (True, True, True)


class CpuTarget(PolicyBase):
    """A test policy whose score depends on the task's CPU: closest free CPU to twice the request."""

    name = "cputarget"
    scores_by_state = True

    def choose(self, state: NodeState, t: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Lowest indices."""
        return tuple(feasible[: t.request.count])

    def score(self, state: NodeState, t: Task, picked: Sequence[int]) -> float:
        """Distance of the node's free CPU from twice the task's CPU."""
        return abs((state.cpu_free or 0) - 2 * t.cpu_milli)


def test_remembered_evaluations_are_per_task_shape() -> None:
    """Tasks alike but for CPU get their own evaluations of the same node states (scores differ)."""
    cluster = ClusterState([node("a", 1000, cpu=4000), node("b", 1000, cpu=8000)])
    policy = CpuTarget()
    picks = [find_placement(cluster, task(f"t{c}", memory_mib=10, cpu=c), policy) for c in (1000, 4000)]
    assert [o.placement.only().node for o in picks if o.placement] == ["a", "b"]


def test_fraction_filter_matches_the_rounded_up_mib_exactly() -> None:
    """A fraction fits a GPU exactly when its free share (milli, rounded down) reaches it."""
    cluster = ClusterState([node("a", 24576)])
    cluster.reserve(task("x", memory_mib=24576 - 8184),
                    Placement.one(NodeName("a"), (GpuSlot(0, "a-0", 24576 - 8184),)))
    rows = [candidate_rows(cluster.index(), task("t", fraction=f)) for f in (333, 334)]
    fits = [find_placement(cluster, task("t", fraction=f), BestFit()).placement is not None for f in (333, 334)]
    assert (rows, fits) == ([[0], []], [True, False])


def test_random_fit_visits_every_candidate_once_in_a_seeded_order() -> None:
    """RandomFit's node order is a permutation, the same for the same seed, and reseed starts over."""
    policy = make_policy("random", seed=5)
    assert isinstance(policy, RandomFit)
    first = list(policy.node_order(50))
    policy.reseed(5)
    assert (sorted(first), first == list(policy.node_order(50)), first == list(range(50))) == (
        list(range(50)),
        True,
        False,
    )


def test_random_fit_spreads_over_all_feasible_nodes() -> None:
    """Among four identical feasible nodes (and one full one) every feasible node gets chosen."""
    cluster = ClusterState([node(n, 1000) for n in "abcde"])
    cluster.reserve(task("full"), Placement.one(NodeName("c"), (GpuSlot(0, "c-0", 1000),)))
    policy = RandomFit(seed=1)
    chosen = {find_placement(cluster, task("t", memory_mib=10), policy).placement.only().node for _ in range(200)}  # type: ignore[union-attr]
    assert chosen == {"a", "b", "d", "e"}


def test_make_policy_seed_is_ignored_by_deterministic_policies() -> None:
    """make_policy(seed=...) builds deterministic policies as usual."""
    assert (make_policy("bestfit", seed=3), make_policy("firstfit", seed=3)) == (BestFit(), FirstFit())


# -- property: same outcomes as the plain search ----------------------------------------------
gpu_sizes = st.sampled_from([1000, 1000, 1000, 2000, 24576])
nodes_st = st.lists(
    st.tuples(
        st.lists(gpu_sizes, min_size=0, max_size=4),
        st.sampled_from([None, 4000, 8000]),
        st.sampled_from([None, 64, 128]),
        st.sampled_from(["T4", "A10"]),
        st.booleans(),
    ),
    min_size=1,
    max_size=7,
)
tasks_st = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.sampled_from(["whole", "mib", "fraction"]),
        st.integers(1, 1200),
        st.sampled_from([0, 1000, 3000]),
        st.sampled_from([0, 16, 64]),
        st.sampled_from([(), ("T4",), ("A10", "H100"), ("H100",)]),
    ),
    min_size=1,
    max_size=25,
)


def build(spec: list[tuple[list[int], int | None, int | None, str, bool]]) -> list[Node]:
    """Nodes from the strategy's tuples; several identical nodes are likely (groups)."""
    return [
        node(f"n{i:02d}", *sizes, cpu=cpu, memory=mem, product=product, schedulable=ok or i == 0)
        for i, (sizes, cpu, mem, product, ok) in enumerate(spec)
    ]


def to_task(i: int, spec: tuple[int, str, int, int, int, tuple[str, ...]]) -> Task:
    """A task from the strategy's tuple."""
    count, kind, amount, cpu, mem, products = spec
    return task(
        f"t{i}",
        count,
        memory_mib=amount if kind == "mib" else None,
        fraction=min(amount, 1000) if kind == "fraction" else None,
        cpu=cpu,
        memory=mem,
        products=products,
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, tasks_st, st.sampled_from(["bestfit", "firstfit", "fgd", "packing", "bestfit-atc23"]))
def test_deterministic_policies_place_exactly_as_the_plain_search(nodes: list, tasks: list, name: str) -> None:
    """Task after task, the indexed search returns the plain search's outcome (placements then reserved)."""
    cluster = ClusterState(build(nodes))
    policy = make_policy(name)
    got, want = [], []
    for i, spec in enumerate(tasks):
        t = to_task(i, spec)
        got.append(find_placement(cluster, t, policy))
        want.append(plain_search(cluster, t, policy))
        if got[-1].placement is not None:
            cluster.reserve(t, got[-1].placement)
    assert got == want


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, tasks_st, st.sampled_from(["bestfit", "firstfit", "fgd", "packing"]), st.sets(gpu_sizes))
def test_with_a_quota_check_the_outcome_is_the_plain_searchs(
    nodes: list, tasks: list, name: str, refused: set[int]
) -> None:
    """A quota check that refuses some placements gives the plain search's outcomes, identical nodes or not.

    As QuotaCheck's contract says, the check may depend only on the sizes of the picked GPUs
    (quota usage does); the search then asks it once per distinct set of sizes.
    """
    cluster = ClusterState(build(nodes))
    policy = make_policy(name)

    def quota(state: NodeState, placement: Placement) -> str | None:
        sizes = {g.memory_mib for g in state.node.gpus if g.index in placement.indices}
        return "nvidia.com/gpu" if sizes & refused else None

    got, want = [], []
    for i, spec in enumerate(tasks):
        t = to_task(i, spec)
        got.append(find_placement(cluster, t, policy, quota=quota))
        want.append(plain_search(cluster, t, policy, quota))
        if got[-1].placement is not None:
            cluster.reserve(t, got[-1].placement)
    assert got == want


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, tasks_st, st.sampled_from(["bestfit", "firstfit", "fgd", "packing"]), st.sets(gpu_sizes, min_size=1))
def test_a_quota_that_refuses_everything_reports_as_the_full_search_does(
    nodes: list, tasks: list, name: str, sizes: set[int]
) -> None:
    """``refused_anyway`` (the quota refuses even the least the task could charge) gives the outcome of the
    full search: whether some node fits, and the refusal reported for the first one in name order."""
    cluster = ClusterState(build(nodes))
    policy = make_policy(name)
    reason = {size: f"refused {size}" for size in sizes}

    def quota(state: NodeState, placement: Placement) -> str | None:  # refuses all, the reason per size
        picked = sorted(g.memory_mib for g in state.node.gpus if g.index in placement.indices)
        return reason.get(picked[0], "refused") if picked else "refused"

    for i, spec in enumerate(tasks):
        t = to_task(i, spec)
        fast = find_placement(cluster, t, policy, quota=quota, refused_anyway=True)
        assert fast == find_placement(cluster, t, policy, quota=quota) == plain_search(cluster, t, policy, quota)
        placed = find_placement(cluster, t, policy)
        if placed.placement is not None:
            cluster.reserve(t, placed.placement)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, tasks_st, st.integers(0, 10))
def test_random_fit_places_whenever_the_plain_search_can_and_only_on_feasible_gpus(
    nodes: list, tasks: list, seed: int
) -> None:
    """RandomFit finds a placement exactly when some node fits, and the cluster accepts it."""
    cluster = ClusterState(build(nodes))
    policy = RandomFit(seed=seed)
    agree = []
    for i, spec in enumerate(tasks):
        t = to_task(i, spec)
        outcome = find_placement(cluster, t, policy)
        agree.append((outcome.placement is None) == (plain_search(cluster, t, BestFit()).placement is None))
        if outcome.placement is not None:
            cluster.reserve(t, outcome.placement)  # raises OverCommitError on an infeasible choice
    assert all(agree)


@settings(max_examples=100, deadline=None)
@given(nodes_st, tasks_st)
def test_candidate_rows_never_drop_a_node_that_fits(nodes: list, tasks: list) -> None:
    """Every node where the task fits (node_fits and enough feasible GPUs) is among the candidate rows."""
    cluster = ClusterState(build(nodes))
    index = cluster.index()
    for i, spec in enumerate(tasks):
        t = to_task(i, spec)
        fitting = [
            r for r, s in enumerate(index.states) if node_fits(s, t) and len(feasible_gpus(s, t)) >= t.request.count
        ]
        assert set(fitting) <= set(candidate_rows(index, t))
        outcome = find_placement(cluster, t, BestFit())
        if outcome.placement is not None:
            cluster.reserve(t, outcome.placement)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, tasks_st, tasks_st, st.data())
def test_the_preemption_precheck_never_refuses_a_node_the_search_would_fit(
    nodes: list, running: list, preemptors: list, data: st.DataObject
) -> None:
    """``could_fit_without`` (which lets the planner skip trials) is False only where releasing the victims
    and searching that node finds nothing: whatever is running, whichever victims, whatever the task."""
    cluster = ClusterState(build(nodes))
    policy = make_policy("bestfit")
    placed: list[Victim] = []
    for i, spec in enumerate(running):
        t = to_task(100 + i, spec)
        found = find_placement(cluster, t, policy).placement
        if found is not None:
            cluster.reserve(t, found)
            placed.append(Victim(t, found, {}, 0.0))
    planner = Planner(cluster, QuotaBook(), policy)
    for i, spec in enumerate(preemptors):
        t = to_task(i, spec)
        for state in cluster.sorted_nodes():
            on_node = [v for v in placed if v.placement.only().node == state.name]
            victims = data.draw(st.lists(st.sampled_from(on_node), unique_by=id) if on_node else st.just([]))
            if not could_fit_without(state, t, victims):
                with planner._without(victims):
                    assert find_placement(cluster, t, policy, nodes=[state]).placement is None
