"""GPU topology inside a node: the best-connected GPUs among equal choices, and how a set is described."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import pytest

from gputask.core import ClusterState, Gpu, GpuRequest, Node, NodeName, Task, TaskKey, find_placement, make_policy
from gputask.core.diagnose import diagnose
from gputask.core.gpulinks import MAX_CANDIDATES, best_connected, describe, pair_value, set_value
from gputask.core.model import GpuLink, Placement
from gputask.core.quota import GPU, QueueSpec, ResourceQuota
from gputask.core.scheduler import Scheduler

GIB = 1024
POLICIES = ["packing", "fgd", "bestfit", "firstfit", "random", "bestfit-atc23"]


def gpus(n: int, mib: int = 24 * GIB) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"u{i}", "NVIDIA-A10", mib) for i in range(n))


def mesh(n: int, kind: str = "CrossNUMA", **better: tuple[str, int]) -> tuple[GpuLink, ...]:
    """Every pair of ``n`` GPUs linked by ``kind``, except the pairs named ``p<a>_<b>`` in ``better``."""
    links = []
    for a, b in combinations(range(n), 2):
        found = better.get(f"p{a}_{b}")
        links.append(GpuLink(a, b, *found) if found else GpuLink(a, b, kind))
    return tuple(links)


def whole(count: int) -> Task:
    return Task(TaskKey(f"ns/t{count}"), "q", GpuRequest(count))


def place(cluster: ClusterState, task: Task, policy: str = "packing") -> Placement:
    found = find_placement(cluster, task, make_policy(policy, seed=1)).placement
    assert found is not None
    return found


# An NVLink pair (2, 3) and a PCIe-switch pair (0, 1); every other pair crosses sockets.
LINKED = mesh(4, p0_1=("PCIeSwitch", 0), p2_3=("NVLink", 4))


@pytest.mark.parametrize("policy", POLICIES)
def test_an_nvlink_pair_is_chosen_over_a_pcie_pair_when_scores_tie(policy: str) -> None:
    """Four idle alike GPUs: every pair scores the same, and the pod gets the NVLink pair, not the lowest indices;
    without links it gets what the policy picked before (0, 1: first fit's and the fragmentation policies' pick)."""
    linked = ClusterState([Node(NodeName("n"), gpus(4), links=LINKED)])
    plain = ClusterState([Node(NodeName("n"), gpus(4))])
    chosen = place(linked, whole(2), policy).only().indices
    before = place(plain, whole(2), policy).only().indices
    assert (chosen, before if policy != "random" else (0, 1)) == ((2, 3), (0, 1))


def test_links_never_change_the_node_chosen() -> None:
    """node-a wins on name among equal nodes; node-b's NVLink pair does not draw the pod away from it."""
    a = Node(NodeName("node-a"), gpus(4), links=mesh(4))
    b = Node(NodeName("node-b"), gpus(4), links=mesh(4, p0_1=("NVLink", 12)))
    found = place(ClusterState([a, b]), whole(2)).only()
    assert (found.node, found.indices) == ("node-a", (0, 1))


def test_gpus_that_score_differently_are_not_swapped_in() -> None:
    """A GPU that differs from the picked ones (here in foreign use) is never swapped in for a better link: the
    score would change. A shared 2-GPU task goes to the tightest GPUs 3 and 2 (8 and 4 GiB used by others) and
    stays there although 0 and 1 are NVLinked. With 1, 2 and 3 alike (4 GiB used each), the policy's pick 1, 2
    gives way to the NVLinked 2, 3."""
    base = Node(NodeName("n"), gpus(4), links=mesh(4, p0_1=("NVLink", 12)))
    used = (0, 0, 4 * GIB, 8 * GIB)
    busy = replace(base, gpus=tuple(replace(g, foreign_mib=mib) for g, mib in zip(base.gpus, used, strict=True)))
    shared = Task(TaskKey("ns/s"), "q", GpuRequest(2, memory_mib=GIB))
    alike = replace(busy, gpus=tuple(replace(g, foreign_mib=4 * GIB if g.index else 0) for g in busy.gpus),
                    links=mesh(4, p2_3=("NVLink", 12)))
    plain = replace(alike, links=())
    assert [place(ClusterState([n]), shared).only().indices for n in (busy, alike, plain)] == [
        (3, 2), (2, 3), (1, 2)]


def test_the_worst_pair_decides_then_the_sum() -> None:
    """Of four GPUs out of eight: 4..7, every pair through a PCIe switch, beat 0..3, five pairs NVLink x18 but
    2-3 across sockets (the larger sum, the worse worst pair); among sets of equal worst pair the larger sum wins."""
    nv18 = {f"p{a}_{b}": ("NVLink", 18) for a, b in combinations(range(4), 2) if (a, b) != (2, 3)}
    pcie = {f"p{a}_{b}": ("PCIeSwitch", 0) for a, b in combinations(range(4, 8), 2)}
    node = Node(NodeName("n"), gpus(8), links=mesh(8, **nv18, **pcie))
    table = {(link.a, link.b): link for link in node.links}
    assert place(ClusterState([node]), whole(4)).only().indices == (4, 5, 6, 7)
    assert set_value(table, (0, 1, 2, 3))[1] > set_value(table, (4, 5, 6, 7))[1]
    assert set_value(table, (0, 1, 2)) > set_value(table, (4, 5, 6)) > set_value(table, (0, 4, 5))


def test_unknown_pairs_rank_below_every_known_kind_and_mig_devices_have_none() -> None:
    """A pair the agent did not report ranks last; CrossNUMA is still known; NVLink counts order NVLink pairs."""
    assert [pair_value(None), pair_value(GpuLink(0, 1, "CrossNUMA"))] == [0, 100]
    assert pair_value(GpuLink(0, 1, "NVLink", 4)) < pair_value(GpuLink(0, 1, "NVLink", 12))
    assert pair_value(GpuLink(0, 1, "PCIeSwitch")) < pair_value(GpuLink(0, 1, "NVLink", 1))


def test_a_node_too_large_to_compare_every_set_improves_the_pick_one_swap_at_a_time() -> None:
    """16 alike GPUs, 8 wanted: more sets than MAX_CANDIDATES, so local search from the policy's pick (0..7)
    reaches the NVLink clique 8..15."""
    clique = {f"p{a}_{b}": ("NVLink", 18) for a, b in combinations(range(8, 16), 2)}
    node = Node(NodeName("n"), gpus(16), links=mesh(16, **clique))
    state = ClusterState([node]).node(NodeName("n"))
    assert MAX_CANDIDATES < 12870  # C(16, 8) sets
    assert best_connected(state, tuple(range(8)), list(range(16))) == tuple(range(8, 16))


def test_without_links_or_with_one_gpu_the_pick_is_returned_as_is() -> None:
    state = ClusterState([Node(NodeName("n"), gpus(4))]).node(NodeName("n"))
    linked = ClusterState([Node(NodeName("n"), gpus(4), links=LINKED)]).node(NodeName("n"))
    assert [best_connected(state, (1, 0), [0, 1, 2, 3]), best_connected(linked, (1,), [0, 1, 2, 3])] == [(1, 0), (1,)]


def test_describe_says_each_pair_or_lists_them() -> None:
    node = Node(NodeName("n"), gpus(4), links=mesh(4, "NVLink", p2_3=("NVLink", 12))[:5] + (
        GpuLink(2, 3, "NVLink", 12),))
    alike = Node(NodeName("n"), gpus(4), links=tuple(GpuLink(a, b, "NVLink", 12) for a, b in combinations(range(4), 2)))
    partial = Node(NodeName("n"), gpus(3), links=(GpuLink(0, 1, "PCIeSwitch"),))
    assert [describe(alike, (3, 2, 1, 0)), describe(alike, (0, 1)), describe(partial, (0, 1, 2)),
            describe(Node(NodeName("n"), gpus(2)), (0, 1)), describe(alike, (1,))] == [
        "GPUs 0,1,2,3: NVLink x12 each pair", "GPUs 0,1: NVLink x12",
        "GPUs 0,1,2: 0-1 PCIeSwitch, 0-2 no link info, 1-2 no link info", "", ""]
    assert describe(node, (0, 2, 3)).startswith("GPUs 0,2,3: 0-2 ")


def test_explain_shows_the_links_of_an_admitted_task() -> None:
    """An admitted 2-GPU task on a node with links: explain names its node, GPUs and their link."""
    scheduler = Scheduler(nodes=[Node(NodeName("n"), gpus(4), links=LINKED)])
    scheduler.set_queue(QueueSpec("q", quotas={GPU: ResourceQuota(8000)}))
    scheduler.submit(whole(2))
    scheduler.cycle(0.0)
    found = diagnose(scheduler, TaskKey("ns/t2"))
    assert (found.state, found.links) == ("admitted", ("n GPUs 2,3: NVLink x4",))


def test_explain_text_prints_the_links_after_the_node() -> None:
    """``gputask explain`` of an admitted task: one ``GPU links:`` line per pod of two GPUs or more."""
    from rich.console import Console

    from gputask.core.diagnose import Diagnosis
    from gputask.live import render_diagnosis

    console = Console(width=200, color_system=None, record=True)
    found = Diagnosis(key="ns/t", state="admitted", queue="q", node="n", links=("n GPUs 2,3: NVLink x4",))
    render_diagnosis(console, found, {"phase": "Running"})
    assert console.export_text().splitlines()[-2:] == ["Admitted on node n.", "GPU links: n GPUs 2,3: NVLink x4"]


def test_each_pod_of_a_gang_gets_the_best_connected_gpus_left() -> None:
    """A gang of two 2-GPU pods on one 4-GPU node whose NVLinked pairs are 0-3 and 1-2: each pod gets one
    NVLinked pair (without links: 0, 1 and 2, 3, both pairs crossing sockets here)."""
    from gputask.core.model import PodSet

    links = mesh(4, p0_3=("NVLink", 12), p1_2=("NVLink", 12))
    gang = Task.of_pod_sets(TaskKey("ns/g"), "q", (PodSet("workers", 2, GpuRequest(2)),))
    found = [place(ClusterState([Node(NodeName("n"), gpus(4), links=chosen)]), gang).pods for chosen in (links, ())]
    assert [[p.indices for p in pods] for pods in found] == [[(0, 3), (1, 2)], [(0, 1), (2, 3)]]
