"""What a scheduling cycle decides: :data:`Decision` (Admit, Pending, Evict, Fail), :class:`CycleStats`, and
:class:`Wait` (why a task waits).

Plain values, shared by the cycle (:mod:`gputask.core.cycle`) that makes them, the queue manager and cache that
record them, and the adapter that carries them out (as Kueue's scheduler hands admissions to its workload
controller).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from gputask.core.model import Placement, Task, TaskKey
from gputask.core.quota import Usage


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit ``task`` with ``placement``; ``usage`` is what it charges its queue."""

    task: Task
    placement: Placement
    usage: Usage


@dataclass(frozen=True, slots=True)
class Pending:
    """``task`` stays pending; emitted when ``reason`` or ``message`` changes, or when its
    ``position`` in its queue (0 = head) changes among the first ``tracked_positions`` (:data:`TRACKED_POSITIONS`
    unless the scheduler was given another number).

    ``position`` is left out of equality: it is a report, not a decision; so is ``filters``
    (nodes refused per filter, see :class:`~gputask.core.reasons.Wait`), which is for metrics.
    """

    task: Task
    reason: str
    message: str
    position: int = field(default=-1, compare=False)
    filters: tuple[tuple[str, int], ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict running ``task`` from ``placement``; it is requeued in its old place.

    ``reason`` is Preempted, NodeFailure, GPUFailure, QueueDrained or GPUMemoryExceeded (and the adapter's
    own: JobDeleted, PodsNotStarting, PlacementConflict); ``by`` names the preemptor.
    ``held`` is the key under which the evicted workload keeps its GPUs (what a nominated
    preemptor did not take) until the adapter reports it gone with :meth:`Scheduler.finish`; a
    report, left out of equality.
    """

    task: Task
    placement: Placement
    reason: str
    message: str
    by: TaskKey | None = None
    held: TaskKey | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Fail:
    """``task`` failed for good (e.g. MaxReschedulesExceeded); it is no longer queued."""

    task: Task
    reason: str
    message: str


Decision = Admit | Pending | Evict | Fail

MERGE_ADDED = 1000
"""With cohorts, an incremental cycle orders what it emits from the keys of the tasks added since the last walk
(:meth:`~gputask.core.queueing.Queues.merge_keys`); beyond this many, the walk decides (and starts the count over)."""

TRACKED_POSITIONS = 100
"""Queue positions are reported as they change for this many heads of each queue; further back,
only with a new reason (tens of thousands of pending tasks must not mean as many writes)."""


@dataclass(frozen=True, slots=True)
class CycleStats:
    """What the last :meth:`Scheduler.cycle` did: ``mode`` is ``skipped`` (nothing changed since a cycle that
    changed nothing, and no deadline passed), ``incremental`` (only new tasks arrived: each tried alone) or
    ``full`` (every pending task walked in order); ``tried`` counts the pending tasks tried (queue, quota,
    placement, preemption); ``skipped`` the cycles skipped so far."""

    mode: str = "full"
    tried: int = 0
    skipped: int = 0


class Wait(NamedTuple):
    """Why a task waits: a reason and the message that names the binding constraint.

    ``filters``: for a task no node fits, how many nodes each filter refused
    (:class:`~gputask.core.fit.Filter` value, count), for metrics; empty otherwise.
    """

    reason: str
    message: str
    filters: tuple[tuple[str, int], ...] = ()
