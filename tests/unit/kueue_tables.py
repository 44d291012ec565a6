"""Harness for Kueue's own unit-test tables, ported case by case at GPU granularity.

A ported case names its Kueue test file, test function and case name. Kueue's quantities map
to whole GPUs: one unit of the resource the case uses (usually ``cpu: "1"``) is one GPU of
the single node every case runs on, a node with more identical GPUs than any case can use,
so placement never decides anything and what is compared is the queue rules alone.

Two kinds of case:
- :class:`PreemptionCase` (preemption_test.go, preemption_fair_test.go): ``admitted`` run
  already (restored, at their admission times), ``incoming`` is submitted and one cycle runs;
  the names of the tasks it preempts must equal ``want``.
- :class:`AdmissionCase` (scheduler_test.go, scheduler_fs_test.go): ``admitted`` run, ``pending``
  are submitted, cycles run until nothing changes; the names admitted must equal
  ``want_admitted`` (and, when given, the names preempted ``want_preempted``).

Where the port cannot ask exactly what Kueue's test asks (Kueue's test runs one cycle, which
leaves a preemptor pending, where the harness runs cycles until nothing changes), the case's
``differs`` says how, and its expectation is what Kueue's rules end with. No case needs the one
deliberate difference, victims chosen on one node: there is only one node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gputask.core import (
    GPU,
    Gpu,
    GpuRequest,
    GpuSlot,
    Node,
    NodeName,
    Placement,
    Preemption,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
)
from gputask.core.scheduler import Admit, Evict

GPU_MIB = 16 * 1024
NODE_GPUS = 256


def Q(
    name: str,
    nominal: int,
    *,
    cohort: str | None = None,
    borrowing: int | None = None,
    lending: int | None = None,
    within: str = "Never",
    reclaim: str = "Never",
    borrow: str = "Never",
    threshold: int | None = None,
    weight: float | None = None,
    strategy: str = "BestEffortFIFO",
) -> QueueSpec:
    """A GPUClusterQueue with an ``nvidia.com/gpu`` quota in whole GPUs (Kueue's ``cpu`` units).

    ``borrowing``/``lending`` are borrowingLimit/lendingLimit in GPUs (None: unset); ``within``,
    ``reclaim``, ``borrow`` and ``threshold`` are withinClusterQueue, reclaimWithinCohort,
    borrowWithinCohort.policy and its maxPriorityThreshold; ``weight`` is fairSharing.weight
    (None: not set; a cohort any of whose queues sets it shares fairly).
    """
    quota = ResourceQuota(
        nominal * 1000,
        None if borrowing is None else borrowing * 1000,
        None if lending is None else lending * 1000,
    )
    return QueueSpec(
        name,
        cohort=cohort,
        strategy=strategy,  # type: ignore[arg-type]
        quotas={GPU: quota},
        preemption=Preemption(within, reclaim, borrow, threshold),  # type: ignore[arg-type]
        fair_sharing_weight_milli=None if weight is None else round(weight * 1000),
    )


@dataclass(frozen=True)
class W:
    """A workload: ``gpus`` whole GPUs in ``queue``; ``admitted`` is when it was admitted (s, larger =
    more recent, Kueue's QuotaReserved time), ``created`` its creation time (s, Kueue's queue order)."""

    name: str
    queue: str
    gpus: int
    priority: int = 0
    admitted: float = 0.0
    created: float = 0.0


@dataclass(frozen=True)
class PreemptionCase:
    """One case of Kueue's preemption tables (see the module doc)."""

    source: str  # e.g. "preemption_test.go TestPreemption"
    name: str  # Kueue's case name, verbatim
    queues: tuple[QueueSpec, ...]
    admitted: tuple[W, ...]
    incoming: W
    want: frozenset[str] = frozenset()
    strategies: tuple[str, ...] | None = None  # fairSharing.preemptionStrategies (None: Kueue's default)
    differs: str | None = None


@dataclass(frozen=True)
class AdmissionCase:
    """One case of Kueue's scheduler tables (see the module doc)."""

    source: str
    name: str
    queues: tuple[QueueSpec, ...]
    pending: tuple[W, ...]
    want_admitted: frozenset[str]
    admitted: tuple[W, ...] = ()
    want_preempted: frozenset[str] | None = None
    differs: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def _task(w: W) -> Task:
    return Task(TaskKey(f"ns/{w.name}"), w.queue, GpuRequest(w.gpus), priority=w.priority, created=w.created)


def _scheduler(queues: Iterable[QueueSpec], strategies: tuple[str, ...] | None) -> Scheduler:
    node = Node(NodeName("n"), tuple(Gpu(i, f"n-{i}", "NVIDIA-A10", GPU_MIB) for i in range(NODE_GPUS)))
    s = Scheduler(nodes=[node]) if strategies is None else Scheduler(nodes=[node], preemption_strategies=strategies)
    for q in queues:
        s.set_queue(q)
    return s


def _restore(s: Scheduler, admitted: Iterable[W]) -> None:
    index = 0
    for w in admitted:
        slots = tuple(GpuSlot(i, f"n-{i}", GPU_MIB) for i in range(index, index + w.gpus))
        index += w.gpus
        assert s.restore(_task(w), Placement.one(NodeName("n"), slots), w.admitted)


def _name(key: str) -> str:
    return key.rpartition("/")[2]


def run_preemption(case: PreemptionCase) -> frozenset[str]:
    """The names of the tasks one cycle preempts for ``case.incoming``."""
    s = _scheduler(case.queues, case.strategies)
    _restore(s, case.admitted)
    s.submit(_task(case.incoming))
    now = 1 + max([w.admitted for w in case.admitted] + [case.incoming.created])
    decisions = s.cycle(now)
    return frozenset(_name(d.task.key) for d in decisions if isinstance(d, Evict) and d.reason == "Preempted")


def run_admission(case: AdmissionCase) -> tuple[frozenset[str], frozenset[str]]:
    """Names admitted and names preempted once cycles stop changing anything (at most 20 cycles;
    a preempted task's workload is reported gone at once, as Kueue's tables assume)."""
    s = _scheduler(case.queues, None)
    _restore(s, case.admitted)
    for w in case.pending:
        s.submit(_task(w))
    admitted: set[str] = set()
    preempted: set[str] = set()
    now = 1 + max([w.admitted for w in case.admitted] + [w.created for w in case.pending] + [0.0])
    for step in range(20):
        decisions = s.cycle(now + step)
        for d in decisions:
            if isinstance(d, Admit):
                admitted.add(_name(d.task.key))
            elif isinstance(d, Evict):
                preempted.add(_name(d.task.key))
                if d.held is not None:
                    s.finish(d.held)
                s.victim_gone(d.task.key)
        if not decisions or all(type(d).__name__ == "Pending" for d in decisions):
            break
    return frozenset(admitted), frozenset(preempted)
