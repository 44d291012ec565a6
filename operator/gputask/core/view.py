"""The read-only view of the scheduler that reports read: :func:`~gputask.core.reasons.queue_status`,
:func:`~gputask.core.reasons.violations`, :func:`~gputask.core.diagnose.diagnose` (``explain``) and the adapter's
status writers. :class:`~gputask.core.scheduler.Scheduler` is its implementation; a reader depends on this protocol,
not on the scheduler's module or its parts (so no import circle runs through the core), and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gputask.core.cluster import ClusterState
from gputask.core.decisions import Wait
from gputask.core.ledger import Entry, Ledger
from gputask.core.model import NodeName, Placement, Task, TaskKey
from gputask.core.placement import Outcome
from gputask.core.preemption import Plan
from gputask.core.queues import QueueManager
from gputask.core.quota import QuotaBook, Usage


class SchedulerView(Protocol):
    """What a report may read of the scheduler (every member read only; none changes anything)."""

    @property
    def cluster(self) -> ClusterState:
        """Nodes and reservations."""
        ...

    @property
    def quotas(self) -> QuotaBook:
        """Queue specs and what each queue is charged (milli-GPU, MiB)."""
        ...

    @property
    def ledger(self) -> Ledger:
        """Running, nominated and held reservations, and the admitted tallies per group."""
        ...

    @property
    def pending(self) -> QueueManager:
        """Pending tasks in queue order."""
        ...

    @property
    def running(self) -> Mapping[TaskKey, Entry]:
        """Admitted tasks by key."""
        ...

    @property
    def nominated(self) -> Mapping[TaskKey, Entry]:
        """Preemptors waiting for their victims, by key."""
        ...

    @property
    def reasons(self) -> Mapping[TaskKey, tuple[str, str, int]]:
        """The waits said: reason, message and queue position (0 = head) per pending task."""
        ...

    @property
    def filters(self) -> Mapping[TaskKey, tuple[tuple[str, int], ...]]:
        """Nodes refused per filter, per waiting task."""
        ...

    @property
    def waiting_by_reason(self) -> Mapping[tuple[str, str], int]:
        """Waiting tasks per (queue, reason)."""
        ...

    @property
    def waiting_by_filter(self) -> Mapping[str, int]:
        """Waiting tasks per filter that refused some node."""
        ...

    @property
    def largest_gpu_mib(self) -> int:
        """The largest GPU seen (MiB): the bound of a memory request's least charge."""
        ...

    def never_admits(self, task: Task) -> bool:
        """True when ``task``'s queue exists and its namespaceSelector does not select the task's namespace."""
        ...

    def parked_by_queue(self) -> dict[str, int]:
        """Per queue, its pending tasks it never admits."""
        ...

    def gate(self, task: Task) -> Wait | None:
        """The queue-level reason ``task`` would wait for before any node is looked at, else None."""
        ...

    def variants(self, task: Task) -> list[Task]:
        """``task`` in each flavor of its queue it may use, in the queue's order."""
        ...

    def place(self, task: Task) -> Outcome:
        """Where ``task`` would go now, with no queue or quota involved (a gang's best partial try when it does not
        fit); nothing is reserved."""
        ...

    def try_place(self, task: Task, node: NodeName | None = None) -> tuple[Placement | None, Usage | None, str | None]:
        """Where a cycle would place ``task`` now ignoring quota, what it charges, and the quota key refusing it."""
        ...

    def defrag_lines(self, task: Task, now: float) -> tuple[str, ...]:
        """For a task waiting Fragmented: the defragmentation a cycle at ``now`` would run (moves, where each goes,
        the budget left) or why none; () for another task. Changes nothing."""
        ...

    def preemption_plan(self, task: Task) -> Plan | None:
        """The preemption a cycle would start for ``task`` now (tried on a snapshot), None when none makes room."""
        ...
