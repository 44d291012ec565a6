"""Test helpers for the CRDs in ``crds/``: load them, check them, validate objects against them.

No kube-apiserver runs here, so two of its checks are redone in Python:
- :func:`structural_problems` walks an openAPIV3Schema with the apiextensions rules for a
  structural schema (k8s.io/apiextensions-apiserver, pkg/apiserver/schema/validation.go) plus
  the CRD rules for list-type map keys and the project's own rule that every field is described;
- :func:`validator_for` turns the schema into a JSON Schema (Draft 7) validator. The x-kubernetes
  extensions are unknown keywords to jsonschema; two are translated so the validator is not looser
  than the API server: int-or-string becomes ``type: [integer, string]``, and objects with
  ``properties`` reject unknown fields (what ``kubectl apply``'s strict field validation does).
  CEL rules (``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

Schema = dict[str, Any]

JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
# Keys the API server forbids inside a junctor (validateNestedValueValidation).
FORBIDDEN_IN_JUNCTOR = frozenset(
    {"type", "description", "title", "default", "nullable", "additionalProperties"}
)
INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]


def load_crds(directory: Path) -> dict[str, dict[str, Any]]:
    """Every CRD in ``directory`` (``*.yaml``), by the kind it defines."""
    crds = (yaml.safe_load(path.read_text()) for path in sorted(directory.glob("*.yaml")))
    return {crd["spec"]["names"]["kind"]: crd for crd in crds}


def load_objects(directory: Path) -> list[dict[str, Any]]:
    """Every object of every ``*.yaml`` file in ``directory``, in sorted file order."""
    return [
        doc
        for path in sorted(directory.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def openapi_schema(crd: Mapping[str, Any], version: str = "v1alpha1") -> Schema:
    """The openAPIV3Schema of ``version`` of ``crd``."""
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: Schema = found["schema"]["openAPIV3Schema"]
    return schema


def to_jsonschema(schema: Schema) -> Schema:
    """A copy of an openAPIV3Schema node as plain JSON Schema (see the module docstring)."""
    out: Schema = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = to_jsonschema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_jsonschema(sub) for sub in value]
        elif not key.startswith("x-kubernetes-"):
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.setdefault("type", ["integer", "string"])
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def validator_for(crd: Mapping[str, Any], version: str = "v1alpha1") -> jsonschema.Draft7Validator:
    """A Draft 7 validator for custom resources of ``crd``."""
    schema = to_jsonschema(openapi_schema(crd, version))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node outside junctors, as (path, node): properties, items, additionalProperties."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def structural_problems(schema: Schema) -> list[str]:
    """What makes ``schema`` non-structural or an invalid CRD schema; empty when it is fine."""
    problems: list[str] = []
    for path, node in walk(schema):
        problems += [f"{path or '<root>'}: {p}" for p in _node_problems(node)]
        for junctor, nested in _junctor_nodes(node):
            problems += [f"{path}.{junctor}: {p}" for p in _nested_problems(nested, node)]
    if schema.get("type") != "object":
        problems.append("<root>: type must be object")
    if "additionalProperties" in schema:
        problems.append("<root>: additionalProperties must not be used at the root")
    metadata = schema.get("properties", {}).get("metadata", {})
    if set(metadata.get("properties", {})) - {"name", "generateName"}:
        problems.append(".metadata: only name and generateName may be specified")
    return problems


def _node_problems(node: Schema) -> list[str]:
    """Structural problems of one node outside junctors."""
    problems = []
    exempt = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in node and not exempt:
        problems.append("type must not be empty")
    if node.get("x-kubernetes-int-or-string") and "type" in node:
        problems.append("type must be empty with x-kubernetes-int-or-string")
    if node.get("type") == "array" and "items" not in node:
        problems.append("items must be specified for an array")
    if "properties" in node and "additionalProperties" in node:
        problems.append("properties and additionalProperties are mutually exclusive")
    if node.get("x-kubernetes-embedded-resource") and node.get("type") != "object":
        problems.append("x-kubernetes-embedded-resource needs type object")
    return problems + _list_map_problems(node)


def _list_map_problems(node: Schema) -> list[str]:
    """List-type map rules: object items whose keys are scalar and required or defaulted."""
    if node.get("x-kubernetes-list-type") != "map":
        return []
    items = node.get("items", {})
    keys = node.get("x-kubernetes-list-map-keys", [])
    if items.get("type") != "object" or not keys:
        return ["list-type map needs object items and list-map-keys"]
    props = items.get("properties", {})
    return [
        f"list-map key {key} must be a required or defaulted scalar field"
        for key in keys
        if props.get(key, {}).get("type") not in ("string", "integer", "boolean")
        or (key not in items.get("required", []) and "default" not in props[key])
    ]


def _junctor_nodes(node: Schema) -> Iterator[tuple[str, Schema]]:
    """The value validations under allOf/anyOf/oneOf/not of one node, except int-or-string's anyOf."""
    for junctor in JUNCTORS:
        value = node.get(junctor)
        if value is None or (junctor == "anyOf" and value == INT_OR_STRING_ANY_OF):
            continue
        for index, nested in enumerate(value if isinstance(value, list) else [value]):
            yield f"{junctor}[{index}]", nested


def _nested_problems(nested: Schema, outer: Schema) -> list[str]:
    """Problems of a value validation under a junctor; ``outer`` is the node it constrains."""
    forbidden = [
        key for key in sorted(nested) if key in FORBIDDEN_IN_JUNCTOR or key.startswith("x-kubernetes-")
    ]
    problems = [f"{key} is forbidden in a junctor" for key in forbidden]
    outer_props = outer.get("properties", {})
    for name, sub in nested.get("properties", {}).items():
        if name not in outer_props:
            problems.append(f"property {name} is not specified outside the junctor")
        else:
            problems += [f"{name}: {p}" for p in _nested_problems(sub, outer_props[name])]
    if "items" in nested:
        problems += [f"[]: {p}" for p in _nested_problems(nested["items"], outer.get("items", {}))]
    for junctor, deeper in _junctor_nodes(nested):
        problems += [f"{junctor}: {p}" for p in _nested_problems(deeper, outer)]
    return problems


def undocumented_fields(schema: Schema) -> list[str]:
    """Paths of schema nodes (fields, items, map values) without a description."""
    return [path or "<root>" for path, node in walk(schema) if not node.get("description")]


def defaults(schema: Schema) -> list[tuple[str, Schema]]:
    """Every (path, node) that declares a default."""
    return [(path, node) for path, node in walk(schema) if "default" in node]
