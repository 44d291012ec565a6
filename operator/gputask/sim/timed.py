"""Time-based replay of the Alibaba GPU trace: arrivals and departures, queues and priorities.

Unlike the FGD protocol (arrivals only, :mod:`gputask.sim.trace`), this replay uses the trace's
clock: each GPU pod arrives at ``creation_time`` (divided by ``speedup`` to raise the load) and
runs for ``deletion_time - scheduled_time`` seconds once admitted. Pods that never ran in the
trace (no ``scheduled_time``) and CPU-only pods are left out. The same core
:class:`~gputask.core.Scheduler` decides, cycling at every arrival and departure:

- **gputask**: one GPUClusterQueue per QoS class in a cohort (``LS``, ``Guaranteed``,
  ``Burstable``, ``BE``), each with a nominal ``nvidia.com/gpu`` quota proportional to its
  share of the trace's GPU demand and free to borrow what the others leave; priorities follow
  QoS (LS 1000, Guaranteed 500, Burstable 100, BE 0); BestEffortFIFO; the given policy;
  ``reclaimWithinCohort: LowerPriority``, so a queue takes back lent quota from lower-priority
  borrowers (victims restart their full duration when re-admitted).
- **fifo**: the strict FIFO baseline: one StrictFIFO queue, no priorities, first fit.

Reported per run: mean and p95 queueing delay (admission minus arrival, s), makespan (last
finish minus first arrival, s), GPU utilisation (allocated milli-GPU over the cluster's,
time-averaged from the first to the last arrival, %: the makespan is dominated by a few pods
that ran for months), pods never admitted, preemptions. The pod lists hold about one cluster's
worth of GPU demand spread over 149 days, so queueing needs ``speedup`` (e.g. 2000) and
``load`` (copies of every pod) to appear at all. The trace (research use only) is read from
its folder, never shipped.
"""

from __future__ import annotations

import csv
import heapq
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gputask.core import (
    GPU,
    Admit,
    Preemption,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
    make_policy,
)
from gputask.core.defrag import DefragConfig
from gputask.core.scheduler import Evict
from gputask.sim.trace import NODE_LIST, TraceError, build_nodes, read_nodes, read_pods, request_of

QOS = {"LS": ("latency-sensitive", 1000), "Guaranteed": ("guaranteed", 500), "Burstable": ("burstable", 100)}
BEST_EFFORT = ("best-effort", 0)


@dataclass(frozen=True, slots=True)
class TimedPod:
    """A GPU pod with its trace times (s) and QoS."""

    name: str
    task: Task
    arrival_s: float
    duration_s: float
    qos: str


def read_timed_pods(trace_dir: Path, pods_file: str, *, speedup: float = 1.0, load: int = 1) -> list[TimedPod]:
    """GPU pods that ran in the trace, with arrival (``creation_time / speedup``) and duration.

    ``load`` > 1 adds ``load - 1`` copies of every pod arriving at the same time (names suffixed
    ``~copy<N>``): the pod lists are sized to the cluster, so queueing needs more demand than it
    holds. Raises TraceError when the file lacks the time columns (the ``multigpu*`` lists do).
    """
    pods = {p.name: p for p in read_pods(trace_dir / pods_file)}
    out: list[TimedPod] = []
    with (trace_dir / pods_file).open(newline="") as handle:
        for row in csv.DictReader(handle):
            if "creation_time" not in row:
                raise TraceError(f"{pods_file}: no creation_time column; use a list with times (e.g. default)")
            pod = pods[row["name"]]
            if pod.num_gpu == 0 or not row.get("scheduled_time") or not row.get("deletion_time"):
                continue
            duration = max(1.0, float(row["deletion_time"]) - float(row["scheduled_time"]))
            arrival = float(row["creation_time"]) / speedup
            queue, priority = QOS.get(row.get("qos", ""), BEST_EFFORT)
            task = Task(
                TaskKey(pod.name),
                queue,
                request_of(pod),
                priority=priority,
                created=arrival,
                cpu_milli=pod.cpu_milli,
                memory_mib=pod.memory_mib,
            )
            for copy in range(load):
                name = pod.name if copy == 0 else f"{pod.name}~copy{copy}"
                task_n = (
                    task
                    if copy == 0
                    else Task(
                        TaskKey(name),
                        queue,
                        task.request,
                        priority=priority,
                        created=arrival,
                        cpu_milli=pod.cpu_milli,
                        memory_mib=pod.memory_mib,
                    )
                )
                out.append(TimedPod(name, task_n, arrival, duration, row.get("qos", "BE")))
    return sorted(out, key=lambda p: (p.arrival_s, p.name))


def queues_for(pods: list[TimedPod], total_milli: int) -> list[QueueSpec]:
    """One queue per QoS, nominal quota proportional to its GPU demand (milli-GPU, rounded so that the
    quotas add up to ``total_milli``), all in one cohort."""
    demand: dict[str, int] = {}
    for p in pods:
        demand[p.task.queue] = demand.get(p.task.queue, 0) + p.task.request.count * (
            p.task.request.fraction_milli or 1000
        )
    whole = sum(demand.values()) or 1
    policy = Preemption("Never", "LowerPriority")
    names = sorted(demand)
    shares = {name: total_milli * demand[name] // whole for name in names}
    for name in names[: total_milli - sum(shares.values()) if demand else 0]:  # rounding: the quotas sum to the total
        shares[name] += 1
    return [
        QueueSpec(name, cohort="trace", quotas={GPU: ResourceQuota(shares[name])}, preemption=policy) for name in names
    ]


@dataclass(slots=True)
class TimedResult:
    """Figures of one timed run (seconds, %). ``waits`` (first admission minus arrival, s) and ``gpus`` (GPUs asked)
    per admitted task; ``moves``: defragmentation moves (evictions with reason Defragmented); ``span_s``: first to
    last arrival; ``hourly_pct``: GPU allocation per hour of the arrival window (%)."""

    mode: str
    delays_s: list[float]
    makespan_s: float
    utilisation_pct: float
    unadmitted: int
    preemptions: int
    waits: dict[TaskKey, float] = field(default_factory=dict)
    gpus: dict[TaskKey, int] = field(default_factory=dict)
    moves: int = 0
    span_s: float = 0.0
    hourly_pct: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The JSON figures of the run."""
        ordered = sorted(self.delays_s)
        p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0
        return {
            "meanQueueDelayS": round(sum(ordered) / len(ordered), 1) if ordered else 0.0,
            "p95QueueDelayS": round(p95, 1),
            "makespanS": round(self.makespan_s, 1),
            "gpuUtilizationPct": round(self.utilisation_pct, 2),
            "admitted": len(ordered),
            "unadmitted": self.unadmitted,
            "preemptions": self.preemptions,
        }


def replay_timed(
    trace_dir: Path,
    pods_file: str,
    *,
    mode: str,
    policy: str,
    speedup: float = 1.0,
    load: int = 1,
    arrived: Callable[[float], None] | None = None,
    defragmentation: DefragConfig | None = None,
) -> TimedResult:
    """Run the trace on its clock through the core; ``mode`` is ``gputask`` or ``fifo``. ``arrived`` is told
    the share of pods (0..1) that have arrived, as the replay goes (for progress reports). ``defragmentation``
    (gputask mode): the scheduler's settings, and every pod opts in (``movable``)."""
    nodes = build_nodes(read_nodes(trace_dir / NODE_LIST))
    total_milli = 1000 * sum(len(n.gpus) for n in nodes)
    pods = read_timed_pods(trace_dir, pods_file, speedup=speedup, load=load)
    if mode == "fifo":
        scheduler = Scheduler(policy=make_policy("firstfit"), nodes=nodes)
        scheduler.set_queue(QueueSpec("fifo", strategy="StrictFIFO"))
        pods = [
            TimedPod(
                p.name,
                Task(
                    p.task.key,
                    "fifo",
                    p.task.request,
                    created=p.arrival_s,
                    cpu_milli=p.task.cpu_milli,
                    memory_mib=p.task.memory_mib,
                ),
                p.arrival_s,
                p.duration_s,
                p.qos,
            )
            for p in pods
        ]
    else:
        scheduler = Scheduler(policy=make_policy(policy), nodes=nodes, defragmentation=defragmentation)
        if defragmentation is not None:
            pods = [replace(p, task=replace(p.task, movable=True)) for p in pods]
        for spec in queues_for(pods, total_milli):
            scheduler.set_queue(spec)
    return _run(scheduler, pods, total_milli, mode, arrived)


def _run(
    scheduler: Scheduler,
    pods: list[TimedPod],
    total_milli: int,
    mode: str,
    arrived: Callable[[float], None] | None = None,
) -> TimedResult:
    by_key = {p.task.key: p for p in pods}
    count = 0
    events: list[tuple[float, int, str, TaskKey, int]] = [(p.arrival_s, 0, "arrive", p.task.key, 0) for p in pods]
    heapq.heapify(events)
    admitted_at: dict[TaskKey, float] = {}
    runs: dict[TaskKey, int] = {}  # admission count: a finish event of an older run is stale
    usage: dict[TaskKey, int] = {}
    allocated = area = 0.0
    last = pods[0].arrival_s if pods else 0.0
    last_arrival = pods[-1].arrival_s if pods else 0.0
    preemptions = moves = 0
    end = last
    hours: dict[int, float] = {}  # allocated milli-GPU x seconds, per hour of the arrival window
    wakes: set[float] = set()
    while events:
        now = events[0][0]
        if last < last_arrival:  # utilisation over the arrival window: the busy part of the run
            area += allocated * (min(now, last_arrival) - last)
            _by_hour(hours, allocated, last - pods[0].arrival_s, min(now, last_arrival) - pods[0].arrival_s)
        last = now
        while events and events[0][0] == now:
            _, _, kind, key, run = heapq.heappop(events)
            if kind == "wake":
                continue
            if kind == "arrive":
                scheduler.submit(by_key[key].task)
                count += 1
                if arrived is not None:
                    arrived(count / len(pods))
            elif runs.get(key) == run:
                scheduler.finish(key)
                allocated -= usage.pop(key)
                end = now
        for _ in range(100):  # cycle until quiet: victims terminate at once in simulation
            decisions = scheduler.cycle(now)
            for d in decisions:
                if isinstance(d, Admit):
                    runs[d.task.key] = runs.get(d.task.key, 0) + 1
                    admitted_at.setdefault(d.task.key, now)
                    usage[d.task.key] = d.usage.get(GPU, 0)
                    allocated += usage[d.task.key]
                    heapq.heappush(
                        events, (now + by_key[d.task.key].duration_s, 1, "finish", d.task.key, runs[d.task.key])
                    )
                elif isinstance(d, Evict):
                    if d.reason == "Defragmented":
                        moves += 1
                    else:
                        preemptions += 1
                    allocated -= usage.pop(d.task.key, 0)
                    runs[d.task.key] = runs.get(d.task.key, 0) + 1  # its pending finish is stale now
                    if d.held is not None:
                        scheduler.finish(d.held)  # the replayed pod stops at once
                    scheduler.victim_gone(d.task.key)
            if not any(isinstance(d, Admit | Evict) for d in decisions):
                break
        wake = scheduler.defrag.wake_at  # a refused move may be allowed by time alone: cycle then
        if now < wake < float("inf") and wake not in wakes:
            wakes.add(wake)
            heapq.heappush(events, (wake, 2, "wake", TaskKey(""), 0))
    first = pods[0].arrival_s if pods else 0.0
    span = max(last_arrival - first, 1e-9)
    waits = {k: admitted_at[k] - by_key[k].arrival_s for k in admitted_at}
    hourly = [round(100.0 * hours.get(h, 0.0) / (3600.0 * total_milli), 2) for h in range(math.ceil(span / 3600))]
    return TimedResult(
        mode, list(waits.values()), end - first, 100.0 * area / (span * total_milli), len(pods) - len(admitted_at),
        preemptions, waits, {k: by_key[k].task.request.count for k in admitted_at}, moves, span, hourly,
    )


def _by_hour(hours: dict[int, float], allocated: float, start: float, stop: float) -> None:
    """Add ``allocated`` x seconds from ``start`` to ``stop`` (s since the first arrival) to each hour it covers."""
    while start < stop:
        hour = int(start // 3600)
        upto = min(stop, (hour + 1) * 3600.0)
        hours[hour] = hours.get(hour, 0.0) + allocated * (upto - start)
        start = upto


def cli_timed(
    trace_dir: Path, *, pods_file: str, policy: str, speedup: float, load: int, output: str, quiet: bool = False
) -> int:
    """``gputask simulate --timed``: gputask (queues, priorities, policy) against strict FIFO."""
    import json

    from rich.console import Console
    from rich.table import Table

    from gputask.core.placement import POLICIES

    problem = None
    if output not in ("table", "json"):
        problem = f"--output {output!r}: use table or json"
    elif not speedup > 0:
        problem = f"--speedup {speedup:g}: must be above 0 (arrival times are divided by it)"
    elif policy not in POLICIES:
        problem = f"unknown policy {policy!r} for --timed; known: {', '.join(sorted(POLICIES))}"
    elif not (trace_dir / NODE_LIST).is_file():
        problem = f"{trace_dir} holds no {NODE_LIST} (get alibaba/clusterdata cluster-trace-gpu-v2023/csv)"
    if problem is not None:
        print(f"gputask simulate: {problem}", file=sys.stderr)
        return 2
    from gputask.progress import Progress

    results: dict[str, dict[str, Any]] = {}
    try:
        with Progress("timed replay", 2, unit="replays (gputask, then fifo)", quiet=quiet) as progress:
            for done, mode in enumerate(("gputask", "fifo")):
                results[mode] = replay_timed(
                    trace_dir, pods_file, mode=mode, policy=policy, speedup=speedup, load=load,
                    arrived=lambda share, done=done: progress.update(done + share),  # type: ignore[misc]
                ).summary()
    except TraceError as exc:
        print(f"gputask simulate: {exc}", file=sys.stderr)
        return 2
    doc = {"trace": pods_file, "speedup": speedup, "load": load, "policy": policy, "modes": results}
    if output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    table = Table(
        title=f"Timed replay of {pods_file} (arrivals x{speedup:g}, load x{load}); gputask = QoS queues + {policy}"
    )
    columns = (
        "meanQueueDelayS",
        "p95QueueDelayS",
        "makespanS",
        "gpuUtilizationPct",
        "admitted",
        "unadmitted",
        "preemptions",
    )
    table.add_column("mode")
    for column in columns:
        table.add_column(column, justify="right")
    for mode, figures in results.items():
        table.add_row(mode, *(str(figures[c]) for c in columns))
    console = Console()
    if not console.is_terminal:  # a pipe or a file: do not cut the columns at 80
        console = Console(width=200)
    console.print(table)
    return 0
