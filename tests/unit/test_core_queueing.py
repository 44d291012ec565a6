"""The queue manager (``core/queueing.py`` ``Queues``): order, positions, backoffs, new arrivals, the order
across a cohort's queues, and which changes move ``Queues.generation``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_core_scheduler import task

from gputask.core import Pending, Task, TaskKey
from gputask.core.queueing import HeadKey, Queues
from gputask.core.queues import order_key


def queues(*tasks: Task) -> Queues:
    """A queue manager holding ``tasks``, none of them new any more (as after a cycle)."""
    q = Queues()
    for t in tasks:
        q.submit(t)
    q.new.clear()
    return q


def keys(tasks: object) -> list[str]:
    return [t.key for t in tasks]  # type: ignore[attr-defined]


def test_pending_order_is_priority_then_creation_then_key_and_positions_count_within_the_queue() -> None:
    """Pending tasks iterate by higher priority, then older, then key; a task's position (rank) counts only the
    tasks of its own queue ahead of it."""
    old, new, high, other = (task("old", created=1.0), task("new", created=2.0), task("high", priority=5, created=3.0),
                             task("other", queue="r", created=0.0))
    tie = task("a-tie", created=1.0)
    q = queues(new, other, old, high, tie)
    assert keys(q.pending) == ["ns/high", "ns/other", "ns/a-tie", "ns/old", "ns/new"]
    assert [q.pending.rank(t) for t in (high, tie, old, new, other)] == [0, 1, 2, 3, 0]
    assert keys(q.pending.in_queue("q", 1, 3)) == ["ns/a-tie", "ns/old"]


def test_a_new_task_is_new_without_a_generation_and_a_replaced_one_moves_the_generation() -> None:
    """A first submission only joins ``new`` (the next cycle may try it alone); submitting a pending task again
    replaces it (its place is tried anew) and moves the generation."""
    q = Queues()
    q.submit(task("a"))
    assert (list(q.new), q.generation) == ([TaskKey("ns/a")], 0)
    q.new.clear()
    q.submit(task("a", priority=3))
    assert (list(q.new), q.generation, q.pending.get(TaskKey("ns/a"))) == ([], 1, task("a", priority=3))
    assert len(q.pending) == 1


GENERATION_CHANGES: dict[str, Callable[[Queues], object]] = {
    "push_back (requeue)": lambda q: q.push_back(task("back", created=-1.0)),
    "take (admitted)": lambda q: q.take(TaskKey("ns/a")),
    "forget (pending)": lambda q: q.forget(TaskKey("ns/a")),
    "forget (deferred only)": lambda q: (q.deferred.update({TaskKey("ns/gone"): (9.0, "R", "m")}),
                                         q.forget(TaskKey("ns/gone"))),
    "defer": lambda q: q.defer(TaskKey("ns/a"), 10.0, "JobRejected", "refused"),
    "undefer": lambda q: (q.deferred.update({TaskKey("ns/a"): (9.0, "R", "m")}), q.undefer(TaskKey("ns/a"))),
}


@pytest.mark.parametrize("name", list(GENERATION_CHANGES))
def test_every_change_but_a_new_arrival_moves_the_generation(name: str) -> None:
    """Requeue, admission, forgetting, a backoff and its end each move ``Queues.generation``."""
    q = queues(task("a"), task("b", created=1.0))
    before = q.generation
    GENERATION_CHANGES[name](q)
    assert q.generation > before


NO_CHANGES: dict[str, Callable[[Queues], object]] = {
    "take of a task not pending": lambda q: q.take(TaskKey("ns/unknown")),
    "forget of a task not known": lambda q: q.forget(TaskKey("ns/unknown")),
    "undefer of a task not deferred": lambda q: q.undefer(TaskKey("ns/a")),
    "backoff_ends": lambda q: q.backoff_ends(0.0),
    "ordered": lambda q: list(q.ordered(False, lambda t: (False, 0.0, order_key(t)))),
    "rank": lambda q: q.pending.rank(task("a")),
}


@pytest.mark.parametrize("name", list(NO_CHANGES))
def test_reads_and_no_ops_leave_the_generation(name: str) -> None:
    """Reads and changes of nothing keep ``Queues.generation`` (so a cycle after them may be skipped)."""
    q = queues(task("a"), task("b", created=1.0))
    before = q.generation
    NO_CHANGES[name](q)
    assert q.generation == before


def test_a_backoff_holds_until_its_end_then_is_dropped_and_undefer_ends_it_early() -> None:
    """``backoff`` says the backoff (until, reason, message) before its end and drops it at its end;
    ``backoff_ends`` lists the ends still ahead; ``undefer`` ends one at once."""
    q = queues(task("a"), task("b"))
    q.defer(TaskKey("ns/a"), 10.0, "JobRejected", "refused")
    q.defer(TaskKey("ns/b"), 20.0, "JobRejected", "refused too")
    assert (q.backoff(TaskKey("ns/a"), 9.5), q.backoff_ends(9.5)) == ((10.0, "JobRejected", "refused"), [10.0, 20.0])
    assert (q.backoff(TaskKey("ns/a"), 10.0), list(q.deferred), q.backoff_ends(10.0)) == (None, ["ns/b"], [20.0])
    q.undefer(TaskKey("ns/b"))
    assert (q.backoff(TaskKey("ns/b"), 0.0), q.deferred) == (None, {})


def test_taking_and_forgetting_drop_the_waits_said_and_their_counts() -> None:
    """A task admitted (``take``) or forgotten leaves the pending set and its recorded wait, reason count and
    filter count with it; the others' stay."""
    a, b = task("a"), task("b", created=1.0)
    q = queues(a, b)
    for t in (a, b):
        q.waits.say(t, "NoFit", "no node", 0)
        q.waits.note_filters(t.key, (("GPU", 2),))
    q.take(a.key)
    assert (keys(q.pending), dict(q.waits.reasons), q.waits.waiting_by_reason, q.waits.waiting_by_filter) == (
        ["ns/b"], {b.key: ("NoFit", "no node", 0)}, {("q", "NoFit"): 1}, {"GPU": 1})
    assert q.forget(b.key) is True
    assert (len(q.pending), q.waits.reasons, q.waits.waiting_by_reason, q.waits.waiting_by_filter) == (0, {}, {}, {})
    assert q.forget(b.key) is False


def test_across_a_cohort_each_next_head_is_keyed_after_the_one_before_is_decided() -> None:
    """``merged`` takes the lowest head key across queues, and keys a queue's next head only after its previous
    head was yielded: with fair sharing, a queue whose share grows with each admission gives way to the other
    (Kueue's entryOrdering, a cycle at a time)."""
    share = {"q": 0.1, "r": 0.0}

    def head_key(t: Task) -> HeadKey:
        return (False, share[t.queue], order_key(t))

    q = queues(*(task(f"q{i}", created=float(i)) for i in range(3)),
               *(task(f"r{i}", queue="r", created=float(i)) for i in range(2)))
    out = []
    for t in q.ordered(True, head_key):
        out.append(t.key)
        share[t.queue] += 0.25  # admitting the head raises its queue's share
    assert out == ["ns/r0", "ns/q0", "ns/r1", "ns/q1", "ns/q2"]  # keyed once up front: r0, r1, q0, q1, q2
    assert keys(q.ordered(False, head_key)) == ["ns/q0", "ns/r0", "ns/q1", "ns/r1", "ns/q2"]  # no cohort: global


def test_a_head_within_nominal_goes_before_one_that_borrows_whatever_the_share() -> None:
    """The first element of the head key (borrowing) wins over the share and the queue order."""
    borrowing = {"q": True, "r": False}
    q = queues(task("q0", priority=9), task("r0", queue="r", created=5.0))
    assert keys(q.merged(lambda t: (borrowing[t.queue], 0.0, order_key(t)))) == ["ns/r0", "ns/q0"]


def test_new_tasks_ahead_of_waiting_ones_report_their_new_positions() -> None:
    """A waiting task a new task now stands ahead of (among the tracked heads of its queue) gets a Pending with
    the same reason at its new position; one behind the tracked heads, or not moved, gets none."""
    waiting = [task(f"w{i}", created=float(i + 1)) for i in range(3)]
    q = queues(*waiting)
    for position, t in enumerate(waiting):
        q.waits.say(t, "NoFit", "no node", position)
    ahead = task("ahead", created=1.5)  # between w0 and w1
    q.submit(ahead)
    moved = q.moved_behind([ahead], tracked_positions=3)
    assert (moved, [p.position for p in moved]) == ([Pending(waiting[1], "NoFit", "no node")], [2])
    moved = q.moved_behind([ahead], tracked_positions=4)  # w2 (now 3) is tracked too
    assert (moved, [p.position for p in moved]) == ([Pending(t, "NoFit", "no node") for t in waiting[1:]], [2, 3])
