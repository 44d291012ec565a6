"""Fields a CRD's structural schema does not declare, found and pruned as kube-apiserver prunes them.

Used by the emulator (``gputask.testing._fields``: refused, warned of or dropped by ``fieldValidation``)
and by the scenario reader (refused: a misspelled ``gpuMemroy`` must not run a task as a whole GPU).
Paths are dotted (``spec.a.b``, map keys alike), list items ``[i]``; unknown ``metadata`` fields come
first (ObjectMeta's strict decoding), then the others sorted, as kube-apiserver v1.28.7 lists them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

OBJECT_META = frozenset(
    {
        "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
        "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
        "ownerReferences", "finalizers", "managedFields",
    }
)
EMBEDDED = ("apiVersion", "kind", "metadata")


def prune(obj: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Remove from ``obj`` (in place) what ``schema`` (a CRD version's openAPIV3Schema) does not declare;
    return the removed fields' paths in the API server's order."""
    meta = obj.get("metadata")
    first = []
    if isinstance(meta, dict):
        first = [f"metadata.{k}" for k in sorted(meta) if k not in OBJECT_META]
        for key in first:
            del meta[key.removeprefix("metadata.")]
    rest: list[str] = []
    _prune(obj, schema, "", rest, root=True)
    return first + sorted(rest)


def _prune(value: Any, schema: Mapping[str, Any], path: str, found: list[str], *, root: bool = False) -> None:
    if isinstance(value, list):
        items = schema.get("items")
        for i, item in enumerate(value if isinstance(items, Mapping) else []):
            _prune(item, items, f"{path}[{i}]", found)
        return
    if not isinstance(value, dict):
        return
    properties: Mapping[str, Any] = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    implicit = EMBEDDED if root or schema.get("x-kubernetes-embedded-resource") else ()
    for key in list(value):
        child = f"{path}.{key}" if path else key
        if key in implicit:
            continue  # ObjectMeta and type fields: not the schema's to prune
        if key in properties:
            _prune(value[key], properties[key], child, found)
        elif isinstance(additional, Mapping):
            _prune(value[key], additional, child, found)
        elif not keep_unknown and additional is not True:
            del value[key]
            found.append(child)


def shipped_crds() -> Path:
    """The CRD folder shipped with the package (``gputask/_data/crds``) or, in a checkout, the repository's."""
    here = Path(__file__).resolve().parents[1]
    for candidate in (here / "_data" / "crds", here.parents[1] / "crds"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the crds/ folder next to {here}")


@functools.cache
def crd_schema(kind: str, crds: Path | None = None) -> Mapping[str, Any]:
    """The storage version's openAPIV3Schema of the CRD of ``kind`` in folder ``crds`` (default: the shipped
    CRDs); KeyError if none."""
    crds = crds or shipped_crds()
    for path in sorted(crds.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("spec", {}).get("names", {}).get("kind") == kind:
                version = next(v for v in doc["spec"]["versions"] if v.get("storage"))
                schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]
                return schema
    raise KeyError(f"no CRD of kind {kind} in {crds}")
