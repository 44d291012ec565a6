"""The real operator when one of its running Jobs loses its ``gputask.io/task`` label (kubectl, a GitOps prune, a
webhook): a real API server's watch sends it as DELETED, exactly as a deletion; the Job keeps its GPUs, the label
comes back and the task says so, across a watch, a relisting after 410 and a restart; a Job really deleted still
frees its GPUs."""

from __future__ import annotations

from typing import Any

from gputask.config import Config
from gputask.k8s.client import JOBS
from gputask.k8s.handlers import Operator
from gputask.k8s.relabel import LABEL_RESTORED
from harness import Cluster, eventually, gputask, job_of, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")
FAST = Config(cycleInterval=0.2)
UNLABEL = {"metadata": {"labels": {"gputask.io/task": None}}}
RESTORED = ("Warning", LABEL_RESTORED, "label gputask.io/task was removed from Job first-1 while it held its GPUs; "
            "restored (the Job keeps its GPUs; without the label gputask would lose sight of it)")


async def started(cluster: Cluster) -> None:
    """One node with one A10 and a queue; ``first`` is admitted on the GPU (Job first-1), then ``second``, which
    needs that GPU too, is submitted and waits."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    await cluster.submit(gputask("first"))
    await eventually(lambda: job_of(cluster, "first-1"))
    await cluster.submit(gputask("second"))


async def labelled_again(cluster: Cluster) -> dict[str, Any] | None:
    """Job first-1 once it carries the task label again."""
    job = await job_of(cluster, "first-1")
    return job if job is not None and "gputask.io/task" in (job["metadata"].get("labels") or {}) else None


async def after_cycles(operator: Operator, count: int = 3) -> None:
    """Return once the scheduling loop has run ``count`` more cycles."""
    target = operator.loop.cycles + count

    async def ran() -> bool:
        return operator.loop.cycles >= target

    await eventually(ran)


async def outcome(cluster: Cluster, operator: Operator) -> tuple[Any, ...]:
    """What the tests compare: first's phase and attempt, whether second has a Job and its phase, the label's
    value on first-1, whether the operator holds first-1's GPU, and the Warnings on first."""
    first, second = (await cluster.task("first"))["status"], (await cluster.task("second")).get("status") or {}
    job = await job_of(cluster, "first-1")
    assert job is not None
    warnings = [e for e in await cluster.events_for("first") if e[0] == "Warning"]
    return (first["phase"], first["attempt"], await job_of(cluster, "second-1") is not None, second.get("phase"),
            job["metadata"]["labels"].get("gputask.io/task"), operator.controller.holds_gpus("default/first-1"),
            warnings)


KEPT = ("Admitted", 1, False, "Pending", "first", True, [RESTORED])


async def test_a_running_jobs_label_removed_keeps_its_gpu_and_is_put_back(cluster: Cluster) -> None:
    """A running task's Job loses its label: its GPU stays booked (the task waiting for it still waits), the label
    comes back with a Warning Event on the task, and the task is neither requeued nor given a second Job."""
    async with running_operator(cluster, FAST) as operator:
        await started(cluster)
        await after_cycles(operator)
        await cluster.client.patch(JOBS, "first-1", UNLABEL, "default")
        await eventually(lambda: labelled_again(cluster))
        await after_cycles(operator)
        assert (await outcome(cluster, operator), operator.executor.relabel.restored) == (KEPT, 1)


async def test_a_label_removed_during_a_watch_gap_is_found_at_the_relisting(cluster: Cluster) -> None:
    """The label is removed while the jobs watch is down and the history it would resume from is compacted: the
    relisting after 410 misses the Job, the operator finds it by name, keeps its GPU and puts the label back."""
    emulator = cluster.server.emulator
    async with running_operator(cluster, FAST) as operator:
        await started(cluster)
        await after_cycles(operator)
        emulator.inject("GET", "/apis/batch/v1/jobs", 500)  # the jobs watch, opened again, is refused once
        refusal = emulator.injected[-1]
        emulator.close_watches()

        async def refused() -> bool:
            return refusal.times == 0

        await eventually(refused)  # the informer waits its backoff before watching again
        await cluster.client.patch(JOBS, "first-1", UNLABEL, "default")
        emulator.compact()
        await eventually(lambda: labelled_again(cluster))
        await after_cycles(operator)
        assert (await outcome(cluster, operator), operator.informers["jobs"].relists) == (KEPT, 1)


async def test_a_restart_while_the_label_is_missing_books_nothing_twice(cluster: Cluster) -> None:
    """The label is removed while no operator runs: the next one's labelled listing misses the Job, yet it finds it
    by the name first's status gives, books its GPU for it alone, and puts the label back."""
    async with running_operator(cluster, FAST) as operator:
        await started(cluster)
        await after_cycles(operator)
    await cluster.client.patch(JOBS, "first-1", UNLABEL, "default")
    async with running_operator(cluster, FAST) as operator:
        await eventually(lambda: labelled_again(cluster))
        await after_cycles(operator)
        assert await outcome(cluster, operator) == KEPT


async def test_a_job_really_deleted_still_frees_its_gpu_and_requeues_its_task(cluster: Cluster) -> None:
    """A running task's Job deleted (its DELETED looks like a label's removal): the server says it is gone, so
    its GPU is freed and the task requeued (JobDeleted, its Warning Event) and admitted again as attempt 2, which
    turns Evicted False ("Previously: ..."); no label Event."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, FAST) as operator:
        await cluster.submit(gputask("first"))
        await eventually(lambda: job_of(cluster, "first-1"))
        await after_cycles(operator)
        await cluster.client.delete(JOBS, "first-1", "default")
        await eventually(lambda: job_of(cluster, "first-2"))

        async def readmitted() -> dict[str, Any] | None:
            status = (await cluster.task("first")).get("status") or {}
            return status if status.get("attempt") == 2 and status.get("phase") == "Admitted" else None

        status = await eventually(readmitted)
        evicted = next(c for c in status["conditions"] if c["type"] == "Evicted")
        reasons = [e[1] for e in await cluster.events_for("first") if e[0] == "Warning"]
        assert ((evicted["status"], evicted["reason"], evicted["message"]), "JobDeleted" in reasons,
                LABEL_RESTORED in reasons, operator.executor.relabel.lost) == (
            ("False", "QuotaReserved", "Previously: Job first-1 was deleted while the task ran; requeued"), True,
            False, {})
