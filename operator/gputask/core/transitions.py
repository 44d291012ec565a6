"""How a workload moves between the queue manager and the cache outside the cycle's own steps.

:class:`Transitions` is the one place that moves a task from the cache back to its queue (requeue), out of both
(finish), out on a failure (evict, GPU memory overuse, failure notices: NodeFailure, GPUFailure,
MaxReschedulesExceeded), and that keeps what an evicted workload still uses (a hold under a new key). Decisions
made here outside a cycle (``carry``) are emitted by the next cycle.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from gputask.core.budget import EVICT, GPU_MEMORY_EXCEEDED, MemoryBudget, Overuse, overuse_text, overuses
from gputask.core.cache import Cache
from gputask.core.decisions import Decision, Evict, Fail
from gputask.core.failures import MAX_RESCHEDULES_EXCEEDED, FailureNotice
from gputask.core.ledger import Entry
from gputask.core.model import NodeName, Placement, Task, TaskKey
from gputask.core.queueing import Queues


class Transitions:
    """Moves of workloads between ``queues`` and ``cache`` (module doc); ``memory_budget`` judges GPU memory use."""

    def __init__(self, cache: Cache, queues: Queues, memory_budget: MemoryBudget) -> None:
        self.cache = cache
        self.queues = queues
        self.memory_budget = memory_budget
        self.carry: list[Decision] = []  # decisions made outside a cycle, emitted by the next one
        self._departures = itertools.count(1)  # names the holds of evicted workloads

    def take_carry(self) -> list[Decision]:
        """The decisions made since the last cycle, cleared."""
        out, self.carry = self.carry, []
        return out

    def submit(self, task: Task) -> None:
        """Queue a task (or replace its pending version). Running tasks are left alone."""
        if self.cache.ledger.get(task.key) is None:
            self.queues.submit(task)

    def restore(
        self,
        task: Task,
        placement: Placement,
        admitted_at: float = 0.0,
        *,
        charge: bool = True,
        flavor: str | None = None,
    ) -> bool:
        """Record a task already running with ``placement`` (after a restart): never refused.

        ``charge=False`` records a placement whose quota Kueue books (Kueue mode). ``flavor`` is the
        ResourceFlavor it was admitted in, as its Job or status says (None: found from the placement,
        :meth:`Cache.flavor_of`). Returns False when the placement over-commits a GPU with what was restored
        before it (two beliefs about one GPU: the caller resolves it, e.g. by evicting the later one).
        """
        cache = self.cache
        if task.key in cache.ledger.running:
            return True
        self.queues.forget(task.key)
        task = cache.flavor_of(task, placement, flavor)
        cache.restore(task, placement, admitted_at, charge=charge)
        if not all(map(cache.cluster.has_node, placement.nodes)):  # a node is gone: a node failure, not a loss
            self.carry.extend(self.evict_failed(cache.health.take()))
            return True
        return not cache.cluster.overcommitted(placement)

    def remove_node(self, name: NodeName) -> list[TaskKey]:
        """A node is deleted: its tasks are queued for eviction (NodeFailure), what was held there for departing
        workloads is released (their pods go with the Node), and it is forgotten."""
        lost = self.cache.node_removed(name)
        self.carry.extend(self.evict_failed(self.cache.health.take()))  # release before the node goes
        self.cache.forget_node(name)
        return lost

    def evict(self, key: TaskKey, reason: str, message: str, *, failure: bool = False) -> None:
        """Evict a running task for something the adapter saw (its Job deleted, its pods never
        starting); the next cycle emits the Evict. ``failure`` counts it against maxReschedules."""
        entry = self.cache.ledger.get(key)
        if entry is None:
            return
        if failure:
            self.carry.extend(self.evict_failed([FailureNotice(key, reason, message)]))
            return
        self.requeue(key)
        self.carry.append(Evict(entry.task, entry.placement, reason, message, held=self.hold_departing(entry)))

    def memory_used(self, key: TaskKey, used_by_index: Mapping[int, int]) -> tuple[Overuse, ...] | None:
        """Judge a running task's GPU memory use (MiB per GPU index of its node, what its pods use) against its
        placement (:mod:`gputask.core.budget`); returns its overuses, or None when it is not running (nothing
        to judge). With the Evict action an overusing task is evicted (GPUMemoryExceeded, counted against
        maxReschedules); the next cycle emits the Evict."""
        entry = self.cache.ledger.running.get(key)
        if entry is None or len(entry.placement.pods) != 1:  # several pods: GPU indices alone name no node
            return None
        budget = self.memory_budget
        found = overuses(entry.placement.only(), used_by_index, budget.tolerance_mib)
        if found and budget.action == EVICT:
            message = f"uses more GPU memory than it reserved: {overuse_text(found, budget.tolerance_mib)}"
            self.evict(key, GPU_MEMORY_EXCEEDED, message, failure=True)
        return found

    def hold_departing(self, entry: Entry) -> TaskKey | None:
        """Keep what an evicted workload still uses (its pods run until its Job is gone) under a new key."""
        key = TaskKey(f"{entry.task.key}#departing-{next(self._departures)}")
        return key if self.cache.hold(key, entry.placement, fit=True) is not None else None

    def finish(self, key: TaskKey) -> Placement | None:
        """Forget a task (finished, deleted or evicted) or a hold: release GPUs and quota.

        Decisions about it made outside a cycle and not yet emitted are dropped: the adapter
        has moved on (e.g. the task was deleted right after its node was). Forgetting what it does not know
        changes nothing.
        """
        self.queues.forget(key)
        self.cache.forget_revision(key)
        if self.carry:  # in place: callers may hold the list (``self.carry.extend(...)``)
            self.carry[:] = [d for d in self.carry if d.task.key != key]
        released = self.cache.release(key)
        return released.placement if isinstance(released, Entry) else released

    def requeue(self, key: TaskKey) -> Task | None:
        """Release a running (or nominated) task and queue it again in its old place.

        For an eviction, or to undo an admission whose API write failed. The task keeps its
        creation time, so it goes ahead of newer work; it is queued as its latest revision
        (:meth:`Cache.revise`). Returns the task queued, or None when it held nothing or its revision is
        None. The adapter records the reason and the attempt.
        """
        entry = self.cache.ledger.get(key)
        if entry is None:
            return None
        revised = self.cache.requeued_as(entry)
        self.finish(key)
        if revised is not None:
            self.queues.push_back(revised)
        return revised

    def evict_failed(self, notices: Iterable[FailureNotice]) -> list[Decision]:
        """Evict what failure notices name; past ``maxReschedules`` the task fails for good.

        A task whose quota Kueue books (Kueue mode) is released, not queued here: Kueue requeues it.
        """
        out: list[Decision] = []
        for notice in notices:
            entry = self.cache.ledger.get(notice.key)
            if entry is None:
                continue
            count = self.cache.count_failure(notice.key)
            fails = count > entry.task.max_reschedules
            if entry.charged and not fails:
                self.requeue(notice.key)
            else:
                self.finish(notice.key)
            held = self.hold_departing(entry)
            out.append(Evict(entry.task, entry.placement, notice.reason, notice.message, held=held))
            if fails:
                limit = entry.task.max_reschedules
                out.append(
                    Fail(entry.task, MAX_RESCHEDULES_EXCEEDED, f"{notice.message}; rescheduled {limit} times already")
                )
        return out
