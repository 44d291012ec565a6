"""Who a preemption may evict, and whether evicting them can make room on a node (split from
:mod:`gputask.core.preemption`, which plans with them).

Source: Kueue, pkg/scheduler/preemption (``findCandidates``, ``candidatesOrdering``); the node test
(:func:`could_fit_without`) is gputask's, which plans preemption for a placement, not for quota alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gputask.core.cluster import NodeState
from gputask.core.fit import static_refusal
from gputask.core.ledger import Entry
from gputask.core.model import Placement, Task
from gputask.core.quota import QuotaBook, Usage


@dataclass(slots=True)
class Victim:
    """A running task that may be preempted: task, placement, usage, admission time (s)."""

    task: Task
    placement: Placement
    usage: Usage
    admitted_at: float


@dataclass(frozen=True, slots=True)
class Plan:
    """Preempt ``victims`` (each with every pod of it) so ``placement``, on one node, fits the preemptor."""

    placement: Placement
    victims: tuple[Victim, ...]


def could_fit_without(state: NodeState, task: Task, victims: list[Victim]) -> bool:
    """Whether ``task`` could pass the node filters and find enough GPUs on ``state`` once ``victims`` are
    gone, reckoned without touching the state. Never False where the real search (``node_fits`` and
    ``feasible_gpus`` after releasing them) would find enough: so skipping a trial it refuses changes
    nothing, not even a random policy's draws (they happen only once a node has enough GPUs)."""
    node, req = state.node, task.request
    if not node.schedulable or len(node.gpus) < req.count:
        return False
    if (node.taints or task.constraints is not None) and static_refusal(
        task.constraints, node.labels, node.taints, node.name
    ) is not None:
        return False
    freed = {"cpu": 0, "memory": 0, "storage": 0}
    mib = [0] * len(node.gpus)
    held = [False] * len(node.gpus)
    groups_left = [dict(g) for g in state.groups]  # shared reservations per share group once the victims are gone
    pods_freed = 0
    for victim in victims:
        for pod, placed in zip(victim.task.pods, victim.placement.pods, strict=True):
            if placed.node != state.name:
                continue  # a victim's pod on another node frees nothing here
            pods_freed += 1
            freed["cpu"] += pod.cpu_milli
            freed["memory"] += pod.memory_mib
            freed["storage"] += pod.ephemeral_mib
            for slot in placed.gpus:
                pos = state.position.get(slot.index)
                if pos is not None and node.gpus[pos].uuid == slot.uuid:
                    mib[pos] += slot.memory_mib
                    held[pos] = True
                    if not pod.request.exclusive:
                        group = pod.request.share_group
                        groups_left[pos][group] = groups_left[pos].get(group, 0) - 1
    for free, need, key in ((state.cpu_free, task.cpu_milli, "cpu"), (state.memory_free_mib, task.memory_mib, "memory"),
                            (state.ephemeral_free_mib, task.ephemeral_mib, "storage")):
        if free is not None and need > free + freed[key]:
            return False
    pods = state.pods_free
    if pods is not None and pods + pods_freed < 1:
        return False
    usable = 0
    for pos, gpu in enumerate(node.gpus):
        if not gpu.healthy or not req.allows(gpu.product):
            continue
        reserved = state.reserved_mib[pos] - mib[pos]
        exclusive = state.exclusive[pos] and not held[pos]
        if req.exclusive:
            usable += reserved <= 0 and gpu.foreign_mib == 0
        elif not exclusive and gpu.memory_mib - gpu.foreign_mib - reserved >= req.mib_on(gpu):
            other_groups = any(count > 0 and g != req.share_group for g, count in groups_left[pos].items())
            usable += req.mib_on(gpu) <= gpu.memory_mib and not other_groups
    return usable >= req.count


def _removal_order(victim: Victim, preemptor_queue: str) -> tuple[object, ...]:
    """Kueue's ``candidatesOrdering``: other queues' tasks first, then lowest priority, then the most
    recently admitted, then the newest task."""
    return (
        victim.task.queue == preemptor_queue,
        victim.task.priority,
        -victim.admitted_at,
        -victim.task.created,
        victim.task.key,
    )


# -- eligibility: who may be preempted ---------------------------------------------------------------


def victim_allowed(preemptor: Task, victim: Task, quotas: QuotaBook, resources: Sequence[str] | None = None) -> bool:
    """Kueue's ``findCandidates`` for one running task (module doc): True when the queues'
    policies let ``preemptor`` preempt ``victim`` now (another queue's task only while it borrows)."""
    spec = quotas.specs.get(preemptor.queue)
    if spec is None:
        return False
    policy = spec.preemption
    if victim.queue == preemptor.queue:
        if policy.within_cluster_queue == "LowerPriority":
            return victim.priority < preemptor.priority
        if policy.within_cluster_queue == "LowerOrNewerEqualPriority":
            return victim.priority < preemptor.priority or (
                victim.priority == preemptor.priority and victim.created > preemptor.created
            )  # strictly newer (Kueue: preemptorTS.Before(candidateTS)); equal times never preempt
        return False
    other = quotas.specs.get(victim.queue)
    if spec.cohort is None or other is None or other.cohort != spec.cohort:
        return False
    if not quotas.is_borrowing(victim.queue, resources):
        return False
    if policy.reclaim_within_cohort == "Any":
        return True
    return policy.reclaim_within_cohort == "LowerPriority" and victim.priority < preemptor.priority


def candidates(
    task: Task,
    running: Iterable[Entry] | Callable[[set[str]], Iterable[Entry]],
    quotas: QuotaBook,
    resources: Sequence[str] | None = None,
) -> list[Victim]:
    """Running tasks the queues' policies let ``task`` preempt, in Kueue's order (:func:`_removal_order`);
    another queue's only while it borrows some of ``resources`` (those needing preemption; None: any).

    ``running``: the running entries, or a function giving those of some queues (the ledger's
    ``running_in``), so only the queues whose tasks could be victims are read.
    Entries whose quota someone else books (Kueue mode) are never candidates.
    """
    queues = _victim_queues(task, quotas, resources)
    if not queues:
        return []
    out = []
    for entry in running(queues) if callable(running) else running:
        if not entry.charged or entry.task.queue not in queues:
            continue
        if victim_allowed(task, entry.task, quotas, resources):
            out.append(Victim(entry.task, entry.placement, entry.usage, entry.admitted_at))
    out.sort(key=lambda v: _removal_order(v, task.queue))
    return out


def _victim_queues(task: Task, quotas: QuotaBook, resources: Sequence[str] | None = None) -> set[str]:
    """Queues whose tasks :func:`victim_allowed` could let ``task`` preempt at all: its own (unless
    ``withinClusterQueue: Never``), and the other queues of its cohort that borrow now (unless
    ``reclaimWithinCohort: Never``). A necessary condition, so candidates need not test every entry."""
    spec = quotas.specs.get(task.queue)
    if spec is None:
        return set()
    policy = spec.preemption
    out = {task.queue} if policy.within_cluster_queue != "Never" else set()
    if spec.cohort is not None and policy.reclaim_within_cohort != "Never":
        others = (m.name for m in quotas.cohort_members(spec.cohort) if m.name != task.queue)
        out |= {name for name in others if quotas.is_borrowing(name, resources)}
    return out
