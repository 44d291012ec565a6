"""Defragmentation moves through the Eviction API (gputask.k8s.evictions) on the fake client: a PodDisruptionBudget's
429 on any pod of a plan moves nothing, refuses the plan (counted) and lets another plan run; an allowed plan evicts
the pods (dry-run first, then for real) and the Jobs (reason Defragmented); DryRun only posts Events."""

from __future__ import annotations

import time
from typing import Any

from gputask.config import Config
from gputask.k8s.client import EVENTS, GPULOCALQUEUES, GPUNODES, GPUTASKS, JOBS, PODS
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor
from gputask.k8s.loop import SchedulingLoop
from gputask.k8s.writer import Writer
from gputask.metrics import OperatorMetrics
from gputask.testing.fake import FakeKubeClient


def _gpu(node: str, i: int) -> dict[str, Any]:
    return {"index": i, "uuid": f"GPU-{node}-{i}", "product": "NVIDIA-A10", "memory": "24Gi", "memoryUsed": "0",
            "healthy": True}


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Cluster:
    """Nodes node-a and node-b of 2 GPUs each; movable 1-GPU tasks ``s1`` on node-a and ``s2`` on node-b, each with
    its running pod: a 2-GPU task waits Fragmented (2 GPUs free, one per node)."""

    def __init__(self, mode: str) -> None:
        self.client = FakeKubeClient()
        config = Config.model_validate({"cycleInterval": 0.2, "defragmentation": {"mode": mode, "minRuntime": "0s"}})
        self.controller = Controller(config)
        self.executor = Executor(self.controller, Writer(self.client, OperatorMetrics()), OperatorMetrics())
        self.loop = SchedulingLoop(self.controller, self.executor)
        inventory = self.controller.inventory
        inventory.on_queue({"metadata": {"name": "q"}, "spec": {
            "namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1000}]}})
        self.controller.on_local_queue(self.client.put(
            GPULOCALQUEUES, {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"clusterQueue": "q"}}, "ns"))
        for name in ("node-a", "node-b"):
            inventory.on_gpunode(self.client.put(GPUNODES, {"metadata": {"name": name}, "status": {
                "gpus": [_gpu(name, 0), _gpu(name, 1)], "heartbeatTime": _stamp()}}), time.time())

    def node(self, name: str, cordoned: bool) -> None:
        self.controller.inventory.on_node({"metadata": {"name": name}, "spec": {"unschedulable": cordoned},
                                           "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                                          time.time())

    def submit(self, name: str, gpus: int, **spec: Any) -> None:
        body = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": name, "namespace": "ns"},
                "spec": {"queueName": "q", "gpus": gpus,
                         "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}, **spec}}
        self.controller.on_task(self.client.put(GPUTASKS, body, "ns"))

    async def running(self, name: str) -> None:
        """Feed task ``name``'s Job (after a pass) and store its running pod."""
        await self.loop.run_once()
        job = next(j for j in self.client.all(JOBS, "ns") if j["metadata"]["name"].startswith(f"{name}-"))
        self.controller.on_job(job)
        job_name = job["metadata"]["name"]
        self.client.put(PODS, {"metadata": {"name": f"{job_name}-p", "namespace": "ns", "uid": f"uid-{name}",
                                            "labels": {"job-name": job_name, "batch.kubernetes.io/job-name": job_name}},
                               "spec": {"nodeName": "x"}, "status": {"phase": "Running"}}, "ns")

    async def fragmented(self) -> None:
        self.node("node-a", False)
        self.node("node-b", True)
        self.submit("s1", 1, disruption={"movable": True})
        await self.running("s1")
        self.node("node-a", True)
        self.node("node-b", False)
        self.submit("s2", 1, disruption={"movable": True})
        await self.running("s2")
        self.node("node-a", False)
        self.submit("big", 2)

    def status(self, name: str) -> dict[str, Any]:
        return next(t for t in self.client.all(GPUTASKS, "ns") if t["metadata"]["name"] == name).get("status") or {}

    def events(self, reason: str) -> list[tuple[str, str, str]]:
        return [(e["involvedObject"]["name"], e["type"], e["message"]) for e in self.client.all(EVENTS, "ns")
                if e["reason"] == reason]

    def evictions(self) -> list[tuple[str, bool]]:
        return [(plural.split("/")[1], False) for verb, plural, _ in self.client.calls
                if verb == "create" and plural.endswith("/eviction")]

    def pods(self) -> list[str]:
        return [p["metadata"]["name"] for p in self.client.all(PODS, "ns")]


async def test_an_allowed_plan_evicts_the_moved_pod_and_job_for_the_big_task() -> None:
    """One move (s2: it ran less than s1, the least lost work): its pod asked dry-run then evicted, its Job
    deleted, the task evicted Defragmented naming big."""
    c = Cluster("Enabled")
    await c.fragmented()
    await c.loop.run_once()
    assert c.evictions() == [("s2-1-p", False), ("s2-1-p", False)]  # the dry run, then the eviction
    assert c.pods() == ["s1-1-p"]
    assert [j["metadata"]["name"] for j in c.client.all(JOBS, "ns")] == ["s1-1"]
    (evicted,) = [(n, m) for n, _, m in c.events("Defragmented")]
    assert evicted[0] == "s2" and "to make room for ns/big" in evicted[1]
    assert c.controller.scheduler.defrag.stats.moves == 1
    assert c.controller.scheduler.defrag.stats.refused_by_budget == 0


async def test_a_budget_refusal_moves_nothing_and_another_plan_runs() -> None:
    """A 429 on s2's pod (dry run): nothing evicted, the plan refused and counted, a Warning names the budget; the
    next pass moves s1 instead."""
    c = Cluster("Enabled")
    await c.fragmented()
    why = "The disruption budget pdb-s2 needs 1 healthy pods and has 1 currently"
    c.client.fail("create", "pods/s2-1-p/eviction", status=429,
                  message=f'{{"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "Cannot evict", '
                          f'"details": {{"causes": [{{"reason": "DisruptionBudget", "message": "{why}"}}]}}}}')
    await c.loop.run_once()
    assert c.pods() == ["s1-1-p", "s2-1-p"]
    assert len(c.client.all(JOBS, "ns")) == 2
    assert c.controller.scheduler.defrag.stats.refused_by_budget == 1
    assert c.controller.scheduler.defrag.stats.moves == 0
    (refused,) = c.events("DefragmentationRefused")
    assert refused[:2] == ("big", "Warning") and "pdb-s2" in refused[2]
    await c.loop.run_once()
    assert c.pods() == ["s2-1-p"]
    assert [n for n, _, _ in c.events("Defragmented")] == ["s1"]


async def test_dry_run_posts_an_event_and_moves_nothing() -> None:
    """DryRun: a Normal DefragmentationPlanned Event on big naming the move; no eviction asked, no pod gone."""
    c = Cluster("DryRun")
    await c.fragmented()
    await c.loop.run_once()
    await c.loop.run_once()
    assert c.evictions() == []
    assert c.pods() == ["s1-1-p", "s2-1-p"]
    (planned,) = c.events("DefragmentationPlanned")
    assert planned[:2] == ("big", "Normal") and "ns/s2 (node-b to node-a)" in planned[2]
