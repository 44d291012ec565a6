"""Conversion between Kubernetes objects (plain dicts) and core values, with clear errors.

Every function here is pure and raises :class:`gputask.core.InvalidTaskError` (with a
CamelCase ``reason``) or :class:`gputask.core.InvalidQueueError` on bad input; callers turn
those into a status condition and an Event, never a retry loop. Quantities go through
``kubernetes.utils.parse_quantity``; MiB are integers, rounded up.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from typing import Any, get_args

from gputask.core import (
    GPU,
    GPU_MEMORY,
    MILLI_PER_GPU,
    Gpu,
    GpuRequest,
    InvalidQueueError,
    InvalidTaskError,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeName,
    PodSet,
    Preemption,
    QueueSpec,
    ResourceQuota,
    Task,
    task_key,
)
from gputask.core.fit import Constraints
from gputask.core.flavors import Flavor
from gputask.core.model import is_mig_product, mig_parent_index
from gputask.core.quota import (
    BorrowWithinCohort,
    QueueingStrategy,
    ReclaimWithinCohort,
    StopPolicy,
    WithinClusterQueue,
)
from gputask.manifests import flavors as flavors_manifest
from gputask.manifests.fields import aggregate, kube_quantity
from gputask.manifests.flavors import fungibility, resource_groups
from gputask.manifests.podfit import Requests, constraints_of, pod_requests
from gputask.manifests.podsets import pod_set_entries, topology_of
from gputask.manifests.podspec import template_problems

MIB = 1 << 20
DEVICE_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9-]+$")
"""A GPU's or MIG device's UUID as NVML gives it (R470+ drivers; the older ``MIG-GPU-<uuid>/<gi>/<ci>`` form is
refused: a ``/`` is no part of a CDI device name, and those drivers are years out of support)."""
MAX_GPUS = 16
MAX_GPU_MEMORY_MIB = 1 << 20  # 1 TiB per GPU: larger is certainly a unit mistake
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
INVALID_SPEC = "InvalidSpec"


def quantity(value: Any, *, field: str) -> Decimal:
    """Parse a Kubernetes quantity (``"16Gi"``, ``"1500m"``, ``4``) as the API server does
    (:func:`gputask.manifests.fields.kube_quantity`); raises ValueError naming ``field``."""
    try:
        return kube_quantity(value)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def to_mib(value: Any, *, field: str) -> int:
    """Bytes quantity to whole MiB, rounding up; ValueError when not a positive quantity."""
    amount = quantity(value, field=field)
    if amount <= 0:
        raise ValueError(f"{field}: {value!r} must be positive")
    return math.ceil(amount / MIB)


def timestamp(value: Any) -> float:
    """RFC 3339 time (``2026-01-02T03:04:05Z``) to epoch seconds; 0.0 when absent or malformed."""
    if not isinstance(value, str):
        return 0.0
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _bad(message: str) -> InvalidTaskError:
    return InvalidTaskError(INVALID_SPEC, message)


def _int_field(spec: Mapping[str, Any], name: str, default: int, low: int, high: int, where: str = "spec") -> int:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        finite = isinstance(value, float) and math.isfinite(value)
        shown = f"{value:f}".rstrip("0").rstrip(".") if finite else repr(value)
        raise _bad(f"{where}.{name} must be an integer from {low} to {high}, got {shown}")
    if not low <= value <= high:
        raise _bad(f"{where}.{name} must be between {low} and {high}, got {value}")
    return value


GPU_SHARINGS = ("TimeSlicing", "MPS")
"""``spec.gpuSharing`` values; TimeSlicing (the default) is the share group ``""``, MPS the group ``"MPS"``."""


def share_group(sharing: str, namespace: str, *, per_namespace: bool) -> str:
    """The share group of a shared request: ``"MPS"`` for MPS, ``""`` for time-slicing; with ``per_namespace``
    (Dynamic Resource Allocation: a pod can use only ResourceClaims of its own namespace, and a device is allocated
    to one claim) prefixed by the namespace, e.g. ``"namespace ml, MPS"``."""
    group = "MPS" if sharing == "MPS" else ""
    if not per_namespace:
        return group
    return f"namespace {namespace}, {group}" if group else f"namespace {namespace}"


def gpu_sharing(spec: Mapping[str, Any]) -> str:
    """``spec.gpuSharing`` (default TimeSlicing); raises InvalidTaskError(InvalidSpec) for another value."""
    sharing = spec.get("gpuSharing", "TimeSlicing")
    if sharing not in GPU_SHARINGS:
        raise _bad(f"spec.gpuSharing must be one of {', '.join(GPU_SHARINGS)}, got {sharing!r}")
    return str(sharing)


def gpu_request(
    spec: Mapping[str, Any], *, namespace: str = "default", per_namespace: bool = False,
    pod_set: Mapping[str, Any] | None = None, where: str = "spec",
) -> GpuRequest:
    """The core GpuRequest of a GPUTask spec in ``namespace`` (its share group from ``spec.gpuSharing`` and, with
    ``per_namespace``, the namespace: :func:`share_group`); raises InvalidTaskError(InvalidSpec). With ``pod_set``
    (one entry of ``spec.podSets``, at ``where``) the GPUs are that PodSet's and the sharing the spec's."""
    request = _gpu_shape(spec if pod_set is None else pod_set, where)
    sharing = gpu_sharing(spec)
    if request.exclusive:
        if sharing == "MPS":
            raise _bad(f"spec.gpuSharing: MPS is for shared GPUs: set {where}.gpuMemory, or a {where}.gpuFraction "
                       "below 1")
        return request
    return replace(request, share_group=share_group(sharing, namespace, per_namespace=per_namespace))


def _gpu_shape(spec: Mapping[str, Any], where: str = "spec") -> GpuRequest:
    count = _int_field(spec, "gpus", 1, 1, MAX_GPUS, where)
    memory, fraction = spec.get("gpuMemory"), spec.get("gpuFraction")
    if memory is not None and fraction is not None:
        raise _bad(f"set at most one of {where}.gpuMemory and {where}.gpuFraction")
    products = spec.get("gpuProducts") or []
    if not isinstance(products, list) or not all(isinstance(p, str) and p for p in products):
        raise _bad(f"{where}.gpuProducts must be a list of product names, got {products!r}")
    request = GpuRequest(count, products=frozenset(products))
    if memory is not None:
        field = f"{where}.gpuMemory"
        try:
            mib = to_mib(memory, field=field)
        except ValueError as exc:
            raise _bad(str(exc)) from None
        if quantity(memory, field=field) < MIB:
            raise _bad(_below_one_mib(memory, field))
        if mib > MAX_GPU_MEMORY_MIB:
            raise _bad(f"{field}: {memory!r} is more than any GPU has (limit 1Ti)")
        return GpuRequest(count, memory_mib=mib, products=request.products)
    if fraction is not None:
        return GpuRequest(count, fraction_milli=_fraction_milli(fraction, f"{where}.gpuFraction"),
                          products=request.products)
    return request


def _below_one_mib(memory: Any, field: str = "spec.gpuMemory") -> str:
    """Why GPU memory under 1Mi is refused: a bare number is bytes (``4096`` is 4 KiB), almost surely meant as MiB."""
    shown = str(memory).strip()
    hint = f"'{shown}Mi'" if shown.isdigit() else "'4096Mi' or '4Gi'"
    return (f"{field}: {memory!r} is less than 1Mi (a bare number is bytes): likely a unit mistake, "
            f"write e.g. {hint}")


def _fraction_milli(value: Any, field: str = "spec.gpuFraction") -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _bad(f"{field} must be a decimal string in (0, 1], got {value!r}")
    try:
        share = Decimal(str(value).strip())
    except InvalidOperation:
        raise _bad(f"{field} must be a decimal string in (0, 1], got {value!r}") from None
    if not share.is_finite() or not 0 < share <= 1:
        raise _bad(f"{field} must be in (0, 1], got {value!r}")
    return max(1, math.ceil(share * MILLI_PER_GPU))


def _json_type(value: Any) -> str:
    """What a JSON value is, as a message says it: a list, a string, a number, a boolean."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float, Decimal)):
        return "a number"
    return {list: "a list", tuple: "a list", str: "a string"}.get(type(value), type(value).__name__)


def task_from_manifest(
    obj: Mapping[str, Any],
    *,
    priority_of: Callable[[str], int | None] = lambda _name: None,
    workload_priority_of: Callable[[str], int | None] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    share_per_namespace: bool = False,
) -> Task:
    """Core Task of a GPUTask object (dict with metadata and spec).

    ``share_per_namespace`` keeps shared GPUs to the tasks of one namespace (``pinning: dra``; :func:`share_group`).

    ``priority_of`` resolves ``spec.priorityClassName`` (a PriorityClass) to its value;
    ``workload_priority_of`` resolves the label ``kueue.x-k8s.io/priority-class`` (a Kueue
    WorkloadPriorityClass; when not given, ``priority_of`` is used for the label too),
    None when it does not exist. The pod template is checked against what the Job API refuses
    (:mod:`gputask.manifests.podspec`) when there is one, and read for the pod's requests, node selector,
    affinity and tolerations (:mod:`gputask.manifests.podfit`). A spec with ``podSets`` (a gang; checked by
    :func:`gputask.manifests.podsets.pod_set_entries`) becomes a task of those PodSets
    (:meth:`gputask.core.Task.of_pod_sets`), each PodSet's GPUs and template converted as the one-pod fields are
    and its sharing the spec's ``gpuSharing``; ``spec.topology`` becomes ``topology_required`` or
    ``topology_preferred`` (:func:`gputask.manifests.podsets.topology_of`). Raises InvalidTaskError
    with reason InvalidSpec, MissingQueueName or PriorityClassNotFound.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise _bad("metadata.name is missing")
    if spec is None:
        raise _bad("spec is missing")
    if not isinstance(spec, Mapping):
        raise _bad(f"spec must be an object, got {_json_type(spec)}")
    labels = meta.get("labels") or {}
    queue = spec.get("queueName") or labels.get(QUEUE_LABEL)
    if not isinstance(queue, str) or not queue:
        raise InvalidTaskError("MissingQueueName", f"set spec.queueName or the label {QUEUE_LABEL}")
    class_name = spec.get("priorityClassName")
    resolve = priority_of
    if not class_name and labels.get(PRIORITY_LABEL):
        class_name = labels[PRIORITY_LABEL]
        resolve = workload_priority_of or priority_of
    priority = 0
    if class_name:
        found = resolve(str(class_name))
        if found is None:
            raise InvalidTaskError("PriorityClassNotFound", f"priority class {class_name!r} does not exist")
        priority = found
    namespace = str(meta.get("namespace") or "default")
    required, preferred = topology_of(spec)
    entries = pod_set_entries(spec)
    common: dict[str, Any] = {
        "priority": priority,
        "created": timestamp(meta.get("creationTimestamp")),
        "namespace_labels": tuple(sorted((namespace_labels or {}).items())),
        "topology_required": required,
        "topology_preferred": preferred,
        "movable": movable(spec, _bad),
    }
    key = task_key(namespace, meta["name"])
    if entries is None:
        requests, constraints = _pod_shape(spec.get("template"), "spec.template")
        return Task(
            key=key,
            queue=queue,
            request=gpu_request(spec, namespace=namespace, per_namespace=share_per_namespace),
            max_reschedules=_int_field(spec, "maxReschedules", 3, 0, 1000),
            cpu_milli=requests.cpu_milli,
            memory_mib=requests.memory_mib,
            ephemeral_mib=requests.ephemeral_mib,
            constraints=constraints,
            **common,
        )
    pod_sets = []
    for i, entry in enumerate(entries):
        where = f"spec.podSets[{i}]"
        requests, constraints = _pod_shape(entry.get("template"), f"{where}.template")
        request = gpu_request(spec, namespace=namespace, per_namespace=share_per_namespace, pod_set=entry, where=where)
        pod_sets.append(PodSet(str(entry["name"]), int(entry.get("count", 1)), request, requests.cpu_milli,
                               requests.memory_mib, requests.ephemeral_mib, constraints))
    return Task.of_pod_sets(key, queue, tuple(pod_sets), max_reschedules=_int_field(spec, "maxReschedules", 3, 0, 1000),
                            **common)


def _pod_shape(template: Any, where: str) -> tuple[Requests, Constraints | None]:
    """The requests and node constraints of a pod template at ``where`` (none: no requests, no constraints),
    after the checks of what the Job API refuses in it; raises InvalidTaskError(InvalidSpec)."""
    problems = template_problems(template, where) if template is not None else []
    if problems:
        raise _bad(f"the pod template would be refused as a Job's: {aggregate(problems)}")
    pod = (template or {}).get("spec") or {}
    try:
        return pod_requests(pod, f"{where}.spec"), constraints_of(pod, f"{where}.spec")
    except ValueError as exc:
        raise _bad(f"the pod template would be refused as a Job's: {exc}") from None


def priority_class_name(obj: Mapping[str, Any]) -> str | None:
    """The priority class a GPUTask names: ``spec.priorityClassName``, else the Kueue label; None for none."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    name = spec.get("priorityClassName") or labels.get(PRIORITY_LABEL)
    return str(name) if name else None


def label_selector(raw: Any) -> LabelSelector:
    """Core LabelSelector of a metav1.LabelSelector dict (None = everything); raises InvalidQueueError."""
    return _selector(raw)


def _selector(raw: Any) -> LabelSelector:
    if raw is None:
        return LabelSelector()
    if not isinstance(raw, Mapping):
        raise InvalidQueueError(f"namespaceSelector must be a LabelSelector, got {raw!r}")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidQueueError(f"namespaceSelector.matchLabels must be a map of strings, got {labels!r}")
    raw_exprs = raw.get("matchExpressions") or []
    if not isinstance(raw_exprs, list):
        raise InvalidQueueError(f"namespaceSelector.matchExpressions must be a list, got {raw_exprs!r}")
    exprs = []
    for e in raw_exprs:
        op = e.get("operator") if isinstance(e, Mapping) else None
        if op not in ("In", "NotIn", "Exists", "DoesNotExist") or not isinstance(e.get("key"), str):
            raise InvalidQueueError(f"namespaceSelector.matchExpressions: invalid entry {e!r}")
        values = e.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InvalidQueueError(f"namespaceSelector.matchExpressions[{e['key']}].values must be a list of strings, "
                                    f"got {values!r}")
        exprs.append(LabelRequirement(e["key"], op, tuple(values)))
    return LabelSelector(tuple(sorted((str(k), str(v)) for k, v in labels.items())), tuple(exprs))


def _resource_amount(name: str, value: Any, field: str) -> int:
    try:
        amount = quantity(value, field=field)
    except ValueError as exc:
        raise InvalidQueueError(str(exc)) from None
    if amount < 0:
        raise InvalidQueueError(f"{field}: {value!r} must not be negative")
    if name == GPU:
        return math.ceil(amount * MILLI_PER_GPU)
    return math.ceil(amount / MIB)


def _section(parent: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
    value = parent.get(key) or {}
    if not isinstance(value, Mapping):
        raise InvalidQueueError(f"{prefix}{key} must be an object, got {value!r}")
    return value


def movable(spec: Mapping[str, Any], bad: Callable[[str], Exception]) -> bool | None:
    """``spec.disruption.movable`` (None when unset: the GPUClusterQueue's default); ``bad(message)`` is raised
    for a value that is no boolean."""
    disruption = spec.get("disruption")
    if disruption is None:
        return None
    if not isinstance(disruption, Mapping):
        raise bad(f"spec.disruption must be an object, got {disruption!r}")
    value = disruption.get("movable")
    if value is not None and not isinstance(value, bool):
        raise bad(f"spec.disruption.movable must be true or false, got {value!r}")
    return value


def _choice(parent: Mapping[str, Any], key: str, allowed: tuple[str, ...], prefix: str = "") -> str:
    value = parent.get(key, allowed[0])
    if value not in allowed:
        raise InvalidQueueError(f"{prefix}{key} {value!r}: use one of {', '.join(allowed)}")
    return str(value)


def queue_from_manifest(name: str, spec: Mapping[str, Any] | None, *, open_defaults: bool = False) -> QueueSpec:
    """Core QueueSpec of a GPUClusterQueue's name and spec; raises InvalidQueueError.

    As Kueue, a manifest fails closed: no ``namespaceSelector`` admits no namespace and a queue
    listing no GPU resource admits nothing (:class:`~gputask.core.quota.QueueSpec`).
    ``open_defaults`` (scenario files, which have no namespaces to select) reads an absent
    selector as ``{}`` and unlisted resources as unlimited.
    """
    spec = spec or {}
    if not isinstance(spec, Mapping):
        raise InvalidQueueError(f"spec must be an object, got {spec!r}")
    resources = spec.get("resources") or []
    if not isinstance(resources, list):
        raise InvalidQueueError(f"resources must be a list, got {resources!r}")
    quotas: dict[str, ResourceQuota] = {}
    for entry in resources:
        rname = entry.get("name") if isinstance(entry, Mapping) else None
        if rname not in (GPU, GPU_MEMORY):
            raise InvalidQueueError(f"resources: unknown resource {rname!r}; use {GPU} or {GPU_MEMORY}")
        quotas[rname] = _quota_entry(entry, rname, f"resources[{rname}]")
    flavors: tuple[str, ...] = ()
    if spec.get("resourceGroups") is not None:
        if resources:
            raise InvalidQueueError("set resources (one implicit flavor) or resourceGroups, not both")
        flavors, quotas = resource_groups(spec["resourceGroups"], _quota_entry)
    when_can_borrow, when_can_preempt = fungibility(spec.get("flavorFungibility"))
    pre = _section(spec, "preemption")
    borrow = _section(pre, "borrowWithinCohort", "preemption.")
    within = _choice(pre, "withinClusterQueue", get_args(WithinClusterQueue), "preemption.")
    reclaim = _choice(pre, "reclaimWithinCohort", get_args(ReclaimWithinCohort), "preemption.")
    borrow_policy = _choice(borrow, "policy", get_args(BorrowWithinCohort), "preemption.borrowWithinCohort.")
    threshold = borrow.get("maxPriorityThreshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int)):
        raise InvalidQueueError(
            f"preemption.borrowWithinCohort.maxPriorityThreshold must be an integer, got {threshold!r}"
        )
    stop_policy = _choice(spec, "stopPolicy", get_args(StopPolicy))
    cohort = spec.get("cohort")
    if cohort is not None and not isinstance(cohort, str):
        raise InvalidQueueError(f"cohort must be a name, got {cohort!r}")
    strategy = spec.get("queueingStrategy", "BestEffortFIFO")
    if strategy not in get_args(QueueingStrategy):
        raise InvalidQueueError(f"queueingStrategy {strategy!r}: use BestEffortFIFO or StrictFIFO")
    selector = spec.get("namespaceSelector")
    fair = spec.get("fairSharing")
    weight = None
    if isinstance(fair, Mapping):
        try:
            weight = math.ceil(quantity(fair.get("weight", 1), field="fairSharing.weight") * 1000)
        except ValueError as exc:
            raise InvalidQueueError(str(exc)) from None
        if weight < 0:
            raise InvalidQueueError(f"fairSharing.weight {fair.get('weight')!r} must not be negative")
    elif fair is not None:
        raise InvalidQueueError(f"fairSharing must be an object, got {fair!r}")
    return QueueSpec(
        name=name,
        cohort=cohort or None,
        namespace_selector=None if selector is None and not open_defaults else _selector(selector),
        strategy=strategy,
        quotas=quotas,
        preemption=Preemption(within, reclaim, borrow_policy, threshold),
        fair_sharing_weight_milli=weight,
        stop_policy=stop_policy,
        closed=not open_defaults,
        flavors=flavors,
        when_can_borrow=when_can_borrow,
        when_can_preempt=when_can_preempt,
        movable=bool(movable(spec, InvalidQueueError)),
    )


def _quota_entry(entry: Mapping[str, Any], rname: str, where: str) -> ResourceQuota:
    """One ``{name, nominalQuota, borrowingLimit, lendingLimit}`` entry; raises InvalidQueueError."""
    limits = {
        key: _resource_amount(rname, entry[key], f"{where}.{key}")
        for key in ("nominalQuota", "borrowingLimit", "lendingLimit")
        if entry.get(key) is not None
    }
    nominal, lending = limits.get("nominalQuota", 0), limits.get("lendingLimit")
    if lending is not None and lending > nominal:
        raise InvalidQueueError(
            f"{where}.lendingLimit {entry['lendingLimit']!r} is more than nominalQuota "
            f"{entry.get('nominalQuota')!r}: a queue can lend only what it has"
        )
    return ResourceQuota(nominal, limits.get("borrowingLimit"), lending)


def flavor_from_manifest(name: str, spec: Any) -> Flavor:
    """Core Flavor of a GPUResourceFlavor's name and spec (:mod:`gputask.manifests.flavors`);
    raises InvalidQueueError."""
    return flavors_manifest.flavor_from_manifest(name, spec, to_mib)


def node_from_gpunode(
    name: str, status: Mapping[str, Any] | None, *, unschedulable: str = ""
) -> tuple[Node, list[str]]:
    """Core Node of a GPUNode's status, and one error line per rejected GPU entry.

    Errors: none raised; bad entries are reported in the returned list.

    A malformed entry is rejected alone (a broken agent field never hides the node's other
    GPUs). ``memoryUsed`` is validated here; :func:`reported_used_mib` reads it, and the
    inventory turns it into foreign use net of what gputask reserved. MIG devices must agree with
    their GPU (:func:`_mig_lies`), or the GPU and its MIG devices are all refused: one GPU is never
    placed on twice.
    """
    gpus: list[Gpu] = []
    errors: list[str] = []
    seen: set[int] = set()
    uuids: set[str] = set()
    stated: dict[int, int | None] = {}  # GPU index -> the mig.parentIndex its entry states
    if status is not None and not isinstance(status, Mapping):
        return _node(name, (), unschedulable), [f"status must be an object, got {status!r}"]
    entries = (status or {}).get("gpus") or []
    if not isinstance(entries, list):
        return _node(name, (), unschedulable), [f"status.gpus must be a list, got {entries!r}"]
    for i, raw in enumerate(entries):
        try:
            gpu = _gpu(raw)
        except KeyError as exc:  # str(KeyError) alone would read "status.gpus[2]: 'uuid'"
            errors.append(f"status.gpus[{i}]: missing field {exc}")
            continue
        except (ValueError, TypeError) as exc:
            errors.append(f"status.gpus[{i}]: {exc}")
            continue
        if gpu.index in seen:
            errors.append(f"status.gpus[{i}]: duplicate index {gpu.index}")
            continue
        if gpu.uuid in uuids:
            errors.append(f"status.gpus[{i}]: duplicate uuid {gpu.uuid}")
            continue
        seen.add(gpu.index)
        uuids.add(gpu.uuid)
        gpus.append(gpu)
        stated[gpu.index] = _mig_parent_of(raw)
    gpus.sort(key=lambda g: g.index)
    lies = _mig_lies(gpus, stated)
    errors += [line for _, line in sorted(lies.items())]
    refused = set(lies) | {g.index for g in gpus if mig_parent_index(g.index) in lies}
    return _node(name, tuple(g for g in gpus if g.index not in refused), unschedulable), errors


def _mig_parent_of(raw: Any) -> int | None:
    """The ``mig.parentIndex`` an entry states (None when it states none)."""
    mig = raw.get("mig") if isinstance(raw, Mapping) else None
    parent = mig.get("parentIndex") if isinstance(mig, Mapping) else None
    return parent if isinstance(parent, int) and not isinstance(parent, bool) else None


def _mig_lies(gpus: list[Gpu], stated: Mapping[int, int | None]) -> dict[int, str]:
    """GPU index -> why the GPU (with its MIG devices) is refused: a MIG device under a GPU not reported, or under
    a GPU reported schedulable (a GPU in MIG mode runs nothing itself), whose ``mig.parentIndex`` says otherwise
    than its index, or whose memory with its siblings' is more than the GPU's; a product marked MIG on a GPU's
    own index."""
    by_index = {g.index: g for g in gpus}
    lies: dict[int, str] = {}
    children: dict[int, list[Gpu]] = {}
    for gpu in gpus:
        parent = mig_parent_index(gpu.index)
        if parent is None:
            if is_mig_product(gpu.product):
                lies[gpu.index] = f"GPU {gpu.index}: product {gpu.product} is a MIG device's, index {gpu.index} a GPU's"
            continue
        if stated.get(gpu.index) not in (None, parent):
            lies[gpu.index] = f"GPU {gpu.index}: mig.parentIndex {stated[gpu.index]} but its index says GPU {parent}"
        elif parent not in by_index:
            lies[gpu.index] = f"GPU {gpu.index}: a MIG device of GPU {parent}, which is not reported"
        else:
            children.setdefault(parent, []).append(gpu)
    for parent, migs in children.items():
        gpu = by_index[parent]
        if gpu.healthy:
            lies[parent] = (f"GPU {parent}: reported schedulable with MIG devices {[m.index for m in migs]} "
                            "(a GPU in MIG mode runs work only in them)")
        elif sum(m.memory_mib for m in migs) > gpu.memory_mib:
            lies[parent] = (f"GPU {parent}: its MIG devices have {sum(m.memory_mib for m in migs)} MiB, more than "
                            f"its {gpu.memory_mib} MiB")
    return lies


def _node(name: str, gpus: tuple[Gpu, ...], unschedulable: str) -> Node:
    return Node(NodeName(name), gpus, schedulable=not unschedulable, unschedulable_reason=unschedulable)


def _gpu(raw: Any) -> Gpu:
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected an object, got {raw!r}")
    index = raw["index"]
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a non-negative integer, got {index!r}")
    uuid, product = raw["uuid"], raw.get("product", "unknown")
    if not isinstance(uuid, str) or not DEVICE_UUID.match(uuid):
        raise ValueError(f"uuid must be a GPU-... or MIG-... UUID (letters, digits and '-'), got {uuid!r}")
    memory = to_mib(raw["memory"], field="memory")
    if memory > MAX_GPU_MEMORY_MIB:  # the bound a task's gpuMemory has: no task could use the rest anyway
        raise ValueError(f"memory {raw['memory']!r} is more than any GPU has (limit 1Ti)")
    used_raw = raw.get("memoryUsed")
    used = quantity(used_raw, field="memoryUsed") if used_raw is not None else Decimal(0)
    if used < 0:
        raise ValueError(f"memoryUsed must not be negative, got {used_raw!r}")
    if math.floor(used / MIB) > memory:
        raise ValueError(f"memoryUsed {used_raw!r} is more than the GPU's memory {raw['memory']!r}")
    healthy = raw.get("healthy", True)
    if not isinstance(healthy, bool):
        raise ValueError(f"healthy must be a boolean, got {healthy!r}")
    return Gpu(index, uuid, str(product).replace(" ", "-"), memory, healthy)


def reported_used_mib(status: Mapping[str, Any] | None) -> dict[int, int]:
    """MiB in use per GPU index as the agent reported it (``memoryUsed``, rounded down).

    Entries without a valid index or quantity are skipped (they are rejected by
    :func:`node_from_gpunode` already).
    """
    out: dict[int, int] = {}
    entries = (status or {}).get("gpus") if isinstance(status, Mapping) else None
    for raw in entries if isinstance(entries, list) else []:
        if not isinstance(raw, Mapping) or raw.get("memoryUsed") is None:
            continue
        index = raw.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        try:
            amount = quantity(raw["memoryUsed"], field="memoryUsed")
        except ValueError:
            continue
        if amount >= 0:
            out[index] = math.floor(amount / MIB)
    return out
