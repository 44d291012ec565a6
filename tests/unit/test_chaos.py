"""Chaos scenarios: random failures, restarts and deletions never lose or double-book a task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gputask.sim.chaos import generate, summarize
from gputask.sim.scenario import run_scenario


def test_generate_is_deterministic_per_seed() -> None:
    """The same seed gives the same scenario; another seed gives another."""
    assert generate(seed=3, nodes=10, tasks=50) == generate(seed=3, nodes=10, tasks=50)
    assert generate(seed=3, nodes=10, tasks=50) != generate(seed=4, nodes=10, tasks=50)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chaos_run_accounts_for_every_task_without_violations(seed: int) -> None:
    """40 nodes, 400 tasks, outages, deletions, bad GPUs and restarts: no violation, every task in the output."""
    doc = generate(seed=seed, nodes=40, tasks=400)
    kinds = {next(k for k in e if k != "at") for e in doc["events"]}
    summary = summarize(run_scenario(doc), 400)
    assert kinds == {"submit", "delete", "nodeDown", "nodeUp", "nodeDeleted", "gpuUnhealthy", "restartOperator"}
    assert (summary["accountedFor"], summary["violations"], sum(summary["phases"].values())) == (400, [], 400)
    assert set(summary["phases"]) <= {"Succeeded", "Deleted", "Failed", "Pending", "Running"}


def _planted_bugs(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Two core bugs: every 40th task that succeeds keeps its reservation; every 25th reservation counts
    its MiB twice on its GPUs while it lasts (so a GPU can seem over-committed)."""
    from gputask.core.cluster import ClusterState
    from gputask.core.scheduler import Scheduler
    from gputask.sim import scenario

    calls = {"finish": 0, "reserve": 0, "succeeding": 0}
    doubled: set[Any] = set()
    finish, reserve, release = Scheduler.finish, ClusterState.reserve, ClusterState.release
    succeed = scenario._Run._finish

    def succeeding(self: Any, now: float, record: Any, attempt: int) -> None:
        calls["succeeding"] = 1
        try:
            succeed(self, now, record, attempt)
        finally:
            calls["succeeding"] = 0

    def leaky_finish(self: Scheduler, key: Any) -> Any:
        calls["finish"] += calls["succeeding"]
        if calls["succeeding"] and calls["finish"] % 40 == 0:
            return None  # the task succeeded; the core forgets to release it
        return finish(self, key)

    def extra(self: ClusterState, placement: Any, sign: int) -> None:
        state = self.node(placement.only().node)
        for slot in placement.only().gpus:
            state.reserved_mib[state.position[slot.index]] += sign * slot.memory_mib
        self._touched(state)  # as a real change would: the placement index sees it

    def doubling_reserve(self: ClusterState, task: Any, placement: Any, *, force: bool = False) -> None:
        reserve(self, task, placement, force=force)
        if type(self) is not ClusterState:
            return  # a preemption trial's snapshot (core.snapshot): the bugs are planted in the live state only
        calls["reserve"] += 1
        if calls["reserve"] % 25 == 0 and task.request.memory_mib is not None:
            doubled.add(task.key)
            extra(self, placement, +1)

    def undoubling_release(self: ClusterState, key: Any) -> Any:
        if type(self) is not ClusterState:
            return release(self, key)
        reservation = self.reservation(key)
        if key in doubled and reservation is not None and self.has_node(reservation.placement.only().node):
            doubled.discard(key)
            extra(self, reservation.placement, -1)
        return release(self, key)

    monkeypatch.setattr(scenario._Run, "_finish", succeeding)
    monkeypatch.setattr(Scheduler, "finish", leaky_finish)
    monkeypatch.setattr(ClusterState, "reserve", doubling_reserve)
    monkeypatch.setattr(ClusterState, "release", undoubling_release)

    def again() -> None:  # the same bugs at the same calls in the next run
        calls.update(finish=0, reserve=0, succeeding=0)
        doubled.clear()

    return again


def test_checking_what_changed_finds_what_checking_everything_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner checks only the nodes and tasks changed since its last check; with planted core bugs it
    reports exactly the violations (text and first time) that a full check after every cycle reports."""
    from gputask.sim import scenario

    doc = generate(seed=2, nodes=30, tasks=300, load=3.0)
    again = _planted_bugs(monkeypatch)
    incremental = run_scenario(doc)["violations"]
    again()
    changed = scenario._Checks.changed

    def everything(self: Any, scheduler: Any, by_key: Any) -> Any:
        self.full = True
        return changed(self, scheduler, by_key)

    monkeypatch.setattr(scenario._Checks, "changed", everything)
    full = run_scenario(doc)["violations"]
    kinds = {("MiB reserved" in v, "still holds it" in v) for v in full}
    assert incremental == full
    assert {(True, False), (False, True)} <= kinds, full  # both planted bugs were seen


def test_a_loaded_chaos_run_preempts_and_stays_clean() -> None:
    """At three times the default arrival rate queues contend: tasks are preempted, nothing breaks."""
    summary = summarize(run_scenario(generate(seed=1, nodes=40, tasks=600, load=3.0)), 600)
    assert summary["evictions"].get("Preempted", 0) > 0, summary
    assert (summary["accountedFor"], summary["violations"]) == (600, [])
