"""Prometheus metrics of the operator (``gputask_`` prefix, base units, low-cardinality labels).

One :class:`OperatorMetrics` per operator instance, on its own registry (tests run several).
Gauges are refreshed from the scheduler after each cycle; counters and histograms are
observed where the events happen. Served by ``gputask run --metrics-port``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gputask.core import GPU, GPU_MEMORY, MILLI_PER_GPU, Scheduler, TaskKey
from gputask.core.budget import Overuse
from gputask.core.fit import Filter
from gputask.core.flavors import split_key

MIB = 1 << 20
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

log = logging.getLogger("gputask.metrics")


def fragmentation_ratio(scheduler: Scheduler) -> float:
    """Share of free GPU memory that sits on partly used GPUs (0 when nothing is free).

    Memory free on a GPU that already holds work can only take smaller tasks; a whole idle GPU
    can take anything. This is a simple, workload-independent stand-in for the FGD paper's
    fragmentation measure (Weng et al., USENIX ATC '23), which needs a target workload.
    """
    free_total = free_fragmented = 0
    for state in scheduler.cluster.sorted_nodes():
        if not state.node.schedulable:
            continue
        for pos in range(len(state.node.gpus)):
            free = state.free_mib(pos)
            free_total += free
            if not state.is_idle(pos):
                free_fragmented += free
    return free_fragmented / free_total if free_total else 0.0


class OperatorMetrics:
    """The operator's metrics, registered on ``registry`` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._nodes = {}  # node -> (its state object, that state's generation, GPU indices) as last exported
        self._inadmissible: dict[str, int] = {}  # pending tasks waiting as Inadmissible, per queue (last counted)
        r = self.registry
        self.pending = Gauge("gputask_pending_tasks", "Tasks waiting in each queue.", ["queue"], registry=r)
        self.pending_by_status = Gauge(
            "gputask_pending_tasks_by_status",
            "Tasks waiting in each queue: active (may be admitted as the cluster changes) or inadmissible (can "
            "never fit the queue or any node as they are; Kueue's kueue_pending_workloads status label).",
            ["queue", "status"],
            registry=r,
        )
        self.nominal = Gauge(
            "gputask_queue_nominal_quota",
            "nominalQuota per queue, flavor ('' for flat resources) and resource (GPUs, bytes).",
            ["queue", "flavor", "resource"],
            registry=r,
        )
        self.borrowing_limit = Gauge(
            "gputask_queue_borrowing_limit",
            "borrowingLimit per queue, flavor and resource, where one is set (same units).",
            ["queue", "flavor", "resource"],
            registry=r,
        )
        self.lending_limit = Gauge(
            "gputask_queue_lending_limit",
            "lendingLimit per queue, flavor and resource, where one is set (same units).",
            ["queue", "flavor", "resource"],
            registry=r,
        )
        self.gpu_reserved = Gauge(
            "gputask_gpu_memory_reserved_bytes",
            "GPU memory reserved by gputask on each GPU (label gpu: its NVML index).",
            ["node", "gpu"],
            registry=r,
        )
        self.gpu_free = Gauge(
            "gputask_gpu_memory_free_bytes",
            "GPU memory free for gputask on each GPU (0 when unhealthy or held whole).",
            ["node", "gpu"],
            registry=r,
        )
        self.admitted = Gauge("gputask_admitted_tasks", "Tasks admitted and not finished.", ["queue"], registry=r)
        self.usage = Gauge(
            "gputask_queue_usage",
            "Quota used per queue: GPUs for nvidia.com/gpu, bytes for gputask.io/gpu-memory.",
            ["queue", "resource"],
            registry=r,
        )
        self.borrowed = Gauge(
            "gputask_queue_borrowed", "Quota used beyond nominalQuota (same units).", ["queue", "resource"], registry=r
        )
        self.flavor_usage = Gauge(
            "gputask_queue_flavor_usage",
            "Quota used per queue and ResourceFlavor (queues with resourceGroups; same units).",
            ["queue", "flavor", "resource"],
            registry=r,
        )
        self.flavor_borrowed = Gauge(
            "gputask_queue_flavor_borrowed",
            "Quota used beyond nominalQuota per queue and ResourceFlavor (same units).",
            ["queue", "flavor", "resource"],
            registry=r,
        )
        self.reserved = Gauge(
            "gputask_node_gpu_memory_reserved_bytes", "GPU memory reserved by gputask per node.", ["node"], registry=r
        )
        self.free = Gauge("gputask_node_gpu_memory_free_bytes", "GPU memory free per node.", ["node"], registry=r)
        self.fragmentation = Gauge(
            "gputask_cluster_fragmentation_ratio", "Share of free GPU memory on partly used GPUs.", registry=r
        )
        self.cycle = Histogram(
            "gputask_scheduling_cycle_duration_seconds",
            "Duration of a scheduling cycle.",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "gputask_admission_latency_seconds",
            "Time from GPUTask creation to its Job's creation, per GPUClusterQueue (Kueue's admission wait time).",
            ["queue"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.preemptions = Counter(
            "gputask_preemptions_total", "Tasks preempted, by victim queue.", ["queue"], registry=r
        )
        self.evictions = Counter("gputask_evictions_total", "Tasks evicted, by reason.", ["reason"], registry=r)
        self.defrag_moves = Counter(
            "gputask_defrag_moves_total", "Tasks moved by defragmentation (evicted Defragmented, re-admitted).",
            registry=r)
        self.defrag_refused = Counter(
            "gputask_defrag_plans_refused_by_budget_total",
            "Defragmentation attempts a move budget stopped (maxMovesPerWindow, maxMovesPerQueue).", registry=r)
        self.defrag_dry_runs = Counter(
            "gputask_defrag_dry_run_plans_total", "Defragmentation plans reported and not run (mode DryRun).",
            registry=r)
        self.defrag_lost = Counter(
            "gputask_defrag_lost_work_gpu_hours_total",
            "GPU-hours of work lost by moved tasks (GPUs held times how long each had run).", registry=r)
        self.defrag_waited = Histogram(
            "gputask_defrag_waiting_task_wait_seconds",
            "How long a task waited (since its creation) before defragmentation made room for it.",
            buckets=LATENCY_BUCKETS, registry=r)
        self._defrag_seen = (0, 0, 0, 0.0)
        self.reschedules = Counter("gputask_reschedules_total", "Re-placements after node or GPU failure.", registry=r)
        self.api_errors = Counter("gputask_api_errors_total", "Failed Kubernetes API calls.", registry=r)
        self.strays = Counter(
            "gputask_stray_jobs_deleted_total",
            "Second live Jobs of one task found at a rebuild (a lost create answer, a stale leader), deleted.",
            registry=r,
        )
        self.adopted = Counter(
            "gputask_jobs_adopted_total",
            "Jobs found with another placement than the one just chosen, whose placement was taken over.",
            registry=r,
        )

        self.by_filter = Gauge(
            "gputask_waiting_tasks_by_filter",
            "Waiting tasks that at least one node refused by this filter (NodeUnschedulable, TaintToleration, "
            "NodeAffinity, NodeResourcesFit, GPU).",
            ["filter"],
            registry=r,
        )
        self.over_budget = Gauge(
            "gputask_task_gpu_memory_over_budget_bytes",
            "GPU memory a running task's pods use on a GPU beyond what it reserved there, for tasks over their "
            "budget (memoryBudget: beyond the reservation plus toleranceMiB); label gpu: the NVML index.",
            ["namespace", "task", "node", "gpu"],
            registry=r,
        )

        self.pinning_supported = Gauge(
            "gputask_pinning_mode_supported",
            "1 when nothing the API shows stands in the way of the pinning mode (envvar, cdi, dra), 0 when something "
            "does; a mode whose verdict could not be read is not exported. Set at start and at each re-check.",
            ["mode"],
            registry=r,
        )

    _nodes: dict[str, tuple[object, int, tuple[str, ...]]]

    def refresh_budgets(self, over: Mapping[TaskKey, tuple[Overuse, ...]], scheduler: Scheduler) -> None:
        """Set the over-budget series from the tasks over budget that still run (one per task and GPU)."""
        self.over_budget.clear()
        for key, found in over.items():
            if key not in scheduler.running:
                continue
            namespace, _, name = str(key).partition("/")
            for o in found:
                self.over_budget.labels(namespace, name, o.node, str(o.index)).set(o.over_mib * MIB)

    def refresh(self, scheduler: Scheduler, *, waiting: bool = True) -> None:
        """Set the gauges from the scheduler's state (after a cycle). ``waiting`` False skips the waiting series
        (refused per filter, pending active and inadmissible) and the fragmentation ratio, which reads every GPU:
        the loop sets those at most once a second. The waiting series read the scheduler's counts of the waits it
        said; everything costs in proportion to queues, filters and the nodes that changed, not to tasks."""
        if waiting:
            self._refresh_waiting(scheduler)
        else:
            self._inadmissible = {q: n for q, n in self._inadmissible.items() if q in scheduler.quotas.specs}
        inadmissible = self._inadmissible
        for gauge in (self.nominal, self.borrowing_limit, self.lending_limit):
            gauge.clear()  # a queue or flavor removed since takes its series with it
        for name, spec in scheduler.quotas.specs.items():
            for key, quota in spec.quotas.items():
                resource, flavor = split_key(key)
                self.nominal.labels(name, flavor, resource).set(_base(resource, quota.nominal))
                if quota.borrowing_limit is not None:
                    self.borrowing_limit.labels(name, flavor, resource).set(_base(resource, quota.borrowing_limit))
                if quota.lending_limit is not None:
                    self.lending_limit.labels(name, flavor, resource).set(_base(resource, quota.lending_limit))
        for queue, report in scheduler.queue_status().items():
            self.pending.labels(queue).set(report["pending"])  # type: ignore[arg-type]
            waiting = int(report["pending"])  # type: ignore[call-overload]
            self.pending_by_status.labels(queue, "inadmissible").set(inadmissible.get(queue, 0))
            self.pending_by_status.labels(queue, "active").set(max(0, waiting - inadmissible.get(queue, 0)))
            self.admitted.labels(queue).set(report["admitted"])  # type: ignore[arg-type]
            usage, borrowed = report["usage"], report["borrowed"]
            assert isinstance(usage, dict) and isinstance(borrowed, dict)
            totals = {GPU: [0, 0], GPU_MEMORY: [0, 0]}  # over the queue's flavors: used, borrowed
            for key, amount in usage.items():
                resource, flavor = split_key(key)
                totals[resource][0] += amount
                totals[resource][1] += borrowed.get(key, 0)
                if flavor:
                    self.flavor_usage.labels(queue, flavor, resource).set(_base(resource, amount))
                    self.flavor_borrowed.labels(queue, flavor, resource).set(_base(resource, borrowed.get(key, 0)))
            for resource, (used, lent) in totals.items():
                self.usage.labels(queue, resource).set(_base(resource, used))
                self.borrowed.labels(queue, resource).set(_base(resource, lent))
        self._refresh_nodes(scheduler)
        self._refresh_defrag(scheduler)
        if waiting:  # reads every GPU: with the once-a-second series
            self.fragmentation.set(fragmentation_ratio(scheduler))

    def _refresh_defrag(self, scheduler: Scheduler) -> None:
        """Count what defragmentation did since the last refresh, and log each plan it found (applied, or only
        reported in DryRun) with its moves."""
        stats = scheduler.defrag.stats
        seen, self._defrag_seen = self._defrag_seen, (stats.moves, stats.refused_by_budget, stats.dry_runs,
                                                      stats.lost_gpu_s)
        self.defrag_moves.inc(stats.moves - seen[0])
        self.defrag_refused.inc(stats.refused_by_budget - seen[1])
        self.defrag_dry_runs.inc(stats.dry_runs - seen[2])
        self.defrag_lost.inc((stats.lost_gpu_s - seen[3]) / 3600.0)
        for report in scheduler.defrag.take_reports():
            plan = report.plan
            what = "moving" if report.applied else "dry run, would move"
            log.info("defragmentation for %s on %s: %s %s", plan.task.key, ", ".join(plan.placement.nodes), what,
                     plan.describe())
            if report.applied:
                self.defrag_waited.observe(max(0.0, report.at - plan.task.created))

    def _refresh_waiting(self, scheduler: Scheduler) -> None:
        """From the scheduler's counts of the waits it said (kept as they change): O(queues and filters)."""
        counts = {**dict.fromkeys((f.value for f in Filter), 0), **scheduler.waiting_by_filter}
        for name, count in counts.items():
            self.by_filter.labels(name).set(count)
        self._inadmissible = {
            queue: count for (queue, reason), count in scheduler.waiting_by_reason.items() if reason == "Inadmissible"
        }

    def _refresh_nodes(self, scheduler: Scheduler) -> None:
        """Per-node and per-GPU memory gauges of the nodes that changed since the last refresh (by the node
        state's generation), and no series for nodes or GPUs gone: label calls in proportion to what changed."""
        seen: dict[str, tuple[object, int, tuple[str, ...]]] = {}
        for state in scheduler.cluster.sorted_nodes():
            known = self._nodes.get(state.name)
            if known is not None and known[0] is state and known[1] == state.generation:  # set_node makes a new state
                seen[state.name] = known
                continue
            indices = tuple(str(g.index) for g in state.node.gpus)
            seen[state.name] = (state, state.generation, indices)
            self._drop_gpus(state.name, set(known[2] if known else ()) - set(indices))
            free = sum(state.free_mib(p) for p in range(len(state.node.gpus)))
            self.reserved.labels(state.name).set(sum(state.reserved_mib) * MIB)
            self.free.labels(state.name).set(free * MIB)
            for pos, index in enumerate(indices):
                self.gpu_reserved.labels(state.name, index).set(state.reserved_mib[pos] * MIB)
                self.gpu_free.labels(state.name, index).set(state.free_mib(pos) * MIB)
        for name in set(self._nodes) - set(seen):
            self._drop_gpus(name, set(self._nodes[name][2]))
            for gauge in (self.reserved, self.free):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)
        self._nodes = seen

    def _drop_gpus(self, node: str, indices: set[str]) -> None:
        for index in indices:
            for gauge in (self.gpu_reserved, self.gpu_free):
                with contextlib.suppress(KeyError):
                    gauge.remove(node, index)


def _base(resource: str, amount: int) -> float:
    """milli-GPU to GPUs, MiB to bytes."""
    return amount / MILLI_PER_GPU if resource == GPU else float(amount * MIB)
