"""Pod updates in the emulator, refused as kube-apiserver v1.27+ refuses them (k8s ``pkg/apis/core/validation``
``ValidatePodUpdate``; scheduling gates: KEP-3521, mutable scheduling directives of gated pods: KEP-3838, both on by
default from v1.27).

- A pod's ``spec`` is immutable but for what the server lets change; here: ``schedulingGates`` may only lose gates
  (``spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate 'x'``), and while the
  pod *was* gated (the stored pod has a gate) ``nodeSelector`` may gain keys and the required node affinity may gain
  ``matchExpressions``/``matchFields`` in each of its existing terms (a pod with no required node affinity may get
  any). Container images, ``activeDeadlineSeconds``, added tolerations and ``terminationGracePeriodSeconds`` change
  as the server allows; any other spec change is ``spec: Forbidden: pod updates may not change fields other than
  ...``.
- Not modelled: the value checks of the new affinity itself (the server validates it as on create), ephemeral
  containers, resize, and the ``nodeName`` a binding sets (the binding subresource is not served).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kmock import resource

from gputask.manifests.fields import FORBIDDEN, INVALID, FieldError

_REQUIRED_PATH = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
UNCHANGEABLE = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def _gates(spec: Mapping[str, Any]) -> list[str]:
    return [str(g.get("name")) for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping)]


def _terms(spec: Mapping[str, Any]) -> list[Any] | None:
    """The required nodeSelectorTerms, or None when the pod has no required node affinity."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    return None if required is None else list(required.get("nodeSelectorTerms") or [])


def _scheduling_problems(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    """What a gated pod may not change in its nodeSelector and required node affinity: only additions."""
    problems = []
    old_selector, new_selector = old.get("nodeSelector") or {}, new.get("nodeSelector") or {}
    if any(new_selector.get(k) != v for k, v in old_selector.items()):
        problems.append(FieldError("spec.nodeSelector", INVALID, "only additions to spec.nodeSelector are allowed "
                                   "(no mutations or deletions)", new_selector))
    old_terms, new_terms = _terms(old), _terms(new)
    if not old_terms:  # none, or an empty list: any new affinity
        return problems
    if new_terms is None or len(new_terms) != len(old_terms):
        return [*problems, FieldError(_REQUIRED_PATH, INVALID, "no additions/deletions to non-empty "
                                      "NodeSelectorTerms list are allowed", new_terms)]
    for i, (before, after) in enumerate(zip(old_terms, new_terms, strict=True)):
        for part in ("matchExpressions", "matchFields"):
            was, now = list(before.get(part) or []), list(after.get(part) or [])
            if now[: len(was)] != was:
                problems.append(FieldError(f"{_REQUIRED_PATH}[{i}].{part}", INVALID,
                                           "only additions are allowed (no mutations or deletions)", now))
    return problems


def pod_update_problems(res: resource, current: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    """The field errors of updating pod ``current`` to ``new`` (empty for other kinds or an allowed change)."""
    if (res.group, res.plural) != ("", "pods"):
        return []
    old_spec, new_spec = current.get("spec") or {}, new.get("spec") or {}
    if old_spec == new_spec:
        return []
    old_gates, new_gates = _gates(old_spec), _gates(new_spec)
    problems = [FieldError("spec.schedulingGates", FORBIDDEN, f"only deletion is allowed, but found new scheduling "
                           f"gate '{g}'") for g in new_gates if g not in old_gates]
    if old_gates:
        problems += _scheduling_problems(old_spec, new_spec)
    munged = copy.deepcopy(dict(new_spec))  # the new spec with every allowed change put back as it was
    for key in ("schedulingGates", "activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds",
                *(("nodeSelector", "affinity") if old_gates else ())):
        munged.pop(key, None)
        if key in old_spec:
            munged[key] = copy.deepcopy(old_spec[key])
    if old_gates and "affinity" in new_spec:  # only its nodeAffinity may change; the rest stays as it was
        affinity = {k: v for k, v in (new_spec.get("affinity") or {}).items() if k != "nodeAffinity"}
        kept = (old_spec.get("affinity") or {}).get("nodeAffinity")
        munged["affinity"] = {**affinity, **({"nodeAffinity": kept} if kept is not None else {})} or None
        if munged["affinity"] is None and "affinity" not in old_spec:
            munged.pop("affinity")
    for kind in ("containers", "initContainers"):
        olds = old_spec.get(kind) or []
        for i, container in enumerate(munged.get(kind) or []):
            if i < len(olds) and isinstance(container, dict) and "image" in olds[i]:
                container["image"] = olds[i]["image"]
    if munged != old_spec:
        problems.append(FieldError("spec", FORBIDDEN, UNCHANGEABLE))
    return problems


__all__ = ["UNCHANGEABLE", "pod_update_problems"]
