"""Why a task waits (condition reasons and messages), and the scheduler's reports.

Every wait has a reason (DESIGN.md principle 4); the message names the binding constraint:
which quota, how many GPUs with how much free memory, which product, which queue state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from enum import StrEnum

from gputask.core.cluster import ClusterState, NodeState
from gputask.core.decisions import Wait as Wait  # defined with the decisions; read here as always
from gputask.core.fit import Filter, Refusal, static_refusal
from gputask.core.flavors import describe_key, flavored, split_key
from gputask.core.gang import GangOutcome, domain_of, pods_fitting
from gputask.core.model import MILLI_PER_GPU, NodeName, Task, TaskKey, is_mig_product
from gputask.core.placement import Outcome, feasible_gpus
from gputask.core.quota import GPU, GPU_MEMORY, QueueSpec, QuotaBook
from gputask.core.view import SchedulerView


class Reason(StrEnum):
    """Condition reasons (CamelCase) of the core's decisions: why a task waits, was evicted or failed.

    A member is its string (``Reason.NO_FIT == "NoFit"``), so statuses, Events, metrics and JSON
    carry the plain name.
    """

    QUEUE_NOT_FOUND = "QueueNotFound"
    QUEUE_INACTIVE = "QueueInactive"
    QUEUE_HELD = "QueueHeld"
    NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"
    QUOTA_EXCEEDED = "QuotaExceeded"
    NO_FIT = "NoFit"
    PRODUCT_UNAVAILABLE = "ProductUnavailable"
    INADMISSIBLE = "Inadmissible"
    STRICT_FIFO_BLOCKED = "StrictFIFOBlocked"
    PREEMPTING = "Preempting"
    PREEMPTED = "Preempted"
    QUEUE_DRAINED = "QueueDrained"
    NODE_FAILURE = "NodeFailure"
    GPU_FAILURE = "GPUFailure"
    MAX_RESCHEDULES_EXCEEDED = "MaxReschedulesExceeded"
    GPU_MEMORY_EXCEEDED = "GPUMemoryExceeded"
    FRAGMENTED = "Fragmented"
    DEFRAGMENTING = "Defragmenting"
    DEFRAGMENTED = "Defragmented"


QUEUE_NOT_FOUND, QUEUE_INACTIVE, QUEUE_HELD = Reason.QUEUE_NOT_FOUND, Reason.QUEUE_INACTIVE, Reason.QUEUE_HELD
NAMESPACE_NOT_ALLOWED, QUOTA_EXCEEDED, NO_FIT = Reason.NAMESPACE_NOT_ALLOWED, Reason.QUOTA_EXCEEDED, Reason.NO_FIT
PRODUCT_UNAVAILABLE, INADMISSIBLE, PREEMPTING = Reason.PRODUCT_UNAVAILABLE, Reason.INADMISSIBLE, Reason.PREEMPTING
WAITING_FOR_HEAD = Reason.STRICT_FIFO_BLOCKED


def _unit(resource: str) -> str:
    return "milli-GPU" if split_key(resource)[0] == GPU else "MiB"


def need_text(task: Task) -> str:
    """``idle``, ``12288 MiB free`` or ``25% free``: what each GPU must offer."""
    req = task.request
    if req.exclusive:
        return "idle"
    if req.memory_mib is not None:
        return f"{req.memory_mib} MiB free"
    return f"{(req.fraction_milli or 0) / 10:g}% free"


def namespace_refusal(task: Task, spec: QueueSpec) -> Wait | None:
    """NamespaceNotAllowed when the queue's namespaceSelector does not select the task's namespace."""
    if spec.namespace_selector is None:
        return Wait(
            NAMESPACE_NOT_ALLOWED,
            f"GPUClusterQueue {spec.name!r} has no namespaceSelector, so it admits no namespace "
            "(namespaceSelector: {} admits all)",
        )
    if spec.namespace_selector.matches(dict(task.namespace_labels)):
        return None
    return Wait(NAMESPACE_NOT_ALLOWED, f"namespace {task.namespace!r} is not selected by GPUClusterQueue {spec.name!r}")


def min_usage(task: Task, largest_gpu_mib: int = 0) -> dict[str, int]:
    """The least a task can charge: exact MiB for memory requests, whole GPUs when exclusive.

    For a memory request the GPU share is at least its MiB over the largest GPU's MiB, at most one GPU
    (``largest_gpu_mib``, 0 when unknown: then 1 milli-GPU per GPU); in a flavor with a charging card size
    (``task.card_mib``) it is its MiB over that size, and a fraction's charge depends on the card, so 1.
    A task of several pods: the sum over its pods.
    """
    if not task.single_pod:
        total: dict[str, int] = {}
        for pod in task.pods:
            for key, amount in min_usage(task.pod_task(pod), largest_gpu_mib).items():
                total[key] = total.get(key, 0) + amount
        return total
    req = task.request
    if req.exclusive:
        milli = MILLI_PER_GPU
    elif task.card_mib is not None:  # in a flavor charging against its card size (flavors.py)
        milli = min(MILLI_PER_GPU, -(-req.memory_mib * MILLI_PER_GPU // task.card_mib)) if req.memory_mib else 1
    elif req.fraction_milli is not None:
        milli = req.fraction_milli
    elif req.memory_mib is not None and largest_gpu_mib > 0:  # a GPU's share is never more than the GPU
        milli = min(MILLI_PER_GPU, -(-req.memory_mib * MILLI_PER_GPU // largest_gpu_mib))
    else:
        milli = 1
    memory = req.count * req.memory_mib if req.memory_mib is not None else 0
    return {flavored(GPU, task.flavor): req.count * milli, flavored(GPU_MEMORY, task.flavor): memory}


def never_fits_queue(task: Task, quotas: QuotaBook) -> Wait | None:
    """Inadmissible when the task is bigger than its queue could ever hold (nominal + borrowable)."""
    for resource, amount in min_usage(task).items():
        ceiling = quotas.ceiling(task.queue, resource)
        if ceiling is not None and amount > ceiling:
            return Wait(
                INADMISSIBLE,
                f"needs at least {amount} {_unit(resource)} of {describe_key(resource)}; GPUClusterQueue "
                f"{task.queue!r} can never hold more than {ceiling}",
            )
    return None


def explain(task: Task, outcome: Outcome, quotas: QuotaBook, cluster: ClusterState) -> Wait:
    """The reason a task found no placement this cycle."""
    req = task.request
    if not outcome.product_seen:
        return Wait(PRODUCT_UNAVAILABLE, f"no node has a GPU of product {sorted(req.products)}")
    if outcome.quota_resource is not None:
        free = quotas.available(task.queue, outcome.quota_resource)
        return Wait(
            QUOTA_EXCEEDED,
            f"quota of {describe_key(outcome.quota_resource)} in GPUClusterQueue {task.queue!r} has "
            f"{free} {_unit(outcome.quota_resource)} left",
        )
    if outcome.gang is not None:
        return gang_wait(task, outcome.gang, cluster)
    index = cluster.index()
    cached = index.summaries.get(task.fit_key)
    if cached is not None and cached[0] == index.log_end:  # no node changed since: the same counts
        return cached[1]  # type: ignore[no-any-return]
    if len(index.summaries) > 4096:
        index.summaries.clear()
    states = index.states
    if not any(could_ever_fit(s, task) for s in states):
        text, filters = nodes_summary(task, states, ever=True, groups=index.group)
        wait = Wait(INADMISSIBLE, f"no node could ever hold it: {text}", filters)
    else:
        text, filters = nodes_summary(task, states, groups=index.group)
        wait = Wait(NO_FIT, text, filters)
    index.summaries[task.fit_key] = (index.log_end, wait)
    return wait


def gang_wait(task: Task, outcome: GangOutcome, cluster: ClusterState) -> Wait:
    """Why a gang found no placement: ``0/64 pods placeable together: 9 nodes have room for a pod of PodSet
    'workers' (8 idle GPUs), at most 3 of them in one example.com/rack domain`` (per PodSet; the most pods its best
    try placed at once), Inadmissible when some PodSet fits no node even empty."""
    states = cluster.index().states
    parts = []
    for pod in task.podsets:
        one = task.pod_task(pod)
        if not any(could_ever_fit(s, one) for s in states):
            text, filters = nodes_summary(one, states, ever=True)
            return Wait(INADMISSIBLE, f"no node could ever hold a pod of PodSet {pod.name!r}: {text}", filters)
        room = [s for s in states if pods_fitting(s, pod, 1)]
        each = f"{pod.request.count} GPUs {need_text(one)}" if pod.request.count != 1 else f"a GPU {need_text(one)}"
        part = f"{len(room)} nodes have room for a pod of PodSet {pod.name!r} ({each})"
        key = task.topology
        if key is not None and room:
            domains = Counter(domain_of(s, key) for s in room)
            domains.pop(None, None)
            most = max(domains.values(), default=0)
            part += f", at most {most} of them in one {key} domain"
        parts.append(part)
    return Wait(NO_FIT, f"{outcome.placed}/{task.pod_count} pods placeable together: {'; '.join(parts)}")


def gpu_refusal(state: NodeState, task: Task, *, ever: bool = False) -> Refusal | None:
    """The GPU filter: too few GPUs (of an allowed product) that are ``need_text`` (``ever``: that
    could be, on the empty node); None when enough are. Its text names what each GPU must offer."""
    req = task.request
    gpus = state.node.gpus
    if req.products and req.products.isdisjoint([g.product for g in gpus]):
        return Refusal(Filter.GPU, f"no GPU of product {sorted(req.products)}")
    if not req.products and any(is_mig_product(g.product) for g in gpus):
        outside = sum(1 for g in gpus if g.healthy and not is_mig_product(g.product))
        if outside < req.count:
            what = "no GPU" if req.count == 1 else f"fewer than {req.count} GPUs"
            return Refusal(Filter.GPU, f"{what} outside MIG (a MIG device takes only tasks whose gpuProducts name it)")
    if ever:
        usable = sum(1 for g in gpus if req.allows(g.product) and req.mib_on(g) <= g.memory_mib)
    else:
        usable = len(feasible_gpus(state, task))
    if usable >= req.count:
        return None
    need = need_text(task)
    if ever and len(gpus) < req.count:
        return Refusal(Filter.GPU, f"fewer than {req.count} GPUs")
    if ever:
        text = "no GPU large enough" if req.count == 1 else f"fewer than {req.count} GPUs large enough"
        return Refusal(Filter.GPU, text)
    if req.exclusive:
        return Refusal(Filter.GPU, f"fewer than {req.count} idle GPUs" if req.count > 1 else "no idle GPU")
    if not ever and any(not state.admits(pos, req.share_group) for pos in range(len(gpus))):
        need += f" that tasks of another share group do not hold (this task's: {share_group_text(req.share_group)})"
    return Refusal(Filter.GPU, f"fewer than {req.count} GPUs with {need}" if req.count > 1 else f"no GPU with {need}")


def share_group_text(group: str) -> str:
    """A share group as people say it: ``""`` time-slicing, ``"MPS"`` MPS, ``"namespace ml, MPS"`` MPS in namespace
    ml (the groups :func:`gputask.manifests.convert.share_group` makes)."""
    namespace = ""
    if group.startswith("namespace "):
        namespace, _, group = group.partition(", ")
    what = "MPS" if group == "MPS" else "time-slicing"
    return f"{what} in {namespace}" if namespace else what


NODE_CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
"""Taints Kubernetes itself puts on a node while a condition holds (``not-ready``, ``unreachable``,
``unschedulable``, ``memory-pressure``, ``disk-pressure``, ``pid-pressure``, ``network-unavailable``, a new node's
start-up ``not-ready``) and takes off when it clears: never a reason a task could *never* fit."""


def refusals(state: NodeState, task: Task, *, ever: bool = False) -> list[Refusal]:
    """Why ``state`` cannot take ``task`` now, as kube-scheduler reports it: the first filter that
    refuses, in its order (NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit, then
    GPUs), NodeResourcesFit naming every insufficient resource. Empty when the node fits.

    With ``ever``, judged on the node as if empty, schedulable and free of the taints of node conditions
    (:data:`NODE_CONDITION_TAINT_PREFIX`): what no wait can change.
    """
    node = state.node
    if not node.schedulable and not ever:
        why = node.unschedulable_reason
        return [Refusal(Filter.NODE_UNSCHEDULABLE, f"unschedulable ({why})" if why else "unschedulable")]
    taints = node.taints
    if ever and taints:  # the node lifecycle controller and the kubelet add and remove these with conditions
        taints = tuple(t for t in taints if not t.key.startswith(NODE_CONDITION_TAINT_PREFIX))
    if taints or task.constraints is not None:
        static = static_refusal(task.constraints, node.labels, taints, node.name)
        if static is not None:
            return [static]
    free = (
        (node.cpu_milli, None if ever else state.cpu_free, task.cpu_milli, "cpu"),
        (node.memory_mib, None if ever else state.memory_free_mib, task.memory_mib, "memory"),
        (node.ephemeral_mib, None if ever else state.ephemeral_free_mib, task.ephemeral_mib, "ephemeral-storage"),
        (node.pods, None if ever else state.pods_free, 1, "pods"),
    )
    out = [
        Refusal(Filter.NODE_RESOURCES_FIT, "too many pods" if name == "pods" else f"insufficient {name}")
        for cap, left, need, name in free
        if cap is not None and need > (cap if left is None else left)
    ]
    if out:
        return out
    gpu = gpu_refusal(state, task, ever=ever)
    return [] if gpu is None else [gpu]


def nodes_summary(
    task: Task, states: Iterable[NodeState], *, ever: bool = False, groups: Sequence[int] | None = None
) -> tuple[str, tuple[tuple[str, int], ...]]:
    """kube-scheduler's count of refusals: ``0/12 nodes fit: 5 no GPU with 40960 MiB free, 3 insufficient
    cpu, ...`` (most frequent first; a node refused for two resources counts under both), and the
    count of nodes each filter refused. Nodes that fit are counted in the numerator.

    ``groups`` (the cluster index's group ids, row by row with ``states``) lets identical nodes share
    one evaluation, unless the task's affinity reads node names.
    """
    states = list(states)
    share = groups is not None and not (task.constraints is not None and task.constraints.by_name)
    if share and groups is not None:
        weights = Counter(groups)  # identical nodes: one evaluation, counted as many times as there are
        rows = {group: row for row, group in enumerate(groups)}
        sample = [(states[rows[group]], n) for group, n in weights.items()]
    else:
        sample = [(state, 1) for state in states]
    texts: dict[str, int] = {}
    filters: dict[str, int] = {}
    fitting = 0
    for state, n in sample:
        found = refusals(state, task, ever=ever)
        if not found:
            fitting += n
        for refusal in found:
            texts[refusal.text] = texts.get(refusal.text, 0) + n
        for name in {r.filter.value for r in found}:
            filters[name] = filters.get(name, 0) + n
    total = len(states)
    parts = ", ".join(f"{n} {text}" for text, n in sorted(texts.items(), key=lambda kv: (-kv[1], kv[0])))
    head = f"{fitting}/{total} nodes fit"
    return (f"{head}: {parts}" if parts else head), tuple(sorted(filters.items()))


def could_ever_fit(state: NodeState, task: Task) -> bool:
    """True when the node, empty and schedulable, could hold the task: taints, selector and affinity,
    allocatable cpu, memory, ephemeral-storage and pods, GPU count, product and memory."""
    return not refusals(state, task, ever=True)


def queue_status(scheduler: SchedulerView) -> dict[str, dict[str, object]]:
    """Per queue: usage (milli-GPU, MiB), borrowed, pending and admitted counts."""
    pending = scheduler.pending.count_by_queue()
    for queue, parked in scheduler.parked_by_queue().items():  # never admitted there: not its pending work
        pending[queue] -= parked
    admitted: dict[str, int] = {}
    for (queue, _, _, _), tally in scheduler.ledger.tallies.items():  # O(groups), not O(tasks)
        if tally.running:
            admitted[queue] = admitted.get(queue, 0) + tally.running
    quotas = scheduler.quotas
    names = sorted(set(quotas.specs) | set(pending) | set(admitted))
    return {
        n: {
            "usage": _usage_keys(quotas, n),
            "borrowed": quotas.borrowed(n),
            "pending": pending.get(n, 0),
            "admitted": admitted.get(n, 0),
        }
        for n in names
    }


def _usage_keys(quotas: QuotaBook, name: str) -> dict[str, int]:
    """Usage of queue ``name`` by quota key: both GPU resources of each of its flavors (the bare names for
    the implicit flavor), plus whatever it still uses of flavors it no longer lists."""
    spec = quotas.specs.get(name)
    used = quotas.usage.get(name, {})
    flavors = spec.flavors if spec is not None and spec.flavors else ("",)
    out = {flavored(r, f): used.get(flavored(r, f), 0) for f in flavors for r in (GPU, GPU_MEMORY)}
    out.update({k: v for k, v in used.items() if v and k not in out})
    return out


def violations(
    scheduler: SchedulerView, *, nodes: Iterable[NodeName] | None = None, keys: Iterable[TaskKey] | None = None
) -> list[str]:
    """Broken invariants: GPU over-commit, quota beyond the queue's ceiling, a task in two states.

    ``nodes`` and ``keys`` limit the per-node and per-task checks to what changed since a previous
    check (the scenario runner checks after every cycle); quotas are always checked in full.
    """
    out = scheduler.cluster.violations(nodes)
    quotas = scheduler.quotas
    for name in quotas.specs:
        used = quotas.usage.get(name, {})
        for resource in quotas.specs[name].quotas:
            ceiling = quotas.ceiling(name, resource)
            if ceiling is not None and used.get(resource, 0) > ceiling:
                out.append(f"queue {name}: {resource} usage {used.get(resource, 0)} > {ceiling}")
    if keys is None:
        both = (set(scheduler.running) | set(scheduler.nominated)) & {t.key for t in scheduler.pending}
    else:
        pending = scheduler.pending
        both = {k for k in keys if k in pending and (k in scheduler.running or k in scheduler.nominated)}
    out.extend(f"task {key} is both pending and placed" for key in sorted(both))
    if keys is None:
        out.extend(_tally_violations(scheduler))
    return out


def _tally_violations(scheduler: SchedulerView) -> list[str]:
    """The ledger's admitted tallies (:class:`~gputask.core.ledger.Tally`) unlike a count over every admitted task."""
    counted: dict[object, tuple[int, int, dict[str, int]]] = {}
    for entries, running in ((scheduler.running.values(), 1), (scheduler.nominated.values(), 0)):
        for entry in entries:
            task = entry.task
            group = (task.queue, task.namespace, task.local_queue, task.flavor)
            runs, nominated, usage = counted.get(group, (0, 0, {}))
            for key, amount in entry.usage.items():
                usage[key] = usage.get(key, 0) + amount
            counted[group] = (runs + running, nominated + 1 - running, usage)
    kept = {g: (t.running, t.nominated, {k: v for k, v in t.usage.items() if v}) for g, t in
            scheduler.ledger.tallies.items()}
    counted = {g: (r, n, {k: v for k, v in u.items() if v}) for g, (r, n, u) in counted.items()}
    out = [] if kept == counted else [f"admitted tallies {kept} are not the admitted tasks' {counted}"]
    waits: dict[tuple[str, str], int] = {}
    for key, (reason, _, _) in scheduler.reasons.items():
        placed = scheduler.ledger.get(key)  # a nominated preemptor says Preempting
        waiting = scheduler.pending.get(key) or (placed.task if placed is not None else None)
        where = (waiting.queue if waiting is not None else "?", str(reason))
        waits[where] = waits.get(where, 0) + 1
    refused: dict[str, int] = {}
    for filters in scheduler.filters.values():
        for name, _ in filters:
            refused[name] = refused.get(name, 0) + 1
    if (waits, refused) != (scheduler.waiting_by_reason, scheduler.waiting_by_filter):
        out.append(f"wait counts {scheduler.waiting_by_reason} {scheduler.waiting_by_filter} are not {waits} {refused}")
    return out
