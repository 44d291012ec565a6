"""What the controller queues for the loop to publish about a task: :class:`Report`, of a :class:`ReportKind`.

Handlers feed the controller synchronously under the core gate and never write; what must be said (a status, an
Event, a Job to delete) waits in :attr:`Controller.outbox` as Reports until the loop hands them to
:meth:`Executor.publish`. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gputask.k8s.records import TaskRecord


class ReportKind(StrEnum):
    """The kinds of report; ``detail`` of :class:`Report` is given where a kind says so."""

    INVALID = "invalid"  # its spec can never run (record.invalid)
    BLOCKED = "blocked"  # it waits outside the queues (record.blocked)
    SPEC_IGNORED = "spec-ignored"  # its spec changed while placed: applies at its next admission
    DEPRECATED_QUEUE = "deprecated-queue"  # detail: the GPUClusterQueue it names directly
    FINISHED = "finished"  # detail: its Job's outcome (Succeeded, Failed)
    RUNNING = "running"  # detail: which pod of its Job started
    RESTORED = "restored"  # detail: the status message (a restart between the Job's create and the status)
    DELETE_JOB = "delete-job"  # its object was deleted: its Job goes
    GANG_ENDED = "gang-ended"  # detail: the key of a live Job of a gang whose other Job failed, to stop
    STRAY_JOB = "stray-job"  # detail: the key of a second live Job of the task, to delete
    OVER_BUDGET = "over-budget"  # detail: its pods' GPU memory against its reservation
    WITHIN_BUDGET = "within-budget"  # detail: the same, within it again
    GPUS_HELD = "gpus-held"  # detail: lingering.held_note (an old Job gone, its pods not: its GPUs held)
    GPUS_RELEASED = "gpus-released"  # detail: those pods are gone, the GPUs released


@dataclass(frozen=True, slots=True)
class Report:
    """Something the loop must publish about a task (``record``): ``kind``, with ``detail`` where it says so."""

    kind: ReportKind
    record: TaskRecord
    detail: str = ""


__all__ = ["Report", "ReportKind"]
