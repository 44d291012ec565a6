"""The CRDs in crds/ are valid structural schemas and accept exactly the objects they should."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

# tests/ is not a package, so its shared helper is not importable from tests/unit by default.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import crdschema  # noqa: E402 (needs the sys.path entry above)

ROOT = Path(__file__).resolve().parents[2]
CRDS = crdschema.load_crds(ROOT / "crds")
VALIDATORS = {kind: crdschema.validator_for(crd) for kind, crd in CRDS.items()}
TEMPLATE = {
    "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "60"]}],
    }
}


def task(**spec: Any) -> dict[str, Any]:
    """A GPUTask manifest with the given spec fields and a valid template."""
    return {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUTask",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"queueName": "default", "template": TEMPLATE, **spec},
    }


def queue(**spec: Any) -> dict[str, Any]:
    """A GPUClusterQueue manifest with the given spec fields."""
    return {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUClusterQueue",
        "metadata": {"name": "q"},
        "spec": {"resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}], **spec},
    }


def is_valid(manifest: dict[str, Any]) -> bool:
    """True when the manifest's CRD schema accepts it."""
    return bool(VALIDATORS[manifest["kind"]].is_valid(manifest))


def test_crd_files_define_the_five_kinds_as_v1alpha1_with_status_subresources() -> None:
    """Each CRD is apiextensions v1, serves and stores v1alpha1, and has a status subresource."""
    summary = {
        kind: (
            crd["apiVersion"],
            crd["metadata"]["name"],
            crd["spec"]["group"],
            crd["spec"]["scope"],
            crd["spec"]["names"].get("shortNames"),
            crd["spec"]["names"].get("categories"),
            [(v["name"], v["served"], v["storage"], v.get("subresources")) for v in crd["spec"]["versions"]],
        )
        for kind, crd in CRDS.items()
    }
    version = [("v1alpha1", True, True, {"status": {}})]
    assert summary == {
        "GPUTask": ("apiextensions.k8s.io/v1", "gputasks.gputask.io", "gputask.io", "Namespaced",
                    ["gt"], ["gputask"], version),
        "GPUClusterQueue": ("apiextensions.k8s.io/v1", "gpuclusterqueues.gputask.io", "gputask.io",
                            "Cluster", ["gcq"], None, version),
        "GPULocalQueue": ("apiextensions.k8s.io/v1", "gpulocalqueues.gputask.io", "gputask.io",
                          "Namespaced", ["glq"], ["gputask"], version),
        "GPUNode": ("apiextensions.k8s.io/v1", "gpunodes.gputask.io", "gputask.io", "Cluster",
                    ["gn"], None, version),
        "GPUResourceFlavor": ("apiextensions.k8s.io/v1", "gpuresourceflavors.gputask.io", "gputask.io", "Cluster",
                              ["grf"], None, [("v1alpha1", True, True, None)]),  # no status: nothing to report
    }  # fmt: skip


def test_crd_schemas_describe_every_field() -> None:
    """Every field, item and map value of every CRD schema has a description (the root metadata may not have one).

    Whether the API server accepts the CRDs is tests/unit/test_crd_rules.py's question.
    """
    undocumented = {kind: crdschema.undocumented_fields(crdschema.openapi_schema(crd)) for kind, crd in CRDS.items()}
    assert undocumented == {"GPUTask": [], "GPUClusterQueue": [], "GPULocalQueue": [], "GPUNode": [],
                           "GPUResourceFlavor": []}


def test_crd_defaults_validate_against_their_own_schema() -> None:
    """Every default validates against the schema of the field it defaults, as the API server requires."""
    invalid = [
        f"{kind}{path}"
        for kind, crd in CRDS.items()
        for path, node in crdschema.defaults(crdschema.openapi_schema(crd))
        if not jsonschema.Draft7Validator(crdschema.to_jsonschema(node)).is_valid(node["default"])
    ]
    assert invalid == []


def test_gputask_spec_states_memory_and_fraction_exclusivity_in_cel_and_schema() -> None:
    """The GPUTask spec forbids gpuMemory with gpuFraction both with a CEL rule and with `not`."""
    schema = crdschema.openapi_schema(CRDS["GPUTask"])
    spec = schema["properties"]["spec"]
    assert (schema["required"], spec["not"], spec["x-kubernetes-validations"][0]) == (
        ["spec"],
        {"required": ["gpuMemory", "gpuFraction"]},
        {
            "rule": "!(has(self.gpuMemory) && has(self.gpuFraction))",
            "message": "set at most one of gpuMemory and gpuFraction",
        },
    )


def test_gpu_sharing_mps_is_refused_for_whole_gpus_by_the_cel_rule() -> None:
    """gpuSharing: MPS passes with gpuMemory or a fraction below 1 and fails the CEL rule without, or with "1"."""
    spec = crdschema.openapi_schema(CRDS["GPUTask"])["properties"]["spec"]
    cases = [{"gpuSharing": "MPS", "gpuMemory": "4Gi"}, {"gpuSharing": "MPS", "gpuFraction": "0.5"},
             {"gpuSharing": "MPS"}, {"gpuSharing": "MPS", "gpuFraction": "1.000"}, {"gpuSharing": "TimeSlicing"}, {}]
    failed = "gpuSharing: MPS is for shared GPUs: set gpuMemory, or a gpuFraction below 1"
    assert [crdschema.rule_failures(spec, case) for case in cases] == [[], [], [failed], [failed], [], []]


def test_examples_are_the_demo_objects_and_validate_against_their_crds() -> None:
    """examples/ holds the demo's Nodes, GPUNodes, queues and tasks, and each custom resource validates."""
    objects = crdschema.load_objects(ROOT / "examples")
    errors = {
        obj["metadata"]["name"]: [e.message for e in VALIDATORS[obj["kind"]].iter_errors(obj)]
        for obj in objects
        if obj["apiVersion"].startswith("gputask.io/")
    }
    assert ([(o["kind"], o["metadata"]["name"]) for o in objects], errors) == (
        [("Node", "node-a"), ("Node", "node-b"), ("Node", "node-c"), ("Node", "node-d"), ("GPUNode", "node-a"),
         ("GPUNode", "node-b"), ("GPUNode", "node-c"), ("GPUNode", "node-d"),
         ("GPUClusterQueue", "default"), ("GPULocalQueue", "default"), ("GPUTask", "train-small"),
         ("GPUTask", "eval-fraction"), ("GPUTask", "infer-whole")],
        dict.fromkeys(["node-a", "node-b", "node-c", "node-d", "default", "train-small", "eval-fraction",
                       "infer-whole"], []),
    )  # fmt: skip


def test_example_files_sort_in_apply_order() -> None:
    """The demo applies examples/*.yaml in sorted order: Nodes, GPUNodes, the queue, then the tasks."""
    assert sorted(p.name for p in (ROOT / "examples").glob("*.yaml")) == [
        "00-nodes.yaml",
        "01-gpunodes.yaml",
        "10-queue.yaml",
        "20-gputask.yaml",
        "21-gputask-fraction.yaml",
        "22-gputask-whole.yaml",
    ]


def test_schemas_reject_exactly_the_bad_manifests() -> None:
    """Out-of-range, malformed and conflicting fields are rejected; their valid neighbours are not."""
    unknown_field = task(gpus=1)
    unknown_field["spec"]["gpuCount"] = 2
    cases = {
        "gpus 1": task(gpus=1),
        "gpus 16": task(gpus=16),
        "gpus 0": task(gpus=0),
        "gpus 17": task(gpus=17),
        "gpuFraction 0.25": task(gpuFraction="0.25"),
        "gpuFraction 1": task(gpuFraction="1"),
        "gpuFraction 1.5": task(gpuFraction="1.5"),
        "gpuFraction 0": task(gpuFraction="0"),
        "gpuFraction 0.0001": task(gpuFraction="0.0001"),
        "gpuFraction as a number": task(gpuFraction=0.5),
        "gpuMemory 12Gi": task(gpuMemory="12Gi"),
        "gpuMemory 12GB": task(gpuMemory="12GB"),
        "gpuMemory -1Gi": task(gpuMemory="-1Gi"),
        "gpuMemory as an object": task(gpuMemory={"value": "12Gi"}),
        "gpuMemory and gpuFraction": task(gpuMemory="12Gi", gpuFraction="0.5"),
        "gpuSharing MPS": task(gpuMemory="4Gi", gpuSharing="MPS"),
        "gpuSharing Exclusive": task(gpuMemory="4Gi", gpuSharing="Exclusive"),
        "maxReschedules -1": task(maxReschedules=-1),
        "maxReschedules 1001": task(maxReschedules=1001),
        "unknown spec field": unknown_field,
        "no spec": {k: v for k, v in task().items() if k != "spec"},
        "queue StrictFIFO": queue(queueingStrategy="StrictFIFO"),
        "queueingStrategy Fifo": queue(queueingStrategy="Fifo"),
        "unknown preemption policy": queue(preemption={"withinClusterQueue": "Always"}),
        "unknown resource": queue(resources=[{"name": "cpu", "nominalQuota": 4}]),
        "milli-GPU quota": queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": "1500m"}]),
    }
    rejected = [name for name, manifest in cases.items() if not is_valid(manifest)]
    assert rejected == [
        "gpus 0",
        "gpus 17",
        "gpuFraction 1.5",
        "gpuFraction 0",
        "gpuFraction 0.0001",
        "gpuFraction as a number",
        "gpuMemory 12GB",
        "gpuMemory -1Gi",
        "gpuMemory as an object",
        "gpuMemory and gpuFraction",
        "gpuSharing Exclusive",
        "maxReschedules -1",
        "maxReschedules 1001",
        "unknown spec field",
        "no spec",
        "queueingStrategy Fifo",
        "unknown preemption policy",
        "unknown resource",
    ]


def test_gputask_printer_columns() -> None:
    """`kubectl get gt` shows Queue, Priority, Phase, Node, Pods, GPUs, Memory, Reason and Age in that order."""
    (version,) = CRDS["GPUTask"]["spec"]["versions"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Queue", "Priority", "Phase", "Node", "Pods", "GPUs", "Memory", "Reason", "Age",
    ]  # fmt: skip


QUANTITIES = ["1", "512Mi", "12Gi", "1.5Gi", "16G", "100M", "1e9", "24Gi", ".5Gi", "8000Mi"]


@given(gpus=st.integers(1, 16), memory=st.sampled_from(QUANTITIES) | st.integers(1, 2**40))
def test_any_gpu_count_and_memory_quantity_validates(gpus: int, memory: str | int) -> None:
    """Any gpus in 1..16 with any well-formed gpuMemory quantity is accepted."""
    assert is_valid(task(gpus=gpus, gpuMemory=memory))


@given(fraction=st.decimals(min_value=Decimal("0.001"), max_value=Decimal(1), places=3), trim=st.booleans())
def test_any_fraction_with_at_most_three_decimals_validates(fraction: Decimal, trim: bool) -> None:
    """Any gpuFraction in (0,1] written with at most three decimals, trailing zeros or not, is accepted."""
    assert is_valid(task(gpuFraction=format(fraction.normalize() if trim else fraction, "f")))


def local_queue(**spec: Any) -> dict[str, Any]:
    """A GPULocalQueue manifest with the given spec fields."""
    return {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPULocalQueue",
        "metadata": {"name": "team-a", "namespace": "team-a"},
        "spec": spec,
    }


def test_local_queue_needs_a_cluster_queue_name_that_is_a_kubernetes_name() -> None:
    """spec.clusterQueue is required, non-empty and a DNS subdomain, as Kueue's LocalQueue; nothing else is read."""
    cases = {
        "named": local_queue(clusterQueue="team-a"),
        "dotted": local_queue(clusterQueue="org.team-a"),
        "missing": local_queue(),
        "empty": local_queue(clusterQueue=""),
        "upper case": local_queue(clusterQueue="Team-A"),
        "unknown field": local_queue(clusterQueue="team-a", cohort="org"),
    }
    assert {name: is_valid(m) for name, m in cases.items()} == {
        "named": True, "dotted": True, "missing": False, "empty": False, "upper case": False, "unknown field": False,
    }  # fmt: skip


def test_local_queue_cluster_queue_is_immutable_as_in_kueue() -> None:
    """The transition rule refuses an update that points the queue elsewhere and accepts one that keeps it."""
    field = crdschema.openapi_schema(CRDS["GPULocalQueue"])["properties"]["spec"]["properties"]["clusterQueue"]
    assert (
        crdschema.rule_failures(field, "team-b", old="team-a"),
        crdschema.rule_failures(field, "team-a", old="team-a"),
        crdschema.rule_failures(field, "team-b"),  # a create: transition rules are not evaluated
    ) == (["field is immutable"], [], [])


def test_local_queue_printer_columns() -> None:
    """`kubectl get glq` shows ClusterQueue, Pending, Admitted, GPU usage and Age, read from spec and status."""
    (version,) = CRDS["GPULocalQueue"]["spec"]["versions"]
    obj = local_queue(clusterQueue="team-a")
    obj["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    usage = [{"name": "nvidia.com/gpu", "total": "1500m"}, {"name": "gputask.io/gpu-memory", "total": "24576Mi"}]
    obj["status"] = {"pendingTasks": 3, "admittedTasks": 2, "usage": usage}
    assert (is_valid(obj), crdschema.column_values(version["additionalPrinterColumns"], obj)) == (True, {
        "ClusterQueue": "team-a", "Pending": 3, "Admitted": 2, "GPU usage": "1500m", "Age": "2026-12-01T10:00:00Z",
    })  # fmt: skip


def test_a_flavor_of_a_resource_group_must_list_exactly_its_covered_resources() -> None:
    """As Kueue's webhook: a flavor listing another resource than the group covers is refused by the CEL rule,
    and resources and resourceGroups together by the spec's rule."""
    group = crdschema.openapi_schema(CRDS["GPUClusterQueue"])["properties"]["spec"]["properties"]["resourceGroups"]
    spec = crdschema.openapi_schema(CRDS["GPUClusterQueue"])["properties"]["spec"]

    def one(resource: str) -> dict[str, Any]:
        return {"coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": "a10", "resources": [{"name": resource, "nominalQuota": 1}]}]}

    both = {"resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}], "resourceGroups": [one("nvidia.com/gpu")]}
    assert (
        crdschema.rule_failures(group["items"], one("nvidia.com/gpu")),
        crdschema.rule_failures(group["items"], one("gputask.io/gpu-memory")),
        crdschema.rule_failures(spec, both),
        is_valid({**queue(), "spec": {"namespaceSelector": {}, "resourceGroups": [one("nvidia.com/gpu")]}}),
    ) == ([], ["each flavor must list exactly the group's coveredResources"],
          ["set resources (one implicit flavor) or resourceGroups, not both"], True)


def test_a_resource_flavor_validates_as_kueues_plus_the_gpu_fields() -> None:
    """GPUResourceFlavor accepts Kueue's nodeLabels, nodeTaints and tolerations plus gpuProducts and
    gpuMemory; it refuses a taint without an effect and an unknown field."""
    def flavor(**spec: Any) -> dict[str, Any]:
        return {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUResourceFlavor", "metadata": {"name": "h100"},
                "spec": spec}

    full = flavor(nodeLabels={"gpu": "h100"}, nodeTaints=[{"key": "gpu", "value": "h100", "effect": "NoSchedule"}],
                  tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
                  gpuProducts=["NVIDIA-H100-80GB-HBM3"], gpuMemory="80Gi")
    assert [is_valid(full), is_valid(flavor()), is_valid(flavor(nodeTaints=[{"key": "gpu"}])),
            is_valid(flavor(cohort="x"))] == [True, True, False, False]


# -- gangs: spec.podSets and spec.topology ------------------------------------------------------------

def gang(*pod_sets: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A GPUTask manifest of ``pod_sets`` (no one-pod fields) with the other spec fields given."""
    return {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUTask",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"queueName": "default", "podSets": list(pod_sets), **spec},
    }


def pod_set(name: str, **fields: Any) -> dict[str, Any]:
    """One PodSet with a valid template."""
    return {"name": name, "template": TEMPLATE, **fields}


def test_schema_bounds_pod_sets_and_topology() -> None:
    """1 to 8 PodSets named as DNS labels, count 1 to 1024, gpus 1 to 16, gpuMemory more than zero (by its
    pattern: a CEL rule there costs past the API server's budget), topology keys label keys."""
    cases = {
        "one PodSet": gang(pod_set("main")),
        "launcher and workers": gang(pod_set("launcher"), pod_set("workers", count=1024, gpus=8, gpuMemory="40Gi")),
        "no PodSet": gang(),
        "nine PodSets": gang(*(pod_set(f"p{i}") for i in range(9))),
        "count 0": gang(pod_set("w", count=0)),
        "count 1025": gang(pod_set("w", count=1025)),
        "gpus 17": gang(pod_set("w", gpus=17)),
        "name not a DNS label": gang(pod_set("Workers")),
        "no name": gang({"count": 2}),
        "memory 512Mi": gang(pod_set("w", gpuMemory="512Mi")),
        "memory 0.5Gi": gang(pod_set("w", gpuMemory="0.5Gi")),
        "memory .05": gang(pod_set("w", gpuMemory=".05")),
        "memory 1.0e3": gang(pod_set("w", gpuMemory="1.0e3")),
        "memory 0Mi": gang(pod_set("w", gpuMemory="0Mi")),
        "memory 0.0": gang(pod_set("w", gpuMemory="0.0")),
        "memory .0Gi": gang(pod_set("w", gpuMemory=".0Gi")),
        "memory 00e5": gang(pod_set("w", gpuMemory="00e5")),
        "memory 0 as an integer": gang(pod_set("w", gpuMemory=0)),
        "fraction 0.5": gang(pod_set("w", gpuFraction="0.5")),
        "fraction 2": gang(pod_set("w", gpuFraction="2")),
        "memory and fraction": gang(pod_set("w", gpuMemory="4Gi", gpuFraction="0.5")),
        "unknown PodSet field": gang(pod_set("w", replicas=2)),
        "topology required": gang(pod_set("w"), topology={"required": "topology.kubernetes.io/zone"}),
        "topology preferred": gang(pod_set("w"), topology={"preferred": "nvidia.com/gpu.clique"}),
        "topology key with two slashes": gang(pod_set("w"), topology={"required": "a/b/c"}),
        "unknown topology field": gang(pod_set("w"), topology={"within": "rack"}),
    }
    rejected = [name for name, manifest in cases.items() if not is_valid(manifest)]
    assert rejected == [
        "no PodSet", "nine PodSets", "count 0", "count 1025", "gpus 17", "name not a DNS label", "no name",
        "memory 0Mi", "memory 0.0", "memory .0Gi", "memory 00e5", "memory 0 as an integer",
        "fraction 2", "memory and fraction", "unknown PodSet field", "topology key with two slashes",
        "unknown topology field",
    ]  # fmt: skip


def test_pod_set_names_are_unique_as_list_map_keys() -> None:
    """PodSets are a list map keyed by name: the API server refuses a repeated name (Duplicate value) and merges
    PodSets by name on apply."""
    pod_sets = crdschema.openapi_schema(CRDS["GPUTask"])["properties"]["spec"]["properties"]["podSets"]
    assert (pod_sets["x-kubernetes-list-type"], pod_sets["x-kubernetes-list-map-keys"], pod_sets["items"]["required"]
            ) == ("map", ["name"], ["name"])


SPEC_RULES = crdschema.openapi_schema(CRDS["GPUTask"])["properties"]["spec"]
BOTH = "set podSets or the one-pod fields (gpus, gpuMemory, gpuFraction, gpuProducts, template), not both"
MPS = "gpuSharing: MPS is for shared GPUs: set gpuMemory, or a gpuFraction below 1"


@pytest.mark.parametrize(
    ("spec", "broken"),
    [
        ({"podSets": [{"name": "w"}]}, []),
        ({"podSets": [{"name": "w"}], "gpus": 1}, []),  # the API server defaults gpus to 1: that is no shorthand
        ({"podSets": [{"name": "w"}], "gpus": 2}, [BOTH]),
        ({"podSets": [{"name": "w"}], "gpuMemory": "4Gi"}, [BOTH]),
        ({"podSets": [{"name": "w"}], "gpuFraction": "0.5"}, [BOTH]),
        ({"podSets": [{"name": "w"}], "gpuProducts": ["NVIDIA-A10"]}, [BOTH]),
        ({"podSets": [{"name": "w"}], "template": TEMPLATE}, [BOTH]),
        ({"gpus": 2, "template": TEMPLATE}, []),
        ({"podSets": [{"name": "a", "gpuMemory": "4Gi"}, {"name": "b", "gpuFraction": "0.5"}], "gpuSharing": "MPS"},
         []),
        ({"podSets": [{"name": "a", "gpuMemory": "4Gi"}, {"name": "b"}], "gpuSharing": "MPS"}, [MPS]),
        ({"podSets": [{"name": "a", "gpuFraction": "1"}], "gpuSharing": "MPS"}, [MPS]),
    ],
)  # fmt: skip
def test_cel_rules_refuse_both_shapes_and_mps_on_a_whole_gpu_pod_set(spec: dict[str, Any], broken: list[str]) -> None:
    """The spec's CEL rules refuse podSets with any one-pod field (gpus other than its default 1), and MPS unless
    every PodSet shares its GPUs."""
    assert crdschema.rule_failures(SPEC_RULES, spec) == broken


@pytest.mark.parametrize(
    ("path", "value", "broken"),
    [
        (("topology",), {"required": "topology.kubernetes.io/zone"}, []),
        (("topology",), {"preferred": "rack"}, []),
        (("topology",), {}, ["set exactly one of topology.required and topology.preferred"]),
        (("topology",), {"required": "rack", "preferred": "zone"},
         ["set exactly one of topology.required and topology.preferred"]),
        (("podSets", "[]"), {"name": "w", "gpuMemory": "4Gi", "gpuFraction": "0.5"},
         ["set at most one of gpuMemory and gpuFraction"]),
        (("podSets", "[]"), {"name": "w", "gpuMemory": "4Gi"}, []),
    ],
)  # fmt: skip
def test_cel_rules_of_topology_and_each_pod_set(path: tuple[str, ...], value: Any, broken: list[str]) -> None:
    """topology names exactly one of required and preferred; a PodSet may not set both memory and fraction."""
    node = SPEC_RULES
    for name in path:
        node = node["items"] if name == "[]" else node["properties"][name]
    assert crdschema.rule_failures(node, value) == broken


def test_every_list_and_string_a_spec_rule_iterates_is_bounded() -> None:
    """The CEL cost estimate of kube-apiserver multiplies by maxItems and maxLength: every list and string
    under spec.podSets (which the MPS rule iterates) states its bound."""
    pod_sets = SPEC_RULES["properties"]["podSets"]
    fields = pod_sets["items"]["properties"]
    assert (pod_sets["maxItems"], fields["gpuMemory"]["maxLength"], fields["gpuFraction"]["maxLength"],
            fields["gpuProducts"]["maxItems"], fields["name"]["maxLength"]) == (8, 64, 5, 32, 63)


def test_no_rule_under_a_list_matches_a_regular_expression() -> None:
    """A CEL rule's estimated cost is multiplied by the maxItems of every list above it: a matches() on a PodSet's
    gpuMemory was refused by kube-apiserver v1.28 (3.5x its budget), so rules under lists use no regex (a pattern
    says it instead; tests/realcluster applies the CRDs to the real server)."""
    costly = [
        f"{kind}{path}"
        for kind, definition in CRDS.items()
        for path, node in crdschema.all_nodes(crdschema.openapi_schema(definition))
        if ".items" in path and any("matches(" in r["rule"] for r in node.get("x-kubernetes-validations") or [])
    ]
    assert costly == []
