"""Placement speed of the core on one CPU core (``make bench-speed``; also run by ``make bench``).

Two measurements, each in this one process (no pool), written to ``bench/results/speed.json``:

1. **trace**: the default pod list of the Alibaba GPU trace v2023 replayed on its 1,213-node
   cluster (FGD protocol, seed 42): placements per second = pods placed or found unplaceable,
   each one ``find_placement`` plus, when placed, a reservation; per policy.
2. **synthetic**: a 5,000-node, 40,000-GPU cluster (8 GPUs per node, three products) and
   50,000 pending tasks (whole GPUs 1/2/4/8, memory and fraction shares, some restricted to a
   product) in four GPUClusterQueues of one cohort with nominal quotas, scheduled by the full
   ``Scheduler.cycle`` (queue order, quota, placement, preemption planning when nothing fits)
   until a cycle admits nothing more; admissions per second over the cycles' wall time. Then what a later
   cycle costs with 50,000 tasks waiting (``laterCycleMs``, :func:`later_cycles`): with nothing new and with
   100 new tasks, walking every pending task as before and as the scheduler does now (skipped, incremental).
3. **syntheticFlavors**: part 2 with the quota split into one ResourceFlavor per product (the default
   policy only): what trying a task in each flavor in turn costs.
4. **gangs** (:func:`gang_speed`, issue 30): gangs of 8 and 64 pods of 8 whole GPUs placed (``find_placement``, all
   or nothing, then reserved) on 1,000 and 5,000 8-GPU nodes, with no topology and with a required domain of 32
   nodes (label ``example.com/rack``); milliseconds per gang and per pod (the median of the gangs placed until a
   quarter of the cluster is full).

Peak RSS (``resource.getrusage``) is reported after each part; it only grows, so a later
part's figure covers the earlier ones. Timings depend on the machine: the JSON names it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gputask.core import (
    DEFAULT_POLICY,
    GPU,
    Admit,
    ClusterState,
    Gpu,
    GpuRequest,
    Node,
    NodeName,
    PodSet,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
    find_placement,
    make_policy,
)
from gputask.core.flavors import Flavor, flavored
from gputask.sim.report import UsageError, check_trace
from gputask.sim.trace import GPU_MIB, RunSpec, build_nodes, load_trace, replay, workload

GIB = 1024
PRODUCTS = (("NVIDIA-A100-SXM4-80GB", 80 * GIB, 0.6), ("NVIDIA-A10", 24 * GIB, 0.25), ("Tesla-T4", 16 * GIB, 0.15))


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict[str, Any]:
    """CPU model, core count and Python of this machine."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "system": platform.system()}


def trace_speed(trace_dir: Path, policies: list[str]) -> dict[str, Any]:
    """Part 1: placements per second on the trace cluster, per policy."""
    spec = RunSpec(str(trace_dir), "openb_pod_list_default.csv", "", 42)
    trace_nodes, pods = load_trace(spec.trace_dir, spec.pods_file)
    out: dict[str, Any] = {"nodes": len(trace_nodes), "podList": spec.pods_file, "seed": spec.seed, "policies": {}}
    for policy in policies:
        nodes = build_nodes(trace_nodes)
        arrivals = workload(pods, spec.seed, GPU_MIB * sum(len(n.gpus) for n in nodes))
        started = time.perf_counter()
        result = replay(nodes, arrivals, policy, seed=spec.seed, target_pods=pods)
        elapsed = time.perf_counter() - started
        out["policies"][policy] = {
            "placements": len(arrivals),
            "failed": result.failed_pods,
            "seconds": round(elapsed, 3),
            "placementsPerSecond": round(len(arrivals) / elapsed, 1),
        }
        print(f"speed: trace {policy}: {len(arrivals) / elapsed:.0f} placements/s", file=sys.stderr)
    out["peakRssMiB"] = round(peak_rss_mib(), 1)
    return out


def synthetic_nodes(count: int, rng: random.Random) -> list[Node]:
    """``count`` nodes of 8 GPUs, product drawn by share; CPU and memory left to kube-scheduler."""
    nodes = []
    for i in range(count):
        product, mib, _ = rng.choices(PRODUCTS, weights=[p[2] for p in PRODUCTS])[0]
        name = f"node-{i:05d}"
        gpus = tuple(Gpu(g, f"{name}-gpu{g}", product, mib) for g in range(8))
        nodes.append(Node(NodeName(name), gpus))
    return nodes


def synthetic_task(i: int, rng: random.Random, queues: list[str]) -> Task:
    """One task: mostly single GPUs or shares, a few multi-GPU, a tenth restricted to a product."""
    kind = rng.random()
    products = frozenset([rng.choice(PRODUCTS)[0]]) if rng.random() < 0.1 else frozenset()
    if kind < 0.35:
        request = GpuRequest(1, products=products)
    elif kind < 0.55:
        request = GpuRequest(1, memory_mib=rng.choice([4, 8, 10, 12, 20]) * GIB, products=products)
    elif kind < 0.8:
        request = GpuRequest(1, fraction_milli=rng.choice([250, 330, 500, 750]), products=products)
    elif kind < 0.9:
        request = GpuRequest(2, products=products)
    elif kind < 0.97:
        request = GpuRequest(4, products=products)
    else:
        request = GpuRequest(8, products=products)
    queue = queues[i % len(queues)]
    return Task(TaskKey(f"{queue}/task-{i:06d}"), queue, request, priority=rng.choice([0, 0, 0, 100]), created=float(i))


def synthetic_speed(nodes: int, tasks: int, policy: str, seed: int = 7, *, flavors: bool = False) -> dict[str, Any]:
    """Part 2: the full scheduling cycle with quota on a big synthetic cluster; with ``flavors`` (part 3)
    the same cluster, tasks and total quota, split into one ResourceFlavor per product (each queue's
    quota of a flavor in proportion to the product's share), which every task tries in turn."""
    rng = random.Random(seed)
    scheduler = Scheduler(policy=make_policy(policy), nodes=synthetic_nodes(nodes, rng))
    queues = ["team-a", "team-b", "team-c", "team-d"]
    gpus = nodes * 8
    names = [product.split("-")[-1].lower() for product, _, _ in PRODUCTS]
    if flavors:
        for name, (product, _, _) in zip(names, PRODUCTS, strict=True):
            scheduler.set_flavor(Flavor(name, gpu_products=frozenset([product])))
    for name in queues:  # nominal quotas sum to 90% of the GPUs: quota binds for some queues
        nominal, borrowing = gpus * 1000 * 9 // 40, gpus * 1000 // 10
        if flavors:
            quota = {flavored(GPU, f): ResourceQuota(int(nominal * share), int(borrowing * share))
                     for f, (_, _, share) in zip(names, PRODUCTS, strict=True)}
            scheduler.set_queue(QueueSpec(name=name, cohort="org", quotas=quota, flavors=tuple(names)))
        else:
            quota = {GPU: ResourceQuota(nominal=nominal, borrowing_limit=borrowing)}
            scheduler.set_queue(QueueSpec(name=name, cohort="org", quotas=quota))
    for i in range(tasks):
        scheduler.submit(synthetic_task(i, rng, queues))
    admitted, cycles, cycle_seconds = 0, [], 0.0
    while True:
        started = time.perf_counter()
        decisions = scheduler.cycle(float(len(cycles)))
        elapsed = time.perf_counter() - started
        new = sum(isinstance(d, Admit) for d in decisions)
        cycles.append({"seconds": round(elapsed, 3), "admitted": new, "decisions": len(decisions)})
        cycle_seconds += elapsed
        admitted += new
        what = "synthetic (flavors)" if flavors else "synthetic"
        print(f"speed: {what} cycle {len(cycles)}: {new} admitted in {elapsed:.2f} s", file=sys.stderr)
        if not new or len(cycles) >= 5:
            break
    still = len(scheduler.pending)
    later = later_cycles(scheduler, rng, queues, tasks, float(len(cycles)))
    return {
        "nodes": nodes,
        "gpus": gpus,
        "pendingTasks": tasks,
        "policy": policy,
        "queues": len(queues),
        "flavors": len(names) if flavors else 0,
        "admitted": admitted,
        "stillPending": still,
        "cycles": cycles,
        "seconds": round(cycle_seconds, 3),
        "placementsPerSecond": round(admitted / cycle_seconds, 1),
        "decisionsPerSecond": round(sum(c["decisions"] for c in cycles) / cycle_seconds, 1),
        "laterCycleMs": later,
        "peakRssMiB": round(peak_rss_mib(), 1),
    }


def later_cycles(
    scheduler: Scheduler, rng: random.Random, queues: list[str], pending: int, now: float
) -> dict[str, Any]:
    """What a later cycle costs with ``pending`` tasks waiting on the full cluster: the backlog topped up to
    ``pending`` with more tasks like the others and one cycle to settle it; then, walking every pending task each
    cycle (``incremental=False``, the way before) and as the scheduler does now, a cycle with nothing new and one
    with 100 new tasks: milliseconds, and how each went (skipped, incremental or full) with the tasks it tried."""
    n = 10**6
    while len(scheduler.pending) < pending:
        scheduler.submit(synthetic_task(n, rng, queues))
        n += 1
    scheduler.cycle(now + 1)
    out: dict[str, Any] = {"pending": len(scheduler.pending), "admittedBeforehand": len(scheduler.running)}
    for name, incremental in (("walk", False), ("now", True)):
        scheduler.incremental = incremental
        figures: dict[str, Any] = {}
        for label, new in (("nothingNew", 0), ("hundredNewTasks", 100)):
            for _ in range(new):
                scheduler.submit(synthetic_task(n, rng, queues))
                n += 1
            now += 1
            started = time.perf_counter()
            scheduler.cycle(now)
            figures[label] = round(1000 * (time.perf_counter() - started), 1)
            figures[label + "Cycle"] = f"{scheduler.stats.mode}, {scheduler.stats.tried} tried"
        out[name] = figures
    return out


def gang_speed(nodes: int, pods: int, *, domain: int | None, policy: str = DEFAULT_POLICY) -> dict[str, Any]:
    """Median ms per gang and per pod placing gangs of ``pods`` x 8 GPUs on ``nodes`` empty 8-GPU nodes (module doc)."""
    rack = "example.com/rack"
    cluster_nodes = [
        Node(NodeName(f"node-{i:05d}"), tuple(Gpu(g, f"n{i}-g{g}", "NVIDIA-H100", 81559) for g in range(8)),
             labels=() if domain is None else ((rack, f"r{i // domain:04d}"),))
        for i in range(nodes)
    ]
    cluster = ClusterState(cluster_nodes)
    chosen = make_policy(policy)
    times: list[float] = []
    for number in range(max(1, nodes // 4 // pods)):
        task = Task.of_pod_sets(TaskKey(f"bench/gang-{number}"), "q", (PodSet("workers", pods, GpuRequest(8)),),
                                topology_required=None if domain is None else rack)
        start = time.perf_counter()
        placement = find_placement(cluster, task, chosen).placement
        times.append(time.perf_counter() - start)
        if placement is None:
            break
        cluster.reserve(task, placement)
    median = statistics.median(times) * 1000
    return {"nodes": nodes, "pods": pods, "domainNodes": domain, "gangs": len(times),
            "msPerGang": round(median, 2), "msPerPod": round(median / pods, 3)}


def main(argv: list[str] | None = None) -> int:
    """Run both parts and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", type=Path, required=True)
    parser.add_argument("--policies", default="packing,fgd,bestfit,firstfit")
    parser.add_argument("--synthetic-policies", default=",".join(dict.fromkeys([DEFAULT_POLICY, "packing", "bestfit"])))
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "speed.json")
    args = parser.parse_args(argv)
    try:
        check_trace(args.trace_dir, ["openb_pod_list_default.csv"])
    except UsageError as err:
        print(f"speed: {err}", file=sys.stderr)
        return 2
    result = {
        "machine": machine(),
        "trace": trace_speed(args.trace_dir, args.policies.split(",")),
        "synthetic": {p: synthetic_speed(args.nodes, args.tasks, p) for p in args.synthetic_policies.split(",")},
        "syntheticFlavors": {DEFAULT_POLICY: synthetic_speed(args.nodes, args.tasks, DEFAULT_POLICY, flavors=True)},
        "gangs": [gang_speed(n, p, domain=d) for n in (1000, 5000) for d in (None, 32) for p in (8, 64)],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for body in [*result["synthetic"].values(), *result["syntheticFlavors"].values()]:
        print(json.dumps({k: v for k, v in body.items() if k != "cycles"}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
