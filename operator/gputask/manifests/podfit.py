"""What a pod asks of its node, and what a Node offers, read as kube-scheduler reads them.

- :func:`pod_requests`: a pod spec's effective requests (``PodRequests`` in Kubernetes'
  ``pkg/api/v1/resource`` / ``component-helpers``): the containers' requests summed, restartable
  init containers (sidecars, ``restartPolicy: Always``) added to them, the larger of that and the
  largest ordinary init container (plus the sidecars started before it); a pod-level
  ``spec.resources`` (Kubernetes 1.32+) sets cpu and memory for the whole pod instead; then
  ``spec.overhead`` added. A container without a request but with a limit requests its limit (the API server's
  defaulting of pods; a GPUTask's template is not defaulted before its Job is made).
- :func:`constraints_of`: ``nodeSelector``, required node affinity and tolerations as
  :class:`gputask.core.fit.Constraints`, refusing what the pod API would refuse.
- :func:`node_offer`: a Node's allocatable cpu, memory, ephemeral-storage and pods, labels, taints.

Units: millicores and MiB, rounded up for requests and down for allocatable (never optimistic).
Errors: ValueError naming the field (the converter turns it into the task's InvalidSpec).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gputask.core.fit import SELECTOR_OPERATORS, Constraints, Requirement, Taint, Term, Toleration
from gputask.manifests.fields import kube_quantity

MIB = Decimal(1 << 20)
RESOURCES = ("cpu", "memory", "ephemeral-storage")
POD_LEVEL = ("cpu", "memory")
"""Resources a pod-level ``spec.resources`` sets for the whole pod (instead of the containers' sum)."""
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME_RULE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (at most 63), with an optional DNS subdomain prefix and '/'"
)


def qualified_name(key: str) -> bool:
    """Whether ``key`` is a label key (``validation.IsQualifiedName``: ``[prefix/]name``)."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (prefix == "" and key.startswith("/")):
        return False
    if prefix and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.fullmatch(name))


@dataclass(frozen=True, slots=True)
class Requests:
    """A pod's effective requests: millicores, MiB of memory, MiB of ephemeral-storage."""

    cpu_milli: int = 0
    memory_mib: int = 0
    ephemeral_mib: int = 0


@dataclass(frozen=True, slots=True)
class Offer:
    """A Node's allocatable (None: not reported), labels (sorted pairs) and taints."""

    cpu_milli: int | None
    memory_mib: int | None
    ephemeral_mib: int | None
    pods: int | None
    labels: tuple[tuple[str, str], ...]
    taints: tuple[Taint, ...]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _amount(value: Any, field: str) -> Decimal:
    try:
        amount = kube_quantity(value)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None
    if amount < 0:
        raise ValueError(f"{field}: {value!r} must be a non-negative quantity")
    return amount


def _units(resource: str, amount: Decimal, *, up: bool) -> int:
    scaled = amount * 1000 if resource == "cpu" else amount / MIB
    return math.ceil(scaled) if up else math.floor(scaled)


def _requests(
    owner: Mapping[str, Any], field: str, names: tuple[str, ...], limit_stands: Callable[[str], bool]
) -> dict[str, Decimal]:
    """``owner.resources`` requests of ``names``; a limit stands for a missing request where ``limit_stands``."""
    resources = _mapping(owner.get("resources"))
    requests, limits = _mapping(resources.get("requests")), _mapping(resources.get("limits"))
    out: dict[str, Decimal] = {}
    for name in names:
        if name in requests:
            out[name] = _amount(requests[name], f"{field}.resources.requests[{name}]")
        elif name in limits and limit_stands(name):
            out[name] = _amount(limits[name], f"{field}.resources.limits[{name}]")
    return out


def _container_requests(container: Mapping[str, Any], field: str) -> dict[str, Decimal]:
    return _requests(container, field, RESOURCES, lambda _name: True)


def _add(into: dict[str, Decimal], more: Mapping[str, Decimal]) -> dict[str, Decimal]:
    out = dict(into)
    for name, amount in more.items():
        out[name] = out.get(name, Decimal(0)) + amount
    return out


def _max(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {name: max(a.get(name, Decimal(0)), b.get(name, Decimal(0))) for name in set(a) | set(b)}


def _pod_level(spec: Mapping[str, Any], path: str, containers: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Pod-level ``spec.resources`` (PodLevelResources, beta in 1.34) for cpu and memory: its request, or
    where only a limit is set and no container requests that resource, the limit (API defaulting)."""
    return _requests(spec, path, POD_LEVEL, lambda name: not containers.get(name))


def pod_requests(spec: Mapping[str, Any], path: str = "spec") -> Requests:
    """A pod spec's effective requests (module docstring); raises ValueError on a bad quantity."""
    total: dict[str, Decimal] = {}
    for i, container in enumerate(spec.get("containers") or []):
        total = _add(total, _container_requests(_mapping(container), f"{path}.containers[{i}]"))
    sidecars: dict[str, Decimal] = {}
    inits: dict[str, Decimal] = {}
    for i, raw in enumerate(spec.get("initContainers") or []):
        container = _mapping(raw)
        asked = _container_requests(container, f"{path}.initContainers[{i}]")
        if container.get("restartPolicy") == "Always":
            total = _add(total, asked)
            sidecars = _add(sidecars, asked)
            inits = _max(inits, sidecars)
        else:
            inits = _max(inits, _add(asked, sidecars))
    total = _max(total, inits)
    total.update(_pod_level(spec, path, total))
    overhead = _mapping(spec.get("overhead"))
    total = _add(total, {n: _amount(overhead[n], f"{path}.overhead[{n}]") for n in RESOURCES if n in overhead})
    cpu, memory, storage = (_units(n, total.get(n, Decimal(0)), up=True) for n in RESOURCES)
    return Requests(cpu, memory, storage)


def _strings(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{field}: must be a list of strings, got {value!r}")
    return tuple(value)


def _requirement(raw: Any, field: str, *, on_name: bool) -> Requirement:
    entry = _mapping(raw)
    key, op = entry.get("key"), entry.get("operator")
    values = _strings(entry.get("values"), f"{field}.values")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{field}.key: Required value")
    if not on_name and not qualified_name(key):
        raise ValueError(f"{field}.key: Invalid value: {key!r}: {QUALIFIED_NAME_RULE}")
    if not isinstance(op, str) or op not in SELECTOR_OPERATORS:
        raise ValueError(f"{field}.operator: Invalid value: {op!r}: not a valid selector operator")
    if on_name and (key != "metadata.name" or op not in ("In", "NotIn") or len(values) != 1):
        raise ValueError(f"{field}: matchFields supports only key metadata.name with In or NotIn and one value")
    if op in ("In", "NotIn") and not values:
        raise ValueError(f"{field}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'")
    if op in ("Exists", "DoesNotExist") and values:
        raise ValueError(
            f"{field}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
        )
    if op in ("Gt", "Lt") and len(values) != 1:
        raise ValueError(
            f"{field}.values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'"
        )
    return Requirement(key, op, values)


def _term(raw: Mapping[str, Any], where: str) -> Term:
    """One nodeSelectorTerm. A value that is no label value (``validation.IsValidLabelValue``) passes the
    pod API but makes kube-scheduler's ``labels.NewRequirement`` fail: that term then matches nothing."""
    expressions = tuple(_requirement(r, f"{where}.matchExpressions[{j}]", on_name=False)
                        for j, r in enumerate(raw.get("matchExpressions") or []))
    fields = tuple(_requirement(r, f"{where}.matchFields[{j}]", on_name=True)
                   for j, r in enumerate(raw.get("matchFields") or []))
    if not all(label_value(v) for r in expressions for v in r.values):
        return Term()
    return Term(expressions, fields)


def label_value(value: str) -> bool:
    """Whether ``value`` is a label value: empty, or at most 63 alphanumerics, '-', '_', '.' inside."""
    return value == "" or (len(value) <= 63 and bool(_NAME.fullmatch(value)))


def parse_tolerations(raw: Any, field: str) -> tuple[Toleration, ...]:
    """A pod's (or a flavor's) ``tolerations`` list, checked as the API server validates it; raises ValueError."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{field}: must be a list, got {raw!r}")
    out = []
    for i, item in enumerate(raw):
        entry, where = _mapping(item), f"{field}[{i}]"
        strings = {name: entry.get(name, "") for name in ("key", "operator", "value", "effect")}
        for name, text in strings.items():
            if text is not None and not isinstance(text, str):
                raise ValueError(f"{where}.{name}: Invalid value: {text!r}: must be a string")
        key, op = strings["key"] or "", strings["operator"] or "Equal"
        value, effect = strings["value"] or "", strings["effect"] or ""
        if key and not qualified_name(key):
            raise ValueError(f"{where}.key: Invalid value: {key!r}: {QUALIFIED_NAME_RULE}")
        if op not in ("Equal", "Exists"):
            raise ValueError(f"{where}.operator: Unsupported value: {op!r}: supported values: \"Equal\", \"Exists\"")
        if not key and op != "Exists":
            raise ValueError(f"{where}.operator: Invalid value: {op!r}: operator must be Exists when `key` is empty")
        if op == "Exists" and value:
            raise ValueError(f"{where}.operator: Invalid value: {value!r}: value must be empty when `operator` is "
                             "'Exists'")
        if effect and effect not in TAINT_EFFECTS:
            raise ValueError(f"{where}.effect: Unsupported value: {effect!r}")
        if op != "Exists" and not label_value(value):
            raise ValueError(f"{where}.value: Invalid value: {value!r}: a valid label value must be 63 characters "
                             "or less and must be empty or begin and end with an alphanumeric character")
        seconds = entry.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            raise ValueError(f"{where}.tolerationSeconds: Invalid value: {seconds!r}: must be an integer")
        if seconds is not None and effect != "NoExecute":
            raise ValueError(f"{where}.effect: Invalid value: {effect!r}: effect must be 'NoExecute' when "
                             "`tolerationSeconds` is set")
        out.append(Toleration(key, op, value, effect, seconds))
    return tuple(out)


def constraints_of(spec: Mapping[str, Any], path: str = "spec") -> Constraints | None:
    """The node constraints of a pod spec, None when it has none; raises ValueError on what the pod
    API refuses (unknown operators, values where none may be, an empty toleration key without Exists)."""
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping) or not all(isinstance(v, str) for v in selector.values()):
        raise ValueError(f"{path}.nodeSelector: must be a map of strings")
    for key, value in selector.items():
        if not isinstance(key, str) or not qualified_name(key):
            raise ValueError(f"{path}.nodeSelector: Invalid value: {key!r}: {QUALIFIED_NAME_RULE}")
        if not label_value(value):
            raise ValueError(f"{path}.nodeSelector: Invalid value: {value!r}: a valid label value must be 63 "
                             "characters or less and must be empty or begin and end with an alphanumeric character")
    node_affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms: tuple[Term, ...] | None = None
    if node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") is not None:  # {} too: it needs terms
        raw_terms = required.get("nodeSelectorTerms")
        where = f"{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        if not isinstance(raw_terms, list) or not raw_terms:
            raise ValueError(f"{where}: Required value: must have at least one node selector term")
        terms = tuple(_term(_mapping(t), f"{where}[{i}]") for i, t in enumerate(raw_terms))
    tolerations = parse_tolerations(spec.get("tolerations"), f"{path}.tolerations")
    if not selector and terms is None and not tolerations:
        return None
    return Constraints(tuple(sorted((str(k), v) for k, v in selector.items())), terms, tolerations)


def _allocatable(allocatable: Mapping[str, Any], name: str) -> int | None:
    if name not in allocatable:
        return None
    try:
        amount = _amount(allocatable[name], f"status.allocatable[{name}]")
    except ValueError:
        return 0  # unreadable: offer nothing rather than everything
    return int(amount) if name == "pods" else _units(name, amount, up=False)


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A Node's taints (malformed entries skipped: the API server refuses them anyway)."""
    out = []
    for raw in _mapping(node.get("spec")).get("taints") or []:
        taint = _mapping(raw)
        key, value, effect = taint.get("key"), taint.get("value") or "", taint.get("effect")
        if isinstance(key, str) and key and isinstance(value, str) and effect in TAINT_EFFECTS:
            out.append(Taint(key, value, effect))
    return tuple(out)


def node_offer(node: Mapping[str, Any] | None) -> Offer:
    """A v1 Node's allocatable, labels and taints; a Node not seen (None) offers no limits and no labels."""
    if node is None:
        return Offer(None, None, None, None, (), ())
    allocatable = _mapping(_mapping(node.get("status")).get("allocatable"))
    labels = _mapping(_mapping(node.get("metadata")).get("labels"))
    return Offer(
        _allocatable(allocatable, "cpu"),
        _allocatable(allocatable, "memory"),
        _allocatable(allocatable, "ephemeral-storage"),
        _allocatable(allocatable, "pods"),
        tuple(sorted((str(k), v) for k, v in labels.items() if isinstance(v, str))),
        node_taints(node),
    )
