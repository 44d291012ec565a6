"""Beside Kueue and plain GPU pods: foreign GPU use, Kueue conflicts, Kueue labels and Kueue mode."""

from __future__ import annotations

from typing import Any

from gputask.config import Config
from gputask.k8s.client import (
    ADMISSIONCHECKS,
    JOBS,
    LOCALQUEUES,
    PODS,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
)
from harness import REPO, Cluster, eventually, gputask, job_of, running_operator

KUEUE_CRDS = REPO / "tests" / "fixtures" / "kueue-crds"
FAST = Config(cycleInterval=0.2)
KUEUE_MODE = Config(cycleInterval=0.2, queueing="kueue")
A10 = "NVIDIA-A10"



def placement_of(job: dict[str, Any]) -> str:
    """A Job's placement annotation."""
    return str(job["metadata"]["annotations"]["gputask.io/placement"])


def foreign_pod(name: str, node: str, container: dict[str, Any]) -> dict[str, Any]:
    """A pod gputask did not create, bound to ``node``, with one container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda", **container}]},
    }


def condition(task: dict[str, Any], ctype: str) -> tuple[str, str, str] | None:
    """(status, reason, message) of a GPUTask condition, or None."""
    for cond in (task.get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return cond["status"], cond["reason"], cond["message"]
    return None


# -- foreign GPU use --------------------------------------------------------------------------------
async def test_foreign_pod_requesting_a_gpu_sends_the_task_to_another_node(cluster: Cluster) -> None:
    """A running pod with nvidia.com/gpu: 1 on node-a (one GPU each) makes gputask place the task on node-b."""
    await cluster.add_node("node-a", ("GPU-a", A10, "24Gi"))
    await cluster.add_node("node-b", ("GPU-b", A10, "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, FAST) as op:
        pod = foreign_pod("plain", "node-a", {"resources": {"limits": {"nvidia.com/gpu": 1}}})
        await cluster.client.create(PODS, pod, "default")

        async def seen() -> bool:
            return bool(op.controller.foreign.claims_on("node-a"))

        await eventually(seen)
        await cluster.submit(gputask("train", gpuMemory="4Gi"))
        job = await eventually(lambda: job_of(cluster, "train-1"))
    assert placement_of(job) == '{"node":"node-b","uuids":["GPU-b"],"indices":[0],"memoryMiB":[4096]}'


async def test_foreign_pod_pinning_gpu_0_leaves_gpu_1_to_gputask(cluster: Cluster) -> None:
    """A pod (there before the operator) with NVIDIA_VISIBLE_DEVICES=<uuid of GPU 0> makes gputask use GPU 1."""
    await cluster.add_node("node-a", ("GPU-0", A10, "24Gi"), ("GPU-1", A10, "24Gi"))
    await cluster.add_queue()
    pod = foreign_pod("pinned", "node-a", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-0"}]})
    await cluster.client.create(PODS, pod, "default")
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("train", gpuMemory="4Gi"))
        job = await eventually(lambda: job_of(cluster, "train-1"))
    assert placement_of(job) == '{"node":"node-a","uuids":["GPU-1"],"indices":[1],"memoryMiB":[4096]}'


# -- gputask mode beside Kueue ----------------------------------------------------------------------
async def test_default_local_queue_produces_the_kueue_conflict_condition_and_event(cluster: Cluster) -> None:
    """A LocalQueue named default in the task's namespace gives the task KueueConflict=True and a Warning Event."""
    cluster.server.install_crds_from(KUEUE_CRDS)
    await cluster.add_node("node-a", ("GPU-a", A10, "24Gi"))
    await cluster.add_queue()
    local_queue = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "default"}}
    await cluster.client.create(LOCALQUEUES, {**local_queue, "spec": {"clusterQueue": "cq"}}, "default")
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("train"))

        async def conflict() -> tuple[str, str, str] | None:
            return condition(await cluster.task("train"), "KueueConflict")

        message = (
            "Kueue would suspend the Jobs gputask emits: namespace 'default' has a LocalQueue named 'default'. "
            "To fix it, exclude the namespace from Kueue's managedJobsNamespaceSelector, remove the LocalQueue "
            "'default' from it, or run gputask with `queueing: kueue`"
        )

        async def warned() -> bool:  # the Event is posted once the status write has landed, so a moment later
            return ("Warning", "KueueWouldSuspendJob", message) in await cluster.events_for("train")

        found = await eventually(conflict)
        assert await eventually(warned)
    assert found == ("True", "KueueWouldSuspendJob", message)


async def test_a_job_kueue_suspended_is_explained_on_its_task(cluster: Cluster) -> None:
    """When Kueue suspends a Job gputask emitted, the task says so with reason JobSuspendedByKueue."""
    cluster.server.install_crds_from(KUEUE_CRDS)
    await cluster.add_node("node-a", ("GPU-a", A10, "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("train"))
        await eventually(lambda: job_of(cluster, "train-1"))
        suspend = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "default"}}, "spec": {"suspend": True}}
        await cluster.client.patch(JOBS, "train-1", suspend, "default")

        async def explained() -> tuple[str, str, str] | None:
            found = condition(await cluster.task("train"), "KueueConflict")
            return found if found and found[1] == "JobSuspendedByKueue" else None

        found = await eventually(explained)
    assert found == (
        "True",
        "JobSuspendedByKueue",
        "Kueue suspended Job train-1 through LocalQueue 'default'; it will not start until Kueue admits it: "
        "exclude the namespace from Kueue's managedJobsNamespaceSelector, remove the LocalQueue 'default' "
        "from it, or run gputask with `queueing: kueue`",
    )


async def test_kueue_labels_name_the_queue_and_the_workload_priority_class(cluster: Cluster) -> None:
    """A task with only Kueue's labels is admitted to that queue with the WorkloadPriorityClass's value."""
    cluster.server.install_crds_from(KUEUE_CRDS)
    await cluster.add_node("node-a", ("GPU-a", A10, "24Gi"))
    await cluster.add_queue("team-a")
    wpc = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": "high"}}
    await cluster.client.create(WORKLOADPRIORITYCLASSES, {**wpc, "value": 1000})
    body = gputask("train")
    del body["spec"]["queueName"]
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}
    async with running_operator(cluster, FAST):
        await cluster.submit(body)
        job = await eventually(lambda: job_of(cluster, "train-1"))

        async def admitted() -> dict[str, Any] | None:
            status = (await cluster.task("train")).get("status") or {}
            return status if status.get("phase") == "Admitted" else None

        status = await eventually(admitted)
    assert (job["metadata"]["labels"], status["priority"]) == (
        {"gputask.io/task": "train", "gputask.io/queue": "team-a"},
        1000,
    )


# -- Kueue mode -------------------------------------------------------------------------------------
async def workload_for(cluster: Cluster, job_name: str) -> str:
    """Create the Workload Kueue would make for a Job, with quota reserved and our check Pending; its name."""
    job = await cluster.client.get(JOBS, job_name, "default")
    name = f"job-{job_name}-0a1b2"
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job_name,
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [owner]},
        "spec": {"queueName": "team-a", "podSets": [{"name": "main", "count": 1, "template": job["spec"]["template"]}]},
    }
    await cluster.client.create(WORKLOADS, body, "default")
    await set_check(cluster, name, "Pending", reserved=True)
    return name


async def set_check(cluster: Cluster, name: str, state: str, *, reserved: bool, finished: bool = False) -> None:
    """Write a Workload's status as Kueue would: QuotaReserved, admission, Finished and our check's state."""
    conditions = [{"type": "QuotaReserved", "status": str(reserved), "reason": "QuotaReserved", "message": ""}]
    if finished:
        conditions.append({"type": "Finished", "status": "True", "reason": "Succeeded", "message": ""})
    status = {
        "conditions": conditions,
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "main", "count": 1}]} if reserved else None,
        "admissionChecks": [
            {"name": "gputask-placement", "state": state, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ],
    }
    await cluster.client.patch(WORKLOADS, name, {"status": status}, "default", status=True)


async def check_of(cluster: Cluster, name: str, state: str) -> dict[str, Any] | None:
    """Our admissionChecks entry of a Workload once it is in ``state`` (lastTransitionTime dropped)."""
    wl = await cluster.client.get(WORKLOADS, name, "default")
    for check in (wl.get("status") or {}).get("admissionChecks") or []:
        if check["name"] == "gputask-placement" and check["state"] == state:
            return {k: v for k, v in check.items() if k != "lastTransitionTime"}
    return None


def kueue_cluster_setup(cluster: Cluster) -> None:
    """Install the Kueue CRDs (before the operator starts, so kopf watches Workloads at once)."""
    cluster.server.install_crds_from(KUEUE_CRDS)


async def test_kueue_mode_emits_a_suspended_job_labelled_for_kueue(cluster: Cluster) -> None:
    """In Kueue mode the Job is emitted at once: suspended, queue-name label, no affinity, downward-API devices and
    memory budget (the task shares a GPU)."""
    kueue_cluster_setup(cluster)
    async with running_operator(cluster, KUEUE_MODE) as op:
        task = await cluster.submit(gputask("train", queueName="team-a", gpuMemory="10Gi"))
        job = await eventually(lambda: job_of(cluster, "train-1"))
        check = await cluster.client.get(ADMISSIONCHECKS, "gputask-placement")
    uid = task["metadata"]["uid"]
    labels = {"gputask.io/task": "train", "gputask.io/queue": "team-a"}
    devices = {"fieldRef": {"fieldPath": "metadata.annotations['gputask.io/visible-devices']"}}
    budget = {"fieldRef": {"fieldPath": "metadata.annotations['gputask.io/gpu-memory-mib']"}}
    owner = {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUTask",
        "name": "train",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    meta = job["metadata"]
    assert {
        "metadata": {k: meta[k] for k in ("name", "labels", "annotations", "ownerReferences")},
        "spec": job["spec"],
    } == {
        "metadata": {
            "name": "train-1",
            "labels": {**labels, "kueue.x-k8s.io/queue-name": "team-a"},
            "annotations": {"gputask.io/attempt": "1", "gputask.io/task-uid": uid},
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": 0,
            "suspend": True,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox:1.36",
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": devices},
                                    {"name": "GPUTASK_GPU_MEMORY_MIB", "valueFrom": budget}],
                        }
                    ],
                    "restartPolicy": "Never",
                },
            },
        },
    }
    assert ((check["spec"]), [(c["type"], c["status"]) for c in check["status"]["conditions"]]) == (
        {"controllerName": "gputask.io/placement"},
        [("Active", "True")],
    )
    assert op.controller.scheduler.pending.count_by_queue() == {}  # Kueue admits, not gputask's queues


async def test_kueue_mode_answers_a_reserved_workload_with_pod_set_updates(cluster: Cluster) -> None:
    """A Workload with reserved quota and the check Pending gets Ready with the node and GPUs that fit."""
    kueue_cluster_setup(cluster)
    await cluster.add_node("node-a", ("GPU-small", A10, "8Gi"), ("GPU-big", A10, "24Gi"))
    async with running_operator(cluster, KUEUE_MODE):
        await cluster.submit(gputask("train", queueName="team-a", gpuMemory="10Gi"))
        await eventually(lambda: job_of(cluster, "train-1"))
        name = await workload_for(cluster, "train-1")

        async def ready() -> dict[str, Any] | None:
            return await check_of(cluster, name, "Ready")

        async def placed() -> dict[str, Any] | None:  # the status write may land after the check's
            task = await cluster.task("train")
            return task if (task.get("status") or {}).get("placement") else None

        check = await eventually(ready)
        task = await eventually(placed)
    placement = '{"node":"node-a","uuids":["GPU-big"],"indices":[1],"memoryMiB":[10240]}'
    assert check == {
        "name": "gputask-placement",
        "state": "Ready",
        "message": "placed on node-a GPUs [1] (10240 MiB each)",
        "podSetUpdates": [
            {
                "name": "main",
                "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "annotations": {"gputask.io/placement": placement, "gputask.io/visible-devices": "GPU-big",
                                "gputask.io/gpu-memory-mib": "10240"},
            }
        ],
    }
    assert (task["status"]["phase"], task["status"]["placement"]) == (
        "Admitted",
        {"node": "node-a", "gpus": [{"index": 1, "uuid": "GPU-big", "memory": 10240}]},
    )


async def test_kueue_mode_with_cdi_pinning_puts_the_cdi_request_in_the_pod_set_update(cluster: Cluster) -> None:
    """Kueue mode with pinning cdi: the suspended Job runs in the RuntimeClass with NVIDIA_VISIBLE_DEVICES=void and
    reads its MPS budget from annotations; the Ready check's podSetUpdate carries the CDI annotation and the budget
    (pinning dra is refused with Kueue by the configuration, test_config)."""
    kueue_cluster_setup(cluster)
    await cluster.add_node("node-a", ("GPU-big", A10, "24Gi"))
    config = Config(cycleInterval=0.2, queueing="kueue", pinning="cdi", jobRuntimeClassName="nvidia-cdi")
    async with running_operator(cluster, config):
        await cluster.submit(gputask("train", queueName="team-a", gpuMemory="10Gi", gpuSharing="MPS"))
        job = await eventually(lambda: job_of(cluster, "train-1"))
        name = await workload_for(cluster, "train-1")

        async def ready() -> dict[str, Any] | None:
            return await check_of(cluster, name, "Ready")

        check = await eventually(ready)
    spec = job["spec"]["template"]["spec"]
    downward = [e["valueFrom"]["fieldRef"]["fieldPath"] for e in spec["containers"][0]["env"][1:]]
    assert (spec["runtimeClassName"], spec["containers"][0]["env"][0], downward) == (
        "nvidia-cdi", {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        ["metadata.annotations['gputask.io/gpu-memory-mib']",
         "metadata.annotations['gputask.io/mps-pinned-device-mem-limit']"],
    )
    annotations = check["podSetUpdates"][0]["annotations"]
    del annotations["gputask.io/placement"]
    assert annotations == {"cdi.k8s.io/gputask": "nvidia.com/gpu=GPU-big", "gputask.io/gpu-memory-mib": "10240",
                           "gputask.io/mps-pinned-device-mem-limit": "0=10240M"}


async def test_kueue_mode_answers_retry_when_no_gpu_has_room_then_ready_once_it_has(cluster: Cluster) -> None:
    """A second whole-GPU Workload gets Retry with the reason; after the first finishes and Kueue asks again, Ready."""
    kueue_cluster_setup(cluster)
    await cluster.add_node("node-a", ("GPU-a", A10, "24Gi"))
    async with running_operator(cluster, KUEUE_MODE):
        await cluster.submit(gputask("first", queueName="team-a"))
        await cluster.submit(gputask("second", queueName="team-a"))
        await eventually(lambda: job_of(cluster, "second-1"))
        first = await workload_for(cluster, "first-1")
        await eventually(lambda: check_of(cluster, first, "Ready"))
        second = await workload_for(cluster, "second-1")

        async def retry() -> dict[str, Any] | None:
            return await check_of(cluster, second, "Retry")

        assert await eventually(retry) == {
            "name": "gputask-placement",
            "state": "Retry",
            "message": "0/1 nodes fit: 1 no idle GPU; Kueue requeues the Workload and asks again",
        }
        await set_check(cluster, first, "Ready", reserved=True, finished=True)
        await set_check(cluster, second, "Pending", reserved=True)

        async def ready() -> dict[str, Any] | None:
            return await check_of(cluster, second, "Ready")

        check = await eventually(ready)
    assert check["podSetUpdates"][0]["annotations"]["gputask.io/visible-devices"] == "GPU-a"


async def test_kueue_mode_restart_keeps_the_gpus_of_ready_workloads(cluster: Cluster) -> None:
    """A restarted operator re-reserves the placement of a Workload it answered Ready: the next one gets Retry."""
    kueue_cluster_setup(cluster)
    await cluster.add_node("node-a", ("GPU-a", A10, "24Gi"))
    async with running_operator(cluster, KUEUE_MODE):
        await cluster.submit(gputask("first", queueName="team-a"))
        await eventually(lambda: job_of(cluster, "first-1"))
        first = await workload_for(cluster, "first-1")
        await eventually(lambda: check_of(cluster, first, "Ready"))
    async with running_operator(cluster, KUEUE_MODE) as op:
        await cluster.submit(gputask("second", queueName="team-a"))
        await eventually(lambda: job_of(cluster, "second-1"))
        second = await workload_for(cluster, "second-1")

        async def retry() -> dict[str, Any] | None:
            return await check_of(cluster, second, "Retry")

        await eventually(retry)
        assert await job_names(cluster) == ["first-1", "second-1"]
        assert op.kueue.admission.held == {f"default/{first}": "default/first"}


async def job_names(cluster: Cluster) -> list[str]:
    """Names of the Jobs in namespace default, sorted."""
    return sorted(j["metadata"]["name"] for j in await cluster.client.list(JOBS, "default"))
