"""Defragmentation (issue 32): the Fragmented reason, the planner's rules (opt-in, priority, minRuntime, budgets,
schedule, gangs move whole), the moves it decides, dry runs, and plans re-checked before they are applied."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_core_scheduler import GIB, node, placed, queue, task

from gputask.core import GpuRequest, Placement, PodPlacement, PodSet, Scheduler, Task, TaskKey
from gputask.core.decisions import Admit, Decision, Evict
from gputask.core.defrag import DefragConfig, plan_holds
from gputask.core.diagnose import diagnose
from gputask.core.model import GpuSlot, NodeName
from gputask.core.quota import ResourceQuota

ON = DefragConfig(mode="Enabled", min_runtime_s=60.0)


def said(decisions: list[Decision]) -> list[tuple[str, str, str, str]]:
    """(kind, task, reason, nodes or message) of each decision."""
    out = []
    for d in decisions:
        if isinstance(d, Admit):
            out.append(("Admit", d.task.key, "", ",".join(d.placement.nodes)))
        elif isinstance(d, Evict):
            out.append(("Evict", d.task.key, d.reason, d.message))
        else:
            out.append((type(d).__name__, d.task.key, d.reason, d.message))
    return out


def gone(s: Scheduler, decisions: list[Decision]) -> None:
    """The evicted workloads stop at once (as in the scenario runner)."""
    for d in decisions:
        if isinstance(d, Evict):
            if d.held is not None:
                s.finish(d.held)
            s.victim_gone(d.task.key)


def small(name: str, where: str, gpu: int, *, movable: bool | None = True, priority: int = 0,
          queue_name: str = "q") -> tuple[Task, Placement]:
    return replace(task(name, priority=priority, queue=queue_name), movable=movable), placed(where, (gpu, 24 * GIB))


def cluster(config: DefragConfig = ON, *, movable: bool | None = True, priority: int = 0,
            queue_movable: bool = False, admitted_at: float = 0.0) -> Scheduler:
    """Two nodes of 4 GPUs, each with 2 busy (s1, s2 on a; s3, s4 on b): 4 GPUs free, 2 per node."""
    s = Scheduler(nodes=[node("a", 24, 24, 24, 24), node("b", 24, 24, 24, 24)], defragmentation=config)
    s.set_queue(replace(queue(), movable=queue_movable))
    for name, where, gpu in (("s1", "a", 0), ("s2", "a", 1), ("s3", "b", 0), ("s4", "b", 1)):
        t, p = small(name, where, gpu, movable=movable, priority=priority)
        s.restore(t, p, admitted_at=admitted_at)
    return s


BIG = task("big", count=4, created=10.0)
FRAGMENTED_MESSAGE = ("needs 4 GPUs idle on one node: 4 are free in the cluster but no node has more than 2 "
                      "(largest free blocks: a 2, b 2)")
MOVED = "moved to b to make room for ns/big (priority 0) on a"


def test_a_task_the_free_gpus_of_several_nodes_would_hold_waits_fragmented_with_the_largest_blocks() -> None:
    s = cluster(DefragConfig())
    s.submit(BIG)
    assert said(s.cycle(10.0)) == [("Pending", "ns/big", "Fragmented", FRAGMENTED_MESSAGE)]


def test_not_fragmented_when_the_cluster_lacks_the_gpus_or_quota_refuses() -> None:
    s = cluster(DefragConfig())
    s.restore(*small("s5", "b", 2), admitted_at=0.0)  # 3 GPUs free
    s.submit(BIG)
    assert said(s.cycle(10.0))[0][2] == "NoFit"
    s = cluster(DefragConfig())
    s.set_queue(queue(gpu=ResourceQuota(7000)))  # 4 GPUs run: 3 left of quota
    s.submit(BIG)
    assert said(s.cycle(10.0))[0][2] == "NoFit"


def test_enabled_moves_two_tasks_then_admits_the_big_one_and_readmits_them_elsewhere() -> None:
    s = cluster()
    s.submit(BIG)
    moving = s.cycle(100.0)
    assert said(moving) == [
        ("Evict", "ns/s1", "Defragmented", MOVED),
        ("Evict", "ns/s2", "Defragmented", MOVED),
        ("Pending", "ns/big", "Defragmenting", "moving ns/s1 (a to b), ns/s2 (a to b) to make room on a"),
    ]
    assert [d.by for d in moving if isinstance(d, Evict)] == ["ns/big", "ns/big"]
    gone(s, moving)
    admitted = s.cycle(100.0)
    assert said(admitted) == [("Admit", "ns/big", "", "a"), ("Admit", "ns/s1", "", "b"), ("Admit", "ns/s2", "", "b")]
    assert s.violations() == []
    assert (s.defrag.stats.moves, s.defrag.stats.plans, s.defrag.stats.lost_gpu_s) == (2, 1, 200.0)


def test_a_moved_task_is_not_readmitted_before_its_old_workload_is_gone() -> None:
    s = cluster()
    s.submit(BIG)
    s.cycle(100.0)
    assert said(s.cycle(101.0)) == []  # nothing reported gone yet
    s.victim_gone(TaskKey("ns/s1"))
    assert said(s.cycle(102.0)) == [("Admit", "ns/s1", "", "b")]


def test_only_tasks_that_opted_in_move() -> None:
    s = cluster(movable=None)
    s.submit(BIG)
    assert said(s.cycle(100.0)) == [("Pending", "ns/big", "Fragmented", FRAGMENTED_MESSAGE)]
    s = cluster(movable=False, queue_movable=True)  # a task's own false beats its queue's default
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Fragmented"
    s = cluster(movable=None, queue_movable=True)  # the queue's default
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Defragmented"


def test_only_tasks_of_priority_at_most_the_waiting_ones_plus_the_threshold_move() -> None:
    s = cluster(priority=1)
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Fragmented"
    s = cluster(replace(ON, priority_threshold=1), priority=1)
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Defragmented"
    s = cluster(replace(ON, priority_threshold=-1), priority=0)  # strictly lower only
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Fragmented"


def test_tasks_move_only_after_min_runtime_and_the_cycle_wakes_for_it() -> None:
    s = cluster(admitted_at=50.0)
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Fragmented"  # ran 50 s of 60
    assert s.cycle(109.0) == [] and s.stats.mode == "skipped"
    assert said(s.cycle(110.0))[0][2] == "Defragmented"  # the deadline made this cycle walk


def test_moves_per_window_bound_a_plan_and_refusals_are_counted() -> None:
    s = cluster(replace(ON, max_moves_per_window=1))
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Fragmented"  # the plan needs 2 moves
    assert s.defrag.stats.refused_by_budget == 0  # a plan bounded, not refused: 1 move makes no room
    plan, why = s.defrag_plan(BIG, 100.0)
    assert (plan, why) == (None, "no move of up to 1 movable tasks makes room on one node")


def test_a_spent_window_refuses_until_a_move_leaves_it() -> None:
    s = cluster(replace(ON, max_moves_per_window=2, window_s=1000.0))
    s.submit(BIG)
    gone(s, s.cycle(100.0))
    s.cycle(100.0)
    s.finish(TaskKey("ns/big"))
    s.submit(task("big2", count=4, created=20.0))
    s.restore(*small("s5", "a", 0), admitted_at=0.0)  # fragment node a again (b is full)
    s.restore(*small("s6", "a", 1), admitted_at=0.0)
    s.finish(TaskKey("ns/s1"))  # b: 1 free, a: 2 free
    s.finish(TaskKey("ns/s3"))  # b: 2 free
    assert said(s.cycle(200.0))[0][2] == "Fragmented"
    assert s.defrag.stats.refused_by_budget == 1
    assert s.defrag_plan(task("big2", count=4), 200.0)[1] == (
        "no moves left: maxMovesPerWindow 2 spent in the window")
    assert said(s.cycle(1100.0))[0][2] == "Defragmented"  # the first moves left the window at 1100


def test_each_queue_has_its_own_budget() -> None:
    def two_queues(config: DefragConfig) -> Scheduler:
        s = Scheduler(nodes=[node("a", 24, 24, 24, 24), node("b", 24, 24, 24, 24)], defragmentation=config)
        for name in ("q", "r"):
            s.set_queue(queue(name))
        for name, gpu in (("s1", 0), ("s2", 1)):  # the only plan moves both of q's tasks off a
            s.restore(*small(name, "a", gpu), admitted_at=0.0)
        for name, gpu in (("s3", 0), ("s4", 1)):
            s.restore(*small(name, "b", gpu, movable=False, queue_name="r"), admitted_at=0.0)
        s.submit(BIG)
        return s

    s = two_queues(replace(ON, max_moves_per_queue=1))
    assert said(s.cycle(100.0))[0][2] == "Fragmented"
    assert s.defrag_plan(BIG, 100.0)[1] == "no move of up to 3 movable tasks makes room on one node"
    s = two_queues(replace(ON, max_moves_per_queue=2))
    s.defrag.log.append((90.0, "q"))  # one of q's two moves spent: the window wakes the cycle when it leaves
    assert said(s.cycle(100.0))[0][2] == "Fragmented"
    assert said(s.cycle(3690.0))[0][2] == "Defragmented"
    s = two_queues(replace(ON, max_moves_per_queue=2))
    s.defrag.log.append((90.0, "r"))  # another queue's move does not count against q
    assert said(s.cycle(100.0))[0][2] == "Defragmented"


def test_outside_the_schedule_nothing_moves_and_the_next_minute_is_tried() -> None:
    s = cluster(replace(ON, allowed_at=lambda now: now >= 180.0))
    s.submit(BIG)
    assert said(s.cycle(100.0))[0][2] == "Fragmented"
    assert s.defrag.wake_at == 120.0
    assert s.defrag_plan(BIG, 100.0)[1] == "outside the maintenance window (defragmentation.schedule)"
    assert said(s.cycle(180.0))[0][2] == "Defragmented"


def test_dry_run_reports_the_plan_once_and_moves_nothing() -> None:
    s = cluster(replace(ON, mode="DryRun"))
    s.submit(BIG)
    assert said(s.cycle(100.0)) == [("Pending", "ns/big", "Fragmented", FRAGMENTED_MESSAGE)]
    s.cycle(100.0)
    reports = s.defrag.take_reports()
    assert [(r.applied, r.plan.describe()) for r in reports] == [(False, "ns/s1 (a to b), ns/s2 (a to b)")]
    assert s.placement_of(TaskKey("ns/s1")) == placed("a", (0, 24 * GIB))
    assert s.defrag.stats.dry_runs == 1 and s.defrag.stats.moves == 0


def test_the_plan_of_fewest_moves_wins_then_the_least_lost_work() -> None:
    s = Scheduler(nodes=[node("a", 24, 24, 24, 24), node("b", 24, 24, 24, 24), node("c", 24, 24, 24, 24)],
                  defragmentation=ON)
    s.set_queue(queue())
    s.restore(*small("a1", "a", 0), admitted_at=0.0)  # a: one task, long running
    s.restore(*small("b1", "b", 0), admitted_at=50.0)  # b: one task, shorter
    s.restore(*small("c1", "c", 0), admitted_at=0.0)  # c: two tasks
    s.restore(*small("c2", "c", 1), admitted_at=0.0)
    for name, gpu in (("x1", 1), ("x2", 2)):  # a and b keep 1 free GPU each; c 2
        s.restore(*small(name, "a", gpu, movable=False), admitted_at=0.0)
    s.restore(*small("y1", "b", 1, movable=False), admitted_at=0.0)
    s.restore(*small("y2", "b", 2, movable=False), admitted_at=0.0)
    s.submit(task("big", count=2))  # a move of one task off a or b frees 2 there; c is 2 moves
    plan, _ = s.defrag_plan(task("big", count=2), 110.0)
    assert plan is not None and [m.task.key for m in plan.moves] == ["ns/b1"] and plan.placement.nodes == ("b",)


def test_a_gang_moves_whole() -> None:
    s = Scheduler(nodes=[node("a", 24, 24, 24, 24), node("b", 24, 24, 24, 24), node("c", 24, 24, 24, 24)],
                  defragmentation=ON)
    s.set_queue(queue())
    gang = Task.of_pod_sets(TaskKey("ns/gang"), "q", (PodSet("w", 2, GpuRequest(1)),), movable=True)
    two = Placement((PodPlacement(NodeName("a"), (GpuSlot(0, "a-0", 24 * GIB),)),
                     PodPlacement(NodeName("b"), (GpuSlot(0, "b-0", 24 * GIB),))))
    s.restore(gang, two, admitted_at=0.0)
    for name, where, gpu in (("a1", "a", 1), ("b1", "b", 1), ("b2", "b", 2), ("c0", "c", 0), ("c1", "c", 1)):
        s.restore(*small(name, where, gpu, movable=False), admitted_at=0.0)
    s.submit(task("big", count=3))  # free: a 2, b 1, c 2; only moving the gang off a makes 3 there
    moving = s.cycle(100.0)
    evicted = [(d.task.key, d.placement) for d in moving if isinstance(d, Evict)]
    assert evicted == [("ns/gang", two)]  # both pods, the one on b too
    gone(s, moving)
    admitted = {d.task.key: d.placement for d in s.cycle(100.0) if isinstance(d, Admit)}
    assert admitted["ns/big"].nodes == ("a",)
    assert len(admitted["ns/gang"].pods) == 2 and "a" not in admitted["ns/gang"].nodes
    assert s.violations() == []


def test_a_plan_that_no_longer_holds_is_not_applied() -> None:
    s = cluster()
    plan, _ = s.defrag_plan(BIG, 100.0)
    assert plan is not None and plan_holds(plan, s.cache)
    s.finish(TaskKey("ns/s1"))  # a moved task is gone: the plan is stale
    assert not plan_holds(plan, s.cache)
    s = cluster()
    plan, _ = s.defrag_plan(BIG, 100.0)
    assert plan is not None
    s.restore(*small("late", "b", 2, movable=False), admitted_at=0.0)  # b's room for the moved tasks is taken
    assert not plan_holds(plan, s.cache)
    assert s.defrag.act(plan, s.cache, s.queues, s.moves, 100.0) == []
    assert s.placement_of(TaskKey("ns/s1")) == placed("a", (0, 24 * GIB))


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="defragmentation mode 'On'"):
        DefragConfig(mode="On")


def test_explain_shows_the_plan_it_would_run_and_why_not_yet() -> None:
    s = cluster(admitted_at=50.0)
    s.submit(BIG)
    s.cycle(100.0)
    assert diagnose(s, TaskKey("ns/big"), 100.0).defragmentation == (
        "mode Enabled; no plan now: no running task may move (4 runs for less than minRuntime)",
        "4 of 4 moves left in the window",
    )
    assert diagnose(s, TaskKey("ns/big"), 110.0).defragmentation == (
        "mode Enabled; the plan: place it on a after 2 move(s), 0.03 GPU-hours of work lost",
        "move ns/s1 (priority 0) from a to b",
        "move ns/s2 (priority 0) from a to b",
        "4 of 4 moves left in the window",
    )
    dry = cluster(replace(ON, mode="DryRun"))
    dry.submit(BIG)
    assert diagnose(dry, TaskKey("ns/big"), 100.0).defragmentation[0].startswith(
        "mode DryRun; the plan (not run: DryRun): place it on a")
    assert diagnose(s, TaskKey("ns/s1"), 100.0).defragmentation == ()  # running
    assert diagnose(s, TaskKey("ns/big")).defragmentation == ()  # no time given: not asked
