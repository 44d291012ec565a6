"""Whole-pod fit beyond GPUs: kube-scheduler's node filters, as the core applies them.

A task is admitted only onto a node where kube-scheduler would also bind its pod, or the pod
would stay Pending while holding GPUs and quota. The filters, with the semantics of
kube-scheduler's plugins of the same names (pkg/scheduler/framework/plugins, Kubernetes 1.26-1.34):

- ``NodeUnschedulable``: a cordoned node (``spec.unschedulable``) takes no new pod; the core also
  counts a NotReady node or a stale GPUNode as unschedulable (:attr:`Node.schedulable`);
- ``TaintToleration``: every taint of effect NoSchedule or NoExecute must be tolerated
  (PreferNoSchedule is a preference, never a filter); see :meth:`Toleration.tolerates`;
- ``NodeAffinity``: the pod's ``nodeSelector`` (every pair equal) and its required node affinity
  (``nodeSelectorTerms`` ORed, the requirements of one term ANDed; an empty term matches no node);
- ``NodeResourcesFit``: requests within free allocatable cpu, memory, ephemeral-storage and pods
  (checked in :func:`gputask.core.placement.node_fits`, with the counts kept by the cluster state).

:class:`Constraints` holds what a pod template says about nodes; :func:`static_refusal` applies the
first three filters to a node's labels, taints and name. Results are remembered per distinct
(constraints, labels, taints) so a search over thousands of nodes costs a dictionary lookup per
node, and nodes with the same labels and taints share one answer (the node name takes part only
when a term uses ``matchFields``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

FILTER_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects that keep a pod off a node (TaintToleration's filter)."""

SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
"""Operators of a node selector requirement (core/v1 NodeSelectorOperator)."""


class Filter(StrEnum):
    """Why one node cannot take a task: kube-scheduler's filter names, plus the GPU filter.

    Each value is also the metrics label (``gputask_waiting_tasks_by_filter{filter=...}``).
    """

    NODE_UNSCHEDULABLE = "NodeUnschedulable"
    TAINT_TOLERATION = "TaintToleration"
    NODE_AFFINITY = "NodeAffinity"
    NODE_RESOURCES_FIT = "NodeResourcesFit"
    GPU = "GPU"


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint (core/v1 Taint): ``key``, ``value`` (may be empty), ``effect``."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def text(self) -> str:
        """kube-scheduler's rendering in its messages: ``{key: value}``."""
        return f"{{{self.key}: {self.value}}}"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration (core/v1 Toleration); ``operator`` is ``Equal`` or ``Exists``; ``seconds`` its
    ``tolerationSeconds`` (kept for the Jobs a flavor's tolerations go into)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    seconds: int | None = None  # tolerationSeconds (NoExecute only): how long it tolerates; never read by placement

    def tolerates(self, taint: Taint) -> bool:
        """True when this toleration tolerates ``taint`` (``Toleration.ToleratesTaint`` of k8s.io/api):
        an empty effect matches every effect; an empty key with ``Exists`` matches every key;
        ``Exists`` ignores the value; ``Equal`` (or no operator) needs the same value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node selector requirement: ``key``, ``operator`` (:data:`SELECTOR_OPERATORS`), ``values``; also a
    LabelSelector's ``matchExpressions`` entry (``quota.LabelRequirement``: In, NotIn, Exists, DoesNotExist)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, value: str | None) -> bool:
        """Whether a node whose label ``key`` is ``value`` (None: no such label) satisfies it.

        As in k8s.io/apimachinery labels selectors: NotIn and DoesNotExist hold for a missing label;
        Gt and Lt compare integers (as Go's ``strconv.ParseInt(s, 10, 64)`` reads them) and fail on a missing
        or non-integer label, and for a value that is no integer (kube-scheduler skips such a term).
        """
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None or len(self.values) != 1:
            return False
        have, bound = go_int(value), go_int(self.values[0])
        if have is None or bound is None:
            return False  # a value Go's strconv.ParseInt refuses: the label or the term matches nothing
        return have > bound if op == "Gt" else have < bound if op == "Lt" else False


_INT64 = (-(1 << 63), (1 << 63) - 1)


def go_int(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it (an optional sign, then ASCII digits,
    within int64), or None where Go refuses it (Python's ``int`` also takes " 4", "0_4" and "٤")."""
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    number = int(text)
    return number if _INT64[0] <= number <= _INT64[1] else None


@dataclass(frozen=True, slots=True)
class Term:
    """A nodeSelectorTerm: ``expressions`` on labels and ``fields`` on ``metadata.name``, all ANDed.

    A term with neither matches no node (core/v1: "a null or empty node selector term matches no objects").
    """

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """Whether a node with ``labels`` and ``name`` satisfies every requirement."""
        if not self.expressions and not self.fields:
            return False
        return all(r.matches(labels.get(r.key)) for r in self.expressions) and all(
            r.matches(name if r.key == "metadata.name" else None) for r in self.fields
        )


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a pod template requires of its node (besides resources).

    ``node_selector``: (key, value) pairs, sorted; ``terms``: the required node affinity's terms,
    None when the pod has none (an empty tuple then means "no node", as an empty terms list is
    refused by the API); ``tolerations``: the pod's tolerations.
    """

    node_selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[Term, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()

    @property
    def by_name(self) -> bool:
        """True when a term reads the node's name (``matchFields``): answers differ per node name."""
        return any(t.fields for t in self.terms or ())


NO_CONSTRAINTS = Constraints()
"""A pod template that says nothing about nodes (tolerates no taint)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """One filter refusing one node: which filter and the message text counted per node."""

    filter: Filter
    text: str


_CACHE: dict[tuple[object, ...], Refusal | None] = {}
_CACHE_LIMIT = 65536


def static_refusal(
    constraints: Constraints | None,
    labels: tuple[tuple[str, str], ...],
    taints: tuple[Taint, ...],
    name: str,
) -> Refusal | None:
    """The first of TaintToleration and NodeAffinity that refuses a node, or None when both pass.

    ``labels`` and ``taints`` are the node's; ``constraints`` None means a pod with no selector,
    affinity or toleration. Remembered per distinct arguments (``name`` only when it matters).
    """
    if constraints is None:
        if not taints:
            return None
        constraints = NO_CONSTRAINTS
    key = (constraints, labels, taints, name if constraints.by_name else None)
    found = _CACHE.get(key, _MISSING)
    if found is _MISSING:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        found = _CACHE[key] = _refusal(constraints, dict(labels), taints, name)
    return found  # type: ignore[return-value]


_MISSING = object()


def _refusal(
    constraints: Constraints, labels: Mapping[str, str], taints: tuple[Taint, ...], name: str
) -> Refusal | None:
    for taint in taints:
        if taint.effect in FILTER_EFFECTS and not any(t.tolerates(taint) for t in constraints.tolerations):
            return Refusal(Filter.TAINT_TOLERATION, f"had untolerated taint {taint.text()}")
    if any(labels.get(k) != v for k, v in constraints.node_selector):
        return Refusal(Filter.NODE_AFFINITY, "did not match nodeSelector")
    if constraints.terms is not None and not any(t.matches(labels, name) for t in constraints.terms):
        return Refusal(Filter.NODE_AFFINITY, "did not match node affinity")
    return None
