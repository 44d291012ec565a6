"""Label and field selectors, parsed and matched the way the Kubernetes API server does.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``,
``k>1``, ``k<1``, joined by commas. ``!=`` and ``notin`` also match objects without the label.

Field selectors: ``path=v``, ``path==v``, ``path!=v``. As in the API server, only the fields a
resource supports are accepted (``metadata.name`` and ``metadata.namespace`` everywhere, a few
more for built-in kinds, and a CRD's ``selectableFields``); any other field is a 400 error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector that does not parse, or names an unsupported field (the API answers 400)."""


_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_TERM = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)$")
_EQ_TERM = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_CMP_TERM = re.compile(rf"^({_KEY})\s*([<>])\s*(-?\d+)$")
_EXISTS_TERM = re.compile(rf"^(!?)\s*({_KEY})$")


@dataclass(frozen=True)
class LabelRequirement:
    """One comma-separated term of a label selector."""

    key: str
    op: str  # one of: =, !=, in, notin, exists, !, >, <
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label set satisfies this term."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present or not re.fullmatch(r"-?\d+", value or ""):
            return False
        bound = int(next(iter(self.values)))
        return int(value or 0) > bound if self.op == ">" else int(value or 0) < bound


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    terms.append("".join(current).strip())
    return [term for term in terms if term]


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """Parse a ``labelSelector`` query value; raise :class:`SelectorError` if malformed."""
    requirements = []
    for term in _split_terms(text):
        if m := _SET_TERM.match(term):
            values = [v.strip() for v in m.group(3).split(",")]
            if not all(re.fullmatch(_VALUE, v) for v in values):
                raise SelectorError(f"invalid label selector term: {term!r}")
            requirements.append(LabelRequirement(m.group(1), m.group(2), frozenset(values)))
        elif m := _EQ_TERM.match(term):
            op = "!=" if m.group(2) == "!=" else "="
            requirements.append(LabelRequirement(m.group(1), op, frozenset({m.group(3)})))
        elif m := _CMP_TERM.match(term):
            requirements.append(LabelRequirement(m.group(1), m.group(2), frozenset({m.group(3)})))
        elif m := _EXISTS_TERM.match(term):
            requirements.append(LabelRequirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")
    return requirements


# Field labels per (group, plural) beyond metadata.name/metadata.namespace, as in kube-apiserver.
_EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
BUILTIN_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "events"): _EVENT_FIELDS,
    ("events.k8s.io", "events"): _EVENT_FIELDS,
    ("batch", "jobs"): frozenset({"status.successful"}),
}
# Where a field label lives in the stored object when it is not the label itself.
_FIELD_PATHS: dict[tuple[str, str], dict[str, str]] = {
    ("", "events"): {"source": "source.component"},
    ("events.k8s.io", "events"): {
        "source": "deprecatedSource.component",
        "reportingComponent": "reportingController",
        **{
            f"involvedObject.{k}": f"regarding.{k}"
            for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
        },
    },
}


@dataclass(frozen=True)
class FieldRequirement:
    """One comma-separated term of a field selector, resolved to a path in the object."""

    path: tuple[str, ...]
    negated: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether an object's field (a missing field reads as "") satisfies this term."""
        node: Any = obj
        for part in self.path:
            node = node.get(part) if isinstance(node, Mapping) else None
        text = "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)
        return (text == self.value) != self.negated


def parse_field_selector(
    text: str, group: str, plural: str, extra_fields: Collection[str] = ()
) -> list[FieldRequirement]:
    """Parse a ``fieldSelector`` for a resource; unsupported fields raise :class:`SelectorError`."""
    allowed = {"metadata.name", "metadata.namespace"}
    allowed |= BUILTIN_FIELDS.get((group, plural), frozenset()) | set(extra_fields)
    aliases = _FIELD_PATHS.get((group, plural), {})
    requirements = []
    for term in (t.strip() for t in text.split(",")):
        if not term:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-/]+)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise SelectorError(f"invalid field selector term: {term!r}")
        field, op, value = m.groups()
        if field not in allowed:
            raise SelectorError(f'field label not supported: "{field}"')
        path = tuple(aliases.get(field, field).split("."))
        requirements.append(FieldRequirement(path, op == "!=", value.strip()))
    return requirements


def make_matcher(
    labels: list[LabelRequirement], fields: list[FieldRequirement]
) -> Callable[[Mapping[str, Any]], bool]:
    """Combine parsed selectors into one predicate over whole objects."""

    def matches(obj: Mapping[str, Any]) -> bool:
        obj_labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(obj_labels) for r in labels) and all(r.matches(obj) for r in fields)

    return matches
