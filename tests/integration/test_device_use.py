"""Who uses which GPU, end to end: the agent (fake GPUs, a fake kubelet, fake processes), the emulator and the
real operator. A device-plugin pod's exact GPUs stay out of placement; a task over its memory budget is told,
and with memoryBudget Evict it is evicted and requeued."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gputask.agent import FakeProbe, fake_uuid
from gputask.agent.podresources import PodResourcesClient
from gputask.config import Config
from gputask.k8s.client import EVENTS, GPUNODES, JOBS, PODS, NotFound
from gputask.testing.kubelet import FakeKubelet
from harness import Cluster, add_ready_node, eventually, gputask, job_of, running_agent, running_operator

NODE = "gpu-node-1"
UUIDS = [fake_uuid(NODE, i) for i in range(4)]
CID = "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376"





async def gpunode_condition(cluster: Cluster, ctype: str) -> tuple[str, str, str] | None:
    """(status, reason, message) of the GPUNode's condition ``ctype`` once written."""
    try:
        obj = await cluster.client.get(GPUNODES, NODE)
    except NotFound:
        return None
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype]
    return (found[0]["status"], found[0]["reason"], found[0]["message"]) if found else None


def foreign_pod(name: str, gpus: int) -> dict[str, Any]:
    """A device-plugin pod (nvidia.com/gpu: ``gpus``) bound to NODE and running."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}


async def test_a_device_plugin_pods_exact_gpus_are_kept_out_of_placement(cluster: Cluster, tmp_path: Path) -> None:
    """The kubelet gave the foreign pod GPU 3 (a time-sliced replica ID); gputask's count rule would have guessed
    GPU 0. With the agent reading the kubelet, a 3-GPU task gets GPUs 0-2, and the GPUNode says PodResources is
    available; when the kubelet's socket goes, the condition turns False (SocketNotFound) with a Warning Event."""
    await add_ready_node(cluster, NODE)
    await cluster.add_queue()
    probe = FakeProbe.from_spec("4xNVIDIA-A10:24Gi", node_name=NODE)
    with FakeKubelet(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = {("default", "infer"): {"main": {"nvidia.com/gpu": [f"{UUIDS[3]}::1"]}}}
        await cluster.client.create(PODS, foreign_pod("infer", 1), "default")
        client = PodResourcesClient(kubelet.socket_path, timeout_s=2)
        async with running_agent(cluster, probe, NODE, pod_resources=client), running_operator(cluster):
            assert await eventually(lambda: gpunode_condition(cluster, "PodResourcesAvailable")) == (
                "True", "Listed", "the GPUs of device-plugin pods are read from the kubelet's PodResources API")
            await cluster.submit(gputask("train", gpus=3))
            job = await eventually(lambda: job_of(cluster, "train-1"))
            kubelet.stop()

            async def socket_gone() -> tuple[str, str, str] | None:
                found = await gpunode_condition(cluster, "PodResourcesAvailable")
                return found if found is not None and found[1] == "SocketNotFound" else None

            said = await eventually(socket_gone)

            async def socket_gone_said() -> list[tuple[str, str, str]] | None:
                events = await gpunode_events(cluster)
                return events if any("does not exist" in e[2] for e in events) else None

            events = await eventually(socket_gone_said)
    placement = json.loads(job["metadata"]["annotations"]["gputask.io/placement"])
    count_rule = ("pods requesting nvidia.com/gpu on this node are counted on GPUs gputask chooses, not the devices "
                  "the kubelet gave them (gputask.k8s.foreign, rule 3)")
    missing = (f"{kubelet.socket_path} does not exist: the kubelet's pod-resources directory is not mounted into the "
               "agent (chart: agent.podResources.enabled), or this kubelet does not serve the PodResources API")
    # A List in flight when the kubelet stops is cancelled (reason Unavailable, an Event of its own) before the
    # next one finds no socket; whether one was in flight depends on timing, so one such Event may come first.
    gone = ("Warning", "PodResourcesUnavailable", f"{missing}; {count_rule}")
    others = [e for e in events if e != gone]
    cancelled = [e for e in others if e[:2] == ("Warning", "PodResourcesUnavailable")
                 and e[2].startswith(f"{kubelet.socket_path}: ") and e[2].endswith(count_rule)]
    assert (placement["uuids"], said, events.count(gone), cancelled == others, len(others) <= 1) == (
        UUIDS[:3], ("False", "SocketNotFound", f"{missing}; {count_rule}"), 1, True, True)


async def gpunode_events(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events about the GPUNode."""
    events = await cluster.client.list(EVENTS, "default")
    return [(e["type"], e["reason"], e["message"]) for e in events
            if (e.get("involvedObject") or {}).get("kind") == "GPUNode"]


async def running_pod_of(cluster: Cluster, job_name: str) -> str:
    """Create the Job's pod as the Job controller and kubelet would, Running on NODE; returns its uid."""
    job = await cluster.client.get(JOBS, job_name, "default")
    labels = job["spec"]["template"]["metadata"]["labels"] | {"batch.kubernetes.io/job-name": job_name}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{job_name}-x1", "namespace": "default", "labels": labels, "ownerReferences": [owner]},
           "spec": job["spec"]["template"]["spec"] | {"nodeName": NODE}}
    stored = await cluster.client.create(PODS, pod, "default")
    await cluster.client.patch(PODS, f"{job_name}-x1", {"status": {"phase": "Running"}}, "default", status=True)
    return str(stored["metadata"]["uid"])


async def task_condition(cluster: Cluster, name: str, ctype: str) -> tuple[str, str, str] | None:
    """(status, reason, message) of a GPUTask condition once it has one."""
    for cond in ((await cluster.task(name)).get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return cond["status"], cond["reason"], cond["message"]
    return None


async def over_budget(cluster: Cluster, tmp_path: Path, probe: FakeProbe, used_mib: int) -> None:
    """Run a pod of Job train-1 on NODE whose process (pid 4242) uses ``used_mib`` on GPU 0."""
    uid = await running_pod_of(cluster, "train-1")
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/{CID}\n")
    probe.set_used(0, used_mib + 500)
    probe.set_processes(0, [(4242, used_mib)])


USE = f"{NODE} GPU 0 ({UUIDS[0]}): 12000 MiB used, budget 8192 MiB (+1024 MiB tolerance)"


async def test_a_task_over_its_memory_budget_is_told_and_told_again_once_within(
    cluster: Cluster, tmp_path: Path
) -> None:
    """memoryBudget Warn: its pod's process uses 12000 MiB where it reserved 8192 MiB, so the task gets
    GPUMemoryWithinBudget False and a Warning Event naming GPU, use and budget, and the metric says by how much;
    once the process uses 6000 MiB the condition turns True with a Normal Event; it runs on, never evicted."""
    await add_ready_node(cluster, NODE)
    await cluster.add_queue()
    probe = FakeProbe.from_spec("1xNVIDIA-A10:24Gi", node_name=NODE)
    agent = running_agent(cluster, probe, NODE, host_pid=True, proc_root=str(tmp_path / "proc"))
    async with agent, running_operator(cluster) as op:
        await cluster.submit(gputask("train", gpuMemory="8Gi"))
        await eventually(lambda: job_of(cluster, "train-1"))
        await over_budget(cluster, tmp_path, probe, 12000)

        async def condition_is(status: str) -> tuple[str, str, str] | None:
            found = await task_condition(cluster, "train", "GPUMemoryWithinBudget")
            return found if found is not None and found[0] == status else None

        told = await eventually(lambda: condition_is("False"))
        labels = {"namespace": "default", "task": "train", "node": NODE, "gpu": "0"}

        async def metric_set() -> float | None:
            return op.metrics.registry.get_sample_value("gputask_task_gpu_memory_over_budget_bytes", labels)

        metric = await eventually(metric_set)
        probe.set_processes(0, [(4242, 6000)])
        within = await eventually(lambda: condition_is("True"))
        events = [e for e in await cluster.events_for("train") if e[1] != "Admitted"]
        phase = (await cluster.task("train"))["status"]["phase"]
    over = f"its pods use more GPU memory than it reserved: {USE}"
    again = "its pods use at most the GPU memory it reserved (+1024 MiB tolerance) again"
    assert (told, metric, within, sorted(events), phase) == (
        ("False", "GPUMemoryExceeded", over),
        (12000 - 8192) * 2**20,
        ("True", "GPUMemoryWithinBudget", again),
        sorted([("Warning", "GPUMemoryExceeded", over), ("Normal", "GPUMemoryWithinBudget", again)]),
        "Running",
    )


async def test_with_evict_a_task_over_its_memory_budget_is_evicted_and_requeued(
    cluster: Cluster, tmp_path: Path
) -> None:
    """memoryBudget Evict: the same overuse evicts the task (GPUMemoryExceeded, counted as a reschedule) with a
    Warning Event naming GPU, use and budget; its Job is deleted and it is admitted again as attempt 2, which turns
    Evicted False ("Previously: ...")."""
    await add_ready_node(cluster, NODE)
    await cluster.add_queue()
    probe = FakeProbe.from_spec("1xNVIDIA-A10:24Gi", node_name=NODE)
    config = Config(cycleInterval=0.2, memoryBudget={"action": "Evict", "toleranceMiB": 1024})
    agent = running_agent(cluster, probe, NODE, host_pid=True, proc_root=str(tmp_path / "proc"))
    async with agent, running_operator(cluster, config):
        await cluster.submit(gputask("train", gpuMemory="8Gi"))
        await eventually(lambda: job_of(cluster, "train-1"))
        await over_budget(cluster, tmp_path, probe, 12000)
        again = await eventually(lambda: job_of(cluster, "train-2"))

        async def readmitted() -> tuple[str, str, str] | None:  # the status is written just after the Job
            found = await task_condition(cluster, "train", "Evicted")
            return found if found is not None and found[0] == "False" else None

        evicted = await eventually(readmitted)
        events = [e for e in await cluster.events_for("train") if e[1] == "GPUMemoryExceeded"]
        reschedules = (await cluster.task("train"))["status"]["reschedules"]
        first_gone = await job_of(cluster, "train-1") is None or "deletionTimestamp" in (
            (await job_of(cluster, "train-1")) or {}).get("metadata", {})
    evict = f"uses more GPU memory than it reserved: {USE}"
    assert (evicted, events, again["metadata"]["annotations"]["gputask.io/attempt"], reschedules, first_gone) == (
        ("False", "QuotaReserved", f"Previously: {evict}"),
        [("Warning", "GPUMemoryExceeded", evict)],
        "2",
        1,
        True,
    )
