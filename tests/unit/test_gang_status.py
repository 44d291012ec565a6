"""A gang's placement in a GPUTask's status: status.placement.pods, status.podsSummary and the message's words."""

from __future__ import annotations

from gputask.core import GpuRequest, GpuSlot, NodeName, Placement, PodPlacement, PodSet, Task, TaskKey
from gputask.k8s.records import ADMITTED, TaskRecord
from gputask.k8s.tasks import Transitions, describe, placement_status
from gputask.k8s.writer import Writer
from gputask.metrics import OperatorMetrics
from gputask.testing.fake import FakeKubeClient

TASK = Task.of_pod_sets(TaskKey("ml/ddp"), "q", (PodSet("launcher", 1, GpuRequest(1, memory_mib=1024)),
                                                  PodSet("workers", 2, GpuRequest(2))))
PLACEMENT = Placement((
    PodPlacement(NodeName("a"), (GpuSlot(0, "GPU-a0", 1024),)),
    PodPlacement(NodeName("a"), (GpuSlot(1, "GPU-a1", 24576), GpuSlot(2, "GPU-a2", 24576))),
    PodPlacement(NodeName("b"), (GpuSlot(0, "GPU-b0", 24576), GpuSlot(1, "GPU-b1", 24576))),
))


def test_a_gangs_status_placement_lists_each_pod_by_pod_set_and_index() -> None:
    """One {podSet, index, node, gpus} per pod in PodSet then index order; no single node."""
    assert placement_status(PLACEMENT, TASK) == {"pods": [
        {"podSet": "launcher", "index": 0, "node": "a", "gpus": [{"index": 0, "uuid": "GPU-a0", "memory": 1024}]},
        {"podSet": "workers", "index": 0, "node": "a", "gpus": [{"index": 1, "uuid": "GPU-a1", "memory": 24576},
                                                                {"index": 2, "uuid": "GPU-a2", "memory": 24576}]},
        {"podSet": "workers", "index": 1, "node": "b", "gpus": [{"index": 0, "uuid": "GPU-b0", "memory": 24576},
                                                                {"index": 1, "uuid": "GPU-b1", "memory": 24576}]},
    ]}  # fmt: skip


def test_a_one_pod_placement_keeps_todays_node_and_gpus() -> None:
    """A one-pod task's status.placement is still {node, gpus}, and its message names the node and GPUs."""
    one = Placement.one(NodeName("a"), (GpuSlot(3, "GPU-a3", 12288),))
    assert (placement_status(one), describe(one)) == (
        {"node": "a", "gpus": [{"index": 3, "uuid": "GPU-a3", "memory": 12288}]}, "a GPUs [3] (12288 MiB each)")


def test_a_gangs_message_counts_its_pods_and_nodes() -> None:
    """The Admitted message of a gang says how many pods on which nodes."""
    assert describe(PLACEMENT) == "3 pods on 2 nodes (a, b)"


def test_status_carries_the_pods_summary_of_a_placed_task() -> None:
    """status.podsSummary (the Pods column) is `1x1 + 2x2 on 2 nodes` for the placed gang, unset before it is
    placed, `1x1 on 1 node` for a placed one-pod task; status.placement has pods for the gang only."""
    gang = TaskRecord(TaskKey("ml/ddp"), "u1", {}, task=TASK, phase=ADMITTED, placement=PLACEMENT)
    waiting = TaskRecord(TaskKey("ml/ddp"), "u1", {}, task=TASK)
    one = TaskRecord(TaskKey("ml/one"), "u2", {}, task=Task(TaskKey("ml/one"), "q", GpuRequest(1)), phase=ADMITTED,
                     placement=Placement.one(NodeName("a"), (GpuSlot(0, "GPU-a0", 24576),)))
    transitions = Transitions(Writer(FakeKubeClient(), OperatorMetrics(), leading=lambda: True))
    shown = [(s["podsSummary"], s["placement"] is not None and "pods" in s["placement"])
             for s in (transitions.status_of(r, "m") for r in (gang, waiting, one))]
    assert shown == [("1x1 + 2x2 on 2 nodes", True), (None, False), ("1x1 on 1 node", False)]
