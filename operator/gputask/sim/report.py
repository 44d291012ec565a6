"""``gputask simulate``: run (trace, policy, seed) replays, summarise, print a table or JSON.

The JSON shape is DESIGN.md section 7: ``{"trace", "tieBreak", "policies": {NAME:
{"unallocatedPctAt100", "allocationPctAt100", "failedPods", "refusedFeasible"} each
{"mean", "min", "max"}}, "fgdExpected"}``, plus per-run details and the allocation curve
(``allocationPctByArrivedPct``, index = arrived %, 0..130) for plots. Several pod lists print
``{TRACE_FILE: {...}}``, the shape ``make bench`` writes.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from gputask.core.placement import DEFAULT_POLICY, POLICIES
from gputask.sim.trace import (
    DEFAULT_PODS,
    MAX_PCT,
    NODE_LIST,
    TIE_BREAKS,
    RunResult,
    RunSpec,
    TraceError,
    load_trace,
    run,
)

FGD_RESULTS = Path("fgd-expected-results") / "analysis_allo_discrete.csv"
"""The FGD authors' per-run allocation curves, beside the ``csv`` folder of the trace."""
FGD_SEEDS = range(42, 52)
FGD_TIE_BREAK = "random"
"""The authors' simulator prefixes node names with a random string per run."""
OURS_TO_FGD = {"random": "Random", "bestfit-atc23": "BestFit", "fgd": "FGD"}
"""Our policies that reproduce one of the paper's (same definition; our ``bestfit`` is a different,
GPU-only exact best fit), shown next to the paper's figure in the table."""
TRACE_HINT = (
    "get the Alibaba GPU cluster trace v2023 from https://github.com/alibaba/clusterdata "
    "(folder cluster-trace-gpu-v2023/csv) and pass that folder with --trace-dir"
)


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


# -- parsing the command line ------------------------------------------------------------------
def parse_seeds(text: str) -> list[int]:
    """Seeds from ``"42-51"``, ``"42,45,50"`` or ``"42"`` (ranges inclusive)."""
    seeds: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            low, sep, high = part.partition("-")
            seeds.extend(range(int(low), int(high) + 1) if sep else [int(low)])
    except ValueError:
        raise UsageError(f"bad --seeds {text!r}: use e.g. 42-51 or 42,43") from None
    if not seeds:
        raise UsageError(f"bad --seeds {text!r}: no seed")
    return list(dict.fromkeys(seeds))


def resolve_policies(names: Sequence[str] | None) -> list[str]:
    """Policy names to run: the given ones (``all`` = every registered policy) or the defaults."""
    if not names:
        names = ["bestfit", "firstfit", "random", "bestfit-atc23", "fgd", DEFAULT_POLICY]
    if "all" in names:
        names = sorted(POLICIES)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise UsageError(f"unknown policy {unknown[0]!r}; known: {', '.join(sorted(POLICIES))}")
    return list(dict.fromkeys(names))


def check_trace(trace_dir: Path, pods_files: Sequence[str]) -> None:
    """Raise UsageError, saying where to get the trace, unless every file is there."""
    if not (trace_dir / NODE_LIST).is_file():
        raise UsageError(f"no trace at {trace_dir} ({NODE_LIST} not found): {TRACE_HINT}")
    for name in pods_files:
        if not (trace_dir / name).is_file():
            known = sorted(p.name for p in trace_dir.glob("openb_pod_list_*.csv"))
            raise UsageError(f"pod list {name} not in {trace_dir}; found: {', '.join(known) or 'none'}")


# -- the FGD authors' figures ---------------------------------------------------------------------
def fgd_expected(trace_dir: Path, pods_file: str) -> dict[str, Any] | None:
    """The paper's unallocated GPU % at 100% arrived, mean over seeds 42..51, per policy.

    Read from ``fgd-expected-results/analysis_allo_discrete.csv`` beside the trace folder
    (100 minus column "100"); None when the file or the trace's rows are absent.
    """
    path = trace_dir.parent / FGD_RESULTS
    if not path.is_file():
        return None
    workload = Path(pods_file).stem
    values: dict[str, list[float]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] == workload and int(row["seed"]) in FGD_SEEDS:
                policy = row["sc_policy"].split("-", 1)[-1]
                values.setdefault(policy, []).append(100.0 - float(row["100"]))
    if not values:
        return None
    return {
        "source": FGD_RESULTS.as_posix(),
        "workload": workload,
        "seeds": [FGD_SEEDS.start, FGD_SEEDS.stop - 1],
        "tieBreak": FGD_TIE_BREAK,
        "unallocatedPctAt100": {p: _num(sum(v) / len(v)) for p, v in values.items()},
    }


# -- summaries -------------------------------------------------------------------------------------
def _num(value: float) -> float | None:
    """A JSON-friendly number: rounded to 4 decimals, None for NaN."""
    return None if math.isnan(value) else round(value, 4)


def stats(values: Iterable[float]) -> dict[str, float | None]:
    """``{"mean", "min", "max"}`` of ``values`` (NaN-free values only; None when none)."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return {"mean": None, "min": None, "max": None}
    return {"mean": _num(sum(clean) / len(clean)), "min": _num(min(clean)), "max": _num(max(clean))}


def mean_curve(runs: Sequence[RunResult]) -> list[float | None]:
    """Per arrived % (0..130), the mean allocation % over the runs that have a value there."""
    out: list[float | None] = []
    for pct in range(MAX_PCT + 1):
        values = [v for r in runs if (v := r.curve[pct]) is not None]
        out.append(_num(sum(values) / len(values)) if values else None)
    return out


def run_json(result: RunResult) -> dict[str, Any]:
    """One run's figures and curve."""
    return {
        "seed": result.seed,
        "pods": result.pods,
        "failedPods": result.failed_pods,
        "refusedFeasible": result.refused_feasible,
        "allocationPctAt100": _num(result.allocation_at_100),
        "unallocatedPctAt100": _num(result.unallocated_at_100),
        "allocationPctByArrivedPct": [None if v is None else _num(v) for v in result.curve],
    }


def policy_json(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Summary of one policy's runs (one per seed)."""
    return {
        "unallocatedPctAt100": stats(r.unallocated_at_100 for r in runs),
        "allocationPctAt100": stats(r.allocation_at_100 for r in runs),
        "failedPods": stats(float(r.failed_pods) for r in runs),
        "refusedFeasible": stats(float(r.refused_feasible) for r in runs),
        "seeds": [r.seed for r in runs],
        "allocationPctByArrivedPct": mean_curve(runs),
        "runs": [run_json(r) for r in runs],
    }


def trace_json(
    pods_file: str, tie_break: str, runs: Sequence[RunResult], policies: Sequence[str], fgd: dict[str, Any] | None
) -> dict[str, Any]:
    """The DESIGN.md section 7 object for one pod list."""
    return {
        "trace": pods_file,
        "nodes": NODE_LIST,
        "tieBreak": tie_break,
        "policies": {p: policy_json([r for r in runs if r.policy == p]) for p in policies},
        "fgdExpected": fgd,
    }


# -- running ----------------------------------------------------------------------------------------
def run_all(specs: Sequence[RunSpec], *, jobs: int, advance: Callable[[], None]) -> list[RunResult]:
    """Run every spec (in a process pool when ``jobs`` > 1); results in the order of ``specs``."""
    if jobs <= 1:
        results = []
        for spec in specs:
            results.append(run(spec))
            advance()
        return results
    by_spec: dict[RunSpec, RunResult] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run, spec): spec for spec in specs}
        for future in as_completed(futures):
            by_spec[futures[future]] = future.result()
            advance()
    return [by_spec[spec] for spec in specs]


def run_with_progress(specs: Sequence[RunSpec], *, jobs: int, quiet: bool = False) -> list[RunResult]:
    """:func:`run_all` reporting on stderr (:class:`gputask.progress.Progress`: a bar on a terminal, plain lines
    otherwise, nothing when ``quiet``)."""
    from gputask.progress import Progress

    with Progress("replaying", len(specs), unit="runs", quiet=quiet) as progress:
        return run_all(specs, jobs=jobs, advance=progress.advance)


# -- the table ----------------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def caption(summary: dict[str, Any], seeds: Sequence[int]) -> str:
    """What the table compares: trace, cluster, seeds, tie-break, and the paper's figures."""
    order = "smallest node name" if summary["tieBreak"] == "name" else "random node priority per seed"
    seed_text = (
        f"{seeds[0]}-{seeds[-1]}"
        if list(seeds) == list(range(seeds[0], seeds[-1] + 1))
        else (",".join(map(str, seeds)))
    )
    text = (
        f"Trace {summary['trace']} on {summary['nodes']}, seeds {seed_text}, tie-break: "
        f"{summary['tieBreak']} ({order}). Unallocated GPU % at 100% arrived workload. "
        "Unplaced pods: pods that fitted on no node when they arrived (the protocol submits pods up to 130% of "
        "the cluster's GPUs, so most of these come after it is full); refused feasible: pods refused although a "
        "node could hold them (always 0, checked). Pod orders come from gputask's own RNG, not the paper's."
    )
    fgd = summary["fgdExpected"]
    if fgd:
        figures = ", ".join(f"{p} {_pct(v)}" for p, v in fgd["unallocatedPctAt100"].items())
        text += (
            f"\nColumn paper: the FGD paper's figure for the same policy (Weng et al., ATC '23; authors' results, "
            f"seeds 42-51, tie-break {fgd['tieBreak']}): {figures}. bestfit-atc23 and fgd reproduce BestFit and "
            "FGD; bestfit differs."
        )
    return text


def render_table(summary: dict[str, Any], seeds: Sequence[int]) -> Any:
    """A rich Table of one trace's summary."""
    from rich.table import Table

    table = Table(title=f"gputask simulate: {summary['trace']}", caption=caption(summary, seeds))
    for header in (  # short enough for 80 columns
        "policy",
        "unalloc % mean",
        "min",
        "max",
        "unplaced pods (mean)",
        "refused feasible",
        "paper",
    ):
        if header == "policy":  # never cut a policy's name (the caption refers to them): the numbers wrap first
            table.add_column(header, justify="left", no_wrap=True, min_width=len(max(summary["policies"], key=len)))
        else:
            table.add_column(header, justify="right")
    fgd = (summary["fgdExpected"] or {}).get("unallocatedPctAt100", {})
    for name, body in summary["policies"].items():
        unalloc = body["unallocatedPctAt100"]
        failed = body["failedPods"]["mean"]
        table.add_row(
            name,
            _pct(unalloc["mean"]),
            _pct(unalloc["min"]),
            _pct(unalloc["max"]),
            "-" if failed is None else f"{failed:.1f}",
            f"{body['refusedFeasible']['max'] or 0:g}",
            _pct(fgd.get(OURS_TO_FGD.get(name, ""))),
        )
    return table


# -- the command ----------------------------------------------------------------------------------------
def simulate_command(
    trace_dir: Path,
    *,
    pods: list[str] | None,
    policies: list[str] | None,
    seeds: str,
    output: str,
    jobs: int,
    tie_break: str = "random",
    quiet: bool = False,
) -> int:
    """Validate, run every (trace, policy, seed), print; 2 on bad input, 1 if a policy refused a fit."""
    try:
        summaries, seed_list = _simulate(
            trace_dir, pods=pods, policies=policies, seeds=seeds, output=output, jobs=jobs, tie_break=tie_break,
            quiet=quiet,
        )
    except (UsageError, TraceError) as err:
        print(f"gputask simulate: {err}", file=sys.stderr)
        return 2
    _print(summaries, seed_list, output)
    refused = [s["trace"] + ":" + p for s in summaries for p, b in s["policies"].items() if b["refusedFeasible"]["max"]]
    if refused:
        print(f"gputask simulate: policies refused pods that fitted: {', '.join(refused)}", file=sys.stderr)
        return 1
    return 0


def _simulate(
    trace_dir: Path,
    *,
    pods: list[str] | None,
    policies: list[str] | None,
    seeds: str,
    output: str,
    jobs: int,
    tie_break: str,
    quiet: bool = False,
) -> tuple[list[dict[str, Any]], list[int]]:
    if output not in ("table", "json"):
        raise UsageError(f"--output must be table or json, not {output!r}")
    if tie_break not in TIE_BREAKS:
        raise UsageError(f"--tie-break must be one of {', '.join(TIE_BREAKS)}, not {tie_break!r}")
    if jobs < 1:
        raise UsageError(f"--jobs must be 1 or more, not {jobs}")
    pods_files = list(dict.fromkeys(pods or [DEFAULT_PODS]))
    names, seed_list = resolve_policies(policies), parse_seeds(seeds)
    check_trace(trace_dir, pods_files)
    for name in pods_files:
        load_trace(str(trace_dir), name)  # fail early, before any worker starts, on a bad file
    specs = [RunSpec(str(trace_dir), f, p, s, tie_break) for f in pods_files for p in names for s in seed_list]
    results = run_with_progress(specs, jobs=max(1, jobs), quiet=quiet)
    summaries = [
        trace_json(
            f,
            tie_break,
            [r for r, spec in zip(results, specs, strict=True) if spec.pods_file == f],
            names,
            fgd_expected(trace_dir, f),
        )
        for f in pods_files
    ]
    return summaries, seed_list


def _print(summaries: list[dict[str, Any]], seeds: Sequence[int], output: str) -> None:
    if output == "json":
        body: Any = summaries[0] if len(summaries) == 1 else {s["trace"]: s for s in summaries}
        print(json.dumps(body, indent=2))
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a pipe or a file: do not cut the columns at 80
        console = Console(width=200)
    for summary in summaries:
        console.print(render_table(summary, seeds))
