"""What the agent reads from the GPUs: value types, the probe protocol, and the NVML probe.

:class:`GpuProbe` is the seam: :class:`NvmlProbe` reads real devices through ``pynvml``
(package ``nvidia-ml-py``, imported only when a probe opens, so this module imports without
it) and :class:`~gputask.agent.fake.FakeProbe` returns the same shapes from a spec such as
``2x24Gi``. A probe never raises for one broken device: that device is reported unhealthy with
the NVML error text as its reason. Only a node-wide failure raises :class:`ProbeError`.

Health from XID events. The probe registers every device for
``nvmlEventTypeXidCriticalError`` and drains the event set without blocking at each read. A
device that had a critical XID stays unhealthy ("XID <n>") until the agent restarts, as in
NVIDIA's k8s-device-plugin (``internal/rm/health.go``). That plugin's rule is followed: every
critical XID marks the device unhealthy except the application errors it skips, 13 (graphics
engine exception), 31 (memory page fault), 43 (GPU stopped processing), 45 (preemptive
cleanup), 68 (video processor exception) and 109 (context switch timeout, skipped by newer
releases); see NVIDIA's XID catalogue, https://docs.nvidia.com/deploy/xid-errors/. So 48
(double-bit ECC), 63/64 (ECC page retirement / row remapping), 74 (NVLink), 79 (fallen off
the bus), 92 (high single-bit ECC rate), 94/95 (contained / uncontained ECC) and any other
critical XID make the device unhealthy. An event whose device cannot be identified, or a
failed wait, marks every device unhealthy (the plugin does the same). Where events are not
supported (old GPUs, some virtualised ones) the probe records it in :attr:`NvmlProbe.events`
and goes on with query-based health only.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Protocol

from gputask.agent.errors import ProbeError, ProbeUnavailable
from gputask.agent.mig import MIG_PERMISSION_HINT, MigDevice, MigInfo, mig_product, read_mig_devices
from gputask.agent.processes import ProcessUse
from gputask.core.model import GpuLink, mig_device_index

log = logging.getLogger("gputask.agent")

MIB = 1024 * 1024
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MAX_EVENTS_PER_READ = 256  # bounds one drain if a device floods the event set


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One device as read: product with spaces as '-', memory in MiB, MIG mode if supported.

    ``memory_total_mib`` is what tasks can allocate: NVML's total less the driver's reserve
    where the driver tells it (see :func:`_memory`); ``memory_used_mib`` is what processes hold.
    A MIG device (:mod:`gputask.agent.mig`) is a reading of its own with ``mig`` set, its index
    from :func:`~gputask.core.model.mig_device_index` and its parent's product with ``-MIG-<profile>``.
    ``processes``: the compute processes on it (host PIDs, MiB each), None when not read (the probe
    was not asked to, NVML cannot list them here, or it is a GPU in MIG mode: its processes are read
    per MIG device).
    """

    index: int
    uuid: str
    product: str
    memory_total_mib: int
    memory_used_mib: int
    mig_mode: str | None = None
    healthy: bool = True
    reason: str = ""
    mig: MigInfo | None = None
    processes: tuple[ProcessUse, ...] | None = None


@dataclass(frozen=True, slots=True)
class NodeReading:
    """All devices of the node, in index order, with the driver and CUDA versions, and how pairs of its GPUs are
    connected (``links``, sorted by ``(a, b)``; empty when not known: see :func:`read_links`)."""

    driver_version: str
    cuda_version: str
    gpus: tuple[GpuReading, ...]
    links: tuple[GpuLink, ...] = ()


class GpuProbe(Protocol):
    """Reads the node's GPUs. ``read`` may block briefly; callers run it in a worker thread."""

    def read(self) -> NodeReading:
        """The current reading; ProbeError when the node as a whole cannot be read."""
        ...

    def close(self) -> None:
        """Release what the probe holds (NVML handles, event sets)."""
        ...


def product_name(raw: str | bytes) -> str:
    """NVML's device name as DESIGN.md spells products: spaces replaced by '-'."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return text.strip().replace(" ", "-")


def cuda_version_text(value: int) -> str:
    """NVML's CUDA driver version integer (12040) as text ("12.4")."""
    return f"{value // 1000}.{value % 1000 // 10}"


@dataclass(frozen=True, slots=True)
class _Known:
    """The last good identity of a device, reused when a later query of it fails."""

    uuid: str
    product: str
    memory_total_mib: int


NVML_HINT = (
    "In a pod the agent reaches NVML through the NVIDIA container runtime: the chart's agent.runtimeClassName "
    "(default nvidia, the RuntimeClass of the NVIDIA GPU Operator) must name a RuntimeClass of that runtime on "
    "this node (kubectl get runtimeclass), or be empty where it is containerd's default; on a host, check that "
    "nvidia-smi works"
)
"""What to check when NVML cannot start: the setting to change, not only the driver."""


class NvmlProbe:
    """Reads devices through NVML; ``nvml`` replaces the ``pynvml`` module (tests inject a fake).

    ``events`` maps each device index to whether XID events are supported on it, once opened.
    With ``processes`` each reading lists every device's compute processes (:func:`_processes`);
    ``process_errors`` then holds, per device index, why its list could not be read at the last read.
    """

    def __init__(self, *, nvml: ModuleType | Any | None = None, processes: bool = False) -> None:
        self._nvml = nvml
        self.processes = processes
        self.process_errors: dict[int, str] = {}
        self._lock = threading.Lock()
        self._opened = False
        self._event_set: Any = None
        self._known: dict[int, _Known] = {}
        self._known_mig: dict[int, tuple[GpuReading, ...]] = {}  # parent index -> its MIG devices as last read
        self._sticky: dict[int, str] = {}  # index -> reason ("XID 79"), unhealthy until restart
        self.events: dict[int, bool] = {}
        self._links: tuple[tuple[tuple[int, str], ...], tuple[GpuLink, ...]] | None = None  # (GPUs read, links)

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """nvmlInit once and register for XID events; ProbeUnavailable when NVML cannot start."""
        with self._lock:
            if self._opened:
                return
            nvml = self._module()
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                raise ProbeUnavailable(f"NVML could not initialise: {exc}. {NVML_HINT}") from None
            self._opened = True
            self._register_events(nvml)

    def close(self) -> None:
        """Free the event set and shut NVML down; safe to call twice."""
        with self._lock:
            if not self._opened:
                return
            nvml, self._opened = self._module(), False
            try:
                if self._event_set is not None:
                    nvml.nvmlEventSetFree(self._event_set)
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.warning("NVML shutdown: %s", exc)
            self._event_set = None

    def __enter__(self) -> NvmlProbe:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _module(self) -> Any:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError:
                raise ProbeUnavailable("pynvml is not installed (pip install 'gputask[agent]')") from None
        return self._nvml

    # -- reading ---------------------------------------------------------------------------

    def read(self) -> NodeReading:
        """One reading of every device; a device whose query fails is reported unhealthy."""
        self.open()
        with self._lock:
            nvml = self._module()
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except nvml.NVMLError as exc:
                raise ProbeError(f"nvmlDeviceGetCount: {exc}") from None
            gpus = [gpu for index in range(count) for gpu in self._read_device(nvml, index)]
            self._drain_events(nvml, count)
            links = self._links_of(nvml, gpus)
            gpus = [self._with_sticky(gpu) for gpu in gpus]
            return NodeReading(self._driver_version(nvml), self._cuda_version(nvml), tuple(gpus), links)

    def _links_of(self, nvml: Any, gpus: list[GpuReading]) -> tuple[GpuLink, ...]:
        """How the GPUs read are connected: read once (topology does not change while the agent runs), again
        when the GPUs change or the last reading met an unexpected NVML error."""
        known = tuple((g.index, g.uuid) for g in gpus if g.mig is None)  # GPUs, not their MIG devices
        if self._links is not None and self._links[0] == known:
            return self._links[1]
        links, complete = read_links(nvml, [index for index, _ in known])
        self._links = (known, links) if complete else None
        return links

    def _with_sticky(self, gpu: GpuReading) -> GpuReading:
        reason = self._sticky.get(gpu.mig.parent_index if gpu.mig is not None else gpu.index)
        if reason is None or not gpu.healthy:
            return gpu
        return replace(gpu, healthy=False, reason=reason)

    def _read_device(self, nvml: Any, index: int) -> list[GpuReading]:
        """The device at ``index``, followed by its MIG devices when it is in MIG mode."""
        identity: dict[str, str] = {}
        try:
            handle = _query(nvml, "nvmlDeviceGetHandleByIndex", index)
            identity["uuid"] = _text(_query(nvml, "nvmlDeviceGetUUID", handle))
            identity["product"] = product_name(_query(nvml, "nvmlDeviceGetName", handle))
            total_mib, used_mib = _memory(nvml, handle)
            mig_mode = self._mig_mode(nvml, handle)
        except _QueryFailed as exc:
            return [self._failed_device(index, str(exc), **identity), *self._failed_mig(index, str(exc))]
        uuid, product = identity["uuid"], identity["product"]
        self._known[index] = _Known(uuid, product, total_mib)
        if mig_mode == "Enabled":  # its processes are read per MIG device (the parent's figures are aggregate)
            return self._with_mig_devices(nvml, handle, GpuReading(index, uuid, product, total_mib, used_mib, mig_mode))
        self._known_mig.pop(index, None)
        processes = self._processes_of(nvml, index, handle) if self.processes else None
        return [GpuReading(index, uuid, product, total_mib, used_mib, mig_mode, processes=processes)]

    def _with_mig_devices(self, nvml: Any, handle: Any, gpu: GpuReading) -> list[GpuReading]:
        """``gpu`` (in MIG mode) and its MIG devices; when they cannot be read, ``gpu`` says why and the
        MIG devices read before are kept, unhealthy with that reason (their work is not silently lost)."""
        try:
            found = read_mig_devices(nvml, handle, parent_index=gpu.index, parent_uuid=gpu.uuid)
        except nvml.NVMLError as exc:
            denied = isinstance(exc, getattr(nvml, "NVMLError_NoPermission", ()))
            reason = MIG_PERMISSION_HINT if denied else f"reading its MIG devices failed: {exc}"
            log.warning("GPU %d: %s", gpu.index, reason)
            return [replace(gpu, healthy=False, reason=f"MIG mode is enabled; {reason}"),
                    *self._failed_mig(gpu.index, reason)]
        migs = tuple(self._mig_reading(nvml, gpu, d) for d in found)
        self._known_mig[gpu.index] = migs
        return [gpu, *migs]

    def _mig_reading(self, nvml: Any, gpu: GpuReading, device: MigDevice) -> GpuReading:
        """A MIG device of ``gpu`` as a reading of its own, with its processes (NVML lists a MIG device's
        processes, and their memory, per MIG device handle; the parent's list is aggregate, and only for
        privileged callers: NVML reference, nvmlDeviceGetComputeRunningProcesses)."""
        index = mig_device_index(gpu.index, device.slot)
        processes = self._processes_of(nvml, index, device.handle) if self.processes else None
        return GpuReading(index, device.uuid, mig_product(gpu.product, device.info.profile), device.memory_total_mib,
                          device.memory_used_mib, mig=device.info, processes=processes)

    def _failed_mig(self, parent_index: int, reason: str) -> list[GpuReading]:
        """The MIG devices last read under ``parent_index``, unhealthy with ``reason``."""
        known = self._known_mig.get(parent_index, ())
        return [replace(m, memory_used_mib=0, healthy=False, reason=reason) for m in known]

    def _processes_of(self, nvml: Any, index: int, handle: Any) -> tuple[ProcessUse, ...] | None:
        try:
            found = _processes(nvml, handle)
        except _QueryFailed as exc:
            self.process_errors[index] = str(exc)
            return None
        self.process_errors.pop(index, None)
        return found

    def _failed_device(self, index: int, reason: str, uuid: str = "", product: str = "") -> GpuReading:
        """The device as last known (what this read got first), unhealthy with ``reason``."""
        known = self._known.get(index)
        if known is None or (uuid and uuid != known.uuid):
            known = _Known(uuid or f"GPU-unknown-index-{index}", product or "unknown", 0)
        log.warning("GPU %d unhealthy: %s", index, reason)
        return GpuReading(index, known.uuid, product or known.product, known.memory_total_mib, 0, None, False, reason)

    @staticmethod
    def _mig_mode(nvml: Any, handle: Any) -> str | None:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except _not_supported(nvml):
            return None  # no MIG on this GPU or driver
        except nvml.NVMLError as exc:
            raise _QueryFailed(f"nvmlDeviceGetMigMode: {exc}") from None
        return "Enabled" if current == nvml.NVML_DEVICE_MIG_ENABLE else "Disabled"

    @staticmethod
    def _driver_version(nvml: Any) -> str:
        try:
            return _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            log.warning("driver version: %s", exc)
            return "unknown"

    @staticmethod
    def _cuda_version(nvml: Any) -> str:
        try:
            return cuda_version_text(int(nvml.nvmlSystemGetCudaDriverVersion()))
        except nvml.NVMLError as exc:
            log.warning("CUDA version: %s", exc)
            return "unknown"

    # -- XID events ------------------------------------------------------------------------

    def _register_events(self, nvml: Any) -> None:
        try:
            self._event_set = nvml.nvmlEventSetCreate()
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            log.warning("XID events unavailable (%s); health comes from device queries only", exc)
            return
        for index in range(count):
            self.events[index] = self._register_device(nvml, index)

    def _register_device(self, nvml: Any, index: int) -> bool:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            if not supported & nvml.nvmlEventTypeXidCriticalError:
                log.warning("GPU %d does not report XID events; health from queries only", index)
                return False
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
        except nvml.NVMLError_NotSupported:
            log.warning("GPU %d does not support events; health from queries only", index)
            return False
        except nvml.NVMLError as exc:  # a device that cannot even register is reported by read()
            log.warning("GPU %d: registering XID events failed: %s", index, exc)
            return False
        return True

    def _drain_events(self, nvml: Any, count: int) -> None:
        if self._event_set is None:
            return
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = nvml.nvmlEventSetWait(self._event_set, 0)
            except nvml.NVMLError_Timeout:
                return  # no event pending
            except nvml.NVMLError as exc:
                self._mark_all(count, f"NVML event wait failed: {exc}")
                return
            self._on_event(nvml, event, count)

    def _on_event(self, nvml: Any, event: Any, count: int) -> None:
        if not int(event.eventType) & nvml.nvmlEventTypeXidCriticalError:
            return
        xid = int(event.eventData)
        if xid in APPLICATION_XIDS:
            log.info("XID %d is an application error; the GPU stays healthy", xid)
            return
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
        except nvml.NVMLError as exc:
            self._mark_all(count, f"XID {xid} on an unidentified device ({exc})")
            return
        index = next((i for i, known in self._known.items() if known.uuid == uuid), None)
        if index is None:
            index = self._index_of(nvml, uuid)
        if index is None:
            self._mark_all(count, f"XID {xid} on unknown device {uuid}")
            return
        log.warning("GPU %d (%s): XID %d, marking it unhealthy", index, uuid, xid)
        self._sticky.setdefault(index, f"XID {xid}")

    def _index_of(self, nvml: Any, uuid: str) -> int | None:
        try:
            for index in range(int(nvml.nvmlDeviceGetCount())):
                if _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))) == uuid:
                    return index
        except nvml.NVMLError:
            return None
        return None

    def _mark_all(self, count: int, reason: str) -> None:
        log.warning("all GPUs unhealthy: %s", reason)
        for index in range(count):
            self._sticky.setdefault(index, reason)


# -- GPU topology ------------------------------------------------------------------------------

_ANCESTOR_KINDS = {  # nvmlGpuTopologyLevel_t (nvml.h; a fixed ABI) -> GpuLink kind
    0: "PCIeSwitch",  # NVML_TOPOLOGY_INTERNAL: on one board (e.g. Tesla K80)
    10: "PCIeSwitch",  # NVML_TOPOLOGY_SINGLE: through a single PCIe switch (nvidia-smi PIX)
    20: "PCIeSwitch",  # NVML_TOPOLOGY_MULTIPLE: through PCIe switches, no host bridge (PXB)
    30: "HostBridge",  # NVML_TOPOLOGY_HOSTBRIDGE: through one PCIe host bridge (PHB)
    40: "SameNUMANode",  # NVML_TOPOLOGY_NODE: through host bridges of one NUMA node (NODE)
    50: "CrossNUMA",  # NVML_TOPOLOGY_SYSTEM: across the interconnect between NUMA nodes/sockets (SYS)
}
_NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS where the module lacks it (nvml.h of driver 535; 36 later)
_NVLINK_GPU, _NVLINK_SWITCH = 0x00, 0x02  # NVML_NVLINK_DEVICE_TYPE_GPU, _SWITCH


def read_links(nvml: Any, indices: list[int]) -> tuple[tuple[GpuLink, ...], bool]:
    """How each pair of GPUs ``indices`` (NVML indices, physical GPUs) is connected, and whether the reading is
    complete (False after an unexpected NVML error: the caller reads again later).

    NVLink first: for each GPU, every link 0..NVML_NVLINK_MAX_LINKS-1 that ``nvmlDeviceGetNvLinkState`` says is
    active, to the device ``nvmlDeviceGetNvLinkRemotePciInfo`` names: another GPU of the node (matched by PCI
    domain, bus and device against ``nvmlDeviceGetPciInfo``) or an NVSwitch
    (``nvmlDeviceGetNvLinkRemoteDeviceType``). A pair has the links between them (the larger count of the two
    directions) plus, when both have links to NVSwitches, the fewer of the two's switch links (every GPU of one
    NVSwitch baseboard reaches every other over all of its links: ``nvidia-smi topo -m`` prints NV18 on an HGX
    H100). A pair without NVLink gets the PCIe path ``nvmlDeviceGetTopologyCommonAncestor`` reports
    (:data:`gputask.core.model.LINK_TYPES`). Never raises: NVML_ERROR_NOT_SUPPORTED (a GPU without NVLink, a
    virtual GPU), a call the driver or module lacks, or any other error leaves that link or pair out (no link
    info for it); fewer than two GPUs: none.
    """
    if len(indices) < 2:
        return (), True
    complete = True
    handles: dict[int, Any] = {}
    pci: dict[int, tuple[int, int, int]] = {}
    pci_info = getattr(nvml, "nvmlDeviceGetPciInfo", None)
    for index in indices:
        try:
            handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            log.warning("GPU %d: no link info (%s)", index, exc)
            complete = False
            continue
        if pci_info is None:
            continue
        try:
            pci[index] = _pci_key(pci_info(handles[index]))
        except (nvml.NVMLError, AttributeError, TypeError, ValueError) as exc:
            complete = complete and _expected(nvml, exc)
    by_pci = {key: index for index, key in pci.items()}
    direct: dict[int, dict[int, int]] = {}
    switch: dict[int, int] = {}
    for index, handle in handles.items():
        peers, switches, ok = _nvlinks(nvml, handle, by_pci)
        direct[index], switch[index], complete = peers, switches, complete and ok
    links: list[GpuLink] = []
    ordered = sorted(handles)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            count = max(direct[a].get(b, 0), direct[b].get(a, 0))
            if switch[a] and switch[b]:
                count += min(switch[a], switch[b])
            if count:
                links.append(GpuLink(a, b, "NVLink", count))
                continue
            kind, ok = _common_ancestor(nvml, handles[a], handles[b])
            complete = complete and ok
            if kind is not None:
                links.append(GpuLink(a, b, kind))
    return tuple(links), complete


def _pci_key(info: Any) -> tuple[int, int, int]:
    """(domain, bus, device) of an ``nvmlPciInfo_t``: what a remote link's PCI info and a GPU's own agree on
    (the bus id text differs between the legacy and current formats)."""
    return int(info.domain), int(info.bus), int(info.device)


def _nvlinks(nvml: Any, handle: Any, by_pci: dict[tuple[int, int, int], int]) -> tuple[dict[int, int], int, bool]:
    """(active links to each GPU index, active links to NVSwitches, no unexpected error) of one GPU."""
    state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    remote = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None)
    if state is None or remote is None:
        return {}, 0, True  # a pynvml without NVLink calls
    kind_of = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    gpu_type = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", _NVLINK_GPU)
    switch_type = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", _NVLINK_SWITCH)
    peers: dict[int, int] = {}
    switches, ok = 0, True
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS))):
        try:
            if state(handle, link) != enabled:
                continue
            kind = None
            if kind_of is not None:
                try:
                    kind = kind_of(handle, link)
                except _not_supported(nvml):
                    kind = None  # older drivers: decided by the PCI address alone
            if kind == switch_type:
                switches += 1
                continue
            peer = by_pci.get(_pci_key(remote(handle, link)))
        except (nvml.NVMLError, AttributeError, TypeError, ValueError) as exc:
            ok = ok and _expected(nvml, exc)
            if link == 0 and isinstance(exc, _not_supported(nvml)):
                break  # no NVLink on this GPU: every link answers the same
            continue
        if peer is not None and kind in (None, gpu_type):
            peers[peer] = peers.get(peer, 0) + 1
    return peers, switches, ok


def _common_ancestor(nvml: Any, a: Any, b: Any) -> tuple[str | None, bool]:
    """The kind of PCIe path between two GPUs (None when NVML cannot tell), and no unexpected error."""
    call = getattr(nvml, "nvmlDeviceGetTopologyCommonAncestor", None)
    if call is None:
        return None, True
    try:
        level = int(call(a, b))
    except (nvml.NVMLError, TypeError, ValueError) as exc:
        return None, _expected(nvml, exc)
    return _ANCESTOR_KINDS.get(level), True


def _expected(nvml: Any, exc: BaseException) -> bool:
    """Whether an error of a link query just means "not on this GPU": NotSupported, FunctionNotFound or
    InvalidArgument (a link index past the GPU's links)."""
    invalid = getattr(nvml, "NVMLError_InvalidArgument", None)
    expected = _not_supported(nvml) + ((invalid,) if invalid is not None else ())
    if isinstance(exc, expected):
        return True
    log.warning("reading GPU links: %s", exc)
    return False


class _QueryFailed(Exception):
    """One device query failed; the message names the NVML call and its error text."""


def _query(nvml: Any, name: str, *args: Any) -> Any:
    try:
        return getattr(nvml, name)(*args)
    except nvml.NVMLError as exc:
        raise _QueryFailed(f"{name}: {exc}") from None


def _memory(nvml: Any, handle: Any) -> tuple[int, int]:
    """(allocatable MiB, used MiB) of one device; used rounds up.

    NVML's v2 memory query (``nvmlDeviceGetMemoryInfo_v2``) separates what the driver and
    firmware reserve from what processes use; v1 counts the reserve as used. On an idle H200
    with driver 580.159 the reserve is 616 MiB: v1 says 616 MiB used where nvidia-smi says 0.
    With v2 the GPU's memory is reported as total minus the reserve (what tasks can allocate)
    and used is what processes hold, so the operator's ``foreignMemoryToleranceMiB`` only has
    to absorb CUDA contexts (526 MiB per process there). Where v2 is missing (older drivers or
    pynvml) v1 is read: total, and used including the reserve.
    Raises _QueryFailed when the query fails for another reason.
    """
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except _not_supported(nvml):
            pass
        except nvml.NVMLError as exc:
            raise _QueryFailed(f"nvmlDeviceGetMemoryInfo_v2: {exc}") from None
        else:
            return (int(memory.total) - int(memory.reserved)) // MIB, -(-int(memory.used) // MIB)
    memory = _query(nvml, "nvmlDeviceGetMemoryInfo", handle)
    return int(memory.total) // MIB, -(-int(memory.used) // MIB)


_PROCESS_LISTS = (
    (("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"), True),
    (("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2"), False),
)


def _processes(nvml: Any, handle: Any) -> tuple[ProcessUse, ...]:
    """The compute processes on a device: host PID and MiB used (rounded up; None where NVML reports
    NVML_VALUE_NOT_AVAILABLE, which pynvml turns into None), by PID.

    ``nvmlDeviceGetComputeRunningProcesses`` (pynvml calls the v3 entry point) lists processes with a
    CUDA context; ``usedGpuMemory`` is "all of the memory used by the application" (NVML reference).
    Processes that are clients of an MPS server are listed by ``...MPSComputeRunningProcesses`` too;
    both lists are merged by PID. Drivers without the v3 entry point (FunctionNotFound) are asked
    through v2. On a GPU in MIG mode the parent device gives aggregate figures only to privileged
    callers (NVML reference); what it gives is taken as it is. Raises _QueryFailed when the list
    cannot be read.
    """
    found: dict[int, int | None] = {}
    for names, required in _PROCESS_LISTS:
        for process in _process_list(nvml, handle, names, required=required):
            used = process.usedGpuMemory
            mib = None if used is None else -(-int(used) // MIB)
            pid = int(process.pid)
            found[pid] = mib if found.get(pid) is None else found[pid]
    return tuple(ProcessUse(pid, mib) for pid, mib in sorted(found.items()))


def _process_list(nvml: Any, handle: Any, names: tuple[str, str], *, required: bool) -> list[Any]:
    """One process list, through the first entry point the driver has; an optional list (MPS) the driver
    does not support is empty."""
    for name in names:
        call = getattr(nvml, name, None)
        if call is None:
            continue
        try:
            return list(call(handle))
        except _not_supported(nvml):
            continue
        except nvml.NVMLError as exc:
            raise _QueryFailed(f"{name}: {exc}") from None
    if required:
        raise _QueryFailed(f"{names[0]}: not supported by this driver")
    return []


def _not_supported(nvml: Any) -> tuple[type[BaseException], ...]:
    """NotSupported, plus FunctionNotFound where the module has it (older drivers lack calls)."""
    missing = getattr(nvml, "NVMLError_FunctionNotFound", None)
    return (nvml.NVMLError_NotSupported,) if missing is None else (nvml.NVMLError_NotSupported, missing)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
