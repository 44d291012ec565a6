"""What the emulator serves: the built-in resources, CRD-defined resources, and URL parsing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kmock import ResourceInfo, resource

from gputask.testing._kmock import ParsedPath

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")

CRD_RESOURCE = resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = resource("", "v1", "namespaces")


@dataclass(frozen=True)
class Builtin:
    """A built-in resource as the real API server describes it in discovery."""

    group_version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    status: bool = False  # has the /status subresource
    categories: tuple[str, ...] = ()


BUILTINS: tuple[Builtin, ...] = (
    Builtin("v1", "namespaces", "Namespace", False, ("ns",), status=True),
    Builtin("v1", "nodes", "Node", False, ("no",), status=True),
    Builtin("v1", "pods", "Pod", True, ("po",), status=True, categories=("all",)),
    Builtin("v1", "events", "Event", True, ("ev",)),
    Builtin("v1", "configmaps", "ConfigMap", True, ("cm",)),
    Builtin("v1", "secrets", "Secret", True),
    Builtin("v1", "resourcequotas", "ResourceQuota", True, ("quota",), status=True),
    Builtin("v1", "services", "Service", True, ("svc",), status=True, categories=("all",)),
    Builtin("batch/v1", "jobs", "Job", True, status=True, categories=("all",)),
    Builtin("apps/v1", "deployments", "Deployment", True, ("deploy",), True, ("all",)),
    Builtin("coordination.k8s.io/v1", "leases", "Lease", True),
    Builtin("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, ("pc",)),
    Builtin("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False),
    Builtin("events.k8s.io/v1", "events", "Event", True, ("ev",)),
    Builtin(
        "apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ("crd", "crds"),
        status=True,
    ),
)

# What the real API server puts into .status on create; kinds not listed keep the given status
# if they have no status subresource, and start with no status if they have one.
STATUS_ON_CREATE: dict[tuple[str, str], dict[str, Any] | None] = {
    ("", "namespaces"): {"phase": "Active"},
    ("", "pods"): {"phase": "Pending"},
}
KEEP_STATUS_ON_CREATE = frozenset({("", "nodes")})  # the kubelet registers nodes with status


def dra_builtins(version: str) -> tuple[Builtin, ...]:
    """The ``resource.k8s.io`` kinds gputask uses, at ``version`` (v1, v1beta1 or v1beta2)."""
    group_version = f"resource.k8s.io/{version}"
    return (
        Builtin(group_version, "resourceclaims", "ResourceClaim", True, status=True),
        Builtin(group_version, "resourceclaimtemplates", "ResourceClaimTemplate", True),
        Builtin(group_version, "deviceclasses", "DeviceClass", False),
    )


def builtin_infos(builtins: tuple[Builtin, ...] = BUILTINS) -> list[tuple[resource, ResourceInfo]]:
    """Discovery entries for built-in resources (default: those every emulated cluster serves)."""
    return [
        (
            resource(b.group_version, b.plural),
            ResourceInfo(
                namespaced=b.namespaced,
                kind=b.kind,
                singular=b.kind.lower(),
                verbs=VERBS,
                shortnames=b.short_names,
                categories=b.categories,
                subresources={"status"} if b.status else set(),
            ),
        )
        for b in builtins
    ]


class InvalidCRD(ValueError):
    """A CustomResourceDefinition the emulator cannot install (the API answers 422)."""


@dataclass(frozen=True)
class CRDVersion:
    """One served version of a custom resource, ready for the resource registry."""

    res: resource
    info: ResourceInfo
    selectable_fields: tuple[str, ...]
    schema: Mapping[str, Any] | None = None  # openAPIV3Schema: fields outside it are pruned


def crd_versions(crd: dict[str, Any]) -> list[CRDVersion]:
    """Validate a CRD body (the parts the emulator relies on) and list its served versions."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not group or not plural or not kind:
        raise InvalidCRD("spec.group, spec.names.plural and spec.names.kind are required")
    if (crd.get("metadata") or {}).get("name") != f"{plural}.{group}":
        raise InvalidCRD(f"metadata.name must be spec.names.plural+'.'+spec.group: {plural}.{group}")
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        raise InvalidCRD("spec.scope must be Namespaced or Cluster")
    versions = spec.get("versions") or []
    if not versions or sum(bool(v.get("storage")) for v in versions) != 1:
        raise InvalidCRD("spec.versions must have exactly one storage version")
    result = []
    for version in versions:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        info = ResourceInfo(
            namespaced=spec["scope"] == "Namespaced",
            kind=kind,
            singular=names.get("singular") or kind.lower(),
            verbs=VERBS,
            shortnames=names.get("shortNames") or (),
            categories=names.get("categories") or (),
            subresources={"status"} if "status" in subresources else set(),
        )
        fields = tuple(f["jsonPath"].lstrip(".") for f in version.get("selectableFields") or [])
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        result.append(CRDVersion(resource(group, version["name"], plural), info, fields, schema))
    return result


def crd_status(crd: dict[str, Any], now: str) -> dict[str, Any]:
    """The status the API server reports for an established CRD."""
    spec, names = crd["spec"], crd["spec"]["names"]
    accepted = {
        "kind": names["kind"],
        "listKind": names.get("listKind") or f"{names['kind']}List",
        "plural": names["plural"],
        "singular": names.get("singular") or names["kind"].lower(),
    }
    accepted |= {k: names[k] for k in ("shortNames", "categories") if names.get(k)}
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": now, "reason": r, "message": m}
        for t, r, m in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    stored = [v["name"] for v in spec["versions"] if v.get("storage")]
    return {"acceptedNames": accepted, "conditions": conditions, "storedVersions": stored}


_VERSION = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key, highest first, in the API server's order: v2 > v1 > v1beta2 > v1alpha1 > foo."""
    m = _VERSION.fullmatch(version)
    if not m:
        return (-1, 0, 0, version)
    stability = {"alpha": 0, "beta": 1, None: 2}[m.group(2)]
    return (stability, int(m.group(1)), int(m.group(3) or 0), "")


def group_version(res: resource) -> str:
    """The apiVersion string of a resource: ``v1`` for the core group, else ``group/version``."""
    return f"{res.group}/{res.version}" if res.group else str(res.version)


def parse_path(path: str) -> ParsedPath:
    """Parse a Kubernetes API URL path, including the ``namespaces`` resource kmock 0.8 mis-parses.

    ``/api/v1/namespaces/x`` is the Namespace ``x`` (and ``.../x/status`` its status), while
    ``/api/v1/namespaces/x/pods/y`` is the pod ``y`` in namespace ``x``.
    """
    parts = [part for part in path.strip("/").split("/") if part]
    if len(parts) >= 2 and parts[0] == "apis":
        group, version, rest = parts[1], (parts[2] if len(parts) > 2 else None), parts[3:]
    elif len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        return ParsedPath()
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return ParsedPath(group, version, plural, namespace, name, subresource)
