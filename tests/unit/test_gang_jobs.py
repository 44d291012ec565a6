"""A gang's objects and life cycle in the adapter (k8s/gangjobs.py, k8s/gangwrites.py), on the fake client: one
Indexed Job per PodSet and a headless Service, each gated pod pinned to its node and GPUs by one patch, Running only
when every pod runs, the whole gang stopped on eviction and on a failed Job, the rebuild keeping its Jobs.

The GPUTask's ``spec.podSets`` goes through the operator's own conversion (each PodSet with its template, as the
operator requires); every Job, Service and patch is the operator's own.
"""

from __future__ import annotations

import time
from typing import Any, cast

import pytest
from test_adapter import Parts

from gputask.config import Config
from gputask.core import TaskKey
from gputask.k8s import gangjobs
from gputask.k8s.client import EVENTS, GPUNODES, GPUTASKS, JOBS, PODS
from gputask.k8s.gangjobs import DEVICES_ANNOTATION, INDEX_KEY, PLACEMENT_GATE
from gputask.k8s.resources import SERVICES

TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "pytorch"}]}}
POD_SETS = [{"name": "launcher", "count": 1, "gpus": 1, "template": TEMPLATE},
            {"name": "worker", "count": 3, "gpus": 1, "template": TEMPLATE}]


def gpu(node: str, index: int) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{node[-1]}{index}", "product": "NVIDIA-A10", "memory": "24Gi",
            "memoryUsed": "0", "healthy": True}


def gang_parts(config: Config | None = None) -> Parts:
    """Parts (node-a: one GPU) with node-b and node-c of 2 GPUs each."""
    parts = Parts(config)
    now, inventory = time.time(), parts.controller.inventory
    for node in ("node-b", "node-c"):
        inventory.on_node({"metadata": {"name": node}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                          now)
        status = {"gpus": [gpu(node, 0), gpu(node, 1)], "heartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                          time.gmtime())}
        inventory.on_gpunode(parts.client.put(GPUNODES, {"metadata": {"name": node}, "status": status}), now)
    return parts


def gated_pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """Pod ``index`` of an Indexed Job as the Job controller makes it: the template, the index annotation and label,
    the hostname ``<job>-<index>``, not bound (its gate holds it back)."""
    template, name = job["spec"]["template"], job["metadata"]["name"]
    meta = {"name": f"{name}-{index}-x", "namespace": "ns", "uid": f"{name}-{index}",
            "labels": template["metadata"]["labels"] | {"batch.kubernetes.io/job-name": name, INDEX_KEY: str(index)},
            "annotations": template["metadata"]["annotations"] | {INDEX_KEY: str(index)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name}]}
    spec = {**template["spec"], "hostname": f"{name}-{index}"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


async def admitted_gang(parts: Parts) -> list[dict[str, Any]]:
    """Submit the 4-pod gang ``g``, run a pass, feed its Jobs; returns them, lead first."""
    parts.submit("g", podSets=POD_SETS, template=None)
    await parts.loop.run_once()
    jobs = sorted(parts.client.all(JOBS, "ns"), key=lambda j: j["metadata"]["name"])
    for job in jobs:
        parts.controller.on_job(job)
    return jobs


def node_of(pod: dict[str, Any]) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    return [f["values"] for t in terms for f in t["matchFields"]][-1]


async def test_a_gang_runs_as_an_indexed_job_per_pod_set_under_one_headless_service() -> None:
    parts = gang_parts()
    jobs = await admitted_gang(parts)
    assert [j["metadata"]["name"] for j in jobs] == ["g-1-launcher", "g-1-worker"]
    assert [(j["spec"]["completionMode"], j["spec"]["completions"], j["spec"]["parallelism"]) for j in jobs] == [
        ("Indexed", 1, 1), ("Indexed", 3, 3)]
    lead, worker = jobs
    assert {j["metadata"]["annotations"][gangjobs.GANG_ANNOTATION] for j in jobs} == {"g-1-launcher"}
    template = worker["spec"]["template"]["spec"]
    assert (template["schedulingGates"], template["subdomain"]) == ([{"name": PLACEMENT_GATE}], "g")
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in template["containers"][0]["env"]}
    assert env == {
        "GPUTASK_POD_SETS": "launcher:1,worker:3", "GPUTASK_WORLD_SIZE": "4",
        "GPUTASK_COORDINATOR": "g-1-launcher-0.g",
        "GPUTASK_POD_INDEX": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}},
        "GPUTASK_POD_SET": "worker", "GPUTASK_POD_SET_OFFSET": "1",
        "NVIDIA_VISIBLE_DEVICES": {"fieldRef": {"fieldPath": f"metadata.annotations['{DEVICES_ANNOTATION}']"}}}
    (service,) = parts.client.all(SERVICES, "ns")
    assert (service["metadata"]["name"], service["spec"]) == ("g", {
        "clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"gputask.io/task": "g"}})
    assert service["metadata"]["ownerReferences"][0]["kind"] == "GPUTask"
    status = parts.status("g")
    assert (status["phase"], status["jobName"]) == ("Admitted", "g-1-launcher")
    placed = parts.controller.tasks[TaskKey("ns/g")].placement
    assert placed is not None and len(placed.pods) == 4
    assert [len(parts.controller.jobs[f"ns/{j['metadata']['name']}"].placement.pods) for j in jobs] == [1, 3]


async def test_each_gated_pod_is_pinned_to_its_node_and_gpus_and_the_gang_runs_when_all_four_do() -> None:
    parts = gang_parts()
    jobs = await admitted_gang(parts)
    placed = parts.controller.tasks[TaskKey("ns/g")].placement
    assert placed is not None
    pods = [gated_pod(job, i) for job in jobs for i in range(job["spec"]["completions"])]
    for pod in pods:
        parts.controller.on_task_pod(parts.client.put(PODS, pod, "ns"))
    await parts.loop.run_once()
    stored = {p["metadata"]["name"]: p for p in parts.client.all(PODS, "ns")}
    for pod, want in zip(pods, placed.pods, strict=True):
        got = stored[pod["metadata"]["name"]]
        assert got["spec"].get("schedulingGates") is None
        assert node_of(got) == [want.node]
        assert got["metadata"]["annotations"][DEVICES_ANNOTATION] == ",".join(g.uuid for g in want.gpus)
    assert len({(p.node, g.uuid) for p in placed.pods for g in p.gpus}) == 4 and len(placed.nodes) >= 2
    for i, pod in enumerate(stored.values()):
        running = {**pod, "spec": {**pod["spec"], "nodeName": node_of(pod)[0]}, "status": {"phase": "Running"}}
        parts.controller.on_task_pod(running)
        await parts.loop.run_once()
        assert parts.status("g")["phase"] == ("Running" if i == 3 else "Admitted")


async def test_an_evicted_gang_stops_every_job_each_holding_its_pods_gpus_until_gone() -> None:
    parts = gang_parts()
    jobs = await admitted_gang(parts)
    parts.controller.scheduler.evict(TaskKey("ns/g"), "NodeFailure", "node node-b failed", failure=True)
    await parts.loop.run_once()
    deleted = [name for verb, plural, name in parts.client.calls if (verb, plural) == ("delete", "jobs")]
    assert sorted(deleted) == ["g-1-launcher", "g-1-worker"]
    held = parts.controller.held
    assert sorted(held) == ["ns/g-1-launcher", "ns/g-1-worker"]
    parts.controller.on_job_deleted(jobs[0])
    assert sorted(parts.controller.held) == ["ns/g-1-worker"]
    assert parts.client.all(SERVICES, "ns")  # the Service of every attempt stays


async def test_a_failed_job_fails_the_gang_and_stops_its_other_job() -> None:
    parts = gang_parts()
    jobs = await admitted_gang(parts)
    failed = {**jobs[1], "status": {"conditions": [{"type": "Failed", "status": "True",
                                                    "reason": "BackoffLimitExceeded", "message": "pod 2 failed"}]}}
    parts.controller.on_job(failed)
    await parts.loop.run_once()
    assert parts.status("g")["phase"] == "Failed"
    assert [n for v, p, n in parts.client.calls if (v, p) == ("delete", "jobs")] == ["g-1-launcher"]
    assert "ns/g-1-launcher" in parts.controller.held  # its pods run until it is gone


async def test_a_gang_succeeds_only_when_every_job_completed() -> None:
    parts = gang_parts()
    jobs = await admitted_gang(parts)
    done = [{**j, "status": {"conditions": [{"type": "Complete", "status": "True"}]}} for j in jobs]
    parts.controller.on_job(done[0])
    await parts.loop.run_once()
    assert parts.status("g")["phase"] == "Admitted"
    parts.controller.on_job(done[1])
    await parts.loop.run_once()
    assert parts.status("g")["phase"] == "Succeeded"


async def test_the_rebuild_restores_a_gang_from_its_jobs_and_deletes_none() -> None:
    parts = gang_parts()
    await admitted_gang(parts)
    before = parts.controller.tasks[TaskKey("ns/g")].placement
    nodes = [{"metadata": {"name": n}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
             for n in ("node-a", "node-b", "node-c")]
    parts.controller.rebuild({"nodes": nodes, "gpunodes": parts.client.all(GPUNODES),
                              "queues": [{"metadata": {"name": "q"}, "spec": {"namespaceSelector": {}, "resources": [
                                  {"name": "nvidia.com/gpu", "nominalQuota": 1000}]}}],
                              "jobs": parts.client.all(JOBS, "ns"), "tasks": parts.client.all(GPUTASKS, "ns")})
    record = parts.controller.tasks[TaskKey("ns/g")]
    assert (record.phase, record.job_name, record.placement) == ("Admitted", "g-1-launcher", before)
    await parts.loop.run_once()
    assert [n for v, p, n in parts.client.calls if (v, p) == ("delete", "jobs")] == []
    assert "StrayJobDeleted" not in [e["reason"] for e in parts.client.all(EVENTS, "ns")]


async def test_dra_pinning_refuses_a_gang_with_its_reason() -> None:
    parts = gang_parts(Config(cycleInterval=0.2, pinning="dra"))
    parts.submit("g", podSets=POD_SETS, template=None)
    await parts.loop.run_once()
    assert parts.client.all(JOBS, "ns") == []
    admitted = next(c for c in parts.status("g")["conditions"] if c["type"] == "Admitted")
    assert "cannot pin a gang's pods one by one" in admitted["message"]


async def test_a_refused_pin_is_sent_again_after_a_doubling_backoff_not_every_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pin the API server refuses (422) waits 10 s, then 20 s, before it is sent again: the loop's passes in
    between send nothing (no hot retry); once accepted it is no longer owed."""
    from gputask.k8s import gangwrites
    from gputask.k8s.resources import ApiError
    from gputask.k8s.writer import Writer

    sent: list[str] = []
    answers = [ApiError(422, "Invalid", "spec: Forbidden"), ApiError(422, "Invalid", "spec: Forbidden"), None]

    class Writes:
        async def patch(self, resource: Any, name: str, patch: Any, namespace: str) -> None:
            sent.append(name)
            answer = answers.pop(0)
            if answer is not None:
                raise answer

    clock = [1000.0]
    monkeypatch.setattr(gangwrites.time, "monotonic", lambda: clock[0])

    async def nothing(*_: Any) -> None:
        return None

    writes = gangwrites.GangWrites(cast(Writer, Writes()), nothing, nothing)
    await writes.pin({"ns/p-0": ("ns", "p-0", {})})
    for at in (1001.0, 1009.9):  # passes inside the first backoff
        clock[0] = at
        await writes.pin({})
    clock[0] = 1010.0
    await writes.pin({})  # the second try, refused: 20 s now
    clock[0] = 1029.9
    await writes.pin({})
    clock[0] = 1030.0
    await writes.pin({})  # accepted
    clock[0] = 2000.0
    await writes.pin({})
    assert (sent, writes.unpinned, writes.refused) == (["p-0", "p-0", "p-0"], {}, {})
