"""Dynamic Resource Allocation in the emulator: ``resource.k8s.io`` served at chosen versions, answered as
kube-apiserver answers where the operator depends on it.

- Served only where asked (:meth:`GpuTaskEmulator.serve_dra`): Kubernetes 1.34 serves ``v1`` (and ``v1beta1``,
  ``v1beta2``), 1.32 and 1.33 ``v1beta1`` only when switched on, older ones none. Each version keeps its own objects
  here (the real server converts between them); the operator reads and writes one version.
- Create of a ResourceClaim or ResourceClaimTemplate whose device requests have the other version's shape is 422
  Invalid with the server's message: in ``v1`` a request needs ``exactly`` or ``firstAvailable`` (k8s
  ``pkg/apis/resource/validation`` ``validateDeviceRequest``: "exactly one of `exactly` or `firstAvailable` is
  required"; the server drops the fields ``v1`` does not know, such as a ``v1beta1`` ``deviceClassName`` at the
  request's top level), in ``v1beta1`` a ``deviceClassName`` (Required value).
- Their ``spec`` is immutable: an update changing it is 422 ``spec: Invalid value: ...: field is immutable``.
No allocation, no scheduler, no kubelet: claims stay unallocated (no ``status.allocation``), and deleting one
removes it at once (the real server holds an allocated claim with a finalizer until it is deallocated).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmock import resource

from gputask.manifests.fields import INVALID, REQUIRED, FieldError

GROUP = "resource.k8s.io"
CLAIM_KINDS = frozenset({"resourceclaims", "resourceclaimtemplates"})


def is_claim(res: resource) -> bool:
    """True for a ResourceClaim or ResourceClaimTemplate resource of any served version."""
    return res.group == GROUP and res.plural in CLAIM_KINDS


def _devices(res: resource, obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(field path, the ``devices`` section) of a claim or a template's claim spec."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    prefix = "spec"
    if res.plural == "resourceclaimtemplates":
        spec = spec.get("spec") if isinstance(spec.get("spec"), Mapping) else {}
        prefix = "spec.spec"
    devices = spec.get("devices") if isinstance(spec.get("devices"), Mapping) else {}
    return f"{prefix}.devices", devices


def claim_problems(res: resource, obj: Mapping[str, Any]) -> list[FieldError]:
    """The field errors the API server's validation reports for a claim's or template's device requests."""
    path, devices = _devices(res, obj)
    problems = []
    for i, request in enumerate(devices.get("requests") or []):
        where = f"{path}.requests[{i}]"
        if not isinstance(request, Mapping):
            problems.append(FieldError(where, INVALID, "must be an object", request))
            continue
        if res.version == "v1":
            if not request.get("exactly") and not request.get("firstAvailable"):
                problems.append(FieldError(where, REQUIRED, "exactly one of `exactly` or `firstAvailable` is required"))
        elif not request.get("deviceClassName") and not request.get("firstAvailable"):
            problems.append(FieldError(f"{where}.deviceClassName", REQUIRED))
    return problems


def immutable_spec(res: resource, current: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    """``spec: Invalid value: ...: field is immutable`` when an update changes a claim's or template's spec."""
    if not is_claim(res) or new.get("spec") == current.get("spec"):
        return []
    return [FieldError("spec", INVALID, "field is immutable", new.get("spec"))]
