"""The agent's /metrics series and /healthz, and the ``gputask agent`` command's input errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gputask.agent import GpuReading, NodeReading, ProbeUnavailable
from gputask.agent.metrics import AgentMetrics, start_http
from gputask.agent.probe import NVML_HINT
from gputask.cli import app

READING = NodeReading(
    "550.54.15",
    "12.4",
    (
        GpuReading(0, "GPU-a", "NVIDIA-A10", 24576, 1024),
        GpuReading(1, "GPU-b", "NVIDIA-A10", 24576, 0, None, False, "XID 79"),
    ),
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every gputask_agent sample of an exposition, keyed by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("gputask_agent_") and not s.name.endswith("_created")
    }


def gpu_labels(index: int, uuid: str) -> tuple[tuple[str, str], ...]:
    """The sorted labels of one GPU series."""
    return (("gpu", str(index)), ("node", "n1"), ("product", "NVIDIA-A10"), ("uuid", uuid))


def test_metrics_expose_memory_in_bytes_and_health_per_gpu() -> None:
    """Each GPU has total and used memory in bytes and a 0/1 health series; error counters start at 0."""
    metrics = AgentMetrics("n1")
    metrics.observe(READING)
    metrics.api_failed()
    a, b = gpu_labels(0, "GPU-a"), gpu_labels(1, "GPU-b")
    assert samples(metrics.exposition().decode()) == {
        ("gputask_agent_gpu_memory_total_bytes", a): 24576 * 2**20,
        ("gputask_agent_gpu_memory_total_bytes", b): 24576 * 2**20,
        ("gputask_agent_gpu_memory_used_bytes", a): 1024 * 2**20,
        ("gputask_agent_gpu_memory_used_bytes", b): 0.0,
        ("gputask_agent_gpu_healthy", a): 1.0,
        ("gputask_agent_gpu_healthy", b): 0.0,
        ("gputask_agent_probe_errors_total", (("node", "n1"),)): 0.0,
        ("gputask_agent_api_errors_total", (("node", "n1"),)): 1.0,
    }


def test_metrics_drop_series_of_gpus_that_disappear() -> None:
    """A GPU missing from the next reading loses its series."""
    metrics = AgentMetrics("n1")
    metrics.observe(READING)
    metrics.observe(NodeReading("550.54.15", "12.4", READING.gpus[:1]))
    names = sorted(k for k in samples(metrics.exposition().decode()) if "gpu_" in k[0])
    assert names == [
        ("gputask_agent_gpu_healthy", gpu_labels(0, "GPU-a")),
        ("gputask_agent_gpu_memory_total_bytes", gpu_labels(0, "GPU-a")),
        ("gputask_agent_gpu_memory_used_bytes", gpu_labels(0, "GPU-a")),
    ]


async def test_http_serves_metrics_and_healthz() -> None:
    """/metrics answers the exposition and /healthz 200 or 503 as the health callback says."""
    metrics = AgentMetrics("n1")
    metrics.observe(READING)
    healthy = [True]
    runner = await start_http(metrics, lambda: healthy[0], port=0, host="127.0.0.1")
    port = runner.addresses[0][1]
    results: list[Any] = []
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
            async with session.get("/metrics") as response:
                body = await response.text()
                results.append(
                    (
                        response.status,
                        response.content_type,
                        ("gputask_agent_gpu_healthy", gpu_labels(0, "GPU-a")) in samples(body),
                    )
                )
            for state in (True, False):
                healthy[0] = state
                async with session.get("/healthz") as response:
                    results.append(response.status)
    finally:
        await runner.cleanup()
    assert results == [(200, "text/plain", True), 200, 503]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "gputask agent: no node name: pass --node-name or set NODE_NAME (a DaemonSet sets it from spec.nodeName)"),
        (["--node-name", "n1", "--fake-gpus", "2x24"], "gputask agent: bad fake GPU group '2x24' in '2x24'"),
        (
            ["--node-name", "n1", "--fake-gpus", "1x8Gi", "--interval", "soon"],
            "gputask agent: --interval: not a duration",
        ),
        (
            ["--node-name", "n1", "--fake-gpus", "1x8Gi", "--heartbeat", "0s"],
            "gputask agent: --heartbeat must be positive",
        ),
        (
            ["--node-name", "n1", "--fake-gpus", "1x8Gi", "--metrics-port", "70000"],
            "gputask agent: --metrics-port must be",
        ),
    ],
)
def test_agent_command_rejects_bad_input_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    """Missing node name, bad fake spec, duration or port: exit code 2 and a clear message."""
    monkeypatch.delenv("NODE_NAME", raising=False)
    result = CliRunner().invoke(app, ["agent", *args])
    assert (result.exit_code, result.stderr.startswith(message)) == (2, True)


def test_agent_command_without_nvml_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without --fake-gpus and without a working NVML, the agent exits 2 saying NVML could not start, and leaves
    the same line as its container's termination message (what kubectl describe pod shows)."""

    class NoNvml:
        def __init__(self, **_: object) -> None:
            pass

        def open(self) -> None:
            raise ProbeUnavailable(f"NVML could not initialise: Driver Not Loaded. {NVML_HINT}")

    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setattr("gputask.agent.main.NvmlProbe", NoNvml)
    monkeypatch.setenv("NODE_NAME", "n1")
    monkeypatch.setenv("TERMINATION_LOG", str(log))
    result = CliRunner().invoke(app, ["agent"])
    line = f"gputask agent: NVML could not initialise: Driver Not Loaded. {NVML_HINT}"
    assert (result.exit_code, result.stderr, log.read_text()) == (2, line + "\n", line)


def test_run_command_refuses_a_liveness_value_that_is_not_a_url() -> None:
    """`gputask run --liveness garbage` exits 2 with one line, before touching any cluster."""
    result = CliRunner().invoke(app, ["run", "--liveness", "garbage"])
    assert (result.exit_code, result.stderr) == (
        2,
        "gputask run: --liveness 'garbage': give a URL such as http://0.0.0.0:8080/healthz\n",
    )


@pytest.mark.parametrize("command", [["run"], ["agent", "--node-name", "n1", "--fake-gpus", "1x8Gi"]])
def test_a_missing_kubeconfig_file_is_named_as_missing(tmp_path: Path, command: list[str]) -> None:
    """`--kubeconfig` naming no file: exit 2, saying the file does not exist."""
    missing = tmp_path / "nope"
    result = CliRunner().invoke(app, [*command, "--kubeconfig", str(missing)])
    name = command[0]
    assert (result.exit_code, result.stderr) == (
        2,
        f"gputask {name}: cannot load the Kubernetes configuration: kubeconfig {missing}: no such file\n",
    )
