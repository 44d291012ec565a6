"""A cycle's decisions carry everything it assumed: applied to a snapshot of the cache or to the cache itself, they
place and charge the same, and the snapshot leaves the cache as it was.

One cycle over random single-pod tasks on random nodes and queues decides (the cycle assumes its admissions in its
scheduler's cache); a second scheduler, fed the same nodes and queues, gets the decisions: first on a snapshot
(:class:`~gputask.core.snapshot.Trial`, what preemption trials run on), then on its cache. Reservations, per-node
accounting and quota usage must be the same in all three, and the second cache must not change while the snapshot
is written. (Multi-PodSet tasks come with the PodSet work.)
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_core_properties import QUEUES, nodes, queue_specs, requests

from gputask.core import (
    Admit,
    ClusterState,
    GpuRequest,
    Node,
    QueueSpec,
    QuotaBook,
    Scheduler,
    Task,
    TaskKey,
    make_policy,
)
from gputask.core.snapshot import Trial


def state(cluster: ClusterState, quotas: QuotaBook, names: list[str]) -> tuple[object, ...]:
    """What placing and charging change: each reservation's placement, each node's accounting, each queue's usage."""
    placements = {key: r.placement for key, r in sorted(cluster.reservations().items())}
    accounting = {}
    for name in names:
        s = cluster.node(name)  # type: ignore[arg-type]
        groups = tuple(tuple(sorted(g.items())) for g in s.groups)
        accounting[name] = (tuple(s.reserved_mib), tuple(s.exclusive), groups, s.cpu_used, s.memory_used_mib,
                            s.ephemeral_used_mib, sorted(s.tasks))
    usage = {q: {k: v for k, v in sorted(u.items()) if v} for q, u in sorted(quotas.usage.items())}
    return placements, accounting, {q: u for q, u in usage.items() if u}


@settings(max_examples=150, deadline=None)
@given(
    nodes(),
    queue_specs(),
    st.lists(st.tuples(requests(), st.sampled_from(QUEUES), st.integers(0, 2)), min_size=1, max_size=12),
    st.sampled_from(("bestfit", "firstfit", "packing")),
)
def test_decisions_place_and_charge_alike_on_a_snapshot_and_on_the_cache(
    cluster: list[Node], queues: list[QueueSpec], submitted: list[tuple[GpuRequest, str, int]], policy: str
) -> None:
    """What one cycle admits is placed and charged alike on a snapshot, on another cache, and in its own."""
    deciding, applying = (Scheduler(policy=make_policy(policy), nodes=cluster) for _ in range(2))
    for s in (deciding, applying):
        for spec in queues:
            s.set_queue(spec)
    for i, (request, queue, priority) in enumerate(submitted):
        deciding.submit(Task(TaskKey(f"ns/t{i}"), queue, request, priority=priority, created=float(i)))
    admits = [d for d in deciding.cycle(1.0) if isinstance(d, Admit)]
    names = sorted(n.name for n in cluster)

    before = state(applying.cluster, applying.quotas, names)
    trial = Trial.of(applying.cluster, applying.quotas)
    for d in admits:
        trial.cluster.reserve(d.task, d.placement)  # OverCommitError when a decision does not fit
        trial.quotas.charge(d.task.queue, d.usage)
    assert state(applying.cluster, applying.quotas, names) == before  # the snapshot left the cache as it was

    charged = [applying.cache.admit(d.task, d.placement, 1.0).usage for d in admits]
    assert charged == [d.usage for d in admits]
    on_snapshot = state(trial.cluster, trial.quotas, names)
    assert on_snapshot == state(applying.cluster, applying.quotas, names)
    assert on_snapshot == state(deciding.cluster, deciding.quotas, names)
