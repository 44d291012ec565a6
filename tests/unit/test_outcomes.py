"""The executor's typed outcomes (k8s/outcomes.py), applied to the core and the records under the core gate.

- a contract read from the executor's calls (``ast``): ``k8s/executor.py`` calls no Scheduler mutation, no record
  change (``records``, ``phases``, or a Transitions method that changes a record) and no controller mutation; the
  outcomes' applier does, under the gate. Shown to catch a planted violation;
- an answer that comes while the gate is held (a cycle running) changes nothing until the gate is released;
- one behaviour test per outcome on FakeKubeClient: 201 Created, 409 Adopted, 4xx Rejected (10 s doubling backoff),
  a lost answer keeps "creating", a fenced create requeues, a delete answered 404 is Gone.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import time
from pathlib import Path
from typing import Any

from test_adapter import Parts

from gputask.core import TaskKey
from gputask.k8s import phases, records
from gputask.k8s.client import JOBS
from gputask.k8s.controller import Controller
from gputask.k8s.executor import backoff_s
from gputask.k8s.jobs import build_job
from gputask.k8s.records import TaskRecord
from gputask.k8s.relabel import Relabeler
from gputask.k8s.tasks import Transitions
from gputask.k8s.writer import Writer
from gputask.testing.fake import FakeKubeClient

EXECUTOR = Path(__file__).resolve().parents[2] / "operator" / "gputask" / "k8s" / "executor.py"


def _functions(module: Any) -> set[str]:
    return {name for name, f in inspect.getmembers(module, inspect.isfunction) if f.__module__ == module.__name__}


RECORD_CHANGES = (_functions(records) - {"position_text"}) | _functions(phases)
TRANSITION_CHANGES = {name for name in vars(Transitions) if name in _functions(phases)}
SCHEDULER_MUTATIONS = frozenset({
    "set_queue", "set_flavor", "remove_flavor", "remove_queue", "set_node", "remove_node", "node_ready",
    "node_failed", "submit", "restore", "hold", "evict", "memory_used", "set_reschedules", "finish", "requeue",
    "revise", "defer", "undefer", "victim_gone", "admit_placed", "cycle"})
CONTROLLER_MUTATIONS = frozenset({
    "adopting", "hold", "departing", "job_gone", "pods_not_starting", "on_job", "on_job_deleted", "on_task",
    "on_task_deleted", "requeue", "started", "admitted_with", "drop"})
FORBIDDEN = RECORD_CHANGES | TRANSITION_CHANGES | SCHEDULER_MUTATIONS | CONTROLLER_MUTATIONS


def core_or_record_changes(source: str) -> list[str]:
    """``line: name`` for each call in ``source`` (the executor's) that changes the Scheduler, a record or the
    controller: ``x.name(...)`` or ``name(...)`` with ``name`` in :data:`FORBIDDEN`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in FORBIDDEN:
            out.append((node.lineno, name))
    return [f"{line}: {name}" for line, name in sorted(out)]


def test_the_forbidden_names_are_still_the_owners_methods() -> None:
    """Every name the contract forbids is a Scheduler, Controller or TaskPods method, a Relabeler's drop, or a
    record change: a rename on their side cannot silently empty the contract."""
    controller = Controller()  # the Scheduler binds its parts' methods on the instance
    owners = (controller.scheduler, controller, controller.pods, Relabeler(controller, Writer(FakeKubeClient())))
    found = {name for name in SCHEDULER_MUTATIONS | CONTROLLER_MUTATIONS
             if any(callable(getattr(owner, name, None)) for owner in owners)}
    assert sorted((SCHEDULER_MUTATIONS | CONTROLLER_MUTATIONS) - found) == []
    assert {"creating", "admitted", "evicted", "set_condition"} <= RECORD_CHANGES
    assert {"admitted", "evicted", "rejected", "finished", "waiting"} <= TRANSITION_CHANGES


def test_the_executor_changes_neither_the_core_nor_a_record() -> None:
    """k8s/executor.py calls no Scheduler mutation, record change or controller mutation: Outcomes applies them."""
    assert core_or_record_changes(EXECUTOR.read_text()) == []


def test_the_contract_catches_a_planted_change() -> None:
    """Calls planted as the executor made them before outcomes (requeue after an await, a record change, a
    Transitions change, set_condition, an adoption) are reported; a dict's pop and a status write are not."""
    planted = (
        "async def f(self, record, key, job):\n"
        "    await self.writer.create(JOBS, {}, 'ns')\n"
        "    self.controller.scheduler.requeue(key)\n"
        "    records.creating(record, None)\n"
        "    await self.transitions.evicted(record, 'r', 'm')\n"
        "    set_condition(record, 'C', True, 'r', 'm')\n"
        "    self.controller.adopting(job)\n"
        "    self.creating.pop(key, None)\n"
        "    await self.transitions.say(said)\n"
    )
    assert core_or_record_changes(planted) == ["3: requeue", "4: creating", "5: evicted", "6: set_condition",
                                               "7: adopting"]


# -- behaviour, one test per outcome --------------------------------------------------------------------------
def _record(parts: Parts, name: str = "t") -> TaskRecord:
    return parts.controller.tasks[TaskKey(f"ns/{name}")]


def _state(parts: Parts, name: str = "t") -> tuple[Any, ...]:
    """A task's phase, Job, the Job it creates, the Admitted reason, and whether the books hold it."""
    record = _record(parts, name)
    admitted = record.conditions.get("Admitted") or {}
    booked = parts.controller.scheduler.ledger.get(record.key) is not None
    return record.phase, record.job_name, record.creating, admitted.get("reason"), booked


async def _admit(parts: Parts, name: str = "t") -> None:
    """Run one cycle and apply its decisions (the loop's steps, without its publishing and retries)."""
    decisions = parts.controller.scheduler.cycle(time.time())
    await parts.executor.apply(decisions)


async def test_an_answer_that_comes_while_the_gate_is_held_changes_nothing_until_it_is_released() -> None:
    """The Job create is answered 201 while someone holds the core gate (a cycle on its worker thread): the task is
    still only creating its Job until the gate is released, then it is Admitted with it."""
    parts = Parts()
    parts.submit("t", gpuMemory="8Gi")
    gate, create = parts.executor.gate, parts.client.create
    answered = asyncio.Event()

    async def create_then_hold_the_gate(*args: Any, **kwargs: Any) -> dict[str, Any]:
        stored = await create(*args, **kwargs)
        await gate.acquire()  # the answer is back; the gate is taken before the executor can apply it
        answered.set()
        return stored

    parts.client.create = create_then_hold_the_gate  # type: ignore[method-assign]
    applying = asyncio.create_task(_admit(parts))
    await answered.wait()
    for _ in range(20):
        await asyncio.sleep(0)
    during = _state(parts)
    gate.release()
    await applying
    assert (during, _state(parts)) == (
        ("Pending", None, "t-1", None, True), ("Admitted", "t-1", None, "Admitted", True))


async def test_a_create_answered_201_is_created() -> None:
    """201: Created is applied: the record has the Job, Admitted, booked, attempt 1."""
    parts = Parts()
    parts.submit("t", gpuMemory="8Gi")
    await _admit(parts)
    assert (_state(parts), _record(parts).attempt, [j["metadata"]["name"] for j in parts.client.all(JOBS, "ns")]) == (
        ("Admitted", "t-1", None, "Admitted", True), 1, ["t-1"])


async def test_a_create_answered_409_with_our_job_is_adopted() -> None:
    """409 and the Job there is this task's, on the placement just chosen: Adopted, taken as created (one Job)."""
    parts = Parts()
    obj = parts.submit("t", gpuMemory="8Gi")
    decisions = parts.controller.scheduler.cycle(time.time())
    (admit,) = decisions
    parts.client.put(JOBS, build_job(obj, admit.placement, attempt=1, queue="q"), "ns")  # another replica's create
    await parts.executor.apply(decisions)
    assert (_state(parts), parts.job_creates(), len(parts.client.all(JOBS, "ns"))) == (
        ("Admitted", "t-1", None, "Admitted", True), ["t-1"], 1)


async def test_a_create_refused_4xx_is_rejected_with_the_doubling_backoff() -> None:
    """422: Rejected: the task is Pending (JobRejected), out of the books, queued again and held back 10 s; the
    backoff doubles per failure up to 5 min."""
    parts = Parts()
    parts.client.fail("create", "jobs", status=422, message="spec.template: Invalid value")
    parts.submit("t", gpuMemory="8Gi")
    await _admit(parts)
    record = _record(parts)
    message = record.conditions["Admitted"]["message"]
    assert (_state(parts), record.key in parts.controller.scheduler.pending, record.backoff.failures,
            message.endswith("retried in 10s (attempt 1)")) == (
        ("Pending", None, None, "JobRejected", False), True, 1, True)
    assert [backoff_s(n) for n in (1, 2, 3, 6, 7)] == [10.0, 20.0, 40.0, 300.0, 300.0]


async def test_a_create_whose_answer_was_lost_keeps_creating() -> None:
    """No answer (connection dropped, not served): the task keeps its booking and "creating" the Job, which the
    executor looks up later."""
    parts = Parts()
    parts.client.fail("create", "jobs", status=0)
    parts.submit("t", gpuMemory="8Gi")
    await _admit(parts)
    assert (_state(parts), list(parts.executor.creating), parts.client.all(JOBS, "ns")) == (
        ("Pending", None, "t-1", None, True), ["ns/t"], [])


async def test_a_fenced_create_requeues_the_task() -> None:
    """The replica stops leading before the create is sent: Fenced: the task is out of the books and queued again,
    creating nothing; the next leader decides."""
    parts = Parts()
    parts.submit("t", gpuMemory="8Gi")
    decisions = parts.controller.scheduler.cycle(time.time())
    parts.leading = False
    await parts.executor.apply(decisions)
    assert (_state(parts), TaskKey("ns/t") in parts.controller.scheduler.pending, parts.job_creates()) == (
        ("Pending", None, None, None, False), True, [])


async def test_a_delete_answered_404_is_gone() -> None:
    """A deleted task's Job, held until it is gone, is deleted and the API answers 404 (it went meanwhile): Gone:
    the controller forgets the Job and the hold of its GPUs ends."""
    parts = Parts()
    obj = parts.submit("t", gpuMemory="8Gi")
    await _admit(parts)
    for job in parts.client.all(JOBS, "ns"):
        parts.controller.on_job(job)
    record = _record(parts)
    parts.controller.on_task_deleted(obj)  # its Job keeps the GPUs until it is gone
    held = dict(parts.controller.held)
    await parts.client.delete(JOBS, "t-1", "ns")  # gone before the operator's delete (no event seen yet)
    await parts.executor.delete_job(record)
    assert (list(held), parts.controller.held, "ns/t-1" in parts.controller.jobs,
            parts.controller.scheduler.ledger.get(next(iter(held.values())))) == (["ns/t-1"], {}, False, None)
