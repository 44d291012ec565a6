"""Cluster objects the scheduler needs besides tasks: Nodes, GPUNodes, queues, priorities, namespaces.

:class:`Inventory` turns watch events of those kinds into scheduler inputs. Readiness and
failures go through the core (:meth:`gputask.core.Scheduler.node_ready`, ``node_failed``,
``remove_node``) so the operator and the scenario runner share one failure policy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gputask.config import Config
from gputask.core import InvalidQueueError, Node, NodeName, Scheduler
from gputask.k8s.foreign import ForeignPods, occupied_gpus
from gputask.manifests import convert

log = logging.getLogger("gputask.inventory")

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
WORKLOAD_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def node_ready(node: Mapping[str, Any]) -> bool:
    """True when a v1 Node's Ready condition is True (a node without conditions counts as ready)."""
    conds = (node.get("status") or {}).get("conditions") or []
    ready = [c for c in conds if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


def out_of_service(node: Mapping[str, Any]) -> bool:
    """True when the Node carries the ``node.kubernetes.io/out-of-service`` taint."""
    return any(t.get("key") == OUT_OF_SERVICE for t in (node.get("spec") or {}).get("taints") or [])


class Inventory:
    """Tracks non-task objects and feeds the scheduler. Synchronous; never raises on bad input."""

    def __init__(self, scheduler: Scheduler, config: Config, foreign: ForeignPods | None = None) -> None:
        self.scheduler = scheduler
        self.config = config
        self.priority_classes: dict[str, int] = {}
        self.workload_priority_classes: dict[str, int] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self.deleted_nodes: set[str] = set()
        self.gpunodes: dict[str, Mapping[str, Any]] = {}
        self.stale: set[str] = set()
        self.queue_errors: dict[str, str] = {}
        self.gpunode_errors: dict[str, list[str]] = {}
        self.foreign = foreign or ForeignPods()  # the operator shares one index across rebuilds

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
        name = obj["metadata"]["name"]
        if deleted:
            self.namespace_labels.pop(name, None)
            return
        labels = dict(obj["metadata"].get("labels") or {})
        labels.setdefault("kubernetes.io/metadata.name", name)
        self.namespace_labels[name] = labels

    def labels_of(self, namespace: str) -> dict[str, str]:
        """A namespace's labels (just its name label when the Namespace is not seen yet)."""
        return self.namespace_labels.get(namespace, {"kubernetes.io/metadata.name": namespace})

    # -- nodes ----------------------------------------------------------------------------
    def on_node(self, obj: Mapping[str, Any], now: float, deleted: bool = False) -> None:
        """A v1 Node changed: readiness, cordon, out-of-service taint or deletion."""
        name = obj["metadata"]["name"]
        if deleted:
            self.nodes.pop(name, None)
            self.deleted_nodes.add(name)
            self.scheduler.remove_node(NodeName(name))
            return
        self.deleted_nodes.discard(name)
        self.nodes[name] = obj
        self.scheduler.node_ready(NodeName(name), node_ready(obj), now)
        if out_of_service(obj):
            self.scheduler.node_failed(NodeName(name), f"tainted {OUT_OF_SERVICE}")
        self.refresh_node(name, now)

    def on_gpunode(self, obj: Mapping[str, Any], now: float, deleted: bool = False) -> None:
        """Take a GPUNode's GPU inventory (malformed GPU entries are dropped one by one)."""
        name = obj["metadata"]["name"]
        if deleted:
            self.gpunodes.pop(name, None)
            self.scheduler.remove_node(NodeName(name))
            return
        self.gpunodes[name] = obj
        self.refresh_node(name, now)

    def refresh_node(self, name: str, now: float) -> None:
        """Push a node's GPUs to the scheduler; schedulable unless cordoned or its heartbeat is stale."""
        obj = self.gpunodes.get(name)
        if obj is None or name in self.deleted_nodes:
            return
        status = obj.get("status") or {}
        heartbeat = convert.timestamp(status.get("heartbeatTime"))
        stale = bool(heartbeat) and now - heartbeat > self.config.heartbeat_stale_after_s
        self.stale.discard(name) if not stale else self.stale.add(name)
        cordoned = bool(((self.nodes.get(name) or {}).get("spec") or {}).get("unschedulable"))
        why = "cordoned" if cordoned else "GPUNode heartbeat stale" if stale else ""
        node, errors = convert.node_from_gpunode(name, status, unschedulable=why)
        node = self._with_foreign_use(node, convert.reported_used_mib(status))
        if errors != self.gpunode_errors.get(name, []):
            for line in errors:
                log.warning("GPUNode %s: rejected %s", name, line)
        self.gpunode_errors[name] = errors
        self.scheduler.set_node(node)

    def _with_foreign_use(self, node: Node, used: Mapping[int, int]) -> Node:
        """Memory used beyond what gputask reserved (minus a tolerance) counts as foreign use,
        and GPUs that foreign pods hold (:mod:`gputask.k8s.foreign`) count as fully used.

        A GPU busy with work gputask did not place must not be over-committed (issue: node
        agent, foreign use). The tolerance absorbs CUDA context overhead of our own tasks.
        """
        known = self.scheduler.cluster.node(node.name) if self.scheduler.cluster.has_node(node.name) else None
        tolerance = self.config.foreign_tolerance_mib
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
            foreign = max(0, used.get(gpu.index, 0) - reserved - tolerance)
            gpus.append(replace(gpu, foreign_mib=min(foreign, gpu.memory_mib)))
        node = replace(node, gpus=tuple(gpus))
        held = occupied_gpus(node, self.foreign.claims_on(node.name), ours)
        full = tuple(replace(g, foreign_mib=g.memory_mib) if g.index in held else g for g in node.gpus)
        return replace(node, gpus=full)

    def check_heartbeats(self, now: float) -> None:
        """Re-evaluate heartbeat staleness (time passes without events)."""
        for name, obj in self.gpunodes.items():
            beat = convert.timestamp((obj.get("status") or {}).get("heartbeatTime"))
            stale = bool(beat) and now - beat > self.config.heartbeat_stale_after_s
            if stale != (name in self.stale):
                self.refresh_node(name, now)

    # -- queues ---------------------------------------------------------------------------
    def on_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Add, update or remove a GPUClusterQueue; an invalid spec removes it with an error."""
        name = obj["metadata"]["name"]
        if deleted:
            self.scheduler.remove_queue(name)
            self.queue_errors.pop(name, None)
            return
        try:
            spec = convert.queue_from_manifest(name, obj.get("spec"))
        except (InvalidQueueError, ValueError) as exc:
            self.queue_errors[name] = str(exc)
            self.scheduler.remove_queue(name, invalid=str(exc))
            return
        self.queue_errors.pop(name, None)
        self.scheduler.set_queue(spec)


def _track_value(into: dict[str, int], obj: Mapping[str, Any], deleted: bool) -> None:
    name = obj["metadata"]["name"]
    value = obj.get("value")
    if deleted:
        into.pop(name, None)
    elif isinstance(value, int) and not isinstance(value, bool):
        into[name] = value
