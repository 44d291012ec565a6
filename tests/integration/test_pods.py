"""Pods through the real operator's own informers (no kopf): a foreign device-plugin pod bound to a node is counted
until it finishes (it leaves the informer's field selector and the API server sends DELETED); a 410 on the pod
watches relists, and the relisting neither loses nor counts twice a pod that changed during the gap."""

from __future__ import annotations

from typing import Any

from gputask.config import Config
from gputask.k8s.client import PODS
from gputask.k8s.handlers import Operator
from gputask.manifests.podfit import Requests
from harness import Cluster, eventually, gputask, job_of, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")
A10_2 = ("GPU-a10-1", "NVIDIA-A10", "24Gi")
FAST = Config(cycleInterval=0.2)


def foreign_pod(name: str, node: str = "node-a") -> dict[str, Any]:
    """A device-plugin pod (nvidia.com/gpu: 1, 500m cpu) of no task, bound to ``node``."""
    resources = {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "500m"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda", "resources": resources}]}}


async def set_phase(cluster: Cluster, name: str, phase: str) -> None:
    """Write pod ``name``'s status.phase, as its kubelet would."""
    await cluster.client.patch(PODS, name, {"status": {"phase": phase}}, "default", status=True)


def counted(operator: Operator) -> dict[str, list[str]]:
    """The operator's foreign-pod index: node -> names of the pods counted on it."""
    return {node: sorted(p.name for p in pods.values()) for node, pods in operator.controller.foreign.by_node.items()}


async def phase_of(cluster: Cluster, name: str) -> str:
    """The task's status.phase ('' before it has one)."""
    return str(((await cluster.task(name)).get("status") or {}).get("phase") or "")


async def after_cycles(operator: Operator, count: int = 3) -> None:
    """Return once the scheduling loop has run ``count`` more cycles."""
    target = operator.loop.cycles + count

    async def ran() -> bool:
        return operator.loop.cycles >= target

    await eventually(ran)


async def test_a_foreign_pod_holds_its_gpu_until_it_finishes(cluster: Cluster) -> None:
    """A device-plugin pod bound to the only GPU's node is counted and the task needing that GPU waits; once the pod
    is Succeeded (it leaves the informer's field selector) it is released and the task gets its Job."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, FAST) as operator:
        await cluster.client.create(PODS, foreign_pod("infer"), "default")
        await set_phase(cluster, "infer", "Running")

        async def seen() -> bool:
            return counted(operator) == {"node-a": ["infer"]}

        await eventually(seen)
        await cluster.submit(gputask("t"))
        await after_cycles(operator)
        waiting = (await phase_of(cluster, "t"), await job_of(cluster, "t-1") is not None)
        await set_phase(cluster, "infer", "Succeeded")
        await eventually(lambda: job_of(cluster, "t-1"))
        assert (waiting, counted(operator), operator.informers["foreignpods"].relists) == (("Pending", False), {}, 0)


async def test_a_gap_in_the_pod_watches_is_closed_by_listing_again(cluster: Cluster) -> None:
    """The pod watches break and cannot resume (410 after compaction) while a counted foreign pod finishes, another
    is bound and a task's pod starts running: both pod informers list again once, the finished pod is released, the
    new one counted once, and the task is Running."""
    emulator = cluster.server.emulator
    await cluster.add_node("node-a", A10, A10_2)
    await cluster.add_queue()
    async with running_operator(cluster, FAST) as operator:
        await cluster.client.create(PODS, foreign_pod("old"), "default")
        await set_phase(cluster, "old", "Running")
        await cluster.submit(gputask("t"))
        job = await eventually(lambda: job_of(cluster, "t-1"))
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "t-1", "uid": job["metadata"]["uid"],
                 "controller": True}
        template = job["spec"]["template"]
        mine = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "t-1-abcde", "namespace": "default", "labels": template["metadata"]["labels"],
            "ownerReferences": [owner]}, "spec": template["spec"]}
        await cluster.client.create(PODS, mine, "default")

        async def known() -> bool:
            return counted(operator) == {"node-a": ["old"]} and len(operator.controller.task_pods) == 1

        await eventually(known)
        emulator.inject("GET", "/api/v1/pods", 500, times=2)  # both pod watches, opened again, are refused once
        refusal = emulator.injected[-1]
        emulator.close_watches()

        async def refused() -> bool:
            return refusal.times == 0

        await eventually(refused)  # each informer waits its backoff before watching again
        await set_phase(cluster, "old", "Succeeded")
        await cluster.client.create(PODS, foreign_pod("new"), "default")
        await set_phase(cluster, "new", "Running")
        await set_phase(cluster, "t-1-abcde", "Running")
        emulator.compact()

        async def relisted() -> bool:
            informers = operator.informers
            return (informers["foreignpods"].relists, informers["taskpods"].relists) == (1, 1)

        await eventually(relisted, timeout_s=30)

        async def running() -> bool:
            return await phase_of(cluster, "t") == "Running"

        await eventually(running)
        informers = operator.informers
        assert (counted(operator), operator.controller.foreign.requests_on("node-a"),
                sorted(operator.controller.task_pods.values()), operator.controller.scheduler.violations(),
                informers["foreignpods"].relists, informers["taskpods"].relists) == (
            {"node-a": ["new"]}, (Requests(cpu_milli=500), 1), ["default/t-1"], [], 1, 1)


