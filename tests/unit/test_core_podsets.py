"""Tasks of several pods (PodSets): placed all or nothing, charged the sum, freed whole (issue 29)."""

from __future__ import annotations

import pytest

from gputask.core import (
    GPU,
    GPU_MEMORY,
    Admit,
    ClusterState,
    Gpu,
    GpuRequest,
    GpuSlot,
    Node,
    NodeName,
    OverCommitError,
    Placement,
    PodPlacement,
    PodSet,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
    find_placement,
    make_policy,
)
from gputask.core.quota import Preemption
from gputask.core.scheduler import Evict

GIB = 1024  # MiB


def node(name: str, *gib: int, pods: int | None = None) -> Node:
    """A node whose GPUs 0..n-1 have the given sizes in GiB and uuids ``<name>-<index>``."""
    return Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", "NVIDIA-A10", g * GIB) for i, g in enumerate(gib)),
                pods=pods)


def pod(name: str, node_name: str, *slots: tuple[int, int]) -> PodPlacement:
    """One pod's placement on ``node_name`` of (index, MiB) slots."""
    del name  # the PodSet a pod belongs to is its position; the name only documents the test
    return PodPlacement(NodeName(node_name), tuple(GpuSlot(i, f"{node_name}-{i}", m) for i, m in slots))


def gang(name: str, *sets: tuple[str, int, GpuRequest], priority: int = 0, cpu: int = 0) -> Task:
    """A task of PodSets ``(name, count, per-pod request)`` in queue ``q``."""
    pod_sets = tuple(PodSet(n, c, r, cpu_milli=cpu) for n, c, r in sets)
    return Task.of_pod_sets(TaskKey(f"ns/{name}"), "q", pod_sets, priority=priority)


def scheduler(nodes: list[Node], *, within: str = "Never") -> Scheduler:
    """A best-fit scheduler with one queue ``q`` and no quota limit."""
    s = Scheduler(nodes=nodes, policy=make_policy("bestfit"))
    s.set_queue(QueueSpec("q", preemption=Preemption(within_cluster_queue=within)))
    return s


def reserved(cluster: ClusterState) -> dict[str, list[int]]:
    """MiB reserved per GPU, per node."""
    return {state.name: list(state.reserved_mib) for state in cluster}


WHOLE = GpuRequest(1)


def test_a_task_of_two_podsets_is_placed_pod_by_pod_in_podset_order_and_pods_share_a_node() -> None:
    """Launcher then workers, each pod seeing the GPUs the earlier pods took: best fit puts the launcher on the
    2-GPU node; the two workers go together on the node that takes both (fewest nodes first, issue 30), not
    one on each node."""
    cluster = ClusterState([node("a", 24, 24), node("b", 24, 24, 24)])
    t = gang("train", ("launcher", 1, WHOLE), ("workers", 2, GpuRequest(1, memory_mib=20 * GIB)))
    outcome = find_placement(cluster, t, make_policy("bestfit"))
    assert (outcome.placement, reserved(cluster)) == (
        Placement((
            pod("launcher", "a", (0, 24 * GIB)),
            pod("worker-0", "b", (0, 20 * GIB)),
            pod("worker-1", "b", (1, 20 * GIB)),
        )),
        {"a": [0, 0], "b": [0, 0, 0]},  # a search reserves nothing
    )


def test_a_task_one_pod_of_which_cannot_fit_gets_no_placement_and_holds_nothing() -> None:
    """Three whole-GPU pods on two free GPUs: no placement, fits_somewhere False, and the cycle admits
    nothing, charges nothing and reserves nothing."""
    t = gang("big", ("workers", 3, WHOLE))
    s = scheduler([node("a", 24), node("b", 24)])
    s.submit(t)
    outcome = find_placement(s.cluster, t, s.policy)
    decisions = s.cycle()
    assert (outcome.placement, outcome.fits_somewhere, [type(d).__name__ for d in decisions], dict(s.running),
            s.quotas.usage.get("q", {}), reserved(s.cluster)) == (
        None, False, ["Pending"], {}, {}, {"a": [0], "b": [0]},
    )


def test_quota_charges_the_sum_over_every_pod() -> None:
    """Two pods of 12Gi on 24Gi GPUs: 500 milli-GPU each, 1000 and 24Gi in all, in the Admit and the queue."""
    t = gang("pair", ("workers", 2, GpuRequest(1, memory_mib=12 * GIB)))
    s = scheduler([node("a", 24), node("b", 24)])
    s.submit(t)
    placement = Placement((pod("w0", "a", (0, 12 * GIB)), pod("w1", "a", (0, 12 * GIB))))
    charged = {GPU: 1000, GPU_MEMORY: 24 * GIB}
    assert (s.cycle(), s.quotas.usage["q"]) == ([Admit(t, placement, charged)], charged)


def test_a_quota_left_for_one_pod_but_not_both_admits_neither() -> None:
    """2 GPUs of quota, one used by a running task: the pair waits on quota as a whole (QuotaExceeded), nothing
    of it is reserved or charged; alone in a 1-GPU queue it could never fit (Inadmissible)."""
    t = gang("pair", ("workers", 2, WHOLE))
    s = Scheduler(nodes=[node("a", 24, 24, 24)], policy=make_policy("bestfit"))
    s.set_queue(QueueSpec("q", quotas={GPU: ResourceQuota(2000)}))
    s.submit(Task(TaskKey("ns/one"), "q", WHOLE))
    s.cycle()
    s.submit(t)
    waits = [(type(d).__name__, str(getattr(d, "reason", ""))) for d in s.cycle(1.0)]
    small = Scheduler(nodes=[node("a", 24, 24)], policy=make_policy("bestfit"))
    small.set_queue(QueueSpec("q", quotas={GPU: ResourceQuota(1000)}))
    small.submit(t)
    never = [(type(d).__name__, str(getattr(d, "reason", ""))) for d in small.cycle()]
    assert (waits, s.quotas.usage["q"][GPU], reserved(s.cluster), never) == (
        [("Pending", "QuotaExceeded")], 1000, {"a": [24 * GIB, 0, 0]}, [("Pending", "Inadmissible")],
    )


def test_reserving_a_task_whose_later_pod_over_commits_changes_nothing() -> None:
    """All or nothing in the cluster state too: the second pod's GPU is taken, so OverCommitError and the
    first pod's reservation is undone."""
    cluster = ClusterState([node("a", 24), node("b", 24)])
    cluster.reserve(Task(TaskKey("ns/other"), "q", WHOLE), Placement.one(NodeName("b"), (GpuSlot(0, "b-0", 24 * GIB),)))
    t = gang("pair", ("workers", 2, WHOLE))
    before = (reserved(cluster), {s.name: (dict(s.tasks), s.pods_used) for s in cluster})
    with pytest.raises(OverCommitError):
        cluster.reserve(t, Placement((pod("w0", "a", (0, 24 * GIB)), pod("w1", "b", (0, 24 * GIB)))))
    assert (reserved(cluster), {s.name: (dict(s.tasks), s.pods_used) for s in cluster}) == before


def test_a_failed_node_evicts_a_task_with_one_pod_there_and_frees_every_pod() -> None:
    """One pod on a, one on b; b fails: the task is evicted (NodeFailure) and requeued, and a's GPU is free
    again once the departing hold is gone."""
    t = gang("pair", ("workers", 2, WHOLE))
    s = scheduler([node("a", 24), node("b", 24)])
    s.submit(t)
    [admit] = s.cycle()
    s.node_failed(NodeName("b"), "out-of-service")
    decisions = s.cycle(1.0)
    evicts = [d for d in decisions if isinstance(d, Evict)]
    for e in evicts:
        if e.held is not None:
            s.finish(e.held)  # its pods are gone
    assert (admit.placement.nodes, [(e.task.key, e.reason) for e in evicts], dict(s.running),
            reserved(s.cluster), t.key in [p.key for p in s.pending]) == (
        ("a", "b"), [(t.key, "NodeFailure")], {}, {"a": [0], "b": [0]}, True,
    )


def test_preempting_a_task_of_several_pods_frees_all_of_its_pods() -> None:
    """A low-priority pair holds a's and b's only GPUs; a high-priority one-GPU task preempts the pair whole:
    once its pods are gone both GPUs are free and the preemptor runs on one of them."""
    low = gang("low", ("workers", 2, WHOLE))
    s = scheduler([node("a", 24), node("b", 24)], within="LowerPriority")
    s.submit(low)
    s.cycle()
    high = Task(TaskKey("ns/high"), "q", WHOLE, priority=10)
    s.submit(high)
    decisions = s.cycle(1.0)
    evicts = [d for d in decisions if isinstance(d, Evict)]
    for e in evicts:
        if e.held is not None:
            s.finish(e.held)
    s.victim_gone(low.key)
    admitted = [d for d in s.cycle(2.0) if isinstance(d, Admit)]
    assert ([(e.task.key, e.reason, e.placement.nodes) for e in evicts], [(d.task.key, d.placement.nodes)
            for d in admitted], reserved(s.cluster)) == (
        [(low.key, "Preempted", ("a", "b"))], [(high.key, ("a",))], {"a": [24 * GIB], "b": [0]},
    )


def test_a_multi_pod_preemptor_evicts_what_blocks_one_of_its_pods() -> None:
    """A high-priority pair needs both GPUs; the one-GPU task on a is preempted and the pair is nominated to a
    and b (gang preemption, issue 30)."""
    one = Task(TaskKey("ns/one"), "q", WHOLE)
    s = scheduler([node("a", 24), node("b", 24)], within="LowerPriority")
    s.submit(one)
    s.cycle()
    s.submit(gang("pair", ("workers", 2, WHOLE), priority=10))
    assert [(type(d).__name__, str(getattr(d, "reason", ""))) for d in s.cycle(1.0)] == [
        ("Evict", "Preempted"), ("Pending", "Preempting")]


def test_a_node_pod_limit_counts_pods_not_tasks() -> None:
    """A node that takes one more pod takes one pod of a pair, not both, though its GPUs could take both: the
    second pod goes elsewhere."""
    cluster = ClusterState([node("a", 24, 24, pods=1), node("b", 24)])
    t = gang("pair", ("workers", 2, WHOLE))
    placement = find_placement(cluster, t, make_policy("bestfit")).placement
    assert placement is not None
    cluster.reserve(t, placement)
    assert ([p.node for p in placement.pods], {s.name: s.pods_used for s in cluster}) == (["b", "a"], {"a": 1, "b": 1})


def test_podsets_need_unique_names_and_a_positive_count() -> None:
    """A repeated PodSet name or a count of 0 is refused when the task is built."""
    with pytest.raises(ValueError):
        gang("bad", ("w", 1, WHOLE), ("w", 1, WHOLE))
    with pytest.raises(ValueError):
        gang("bad", ("w", 0, WHOLE))
