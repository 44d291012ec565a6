"""Conversion of a GPUTask's gang fields (spec.podSets, spec.topology) into a core Task of PodSets, with the
API server's words for what its CRD refuses."""

from __future__ import annotations

from typing import Any

import pytest

from gputask.core import GpuRequest, InvalidTaskError, NodeName, Placement, PodPlacement, PodSet, Task, TaskKey
from gputask.core.fit import Constraints, Toleration
from gputask.core.model import GpuSlot
from gputask.manifests.convert import task_from_manifest
from gputask.manifests.podsets import pod_ids, pods_summary


def pod_template(cpu: str = "1", memory: str = "1Gi", **pod: Any) -> dict[str, Any]:
    """A pod template of one container requesting ``cpu`` and ``memory``."""
    container = {"name": "main", "image": "trainer:1", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
    return {"spec": {"containers": [container], "restartPolicy": "Never", **pod}}


def gang(*pod_sets: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A GPUTask ``ml/ddp`` of queue ``team-a`` with ``pod_sets`` and the other spec fields."""
    return {"metadata": {"name": "ddp", "namespace": "ml"},
            "spec": {"queueName": "team-a", "podSets": list(pod_sets), **spec}}


def error_of(obj: dict[str, Any]) -> tuple[str, str]:
    """(reason, message) of the InvalidTaskError converting ``obj`` raises."""
    with pytest.raises(InvalidTaskError) as info:
        task_from_manifest(obj)
    return info.value.reason, info.value.message


def test_launcher_and_workers_become_two_pod_sets_with_their_templates_requests_and_constraints() -> None:
    """Each PodSet's count, GPUs, sharing and its template's requests and tolerations land in its core PodSet;
    the topology becomes topology_required; the rest of the spec is the task's."""
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    obj = gang(
        {"name": "launcher", "gpus": 1, "gpuFraction": "0.25", "template": pod_template("500m", "512Mi")},
        {"name": "workers", "count": 4, "gpus": 8, "gpuProducts": ["NVIDIA-H100"],
         "template": pod_template("16", "64Gi", tolerations=[toleration])},
        topology={"required": "nvidia.com/gpu.clique"}, maxReschedules=2,
    )
    workers = PodSet("workers", 4, GpuRequest(8, products=frozenset({"NVIDIA-H100"})), 16000, 65536, 0,
                     Constraints(tolerations=(Toleration("gpu", "Exists", "", "NoSchedule"),)))
    launcher = PodSet("launcher", 1, GpuRequest(1, fraction_milli=250), 500, 512)
    assert task_from_manifest(obj) == Task.of_pod_sets(
        TaskKey("ml/ddp"), "team-a", (launcher, workers), topology_required="nvidia.com/gpu.clique",
        max_reschedules=2,
    )


def test_one_pod_fields_and_a_preferred_topology() -> None:
    """The shorthand stays one pod (no PodSets); topology preferred lands in topology_preferred."""
    obj = {"metadata": {"name": "t"}, "spec": {"queueName": "q", "gpus": 2, "topology": {"preferred": "rack"}}}
    assert task_from_manifest(obj) == Task(TaskKey("default/t"), "q", GpuRequest(2), topology_preferred="rack")


def test_mps_sharing_applies_to_every_pod_set_and_needs_each_shared() -> None:
    """spec.gpuSharing MPS puts every PodSet's request in the MPS share group; a whole-GPU PodSet is refused."""
    shared = task_from_manifest(gang({"name": "w", "count": 2, "gpuMemory": "8Gi"}, gpuSharing="MPS"))
    assert (shared.pod_sets[0].request, error_of(gang({"name": "a", "gpuMemory": "8Gi"}, {"name": "b"},
                                                     gpuSharing="MPS"))) == (
        GpuRequest(1, memory_mib=8192, share_group="MPS"),
        ("InvalidSpec", "spec.gpuSharing: MPS is for shared GPUs: set spec.podSets[1].gpuMemory, or a "
                        "spec.podSets[1].gpuFraction below 1"),
    )


BOTH = 'spec: Invalid value: "object": set podSets or the one-pod fields (gpus, gpuMemory, gpuFraction, ' \
       'gpuProducts, template), not both'


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (gang({"name": "w"}, gpus=2), BOTH),
        (gang({"name": "w"}, gpuMemory="4Gi"), BOTH),
        (gang({"name": "w"}, template=pod_template()), BOTH),
        (gang(), 'spec.podSets: Invalid value: []: spec.podSets in body should have at least 1 items'),
        (gang(*({"name": f"p{i}"} for i in range(9))), "spec.podSets: Too many: 9: must have at most 8 items"),
        (gang({"name": "w"}, {"name": "w"}),
         'spec.podSets[1]: Duplicate value: map[string]interface {}{"name":"w"}'),
        (gang({"name": "Workers"}),
         'spec.podSets[0].name: Invalid value: "Workers": a lowercase RFC 1123 label must consist of lower case '
         "alphanumeric characters or '-', and must start and end with an alphanumeric character"),
        (gang({"count": 2}), "spec.podSets[0].name: Required value"),
        (gang({"name": "w", "count": 0}, {"name": "v", "count": 1025}),
         "[spec.podSets[0].count: Invalid value: 0: spec.podSets[0].count in body should be greater than or equal "
         "to 1, spec.podSets[1].count: Invalid value: 1025: spec.podSets[1].count in body should be less than or "
         "equal to 1024]"),
        (gang({"name": "w", "replicas": 2}), "spec.podSets[0].replicas: Forbidden: unknown field"),
        (gang({"name": "w", "gpus": 17}), "spec.podSets[0].gpus must be between 1 and 16, got 17"),
        (gang({"name": "w", "gpuMemory": "0.5"}),
         "spec.podSets[0].gpuMemory: '0.5' is less than 1Mi (a bare number is bytes): likely a unit mistake, "
         "write e.g. '4096Mi' or '4Gi'"),
        (gang({"name": "w", "template": {"spec": {"containers": []}}}),
         "the pod template would be refused as a Job's: spec.podSets[0].template.spec.containers: Required value"),
        (gang({"name": "w"}, topology={}),
         'spec.topology: Invalid value: "object": set exactly one of topology.required and topology.preferred'),
        (gang({"name": "w"}, topology={"required": "zone", "preferred": "rack"}),
         'spec.topology: Invalid value: "object": set exactly one of topology.required and topology.preferred'),
        (gang({"name": "w"}, topology={"required": "a/b/c"}),
         'spec.topology.required: Invalid value: "a/b/c": name part must consist of alphanumeric characters, '
         "'-', '_' or '.', and must start and end with an alphanumeric character (at most 63), with an optional "
         "DNS subdomain prefix and '/'"),
    ],
)  # fmt: skip
def test_bad_gang_fields_are_invalid_spec_in_the_api_servers_words(obj: dict[str, Any], message: str) -> None:
    """Each gang field the CRD refuses is InvalidSpec, addressed and worded as kube-apiserver says it."""
    assert error_of(obj) == ("InvalidSpec", message)


def test_pods_are_named_by_pod_set_and_index_and_summarised_for_kubectl_get() -> None:
    """pod_ids follows Placement.pods' order; the summary is COUNTxGPUS per PodSet and the nodes once placed."""
    task = task_from_manifest(gang({"name": "launcher"}, {"name": "workers", "count": 3, "gpus": 8}))
    pods = tuple(PodPlacement(NodeName(n), (GpuSlot(0, f"GPU-{n}", 1),)) for n in ("a", "a", "b", "c"))
    assert (pod_ids(task), pods_summary(task), pods_summary(task, Placement(pods))) == (
        [("launcher", 0), ("workers", 0), ("workers", 1), ("workers", 2)],
        "1x1 + 3x8",
        "1x1 + 3x8 on 3 nodes",
    )
