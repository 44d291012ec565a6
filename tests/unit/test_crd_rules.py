"""The API server's CRD rules (gputask.testing.crdrules, plus RE2, CEL and JSONPath in tests/crdschema.py).

One test per rule: a CRD that breaks it gets exactly the refusal kube-apiserver words for it (the
text after ``CustomResourceDefinition.apiextensions.k8s.io "NAME" is invalid:``), and the same CRD
with that one thing mended is accepted. The rules come from k8s.io/apiextensions-apiserver,
``pkg/apis/apiextensions/validation/validation.go`` and ``pkg/apiserver/schema/validation.go``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

from gputask.testing import crdrules

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import crdschema  # noqa: E402 (tests/ is not a package)

ROOT = Path(__file__).resolve().parents[2]
S = "spec.validation.openAPIV3Schema"  # where the server reports a schema all versions share
QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


def crd(spec_schema: dict[str, Any] | None = None, **root: Any) -> dict[str, Any]:
    """A one-version CRD whose ``spec`` has ``spec_schema``; ``root`` adds or replaces root schema keys."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema or {"type": "object"},
        },
        **root,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                 "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }  # fmt: skip


def spec_of(**properties: Any) -> dict[str, Any]:
    """An object schema with these properties."""
    return {"type": "object", "properties": properties}


def problems(definition: dict[str, Any]) -> list[str]:
    """The refusals of the API server's rules, as it words them."""
    return [str(e) for e in crdrules.crd_problems(definition)]


def test_the_projects_crds_pass_every_rule() -> None:
    """crds/ (and so the chart's copy) breaks no API-server rule, RE2 pattern, CEL rule or column path."""
    found = {kind: crdschema.api_server_problems(c) for kind, c in crdschema.load_crds(ROOT / "crds").items()}
    assert found == {"GPUClusterQueue": [], "GPULocalQueue": [], "GPUNode": [], "GPUResourceFlavor": [], "GPUTask": []}


def test_root_metadata_may_only_constrain_name_and_generate_name() -> None:
    """A description (or any field but name/generateName) on the root metadata is refused, as the issue saw."""
    described = crd()
    schema = described["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["metadata"]["description"] = "Standard object metadata."
    named = crd()
    named["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"]["properties"] = {
        "name": {"type": "string", "maxLength": 40}
    }
    labelled = copy.deepcopy(named)
    labelled["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"]["properties"]["labels"] = {
        "type": "object"
    }
    forbidden = (
        f"{S}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, "
        "but metadata is implicitly specified"
    )
    assert (problems(described), problems(named), problems(labelled)) == ([forbidden], [], [forbidden])


def test_metadata_must_not_appear_inside_a_junctor() -> None:
    """Reasoning about metadata in allOf/anyOf/oneOf/not is refused."""
    definition = crd(spec_of(metadata={"type": "object"}, a={"type": "string"}))
    definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["not"] = {
        "properties": {"metadata": {}}
    }
    assert problems(definition) == [
        f"{S}.properties[spec].not.properties[metadata]: Forbidden: must not be specified in a nested context"
    ]


def test_every_specified_node_has_a_type() -> None:
    """Fields and items need a type, unless int-or-string or preserve-unknown-fields stands in."""
    untyped = crd(spec_of(a={"description": "x"}, b={"type": "array", "items": {}}))
    exempt = crd(spec_of(a=QUANTITY, b={"x-kubernetes-preserve-unknown-fields": True}))
    assert (problems(untyped), problems(exempt)) == (
        [
            f"{S}.properties[spec].properties[a].type: Required value: must not be empty for specified object fields",
            f"{S}.properties[spec].properties[b].items.type: Required value: must not be empty for specified array "
            "items",
        ],
        [],
    )


def test_the_root_is_an_object_without_additional_properties() -> None:
    """The root's type must be object and it may not use additionalProperties."""
    definition = crd(additionalProperties={"type": "string"})
    del definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    not_object = crd(type="array", items={"type": "string"})
    assert (problems(definition), problems(not_object)[-1]) == (
        [
            f"{S}: Invalid value: [\"additionalProperties\"]: only {sorted(crdrules.ROOT_FIELDS)} fields are allowed "
            "at the root of the schema if the status subresource is enabled",
            f"{S}.additionalProperties: Forbidden: must not be used at the root",
        ],
        f'{S}.type: Invalid value: "array": must be object at the root',
    )


def test_arrays_need_items() -> None:
    """An array without items is refused."""
    assert problems(crd(spec_of(a={"type": "array"}))) == [
        f"{S}.properties[spec].properties[a].items: Required value: must be specified"
    ]


def test_properties_and_additional_properties_are_mutually_exclusive() -> None:
    """An object may list properties or describe map values, not both."""
    both = spec_of(a={"type": "string"})
    both["additionalProperties"] = {"type": "string"}
    assert problems(crd(both)) == [
        f"{S}.properties[spec].additionalProperties: Forbidden: additionalProperties and properties are mutual "
        "exclusive"
    ]


def test_a_junctor_holds_value_validations_only() -> None:
    """Types, descriptions, defaults and extensions under allOf/anyOf/oneOf/not are refused;
    int-or-string's own anyOf of two types is the one exception."""
    spec = spec_of(a={"type": "string"}, q=QUANTITY)
    spec["anyOf"] = [{"type": "object", "description": "x", "nullable": True, "required": ["a"]}]
    assert problems(crd(spec)) == [
        f"{S}.properties[spec].anyOf[0].type: Forbidden: must be empty to be structural",
        f"{S}.properties[spec].anyOf[0].description: Forbidden: must be empty to be structural",
        f"{S}.properties[spec].anyOf[0].nullable: Forbidden: must be false to be structural",
    ]


def test_what_a_root_junctor_constrains_is_specified_outside_it() -> None:
    """A property named only inside a junctor of the root is refused (structural completeness)."""
    definition = crd()
    schema = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["allOf"] = [{"properties": {"spec": {"properties": {"b": {"minLength": 1}}}}}]
    assert problems(definition) == [
        f"{S}: Invalid value: [\"allOf\"]: only {sorted(crdrules.ROOT_FIELDS)} fields are allowed at the root of "
        "the schema if the status subresource is enabled",
        f"{S}.properties[spec].properties[b]: Required value: because it is defined in "
        f"{S}.allOf[0].properties[spec].properties[b]",
    ]


def test_extension_combinations() -> None:
    """x-kubernetes-*: int-or-string excludes preserve/embedded; embedded needs an object with
    properties or preserve; preserve-unknown-fields false and map-type on a string are refused."""
    spec = spec_of(
        a={**QUANTITY, "x-kubernetes-preserve-unknown-fields": True},
        b={"type": "string", "x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True},
        c={"type": "object", "x-kubernetes-embedded-resource": True},
        d={"type": "object", "x-kubernetes-preserve-unknown-fields": False},
        e={"type": "string", "x-kubernetes-map-type": "atomic"},
        f={"type": "object", "x-kubernetes-map-type": "sometimes"},
    )
    p = f"{S}.properties[spec].properties"
    assert problems(crd(spec)) == [
        f"{p}[d].x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined",
        f'{p}[e].type: Invalid value: "string": must be object if x-kubernetes-map-type is specified',
        f'{p}[f].x-kubernetes-map-type: Unsupported value: "sometimes": supported values: "atomic", "granular"',
        f"{p}[a].x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if "
        "x-kubernetes-int-or-string is true",
        f'{p}[b].type: Invalid value: "string": must be object if x-kubernetes-embedded-resource is true',
        f"{p}[c].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without "
        "x-kubernetes-preserve-unknown-fields",
    ]


def test_list_types_and_set_items() -> None:
    """list-type only on arrays and only atomic/set/map; a set's object items must be atomic maps."""
    spec = spec_of(
        a={"type": "string", "x-kubernetes-list-type": "set"},
        b={"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "bag"},
        c={"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "set"},
        d={"type": "array", "items": {"type": "object", "x-kubernetes-map-type": "atomic"},
           "x-kubernetes-list-type": "set"},
    )  # fmt: skip
    p = f"{S}.properties[spec].properties"
    assert problems(crd(spec)) == [
        f'{p}[a].type: Invalid value: "string": must be array if x-kubernetes-list-type is specified',
        f'{p}[b].x-kubernetes-list-type: Unsupported value: "bag": supported values: "atomic", "set", "map"',
        f"{p}[c].items.x-kubernetes-map-type: Invalid value: null: must be atomic as item of a list with "
        "x-kubernetes-list-type=set",
    ]


def test_list_map_keys_are_required_scalar_item_properties() -> None:
    """A map list needs keys; each key is a scalar item property that is required or defaulted; keys
    need list-type map."""
    item = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "object"}}}
    spec = spec_of(
        nokeys={"type": "array", "items": item, "x-kubernetes-list-type": "map"},
        optional={"type": "array", "items": item, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys":
                  ["name"]},
        nested={"type": "array", "items": {**item, "required": ["tags"]}, "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["tags"]},
        missing={"type": "array", "items": item, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys":
                 ["id"]},
        atomic={"type": "array", "items": item, "x-kubernetes-list-type": "atomic", "x-kubernetes-list-map-keys":
                ["name"]},
        good={"type": "array", "items": {**item, "required": ["name"]}, "x-kubernetes-list-type": "map",
              "x-kubernetes-list-map-keys": ["name"]},
    )  # fmt: skip
    p = f"{S}.properties[spec].properties"
    assert problems(crd(spec)) == [
        f"{p}[nokeys].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map",
        f"{p}[optional].items.properties[name].default: Required value: this property is in "
        "x-kubernetes-list-map-keys, so it must have a default or be a required property",
        f'{p}[nested].items.properties[tags].type: Invalid value: "object": must be a scalar type if parent '
        "array's x-kubernetes-list-type is map",
        f'{p}[missing].x-kubernetes-list-map-keys: Invalid value: ["id"]: entries must all be names of item '
        "properties",
        f'{p}[atomic].x-kubernetes-list-type: Invalid value: "atomic": must be map if x-kubernetes-list-map-keys '
        "is non-empty",
    ]


def test_printer_columns_name_type_format_and_path() -> None:
    """Columns need a name, a printable type, a known format and a path starting with a dot."""
    definition = crd()
    definition["spec"]["versions"][0]["additionalPrinterColumns"] = [
        {"name": "", "type": "string", "jsonPath": ".spec.a"},
        {"name": "B", "type": "object", "jsonPath": ".spec.b"},
        {"name": "C", "type": "integer", "format": "uint8", "jsonPath": ".spec.c"},
        {"name": "D", "type": "string", "jsonPath": "spec.d"},
        {"name": "E", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    ]
    c = "spec.additionalPrinterColumns"
    assert problems(definition) == [
        f"{c}[0].name: Required value",
        f'{c}[1].type: Invalid value: "object": must be one of boolean,date,integer,number,string',
        f'{c}[2].format: Invalid value: "uint8": must be one of byte,date,date-time,double,float,int32,int64,password',
        f'{c}[3].JSONPath: Invalid value: "spec.d": must be a simple json path starting with .',
    ]


def test_printer_column_paths_parse_and_name_one_value() -> None:
    """A column path that does not parse, or that matches several values (only the first prints), is refused."""
    columns = [
        {"name": "A", "jsonPath": ".status.gpus[*].product"},
        {"name": "B", "jsonPath": ".status.gpus[0"},
        {"name": "C", "jsonPath": '.status.conditions[?(@.type=="Admitted")].reason'},
    ]
    found = crdschema.column_path_problems(columns)
    assert [line.split(":")[0] for line in found] == ["column A", "column B"]
    assert found[0] == "column A: JSONPath '.status.gpus[*].product' matches several values; only the first prints"


def test_cel_rules_need_a_rule_and_a_one_line_message_and_a_known_reason() -> None:
    """x-kubernetes-validations: the rule is given, the message has no line breaks, the reason is one of four."""
    spec = spec_of(a={"type": "string"})
    spec["x-kubernetes-validations"] = [
        {"rule": " "},
        {"rule": "self.a != 'x'", "message": "two\nlines"},
        {"rule": "self.a != 'y'\n|| true"},
        {"rule": "self.a != 'z'", "reason": "Because"},
        {"rule": "self.a != 'w'", "reason": "FieldValueForbidden", "message": "no w"},
    ]
    v = f"{S}.properties[spec].x-kubernetes-validations"
    assert problems(crd(spec)) == [
        f"{v}[0].rule: Required value: rule is not specified",
        f'{v}[1].message: Invalid value: "two\\nlines": message must not contain line breaks',
        f"{v}[2].message: Required value: message must be specified if rule contains line breaks",
        f'{v}[3].reason: Unsupported value: "Because": supported values: "FieldValueInvalid", "FieldValueForbidden", '
        '"FieldValueRequired", "FieldValueDuplicate"',
    ]


def test_cel_rules_compile() -> None:
    """A CEL rule that does not parse is refused; the project's rules all parse."""
    spec = spec_of(a={"type": "string"})
    spec["x-kubernetes-validations"] = [{"rule": "self.a =="}, {"rule": "has(self.a)"}]
    found = crdschema.cel_problems(crd(spec)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    assert [line.split(": compilation failed")[0] for line in found] == [
        ".spec.x-kubernetes-validations[0].rule"
    ]


def test_patterns_compile_as_re2() -> None:
    """Go's regexp has no lookaround: a pattern Python accepts but RE2 does not is refused."""
    schema = spec_of(a={"type": "string", "pattern": "^(?!x)[a-z]+$"}, b={"type": "string", "pattern": "^[a-z]+$"})
    found = crdschema.pattern_problems(schema)
    assert [line.split(":")[0] for line in found] == [".a.pattern"]


def test_names_storage_version_and_crd_name() -> None:
    """metadata.name is plural.group, names are DNS-1035 labels, kind differs from listKind, one storage version."""
    definition = crd()
    spec = definition["spec"]
    spec["names"] |= {"plural": "Widgets", "listKind": "Widget", "shortNames": ["w_1"]}
    spec["versions"][0]["storage"] = False
    assert problems(definition) == [
        'metadata.name: Invalid value: "widgets.example.com": must be spec.names.plural+"."+spec.group',
        'spec.names.plural: Invalid value: "Widgets": a DNS-1035 label',
        'spec.names.listKind: Invalid value: "Widget": kind and listKind may not be the same',
        'spec.names.shortNames[0]: Invalid value: "w_1": a DNS-1035 label',
        "spec.versions: Invalid value: must have exactly one version marked as storage version",
    ]


def test_refusals_join_as_the_api_server_joins_them() -> None:
    """One refusal is the message; several are bracketed and comma-separated."""
    one = crdrules.FieldError("a", crdrules.REQUIRED)
    two = crdrules.FieldError("b", crdrules.FORBIDDEN, "no")
    assert (crdrules.aggregate([one]), crdrules.aggregate([one, two])) == ("a: Required value",
                                                                           "[a: Required value, b: Forbidden: no]")


# -- bounds the OpenAPI keywords cannot state, and that CEL rules state instead -------------------------

TASK = crdschema.load_crds(ROOT / "crds")["GPUTask"]
QUEUE = crdschema.load_crds(ROOT / "crds")["GPUClusterQueue"]


def _node(definition: dict[str, Any], *path: str) -> dict[str, Any]:
    node = crdschema.openapi_schema(definition)
    for name in path:
        node = node["items"] if name == "[]" else node["properties"][name]
    return node


@pytest.mark.parametrize(
    ("definition", "path", "value", "broken"),
    [
        (TASK, ("spec",), {"gpuMemory": "1Gi", "gpuFraction": "0.5"}, ["set at most one of gpuMemory and gpuFraction"]),
        (TASK, ("spec",), {"gpuMemory": "1Gi"}, []),
        (TASK, ("spec", "gpuMemory"), "0Gi", ["gpuMemory must be more than zero"]),
        (TASK, ("spec", "gpuMemory"), "0.0", ["gpuMemory must be more than zero"]),
        (TASK, ("spec", "gpuMemory"), "512Mi", []),
        (TASK, ("spec", "gpuMemory"), 1, []),
        (QUEUE, ("spec", "resources", "[]"), {"name": "nvidia.com/gpu", "nominalQuota": 2, "lendingLimit": 3},
         ["lendingLimit must not be more than nominalQuota"]),
        (QUEUE, ("spec", "resources", "[]"), {"name": "nvidia.com/gpu", "nominalQuota": 2, "lendingLimit": 2}, []),
        (QUEUE, ("spec", "preemption"), {"borrowWithinCohort": {"policy": "LowerPriority"}},
         ["borrowWithinCohort needs reclaimWithinCohort other than Never"]),
    ],
)  # fmt: skip
def test_cel_rules_state_the_cross_field_and_zero_bounds(
    definition: dict[str, Any], path: tuple[str, ...], value: Any, broken: list[str]
) -> None:
    """Each bound no OpenAPI keyword can express has a CEL rule that refuses exactly the values breaking it."""
    assert crdschema.rule_failures(_node(definition, *path), value) == broken


def test_quantities_are_bounded_for_integers_and_strings() -> None:
    """Every int-or-string quantity has a pattern (strings) and a minimum (integers), and a maxLength
    so the CEL cost of a rule reading it stays bounded."""
    unbounded = [
        f"{kind}{path}"
        for kind, definition in crdschema.load_crds(ROOT / "crds").items()
        for path, node in crdschema.all_nodes(crdschema.openapi_schema(definition))
        if node.get("x-kubernetes-int-or-string") and not {"pattern", "minimum", "maxLength"} <= set(node)
    ]
    assert unbounded == []


def test_the_root_field_rule_follows_each_versions_status_subresource_and_skips_zero_values() -> None:
    """The root-field restriction applies to versions with the status subresource only, and
    a zero value (nullable: false) is not a field set."""
    definition = crd(nullable=False)
    two = copy.deepcopy(definition)
    second = copy.deepcopy(two["spec"]["versions"][0]) | {"name": "v2", "storage": False, "subresources": {}}
    second["schema"]["openAPIV3Schema"]["maxProperties"] = 10
    two["spec"]["versions"].append(second)
    with_status = copy.deepcopy(two)
    with_status["spec"]["versions"][1]["subresources"] = {"status": {}}
    assert (problems(definition), problems(two), problems(with_status)) == (
        [],
        [],
        [
            f'spec.versions[1].schema.openAPIV3Schema: Invalid value: ["maxProperties"]: only '
            f"{sorted(crdrules.ROOT_FIELDS)} fields are allowed at the root of the schema if the status subresource "
            "is enabled"
        ],
    )
