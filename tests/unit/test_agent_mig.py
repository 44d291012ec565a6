"""MIG devices in the agent: NVIDIA's profile names, reading them through NVML, and the GPUNode they make.

The fake NVML (``tests/nvml_mig.py``) is built from NVIDIA's MIG user guide, not recorded from hardware; the
profile-size table below takes its sizes from the same guide (``nvidia-smi mig -lgip`` on A100-40GB and
A100-80GB, and an H100-80GB).
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from gputask.agent import GpuReading, NodeReading, NvmlProbe
from gputask.agent.mig import MIG_PERMISSION_HINT, MigInfo, mig_product, profile_gb, profile_name
from gputask.agent.processes import ProcessUse
from gputask.agent.report import MIG_REASON, device_view, gpunode_status
from gputask.core import Gpu, Node, NodeName, Scheduler
from gputask.core.model import is_mig_product, mig_device_index, mig_parent_index
from gputask.live import node_rows
from nvml_mig import A100_40GB, MIB, MigNvml, a100_in_mig_mode

pynvml = pytest.importorskip("pynvml")  # for its real error classes and constants


@pytest.mark.parametrize(
    ("memory_mib", "card_bytes", "gb"),
    [
        (4864, A100_40GB, 5),  # A100-40GB 1g.5gb
        (9984, A100_40GB, 10),  # 2g.10gb
        (20096, A100_40GB, 20),  # 3g.20gb and 4g.20gb
        (40448, A100_40GB, 40),  # 7g.40gb
        (9728, 81920 * MIB, 10),  # A100-80GB 1g.10gb
        (19968, 81920 * MIB, 20),  # A100-80GB 1g.20gb and 2g.20gb
        (40192, 81920 * MIB, 40),  # A100-80GB 3g.40gb
        (9984, 81559 * MIB, 10),  # H100-80GB 1g.10gb: the card's GiB round up to 80
    ],
)
def test_profile_memory_is_named_as_nvidia_names_it(memory_mib: int, card_bytes: int, gb: int) -> None:
    """The <GB> of a profile is the instance's share rounded up to eighths of the card's whole GiB."""
    assert profile_gb(memory_mib, card_bytes) == gb


def test_profile_names_carry_compute_slices_and_media_attributes() -> None:
    """A compute instance smaller than its GPU instance is named <C>c.<G>g; media-engine profiles get +me,
    +me.all, +gfx or -me; an unknown profile id adds nothing."""
    p = pynvml
    profiles = [
        (1, 1, 5, p.NVML_GPU_INSTANCE_PROFILE_1_SLICE),
        (2, 1, 10, p.NVML_GPU_INSTANCE_PROFILE_2_SLICE),
        (1, 1, 5, p.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1),
        (1, 1, 23, p.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME),
        (4, 4, 90, p.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX),
        (1, 1, 6, p.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME),
        (3, 3, 20, None),
    ]
    names = [profile_name(gi_slices=g, ci_slices=c, gb=gb, gi_profile_id=i, nvml=p) for g, c, gb, i in profiles]
    assert names == ["1g.5gb", "1c.2g.10gb", "1g.5gb+me", "1g.23gb+me.all", "4g.90gb+gfx", "1g.6gb-me", "3g.20gb"]


def test_mig_indices_products_and_parents_round_trip() -> None:
    """GPU 0's MIG devices are 100.., GPU 1's 200..; a GPU's own index has no parent; MIG products are marked."""
    product = mig_product("NVIDIA-A100-SXM4-40GB", "1g.5gb")
    assert (
        [mig_device_index(0, 0), mig_device_index(0, 6), mig_device_index(1, 0)],
        [mig_parent_index(100), mig_parent_index(106), mig_parent_index(200), mig_parent_index(7)],
        (product, is_mig_product(product), is_mig_product("NVIDIA-A100-SXM4-40GB")),
    ) == (
        [100, 106, 200],
        [0, 0, 1, None],
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", True, False),
    )


# -- NvmlProbe over a fake NVML with MIG devices ----------------------------------------------------


PRODUCT = "NVIDIA-A100-SXM4-40GB"


def mig_reading(index: int, uuid: str, profile: str, mib: int, gi: int, ci: int, used: int = 0) -> GpuReading:
    return GpuReading(index, uuid, f"{PRODUCT}-MIG-{profile}", mib, used, mig=MigInfo(0, "GPU-0", profile, gi, ci))


PARENT = GpuReading(0, "GPU-0", PRODUCT, 40960, 0, "Enabled")
MIGS = (
    mig_reading(100, "MIG-a", "1g.5gb", 4864, 7, 0, used=600),
    mig_reading(101, "MIG-b", "1g.5gb", 4864, 8, 0),
    mig_reading(103, "MIG-c", "1c.2g.10gb", 9984, 3, 1),
    mig_reading(104, "MIG-d", "1g.5gb+me", 4864, 9, 0),
)
PLAIN = GpuReading(1, "GPU-1", PRODUCT, 40960, 0, "Disabled")


def test_a_gpu_in_mig_mode_is_read_with_its_mig_devices_as_devices_of_their_own() -> None:
    """The parent, then its MIG devices (empty slots skipped) with NVIDIA's profile names, memory and
    instance ids, then the next GPU."""
    with NvmlProbe(nvml=MigNvml(a100_in_mig_mode())) as probe:
        reading = probe.read()
    assert reading == NodeReading("550.54.15", "12.4", (PARENT, *MIGS, PLAIN))


def test_mig_devices_that_cannot_be_listed_keep_their_identity_unhealthy() -> None:
    """When listing fails without permission the parent names the setting to change, and MIG devices read
    before stay reported (unhealthy, same reason) so their tasks are rescheduled rather than forgotten."""
    gpus = a100_in_mig_mode()
    with NvmlProbe(nvml=MigNvml(gpus)) as probe:
        probe.read()
        gpus[0].errors["nvmlDeviceGetMaxMigDeviceCount"] = pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        reading = probe.read()
    parent = GpuReading(0, "GPU-0", PRODUCT, 40960, 0, "Enabled", False, f"MIG mode is enabled; {MIG_PERMISSION_HINT}")
    lost = tuple(GpuReading(m.index, m.uuid, m.product, m.memory_total_mib, 0, None, False, MIG_PERMISSION_HINT, m.mig)
                 for m in MIGS)
    assert reading.gpus == (parent, *lost, PLAIN)


def test_a_critical_xid_on_a_gpu_in_mig_mode_marks_its_mig_devices_unhealthy() -> None:
    """XID 79 on the GPU takes it and every MIG device on it out for good; the other GPU stays healthy."""
    nvml = MigNvml(a100_in_mig_mode(), events=True)
    with NvmlProbe(nvml=nvml) as probe:
        probe.read()
        nvml.emit_xid(0, 79)
        reading = probe.read()
    assert [(g.index, g.healthy, g.reason) for g in reading.gpus] == [
        (0, False, "XID 79"), (100, False, "XID 79"), (101, False, "XID 79"), (103, False, "XID 79"),
        (104, False, "XID 79"), (1, True, ""),
    ]


def test_processes_are_read_per_mig_device_never_on_the_gpu_in_mig_mode() -> None:
    """With processes asked for, each MIG device lists its own (PID, MiB); the GPU in MIG mode lists none, so
    memory used inside a MIG device is never counted on its parent."""
    gpus = a100_in_mig_mode()
    assert gpus[0].migs[0] is not None
    gpus[0].migs[0].processes = [(4242, 1500 * MIB)]
    with NvmlProbe(nvml=MigNvml(gpus), processes=True) as probe:
        reading = probe.read()
    assert [(g.index, g.processes) for g in reading.gpus[:3]] == [
        (0, None), (100, (ProcessUse(4242, 1500),)), (101, ()),
    ]


def test_the_gpunode_lists_mig_devices_with_their_parent_and_the_parent_unschedulable() -> None:
    """The device view marks the parent unschedulable (MIG_REASON) and the status gives each MIG device a
    ``mig`` entry; the summary counts them by product."""
    view = device_view(NodeReading("550.54.15", "12.4", (PARENT, MIGS[0], MIGS[2])))
    status = gpunode_status(view, dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    mig = {"parentIndex": 0, "parentUUID": "GPU-0", "gpuInstanceId": 7, "computeInstanceId": 0, "profile": "1g.5gb"}
    assert (status["gpus"], status["summary"]) == (
        [
            {"index": 0, "uuid": "GPU-0", "product": PRODUCT, "memory": "40960Mi", "memoryUsed": "0Mi",
             "healthy": False, "reason": MIG_REASON},
            {"index": 100, "uuid": "MIG-a", "product": f"{PRODUCT}-MIG-1g.5gb", "memory": "4864Mi",
             "memoryUsed": "600Mi", "healthy": True, "reason": "", "mig": mig},
            {"index": 103, "uuid": "MIG-c", "product": f"{PRODUCT}-MIG-1c.2g.10gb", "memory": "9984Mi",
             "memoryUsed": "0Mi", "healthy": True, "reason": "",
             "mig": mig | {"gpuInstanceId": 3, "computeInstanceId": 1, "profile": "1c.2g.10gb"}},
        ],
        f"1x {PRODUCT} (40Gi), 1x {PRODUCT}-MIG-1c.2g.10gb (9.8Gi), 1x {PRODUCT}-MIG-1g.5gb (4.8Gi)",
    )


def test_get_nodes_counts_a_gpu_in_mig_mode_through_its_mig_devices() -> None:
    """`gputask get nodes` lists MIG devices by product and counts their memory, not the GPU in MIG mode's too."""
    node = Node(NodeName("n"), (
        Gpu(0, "GPU-0", PRODUCT, 40960, healthy=False),
        Gpu(100, "MIG-a", f"{PRODUCT}-MIG-3g.20gb", 20096),
        Gpu(101, "MIG-b", f"{PRODUCT}-MIG-3g.20gb", 20096),
        Gpu(1, "GPU-1", PRODUCT, 40960),
    ))
    row = node_rows(SimpleNamespace(scheduler=Scheduler(nodes=[node])))[0]  # type: ignore[arg-type]
    assert (row["gpus"], row["total_mib"], row["free_mib"]) == (
        {PRODUCT: 1, f"{PRODUCT}-MIG-3g.20gb": 2}, 81152, 81152,
    )
