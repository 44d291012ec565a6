"""Cluster objects the scheduler needs besides tasks: Nodes, GPUNodes, queues, priorities, namespaces.

:class:`Inventory` turns watch events of those kinds into scheduler inputs. Readiness and
failures go through the core (:meth:`gputask.core.Scheduler.node_ready`, ``node_failed``,
``remove_node``) so the operator and the scenario runner share one failure policy.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gputask.config import Config
from gputask.core import InvalidQueueError, Node, NodeName, Scheduler
from gputask.core.model import LINK_TYPES, GpuLink, HostUse, mig_parent_index
from gputask.k8s.foreign import GPU_RESOURCE, MIG_RESOURCE_PREFIX, ForeignPods, occupied_gpus
from gputask.k8s.usage import DeviceReport, device_report, foreign_mib, pod_memory, sound_pod_memory
from gputask.manifests import convert
from gputask.manifests.podfit import node_offer

log = logging.getLogger("gputask.inventory")

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
WORKLOAD_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


MAX_CLOCK_SKEW_S = 60.0
"""A heartbeat this far in the future is refused: the agent's clock (or the object) lies."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _name(obj: Mapping[str, Any]) -> str | None:
    name = _mapping(obj.get("metadata")).get("name")
    return name if isinstance(name, str) and name else None


def _reported(gpunode: Mapping[str, Any]) -> bool:
    """Whether the agent has written a report into the GPUNode yet (an object created before its status has none)."""
    status = _mapping(gpunode.get("status"))
    return "gpus" in status or "heartbeatTime" in status


def node_ready(node: Mapping[str, Any]) -> tuple[bool, float | None]:
    """Whether a v1 Node's Ready condition is True (no condition counts as ready), and since when
    (its lastTransitionTime in epoch seconds, None when absent): a restart does not reset the grace."""
    conditions = [c for c in _list(_mapping(node.get("status")).get("conditions")) if isinstance(c, Mapping)]
    ready = [c for c in conditions if c.get("type") == "Ready"]
    if not ready:
        return True, None
    since = convert.timestamp(ready[0].get("lastTransitionTime")) or None
    return ready[0].get("status") == "True", since


def out_of_service(node: Mapping[str, Any]) -> bool:
    """True when the Node carries the ``node.kubernetes.io/out-of-service`` taint."""
    taints = _list(_mapping(node.get("spec")).get("taints"))
    return any(isinstance(t, Mapping) and t.get("key") == OUT_OF_SERVICE for t in taints)


def _allocatable(node: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _mapping(_mapping(_mapping(node).get("status")).get("allocatable"))


def allocatable_gpus(node: Mapping[str, Any] | None) -> int | None:
    """How many GPUs the Node's device plugin advertises: allocatable ``nvidia.com/gpu`` plus every
    ``nvidia.com/mig-<profile>`` (its mixed MIG strategy lists a GPU in MIG mode only as those); None without
    a device plugin. Under its single strategy ``nvidia.com/gpu`` counts MIG devices instead, at least one per
    GPU in MIG mode unless one has none configured, so a real GPU is refused here only in that case."""
    allocatable = _allocatable(node)
    counted = [v for k, v in allocatable.items() if k == GPU_RESOURCE or str(k).startswith(MIG_RESOURCE_PREFIX)]
    if not counted:
        return None
    try:
        return sum(int(convert.quantity(v, field="allocatable")) for v in counted)
    except ValueError:
        return None


def gpu_links(status: Mapping[str, Any], node: Node) -> tuple[tuple[GpuLink, ...], list[str]]:
    """The GPUNode's ``status.links`` as core links between ``node``'s GPUs (sorted by pair), and one error line
    per malformed entry (the agent's shape: ``{a, b, type, count}``, count > 0 on NVLink only, a pair once).

    A link to a GPU the node does not have (refused, or a MIG device) is left out without an error: that GPU's
    own entry says what is wrong with it. No ``links``: none, every pair alike to placement.
    """
    raw = status.get("links")
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        return (), [f"status.links must be a list, got {raw!r}"]
    gpus = {g.index for g in node.gpus if mig_parent_index(g.index) is None}
    found: dict[tuple[int, int], GpuLink] = {}
    seen: set[tuple[int, int]] = set()
    errors: list[str] = []
    for i, entry in enumerate(raw):
        entry = _mapping(entry)
        a, b, kind, count = entry.get("a"), entry.get("b"), entry.get("type"), entry.get("count", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (a, b, count)):
            errors.append(f"status.links[{i}]: a, b and count must be non-negative integers, got {dict(entry)!r}")
            continue
        assert isinstance(a, int) and isinstance(b, int) and isinstance(count, int)
        if a == b or kind not in LINK_TYPES or (kind == "NVLink") != (count > 0):
            errors.append(f"status.links[{i}]: two different GPUs, a type of {', '.join(LINK_TYPES)} and a count on "
                          f"NVLink only, got {dict(entry)!r}")
            continue
        pair = (min(a, b), max(a, b))
        if pair in seen:
            errors.append(f"status.links[{i}]: GPUs {pair[0]} and {pair[1]} are linked twice")
            continue
        seen.add(pair)
        if a in gpus and b in gpus:
            found[pair] = GpuLink(pair[0], pair[1], str(kind), count)
    return tuple(found[pair] for pair in sorted(found)), errors


class Inventory:
    """Tracks non-task objects and feeds the scheduler. Synchronous; never raises on bad input."""

    def __init__(
        self,
        scheduler: Scheduler,
        config: Config,
        foreign: ForeignPods | None = None,
        our_pods: Mapping[str, object] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.config = config
        self.priority_classes: dict[str, int] = {}
        self.workload_priority_classes: dict[str, int] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self.deleted_nodes: set[str] = set()
        self.gpunodes: dict[str, Mapping[str, Any]] = {}
        self.stale: set[str] = set()
        # when each GPUNode's heartbeat turns stale (or, from the future, fresh): check_heartbeats looks at those due
        self._flips: list[tuple[float, str]] = []  # heap of (time s, node); an entry not in _flip_at is outdated
        self._flip_at: dict[str, float] = {}
        self.queue_errors: dict[str, str] = {}
        self.flavor_errors: dict[str, str] = {}  # GPUResourceFlavors whose spec is invalid: name -> why
        self.flavor_meta: dict[str, QueueMeta] = {}  # GPUResourceFlavors as last seen (finalizer upkeep)
        # GPUClusterQueues as last seen: finalizers, resourceVersion, whether being deleted (finalizer upkeep)
        self.queue_meta: dict[str, QueueMeta] = {}
        self.gpunode_errors: dict[str, list[str]] = {}
        self.to_report: set[str] = set()  # GPUNodes whose refused entries changed: condition and Event to write
        self.gpunode_missing: dict[str, float] = {}  # Node name -> when its GPUNode was seen gone
        self.uuid_owner: dict[str, str] = {}  # GPU uuid -> the node that reported it first
        self.foreign = foreign or ForeignPods()  # the operator shares one index across rebuilds
        self.our_pods: Mapping[str, object] = our_pods if our_pods is not None else {}  # uids of our Jobs' pods
        self.device_reports: dict[str, DeviceReport] = {}  # GPUNode -> its agent's PodResources report
        self.device_said: dict[str, tuple[bool, str]] = {}  # GPUNode -> PodResourcesAvailable as last written

    # -- priorities and namespaces --------------------------------------------------------
    def on_priority_class(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a scheduling.k8s.io PriorityClass value by name."""
        _track_value(self.priority_classes, obj, deleted)

    def on_workload_priority_class(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a Kueue WorkloadPriorityClass value by name."""
        _track_value(self.workload_priority_classes, obj, deleted)

    def priority_of(self, name: str, *, kueue: bool) -> int | None:
        """Value of a (Workload)PriorityClass, None when unknown."""
        return (self.workload_priority_classes if kueue else self.priority_classes).get(name)

    def on_namespace(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a namespace's labels (for queues' namespaceSelector)."""
        name = _name(obj)
        if name is None:
            return
        if deleted:
            self.namespace_labels.pop(name, None)
            return
        raw = _mapping(_mapping(obj.get("metadata")).get("labels"))
        labels = {str(k): v for k, v in raw.items() if isinstance(v, str)}
        labels.setdefault("kubernetes.io/metadata.name", name)
        self.namespace_labels[name] = labels

    def labels_of(self, namespace: str) -> dict[str, str]:
        """A namespace's labels (just its name label when the Namespace is not seen yet)."""
        return self.namespace_labels.get(namespace, {"kubernetes.io/metadata.name": namespace})

    # -- nodes ----------------------------------------------------------------------------
    def on_node(self, obj: Mapping[str, Any], now: float, deleted: bool = False) -> None:
        """A v1 Node changed: readiness, cordon, taints, labels, allocatable, or deletion."""
        name = _name(obj)
        if name is None:
            return
        if deleted:
            self.nodes.pop(name, None)
            self.deleted_nodes.add(name)
            self.gpunode_missing.pop(name, None)
            self._release_uuids(name)
            self.scheduler.remove_node(NodeName(name))
            return
        self.deleted_nodes.discard(name)
        self.nodes[name] = obj
        self._readiness(name, now)
        if out_of_service(obj):
            self.scheduler.node_failed(NodeName(name), f"tainted {OUT_OF_SERVICE}")
        self.refresh_node(name, now)

    def on_gpunode(self, obj: Mapping[str, Any], now: float, deleted: bool = False) -> None:
        """Take a GPUNode's GPU inventory (malformed or lying GPU entries are refused one by one).

        A GPUNode deleted while its Node is there counts as the node down since then: its tasks
        are evicted only after ``nodeFailureGracePeriod`` (the agent usually writes it again at once).
        """
        name = _name(obj)
        if name is None:
            return
        if deleted:
            self.gpunodes.pop(name, None)
            self.device_reports.pop(name, None)
            self.device_said.pop(name, None)
            self._release_uuids(name)
            if name in self.nodes:
                self.gpunode_missing.setdefault(name, now)
                self._readiness(name, now)
            else:
                self.scheduler.remove_node(NodeName(name))
            return
        self.gpunodes[name] = obj
        if not _reported(obj):
            return  # created, its first status not written yet: nothing to take (nor to lose) yet
        if self.gpunode_missing.pop(name, None) is not None:
            self._readiness(name, now)
        self.refresh_node(name, now)

    def _readiness(self, name: str, now: float) -> None:
        """Down while the Node is NotReady (since its Ready transition) or its GPUNode is gone (since seen gone)."""
        ready, since = node_ready(self.nodes[name]) if name in self.nodes else (True, None)
        down = [min(since or now, now)] if not ready else []
        if name in self.gpunode_missing:
            down.append(self.gpunode_missing[name])
        self.scheduler.node_ready(NodeName(name), not down, min(down) if down else now)

    def refresh_node(self, name: str, now: float) -> None:
        """Push a node's GPUs to the scheduler: only its sound GPU entries, schedulable unless cordoned
        or its heartbeat is stale (or unreadable, or in the future)."""
        obj = self.gpunodes.get(name)
        if obj is None or name in self.deleted_nodes or not _reported(obj):
            return
        status = _mapping(obj.get("status"))
        stale, lie = self._heartbeat(status, now)
        self.stale.discard(name) if not stale else self.stale.add(name)
        self._next_flip(name, status, now)
        cordoned = _mapping(_mapping(self.nodes.get(name)).get("spec")).get("unschedulable") is True
        why = "cordoned" if cordoned else "GPUNode heartbeat stale" if stale else ""
        node, errors = convert.node_from_gpunode(name, status, unschedulable=why)
        node, refused = self._sound(node)
        links, bad_links = gpu_links(status, node)
        node = replace(node, links=links) if links else node
        split, lies = sound_pod_memory(pod_memory(status), node)
        errors = [*errors, *refused, *bad_links, *lies, *([lie] if lie else [])]
        devices = device_report(status)
        node = self._with_foreign_use(node, convert.reported_used_mib(status), devices, split)
        node = self._with_offer(node)
        if errors != self.gpunode_errors.get(name, []):
            for line in errors:
                log.warning("GPUNode %s: rejected %s", name, line)
            self.to_report.add(name)
        if devices.available is not None and self.device_said.get(name) != (devices.available, devices.reason):
            self.to_report.add(name)  # the condition PodResourcesAvailable changes
        self.gpunode_errors[name] = errors
        self.device_reports[name] = devices
        self.scheduler.set_node(node)

    def _heartbeat(self, status: Mapping[str, Any], now: float) -> tuple[bool, str | None]:
        """(stale, what is wrong with it): missing, unreadable or future heartbeats count as stale."""
        raw = status.get("heartbeatTime")
        beat = convert.timestamp(raw)
        if not beat:
            return True, f"heartbeatTime {raw!r} is missing or not an RFC 3339 time: the GPUs take no new work"
        if beat - now > MAX_CLOCK_SKEW_S:
            return True, f"heartbeatTime {raw} is in the future: the GPUs take no new work"
        return now - beat > self.config.heartbeat_stale_after_s, None

    def _sound(self, node: Node) -> tuple[Node, list[str]]:
        """The node's GPUs without those another node reports (by UUID) and those beyond the Node's
        allocatable nvidia.com/gpu (the device plugin's count, when it runs)."""
        refused: list[str] = []
        kept = []
        for gpu in node.gpus:
            owner = self.uuid_owner.setdefault(gpu.uuid, node.name)
            if owner != node.name:
                refused.append(f"GPU {gpu.index}: uuid {gpu.uuid} is reported by node {owner} too")
            else:
                kept.append(gpu)
        v1_node = self.nodes.get(node.name)
        limit = allocatable_gpus(v1_node)
        physical = [g for g in kept if mig_parent_index(g.index) is None]
        if limit is not None and len(physical) > limit:
            over = {g.index for g in physical[limit:]}
            mig = any(str(k).startswith(MIG_RESOURCE_PREFIX) for k in _allocatable(v1_node))
            counted = f"{GPU_RESOURCE} and {MIG_RESOURCE_PREFIX}* come to" if mig else f"{GPU_RESOURCE} is"
            refused.append(f"{len(physical)} GPUs reported but the Node's allocatable {counted} {limit}: "
                           f"GPUs {sorted(over)} refused")
            kept = [g for g in kept if g.index not in over and mig_parent_index(g.index) not in over]
        return replace(node, gpus=tuple(kept)), refused

    def _release_uuids(self, name: str) -> None:
        for uuid in [u for u, owner in self.uuid_owner.items() if owner == name]:
            del self.uuid_owner[uuid]

    def _with_foreign_use(
        self,
        node: Node,
        used: Mapping[int, int],
        devices: DeviceReport | None = None,
        split: Mapping[int, Mapping[str, int]] | None = None,
    ) -> Node:
        """Memory used beyond what gputask reserved (minus a tolerance) counts as foreign use,
        and GPUs that foreign pods hold (:mod:`gputask.k8s.foreign`) count as fully used.

        A GPU busy with work gputask did not place must not be over-committed (issue: node
        agent, foreign use). The tolerance absorbs CUDA context overhead of our own tasks.
        Where the agent split a GPU's memory by pod (``split``), what our own pods use is known
        and :func:`gputask.k8s.usage.foreign_mib` counts other pods' memory in full; where it read
        the kubelet's device assignments (``devices``), device-plugin pods hold exactly those GPUs.
        """
        known = self.scheduler.cluster.node(node.name) if self.scheduler.cluster.has_node(node.name) else None
        tolerance = self.config.foreign_tolerance_mib
        split = split or {}
        gpus = []
        ours: set[int] = set()
        for gpu in node.gpus:
            reserved = 0
            if known is not None and gpu.index in known.position:
                pos = known.position[gpu.index]
                if known.node.gpus[pos].uuid == gpu.uuid:
                    reserved = known.reserved_mib[pos]
            if reserved:
                ours.add(gpu.index)
            pods = split.get(gpu.index)
            ours_mib = None if pods is None else sum(mib for uid, mib in pods.items() if uid in self.our_pods)
            foreign = foreign_mib(used_mib=used.get(gpu.index, 0), reserved_mib=reserved, ours_mib=ours_mib,
                                  tolerance_mib=tolerance)
            gpus.append(replace(gpu, foreign_mib=min(foreign, gpu.memory_mib)))
        node = replace(node, gpus=tuple(gpus))
        exact = devices.pods if devices is not None and devices.available else None
        held = occupied_gpus(node, self.foreign.claims_on(node.name, exact, {g.uuid for g in node.gpus}), ours)
        full = tuple(replace(g, foreign_mib=g.memory_mib) if g.index in held else g for g in node.gpus)
        return replace(node, gpus=full)

    def _with_offer(self, node: Node) -> Node:
        """The Node's labels, taints and allocatable cpu, memory, ephemeral-storage and pods, and what
        foreign pods bound to it request (kube-scheduler's NodeResourcesFit arithmetic)."""
        offer = node_offer(self.nodes.get(node.name))
        used, count = self.foreign.requests_on(node.name)
        return replace(
            node,
            cpu_milli=offer.cpu_milli,
            memory_mib=offer.memory_mib,
            ephemeral_mib=offer.ephemeral_mib,
            pods=offer.pods,
            labels=offer.labels,
            taints=offer.taints,
            foreign_use=HostUse(used.cpu_milli, used.memory_mib, used.ephemeral_mib, count),
        )

    def check_heartbeats(self, now: float) -> None:
        """Re-evaluate heartbeat staleness as time passes without events: only the GPUNodes whose heartbeat is due
        to turn stale (or fresh) by ``now``, not every GPUNode on every loop pass."""
        while self._flips and self._flips[0][0] < now:
            at, name = heapq.heappop(self._flips)
            if self._flip_at.get(name) != at:
                continue  # a newer heartbeat moved it
            del self._flip_at[name]
            obj = self.gpunodes.get(name)
            if obj is not None:
                stale, _ = self._heartbeat(_mapping(obj.get("status")), now)
                if stale != (name in self.stale):
                    self.refresh_node(name, now)
                else:
                    self._next_flip(name, _mapping(obj.get("status")), now)

    def _next_flip(self, name: str, status: Mapping[str, Any], now: float) -> None:
        """Remember when ``name``'s heartbeat turns stale (a fresh one) or fresh (one from the future); none for
        a stale or unreadable one (only a new report changes it)."""
        beat = convert.timestamp(status.get("heartbeatTime"))
        at = None
        if beat and beat - now > MAX_CLOCK_SKEW_S:
            at = beat - MAX_CLOCK_SKEW_S
        elif beat and now - beat <= self.config.heartbeat_stale_after_s:
            at = beat + self.config.heartbeat_stale_after_s
        if at is None:
            self._flip_at.pop(name, None)
        elif self._flip_at.get(name) != at:
            self._flip_at[name] = at
            heapq.heappush(self._flips, (at, name))

    # -- queues ---------------------------------------------------------------------------
    def on_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Add, update or remove a GPUClusterQueue; an invalid spec removes it with an error."""
        name = _name(obj)
        if name is None:
            return
        if deleted:
            self.scheduler.remove_queue(name)
            self.queue_errors.pop(name, None)
            self.queue_meta.pop(name, None)
            return
        self.queue_meta[name] = meta = QueueMeta.of(obj)
        if meta.terminating:  # Kueue: a ClusterQueue being deleted admits nothing new; its admitted work runs on
            self.queue_errors.pop(name, None)
            self.scheduler.remove_queue(name, invalid=TERMINATING)
            return
        try:
            spec = convert.queue_from_manifest(name, obj.get("spec"))
        except (InvalidQueueError, ValueError) as exc:
            self.queue_errors[name] = str(exc)
            self.scheduler.remove_queue(name, invalid=str(exc))
            return
        self.queue_errors.pop(name, None)
        self.scheduler.set_queue(spec)

    # -- flavors ---------------------------------------------------------------------------
    def on_flavor(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Add, update or remove a GPUResourceFlavor; an invalid spec removes it with an error (the
        queues that list it say so)."""
        name = _name(obj)
        if name is None:
            return
        if deleted:
            self.flavor_errors.pop(name, None)
            self.flavor_meta.pop(name, None)
            self.scheduler.remove_flavor(name)
            return
        self.flavor_meta[name] = meta = QueueMeta.of(obj)
        if meta.terminating:  # as a queue being deleted: nothing new is admitted in it; its admitted work runs on
            self.flavor_errors.pop(name, None)
            self.scheduler.remove_flavor(name, invalid=FLAVOR_TERMINATING)
            return
        try:
            flavor = convert.flavor_from_manifest(name, obj.get("spec"))
        except (InvalidQueueError, ValueError) as exc:
            self.flavor_errors[name] = str(exc)
            self.scheduler.remove_flavor(name, invalid=f"is invalid: {exc}")
            return
        self.flavor_errors.pop(name, None)
        self.scheduler.set_flavor(flavor)


TERMINATING = "it is being deleted, and waits for its admitted tasks to finish (its finalizer stays until then)"
FLAVOR_TERMINATING = (
    "is being deleted: it waits for the tasks admitted in it to finish (its finalizer stays until then)"
)
QUEUE_FINALIZER = "gputask.io/queue-in-use"
"""Kept on every GPUClusterQueue while it has admitted tasks (Kueue's ``kueue.x-k8s.io/resource-in-use``)."""


@dataclass(frozen=True, slots=True)
class QueueMeta:
    """What finalizer upkeep needs of a GPUClusterQueue (or GPUResourceFlavor): its finalizers,
    resourceVersion, deletion."""

    finalizers: tuple[str, ...]
    resource_version: str
    terminating: bool

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> QueueMeta:
        """What an object's metadata says of it (GPUClusterQueue or GPUResourceFlavor)."""
        meta = _mapping(obj.get("metadata"))
        finalizers = tuple(str(f) for f in meta.get("finalizers") or ())
        return cls(finalizers, str(meta.get("resourceVersion") or ""), bool(meta.get("deletionTimestamp")))


def _track_value(into: dict[str, int], obj: Mapping[str, Any], deleted: bool) -> None:
    name = _name(obj)
    value = obj.get("value")
    if name is None:
        return
    if deleted:
        into.pop(name, None)
    elif isinstance(value, int) and not isinstance(value, bool):
        into[name] = value
