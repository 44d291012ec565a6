"""The Relabeler on the fake client: a booked Job that lost its task label is confirmed with the server before
anything is released, labelled again (retried after a backoff when refused), and released once really gone."""

from __future__ import annotations

from typing import Any

from test_adapter import Parts

from gputask.k8s.client import EVENTS, JOBS
from gputask.k8s.relabel import LABEL_REMOVED, LABEL_RESTORED, backoff_s

UNLABEL = {"metadata": {"labels": {"gputask.io/task": None}}}


async def running(parts: Parts) -> dict[str, Any]:
    """Task ``t`` admitted with its Job ``t-1`` fed back as the watch would; returns the Job."""
    parts.submit("t", gpus=1)
    await parts.loop.run_once()
    job = parts.client.all(JOBS, "ns")[0]
    parts.controller.on_job(job)
    return job


def warnings(parts: Parts) -> list[str]:
    """Reasons of the Warning Events posted, in the order they were posted."""
    events = sorted(parts.client.all(EVENTS, "ns"), key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e["reason"] for e in events if e["type"] == "Warning"]


def label_patches(parts: Parts) -> int:
    """How many patches of Job t-1 were sent (the test's own removal of the label included)."""
    return sum(1 for call in parts.client.calls if call == ("patch", "jobs", "t-1"))


async def test_a_refused_relabel_keeps_the_gpus_and_is_tried_again_only_after_its_backoff() -> None:
    """A patch putting the label back that is refused keeps the Job booked, posts one JobLabelRemoved Warning and
    is not sent again before its backoff (no hot loop); once due, it is sent, the label is back, and the task gets
    a JobLabelRestored Warning."""
    parts = Parts()
    job = await running(parts)
    await parts.client.patch(JOBS, "t-1", UNLABEL, "ns")
    parts.executor.relabel.doubt(parts.controller.jobs["ns/t-1"], job)  # its DELETED, as the watch sends it
    parts.client.fail("patch", "jobs", "t-1", status=403, message="denied by policy")
    relabel = parts.executor.relabel
    await relabel.settle()
    await relabel.settle()  # not due yet: nothing is sent
    lost = relabel.lost["ns/t-1"]
    refused = (label_patches(parts), lost.failures, lost.found, parts.controller.holds_gpus("ns/t-1"), warnings(parts))
    lost.retry_at = 0.0  # its backoff has passed
    await relabel.settle()
    stored = parts.client.all(JOBS, "ns")[0]["metadata"]["labels"]
    assert (refused, label_patches(parts), stored["gputask.io/task"], relabel.lost, warnings(parts)) == (
        (2, 1, True, True, [LABEL_REMOVED]), 3, "t", {}, [LABEL_REMOVED, LABEL_RESTORED])


async def test_a_job_deleted_while_unlabelled_is_released_when_the_relabel_finds_it_gone() -> None:
    """A Job that lost its label and is then deleted (no watch says so) is released when the patch putting the
    label back is answered 404: the task is requeued as for any deleted Job."""
    parts = Parts()
    job = await running(parts)
    await parts.client.patch(JOBS, "t-1", UNLABEL, "ns")
    relabel = parts.executor.relabel
    relabel.doubt(parts.controller.jobs["ns/t-1"], job)
    parts.client.fail("patch", "jobs", "t-1", status=500)
    await relabel.settle()  # confirmed there, relabel refused: kept
    kept = parts.controller.holds_gpus("ns/t-1")
    await parts.client.delete(JOBS, "t-1", "ns")
    relabel.lost["ns/t-1"].retry_at = 0.0
    await relabel.settle()
    record = parts.controller.tasks[next(iter(parts.controller.tasks))]
    assert (kept, parts.controller.holds_gpus("ns/t-1"), "ns/t-1" in parts.controller.jobs, relabel.lost,
            record.key in parts.controller.scheduler.pending) == (True, False, False, {}, True)


async def test_the_label_is_put_back_on_the_same_job_only() -> None:
    """A Job of the same name re-created (another uid) is not ours: the GET says the old one is gone, it is
    released, and the new one is never patched."""
    parts = Parts()
    job = await running(parts)
    relabel = parts.executor.relabel
    await parts.client.delete(JOBS, "t-1", "ns")
    await parts.client.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t-1"}}, "ns")
    relabel.doubt(parts.controller.jobs["ns/t-1"], job)
    await relabel.settle()
    assert (label_patches(parts), parts.controller.holds_gpus("ns/t-1"), relabel.lost) == (0, False, {})


def test_the_backoff_doubles_from_one_second_to_five_minutes() -> None:
    """Refused relabels wait 1 s, 2 s, 4 s ... at most 300 s."""
    assert [backoff_s(n) for n in (1, 2, 3, 9, 10, 20)] == [1.0, 2.0, 4.0, 256.0, 300.0, 300.0]
