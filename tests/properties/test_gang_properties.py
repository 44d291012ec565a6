"""Gangs under random clusters, arrivals, finishes and preemptions (issue 30): after every cycle an independent
recount finds every admitted or nominated gang's pods feasible together (every pod on a node, on distinct GPUs
free of any other pod, inside one domain of a required topology) and charged together, and no pending task holds
anything (no partial hold survives a cycle)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gputask.core import (
    GPU,
    Gpu,
    GpuRequest,
    Node,
    NodeName,
    PodSet,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
    make_policy,
)
from gputask.core.quota import Preemption
from gputask.core.scheduler import Evict

RACK = "example.com/rack"
PROPERTY = settings(max_examples=120, deadline=None)


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    """2-6 nodes of 1-4 GPUs, in rack r0 or r1 or in none."""
    out = []
    for n in range(draw(st.integers(2, 6))):
        rack = draw(st.sampled_from((None, "r0", "r1")))
        gpus = tuple(Gpu(i, f"n{n}-{i}", "H100", 80 * 1024) for i in range(draw(st.integers(1, 4))))
        out.append(Node(NodeName(f"n{n}"), gpus, labels=() if rack is None else ((RACK, rack),)))
    return out


@st.composite
def tasks(draw: st.DrawFn, number: int) -> Task:
    """A one-pod task or a gang of 1-2 PodSets of 1-4 pods of 1-2 whole GPUs, maybe with a rack topology."""
    priority = draw(st.integers(0, 3))
    key = TaskKey(f"ns/t{number}")
    if draw(st.booleans()):
        return Task(key, "q", GpuRequest(draw(st.integers(1, 2))), priority=priority, created=float(number))
    sets = tuple(PodSet(f"s{i}", draw(st.integers(1, 4)), GpuRequest(draw(st.integers(1, 2))))
                 for i in range(draw(st.integers(1, 2))))
    topology = draw(st.sampled_from(("none", "required", "preferred")))
    return Task.of_pod_sets(key, "q", sets, priority=priority, created=float(number),
                            topology_required=RACK if topology == "required" else None,
                            topology_preferred=RACK if topology == "preferred" else None)


def check(s: Scheduler, nodes: dict[str, Node], quota: int) -> None:
    """The independent recount (module doc); ``quota``: the queue's milli-GPU."""
    entries = {**s.running, **s.nominated}
    taken: Counter[tuple[str, int]] = Counter()
    charged: Counter[str] = Counter()
    for key, entry in entries.items():
        task, pods = entry.task, entry.placement.pods
        assert len(pods) == task.pod_count, key
        for shape, placed in zip(task.pods, pods, strict=True):
            indices = [slot.index for slot in placed.gpus]
            assert len(indices) == len(set(indices)) == shape.request.count, key
            assert set(indices) <= {g.index for g in nodes[placed.node].gpus}, key
            taken.update((placed.node, i) for i in indices)
        if task.topology_required is not None:
            racks = {dict(nodes[p.node].labels).get(RACK) for p in pods}
            assert len(racks) == 1 and None not in racks, (key, racks)
        charged[task.queue] += 1000 * sum(p.request.count for p in task.pods)
    for held in s.ledger.held.values():
        taken.update((p.node, slot.index) for p in held.pods for slot in p.gpus)
    assert max(taken.values(), default=0) <= 1, taken  # whole GPUs: one pod each
    assert s.quotas.usage.get("q", {}).get(GPU, 0) == charged["q"] <= quota
    reserved = set(s.cluster.reservations())
    assert reserved == set(entries) | set(s.ledger.held), (reserved, set(entries))
    assert not {t.key for t in s.pending} & reserved  # no pending task holds anything
    assert sum(st_.pods_used for st_ in s.cluster) == sum(len(e.placement.pods) for e in entries.values()) + sum(
        len(h.pods) for h in s.ledger.held.values())


@PROPERTY
@given(clusters(), st.data())
def test_admitted_gangs_are_feasible_together_charged_together_and_nothing_partial_is_held(
    cluster: list[Node], data: st.DataObject
) -> None:
    """Random arrivals, finishes and preemptions: the recount holds after every cycle (module doc)."""
    s = Scheduler(nodes=cluster, policy=make_policy(data.draw(st.sampled_from(("bestfit", "packing", "firstfit")))))
    quota = data.draw(st.integers(4, 12)) * 1000
    s.set_queue(QueueSpec("q", quotas={GPU: ResourceQuota(quota)},
                          preemption=Preemption(within_cluster_queue="LowerPriority")))
    nodes = {n.name: n for n in cluster}
    now = 0.0
    for step in range(data.draw(st.integers(1, 8))):
        now += 1.0
        if s.running and data.draw(st.booleans()):
            s.finish(data.draw(st.sampled_from(sorted(s.running))))
        for number in range(data.draw(st.integers(0, 2))):
            s.submit(data.draw(tasks(step * 10 + number)))
        for decision in s.cycle(now):
            if isinstance(decision, Evict):
                if decision.held is not None:
                    s.finish(decision.held)
                if decision.by is not None:
                    s.victim_gone(decision.task.key)
        check(s, nodes, quota)
