"""``gputask explain``'s core (:func:`gputask.core.diagnose.diagnose`): what it reports, and that it changes nothing."""

from __future__ import annotations

from dataclasses import replace

from test_core_preemption import cq, running
from test_core_scheduler import node, task

from gputask.core import QueueSpec, Scheduler, TaskKey
from gputask.core.diagnose import PreemptionView, Victim, diagnose
from gputask.core.fit import Constraints, Taint
from gputask.core.model import Node, NodeName
from gputask.core.reasons import Wait


def make(*nodes: Node, queues: tuple[QueueSpec, ...] = ()) -> Scheduler:
    """A scheduler with ``nodes`` and ``queues`` (default: queue q with 8 GPUs, no preemption)."""
    s = Scheduler(nodes=nodes)
    for q in queues or (cq("q", gpus=8),):
        s.set_queue(q)
    return s


def test_preemption_plan_names_the_victims_and_leaves_the_state_alone() -> None:
    s = make(node("n1", 16), queues=(cq("q", gpus=8, within="LowerPriority"),))
    low = task("low", memory_gib=12, priority=0)
    running(s, low)
    high = task("high", memory_gib=12, priority=10, created=1.0)
    s.submit(high)
    before = (dict(s.running), list(s.pending), s.cluster.node(NodeName("n1")).reserved_mib[:])
    found = diagnose(s, TaskKey("ns/high"))
    assert (found.state, found.position, found.waiting_in_queue) == ("pending", 0, 1)
    assert found.flavors[0].preemption == PreemptionView((Victim("ns/low", "n1", 0, "q"),), node="n1")
    assert found.changes == ("memory: 8192 MiB more free on node n1 GPU 0 would let it in (when tasks there finish "
                             "or are preempted, held by ns/low)",
                             "request: gpuMemory 4096Mi or less (per GPU) fits node n1 now")
    assert (dict(s.running), list(s.pending), s.cluster.node(NodeName("n1")).reserved_mib) == before
    assert [type(d).__name__ for d in s.cycle(2.0)] == ["Evict", "Pending"]  # the cycle does what explain said


def test_no_candidate_says_why() -> None:
    s = make(node("n1", 16), queues=(cq("q", gpus=8, within="LowerPriority"),))
    running(s, task("peer", memory_gib=12, priority=5))
    s.submit(task("same", memory_gib=12, priority=5, created=1.0))
    view = diagnose(s, TaskKey("ns/same")).flavors[0].preemption
    assert view == PreemptionView(why_not="no running task it may preempt: none of the 1 running in 'q' has lower "
                                          "priority than 5")


def test_whole_gpu_task_counts_idle_gpus_and_a_cpu_bound_node_names_the_cpu() -> None:
    s = make(node("n1", 16, 16))
    running(s, task("one", memory_gib=1))
    s.submit(task("two", count=2, created=1.0))
    assert diagnose(s, TaskKey("ns/two")).changes == (
        "memory: 1 more idle GPU on node n1 would let it in (or ask for gpuMemory instead of whole GPUs, to share)",)
    t = make(replace(node("n2", 16), cpu_milli=4000))
    t.submit(replace(task("cpu", memory_gib=1), cpu_milli=6000))
    assert diagnose(t, TaskKey("ns/cpu")).changes == ("request: cpu 4000m or less fits node n2 now",)


def test_taint_and_selector_changes_are_checked_on_the_node_they_name() -> None:
    tainted = replace(node("gpu-t", 16), taints=(Taint("dedicated", "infer", "NoSchedule"),))
    labelled = replace(node("gpu-l", 16), labels=(("pool", "b"),))
    s = make(tainted, labelled)
    s.submit(replace(task("picky", memory_gib=4), constraints=Constraints(node_selector=(("pool", "a"),))))
    found = diagnose(s, TaskKey("ns/picky"))
    assert [(n.node, n.refusals) for n in found.flavors[0].nodes] == [
        ("gpu-l", ("NodeAffinity: did not match nodeSelector",)),
        ("gpu-t", ("TaintToleration: had untolerated taint {dedicated: infer}",)),
    ]
    assert found.changes == ("selector: node gpu-l would take it now if its nodeSelector/affinity allowed it",)


def test_gate_unknown_and_admitted() -> None:
    s = make(node("n1", 16), queues=(replace(cq("q", gpus=8), stop_policy="Hold"),))
    s.submit(task("held", memory_gib=1))
    found = diagnose(s, TaskKey("ns/held"))
    assert (found.gate, found.flavors, found.changes) == (
        Wait("QueueHeld", "GPUClusterQueue 'q' is stopped (Hold)"), (),
        ("QueueHeld: GPUClusterQueue 'q' is stopped (Hold)",))
    assert diagnose(s, TaskKey("ns/none")).state == "unknown"
    t = make(node("n1", 16))
    running(t, task("in", memory_gib=1))
    assert (diagnose(t, TaskKey("ns/in")).state, diagnose(t, TaskKey("ns/in")).node) == ("admitted", "n1")


def test_a_task_no_node_could_ever_hold_is_told_so_and_never_fits_now() -> None:
    s = make(node("n1", 16, 8))
    s.submit(task("two-big", count=2, memory_gib=10))
    found = diagnose(s, TaskKey("ns/two-big"))
    assert (found.flavors[0].ever, found.flavors[0].fits_now, found.changes) == (False, False, (
        "request: gpuMemory 8192Mi or less (per GPU) fits node n1 now",))
    s.submit(task("products", memory_gib=1, products=("NVIDIA-H100",), created=1.0))
    assert diagnose(s, TaskKey("ns/products")).changes == (
        "cluster: no node could ever hold it (it needs a GPU of ['NVIDIA-H100'], 1024 MiB free, on one node that "
        "its taints and selector allow): add such a node, or ask for fewer GPUs or less memory per GPU",)
