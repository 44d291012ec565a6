"""Node health: the node inputs of the scheduler and the failure notices they raise.

:class:`NodeHealth` owns the node entries of the cluster state: every node added, updated,
reported NotReady or Ready, failed (out-of-service taint) or deleted goes through it. A node
down keeps its GPUs out of placement at once; the tasks on it are noticed for eviction only
when the rules of :mod:`gputask.core.failures` say so. It never evicts anything itself: the
scheduler turns notices into evictions through the ledger.
"""

from __future__ import annotations

from dataclasses import replace

from gputask.core.cluster import ClusterState
from gputask.core.failures import GPU_FAILURE, NODE_FAILURE, FailureNotice, FailureTracker, tasks_on_bad_gpus
from gputask.core.model import Node, NodeName, Placement, TaskKey

NOT_READY = "NotReady"


class NodeHealth:
    """Readiness per node, failure notices and failure counts; the writer of the cluster's nodes.

    ``grace_s`` is how long (seconds) a node may be NotReady before its tasks are evicted.
    """

    def __init__(self, cluster: ClusterState, grace_s: float) -> None:
        self.cluster = cluster
        self.failures = FailureTracker(grace_s)
        self.largest_gpu_mib = 0  # never decreases, so a minimum usage computed from it stays a bound

    def is_down(self, name: NodeName) -> bool:
        """True while the node is reported NotReady (or failed)."""
        return name in self.failures.down_since

    def set_node(self, node: Node) -> list[TaskKey]:
        """Add or update a node; tasks on GPUs now unhealthy or gone are noticed (GPUFailure).

        A node reported NotReady stays unschedulable whatever ``node`` says; the same node again leaves its
        state (and its generation) as it was. Returns the keys noticed.
        """
        if self.is_down(node.name) and node.schedulable:
            node = replace(node, schedulable=False, unschedulable_reason=NOT_READY)
        if not (self.cluster.has_node(node.name) and self.cluster.node(node.name).node == node):
            self.largest_gpu_mib = max([self.largest_gpu_mib, *(g.memory_mib for g in node.gpus)])
            self.cluster.set_node(node)
        lost = tasks_on_bad_gpus(self.cluster.node(node.name))
        self.failures.notify(lost, GPU_FAILURE, f"a GPU of node {node.name} failed or disappeared")
        return lost

    def node_ready(self, name: NodeName, ready: bool, now: float) -> None:
        """Readiness at ``now``: NotReady stops new work at once; Ready in time changes nothing."""
        if ready:
            self.failures.node_up(name)
        else:
            self.failures.node_down(name, now)
        if self.cluster.has_node(name):
            why = "" if ready else NOT_READY
            self.set_node(replace(self.cluster.node(name).node, schedulable=ready, unschedulable_reason=why))

    def node_failed(self, name: NodeName, why: str) -> list[TaskKey]:
        """Fail a node at once (out-of-service taint): notice its tasks (NodeFailure)."""
        self.node_ready(name, False, float("-inf"))
        lost = self._tasks_on(name)
        self.failures.notify(lost, NODE_FAILURE, f"node {name} failed: {why}")
        return lost

    def node_removed(self, name: NodeName) -> list[TaskKey]:
        """A node is deleted: notice its tasks (NodeFailure, over any earlier notice). Call :meth:`forget` after."""
        lost = self._tasks_on(name)
        self.failures.notify(lost, NODE_FAILURE, f"node {name} is not in the cluster any more", override=True)
        return lost

    def forget(self, name: NodeName) -> None:
        """Drop a deleted node from the cluster state and from the readiness records."""
        self.cluster.remove_node(name)
        self.failures.node_up(name)

    def restored(self, key: TaskKey, placement: Placement) -> None:
        """A restored placement with a pod on a failed GPU or a vanished node is noticed at once (the first such
        node in pod order names it)."""
        for node in placement.nodes:
            if not self.cluster.has_node(node):
                self.failures.notify([key], NODE_FAILURE, f"node {node} is not in the cluster any more")
                return
            if key in tasks_on_bad_gpus(self.cluster.node(node)):
                self.failures.notify([key], GPU_FAILURE, f"a GPU of node {node} failed or disappeared")
                return

    def expired(self, now: float) -> None:
        """Notice the tasks of nodes NotReady for longer than the grace period at ``now``."""
        for name in self.failures.expired(now):
            if self.cluster.has_node(name):
                why = f"node {name} NotReady for more than {self.failures.grace_s:g}s"
                self.failures.notify(self._tasks_on(name), NODE_FAILURE, why)

    def take(self) -> list[FailureNotice]:
        """The notices raised so far, in key order, cleared."""
        return self.failures.take()

    def count_failure(self, key: TaskKey) -> int:
        """Count one more failure eviction of ``key``; returns the new count."""
        count = self.failures.counts[key] = self.failures.counts.get(key, 0) + 1
        return count

    def _tasks_on(self, name: NodeName) -> list[TaskKey]:
        return sorted(self.cluster.node(name).tasks) if self.cluster.has_node(name) else []
