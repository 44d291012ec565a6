"""End-to-end admission rate: GPUTasks created to Jobs created, through the real operator.

Usage::

    python bench/e2e_rate.py [--tasks 300] [--nodes 20] [--out bench/results/e2e.json]

Starts the project's API emulator (``gputask.testing.EmulatorServer``) and the real kopf
operator against it over loopback HTTP, in this one process and event loop (as the
integration tests do), creates ``--nodes`` GPU nodes of 8 GPUs and one GPUClusterQueue, then
creates ``--tasks`` GPUTasks as fast as the client can and watches for their Jobs (polling the
Job list every 20 ms). Reports tasks/s (tasks over the time from the first create to the last
Job seen) and the p50/p99 admission latency (a task's create to its Job first seen). The
emulator, the client and the operator share one CPU core here, so the figure is a lower bound
for the operator, and includes the emulator's own cost.

Measured in this sandbox (bench/results/e2e.json, 60 tasks: 3.0 tasks/s, p50 12.5 s; 300 tasks:
0.9 tasks/s, only 200 Jobs within 120 s): py-spy puts 77% of the CPU in the emulator's request
matching (kmock's filters, which walk a request log that grows with every call) and about 13% in
the operator's API calls, so these figures measure the emulator, not the operator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gputask.config import Config  # noqa: E402
from gputask.k8s.client import JOBS, KubeClient, load_api_client  # noqa: E402
from gputask.testing import EmulatorServer  # noqa: E402
from harness import Cluster, gputask, running_operator  # noqa: E402  (tests/ holds the shared harness)

REPO = Path(__file__).resolve().parents[1]


def percentile(values: list[float], pct: float) -> float:
    """The ``pct`` percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


async def measure(tasks: int, nodes: int, cycle_s: float) -> dict[str, Any]:
    """Run the emulator and the operator, create the tasks, time their Jobs."""
    async with EmulatorServer() as server:
        server.install_crds_from(REPO / "crds")
        kubeconfig = server.write_kubeconfig(Path("/tmp") / f"gputask-e2e-{id(server)}.kubeconfig")
        client = KubeClient(load_api_client(str(kubeconfig)))
        cluster = Cluster(server, client, Path(kubeconfig))
        for n in range(nodes):
            gpus = [(f"GPU-{n}-{g}", "NVIDIA-A100-SXM4-80GB", "80Gi") for g in range(8)]
            await cluster.add_node(f"node-{n:03d}", *gpus)
        await cluster.add_queue("default", resources=[{"name": "nvidia.com/gpu", "nominalQuota": nodes * 8}])
        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        async with running_operator(cluster, Config(cycleInterval=cycle_s)):
            started = time.monotonic()
            for i in range(tasks):
                name = f"t{i:05d}"
                created[name] = time.monotonic()
                await cluster.submit(gputask(name, gpuFraction="0.25"))
            deadline = time.monotonic() + 120
            while len(seen) < tasks and time.monotonic() < deadline:
                for job in await client.list(JOBS, "default"):
                    owner = job["metadata"].get("labels", {}).get("gputask.io/task", "")
                    name = owner.rsplit("/", 1)[-1]
                    if name in created and name not in seen:
                        seen[name] = time.monotonic()
                await asyncio.sleep(0.02)
            finished = max(seen.values(), default=time.monotonic())
        await client.close()
    latencies = [seen[n] - created[n] for n in seen]
    return {
        "tasks": tasks,
        "nodes": nodes,
        "gpus": nodes * 8,
        "cycleIntervalS": cycle_s,
        "jobsSeen": len(seen),
        "seconds": round(finished - started, 3),
        "tasksPerSecond": round(len(seen) / (finished - started), 1) if seen else 0.0,
        "latencyP50S": round(percentile(latencies, 50), 3) if latencies else None,
        "latencyP99S": round(percentile(latencies, 99), 3) if latencies else None,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--cycle-interval", type=float, default=0.2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "e2e.json")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.tasks, args.nodes, args.cycle_interval))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), file=sys.stderr)
    return 0 if result["jobsSeen"] == args.tasks else 1


if __name__ == "__main__":
    sys.exit(main())
