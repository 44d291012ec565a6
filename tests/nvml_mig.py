"""Stand-ins for pynvml: the real names fakes share, and GPUs in MIG mode for the agent's MIG tests.

It models an NVIDIA A100-SXM4-40GB in MIG mode with the memory sizes NVIDIA's MIG user guide prints for its
profiles (``nvidia-smi mig -lgip``: 1g.5gb 4.75 GiB, 2g.10gb 9.75 GiB). It is built from that documentation,
not recorded from hardware: no GPU in MIG mode was at hand (``bench/device_check.sh`` records one where the
GPU it runs on is in MIG mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024**2
A100_40GB = 40960 * MIB  # NVML's total for the A100-SXM4-40GB


@dataclass
class FakeMig:
    """One MIG device: its GPU-instance profile, slices, ids and memory as NVML reports them."""

    uuid: str
    gi_profile: int
    gi_slices: int
    ci_slices: int
    memory_mb: int  # nvmlDeviceGetAttributes' memorySizeMB
    gi_id: int
    ci_id: int
    used: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)  # (host PID, bytes) NVML lists on it


@dataclass
class FakeGpu:
    """One physical GPU; ``migs`` by NVML MIG device index (None: an empty slot)."""

    uuid: str
    name: str
    total: int
    mig_enabled: bool
    migs: list[FakeMig | None] = field(default_factory=list)
    errors: dict[str, Exception] = field(default_factory=dict)


class PynvmlNames:
    """The real pynvml error classes and constants the probe reads from the module, for fakes of it."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError


class MigNvml(PynvmlNames):
    """A stand-in for pynvml with the calls the probe makes for GPUs and their MIG devices.

    Handles: a GPU is its index; a MIG device is ``(gpu index, MIG device index)``; a GPU instance is
    ``("gi", gpu index, gi id)``.
    """

    def __init__(self, gpus: list[FakeGpu], *, events: bool = False) -> None:
        self.gpus = gpus
        self.events = events  # whether XID events can be registered (else health from queries only)
        self.pending: list[SimpleNamespace] = []

    def emit_xid(self, handle: int, xid: int) -> None:
        """Queue a critical XID on GPU ``handle`` for the next event wait."""
        xid_event = pynvml.nvmlEventTypeXidCriticalError
        self.pending.append(SimpleNamespace(device=handle, eventType=xid_event, eventData=xid))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML_GPU_INSTANCE_PROFILE_"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _gpu(self, index: int, call: str) -> FakeGpu:
        gpu = self.gpus[index]
        if call in gpu.errors:
            raise gpu.errors[call]
        return gpu

    def _mig(self, handle: tuple[int, int]) -> FakeMig:
        mig = self.gpus[handle[0]].migs[handle[1]]
        assert mig is not None
        return mig

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...

    def nvmlEventSetCreate(self) -> str:
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # health from queries only, as on some VMs
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None: ...

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        return int(pynvml.nvmlEventTypeXidCriticalError)

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set: str) -> None: ...

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        if not self.pending:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.pending.pop(0)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._mig(handle).uuid if isinstance(handle, tuple) else self.gpus[handle].uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle].name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        if isinstance(handle, tuple):
            mig = self._mig(handle)
            return SimpleNamespace(total=mig.memory_mb * MIB, used=mig.used, free=mig.memory_mb * MIB - mig.used)
        gpu = self.gpus[handle]
        return SimpleNamespace(total=gpu.total, used=0, free=gpu.total)

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if self.gpus[handle].mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        if not isinstance(handle, tuple):  # a GPU in MIG mode gives aggregate figures to privileged callers only
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._mig(handle).processes]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return len(self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount").migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[int, int]:
        if self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex").migs[slot] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (handle, slot)

    def nvmlDeviceGetAttributes(self, handle: tuple[int, int]) -> SimpleNamespace:
        mig = self._mig(handle)
        return SimpleNamespace(
            gpuInstanceSliceCount=mig.gi_slices, computeInstanceSliceCount=mig.ci_slices, memorySizeMB=mig.memory_mb
        )

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[int, int]) -> int:
        return self._mig(handle).gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: tuple[int, int]) -> int:
        return self._mig(handle).ci_id

    def nvmlDeviceGetGpuInstanceById(self, handle: int, gi_id: int) -> tuple[str, int, int]:
        return ("gi", handle, gi_id)

    def nvmlGpuInstanceGetInfo(self, gi: tuple[str, int, int]) -> SimpleNamespace:
        profile = next(m.gi_profile for m in self.gpus[gi[1]].migs if m is not None and m.gi_id == gi[2])
        return SimpleNamespace(profileId=profile)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040


def a100_in_mig_mode() -> list[FakeGpu]:
    """GPU 0: an A100-SXM4-40GB in MIG mode with two 1g.5gb, an empty slot, a 1c.2g.10gb and a 1g.5gb+me;
    GPU 1: an A100 not in MIG mode."""
    p = pynvml
    migs: list[FakeMig | None] = [
        FakeMig("MIG-a", p.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 4864, gi_id=7, ci_id=0, used=600 * MIB),
        FakeMig("MIG-b", p.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 4864, gi_id=8, ci_id=0),
        None,
        FakeMig("MIG-c", p.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, 1, 9984, gi_id=3, ci_id=1),
        FakeMig("MIG-d", p.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, 4864, gi_id=9, ci_id=0),
    ]
    return [
        FakeGpu("GPU-0", "NVIDIA A100-SXM4-40GB", A100_40GB, True, migs),
        FakeGpu("GPU-1", "NVIDIA A100-SXM4-40GB", A100_40GB, False),
    ]
