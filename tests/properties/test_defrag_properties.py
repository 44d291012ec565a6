"""Defragmentation plans under random fragmented clusters: every plan is checked again from scratch here, with no
code of the planner (GPU by GPU, from the running placements), and applying it leaves the books consistent."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gputask.core import Gpu, GpuRequest, Node, NodeName, Placement, QueueSpec, Scheduler, Task, TaskKey
from gputask.core.decisions import Admit, Evict
from gputask.core.defrag import DefragConfig, fragmented
from gputask.core.model import GpuSlot, PodPlacement

GPUS_PER_NODE = 4
MIB = 24_576


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Scheduler, Task, dict[TaskKey, Task]]:
    """2-4 nodes of 4 whole GPUs; running tasks of 1-2 GPUs on random free GPUs (movable 3 times in 4, priority 0-2,
    admitted at 0-900 s); a waiting task of 2-4 GPUs of priority 1."""
    names = [NodeName(f"n{i}") for i in range(draw(st.integers(2, 4)))]
    nodes = [Node(n, tuple(Gpu(i, f"{n}-{i}", "A10", MIB) for i in range(GPUS_PER_NODE))) for n in names]
    config = DefragConfig(mode="Enabled", min_runtime_s=100.0, max_moves_per_window=draw(st.integers(1, 4)))
    s = Scheduler(nodes=nodes, defragmentation=config)
    s.set_queue(QueueSpec("q"))
    free = {n: list(range(GPUS_PER_NODE)) for n in names}
    tasks: dict[TaskKey, Task] = {}
    for i in range(draw(st.integers(2 * len(names), 4 * len(names)))):
        where = draw(st.sampled_from(names))
        count = draw(st.integers(1, 2))
        if len(free[where]) < count:
            continue
        picked = draw(st.permutations(free[where]))[:count]
        for g in picked:
            free[where].remove(g)
        key = TaskKey(f"ns/t{i}")
        movable = draw(st.sampled_from((True, True, True, False)))
        t = Task(key, "q", GpuRequest(count), priority=draw(st.integers(0, 2)), movable=movable)
        s.restore(t, Placement((PodPlacement(where, tuple(GpuSlot(g, f"{where}-{g}", MIB) for g in picked)),)),
                  admitted_at=float(draw(st.integers(0, 900))))
        tasks[key] = t
    big = Task(TaskKey("ns/big"), "q", GpuRequest(draw(st.integers(2, 4))), priority=1, created=1.0)
    return s, big, tasks


def gpu_holders(placements: dict[TaskKey, Placement]) -> Counter[tuple[str, str]]:
    """How many tasks hold each GPU (node, uuid)."""
    return Counter((pod.node, slot.uuid) for p in placements.values() for pod in p.pods for slot in pod.gpus)


@settings(max_examples=400, deadline=None)
@given(clusters())
def test_a_plan_holds_when_checked_from_scratch_and_keeps_every_rule(case: tuple[Scheduler, Task, dict]) -> None:
    s, big, tasks = case
    now = 1000.0
    before = {k: e.placement for k, e in s.running.items()}
    if fragmented(big, s.cluster, s.quotas) is None:  # the cycle plans only for a task that waits Fragmented
        assert s.defrag_plan(big, now)[0] is None or s.try_place(big)[0] is not None
        return
    plan, why = s.defrag_plan(big, now)
    if plan is None:
        assert why
        return
    moved = {m.task.key for m in plan.moves}
    # the rules: opted in, priority at most the waiting task's, run >= minRuntime, within the window's budget
    assert all(tasks[k].movable for k in moved)
    assert all(tasks[k].priority <= big.priority for k in moved)
    assert all(now - s.running[k].admitted_at >= 100.0 for k in moved)
    assert 1 <= len(moved) <= min(3, s.defrag.config.max_moves_per_window)
    assert s.try_place(big)[0] is None  # Fragmented: it waits
    # from scratch: the placements after the plan, every GPU held by one task at most, each placement on GPUs that
    # exist, of the counts asked, the waiting task on one node; nothing moved stays on the waiting task's node
    after = {k: p for k, p in before.items() if k not in moved}
    after[big.key] = plan.placement
    after.update({m.task.key: m.target for m in plan.moves})
    assert max(gpu_holders(after).values()) == 1
    for key, placement in after.items():
        want = big.request.count if key == big.key else tasks[key].request.count
        assert [len(pod.gpus) for pod in placement.pods] == [want]
        for pod in placement.pods:
            assert all(slot.uuid == f"{pod.node}-{slot.index}" and 0 <= slot.index < GPUS_PER_NODE
                       for slot in pod.gpus)
    assert all(plan.placement.nodes[0] not in m.target.nodes for m in plan.moves)
    # the moved tasks' new GPUs were free before: no move waits on another's departure
    assert not set(gpu_holders({m.task.key: m.target for m in plan.moves})) & set(gpu_holders(before))
    # applied through a cycle: the same moves, then everything admitted where planned, books consistent
    s.submit(big)
    decisions = s.cycle(now)
    assert {d.task.key for d in decisions if isinstance(d, Evict)} == moved
    for d in decisions:
        if isinstance(d, Evict):
            if d.held is not None:
                s.finish(d.held)
            s.victim_gone(d.task.key)
    admitted = {d.task.key: d.placement for d in s.cycle(now) if isinstance(d, Admit)}
    assert admitted == {k: after[k] for k in moved | {big.key}}
    assert s.violations() == []
