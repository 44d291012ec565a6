"""FGD, the paper's best fit, and gputask's packing policy: hand-computed fragmentation, choices,
target workloads, pressures, the quota contract, and packing's honesty (never refuses a fit)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_core_placement_index import build, nodes_st, plain_search, tasks_st, to_task

from gputask.core import ClusterState, Gpu, GpuRequest, GpuSlot, Node, NodeName, Placement, Task, TaskKey, make_policy
from gputask.core.cluster import NodeState
from gputask.core.placement import BestFit, Policy, find_placement
from gputask.core.policies import FGD, BestFitAtc23, Packing, TargetWorkload, TaskShape
from gputask.core.policies.fgd import framework_score
from gputask.core.policies.fragmentation import Fragmentation
from gputask.core.policies.packing import COPIES_WEIGHT, multi_gpu_share, pressures
from gputask.core.policies.workload import DEFAULT_TARGET, RecentWorkload

WHOLE = GpuRequest(1)
HALF = GpuRequest(1, fraction_milli=500)
NO_GPU = GpuRequest(0)


def node(name: str, gpus: int = 2, *, cpu: int = 8000, product: str = "T4") -> Node:
    """A trace-like node: GPUs of 1000 MiB (one MiB = one milli-GPU), CPU tracked."""
    return Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", product, 1000) for i in range(gpus)), cpu_milli=cpu)


def task(name: str, request: GpuRequest, cpu: int = 0) -> Task:
    """A task of ``request`` with ``cpu`` millicores."""
    return Task(TaskKey(f"ns/{name}"), "q", request, cpu_milli=cpu)


def reserve(cluster: ClusterState, name: str, node_name: str, mib: int, cpu: int = 0) -> None:
    """Reserve ``mib`` on GPU 0 of ``node_name`` for a sharing task."""
    t = task(name, GpuRequest(1, memory_mib=mib), cpu)
    cluster.reserve(t, Placement.one(NodeName(node_name), (GpuSlot(0, f"{node_name}-0", mib),)))


def target() -> TargetWorkload:
    """Whole GPU with 4 cores (p 1/2), half a GPU with 2 cores (1/4), CPU only (1/4)."""
    shapes = [TaskShape(WHOLE, 4000)] * 2 + [TaskShape(HALF, 2000), TaskShape(NO_GPU, 1000)]
    return TargetWorkload.from_shapes(shapes, popularity=1.0)


def test_target_workload_keeps_the_most_popular_shapes_and_renormalises() -> None:
    """Shapes are kept most popular first until they cover the share asked, then sum to 1."""
    shapes = [TaskShape(WHOLE, 1000)] * 6 + [TaskShape(HALF, 1000)] * 3 + [TaskShape(NO_GPU, 500)]
    assert TargetWorkload.from_shapes(shapes, popularity=0.9).shapes == (
        (TaskShape(WHOLE, 1000), 6 / 9),
        (TaskShape(HALF, 1000), 3 / 9),
    )


def test_fragmentation_of_a_small_node_matches_the_hand_computation() -> None:
    """2 GPUs (300 and 1000 free), 8 cores: whole 1/2 x 300 + half 1/4 x 300 + CPU-only 1/4 x 1300 = 550."""
    cluster = ClusterState([node("a")])
    reserve(cluster, "x", "a", 700)
    frag = Fragmentation(target())
    state = cluster.node(NodeName("a"))
    after = frag.after(state, task("h", HALF, 2000), (1,))  # 300 and 500 free: no idle GPU left
    assert (frag.of_state(state), after, framework_score(-(after - 550.0))) == (550.0, 675.0, 46)


def test_a_node_short_of_cpu_counts_its_capacity_as_fragmented_for_the_shapes_it_cannot_host() -> None:
    """With 3 cores the whole-GPU shape (4 cores) cannot run: its half counts all 2000 free milli."""
    cluster = ClusterState([node("a", cpu=3000)])
    assert Fragmentation(target()).of_state(cluster.node(NodeName("a"))) == 0.5 * 2000 + 0.25 * 0 + 0.25 * 2000


def test_per_copy_fragmentation_caps_what_cpu_lets_copies_use() -> None:
    """Two idle GPUs and 5 cores host one 4-core whole-GPU task, not two: half its capacity is stranded."""
    cluster = ClusterState([node("a", cpu=5000)])
    state = cluster.node(NodeName("a"))
    frag = [Fragmentation(target(), copies_weight=w).of_state(state) for w in (0.0, 1.0, 0.5)]
    assert frag == [0.25 * 2000, 0.5 * 1000 + 0.25 * 2000, 750.0]


def test_fgd_puts_a_half_gpu_task_where_fragmentation_grows_least() -> None:
    """The half-GPU task joins the GPU already half used (no growth) rather than breaking an idle GPU."""
    cluster = ClusterState([node("a"), node("b")])
    reserve(cluster, "x", "b", 500)
    policy = FGD()
    policy.set_workload([TaskShape(WHOLE, 4000)] * 2 + [TaskShape(HALF, 2000)] * 2)
    outcome = find_placement(cluster, task("h", HALF, 2000), policy)
    assert outcome.placement == Placement.one(NodeName("b"), (GpuSlot(0, "b-0", 500),))


def test_fgd_follows_the_tasks_it_sees_when_no_workload_is_fixed() -> None:
    """Without set_workload, the target is built from the tasks placement has seen, by key."""
    recent = RecentWorkload(window=3, refresh=2)
    for name, request in (("a", WHOLE), ("a", WHOLE), ("b", HALF), ("c", HALF)):
        recent.observe(task(name, request))
    assert (recent.target.shapes, recent.generation) == (
        ((TaskShape(HALF), 2 / 3), (TaskShape(WHOLE), 1 / 3)),
        2,
    )


def test_bestfit_atc23_scores_cpu_and_gpu_left_as_the_papers_simulator() -> None:
    """int(100 * (1 - (0.5 * 4 / 128 + 0.5 * 1.5 / 8))) = 89 for 4 cores and 1.5 GPUs left."""
    cluster = ClusterState([node("a", cpu=6000)])
    reserve(cluster, "x", "a", 500)
    state = cluster.node(NodeName("a"))
    assert BestFitAtc23().score(state, task("t", GpuRequest(1, memory_mib=0), 2000), (0,)) == -89.0


def test_pressure_is_constrained_demand_over_capacity_relative_to_the_cluster() -> None:
    """T4-only work (a third of demand) on a fifth of the GPUs gives T4 pressure 5/3; A10 none."""
    shapes = [TaskShape(WHOLE)] * 2 + [TaskShape(GpuRequest(1, products=frozenset({"T4"})))]
    got = pressures(TargetWorkload.from_shapes(shapes, popularity=1.0), {"T4": 2, "A10": 8})  # type: ignore[arg-type]
    assert {k: round(v, 6) for k, v in got.items()} == {"T4": round(5 / 3, 6), "A10": 0.0}


def test_packing_keeps_a_scarce_product_for_the_tasks_that_need_it() -> None:
    """With T4-only work in the target, an unconstrained task goes to the A10 node though T4 sorts first."""
    cluster = ClusterState([node("a", product="T4"), node("b", product="A10")])
    policy = Packing()
    policy.set_workload([TaskShape(WHOLE)] * 2 + [TaskShape(GpuRequest(1, products=frozenset({"T4"})))] * 2)
    assert find_placement(cluster, task("t", WHOLE), policy).placement == Placement.one(
        NodeName("b"), (GpuSlot(0, "b-0", 1000),)
    )


def test_quota_is_asked_once_per_set_of_picked_gpu_sizes() -> None:
    """Six alike nodes all refused by quota cost one quota call; the outcome names the resource."""
    cluster = ClusterState([node(f"n{i}") for i in range(6)])
    calls: list[str] = []

    def quota(state: NodeState, placement: Placement) -> str | None:
        calls.append(state.name)
        return "nvidia.com/gpu"

    outcome = find_placement(cluster, task("t", WHOLE), make_policy("packing"), quota=quota)
    assert (outcome.placement, outcome.fits_somewhere, outcome.quota_resource, calls) == (
        None,
        True,
        "nvidia.com/gpu",
        ["n0"],
    )


def _replay(policy: str | Policy, nodes: list[Node], tasks: Sequence[Task]) -> list[Placement | None]:
    """Place ``tasks`` one by one on a fresh cluster (a policy name or object); the placements."""
    cluster = ClusterState(nodes)
    policy = make_policy(policy) if isinstance(policy, str) else policy
    out = []
    for t in tasks:
        placement = find_placement(cluster, t, policy).placement
        out.append(placement)
        if placement is not None:
            cluster.reserve(t, placement)
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, tasks_st, st.sampled_from(["fgd", "packing", "bestfit-atc23"]))
def test_new_policies_never_refuse_a_fit_and_are_deterministic(nodes: list, tasks: list, name: str) -> None:
    """Each task is placed exactly when some node fits it (plain best fit finds one), and twice the same."""
    specs = [to_task(i, spec) for i, spec in enumerate(tasks)]
    cluster = ClusterState(build(nodes))
    policy = make_policy(name)
    agree = []
    for t in specs:
        outcome = find_placement(cluster, t, policy)
        agree.append((outcome.placement is None) == (plain_search(cluster, t, BestFit()).placement is None))
        if outcome.placement is not None:
            cluster.reserve(t, outcome.placement)
    assert (all(agree), _replay(name, build(nodes), specs) == _replay(name, build(nodes), specs)) == (True, True)


def test_default_target_sums_to_one_and_a_fresh_policy_places_as_a_used_one() -> None:
    """Without a fixed workload, placement depends only on the cluster's state: a policy that placed
    earlier tasks and a fresh one (an operator after a restart) choose the same node for the next."""
    tasks = [task(f"t{i}", request) for i, request in enumerate([WHOLE, HALF, HALF, WHOLE, GpuRequest(2), HALF])]
    used_cluster, used = ClusterState([node(n, 4) for n in "abc"]), make_policy("packing")
    for t in tasks:
        placement = find_placement(used_cluster, t, used).placement
        assert placement is not None
        used_cluster.reserve(t, placement)
    fresh_cluster = ClusterState([node(n, 4) for n in "abc"])
    for reservation in used_cluster.reservations().values():
        fresh_cluster.reserve(reservation.task, reservation.placement, force=True)
    following = task("next", GpuRequest(1, fraction_milli=300))
    assert (
        round(sum(p for _, p in DEFAULT_TARGET.shapes), 9),
        find_placement(used_cluster, following, used),
    ) == (1.0, find_placement(fresh_cluster, following, make_policy("packing")))


def test_per_copy_weight_follows_the_multi_gpu_share_of_the_target() -> None:
    """Multi-GPU shapes asking 2/11 of the GPU demand (under a fifth) give COPIES_WEIGHT; 2/9 give 0; a number
    fixes it."""
    under = [TaskShape(WHOLE)] * 9 + [TaskShape(GpuRequest(2))]  # 2 of 11 GPUs
    at = [TaskShape(WHOLE)] * 7 + [TaskShape(GpuRequest(2))]  # 2 of 9 GPUs
    weights = []
    for shapes, fixed in ((under, None), (at, None), (at, 0.3)):
        policy = Packing(copies_weight=fixed)
        policy.set_workload(shapes)
        weights.append((round(multi_gpu_share(policy.frag.target), 4), policy.frag.copies_weight))
    assert weights == [(round(2 / 11, 4), COPIES_WEIGHT), (round(2 / 9, 4), 0.0), (round(2 / 9, 4), 0.3)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_st, tasks_st)
def test_packing_without_its_sliver_and_tie_terms_places_as_fgd_on_multi_gpu_heavy_unrestricted_work(
    nodes: list, tasks: list
) -> None:
    """Target of 8-GPU and whole-GPU shapes (8/9 multi-GPU), none restricted to products: packing with the
    sliver term and exact ties off places as FGD (no pressure, no per-copy term), whatever the tasks ask."""
    built = build(nodes)
    work = [to_task(i, x) for i, x in enumerate(tasks)]
    target = [TaskShape(GpuRequest(8), cpu_milli=4000), TaskShape(WHOLE, cpu_milli=3000)]  # CPU: copies matter
    placed = []
    for policy in (FGD(), Packing(sliver_weight=0.0, exact_ties=False)):
        policy.set_workload(target)
        placed.append(_replay(policy, built, work))
    assert placed[0] == placed[1]
