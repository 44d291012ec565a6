"""Chaos scenarios: random failures, restarts and deletions never lose or double-book a task."""

from __future__ import annotations

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
