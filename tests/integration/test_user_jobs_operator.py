"""Existing Jobs through the real operator on the emulator (issue 31): a labelled Job gets its GPUTask, stays
suspended until admitted, is admitted with its placement written in and unsuspended, is preempted by suspending
it and restoring its template, and its completion frees its GPU; an unlabelled Job never sees a write of ours.

The emulator has no admission webhooks and no Job controller: the Jobs here are written as the webhook leaves them
(:func:`~gputask.k8s.userjobs.mutate_job`), or unsuspended to show the operator's suspension on sight."""

from __future__ import annotations

import copy
import json
from typing import Any

from gputask.k8s.client import EVENTS, GPUTASKS, JOBS, PRIORITYCLASSES
from gputask.k8s.userjobs import mutate_job
from harness import Cluster, eventually, gputask, job_of, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")


def labelled_job(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"gputask.io/queue-name": "default", **labels}},
            "spec": {"template": {"metadata": {"labels": {"app": name}}, "spec": {
                "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": "node-a"},
                "containers": [{"name": "main", "image": "busybox",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


async def test_a_labelled_job_is_admitted_preempted_restored_and_completed(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.add_node("node-a", A10)
        await cluster.add_queue(preemption={"withinClusterQueue": "LowerPriority"})
        plain = copy.deepcopy(labelled_job("plain"))
        del plain["metadata"]["labels"]["gputask.io/queue-name"]
        plain = await cluster.client.create(JOBS, plain, "default")
        written = mutate_job(labelled_job("train"))
        stored = await cluster.client.create(JOBS, written, "default")
        assert stored["spec"]["suspend"] is True  # as the webhook leaves it

        async def admitted() -> dict[str, Any] | None:
            job = await job_of(cluster, "train")
            return job if job is not None and job["spec"].get("suspend") is False else None

        job = await admitted_job(admitted)
        task = await cluster.task("job-train")
        owner = task["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "Job", "train", stored["metadata"]["uid"], True)
        assert task["spec"]["workloadRef"] == {"apiVersion": "batch/v1", "kind": "Job", "name": "train"}
        template = job["spec"]["template"]
        assert template["metadata"]["annotations"]["gputask.io/visible-devices"] == "GPU-a10-0"
        pin = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
        assert template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"] == [{"matchFields": [pin]}]
        assert json.loads(job["metadata"]["annotations"]["gputask.io/placement"])["uuids"] == ["GPU-a10-0"]

        # a higher-priority GPUTask preempts it: suspended, its template exactly as written, requeued
        await cluster.client.create(
            PRIORITYCLASSES,
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"},
             "value": 1000})
        await cluster.submit(gputask("urgent", priorityClassName="high"))

        async def suspended_again() -> dict[str, Any] | None:  # suspended, then its template restored: two writes
            found = await job_of(cluster, "train")
            return found if found is not None and found["spec"].get("suspend") is True and found["spec"][
                "template"] == stored["spec"]["template"] else None

        evicted = await eventually(suspended_again, 20)
        assert evicted["spec"]["template"] == stored["spec"]["template"]
        assert "gputask.io/task-uid" not in evicted["metadata"]["annotations"]
        urgent_job = await eventually(lambda: job_of(cluster, "urgent-1"), 20)
        # the urgent task completes: its GPU goes back to the Job, admitted again
        complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
        await cluster.client.patch(JOBS, urgent_job["metadata"]["name"], complete, "default", status=True)
        again = await admitted_job(admitted)
        assert again["metadata"]["annotations"]["gputask.io/attempt"] == "2"
        await cluster.client.patch(JOBS, "train", complete, "default", status=True)

        async def succeeded() -> dict[str, Any] | None:
            found = await cluster.task("job-train")
            return found if (found.get("status") or {}).get("phase") == "Succeeded" else None

        await eventually(succeeded, 20)
        untouched = await cluster.client.get(JOBS, "plain", "default")
        assert untouched["metadata"]["resourceVersion"] == plain["metadata"]["resourceVersion"]
        assert [t for t in await cluster.client.list(GPUTASKS, "default")
                if t["metadata"]["name"] == "job-plain"] == []


async def admitted_job(probe: Any) -> dict[str, Any]:
    return await eventually(probe, 20)


async def test_a_labelled_job_created_unsuspended_is_suspended_with_a_warning(cluster: Cluster) -> None:
    """Without the webhook: suspended when seen, a Warning Event says its pods may have started, and (its
    container still asking the device plugin for a GPU) it waits with NotAdmissible rather than run on GPUs gputask
    did not choose."""
    async with running_operator(cluster):
        await cluster.add_node("node-a", A10)
        await cluster.add_queue()
        await cluster.client.create(JOBS, labelled_job("late"), "default")

        async def suspended() -> dict[str, Any] | None:
            job = await job_of(cluster, "late")
            return job if job is not None and job["spec"].get("suspend") is True else None

        await eventually(suspended)

        async def reasons() -> list[str] | None:
            found = [e["reason"] for e in await cluster.client.list(EVENTS, "default")
                     if e["involvedObject"].get("kind") == "Job" and e["involvedObject"].get("name") == "late"]
            return found if len(found) >= 2 else None

        assert sorted(await eventually(reasons)) == ["NotAdmissible", "SuspendedOnSight"]
