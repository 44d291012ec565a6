"""Who uses which GPU on the node, as the agent reports it beside the devices.

Two sources, each reported with whether it could be read and why not:

- **podResources**: the kubelet's device assignments (:mod:`gputask.agent.podresources`), each
  device ID resolved to the GPU it is on (:func:`gpu_of`), so the operator knows exactly which
  GPUs a device-plugin pod holds instead of guessing from its ``nvidia.com/gpu`` count;
- **processMemory**: NVML's compute processes mapped to pods through their cgroups
  (:mod:`gputask.agent.processes`), summed per GPU and pod, so the operator can compare each of its
  tasks with its reservation and count what other pods use exactly.

Device IDs as NVIDIA's k8s-device-plugin hands them out (``api/config/v1/replicas.go``,
``internal/rm/devices.go``): ``GPU-<uuid>`` (the default ``deviceIDStrategy: uuid``), ``<index>``
(``deviceIDStrategy: index``), MIG devices as ``MIG-<uuid>`` (drivers R470+) or
``MIG-GPU-<uuid>/<gi>/<ci>`` (older) or ``<index>:<mig index>``, and any of these with a
``::<replica>`` suffix for time-slicing or MPS sharing (``NewAnnotatedID``: ``"%s::%d"``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gputask.agent.podresources import PodResourcesReading
from gputask.agent.probe import GpuReading, NodeReading
from gputask.agent.processes import ContainerRef, memory_by_pod
from gputask.core.model import mig_device_index

_INDEX = re.compile(r"^(\d+)(?::(\d+))?$")  # deviceIDStrategy index: "<gpu>" or "<gpu>:<mig device index>"
READ, HOST_PID_DISABLED, NOT_AVAILABLE = "Read", "HostPIDDisabled", "NotAvailable"
HOST_PID_MESSAGE = (
    "the agent does not share the host's PID namespace (chart: agent.hostPID), so the host PIDs NVML lists "
    "cannot be looked up: GPU memory is not split by pod"
)


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a source could be read (``reason`` CamelCase, ``message`` for people)."""

    available: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class PodGpus:
    """A pod the kubelet gave NVIDIA devices: the GPUs they are on (UUIDs, first seen first) and the raw IDs."""

    namespace: str
    name: str
    gpus: tuple[str, ...]
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Attribution:
    """The node's pod-to-GPU view: device assignments and memory per pod.

    ``pod_memory``: per GPU index whose processes were split by pod, the (pod uid, MiB) pairs sorted
    by uid; a GPU absent from it is not known (not read, or NVML gave no figure for some process).
    """

    pod_resources: Availability
    pod_gpus: tuple[PodGpus, ...]
    process_memory: Availability
    pod_memory: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]


def gpu_of(device_id: str, gpus: Sequence[GpuReading]) -> str | None:
    """The UUID of the device a device-plugin device ID names (module docstring for the forms), or None.

    A MIG device resolves to its own entry (a MIG device is a device of its own in the reading,
    :mod:`gputask.agent.mig`), else, where the reading lacks it, to the GPU it is on.
    """
    base = device_id.split("::", 1)[0]
    by_uuid = {g.uuid for g in gpus}
    if base in by_uuid:
        return base
    if base.startswith("MIG-GPU-"):  # MIG-GPU-<uuid>/<gi>/<ci>
        parent, _, ids = base[len("MIG-"):].partition("/")
        mig = next((g.uuid for g in gpus if g.mig is not None and g.mig.parent_uuid == parent
                    and f"{g.mig.gpu_instance_id}/{g.mig.compute_instance_id}" == ids), None)
        return mig or (parent if parent in by_uuid else None)
    by_index = _INDEX.match(base)
    if by_index is not None:
        gpu, mig_slot = int(by_index.group(1)), by_index.group(2)
        index = gpu if mig_slot is None else mig_device_index(gpu, int(mig_slot))
        found = next((g.uuid for g in gpus if g.index == index), None)
        return found or next((g.uuid for g in gpus if g.index == gpu), None)
    return None


def pod_gpus(reading: PodResourcesReading, gpus: Sequence[GpuReading]) -> tuple[PodGpus, ...]:
    """Each pod of a PodResources reading with the GPUs its devices are on (IDs on no GPU of ours kept raw)."""
    out = []
    for pod in reading.pods:
        ids = tuple(device for _, device in pod.devices)
        found = (gpu_of(device, gpus) for device in ids)
        out.append(PodGpus(pod.namespace, pod.name, tuple(dict.fromkeys(u for u in found if u)), ids))
    return tuple(out)


def process_memory(
    gpus: Sequence[GpuReading], *, host_pid: bool, lookup: Callable[[int], ContainerRef | None]
) -> tuple[Availability, tuple[tuple[int, tuple[tuple[str, int], ...]], ...]]:
    """Memory per pod on each GPU whose processes could be split, and whether that worked (and why not)."""
    if not host_pid:
        return Availability(False, HOST_PID_DISABLED, HOST_PID_MESSAGE), ()
    split: list[tuple[int, tuple[tuple[str, int], ...]]] = []
    missing: list[str] = []
    for gpu in gpus:
        if gpu.mig_mode == "Enabled":
            continue  # a GPU in MIG mode: its processes are read per MIG device, each a reading of its own
        if gpu.processes is None:
            missing.append(f"GPU {gpu.index}: NVML did not list its processes")
            continue
        found = memory_by_pod(gpu.processes, lookup)
        if found is None:
            missing.append(f"GPU {gpu.index}: NVML gave no memory figure for some process")
            continue
        split.append((gpu.index, tuple(found[0].items())))
    if gpus and not split:
        return Availability(False, NOT_AVAILABLE, "; ".join(missing)), ()
    message = "GPU memory split by pod through each process's cgroup"
    return Availability(True, READ, "; ".join([message, *missing])), tuple(split)


def attribute(
    reading: NodeReading,
    pod_resources: PodResourcesReading,
    *,
    host_pid: bool,
    lookup: Callable[[int], ContainerRef | None],
) -> Attribution:
    """The attribution of one reading (its GPUs) and one PodResources reading."""
    devices = Availability(pod_resources.available, pod_resources.reason, pod_resources.message)
    memory, per_gpu = process_memory(reading.gpus, host_pid=host_pid, lookup=lookup)
    return Attribution(devices, pod_gpus(pod_resources, reading.gpus), memory, per_gpu)


def status_fields(attribution: Attribution) -> dict[str, Any]:
    """``status.podResources`` and ``status.processMemory`` (lists always written: the agent merge-patches
    its status, so a list left out would keep its old entries)."""

    def said(a: Availability) -> dict[str, Any]:
        return {"available": a.available, "reason": a.reason, "message": a.message[:4096]}

    pods = [{"namespace": p.namespace, "name": p.name, "gpus": list(p.gpus), "deviceIDs": list(p.device_ids)}
            for p in attribution.pod_gpus]
    return {"podResources": said(attribution.pod_resources) | {"pods": pods},
            "processMemory": said(attribution.process_memory)}


def gpu_pods(attribution: Attribution | None, index: int) -> list[dict[str, Any]] | None:
    """``status.gpus[i].pods`` of GPU ``index``: ``[{uid, memoryUsed}]``, or None when not known."""
    if attribution is None:
        return None
    for gpu, pods in attribution.pod_memory:
        if gpu == index:
            return [{"uid": uid, "memoryUsed": f"{mib}Mi"} for uid, mib in pods]
    return None


def moved(old: Attribution | None, new: Attribution | None, threshold_mib: int) -> bool:
    """Whether ``new`` says something ``old`` did not: any change but pod memory moving less than
    ``threshold_mib`` (memory moves all the time; the heartbeat carries small moves)."""
    if old is None or new is None:
        return old is not new

    def fixed(a: Attribution) -> tuple[Any, ...]:
        shape = tuple((gpu, tuple(uid for uid, _ in pods)) for gpu, pods in a.pod_memory)
        return a.pod_resources, a.pod_gpus, a.process_memory, shape

    if fixed(old) != fixed(new):
        return True
    pairs = zip(old.pod_memory, new.pod_memory, strict=True)
    return any(abs(a - b) >= threshold_mib for (_, x), (_, y) in pairs for (_, a), (_, b) in zip(x, y, strict=True))


__all__ = ["Attribution", "Availability", "PodGpus", "attribute", "gpu_of", "gpu_pods", "status_fields"]
