"""The agent's probes: FakeProbe specs and NvmlProbe against a fake pynvml module."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gputask.agent import (
    FakeProbe,
    FakeSpecError,
    GpuReading,
    NodeReading,
    NvmlProbe,
    ProbeError,
    ProbeUnavailable,
    fake_uuid,
    parse_fake_spec,
)
from gputask.agent.fake import FakeGpu, parse_fake_links
from gputask.agent.probe import NVML_HINT, cuda_version_text, product_name
from gputask.agent.processes import ProcessUse
from gputask.core.model import GpuLink
from nvml_mig import PynvmlNames

REPO = Path(__file__).resolve().parents[2]
pynvml = pytest.importorskip("pynvml")  # only for its real error classes and constants
GIB = 1024**3
MIB = 1024**2


# -- FakeProbe --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2x24Gi", (FakeGpu("Fake-GPU", 24576), FakeGpu("Fake-GPU", 24576))),
        ("1x16Gi,1x8Gi", (FakeGpu("Fake-GPU", 16384), FakeGpu("Fake-GPU", 8192))),
        ("2xNVIDIA-A10:24Gi", (FakeGpu("NVIDIA-A10", 24576), FakeGpu("NVIDIA-A10", 24576))),
        ("1x512Mi, 1xNVIDIA-H100-80GB-HBM3:80Gi", (FakeGpu("Fake-GPU", 512), FakeGpu("NVIDIA-H100-80GB-HBM3", 81920))),
        ("1x1Ti", (FakeGpu("Fake-GPU", 1048576),)),
    ],
)
def test_fake_spec_parses_groups_in_index_order(spec: str, expected: tuple[FakeGpu, ...]) -> None:
    """A spec lists COUNTx[PRODUCT:]MEMORY groups whose devices are indexed in order."""
    assert parse_fake_spec(spec) == expected


@pytest.mark.parametrize("spec", ["", "2x24", "x24Gi", "2x24GB", "2xNVIDIA A10:24Gi", "2x:24Gi", "2x24Gi,", "-1x8Gi"])
def test_fake_spec_rejects_malformed_groups(spec: str) -> None:
    """A malformed group is a FakeSpecError that quotes it and shows the expected form."""
    with pytest.raises(FakeSpecError, match="expected COUNTx\\[PRODUCT:\\]MEMORY"):
        parse_fake_spec(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0x24Gi", "bad fake GPU group '0x24Gi': count and memory must be positive"),
        ("1x0Mi", "bad fake GPU group '1x0Mi': count and memory must be positive"),
        ("65x1Gi", "fake GPU spec '65x1Gi' describes 65 GPUs; at most 64"),
    ],
)
def test_fake_spec_rejects_empty_or_oversized_specs(spec: str, message: str) -> None:
    """Zero counts, zero memory and more than 64 GPUs are refused with a clear message."""
    with pytest.raises(FakeSpecError) as info:
        parse_fake_spec(spec)
    assert str(info.value) == message


def test_fake_uuids_are_stable_per_node_and_index() -> None:
    """Fake UUIDs depend only on node name and index, so a restarted agent reports the same GPUs."""
    uuids = [fake_uuid("node-a", 0), fake_uuid("node-a", 1), fake_uuid("node-b", 0), fake_uuid("node-a", 0)]
    assert [len(set(uuids)), uuids[0][:4], uuids[0] == uuids[3]] == [3, "GPU-", True]


def test_fake_probe_reads_spec_and_settable_state() -> None:
    """FakeProbe reports its spec, then the used memory and health tests set."""
    probe = FakeProbe.from_spec("2xNVIDIA-A10:24Gi", node_name="node-a")
    probe.set_used(0, 1000)
    probe.set_health(1, False, "XID 79")
    u0, u1 = fake_uuid("node-a", 0), fake_uuid("node-a", 1)
    assert probe.read() == NodeReading(
        "fake",
        "fake",
        (
            GpuReading(0, u0, "NVIDIA-A10", 24576, 1000),
            GpuReading(1, u1, "NVIDIA-A10", 24576, 0, None, False, "XID 79"),
        ),
    )


def test_fake_probe_failure_raises_probe_error_until_cleared() -> None:
    """set_failure makes reads raise ProbeError; clearing it restores reads."""
    probe = FakeProbe.from_spec("1x8Gi", node_name="n")
    probe.set_failure("NVML wedged")
    with pytest.raises(ProbeError, match="NVML wedged"):
        probe.read()
    probe.set_failure(None)
    assert probe.read() == NodeReading("fake", "fake", (GpuReading(0, fake_uuid("n", 0), "Fake-GPU", 8192, 0),))


# -- helpers -----------------------------------------------------------------------------------


def test_product_names_and_cuda_versions_are_spelled_as_the_design_says() -> None:
    """NVML names get '-' for spaces (bytes too) and CUDA 12040 reads as 12.4."""
    names = [product_name("NVIDIA A100-SXM4-40GB"), product_name(b"Tesla T4 "), cuda_version_text(12040)]
    assert names == ["NVIDIA-A100-SXM4-40GB", "Tesla-T4", "12.4"]


def test_agent_package_imports_without_pynvml() -> None:
    """Importing the agent (probe included) does not import pynvml: it loads when a probe opens."""
    code = "import sys, gputask.agent, gputask.agent.main; print('pynvml' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# -- NvmlProbe against a fake pynvml -------------------------------------------------------------


@dataclass
class FakeDevice:
    """One fake NVML device; an error set on a query makes that query raise it."""

    uuid: str
    name: str
    total: int
    used: int
    mig: int | None = None  # None: MIG not supported
    reserved: int = 0  # bytes the driver keeps; v1 counts them as used, v2 apart
    events: int = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    errors: dict[str, Exception] = field(default_factory=dict)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes or None) with a context
    mps: list[tuple[int, int | None]] | None = None  # MPS clients; None: the MPS list is not supported


class FakeNvml(PynvmlNames):
    """A stand-in for the pynvml module: real error classes and constants, fake functions."""

    def __init__(
        self, devices: list[FakeDevice], *, errors: dict[str, Exception] | None = None, memory_v2: bool = False
    ) -> None:
        if memory_v2:  # pynvml has the v2 struct only where it can call nvmlDeviceGetMemoryInfo_v2
            self.nvmlMemory_v2 = pynvml.nvmlMemory_v2
        self.devices = devices
        self.errors = errors or {}  # module-level call name -> error
        self.pending: deque[SimpleNamespace] = deque()
        self.registered: list[int] = []
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.errors:
            raise self.errors[name]

    def _device(self, handle: int, name: str) -> FakeDevice:
        self._call(name)
        if not 0 <= handle < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        device = self.devices[handle]
        if name in device.errors:
            raise device.errors[name]
        return device

    def emit(self, handle: int, xid: int, event_type: int = pynvml.nvmlEventTypeXidCriticalError) -> None:
        self.pending.append(SimpleNamespace(device=handle, eventType=event_type, eventData=xid))

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._device(index, "nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in device.processes]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[SimpleNamespace]:
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses_v2")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in device.processes]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        device = self._device(handle, "nvmlDeviceGetMPSComputeRunningProcesses")
        if device.mps is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in device.mps]

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        if version is None:
            device = self._device(handle, "nvmlDeviceGetMemoryInfo")
            used = device.used + device.reserved
            return SimpleNamespace(total=device.total, used=used, free=device.total - used)
        assert version == pynvml.nvmlMemory_v2
        device = self._device(handle, "nvmlDeviceGetMemoryInfo_v2")
        free = device.total - device.reserved - device.used
        return SimpleNamespace(total=device.total, reserved=device.reserved, used=device.used, free=free)

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        device = self._device(handle, "nvmlDeviceGetMigMode")
        if device.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [device.mig, device.mig]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        self._device(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 0  # in MIG mode with no MIG devices configured (tests/unit/test_agent_mig.py has them)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion")
        return 12040

    def nvmlEventSetCreate(self) -> str:
        self._call("nvmlEventSetCreate")
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        self._call("nvmlEventSetFree")

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        return self._device(handle, "nvmlDeviceGetSupportedEventTypes").events

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set: str) -> None:
        self._device(handle, "nvmlDeviceRegisterEvents")
        self.registered.append(handle)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        self._call("nvmlEventSetWait")
        assert timeout_ms == 0  # the probe must never block
        if not self.pending:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.pending.popleft()


def nvml_error(code: int) -> Exception:
    """The real pynvml exception for an NVML return code."""
    return pynvml.NVMLError(code)


def two_gpus() -> list[FakeDevice]:
    """An A10 without MIG support and an A100 with MIG disabled."""
    return [
        FakeDevice("GPU-0a", "NVIDIA A10", 24 * GIB, 512 * MIB + 1),
        FakeDevice("GPU-1b", "NVIDIA A100-SXM4-40GB", 40 * GIB, 0, mig=0),
    ]


A10 = GpuReading(0, "GPU-0a", "NVIDIA-A10", 24576, 513)
A100 = GpuReading(1, "GPU-1b", "NVIDIA-A100-SXM4-40GB", 40960, 0, "Disabled")


def test_fake_nvml_surface_exists_in_real_pynvml() -> None:
    """Every function and constant the fake offers exists in the real pynvml, so the probe calls real names."""
    names = [n for n in dir(FakeNvml) if n.startswith(("nvml", "NVML"))]
    assert [n for n in names if not hasattr(pynvml, n)] == []


def test_nvml_discovers_two_devices() -> None:
    """Two devices are read with product, MiB (used rounded up), MIG mode and versions; both register for XIDs."""
    nvml = FakeNvml(two_gpus())
    probe = NvmlProbe(nvml=nvml)
    reading = probe.read()
    assert (reading, probe.events, nvml.registered) == (
        NodeReading("550.54.15", "12.4", (A10, A100)),
        {0: True, 1: True},
        [0, 1],
    )


def test_nvml_reports_mig_enabled() -> None:
    """A GPU in MIG mode (here without MIG devices) reads as mig_mode 'Enabled'; MIG NotSupported reads as None."""
    devices = two_gpus()
    devices[1].mig = pynvml.NVML_DEVICE_MIG_ENABLE
    assert NvmlProbe(nvml=FakeNvml(devices)).read().gpus == (
        A10,
        GpuReading(1, "GPU-1b", A100.product, 40960, 0, "Enabled"),
    )


def test_nvml_memory_query_error_marks_only_that_device_unhealthy() -> None:
    """A device whose memory query raises NVMLError is unhealthy with the call and error text; others are read."""
    devices = two_gpus()
    devices[1].errors["nvmlDeviceGetMemoryInfo"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    reading = NvmlProbe(nvml=FakeNvml(devices)).read()
    lost = GpuReading(1, "GPU-1b", "NVIDIA-A100-SXM4-40GB", 0, 0, None, False, "nvmlDeviceGetMemoryInfo: GPU is lost")
    assert reading.gpus == (A10, lost)


def test_nvml_failed_device_keeps_its_last_known_identity() -> None:
    """A device that fails after a good read keeps its UUID, product and memory, unhealthy."""
    devices = two_gpus()
    nvml = FakeNvml(devices)
    probe = NvmlProbe(nvml=nvml)
    probe.read()
    devices[0].errors["nvmlDeviceGetHandleByIndex"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    failed = GpuReading(0, "GPU-0a", "NVIDIA-A10", 24576, 0, None, False, "nvmlDeviceGetHandleByIndex: Unknown Error")
    assert probe.read().gpus == (failed, A100)


def test_nvml_critical_xid_marks_device_unhealthy_and_skips_application_xids() -> None:
    """A critical XID (79) makes its device unhealthy for good; an application XID (13) does not."""
    nvml = FakeNvml(two_gpus())
    probe = NvmlProbe(nvml=nvml)
    probe.read()
    nvml.emit(0, 13)
    nvml.emit(1, 79)
    first = probe.read().gpus
    second = probe.read().gpus
    xid = GpuReading(1, "GPU-1b", "NVIDIA-A100-SXM4-40GB", 40960, 0, "Disabled", False, "XID 79")
    assert (first, second) == ((A10, xid), (A10, xid))


def test_nvml_xid_on_an_unidentified_device_marks_all_unhealthy() -> None:
    """When the device of a critical XID cannot be identified, every device is marked unhealthy."""
    nvml = FakeNvml(two_gpus())
    probe = NvmlProbe(nvml=nvml)
    probe.read()
    nvml.emit(7, 48)  # a handle the fake does not know: its UUID query fails
    gpus = probe.read().gpus
    reason = "XID 48 on an unidentified device (Invalid Argument)"
    assert [(g.index, g.healthy, g.reason) for g in gpus] == [(0, False, reason), (1, False, reason)]


def test_nvml_without_event_support_still_reads_devices() -> None:
    """Where the event set cannot be created, devices are still read and no event wait is attempted."""
    nvml = FakeNvml(two_gpus(), errors={"nvmlEventSetCreate": nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)})
    probe = NvmlProbe(nvml=nvml)
    reading = probe.read()
    assert (reading.gpus, probe.events, "nvmlEventSetWait" in nvml.calls) == ((A10, A100), {}, False)


def test_nvml_device_without_xid_events_is_recorded_and_read() -> None:
    """A device that lacks XID events (or refuses registration) is recorded as unsupported and still read."""
    devices = two_gpus()
    devices[0].events = pynvml.nvmlEventTypePState
    devices[1].errors["nvmlDeviceRegisterEvents"] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    probe = NvmlProbe(nvml=FakeNvml(devices))
    reading = probe.read()
    assert (reading.gpus, probe.events) == ((A10, A100), {0: False, 1: False})


def test_nvml_init_failure_is_probe_unavailable() -> None:
    """When nvmlInit fails (no driver) the probe raises ProbeUnavailable with a hint."""
    nvml = FakeNvml([], errors={"nvmlInit": nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)})
    with pytest.raises(ProbeUnavailable) as info:
        NvmlProbe(nvml=nvml).open()
    assert str(info.value) == f"NVML could not initialise: Driver Not Loaded. {NVML_HINT}"
    assert "agent.runtimeClassName" in NVML_HINT  # the setting to change, in a pod


def test_nvml_device_count_failure_is_a_probe_error() -> None:
    """When even the device count fails, the whole reading is a ProbeError."""
    nvml = FakeNvml(two_gpus())
    probe = NvmlProbe(nvml=nvml)
    probe.open()
    nvml.errors["nvmlDeviceGetCount"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(ProbeError, match="^nvmlDeviceGetCount: Unknown Error$"):
        probe.read()


def test_nvml_initialises_once_and_closes_once() -> None:
    """nvmlInit runs once over many reads; close frees the event set and shuts NVML down, once."""
    nvml = FakeNvml(two_gpus())
    with NvmlProbe(nvml=nvml) as probe:
        probe.read()
        probe.read()
    probe.close()
    lifecycle = [c for c in nvml.calls if c in {"nvmlInit", "nvmlShutdown", "nvmlEventSetFree"}]
    assert lifecycle == ["nvmlInit", "nvmlEventSetFree", "nvmlShutdown"]


def test_nvml_missing_library_is_probe_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the NVML shared library (this machine has no GPU driver) open() raises ProbeUnavailable."""

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with pytest.raises(ProbeUnavailable, match="NVML Shared Library Not Found"):
        NvmlProbe().open()


def test_capture_script_writes_the_reading_as_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bench/agent_probe_capture.py writes the reading, XID event support and the status it would publish."""
    spec = importlib.util.spec_from_file_location("agent_probe_capture", REPO / "bench" / "agent_probe_capture.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "NvmlProbe", lambda **kw: NvmlProbe(nvml=FakeNvml(two_gpus()), **kw))
    out = tmp_path / "reading.json"
    code = script.main(["--output", str(out)])
    data = json.loads(out.read_text())
    a10 = {"index": 0, "uuid": "GPU-0a", "product": "NVIDIA-A10", "memory": "24576Mi", "memoryUsed": "513Mi"}
    a100 = {"index": 1, "uuid": "GPU-1b", "product": "NVIDIA-A100-SXM4-40GB", "memory": "40960Mi", "memoryUsed": "0Mi"}
    assert (code, data["reading"]["gpus"][1], data["xidEventsSupported"], data["gpunodeStatus"]) == (
        0,
        {
            "index": 1,
            "uuid": "GPU-1b",
            "product": "NVIDIA-A100-SXM4-40GB",
            "memory_total_mib": 40960,
            "memory_used_mib": 0,
            "mig_mode": "Disabled",
            "healthy": True,
            "reason": "",
            "mig": None,
            "processes": [],
        },
        {"0": True, "1": True},
        {
            "gpus": [a10 | {"healthy": True, "reason": ""}, a100 | {"healthy": True, "reason": ""}],
            "driverVersion": "550.54.15",
            "cudaVersion": "12.4",
            "summary": "1x NVIDIA-A10 (24Gi), 1x NVIDIA-A100-SXM4-40GB (40Gi)",
        },
    )


def test_nvml_failed_event_wait_marks_all_unhealthy() -> None:
    """An event wait that fails with anything but a timeout marks every device unhealthy, as the device plugin does."""
    nvml = FakeNvml(two_gpus())
    probe = NvmlProbe(nvml=nvml)
    probe.read()
    nvml.errors["nvmlEventSetWait"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    reason = "NVML event wait failed: Unknown Error"
    assert [(g.index, g.healthy, g.reason) for g in probe.read().gpus] == [(0, False, reason), (1, False, reason)]


def test_memory_reserved_by_the_driver_is_neither_allocatable_nor_used_with_nvml_v2() -> None:
    """With the v2 query a 24 GiB card with 512 MiB reserved and 1000 MiB held reads 24064 MiB, 1000 MiB used;
    v1 (no v2 in pynvml) reads 24576 MiB, 1512 MiB used."""

    def card() -> list[FakeDevice]:
        return [FakeDevice("GPU-0a", "NVIDIA A10", 24576 * MIB, 1000 * MIB, reserved=512 * MIB)]

    with NvmlProbe(nvml=FakeNvml(card(), memory_v2=True)) as probe:
        v2 = probe.read().gpus[0]
    with NvmlProbe(nvml=FakeNvml(card())) as probe:
        v1 = probe.read().gpus[0]
    assert [(g.memory_total_mib, g.memory_used_mib, g.healthy) for g in (v2, v1)] == [
        (24064, 1000, True),
        (24576, 1512, True),
    ]


def test_memory_v2_not_supported_falls_back_to_v1_and_other_v2_errors_mark_the_device() -> None:
    """NotSupported from the v2 query reads v1 instead; GPU-is-lost from it makes that device unhealthy."""
    devices = two_gpus()
    for device in devices:
        device.reserved = 256 * MIB
    devices[0].errors["nvmlDeviceGetMemoryInfo_v2"] = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    devices[1].errors["nvmlDeviceGetMemoryInfo_v2"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with NvmlProbe(nvml=FakeNvml(devices, memory_v2=True)) as probe:
        a10, a100 = probe.read().gpus
    assert (a10.memory_total_mib, a10.memory_used_mib, a10.healthy) == (
        24576,
        769,
        True,
    )  # 512 MiB + 1 byte held + 256 reserved, rounded up
    assert (a100.healthy, a100.reason) == (False, "nvmlDeviceGetMemoryInfo_v2: GPU is lost")


# -- processes and MIG devices --------------------------------------------------------------------


def test_nvml_lists_compute_and_mps_processes_merged_by_pid() -> None:
    """Compute and MPS client processes merge by PID, MiB rounded up; NVML's 'not available' stays None."""
    devices = two_gpus()
    devices[0].processes = [(200, GIB + 1), (100, None)]
    devices[0].mps = [(300, 512 * MIB), (200, GIB + 1)]
    reading = NvmlProbe(nvml=FakeNvml(devices), processes=True).read()
    assert [g.processes for g in reading.gpus] == [
        (ProcessUse(100, None), ProcessUse(200, 1025), ProcessUse(300, 512)),
        (),
    ]


def test_nvml_process_lists_fall_back_to_v2_and_say_why_when_unreadable() -> None:
    """Without the v3 entry point v2 is asked; unsupported or failing lists give None with the reason and leave
    the device healthy; a probe not asked for processes never lists them."""
    devices = two_gpus()
    devices[0].processes = [(7, MIB)]
    devices[0].errors["nvmlDeviceGetComputeRunningProcesses"] = nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    devices[1].errors["nvmlDeviceGetComputeRunningProcesses"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml = FakeNvml(devices)
    probe = NvmlProbe(nvml=nvml, processes=True)
    reading = probe.read()
    plain = NvmlProbe(nvml=FakeNvml(two_gpus())).read()
    listed = [(g.processes, g.healthy) for g in reading.gpus]
    assert (listed, probe.process_errors, [g.processes for g in plain.gpus]) == (
        [((ProcessUse(7, 1),), True), (None, True)],
        {1: "nvmlDeviceGetComputeRunningProcesses: GPU is lost"},
        [None, None],
    )


def test_fake_probe_reports_the_processes_tests_set() -> None:
    """FakeProbe.set_processes lists (pid, MiB) processes on a device; None lists none."""
    probe = FakeProbe.from_spec("2x8Gi", node_name="n")
    probe.set_processes(1, [(42, 100), (43, None)])
    assert [g.processes for g in probe.read().gpus] == [None, (ProcessUse(42, 100), ProcessUse(43, None))]


# -- GPU links (topology) ---------------------------------------------------------------------------


class LinkedNvml(FakeNvml):
    """FakeNvml with PCI addresses, NVLinks and PCIe common ancestors (the calls NVIDIA documents for them).

    ``nvlinks[gpu]``: per link index, ``("gpu", peer index)``, ``("switch", None)``, ``("down", None)`` or an
    exception every call on that link raises; links past the list answer NVML_ERROR_INVALID_ARGUMENT, as NVML does
    for a link index the GPU lacks. ``ancestors[(a, b)]``: an nvmlGpuTopologyLevel_t value or an exception.
    """

    NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def __init__(self, devices: list[FakeDevice], nvlinks: dict[int, list[Any]],
                 ancestors: dict[tuple[int, int], Any]) -> None:
        super().__init__(devices)
        self.nvlinks, self.ancestors = nvlinks, ancestors

    @staticmethod
    def pci(index: int) -> SimpleNamespace:
        return SimpleNamespace(domain=0, bus=0x10 + index, device=0, busId=f"00000000:{0x10 + index:02X}:00.0")

    def _link(self, handle: int, link: int, name: str) -> Any:
        self._device(handle, name)
        links = self.nvlinks.get(handle, [])
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if isinstance(links[link], Exception):
            raise links[link]
        return links[link]

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        self._device(handle, "nvmlDeviceGetPciInfo")
        return self.pci(handle)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        kind, _ = self._link(handle, link, "nvmlDeviceGetNvLinkState")
        return pynvml.NVML_FEATURE_DISABLED if kind == "down" else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        kind, _ = self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if kind == "switch" else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:
        kind, peer = self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        return self.pci(peer) if kind == "gpu" else SimpleNamespace(domain=0, bus=0xF0, device=0, busId="switch")

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        self._device(a, "nvmlDeviceGetTopologyCommonAncestor")
        found = self.ancestors.get((a, b), self.ancestors.get((b, a)))
        if found is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if isinstance(found, Exception):
            raise found
        return int(found)


def gpus_of(n: int) -> list[FakeDevice]:
    return [FakeDevice(f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 * GIB, 0) for i in range(n)]


def test_linked_fake_nvml_surface_exists_in_real_pynvml() -> None:
    """Every NVML call and constant LinkedNvml offers exists in the real pynvml, with the fake's arity."""
    names = [n for n in dir(LinkedNvml) if n.startswith(("nvml", "NVML"))]
    assert [n for n in names if not hasattr(pynvml, n)] == []


def test_nvml_links_count_direct_nvlinks_and_take_pcie_paths_for_the_other_pairs() -> None:
    """GPUs 0 and 1 share two NVLinks (a third is down), 2 and 3 one; the other pairs get the PCIe path
    nvmlDeviceGetTopologyCommonAncestor reports, each level to its kind."""
    nvlinks = {0: [("gpu", 1), ("down", None), ("gpu", 1)], 1: [("gpu", 0), ("gpu", 0)],
               2: [("gpu", 3)], 3: [("gpu", 2)]}
    ancestors = {(0, 2): pynvml.NVML_TOPOLOGY_SYSTEM, (0, 3): pynvml.NVML_TOPOLOGY_NODE,
                 (1, 2): pynvml.NVML_TOPOLOGY_HOSTBRIDGE, (1, 3): pynvml.NVML_TOPOLOGY_MULTIPLE}
    reading = NvmlProbe(nvml=LinkedNvml(gpus_of(4), nvlinks, ancestors)).read()
    assert reading.links == (
        GpuLink(0, 1, "NVLink", 2), GpuLink(0, 2, "CrossNUMA"), GpuLink(0, 3, "SameNUMANode"),
        GpuLink(1, 2, "HostBridge"), GpuLink(1, 3, "PCIeSwitch"), GpuLink(2, 3, "NVLink", 1),
    )


def test_nvml_links_through_nvswitches_connect_every_pair_by_the_fewer_switch_links() -> None:
    """On an NVSwitch baseboard every link goes to a switch: each pair gets the fewer of its GPUs' switch links
    (18 and 18, or 12 where one GPU has 12 up), and no PCIe path is asked for."""
    nvlinks = {0: [("switch", None)] * 18, 1: [("switch", None)] * 18, 2: [("switch", None)] * 12}
    nvml = LinkedNvml(gpus_of(3), nvlinks, {})
    reading = NvmlProbe(nvml=nvml).read()
    assert (reading.links, "nvmlDeviceGetTopologyCommonAncestor" in nvml.calls) == (
        (GpuLink(0, 1, "NVLink", 18), GpuLink(0, 2, "NVLink", 12), GpuLink(1, 2, "NVLink", 12)), False)


def test_nvml_links_not_supported_mean_no_link_info_never_a_failure() -> None:
    """GPUs without NVLink (NVML_ERROR_NOT_SUPPORTED on link 0: the other links are not asked) and a pair whose
    PCIe path is not supported either: that pair is left out, the others are read, the devices stay healthy."""
    not_supported = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    nvlinks = {i: [not_supported] * 18 for i in range(3)}
    nvml = LinkedNvml(gpus_of(3), nvlinks, {(0, 1): pynvml.NVML_TOPOLOGY_SINGLE, (1, 2): pynvml.NVML_TOPOLOGY_SYSTEM})
    reading = NvmlProbe(nvml=nvml).read()
    assert (reading.links, [g.healthy for g in reading.gpus], nvml.calls.count("nvmlDeviceGetNvLinkState")) == (
        (GpuLink(0, 1, "PCIeSwitch"), GpuLink(1, 2, "CrossNUMA")), [True, True, True], 3)


def test_nvml_links_are_read_once_unless_an_unexpected_error_asks_for_another_try() -> None:
    """Topology does not change while the agent runs: a second read asks NVML nothing about links. A reading that
    met an unexpected error (here NVML_ERROR_UNKNOWN on a PCIe path) is tried again at the next read."""
    nvml = LinkedNvml(gpus_of(2), {}, {(0, 1): pynvml.NVML_TOPOLOGY_SINGLE})
    probe = NvmlProbe(nvml=nvml)
    first = probe.read().links
    asked = nvml.calls.count("nvmlDeviceGetTopologyCommonAncestor")
    second = probe.read().links
    flaky = LinkedNvml(gpus_of(2), {}, {(0, 1): pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)})
    again = NvmlProbe(nvml=flaky)
    empty = again.read().links
    flaky.ancestors[(0, 1)] = pynvml.NVML_TOPOLOGY_NODE
    assert (first, second, asked, nvml.calls.count("nvmlDeviceGetTopologyCommonAncestor"), empty,
            again.read().links) == (
        (GpuLink(0, 1, "PCIeSwitch"),), (GpuLink(0, 1, "PCIeSwitch"),), 1, 1, (), (GpuLink(0, 1, "SameNUMANode"),))


def test_a_probe_without_link_calls_or_with_one_gpu_reports_no_links() -> None:
    """A pynvml without the topology calls (the plain fake) and a node of one GPU: no links, nothing asked."""
    one = LinkedNvml(gpus_of(1), {0: [("switch", None)] * 18}, {})
    assert (NvmlProbe(nvml=FakeNvml(two_gpus())).read().links, NvmlProbe(nvml=one).read().links,
            "nvmlDeviceGetNvLinkState" in one.calls) == ((), (), False)


def test_fake_probe_reports_links_from_its_spec() -> None:
    """--fake-links gives the fake GPUs' links, sorted by pair; malformed specs say what is wrong."""
    probe = FakeProbe.from_spec("4x80Gi", node_name="n", links="2-3:NVLink:12, 1-0:PCIeSwitch")
    assert probe.read().links == (GpuLink(0, 1, "PCIeSwitch"), GpuLink(2, 3, "NVLink", 12))
    problems = {}
    for spec in ("0-1:NVLink", "0-1:PCIeSwitch:2", "0-4:CrossNUMA", "0-0:CrossNUMA", "0-1:Fast",
                 "0-1:HostBridge,1-0:HostBridge", "01:NVLink:2"):
        with pytest.raises(FakeSpecError) as info:
            parse_fake_links(spec, 4)
        problems[spec] = str(info.value).split(": ", 1)[1]
    assert problems == {
        "0-1:NVLink": "an NVLink pair needs its link count (> 0), others none",
        "0-1:PCIeSwitch:2": "an NVLink pair needs its link count (> 0), others none",
        "0-4:CrossNUMA": "two different GPUs of 0..3",
        "0-0:CrossNUMA": "two different GPUs of 0..3",
        "0-1:Fast": "type must be one of NVLink, PCIeSwitch, HostBridge, SameNUMANode, CrossNUMA",
        "0-1:HostBridge,1-0:HostBridge": "GPUs 0 and 1 are given twice",
        "01:NVLink:2": "expected A-B:TYPE[:COUNT] such as 0-1:NVLink:12",
    }
