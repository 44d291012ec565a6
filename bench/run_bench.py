"""Run the trace benchmark (``make bench``): 17 pod lists x policies x seeds, plus the reproduction.

Usage::

    python bench/run_bench.py --trace-dir ../shared/data/alibaba-gpu-v2023/csv [--jobs 2]
        [--seeds 42-51] [--tie-break random] [--traces default,gpuspec33] [--out bench/results]

Writes ``summary.json`` (``{TRACE_FILE: <DESIGN.md section 7 object>}`` under ``--tie-break``),
``reproduction.json`` (the default pod list under the other tie-break), ``summary.md`` and
``allocation.png`` to ``--out``. Exit code 1 when any policy refused a pod that some node could
hold (the honest-metric rule), 2 on bad input. See :mod:`gputask.sim.bench`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gputask.sim.bench import BENCH_POLICIES, BENCH_TRACES, pods_file, run_bench, write_results
from gputask.sim.report import UsageError, check_trace, parse_seeds, resolve_policies
from gputask.sim.trace import TIE_BREAKS


def main(argv: list[str] | None = None) -> int:
    """Parse, run, write; the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--tie-break", choices=TIE_BREAKS, default="random")
    parser.add_argument("--traces", default=",".join(BENCH_TRACES))
    parser.add_argument("--policies", default=",".join(BENCH_POLICIES))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        policies = resolve_policies(args.policies.split(","))
        traces = [t for t in args.traces.split(",") if t]
        check_trace(args.trace_dir, [pods_file(t) for t in traces])
    except UsageError as err:
        print(f"run_bench: {err}", file=sys.stderr)
        return 2
    started = time.monotonic()
    common = {"policies": policies, "seeds": seeds, "jobs": args.jobs, "quiet": args.quiet}
    main_runs = run_bench(args.trace_dir, traces=traces, tie_break=args.tie_break, **common)
    other_tie = next(t for t in TIE_BREAKS if t != args.tie_break)
    other = run_bench(args.trace_dir, traces=["default"], tie_break=other_tie, **common) if "default" in traces else {}
    write_results(args.out, args.trace_dir, main_runs, other, seeds=seeds)
    print(f"run_bench: wrote {args.out} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    refused = [
        f"{trace}:{policy}"
        for summaries in (main_runs, other)
        for trace, summary in summaries.items()
        for policy, body in summary["policies"].items()
        if body["refusedFeasible"]["max"]
    ]
    if refused:
        print(f"run_bench: policies refused pods that fitted: {', '.join(refused)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
