"""The node agent against the emulator: it writes the GPUNode, and the real operator places on those GPUs."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from typing import Any

from gputask.agent import FakeProbe, GpuReading, NodeReading, NvmlProbe, fake_uuid
from gputask.agent.attribution import HOST_PID_MESSAGE
from gputask.k8s.client import GPUNODES, GPUTASKS, NotFound
from harness import (
    Cluster,
    add_ready_node,
    eventually,
    gputask,
    gputask_command,
    job_of,
    running_agent,
    running_operator,
)
from nvml_mig import MigNvml, a100_in_mig_mode

NODE = "gpu-node-1"
U0, U1 = fake_uuid(NODE, 0), fake_uuid(NODE, 1)




async def gpunode_with(cluster: Cluster, predicate: Any) -> dict[str, Any] | None:
    """The GPUNode once ``predicate(status)`` holds, else None."""
    try:
        obj = await cluster.client.get(GPUNODES, NODE)
    except NotFound:
        return None
    return obj if predicate(obj.get("status") or {}) else None



def a10(index: int, uuid: str, healthy: bool = True, reason: str = "") -> dict[str, Any]:
    """A status entry of the fake 24Gi A10s."""
    return {
        "index": index,
        "uuid": uuid,
        "product": "NVIDIA-A10",
        "memory": "24576Mi",
        "memoryUsed": "0Mi",
        "healthy": healthy,
        "reason": reason,
    }


async def test_agent_reports_gpus_and_the_operator_places_a_task_on_them(cluster: Cluster) -> None:
    """The agent creates the owned GPUNode from a FakeProbe; the operator pins a GPUTask to a reported UUID."""
    node = await add_ready_node(cluster, NODE)
    await cluster.add_queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": 2}])
    probe = FakeProbe.from_spec("2xNVIDIA-A10:24Gi", node_name=NODE)
    async with running_agent(cluster, probe, NODE):
        obj = await eventually(lambda: gpunode_with(cluster, lambda s: bool(s.get("gpus"))))
        status = {k: v for k, v in obj["status"].items() if k != "heartbeatTime"}
        owners = obj["metadata"].get("ownerReferences")
        assert (owners, status) == (
            [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}],
            {"gpus": [a10(0, U0), a10(1, U1)], "driverVersion": "fake", "cudaVersion": "fake",
             "summary": "2x NVIDIA-A10 (48Gi)",
             "podResources": {"available": False, "reason": "Disabled",
                              "message": "the agent was started without a PodResources socket", "pods": []},
             "processMemory": {"available": False, "reason": "HostPIDDisabled", "message": HOST_PID_MESSAGE}},
        )
        async with running_operator(cluster):
            await cluster.submit(gputask("train", gpuMemory="12Gi"))
            job = await eventually(lambda: job_of(cluster, "train-1"))
    placement = json.loads(job["metadata"]["annotations"]["gputask.io/placement"])
    assert placement == {"node": NODE, "uuids": [U0], "indices": [0], "memoryMiB": [12288]}


async def test_operator_avoids_a_gpu_the_agent_reports_unhealthy(cluster: Cluster) -> None:
    """A GPU the agent reports unhealthy (XID 79) gets no task: the operator places on the other GPU."""
    await add_ready_node(cluster, NODE)
    await cluster.add_queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": 2}])
    probe = FakeProbe.from_spec("2xNVIDIA-A10:24Gi", node_name=NODE)
    probe.set_health(0, False, "XID 79")
    async with running_agent(cluster, probe, NODE):
        await eventually(
            lambda: gpunode_with(cluster, lambda s: s.get("gpus") == [a10(0, U0, False, "XID 79"), a10(1, U1)])
        )
        async with running_operator(cluster):
            await cluster.submit(gputask("train", gpuMemory="12Gi"))
            job = await eventually(lambda: job_of(cluster, "train-1"))
    placement = json.loads(job["metadata"]["annotations"]["gputask.io/placement"])
    assert placement == {"node": NODE, "uuids": [U1], "indices": [1], "memoryMiB": [12288]}


class FlakyProbe:
    """Raises, returns garbage, then a malformed reading, then a good one; loops on the good one."""

    def __init__(self) -> None:
        good = GpuReading(0, "GPU-good", "NVIDIA A10", 24576, 0)
        self.script: list[Any] = [
            RuntimeError("driver bug"),
            None,
            NodeReading("550", "12.4", (good, GpuReading(0, "", "x", -1, 0), "junk")),  # type: ignore[arg-type]
        ]
        self.good = NodeReading("550", "12.4", (good,))

    def read(self) -> NodeReading:
        item = self.script.pop(0) if self.script else self.good
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[no-any-return]

    def close(self) -> None: ...


async def test_malformed_readings_never_crash_the_agent_against_the_api(cluster: Cluster) -> None:
    """Through raising and malformed readings the agent keeps running and publishes only the valid GPU."""
    await add_ready_node(cluster, NODE)
    async with running_agent(cluster, FlakyProbe(), NODE) as reporter:
        obj = await eventually(lambda: gpunode_with(cluster, lambda s: bool(s.get("gpus"))))
        await asyncio.sleep(0.2)  # more ticks on the good reading
        probe_errors = reporter.metrics.registry.get_sample_value("gputask_agent_probe_errors_total", {"node": NODE})
    assert (obj["status"]["gpus"], probe_errors, reporter.failures) == (
        [
            {
                "index": 0,
                "uuid": "GPU-good",
                "product": "NVIDIA-A10",
                "memory": "24576Mi",
                "memoryUsed": "0Mi",
                "healthy": True,
                "reason": "",
            }
        ],
        2.0,
        0,
    )


async def test_agent_command_reports_and_exits_0_on_sigterm(cluster: Cluster) -> None:
    """`gputask agent --fake-gpus` as a process writes the GPUNode (fake GPUs: no kubelet's socket read, so
    podResources says Disabled) and exits 0 on SIGTERM."""
    await add_ready_node(cluster, NODE)
    args = ["--node-name", NODE, "--fake-gpus", "1x8Gi", "--interval", "100ms", "--metrics-port", "0"]
    proc = await gputask_command(
        cluster, "agent", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        obj = await eventually(lambda: gpunode_with(cluster, lambda s: bool(s.get("gpus"))), timeout_s=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=15)
    said = obj["status"]["podResources"]
    assert (proc.returncode, [g["uuid"] for g in obj["status"]["gpus"]], said["available"], said["reason"]) == (
        0, [U0], False, "Disabled"), output.decode()


async def test_agent_and_operator_commands_exit_2_on_a_taken_metrics_port(cluster: Cluster) -> None:
    """`gputask agent` and `gputask run` on a port another process listens on: one line on stderr, exit 2."""
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = str(holder.getsockname()[1])
    outcomes = []
    try:
        for args in (
            ["agent", "--node-name", NODE, "--fake-gpus", "1x8Gi", "--metrics-port", port],
            ["run", "--metrics-port", port],
        ):
            proc = await gputask_command(
                cluster, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
            last = err.decode().strip().splitlines()[-1]
            outcomes.append((proc.returncode, last.split(":")[0], "in use" in last))
    finally:
        holder.close()
    assert outcomes == [(2, "gputask agent", True), (2, "gputask run", True)]


async def test_metrics_bind_address_is_where_they_listen(cluster: Cluster) -> None:
    """--metrics-bind-address reaches the listener: an address this host does not have (TEST-NET-3) is one line
    on stderr naming it, exit 2, for the agent and the operator."""
    outcomes = []
    for args in (
        ["agent", "--node-name", NODE, "--fake-gpus", "1x8Gi", "--metrics-port", "0",
         "--metrics-bind-address", "203.0.113.9"],
        ["run", "--metrics-port", "19733", "--metrics-bind-address", "203.0.113.9"],
    ):
        proc = await gputask_command(cluster, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        last = err.decode().strip().splitlines()[-1]
        outcomes.append((proc.returncode, last.split(":")[0], "assign requested address" in last))
    assert outcomes == [(2, "gputask agent", True), (2, "gputask run", True)]


# -- MIG devices end to end: read through NVML, placed by the real operator, pinned by MIG UUID ----------
MIG_1G = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
MIG_2G = "NVIDIA-A100-SXM4-40GB-MIG-1c.2g.10gb"


def visible_devices(job: dict[str, Any]) -> list[str]:
    """The NVIDIA_VISIBLE_DEVICES value of each container of a Job's pod template."""
    containers = job["spec"]["template"]["spec"]["containers"]
    return [e["value"] for c in containers for e in c.get("env") or [] if e["name"] == "NVIDIA_VISIBLE_DEVICES"]


async def test_tasks_naming_a_mig_profile_get_mig_devices_pinned_by_uuid(cluster: Cluster) -> None:
    """Tasks that name a MIG product are placed on MIG devices (shared by memory, or whole) and their Jobs see
    the MIG UUID; a task naming no product takes the GPU outside MIG, and the next one waits."""
    await add_ready_node(cluster, NODE)
    await cluster.add_queue()
    with NvmlProbe(nvml=MigNvml(a100_in_mig_mode())) as probe:
        async with running_agent(cluster, probe, NODE):
            await eventually(lambda: gpunode_with(cluster, lambda s: len(s.get("gpus") or []) == 6))
            async with running_operator(cluster):
                await cluster.submit(gputask("infer", gpuMemory="2Gi", gpuProducts=[MIG_1G]))
                await cluster.submit(gputask("train", gpuProducts=[MIG_2G]))
                await cluster.submit(gputask("whole"))
                await cluster.submit(gputask("whole-2"))
                jobs = [await eventually(lambda n=n: job_of(cluster, f"{n}-1")) for n in ("infer", "train", "whole")]
                waiting = await eventually(lambda: _waiting(cluster, "whole-2"))
    placements = [json.loads(j["metadata"]["annotations"]["gputask.io/placement"]) for j in jobs]
    assert ([(p["indices"], p["uuids"], p["memoryMiB"]) for p in placements], [visible_devices(j) for j in jobs],
            waiting) == (
        [([100], ["MIG-a"], [2048]), ([103], ["MIG-c"], [9984]), ([1], ["GPU-1"], [40960])],
        [["MIG-a"], ["MIG-c"], ["GPU-1"]],
        ("Pending", "NoFit"),
    )


async def _waiting(cluster: Cluster, name: str) -> tuple[str, str] | None:
    status = (await cluster.client.get(GPUTASKS, name, "default")).get("status") or {}
    reasons = [c["reason"] for c in status.get("conditions") or [] if c["type"] == "Admitted"]
    return (status["phase"], reasons[0]) if status.get("phase") == "Pending" and reasons else None
