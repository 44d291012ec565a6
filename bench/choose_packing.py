"""Choose ``packing``'s parameters on one set of seeds and report them on another, both ways round.

Usage::

    python bench/choose_packing.py --trace-dir ../shared/data/alibaba-gpu-v2023/csv \\
        [--seeds-a 100-119] [--seeds-b 42-51] [--jobs 1] [--out bench/results/packing_choice.json]

The trace protocol is ``make bench``'s (random node priority per seed, the same pod orders for every
candidate). Two stages, each a grid of candidates replayed on both seed sets:

A. the per-copy weight c (used below the multi-GPU limit, as :func:`copies_weight_of`) and the sliver
   weight b, on the pod lists without product restrictions where they act: default, cpu250,
   gpushare100, multigpu20 (the pressure weight does nothing there);
B. the pressure weight w, with the (c, b) that stage A chose on the same seed set, on gpuspec10, 20,
   25 and 33 (the lists with product restrictions).

A candidate's objective is the mean over the stage's pod lists of its mean unallocated GPU % at 100%
arrived load; the lowest wins. Each seed set chooses on its own, and each choice is then read off the
other set, so both tables of the issue (chosen on A, reported on B; chosen on B, reported on A) come from
one grid. Writes every run's figure and both choices to ``--out``; prints the grids and the choices.
About 3 CPU-hours for the default seeds (1,440 replays).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gputask.core.placement import register_policy
from gputask.core.policies.packing import MULTI_GPU_LIMIT, Packing, multi_gpu_share
from gputask.core.policies.workload import TargetWorkload
from gputask.sim.bench import pods_file
from gputask.sim.report import UsageError, check_trace, parse_seeds, run_with_progress
from gputask.sim.trace import RunSpec

STAGE_A_LISTS = ("default", "cpu250", "gpushare100", "multigpu20")
STAGE_B_LISTS = ("gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33")
COPIES = (0.5, 0.75, 1.0)
SLIVERS = (0.1, 0.25, 0.4)
PRESSURES = (10.0, 15.0, 20.0, 30.0)
STAGE_A_PRESSURE = 20.0  # no product restrictions on stage A's lists: any value places the same


class Candidate(Packing):
    """``packing`` with its per-copy weight below the multi-GPU limit set to ``below_limit``."""

    def __init__(self, below_limit: float, **kwargs: Any) -> None:
        self.below_limit = below_limit
        super().__init__(**kwargs)

    def copies_weight_for(self, target: TargetWorkload) -> float:
        """``below_limit`` while multi-GPU shapes ask for less than the limit, else 0 (as packing's rule)."""
        return self.below_limit if multi_gpu_share(target) < MULTI_GPU_LIMIT else 0.0


def candidate_name(copies: float, sliver: float, pressure: float) -> str:
    """The registry name of one candidate, registering it on first use."""
    name = f"packing[c={copies},b={sliver},w={pressure}]"

    def make() -> Candidate:
        policy = Candidate(copies, sliver_weight=sliver, pressure_weight=pressure)
        policy.name = name
        return policy

    register_policy(name, make)
    return name


def replay_grid(
    trace_dir: Path, names: Sequence[str], lists: Sequence[str], seeds: Sequence[int], jobs: int
) -> dict[str, dict[str, float]]:
    """Mean unallocated % at 100% by candidate and pod list (fails on any refusal of a feasible pod)."""
    specs = [RunSpec(str(trace_dir), pods_file(t), n, s, "random") for t in lists for n in names for s in seeds]
    results = run_with_progress(specs, jobs=jobs)
    if any(r.refused_feasible for r in results):
        raise SystemExit("choose_packing: a candidate refused a pod that fitted")
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for spec, result in zip(specs, results, strict=True):
        sums[spec.policy][spec.pods_file] += result.unallocated_at_100 / len(seeds)
    return {name: {t: sums[name][pods_file(t)] for t in lists} for name in names}


def best(grid: dict[str, dict[str, float]]) -> str:
    """The candidate with the lowest mean over its pod lists (ties: the first listed)."""
    return min(grid, key=lambda name: sum(grid[name].values()) / len(grid[name]))


def choose(trace_dir: Path, seed_sets: dict[str, list[int]], jobs: int) -> dict[str, Any]:
    """Both stages on both seed sets; the grids and what each set chose."""
    stage_a = [candidate_name(c, b, STAGE_A_PRESSURE) for c in COPIES for b in SLIVERS]
    grids: dict[str, Any] = {"A": {}, "B": {}}
    for label, seeds in seed_sets.items():
        grids["A"][label] = replay_grid(trace_dir, stage_a, STAGE_A_LISTS, seeds, jobs)
    params = {n: (c, b) for n, (c, b) in zip(stage_a, [(c, b) for c in COPIES for b in SLIVERS], strict=True)}
    chosen_a = {label: params[best(grids["A"][label])] for label in seed_sets}
    stage_b = {cb: [candidate_name(*cb, w) for w in PRESSURES] for cb in set(chosen_a.values())}
    for label, seeds in seed_sets.items():
        names = [n for cb in stage_b for n in stage_b[cb]]
        grids["B"][label] = replay_grid(trace_dir, names, STAGE_B_LISTS, seeds, jobs)
    chosen = {}
    for label in seed_sets:
        names = stage_b[chosen_a[label]]
        chosen[label] = best({n: grids["B"][label][n] for n in names})
    return {"grids": grids, "chosen": chosen}


def main(argv: list[str] | None = None) -> int:
    """Parse, run, print, write; the exit code (2 on bad input)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, required=True)
    parser.add_argument("--seeds-a", default="100-119")
    parser.add_argument("--seeds-b", default="42-51")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "packing_choice.json")
    args = parser.parse_args(argv)
    try:
        seed_sets = {"a": parse_seeds(args.seeds_a), "b": parse_seeds(args.seeds_b)}
        check_trace(args.trace_dir, [pods_file(t) for t in STAGE_A_LISTS + STAGE_B_LISTS])
    except UsageError as err:
        print(f"choose_packing: {err}", file=sys.stderr)
        return 2
    found = choose(args.trace_dir, seed_sets, args.jobs)
    found["seeds"] = {label: f"{s[0]}-{s[-1]}" for label, s in seed_sets.items()}
    for stage, by_set in found["grids"].items():
        for label, grid in by_set.items():
            print(f"stage {stage}, seeds {found['seeds'][label]}:")
            for name, means in sorted(grid.items(), key=lambda kv: sum(kv[1].values())):
                cells = "  ".join(f"{t} {v:.3f}" for t, v in means.items())
                print(f"  {name:34s} mean {sum(means.values()) / len(means):.3f}  {cells}")
    for label, name in found["chosen"].items():
        print(f"chosen on seeds {found['seeds'][label]}: {name}")
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
