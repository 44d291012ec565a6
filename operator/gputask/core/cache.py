"""The cache (Kueue's pkg/cache): what runs where, what each queue is charged, the nodes and their health.

:class:`Cache` owns the :class:`~gputask.core.ledger.Ledger` (with the :class:`~gputask.core.cluster.ClusterState`
and :class:`~gputask.core.quota.QuotaBook` it writes), :class:`~gputask.core.health.NodeHealth`, the queue specs,
the GPUResourceFlavors, and what a placed task is requeued as (``revisions``). Every change goes through a method
here and changes :attr:`Cache.generation`; the scheduler skips a cycle when neither it nor the queue manager's
generation changed since a cycle that changed nothing. A cycle's admissions and nominations are assumed here at
once (Kueue's ``AssumeWorkload``) so the rest of the cycle sees them; preemption trials never touch it: they run
on copies (:mod:`gputask.core.snapshot`).
"""

from __future__ import annotations

from dataclasses import replace

from gputask.core.cluster import ClusterState
from gputask.core.flavors import Flavor, holds, variant
from gputask.core.health import NodeHealth
from gputask.core.ledger import Entry, Ledger
from gputask.core.model import Node, NodeName, Placement, Task, TaskKey
from gputask.core.quota import QueueSpec, QuotaBook


class Cache:
    """Reservations, quota charges, nodes, queue specs and flavors; the writer of each (module doc).

    ``grace_s``: how long (seconds) a node may be NotReady before its tasks are evicted.
    """

    def __init__(self, grace_s: float) -> None:
        self.cluster = ClusterState()
        self.quotas = QuotaBook()
        self.ledger = Ledger(self.cluster, self.quotas)
        self.health = NodeHealth(self.cluster, grace_s)
        self.inactive: dict[str, str] = {}  # queues that exist but cannot be used: name -> why
        self.flavors: dict[str, Flavor] = {}  # GPUResourceFlavors by name
        self.invalid_flavors: dict[str, str] = {}  # flavors that exist but cannot be used: name -> why (a predicate)
        self.revisions: dict[TaskKey, Task | None] = {}  # what a placed task is requeued as (None: not at all)
        self._changes = 0  # changes the parts' own versions do not count

    @property
    def generation(self) -> int:
        """Changes whenever anything here changes: the ledger's reservations, the cluster's nodes, the queue specs,
        and (counted here) flavors, readiness, failure notices and counts, revisions, victims gone."""
        return self._changes + self.ledger.version + self.cluster.generation + self.quotas.specs_version

    def _changed(self) -> None:
        self._changes += 1

    # -- queues and flavors ---------------------------------------------------------------------
    def set_queue(self, spec: QueueSpec) -> None:
        """Add or update a GPUClusterQueue."""
        self._changed()
        self.quotas.set_queue(spec)
        self.inactive.pop(spec.name, None)

    def remove_queue(self, name: str, *, invalid: str | None = None) -> None:
        """Remove a queue; its pending tasks wait with reason QueueNotFound, or QueueInactive
        when the queue exists but its spec is ``invalid`` (the message says why)."""
        self._changed()
        self.quotas.remove_queue(name)
        if invalid is None:
            self.inactive.pop(name, None)
        else:
            self.inactive[name] = invalid

    def set_flavor(self, flavor: Flavor) -> None:
        """Add or update a ResourceFlavor (what each queue's quota of that flavor covers)."""
        self._changed()
        self.flavors[flavor.name] = flavor
        self.invalid_flavors.pop(flavor.name, None)

    def remove_flavor(self, name: str, *, invalid: str | None = None) -> None:
        """Forget a ResourceFlavor: queues that list it admit nothing until it is back (Kueue: FlavorNotFound);
        ``invalid`` says why when it exists but cannot be used, as a predicate (``is invalid: ...``, ``is
        being deleted: ...``); None: it does not exist."""
        self._changed()
        self.flavors.pop(name, None)
        if invalid is None:
            self.invalid_flavors.pop(name, None)
        else:
            self.invalid_flavors[name] = invalid

    # -- nodes ----------------------------------------------------------------------------------
    def set_node(self, node: Node) -> list[TaskKey]:
        """Add or update a node; tasks on GPUs now unhealthy or gone are noticed for GPUFailure.

        A node reported NotReady (:meth:`node_ready`) stays unschedulable whatever ``node`` says.
        Returns the keys noticed. The same node again changes nothing.
        """
        lost = self.health.set_node(node)
        if lost:
            self._changed()
        return lost

    def node_ready(self, name: NodeName, ready: bool, now: float) -> None:
        """Report a node's readiness at ``now``: NotReady stops new work at once and evicts
        its tasks after the grace period; Ready in time changes nothing."""
        was = self.health.is_down(name)
        self.health.node_ready(name, ready, now)
        if was != self.health.is_down(name):
            self._changed()

    def node_failed(self, name: NodeName, why: str) -> list[TaskKey]:
        """Fail a node at once (out-of-service taint): notice its tasks for NodeFailure eviction."""
        self._changed()
        return self.health.node_failed(name, why)

    def node_removed(self, name: NodeName) -> list[TaskKey]:
        """A node is deleted: notice its tasks (NodeFailure). Call :meth:`forget_node` once they are evicted."""
        self._changed()
        return self.health.node_removed(name)

    def forget_node(self, name: NodeName) -> None:
        """Release what was held on a deleted node for departing workloads (their pods go with the Node), and
        forget it."""
        self._changed()
        self.ledger.release_holds_on(name)
        self.health.forget(name)

    @property
    def largest_gpu_mib(self) -> int:
        """The largest GPU seen (MiB); never decreases, so a minimum usage computed from it stays a bound."""
        return self.health.largest_gpu_mib

    # -- reservations (assume, forget) -----------------------------------------------------------
    def admit(self, task: Task, placement: Placement, now: float, *, charge: bool = True) -> Entry:
        """Reserve ``placement`` and charge ``task``'s queue (``charge=False``: Kueue books its quota);
        raises OverCommitError when it does not fit."""
        return self.ledger.admit(task, placement, now, charge=charge)

    def admit_placed(self, task: Task, placement: Placement, now: float) -> None:
        """Reserve a placement whose quota Kueue booked: in the ledger, charged to no queue.

        Raises OverCommitError when the placement no longer fits.
        """
        self.ledger.admit(task, placement, now, charge=False)

    def nominate(self, task: Task, placement: Placement, victims: list[TaskKey], now: float) -> Entry:
        """Reserve a preemptor's placement while its ``victims`` terminate."""
        return self.ledger.nominate(task, placement, victims, now)

    def promote(self, key: TaskKey, now: float) -> Entry:
        """A nominated preemptor whose victims are gone becomes running at ``now``."""
        return self.ledger.promote(key, now)

    def victim_gone(self, key: TaskKey) -> None:
        """A preempted task's workload has terminated: its preemptor stops waiting for it."""
        self._changed()
        self.ledger.victim_gone(key)

    def restore(self, task: Task, placement: Placement, admitted_at: float, *, charge: bool) -> None:
        """Record ``task`` already running with ``placement`` (after a restart), never refused; a placement on a
        failed GPU or a vanished node is noticed at once."""
        self.ledger.restore(task, placement, admitted_at, charge=charge)
        self.health.restored(task.key, placement)

    def hold(self, key: TaskKey, placement: Placement, *, fit: bool = False) -> Placement | None:
        """Keep a departing workload's GPUs (a terminating Job) until it is released.

        ``fit``: hold only what is free now of each GPU (after an eviction, whatever a nominated
        preemptor did not take). Returns what is held.
        """
        self._changed()
        return self.ledger.hold(key, placement, fit=fit)

    def release(self, key: TaskKey) -> Entry | Placement | None:
        """Give back whatever ``key`` reserves (GPUs and quota). Returns the entry (or a hold's placement); None
        when it held nothing."""
        return self.ledger.release(key)

    def forget_revision(self, key: TaskKey) -> bool:
        """Drop what ``key`` would be requeued as; True when there was something."""
        if key not in self.revisions:
            return False
        del self.revisions[key]
        self._changed()
        return True

    def revise(self, key: TaskKey, task: Task | None) -> None:
        """A placed task's spec changed: it is requeued as ``task`` (None: not requeued, its new spec
        is invalid) when it is next evicted. A running task itself never changes under its placement."""
        if self.ledger.get(key) is not None:
            self._changed()
            self.revisions[key] = task

    def requeued_as(self, entry: Entry) -> Task | None:
        """What ``entry``'s task is queued as when it is requeued: its latest revision (None: not at all)."""
        return self.revisions.get(entry.task.key, entry.task.unflavored or entry.task)

    def placement_of(self, key: TaskKey) -> Placement | None:
        """Placement of a running task."""
        entry = self.ledger.running.get(key)
        return None if entry is None else entry.placement

    # -- failures ---------------------------------------------------------------------------------
    def set_reschedules(self, key: TaskKey, count: int) -> None:
        """Restore how many failure evictions a task has had (from its status, after a restart)."""
        if count > 0 and self.health.failures.counts.get(key) != count:
            self._changed()
            self.health.failures.counts[key] = count

    def reschedules(self, key: TaskKey) -> int:
        """Failure evictions of ``key`` so far."""
        return self.health.failures.counts.get(key, 0)

    def count_failure(self, key: TaskKey) -> int:
        """Count one more failure eviction of ``key``; returns the new count."""
        self._changed()
        return self.health.count_failure(key)

    # -- flavors of restored tasks ------------------------------------------------------------------
    def flavor_of(self, task: Task, placement: Placement, named: str | None = None) -> Task:
        """A restored task in the flavor it was admitted in, so it is charged there again: ``named`` (its Job
        says, or its status) when the queue lists it, even if that GPUResourceFlavor is gone now; a task
        already in a flavor stays there; else the queue's first flavor that holds the placement (the first
        flavor when none does any more)."""
        spec = self.quotas.specs.get(task.queue)
        if spec is None or not spec.flavors:
            return task
        if task.flavor and named is None:
            return task
        base = task.unflavored or task
        if named is not None and named in spec.flavors:
            flavor = self.flavors.get(named)
            return variant(base, flavor) if flavor is not None else replace(base, flavor=named, unflavored=base)
        if not all(map(self.cluster.has_node, placement.nodes)):
            return task
        pods = [(self.cluster.node(pod.node).node, pod) for pod in placement.pods]
        known = [self.flavors[n] for n in spec.flavors if n in self.flavors]
        chosen = next((f for f in known if all(holds(f, node, pod) for node, pod in pods)), known[0] if known else None)
        return variant(base, chosen) if chosen is not None else task
