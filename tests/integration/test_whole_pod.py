"""Admission is the whole pod's placement, through the real operator on the API emulator: a task whose
pod no node could take waits with kube-scheduler's per-node count, and is admitted once a node fits."""

from __future__ import annotations

import re
from typing import Any

from gputask.k8s.client import JOBS, NODES, PODS
from harness import Cluster, eventually, gputask, running_operator

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
INFRA = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}


async def add_node(cluster: Cluster, name: str, gpus: int, *, taints: list[dict[str, str]] | None = None,
                   cpu: str = "8", memory: str = "32Gi") -> None:
    """A Ready Node with allocatable cpu, memory and 110 pods, ``taints``, and a GPUNode of 24Gi A10s."""
    await cluster.add_node(name, *[(f"GPU-{name}-{i}", "NVIDIA-A10", "24Gi") for i in range(gpus)])
    await cluster.client.patch(NODES, name, {"spec": {"taints": taints or []}})
    await set_allocatable(cluster, name, cpu, memory)


async def set_allocatable(cluster: Cluster, name: str, cpu: str, memory: str) -> None:
    """Write the Node's status.allocatable as the kubelet does."""
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    await cluster.client.patch(NODES, name, {"status": {"allocatable": allocatable, "capacity": allocatable}},
                               status=True)


def pod(**spec: Any) -> dict[str, Any]:
    """A pod template with one busybox container and these pod spec fields."""
    return {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec}}


async def wait_of(cluster: Cluster, name: str) -> tuple[str, str] | None:
    """(Admitted reason, message without the queue position) while the task is Pending."""
    status = (await cluster.task(name)).get("status") or {}
    admitted = next((c for c in status.get("conditions") or [] if c["type"] == "Admitted"), None)
    if status.get("phase") != "Pending" or admitted is None:
        return None
    return admitted["reason"], re.sub(r" \(position \d+ in GPUClusterQueue '\w+'\)$", "", admitted["message"])


async def node_of(cluster: Cluster, name: str) -> str | None:
    """The node a task was placed on, once it has one."""
    return (((await cluster.task(name)).get("status") or {}).get("placement") or {}).get("node")


async def test_unplaceable_pods_wait_with_the_reason_then_run_once_a_node_fits(cluster: Cluster) -> None:
    """The issue's four cases: too much CPU and memory, a nodeSelector no node has, an untolerated taint,
    a NotReady taint. Each waits naming every node's filter; untainting, labelling and more allocatable
    admit them, each where its pod can really run."""
    await add_node(cluster, "node-a", 2)
    await add_node(cluster, "node-b", 2, taints=[INFRA])
    await add_node(cluster, "node-c", 1, taints=[NOT_READY])
    await cluster.add_queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": "8"}])
    async with running_operator(cluster):
        await cluster.submit(gputask("filler", gpus=2))
        assert await eventually(lambda: node_of(cluster, "filler")) == "node-a"
        big = {"requests": {"cpu": "500", "memory": "4Ti"}}
        await cluster.submit(gputask("big", template={"spec": {"containers": [
            {"name": "main", "image": "busybox:1.36", "resources": big}]}}))
        await cluster.submit(gputask("moon", template=pod(nodeSelector={"zone": "moon"})))
        await cluster.submit(gputask("plain"))
        taints = "1 had untolerated taint {dedicated: infra}, 1 had untolerated taint {node.kubernetes.io/not-ready: }"
        # 'Could ever' judges node-c without its NotReady taint, which Kubernetes lifts when the node is Ready.
        assert await eventually(lambda: wait_of(cluster, "big")) == (
            "Inadmissible", "no node could ever hold it: 0/3 nodes fit: 2 insufficient cpu, 2 insufficient memory, "
                            "1 had untolerated taint {dedicated: infra}")
        assert await eventually(lambda: wait_of(cluster, "moon")) == (
            "Inadmissible", "no node could ever hold it: 0/3 nodes fit: 2 did not match nodeSelector, "
                            "1 had untolerated taint {dedicated: infra}")
        assert await eventually(lambda: wait_of(cluster, "plain")) == (
            "NoFit", f"0/3 nodes fit: {taints}, 1 no idle GPU")
        await cluster.client.patch(NODES, "node-b", {"spec": {"taints": []}})
        assert await eventually(lambda: node_of(cluster, "plain")) == "node-b"
        await cluster.client.patch(NODES, "node-c", {"metadata": {"labels": {"zone": "moon"}}, "spec": {"taints": []}})
        assert await eventually(lambda: node_of(cluster, "moon")) == "node-c"
        await set_allocatable(cluster, "node-b", "600", "5Ti")
        assert await eventually(lambda: node_of(cluster, "big")) == "node-b"
        job = await cluster.client.get(JOBS, "moon-1", "default")
        pod_spec = job["spec"]["template"]["spec"]
        terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert (pod_spec["nodeSelector"], terms["nodeSelectorTerms"]) == (
            {"zone": "moon"}, [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-c"]}]}])


async def test_foreign_pods_take_their_requests_and_a_new_taint_stops_placements(cluster: Cluster) -> None:
    """A DaemonSet-like pod bound to the node takes its CPU from what gputask offers; a taint added later
    keeps the next task off the node while the running one stays."""
    await add_node(cluster, "node-a", 2, cpu="8")
    await cluster.add_queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": "8"}])
    foreign = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent", "namespace": "default"},
               "spec": {"nodeName": "node-a", "containers": [
                   {"name": "agent", "image": "x", "resources": {"requests": {"cpu": "7"}}}]}}
    await cluster.client.create(PODS, foreign, "default")
    heavy = {"spec": {"containers": [{"name": "main", "image": "busybox:1.36",
                                      "resources": {"requests": {"cpu": "2"}}}]}}
    async with running_operator(cluster):
        await cluster.submit(gputask("heavy", gpuMemory="4Gi", template=heavy))
        assert await eventually(lambda: wait_of(cluster, "heavy")) == ("NoFit", "0/1 nodes fit: 1 insufficient cpu")
        await cluster.client.delete(PODS, "agent", "default")
        assert await eventually(lambda: node_of(cluster, "heavy")) == "node-a"
        await cluster.client.patch(NODES, "node-a", {"spec": {"taints": [INFRA]}})
        await cluster.submit(gputask("next", gpuMemory="4Gi"))
        assert await eventually(lambda: wait_of(cluster, "next")) == (
            "Inadmissible", "no node could ever hold it: 0/1 nodes fit: 1 had untolerated taint {dedicated: infra}")
        assert await node_of(cluster, "heavy") == "node-a"
