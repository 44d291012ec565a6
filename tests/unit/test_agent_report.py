"""The agent's Reporter: GPUNode body, change detection, heartbeat, backoff, adoption, bad readings."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest

import crdschema
from gputask.agent import FakeProbe, GpuReading, NodeReading, ProbeError, fake_uuid
from gputask.agent.attribution import HOST_PID_MESSAGE
from gputask.agent.report import MIG_REASON, Reporter, device_view, gpu_summary, gpunode_status
from gputask.core.model import GpuLink
from gputask.k8s.client import AlreadyExists, ApiError, NotFound, Resource
from gputask.manifests.convert import node_from_gpunode, reported_used_mib

REPO = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"
NODE_UID = "0c5a-node-uid"
START = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
U0, U1 = fake_uuid(NODE, 0), fake_uuid(NODE, 1)


class RecordingClient:
    """An in-memory KubeClient stand-in that records calls and raises queued errors."""

    def __init__(self, *, node: bool = True) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, ...]] = []
        self.errors: list[Exception] = []  # raised by the next calls, in order
        if node:
            self.add_node()

    def add_node(self) -> None:
        self.objects[("nodes", NODE)] = {"metadata": {"name": NODE, "uid": NODE_UID}}

    def _enter(self, *call: str) -> None:
        self.calls.append(call)
        if self.errors:
            raise self.errors.pop(0)

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        self._enter("get", res.plural, name)
        if (res.plural, name) not in self.objects:
            raise NotFound(404, "NotFound", name)
        return copy.deepcopy(self.objects[(res.plural, name)])

    async def create(self, res: Resource, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self._enter("create", res.plural, name)
        if (res.plural, name) in self.objects:
            raise AlreadyExists(409, "AlreadyExists", name)
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = "1"
        self.objects[(res.plural, name)] = stored
        return copy.deepcopy(stored)

    async def patch(
        self, res: Resource, name: str, patch: dict[str, Any], namespace: str | None = None, *, status: bool = False
    ) -> dict[str, Any]:
        self._enter("patch-status" if status else "patch", res.plural, name)
        if (res.plural, name) not in self.objects:
            raise NotFound(404, "NotFound", name)
        obj = self.objects[(res.plural, name)]
        if status:
            obj["status"] = copy.deepcopy(patch["status"])
        else:
            obj["metadata"] |= copy.deepcopy(patch["metadata"])
        return copy.deepcopy(obj)


class Clock:
    """A settable monotonic clock with a matching wall clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> dt.datetime:
        return START + dt.timedelta(seconds=self.now - 1000.0)


def make(client: RecordingClient, probe: Any = None, **kwargs: Any) -> tuple[Reporter, Any, Clock]:
    """A Reporter on ``client`` with a 2x24Gi A10 FakeProbe and a fake clock."""
    probe = probe or FakeProbe.from_spec("2xNVIDIA-A10:24Gi", node_name=NODE)
    clock = Clock()
    reporter = Reporter(
        client, probe, NODE, interval_s=10, heartbeat_s=30, clock=clock.monotonic, wall_clock=clock.wall, **kwargs
    )
    return reporter, probe, clock


def gpu(index: int, uuid: str, used: str = "0Mi", healthy: bool = True, reason: str = "") -> dict[str, Any]:
    """A status.gpus entry of the 24Gi A10s."""
    return {
        "index": index,
        "uuid": uuid,
        "product": "NVIDIA-A10",
        "memory": "24576Mi",
        "memoryUsed": used,
        "healthy": healthy,
        "reason": reason,
    }


NO_ATTRIBUTION = {
    "podResources": {"available": False, "reason": "Disabled",
                     "message": "the agent was started without a PodResources socket", "pods": []},
    "processMemory": {"available": False, "reason": "HostPIDDisabled", "message": HOST_PID_MESSAGE},
}
"""What a reporter without a PodResources socket and without the host's PID namespace says of GPU users."""


def status(*gpus: dict[str, Any], at: str = "2026-11-29T12:00:00Z") -> dict[str, Any]:
    """A whole GPUNode status from the fake probe (its GPUs are all 24Gi A10s), with no attribution."""
    summary = f"{len(gpus)}x NVIDIA-A10 ({24 * len(gpus)}Gi)"
    return {"gpus": list(gpus), "driverVersion": "fake", "cudaVersion": "fake", "heartbeatTime": at, "summary": summary,
            **NO_ATTRIBUTION}


OWNER = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID}
LABELS = {"app.kubernetes.io/managed-by": "gputask-agent"}


async def test_first_tick_creates_the_exact_gpunode() -> None:
    """The first tick creates the GPUNode named after the Node, owned by it, then writes its status."""
    client = RecordingClient()
    reporter, _, _ = make(client)
    await reporter.tick()
    assert (client.objects[("gpunodes", NODE)], client.calls) == (
        {
            "apiVersion": "gputask.io/v1alpha1",
            "kind": "GPUNode",
            "metadata": {"name": NODE, "labels": LABELS, "ownerReferences": [OWNER], "resourceVersion": "1"},
            "spec": {},
            "status": status(gpu(0, U0), gpu(1, U1)),
        },
        [
            ("get", "gpunodes", NODE),
            ("get", "nodes", NODE),
            ("create", "gpunodes", NODE),
            ("patch-status", "gpunodes", NODE),
        ],
    )


async def test_no_patch_when_nothing_changed_and_heartbeat_not_due() -> None:
    """Ticks within the heartbeat interval with an unchanged view make no API call."""
    client = RecordingClient()
    reporter, _, clock = make(client)
    await reporter.tick()
    client.calls.clear()
    for _ in range(2):
        clock.now += 10
        await reporter.tick()
    assert client.calls == []


async def test_patch_on_change() -> None:
    """A GPU turning unhealthy is patched at the next tick, with its reason."""
    client = RecordingClient()
    reporter, probe, clock = make(client)
    await reporter.tick()
    client.calls.clear()
    probe.set_health(1, False, "XID 79")
    clock.now += 10
    await reporter.tick()
    assert (client.calls, client.objects[("gpunodes", NODE)]["status"]) == (
        [("patch-status", "gpunodes", NODE)],
        status(gpu(0, U0), gpu(1, U1, healthy=False, reason="XID 79"), at="2026-11-29T12:00:10Z"),
    )


async def test_small_used_memory_changes_wait_for_the_heartbeat() -> None:
    """A used-memory change below used_change_mib is not a change; a larger one is patched at once."""
    client = RecordingClient()
    reporter, probe, clock = make(client, used_change_mib=256)
    await reporter.tick()
    client.calls.clear()
    seen = []
    for used in (100, 255, 2048):
        probe.set_used(0, used)
        clock.now += 1
        await reporter.tick()
        seen.append((used, len(client.calls)))
    assert (seen, client.objects[("gpunodes", NODE)]["status"]["gpus"][0]) == (
        [(100, 0), (255, 0), (2048, 1)],
        gpu(0, U0, used="2048Mi"),
    )


async def test_heartbeat_patch_when_nothing_changed() -> None:
    """With no change, the status is patched again once heartbeat_s has passed, with a new heartbeatTime."""
    client = RecordingClient()
    reporter, _, clock = make(client)
    await reporter.tick()
    client.calls.clear()
    clock.now += 30
    await reporter.tick()
    assert (client.calls, client.objects[("gpunodes", NODE)]["status"]) == (
        [("patch-status", "gpunodes", NODE)],
        status(gpu(0, U0), gpu(1, U1), at="2026-11-29T12:00:30Z"),
    )


async def test_api_errors_back_off_exponentially_up_to_the_cap_and_never_raise() -> None:
    """Each API failure doubles the wait before the next API attempt (capped); probing goes on; success resets."""
    client = RecordingClient()
    reporter, _, clock = make(client, backoff_initial_s=1, backoff_max_s=4)
    client.errors = [ApiError(500, "InternalError", "etcd")] * 4
    waits, attempts = [], []
    for _ in range(4):
        await reporter.tick()
        waits.append(reporter.retry_at - clock.now)
        calls_before = len(client.calls)
        clock.now += reporter.retry_at - clock.now - 0.5
        await reporter.tick()  # still backing off: no API call
        attempts.append(len(client.calls) - calls_before)
        clock.now += 0.5
    await reporter.tick()
    assert (waits, attempts, reporter.failures, reporter.healthy(), "status" in client.objects[("gpunodes", NODE)]) == (
        [1, 2, 4, 4],
        [0, 0, 0, 0],
        0,
        True,
        True,
    )


async def test_unreachable_api_is_counted_in_metrics() -> None:
    """An unreachable API server counts in gputask_agent_api_errors_total."""
    client = RecordingClient()
    reporter, _, _ = make(client)
    client.errors = [ApiError(0, "Unreachable", "connection refused")]
    await reporter.tick()
    value = reporter.metrics.registry.get_sample_value("gputask_agent_api_errors_total", {"node": NODE})
    assert (value, reporter.failures) == (1.0, 1)


async def test_missing_node_creates_without_owner_then_adopts() -> None:
    """Without the Node the GPUNode is created unowned; once the Node exists the ownerReference is added."""
    client = RecordingClient(node=False)
    reporter, _, clock = make(client)
    await reporter.tick()
    unowned = copy.deepcopy(client.objects[("gpunodes", NODE)]["metadata"])
    clock.now += 10
    await reporter.tick()  # still no Node: nothing to adopt yet
    client.add_node()
    client.calls.clear()
    clock.now += 10
    await reporter.tick()
    assert (unowned, client.calls, client.objects[("gpunodes", NODE)]["metadata"]) == (
        {"name": NODE, "labels": LABELS, "resourceVersion": "1"},
        [("get", "nodes", NODE), ("get", "gpunodes", NODE), ("patch", "gpunodes", NODE)],
        {"name": NODE, "labels": LABELS, "resourceVersion": "1", "ownerReferences": [OWNER]},
    )


async def test_a_missing_node_is_warned_about_once_until_it_appears(caplog: pytest.LogCaptureFixture) -> None:
    """Three ticks without the Node log one warning, not three; the rest go to debug."""
    client = RecordingClient(node=False)
    reporter, _, clock = make(client)
    with caplog.at_level(logging.DEBUG, logger="gputask.agent"):
        for _ in range(3):
            await reporter.tick()
            clock.now += 10
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "not found" in r.getMessage()]
    text = f"Node {NODE} not found; GPUNode without ownerReference for now"
    assert said == [("WARNING", text), ("DEBUG", text), ("DEBUG", text)]


async def test_existing_gpunode_is_reused_and_status_refreshed_at_start() -> None:
    """A restarted agent finds its GPUNode (owned already) and patches its status at once."""
    client = RecordingClient()
    client.objects[("gpunodes", NODE)] = {"metadata": {"name": NODE, "ownerReferences": [OWNER]}}
    reporter, _, _ = make(client)
    await reporter.tick()
    assert client.calls == [("get", "gpunodes", NODE), ("patch-status", "gpunodes", NODE)]


async def test_deleted_gpunode_is_recreated() -> None:
    """When the GPUNode vanishes, the failed patch leads to a re-create at the next attempt."""
    client = RecordingClient()
    reporter, probe, clock = make(client)
    await reporter.tick()
    del client.objects[("gpunodes", NODE)]
    probe.set_used(0, 4096)
    clock.now += 10
    await reporter.tick()
    clock.now += 10
    await reporter.tick()
    assert client.objects[("gpunodes", NODE)]["status"] == status(
        gpu(0, U0, used="4096Mi"), gpu(1, U1), at="2026-11-29T12:00:20Z"
    )


async def test_mig_enabled_gpu_is_reported_unschedulable() -> None:
    """A GPU in MIG mode is published healthy: false with the MIG reason (gputask places whole GPUs)."""

    class MigProbe:
        def read(self) -> NodeReading:
            return NodeReading("550", "12.4", (GpuReading(0, "GPU-m", "NVIDIA-A100", 40960, 0, "Enabled"),))

        def close(self) -> None: ...

    client = RecordingClient()
    reporter, _, _ = make(client, MigProbe())
    await reporter.tick()
    assert client.objects[("gpunodes", NODE)]["status"]["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-m",
            "product": "NVIDIA-A100",
            "memory": "40960Mi",
            "memoryUsed": "0Mi",
            "healthy": False,
            "reason": MIG_REASON,
        }
    ]


class ScriptedProbe:
    """Returns or raises the scripted values in turn."""

    def __init__(self, *results: Any) -> None:
        self.results = list(results)

    def read(self) -> Any:
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None: ...


async def test_malformed_readings_never_crash_the_reporter() -> None:
    """Garbage from a probe is counted or dropped entry by entry; good entries are still published."""
    good = GpuReading(0, "GPU-good", "NVIDIA A10", 24576, 10)
    bad_entries = (
        good,
        GpuReading(0, "GPU-dup", "x", 1, 0),  # duplicate index
        GpuReading(-1, "GPU-neg", "x", 1, 0),
        GpuReading(2, "", "x", 1, 0),
        GpuReading(3, "GPU-mem", "x", -5, 0),
        GpuReading(4, "GPU-h", "x", 1, 0, None, "yes"),  # type: ignore[arg-type]
        "not a reading",
    )
    probe = ScriptedProbe(
        None,
        RuntimeError("driver bug"),
        ProbeError("NVML wedged"),
        NodeReading(None, 12, bad_entries),  # type: ignore[arg-type]
    )
    client = RecordingClient()
    reporter, _, _ = make(client, probe)
    for _ in range(4):
        await reporter.tick()
    errors = reporter.metrics.registry.get_sample_value("gputask_agent_probe_errors_total", {"node": NODE})
    assert (errors, client.objects[("gpunodes", NODE)]["status"]) == (
        3.0,
        {
            "gpus": [
                {
                    "index": 0,
                    "uuid": "GPU-good",
                    "product": "NVIDIA-A10",
                    "memory": "24576Mi",
                    "memoryUsed": "10Mi",
                    "healthy": True,
                    "reason": "",
                }
            ],
            "driverVersion": "",
            "cudaVersion": "12",
            "heartbeatTime": "2026-11-29T12:00:00Z",
            "summary": "1x NVIDIA-A10 (24Gi)",
            **NO_ATTRIBUTION,
        },
    )


async def test_healthz_follows_the_last_successful_probe() -> None:
    """healthy() is False before any probe, True after one, False once three intervals pass without one."""
    probe = FakeProbe.from_spec("1x8Gi", node_name=NODE)
    reporter, _, clock = make(RecordingClient(), probe)
    states = [reporter.healthy()]
    await reporter.tick()
    states.append(reporter.healthy())
    probe.set_failure("NVML wedged")
    clock.now += 30
    await reporter.tick()
    states.append(reporter.healthy())
    clock.now += 1
    states.append(reporter.healthy())
    assert states == [False, True, True, False]


async def test_run_survives_a_raising_tick_and_stops_on_the_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """run() logs an exception from tick, keeps looping, and returns once the stop event is set."""
    reporter, _, _ = make(RecordingClient())
    reporter.interval_s = 0.01
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 1:
            raise RuntimeError("bug")
        if ticks == 3:
            stop.set()

    stop = asyncio.Event()
    monkeypatch.setattr(reporter, "tick", tick)
    await asyncio.wait_for(reporter.run(stop), timeout=5)
    assert ticks == 3


async def test_published_gpunode_satisfies_the_crd_schema() -> None:
    """The stored GPUNode, with healthy, XID, MIG and never-read devices, validates against crds/ (strict fields)."""
    reading = NodeReading(
        "550.54.15",
        "12.4",
        (
            GpuReading(0, "GPU-a", "NVIDIA A10", 24576, 513),
            GpuReading(1, "GPU-b", "NVIDIA-A10", 24576, 0, None, False, "XID 79"),
            GpuReading(2, "GPU-c", "NVIDIA-A100", 40960, 0, "Enabled"),
            GpuReading(3, "GPU-unknown-index-3", "unknown", 0, 0, None, False, "nvmlDeviceGetUUID: GPU is lost"),
        ),
    )
    client = RecordingClient()
    reporter, _, _ = make(client, ScriptedProbe(reading))
    await reporter.tick()
    validator = crdschema.validator_for(crdschema.load_crds(REPO / "crds")["GPUNode"])
    obj = client.objects[("gpunodes", NODE)]
    assert (len(obj["status"]["gpus"]), [e.message for e in validator.iter_errors(obj)]) == (4, [])


def test_a_reading_captured_on_a_real_h200_publishes_a_valid_gpunode_the_operator_reads() -> None:
    """tests/fixtures/nvml_reading_h200.json (bench/agent_probe_capture.py on an H200, driver 580.159.04):
    the reading gives the captured status again, the CRD schema accepts it, and the operator sees one
    143155 MiB NVIDIA-H200 (143771 MiB less the driver's 616 MiB reserve) with nothing used."""
    captured = json.loads((REPO / "tests/fixtures/nvml_reading_h200.json").read_text())
    raw = captured["reading"]
    reading = NodeReading(raw["driver_version"], raw["cuda_version"], tuple(GpuReading(**g) for g in raw["gpus"]))
    status = gpunode_status(device_view(reading), dt.datetime(2026, 11, 29, tzinfo=dt.UTC))
    heartbeat = status.pop("heartbeatTime")
    body = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "h200"}}
    validator = crdschema.validator_for(crdschema.load_crds(REPO / "crds")["GPUNode"])
    errors = [e.message for e in validator.iter_errors({**body, "status": {**status, "heartbeatTime": heartbeat}})]
    node, rejected = node_from_gpunode("h200", status)
    uuid = "GPU-66d1363a-506b-c90f-6d07-09ad89e1817c"
    assert (status, errors, rejected) == (captured["gpunodeStatus"], [], [])
    assert [(g.index, g.uuid, g.product, g.memory_mib) for g in node.gpus] == [(0, uuid, "NVIDIA-H200", 143155)]
    assert reported_used_mib(status) == {0: 0}


def test_the_summary_counts_gpus_per_product_with_their_memory_in_all() -> None:
    """kubectl's GPUs column: one part per product, sorted; memory in GiB, one decimal when not whole."""
    gpus = (
        GpuReading(0, "GPU-0", "NVIDIA-T4", 16384, 0),
        GpuReading(1, "GPU-1", "NVIDIA-A10", 24576, 0),
        GpuReading(2, "GPU-2", "NVIDIA-T4", 15360, 0),
        GpuReading(3, "GPU-3", "NVIDIA-H200", 143155, 0),
    )
    assert (gpu_summary(NodeReading("", "", gpus)), gpu_summary(NodeReading("", "", ()))) == (
        "1x NVIDIA-A10 (24Gi), 1x NVIDIA-H200 (139.8Gi), 2x NVIDIA-T4 (31Gi)",
        "no GPUs",
    )


async def test_links_changing_are_patched_at_the_next_tick() -> None:
    """The GPUs' links are part of the view: new links are written at once, not at the next heartbeat."""
    client = RecordingClient()
    reporter, probe, clock = make(client)
    await reporter.tick()
    client.calls.clear()
    probe.set_links((GpuLink(0, 1, "NVLink", 4),))
    clock.now += 10
    await reporter.tick()
    assert (client.calls, client.objects[("gpunodes", NODE)]["status"]["links"]) == (
        [("patch-status", "gpunodes", NODE)], [{"a": 0, "b": 1, "type": "NVLink", "count": 4}])
