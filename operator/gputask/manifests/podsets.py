"""A GPUTask's gang fields (``spec.podSets``, ``spec.topology``) checked, and a gang's placement said back.

What the CRD's schema and CEL rules refuse is refused here too, worded and addressed as kube-apiserver words
it (``spec.podSets[1].count: Invalid value: 0: ...``), for the specs no API server checked (scenario files,
an API server without the CRD's rules) and for what CEL cannot say. The pod-by-pod conversion of each PodSet
(its GPUs, its template's requests and node constraints) is :func:`gputask.manifests.convert.task_from_manifest`'s.

Errors: :func:`pod_set_entries` and :func:`topology_of` raise :class:`gputask.core.InvalidTaskError` with
reason ``InvalidSpec``; the rest raise nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gputask.core import InvalidTaskError, Placement, Task
from gputask.manifests.fields import DUPLICATE, FORBIDDEN, INVALID, REQUIRED, FieldError, aggregate
from gputask.manifests.podfit import QUALIFIED_NAME_RULE, qualified_name

MAX_POD_SETS = 8
MAX_POD_COUNT = 1024
ONE_POD_FIELDS = ("gpuMemory", "gpuFraction", "gpuProducts", "template")
"""The shorthand fields that may not be given with ``spec.podSets`` (nor ``gpus`` other than its default 1)."""
BOTH_SHAPES = "set podSets or the one-pod fields (gpus, gpuMemory, gpuFraction, gpuProducts, template), not both"
POD_SET_FIELDS = frozenset({"name", "count", "gpus", "gpuMemory", "gpuFraction", "gpuProducts", "template"})
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_RULE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
               "start and end with an alphanumeric character")


def _invalid(errors: list[FieldError]) -> InvalidTaskError:
    return InvalidTaskError("InvalidSpec", aggregate(errors))


def pod_set_entries(spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The entries of ``spec.podSets`` after the checks the CRD makes (1 to 8 objects of known fields, names
    unique DNS labels, ``count`` 1 to 1024, no one-pod field beside them); None when the spec has no podSets
    (the one-pod shorthand). Raises InvalidTaskError(InvalidSpec) naming every problem found."""
    raw = spec.get("podSets")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _invalid([FieldError("spec.podSets", INVALID, "must be a list", raw)])
    errors: list[FieldError] = []
    if not raw:
        errors.append(FieldError("spec.podSets", INVALID, "spec.podSets in body should have at least 1 items", raw))
    elif len(raw) > MAX_POD_SETS:
        errors.append(FieldError("spec.podSets", "Too many", f"must have at most {MAX_POD_SETS} items", len(raw)))
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        errors += _entry_problems(entry, f"spec.podSets[{i}]", seen)
    gpus = spec.get("gpus", 1)
    if [f for f in ONE_POD_FIELDS if spec.get(f) is not None] or gpus != 1:
        errors.append(FieldError("spec", INVALID, BOTH_SHAPES, "object"))
    if errors:
        raise _invalid(errors)
    return raw


def _entry_problems(entry: Any, where: str, seen: set[str]) -> list[FieldError]:
    if not isinstance(entry, Mapping):
        return [FieldError(where, INVALID, "must be an object", entry)]
    out = [FieldError(f"{where}.{k}", FORBIDDEN, "unknown field") for k in entry if k not in POD_SET_FIELDS]
    name = entry.get("name")
    if name is None:
        out.append(FieldError(f"{where}.name", REQUIRED))
    elif not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        out.append(FieldError(f"{where}.name", INVALID, _LABEL_RULE, name))
    elif name in seen:
        out.append(FieldError(where, DUPLICATE, f'map[string]interface {{}}{{"name":"{name}"}}'))  # Go's %#v
    else:
        seen.add(name)
    count = entry.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int):
        out.append(FieldError(f"{where}.count", INVALID, "must be an integer", count))
    elif not 1 <= count <= MAX_POD_COUNT:
        bound = "greater than or equal to 1" if count < 1 else f"less than or equal to {MAX_POD_COUNT}"
        out.append(FieldError(f"{where}.count", INVALID, f"{where}.count in body should be {bound}", count))
    return out


def topology_of(spec: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(required, preferred)`` node label keys of ``spec.topology`` (both None without one); raises
    InvalidTaskError(InvalidSpec) unless exactly one is given, as a label key."""
    raw = spec.get("topology")
    if raw is None:
        return None, None
    if not isinstance(raw, Mapping):
        raise _invalid([FieldError("spec.topology", INVALID, "must be an object", raw)])
    errors = [FieldError(f"spec.topology.{k}", FORBIDDEN, "unknown field") for k in raw if k not in ("required",
                                                                                                   "preferred")]
    keys = {k: raw[k] for k in ("required", "preferred") if raw.get(k) is not None}
    if len(keys) != 1:
        errors.append(FieldError("spec.topology", INVALID,
                                 "set exactly one of topology.required and topology.preferred", "object"))
    for k, value in keys.items():
        if not isinstance(value, str) or not qualified_name(value):
            errors.append(FieldError(f"spec.topology.{k}", INVALID, QUALIFIED_NAME_RULE, value))
    if errors:
        raise _invalid(errors)
    return keys.get("required"), keys.get("preferred")


def pod_ids(task: Task) -> list[tuple[str, int]]:
    """``(PodSet name, index)`` of each pod of ``task``, in the order of :attr:`Placement.pods`."""
    return [(p.name, i) for p in task.podsets for i in range(p.count)]


def pods_summary(task: Task, placement: Placement | None = None) -> str:
    """``8x4 on 8 nodes``: each PodSet as COUNTxGPUS (joined by `` + ``) and, with ``placement``, the number of
    nodes its pods are on (``1x1 + 4x8 on 4 nodes``); what ``kubectl get gt`` shows in its Pods column."""
    shape = " + ".join(f"{p.count}x{p.request.count}" for p in task.podsets)
    if placement is None:
        return shape
    nodes = len(placement.nodes)
    return f"{shape} on {nodes} node{'s' if nodes != 1 else ''}"
