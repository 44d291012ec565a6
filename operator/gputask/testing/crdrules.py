"""The API server's validation of a CustomResourceDefinition, as a checker in Python.

kube-apiserver refuses a CRD (422 Invalid) when its schema breaks the rules of
``k8s.io/apiextensions-apiserver``: ``pkg/apis/apiextensions/validation/validation.go`` (the
OpenAPI subset, the ``x-kubernetes-*`` extensions, list types, printer columns) and
``pkg/apiserver/schema/validation.go`` (structural schemas: every node typed, nothing but
value validations inside ``allOf``/``anyOf``/``oneOf``/``not``, the root ``metadata``
restricted to ``name`` and ``generateName``, no ``additionalProperties`` at the root). This
module redoes those checks on a CRD dict and reports :class:`FieldError` values worded and
addressed as the API server words them (``spec.validation.openAPIV3Schema.properties[metadata]:
Forbidden: ...``), so the emulator can refuse what a real server refuses, with the same message,
and the tests can check the project's CRDs without a server.

Not covered here (the tests add them, they need libraries the emulator does not): compiling
``pattern`` as RE2, compiling CEL rules, parsing printer-column JSONPaths. Not covered at all:
CEL cost estimation and the validation of defaults against their schema.

Errors: none raised; :func:`crd_problems` returns the list (empty when the CRD is accepted).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from gputask.manifests.fields import FORBIDDEN, INVALID, NOT_SUPPORTED, REQUIRED, FieldError, aggregate, not_supported

Schema = Mapping[str, Any]
__all__ = ["FORBIDDEN", "INVALID", "NOT_SUPPORTED", "REQUIRED", "ROOT_FIELDS", "FieldError", "aggregate",
           "crd_problems", "printer_column_problems", "schema_problems"]


JUNCTORS = ("allOf", "anyOf", "oneOf")
OPENAPI_TYPES = ("array", "boolean", "integer", "number", "object", "string")
LIST_TYPES = ("atomic", "set", "map")
MAP_TYPES = ("atomic", "granular")
PRINTER_TYPES = ("boolean", "date", "integer", "number", "string")
PRINTER_FORMATS = ("byte", "date", "date-time", "double", "float", "int32", "int64", "password")
# What a value validation inside a junctor must not carry, with the API server's wording.
FORBIDDEN_IN_JUNCTOR = {
    "type": "must be empty to be structural",
    "additionalProperties": "must be undefined to be structural",
    "default": "must be undefined to be structural",
    "title": "must be empty to be structural",
    "description": "must be empty to be structural",
    "nullable": "must be false to be structural",
    "x-kubernetes-preserve-unknown-fields": "must be false to be structural",
    "x-kubernetes-embedded-resource": "must be false to be structural",
    "x-kubernetes-int-or-string": "must be false to be structural",
    "x-kubernetes-list-map-keys": "must be empty to be structural",
    "x-kubernetes-list-type": "must be undefined to be structural",
    "x-kubernetes-map-type": "must be undefined to be structural",
    "x-kubernetes-validations": "must be empty to be structural",
}
UNSUPPORTED_KEYS = {
    "id": "id is not supported",
    "additionalItems": "additionalItems is not supported",
    "patternProperties": "patternProperties is not supported",
    "definitions": "definitions is not supported",
    "dependencies": "dependencies is not supported",
    "$ref": "$ref is not supported",
}
# Root fields allowed with the status subresource (validation.go allowedFieldsAtRootSchema).
ROOT_FIELDS = frozenset(
    {
        "description",
        "type",
        "format",
        "title",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "required",
        "items",
        "properties",
        "externalDocs",
        "example",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
    }
)
INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_NEWLINE = re.compile(r"[\n\r]+")
_RULE_REASONS = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")


# -- the whole CRD -----------------------------------------------------------------------------------


def crd_problems(crd: Mapping[str, Any]) -> list[FieldError]:
    """Everything kube-apiserver refuses in this ``apiextensions.k8s.io/v1`` CRD (empty = accepted).

    Paths follow the server's internal version: a schema or printer columns that every version
    shares are reported under ``spec.validation`` and ``spec.additionalPrinterColumns``.
    """
    spec = crd.get("spec") or {}
    out = _name_problems(crd, spec)
    versions = spec.get("versions") or []
    if sum(bool(v.get("storage")) for v in versions) != 1:
        out.append(FieldError("spec.versions", INVALID, "must have exactly one version marked as storage version"))
    for where, schema, status_enabled in _schemas(versions):
        out += schema_problems(schema, f"{where}.openAPIV3Schema", status_enabled=status_enabled)
    for where, columns in _columns(versions):
        for i, column in enumerate(columns):
            out += printer_column_problems(column, f"{where}[{i}]")
    return out


def _name_problems(crd: Mapping[str, Any], spec: Mapping[str, Any]) -> list[FieldError]:
    names = dict(spec.get("names") or {})
    if names.get("kind"):  # the API server defaults these two before it validates (SetDefaults_...Spec)
        names.setdefault("singular", str(names["kind"]).lower())
        names.setdefault("listKind", f"{names['kind']}List")
    group, plural = spec.get("group") or "", names.get("plural") or ""
    out = []
    if (crd.get("metadata") or {}).get("name") != f"{plural}.{group}":
        out.append(
            FieldError(
                "metadata.name",
                INVALID,
                'must be spec.names.plural+"."+spec.group',
                (crd.get("metadata") or {}).get("name"),
            )
        )
    if "." not in group:
        out.append(FieldError("spec.group", INVALID, "should be a domain with at least one dot", group))
    if spec.get("scope") not in ("Cluster", "Namespaced"):
        out.append(not_supported("spec.scope", spec.get("scope"), ("Cluster", "Namespaced")))
    for key in ("plural", "singular", "kind", "listKind"):
        value = names.get(key) or ""
        if not value:
            out.append(FieldError(f"spec.names.{key}", REQUIRED))
        elif not _DNS1035.fullmatch(value.lower() if key in ("kind", "listKind") else value):
            out.append(FieldError(f"spec.names.{key}", INVALID, "a DNS-1035 label", value))
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        out.append(
            FieldError("spec.names.listKind", INVALID, "kind and listKind may not be the same", names["listKind"])
        )
    for key in ("shortNames", "categories"):
        out += [
            FieldError(f"spec.names.{key}[{i}]", INVALID, "a DNS-1035 label", n)
            for i, n in enumerate(names.get(key) or [])
            if not _DNS1035.fullmatch(str(n))
        ]
    return out


def _schemas(versions: list[Mapping[str, Any]]) -> Iterator[tuple[str, Schema, bool]]:
    """(path, schema, status subresource on) per schema: one shared by every version is checked once,
    with the status subresource on if any version has it (``hasAnyStatusEnabled``)."""
    schemas = [((v.get("schema") or {}).get("openAPIV3Schema")) for v in versions]
    status = ["status" in (v.get("subresources") or {}) for v in versions]
    if schemas and all(s is not None and s == schemas[0] for s in schemas):
        yield "spec.validation", schemas[0], any(status)
        return
    for i, schema in enumerate(schemas):
        if schema is not None:
            yield f"spec.versions[{i}].schema", schema, status[i]


def _columns(versions: list[Mapping[str, Any]]) -> Iterator[tuple[str, list[Mapping[str, Any]]]]:
    columns = [v.get("additionalPrinterColumns") or [] for v in versions]
    if columns and all(c and c == columns[0] for c in columns):
        yield "spec.additionalPrinterColumns", columns[0]
        return
    for i, cols in enumerate(columns):
        yield f"spec.versions[{i}].additionalPrinterColumns", cols


def printer_column_problems(column: Mapping[str, Any], path: str) -> list[FieldError]:
    """A printer column's name, type, format and JSONPath (``ValidateCustomResourceColumnDefinition``)."""
    out = []
    if not column.get("name"):
        out.append(FieldError(f"{path}.name", REQUIRED))
    kind = column.get("type")
    if kind not in PRINTER_TYPES:
        detail = "must be one of " + ",".join(PRINTER_TYPES)
        out.append(
            FieldError(f"{path}.type", REQUIRED, detail)
            if not kind
            else FieldError(f"{path}.type", INVALID, detail, kind)
        )
    if column.get("format") and column["format"] not in PRINTER_FORMATS:
        out.append(
            FieldError(f"{path}.format", INVALID, "must be one of " + ",".join(PRINTER_FORMATS), column["format"])
        )
    json_path = column.get("jsonPath") or ""
    if not json_path:
        out.append(FieldError(f"{path}.JSONPath", REQUIRED))
    elif not json_path.startswith("."):
        out.append(FieldError(f"{path}.JSONPath", INVALID, "must be a simple json path starting with .", json_path))
    return out


# -- one schema --------------------------------------------------------------------------------------


def schema_problems(schema: Schema, path: str = "openAPIV3Schema", *, status_enabled: bool = True) -> list[FieldError]:
    """Everything the API server refuses in one ``openAPIV3Schema`` (structural rules included)."""
    out = []
    if status_enabled:  # zero values do not count, as in the API server's reflection over the struct
        extra = sorted(k for k, v in schema.items() if k not in ROOT_FIELDS and v not in (None, False, "", [], {}, 0))
        if extra:
            out.append(
                FieldError(
                    path,
                    INVALID,
                    f"only {sorted(ROOT_FIELDS)} fields are allowed at the root of "
                    "the schema if the status subresource is enabled",
                    extra,
                )
            )
    if schema.get("nullable"):
        out.append(FieldError(f"{path}.nullable", FORBIDDEN, "nullable cannot be true at the root"))
    out += _openapi_problems(schema, path, root=True, meta=False)
    out += _structural_problems(schema, path, "root")
    out += _completeness_problems(schema, schema, path, path)
    return out


def _children(node: Schema, path: str) -> Iterator[tuple[str, str, Schema]]:
    """(key, path, node) of the sub-schemas the OpenAPI checks recurse into, junctors included."""
    for name, sub in (node.get("properties") or {}).items():
        yield name, f"{path}.properties[{name}]", sub
    if isinstance(node.get("additionalProperties"), Mapping):
        yield "", f"{path}.additionalProperties", node["additionalProperties"]
    if isinstance(node.get("items"), Mapping):
        yield "", f"{path}.items", node["items"]
    if isinstance(node.get("not"), Mapping):
        yield "", f"{path}.not", node["not"]
    for junctor in JUNCTORS:
        for i, sub in enumerate(node.get(junctor) or []):
            yield "", f"{path}.{junctor}[{i}]", sub


def _openapi_problems(node: Schema, path: str, *, root: bool, meta: bool) -> list[FieldError]:
    """``ValidateCustomResourceDefinitionOpenAPISchema``: the OpenAPI subset and the extensions."""
    out = _unsupported_problems(node, path, meta=meta)
    out += _extension_problems(node, path)
    out += _list_problems(node, path)
    out += _rule_problems(node, path)
    for key, sub_path, sub in _children(node, path):
        inside_meta = meta or (
            (root or node.get("x-kubernetes-embedded-resource")) and key in ("metadata", "kind", "apiVersion")
        )
        out += _openapi_problems(sub, sub_path, root=False, meta=bool(inside_meta))
    return out


def _unsupported_problems(node: Schema, path: str, *, meta: bool) -> list[FieldError]:
    out = [FieldError(f"{path}.{key}", FORBIDDEN, why) for key, why in UNSUPPORTED_KEYS.items() if key in node]
    if "type" in node and node["type"] not in OPENAPI_TYPES:
        out.append(not_supported(f"{path}.type", node["type"], OPENAPI_TYPES))
    if node.get("uniqueItems") is True:
        out.append(
            FieldError(
                f"{path}.uniqueItems",
                FORBIDDEN,
                "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
            )
        )
    if isinstance(node.get("items"), list):
        out.append(FieldError(f"{path}.items", FORBIDDEN, "items must be a schema object and not an array"))
    if meta and node.get("x-kubernetes-embedded-resource"):
        out.append(
            FieldError(f"{path}.x-kubernetes-embedded-resource", FORBIDDEN, "must not be used inside of resource meta")
        )
    if node.get("properties") and "additionalProperties" in node and node["additionalProperties"] is not True:
        out.append(
            FieldError(
                f"{path}.additionalProperties", FORBIDDEN, "additionalProperties and properties are mutual exclusive"
            )
        )
    return out


def _extension_problems(node: Schema, path: str) -> list[FieldError]:
    out = []
    if node.get("x-kubernetes-preserve-unknown-fields") is False:
        out.append(
            FieldError(f"{path}.x-kubernetes-preserve-unknown-fields", INVALID, "must be true or undefined", False)
        )
    if "x-kubernetes-map-type" in node:
        if node.get("type") != "object":
            out.append(_typed(node, path, "object", "x-kubernetes-map-type is specified"))
        if node["x-kubernetes-map-type"] not in MAP_TYPES:
            out.append(not_supported(f"{path}.x-kubernetes-map-type", node["x-kubernetes-map-type"], MAP_TYPES))
    return out


def _typed(node: Schema, path: str, wanted: str, when: str) -> FieldError:
    detail = f"must be {wanted} if {when}"
    if not node.get("type"):
        return FieldError(f"{path}.type", REQUIRED, detail)
    return FieldError(f"{path}.type", INVALID, detail, node["type"])


def _list_problems(node: Schema, path: str) -> list[FieldError]:
    """List types: only on arrays, one of atomic/set/map; set items atomic; map keys and items."""
    list_type, keys = node.get("x-kubernetes-list-type"), node.get("x-kubernetes-list-map-keys") or []
    items = node.get("items") if isinstance(node.get("items"), Mapping) else None
    out = []
    if list_type is not None and node.get("type") != "array":
        out.append(_typed(node, path, "array", "x-kubernetes-list-type is specified"))
    elif list_type == "set" and items is not None:
        out += _set_item_problems(items, f"{path}.items")
    if list_type is not None and list_type not in LIST_TYPES:
        out.append(not_supported(f"{path}.x-kubernetes-list-type", list_type, LIST_TYPES))
    if keys and list_type != "map":
        detail = "must be map if x-kubernetes-list-map-keys is non-empty"
        out.append(
            FieldError(f"{path}.x-kubernetes-list-type", REQUIRED, detail)
            if list_type is None
            else FieldError(f"{path}.x-kubernetes-list-type", INVALID, detail, list_type)
        )
    if list_type == "map":
        out += _map_list_problems(node, path, keys, items)
    if list_type in ("set", "map") and items is not None and items.get("nullable"):
        out.append(
            FieldError(
                f"{path}.items.nullable", FORBIDDEN, f"cannot be nullable when x-kubernetes-list-type is {list_type}"
            )
        )
    return out


def _set_item_problems(items: Schema, path: str) -> list[FieldError]:
    detail = "must be atomic as item of a list with x-kubernetes-list-type=set"
    if items.get("type") == "array" and items.get("x-kubernetes-list-type", "atomic") != "atomic":
        return [FieldError(f"{path}.x-kubernetes-list-type", INVALID, detail, items["x-kubernetes-list-type"])]
    if items.get("type") == "object" and items.get("x-kubernetes-map-type") != "atomic":
        return [FieldError(f"{path}.x-kubernetes-map-type", INVALID, detail, items.get("x-kubernetes-map-type"))]
    return []


def _map_list_problems(node: Schema, path: str, keys: list[str], items: Schema | None) -> list[FieldError]:
    out = []
    if not keys:
        out.append(
            FieldError(
                f"{path}.x-kubernetes-list-map-keys", REQUIRED, "must not be empty if x-kubernetes-list-type is map"
            )
        )
    if items is None:
        return [*out, FieldError(f"{path}.items", REQUIRED, "must have a schema if x-kubernetes-list-type is map")]
    if items.get("type") != "object":
        return [
            *out,
            FieldError(
                f"{path}.items.type",
                INVALID,
                "must be object if parent array's x-kubernetes-list-type is map",
                items.get("type"),
            ),
        ]
    props, required = items.get("properties") or {}, set(items.get("required") or [])
    for i, key in enumerate(keys):
        prop = props.get(key)
        if prop is None:
            out.append(
                FieldError(
                    f"{path}.x-kubernetes-list-map-keys", INVALID, "entries must all be names of item properties", keys
                )
            )
            continue
        key_path = f"{path}.items.properties[{key}]"
        if prop.get("type") in ("array", "object"):
            out.append(
                FieldError(
                    f"{key_path}.type",
                    INVALID,
                    "must be a scalar type if parent array's x-kubernetes-list-type is map",
                    "object",
                )
            )
        if key in keys[:i]:
            out.append(
                FieldError(f"{path}.x-kubernetes-list-map-keys", INVALID, "must not contain duplicate entries", keys)
            )
        if key not in required and "default" not in prop:
            out.append(
                FieldError(
                    f"{key_path}.default",
                    REQUIRED,
                    "this property is in x-kubernetes-list-map-keys, "
                    "so it must have a default or be a required property",
                )
            )
        if prop.get("nullable"):
            out.append(
                FieldError(
                    f"{key_path}.nullable",
                    FORBIDDEN,
                    "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                )
            )
    return out


def _rule_problems(node: Schema, path: str) -> list[FieldError]:
    """CEL rules: a rule is given, a message has no line breaks, a reason is one of the four."""
    out = []
    for i, rule in enumerate(node.get("x-kubernetes-validations") or []):
        where = f"{path}.x-kubernetes-validations[{i}]"
        text, message = str(rule.get("rule") or "").strip(), rule.get("message")
        if not text:
            out.append(FieldError(f"{where}.rule", REQUIRED, "rule is not specified"))
        elif message is not None and message and not str(message).strip():
            out.append(FieldError(f"{where}.message", INVALID, "message must be non-empty if specified", message))
        elif _NEWLINE.search(str(message or "").strip()):
            out.append(FieldError(f"{where}.message", INVALID, "message must not contain line breaks", message))
        elif _NEWLINE.search(text) and not str(message or "").strip():
            out.append(
                FieldError(f"{where}.message", REQUIRED, "message must be specified if rule contains line breaks")
            )
        if "reason" in rule and rule["reason"] not in _RULE_REASONS:
            out.append(not_supported(f"{where}.reason", rule["reason"], _RULE_REASONS))
    return out


# -- structural schemas (pkg/apiserver/schema/validation.go) ----------------------------------------------


def _structural_children(node: Schema, path: str) -> Iterator[tuple[str, str, str, Schema]]:
    """(key, path, level, node) of the structural sub-schemas: properties, items, additionalProperties."""
    for name, sub in (node.get("properties") or {}).items():
        yield name, f"{path}.properties[{name}]", "field", sub
    if isinstance(node.get("items"), Mapping):
        yield "", f"{path}.items", "item", node["items"]
    if isinstance(node.get("additionalProperties"), Mapping):
        yield "", f"{path}.additionalProperties", "field", node["additionalProperties"]


def _structural_problems(node: Schema, path: str, level: str) -> list[FieldError]:
    out = []
    if node.get("type") == "array" and "items" not in node:
        out.append(FieldError(f"{path}.items", REQUIRED, "must be specified"))
    for _, sub_path, sub_level, sub in _structural_children(node, path):
        out += _structural_problems(sub, sub_path, sub_level)
    if "additionalProperties" in node and level == "root":
        out.append(FieldError(f"{path}.additionalProperties", FORBIDDEN, "must not be used at the root"))
    out += _int_or_string_problems(node, path)
    out += _junctor_problems(node, path)
    out += _type_problems(node, path, level)
    out += _meta_problems(node, path, level)
    return out


def _int_or_string_problems(node: Schema, path: str) -> list[FieldError]:
    if not node.get("x-kubernetes-int-or-string"):
        return []
    out = []
    for other in ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource"):
        if node.get(other):
            out.append(
                FieldError(f"{path}.{other}", INVALID, "must be false if x-kubernetes-int-or-string is true", True)
            )
    return out


def _int_or_string_exempt(node: Schema) -> tuple[bool, bool]:
    """Whether the anyOf (first) and the anyOf of the first allOf are int-or-string's own pattern."""
    any_of = node.get("anyOf") == INT_OR_STRING_ANY_OF
    all_of = node.get("allOf") or []
    return any_of, bool(all_of) and all_of[0].get("anyOf") == INT_OR_STRING_ANY_OF


def _junctor_problems(node: Schema, path: str) -> list[FieldError]:
    skip_any_of, skip_first_all_of = _int_or_string_exempt(node)
    out = []
    if not skip_any_of:
        out += [p for i, v in enumerate(node.get("anyOf") or []) for p in _nested(v, f"{path}.anyOf[{i}]")]
    for i, value in enumerate(node.get("allOf") or []):
        out += _nested(value, f"{path}.allOf[{i}]", skip_any_of=skip_first_all_of and i == 0)
    out += [p for i, v in enumerate(node.get("oneOf") or []) for p in _nested(v, f"{path}.oneOf[{i}]")]
    if isinstance(node.get("not"), Mapping):
        out += _nested(node["not"], f"{path}.not")
    return out


def _nested(value: Schema, path: str, *, skip_any_of: bool = False) -> list[FieldError]:
    """``validateNestedValueValidation``: what a value validation inside a junctor may not carry."""
    out = _junctor_problems({k: v for k, v in value.items() if not (skip_any_of and k == "anyOf")}, path)
    if isinstance(value.get("items"), Mapping):
        out += _nested(value["items"], f"{path}.items")
    for name, sub in (value.get("properties") or {}).items():
        out += _nested(sub, f"{path}.properties[{name}]")
    for key, why in FORBIDDEN_IN_JUNCTOR.items():
        if value.get(key) not in (None, False, "", [], {}) or (key == "additionalProperties" and key in value):
            out.append(FieldError(f"{path}.{key}", FORBIDDEN, why))
    if "metadata" in (value.get("properties") or {}):
        out.append(FieldError(f"{path}.properties[metadata]", FORBIDDEN, "must not be specified in a nested context"))
    return out


def _type_problems(node: Schema, path: str, level: str) -> list[FieldError]:
    embedded = node.get("x-kubernetes-embedded-resource")
    out = []
    if embedded and node.get("type") != "object":
        out.append(_typed(node, path, "object", "x-kubernetes-embedded-resource is true"))
    elif (
        not node.get("type")
        and not node.get("x-kubernetes-int-or-string")
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        where = {"root": "at the root", "item": "for specified array items", "field": "for specified object fields"}
        out.append(FieldError(f"{path}.type", REQUIRED, f"must not be empty {where[level]}"))
    if embedded and "additionalProperties" in node:
        out.append(
            FieldError(
                f"{path}.additionalProperties", FORBIDDEN, "must not be used if x-kubernetes-embedded-resource is set"
            )
        )
    if level == "root" and node.get("type") not in (None, "", "object"):
        out.append(FieldError(f"{path}.type", INVALID, "must be object at the root", node["type"]))
    if embedded and not node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
        out.append(
            FieldError(
                f"{path}.properties",
                REQUIRED,
                "must not be empty if x-kubernetes-embedded-resource "
                "is true without x-kubernetes-preserve-unknown-fields",
            )
        )
    return out


def _meta_problems(node: Schema, path: str, level: str) -> list[FieldError]:
    """kind and apiVersion strings, and the root metadata restricted to name and generateName."""
    check = level == "root" or bool(node.get("x-kubernetes-embedded-resource"))
    props = node.get("properties") or {}
    out = []
    for key in ("kind", "apiVersion"):
        if check and key in props and props[key].get("type") != "string":
            out.append(FieldError(f"{path}.properties[{key}].type", INVALID, "must be string", props[key].get("type")))
    metadata = props.get("metadata")
    if metadata is None:
        return out
    meta_path = f"{path}.properties[metadata]"
    if check and metadata.get("type") != "object":
        out.append(FieldError(f"{meta_path}.type", INVALID, "must be object", metadata.get("type")))
    if level == "root":
        rest = {k: v for k, v in metadata.items() if k not in ("type", "default")}
        named = set(rest.get("properties") or {})
        if named and named <= {"name", "generateName"}:
            rest.pop("properties")
        if rest:
            out.append(
                FieldError(
                    meta_path,
                    FORBIDDEN,
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                )
            )
    return out


def _completeness_problems(value: Schema, structural: Schema, s_path: str, v_path: str) -> list[FieldError]:
    """``validateStructuralCompleteness``: what the root's junctors constrain exists outside them.

    As in the API server, only the junctors of the root schema are followed (and what they nest).
    """
    nested = [(v, f"{v_path}.{j}[{i}]") for j in JUNCTORS for i, v in enumerate(value.get(j) or [])]
    if isinstance(value.get("not"), Mapping):
        nested.insert(0, (value["not"], f"{v_path}.not"))
    return [p for sub, sub_path in nested for p in _nested_completeness(sub, structural, s_path, sub_path)]


def _nested_completeness(value: Schema, structural: Schema | None, s_path: str, v_path: str) -> list[FieldError]:
    if structural is None:
        return [FieldError(s_path, REQUIRED, f"because it is defined in {v_path}")]
    out = _completeness_problems(value, structural, s_path, v_path)
    if isinstance(value.get("items"), Mapping):
        inner = structural.get("items") if isinstance(structural.get("items"), Mapping) else None
        out += _nested_completeness(value["items"], inner, f"{s_path}.items", f"{v_path}.items")
    for name, sub in (value.get("properties") or {}).items():
        inner = (structural.get("properties") or {}).get(name)
        out += _nested_completeness(sub, inner, f"{s_path}.properties[{name}]", f"{v_path}.properties[{name}]")
    return out
