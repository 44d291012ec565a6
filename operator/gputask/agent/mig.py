"""MIG devices: how the agent finds them through NVML and how it names them.

A GPU in MIG mode runs CUDA work only inside its MIG devices (one compute instance of one GPU
instance each). The agent never changes MIG configuration; it reports the MIG devices it finds as
schedulable devices of their own, and the parent GPU as unschedulable.

Names follow NVIDIA's, so users can copy them from the tools they already have:

- the profile is ``<G>g.<GB>gb`` (``<C>c.<G>g.<GB>gb`` when the compute instance is smaller
  than its GPU instance), plus ``+me``, ``+me.all``, ``+gfx`` or ``-me`` for the GPU-instance
  profiles with or without media engines: the device plugin's resource names
  (``nvidia.com/mig-1g.10gb``) come from the same rule, in NVIDIA's go-nvlib
  (``pkg/nvlib/device/mig_profile.go``: ``GB`` is the instance's share of the card rounded up to
  eighths, times the card's memory in whole GiB rounded up, rounded to the nearest integer);
- the product is ``<parent product>-MIG-<profile>``, e.g. ``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb``,
  as NVIDIA's GPU Feature Discovery labels it (``nvidia.com/mig-1g.10gb.product``).

Each MIG device gets a node-wide ``index`` of its own,
:func:`~gputask.core.model.mig_device_index` (``100 x (parent index + 1) + the MIG device's NVML
index``: GPU 0's MIG devices are 100, 101, ...; GPU 1's 200, ...), so the GPUNode's ``gpus`` list
(keyed by index) and every placement keep one integer per device.

In a pod the agent sees the MIG devices its container can access: ``NVIDIA_VISIBLE_DEVICES=all`` (the
chart's default with a RuntimeClass) gives it every one. Describing GPU instances (the ``+me``-style
suffixes) and listing MIG devices beyond those may need the MIG monitor capability (NVIDIA's MIG user
guide, "Device Nodes and Capabilities"), which the NVIDIA Container Toolkit grants for
``NVIDIA_MIG_MONITOR_DEVICES=all`` only to a container with ``SYS_ADMIN`` in its capabilities, as
NVIDIA's device plugin and GPU Feature Discovery run: chart values ``agent.env`` and
``agent.securityContext.capabilities.add``. A profile whose GPU instance cannot be described is named
without the suffix; MIG devices that cannot be listed at all leave the parent unhealthy with
:data:`MIG_PERMISSION_HINT`. None of this was tried on a GPU in MIG mode here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gputask.core.model import MIG_PRODUCT_MARK

MIG_PERMISSION_HINT = (
    "the agent cannot read this GPU's MIG devices: give it the MIG monitor capability (chart values "
    "agent.env NVIDIA_MIG_MONITOR_DEVICES=all and agent.securityContext.capabilities.add [SYS_ADMIN])"
)

MIB = 1024 * 1024
GIB = 1024 * MIB
_MEMORY_EIGHTHS = 8


@dataclass(frozen=True, slots=True)
class MigInfo:
    """Where a MIG device lives: its parent GPU's NVML index and UUID, its profile (``1g.10gb``) and
    its GPU-instance and compute-instance ids (as ``nvidia-smi`` prints them)."""

    parent_index: int
    parent_uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device as read: its NVML index under the parent, UUID (``MIG-...``), memory in MiB
    (total it can allocate, used by processes), where it lives, and its NVML handle (for its processes)."""

    slot: int
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    info: MigInfo
    handle: Any = field(default=None, compare=False)


def mig_product(parent_product: str, profile: str) -> str:
    """``NVIDIA-A100-SXM4-80GB`` and ``1g.10gb`` -> ``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb``."""
    return f"{parent_product}{MIG_PRODUCT_MARK}{profile}"


def profile_gb(memory_mib: int, card_bytes: int) -> int:
    """The ``<GB>`` of a MIG profile: the instance's share of the card (``memory_mib`` of ``card_bytes``,
    NVML's total), rounded up to eighths, times the card's memory in whole GiB rounded up, rounded.

    ValueError when ``card_bytes`` is not positive.
    """
    if card_bytes <= 0:
        raise ValueError(f"card memory must be positive, got {card_bytes}")
    share = math.ceil(memory_mib * MIB / card_bytes * _MEMORY_EIGHTHS) / _MEMORY_EIGHTHS
    return round(share * -(-card_bytes // GIB))


def profile_name(*, gi_slices: int, ci_slices: int, gb: int, gi_profile_id: int | None, nvml: Any) -> str:
    """``1g.10gb``, ``1c.2g.20gb``, ``1g.10gb+me``...: NVIDIA's spelling of a MIG device's profile.

    ``gi_profile_id`` is the GPU instance's ``NVML_GPU_INSTANCE_PROFILE_*`` (None when unknown: no
    attribute suffix); ``nvml`` supplies those constants (absent ones never match).
    """
    base = f"{gi_slices}g.{gb}gb" if ci_slices == gi_slices else f"{ci_slices}c.{gi_slices}g.{gb}gb"
    return base + _attribute_suffix(gi_profile_id, nvml)


_SUFFIXES = (
    (("1_SLICE_REV1", "2_SLICE_REV1"), "+me"),
    (("1_SLICE_ALL_ME", "2_SLICE_ALL_ME"), "+me.all"),
    (("1_SLICE_GFX", "2_SLICE_GFX", "4_SLICE_GFX"), "+gfx"),
    (("1_SLICE_NO_ME", "2_SLICE_NO_ME"), "-me"),
)


def _attribute_suffix(gi_profile_id: int | None, nvml: Any) -> str:
    if gi_profile_id is None:
        return ""
    for names, suffix in _SUFFIXES:
        ids = {getattr(nvml, f"NVML_GPU_INSTANCE_PROFILE_{name}", None) for name in names} - {None}
        if gi_profile_id in ids:
            return suffix
    return ""


def read_mig_devices(nvml: Any, handle: Any, *, parent_index: int, parent_uuid: str) -> list[MigDevice]:
    """Every MIG device of the parent GPU ``handle``, in NVML index order.

    An empty slot (NVML NotFound) is skipped. Raises ``nvml.NVMLError`` when the parent's MIG devices
    cannot be listed, or one of them cannot be read (the caller reports the parent with the error).
    """
    card_bytes = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    devices: list[MigDevice] = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError_NotFound:
            continue
        devices.append(_read_one(nvml, handle, mig, slot, card_bytes, parent_index, parent_uuid))
    return devices


def _read_one(
    nvml: Any, parent: Any, mig: Any, slot: int, card_bytes: int, parent_index: int, parent_uuid: str
) -> MigDevice:
    uuid = nvml.nvmlDeviceGetUUID(mig)
    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    attributes = nvml.nvmlDeviceGetAttributes(mig)
    memory = nvml.nvmlDeviceGetMemoryInfo(mig)
    gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
    ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
    profile = profile_name(
        gi_slices=int(attributes.gpuInstanceSliceCount),
        ci_slices=int(attributes.computeInstanceSliceCount),
        gb=profile_gb(int(attributes.memorySizeMB), card_bytes),
        gi_profile_id=_gi_profile_id(nvml, parent, gi_id),
        nvml=nvml,
    )
    info = MigInfo(parent_index, parent_uuid, profile, gi_id, ci_id)
    return MigDevice(slot, uuid, int(memory.total) // MIB, -(-int(memory.used) // MIB), info, mig)


def _gi_profile_id(nvml: Any, parent: Any, gi_id: int) -> int | None:
    """The GPU instance's profile id, for the ``+me``-style suffix; None where the driver will not say."""
    try:
        return int(nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)).profileId)
    except nvml.NVMLError:
        return None
