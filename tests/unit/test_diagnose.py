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
        "memory: 1 more idle GPU on node n1 would let it in (when tasks there finish or are preempted, held by "
        "ns/one)",)
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
        ("queue: set spec.stopPolicy: None on its GPUClusterQueue to resume admission (GPUClusterQueue 'q' is "
         "stopped (Hold))",))
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


def test_quota_is_judged_on_the_card_a_node_would_charge() -> None:
    """From a trial: the least charge (over the largest card) fitted the 250m left, the L4 it must land on
    charges 334m; explain said "fits now" while the operator said QuotaExceeded. Now the node says its charge
    exceeds the quota, and the change names what is missing on that card."""
    big = replace(node("big", 40), labels=(("pool", "a"),))
    small = replace(node("small", 24, product="NVIDIA-L4"), labels=(("pool", "b"),))
    s = make(big, small, queues=(replace(cq("q", gpus=1)),))
    running(s, replace(task("first", memory_gib=30), constraints=Constraints(node_selector=(("pool", "a"),))))
    s.submit(replace(task("on-b", memory_gib=8, created=1.0), constraints=Constraints(node_selector=(("pool", "b"),))))
    found = diagnose(s, TaskKey("ns/on-b"))
    view = found.flavors[0]
    assert (view.fits_now, [(n.node, n.fits, n.quota) for n in view.nodes], view.quota[0].needs,
            view.quota[0].left) == (False, [("big", False, None), ("small", True, "nvidia.com/gpu")], 334, 250)
    assert found.changes == ("quota: GPUClusterQueue 'q' needs 84m GPU more of nvidia.com/gpu (raise nominalQuota "
                             "or borrowingLimit, or wait for its running tasks to finish)",
                             "request: gpuMemory 6144Mi or less (per GPU) fits the quota left, on node small")
    assert [type(d).__name__ for d in s.cycle(2.0)] == ["Pending"]  # the cycle agrees: it waits
    s.pending.discard(TaskKey("ns/on-b"))  # as suggested: 6144Mi on the L4 charges the 250m left
    s.submit(replace(task("on-b", created=1.0), request=replace(task("x").request, memory_mib=6144),
                     constraints=Constraints(node_selector=(("pool", "b"),))))
    assert [(type(d).__name__, getattr(d, "placement", None) and d.placement.only().node) for d in s.cycle(3.0)] == [
        ("Admit", "small")]


def test_a_node_side_change_says_when_quota_must_grow_too() -> None:
    tainted = replace(node("t", 16), taints=(Taint("dedicated", "infer", "NoSchedule"),))
    s = make(node("a", 16), tainted, queues=(cq("q", gpus=1),))
    running(s, task("holder", memory_gib=16))
    s.submit(task("wants", memory_gib=12, created=1.0))
    assert diagnose(s, TaskKey("ns/wants")).changes == (
        "quota: GPUClusterQueue 'q' needs 750m GPU more of nvidia.com/gpu (raise nominalQuota or borrowingLimit, "
        "or wait for its running tasks to finish); not enough alone: no node has room for it now (see below)",
        "memory: 12288 MiB more free on node a GPU 0 would let it in (when tasks there finish or are preempted, "
        "held by ns/holder)",
        "taint: tolerating dedicated=infer:NoSchedule would let it onto node t now; not enough alone: "
        "GPUClusterQueue 'q' also needs 750m GPU more of nvidia.com/gpu",
    )


def test_a_multi_gpu_task_behind_a_whole_gpu_holder_is_told_who_holds_it() -> None:
    s = make(node("n", 16, 8))
    running(s, task("whole", count=1))
    s.submit(task("pair", count=2, memory_gib=6, created=1.0))
    changes = diagnose(s, TaskKey("ns/pair")).changes
    assert changes[0].startswith("memory: 6144 MiB more free on node n GPUs 0, 1 would let it in") and (
        "held by ns/whole" in changes[0]), changes


def test_position_changes_are_reported_for_the_tracked_heads_only() -> None:
    """Pending decisions carry a queue position; when the queue moves, only tasks now among the first
    ``tracked_positions`` get a new decision (a status write) for the new position alone."""
    s = Scheduler(nodes=[node("n", 16)], tracked_positions=2)
    s.set_queue(cq("q", gpus=1))
    running(s, task("holder", memory_gib=16))
    for i in range(4):
        s.submit(task(f"w{i}", memory_gib=16, created=1.0 + i))
    first = [(d.task.key, d.position) for d in s.cycle(2.0)]
    assert first == [("ns/w0", 0), ("ns/w1", 1), ("ns/w2", 2), ("ns/w3", 3)]  # new reasons: all reported
    s.finish(TaskKey("ns/w0"))  # w0 gone (deleted): everyone moves up one
    assert [(d.task.key, d.position) for d in s.cycle(3.0)] == [("ns/w1", 0), ("ns/w2", 1)]


def test_a_one_gpu_task_needs_at_most_one_gpu_of_quota() -> None:
    """A 1-GPU task asking more memory than the largest GPU has needs at most 1000 milli-GPU, never more."""
    s = make(node("n1", 24))
    s.submit(task("huge", memory_gib=40))
    lines = diagnose(s, TaskKey("ns/huge")).flavors[0].quota
    assert [(line.resource, line.needs, line.unit) for line in lines] == [("nvidia.com/gpu", 1000, "milli-GPU")]
