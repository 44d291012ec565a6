"""Share groups: a shared GPU takes only tasks of the share group already on it (MPS, DRA namespaces)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputask.core import (
    GPU,
    POLICIES,
    ClusterState,
    Gpu,
    GpuRequest,
    GpuSlot,
    Node,
    NodeName,
    OverCommitError,
    Placement,
    Preemption,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
    find_placement,
    make_policy,
)
from gputask.core.preemption import Victim, could_fit_without
from gputask.core.reasons import refusals, share_group_text

GIB = 1024  # MiB


def node(name: str, *gib: int) -> Node:
    """A node whose GPUs 0..n-1 have the given sizes in GiB and uuids ``<name>-<index>``."""
    return Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", "NVIDIA-A10", g * GIB) for i, g in enumerate(gib)))


def task(name: str, memory_gib: int | None, group: str = "", *, priority: int = 0) -> Task:
    """A one-GPU task of ``memory_gib`` GiB (whole GPU when None) in share group ``group``."""
    mib = None if memory_gib is None else memory_gib * GIB
    return Task(TaskKey(f"ns/{name}"), "q", GpuRequest(1, memory_mib=mib, share_group=group), priority=priority)


def on(node_name: str, index: int, gib: int) -> Placement:
    """One slot of ``gib`` GiB on GPU ``index`` of ``node_name``."""
    return Placement.one(NodeName(node_name), (GpuSlot(index, f"{node_name}-{index}", gib * GIB),))


def test_a_gpu_shared_by_one_group_refuses_a_task_of_another_and_takes_one_of_its_own() -> None:
    """With GPU 0 shared by MPS tasks, a default-group task goes to GPU 1 and another MPS task joins GPU 0."""
    cluster = ClusterState([node("a", 24, 24)])
    cluster.reserve(task("mps-1", 4, "MPS"), on("a", 0, 4))
    best = make_policy("bestfit")
    placed = [find_placement(cluster, t, best).placement for t in (task("plain", 4), task("mps-2", 4, "MPS"))]
    assert placed == [on("a", 1, 4), on("a", 0, 4)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_keeps_share_groups_apart(policy: str) -> None:
    """No placement policy puts a task on a GPU shared by another group (the only free GPU is one)."""
    cluster = ClusterState([node("a", 24, 24)])
    cluster.reserve(task("mps", 4, "MPS"), on("a", 0, 4))
    cluster.reserve(task("whole", None), on("a", 1, 24))
    assert find_placement(cluster, task("plain", 4), make_policy(policy)).placement is None


def test_reserve_refuses_a_placement_that_would_mix_groups_and_changes_nothing() -> None:
    """ClusterState.reserve raises OverCommitError for another group's task on a shared GPU, leaving the state."""
    cluster = ClusterState([node("a", 24)])
    cluster.reserve(task("ns-a", 4, "namespace a"), on("a", 0, 4))
    with pytest.raises(OverCommitError, match=r"shared by share group \['namespace a'\], not 'namespace b'"):
        cluster.reserve(task("ns-b", 4, "namespace b"), on("a", 0, 4))
    state = cluster.node(NodeName("a"))
    assert (state.groups, state.reserved_mib) == ([{"namespace a": 1}], [4096])


def test_release_of_the_last_task_of_a_group_frees_the_gpu_for_any_group() -> None:
    """Counts per group go down on release; once none is left the GPU takes another group."""
    cluster = ClusterState([node("a", 24)])
    cluster.reserve(task("m1", 4, "MPS"), on("a", 0, 4))
    cluster.reserve(task("m2", 4, "MPS"), on("a", 0, 4))
    state = cluster.node(NodeName("a"))
    seen = [dict(state.groups[0])]
    cluster.release(TaskKey("ns/m1"))
    seen.append(dict(state.groups[0]))
    cluster.release(TaskKey("ns/m2"))
    seen.append(dict(state.groups[0]))
    cluster.reserve(task("plain", 4), on("a", 0, 4))
    seen.append(dict(state.groups[0]))
    assert seen == [{"MPS": 2}, {"MPS": 1}, {}, {"": 1}]


def test_set_node_keeps_the_groups_of_the_reservations_it_keeps() -> None:
    """A node update (new state object) recounts the share groups of the reservations on it."""
    cluster = ClusterState([node("a", 24, 24)])
    cluster.reserve(task("m", 4, "MPS"), on("a", 0, 4))
    cluster.reserve(task("p", 4), on("a", 1, 4))
    cluster.set_node(node("a", 24, 24))
    assert cluster.node(NodeName("a")).groups == [{"MPS": 1}, {"": 1}]


def test_a_forced_mix_of_groups_is_a_violation_and_an_overcommit() -> None:
    """A rebuild that forces two groups onto one GPU is reported by violations() and overcommitted()."""
    cluster = ClusterState([node("a", 24)])
    cluster.reserve(task("m", 4, "MPS"), on("a", 0, 4))
    cluster.reserve(task("p", 4), on("a", 0, 4), force=True)
    assert (cluster.violations(), cluster.overcommitted(on("a", 0, 4))) == (
        ["a GPU 0: shared by share groups ['', 'MPS']"],
        True,
    )


def test_whole_gpu_tasks_ignore_share_groups() -> None:
    """An exclusive request's group counts nowhere: it needs an idle GPU whatever its group."""
    cluster = ClusterState([node("a", 24)])
    cluster.reserve(task("whole", None, "MPS"), on("a", 0, 24))
    assert cluster.node(NodeName("a")).groups == [{}]


def test_the_gpu_refusal_says_the_gpus_are_held_by_another_group() -> None:
    """The wait message names the share group when another group's tasks hold the memory that would fit."""
    cluster = ClusterState([node("a", 24)])
    cluster.reserve(task("m", 4, "MPS"), on("a", 0, 4))
    [refusal] = refusals(cluster.node(NodeName("a")), task("plain", 4))
    assert refusal.text == (
        "no GPU with 4096 MiB free that tasks of another share group do not hold (this task's: time-slicing)"
    )


def test_preemption_counts_a_gpu_usable_only_once_every_holder_of_another_group_is_gone() -> None:
    """could_fit_without: evicting one of two MPS holders is not enough for a default-group task; both are."""
    cluster = ClusterState([node("a", 24)])
    cluster.reserve(task("m1", 4, "MPS"), on("a", 0, 4))
    cluster.reserve(task("m2", 4, "MPS"), on("a", 0, 4))
    state = cluster.node(NodeName("a"))
    victims = [Victim(r.task, r.placement, {}, 0.0) for r in cluster.reservations().values()]
    assert [could_fit_without(state, task("plain", 4), v) for v in (victims[:1], victims)] == [False, True]


def test_the_scheduler_preempts_another_groups_tasks_to_place_a_higher_priority_one() -> None:
    """A high-priority default-group task preempts the lower-priority MPS task holding the only GPU it fits."""
    scheduler = Scheduler(nodes=[node("a", 24)])
    scheduler.set_queue(QueueSpec("q", quotas={GPU: ResourceQuota(4000)}, preemption=Preemption("LowerPriority")))
    scheduler.submit(task("mps", 4, "MPS"))
    first = scheduler.cycle(1.0)
    scheduler.submit(task("urgent", 8, priority=10))
    second = scheduler.cycle(3.0)
    kinds = [(type(d).__name__, d.task.key) for d in (*first, *second)]
    assert kinds == [("Admit", "ns/mps"), ("Evict", "ns/mps"), ("Pending", "ns/urgent")]


def test_share_group_is_part_of_the_fit_key() -> None:
    """Two tasks alike but for their share group place differently, so their fit keys differ."""
    plain = task("t", 4)
    assert plain.fit_key != replace(plain, request=replace(plain.request, share_group="MPS")).fit_key


def test_share_groups_are_said_as_people_say_them() -> None:
    """The wait message names a share group by how the GPU is shared and, with DRA, the namespace."""
    assert [share_group_text(g) for g in ("", "MPS", "namespace ml", "namespace ml, MPS")] == [
        "time-slicing", "MPS", "time-slicing in namespace ml", "MPS in namespace ml",
    ]
