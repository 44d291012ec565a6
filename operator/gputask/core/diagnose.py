"""Why one task waits, in full: the answer of ``gputask explain`` (pure; no I/O).

:func:`diagnose` asks the same questions the scheduler's cycle asks of one pending task, without
changing anything: the queue's gate (queue missing, stopped, namespace not selected), then for each
flavor it may use the quota it needs against what is left, every node's filters in kube-scheduler's
order (:func:`gputask.core.reasons.refusals`), the preemption a cycle would start (the same planner,
:class:`gputask.core.preemption.Planner`, whose search leaves the state as it was) and, when none, why
not. It adds what the cycle does not compute: the *smallest change* that would let the task in, one
per kind of obstacle (quota to add, a smaller per-GPU request, memory to free on the nearest GPU, a
taint to tolerate, a node selector to relax, cpu to give up), each checked against the node it names.
Units: milli-GPU for ``nvidia.com/gpu``, MiB for GPU memory and host memory, millicores for cpu.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gputask.core.cluster import NodeState
from gputask.core.fit import NO_CONSTRAINTS, Filter, Toleration
from gputask.core.flavors import describe_key, split_key
from gputask.core.gpulinks import describe
from gputask.core.model import MILLI_PER_GPU, NodeName, Placement, Task, TaskKey
from gputask.core.preemption import any_preemption, candidates, may_preempt, needing_preemption
from gputask.core.quota import GPU, Usage
from gputask.core.reasons import Wait, could_ever_fit, gang_wait, min_usage, need_text, refusals
from gputask.core.view import SchedulerView


@dataclass(frozen=True, slots=True)
class QuotaLine:
    """One quota key the task charges: ``needs`` (what it would charge on the cheapest node that can hold it now,
    else the least it could charge anywhere) and ``left`` (what its queue may still use now; None: unlimited), in
    ``unit`` (milli-GPU or MiB)."""

    resource: str
    needs: int
    left: int | None
    unit: str

    @property
    def short(self) -> int:
        """How much is missing (0 when it fits)."""
        return 0 if self.left is None else max(0, self.needs - self.left)


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One node for the task: ``fits`` (every filter passes), else the filters' texts (``Filter: text``) in
    kube-scheduler's order. For a node that fits, ``quota`` names the quota key that refuses what the placement
    there would charge (None: quota allows it, so it could be admitted there now)."""

    node: str
    fits: bool
    refusals: tuple[str, ...] = ()
    quota: str | None = None

    @property
    def admits(self) -> bool:
        """True when the task could be admitted on this node now (it fits, and quota allows its charge)."""
        return self.fits and self.quota is None


@dataclass(frozen=True, slots=True)
class Victim:
    """A running task a preemption would evict (``node``, its ``priority`` and ``queue``)."""

    key: str
    node: str
    priority: int
    queue: str


@dataclass(frozen=True, slots=True)
class PreemptionView:
    """What preemption could do: ``victims`` of the plan a cycle would start (empty: none), else ``why_not``."""

    victims: tuple[Victim, ...] = ()
    node: str | None = None
    why_not: str = ""


@dataclass(frozen=True, slots=True)
class FlavorView:
    """The task tried in one flavor (``""``: the queue's implicit one): its quota, nodes and preemption; for a gang
    (several pods, or a required topology) ``gang`` says where each pod of its best try would go (``workers-0 on
    a1: GPUs 0, 1``, ``workers-3: no node``) and, when not every pod fits, what blocks the rest (the wait message)."""

    flavor: str
    quota: tuple[QuotaLine, ...]
    nodes: tuple[NodeVerdict, ...]
    preemption: PreemptionView
    ever: bool = True
    gang: tuple[str, ...] = ()
    gang_fits: bool | None = None

    @property
    def fits_now(self) -> bool:
        """True when it is placeable now within quota: the next cycle admits it unless tasks ahead take the room. A
        gang (``gang_fits`` not None) fits only when every pod has a node at once and the whole charge is within
        quota; one pod fitting a node says nothing of the gang."""
        if self.gang_fits is not None:
            return self.gang_fits
        return any(n.admits for n in self.nodes)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Everything ``gputask explain`` says of one task.

    ``state``: ``pending``, ``admitted`` or ``unknown`` (the operator's view has no such task);
    ``position``: 0 = head of its GPUClusterQueue, ``ahead_of`` how many wait behind it; ``gate``: a
    queue-level reason that keeps it out before any node is looked at; ``changes``: the smallest changes
    that would let it in, most direct first (empty when it fits now or nothing simple would); ``held``: GPUs still
    held for an earlier Job of the task that is gone while its pods are not (``GPUs on node X held until pod Y is
    gone``), filled in by the adapter, which knows pods. ``links``: for an admitted task, how the GPUs of each of its
    pods are connected where its node reports it (``node-a GPUs 0,1,2,3: NVLink x12 each pair``,
    :func:`gputask.core.gpulinks.describe`).
    """

    key: str
    state: str
    queue: str = ""
    local_queue: str | None = None
    priority: int = 0
    node: str | None = None
    position: int | None = None
    waiting_in_queue: int = 0
    gate: Wait | None = None
    flavors: tuple[FlavorView, ...] = ()
    changes: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    defragmentation: tuple[str, ...] = ()


def _unit(resource: str) -> str:
    return "milli-GPU" if split_key(resource)[0] == GPU else "MiB"


def _amount(value: int, unit: str) -> str:
    if unit == "milli-GPU":
        return f"{value / MILLI_PER_GPU:g} GPU" if value % 100 == 0 else f"{value}m GPU"
    return f"{value} MiB"


def diagnose(scheduler: SchedulerView, key: TaskKey, now: float | None = None) -> Diagnosis:
    """Explain task ``key`` as the scheduler sees it now; the state is left unchanged.

    A running task is reported ``admitted`` with its node; a key the scheduler does not know, ``unknown``. With
    ``now`` (s), a task waiting on fragmentation also gets the defragmentation plan a cycle would run then, or why
    none (``defragmentation``).
    """
    entry = scheduler.running.get(key) or scheduler.nominated.get(key)
    if entry is not None:
        held = entry.task
        return Diagnosis(key, "admitted", held.queue, held.local_queue, held.priority,
                         node=", ".join(entry.placement.nodes), links=_links(scheduler, entry.placement))
    task = scheduler.pending.get(key)
    if task is None:
        return Diagnosis(key, "unknown")
    same = [t.key for t in scheduler.pending if t.queue == task.queue and not scheduler.never_admits(t)]
    base = Diagnosis(
        key, "pending", task.queue, task.local_queue, task.priority,
        position=same.index(key) if key in same else None, waiting_in_queue=len(same),
    )
    gate = scheduler.gate(task)
    if gate is not None:
        return replace(base, gate=gate, changes=(change_for(gate),))
    spec = scheduler.quotas.specs[task.queue]
    variants = scheduler.variants(task) if spec.flavors else [task]
    views = tuple(_flavor_view(scheduler, v) for v in variants)
    changes: list[str] = []
    for view, variant in zip(views, variants, strict=True):
        for change in _changes(scheduler, variant, view):
            if change not in changes:
                changes.append(change)
    defrag = () if now is None else scheduler.defrag_lines(variants[0] if variants else task, now)
    return replace(base, flavors=views, changes=tuple(changes), defragmentation=defrag)


def _links(scheduler: SchedulerView, placement: Placement) -> tuple[str, ...]:
    """How each pod's GPUs are connected, on nodes that report links (one line per pod of two GPUs or more)."""
    cluster = scheduler.cluster
    out: list[str] = []
    for pod in placement.pods:
        if len(pod.gpus) < 2 or not cluster.has_node(pod.node):
            continue
        text = describe(cluster.node(pod.node).node, pod.indices)
        if text and f"{pod.node} {text}" not in out:
            out.append(f"{pod.node} {text}")
    return tuple(out)


def change_for(gate: Wait) -> str:
    """What to do about a queue-level wait (``gate``): the action, then the reason's message."""
    reason, message = gate.reason, gate.message
    actions = {
        "QueueNotFound": "queue: create it",
        "QueueHeld": "queue: set spec.stopPolicy: None on its GPUClusterQueue to resume admission",
        "QueueInactive": "queue: make it active",
        "NamespaceNotAllowed": "namespace: label the namespace so the queue's namespaceSelector selects it, or "
        "widen the selector",
        "PriorityClassNotFound": "priority: create the PriorityClass it names, or name one that exists",
        "InvalidSpec": "spec: correct it (it will not be admitted as it is)",
    }
    action = actions.get(reason, f"{reason}")
    return f"{action} ({message})" if message else action


def _flavor_view(scheduler: SchedulerView, task: Task) -> FlavorView:
    quotas = scheduler.quotas
    least = min_usage(task, scheduler.largest_gpu_mib)
    verdicts = []
    charges: list[Usage] = []
    for state in scheduler.cluster.sorted_nodes():
        found = refusals(state, task)
        refused = None
        if not found:
            _, charge, refused = scheduler.try_place(task, state.name)
            if charge is not None:
                charges.append(charge)
        verdicts.append(NodeVerdict(state.name, not found, tuple(f"{r.filter.value}: {r.text}" for r in found),
                                    refused))
    listed = quotas.specs[task.queue].quotas
    lines = []
    for resource, amount in least.items():
        if resource not in listed:
            continue
        needs = min((c.get(resource, 0) for c in charges), default=amount)
        lines.append(QuotaLine(resource, needs, quotas.available(task.queue, resource), _unit(resource)))
    ever = any(could_ever_fit(state, task) for state in scheduler.cluster.sorted_nodes())
    gang: tuple[str, ...] = ()
    gang_fits: bool | None = None
    if task.gang:
        placed, _, refused = scheduler.try_place(task)
        gang, gang_fits = _gang_lines(scheduler, task), placed is not None and refused is None
    return FlavorView(task.flavor, tuple(lines), tuple(verdicts), _preemption(scheduler, task, least), ever, gang,
                      gang_fits)


def _gang_lines(scheduler: SchedulerView, task: Task) -> tuple[str, ...]:
    """Each pod of the gang's best try (quota aside) and, when a pod has no node, why (module :mod:`reasons`)."""
    outcome = scheduler.place(task)
    found = outcome.gang
    pods = outcome.placement.pods if outcome.placement is not None else found.partial if found is not None else ()
    names = [f"{pod.name}-{i}" for pod in task.podsets for i in range(pod.count)]
    lines = []
    for name, placed in zip(names, pods or [None] * len(names), strict=True):
        gpus = "" if placed is None else ", ".join(map(str, placed.indices))
        lines.append(f"{name}: no node" if placed is None else f"{name} on {placed.node}: GPUs {gpus}")
    if outcome.placement is None and found is not None:
        domain = f" (domain {task.topology}={found.domain})" if found.domain is not None else ""
        lines.append(f"blocked{domain}: {gang_wait(task, found, scheduler.cluster).message}")
    return tuple(lines)


def _preemption(scheduler: SchedulerView, task: Task, least: dict[str, int]) -> PreemptionView:
    quotas = scheduler.quotas
    spec = quotas.specs[task.queue]
    if not any_preemption(spec):
        return PreemptionView(
            why_not=f"GPUClusterQueue {task.queue!r} preempts nothing (withinClusterQueue and reclaimWithinCohort "
            "are Never)"
        )
    if not may_preempt(spec, least, fair=quotas.fair_sharing(task.queue)):
        return PreemptionView(
            why_not="it needs more than its queue's nominal quota, and the queue may not preempt while borrowing "
            "(borrowWithinCohort: Never)"
        )
    needing = needing_preemption(quotas, task, least)
    found = candidates(task, scheduler.ledger.running_in, quotas, needing)
    if not found:
        return PreemptionView(why_not=_no_candidates(scheduler, task))
    plan = scheduler.preemption_plan(task)
    if plan is None:
        names = ", ".join(sorted(v.task.key for v in found)[:5]) + (", ..." if len(found) > 5 else "")
        return PreemptionView(
            why_not=f"evicting every task it may preempt ({len(found)}: {names}) would still not make room on "
            "one node within quota"
        )
    victims = tuple(
        Victim(v.task.key, ", ".join(v.placement.nodes), v.task.priority, v.task.queue)
        for v in sorted(plan.victims, key=lambda v: v.task.key)
    )
    return PreemptionView(victims=victims, node=", ".join(plan.placement.nodes))


def _no_candidates(scheduler: SchedulerView, task: Task) -> str:
    spec = scheduler.quotas.specs[task.queue]
    policy = spec.preemption
    own = [e.task for e in scheduler.running.values() if e.task.queue == task.queue]
    parts = []
    if policy.within_cluster_queue == "Never":
        parts.append(f"withinClusterQueue is Never in {task.queue!r}")
    elif own:
        rule = "lower" if policy.within_cluster_queue == "LowerPriority" else "lower (or equal and newer)"
        parts.append(f"none of the {len(own)} running in {task.queue!r} has {rule} priority than {task.priority}")
    else:
        parts.append(f"nothing of {task.queue!r} runs")
    if spec.cohort is not None:
        if policy.reclaim_within_cohort == "Never":
            parts.append(f"reclaimWithinCohort is Never, so cohort {spec.cohort!r} is not reclaimed")
        else:
            parts.append(f"no other queue of cohort {spec.cohort!r} borrows a resource it needs")
    return "no running task it may preempt: " + "; ".join(parts)


def _changes(scheduler: SchedulerView, task: Task, view: FlavorView) -> list[str]:
    """The smallest change per kind of obstacle, each checked on the node it names; a change that is not enough
    alone says what else it needs."""
    where = f" (flavor {task.flavor})" if task.flavor else ""
    if view.fits_now:
        return []
    out: list[str] = []
    fitting = any(n.fits for n in view.nodes)
    if view.ever:
        for line in view.quota:
            if line.short:
                alone = "" if fitting else "; not enough alone: no node has room for it now (see below)"
                out.append(
                    f"quota: GPUClusterQueue {task.queue!r} needs {_amount(line.short, line.unit)} more of "
                    f"{describe_key(line.resource)} (raise nominalQuota or borrowingLimit, or wait for its "
                    f"running tasks to finish){alone}"
                )
    if not task.single_pod:  # the changes below reshape one pod on one node; a task of several pods: not yet
        return out
    if fitting:
        smaller = _within_quota(scheduler, task, view, where)
        return out + ([smaller] if smaller else [])  # a node holds it now: only quota keeps it out
    states = scheduler.cluster.sorted_nodes()
    found = [*_gpu_changes(scheduler, states, task, where), *_static_changes(scheduler, states, task, where),
             *_host_changes(scheduler, states, task, where)]
    if not found and not view.ever:
        req = task.request
        each = f"{req.count} GPUs" if req.count > 1 else "a GPU"
        products = f" of {sorted(req.products)}" if req.products else ""
        per = " each" if req.count > 1 else ""
        found.append(f"cluster: no node could ever hold it{where} (it needs {each}{products}, {need_text(task)}{per}, "
                     "on one node that its taints and selector allow): add such a node, or ask for fewer GPUs or "
                     "less memory per GPU")
    return out + found


def _within_quota(scheduler: SchedulerView, task: Task, view: FlavorView, where: str) -> str | None:
    """For a memory request that fits a node but not the quota left: the largest per-GPU request that the quota
    left allows on one of those nodes (checked by placing it there), else None."""
    req = task.request
    if req.memory_mib is None:
        return None
    best: tuple[int, str] | None = None
    for verdict in view.nodes:
        if not verdict.fits or verdict.quota is None:
            continue
        placement, _, refused = scheduler.try_place(task, NodeName(verdict.node))
        if placement is None or refused is None:
            continue
        left = scheduler.quotas.available(task.queue, refused) or 0
        state = scheduler.cluster.node(NodeName(verdict.node))
        cards = [state.node.gpus[state.position[s.index]].memory_mib for s in placement.only().gpus]
        per_gpu = left // req.count  # milli-GPU (or MiB) each GPU may charge
        if split_key(refused)[0] == GPU:
            mib = min(per_gpu * (task.card_mib or card) // MILLI_PER_GPU for card in cards)
        else:
            mib = per_gpu
        if mib <= 0:
            continue
        smaller = replace(task, request=replace(req, memory_mib=mib))
        found, _, still = scheduler.try_place(smaller, NodeName(verdict.node))
        if found is not None and still is None and (best is None or (-mib, verdict.node) < (-best[0], best[1])):
            best = (mib, verdict.node)
    if best is None:
        return None
    return f"request: gpuMemory {best[0]}Mi or less (per GPU) fits the quota left, on node {best[1]}{where}"


def _quota_note(scheduler: SchedulerView, task: Task, node: str) -> str:
    """``""`` when quota allows what ``task`` would charge on ``node``, else what quota must also give."""
    _, charge, refused = scheduler.try_place(task, NodeName(node))
    if charge is None or refused is None:
        return ""
    left = scheduler.quotas.available(task.queue, refused) or 0
    short = charge.get(refused, 0) - left
    return (f"; not enough alone: GPUClusterQueue {task.queue!r} also needs {_amount(short, _unit(refused))} more "
            f"of {describe_key(refused)}")


def _only(state: NodeState, task: Task, kind: Filter) -> bool:
    """True when ``kind`` is the one filter refusing ``state`` for ``task``."""
    found = refusals(state, task)
    return bool(found) and all(r.filter is kind for r in found)


def _gpu_changes(scheduler: SchedulerView, states: list[NodeState], task: Task, where: str) -> list[str]:
    """For nodes only the GPU filter refuses: the largest request that fits now, and the least memory to free."""
    req = task.request
    best_fit: tuple[int, str] | None = None  # (per-GPU MiB that fits now, node)
    least_free: tuple[int, str, str, str] | None = None  # (MiB to free, node, which GPUs, held by)
    idle_short: tuple[int, str, str] | None = None  # (GPUs missing, node, held by) for whole-GPU tasks
    for state in states:
        if not _only(state, task, Filter.GPU):
            continue
        gpus = [(pos, g) for pos, g in enumerate(state.node.gpus) if g.healthy and req.allows(g.product)
                and (req.exclusive or state.admits(pos, req.share_group))]  # another share group's GPU never fits
        if len(gpus) < req.count:
            continue
        if req.exclusive:
            idle = sum(1 for pos, _ in gpus if state.is_idle(pos))
            busy = {g.index for pos, g in gpus if not state.is_idle(pos)}
            holders = ", ".join(sorted(k for k, p in state.tasks.items() if busy & set(p.indices)))
            candidate = (req.count - idle, state.name, holders)
            if idle_short is None or candidate[:2] < idle_short[:2]:
                idle_short = candidate
            continue
        free = sorted((state.free_mib(pos), g.index) for pos, g in gpus)  # 0 on a GPU held whole
        fits_now = free[-req.count][0]  # the count-th most free GPU: the largest request all of them take now
        if fits_now > 0 and (best_fit is None or (-fits_now, state.name) < (-best_fit[0], best_fit[1])):
            best_fit = (fits_now, state.name)
        large = [(f, i) for f, i in free if req.mib_on(state.node.gpus[state.position[i]]) <= state.node.gpus[
            state.position[i]].memory_mib]  # GPUs that could hold it once enough is freed
        if len(large) < req.count:
            continue
        chosen = large[-req.count:]
        missing = sum(max(0, req.mib_on(state.node.gpus[state.position[i]]) - f) for f, i in chosen)
        which = ", ".join(str(i) for _, i in sorted(chosen, key=lambda c: c[1]))
        indices = {i for _, i in chosen}
        holders = ", ".join(sorted(k for k, p in state.tasks.items() if indices & set(p.indices)))
        if least_free is None or (missing, state.name) < (least_free[0], least_free[1]):
            least_free = (missing, state.name, which, holders)
    out = []
    if idle_short is not None:
        short, node, holders = idle_short
        held = f", held by {holders}" if holders else ""
        out.append(f"memory: {short} more idle GPU{'s' if short > 1 else ''} on node {node}{where} would let it in "
                   f"(when tasks there finish or are preempted{held})")
    if least_free is not None:
        missing, node, which, holders = least_free
        label = "GPU" if "," not in which else "GPUs"
        held = f", held by {holders}" if holders else ""
        out.append(f"memory: {missing} MiB more free on node {node} {label} {which}{where} would let it in "
                   f"(when tasks there finish or are preempted{held})")
    if best_fit is not None and req.memory_mib is not None:
        smaller = replace(task, request=replace(req, memory_mib=best_fit[0]))
        out.append(f"request: gpuMemory {best_fit[0]}Mi or less (per GPU) fits node {best_fit[1]}{where} now"
                   + _quota_note(scheduler, smaller, best_fit[1]))
    return out


def _static_changes(scheduler: SchedulerView, states: list[NodeState], task: Task, where: str) -> list[str]:
    """A taint to tolerate, or a selector to relax, that alone would let a node take the task now."""
    constraints = task.constraints or NO_CONSTRAINTS
    tolerant = replace(task, constraints=replace(constraints, tolerations=(*constraints.tolerations, Toleration(
        operator="Exists"))))
    unselective = replace(task, constraints=replace(constraints, node_selector=(), terms=None))
    out = []
    for state in states:
        found = refusals(state, task)
        if not found or found[0].filter is not Filter.TAINT_TOLERATION:
            continue
        if not refusals(state, tolerant):
            taints = ", ".join(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
                               for t in state.node.taints if t.effect in ("NoSchedule", "NoExecute")
                               and not any(x.tolerates(t) for x in constraints.tolerations))
            out.append(f"taint: tolerating {taints} would let it onto node {state.name}{where} now"
                       + _quota_note(scheduler, tolerant, state.name))
            break
    for state in states:
        found = refusals(state, task)
        if not found or found[0].filter is not Filter.NODE_AFFINITY:
            continue
        if not refusals(state, unselective):
            out.append(f"selector: node {state.name}{where} would take it now if its nodeSelector/affinity allowed it"
                       + _quota_note(scheduler, unselective, state.name))
            break
    return out


def _host_changes(scheduler: SchedulerView, states: list[NodeState], task: Task, where: str) -> list[str]:
    """Host resources (cpu, memory) the task asks beyond the nearest node's free allocatable."""
    best: tuple[int, str, str] | None = None
    for state in states:
        if not _only(state, task, Filter.NODE_RESOURCES_FIT):
            continue
        for name, free, need, unit in (
            ("cpu", state.cpu_free, task.cpu_milli, "m"),
            ("memory", state.memory_free_mib, task.memory_mib, "Mi"),
        ):
            if free is not None and need > free and _fits_with(state, task, name, free):
                smaller = replace(task, cpu_milli=max(free, 0)) if name == "cpu" else replace(
                    task, memory_mib=max(free, 0))
                text = (f"request: {name} {max(free, 0)}{unit} or less fits node {state.name}{where} now"
                        + _quota_note(scheduler, smaller, state.name))
                if best is None or (need - free, state.name) < (best[0], best[1]):
                    best = (need - free, state.name, text)
    return [] if best is None else [best[2]]


def _fits_with(state: NodeState, task: Task, name: str, free: int) -> bool:
    smaller = replace(task, cpu_milli=max(free, 0)) if name == "cpu" else replace(task, memory_mib=max(free, 0))
    return not refusals(state, smaller)


__all__ = ["Diagnosis", "change_for", "FlavorView", "NodeVerdict", "PreemptionView", "QuotaLine", "Victim", "diagnose"]
