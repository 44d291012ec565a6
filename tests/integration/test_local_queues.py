"""GPULocalQueues through the real operator and the emulated API: resolution, status, deprecation, deletion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import crdschema
from gputask.config import Config
from gputask.k8s.client import GPULOCALQUEUES, GPUTASKS, JOBS, NotFound
from harness import Cluster, eventually, gputask, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")
FAST = Config(cycleInterval=0.2)
ACTIVE = ("True", "Ready", "Can admit new tasks")
ROOT = Path(__file__).resolve().parents[2]
COLUMNS = yaml.safe_load((ROOT / "crds" / "gputask.io_gpulocalqueues.yaml").read_text())["spec"]["versions"][0][
    "additionalPrinterColumns"
]


def condition(obj: dict[str, Any], ctype: str) -> tuple[str, str, str] | None:
    """(status, reason, message) of a status condition, or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return cond["status"], cond["reason"], cond["message"]
    return None


async def test_tasks_name_local_queues_and_each_reports_its_own_tasks(cluster: Cluster) -> None:
    """Two namespaces, a LocalQueue "gpus" in each, pointing at two GPUClusterQueues: each task is admitted
    and charged by its own GPUClusterQueue; each LocalQueue's status counts its tasks and usage, as
    `kubectl get glq` prints it; no deprecation Event."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue("team-a", local_in=())
    await cluster.add_queue("team-b", local_in=())
    await cluster.add_local_queue("gpus", "team-a", "team-a")
    await cluster.add_local_queue("gpus", "team-b", "team-b")
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("a", namespace="team-a", queueName="gpus", gpuMemory="12Gi"))
        await cluster.submit(gputask("b", namespace="team-b", queueName="gpus", gpuMemory="8Gi"))
        await cluster.submit(gputask("c", namespace="team-b", queueName="gpus", gpuMemory="20Gi"))  # no room

        async def reported() -> dict[str, Any] | None:
            lq = await cluster.client.get(GPULOCALQUEUES, "gpus", "team-b")
            return lq if (lq.get("status") or {}).get("pendingTasks") == 1 else None

        team_b = await eventually(reported)
        team_a = await cluster.client.get(GPULOCALQUEUES, "gpus", "team-a")
        statuses = [(await cluster.task(n, ns))["status"] for n, ns in (("a", "team-a"), ("b", "team-b"))]
        job = await cluster.client.get(JOBS, "b-1", "team-b")
        events = await cluster.events_for("a", "team-a") + await cluster.events_for("b", "team-b")
    columns = {k: v for k, v in crdschema.column_values(COLUMNS, team_b).items() if k != "Age"}
    assert (columns, condition(team_b, "Active")) == (
        {"ClusterQueue": "team-b", "Pending": 1, "Admitted": 1, "GPU usage": "334m"},
        ("True", "Ready", "Can admit new tasks"),
    )
    assert team_a["status"]["usage"] == [{"name": "gputask.io/gpu-memory", "total": "12288Mi"},
                                         {"name": "nvidia.com/gpu", "total": "500m"}]
    assert ([s["queue"] for s in statuses], job["metadata"]["labels"]["gputask.io/queue"]) == (
        ["team-a", "team-b"], "team-b",
    )  # fmt: skip
    assert [e[1] for e in events] == ["Admitted", "Admitted"]


async def test_naming_a_cluster_queue_directly_works_with_one_deprecation_warning(cluster: Cluster) -> None:
    """No GPULocalQueue of that name in the namespace: the GPUClusterQueue of that name admits the task,
    and one Warning Event says the form is deprecated and what to create instead."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue("legacy", local_in=())
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("t", queueName="legacy", gpuMemory="4Gi"))

        async def admitted() -> list[tuple[str, str, str]] | None:
            events = await cluster.events_for("t")
            return events if {e[1] for e in events} >= {"Admitted", "DeprecatedQueueName"} else None

        events = await eventually(admitted)
    assert sorted(events, key=lambda e: e[1]) == [  # (posted in either order: the warning is queued with the
        # conversion, the admission may come from a cycle already running)
        ("Normal", "Admitted", "Admitted by GPUClusterQueue 'legacy' on node-a GPUs [0] (4096 MiB each)"),
        ("Warning", "DeprecatedQueueName",
         "the queue name 'legacy' is a GPUClusterQueue, not a GPULocalQueue of namespace 'default': naming a "
         "GPUClusterQueue directly is deprecated and stops working in the next release; create a GPULocalQueue "
         "'legacy' in 'default' with spec.clusterQueue: legacy"),
    ]  # fmt: skip


async def test_a_task_applied_before_its_local_queue_waits_then_is_admitted(cluster: Cluster) -> None:
    """GitOps order: the task first. It is Pending with QueueNotFound (not Failed, no retry loop); the
    LocalQueue's creation admits it."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue("default", local_in=())
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("t", queueName="gpus", gpuMemory="4Gi"))

        async def waiting() -> tuple[str, str, str] | None:
            return condition(await cluster.task("t"), "Admitted")

        waits = await eventually(waiting)
        await cluster.add_local_queue("gpus", "default", "default")

        async def admitted() -> dict[str, Any] | None:
            status = (await cluster.task("t")).get("status") or {}
            return status if status.get("phase") == "Admitted" else None

        status = await eventually(admitted)
    assert (waits, status["queue"]) == (
        ("False", "QueueNotFound", "GPULocalQueue default/gpus does not exist (nor a GPUClusterQueue 'gpus', "
                                   "which a task may name directly until the next release)"),
        "default",
    )


async def test_a_local_queue_with_admitted_tasks_goes_only_once_they_finish(cluster: Cluster) -> None:
    """The queue-in-use finalizer on a GPULocalQueue: deleted while a task of it runs, it stays Terminating,
    admits nothing new (its waiting task says so), and goes when that task's Job completes."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue("default", local_in=())
    await cluster.add_local_queue("gpus", "default", "default")
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("running", queueName="gpus", gpuMemory="12Gi"))
        await eventually(lambda: _exists(cluster, JOBS, "running-1"))

        async def finalized() -> list[str] | None:
            meta = (await cluster.client.get(GPULOCALQUEUES, "gpus", "default"))["metadata"]
            return meta.get("finalizers") or None

        assert await eventually(finalized) == ["gputask.io/queue-in-use"]
        await cluster.client.delete(GPULOCALQUEUES, "gpus", "default")
        await cluster.submit(gputask("late", queueName="gpus", gpuMemory="4Gi"))

        async def late_waits() -> tuple[str, str, str] | None:
            found = condition(await cluster.task("late"), "Admitted")
            return found if found is not None and found[1] == "QueueInactive" else None

        waits = await eventually(late_waits)

        async def inactive() -> tuple[str, str, str] | None:
            found = condition(await cluster.client.get(GPULOCALQUEUES, "gpus", "default"), "Active")
            return found if found is not None and found[0] == "False" else None

        active = await eventually(inactive)
        complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
        await cluster.client.patch(JOBS, "running-1", complete, "default", status=True)

        async def gone() -> bool | None:
            return None if await _exists(cluster, GPULOCALQUEUES, "gpus") else True

        assert await eventually(gone)
        finished = (await cluster.client.get(GPUTASKS, "running", "default"))["status"]["phase"]
    assert (waits, active, finished) == (
        ("False", "QueueInactive", "GPULocalQueue default/gpus is being deleted: it admits nothing new"),
        ("False", "Terminating", "being deleted: admits nothing new; goes once its admitted tasks finish"),
        "Succeeded",
    )


async def _exists(cluster: Cluster, resource: Any, name: str) -> bool | None:
    try:
        await cluster.client.get(resource, name, "default")
    except NotFound:
        return None
    return True


async def test_a_local_queue_deleted_and_re_created_by_that_name_gets_its_status_again(cluster: Cluster) -> None:
    """The status last written is remembered per queue name only while the queue exists: a queue
    re-created by the same name, whose status would equal the old one, is written anew."""
    await cluster.add_queue("default", local_in=())
    await cluster.add_local_queue("gpus", "default", "default")
    async with running_operator(cluster, FAST):

        async def reported() -> dict[str, Any] | None:
            try:
                lq = await cluster.client.get(GPULOCALQUEUES, "gpus", "default")
            except NotFound:
                return None
            return lq.get("status") or None

        first = await eventually(reported)
        await cluster.client.delete(GPULOCALQUEUES, "gpus", "default")

        async def gone() -> bool | None:
            return None if await _exists(cluster, GPULOCALQUEUES, "gpus") else True

        await eventually(gone)
        await cluster.add_local_queue("gpus", "default", "default")

        async def ready() -> dict[str, Any] | None:  # (a write for the old one may land first: it is corrected)
            status = await reported()
            return status if status and condition({"status": status}, "Active") == ACTIVE else None

        second = await eventually(ready)
    assert (condition({"status": first}, "Active"), first["pendingTasks"], second["pendingTasks"]) == (ACTIVE, 0, 0)
