"""Queues' quota, Kueue ClusterQueue semantics at GPU granularity.

Resources (DESIGN.md section 2):
- ``nvidia.com/gpu`` in milli-GPU: for each device of a placement, reserved / device memory,
  rounded up (a whole GPU is 1000);
- ``gputask.io/gpu-memory`` in MiB reserved on the devices.

A resource a queue does not list is not limited. Borrowing follows Kueue's ClusterQueue
rules: a queue may use, beyond its nominalQuota, what the other queues of its cohort leave
unused and may lend (``lendingLimit``), up to its own ``borrowingLimit``.
Source: Kueue documentation, "Cluster Queue" (concepts), resource groups and cohorts.

The arithmetic is Kueue's (pkg/cache resource_node.go, ``available``): each member puts its
lendable quota (nominal, or lendingLimit when set) into one cohort pool and keeps the rest
(its guaranteed quota) to itself; usage beyond a member's guaranteed quota draws on the pool.
So unused quota is lent once, however many queues borrow it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gputask.core.fit import Requirement
from gputask.core.flavors import flavored, split_key
from gputask.core.model import MILLI_PER_GPU, NodeName, Placement, PodPlacement

GPU = "nvidia.com/gpu"
GPU_MEMORY = "gputask.io/gpu-memory"
RESOURCES = (GPU, GPU_MEMORY)

INFINITE_SHARE = float("inf")
"""The share of a queue of fair-sharing weight 0 that borrows (Kueue's math.MaxInt)."""

Usage = dict[str, int]
"""Amounts by resource name: milli-GPU for ``nvidia.com/gpu``, MiB for ``gputask.io/gpu-memory``."""


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """Quota of one resource in a queue (units as in :data:`Usage`); None = no limit."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


LabelRequirement = Requirement
"""One ``matchExpressions`` entry of a LabelSelector (In, NotIn, Exists, DoesNotExist): the node
selector requirement of :mod:`gputask.core.fit`, whose label semantics are the same."""


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes LabelSelector; the empty selector matches everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every matchLabels pair and every expression holds."""
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels.get(r.key)) for r in self.match_expressions
        )


WithinClusterQueue = Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"]
ReclaimWithinCohort = Literal["Never", "LowerPriority", "Any"]
BorrowWithinCohort = Literal["Never", "LowerPriority"]
QueueingStrategy = Literal["BestEffortFIFO", "StrictFIFO"]
StopPolicy = Literal["None", "Hold", "HoldAndDrain"]
WhenCanBorrow = Literal["Borrow", "TryNextFlavor"]
WhenCanPreempt = Literal["Preempt", "TryNextFlavor"]


@dataclass(frozen=True, slots=True)
class Preemption:
    """ClusterQueue preemption policy (Kueue names and defaults)."""

    within_cluster_queue: WithinClusterQueue = "Never"
    reclaim_within_cohort: ReclaimWithinCohort = "Never"
    borrow_within_cohort: BorrowWithinCohort = "Never"
    max_priority_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A GPUClusterQueue as the core sees it (quantities already converted).

    ``namespace_selector`` None selects no namespace (Kueue: a ClusterQueue without
    namespaceSelector admits nothing; ``{}`` admits every namespace). ``closed`` (every queue read
    from a GPUClusterQueue manifest) fails closed as Kueue does: a queue that lists neither GPU
    resource (``nvidia.com/gpu``, ``gputask.io/gpu-memory``) admits nothing. Both measure the same
    devices, so listing one of them is covering the task's request; the other, unlisted, is not
    limited. ``movable`` (``spec.disruption.movable``) is the default of its tasks that say nothing of it
    (:attr:`~gputask.core.model.Task.movable`): whether defragmentation may move them.
    """

    name: str
    cohort: str | None = None
    namespace_selector: LabelSelector | None = field(default_factory=LabelSelector)
    strategy: QueueingStrategy = "BestEffortFIFO"
    quotas: Mapping[str, ResourceQuota] = field(default_factory=dict)
    preemption: Preemption = field(default_factory=Preemption)
    fair_sharing_weight_milli: int | None = None
    stop_policy: StopPolicy = "None"
    closed: bool = False
    flavors: tuple[str, ...] = ()
    when_can_borrow: WhenCanBorrow = "Borrow"
    when_can_preempt: WhenCanPreempt = "TryNextFlavor"
    movable: bool = False

    def uncovered(self) -> str | None:
        """Why the queue can admit no task because it covers no GPU resource, else None."""
        if not self.closed or any(split_key(r)[0] in RESOURCES for r in self.quotas):
            return None
        return (f"GPUClusterQueue {self.name!r} covers no GPU resource: list {GPU} or {GPU_MEMORY} in spec.resources "
                "or spec.resourceGroups")


def usage_of(
    placement: PodPlacement, memory_of: Mapping[int, int], flavor: str = "", card_mib: int | None = None
) -> Usage:
    """Quota usage of one pod's placement in ``flavor`` (keys :func:`~gputask.core.flavors.flavored`);
    ``memory_of`` maps GPU index to the device's MiB on the pod's node.

    Each device counts its reserved MiB over ``card_mib`` (the flavor's charging card size) when
    given, else over its own memory, rounded up, at most one GPU; a device held whole counts one
    GPU. A GPU the node no longer reports (a restored placement on a vanished device) counts as a
    whole GPU: restoring running work must never fail.
    """
    milli = 0
    for s in placement.gpus:
        device = memory_of.get(s.index)
        if not device or s.memory_mib >= device:
            milli += MILLI_PER_GPU
        else:
            milli += min(MILLI_PER_GPU, -(-s.memory_mib * MILLI_PER_GPU // (card_mib or device)))
    memory = sum(s.memory_mib for s in placement.gpus)
    if flavor:
        return {flavored(GPU, flavor): milli, flavored(GPU_MEMORY, flavor): memory}
    return {GPU: milli, GPU_MEMORY: memory}


def placement_usage(
    placement: Placement,
    memory_of: Callable[[NodeName], Mapping[int, int]],
    flavor: str = "",
    card_mib: int | None = None,
) -> Usage:
    """Quota usage of a whole task's placement: the sum of :func:`usage_of` over its pods (Kueue charges
    a Workload the total of its PodSets); ``memory_of(node)`` maps GPU index to MiB on ``node``."""
    pods = placement.pods
    if len(pods) == 1:
        return usage_of(pods[0], memory_of(pods[0].node), flavor, card_mib)
    total: Usage = {}
    for pod in pods:
        add_usage(total, usage_of(pod, memory_of(pod.node), flavor, card_mib))
    return total


def add_usage(into: Usage, delta: Mapping[str, int], sign: int = 1) -> None:
    """Add (or with ``sign=-1`` subtract) ``delta`` into ``into`` in place."""
    for name, amount in delta.items():
        into[name] = into.get(name, 0) + sign * amount


class QuotaBook:
    """Usage per queue and the borrowing arithmetic over cohorts."""

    def __init__(self) -> None:
        self.specs: dict[str, QueueSpec] = {}
        self.usage: dict[str, Usage] = {}
        self.specs_version = 0  # changes whenever a spec is set or removed
        self._members: dict[str, list[QueueSpec]] | None = None  # by cohort; None: rebuild (specs changed)
        self._lendable_cache: dict[tuple[str, str], int] = {}
        self._fair_cache: dict[str, bool] = {}

    def set_queue(self, spec: QueueSpec) -> None:
        """Add or replace a queue's spec, keeping its usage."""
        self.specs[spec.name] = spec
        self.usage.setdefault(spec.name, {})
        self._specs_changed()

    def remove_queue(self, name: str) -> None:
        """Forget a queue's spec (usage stays, so running work is still counted)."""
        self.specs.pop(name, None)
        self._specs_changed()

    def trial_copy(self) -> QuotaBook:
        """A copy whose usage can be charged and uncharged without touching this book (preemption trials on a
        snapshot, :mod:`gputask.core.snapshot`). The specs and what is derived from them alone are shared: a
        trial never changes a spec."""
        out = QuotaBook()
        out.specs, out.specs_version = self.specs, self.specs_version
        out.usage = {name: dict(used) for name, used in self.usage.items()}
        out._members, out._lendable_cache, out._fair_cache = self.cohort_index(), self._lendable_cache, self._fair_cache
        return out

    def cohort_index(self) -> dict[str, list[QueueSpec]]:
        """The queues of each cohort, by cohort name (kept until a spec changes; read only)."""
        self.cohort_members("")
        assert self._members is not None
        return self._members

    def _specs_changed(self) -> None:
        self.specs_version += 1
        self._members = None
        self._lendable_cache.clear()
        self._fair_cache.clear()

    def cohort_members(self, cohort: str | None) -> Iterable[QueueSpec]:
        """Queues of ``cohort`` (none for a queue without a cohort); kept until a spec changes, as the
        quota checks of every placement and every fair-share key read it."""
        if cohort is None:
            return ()
        if self._members is None:
            self._members = {}
            for spec in self.specs.values():
                if spec.cohort is not None:
                    self._members.setdefault(spec.cohort, []).append(spec)
        return self._members.get(cohort, ())

    def _lendable(self, cohort: str, resource: str) -> int:
        """What the queues of ``cohort`` lend of ``resource`` in total (nominal, or lendingLimit)."""
        key = (cohort, resource)
        if key not in self._lendable_cache:
            self._lendable_cache[key] = sum(
                m.quotas[resource].nominal - self.guaranteed(m, resource)
                for m in self.cohort_members(cohort)
                if resource in m.quotas
            )
        return self._lendable_cache[key]

    def guaranteed(self, spec: QueueSpec, resource: str) -> int:
        """Quota of ``resource`` that ``spec`` keeps to itself: nominal minus lendingLimit (0 if unset)."""
        quota = spec.quotas.get(resource)
        if quota is None or quota.lending_limit is None:
            return 0
        return max(0, quota.nominal - quota.lending_limit)

    def cohort_free(self, cohort: str, resource: str) -> int:
        """What the cohort pool of ``resource`` still holds: lent quota minus usage drawn on it."""
        pool = 0
        for member in self.cohort_members(cohort):
            quota = member.quotas.get(resource)
            if quota is None:  # not limited in that queue: it neither lends nor draws
                continue
            guaranteed = self.guaranteed(member, resource)
            used = self.usage.get(member.name, {}).get(resource, 0)
            pool += quota.nominal - guaranteed - max(0, used - guaranteed)
        return max(0, pool)

    def available(self, name: str, resource: str) -> int | None:
        """How much more of ``resource`` queue ``name`` may use now; None = unlimited."""
        spec = self.specs[name]
        quota = spec.quotas.get(resource)
        if quota is None:
            return None
        used = self.usage.get(name, {}).get(resource, 0)
        if spec.cohort is None:
            return max(0, quota.nominal - used)
        guaranteed = self.guaranteed(spec, resource)
        from_cohort = self.cohort_free(spec.cohort, resource)
        if quota.borrowing_limit is not None:
            lent = quota.nominal - guaranteed
            drawn = max(0, used - guaranteed)
            from_cohort = min(from_cohort, max(0, lent - drawn + quota.borrowing_limit))
        return max(0, guaranteed - used) + from_cohort

    def refuses(self, name: str, usage: Mapping[str, int]) -> str | None:
        """The first resource (quota key) for which ``usage`` does not fit queue ``name``, else None."""
        for resource, amount in usage.items():
            if amount == 0:
                continue
            free = self.available(name, resource)
            if free is not None and amount > free:
                return resource
        return None

    def charge(self, name: str, usage: Mapping[str, int], sign: int = 1) -> None:
        """Add (sign=1) or remove (sign=-1) usage of queue ``name``."""
        add_usage(self.usage.setdefault(name, {}), usage, sign)

    def borrowed(self, name: str) -> Usage:
        """Amount used beyond nominalQuota, per listed resource."""
        spec = self.specs.get(name)
        used = self.usage.get(name, {})
        if spec is None:
            return {}
        return {r: max(0, used.get(r, 0) - q.nominal) for r, q in spec.quotas.items()}

    def is_borrowing(self, name: str, resources: Iterable[str] | None = None) -> bool:
        """True when queue ``name`` uses more than its nominalQuota of some listed resource (of
        ``resources`` only, when given: Kueue's ``cqIsBorrowing`` over the resources needing preemption)."""
        borrowed = self.borrowed(name)
        return any(borrowed.get(r, 0) > 0 for r in (borrowed if resources is None else resources))

    def beyond_nominal(self, name: str, usage: Mapping[str, int]) -> str | None:
        """The first resource for which adding ``usage`` takes queue ``name`` beyond its nominal quota
        (Kueue's ``BorrowingWith``), else None."""
        spec = self.specs.get(name)
        if spec is None:
            return None
        used = self.usage.get(name, {})
        for resource, amount in usage.items():
            quota = spec.quotas.get(resource)
            if quota is not None and amount > 0 and used.get(resource, 0) + amount > quota.nominal:
                return resource
        return None

    def ceiling(self, name: str, resource: str) -> int | None:
        """Most of ``resource`` queue ``name`` could ever use (empty cohort); None = unlimited."""
        spec = self.specs.get(name)
        quota = None if spec is None else spec.quotas.get(resource)
        if spec is None or quota is None:
            return None
        if spec.cohort is None:
            return quota.nominal
        others = sum(
            m.quotas[resource].nominal - self.guaranteed(m, resource)
            for m in self.cohort_members(spec.cohort)
            if m.name != name and resource in m.quotas
        )
        if quota.borrowing_limit is not None:
            others = min(others, quota.borrowing_limit)
        return quota.nominal + others

    def share(self, name: str, extra: Mapping[str, int] | None = None) -> float:
        """Weighted dominant resource share of queue ``name`` (Kueue fair sharing).

        For each listed resource, what the queue uses (plus ``extra``, which may be negative) beyond
        its nominal quota, times 1000, divided by what the cohort's queues lend in total; the share is
        the largest such ratio times 1000 divided by the weight in milli (``fairSharing.weight``,
        default 1); 0 when it borrows nothing; infinity for a queue of weight 0 that borrows.
        Source: Kueue, pkg/cache ``dominantResourceShare`` in its precise form (float ratios, as
        Kueue's current releases compute it: per-mille integers make a task small against the
        cohort change no share, so two queues could preempt each other back and forth) and the
        "Fair Sharing" documentation.
        """
        spec = self.specs.get(name)
        if spec is None or spec.cohort is None:
            return 0.0
        used = self.usage.get(name, {})
        best = -1.0
        for resource, quota in spec.quotas.items():
            borrowed = used.get(resource, 0) + (extra or {}).get(resource, 0) - quota.nominal
            if borrowed <= 0:
                continue
            best = max(best, 0.0)
            lendable = self._lendable(spec.cohort, resource)
            if lendable > 0:
                best = max(best, borrowed * 1000 / lendable)
        if best < 0:
            return 0.0
        weight = spec.fair_sharing_weight_milli if spec.fair_sharing_weight_milli is not None else 1000
        if weight == 0:
            return INFINITE_SHARE
        return best * 1000 / weight

    def fair_sharing(self, name: str) -> bool:
        """True when queue ``name`` is in a cohort whose queues set ``fairSharing``."""
        spec = self.specs.get(name)
        if spec is None or spec.cohort is None:
            return False
        if spec.cohort not in self._fair_cache:
            members = self.cohort_members(spec.cohort)
            self._fair_cache[spec.cohort] = any(m.fair_sharing_weight_milli is not None for m in members)
        return self._fair_cache[spec.cohort]
