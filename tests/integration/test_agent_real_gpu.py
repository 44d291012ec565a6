"""The node agent on a real NVIDIA GPU: NVML through pynvml, no fake probe.

These tests run only where NVML initialises (a machine with an NVIDIA driver and
``nvidia-ml-py``); everywhere else each one is skipped with the reason. They check what the
fake-probe tests cannot: that :class:`~gputask.agent.NvmlProbe` reads the same devices as
``nvidia-smi``, the same compute processes and per-process memory as ``nvidia-smi
--query-compute-apps``, that memory held by a process gputask did not start shows up in the reading,
and that the ``gputask agent`` command on the real device, the emulator and the real operator
keep a task off memory another process holds.

The memory holder is a separate Python process (torch or cupy, whichever is installed) so the
allocation is foreign to the test process, as another team's pod would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from gputask.agent import NvmlProbe, ProbeUnavailable
from gputask.agent.probe import product_name
from gputask.k8s.client import GPUNODES, JOBS, NotFound
from harness import Cluster, add_ready_node, eventually, gputask, gputask_command, running_operator

NODE = "gpu-node-real"


def _nvml_or_skip() -> None:
    try:
        with NvmlProbe() as probe:
            probe.read()
    except ProbeUnavailable as exc:
        pytest.skip(f"no NVIDIA GPU here: NVML did not initialise ({exc})")


@pytest.fixture
def real_gpu() -> None:
    """Skip the test unless NVML initialises on this machine."""
    _nvml_or_skip()


def _allocator() -> str | None:
    """The first of torch / cupy that imports and sees a CUDA device, as a module name."""
    for module, check in (("torch", "torch.cuda.is_available()"), ("cupy", "cupy.cuda.runtime.getDeviceCount() > 0")):
        probe = f"import {module}, sys; sys.exit(0 if {check} else 1)"
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0:
                return module
    return None


HOLDER = {
    "torch": "import sys, torch; x = torch.empty({mib} * 2**20, dtype=torch.uint8, device='cuda:{index}'); "
    "torch.cuda.synchronize(); print('held', flush=True); sys.stdin.read()",
    "cupy": "import sys, cupy; cupy.cuda.Device({index}).use(); x = cupy.empty({mib} * 2**20, dtype=cupy.uint8); "
    "cupy.cuda.runtime.deviceSynchronize(); print('held', flush=True); sys.stdin.read()",
}


@contextlib.contextmanager
def memory_held(mib: int, index: int = 0) -> Iterator[None]:
    """Hold ``mib`` MiB on GPU ``index`` in another process until the block ends (skips without torch/cupy)."""
    with memory_held_by(mib, index):
        yield


def _used_mib(index: int) -> int:
    with NvmlProbe() as probe:
        return probe.read().gpus[index].memory_used_mib


def _wait_used(index: int, predicate: Any, timeout_s: float = 30.0) -> int:
    """Poll NVML until ``predicate(used_mib)`` holds; returns the value (fails after the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        used = _used_mib(index)
        if predicate(used):
            return used
        if time.monotonic() > deadline:
            pytest.fail(f"GPU {index} memory used stayed at {used} MiB for {timeout_s}s")
        time.sleep(0.2)


def test_nvml_probe_reads_the_same_devices_as_nvidia_smi(real_gpu: None) -> None:
    """Index, UUID, product (spaces as '-'), memory (total less the driver's reserve), used and driver
    version agree with nvidia-smi; all healthy. Run with nothing else on the GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on the PATH")
    query = "index,uuid,name,memory.total,memory.reserved,memory.used,driver_version"
    lines = subprocess.run(
        [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = [[cell.strip() for cell in line.split(",")] for line in lines.splitlines()]
    expected = [(int(i), uuid, product_name(name), True, "") for i, uuid, name, *_ in rows]
    memory = [(int(total) - int(reserved), int(used)) for _, _, _, total, reserved, used, _ in rows]

    with NvmlProbe() as probe:
        reading = probe.read()

    got = [(g.index, g.uuid, g.product, g.healthy, g.reason) for g in reading.gpus]
    # nvidia-smi rounds each MiB figure on its own; the probe works in bytes: 1 MiB apart at most.
    off = [
        (abs(g.memory_total_mib - allocatable) <= 1, abs(g.memory_used_mib - used) <= 1)
        for g, (allocatable, used) in zip(reading.gpus, memory, strict=True)
    ]
    assert (got, reading.driver_version, off) == (expected, rows[0][6], [(True, True)] * len(rows)), (
        [(g.memory_total_mib, g.memory_used_mib) for g in reading.gpus],
        memory,
    )


def test_memory_another_process_holds_shows_in_the_reading_and_goes_away(real_gpu: None) -> None:
    """Holding 8 GiB elsewhere raises memory used by 8 GiB plus at most 2 GiB of CUDA context; freeing it lowers it."""
    baseline = _used_mib(0)
    with memory_held(8192):
        held = _wait_used(0, lambda used: used >= baseline + 8192)
    after = _wait_used(0, lambda used: used <= baseline + 256)
    assert (8192 <= held - baseline <= 8192 + 2048, after <= baseline + 256) == (True, True), (baseline, held, after)


@contextlib.contextmanager
def memory_held_by(mib: int, index: int = 0) -> Iterator[int]:
    """Like :func:`memory_held`, and yields the holder's PID."""
    module = _allocator()
    if module is None:
        pytest.skip("neither torch nor cupy with CUDA is installed to hold GPU memory from another process")
    code = HOLDER[module].format(mib=mib, index=index)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held", f"{module} could not hold {mib} MiB on GPU {index}"
        yield proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def test_per_process_memory_matches_nvidia_smi_and_the_holder_is_found(real_gpu: None) -> None:
    """NvmlProbe(processes=True) lists the same compute processes and MiB as nvidia-smi --query-compute-apps
    (1 MiB apart at most), the holder of 4 GiB among them with 4096 MiB plus its CUDA context, and its cgroup
    names the same pod (or none) as this test's own process, its parent."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on the PATH")
    from gputask.agent.processes import read_cgroup

    with memory_held_by(4096) as pid:
        time.sleep(1)
        lines = subprocess.run([smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, check=True).stdout.strip().splitlines()
        with NvmlProbe(processes=True) as probe:
            reading = probe.read()
    smi_rows = sorted((u.strip(), int(p), int(m)) for u, p, m in (line.split(",") for line in lines if line.strip()))
    ours = sorted((g.uuid, p.pid, p.used_mib) for g in reading.gpus for p in g.processes or ())
    close = [a[:2] == b[:2] and b[2] is not None and abs(a[2] - b[2]) <= 1 for a, b in zip(smi_rows, ours, strict=True)]
    holder = [p.used_mib for p in reading.gpus[0].processes or () if p.pid == pid]
    assert (len(smi_rows) == len(ours), all(close), len(holder), 4096 <= (holder or [0])[0] <= 4096 + 2048,
            read_cgroup(pid) == read_cgroup(os.getpid())) == (True, True, 1, True, True), (smi_rows, ours)


@contextlib.asynccontextmanager
async def agent_process(cluster: Cluster) -> AsyncIterator[None]:
    """``gputask agent`` on the real GPUs (no --fake-gpus) against the emulator, stopped with SIGTERM."""
    args = ["agent", "--node-name", NODE, "--interval", "200ms", "--metrics-port", "0"]
    proc = await gputask_command(cluster, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
        assert proc.returncode == 0, output.decode()


async def gpunode_status(cluster: Cluster, predicate: Any) -> dict[str, Any] | None:
    """The GPUNode's status once ``predicate(status)`` holds, else None."""
    try:
        obj = await cluster.client.get(GPUNODES, NODE)
    except NotFound:
        return None
    status = obj.get("status") or {}
    return status if status.get("gpus") and predicate(status) else None


def mib(quantity: str) -> int:
    """'143771Mi' -> 143771 (the agent writes memory as Mi quantities)."""
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


async def test_agent_on_the_real_gpu_and_the_operator_keep_tasks_off_foreign_memory(
    real_gpu: None, cluster: Cluster
) -> None:
    """The agent publishes the real GPU; with all but 20 GiB held by another process a 40Gi task waits
    (NoFit) and an 8Gi task is pinned to the real UUID."""
    with NvmlProbe() as probe:
        gpu0 = probe.read().gpus[0]
    await add_ready_node(cluster, NODE)
    await cluster.add_queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": 8}])
    hold = gpu0.memory_total_mib - 20480 - gpu0.memory_used_mib
    with memory_held(hold):
        async with agent_process(cluster):
            status = await eventually(
                lambda: gpunode_status(cluster, lambda s: mib(s["gpus"][0]["memoryUsed"]) >= hold), timeout_s=60
            )
            async with running_operator(cluster):
                await cluster.submit(gputask("big", gpuMemory="40Gi"))
                await cluster.submit(gputask("small", gpuMemory="8Gi"))
                job = await eventually(lambda: _job(cluster, "small-1"), timeout_s=30)
                big_waits = await eventually(lambda: _admitted(cluster, "big"), timeout_s=30)
    placement = json.loads(job["metadata"]["annotations"]["gputask.io/placement"])
    want = {"node": NODE, "uuids": [gpu0.uuid], "indices": [0], "memoryMiB": [8192]}
    assert (status["gpus"][0]["uuid"], status["gpus"][0]["memory"], placement, big_waits) == (
        gpu0.uuid,
        f"{gpu0.memory_total_mib}Mi",
        want,
        ("False", "NoFit", "0/1 nodes fit: 1 no GPU with 40960 MiB free (position 0 in GPUClusterQueue 'default')"),
    )


async def _admitted(cluster: Cluster, name: str) -> tuple[str, str, str] | None:
    """(status, reason, message) of the task's Admitted condition once it has one."""
    for c in (await cluster.task(name)).get("status", {}).get("conditions", []):
        if c["type"] == "Admitted":
            return c["status"], c["reason"], c["message"]
    return None


async def _job(cluster: Cluster, name: str) -> dict[str, Any] | None:
    try:
        return await cluster.client.get(JOBS, name, "default")
    except NotFound:
        return None
