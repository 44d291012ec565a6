"""Per-GPU timeline of a scenario run (``gputask scenario run --plot FILE.png``).

One horizontal lane per GPU (``node/index``); one bar per admission of a task, from its
admission to its eviction, finish or the end of the run, as tall as the share of the GPU's
memory it reserves (so tasks sharing a GPU stack up); an ``x`` marks each eviction.
Needs matplotlib (the ``sim`` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputask.core import Gpu
from gputask.manifests.convert import gpu_request
from gputask.sim.scenario_model import Scenario, scenario_gpus

Interval = tuple[float, float, float]  # start, end, share of the GPU (0..1]


def write_timeline(result: dict[str, Any], scenario: Scenario, path: Path) -> None:
    """Draw the run's per-GPU timeline into ``path`` (PNG); ``scenario`` is the input as run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = scenario_gpus(scenario)
    lanes = {lane: i for i, lane in enumerate(gpus)}
    specs = [e.submit.spec for _, e in scenario.ordered_events() if e.submit is not None]
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(lanes)))
    colors = matplotlib.colormaps["tab20"]
    placed: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    right = 0.0
    for n, (task, spec) in enumerate(zip(result["tasks"], specs, strict=True)):
        color = colors(n % colors.N)
        for lane, (start, end, share) in _intervals(task, spec, gpus, scenario.until):
            bottom = _stack(placed.setdefault(lane, []), start, end, share)
            right = max(right, end)
            # y grows downwards (lanes listed top to bottom), so a lane fills from its bottom edge up
            ax.barh(
                lanes[lane] + 0.45 - (bottom + share) * 0.9,
                end - start,
                height=share * 0.9,
                left=start,
                align="edge",
                color=color,
                edgecolor="black",
                linewidth=0.5,
                label=f"{task['namespace']}/{task['name']}",
            )
        for entry in task["history"]:
            if entry["event"] == "Evicted":
                for index in entry["gpus"]:
                    ax.plot(entry["at"], lanes[(entry["node"], index)], "x", color="red", markersize=10)
    ax.set_yticks(range(len(lanes)), [f"{node}/{index}" for node, index in lanes])
    ax.set_xlabel("seconds")
    ax.set_xlim(0, (right or scenario.until) * 1.02)
    ax.invert_yaxis()
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if len(unique) <= 30:
        ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    ax.set_title(f"policy {result['policy']}, makespan {result['makespan']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _intervals(
    task: dict[str, Any], spec: Any, gpus: dict[tuple[str, int], Gpu], until: float
) -> list[tuple[tuple[str, int], Interval]]:
    out: list[tuple[tuple[str, int], Interval]] = []
    opened: dict[str, Any] | None = None
    for entry in [*task["history"], {"at": until, "event": "End"}]:
        if entry["event"] == "Admitted":
            opened = entry
        elif opened is not None and entry["event"] in ("Evicted", "Finished", "End"):
            request = gpu_request(spec)
            for index in opened["gpus"]:
                gpu = gpus[(opened["node"], index)]
                share = min(1.0, request.mib_on(gpu) / gpu.memory_mib)
                out.append(((opened["node"], index), (opened["at"], entry["at"], share)))
            opened = None
    return out


def _stack(placed: list[tuple[float, float, float, float]], start: float, end: float, share: float) -> float:
    """Lowest offset in the lane where [start, end) x share overlaps no bar drawn before."""
    overlapping = [p for p in placed if p[0] < end and start < p[1]]
    for bottom in sorted({0.0, *(p[2] + p[3] for p in overlapping)}):
        if all(bottom + share <= p[2] + 1e-9 or p[2] + p[3] <= bottom + 1e-9 for p in overlapping):
            placed.append((start, end, bottom, share))
            return bottom
    placed.append((start, end, 0.0, share))
    return 0.0
