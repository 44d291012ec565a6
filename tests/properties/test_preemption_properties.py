"""Preemption invariants over random clusters, queue policies and submission streams.

Each example submits a random batch, then runs cycles (victims terminate at once) until the
scheduler is quiet. Checked after every cycle: no over-commit, quota within ceilings; over the
run: every victim was allowed by its preemptor's policy, no victim was preempted twice by the
same preemptor, and the run settles (no admit-evict-admit cycle).
"""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gputask.core import (
    GPU,
    Admit,
    Gpu,
    GpuRequest,
    Node,
    NodeName,
    Preemption,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
)
from gputask.core.scheduler import Evict

GIB = 1024
PROPERTY = settings(max_examples=400, deadline=None)
WITHIN = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
RECLAIM = ("Never", "LowerPriority", "Any")


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    """1-3 nodes of 1-4 GPUs of 16 or 24 GiB."""
    out = []
    for n in range(draw(st.integers(1, 3))):
        sizes = draw(st.lists(st.sampled_from((16 * GIB, 24 * GIB)), min_size=1, max_size=4))
        out.append(Node(NodeName(f"n{n}"), tuple(Gpu(i, f"n{n}-{i}", "A10", m) for i, m in enumerate(sizes))))
    return out


@st.composite
def queue_specs(draw: st.DrawFn) -> list[QueueSpec]:
    """Two queues in one cohort with random GPU quotas, policies and optional fair sharing."""
    fair = draw(st.booleans())
    out = []
    for name in ("qa", "qb"):
        nominal = draw(st.integers(0, 4)) * 1000
        borrowing = draw(st.none() | st.integers(0, 4).map(lambda g: g * 1000))
        policy = Preemption(
            draw(st.sampled_from(WITHIN)),
            draw(st.sampled_from(RECLAIM)),
            draw(st.sampled_from(("Never", "LowerPriority"))),
            draw(st.none() | st.integers(-1, 2)),
        )
        quotas = {GPU: ResourceQuota(nominal, borrowing)}
        out.append(
            QueueSpec(
                name, cohort="org", quotas=quotas, preemption=policy, fair_sharing_weight_milli=1000 if fair else None
            )
        )
    return out


@st.composite
def task_lists(draw: st.DrawFn) -> list[Task]:
    """Up to 12 tasks: 1-2 GPUs, whole or 4/8/12 GiB, priorities 0-3, distinct creation times."""
    out = []
    for i in range(draw(st.integers(1, 12))):
        memory = draw(st.sampled_from((None, 4 * GIB, 8 * GIB, 12 * GIB)))
        request = GpuRequest(draw(st.integers(1, 2)), memory_mib=memory)
        out.append(
            Task(
                TaskKey(f"ns/t{i}"),
                draw(st.sampled_from(("qa", "qb"))),
                request,
                priority=draw(st.integers(0, 3)),
                created=float(i),
            )
        )
    return out


def allowed(victim: Task, preemptor: Task, specs: dict[str, QueueSpec]) -> bool:
    """Whether Kueue's policies could ever allow this pair (a necessary condition)."""
    policy = specs[preemptor.queue].preemption
    if victim.queue == preemptor.queue:
        if policy.within_cluster_queue == "LowerPriority":
            return victim.priority < preemptor.priority
        if policy.within_cluster_queue == "LowerOrNewerEqualPriority":
            return victim.priority < preemptor.priority or (
                victim.priority == preemptor.priority and victim.created > preemptor.created
            )
        return False
    if policy.reclaim_within_cohort == "Never":
        return False
    if policy.reclaim_within_cohort == "Any" or specs[preemptor.queue].fair_sharing_weight_milli is not None:
        return True
    return victim.priority < preemptor.priority


@PROPERTY
@given(clusters(), queue_specs(), task_lists())
def test_preemption_respects_policies_and_settles(nodes: list[Node], specs: list[QueueSpec], tasks: list[Task]) -> None:
    """Victims are always allowed, never preempted twice by the same task, and the run settles without violations."""
    s = Scheduler(nodes=nodes)
    for spec in specs:
        s.set_queue(spec)
    by_name = {spec.name: spec for spec in specs}
    for task in tasks:
        s.submit(task)
    pairs: list[tuple[TaskKey, TaskKey]] = []
    quiet = 0
    for step in range(60):
        decisions = s.cycle(float(step))
        assert s.violations() == []
        for d in decisions:
            if isinstance(d, Evict) and d.reason == "Preempted":
                preemptor = next(t for t in tasks if t.key == d.by)
                assert allowed(d.task, preemptor, by_name), (d.task, preemptor)
                pairs.append((d.task.key, preemptor.key))
                s.victim_gone(d.task.key)
        quiet = quiet + 1 if not any(isinstance(d, (Admit, Evict)) for d in decisions) else 0
        if quiet >= 2:
            break
    event(f"preemptions: {min(len(pairs), 3)}")
    assert quiet >= 2, f"did not settle: {pairs}"
    assert len(pairs) == len(set(pairs)), f"evicted twice by the same preemptor: {pairs}"
