"""The view protocol (``core/view.py`` ``SchedulerView``): reasons (``queue_status``, ``violations``) and diagnose
(``explain``) read nothing but its members, so a minimal fake with only those members serves them."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from test_core_preemption import cq
from test_core_scheduler import GIB, node, placed, task, usage

from gputask.core import GPU, Scheduler, Task, TaskKey
from gputask.core.cluster import ClusterState
from gputask.core.decisions import Wait
from gputask.core.diagnose import PreemptionView, Victim, diagnose
from gputask.core.ledger import Entry, Ledger
from gputask.core.model import NodeName, Placement
from gputask.core.preemption import Plan
from gputask.core.preemption import Victim as Candidate  # the planner's victim; diagnose's Victim is a report
from gputask.core.queues import QueueManager
from gputask.core.quota import QuotaBook, Usage
from gputask.core.reasons import queue_status, violations
from gputask.core.view import SchedulerView

MEMBERS = tuple(sorted(n for n in vars(SchedulerView) if not n.startswith("_")))


class Narrow:
    """Exactly the protocol's members, each one of the given scheduler's (slots: any other attribute read raises
    AttributeError)."""

    __slots__ = MEMBERS

    def __init__(self, s: Scheduler) -> None:
        for name in MEMBERS:
            setattr(self, name, getattr(s, name))


def busy() -> Scheduler:
    """Queue q preempting lower priorities; n1 (16 GiB) runs ns/low; ns/high waits for room, ns/never waits in a
    queue that does not exist."""
    s = Scheduler(nodes=[node("n1", 16)])
    s.set_queue(cq("q", gpus=8, within="LowerPriority"))
    s.submit(task("low", memory_gib=12))
    s.cycle(0.0)
    s.submit(task("high", memory_gib=12, priority=10, created=1.0))
    s.submit(task("never", queue="missing", created=2.0))
    return s


def test_the_protocol_lists_what_reports_read() -> None:
    """The members of the protocol are the reads listed in ARCHITECTURE.md's view row (a member added or dropped
    shows here)."""
    assert MEMBERS == ("cluster", "filters", "gate", "largest_gpu_mib", "ledger", "never_admits", "nominated",
                       "parked_by_queue", "pending", "place", "preemption_plan", "quotas", "reasons", "running",
                       "try_place", "variants", "waiting_by_filter", "waiting_by_reason")


def test_reports_over_only_the_protocol_say_what_they_say_over_the_scheduler() -> None:
    """``queue_status``, ``violations`` and ``diagnose`` of every task give the same answers through a view that
    has nothing but the protocol's members as through the scheduler."""
    s = busy()
    view: SchedulerView = Narrow(s)
    assert queue_status(view) == queue_status(s)
    assert violations(view) == violations(s) == []
    assert violations(view, nodes=[NodeName("n1")], keys=[TaskKey("ns/low")]) == []
    for key in ("ns/low", "ns/high", "ns/never", "ns/unknown"):
        assert diagnose(view, TaskKey(key)) == diagnose(s, TaskKey(key))
    assert diagnose(view, TaskKey("ns/high")).flavors[0].preemption == PreemptionView(
        (Victim("ns/low", "n1", 0, "q"),), node="n1")


class Minimal:
    """A hand-made view: books built here, no scheduler, canned answers for the four questions a cycle would
    answer (``gate``, ``variants``, ``try_place``, ``preemption_plan``)."""

    __slots__ = MEMBERS

    def __init__(self, gate: Wait | None, plan: Plan | None) -> None:
        self.cluster = ClusterState([node("n1", 16)])
        self.quotas = QuotaBook()
        self.quotas.set_queue(cq("q", gpus=1, within="LowerPriority"))
        self.ledger = Ledger(self.cluster, self.quotas)
        self.ledger.admit(task("low", memory_gib=8), placed("n1", (0, 8 * GIB)), 0.0)
        self.pending = QueueManager()
        self.pending.push(task("high", memory_gib=12, priority=10, created=1.0))
        self.running: Mapping[TaskKey, Entry] = self.ledger.running
        self.nominated: Mapping[TaskKey, Entry] = self.ledger.nominated
        self.reasons: Mapping[TaskKey, tuple[str, str, int]] = {TaskKey("ns/high"): ("NoFit", "no room", 0)}
        self.filters: Mapping[TaskKey, tuple[tuple[str, int], ...]] = {TaskKey("ns/high"): (("GPU", 1),)}
        self.waiting_by_reason: Mapping[tuple[str, str], int] = {("q", "NoFit"): 1}
        self.waiting_by_filter: Mapping[str, int] = {"GPU": 1}
        self.largest_gpu_mib = 16 * GIB
        self.never_admits: Callable[[Task], bool] = lambda t: False
        self.parked_by_queue: Callable[[], dict[str, int]] = dict
        self.gate: Callable[[Task], Wait | None] = lambda t: gate
        self.variants: Callable[[Task], list[Task]] = lambda t: [t]
        self.try_place: Callable[..., tuple[Placement | None, Usage | None, str | None]] = (
            lambda t, node=None: (None, None, None))
        self.preemption_plan: Callable[[Task], Plan | None] = lambda t: plan


def test_reasons_read_a_hand_made_view() -> None:
    """Queue status counts the fake's pending and admitted tasks and its quota usage; its books break nothing."""
    view: SchedulerView = Minimal(None, None)
    assert queue_status(view) == {"q": {"usage": usage(500, 8 * GIB), "borrowed": {GPU: 0},
                                        "pending": 1, "admitted": 1}}
    assert violations(view) == []


def test_a_violation_in_the_fake_books_is_found() -> None:
    """A wait count unlike the waits said is a violation (violations reads the fake's members, not a scheduler's)."""
    view = Minimal(None, None)
    view.waiting_by_reason = {("q", "NoFit"): 2}
    assert violations(view) == ["wait counts {('q', 'NoFit'): 2} {'GPU': 1} are not {('q', 'NoFit'): 1} {'GPU': 1}"]


def test_diagnose_answers_from_the_view_alone() -> None:
    """A gate the view reports is the whole diagnosis; without one, the preemption is the view's plan."""
    gated = diagnose(Minimal(Wait("QueueHeld", "held here"), None), TaskKey("ns/high"))
    assert (gated.state, gated.position, gated.gate, gated.changes) == (
        "pending", 0, Wait("QueueHeld", "held here"),
        ("queue: set spec.stopPolicy: None on its GPUClusterQueue to resume admission (held here)",))
    low = Minimal(None, None).ledger.running[TaskKey("ns/low")]
    plan = Plan(placed("n1", (0, 12 * GIB)), (Candidate(low.task, low.placement, low.usage, low.admitted_at),))
    found = diagnose(Minimal(None, plan), TaskKey("ns/high"))
    assert found.flavors[0].preemption == PreemptionView((Victim("ns/low", "n1", 0, "q"),), node="n1")
    assert diagnose(Minimal(None, None), TaskKey("ns/low")).state == "admitted"
