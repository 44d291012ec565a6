"""A task's phase changes as values: each function changes the record (through :mod:`gputask.k8s.records`, the one
module that changes records) and returns what is to be said of it, a :class:`Said` (the status message to write and
the Event to post after it). No I/O: :class:`~gputask.k8s.tasks.Transitions` writes what is said, and
:class:`~gputask.k8s.outcomes.Outcomes` changes records this way under the core gate, the writes coming after it is
released.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputask.core import Placement
from gputask.core.budget import GPU_MEMORY_EXCEEDED
from gputask.k8s import records
from gputask.k8s.lingering import HELD_NOTE
from gputask.k8s.records import MAX_CONDITION_MESSAGE, SUCCEEDED, TaskRecord, set_condition

GPU_MEMORY_WITHIN_BUDGET = "GPUMemoryWithinBudget"

Event = tuple[str, str, str]  # (type, reason, message) of a core/v1 Event


@dataclass(frozen=True, slots=True)
class Said:
    """What to say of ``record``: its status with ``message`` (written when ``status``), then ``event`` (type,
    reason, message), if any. ``status=False``: an Event only (the status does not change)."""

    record: TaskRecord
    message: str
    event: Event | None = None
    status: bool = True


def admitted(record: TaskRecord, placement: Placement, *, job_name: str | None, attempt: int, quota: str,
             message: str) -> Said:
    """Placed with quota reserved (``quota`` says by whom) and its Job created (or to come)."""
    records.admitted(record, placement, job_name=job_name, attempt=attempt, quota=quota, message=message)
    return Said(record, message, ("Normal", "Admitted", message))


def running(record: TaskRecord, message: str) -> Said:
    """A pod of its Job runs."""
    records.running(record)
    return Said(record, message)


def waiting(record: TaskRecord, reason: str, message: str, position: int | None = None) -> Said:
    """Pending for ``reason``; an Event only for a new reason, not a new position."""
    said, new = records.waiting(record, reason, message, position)
    return Said(record, said, ("Normal", reason, message) if new else None)


def evicted(record: TaskRecord, reason: str, message: str) -> Said:
    """Evicted from its placement and requeued (the Job is being deleted)."""
    records.evicted(record, reason, message)
    return Said(record, message, ("Warning", reason, message))


def rejected(record: TaskRecord, reason: str, message: str) -> Said:
    """Its Job was refused (or could not start): Pending, with the API's words, until it is retried."""
    records.rejected(record, reason, message)
    return Said(record, message, ("Warning", reason, message))


def blocked(record: TaskRecord, reason: str, message: str) -> Said:
    """Pending outside any queue until something it names exists (e.g. PriorityClassNotFound); an Event only for a
    new wait."""
    new = records.blocked(record, reason, message)
    return Said(record, message, ("Warning", reason, message) if new else None)


def failed(record: TaskRecord, reason: str, message: str) -> Said:
    """Failed for good (MaxReschedulesExceeded): it is no longer queued."""
    records.failed(record, reason, message)
    return Said(record, message, ("Warning", reason, message))


def invalid(record: TaskRecord) -> Said:
    """A spec that can never run: Failed with the reason, until the spec changes."""
    reason, message = records.invalid(record)
    return Said(record, message, ("Warning", reason, message))


def finished(record: TaskRecord, outcome: str, why: str = "") -> Said:
    """Its Job completed (Succeeded) or failed (Failed; ``why``: the Job's Failed condition, "reason: message").
    A failed task's Admitted condition turns False (reason JobFailed), so no column says Admitted any more."""
    message = f"Job {record.job_name} {'completed' if outcome == SUCCEEDED else 'failed'}"
    message += f" ({why})" if why else ""
    records.finished(record, outcome, message)
    return Said(record, message, ("Normal" if outcome == SUCCEEDED else "Warning", outcome, message))


def gpus_held(record: TaskRecord, note: str, *, held: bool) -> Said | None:
    """An old Job of the task is gone while its pods are not: its GPUs stay ``held`` until they are (``note``:
    :func:`~gputask.k8s.lingering.held_note`, added at the end of the Evicted condition's message), or are
    released now (``note`` says so; the condition's message loses what was added; None when it never said so).
    A Normal Event either way."""
    old = record.conditions.get("Evicted")
    said = str((old or {}).get("message") or "")
    if not held and not HELD_NOTE.search(said):
        return None  # never said to be held (its node was deleted first): nothing to take back
    if old is not None:
        base = HELD_NOTE.sub("", said)
        text = f"{base}; {note}"[:MAX_CONDITION_MESSAGE] if held else base
        set_condition(record, "Evicted", old.get("status") == "True", str(old.get("reason")), text)
    summary = str((record.obj.get("status") or {}).get("message") or note)
    return Said(record, summary, ("Normal", "GPUsHeld" if held else "GPUsReleased", note))


def condition(record: TaskRecord, ctype: str, status: bool, reason: str, message: str) -> Said:
    """Another condition (KueueConflict); a Warning Event when it turns True."""
    set_condition(record, ctype, status, reason, message)
    summary = message if status else str((record.obj.get("status") or {}).get("message") or message)
    return Said(record, summary, ("Warning", reason, message) if status else None)


def memory_budget(record: TaskRecord, within: bool, message: str) -> Said:
    """The condition GPUMemoryWithinBudget: False (reason GPUMemoryExceeded, a Warning Event naming each GPU, what
    its pods use and the budget) or True again (reason GPUMemoryWithinBudget, a Normal Event)."""
    if within:
        set_condition(record, GPU_MEMORY_WITHIN_BUDGET, True, GPU_MEMORY_WITHIN_BUDGET, message)
        kept = str((record.obj.get("status") or {}).get("message") or message)
        return Said(record, kept, ("Normal", GPU_MEMORY_WITHIN_BUDGET, message))
    text = f"its pods use more GPU memory than it reserved: {message}"
    set_condition(record, GPU_MEMORY_WITHIN_BUDGET, False, GPU_MEMORY_EXCEEDED, text)
    return Said(record, text, ("Warning", GPU_MEMORY_EXCEEDED, text))


def note(record: TaskRecord, etype: str, reason: str, message: str) -> Said:
    """An Event only (e.g. SpecChangeIgnored): the status does not change."""
    return Said(record, message, (etype, reason, message), status=False)


__all__ = ["GPU_MEMORY_WITHIN_BUDGET", "Said", "admitted", "blocked", "condition", "evicted", "failed", "finished",
           "gpus_held", "invalid", "memory_budget", "note", "rejected", "running", "waiting"]
