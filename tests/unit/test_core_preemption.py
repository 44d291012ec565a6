"""Preemption: Kueue's policies at GPU granularity, victims on one node, reprieve, nomination."""

from __future__ import annotations

import pytest
from test_core_scheduler import GIB, node, placed, task

from gputask.core import (
    GPU,
    Admit,
    Pending,
    Preemption,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
)
from gputask.core.cycle import Cycle
from gputask.core.scheduler import Evict


def cq(
    name: str = "q",
    *,
    cohort: str | None = None,
    gpus: int | None = None,
    borrowing: int | None = None,
    lending: int | None = None,
    within: str = "Never",
    reclaim: str = "Never",
    borrow: str = "Never",
    threshold: int | None = None,
    weight: int | None = None,
) -> QueueSpec:
    """A queue with an nvidia.com/gpu quota (in whole GPUs) and a preemption policy."""
    quotas = {}
    if gpus is not None:
        quotas[GPU] = ResourceQuota(
            gpus * 1000,
            None if borrowing is None else borrowing * 1000,
            None if lending is None else lending * 1000,
        )
    return QueueSpec(
        name,
        cohort=cohort,
        quotas=quotas,
        preemption=Preemption(within, reclaim, borrow, threshold),
        fair_sharing_weight_milli=weight,
    )


def running(s: Scheduler, *tasks: Task, at: float = 0.0) -> None:
    """Submit and admit ``tasks`` in order (each must be admitted), at time ``at``."""
    for t in tasks:
        s.submit(t)
    decisions = s.cycle(at)
    assert [type(d).__name__ for d in decisions] == ["Admit"] * len(tasks)


def preempted(victim: Task, where: tuple[str, int, int], by: Task) -> Evict:
    """The Evict decision for ``victim`` preempted by ``by`` (priority and queue from ``by``)."""
    node_name, index, mib = where
    message = f"preempted by {by.key} (priority {by.priority}) in GPUClusterQueue {by.queue!r}"
    return Evict(victim, placed(node_name, (index, mib)), "Preempted", message, by=by.key)


def whole(name: str, priority: int = 0, queue: str = "q", created: float = 0.0) -> Task:
    """A one-whole-GPU task."""
    return task(name, priority=priority, queue=queue, created=created)


W = 24 * GIB  # a whole 24Gi GPU in MiB


@pytest.mark.parametrize(
    ("policy", "victim_priority", "victim_created", "expected"),
    [
        ("Never", -1, 0.0, False),
        ("LowerPriority", -1, 0.0, True),
        ("LowerPriority", 0, 5.0, False),
        ("LowerOrNewerEqualPriority", 0, 5.0, True),
        ("LowerOrNewerEqualPriority", 0, -5.0, False),
        ("LowerOrNewerEqualPriority", 1, 5.0, False),
    ],
)
def test_within_cluster_queue_policies(
    policy: str, victim_priority: int, victim_created: float, expected: bool
) -> None:
    """withinClusterQueue decides which same-queue tasks a priority-0 task created at 0 may preempt."""
    s = Scheduler(nodes=[node("a", 24)])
    s.set_queue(cq(within=policy))
    victim = whole("victim", victim_priority, created=victim_created)
    running(s, victim)
    pre = whole("pre", 0)
    s.submit(pre)
    decisions = s.cycle(1.0)
    if expected:
        assert decisions == [
            preempted(victim, ("a", 0, W), pre),
            Pending(pre, "Preempting", "preempting ns/victim on a"),
        ]
    else:
        assert decisions == [Pending(pre, "NoFit", "0/1 nodes fit: 1 no idle GPU")]


def test_preemptor_is_admitted_on_the_freed_gpu_only_after_its_victim_is_gone() -> None:
    """The freed GPU is held for the preemptor: the requeued victim cannot take it back, and admission waits."""
    s = Scheduler(nodes=[node("a", 24)])
    s.set_queue(cq(within="LowerPriority"))
    low = whole("low", -1)
    running(s, low)
    high = whole("high", 5)
    s.submit(high)
    s.cycle(1.0)
    waiting = s.cycle(2.0)
    s.victim_gone(low.key)
    after = s.cycle(3.0)
    assert (waiting, after) == (
        [Pending(low, "NoFit", "0/1 nodes fit: 1 no idle GPU")],
        [Admit(high, placed("a", (0, W)), {GPU: 1000, "gputask.io/gpu-memory": W})],
    )
    assert s.violations() == []


def test_victims_are_chosen_on_one_node_fewest_first() -> None:
    """A 2-GPU preemptor evicts the two tasks of one node rather than one task on each of two nodes."""
    s = Scheduler(nodes=[node("a", 24, 24), node("b", 24, 24)])
    s.set_queue(cq(within="LowerPriority"))
    a1, b1, b2 = whole("a1", 1, created=1), whole("b1", 1, created=2), whole("b2", 1, created=3)
    a_busy = task("a-busy", priority=9, created=0)
    running(s, a_busy, a1, b1, b2)
    pre = task("pre", count=2, priority=5)
    s.submit(pre)
    decisions = s.cycle(1.0)
    assert decisions == [
        preempted(b2, ("b", 1, W), pre),
        preempted(b1, ("b", 0, W), pre),
        Pending(pre, "Preempting", "preempting ns/b1, ns/b2 on b"),
    ]


def test_lowest_priority_then_most_recent_victim_and_reprieve() -> None:
    """Of three candidates on a full GPU, only the lowest-priority most-recent one goes; the rest are reprieved."""
    s = Scheduler(nodes=[node("a", 24)])
    s.set_queue(cq(within="LowerPriority"))
    old = task("old", memory_gib=8, priority=1, created=1)
    new = task("new", memory_gib=8, priority=1, created=2)
    vip = task("vip", memory_gib=8, priority=3, created=3)
    running(s, old, vip)
    running(s, new, at=10.0)
    pre = task("pre", memory_gib=8, priority=5)
    s.submit(pre)
    assert s.cycle(11.0) == [
        Evict(
            new,
            placed("a", (0, 8 * GIB)),
            "Preempted",
            "preempted by ns/pre (priority 5) in GPUClusterQueue 'q'",
            by=TaskKey("ns/pre"),
        ),
        Pending(pre, "Preempting", "preempting ns/new on a"),
    ]


def test_reclaim_within_cohort_takes_back_lent_quota() -> None:
    """A queue within its nominal quota reclaims from a borrowing queue of its cohort (Any), not from a non-borrower."""
    s = Scheduler(nodes=[node("a", 24, 24)])
    s.set_queue(cq("team-a", cohort="org", gpus=1, reclaim="Any"))
    s.set_queue(cq("team-b", cohort="org", gpus=1))
    b1 = whole("b1", 9, queue="team-b", created=1)
    b2 = whole("b2", 9, queue="team-b", created=2)
    running(s, b1, b2)
    mine = whole("mine", 0, queue="team-a")
    s.submit(mine)
    assert s.cycle(1.0) == [
        Evict(
            b2,
            placed("a", (1, W)),
            "Preempted",
            "preempted by ns/mine (priority 0) in GPUClusterQueue 'team-a'",
            by=mine.key,
        ),
        Pending(mine, "Preempting", "preempting ns/b2 on a"),
    ]


@pytest.mark.parametrize(
    ("reclaim", "victim_priority", "expected"),
    [("Never", -1, False), ("LowerPriority", -1, True), ("LowerPriority", 0, False), ("Any", 5, True)],
)
def test_reclaim_within_cohort_policies(reclaim: str, victim_priority: int, expected: bool) -> None:
    """reclaimWithinCohort: Never, LowerPriority (strictly lower), Any (any priority) against a borrowing queue."""
    s = Scheduler(nodes=[node("a", 24, 24)])
    s.set_queue(cq("team-a", cohort="org", gpus=1, reclaim=reclaim))
    s.set_queue(cq("team-b", cohort="org", gpus=1))
    running(s, whole("b1", victim_priority, "team-b", 1), whole("b2", victim_priority, "team-b", 2))
    s.submit(whole("mine", 0, "team-a"))
    kinds = [type(d).__name__ for d in s.cycle(1.0)]
    assert kinds == (["Evict", "Pending"] if expected else ["Pending"])


@pytest.mark.parametrize(
    ("borrow", "threshold", "victim_priority", "expected"),
    [
        ("Never", None, -1, False),
        ("LowerPriority", None, -1, True),
        ("LowerPriority", None, 0, False),
        ("LowerPriority", -5, -1, False),
        ("LowerPriority", -1, -1, True),
    ],
)
def test_borrow_within_cohort_policies(
    borrow: str, threshold: int | None, victim_priority: int, expected: bool
) -> None:
    """borrowWithinCohort lets a borrowing preemptor take lower-priority work (at most maxPriorityThreshold)."""
    s = Scheduler(nodes=[node("a", 24, 24, 24)])
    s.set_queue(cq("team-a", cohort="org", gpus=1, reclaim="LowerPriority", borrow=borrow, threshold=threshold))
    s.set_queue(cq("team-b", cohort="org", gpus=1))
    s.set_queue(cq("team-c", cohort="org", gpus=1))  # lends its GPU to team-b
    running(s, whole("a1", 9, "team-a", 0))
    running(s, whole("b1", victim_priority, "team-b", 1), whole("b2", victim_priority, "team-b", 2))
    s.submit(whole("mine", 0, "team-a", 3))
    kinds = [type(d).__name__ for d in s.cycle(1.0)]
    assert kinds == (["Evict", "Pending"] if expected else ["Pending"])


def test_a_task_bigger_than_its_queue_is_inadmissible_and_evicts_nobody() -> None:
    """A 2-GPU task in a 1-GPU queue without cohort is Inadmissible and never preempts."""
    s = Scheduler(nodes=[node("a", 24, 24)])
    s.set_queue(cq(gpus=1, within="LowerPriority"))
    running(s, whole("low", -5))
    huge = task("huge", count=2, priority=100)
    s.submit(huge)
    assert s.cycle(1.0) == [
        Pending(
            huge,
            "Inadmissible",
            "needs at least 2000 milli-GPU of nvidia.com/gpu; GPUClusterQueue 'q' can never hold more than 1000",
        )
    ]


def test_fair_sharing_preempts_only_toward_equal_shares() -> None:
    """With fairSharing, a queue under its share reclaims from the heavier borrower, never the reverse."""
    s = Scheduler(nodes=[node("a", 24, 24, 24, 24)])
    s.set_queue(cq("team-a", cohort="org", gpus=2, reclaim="Any", weight=1000))
    s.set_queue(cq("team-b", cohort="org", gpus=2, reclaim="Any", weight=1000))
    b = [whole(f"b{i}", 0, "team-b", i) for i in range(4)]
    running(s, *b)
    a1 = whole("a1", 0, "team-a", 10)
    s.submit(a1)
    first = s.cycle(1.0)
    s.victim_gone(b[3].key)
    second = s.cycle(2.0)
    assert [type(d).__name__ for d in first] == ["Evict", "Pending"]
    assert [d for d in second if isinstance(d, Admit)] == [
        Admit(a1, placed("a", (3, W)), {GPU: 1000, "gputask.io/gpu-memory": W})
    ]
    # b3 is requeued; team-b's share would rise above team-a's again: it must not preempt back.
    assert s.cycle(3.0) == []
    assert s.violations() == []


def test_hold_and_drain_evicts_admitted_work() -> None:
    """stopPolicy HoldAndDrain evicts the queue's running tasks (reason QueueDrained) and admits nothing."""
    s = Scheduler(nodes=[node("a", 24)])
    s.set_queue(cq())
    t = whole("t")
    running(s, t)
    s.set_queue(QueueSpec("q", stop_policy="HoldAndDrain"))
    assert s.cycle(1.0) == [
        Evict(t, placed("a", (0, W)), "QueueDrained", "GPUClusterQueue 'q' is draining"),
        Pending(t, "QueueHeld", "GPUClusterQueue 'q' is stopped (HoldAndDrain)"),
    ]


def test_random_policy_preemption_uses_the_placement_it_checked() -> None:
    """With the random policy (a new answer per call) preemption still yields a consistent plan."""
    from gputask.core import make_policy

    for seed in range(20):
        s = Scheduler(policy=make_policy("random", seed=seed), nodes=[node("a", 24, 24), node("b", 24, 24)])
        s.set_queue(cq(within="LowerPriority"))
        running(s, *(task(f"low{i}", memory_gib=8, priority=0, created=i) for i in range(12)))
        s.submit(task("high", count=2, priority=5, created=50))
        kinds = [type(d).__name__ for d in s.cycle(1.0)]
        assert kinds[-1] == "Pending" and set(kinds[:-1]) == {"Evict"}
        assert s.violations() == []


def test_an_inadmissible_head_does_not_block_a_strict_fifo_queue() -> None:
    """StrictFIFO: a head that can never fit is Inadmissible and the task behind it is admitted."""
    s = Scheduler(nodes=[node("a", 24, 24)])
    s.set_queue(QueueSpec("q", strategy="StrictFIFO"))
    huge, small = task("huge", count=4, created=0), task("small", created=1)
    s.submit(huge)
    s.submit(small)
    assert s.cycle(0.0) == [
        Pending(huge, "Inadmissible", "no node could ever hold it: 0/1 nodes fit: 1 fewer than 4 GPUs"),
        Admit(small, placed("a", (0, W)), {GPU: 1000, "gputask.io/gpu-memory": W}),
    ]


def test_a_victim_of_another_queue_is_taken_only_while_its_queue_still_borrows() -> None:
    """Kueue re-checks each candidate as the plan grows: b borrows 250m, so a borrowing preemptor may
    not take both b's tasks (after the first, b is below its nominal quota), and the two queues do not
    take the GPUs from each other for ever (found by the preemption property test)."""
    qa = cq("qa", cohort="org", gpus=1, reclaim="LowerPriority", borrow="LowerPriority")
    qb = cq("qb", cohort="org", gpus=1, reclaim="Any")
    whole, small = task("whole", queue="qb", created=0), task("small", queue="qb", memory_gib=4, priority=1, created=4)
    big = task("big", queue="qa", count=2, priority=2, created=1)
    s = Scheduler(nodes=[node("n0", 16, 16)])
    s.set_queue(qa)
    s.set_queue(qb)
    running(s, whole, small)
    s.submit(big)
    assert [d for d in s.cycle(1.0) if not isinstance(d, Pending)] == []
    assert sorted(s.running) == ["ns/small", "ns/whole"]


def test_a_failed_preemption_is_not_planned_again_until_something_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning is the costly part of a cycle: a shape and priority that found no plan is not planned
    again while reservations, nodes, queues and the policy are unchanged (a node reported again as it was
    is no change); any change plans again."""
    s = Scheduler(nodes=[node("a", 24)])
    s.set_queue(cq(gpus=4, within="LowerPriority"))
    running(s, whole("same", 5))
    waiting = whole("waiting", 5, created=1.0)  # same priority: nothing it may preempt
    s.submit(waiting)
    plans: list[str] = []
    real = Cycle.plan

    def counted(self: Cycle, task: Task) -> object:
        plans.append(task.key)
        return real(self, task)

    monkeypatch.setattr(Cycle, "plan", counted)
    s.cycle(1.0)
    s.cycle(2.0)
    assert plans == ["ns/waiting"]
    s.set_queue(cq(gpus=4, within="LowerPriority"))  # the queue was set again: plan again
    s.cycle(3.0)
    s.cycle(4.0)
    s.set_node(node("a", 24))  # the node was reported again as it was (a heartbeat): nothing changed
    s.cycle(5.0)
    s.set_node(node("a", 32))  # the node changed: plan again
    s.cycle(6.0)
    assert plans == ["ns/waiting"] * 3


# -- the four rules where gputask differed from Kueue (issue: Kueue's queue model, exactly) -----------


def _preempted(decisions: list) -> list[str]:
    return sorted(d.task.key for d in decisions if isinstance(d, Evict) and d.reason == "Preempted")


def test_a_queue_under_nominal_preempts_its_own_and_reclaims_in_one_plan() -> None:
    """Rule 1: qa uses 1 of its 4 GPUs and asks for 4 more. With its own low task counted as a victim it
    stays within nominal, so Kueue reclaims from the borrower qb as well (``queueUnderNominal...`` is
    judged on current usage, the plan's fit without borrowing after its own victims). Judging "would it
    borrow" on usage plus request, before its own victims, dropped the reclaim candidates: it starved."""
    qa = cq("qa", cohort="org", gpus=4, within="LowerPriority", reclaim="Any")
    qb = cq("qb", cohort="org", gpus=2)
    s = Scheduler(nodes=[node("n", *[24] * 6)])
    s.set_queue(qa)
    s.set_queue(qb)
    running(s, task("low", queue="qa", priority=-1))
    for i in range(4):
        running(s, task(f"b{i}", queue="qb", created=float(i)), at=float(i))
    s.submit(task("big", queue="qa", count=4, priority=5))
    assert _preempted(s.cycle(10.0)) == ["ns/b2", "ns/b3", "ns/low"]  # qb keeps its nominal 2


def test_reclaim_takes_the_borrowers_task_before_the_lenders_own_lower_priority_one() -> None:
    """Rule 4: Kueue orders candidates other queues' first, then priority, then most recently admitted.
    qa lends to qb; qa's new task must take back the lent GPU, not evict qa's own lower-priority task."""
    qa = cq("qa", cohort="org", gpus=2, within="LowerPriority", reclaim="Any")
    qb = cq("qb", cohort="org", gpus=0)
    s = Scheduler(nodes=[node("n", 24, 24)])
    s.set_queue(qa)
    s.set_queue(qb)
    running(s, task("own-low", queue="qa", priority=-1), task("borrowed", queue="qb"))
    s.submit(task("new", queue="qa"))
    assert _preempted(s.cycle(1.0)) == ["ns/borrowed"]


def test_fair_sharing_counts_the_preemptors_own_victims_and_tries_the_strategies_in_order() -> None:
    """Rule 3 (Kueue's "preempt from target and others even if over nominal"): a asks for 4 of the
    cohort's 9 GPUs; with its own low task of 2 gone its share after admission is below b's, so b1 goes
    too. Requiring both strategies of every victim, with a's own victims still counted, preempted none."""
    queues = [cq(n, cohort="all", gpus=3, within="LowerPriority", reclaim="Any", weight=1000) for n in "abc"]
    s = Scheduler(nodes=[node("n", *[24] * 9)])
    for q in queues:
        s.set_queue(q)
    running(
        s,
        task("a1_low", queue="a", count=2, priority=-1),
        task("a2_low", queue="a", priority=-1),
        task("b1", queue="b", count=3),
        task("b2", queue="b", count=3),
    )
    s.submit(task("incoming", queue="a", count=4))
    assert _preempted(s.cycle(1.0)) == ["ns/a1_low", "ns/b1"]


def test_lower_or_newer_equal_priority_never_preempts_a_task_created_at_the_same_time() -> None:
    """Kueue takes an equal-priority task only if the preemptor was created strictly before it; with
    timestamps of one second, equal creation times are common and must not let two tasks evict each other."""
    s = Scheduler(nodes=[node("a", 24)])
    s.set_queue(cq(gpus=1, within="LowerOrNewerEqualPriority"))
    running(s, task("b-victim", created=5.0))
    s.submit(task("a-preemptor", created=5.0))
    assert _preempted(s.cycle(10.0)) == []


def test_reclaim_counts_borrowing_only_in_the_resources_that_need_preemption() -> None:
    """Kueue's cqIsBorrowing over the resources needing preemption: a asks for a GPU (its memory fits);
    b borrows only gpu-memory, so it is not a reclaim target; c borrows a GPU and loses its task."""

    def two(name: str, gpus: int, mem_gib: int) -> QueueSpec:
        quotas = {GPU: ResourceQuota(gpus * 1000), "gputask.io/gpu-memory": ResourceQuota(mem_gib * 1024)}
        preemption = Preemption("Never", "Any" if name == "a" else "Never")
        return QueueSpec(name, cohort="c", quotas=quotas, preemption=preemption)

    s = Scheduler(nodes=[node("n", 16, 16, 16, 16)])
    for spec in (two("a", 2, 64), two("b", 2, 16), two("c", 0, 64)):
        s.set_queue(spec)
    running(s, task("a0", queue="a", priority=5), task("c1", queue="c", priority=5))
    running(s, task("b1", queue="b", created=1), task("b2", queue="b", created=1), at=1.0)
    s.submit(task("a1", queue="a", priority=1, created=3))
    assert _preempted(s.cycle(10.0)) == ["ns/c1"]


def test_fair_sharing_does_not_preempt_between_queues_whose_shares_only_round_equal() -> None:
    """Shares are precise (Kueue's current float form): a 1Gi task against a 1000-GPU cohort moves a
    share by far less than one per mille, so per-mille integers made qa's share with one more task
    equal to qb's with one fewer, and qa preempted qb's task, which could then preempt back."""
    fair = dict(cohort="org", reclaim="Any", weight=1000)
    s = Scheduler(nodes=[node("n", 24)])
    for spec in (cq("qa", gpus=0, **fair), cq("qb", gpus=0, **fair), cq("qc", gpus=1000, **fair)):
        s.set_queue(spec)
    for i in range(12):
        a, b = task(f"a{i}", queue="qa", memory_gib=1, created=i), task(f"b{i}", queue="qb", memory_gib=1, created=i)
        running(s, a, b)
    s.submit(task("a-more", queue="qa", memory_gib=1, created=20))
    assert _preempted(s.cycle(30.0)) == []


def _run_until_quiet(s: Scheduler, cycles: int = 20) -> tuple[list[tuple[str, str]], bool]:
    """Cycles (each victim gone at once) until two in a row admit and evict nothing: the (victim,
    preemptor) pairs in order, and whether the run went quiet within ``cycles``."""
    pairs: list[tuple[str, str]] = []
    quiet = 0
    for step in range(cycles):
        decisions = s.cycle(float(step))
        for d in decisions:
            if isinstance(d, Evict) and d.reason == "Preempted":
                pairs.append((d.task.key, str(d.by)))
                s.victim_gone(d.task.key)
        quiet = 0 if any(isinstance(d, (Admit, Evict)) for d in decisions) else quiet + 1
        if quiet == 2:
            return pairs, True
    return pairs, False


def test_fair_sharing_judges_the_preemptors_share_by_the_gpus_it_is_placed_on() -> None:
    """A fair-sharing preemption holds only if the preemptor's queue, charged for the GPUs it really
    gets, ends below the target queue's share: judged on its cheapest GPUs (24Gi) and packed on 16Gi
    ones, t0 took t2 and t2 took t0 back at every cycle."""
    fair = dict(cohort="org", gpus=1, weight=1000)
    s = Scheduler(nodes=[node("n0", 16, 16, 24)])
    s.set_queue(cq("qa", reclaim="LowerPriority", **fair))  # type: ignore[arg-type]
    s.set_queue(cq("qb", reclaim="Any", **fair))  # type: ignore[arg-type]
    t2 = task("t2", queue="qa", count=2, memory_gib=12, priority=1, created=2)
    for t in (task("t0", queue="qb", count=2, memory_gib=12), task("t1", queue="qa", created=1), t2):
        s.submit(t)
    assert _run_until_quiet(s) == ([], True)
    assert {k: e.placement for k, e in s.running.items()} == {t2.key: placed("n0", (0, 12 * GIB), (1, 12 * GIB))}


def test_fair_sharing_counts_the_preemptors_own_victims_that_fill_back_returns() -> None:
    """Kueue issue 14543: t2 took qb's t1 judged with its own queue's t3 gone, then fill-back returned
    t3 and qa ended above qb, so t1 took t2's place and t2 evicted t1 again; a plan whose preemptor's
    queue ends at or above its target's share is dropped, and the run settles after t4's reclaim."""
    s = Scheduler(nodes=[node("n0", 16, 16, 16, 24), node("n1", 16, 16, 16, 24)])
    s.set_queue(cq("qa", cohort="org", gpus=4, within="LowerOrNewerEqualPriority", reclaim="Any", weight=1000))
    s.set_queue(cq("qb", cohort="org", gpus=2, reclaim="Any", weight=1000))
    tasks = [
        task("t0", queue="qa", count=2),
        task("t1", queue="qb", count=2, memory_gib=12, created=1),
        task("t2", queue="qa", count=2, created=2),
        task("t3", queue="qa", memory_gib=8, created=3),
        task("t4", queue="qb", memory_gib=12, created=4),
    ]
    for t in tasks:
        s.submit(t)
    assert _run_until_quiet(s) == ([("ns/t2", "ns/t4")], True)  # t4 reclaims from qa; nothing preempts back
    assert sorted(s.running) == ["ns/t0", "ns/t1", "ns/t3", "ns/t4"]


def test_fair_sharing_visits_the_preemptors_queue_with_its_request_counted() -> None:
    """Kueue orders the target queues with the preemptor's request added to its own queue's share: a
    (3 of 7 GPUs used, 6 with incoming) comes before b (4 used), so a2 goes first and b0 then passes
    LessThanOrEqualToFinalShare; ordering a by its share without the request took its own a1 and a2."""
    s = Scheduler(nodes=[node("n", *[24] * 7)])
    for name, gpus in (("a", 3), ("b", 2), ("c", 2)):
        s.set_queue(cq(name, cohort="o", gpus=gpus, within="LowerPriority", reclaim="Any", weight=1000))
    running(
        s,
        task("b0", queue="b", priority=-1, created=0),
        task("a1", queue="a", priority=-1, created=1),
        task("b2", queue="b", count=2, created=2),
        task("b3", queue="b", created=3),
        task("a2", queue="a", count=2, priority=-1, created=4),
    )
    s.submit(task("incoming", queue="a", count=3, created=50))
    assert _preempted(s.cycle(1.0)) == ["ns/a2", "ns/b0"]
