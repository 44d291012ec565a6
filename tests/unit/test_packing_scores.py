"""Packing's score terms on hand-built clusters: the sliver table, soft product pressure, and exact
growth inside one FGD score step (trace-like GPUs of 1000 MiB: one MiB is one milli-GPU)."""

from __future__ import annotations

from gputask.core import ClusterState, Gpu, GpuRequest, GpuSlot, Node, NodeName, Placement, Task, TaskKey
from gputask.core.placement import find_placement
from gputask.core.policies import FGD, Packing, TaskShape
from gputask.core.policies.fgd import framework_score
from gputask.core.policies.fragmentation import Fragmentation, sliver_table
from gputask.core.policies.workload import TargetWorkload

WHOLE = GpuRequest(1)


def share(milli: int) -> GpuRequest:
    """A request for ``milli`` thousandths of one GPU."""
    return GpuRequest(1, fraction_milli=milli)


def node(name: str, gpus: int = 1, *, product: str = "T4") -> Node:
    """A node of ``gpus`` GPUs of 1000 MiB, 8 cores."""
    return Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", product, 1000) for i in range(gpus)), cpu_milli=8000)


def task(name: str, request: GpuRequest) -> Task:
    """A task of ``request`` without CPU."""
    return Task(TaskKey(f"ns/{name}"), "q", request)


def cluster_with(nodes: list[Node], used: dict[str, int]) -> ClusterState:
    """``nodes`` with ``used[name]`` MiB already reserved on GPU 0 of each named node."""
    cluster = ClusterState(nodes)
    for name, mib in used.items():
        held = task(f"held-{name}", GpuRequest(1, memory_mib=mib))
        cluster.reserve(held, Placement.one(NodeName(name), (GpuSlot(0, f"{name}-0", mib),)))
    return cluster


def placed_on(cluster: ClusterState, request: GpuRequest, policy: FGD) -> str:
    """The node ``policy`` places a task of ``request`` on."""
    placement = find_placement(cluster, task("t", request), policy).placement
    assert placement is not None
    return placement.only().node


def test_sliver_table_is_the_expected_gap_left_when_popular_shares_top_a_gpu_up() -> None:
    """Shares 600 and 400 equally popular: 300 free stays 300, 500 leaves 100, 700 leaves 100 or 300 (200), idle 0."""
    phi = sliver_table([(600, 1.0), (400, 1.0)])
    assert [phi[g] for g in (0, 300, 500, 700, 1000)] == [0.0, 300.0, 100.0, 200.0, 0.0]


def test_sliver_term_adds_the_weighted_sliver_of_each_partly_used_gpu() -> None:
    """GPU 0 with 300 free (no 500 share or whole GPU fits: sliver 300) adds 0.5 x 300 to FGD's
    300 x 3/4 + 1300 x 1/4."""
    target = TargetWorkload.from_shapes([TaskShape(WHOLE)] * 2 + [TaskShape(share(500)), TaskShape(GpuRequest(0))])
    state = cluster_with([node("a", 2)], {"a": 700}).node(NodeName("a"))
    plain, with_sliver = (Fragmentation(target, sliver_weight=w).of_state(state) for w in (0.0, 0.5))
    assert (plain, with_sliver) == (0.75 * 300 + 0.25 * 1300, 0.75 * 300 + 0.25 * 1300 + 0.5 * 300)


def test_sliver_term_sends_a_share_where_it_fills_a_gpu_that_fgd_ties_with_an_emptier_one() -> None:
    """A 230 task: FGD's growth is -115 on node a (910 free) and on node b (230 free), so FGD takes a by
    name; the sliver term sees b left full (no sliver) and takes b."""
    shapes = [TaskShape(share(230)), TaskShape(share(220))] + [TaskShape(WHOLE)] * 2
    choices = []
    for sliver in (0.0, 0.25):
        policy = Packing(sliver_weight=sliver, copies_weight=0.0)
        policy.set_workload(shapes)
        choices.append(placed_on(cluster_with([node("a"), node("b")], {"a": 90, "b": 770}), share(230), policy))
    assert choices == ["a", "b"]


def test_inside_one_fgd_step_a_share_goes_where_fragmentation_grows_least() -> None:
    """Growths -60 (node a: 450 free, leaves 220) and -80 (node b: 300 free, leaves 70) both score 51:
    FGD takes a by name, packing b by exact growth."""
    shapes = [TaskShape(share(230)), TaskShape(share(220))] + [TaskShape(WHOLE)] * 2
    fgd, packing = FGD(), Packing(sliver_weight=0.0, copies_weight=0.0)
    choices = []
    for policy in (fgd, packing):
        policy.set_workload(shapes)
        choices.append(placed_on(cluster_with([node("a"), node("b")], {"a": 550, "b": 700}), share(230), policy))
    assert (choices, framework_score(60.0), framework_score(80.0)) == (["a", "b"], 51, 51)


def test_product_pressure_is_a_soft_penalty_in_score_points() -> None:
    """A half-GPU task fills the half-used T4 GPU (step 42 against 57 on the idle A10) while T4 pressure is
    0.2 (+4 points at 20 per unit), but takes the idle A10 (step 50) once T4-only work makes it 0.8 (+16)."""
    outcomes = []
    for t4_only in (1, 4):
        shapes = [TaskShape(WHOLE)] * (8 - t4_only) + [TaskShape(share(500))] * 4
        shapes += [TaskShape(GpuRequest(1, products=frozenset({"T4"})))] * t4_only
        policy = Packing(pressure_weight=20.0, sliver_weight=0.0, copies_weight=0.0)
        policy.set_workload(shapes)
        cluster = cluster_with([node("a", 2, product="T4"), node("b", 2, product="A10")], {"a": 500})
        chosen = placed_on(cluster, share(500), policy)
        states = [cluster.node(NodeName(n)) for n in "ab"]
        scores = [round(policy.growth_score(s, task("t", share(500)), (0,), policy.frag.of_state(s))) for s in states]
        outcomes.append((round(policy.pressure_of(states[0], (0,)), 6), scores, chosen))
    assert outcomes == [(0.2, [46, 57], "a"), (0.8, [58, 50], "b")]
