"""Writes whose answer the API server lost, Jobs that ended unseen, and pods the system disrupted (issue 33), on the
in-process fake client: nothing is double-booked, nothing finished runs again, a disruption requeues.

Each test feeds the controller as the watch handlers would and runs the loop once at a time (as test_adapter).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_adapter import GPU0, Parts, _now, task_pod

from gputask.core import GpuSlot, NodeName, Placement, TaskKey
from gputask.k8s import executor as executor_module
from gputask.k8s.client import EVENTS, JOBS
from gputask.k8s.jobs import PLACEMENT_ANNOTATION, build_job, parse_placement

GPU1 = {**GPU0, "index": 1, "uuid": "GPU-1"}


@pytest.fixture(autouse=True)
def _confirm_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lost answers are looked up at the next loop pass (no backoff to wait out in a unit test)."""
    monkeypatch.setattr(executor_module, "CONFIRM_RETRY_S", 0.0, raising=False)


def two_gpus(parts: Parts) -> None:
    """Give node-a a second A10 (24 GiB each)."""
    gpunode = {"metadata": {"name": "node-a"}, "status": {"gpus": [GPU0, GPU1], "heartbeatTime": _now()}}
    parts.controller.inventory.on_gpunode(gpunode, time.time())


def mib_on_gpus(parts: Parts) -> dict[int, int]:
    """What the live Jobs in the API hold, MiB per GPU index (their placement annotations): the real use."""
    used: dict[int, int] = {}
    for job in parts.client.all(JOBS, "ns"):
        if job["metadata"].get("deletionTimestamp"):
            continue
        placement = parse_placement(job["metadata"]["annotations"][PLACEMENT_ANNOTATION])
        assert placement is not None
        for slot in placement.only().gpus:
            used[slot.index] = used.get(slot.index, 0) + slot.memory_mib
    return used


def reason(status: dict[str, Any], ctype: str = "Admitted") -> str | None:
    """The reason of a condition of a stored status."""
    return next((c["reason"] for c in status.get("conditions") or [] if c["type"] == ctype), None)


def feed_jobs(parts: Parts) -> None:
    """Feed every Job in the API to the controller (their informer events)."""
    for job in parts.client.all(JOBS, "ns"):
        parts.controller.on_job(job)


async def test_a_served_create_whose_answer_was_lost_keeps_the_gpu_booked_and_is_adopted() -> None:
    """The Job POST is served but its answer lost: the task keeps its 20 GiB of the 24 GiB GPU (a second task waits
    NoFit instead of taking it), and the next pass finds the Job and records the admission; one create only."""
    parts = Parts()
    parts.client.fail("create", "jobs", served=True)
    parts.submit("t", gpuMemory="20Gi")
    await parts.loop.run_once()
    parts.submit("u", gpuMemory="20Gi")
    await parts.loop.run_once()
    await parts.loop.run_once()
    status = parts.status("t")
    assert (status["phase"], status["jobName"], parts.job_creates(), reason(parts.status("u")),
            mib_on_gpus(parts)) == ("Admitted", "t-1", ["t-1"], "NoFit", {0: 20480})


async def test_an_unanswered_create_that_was_not_served_is_sent_again_once_a_get_says_so() -> None:
    """The Job POST gets no answer and was not served: the GPU stays booked meanwhile; a GET answers 404 and the
    create is sent again, and the task is admitted with that Job."""
    parts = Parts()
    parts.client.fail("create", "jobs", status=0)
    parts.submit("t", gpuMemory="20Gi")
    await parts.loop.run_once()
    booked = parts.controller.scheduler.placement_of(TaskKey("ns/t"))
    await parts.loop.run_once()
    assert (booked is not None, parts.job_creates(), parts.status("t")["phase"], mib_on_gpus(parts)) == (
        True, ["t-1", "t-1"], "Admitted", {0: 20480})


async def test_a_live_job_of_a_waiting_task_holds_its_gpus() -> None:
    """A Job of ours whose task the books say waits (its create answer was lost) holds its GPU: a new task waits
    NoFit instead of sharing the GPU beyond its memory."""
    parts = Parts()
    task = parts.submit("t", gpuMemory="20Gi", queueName="nowhere")  # waits: its queue does not exist
    on_gpu0 = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 20480),))
    parts.controller.on_job(parts.client.put(JOBS, build_job(task, on_gpu0, attempt=1, queue="q"), "ns"))
    parts.submit("u", gpuMemory="20Gi")
    await parts.loop.run_once()
    assert (reason(parts.status("u")), mib_on_gpus(parts)) == ("NoFit", {0: 20480})


async def test_an_adopted_job_whose_gpus_were_booked_since_is_deleted_not_believed() -> None:
    """409 on create: the task's Job exists on GPU 0, where another task was admitted since (20 + 20 GiB of 24): the
    Job is deleted and the task requeued (PlacementConflict, Warning Event); no GPU is booked over its memory."""
    parts = Parts()
    two_gpus(parts)
    parts.submit("u", gpuMemory="20Gi")
    await parts.loop.run_once()
    task = parts.submit("t", gpuMemory="20Gi")
    on_gpu0 = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 20480),))
    parts.client.put(JOBS, build_job(task, on_gpu0, attempt=1, queue="q"), "ns")  # the informer has not seen it
    await parts.loop.run_once()
    status = parts.status("t")
    events = [(e["type"], e["reason"]) for e in parts.client.all(EVENTS, "ns")
              if e["involvedObject"]["name"] == "t"]
    assert (status["phase"], reason(status, "Evicted"), events, sorted(j["metadata"]["name"] for j in
            parts.client.all(JOBS, "ns")), parts.controller.scheduler.violations()) == (
        "Pending", "PlacementConflict", [("Warning", "PlacementConflict")], ["u-1"], [])


async def test_a_job_that_completed_unseen_makes_its_waiting_task_succeeded() -> None:
    """A waiting task's Job (a lost create answer) is seen completed: the task is Succeeded, no Job is created or
    deleted, it never runs again."""
    parts = Parts()
    task = parts.submit("t", gpuMemory="8Gi", queueName="nowhere")
    on_gpu0 = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 8192),))
    job = parts.client.put(JOBS, {**build_job(task, on_gpu0, attempt=1, queue="q"),
                                  "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, "ns")
    parts.controller.on_job(job)
    await parts.loop.run_once()
    await parts.loop.run_once()
    status = parts.status("t")
    assert (status["phase"], status["jobName"], reason(status, "Finished"), parts.job_creates(),
            [j["metadata"]["name"] for j in parts.client.all(JOBS, "ns")]) == ("Succeeded", "t-1", "Succeeded", [],
                                                                               ["t-1"])


async def test_a_409_on_a_completed_job_finishes_the_task_instead_of_running_it_again() -> None:
    """The create is answered 409 by a Job of the task that already completed (unseen by the informer): the task is
    Succeeded at once, nothing holds the GPU, and the Job is never deleted for having no pod."""
    parts = Parts()
    task = parts.submit("t", gpuMemory="8Gi")
    on_gpu0 = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 8192),))
    parts.client.put(JOBS, {**build_job(task, on_gpu0, attempt=1, queue="q"),
                            "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, "ns")
    await parts.loop.run_once()
    assert (parts.status("t")["phase"], parts.controller.scheduler.cluster.reservations(),
            [j["metadata"]["name"] for j in parts.client.all(JOBS, "ns")]) == ("Succeeded", {}, ["t-1"])


def disrupted_pod(job: dict[str, Any], why: str) -> dict[str, Any]:
    """The pod of ``job`` as the system leaves it after a disruption: Failed, DisruptionTarget True with ``why``."""
    name = job["metadata"]["name"]
    return {
        "metadata": {"name": f"{name}-abcde", "namespace": "ns", "uid": f"pod-{name}",
                     "labels": {"gputask.io/task": "t", "batch.kubernetes.io/job-name": name},
                     "ownerReferences": [{"kind": "Job", "name": name}]},
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Failed", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": why,
             "message": "Taint manager: deleting due to NoExecute taint"}]},
    }


def failed(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with the Failed condition the Job controller sets when its only pod failed (backoffLimit 0)."""
    return {**job, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                              "message": "Job has reached the specified backoff limit"}]}}


async def test_a_pod_evicted_by_the_taint_manager_requeues_its_task_instead_of_failing_it() -> None:
    """The taint manager evicts the pod (DisruptionTarget DeletionByTaintManager) and the Job fails: the task is
    evicted with that reason (a Warning Event), counted as a reschedule, its Job deleted, and admitted again (the GPU
    has room beside the departing Job's hold) in the same pass, where Evicted turns False saying what it was."""
    parts = Parts()
    parts.submit("t", gpuMemory="8Gi")
    await parts.loop.run_once()
    (job,) = parts.client.all(JOBS, "ns")
    parts.controller.on_job(job)
    parts.controller.on_task_pod(disrupted_pod(job, "DeletionByTaintManager"), deleted=True)
    parts.controller.on_job(failed(job))
    await parts.loop.run_once()
    status = parts.status("t")
    message = ("pod t-1-abcde of Job t-1 was disrupted by the system (DeletionByTaintManager: Taint manager: "
               "deleting due to NoExecute taint); requeued")
    warnings = [(e["reason"], e["message"]) for e in parts.client.all(EVENTS, "ns") if e["type"] == "Warning"]
    evicted = next(c for c in status["conditions"] if c["type"] == "Evicted")
    assert (status["phase"], status["jobName"], (evicted["status"], evicted["reason"], evicted["message"]),
            status["reschedules"], warnings, [j["metadata"]["name"] for j in parts.client.all(JOBS, "ns")]) == (
        "Admitted", "t-2", ("False", "QuotaReserved", f"Previously: {message}"), 1,
        [("DeletionByTaintManager", message)], ["t-2"])


async def test_a_failed_job_fails_its_task_and_the_reason_column_says_so() -> None:
    """A Job that fails on its own (no disruption) makes the task Failed, and its Admitted condition (kubectl's
    REASON column) says JobFailed with the Job's reason, not Admitted."""
    parts = Parts()
    parts.submit("t", gpuMemory="8Gi")
    await parts.loop.run_once()
    (job,) = parts.client.all(JOBS, "ns")
    parts.controller.on_job(failed(job))
    await parts.loop.run_once()
    status = parts.status("t")
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert (status["phase"], admitted["status"], admitted["reason"], admitted["message"]) == (
        "Failed", "False", "JobFailed",
        "Job t-1 failed (BackoffLimitExceeded: Job has reached the specified backoff limit)")


async def test_a_served_delete_whose_answer_was_lost_is_confirmed_and_the_gpus_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Job DELETE is served but its answer lost: the delete is sent again after the backoff (here none), answered
    404, and only then is the departing Job's hold released."""
    monkeypatch.setattr(executor_module, "BACKOFF_BASE_S", 0.0)  # the retry is due at once
    parts = Parts()
    parts.submit("t", gpuMemory="20Gi")
    await parts.loop.run_once()
    feed_jobs(parts)
    parts.client.fail("delete", "jobs", served=True)
    parts.controller.scheduler.evict(TaskKey("ns/t"), "Preempted", "test eviction")
    await parts.loop.run_once()
    deletes = [call for call in parts.client.calls if call[:2] == ("delete", "jobs")]
    assert (deletes, parts.client.all(JOBS, "ns"), parts.controller.held, parts.executor.deletions) == (
        [("delete", "jobs", "t-1")] * 2, [], {}, {})


async def test_a_served_status_write_whose_answer_was_lost_is_read_again_and_written() -> None:
    """The status PATCH is served but its answer lost: the retry conflicts on the changed resourceVersion, reads the
    task again and writes; the status and its one Admitted Event end as if nothing was lost."""
    parts = Parts()
    parts.client.fail("patch-status", "gputasks", served=True)
    parts.submit("t", gpuMemory="8Gi")
    await parts.loop.run_once()
    await parts.executor.transitions.retry(now=float("inf"))
    status = parts.status("t")
    assert (status["phase"], status["jobName"], [e["reason"] for e in parts.client.all(EVENTS, "ns")],
            parts.executor.transitions.unwritten) == ("Admitted", "t-1", ["Admitted"], {})


async def test_a_task_evicted_while_its_create_is_unconfirmed_deletes_that_job_and_gets_a_new_name() -> None:
    """A task is preempted while its served-but-unanswered create is still unconfirmed: the Job it may have made is
    deleted (its GPUs held until it is gone), and the task's next admission creates a Job of the next attempt."""
    parts = Parts()
    parts.client.fail("create", "jobs", served=True)
    parts.submit("t", gpuMemory="20Gi")
    await parts.loop.run_once()
    parts.controller.scheduler.evict(TaskKey("ns/t"), "Preempted", "test eviction")
    await parts.loop.run_once()
    feed_jobs(parts)
    parts.controller.on_job_deleted({"metadata": {"name": "t-1", "namespace": "ns"}})  # its DELETED event
    await parts.loop.run_once()
    deletes = [name for verb, plural, name in parts.client.calls if (verb, plural) == ("delete", "jobs")]
    assert (parts.job_creates(), deletes, parts.status("t")["jobName"], parts.executor.creating,
            mib_on_gpus(parts)) == (["t-1", "t-2"], ["t-1"], "t-2", {}, {0: 20480})


async def test_a_pod_that_ran_before_the_lost_create_was_found_makes_the_adopted_task_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Job POST is served, its answer lost, and the Job's pod is Running before the lookup finds the Job: once
    the task is admitted with it, it is Running (its pod seen early), never evicted as PodsNotStarting."""
    monkeypatch.setattr(executor_module, "CONFIRM_RETRY_S", 60.0)  # the lookup waits: the pod runs before it
    parts = Parts()
    parts.client.fail("create", "jobs", served=True)
    parts.submit("t", gpuMemory="20Gi")
    await parts.loop.run_once()
    feed_jobs(parts)  # the Jobs informer sees t-1 ...
    job = await parts.client.get(JOBS, "t-1", "ns")
    parts.controller.on_task_pod(task_pod(job))  # ... and its pod Running, while the task does not name it yet
    for sent in parts.executor.creating.values():
        sent.retry_at = 0.0  # the lookup is due now
    await parts.loop.run_once()
    await parts.loop.run_once()
    status = parts.status("t")
    assert (status["phase"], status["jobName"], parts.job_creates()) == ("Running", "t-1", ["t-1"])
