"""The queue manager (Kueue's pkg/queue Manager): what waits, in which order, and what was said about it.

:class:`Queues` owns the pending tasks of every GPUClusterQueue (:class:`~gputask.core.queues.QueueManager`, each
queue's order kept sorted), the tasks submitted since the last cycle (``new``), backoffs (``deferred``), the waits
said with their positions (:class:`~gputask.core.waits.Waits`), and the cycle's order across the queues of cohorts
(Kueue's ``entryOrdering``, fair sharing included: :meth:`Queues.ordered`). Every change but a new task's arrival
bumps :attr:`Queues.generation`, which the scheduler compares to skip a cycle that nothing changed.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from gputask.core.decisions import MERGE_ADDED, Pending
from gputask.core.model import Task, TaskKey
from gputask.core.queues import OrderKey, QueueManager, order_key
from gputask.core.waits import Waits

HeadKey = tuple[bool, float, OrderKey]
"""A queue head's key in Kueue's ``entryOrdering``: borrows, fair share after admitting it, then queue order."""


class Queues:
    """Pending tasks, backoffs and waits said; the writer of all three (module doc).

    ``generation`` changes with every change a cycle reads except a new task (those are in ``new`` until the next
    cycle, which tries them alone when nothing else changed).
    """

    def __init__(self) -> None:
        self.pending = QueueManager()
        self.waits = Waits()
        self.deferred: dict[TaskKey, tuple[float, str, str]] = {}  # backoff: until (s), reason, message
        self.new: dict[TaskKey, None] = {}  # tasks submitted since the last cycle (none pending before)
        self.generation = 0
        self._running_max: dict[TaskKey, HeadKey] = {}  # see merged and merge_keys
        self._added: dict[str, list[tuple[OrderKey, HeadKey]]] = {}

    # -- changes ------------------------------------------------------------------------------
    def submit(self, task: Task) -> None:
        """Queue ``task``, or replace its pending version (where it stands is then tried anew)."""
        if task.key in self.pending:
            self.generation += 1
        else:
            self.new[task.key] = None
        self.pending.push(task)

    def push_back(self, task: Task) -> None:
        """Queue ``task`` again in its old place (it keeps its creation time): a requeue."""
        self.generation += 1
        self.pending.push(task)

    def take(self, key: TaskKey) -> None:
        """``key`` leaves the queue for the cache (admitted or nominated): it waits no more."""
        if self.pending.discard(key) is not None:
            self.generation += 1
        self.waits.forget(key)

    def forget(self, key: TaskKey) -> bool:
        """Forget ``key`` altogether (finished, deleted, requeued): pending, its waits and its backoff. True when
        it was pending or deferred."""
        known = self.pending.discard(key) is not None
        self.waits.forget(key)
        known = self.deferred.pop(key, None) is not None or known
        if known:
            self.generation += 1
        return known

    def defer(self, key: TaskKey, until: float, reason: str, message: str) -> None:
        """Hold a pending task back until ``until`` (seconds, the cycle's clock): it waits with
        ``reason`` and is tried again at the first cycle at or after ``until`` (a backoff)."""
        self.generation += 1
        self.deferred[key] = (until, reason, message)

    def undefer(self, key: TaskKey) -> None:
        """Try a deferred task at the next cycle."""
        if self.deferred.pop(key, None) is not None:
            self.generation += 1

    def backoff(self, key: TaskKey, now: float) -> tuple[float, str, str] | None:
        """The backoff ``key`` still waits out at ``now`` (until, reason, message); one that ended is dropped."""
        deferred = self.deferred.get(key)
        if deferred is not None and now >= deferred[0]:
            del self.deferred[key]
            return None
        return deferred

    def backoff_ends(self, now: float) -> list[float]:
        """When the backoffs still running at ``now`` end (seconds)."""
        return [until for until, _, _ in self.deferred.values() if until > now]

    # -- order ----------------------------------------------------------------------------------
    def ordered(self, cohorts: bool, head_key: Callable[[Task], HeadKey]) -> Iterable[Task]:
        """Pending tasks in Kueue's order: each queue's own in priority then creation order, and
        across the queues of cohorts (``cohorts``) the heads ordered as Kueue's ``entryOrdering``
        (:meth:`merged`, keys from ``head_key``). Without cohorts that is :class:`QueueManager`'s global order."""
        return self.merged(head_key) if cohorts else self.pending

    def merged(self, head_key: Callable[[Task], HeadKey]) -> Iterator[Task]:
        """Queue heads in Kueue's ``entryOrdering`` (pkg/scheduler): a head that fits its nominal quota
        before one that must borrow, then (fair sharing) the lower share after admitting the head
        (``DominantResourceShareWith``), then priority, then creation: ``head_key``. A queue's next head is keyed
        after the previous one was decided (admitting it changes its queue's share), as Kueue's
        next cycle would. Keys: O(log queues) per task."""
        by_queue: dict[str, deque[Task]] = {}
        for task in self.pending:
            by_queue.setdefault(task.queue, deque()).append(task)
        heap = [(head_key(tasks[0]), name) for name, tasks in by_queue.items()]
        heapq.heapify(heap)
        self._running_max, self._added = {}, {}  # how an incremental cycle puts what it emits in this order
        top: dict[str, HeadKey] = {}
        while heap:
            key, name = heapq.heappop(heap)
            tasks = by_queue[name]
            task = tasks.popleft()
            top[name] = max(top[name], key) if name in top else key
            self._running_max[task.key] = top[name]
            yield task
            if tasks:
                heapq.heappush(heap, (head_key(tasks[0]), name))

    def merge_keys(
        self, emitted: list[Pending], new: list[Task], head_key: Callable[[Task], HeadKey]
    ) -> dict[TaskKey, tuple[object, ...]] | None:
        """Sort keys that put ``emitted`` in :meth:`merged`'s order while nothing changes its queues' keys (between
        cycles that admit nothing); None when one cannot be told, or when more than :data:`MERGE_ADDED` tasks came
        since the last walk (the walk then decides: it costs less than this does then).

        A merge that always takes the queue head with the lowest key yields the tasks in the order of the largest
        key of their queue up to them (each queue's keys being distinct from every other's; queue order breaks
        ties within a queue). So a task's sort key is that running maximum: the larger of the one the last walk
        recorded for the nearest task ahead that it walked and the largest key of the tasks added since that are
        ahead of it (a binary search in their running maxima), not a replay of the merge."""
        for task in new:
            bisect.insort(self._added.setdefault(task.queue, []), (order_key(task), head_key(task)))
        if sum(len(entries) for entries in self._added.values()) > MERGE_ADDED:
            return None
        added = {ok[2] for entries in self._added.values() for ok, _ in entries}
        ahead = {q: list(itertools.accumulate((k for _, k in entries), max)) for q, entries in self._added.items()}
        out: dict[TaskKey, tuple[object, ...]] = {}
        for decision in emitted:
            task = decision.task
            rank, entries = self.pending.rank(task), self._added.get(task.queue, [])
            keys = []
            if (at := bisect.bisect_right(entries, (order_key(task), (True, float("inf"), order_key(task))))) > 0:
                keys.append(ahead[task.queue][at - 1])
            walked = self._walked_ahead(task.queue, rank, added, len(entries))
            if walked is not None:
                if walked not in self._running_max:
                    return None
                keys.append(self._running_max[walked])
            out[task.key] = (max(keys), rank)
        return out

    def _walked_ahead(self, queue: str, rank: int, added: set[str], in_queue: int) -> TaskKey | None:
        """The nearest task at or ahead of ``rank`` in ``queue`` that the last walk saw (not one of the ``in_queue``
        tasks of ``added`` there); None when there is none."""
        for earlier in reversed(self.pending.in_queue(queue, max(0, rank - in_queue), rank + 1)):
            if earlier.key not in added:
                return earlier.key
        return None

    def moved_behind(self, new: list[Task], tracked_positions: int) -> list[Pending]:
        """Waiting tasks that new ones now stand ahead of, at a new position among the ``tracked_positions`` heads of
        their queue: a Pending with the same reason at the new position."""
        out: list[Pending] = []
        reasons, filters = self.waits.reasons, self.waits.filters
        for queue in sorted({t.queue for t in new}):
            first = min(self.pending.rank(t) for t in new if t.queue == queue)
            for position, task in enumerate(self.pending.in_queue(queue, first, tracked_positions), first):
                last = reasons.get(task.key)
                if last is not None and task.key not in self.new and last[2] != position:
                    out.append(Pending(task, last[0], last[1], position, filters.get(task.key, ())))
        return out
