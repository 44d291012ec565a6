"""Defragmentation measured on churn (issue 32): the timed replay (:mod:`gputask.sim.timed`) with defragmentation
off and on, same trace, same arrivals and durations (the replay draws no random numbers).

Every pod opts in (``movable``) in both runs; only the scheduler's ``defragmentation`` settings differ. Reported:
mean and p95 wait (first admission minus arrival, s) of tasks of 4+ GPUs and of whole-node tasks (8 GPUs, the
largest node), of all tasks; GPU allocation (time-averaged over the arrival window, and per hour); moves, moves per
hour of the arrival window and per admitted task of 4+ GPUs; preemptions; tasks never admitted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gputask.core.defrag import DefragConfig
from gputask.sim.timed import TimedResult, replay_timed

WHOLE_NODE_GPUS = 8
"""The GPUs of the trace's largest nodes: a task asking this many takes a whole node."""


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def _waits(result: TimedResult, least: int) -> dict[str, Any]:
    waits = [w for k, w in result.waits.items() if result.gpus[k] >= least]
    return {"tasks": len(waits), "meanWaitS": round(sum(waits) / len(waits), 1) if waits else 0.0,
            "p95WaitS": round(_p95(waits), 1)}


def figures(result: TimedResult) -> dict[str, Any]:
    """The figures of one run (module doc)."""
    big = _waits(result, 4)
    hours = max(result.span_s / 3600.0, 1e-9)
    return {
        "gpus4plus": big,
        "wholeNode": _waits(result, WHOLE_NODE_GPUS),
        "all": _waits(result, 0),
        "gpuAllocationPct": round(result.utilisation_pct, 2),
        "gpuAllocationHourlyPct": result.hourly_pct,
        "moves": result.moves,
        "movesPerHour": round(result.moves / hours, 2),
        "movesPerBigTask": round(result.moves / big["tasks"], 2) if big["tasks"] else 0.0,
        "preemptions": result.preemptions,
        "unadmitted": result.unadmitted,
    }


def compare(
    trace_dir: Path, pods_file: str, *, policy: str, speedup: float, load: int, config: DefragConfig
) -> dict[str, Any]:
    """Figures with defragmentation off and with ``config`` (its mode must be Enabled), and the p95 change of
    4+-GPU tasks (%, negative = lower)."""
    if config.mode != "Enabled":
        raise ValueError(f"defragmentation mode {config.mode!r}: the comparison needs Enabled (DryRun moves nothing)")
    off = figures(replay_timed(trace_dir, pods_file, mode="gputask", policy=policy, speedup=speedup, load=load,
                               defragmentation=DefragConfig()))
    on = figures(replay_timed(trace_dir, pods_file, mode="gputask", policy=policy, speedup=speedup, load=load,
                              defragmentation=config))
    before, after = off["gpus4plus"]["p95WaitS"], on["gpus4plus"]["p95WaitS"]
    change = round(100.0 * (after - before) / before, 1) if before else 0.0
    return {"trace": pods_file, "speedup": speedup, "load": load, "policy": policy, "off": off, "on": on,
            "p95ChangePct4plus": change}
