"""The operator's gauges after a cycle: the series Kueue users look for, per queue, flavor and GPU."""

from __future__ import annotations

import pytest

from gputask.core import Gpu, GpuRequest, Node, NodeName, Scheduler, Task, TaskKey
from gputask.manifests.convert import flavor_from_manifest, queue_from_manifest
from gputask.metrics import OperatorMetrics

GIB = 1024


def test_quota_limits_pending_by_status_and_per_gpu_memory_after_a_cycle() -> None:
    """A queue with an A10 flavor (nominal 1, borrowingLimit 1, lendingLimit 500m) in a cohort: its quota series
    carry the flavor; of two waiting tasks the one no node could ever hold is inadmissible, the other active;
    each GPU reports what is reserved and free on it; admission latency is per queue."""
    gpus = (Gpu(0, "g0", "NVIDIA-A10", 24 * GIB), Gpu(1, "g1", "NVIDIA-A10", 24 * GIB))
    s = Scheduler(nodes=[Node(NodeName("n"), gpus)])
    s.set_flavor(flavor_from_manifest("a10", {"gpuProducts": ["NVIDIA-A10"]}))
    groups = [{"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "a10", "resources": [
        {"name": "nvidia.com/gpu", "nominalQuota": 1, "borrowingLimit": 1, "lendingLimit": "500m"}]}]}]
    s.set_queue(queue_from_manifest("q", {"namespaceSelector": {}, "cohort": "org", "resourceGroups": groups}))

    def task(name: str, gib: int, created: float) -> Task:
        return Task(TaskKey(f"ns/{name}"), "q", GpuRequest(1, memory_mib=gib * GIB), created=created)

    s.submit(task("fits", 10, 0))
    s.submit(task("later", 20, 1))  # 2 x 10Gi + 20Gi: quota (1 GPU, nothing to borrow) stops it: active
    s.submit(task("huge", 40, 2))  # no GPU has 40Gi: inadmissible
    s.cycle(0.0)
    metrics = OperatorMetrics()
    metrics.latency.labels("q").observe(1.5)
    metrics.refresh(s)
    sample = metrics.registry.get_sample_value
    flavor = {"queue": "q", "flavor": "a10", "resource": "nvidia.com/gpu"}
    assert {
        "nominal": sample("gputask_queue_nominal_quota", flavor),
        "borrowing": sample("gputask_queue_borrowing_limit", flavor),
        "lending": sample("gputask_queue_lending_limit", flavor),
        "active": sample("gputask_pending_tasks_by_status", {"queue": "q", "status": "active"}),
        "inadmissible": sample("gputask_pending_tasks_by_status", {"queue": "q", "status": "inadmissible"}),
        "used": sample("gputask_queue_flavor_usage", flavor),
        "reserved": [sample("gputask_gpu_memory_reserved_bytes", {"node": "n", "gpu": g}) for g in ("0", "1")],
        "free": [sample("gputask_gpu_memory_free_bytes", {"node": "n", "gpu": g}) for g in ("0", "1")],
        "latency": sample("gputask_admission_latency_seconds_count", {"queue": "q"}),
    } == {
        "nominal": 1.0, "borrowing": 1.0, "lending": 0.5, "active": 1.0, "inadmissible": 1.0, "used": 0.417,
        "reserved": [float(10 << 30), 0.0], "free": [float(14 << 30), float(24 << 30)], "latency": 1.0,
    }  # fmt: skip


def test_gpu_gauges_follow_changes_and_drop_nodes_gone() -> None:
    """Per-GPU gauges are set again only for nodes that changed, and a node removed takes its series along
    (label work in proportion to what changed, not to the cluster, on every refresh)."""
    def node(name: str, *gib: int) -> Node:
        return Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", "NVIDIA-A10", g * GIB) for i, g in enumerate(gib)))

    s = Scheduler(nodes=[node("a", 24, 24), node("b", 24)])
    s.set_queue(queue_from_manifest("q", {"namespaceSelector": {}, "resources": [
        {"name": "nvidia.com/gpu", "nominalQuota": 8}]}))
    metrics = OperatorMetrics()
    metrics.refresh(s)
    sample = metrics.registry.get_sample_value

    def free(name: str, gpu: str) -> float | None:
        return sample("gputask_gpu_memory_free_bytes", {"node": name, "gpu": gpu})

    assert (free("a", "0"), free("b", "0")) == (24 * GIB * 2**20, 24 * GIB * 2**20)
    s.submit(Task(TaskKey("ns/t"), "q", GpuRequest(1, memory_mib=10 * GIB), created=0))
    placed = [d for d in s.cycle(0.0) if hasattr(d, "placement")][0]
    s.remove_node(NodeName("b") if placed.placement.only().node == "a" else NodeName("a"))
    metrics.refresh(s)
    gone = "b" if placed.placement.only().node == "a" else "a"
    on = placed.placement.only().node
    frees = sorted(free(on, str(i)) or 0.0 for i in range(2 if on == "a" else 1))
    assert (free(gone, "0"), sample("gputask_node_gpu_memory_free_bytes", {"node": gone}), frees[0]) == (
        None, None, 14 * GIB * 2**20)


def test_defragmentation_moves_lost_work_and_waits_are_counted_and_each_plan_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After a cycle that moved two tasks (1 GPU each, run 100 s) for a task created at 10 s, moved at 100 s."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_core_defrag import BIG, cluster

    metrics = OperatorMetrics()
    s = cluster()
    s.submit(BIG)
    s.cycle(100.0)
    with caplog.at_level("INFO", logger="gputask.metrics"):
        metrics.refresh(s)
        metrics.refresh(s)  # nothing new: counted once
    registry = metrics.registry
    assert [registry.get_sample_value(n) for n in (
        "gputask_defrag_moves_total", "gputask_defrag_lost_work_gpu_hours_total",
        "gputask_defrag_waiting_task_wait_seconds_sum", "gputask_defrag_plans_refused_by_budget_total")] == [
        2.0, 200.0 / 3600.0, 90.0, 0.0]
    assert [r.getMessage() for r in caplog.records] == [
        "defragmentation for ns/big on a: moving ns/s1 (a to b), ns/s2 (a to b)"]
