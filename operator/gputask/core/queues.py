"""Pending tasks in scheduling order: higher priority first, then older, then by key.

One global order across queues (each queue's own order is the same order filtered), kept
sorted incrementally with :mod:`bisect` so a cycle never re-sorts tens of thousands of tasks.
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
        self._counts: dict[str, int] = {}  # pending tasks per queue, kept as they come and go

    def push(self, task: Task) -> None:
        """Add or replace a pending task."""
        self.discard(task.key)
        self._tasks[task.key] = task
        bisect.insort(self._order, order_key(task))
        self._counts[task.queue] = self._counts.get(task.queue, 0) + 1

    def discard(self, key: TaskKey) -> Task | None:
        """Remove a task if pending; returns it."""
        task = self._tasks.pop(key, None)
        if task is not None:
            ok = order_key(task)
            i = bisect.bisect_left(self._order, ok)
            del self._order[i]
            left = self._counts[task.queue] - 1
            if left:
                self._counts[task.queue] = left
            else:
                del self._counts[task.queue]
        return task

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

    def count_by_queue(self) -> dict[str, int]:
        """Number of pending tasks per queue name (kept as tasks come and go: O(queues))."""
        return dict(self._counts)
