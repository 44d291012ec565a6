"""Pinning modes: the exact Job (and DRA objects) each mode emits, MIG devices, budgets, and the API schemas."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from gputask.core import GpuRequest, GpuSlot, NodeName, Placement
from gputask.k8s import dra
from gputask.k8s.jobs import build_job
from gputask.k8s.kueue_api import build_kueue_job, pod_set_annotations
from gputask.k8s.pinning import Budget, Pinning, budget_of, cdi_annotation, cdi_device_name

TASK = {
    "apiVersion": "gputask.io/v1alpha1",
    "kind": "GPUTask",
    "metadata": {"name": "train", "namespace": "ml", "uid": "uid-1"},
    "spec": {
        "queueName": "default",
        "template": {
            "spec": {
                "initContainers": [{"name": "fetch", "image": "busybox"}],
                "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            }
        },
    },
}
GPU_A, GPU_B, MIG = (
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-1d0e7b0a-2c53-4f2e-9b5e-77c1a0e3c111",
    "MIG-5c4b2c1d-7d3e-5f7a-8b9c-0d1e2f3a4b5c",
)
SHARED = Placement.one(NodeName("node-a"), (GpuSlot(0, GPU_A, 8192), GpuSlot(1, GPU_B, 6144)))
WHOLE = Placement.one(NodeName("node-a"), (GpuSlot(0, GPU_A, 81920), GpuSlot(3, MIG, 9984)))
MPS = GpuRequest(2, memory_mib=8192, share_group="MPS")
PIN = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}  # fmt: skip
KUBERNETES = [f"1.{minor}.0" for minor in range(26, 35)]
DRA_KUBERNETES = {"v1beta1": ["1.32.0", "1.33.0", "1.34.0"], "v1": ["1.34.0"]}


def pod(job: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a Job, without the placement annotation (the same in every mode)."""
    template = copy.deepcopy(job["spec"]["template"])
    template["metadata"]["annotations"].pop("gputask.io/placement")
    del template["metadata"]["labels"]
    return template


def validate(obj: dict[str, Any], versions: list[str]) -> list[str]:
    """The strict schema errors of ``obj`` at each Kubernetes version (empty when it validates everywhere)."""
    errors = []
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{version}: {exc.message}")
    return errors


def test_envvar_mode_sets_the_uuids_and_tells_an_mps_task_its_budget() -> None:
    """envvar: NVIDIA_VISIBLE_DEVICES lists the UUIDs in every container, no nvidia.com/gpu request, and a shared
    MPS task gets GPUTASK_GPU_MEMORY_MIB and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT at its smallest per-GPU MiB."""
    job = build_job(TASK, SHARED, attempt=1, queue="q", request=MPS)
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": f"{GPU_A},{GPU_B}"},
           {"name": "GPUTASK_GPU_MEMORY_MIB", "value": "6144"},
           {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=6144M,1=6144M"}]
    assert pod(job) == {
        "metadata": {"annotations": {}},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox", "env": env}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {}}, "env": env}],
            "affinity": PIN,
            "restartPolicy": "Never",
        },
    }


def test_cdi_mode_requests_the_cdi_names_in_the_pod_annotation_and_voids_the_variable() -> None:
    """cdi: the pod annotation cdi.k8s.io/gputask lists nvidia.com/gpu=<UUID> (MIG too), containers get
    NVIDIA_VISIBLE_DEVICES=void, and the pods the configured RuntimeClass; whole GPUs get no budget."""
    job = build_job(TASK, WHOLE, attempt=1, queue="q", pinning=Pinning("cdi", "nvidia-cdi"), request=GpuRequest(2))
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert pod(job) == {
        "metadata": {"annotations": {"cdi.k8s.io/gputask": f"nvidia.com/gpu={GPU_A},nvidia.com/gpu={MIG}"}},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox", "env": env}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {}}, "env": env}],
            "affinity": PIN,
            "restartPolicy": "Never",
            "runtimeClassName": "nvidia-cdi",
        },
    }


def test_envvar_mode_names_a_mig_device_by_its_uuid() -> None:
    """envvar: a MIG device is named in NVIDIA_VISIBLE_DEVICES by its MIG UUID, beside a full GPU's UUID."""
    job = build_job(TASK, WHOLE, attempt=1, queue="q", request=GpuRequest(2))
    assert job["spec"]["template"]["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": f"{GPU_A},{MIG}"}]


def test_a_templates_own_runtime_class_is_kept() -> None:
    """jobRuntimeClassName applies only where the task's template names no RuntimeClass."""
    task = copy.deepcopy(TASK)
    task["spec"]["template"]["spec"]["runtimeClassName"] = "kata-nvidia"
    job = build_job(task, SHARED, attempt=1, queue="q", pinning=Pinning("envvar", "nvidia"))
    assert job["spec"]["template"]["spec"]["runtimeClassName"] == "kata-nvidia"


def test_dra_mode_whole_gpus_claim_the_jobs_template_from_every_container() -> None:
    """dra, whole GPUs: the pod names the Job's ResourceClaimTemplate as claim gpus, every container uses it."""
    job = build_job(TASK, WHOLE, attempt=2, queue="q", pinning=Pinning("dra"), request=GpuRequest(2))
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    claims = {"claims": [{"name": "gpus"}]}
    assert pod(job) == {
        "metadata": {"annotations": {}},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox", "env": env, "resources": claims}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {}, **claims}, "env": env}],
            "affinity": PIN,
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "train-2"}],
        },
    }


def test_dra_mode_shared_gpus_use_the_namespaces_shared_claim_of_each_gpu() -> None:
    """dra, shared: one pod claim per GPU naming the shared claim gputask-<uuid>[-mps]; the budget is told too."""
    request = GpuRequest(2, memory_mib=8192, share_group="namespace ml, MPS")
    job = build_job(TASK, SHARED, attempt=1, queue="q", pinning=Pinning("dra"), request=request)
    spec = job["spec"]["template"]["spec"]
    assert (spec["resourceClaims"], spec["containers"][0]["resources"], spec["containers"][0]["env"][1:]) == (
        [{"name": "gpu-0", "resourceClaimName": f"gputask-{GPU_A.lower()}-mps"},
         {"name": "gpu-1", "resourceClaimName": f"gputask-{GPU_B.lower()}-mps"}],
        {"limits": {}, "claims": [{"name": "gpu-0"}, {"name": "gpu-1"}]},
        [{"name": "GPUTASK_GPU_MEMORY_MIB", "value": "6144"},
         {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=6144M,1=6144M"}],
    )


def test_the_claim_template_selects_each_device_by_uuid_in_its_class_v1_and_v1beta1() -> None:
    """A whole-GPU Job's template: one request per device, gpu.nvidia.com or mig.nvidia.com by UUID, owned by the
    task; v1 nests the request under exactly, v1beta1 does not."""
    gpu = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
           "selectors": [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{GPU_A}"'}}]}
    mig = {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
           "selectors": [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{MIG}"'}}]}
    meta = {"name": "train-2", "namespace": "ml",
            "labels": {"gputask.io/task": "train", "app.kubernetes.io/managed-by": "gputask"},
            "ownerReferences": [{"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "name": "train",
                                 "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]}
    templates = [dra.claim_template(TASK, "train-2", WHOLE, v) for v in ("v1", "v1beta1")]
    assert templates == [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": meta,
         "spec": {"spec": {"devices": {"requests": [{"name": "gpu-0", "exactly": gpu},
                                                    {"name": "gpu-1", "exactly": mig}]}}}},
        {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate", "metadata": meta,
         "spec": {"spec": {"devices": {"requests": [{"name": "gpu-0", **gpu}, {"name": "gpu-1", **mig}]}}}},
    ]


def test_shared_claims_carry_the_drivers_mps_config_and_time_sliced_ones_none() -> None:
    """An MPS shared claim has GpuConfig (MigDeviceConfig on a MIG device) sharing MPS; a time-sliced one none."""
    mps = GpuRequest(1, memory_mib=4096, share_group="namespace ml, MPS")
    sliced = GpuRequest(1, memory_mib=4096, share_group="namespace ml")
    claims = [dra.shared_claim("ml", MIG, mps, "v1"), dra.shared_claim("ml", GPU_A, sliced, "v1")]
    request = {"name": "gpu", "exactly": {
        "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "selectors": [{"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{MIG}"'}}]}}
    assert claims[0] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"gputask-{MIG.lower()}-mps", "namespace": "ml",
                     "labels": {"gputask.io/shared-gpu": MIG.lower(), "app.kubernetes.io/managed-by": "gputask"}},
        "spec": {"devices": {"requests": [request], "config": [{"requests": ["gpu"], "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
                           "sharing": {"strategy": "MPS"}}}}]}},
    }
    assert (claims[1]["metadata"]["name"], "config" in claims[1]["spec"]["devices"]) == (f"gputask-{GPU_A.lower()}",
                                                                                         False)


@pytest.mark.parametrize("mode", ["envvar", "cdi"])
def test_envvar_and_cdi_jobs_validate_on_every_supported_kubernetes(mode: str) -> None:
    """The envvar and cdi Jobs (shared MPS and whole, MIG included) validate strictly on Kubernetes 1.26 to 1.34."""
    pinning = Pinning(mode, "nvidia")  # type: ignore[arg-type]
    jobs = [build_job(TASK, SHARED, attempt=1, queue="q", pinning=pinning, request=MPS),
            build_job(TASK, WHOLE, attempt=1, queue="q", pinning=pinning, request=GpuRequest(2))]
    assert [validate(job, KUBERNETES) for job in jobs] == [[], []]


@pytest.mark.parametrize("version", ["v1beta1", "v1"])
def test_dra_jobs_and_objects_validate_where_their_api_version_is_served(version: str) -> None:
    """DRA Jobs, templates and shared claims validate strictly on each Kubernetes that serves their version."""
    shared = GpuRequest(2, memory_mib=4096, share_group="namespace ml, MPS")
    objects = [
        build_job(TASK, WHOLE, attempt=1, queue="q", pinning=Pinning("dra", "", version), request=GpuRequest(2)),
        build_job(TASK, SHARED, attempt=1, queue="q", pinning=Pinning("dra", "", version), request=shared),
        *dra.objects_for(TASK, "train-1", GpuRequest(2), WHOLE, version),
        *dra.objects_for(TASK, "train-1", shared, SHARED, version),
    ]
    assert [validate(obj, DRA_KUBERNETES[version]) for obj in objects] == [[]] * 5


def test_a_v1_claim_is_refused_by_the_schemas_of_kubernetes_that_do_not_serve_it() -> None:
    """The validation has teeth: a v1 template is unknown to 1.33, a v1beta1-shaped request invalid as v1."""
    template = dra.claim_template(TASK, "train-1", WHOLE, "v1beta1")
    template["apiVersion"] = "resource.k8s.io/v1"
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(dra.claim_template(TASK, "train-1", WHOLE, "v1"), "1.33.0", strict=True)
    assert validate(template, ["1.34.0"]) != []


def test_cdi_names_and_keys_follow_the_cdi_rules() -> None:
    """A UUID becomes nvidia.com/gpu=<UUID>; the old MIG form with '/' and an over-long key are refused."""
    assert cdi_device_name(MIG) == f"nvidia.com/gpu={MIG}"
    with pytest.raises(ValueError, match="not a valid CDI device name"):
        cdi_device_name("MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0")
    with pytest.raises(ValueError, match="not a CDI annotation key"):
        cdi_annotation([GPU_A], "cdi.k8s.io/" + "x" * 64)
    assert cdi_annotation([GPU_A, GPU_B]) == {"cdi.k8s.io/gputask": f"nvidia.com/gpu={GPU_A},nvidia.com/gpu={GPU_B}"}


def test_budgets_exist_for_shared_requests_only() -> None:
    """A shared request's budget is its smallest per-GPU MiB (MPS or not); whole GPUs get none."""
    budgets = [budget_of(GpuRequest(2, fraction_milli=250), SHARED), budget_of(MPS, SHARED),
               budget_of(GpuRequest(2), WHOLE)]
    assert budgets == [Budget(6144, 2), Budget(6144, 2, mps=True), None]


def test_kueue_mode_jobs_read_devices_and_budget_from_the_pod_set_update() -> None:
    """Kueue mode, cdi: containers get NVIDIA_VISIBLE_DEVICES=void and the budget through the downward API; the
    podSetUpdate annotations carry the CDI request and the budget; envvar carries the UUIDs instead."""
    job = build_kueue_job(TASK, attempt=1, queue="lq", pinning=Pinning("cdi", "nvidia-cdi"), request=MPS)
    spec = job["spec"]["template"]["spec"]

    def downward(name: str, key: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}

    assert (spec["runtimeClassName"], spec["containers"][0]["env"]) == ("nvidia-cdi", [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        downward("GPUTASK_GPU_MEMORY_MIB", "gputask.io/gpu-memory-mib"),
        downward("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "gputask.io/mps-pinned-device-mem-limit"),
    ])
    placement = f'{{"node":"node-a","uuids":["{GPU_A}","{GPU_B}"],"indices":[0,1],"memoryMiB":[8192,6144]}}'
    assert [pod_set_annotations(SHARED, Pinning(mode), MPS) for mode in ("cdi", "envvar")] == [
        {"gputask.io/placement": placement, "cdi.k8s.io/gputask": f"nvidia.com/gpu={GPU_A},nvidia.com/gpu={GPU_B}",
         "gputask.io/gpu-memory-mib": "6144", "gputask.io/mps-pinned-device-mem-limit": "0=6144M,1=6144M"},
        {"gputask.io/placement": placement, "gputask.io/visible-devices": f"{GPU_A},{GPU_B}",
         "gputask.io/gpu-memory-mib": "6144", "gputask.io/mps-pinned-device-mem-limit": "0=6144M,1=6144M"},
    ]
    assert validate(job, KUBERNETES) == []
