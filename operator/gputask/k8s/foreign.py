"""GPUs and node resources held by pods gputask did not create, so it never places work on a GPU
someone else has, nor onto a node whose cpu, memory or pod slots other pods already take.

Every foreign pod bound to a node and not finished (DaemonSets included) counts with its effective
requests (:func:`gputask.manifests.podfit.pod_requests`, kube-scheduler's rules): the inventory
offers the scheduler the Node's allocatable less their sum (:meth:`ForeignPods.requests_on`).

A pod counts as *foreign GPU use* when it has no ``gputask.io/task`` label, is bound to a node
(``spec.nodeName``), has not finished (phase not Succeeded or Failed), and either requests
``nvidia.com/gpu`` (limits, else requests) or sets ``NVIDIA_VISIBLE_DEVICES`` to GPU UUIDs or
indices (``all`` means every GPU of the node; ``void``, ``none`` and an empty value mean none).

:class:`ForeignPods` is an incremental index ``node -> {pod uid: claim}`` fed by pod watch
events (one pod at a time; nothing lists every pod per cycle). :func:`occupied_gpus` turns a
node's claims into the GPUs that are fully occupied:

1. GPUs named by UUID or index are occupied;
2. the GPUs the kubelet gave a device-plugin pod, as the node's agent read them from the kubelet's
   PodResources API (GPUNode ``status.podResources``, :mod:`gputask.k8s.usage`), are occupied: the
   exact devices, for ``nvidia.com/gpu`` and for NVIDIA's other resources (``nvidia.com/gpu.shared``,
   ``nvidia.com/mig-*``), which the count rule below does not see at all;
3. only where the agent says the API is not available (or does not report it), and for a pod
   bound after the agent's last report (the kubelet assigns devices when it admits the pod; the
   report follows within an agent interval), ``nvidia.com/gpu: N`` counts N whole GPUs: first those
   the agent reports busy with memory gputask did not reserve (the likely ones), then idle GPUs
   (no gputask reservation, nothing foreign) in index order, and only then GPUs gputask uses; never
   a GPU in MIG mode (the device plugin hands out its MIG devices instead: under its single strategy
   ``nvidia.com/gpu`` may be one of them). ``nvidia.com/mig-<profile>: N`` counts N MIG devices of
   that profile in the same order.

A pod the kubelet reports that the API does not have as bound and unfinished is ignored: the
kubelet's List can still name pods in a terminal phase (kubernetes/kubernetes#119423).

Why the count rule is conservative: the count is never lower than what the device plugin handed out (a
pod both naming devices and requesting ``nvidia.com/gpu`` is charged both); every counted GPU is
taken whole, so nothing else is placed on it; and preferring idle GPUs withholds the most free
capacity from gputask, so its view of free GPUs never exceeds the truth in total. A guess can
name the wrong idle GPU until the pod's processes show up in the agent's memory report; the
claim then moves to the GPU that report points at. Pair it with the device-pinning guard
(``examples/policies/``) so no pod can claim GPUs through ``NVIDIA_VISIBLE_DEVICES`` unseen.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gputask.core import Gpu, Node
from gputask.core.model import MIG_PRODUCT_MARK, mig_device_index, mig_parent_index
from gputask.k8s.jobs import TASK_LABEL, VISIBLE_DEVICES
from gputask.manifests.podfit import Requests, pod_requests

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""The device plugin's MIG resources under its mixed strategy: ``nvidia.com/mig-1g.10gb``..."""
FINISHED_POD_PHASES = ("Succeeded", "Failed")
NO_DEVICES = frozenset({"", "void", "none"})
UNFINISHED_PODS = "status.phase!=Succeeded,status.phase!=Failed"
"""Field selector of pods not finished (``gputask top``'s listing)."""
FOREIGN_PODS = f"spec.nodeName!=,{UNFINISHED_PODS}"
"""Field selector of the operator's foreign-pod informer (and the rebuild's listing for it): pods bound to a node and
not finished, the only ones that hold anything of a node. A pod that finishes leaves it: its watch sends DELETED
with the pod's previous state (k8s.io/apiserver, ``cacheWatcher.convertToWatchEvent``)."""


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """GPUs one foreign pod holds on its node.

    ``count``: whole GPUs requested through ``nvidia.com/gpu`` (devices unknown);
    ``devices``: UUIDs or indices named by ``NVIDIA_VISIBLE_DEVICES``; ``every``: it said ``all``;
    ``mig``: (profile, count) of MIG devices requested through the device plugin's mixed-strategy resources
    ``nvidia.com/mig-<profile>`` (devices unknown), sorted by profile.
    """

    count: int = 0
    devices: tuple[str, ...] = ()
    every: bool = False
    mig: tuple[tuple[str, int], ...] = ()


def _gpu_counts(container: Mapping[str, Any]) -> dict[str, int]:
    """``nvidia.com/gpu`` and ``nvidia.com/mig-*`` counts of one container (limits, else requests)."""
    resources = container.get("resources") or {}
    counts: dict[str, int] = {}
    for section in ("requests", "limits"):  # an extended resource's request equals its limit: limits win
        for name, value in (resources.get(section) or {}).items():
            if name == GPU_RESOURCE or str(name).startswith(MIG_RESOURCE_PREFIX):
                try:
                    counts[str(name)] = max(0, int(str(value)))
                except ValueError:
                    counts[str(name)] = 0
    return counts


def _pod_counts(containers: list[Mapping[str, Any]], inits: list[Mapping[str, Any]]) -> dict[str, int]:
    """Per resource: the containers' sum or the largest init container's, whichever is more (the kubelet's rule)."""
    total: dict[str, int] = {}
    for counts in map(_gpu_counts, containers):
        for name, n in counts.items():
            total[name] = total.get(name, 0) + n
    for counts in map(_gpu_counts, inits):
        for name, n in counts.items():
            total[name] = max(total.get(name, 0), n)
    return {name: n for name, n in total.items() if n > 0}


def _visible_devices(container: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    """(named devices, every) from a container's literal ``NVIDIA_VISIBLE_DEVICES`` (valueFrom cannot be read)."""
    for env in container.get("env") or []:
        if isinstance(env, Mapping) and env.get("name") == VISIBLE_DEVICES and isinstance(env.get("value"), str):
            value = env["value"].strip()
            if value.lower() in NO_DEVICES:
                return (), False
            if value.lower() == "all":
                return (), True
            return tuple(t.strip() for t in value.split(",") if t.strip()), False
    return (), False


def claim_of(spec: Mapping[str, Any]) -> GpuClaim | None:
    """The GPUs a pod spec holds, or None when it holds none.

    Containers run together, so their counts add up; init containers run one at a time before
    them, so the pod holds the larger of the two (as the kubelet reckons a pod's request).
    """
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    inits = [c for c in spec.get("initContainers") or [] if isinstance(c, Mapping)]
    counts = _pod_counts(containers, inits)
    count = counts.pop(GPU_RESOURCE, 0)
    mig = tuple(sorted((name[len(MIG_RESOURCE_PREFIX):], n) for name, n in counts.items()))
    devices: list[str] = []
    every = False
    for container in inits + containers:
        named, all_of_them = _visible_devices(container)
        every = every or all_of_them
        devices += [d for d in named if d not in devices]
    if not count and not mig and not devices and not every:
        return None
    return GpuClaim(count, tuple(devices), every, mig)


@dataclass(frozen=True, slots=True)
class ForeignPod:
    """What one foreign pod holds on its node: GPUs (None: none by its spec) and effective requests; its
    namespace and name (how the kubelet's PodResources API names it)."""

    claim: GpuClaim | None
    requests: Requests
    namespace: str = ""
    name: str = ""


def foreign_pod(pod: Mapping[str, Any]) -> tuple[str, ForeignPod] | None:
    """(node, what it holds) of a foreign pod bound and not finished; None for ours, unbound or finished pods."""
    meta = pod.get("metadata") or {}
    if TASK_LABEL in (meta.get("labels") or {}):
        return None
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    if not node or phase in FINISHED_POD_PHASES:
        return None
    try:
        requests = pod_requests(spec)
    except ValueError:
        requests = Requests()  # the API server accepted it, so this does not happen; never crash on it
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    return str(node), ForeignPod(claim_of(spec), requests, namespace, name)


def pod_claim(pod: Mapping[str, Any]) -> tuple[str, GpuClaim] | None:
    """(node, claim) of a foreign pod that holds GPUs now; None for ours, unbound, finished or GPU-less pods."""
    found = foreign_pod(pod)
    return None if found is None or found[1].claim is None else (found[0], found[1].claim)


class ForeignPods:
    """Incremental index of foreign pods (GPU claims and requests) by node, fed by the foreign-pod informer while the
    operator leads and :meth:`reset` from a listing at each rebuild."""

    def __init__(self) -> None:
        self.by_node: dict[str, dict[str, ForeignPod]] = {}
        self.node_of: dict[str, str] = {}  # pod uid -> node

    def on_pod(self, pod: Mapping[str, Any], deleted: bool = False) -> str | None:
        """Take one pod event; returns the node whose foreign pods changed, else None."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return None
        found = None if deleted else foreign_pod(pod)
        old_node = self.node_of.get(uid)
        if found is None:
            if old_node is None:
                return None
            self._drop(uid, old_node)
            return old_node
        node, held = found
        if old_node == node and self.by_node[node].get(uid) == held:
            return None
        if old_node is not None:
            self._drop(uid, old_node)
        self.by_node.setdefault(node, {})[uid] = held
        self.node_of[uid] = node
        return node

    def reset(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Replace the index with the foreign pods among ``pods`` (a fresh listing)."""
        self.by_node.clear()
        self.node_of.clear()
        for pod in pods:
            self.on_pod(pod)

    def claims_on(
        self,
        node: str,
        exact: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
        uuids: Collection[str] | None = None,
    ) -> list[GpuClaim]:
        """The GPU claims of the foreign pods bound to ``node``, in pod uid order.

        ``exact``: the GPU UUIDs the kubelet gave each (namespace, name) pod on the node, when the agent could
        read them (None: it could not); ``uuids``: the node's GPU UUIDs (None: take ``exact`` as it is). A pod
        found there with GPUs of this node holds exactly those GPUs (and any it names through
        NVIDIA_VISIBLE_DEVICES) instead of its count; a pod not found there (bound after the report), or found
        with no GPU of this node (an ID the agent could not resolve, or a report that lies), keeps its count.
        Module docstring, rules 2 and 3.
        """
        pods = self.by_node.get(node) or {}
        claims = []
        for uid in sorted(pods):
            pod = pods[uid]
            given = exact.get((pod.namespace, pod.name), ()) if exact is not None else ()
            if uuids is not None:
                given = tuple(u for u in given if u in uuids)
            claim = pod.claim
            if given:
                named = claim.devices if claim is not None else ()
                claim = GpuClaim(0, tuple(dict.fromkeys(named + given)), claim.every if claim is not None else False)
            if claim is not None:
                claims.append(claim)
        return claims

    def requests_on(self, node: str) -> tuple[Requests, int]:
        """The summed effective requests of the foreign pods bound to ``node``, and how many they are."""
        pods = (self.by_node.get(node) or {}).values()
        total = Requests(
            sum(p.requests.cpu_milli for p in pods),
            sum(p.requests.memory_mib for p in pods),
            sum(p.requests.ephemeral_mib for p in pods),
        )
        return total, len(pods)

    def _drop(self, uid: str, node: str) -> None:
        self.node_of.pop(uid, None)
        claims = self.by_node.get(node)
        if claims is not None:
            claims.pop(uid, None)
            if not claims:
                del self.by_node[node]


def occupied_gpus(node: Node, claims: Iterable[GpuClaim], reserved: Collection[int]) -> set[int]:
    """Indices of the GPUs of ``node`` that ``claims`` occupy entirely.

    ``reserved`` holds the indices of GPUs gputask has reserved; ``node.gpus[*].foreign_mib``
    is what the agent reports in use beyond gputask's reservations. The order of the count-based
    choice is the module docstring's.
    """
    claims = list(claims)
    indices = [g.index for g in node.gpus]
    taken: set[int] = set()
    by_name = _device_names(node)
    for claim in claims:
        taken |= set(indices) if claim.every else {by_name[d] for d in claim.devices if d in by_name}
    in_mig_mode = {parent for g in node.gpus if (parent := mig_parent_index(g.index)) is not None}
    # nvidia.com/gpu is a GPU outside MIG or (the device plugin's single strategy) a MIG device, never a GPU in
    # MIG mode; nvidia.com/mig-<profile> is a MIG device of that profile.
    _take(node, reserved, taken, sum(c.count for c in claims), lambda g: g.index not in in_mig_mode)
    wanted: dict[str, int] = {}
    for claim in claims:
        for profile, n in claim.mig:
            wanted[profile] = wanted.get(profile, 0) + n
    for profile, n in sorted(wanted.items()):
        _take(node, reserved, taken, n, lambda g, p=profile: g.product.endswith(f"{MIG_PRODUCT_MARK}{p}"))
    return taken


def _device_names(node: Node) -> dict[str, int]:
    """Each device's index by the names NVIDIA_VISIBLE_DEVICES may give it: UUID, index, and for a MIG device
    ``<GPU index>:<MIG device index>``."""
    names = {g.uuid: g.index for g in node.gpus} | {str(g.index): g.index for g in node.gpus}
    for g in node.gpus:
        parent = mig_parent_index(g.index)
        if parent is not None:
            names[f"{parent}:{g.index - mig_device_index(parent, 0)}"] = g.index
    return names


def _take(node: Node, reserved: Collection[int], taken: set[int], wanted: int, eligible: Callable[[Gpu], bool]) -> None:
    """Add ``wanted`` more eligible devices to ``taken``: busy with foreign memory, then idle, then ours."""
    gpus = [g for g in node.gpus if eligible(g)]
    busy = [g.index for g in gpus if g.foreign_mib > 0]
    idle = [g.index for g in gpus if g.foreign_mib == 0 and g.index not in reserved]
    ours = [g.index for g in gpus if g.foreign_mib == 0 and g.index in reserved]
    for index in busy + idle + ours:
        if wanted <= 0:
            break
        if index not in taken:
            taken.add(index)
            wanted -= 1
