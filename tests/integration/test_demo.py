"""``gputask demo``: the real operator on the emulator pins the example tasks, the same way on every run."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gputask import demo
from gputask.config import Config
from gputask.demo import apply, load_manifests, run_demo, run_pods
from gputask.k8s.client import PODS, KubeClient, load_api_client
from gputask.testing import EmulatorServer
from harness import REPO, Cluster, eventually, gputask, running_operator


async def test_demo_places_the_examples_alike_on_every_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two runs print the same pinned Jobs: every task applied before the operator's first cycle, in one second
    of creationTimestamp, so name order decides (three different outcomes came out of seven runs before)."""
    tables = []
    for run in range(2):
        assert await run_demo(keep=False, port=0, workdir=tmp_path / str(run)) == 0
        out = capsys.readouterr().out
        tables.append([tuple(c.strip() for c in row.split("│")[1:-1]) for row in out.splitlines()
                       if re.match(r"│ default/", row)])
    assert tables[0] == tables[1] == [
        ("default/eval-fraction", "node-a", "GPU-7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "2048", "eval-fraction-1"),
        ("default/infer-whole", "node-a", "GPU-3f6c1a2e-8b4d-4e1f-9a7c-2d5e6f7a8b90", "16384", "infer-whole-1"),
        ("default/train-small", "node-b", "GPU-c0ffee00-1234-4abc-9def-0123456789ab", "12288", "train-small-1"),
    ]


async def test_the_demo_runs_each_jobs_pod_so_tasks_run_and_stay(cluster: Cluster) -> None:
    """The demo stands in for the Job controller and kubelet: each pinned Job gets a Running pod on its node, so
    the task goes Running and is not evicted as PodsNotStarting (a trial saw every demo task evicted after 2 min)."""
    await cluster.add_node("node-a", ("GPU-a", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    kubelet = asyncio.create_task(run_pods(cluster.client, interval_s=0.1))
    try:
        async with running_operator(cluster, Config(cycleInterval=0.2, podStartTimeout=2)):
            await cluster.submit(gputask("t", gpuMemory="8Gi"))

            async def running() -> bool:
                return ((await cluster.task("t")).get("status") or {}).get("phase") == "Running"

            assert await eventually(running)
            await asyncio.sleep(3)  # past podStartTimeout
            status = (await cluster.task("t"))["status"]
            pod = (await cluster.client.list(PODS, "default"))[0]
        assert (status["phase"], status["attempt"], pod["spec"]["nodeName"], pod["status"]["phase"]) == (
            "Running", 1, "node-a", "Running")
    finally:
        kubelet.cancel()


async def test_kubectl_apply_after_the_demo_finds_the_examples_unchanged(tmp_path: Path) -> None:
    """The demo applies the examples as kubectl apply would: a later kubectl apply of them warns of no missing
    last-applied-configuration annotation and finds every spec unchanged."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    examples = sorted((REPO / "examples").glob("*.yaml"))
    async with EmulatorServer() as server:
        server.install_crds_from(REPO / "crds")
        config = server.write_kubeconfig(tmp_path / "kubeconfig")
        client = KubeClient(load_api_client(str(config)))
        try:
            for obj in load_manifests(examples):
                await apply(client, obj)
        finally:
            await client.close()
        command = ["kubectl", "--kubeconfig", str(config), "apply", *(f"-f={path}" for path in examples)]
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    # GPUNodes alone are patched: the file's status has a 2024 heartbeat, the demo (the agent) a fresh one; the
    # API server ignores status in a patch of the main resource, as on a real cluster
    changed = [line for line in done.stdout.splitlines() if "unchanged" not in line]
    assert (done.returncode, done.stderr, changed) == (
        0, "", [f"gpunode.gputask.io/node-{n} configured" for n in "abcd"])


async def test_a_misspelled_field_in_an_example_stops_the_demo_saying_which(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An example with gpuMemroy is refused as kubectl apply refuses it, and the demo says so and exits 2."""
    examples = tmp_path / "examples"
    shutil.copytree(REPO / "examples", examples)
    path = examples / "20-gputask.yaml"
    path.write_text(path.read_text().replace("gpuMemory: 12Gi", "gpuMemroy: 12Gi"))
    monkeypatch.setattr(demo, "project_dir", lambda name: examples if name == "examples" else REPO / name)
    code = await demo.run_demo(keep=False, port=0, workdir=tmp_path / "demo")
    assert (code, capsys.readouterr().out.splitlines()[-1]) == (
        2, 'gputask demo: the API server refused an example: GPUTask in version "v1alpha1" cannot be handled as a '
           'GPUTask: strict decoding error: unknown field "spec.gpuMemroy"')
