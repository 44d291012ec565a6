"""The real kopf operator against the emulator: GPUTask in, pinned Job out, and back."""

from __future__ import annotations

from typing import Any

from gputask.k8s.client import GPUNODES, GPUTASKS, JOBS
from harness import Cluster, eventually, gpunode, gputask, job_of, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")


def job_view(job: dict[str, Any]) -> dict[str, Any]:
    """The parts of a stored Job the operator decides (server-set metadata dropped)."""
    meta = job["metadata"]
    keep = ("name", "namespace", "labels", "annotations", "ownerReferences")
    return {"metadata": {k: meta.get(k) for k in keep}, "spec": job["spec"]}


def status_view(task: dict[str, Any]) -> dict[str, Any]:
    """A GPUTask status without timestamps."""
    status = {k: v for k, v in (task.get("status") or {}).items() if k != "admittedAt"}
    status["conditions"] = [
        {k: c[k] for k in ("type", "status", "reason", "message")} for c in status.get("conditions") or []
    ]
    return status



async def test_gputask_becomes_a_job_pinned_to_its_node_and_gpu(cluster: Cluster) -> None:
    """Applying a GPUTask creates the exact pinned Job (its 12Gi per GPU told as its memory budget), Admitted status
    and an Admitted Event."""
    async with running_operator(cluster):
        await cluster.add_node("node-a", ("GPU-t4-0", "NVIDIA-T4", "16Gi"), ("GPU-t4-1", "NVIDIA-T4", "8Gi"))
        await cluster.add_queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": 2}])
        task = await cluster.submit(gputask("train", gpuMemory="12Gi"))
        uid = task["metadata"]["uid"]

        job = await eventually(lambda: job_of(cluster, "train-1"))

        annotation = '{"node":"node-a","uuids":["GPU-t4-0"],"indices":[0],"memoryMiB":[12288]}'
        labels = {"gputask.io/task": "train", "gputask.io/queue": "default"}
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                            ]
                        }
                    ]
                }
            }
        }
        assert job_view(job) == {
            "metadata": {
                "name": "train-1",
                "namespace": "default",
                "labels": labels,
                "annotations": {
                    "gputask.io/placement": annotation,
                    "gputask.io/attempt": "1",
                    "gputask.io/task-uid": uid,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "gputask.io/v1alpha1",
                        "kind": "GPUTask",
                        "name": "train",
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": labels, "annotations": {"gputask.io/placement": annotation}},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox:1.36",
                                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-t4-0"},
                                        {"name": "GPUTASK_GPU_MEMORY_MIB", "value": "12288"}],
                            }
                        ],
                        "affinity": affinity,
                        "restartPolicy": "Never",
                    },
                },
            },
        }

        async def admitted() -> dict[str, Any] | None:
            found = await cluster.task("train")
            return found if (found.get("status") or {}).get("phase") == "Admitted" else None

        message = "Admitted by GPUClusterQueue 'default' on node-a GPUs [0] (12288 MiB each)"
        assert status_view(await eventually(admitted)) == {
            "phase": "Admitted",
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "quota reserved in 'default'",
                },
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": message},
            ],
            "placement": {"node": "node-a", "gpus": [{"index": 0, "uuid": "GPU-t4-0", "memory": 12288}]},
            "attempt": 1,
            "reschedules": 0,
            "jobName": "train-1",
            "priority": 0,
            "queue": "default",
            "gpuMemory": "12Gi",
            "podsSummary": "1x1 on 1 node",
            "observedGeneration": 1,
            "message": message,
        }
        assert await eventually(lambda: cluster.events_for("train")) == [("Normal", "Admitted", message)]


async def test_deleting_a_task_frees_its_gpu_for_the_next(cluster: Cluster) -> None:
    """A second task waits with reason NoFit; deleting the first GCs its Job and admits the second there."""
    async with running_operator(cluster):
        await cluster.add_node("node-a", A10)
        await cluster.add_queue()
        await cluster.submit(gputask("first", gpuMemory="20Gi"))
        await eventually(lambda: job_of(cluster, "first-1"))
        await cluster.submit(gputask("second", gpuMemory="20Gi"))

        async def waiting() -> list[tuple[str, str, str]]:
            return await cluster.events_for("second")

        reason = ("Normal", "NoFit", "0/1 nodes fit: 1 no GPU with 20480 MiB free")
        assert await eventually(waiting) == [reason]
        pending = await cluster.task("second")
        assert [(c["type"], c["status"], c["reason"]) for c in pending["status"]["conditions"]] == [
            ("QuotaReserved", "False", "NoFit"),
            ("Admitted", "False", "NoFit"),
        ]

        await cluster.client.delete(GPUTASKS, "first", "default")
        second_job = await eventually(lambda: job_of(cluster, "second-1"))

        assert await job_of(cluster, "first-1") is None
        assert second_job["metadata"]["annotations"]["gputask.io/placement"] == (
            '{"node":"node-a","uuids":["GPU-a10-0"],"indices":[0],"memoryMiB":[20480]}'
        )


async def test_invalid_spec_fails_with_a_reason_and_blocks_nothing(cluster: Cluster) -> None:
    """A task with both gpuMemory and gpuFraction goes Failed/InvalidSpec with a Warning Event; the next task runs."""
    async with running_operator(cluster):
        await cluster.add_node("node-a", A10)
        await cluster.add_queue()
        await cluster.submit(gputask("bad", gpuMemory="1Gi", gpuFraction="0.5"))
        await cluster.submit(gputask("good", gpuMemory="1Gi"))

        await eventually(lambda: job_of(cluster, "good-1"))

        async def failed() -> dict[str, Any] | None:
            found = await cluster.task("bad")
            return found if (found.get("status") or {}).get("phase") == "Failed" else None

        message = "set at most one of spec.gpuMemory and spec.gpuFraction"
        bad = await eventually(failed)
        assert (bad["status"]["conditions"][0]["reason"], bad["status"]["message"]) == ("InvalidSpec", message)
        assert await eventually(lambda: cluster.events_for("bad")) == [("Warning", "InvalidSpec", message)]
        assert await job_of(cluster, "bad-1") is None


async def test_finished_job_releases_gpus_and_task_succeeds(cluster: Cluster) -> None:
    """When the Job completes the task goes Succeeded and its GPU memory admits the waiting task."""
    async with running_operator(cluster):
        await cluster.add_node("node-a", A10)
        await cluster.add_queue()
        await cluster.submit(gputask("first"))
        await eventually(lambda: job_of(cluster, "first-1"))
        await cluster.submit(gputask("second"))
        complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
        await cluster.client.patch(JOBS, "first-1", complete, "default", status=True)

        await eventually(lambda: job_of(cluster, "second-1"))

        first = await cluster.task("first")
        assert (first["status"]["phase"], first["status"]["message"]) == ("Succeeded", "Job first-1 completed")


async def test_restarted_operator_rebuilds_state_and_never_double_books(cluster: Cluster) -> None:
    """After a restart the running task keeps its GPU: a new whole-GPU task waits instead of sharing it."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("first", gpuMemory="4Gi"))
        await eventually(lambda: job_of(cluster, "first-1"))
    async with running_operator(cluster) as second:
        await cluster.submit(gputask("whole"))

        async def reason() -> list[tuple[str, str, str]]:
            return await cluster.events_for("whole")

        assert await eventually(reason) == [("Normal", "NoFit", "0/1 nodes fit: 1 no idle GPU")]
        assert [j["metadata"]["name"] for j in await cluster.client.list(JOBS, "default")] == ["first-1"]
        assert second.controller.scheduler.placement_of("default/first") is not None


async def test_memory_used_outside_gputask_is_not_overcommitted(cluster: Cluster) -> None:
    """A GPU whose reported use (20Gi, none of it ours) leaves too little room gets no 10Gi task; the idle GPU does."""
    async with running_operator(cluster):
        await cluster.add_node("node-a", ("GPU-busy", "NVIDIA-A10", "24Gi"), ("GPU-idle", "NVIDIA-A10", "24Gi"))
        body = gpunode("node-a", ("GPU-busy", "NVIDIA-A10", "24Gi"), ("GPU-idle", "NVIDIA-A10", "24Gi"))
        body["status"]["gpus"][0]["memoryUsed"] = "20Gi"
        await cluster.client.patch(GPUNODES, "node-a", {"status": body["status"]}, status=True)
        await cluster.add_queue()
        await cluster.submit(gputask("t", gpuMemory="10Gi"))

        job = await eventually(lambda: job_of(cluster, "t-1"))

        assert job["metadata"]["annotations"]["gputask.io/placement"] == (
            '{"node":"node-a","uuids":["GPU-idle"],"indices":[1],"memoryMiB":[10240]}'
        )


async def test_an_edit_of_an_admitted_task_applies_at_its_next_admission(cluster: Cluster) -> None:
    """Editing gpuMemory of a running task posts SpecChangeIgnored and leaves its Job alone; once the
    task is requeued (its Job deleted) it is admitted again with the new size, for the new generation."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("t", gpuMemory="2Gi"))
        await eventually(lambda: job_of(cluster, "t-1"))
        await cluster.client.patch(GPUTASKS, "t", {"spec": {"gpuMemory": "6Gi"}}, "default")

        async def warned() -> list[tuple[str, str, str]]:
            return [e for e in await cluster.events_for("t") if e[0] == "Warning"]

        message = (
            "spec changed while Job t-1 runs: it applies at the task's next admission (after an eviction); "
            "delete and re-create the GPUTask to apply it now"
        )
        assert await eventually(warned) == [("Warning", "SpecChangeIgnored", message)]
        assert [j["metadata"]["name"] for j in await cluster.client.list(JOBS, "default")] == ["t-1"]
        await cluster.client.delete(JOBS, "t-1", "default")
        job = await eventually(lambda: job_of(cluster, "t-2"))
        status = (await cluster.task("t"))["status"]
        observed = {c["type"]: c["observedGeneration"] for c in status["conditions"]}
        assert (job["metadata"]["annotations"]["gputask.io/placement"], status["gpuMemory"],
                status["observedGeneration"], observed["Admitted"]) == (
            '{"node":"node-a","uuids":["GPU-a10-0"],"indices":[0],"memoryMiB":[6144]}', "6Gi", 2, 2
        )  # fmt: skip


async def test_pending_tasks_report_their_queue_position(cluster: Cluster) -> None:
    """Waiting tasks report positions 0, 1, 2; when the head is admitted the rest move up, without new Events."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("running"))
        await eventually(lambda: job_of(cluster, "running-1"))
        for name in ("w0", "w1", "w2"):
            await cluster.submit(gputask(name))

        async def positions() -> dict[str, Any] | None:
            found = {n: ((await cluster.task(n)).get("status") or {}).get("queuePosition") for n in ("w0", "w1", "w2")}
            return found if found == {"w0": 0, "w1": 1, "w2": 2} else None

        await eventually(positions)
        await cluster.client.delete(GPUTASKS, "running", "default")
        await eventually(lambda: job_of(cluster, "w0-1"))

        async def moved() -> dict[str, Any] | None:
            found = {n: ((await cluster.task(n)).get("status") or {}).get("queuePosition") for n in ("w1", "w2")}
            return found if found == {"w1": 0, "w2": 1} else None

        await eventually(moved)
        assert await cluster.events_for("w2") == [("Normal", "NoFit", "0/1 nodes fit: 1 no idle GPU")]


async def test_a_task_recreated_under_the_same_name_is_a_new_task(cluster: Cluster) -> None:
    """Delete and re-create a task at once: the new one gets its own Job (its uid), never the old one's."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        old = await cluster.submit(gputask("t", gpuMemory="4Gi"))
        await eventually(lambda: job_of(cluster, "t-1"))
        await cluster.client.delete(GPUTASKS, "t", "default")
        new = await cluster.submit(gputask("t", gpuMemory="8Gi"))

        async def new_job() -> dict[str, Any] | None:
            job = await job_of(cluster, "t-1")
            uid = job and job["metadata"]["annotations"]["gputask.io/task-uid"]
            return job if uid == new["metadata"]["uid"] else None

        job = await eventually(new_job)
    assert old["metadata"]["uid"] != new["metadata"]["uid"]
    assert job["metadata"]["annotations"]["gputask.io/placement"] == (
        '{"node":"node-a","uuids":["GPU-a10-0"],"indices":[0],"memoryMiB":[8192]}'
    )
