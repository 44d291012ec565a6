"""The waits said: why each pending task waits, where it stood, which filters refused it, and the counts of those.

:class:`Waits` is the one writer of these records; the queue manager (:class:`~gputask.core.queueing.Queues`) owns
one. The cycle records a wait when it emits a Pending (:meth:`Waits.say`, :meth:`Waits.note_filters`); a task that
leaves the queue is forgotten (:meth:`Waits.forget`). Metrics and queue statuses read the counts
(``waiting_by_reason``, ``waiting_by_filter``), kept as the waits change, never a walk over every waiting task.
"""

from __future__ import annotations

from gputask.core.model import Task, TaskKey


class Waits:
    """Recorded waits: ``reasons`` (key -> reason, message, position in its queue, 0 = head), ``filters`` (key ->
    nodes refused per filter), and their counts: ``waiting_by_reason`` ((queue, reason) -> tasks) and
    ``waiting_by_filter`` (filter -> tasks some node refused by it)."""

    def __init__(self) -> None:
        self.reasons: dict[TaskKey, tuple[str, str, int]] = {}
        self.filters: dict[TaskKey, tuple[tuple[str, int], ...]] = {}  # waiting tasks: nodes refused per filter
        self.waiting_by_reason: dict[tuple[str, str], int] = {}  # (queue, reason) -> waiting tasks
        self.waiting_by_filter: dict[str, int] = {}  # filter -> waiting tasks some node refused by it
        self._said_in: dict[TaskKey, tuple[str, str]] = {}  # (queue, reason) each recorded reason is counted under

    def note_filters(self, key: TaskKey, filters: tuple[tuple[str, int], ...]) -> None:
        """Record the nodes each filter refused ``key`` (empty: none), replacing what was recorded."""
        self._count_filters(self.filters.pop(key, ()), -1)
        if filters:
            self.filters[key] = filters
            self._count_filters(filters, 1)

    def _count_filters(self, filters: tuple[tuple[str, int], ...], sign: int) -> None:
        for name, _ in filters:
            left = self.waiting_by_filter.get(name, 0) + sign
            if left:
                self.waiting_by_filter[name] = left
            else:
                del self.waiting_by_filter[name]

    def say(self, task: Task, reason: str, message: str, position: int) -> None:
        """Record why ``task`` waits (and count it under its queue and reason)."""
        self._uncount(task.key)
        self.reasons[task.key] = (reason, message, position)
        where = self._said_in[task.key] = (task.queue, str(reason))
        self.waiting_by_reason[where] = self.waiting_by_reason.get(where, 0) + 1

    def _uncount(self, key: TaskKey) -> None:
        where = self._said_in.pop(key, None)
        if where is not None:
            left = self.waiting_by_reason[where] - 1
            if left:
                self.waiting_by_reason[where] = left
            else:
                del self.waiting_by_reason[where]

    def forget(self, key: TaskKey) -> None:
        """``key`` waits no more: drop its reason and filters (and their counts)."""
        self.reasons.pop(key, None)
        self._uncount(key)
        self._count_filters(self.filters.pop(key, ()), -1)
