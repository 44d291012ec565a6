"""Node and GPU failure in the core: grace period, immediate failures, maxReschedules, restore."""

from __future__ import annotations

from dataclasses import replace

from test_core_scheduler import GIB, node, placed, task

from gputask.core import Admit, NodeName, Pending, QueueSpec, Scheduler
from gputask.core.scheduler import Evict, Fail

W = 24 * GIB


def two_nodes(grace_s: float = 60.0) -> Scheduler:
    """node a and node b with one 24Gi GPU each, a default queue, and task t running on a."""
    s = Scheduler(nodes=[node("a", 24), node("b", 24)], node_failure_grace_s=grace_s)
    s.set_queue(QueueSpec("q"))
    s.submit(task("t", memory_gib=8))
    assert [type(d) for d in s.cycle(0.0)] == [Admit]
    return s


def test_node_not_ready_evicts_only_after_the_grace_period_and_requeues_elsewhere() -> None:
    """NotReady at 10 s: nothing at 60 s, NodeFailure eviction at 71 s and re-admission on node b."""
    s = two_nodes()
    t = task("t", memory_gib=8)
    s.node_ready(NodeName("a"), False, 10.0)
    during = s.cycle(60.0)
    after = s.cycle(71.0)
    assert (during, after) == (
        [],
        [
            Evict(t, placed("a", (0, 8 * GIB)), "NodeFailure", "node a NotReady for more than 60s"),
            Admit(t, placed("b", (0, 8 * GIB)), {"nvidia.com/gpu": 334, "gputask.io/gpu-memory": 8 * GIB}),
        ],
    )
    assert s.reschedules(t.key) == 1


def test_node_back_before_the_grace_period_changes_nothing() -> None:
    """A node Ready again within the grace period keeps its tasks and takes new work again."""
    s = two_nodes()
    s.node_ready(NodeName("a"), False, 10.0)
    s.node_ready(NodeName("a"), True, 30.0)
    assert s.cycle(200.0) == []
    assert s.placement_of(task("t").key) == placed("a", (0, 8 * GIB))
    assert s.cluster.node(NodeName("a")).node.schedulable is True


def test_not_ready_node_gets_no_new_work_at_once() -> None:
    """A NotReady node is skipped by placement immediately, before any eviction."""
    s = two_nodes()
    s.node_ready(NodeName("a"), False, 1.0)
    s.submit(task("new", memory_gib=8, created=1))
    assert s.cycle(2.0) == [
        Admit(
            task("new", memory_gib=8, created=1),
            placed("b", (0, 8 * GIB)),
            {"nvidia.com/gpu": 334, "gputask.io/gpu-memory": 8 * GIB},
        )
    ]


def test_deleted_node_and_out_of_service_fail_at_once() -> None:
    """A deleted node's tasks are evicted by the next cycle; so are an out-of-service node's."""
    s = two_nodes()
    t = task("t", memory_gib=8)
    s.remove_node(NodeName("a"))
    first = s.cycle(1.0)
    s.node_failed(NodeName("b"), "tainted node.kubernetes.io/out-of-service")
    second = s.cycle(2.0)
    assert [(type(d).__name__, d.reason if isinstance(d, Evict) else "") for d in first] == [
        ("Evict", "NodeFailure"),
        ("Admit", ""),
    ]
    assert second == [
        Evict(t, placed("b", (0, 8 * GIB)), "NodeFailure", "node b failed: tainted node.kubernetes.io/out-of-service"),
        Pending(
            t,
            "NoFit",
            "0/1 nodes fit: 1 unschedulable (NotReady)",
        ),
    ]


def test_unhealthy_gpu_evicts_its_tasks_with_gpu_failure() -> None:
    """Marking the GPU unhealthy evicts the task on it (GPUFailure) and places it on the other node."""
    s = two_nodes()
    t = task("t", memory_gib=8)
    a = s.cluster.node(NodeName("a")).node
    s.set_node(replace(a, gpus=(replace(a.gpus[0], healthy=False),)))
    assert [(type(d).__name__, getattr(d, "reason", "")) for d in s.cycle(1.0)] == [
        ("Evict", "GPUFailure"),
        ("Admit", ""),
    ]
    assert s.placement_of(t.key) == placed("b", (0, 8 * GIB))


def test_max_reschedules_exceeded_fails_the_task() -> None:
    """With maxReschedules 0 the first failure eviction fails the task for good."""
    s = Scheduler(nodes=[node("a", 24), node("b", 24)])
    s.set_queue(QueueSpec("q"))
    t = replace(task("t", memory_gib=8), max_reschedules=0)
    s.submit(t)
    s.cycle(0.0)
    s.remove_node(NodeName("a"))
    assert s.cycle(1.0) == [
        Evict(t, placed("a", (0, 8 * GIB)), "NodeFailure", "node a is not in the cluster any more"),
        Fail(t, "MaxReschedulesExceeded", "node a is not in the cluster any more; rescheduled 0 times already"),
    ]
    assert (s.placement_of(t.key), t.key in s.pending) == (None, False)


def test_restore_on_an_unknown_node_requeues_instead_of_losing_the_task() -> None:
    """A running task restored onto a node that no longer exists is evicted (NodeFailure) and placed anew."""
    s = Scheduler(nodes=[node("b", 24)])
    s.set_queue(QueueSpec("q"))
    t = task("t", memory_gib=8)
    s.restore(t, placed("gone", (0, 8 * GIB)))
    assert [(type(d).__name__, getattr(d, "reason", "")) for d in s.cycle(1.0)] == [
        ("Evict", "NodeFailure"),
        ("Admit", ""),
    ]
    assert s.placement_of(t.key) == placed("b", (0, 8 * GIB))
