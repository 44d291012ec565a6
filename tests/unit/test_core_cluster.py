"""ClusterState: per-GPU reservation accounting, exclusivity, refusals, node updates, invariants."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gputask.core import (
    ClusterState,
    Gpu,
    GpuRequest,
    GpuSlot,
    Node,
    NodeName,
    OverCommitError,
    Placement,
    Task,
    TaskKey,
    UnknownNodeError,
)

GIB = 1024  # MiB


def node(name: str, *gib: int, schedulable: bool = True) -> Node:
    """A node whose GPUs 0..n-1 have the given sizes in GiB and uuids ``<name>-<index>``."""
    gpus = tuple(Gpu(i, f"{name}-{i}", "NVIDIA-A10", g * GIB) for i, g in enumerate(gib))
    return Node(NodeName(name), gpus, schedulable=schedulable)


def task(name: str, *, count: int = 1, memory_gib: int | None = None) -> Task:
    """A task in queue ``q``: whole GPUs unless ``memory_gib`` is given."""
    mib = None if memory_gib is None else memory_gib * GIB
    return Task(TaskKey(f"ns/{name}"), "q", GpuRequest(count, memory_mib=mib))


def placed(node_name: str, *slots: tuple[int, int]) -> Placement:
    """A placement on ``node_name`` of (index, MiB) slots, with the uuids of :func:`node`."""
    return Placement.one(NodeName(node_name), tuple(GpuSlot(i, f"{node_name}-{i}", m) for i, m in slots))


def accounting(cluster: ClusterState) -> dict[str, object]:
    """Everything a reservation can change, as one comparable value."""
    return {
        "nodes": [
            (s.name, list(s.reserved_mib), list(s.exclusive), dict(s.tasks), s.cpu_used, s.generation)
            for s in cluster
        ],
        "reservations": {k: (r.task, r.placement) for k, r in cluster.reservations().items()},
        "generation": cluster.generation,
    }


def per_gpu(cluster: ClusterState) -> list[tuple[str, list[int], list[bool]]]:
    """Reserved MiB and exclusive flags of every GPU, node by node."""
    return [(s.name, list(s.reserved_mib), list(s.exclusive)) for s in cluster]


def test_reserve_adds_mib_per_gpu_and_release_takes_it_back() -> None:
    """Shared reservations add up on their GPUs and releasing one subtracts exactly its MiB."""
    cluster = ClusterState([node("a", 24, 24)])
    cluster.reserve(task("t1", memory_gib=15), placed("a", (0, 15 * GIB)))
    cluster.reserve(task("t2", memory_gib=5), placed("a", (0, 5 * GIB)))
    cluster.reserve(task("t3", count=2, memory_gib=4), placed("a", (0, 4 * GIB), (1, 4 * GIB)))
    after_reserve = per_gpu(cluster)
    released = cluster.release(TaskKey("ns/t1"))
    assert (after_reserve, released, per_gpu(cluster), sorted(cluster.node(NodeName("a")).tasks)) == (
        [("a", [24 * GIB, 4 * GIB], [False, False])],
        placed("a", (0, 15 * GIB)),
        [("a", [9 * GIB, 4 * GIB], [False, False])],
        ["ns/t2", "ns/t3"],
    )


def test_whole_gpu_reservation_is_exclusive_until_released() -> None:
    """A whole-GPU task marks its GPU exclusive with no free MiB, and release clears the mark."""
    cluster = ClusterState([node("a", 16, 16)])
    cluster.reserve(task("whole"), placed("a", (1, 16 * GIB)))
    state = cluster.node(NodeName("a"))
    held = (per_gpu(cluster), state.free_mib(0), state.free_mib(1), state.is_idle(1))
    cluster.release(TaskKey("ns/whole"))
    assert (held, per_gpu(cluster)) == (
        ([("a", [0, 16 * GIB], [False, True])], 16 * GIB, 0, False),
        [("a", [0, 0], [False, False])],
    )


def test_release_of_an_unknown_task_returns_none_and_changes_nothing() -> None:
    """Releasing a key that holds no reservation is a no-op returning None."""
    cluster = ClusterState([node("a", 16)])
    before = accounting(cluster)
    assert (cluster.release(TaskKey("ns/ghost")), accounting(cluster)) == (None, before)


def _busy_cluster() -> ClusterState:
    """Node a: GPU 0 holds a 20Gi shared task, GPU 1 a whole-GPU task, GPU 2 is idle but unhealthy."""
    a = node("a", 24, 24, 24)
    a = Node(a.name, (*a.gpus[:2], Gpu(2, "a-2", "NVIDIA-A10", 24 * GIB, healthy=False)))
    cluster = ClusterState([a])
    cluster.reserve(task("shared", memory_gib=20), placed("a", (0, 20 * GIB)))
    cluster.reserve(task("whole"), placed("a", (1, 24 * GIB)))
    return cluster


OVERCOMMITS: dict[str, Callable[[ClusterState], None]] = {
    "repeat reserve": lambda c: c.reserve(task("shared", memory_gib=1), placed("a", (0, GIB))),
    "unknown GPU index": lambda c: c.reserve(task("t", memory_gib=1), placed("a", (7, GIB))),
    "repeated GPU index": lambda c: c.reserve(
        task("t", count=2, memory_gib=1), placed("a", (0, GIB), (0, GIB))
    ),
    "uuid mismatch": lambda c: c.reserve(
        task("t", memory_gib=1), Placement.one(NodeName("a"), (GpuSlot(0, "b-0", GIB),))
    ),
    "over memory": lambda c: c.reserve(task("t", memory_gib=5), placed("a", (0, 5 * GIB))),
    "exclusive on a busy GPU": lambda c: c.reserve(task("t"), placed("a", (0, 24 * GIB))),
    "shared on an exclusive GPU": lambda c: c.reserve(task("t", memory_gib=1), placed("a", (1, GIB))),
    "unhealthy GPU": lambda c: c.reserve(task("t", memory_gib=1), placed("a", (2, GIB))),
    "second GPU fails after the first fits": lambda c: c.reserve(
        task("t", count=2, memory_gib=2), placed("a", (0, 2 * GIB), (1, 2 * GIB))
    ),
}


@pytest.mark.parametrize("case", sorted(OVERCOMMITS))
def test_refused_reservation_raises_overcommit_and_leaves_state_unchanged(case: str) -> None:
    """Every kind of over-commit raises OverCommitError and changes no counter, flag or map."""
    cluster = _busy_cluster()
    before = accounting(cluster)
    with pytest.raises(OverCommitError):
        OVERCOMMITS[case](cluster)
    assert accounting(cluster) == before


def test_reserve_on_an_unknown_node_raises_unknown_node() -> None:
    """A placement on a node the cluster does not hold raises UnknownNodeError."""
    cluster = ClusterState([node("a", 16)])
    with pytest.raises(UnknownNodeError):
        cluster.reserve(task("t", memory_gib=1), placed("zz", (0, GIB)))


def test_set_node_keeps_reservations_on_surviving_gpus_and_reports_tasks_whose_gpus_vanished() -> None:
    """Updating a node re-applies reservations on GPUs that remain and returns tasks that lost one."""
    cluster = ClusterState([node("a", 24, 24, 24)])
    cluster.reserve(task("on0", memory_gib=10), placed("a", (0, 10 * GIB)))
    cluster.reserve(task("on2"), placed("a", (2, 24 * GIB)))
    cluster.reserve(task("on0and1", count=2, memory_gib=1), placed("a", (0, GIB), (1, GIB)))
    lost = cluster.set_node(Node(NodeName("a"), node("a", 24, 24).gpus))
    assert (lost, per_gpu(cluster), sorted(cluster.reservations())) == (
        ["ns/on2"],
        [("a", [11 * GIB, GIB], [False, False])],
        ["ns/on0", "ns/on0and1", "ns/on2"],
    )


def test_set_node_reports_a_replaced_gpu_and_releasing_the_lost_task_leaves_the_new_gpu_at_zero() -> None:
    """A GPU whose uuid changed counts as vanished; releasing the lost task never touches the new GPU."""
    cluster = ClusterState([node("a", 24)])
    cluster.reserve(task("old", memory_gib=10), placed("a", (0, 10 * GIB)))
    replaced = Node(NodeName("a"), (Gpu(0, "a-0-new", "NVIDIA-A10", 24 * GIB),))
    lost = cluster.set_node(replaced)
    cluster.release(TaskKey("ns/old"))
    assert (lost, per_gpu(cluster), cluster.node(NodeName("a")).free_mib(0)) == (
        ["ns/old"],
        [("a", [0], [False])],
        24 * GIB,
    )


def test_set_node_keeps_exclusive_marks_and_health_changes_hide_free_memory() -> None:
    """An unhealthy GPU keeps its reservation and offers no free MiB; exclusive marks survive updates."""
    cluster = ClusterState([node("a", 16, 16)])
    cluster.reserve(task("whole"), placed("a", (0, 16 * GIB)))
    cluster.reserve(task("part", memory_gib=4), placed("a", (1, 4 * GIB)))
    sick = Node(NodeName("a"), (node("a", 16).gpus[0], Gpu(1, "a-1", "NVIDIA-A10", 16 * GIB, healthy=False)))
    lost = cluster.set_node(sick)
    state = cluster.node(NodeName("a"))
    assert (lost, per_gpu(cluster), state.free_mib(1)) == (
        [],
        [("a", [16 * GIB, 4 * GIB], [True, False])],
        0,
    )


def test_remove_node_returns_its_tasks_and_keeps_other_nodes() -> None:
    """Removing a node returns the tasks reserved on it, sorted, and leaves other nodes as they were."""
    cluster = ClusterState([node("a", 16, 16), node("b", 16)])
    cluster.reserve(task("y", memory_gib=2), placed("a", (1, 2 * GIB)))
    cluster.reserve(task("x", memory_gib=2), placed("a", (0, 2 * GIB)))
    cluster.reserve(task("z", memory_gib=3), placed("b", (0, 3 * GIB)))
    removed = cluster.remove_node(NodeName("a"))
    assert (removed, cluster.remove_node(NodeName("nope")), per_gpu(cluster)) == (
        ["ns/x", "ns/y"],
        [],
        [("b", [3 * GIB], [False])],
    )


def test_sorted_nodes_are_in_name_order_whatever_the_insertion_order() -> None:
    """Nodes iterate by name so that ties go to the smallest name."""
    cluster = ClusterState([node("c", 8), node("a", 8)])
    cluster.set_node(node("b", 8))
    assert [s.name for s in cluster] == ["a", "b", "c"]


def test_violations_report_overcommit_and_shared_exclusive_gpus_from_force_reserve() -> None:
    """force_reserve records a placement that over-commits, and violations() names each broken GPU."""
    cluster = ClusterState([node("a", 16, 16)])
    clean = cluster.violations()
    cluster.reserve(task("whole"), placed("a", (0, 16 * GIB)))
    cluster.reserve(task("intruder", memory_gib=4), placed("a", (0, 4 * GIB)), force=True)
    cluster.reserve(task("big", memory_gib=20), placed("a", (1, 20 * GIB)), force=True)
    assert (clean, cluster.violations()) == (
        [],
        [
            "a GPU 0: 20480 MiB reserved > 16384 MiB",
            "a GPU 0: exclusive GPU shared by ['ns/whole', 'ns/intruder']",
            "a GPU 1: 20480 MiB reserved > 16384 MiB",
        ],
    )
