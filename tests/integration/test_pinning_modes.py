"""Pinning modes through the real operator against the emulator: what each mode emits, the start-up check, and
what happens when the configured mode cannot work."""

from __future__ import annotations

from typing import Any

import pytest

from gputask.config import Config
from gputask.k8s import executor, pinner
from gputask.k8s.client import (
    DEVICECLASSES,
    EVENTS,
    GPUNODES,
    JOBS,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RUNTIMECLASSES,
    at_version,
)
from harness import Cluster, eventually, gpunode, gputask, job_of, running_operator

H100 = "NVIDIA-H100-80GB-HBM3"
GPU_0, GPU_1 = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-1d0e7b0a-2c53-4f2e-9b5e-77c1a0e3c111"
MIG = "MIG-5c4b2c1d-7d3e-5f7a-8b9c-0d1e2f3a4b5c"
OWN_POD = {"POD_NAME": "gputask-operator-7d9f", "POD_NAMESPACE": "gputask-system"}


@pytest.fixture(autouse=True)
def in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator runs in a Pod (the chart's POD_NAME and POD_NAMESPACE), so its check posts an Event there."""
    for name, value in OWN_POD.items():
        monkeypatch.setenv(name, value)



async def operator_events(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events on the operator's own Pod."""
    events = await cluster.client.list(EVENTS, OWN_POD["POD_NAMESPACE"])
    return [(e["type"], e["reason"], e["message"]) for e in events
            if e["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": OWN_POD["POD_NAME"],
                                       "namespace": OWN_POD["POD_NAMESPACE"]}]


async def add_class(cluster: Cluster, name: str, version: str = "v1") -> None:
    """A DeviceClass as the NVIDIA DRA driver's chart installs it (its selector is not read by gputask)."""
    selector = {"cel": {"expression": f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type"
                                      f" == '{name.split('.')[0]}'"}}
    body = {"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [selector]}}
    await cluster.client.create(at_version(DEVICECLASSES, version), body)


async def add_runtime_class(cluster: Cluster, name: str) -> None:
    """A node.k8s.io/v1 RuntimeClass whose handler has the same name."""
    await cluster.client.create(RUNTIMECLASSES, {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                 "metadata": {"name": name}, "handler": name})


def supported(op: Any) -> dict[str, float | None]:
    """gputask_pinning_mode_supported per mode (None: not exported)."""
    registry = op.metrics.registry
    return {m: registry.get_sample_value("gputask_pinning_mode_supported", {"mode": m}) for m in ("envvar", "cdi",
                                                                                                  "dra")}


async def test_envvar_mode_pins_by_uuid_and_tells_an_mps_task_its_budget(cluster: Cluster) -> None:
    """The default mode: NVIDIA_VISIBLE_DEVICES with the UUID, the budget variables of an MPS task, and the start-up
    check said as one Event and the gauges (dra cannot work: resource.k8s.io is not served)."""
    await cluster.add_node("node-a", (GPU_0, H100, "80Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2)) as op:
        await cluster.submit(gputask("infer", gpuMemory="20Gi", gpuSharing="MPS"))
        job = await eventually(lambda: job_of(cluster, "infer-1"))
        gauges = supported(op)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": GPU_0},
                   {"name": "GPUTASK_GPU_MEMORY_MIB", "value": "20480"},
                   {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=20480M"}]
    assert gauges == {"envvar": 1.0, "cdi": 1.0, "dra": 0.0}
    [(etype, reason, message)] = await operator_events(cluster)
    assert (etype, reason, message.split("; ")[0]) == ("Normal", "PinningChecked", "GPU pinning 'envvar' can work")


async def test_cdi_mode_annotates_the_pod_with_cdi_names_and_runs_it_in_the_runtime_class(cluster: Cluster) -> None:
    """cdi: the Job's pods carry cdi.k8s.io/gputask with nvidia.com/gpu=<UUID>, NVIDIA_VISIBLE_DEVICES=void and
    the configured RuntimeClass, which exists."""
    await add_runtime_class(cluster, "nvidia-cdi")
    await cluster.add_node("node-a", (GPU_0, H100, "80Gi"), (GPU_1, H100, "80Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2, pinning="cdi", jobRuntimeClassName="nvidia-cdi")):
        await cluster.submit(gputask("train", gpus=2))
        job = await eventually(lambda: job_of(cluster, "train-1"))
    template = job["spec"]["template"]
    assert (template["metadata"]["annotations"]["cdi.k8s.io/gputask"], template["spec"]["runtimeClassName"],
            template["spec"]["containers"][0]["env"]) == (
        f"nvidia.com/gpu={GPU_0},nvidia.com/gpu={GPU_1}", "nvidia-cdi",
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])


async def test_a_missing_runtime_class_is_said_loudly_and_holds_admissions_until_it_exists(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jobRuntimeClassName naming no RuntimeClass: a Warning Event, gauge 0, the task waits PinningUnavailable
    with no Job; once the RuntimeClass exists the next retry admits it."""
    monkeypatch.setattr(pinner, "RECHECK_S", 0.0)
    monkeypatch.setattr(executor, "BACKOFF_BASE_S", 0.3)
    await cluster.add_node("node-a", (GPU_0, H100, "80Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2, pinning="cdi", jobRuntimeClassName="nvidia")) as op:
        await cluster.submit(gputask("train"))

        async def waiting() -> dict[str, Any] | None:
            task = await cluster.task("train")
            conditions = (task.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "Admitted" and c["reason"] == "PinningUnavailable"),
                        None)

        condition = await eventually(waiting)
        held = (await job_of(cluster, "train-1"), supported(op)["cdi"])
        await add_runtime_class(cluster, "nvidia")
        job = await eventually(lambda: job_of(cluster, "train-1"))
    assert held == (None, 0.0)
    assert condition["message"].startswith("GPU pinning 'cdi' cannot work in this cluster: RuntimeClass 'nvidia' "
                                           "(jobRuntimeClassName) does not exist; retried in 0.3s")
    assert job["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    [(etype, reason, message)] = await operator_events(cluster)
    assert (etype, reason, message.split("; ")[0]) == ("Warning", "PinningUnsupported", "GPU pinning 'cdi' CANNOT WORK")


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_dra_mode_whole_gpus_get_a_claim_template_made_before_the_job(cluster: Cluster, version: str) -> None:
    """dra at the version the cluster serves: a ResourceClaimTemplate named after the Job, owned by the task,
    selecting the GPU and the MIG device by UUID in their DeviceClasses; the Job's pods claim it."""
    cluster.server.emulator.serve_dra((version,))
    await add_class(cluster, "gpu.nvidia.com", version)
    await add_class(cluster, "mig.nvidia.com", version)
    await cluster.add_node("node-a", (GPU_0, H100, "80Gi"), (GPU_1, H100, "80Gi"))
    status = gpunode("node-a", (GPU_0, H100, "80Gi"), (GPU_1, H100, "80Gi"))["status"]  # GPU 1 in MIG mode
    status["gpus"][1] |= {"healthy": False, "reason": "MIG mode is enabled"}
    status["gpus"].append({"index": 200, "uuid": MIG, "product": "NVIDIA-H100-MIG-1g.10gb", "memory": "9984Mi",
                           "memoryUsed": "0", "healthy": True,
                           "mig": {"parentIndex": 1, "parentUUID": GPU_1, "profile": "1g.10gb"}})
    await cluster.client.patch(GPUNODES, "node-a", {"status": status}, status=True)
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2, pinning="dra")) as op:
        # a MIG device takes only tasks that name its product
        task = await cluster.submit(gputask("train", gpus=2, gpuProducts=[H100, "NVIDIA-H100-MIG-1g.10gb"]))
        job = await eventually(lambda: job_of(cluster, "train-1"))
        template = await cluster.client.get(at_version(RESOURCECLAIMTEMPLATES, version), "train-1", "default")
        gauges = supported(op)
    requests = template["spec"]["spec"]["devices"]["requests"]
    classes = [(r.get("exactly") or r)["deviceClassName"] for r in requests]
    selectors = [(r.get("exactly") or r)["selectors"][0]["cel"]["expression"] for r in requests]
    assert (template["apiVersion"], template["metadata"]["ownerReferences"][0]["uid"], classes, selectors) == (
        f"resource.k8s.io/{version}", task["metadata"]["uid"], ["gpu.nvidia.com", "mig.nvidia.com"],
        [f'device.attributes["gpu.nvidia.com"].uuid == "{GPU_0}"',
         f'device.attributes["gpu.nvidia.com"].uuid == "{MIG}"'])
    spec = job["spec"]["template"]["spec"]
    assert (spec["resourceClaims"], spec["containers"][0]["resources"]) == (
        [{"name": "gpus", "resourceClaimTemplateName": "train-1"}], {"claims": [{"name": "gpus"}]})
    assert template["metadata"]["creationTimestamp"] <= job["metadata"]["creationTimestamp"]
    assert gauges == {"envvar": 1.0, "cdi": 1.0, "dra": 1.0}


async def test_dra_mode_shares_a_gpu_through_one_claim_per_namespace_and_deletes_it_when_unused(
    cluster: Cluster,
) -> None:
    """dra, shared: two MPS tasks of one namespace share GPU 0 through one claim with the driver's MPS config; a
    task of another namespace does not join them (it takes GPU 1, its own claim); once both tasks of the first
    namespace finish, their claim is deleted and the other stays."""
    cluster.server.emulator.serve_dra(("v1",))
    await add_class(cluster, "gpu.nvidia.com")
    await cluster.add_node("node-a", (GPU_0, H100, "80Gi"), (GPU_1, H100, "80Gi"))
    await cluster.add_queue(local_in=("default", "ml"))
    claims = at_version(RESOURCECLAIMS, "v1")
    async with running_operator(cluster, Config(cycleInterval=0.2, pinning="dra")):
        await cluster.submit(gputask("a", gpuMemory="10Gi", gpuSharing="MPS"))
        await cluster.submit(gputask("b", gpuMemory="10Gi", gpuSharing="MPS"))
        jobs = [await eventually(lambda n=n: job_of(cluster, n)) for n in ("a-1", "b-1")]
        await cluster.submit(gputask("c", namespace="ml", gpuMemory="10Gi", gpuSharing="MPS"))
        other = await eventually(lambda: job_of(cluster, "c-1", "ml"))
        before = sorted((c["metadata"]["namespace"], c["metadata"]["name"]) for c in await cluster.client.list(claims))
        mps = (await cluster.client.get(claims, f"gputask-{GPU_0.lower()}-mps", "default"))["spec"]["devices"]["config"]
        done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
        for name in ("a-1", "b-1"):
            await cluster.client.patch(JOBS, name, done, "default", status=True)

        async def collected() -> list[tuple[str, str]] | None:
            left = sorted((c["metadata"]["namespace"], c["metadata"]["name"])
                          for c in await cluster.client.list(claims))
            return left if len(left) == 1 else None

        after = await eventually(collected)
    assert [j["spec"]["template"]["spec"]["resourceClaims"] for j in jobs] == [
        [{"name": "gpu-0", "resourceClaimName": f"gputask-{GPU_0.lower()}-mps"}]] * 2
    assert other["spec"]["template"]["spec"]["resourceClaims"] == [
        {"name": "gpu-0", "resourceClaimName": f"gputask-{GPU_1.lower()}-mps"}]
    assert before == [("default", f"gputask-{GPU_0.lower()}-mps"), ("ml", f"gputask-{GPU_1.lower()}-mps")]
    assert mps == [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}}}]
    assert after == [("ml", f"gputask-{GPU_1.lower()}-mps")]


async def test_dra_mode_without_the_api_keeps_tasks_waiting_with_the_reason(cluster: Cluster) -> None:
    """pinning dra where resource.k8s.io is not served: no Job, the task waits PinningUnavailable saying why."""
    await cluster.add_node("node-a", (GPU_0, H100, "80Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2, pinning="dra")):
        await cluster.submit(gputask("train"))

        async def reason() -> tuple[str, str] | None:
            status = (await cluster.task("train")).get("status") or {}
            admitted = next((c for c in status.get("conditions") or [] if c["type"] == "Admitted"), None)
            return (admitted["reason"], admitted["message"]) if admitted else None

        found = await eventually(reason)
        job = await job_of(cluster, "train-1")
    assert (job, found[0], found[1].split("; retried")[0]) == (
        None, "PinningUnavailable", "GPU pinning 'dra' cannot work in this cluster: resource.k8s.io is served at "
        "neither v1 nor v1beta1 (Kubernetes 1.34+, or 1.32/1.33 with --runtime-config=resource.k8s.io/v1beta1=true "
        "and the DynamicResourceAllocation feature gate)")


async def test_a_restarted_dra_operator_deletes_the_templates_of_jobs_that_are_gone(cluster: Cluster) -> None:
    """A new leader lists gputask's ResourceClaimTemplates and deletes those whose Job does not exist."""
    cluster.server.emulator.serve_dra(("v1",))
    await add_class(cluster, "gpu.nvidia.com")
    templates = at_version(RESOURCECLAIMTEMPLATES, "v1")
    stray = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "gone-3", "namespace": "default",
                          "labels": {"app.kubernetes.io/managed-by": "gputask"}},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpu-0", "exactly": {
                 "deviceClassName": "gpu.nvidia.com"}}]}}}}
    await cluster.client.create(templates, stray, "default")
    async with running_operator(cluster, Config(cycleInterval=0.2, pinning="dra")):

        async def cleaned() -> bool:
            return not await cluster.client.list(templates, "default")

        await eventually(cleaned)
