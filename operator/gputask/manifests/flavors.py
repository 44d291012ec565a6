"""GPUResourceFlavor manifests and GPUClusterQueue ``resourceGroups``, read into core objects.

Shapes as Kueue's (ResourceFlavor ``spec.nodeLabels``, ``nodeTaints``, ``tolerations``;
ClusterQueue ``resourceGroups: [{coveredResources, flavors: [{name, resources: [{name,
nominalQuota, borrowingLimit, lendingLimit}]}]}]`` and ``flavorFungibility``), plus the GPU fields
of a flavor (``gpuProducts``, ``gpuMemory``). Errors are InvalidQueueError with the field path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, get_args

from gputask.core import InvalidQueueError
from gputask.core.fit import Taint
from gputask.core.flavors import Flavor, flavored
from gputask.core.quota import GPU, GPU_MEMORY, ResourceQuota, WhenCanBorrow, WhenCanPreempt
from gputask.manifests.podfit import TAINT_EFFECTS, parse_tolerations

QuotaReader = Callable[[Mapping[str, Any], str, str], ResourceQuota]
"""Reads one ``{name, nominalQuota, borrowingLimit, lendingLimit}`` entry: (entry, resource, field path)."""


def flavor_from_manifest(name: str, spec: Any, to_mib: Callable[..., int]) -> Flavor:
    """Core Flavor of a GPUResourceFlavor's name and spec; ``to_mib`` reads a quantity as MiB.
    Raises InvalidQueueError."""
    spec = spec if spec is not None else {}
    if not isinstance(spec, Mapping):
        raise InvalidQueueError(f"spec must be an object, got {spec!r}")
    labels = spec.get("nodeLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidQueueError(f"spec.nodeLabels must be a map of strings, got {labels!r}")
    taints = []
    for i, raw in enumerate(spec.get("nodeTaints") or []):
        entry = raw if isinstance(raw, Mapping) else {}
        key, value, effect = entry.get("key"), entry.get("value") or "", entry.get("effect")
        if not isinstance(key, str) or not key or not isinstance(value, str) or effect not in TAINT_EFFECTS:
            raise InvalidQueueError(f"spec.nodeTaints[{i}] must have a key and an effect of "
                                    f"{', '.join(sorted(TAINT_EFFECTS))}, got {raw!r}")
        taints.append(Taint(key, value, str(effect)))
    try:
        tolerations = parse_tolerations(spec.get("tolerations"), "spec.tolerations")
    except ValueError as exc:
        raise InvalidQueueError(str(exc)) from None
    products = spec.get("gpuProducts") or []
    if not isinstance(products, list) or not all(isinstance(p, str) and p for p in products):
        raise InvalidQueueError(f"spec.gpuProducts must be a list of product names, got {products!r}")
    memory = spec.get("gpuMemory")
    try:
        memory_mib = to_mib(memory, field="spec.gpuMemory") if memory is not None else None
    except ValueError as exc:
        raise InvalidQueueError(str(exc)) from None
    if memory_mib is not None and memory_mib < 1024:  # "1" or "100m" would charge every shared task a whole GPU
        raise InvalidQueueError(f"spec.gpuMemory is the charging card size and must be at least 1Gi, got {memory!r}")
    return Flavor(
        name=name,
        node_labels=tuple(sorted((str(k), v) for k, v in labels.items())),
        node_taints=tuple(taints),
        tolerations=tolerations,
        gpu_products=frozenset(products),
        gpu_memory_mib=memory_mib,
    )


def resource_groups(raw: Any, read: QuotaReader) -> tuple[tuple[str, ...], dict[str, ResourceQuota]]:
    """(flavor names in order, quotas by flavor-qualified key) of ``spec.resourceGroups``.

    One group (both GPU resources measure the same devices, so they are covered together); each
    flavor lists exactly the group's ``coveredResources``, as Kueue requires; a flavor appears once.
    """
    if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], Mapping):
        raise InvalidQueueError(f"resourceGroups must hold exactly one group (the GPU resources), got {raw!r}")
    group = raw[0]
    covered = group.get("coveredResources")
    if not isinstance(covered, list) or not covered or any(r not in (GPU, GPU_MEMORY) for r in covered) or (
        len(set(covered)) != len(covered)
    ):
        raise InvalidQueueError(f"resourceGroups[0].coveredResources must list {GPU} and/or {GPU_MEMORY}, "
                                f"got {covered!r}")
    flavors = group.get("flavors")
    if not isinstance(flavors, list) or not flavors:
        raise InvalidQueueError("resourceGroups[0].flavors must list at least one flavor")
    names: list[str] = []
    quotas: dict[str, ResourceQuota] = {}
    for i, entry in enumerate(flavors):
        where = f"resourceGroups[0].flavors[{i}]"
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not name or name in names:
            raise InvalidQueueError(f"{where}.name must name a GPUResourceFlavor once, got {name!r}")
        resources = entry.get("resources")
        listed = [r.get("name") if isinstance(r, Mapping) else None for r in resources or []]
        if not isinstance(resources, list) or sorted(map(str, listed)) != sorted(covered):
            raise InvalidQueueError(f"{where}.resources must list exactly the covered resources {covered}, "
                                    f"got {listed}")
        names.append(name)
        for r in resources:
            quotas[flavored(r["name"], name)] = read(r, r["name"], f"{where}.resources[{r['name']}]")
    return tuple(names), quotas


def fungibility(raw: Any) -> tuple[WhenCanBorrow, WhenCanPreempt]:
    """Kueue's ``flavorFungibility`` (defaults: whenCanBorrow Borrow, whenCanPreempt TryNextFlavor)."""
    raw = raw if raw is not None else {}
    if not isinstance(raw, Mapping):
        raise InvalidQueueError(f"flavorFungibility must be an object, got {raw!r}")
    borrow = raw.get("whenCanBorrow", "Borrow")
    preempt = raw.get("whenCanPreempt", "TryNextFlavor")
    if borrow not in get_args(WhenCanBorrow):
        raise InvalidQueueError(f"flavorFungibility.whenCanBorrow {borrow!r}: use Borrow or TryNextFlavor")
    if preempt not in get_args(WhenCanPreempt):
        raise InvalidQueueError(f"flavorFungibility.whenCanPreempt {preempt!r}: use Preempt or TryNextFlavor")
    return borrow, preempt


__all__ = ["flavor_from_manifest", "fungibility", "resource_groups"]
