# ruff: noqa: E501  (output snapshots are the commands' lines verbatim)
"""``gputask get``, ``explain`` and ``top`` against the emulator with the real operator: output snapshots.

One cluster: node-a with two 24Gi A10s, node-t with a 24Gi L4 tainted ``dedicated=infer:NoSchedule``;
GPUClusterQueue ``default`` (2 GPUs) and ``tight`` (500m). Five tasks: two admitted, one blocked by
quota, one by memory, one by the taint. Only the AGE column is normalised (it is wall-clock time).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from gputask.cli import app
from gputask.k8s.client import GPUNODES, GPUTASKS, NODES
from harness import Cluster, eventually, gpunode, gputask, running_operator

A10, L4 = "NVIDIA-A10", "NVIDIA-L4"
EXPECTED_REASONS = {
    "big": ("Admitted", "Admitted"),
    "half": ("Admitted", "Admitted"),
    "more": ("Pending", "QuotaExceeded"),
    "mem": ("Pending", "NoFit"),
    "on-l4": ("Pending", "Inadmissible"),
}


SNAPSHOTS = {  # noqa: E501 (the commands' lines, verbatim)
    'get tasks': (
        'NAME   QUEUE    CLUSTERQUEUE  PHASE     POS  NODE    GPUS  MEMORY  REASON         AGE\n'
        'big    default  default       Admitted  -    node-a  1     20Gi    Admitted       <age>\n'
        'half   tight    tight         Admitted  -    node-a  1     8Gi     Admitted       <age>\n'
        'mem    default  default       Pending   0    -       1     20Gi    NoFit          <age>\n'
        'more   tight    tight         Pending   0    -       1     8Gi     QuotaExceeded  <age>\n'
        'on-l4  default  default       Pending   1    -       1     4Gi     Inadmissible   <age>\n'
    ),
    'get queues': (
        'NAME     COHORT  PENDING  ADMITTED  ACTIVE  USAGE\n'
        'default  -       2        1         yes     nvidia.com/gpu 834m/2000m\n'
        'tight    -       1        1         yes     nvidia.com/gpu 334m/500m\n'
    ),
    'get nodes': (
        'NODE    SCHEDULABLE  GPUS           RESERVED MIB  FOREIGN MIB  FREE MIB  TOTAL MIB  TASKS\n'
        'node-a  yes          2x NVIDIA-A10  28672         0            20480     49152      2\n'
        'node-t  yes          1x NVIDIA-L4   0             0            24576     24576      0\n'
    ),
    'top gpus': (
        'NODE    GPU  PRODUCT     RESERVED MIB  FOREIGN MIB  FREE MIB  TOTAL MIB  TASKS (MIB)\n'
        'node-a  0    NVIDIA-A10  20480         0            4096      24576      default/big (20480)\n'
        'node-a  1    NVIDIA-A10  8192          0            16384     24576      default/half (8192)\n'
        'node-t  0    NVIDIA-L4   0             0            24576     24576\n'
    ),
    'explain more': (
        "default/more: Pending (QuotaExceeded: quota of nvidia.com/gpu in GPUClusterQueue 'tight' has 166 milli-GPU left (position 0 in GPUClusterQueue 'tight'))\n"
        'GPUClusterQueue: tight (through GPULocalQueue tight); priority 0\n'
        "Position: 0 of 1 waiting in 'tight' (0 = head)\n"
        '\n'
        'placement\n'
        '  quota nvidia.com/gpu: needs 334 milli-GPU, 166 left (short by 168)\n'
        '  nodes: 1/2 fit now\n'
        '    node-a: fits, but its charge there exceeds the quota of nvidia.com/gpu\n'
        '    node-t: TaintToleration: had untolerated taint {dedicated: infer}\n'
        "  preemption: none: GPUClusterQueue 'tight' preempts nothing (withinClusterQueue and reclaimWithinCohort are Never)\n"
        '\n'
        'Smallest changes that would let it in\n'
        "  - quota: GPUClusterQueue 'tight' needs 168m GPU more of nvidia.com/gpu (raise nominalQuota or borrowingLimit, or wait for its running tasks to finish)\n"
        '  - request: gpuMemory 4079Mi or less (per GPU) fits the quota left, on node node-a\n'
    ),
    'explain mem': (
        "default/mem: Pending (NoFit: 0/2 nodes fit: 1 had untolerated taint {dedicated: infer}, 1 no GPU with 20480 MiB free (position 0 in GPUClusterQueue 'default'))\n"
        'GPUClusterQueue: default (through GPULocalQueue default); priority 0\n'
        "Position: 0 of 2 waiting in 'default' (0 = head)\n"
        '\n'
        'placement\n'
        '  quota nvidia.com/gpu: needs 834 milli-GPU, 1166 left (ok)\n'
        '  nodes: 0/2 fit now\n'
        '    node-a: GPU: no GPU with 20480 MiB free\n'
        '    node-t: TaintToleration: had untolerated taint {dedicated: infer}\n'
        "  preemption: none: GPUClusterQueue 'default' preempts nothing (withinClusterQueue and reclaimWithinCohort are Never)\n"
        '\n'
        'Smallest changes that would let it in\n'
        '  - memory: 4096 MiB more free on node node-a GPU 1 would let it in (when tasks there finish or are preempted, held by default/half)\n'
        '  - request: gpuMemory 16384Mi or less (per GPU) fits node node-a now\n'
        '  - taint: tolerating dedicated=infer:NoSchedule would let it onto node node-t now\n'
    ),
    'explain on-l4': (
        "default/on-l4: Pending (Inadmissible: no node could ever hold it: 0/2 nodes fit: 1 had untolerated taint {dedicated: infer}, 1 no GPU of product ['NVIDIA-L4'] (position 1 in GPUClusterQueue 'default'))\n"
        'GPUClusterQueue: default (through GPULocalQueue default); priority 0\n'
        "Position: 1 of 2 waiting in 'default' (0 = head)\n"
        '\n'
        'placement\n'
        '  quota nvidia.com/gpu: needs 167 milli-GPU, 1166 left (ok)\n'
        '  nodes: 0/2 fit now\n'
        "    node-a: GPU: no GPU of product ['NVIDIA-L4']\n"
        '    node-t: TaintToleration: had untolerated taint {dedicated: infer}\n'
        "  preemption: none: GPUClusterQueue 'default' preempts nothing (withinClusterQueue and reclaimWithinCohort are Never)\n"
        '\n'
        'Smallest changes that would let it in\n'
        '  - taint: tolerating dedicated=infer:NoSchedule would let it onto node node-t now\n'
    ),
    'explain big': (
        "default/big: Admitted (Admitted: Admitted by GPUClusterQueue 'default' on node-a GPUs [0] (20480 MiB each))\n"
        'GPUClusterQueue: default (through GPULocalQueue default); priority 0\n'
        'Admitted on node node-a.\n'
    ),
}


async def seed(cluster: Cluster) -> None:
    """The nodes, queues and tasks above, in creation order (names sort in the same order)."""
    await cluster.add_node("node-a", ("GPU-a0", A10, "24Gi"), ("GPU-a1", A10, "24Gi"))
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-t", "labels": {"kubernetes.io/hostname":
            "node-t"}}, "spec": {"taints": [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}}
    await cluster.client.create(NODES, node)
    await cluster.client.patch(NODES, "node-t", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                               status=True)
    body = gpunode("node-t", ("GPU-t0", L4, "24Gi"))
    await cluster.client.create(GPUNODES, {k: v for k, v in body.items() if k != "status"})
    await cluster.client.patch(GPUNODES, "node-t", {"status": body["status"]}, status=True)
    await cluster.add_queue("default", resources=[{"name": "nvidia.com/gpu", "nominalQuota": 2}])
    await cluster.add_queue("tight", resources=[{"name": "nvidia.com/gpu", "nominalQuota": "500m"}])
    await cluster.submit(gputask("big", gpuMemory="20Gi"))
    await cluster.submit(gputask("half", queueName="tight", gpuMemory="8Gi"))


async def report_used(cluster: Cluster) -> None:
    """What the agent reports once big and half run: their memory in use on node-a's GPUs (not foreign use)."""
    gpus = (await cluster.client.get(GPUNODES, "node-a"))["status"]["gpus"]
    for gpu, used in zip(gpus, ("20Gi", "8Gi"), strict=True):
        gpu["memoryUsed"] = used
    await cluster.client.patch(GPUNODES, "node-a", {"status": {"gpus": gpus}}, status=True)


async def settle(cluster: Cluster, names: tuple[str, ...]) -> None:
    async def done() -> bool:
        found = {}
        for obj in await cluster.client.list(GPUTASKS):
            status = obj.get("status") or {}
            reason = next((c["reason"] for c in status.get("conditions") or [] if c["type"] == "Admitted"), "")
            found[obj["metadata"]["name"]] = (status.get("phase"), reason)
        return all(found.get(n) == EXPECTED_REASONS[n] for n in names)

    await eventually(done)


async def cli(cluster: Cluster, *args: str) -> tuple[int, str]:
    """Run ``gputask ARGS --kubeconfig <emulator>`` in a thread (the command runs its own event loop)."""
    result = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--kubeconfig", str(cluster.kubeconfig)])
    return result.exit_code, result.output


def aged(text: str) -> str:
    """The AGE column (last) as ``<age>``."""
    return re.sub(r"(?<=  )\d+[smhd]$", "<age>", text, flags=re.M)


async def test_live_commands_answer_for_quota_memory_and_taint(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await seed(cluster)
        await settle(cluster, ("big", "half"))
        await report_used(cluster)
        for name, spec in (("more", {"queueName": "tight", "gpuMemory": "8Gi"}), ("mem", {"gpuMemory": "20Gi"}),
                           ("on-l4", {"gpuMemory": "4Gi", "gpuProducts": [L4]})):
            await cluster.submit(gputask(name, **spec))
        await settle(cluster, tuple(EXPECTED_REASONS))
        outputs = {args: await cli(cluster, *args.split()) for args in (
            "get tasks", "get queues", "get nodes", "top gpus", "explain more", "explain mem", "explain on-l4",
            "explain big")}
    assert {k: (code, aged(text)) for k, (code, text) in outputs.items()} == {
        k: (0, v) for k, v in SNAPSHOTS.items()}


async def test_live_commands_json_all_namespaces_and_errors(cluster: Cluster, tmp_path: Path) -> None:
    """-A adds the namespace; -o json gives the rows; a missing task exits 1, a bad kubeconfig or context 2,
    each with one line on stderr."""
    async with running_operator(cluster):
        await seed(cluster)
        await settle(cluster, ("big", "half"))
    code, text = await cli(cluster, "get", "tasks", "-A")
    assert (code, aged(text).splitlines()[:2]) == (0, [
        "NAMESPACE  NAME  QUEUE    CLUSTERQUEUE  PHASE     POS  NODE    GPUS  MEMORY  REASON    AGE",
        "default    big   default  default       Admitted  -    node-a  1     20Gi    Admitted  <age>",
    ])
    code, text = await cli(cluster, "get", "tasks", "-n", "elsewhere")
    assert (code, text) == (0, "No GPUTasks found in elsewhere namespace.\n")
    code, text = await cli(cluster, "top", "gpus", "-o", "json")
    rows = json.loads(text)
    assert (code, [(r["node"], r["gpu"], r["free_mib"], r["tasks"]) for r in rows]) == (0, [
        ("node-a", 0, 4096, ["default/big (20480)"]), ("node-a", 1, 16384, ["default/half (8192)"]),
        ("node-t", 0, 24576, []),
    ])
    code, text = await cli(cluster, "explain", "default/nothing")
    assert (code, text) == (1, 'gputask: GPUTask "nothing" not found in namespace default\n')
    runner = CliRunner()
    missing = await asyncio.to_thread(runner.invoke, app, ["get", "nodes", "--kubeconfig", str(tmp_path / "none")])
    assert (missing.exit_code, missing.output) == (
        2, f"gputask: cannot load the Kubernetes configuration: kubeconfig {tmp_path / 'none'}: no such file\n")
    garbage = tmp_path / "garbage.kubeconfig"
    garbage.write_text("garbage: [\n")
    broken = await asyncio.to_thread(runner.invoke, app, ["get", "tasks", "--kubeconfig", str(garbage)])
    assert (broken.exit_code, broken.output.startswith(f"gputask: cannot read the kubeconfig {garbage}: "),
            broken.output.count("\n")) == (2, True, 1)
    bad = await cli(cluster, "get", "tasks", "--context", "nope")
    assert bad[0] == 2 and bad[1].startswith("gputask: context 'nope' is not in the kubeconfig (it has: ")
    assert bad[1].count("\n") == 1
    wrong = await cli(cluster, "get", "queues", "-o", "yaml")
    assert wrong == (2, "gputask: --output 'yaml': choose table or json\n")


async def test_refused_gpunode_entries_are_summed_up_in_one_stderr_line(cluster: Cluster) -> None:
    """Refused GPUNode entries give each command one stderr line with their count, not one log line each."""
    body = gpunode("node-x", ("GPU-x0", A10, "1Ei"), ("GPU-x1", A10, "2Ei"), ("GPU-x2", A10, "24Gi"))
    await cluster.client.create(GPUNODES, {k: v for k, v in body.items() if k != "status"})
    await cluster.client.patch(GPUNODES, "node-x", {"status": body["status"]}, status=True)
    result = await asyncio.to_thread(CliRunner().invoke, app, ["get", "nodes", "--kubeconfig", str(cluster.kubeconfig)])
    assert (result.exit_code, result.stderr) == (
        0, "gputask: 2 GPUNode entries refused on node-x (kubectl describe gpunode NAME says why)\n")


async def test_get_tasks_names_the_local_queue_as_written_and_the_cluster_queue_apart(cluster: Cluster) -> None:
    """QUEUE is always the GPULocalQueue the task names, CLUSTERQUEUE what it resolves to ('-' while none), and
    MEMORY what it asks before the operator wrote a status."""
    await cluster.submit(gputask("lost", queueName="nowhere", gpuMemory="6Gi"))
    await cluster.submit(gputask("whole", queueName="nowhere", gpus=2))
    code, text = await cli(cluster, "get", "tasks")
    assert (code, aged(text)) == (0, (
        "NAME   QUEUE    CLUSTERQUEUE  PHASE    POS  NODE  GPUS  MEMORY     REASON  AGE\n"
        "lost   nowhere  -             Pending  -    -     1     6Gi                <age>\n"
        "whole  nowhere  -             Pending  -    -     2     whole GPU          <age>\n"
    ))
