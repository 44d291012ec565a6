"""Per-GPU occupancy of a scenario run (``gputask scenario run --plot FILE.png``).

Top panel: one horizontal lane per GPU (``node/index``), time (simulated seconds) across; one bar per
admission of a task, coloured by task, from its admission to its eviction, its finish or the end of the
run, as tall as the share of the GPU's memory it reserves (tasks sharing a GPU stack up). Bars of tasks
still running when the run ends are hatched; a red ``x`` marks each eviction; dashed lines mark the last
finish (the makespan) and the end of the run. Bottom panel: GPU memory reserved, in % of the cluster's,
over time. The title counts the tasks that finished, still run, still wait or failed; tasks never
admitted are listed under the plot. Needs matplotlib (the ``sim`` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputask.core import Gpu
from gputask.manifests.convert import gpu_request
from gputask.sim.scenario_model import Scenario, scenario_gpus

Interval = tuple[float, float, float, bool]  # start, end (s), share of the GPU (0..1], still running at the end


class PlotError(Exception):
    """The plot cannot be written (matplotlib missing, the path not writable): one line, exit 2."""


def title_of(result: dict[str, Any], until: float) -> str:
    """``policy packing: 3 of 5 tasks finished, the last at 310 s; at the end (600 s): 1 running, 1 waiting``."""
    tasks = result["tasks"]
    phases: dict[str, int] = {}
    for task in tasks:
        phases[task["phase"]] = phases.get(task["phase"], 0) + 1
    done = phases.get("Succeeded", 0)
    head = f"policy {result['policy']}: {done} of {len(tasks)} tasks finished"
    if result["makespan"] is not None:
        head += f", the last at {result['makespan']:g} s"
    rest = [f"{phases[p]} {word}" for p, word in (("Running", "running"), ("Pending", "waiting"),
                                                  ("Failed", "failed")) if phases.get(p)]
    return head + (f"; at the end ({until:g} s): {', '.join(rest)}" if rest else "")


def write_timeline(result: dict[str, Any], scenario: Scenario, path: Path) -> None:
    """Draw the run's per-GPU occupancy into ``path`` (PNG); ``scenario`` is the input as run.

    Raises :class:`PlotError` when matplotlib is not installed or ``path`` cannot be written.
    """
    try:
        import matplotlib
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'gputask[sim]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    gpus = scenario_gpus(scenario)
    lanes = {lane: i for i, lane in enumerate(gpus)}
    specs = [e.submit.spec for _, e in scenario.ordered_events() if e.submit is not None]
    until = scenario.until
    height = 1.6 + 0.45 * len(lanes)
    fig, (ax, use) = plt.subplots(
        2, 1, figsize=(12, height + 2.2), sharex=True, gridspec_kw={"height_ratios": [height, 1.6]}
    )
    colors = matplotlib.colormaps["tab20"]
    placed: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    changes: dict[float, float] = {}  # time -> change of reserved MiB
    handles: list[Any] = []
    never: list[str] = []
    right = 0.0  # where the picture ends: the end of the run if a task still runs then, else the last bar's end
    for n, (task, spec) in enumerate(zip(result["tasks"], specs, strict=True)):
        color = colors(n % colors.N)
        name = f"{task['namespace']}/{task['name']}"
        intervals = _intervals(task, spec, gpus, until)
        if not intervals:
            never.append(f"{name} ({task['reason'] or task['phase']})")
        for lane, (start, end, share, open_end) in intervals:
            right = max(right, until if open_end else end)
            bottom = _stack(placed.setdefault(lane, []), start, end, share)
            ax.barh(  # y grows downwards (lanes listed top to bottom): a lane fills from its bottom edge up
                lanes[lane] + 0.45 - (bottom + share) * 0.9, end - start, height=share * 0.9, left=start,
                align="edge", color=color, edgecolor="black", linewidth=0.5, hatch="//" if open_end else None,
            )
            mib = share * gpus[lane].memory_mib
            changes[start] = changes.get(start, 0.0) + mib
            if not open_end:  # still reserved when the run ends
                changes[end] = changes.get(end, 0.0) - mib
        if intervals and len(handles) < 30:
            handles.append(Patch(facecolor=color, edgecolor="black", label=name))
        for entry in task["history"]:
            if entry["event"] == "Evicted":
                for lane, _ in _lanes_of(entry):
                    ax.plot(entry["at"], lanes[lane], "x", color="red", markersize=10)
    marks = [
        Patch(facecolor="white", edgecolor="black", hatch="//", label="still running at the end"),
        Line2D([], [], marker="x", color="red", linestyle="none", markersize=8, label="evicted"),
    ]
    if result["makespan"] is not None:
        marks.append(Line2D([], [], color="black", linestyle="--", label="last finish (makespan)"))
    if right >= until:
        marks.append(Line2D([], [], color="grey", linestyle=":", label="end of the run"))
    right = right or until
    for axis in (ax, use):
        if result["makespan"] is not None:
            axis.axvline(result["makespan"], color="black", linestyle="--", linewidth=1)
        if right >= until:
            axis.axvline(until, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(lanes)), [f"{node}/{index}" for node, index in lanes])
    ax.set_ylabel("GPU (node/index)\nbar height: share of its memory")
    ax.invert_yaxis()
    ax.legend(handles=handles + marks, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small",
              title="tasks (colour)" if len(handles) < 30 else "first 30 tasks")
    ax.set_title(title_of(result, until), fontsize="medium")
    total = sum(g.memory_mib for g in gpus.values()) or 1
    times, levels, level = [0.0], [0.0], 0.0
    for at in sorted(changes):
        level += changes[at]
        times.append(at)
        levels.append(100.0 * max(level, 0.0) / total)
    times.append(right)
    levels.append(levels[-1])
    use.step(times, levels, where="post", color="tab:blue", label="GPU memory reserved")
    use.set_ylim(0, 105)
    use.set_ylabel("reserved\n(% of cluster)")
    use.set_xlabel("simulated time (s)")
    use.set_xlim(0, right * 1.02)
    if never:
        shown = ", ".join(never[:8]) + (f" and {len(never) - 8} more" if len(never) > 8 else "")
        fig.text(0.01, 0.005, f"never admitted: {shown}", fontsize="small", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if never else 0, 1, 1))
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise PlotError(f"--plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _intervals(
    task: dict[str, Any], spec: Any, gpus: dict[tuple[str, int], Gpu], until: float
) -> list[tuple[tuple[str, int], Interval]]:
    out: list[tuple[tuple[str, int], Interval]] = []
    opened: dict[str, Any] | None = None
    for entry in [*task["history"], {"at": until, "event": "End"}]:
        if entry["event"] == "Admitted":
            opened = entry
        elif opened is not None and entry["event"] in ("Evicted", "Finished", "End", "Deleted", "Failed"):
            request = gpu_request(spec) if "pods" not in opened else None
            for lane, mib in _lanes_of(opened):
                gpu = gpus[lane]
                share = min(1.0, (mib if request is None else request.mib_on(gpu)) / gpu.memory_mib)
                out.append((lane, (opened["at"], entry["at"], share, entry["event"] == "End")))
            opened = None
    return out


def _lanes_of(entry: dict[str, Any]) -> list[tuple[tuple[str, int], int]]:
    """((node, GPU index), MiB reserved on it) of a history entry: its ``pods`` for a task of podSets (each pod's
    node and ``memoryPerGpu``), else its one ``node`` and ``gpus`` (MiB 0: the request says)."""
    if "pods" in entry:
        return [((pod["node"], index), pod["memoryPerGpu"]) for pod in entry["pods"] for index in pod["gpus"]]
    return [((entry["node"], index), 0) for index in entry["gpus"]]


def _stack(placed: list[tuple[float, float, float, float]], start: float, end: float, share: float) -> float:
    """Lowest offset in the lane where [start, end) x share overlaps no bar drawn before."""
    overlapping = [p for p in placed if p[0] < end and start < p[1]]
    for bottom in sorted({0.0, *(p[2] + p[3] for p in overlapping)}):
        if all(bottom + share <= p[2] + 1e-9 or p[2] + p[3] <= bottom + 1e-9 for p in overlapping):
            placed.append((start, end, bottom, share))
            return bottom
    placed.append((start, end, 0.0, share))
    return 0.0
