"""Harness for Kueue's scheduler tables that need ResourceFlavors, at GPU granularity (see ``kueue_tables``).

The mapping is ``kueue_tables``': one unit of Kueue's ``cpu`` (or of its test resource ``gpu``) is one
whole GPU. What is added is a node per flavor: the node ``n-<flavor>`` carries the label
``flavor=<flavor>`` and :data:`~kueue_tables.NODE_GPUS` identical GPUs of 16 GiB (UUIDs unique across
nodes), and the GPUResourceFlavor ``<flavor>`` selects it by that label, so a task tried in a flavor can
only land on that flavor's node and placement never decides anything: what is compared is the queue
rules per flavor alone. Quotas are keyed ``nvidia.com/gpu@<flavor>`` (:func:`gputask.core.flavors.flavored`).

- :func:`FQ` is a GPUClusterQueue with a flavored quota per flavor, in the order Kueue's ResourceGroup
  lists them, and its flavorFungibility (gputask's ``Preempt`` is Kueue v1beta2's ``MayStopSearch`` for
  whenCanPreempt, ``Borrow`` its ``MayStopSearch`` for whenCanBorrow).
- :class:`FW` is a workload; an admitted one (``flavor`` set) is restored on its flavor's node.
- :class:`FlavorCase` is one case: admitted ones restored, pending ones submitted, cycles run until
  nothing changes (``kueue_tables.run_admission``'s loop); compared are the names admitted (and the
  flavor each was admitted in) and the names preempted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kueue_tables import GPU_MIB, NODE_GPUS, _name

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
from gputask.core.flavors import Flavor, flavored
from gputask.core.scheduler import Admit, Evict

Quota = int | tuple[int, int | None, int | None]
"""A flavor's quota in whole GPUs: nominal, or (nominal, borrowingLimit, lendingLimit) with None unset."""


def FQ(
    name: str,
    flavors: Mapping[str, Quota],
    *,
    cohort: str | None = None,
    within: str = "Never",
    reclaim: str = "Never",
    borrow: str = "Never",
    threshold: int | None = None,
    when_can_borrow: str = "Borrow",
    when_can_preempt: str = "TryNextFlavor",
    strategy: str = "BestEffortFIFO",
    weight: float | None = None,
) -> QueueSpec:
    """A GPUClusterQueue with one resource group over ``nvidia.com/gpu`` whose flavors are ``flavors``
    in order (a name mapped to its nominal quota, or to (nominal, borrowingLimit, lendingLimit)).

    ``within``/``reclaim``/``borrow``/``threshold`` are the preemption policy (as ``kueue_tables.Q``),
    ``when_can_borrow``/``when_can_preempt`` flavorFungibility (Kueue's defaults: Borrow, TryNextFlavor),
    ``weight`` fairSharing.weight (None: unset; a cohort any of whose queues sets it shares fairly).
    """
    quotas: dict[str, ResourceQuota] = {}
    for flavor, quota in flavors.items():
        nominal, borrowing, lending = (quota, None, None) if isinstance(quota, int) else quota
        quotas[flavored(GPU, flavor)] = ResourceQuota(
            nominal * 1000,
            None if borrowing is None else borrowing * 1000,
            None if lending is None else lending * 1000,
        )
    return QueueSpec(
        name,
        cohort=cohort,
        strategy=strategy,  # type: ignore[arg-type]
        quotas=quotas,
        preemption=Preemption(within, reclaim, borrow, threshold),  # type: ignore[arg-type]
        fair_sharing_weight_milli=None if weight is None else round(weight * 1000),
        flavors=tuple(flavors),
        when_can_borrow=when_can_borrow,  # type: ignore[arg-type]
        when_can_preempt=when_can_preempt,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class FW:
    """A workload: ``gpus`` whole GPUs in ``queue``. ``flavor`` set: it is admitted in that flavor (restored
    on its node) at ``admitted`` (s, Kueue's QuotaReserved time); ``created`` orders the queue (s)."""

    name: str
    queue: str
    gpus: int
    priority: int = 0
    admitted: float = 0.0
    created: float = 0.0
    flavor: str = ""


@dataclass(frozen=True)
class FlavorCase:
    """One case of Kueue's scheduler tables that needs flavors.

    ``want_flavors``: the flavor each newly admitted workload is admitted in (Kueue's wantAssignments, or
    what Kueue's later cycles would assign, which ``differs`` then says). ``absent``: flavors a queue lists
    that do not exist (no GPUResourceFlavor, no node).
    """

    source: str
    name: str
    queues: tuple[QueueSpec, ...]
    pending: tuple[FW, ...]
    want_admitted: frozenset[str]
    want_preempted: frozenset[str]
    want_flavors: Mapping[str, str] = field(default_factory=dict)
    admitted: tuple[FW, ...] = ()
    absent: frozenset[str] = frozenset()
    differs: str | None = None


def node_of(flavor: str) -> NodeName:
    """The node that holds ``flavor``."""
    return NodeName(f"n-{flavor}")


def _task(w: FW) -> Task:
    return Task(TaskKey(f"ns/{w.name}"), w.queue, GpuRequest(w.gpus), priority=w.priority, created=w.created)


def flavors_of(queues: Iterable[QueueSpec]) -> list[str]:
    """Every flavor the queues list, in first-listed order."""
    seen: dict[str, None] = {}
    for q in queues:
        seen.update(dict.fromkeys(q.flavors))
    return list(seen)


def scheduler_for(queues: Iterable[QueueSpec], absent: Iterable[str] = ()) -> Scheduler:
    """A scheduler with a node and a GPUResourceFlavor per flavor the queues list (but ``absent``), and the
    queues."""
    queues = tuple(queues)
    missing = set(absent)
    s = Scheduler()
    for flavor in flavors_of(queues):
        if flavor in missing:
            continue
        gpus = tuple(Gpu(i, f"{flavor}-{i}", "NVIDIA-A10", GPU_MIB) for i in range(NODE_GPUS))
        s.set_node(Node(node_of(flavor), gpus, labels=(("flavor", flavor),)))
        s.set_flavor(Flavor(flavor, node_labels=(("flavor", flavor),)))
    for q in queues:
        s.set_queue(q)
    return s


def restore(s: Scheduler, admitted: Iterable[FW]) -> None:
    """Restore admitted workloads, each on the next free GPUs of its flavor's node."""
    used: dict[str, int] = {}
    for w in admitted:
        if not w.flavor:
            raise ValueError(f"admitted workload {w.name} names no flavor")
        start = used.get(w.flavor, 0)
        used[w.flavor] = start + w.gpus
        slots = tuple(GpuSlot(i, f"{w.flavor}-{i}", GPU_MIB) for i in range(start, start + w.gpus))
        assert s.restore(_task(w), Placement.one(node_of(w.flavor), slots), w.admitted)
        assert s.running[TaskKey(f"ns/{w.name}")].task.flavor == w.flavor, w.name


def run_flavor_admission(case: FlavorCase) -> tuple[frozenset[str], frozenset[str], dict[str, str]]:
    """Names admitted, names preempted and {name: flavor admitted in} once cycles stop changing anything
    (at most 20 cycles; a preempted task's workload is reported gone at once, as Kueue's tables assume, and
    it is requeued as Kueue requeues it). A task admitted twice (preempted, then admitted again) reports
    the flavor of its last admission."""
    s = scheduler_for(case.queues, case.absent)
    restore(s, case.admitted)
    for w in case.pending:
        s.submit(_task(w))
    admitted: set[str] = set()
    preempted: set[str] = set()
    flavors: dict[str, str] = {}
    now = 1 + max([w.admitted for w in case.admitted] + [w.created for w in case.pending] + [0.0])
    for step in range(20):
        decisions = s.cycle(now + step)
        for d in decisions:
            if isinstance(d, Admit):
                name = _name(d.task.key)
                admitted.add(name)
                flavors[name] = d.task.flavor
            elif isinstance(d, Evict):
                preempted.add(_name(d.task.key))
                if d.held is not None:
                    s.finish(d.held)
                s.victim_gone(d.task.key)
        if not decisions or all(type(d).__name__ == "Pending" for d in decisions):
            break
    return frozenset(admitted), frozenset(preempted), flavors


__all__ = ["FQ", "FW", "FlavorCase", "flavors_of", "node_of", "restore", "run_flavor_admission", "scheduler_for"]
