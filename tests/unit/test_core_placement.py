"""Placement: filters (health, product, idleness, schedulable), best/first/random fit, tie-breaks."""

from __future__ import annotations

import pytest

from gputask.core import (
    POLICIES,
    ClusterState,
    Gpu,
    GpuRequest,
    GpuSlot,
    Node,
    NodeName,
    Outcome,
    Placement,
    Task,
    TaskKey,
    find_placement,
    make_policy,
)
from gputask.core.placement import BestFit, FirstFit, RandomFit

GIB = 1024  # MiB


def node(name: str, *gib: int, product: str = "NVIDIA-A10", schedulable: bool = True) -> Node:
    """A node whose GPUs 0..n-1 have the given sizes in GiB and uuids ``<name>-<index>``."""
    gpus = tuple(Gpu(i, f"{name}-{i}", product, g * GIB) for i, g in enumerate(gib))
    return Node(NodeName(name), gpus, schedulable=schedulable)


def task(
    name: str,
    *,
    count: int = 1,
    memory_gib: int | None = None,
    fraction_milli: int | None = None,
    products: tuple[str, ...] = (),
) -> Task:
    """A task in queue ``q``: whole GPUs unless a memory or a fraction is given."""
    mib = None if memory_gib is None else memory_gib * GIB
    request = GpuRequest(count, memory_mib=mib, fraction_milli=fraction_milli, products=frozenset(products))
    return Task(TaskKey(f"ns/{name}"), "q", request)


def placed(node_name: str, *slots: tuple[int, int]) -> Placement:
    """A placement on ``node_name`` of (index, MiB) slots, with the uuids of :func:`node`."""
    return Placement.one(NodeName(node_name), tuple(GpuSlot(i, f"{node_name}-{i}", m) for i, m in slots))


def found(outcome: Outcome) -> Placement:
    """The placement of an outcome that must have one."""
    assert outcome.placement is not None, outcome
    return outcome.placement


def test_best_fit_puts_a_small_task_on_the_gpu_already_holding_work_within_a_node() -> None:
    """A 5Gi task joins the GPU with 15Gi of 24Gi reserved rather than an empty GPU."""
    cluster = ClusterState([node("a", 24, 24)])
    cluster.reserve(task("big", memory_gib=15), placed("a", (1, 15 * GIB)))
    assert find_placement(cluster, task("small", memory_gib=5), BestFit()) == Outcome(
        placed("a", (1, 5 * GIB)), True
    )


def test_best_fit_prefers_the_node_with_the_partly_used_gpu_over_an_empty_node() -> None:
    """Across nodes, best fit picks the node left with the least free capacity after placing."""
    cluster = ClusterState([node("a", 24), node("b", 24)])
    cluster.reserve(task("big", memory_gib=15), placed("b", (0, 15 * GIB)))
    assert find_placement(cluster, task("small", memory_gib=5), BestFit()) == Outcome(
        placed("b", (0, 5 * GIB)), True
    )


def test_ties_go_to_the_smallest_node_name_then_the_lowest_gpu_index() -> None:
    """With identical empty nodes, the smallest name and its lowest-index GPUs win."""
    cluster = ClusterState([node("c", 16, 16, 16), node("b", 16, 16, 16), node("ba", 16, 16, 16)])
    assert [
        found(find_placement(cluster, task("t", count=2, memory_gib=4), policy))
        for policy in (BestFit(), FirstFit())
    ] == [placed("b", (0, 4 * GIB), (1, 4 * GIB))] * 2


def test_multi_gpu_task_goes_whole_onto_one_node_or_nowhere() -> None:
    """A 3-GPU task never splits: it takes the one node with three fitting GPUs, else nothing."""
    cluster = ClusterState([node("a", 16, 16), node("b", 16, 16), node("c", 16, 16, 16, 16)])
    cluster.reserve(task("busy", memory_gib=10), placed("c", (0, 10 * GIB)))
    fits = find_placement(cluster, task("three", count=3, memory_gib=8), BestFit())
    cluster.reserve(task("busy2", memory_gib=10), placed("c", (1, 10 * GIB)))
    no_fit = find_placement(cluster, task("three", count=3, memory_gib=8), BestFit())
    assert (fits, no_fit) == (
        Outcome(placed("c", (1, 8 * GIB), (2, 8 * GIB), (3, 8 * GIB)), True),
        Outcome(None, False, None, True),
    )


def test_gpu_products_restrict_the_candidate_gpus() -> None:
    """gpuProducts keeps only GPUs of the named products; an absent product is reported as unseen."""
    cluster = ClusterState([node("a", 24, product="NVIDIA-A10"), node("b", 80, product="NVIDIA-H100")])
    assert (
        find_placement(cluster, task("t", memory_gib=4, products=("NVIDIA-H100",)), BestFit()),
        find_placement(cluster, task("t", memory_gib=4, products=("NVIDIA-B200",)), BestFit()),
    ) == (
        Outcome(placed("b", (0, 4 * GIB)), True),
        Outcome(None, False, None, product_seen=False),
    )


def test_whole_gpu_tasks_only_take_idle_gpus() -> None:
    """A whole-GPU task skips GPUs holding any reservation or foreign memory, even 1 MiB."""
    gpus = (
        Gpu(0, "a-0", "NVIDIA-A10", 24 * GIB),
        Gpu(1, "a-1", "NVIDIA-A10", 24 * GIB, foreign_mib=1),
        Gpu(2, "a-2", "NVIDIA-A10", 24 * GIB),
    )
    cluster = ClusterState([Node(NodeName("a"), gpus)])
    cluster.reserve(task("tiny", memory_gib=None, fraction_milli=1), placed("a", (0, 25)))
    assert (
        find_placement(cluster, task("whole"), BestFit()),
        find_placement(cluster, task("two", count=2), BestFit()),
    ) == (Outcome(placed("a", (2, 24 * GIB)), True), Outcome(None, False, None, True))


def test_unhealthy_gpus_and_unschedulable_nodes_are_never_chosen() -> None:
    """Placement skips an unhealthy GPU and every GPU of an unschedulable node."""
    sick = Node(
        NodeName("a"),
        (Gpu(0, "a-0", "NVIDIA-A10", 24 * GIB, healthy=False), Gpu(1, "a-1", "NVIDIA-A10", 24 * GIB)),
    )
    cluster = ClusterState([sick, node("b", 24, 24, schedulable=False), node("c", 24, 24)])
    assert [find_placement(cluster, task("t", count=n, memory_gib=1), BestFit()) for n in (1, 2)] == [
        Outcome(placed("a", (1, GIB)), True),
        Outcome(placed("c", (0, GIB), (1, GIB)), True),
    ]


def test_gpu_fraction_reserves_its_share_of_each_gpu_rounded_up_to_whole_mib() -> None:
    """gpuFraction 0.333 of a 24Gi GPU is ceil(24576 * 0.333) = 8184 MiB, per GPU size."""
    cluster = ClusterState([node("a", 24, 16)])
    assert found(find_placement(cluster, task("t", count=2, fraction_milli=333), FirstFit())) == placed(
        "a", (0, 8184), (1, 5456)
    )


def test_a_fraction_of_one_is_a_whole_exclusive_gpu() -> None:
    """gpuFraction 1 reserves the whole GPU exclusively, like a task without a memory request."""
    cluster = ClusterState([node("a", 16, 16)])
    cluster.reserve(task("tiny", memory_gib=1), placed("a", (0, GIB)))
    assert find_placement(cluster, task("t", fraction_milli=1000), BestFit()) == Outcome(
        placed("a", (1, 16 * GIB)), True
    )


def test_first_fit_takes_the_first_node_by_name_even_when_another_packs_better() -> None:
    """First fit picks node a (first feasible) while best fit picks the fuller node b."""
    cluster = ClusterState([node("a", 24), node("b", 24)])
    cluster.reserve(task("big", memory_gib=15), placed("b", (0, 15 * GIB)))
    small = task("small", memory_gib=5)
    assert [found(find_placement(cluster, small, p)) for p in (FirstFit(), BestFit())] == [
        placed("a", (0, 5 * GIB)),
        placed("b", (0, 5 * GIB)),
    ]


def test_random_policy_is_repeatable_per_seed_and_stays_feasible() -> None:
    """Two random policies with one seed choose the same sequence, always on feasible GPUs."""
    cluster = ClusterState([node(n, 24, 24, 24) for n in "abcd"])
    cluster.reserve(task("full", count=3), placed("c", (0, 24 * GIB), (1, 24 * GIB), (2, 24 * GIB)))
    tasks = [task(f"t{i}", count=2, memory_gib=4) for i in range(12)]
    runs = [[found(find_placement(cluster, t, RandomFit(seed=7))) for t in tasks] for _ in range(2)]
    feasible = all(p.only().node != "c" and len(set(p.only().indices)) == 2 for p in runs[0])
    assert (runs[0] == runs[1], feasible) == (True, True)


def test_find_placement_never_changes_the_cluster() -> None:
    """Searching is pure: reserved MiB and generations are the same before and after."""
    cluster = ClusterState([node("a", 24, 24), node("b", 16)])
    cluster.reserve(task("x", memory_gib=3), placed("a", (0, 3 * GIB)))
    before = [(s.name, list(s.reserved_mib), list(s.exclusive), s.generation) for s in cluster]
    for policy in (BestFit(), FirstFit(), RandomFit()):
        find_placement(cluster, task("t", count=2, memory_gib=2), policy)
    assert [(s.name, list(s.reserved_mib), list(s.exclusive), s.generation) for s in cluster] == before


def test_quota_check_skips_refused_nodes_and_names_the_resource_when_all_refuse() -> None:
    """A node refused by quota is skipped; when every fitting node is refused the outcome names the quota.

    Quota sees only what the placement uses (here: refuses a 4Gi slice of a 16Gi GPU, which costs
    more milli-GPU than on a 24Gi one), never the node's name: that is QuotaCheck's contract.
    """
    cluster = ClusterState([node("a", 16), node("b", 24)])
    small_gpus_only = find_placement(
        cluster,
        task("t", memory_gib=4),
        BestFit(),
        quota=lambda s, p: None if s.node.gpus[0].memory_mib == 24 * GIB else "nvidia.com/gpu",
    )
    none = find_placement(cluster, task("t", memory_gib=4), BestFit(), quota=lambda s, p: "nvidia.com/gpu")
    assert (small_gpus_only, none) == (
        Outcome(placed("b", (0, 4 * GIB)), True),
        Outcome(None, True, "nvidia.com/gpu", True),
    )


def test_make_policy_returns_fresh_policies_by_name() -> None:
    """make_policy builds the named policy; each call gives a new instance."""
    assert [type(make_policy(n)) for n in ("bestfit", "firstfit", "random")] == [BestFit, FirstFit, RandomFit]


def test_make_policy_rejects_an_unknown_name_listing_the_known_ones() -> None:
    """An unknown policy name raises KeyError naming it and every registered policy."""
    with pytest.raises(KeyError) as info:
        make_policy("worstfit")
    assert info.value.args[0] == f"unknown policy 'worstfit'; known: {', '.join(sorted(POLICIES))}"
