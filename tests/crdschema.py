"""Test helpers for the CRDs in ``crds/``: load them, check them, validate objects against them.

No kube-apiserver runs here, so its checks are redone in Python:
- :mod:`gputask.testing.crdrules` holds the API server's CRD validation rules (structural schema,
  extensions, list types, printer columns), also used by the emulator to refuse bad CRDs;
- this module adds what needs libraries the emulator does without: ``pattern`` compiled as RE2
  (Go's regexp syntax, ``google-re2``), CEL rules compiled and evaluated (``cel-python``), and
  printer-column JSONPaths parsed (``jsonpath-ng``);
- :func:`validator_for` turns a schema into a JSON Schema (Draft 7) validator. The x-kubernetes
  extensions are unknown keywords to jsonschema; two are translated so the validator is not looser
  than the API server: int-or-string becomes ``type: [integer, string]``, and objects with
  ``properties`` reject unknown fields (what ``kubectl apply``'s strict field validation does).
  CEL rules are evaluated separately (:func:`rule_failures`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import re2
import yaml
from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext import parse as parse_jsonpath

from gputask.testing import crdrules

Schema = dict[str, Any]

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


def undocumented_fields(schema: Schema) -> list[str]:
    """Paths of schema nodes (fields, items, map values) without a description.

    The root ``metadata`` is exempt: the API server forbids anything on it but ``type``.
    """
    return [path or "<root>" for path, node in walk(schema) if not node.get("description") and path != ".metadata"]


def defaults(schema: Schema) -> list[tuple[str, Schema]]:
    """Every (path, node) that declares a default."""
    return [(path, node) for path, node in walk(schema) if "default" in node]


def api_server_problems(crd: Mapping[str, Any]) -> list[str]:
    """What kube-apiserver refuses in ``crd``, plus RE2 patterns, CEL syntax and printer-column paths."""
    problems = [str(e) for e in crdrules.crd_problems(crd)]
    for version in crd["spec"]["versions"]:
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        problems += pattern_problems(schema) + cel_problems(schema)
        problems += column_path_problems(version.get("additionalPrinterColumns") or [])
    return problems


def all_nodes(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node, junctors included, as (path, node)."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from all_nodes(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            yield from all_nodes(schema[key], f"{path}.{key}")
    for key in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(schema.get(key) or []):
            yield from all_nodes(sub, f"{path}.{key}[{i}]")


def pattern_problems(schema: Schema) -> list[str]:
    """Patterns Go's regexp (RE2) cannot compile: the API server refuses the CRD for them."""
    out = []
    for path, node in all_nodes(schema):
        if "pattern" in node:
            try:
                re2.compile(node["pattern"])
            except re2.error as exc:
                out.append(f"{path or '<root>'}.pattern: must be a valid regular expression, but isn't: {exc}")
    return out


def cel_problems(schema: Schema) -> list[str]:
    """CEL rules that do not compile."""
    out = []
    for path, node in all_nodes(schema):
        for i, rule in enumerate(node.get("x-kubernetes-validations") or []):
            try:
                CEL.compile(rule["rule"])
            except celpy.CELParseError as exc:
                out.append(f"{path or '<root>'}.x-kubernetes-validations[{i}].rule: compilation failed: {exc}")
    return out


CEL = celpy.Environment()


def rule_failures(node: Schema, value: Any, old: Any = None) -> list[str]:
    """Messages of the CEL rules of ``node`` that ``value`` (the value at that node) breaks.

    ``old`` is the value before an update: with it, transition rules (those naming ``oldSelf``) are
    evaluated too; without it (a create) the API server skips them, and so does this.
    """
    failures = []
    for rule in node.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"] and old is None:
            continue
        program = CEL.program(CEL.compile(rule["rule"]))
        bound = {"self": celpy.json_to_cel(value)}
        if old is not None:
            bound["oldSelf"] = celpy.json_to_cel(old)
        result = program.evaluate(bound)
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            failures.append(rule.get("message") or rule["rule"])
    return failures


def column_path_problems(columns: list[Mapping[str, Any]]) -> list[str]:
    """Printer-column JSONPaths the table printer cannot parse, or that match several values.

    The API server prints only the first value a path matches (``.status.gpus[*].product`` shows
    one GPU of many), so a column path must name one value: no ``[*]``, ``..`` or slices.
    """
    out = []
    for column in columns:
        path = str(column.get("jsonPath") or "")
        try:
            parse_jsonpath("$" + path)
        except (JsonPathLexerError, JsonPathParserError) as exc:
            out.append(f"column {column.get('name')}: JSONPath {path!r} does not parse: {exc}")
            continue
        if "[*]" in path or ".." in path or ":" in path.split("[?")[0]:
            out.append(f"column {column.get('name')}: JSONPath {path!r} matches several values; only the first prints")
    return out


def column_values(columns: list[Mapping[str, Any]], obj: Mapping[str, Any]) -> dict[str, Any]:
    """What each printer column shows for ``obj`` (the first match, None when nothing matches)."""
    out = {}
    for column in columns:
        found = parse_jsonpath("$" + column["jsonPath"]).find(obj)
        out[column["name"]] = found[0].value if found else None
    return out
