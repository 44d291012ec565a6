"""Tasks of several pods under random clusters: what a trial copy of the cluster predicts is what the
scheduler admits and charges, and the books agree with an independent recount (issue 29).

The trial is :meth:`ClusterState.copy` (the cluster the placement of a task of several pods is searched on);
each step predicts a random task's placement and charge there, then submits it to the live scheduler and
runs a cycle: the decision must be exactly the prediction, and nothing of a refused task may stay.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gputask.core import (
    GPU,
    GPU_MEMORY,
    Admit,
    Gpu,
    GpuRequest,
    Node,
    NodeName,
    Pending,
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
from gputask.core.cluster import ClusterState, NodeState
from gputask.core.quota import Usage, placement_usage, usage_of

GIB = 1024  # MiB
PROPERTY = settings(max_examples=150, deadline=None)


@st.composite
def nodes(draw: st.DrawFn) -> list[Node]:
    """1-5 nodes of 1-4 GPUs of 8/16/24 GiB, some with a pod limit and CPU tracked."""
    out = []
    for n in range(draw(st.integers(1, 5))):
        sizes = draw(st.lists(st.sampled_from((8 * GIB, 16 * GIB, 24 * GIB)), min_size=1, max_size=4))
        gpus = tuple(Gpu(i, f"node-{n}-{i}", "NVIDIA-A10", m) for i, m in enumerate(sizes))
        pods = draw(st.none() | st.integers(1, 4))
        cpu = draw(st.none() | st.sampled_from((4000, 8000)))
        out.append(Node(NodeName(f"node-{n}"), gpus, cpu_milli=cpu, pods=pods))
    return out


@st.composite
def pod_sets(draw: st.DrawFn) -> tuple[PodSet, ...]:
    """1-3 PodSets of 1-3 pods, each pod 0-2 whole GPUs or 1-2 GPUs of 4-12 GiB, and some CPU."""
    out = []
    for i in range(draw(st.integers(1, 3))):
        count = draw(st.integers(0, 2))
        mib = draw(st.none() | st.sampled_from((4 * GIB, 8 * GIB, 12 * GIB)))
        request = GpuRequest(max(count, 1) if mib is not None else count, memory_mib=mib)
        out.append(PodSet(f"set-{i}", draw(st.integers(1, 3)), request, cpu_milli=draw(st.sampled_from((0, 1000)))))
    return tuple(out)


def independent_usage(cluster: ClusterState, task: Task, admit: Admit) -> Usage:
    """The charge of ``admit`` counted here, GPU by GPU: each slot's MiB over its GPU's, rounded up."""
    milli = memory = 0
    for placed in admit.placement.pods:
        sizes = {g.index: g.memory_mib for g in cluster.node(placed.node).node.gpus}
        for slot in placed.gpus:
            milli += 1000 if slot.memory_mib >= sizes[slot.index] else -(-slot.memory_mib * 1000 // sizes[slot.index])
            memory += slot.memory_mib
    return {GPU: milli, GPU_MEMORY: memory}


@PROPERTY
@given(
    nodes(),
    st.lists(st.tuples(pod_sets(), st.booleans()), min_size=1, max_size=8),
    st.sampled_from(("bestfit", "firstfit", "packing")),
    st.none() | st.integers(1, 12).map(lambda g: g * 1000),
)
def test_a_trial_copy_predicts_admission_and_charge_and_the_books_recount(
    cluster_nodes: list[Node], steps: list[tuple[tuple[PodSet, ...], bool]], policy: str, quota: int | None
) -> None:
    """Each task of several PodSets is admitted exactly where the trial placed it and charged exactly the
    trial's sum over its pods (also counted independently), or waits holding nothing; after every step
    the reserved MiB per GPU, pods per node and queue usage equal a recount from the running tasks."""
    s = Scheduler(nodes=cluster_nodes, policy=make_policy(policy))
    s.set_queue(QueueSpec("q", quotas={} if quota is None else {GPU: ResourceQuota(quota)}))
    for n, (sets, finish_first) in enumerate(steps):
        if finish_first and s.running:
            s.finish(sorted(s.running)[0])
        task = Task.of_pod_sets(TaskKey(f"ns/t{n}"), "q", sets, created=float(n))
        trial = s.cluster.copy()
        before = {state.name: list(state.reserved_mib) for state in s.cluster}

        def memory_of(name: NodeName, trial: ClusterState = trial) -> dict[int, int]:
            return {g.index: g.memory_mib for g in trial.node(name).node.gpus}

        def total(placement: object, trial: ClusterState = trial) -> str | None:
            return s.quotas.refuses("q", placement_usage(placement, memory_of))  # type: ignore[arg-type]

        def one(state: NodeState, pod: PodPlacement) -> str | None:  # a task of one pod is judged per candidate
            return s.quotas.refuses("q", usage_of(pod, memory_of(state.name)))

        predicted = find_placement(trial, task, s.policy, quota=one, total_quota=total).placement
        assert {state.name: list(state.reserved_mib) for state in trial} == before  # the search reserved nothing
        s.submit(task)
        decisions = s.cycle(float(n))
        if predicted is None:
            assert [type(d) for d in decisions] == [Pending]
            s.finish(task.key)
        else:
            charge = placement_usage(predicted, memory_of)
            assert decisions == [Admit(task, predicted, charge)]
            assert charge == independent_usage(s.cluster, task, decisions[0])  # type: ignore[arg-type]
        _recount(s)


def _recount(s: Scheduler) -> None:
    """Reserved MiB per GPU, pods per node and the queue's usage, recounted from the running entries."""
    mib = {state.name: [0] * len(state.node.gpus) for state in s.cluster}
    pods = dict.fromkeys(mib, 0)
    usage: dict[str, int] = {}
    for entry in s.running.values():
        for placed in entry.placement.pods:
            state = s.cluster.node(placed.node)
            pods[placed.node] += 1
            for slot in placed.gpus:
                mib[placed.node][state.position[slot.index]] += slot.memory_mib
        for key, amount in entry.usage.items():
            usage[key] = usage.get(key, 0) + amount
    assert ({state.name: list(state.reserved_mib) for state in s.cluster}, {state.name: state.pods_used for state in
            s.cluster}, {k: v for k, v in s.quotas.usage.get("q", {}).items() if v}) == (
        mib, pods, {k: v for k, v in usage.items() if v})
    assert s.violations() == []
