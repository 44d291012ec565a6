"""Which pod a GPU process belongs to: its cgroup, read from ``/proc/<pid>/cgroup``.

NVML lists the processes that hold a compute context on each GPU with their host PIDs: the
driver does not know PID namespaces (NVIDIA/nvidia-docker#1483, NVIDIA/gpu-monitoring-tools#63),
so the agent can look those PIDs up only when it shares the host's PID namespace (the chart's
``agent.hostPID``). Each PID's ``/proc/<pid>/cgroup`` (world-readable, no privilege needed) names
the cgroup the kubelet and the container runtime put the container in:

cgroup v1 (one line per hierarchy, ``ID:controllers:path``) and v2 (``0::path``), with the
kubelet's two drivers (``pkg/kubelet/cm``: a pod's cgroup is ``pod<uid>`` under its QoS class,
``kubepods/{burstable,besteffort}/``, Guaranteed pods directly under ``kubepods``; the systemd
driver turns each level into a slice and writes the uid's dashes as underscores)::

    cgroupfs: /kubepods/burstable/pod<uid>/<container id>
              /kubepods/pod<uid>/<container id>                  (Guaranteed)
              /kubepods/besteffort/pod<uid>/crio-<container id>  (CRI-O)
    systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
                  cri-containerd-<id>.scope   (containerd)   crio-<id>.scope   (CRI-O)
                  docker-<id>.scope           (cri-dockerd)
              /kubelet.slice/kubelet-kubepods.slice/...      (kind: cgroup root /kubelet)

A reader in its own cgroup namespace (the default for containers on cgroup v2) sees paths
relative to its own cgroup, such as ``0::/../../kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope``;
the rules below look for the pod's segment anywhere in the path, so those parse too. Trailing
segments after the container's (CRI-O's ``.../crio-<id>.scope/container``) are ignored; a
segment ``crio-conmon-<id>.scope`` is CRI-O's monitor process, not a container.

The container ID is given as a pod status writes it (``containerd://<id>``, ``cri-o://<id>``,
``docker://<id>``), and bare where the path does not say the runtime (cgroupfs with containerd
or Docker).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_CGROUPFS = re.compile(rf"^pod({_UUID})$")
_POD_SYSTEMD = re.compile(rf"^(?:[a-z0-9_.]+-)?kubepods(?:-[a-z]+)?-pod({_UUID})\.slice$")
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")
_SCHEMES = {"cri-containerd": "containerd://", "crio": "cri-o://", "docker": "docker://", None: ""}


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A process's pod (metadata.uid, with dashes) and container (``containerd://<id>``; "" when the path ends
    at the pod)."""

    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> ContainerRef | None:
    """The pod and container a ``/proc/<pid>/cgroup`` text names, or None for a process outside any pod."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            found = parse_cgroup_path(parts[2])
            if found is not None:
                return found
    return None


def parse_cgroup_path(path: str) -> ContainerRef | None:
    """The pod and container of one cgroup path (see the module docstring), or None."""
    segments = [s for s in path.strip().split("/") if s]
    for position, segment in enumerate(segments):
        match = _POD_CGROUPFS.match(segment) or _POD_SYSTEMD.match(segment)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        following = segments[position + 1] if position + 1 < len(segments) else ""
        container = _CONTAINER.match(following)
        if container is None:
            return ContainerRef(uid, "")
        return ContainerRef(uid, _SCHEMES[container.group(1)] + container.group(2))
    return None


def read_cgroup(pid: int, proc_root: str | Path = "/proc") -> ContainerRef | None:
    """The pod and container of process ``pid``, or None (gone, not in a pod, unreadable)."""
    try:
        text = (Path(proc_root) / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    return parse_cgroup(text)


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """One process NVML lists on a GPU: host PID and memory it uses in MiB (rounded up; None when NVML says
    the value is not available)."""

    pid: int
    used_mib: int | None


def memory_by_pod(
    processes: Iterable[ProcessUse], lookup: Callable[[int], ContainerRef | None]
) -> tuple[dict[str, int], int] | None:
    """MiB per pod uid on one GPU, and the MiB of processes in no pod; None when some process's memory is
    not available (the GPU's split by pod is then unknown, not zero)."""
    pods: dict[str, int] = {}
    outside = 0
    for process in processes:
        if process.used_mib is None:
            return None
        ref = lookup(process.pid)
        if ref is None:
            outside += process.used_mib
        else:
            pods[ref.pod_uid] = pods.get(ref.pod_uid, 0) + process.used_mib
    return dict(sorted(pods.items())), outside


__all__ = ["ContainerRef", "ProcessUse", "memory_by_pod", "parse_cgroup", "parse_cgroup_path", "read_cgroup"]
