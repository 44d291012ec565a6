"""What a GPUNode's agent reports of who uses its GPUs, read for the operator (DESIGN.md, GPUNode).

- ``status.podResources``: the GPUs the kubelet gave each device-plugin pod (by namespace and
  name: the kubelet's PodResources API has no pod uids), and whether the agent could read it;
- ``status.gpus[i].pods``: GPU memory per pod uid, where the agent could split it.

Malformed entries are skipped (the CRD schema refuses them; an old or broken agent must not stop
the operator). :func:`foreign_mib` is the memory rule that uses the split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gputask.core import Node
from gputask.core.model import mig_parent_index
from gputask.manifests.convert import quantity

MIB = 1024 * 1024
NOT_REPORTED = "NotReported"


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """``status.podResources``: ``available`` (None when the agent does not report it), why, and the GPU UUIDs of
    each (namespace, name) pod."""

    available: bool | None
    reason: str = NOT_REPORTED
    message: str = ""
    pods: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str) and v) if isinstance(value, list) else ()


def device_report(status: Mapping[str, Any] | None) -> DeviceReport:
    """The ``podResources`` part of a GPUNode status."""
    raw = _mapping(_mapping(status).get("podResources"))
    available = raw.get("available")
    if not isinstance(available, bool):
        return DeviceReport(None)
    pods: dict[tuple[str, str], tuple[str, ...]] = {}
    for entry in raw.get("pods") if isinstance(raw.get("pods"), list) else []:
        entry = _mapping(entry)
        namespace, name = entry.get("namespace"), entry.get("name")
        if isinstance(namespace, str) and isinstance(name, str) and name:
            pods[(namespace, name)] = _strings(entry.get("gpus"))
    return DeviceReport(available, str(raw.get("reason") or ""), str(raw.get("message") or ""), pods)


def pod_memory(status: Mapping[str, Any] | None) -> dict[int, dict[str, int]]:
    """``{gpu index: {pod uid: MiB}}`` for the GPUs whose memory the agent split by pod (``gpus[i].pods``; MiB
    rounded down); a GPU without the field is absent (not known), one with an empty list is known idle of pods."""
    out: dict[int, dict[str, int]] = {}
    entries = _mapping(status).get("gpus")
    for gpu in entries if isinstance(entries, list) else []:
        gpu = _mapping(gpu)
        index, pods = gpu.get("index"), gpu.get("pods")
        if isinstance(index, bool) or not isinstance(index, int) or not isinstance(pods, list):
            continue
        split: dict[str, int] = {}
        for pod in pods:
            pod = _mapping(pod)
            uid = pod.get("uid")
            try:
                mib = math.floor(quantity(pod.get("memoryUsed"), field="memoryUsed") / MIB)
            except (ValueError, TypeError):
                continue
            if isinstance(uid, str) and uid and mib >= 0:
                split[uid] = split.get(uid, 0) + mib
        out[index] = split
    return out


def foreign_mib(*, used_mib: int, reserved_mib: int, ours_mib: int | None, tolerance_mib: int) -> int:
    """MiB of a GPU to count as foreign use (placement then leaves it alone), before capping at the GPU's size.

    ``used_mib``: all memory in use on the GPU (NVML); ``reserved_mib``: what gputask reserved there;
    ``ours_mib``: what the processes of gputask's own pods use there, None when the agent could not split
    the GPU's memory by pod. The tolerance absorbs what reservations do not cover (CUDA contexts).

    Without the split (today's rule): used beyond what gputask reserved, ``used - reserved``. Memory a task
    reserved but does not use yet hides that much of other pods' use, and the GPU looks freer than it is.

    With the split, both parts are known: other pods use ``used - ours`` and all of it counts; gputask's own
    pods count only beyond their reservation (``ours - reserved``, the overflow a memory budget reports).
    That is never less than the old rule, and equal to it while our tasks use what they reserved.
    """
    if ours_mib is None:
        beyond = used_mib - reserved_mib
    else:
        beyond = max(0, used_mib - ours_mib) + max(0, ours_mib - reserved_mib)
    return max(0, beyond - tolerance_mib)


__all__ = ["NOT_REPORTED", "DeviceReport", "device_report", "foreign_mib", "pod_memory"]


def sound_pod_memory(split: Mapping[int, Mapping[str, int]], node: Node) -> tuple[dict[int, dict[str, int]], list[str]]:
    """The part of :func:`pod_memory`'s ``split`` the operator believes, and one error line per GPU it does not.

    Kept: GPUs the operator accepted (in ``node``, after refused entries are dropped), never a GPU in MIG mode
    (its figures would be aggregates of its MIG devices', which are reported as devices of their own), and only
    where the pods' memory together fits the GPU (more is a lie: that GPU's split is then taken as not known).
    """
    memory = {g.index: g.memory_mib for g in node.gpus}
    in_mig_mode = {mig_parent_index(g.index) for g in node.gpus} - {None}
    kept: dict[int, dict[str, int]] = {}
    errors: list[str] = []
    for index, pods in sorted(split.items()):
        if index not in memory or index in in_mig_mode:
            continue
        if sum(pods.values()) > memory[index]:
            errors.append(f"GPU {index}: its pods' memory ({sum(pods.values())} MiB) is more than the GPU's "
                          f"({memory[index]} MiB); not used for memory budgets")
            continue
        kept[index] = dict(pods)
    return kept, errors
