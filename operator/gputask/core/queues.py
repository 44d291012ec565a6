"""Pending tasks in scheduling order: higher priority first, then older, then by key.

One global order across queues, and each queue's own order (the same order filtered), kept
sorted incrementally with :mod:`bisect` so a cycle never re-sorts tens of thousands of tasks and
a task's position in its queue is a binary search.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, KeysView

from gputask.core.model import Task, TaskKey

OrderKey = tuple[int, float, str]


def order_key(task: Task) -> OrderKey:
    """Sort key of a task: (-priority, creation time, key)."""
    return (-task.priority, task.created, task.key)


class QueueManager:
    """Pending tasks, ordered by :func:`order_key`."""

    def __init__(self) -> None:
        self._tasks: dict[TaskKey, Task] = {}
        self._order: list[OrderKey] = []
        self._by_queue: dict[str, list[OrderKey]] = {}  # each queue's own order, kept as tasks come and go
        self._groups: dict[tuple[str, str, str | None], int] = {}  # pending per queue, namespace, local queue

    def push(self, task: Task) -> None:
        """Add or replace a pending task."""
        self.discard(task.key)
        self._tasks[task.key] = task
        ok = order_key(task)
        bisect.insort(self._order, ok)
        bisect.insort(self._by_queue.setdefault(task.queue, []), ok)
        group = (task.queue, task.namespace, task.local_queue)
        self._groups[group] = self._groups.get(group, 0) + 1

    def discard(self, key: TaskKey) -> Task | None:
        """Remove a task if pending; returns it."""
        task = self._tasks.pop(key, None)
        if task is not None:
            ok = order_key(task)
            del self._order[bisect.bisect_left(self._order, ok)]
            own = self._by_queue[task.queue]
            del own[bisect.bisect_left(own, ok)]
            if not own:
                del self._by_queue[task.queue]
            group = (task.queue, task.namespace, task.local_queue)
            if self._groups[group] == 1:
                del self._groups[group]
            else:
                self._groups[group] -= 1
        return task

    def rank(self, task: Task) -> int:
        """How many pending tasks of ``task``'s queue come before it (0: its head)."""
        return bisect.bisect_left(self._by_queue.get(task.queue, []), order_key(task))

    def queue_orders(self) -> dict[str, list[OrderKey]]:
        """Each queue's pending tasks' order keys, in its order (the live lists: read only)."""
        return self._by_queue

    def in_queue(self, queue: str, start: int, stop: int) -> list[Task]:
        """The pending tasks of ``queue`` at positions ``start`` to ``stop`` (exclusive) in its order."""
        return [self._tasks[TaskKey(key)] for _, _, key in self._by_queue.get(queue, [])[start:stop]]

    def get(self, key: TaskKey) -> Task | None:
        """The pending task with ``key``, if any."""
        return self._tasks.get(key)

    def keys(self) -> KeysView[TaskKey]:
        """The pending tasks' keys (a live view)."""
        return self._tasks.keys()

    def __contains__(self, key: object) -> bool:
        return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        """Tasks in scheduling order (a copy of the order: safe to mutate while iterating)."""
        for _, _, key in list(self._order):
            task = self._tasks.get(TaskKey(key))
            if task is not None:
                yield task

    def count_by_group(self) -> dict[tuple[str, str, str | None], int]:
        """Number of pending tasks per (GPUClusterQueue, namespace, GPULocalQueue) (kept as tasks come and go)."""
        return dict(self._groups)

    def count_by_queue(self) -> dict[str, int]:
        """Number of pending tasks per queue name (kept as tasks come and go: O(queues))."""
        return {queue: len(keys) for queue, keys in self._by_queue.items()}
