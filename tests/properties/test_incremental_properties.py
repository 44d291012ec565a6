"""A scheduler whose cycles cost what changed decides exactly as one that walks every pending task every cycle.

Two schedulers get the same random stream of inputs (tasks submitted ahead of and behind the waiting ones,
finishes, requeues, backoffs, nodes reported again or changed) and cycles at advancing times; after every cycle
their decisions, the reasons and positions they recorded, what waits and what runs must be the same. The one
with ``incremental=False`` is the walk as it was before cycles could be skipped or tried incrementally.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_core_properties import QUEUES, nodes, queue_specs, requests

from gputask.core import Admit, Decision, Node, Pending, QueueSpec, Scheduler, Task, TaskKey, make_policy

Op = tuple[str, Any]

submit = st.tuples(
    st.just("submit"), st.tuples(requests(), st.sampled_from(QUEUES), st.integers(0, 2), st.sampled_from((1, 1, 0)))
)
churn = st.one_of(
    st.tuples(st.just("cycle"), st.sampled_from((0.0, 1.0, 30.0))),
    st.tuples(st.just("finish"), st.integers(0, 1000)),
    st.tuples(st.just("requeue"), st.integers(0, 1000)),
    st.tuples(st.just("defer"), st.tuples(st.integers(0, 1000), st.sampled_from((0.5, 5.0, 50.0)))),
    st.tuples(st.just("node"), st.tuples(st.integers(0, 100), st.booleans())),
)


@st.composite
def streams(draw: st.DrawFn) -> list[Op]:
    """Rounds of submissions and cycles (often several cycles with nothing in between), then churn."""
    out: list[Op] = []
    for _ in range(draw(st.integers(1, 6))):
        out += draw(st.lists(submit, min_size=1, max_size=6))
        out += [("cycle", 1.0)] * draw(st.integers(1, 3))
        out += draw(st.lists(submit, max_size=3)) + [("cycle", 1.0)]  # new tasks after a cycle that settled
        out += draw(st.lists(st.one_of(churn, submit), max_size=6))
    return out


def normal(decisions: list[Decision]) -> list[tuple[object, ...]]:
    """Decisions as comparable tuples, the position of a Pending included (its equality leaves it out)."""
    out: list[tuple[object, ...]] = []
    for d in decisions:
        if isinstance(d, Pending):
            out.append(("Pending", d.task.key, d.reason, d.message, d.position, d.filters))
        elif isinstance(d, Admit):
            out.append(("Admit", d.task.key, d.placement, tuple(sorted(d.usage.items()))))
        else:
            out.append((type(d).__name__, d.task.key, repr(d)))
    return out


class Pair:
    """The scheduler under test and the reference walk, fed alike."""

    def __init__(self, cluster: list[Node], queues: list[QueueSpec], policy: str) -> None:
        self.both = [Scheduler(policy=make_policy(policy, seed=1), nodes=cluster, incremental=flag)
                     for flag in (True, False)]
        for s in self.both:
            for spec in queues:
                s.set_queue(spec)
        self.nodes = {n.name: n for n in cluster}
        self.submitted: list[Task] = []
        self.now = 0.0

    def apply(self, kind: str, arg: Any) -> None:
        """One input to both (a cycle: compare what they decided and recorded)."""
        if kind == "cycle":
            self.now += arg
            self.cycle()
            return
        for s in self.both:
            self._input(s, kind, arg)
        if kind == "submit":
            self.submitted.append(self._task(arg))

    def _task(self, arg: Any) -> Task:
        request, queue, priority, later = arg
        n = len(self.submitted)
        created = float(n) if later else -float(n)  # some arrive ahead of every waiting task of their priority
        return Task(TaskKey(f"ns/t{n}"), queue, request, priority=priority, created=created)

    def _input(self, s: Scheduler, kind: str, arg: Any) -> None:
        keys = [t.key for t in self.submitted]
        if kind == "submit":
            s.submit(self._task(arg))
        elif kind == "finish" and keys:
            s.finish(keys[arg % len(keys)])
        elif kind == "requeue" and s.running:
            s.requeue(sorted(s.running)[arg % len(s.running)])
        elif kind == "defer" and keys:
            key = keys[arg[0] % len(keys)]
            if key in s.pending:
                s.defer(key, self.now + arg[1], "Backoff", "held back")
        elif kind == "node" and self.nodes:
            node = self.nodes[sorted(self.nodes)[arg[0] % len(self.nodes)]]
            s.set_node(node if arg[1] else replace(node, schedulable=not node.schedulable))  # again, or changed

    def cycle(self) -> None:
        ours, walked = (normal(s.cycle(self.now)) for s in self.both)
        mode = self.both[0].stats.mode
        event(f"cycle {mode}")
        assert ours == walked, mode
        assert [_state(s) for s in self.both][0] == _state(self.both[1]), mode


def _state(s: Scheduler) -> tuple[object, ...]:
    """What a scheduler recorded: reasons with positions, filters, waiting and running tasks, backoffs."""
    return (dict(s.reasons), dict(s.filters), sorted(s.pending.keys()),
            {k: e.placement for k, e in s.running.items()}, sorted(s.nominated), dict(s.deferred))


@settings(max_examples=300, deadline=None)
@given(nodes(), queue_specs(), st.sampled_from(("bestfit", "firstfit", "packing", "random")), streams())
def test_a_cycle_that_costs_what_changed_decides_as_the_full_walk(
    cluster: list[Node], queues: list[QueueSpec], policy: str, ops: list[Op]
) -> None:
    """Skipped, incremental and full cycles give the same decisions, reasons, positions and state as walking every
    pending task every cycle."""
    pair = Pair(cluster, queues, policy)
    for kind, arg in ops:
        pair.apply(kind, arg)
    pair.apply("cycle", 1.0)
