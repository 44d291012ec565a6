"""The operator's reading of who uses which GPU: exact device-plugin GPUs, exact foreign memory, memory budgets."""

from __future__ import annotations

from typing import Any

from test_foreign import container, pod

from gputask.core import Gpu, GpuRequest, GpuSlot, Node, NodeName, Placement, Scheduler, Task, TaskKey
from gputask.core.budget import EVICT, MemoryBudget, Overuse, overuse_text, overuses
from gputask.core.scheduler import Evict, Fail
from gputask.k8s.foreign import ForeignPods, GpuClaim
from gputask.k8s.usage import DeviceReport, device_report, foreign_mib, pod_memory, sound_pod_memory

NODE = Node(NodeName("node-a"), tuple(Gpu(i, f"GPU-{i}", "NVIDIA-A10", 24576) for i in range(4)))


def test_the_agents_report_is_read_and_malformed_entries_skipped() -> None:
    """podResources gives each pod's GPUs by (namespace, name); gpus[].pods gives MiB per pod uid; a GPU without
    pods is unknown, malformed entries are skipped, an agent that reports nothing is 'not reported'."""
    status: dict[str, Any] = {
        "podResources": {"available": True, "reason": "Listed", "message": "m", "pods": [
            {"namespace": "ml", "name": "infer", "gpus": ["GPU-1", 7], "deviceIDs": ["GPU-1::0"]},
            {"namespace": "ml"}, "junk"]},
        "gpus": [{"index": 0, "pods": [{"uid": "u1", "memoryUsed": "1536Mi"}, {"uid": "u2", "memoryUsed": "x"},
                                       {"memoryUsed": "1Gi"}]},
                 {"index": 1},
                 {"index": 2, "pods": []},
                 {"index": True, "pods": []}],
    }
    assert (device_report(status), device_report({}), pod_memory(status), pod_memory(None)) == (
        DeviceReport(True, "Listed", "m", {("ml", "infer"): ("GPU-1",)}),
        DeviceReport(None),
        {0: {"u1": 1536}, 2: {}},
        {},
    )


def test_foreign_memory_counts_other_pods_in_full_once_ours_is_known() -> None:
    """Without the split, used less reserved (an idle reservation hides others' use); with it, others' use in
    full plus our overflow, less the tolerance."""
    cases = [
        dict(used_mib=12000, reserved_mib=10000, ours_mib=None, tolerance_mib=1000),  # old rule: 1000 hidden
        dict(used_mib=12000, reserved_mib=10000, ours_mib=2000, tolerance_mib=1000),  # others use 10000
        dict(used_mib=12000, reserved_mib=10000, ours_mib=10500, tolerance_mib=1000),  # ours within: as before
        dict(used_mib=16000, reserved_mib=10000, ours_mib=16000, tolerance_mib=1000),  # our overflow counts
        dict(used_mib=500, reserved_mib=0, ours_mib=0, tolerance_mib=1000),
    ]
    assert [foreign_mib(**c) for c in cases] == [1000, 9000, 1000, 5000, 0]


def test_device_plugin_pods_hold_the_gpus_the_kubelet_gave_them() -> None:
    """With the kubelet's report a pod holds exactly its GPUs of this node (even for resources the count rule
    ignores); a pod bound after the report, or reported with no GPU of this node (an ID the agent could not
    resolve, or another node's GPU), keeps its count; without the report the count rule applies."""
    index = ForeignPods()
    index.on_pod(pod("counted", containers=[container(gpus=2)]))
    index.on_pod(pod("late", containers=[container(gpus=1)]))
    index.on_pod(pod("shared", containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": 1}}}]))
    index.on_pod(pod("elsewhere", containers=[container(gpus=1)]))
    index.on_pod(pod("lying", containers=[container(gpus=1)]))
    exact = {("default", "counted"): ("GPU-3", "GPU-1"), ("default", "shared"): ("GPU-2",),
             ("default", "elsewhere"): (), ("default", "lying"): ("GPU-of-node-b",), ("default", "gone"): ("GPU-0",)}
    uuids = {g.uuid for g in NODE.gpus}
    claims = index.claims_on("node-a", exact, uuids)
    assert (claims, index.claims_on("node-a")) == (
        [GpuClaim(devices=("GPU-3", "GPU-1")), GpuClaim(count=1), GpuClaim(count=1), GpuClaim(count=1),
         GpuClaim(devices=("GPU-2",))],
        [GpuClaim(count=2), GpuClaim(count=1), GpuClaim(count=1), GpuClaim(count=1)],
    )


# -- memory budgets in the core ----------------------------------------------------------------


def placed(*slots: tuple[int, int]) -> Placement:
    """A placement on node-a with (index, MiB) slots."""
    return Placement.one(NodeName("node-a"), tuple(GpuSlot(i, f"GPU-{i}", mib) for i, mib in slots))


def test_overuse_is_use_beyond_the_reservation_and_the_tolerance_on_each_gpu() -> None:
    """Per GPU: within budget plus tolerance is fine; beyond it is an overuse; a GPU outside the placement has
    budget 0; the message names each GPU."""
    found = overuses(placed((0, 8192), (1, 8192)).only(), {0: 9000, 1: 9300, 3: 700}, 1024)
    assert (found, overuse_text(found, 1024)) == (
        (Overuse("node-a", 1, "GPU-1", 9300, 8192),),
        "node-a GPU 1 (GPU-1): 9300 MiB used, budget 8192 MiB (+1024 MiB tolerance)",
    )
    assert overuses(placed((0, 8192)).only(), {2: 2000}, 1024) == (Overuse("node-a", 2, "", 2000, 0),)


def scheduler_with_running_task(action: str, max_reschedules: int = 3) -> tuple[Scheduler, Task]:
    """A scheduler with one 8 GiB task admitted on node-a GPU 0 and the given budget action."""
    scheduler = Scheduler(nodes=[NODE], memory_budget=MemoryBudget(action, 512))
    task = Task(TaskKey("ml/train"), "q", GpuRequest(count=1, memory_mib=8192), created=1.0,
                max_reschedules=max_reschedules)
    scheduler.restore(task, placed((0, 8192)), 1.0)
    return scheduler, task


def test_warn_only_reports_and_evict_evicts_counted_against_max_reschedules() -> None:
    """Warn judges without deciding; Evict emits an Evict (GPUMemoryExceeded) at the next cycle and, past
    maxReschedules, a Fail; a task that is not running is not judged."""
    warn, _ = scheduler_with_running_task("Warn")
    found = warn.memory_used(TaskKey("ml/train"), {0: 9000})
    evict, task = scheduler_with_running_task(EVICT, max_reschedules=0)
    evict.memory_used(TaskKey("ml/train"), {0: 9000})
    decisions = evict.cycle(2.0)
    message = "uses more GPU memory than it reserved: node-a GPU 0 (GPU-0): 9000 MiB used, budget 8192 MiB " \
              "(+512 MiB tolerance)"
    assert (found, warn.cycle(2.0), [type(d) for d in decisions], decisions[0].reason, decisions[0].message,
            decisions[1], evict.memory_used(TaskKey("ml/train"), {0: 9000})) == (
        (Overuse("node-a", 0, "GPU-0", 9000, 8192),),
        [],
        [Evict, Fail],
        "GPUMemoryExceeded",
        message,
        Fail(task, "MaxReschedulesExceeded", f"{message}; rescheduled 0 times already"),
        None,
    )


def test_pod_memory_is_believed_only_on_accepted_gpus_outside_mig_mode_and_within_their_memory() -> None:
    """Figures for a GPU the operator refused (absent from the node), for a GPU in MIG mode (aggregates of its
    MIG devices) or adding up to more than the GPU holds are not used; the last is said as an error."""
    node = Node(NodeName("node-m"), (
        Gpu(0, "GPU-0", "NVIDIA-A100", 40960, healthy=False),  # in MIG mode
        Gpu(1, "GPU-1", "NVIDIA-A100", 40960),
        Gpu(2, "GPU-2", "NVIDIA-A100", 40960),
        Gpu(100, "MIG-a", "NVIDIA-A100-MIG-1g.5gb", 4864),
    ))
    split = {0: {"u": 3072}, 1: {"u": 40000, "v": 2000}, 2: {"u": 100}, 3: {"u": 1}, 100: {"u": 3072}}
    assert sound_pod_memory(split, node) == (
        {2: {"u": 100}, 100: {"u": 3072}},
        ["GPU 1: its pods' memory (42000 MiB) is more than the GPU's (40960 MiB); not used for memory budgets"],
    )
