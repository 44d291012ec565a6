"""Faults an operator meets on a real cluster, through the real kopf operator (the reliability issue).

A GPUNode deleted while its Node is healthy, a grace period that a restart must not reset, and
GPUNode reports that lie (a UUID on two nodes, more GPUs than the Node's allocatable, memory used
above total, a heartbeat in the future): each is refused or waited out, never believed at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from kubernetes import client as k8s_client

from gputask.config import Config
from gputask.k8s.client import EVENTS, GPUNODES, GPUTASKS, JOBS, LEASES, NODES, PODS, ApiError, KubeClient, NotFound
from gputask.k8s.main import build_operator, run_operator
from harness import Cluster, eventually, gpunode, gputask, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")


def ago(seconds: float) -> str:
    """An RFC 3339 time ``seconds`` in the past (negative: in the future)."""
    moment = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


async def job_exists(cluster: Cluster, name: str) -> bool:
    """True when the Job exists and is not being deleted."""
    try:
        job = await cluster.client.get(JOBS, name, "default")
    except NotFound:
        return False
    return not job["metadata"].get("deletionTimestamp")


async def evicted_reason(cluster: Cluster, name: str) -> str | None:
    """The reason of the task's Evicted condition, once it has one."""
    status = (await cluster.task(name)).get("status") or {}
    found = [c["reason"] for c in status.get("conditions") or [] if c["type"] == "Evicted"]
    return found[0] if found else None


async def test_a_deleted_gpunode_on_a_healthy_node_gets_the_grace_period(cluster: Cluster) -> None:
    """The agent's GPUNode disappears and comes back within the grace period: the running task stays;
    gone for longer than the grace period, its tasks are evicted (NodeFailure)."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2, nodeFailureGracePeriod=2)):
        await cluster.submit(gputask("t", gpuMemory="4Gi"))
        assert await eventually(lambda: job_exists(cluster, "t-1"))
        body = gpunode("node-a", A10)
        await cluster.client.delete(GPUNODES, "node-a")
        await asyncio.sleep(0.8)
        await cluster.client.create(GPUNODES, {k: v for k, v in body.items() if k != "status"})
        await cluster.client.patch(GPUNODES, "node-a", {"status": body["status"]}, status=True)
        await asyncio.sleep(2.0)  # past the grace period counted from the deletion: it came back in time
        assert (await job_exists(cluster, "t-1"), await evicted_reason(cluster, "t")) == (True, None)
        await cluster.client.delete(GPUNODES, "node-a")
        assert await eventually(lambda: evicted_reason(cluster, "t"), timeout_s=10) == "NodeFailure"


async def test_a_restart_does_not_reset_a_notready_nodes_grace_period(cluster: Cluster) -> None:
    """The grace period runs from the Node's Ready transition (durable), not from when an operator saw it:
    a node NotReady for 2.5 s of a 3 s grace is failed about half a second after a restart, not 3 s later."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    config = Config(cycleInterval=0.2, nodeFailureGracePeriod=3)
    async with running_operator(cluster, config):
        await cluster.submit(gputask("t", gpuMemory="4Gi"))
        assert await eventually(lambda: job_exists(cluster, "t-1"))
    down = {"status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ago(2.5)}]}}
    await cluster.client.patch(NODES, "node-a", down, status=True)
    async with running_operator(cluster, config):
        started = asyncio.get_running_loop().time()
        assert await eventually(lambda: evicted_reason(cluster, "t"), timeout_s=10) == "NodeFailure"
        assert asyncio.get_running_loop().time() - started < 2.0


async def accepted(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The Accepted condition the operator wrote into a GPUNode (type, status, reason, message)."""
    status = (await cluster.client.get(GPUNODES, name)).get("status") or {}
    found = [c for c in status.get("conditions") or [] if c["type"] == "Accepted"]
    return {k: found[0][k] for k in ("status", "reason", "message")} if found else None


async def test_a_lying_gpunode_is_refused_entry_by_entry_and_says_so(cluster: Cluster) -> None:
    """A UUID already reported by another node, a GPU beyond the Node's allocatable nvidia.com/gpu and
    memory used above total are refused (the GPUNode's Accepted condition and a Warning Event name them);
    the sound GPU of that node still takes work."""
    await cluster.add_node("node-a", A10)
    await cluster.add_node("node-b", ("GPU-b-0", "NVIDIA-A10", "24Gi"), A10, ("GPU-b-2", "NVIDIA-A10", "24Gi"))
    await cluster.client.patch(NODES, "node-b", {"status": {"allocatable": {"nvidia.com/gpu": "2"}}}, status=True)
    body = gpunode("node-b", ("GPU-b-0", "NVIDIA-A10", "24Gi"), A10, ("GPU-b-2", "NVIDIA-A10", "24Gi"))
    body["status"]["gpus"][0]["memoryUsed"] = "30Gi"
    await cluster.client.patch(GPUNODES, "node-b", {"status": body["status"]}, status=True)
    await cluster.add_queue()
    async with running_operator(cluster):
        why = (
            "status.gpus[0]: memoryUsed '30Gi' is more than the GPU's memory '24Gi'; GPU 1: uuid GPU-a10-0 is "
            "reported by node node-a too"
        )
        assert await eventually(lambda: accepted(cluster, "node-b")) == {
            "status": "False",
            "reason": "RefusedEntries",
            "message": why,
        }
        events = [
            (e["type"], e["reason"], e["message"])
            for e in await cluster.client.list(EVENTS, "default")
            if e["involvedObject"]["kind"] == "GPUNode"
        ]
        assert events == [("Warning", "GPUNodeRefused", why)]
        for name in "abc":
            await cluster.submit(gputask(name, gpuMemory="20Gi"))
        assert await eventually(lambda: job_exists(cluster, "b-1"))
        await asyncio.sleep(0.6)
        statuses = [(await cluster.task(n))["status"] for n in "abc"]
        placed = sorted(s["placement"]["gpus"][0]["uuid"] for s in statuses if s.get("placement"))
        assert (placed, statuses[2]["phase"]) == (["GPU-a10-0", "GPU-b-2"], "Pending")


async def test_a_gpunode_over_the_allocatable_count_keeps_only_that_many(cluster: Cluster) -> None:
    """16 GPUs reported on a Node whose device plugin counts 2: only GPUs 0 and 1 take work, and the
    condition says which were refused."""
    gpus = [(f"GPU-{i}", "NVIDIA-A10", "24Gi") for i in range(16)]
    await cluster.add_node("node-a", *gpus)
    await cluster.client.patch(NODES, "node-a", {"status": {"allocatable": {"nvidia.com/gpu": "2"}}}, status=True)
    await cluster.add_queue()
    async with running_operator(cluster):
        found = await eventually(lambda: accepted(cluster, "node-a"))
        assert found["message"].startswith(
            "16 GPUs reported but the Node's allocatable nvidia.com/gpu is 2: GPUs [2, 3"
        )
        for name in ("x", "y", "z"):
            await cluster.submit(gputask(name))
        assert await eventually(lambda: job_exists(cluster, "y-1"))
        await asyncio.sleep(0.6)
        status = (await cluster.task("z"))["status"]
        assert (status["phase"], await job_exists(cluster, "z-1")) == ("Pending", False)


async def test_a_heartbeat_in_the_future_is_not_believed(cluster: Cluster) -> None:
    """An agent clock (or a hand edit) an hour ahead would never go stale: the node takes no new work."""
    await cluster.add_node("node-a", A10)
    await cluster.client.patch(GPUNODES, "node-a", {"status": {"heartbeatTime": ago(-3600)}}, status=True)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("t", gpuMemory="4Gi"))

        async def waits() -> str | None:
            status = (await cluster.task("t")).get("status") or {}
            return status.get("message")

        message = await eventually(waits)
        assert message.startswith(
            "0/1 nodes fit: 1 unschedulable (GPUNode heartbeat stale)"
        )
        assert (await accepted(cluster, "node-a"))["reason"] == "RefusedEntries"


async def place_job(cluster: Cluster, task: dict[str, Any], attempt: int, uuid: str, mib: int) -> None:
    """Create the Job an operator would have made for ``task`` on ``uuid`` (as a stale leader might have)."""
    from gputask.core import GpuSlot, NodeName, Placement
    from gputask.k8s.jobs import build_job

    placement = Placement.one(NodeName("node-a"), (GpuSlot(0, uuid, mib),))
    await cluster.client.create(JOBS, build_job(task, placement, attempt=attempt, queue="default"), "default")


async def test_a_second_live_job_of_a_task_is_deleted_at_the_rebuild(cluster: Cluster) -> None:
    """Two live Jobs of one task (a lost create answer, a stale leader): the one its status names stays,
    the other is deleted, with a StrayJobDeleted Warning."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    task = await cluster.submit(gputask("t", gpuMemory="4Gi"))
    await place_job(cluster, task, 1, "GPU-a10-0", 4096)
    await place_job(cluster, task, 2, "GPU-a10-0", 4096)
    status = {"phase": "Admitted", "jobName": "t-1", "attempt": 1}
    await cluster.client.patch(GPUTASKS, "t", {"status": status}, "default", status=True)
    async with running_operator(cluster):

        async def gone() -> bool:
            return not await job_exists(cluster, "t-2")

        assert await eventually(gone)

        async def warnings_of() -> list[tuple[str, str, str]]:
            return [e for e in await cluster.events_for("t") if e[0] == "Warning"]

        warnings = await eventually(warnings_of)
        why = "Job t-2 was a second live Job of the task (its status names t-1); deleted"
        assert (await job_exists(cluster, "t-1"), warnings) == (True, [("Warning", "StrayJobDeleted", why)])


async def test_two_jobs_on_one_gpus_memory_leave_the_earlier_in_place(cluster: Cluster) -> None:
    """A stale leader's Job and the new leader's on the same 24 GiB GPU with 20 GiB each: at the rebuild the
    earlier Job keeps the GPU and the other task is evicted (PlacementConflict), so the books never hold both."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    first = await cluster.submit(gputask("first", gpuMemory="20Gi"))
    second = await cluster.submit(gputask("second", gpuMemory="20Gi"))
    await place_job(cluster, first, 1, "GPU-a10-0", 20480)
    await place_job(cluster, second, 1, "GPU-a10-0", 20480)
    for name in ("first", "second"):
        status = {"phase": "Admitted", "jobName": f"{name}-1", "attempt": 1}
        await cluster.client.patch(GPUTASKS, name, {"status": status}, "default", status=True)
    async with running_operator(cluster) as op:
        assert await eventually(lambda: evicted_reason(cluster, "second")) == "PlacementConflict"
        assert (await job_exists(cluster, "first-1"), op.controller.scheduler.violations()) == (True, [])



async def test_a_server_that_never_answers_fails_the_request_at_its_timeout() -> None:
    """A connection accepted and then never answered (an overloaded or partitioned API server) costs a
    request ``timeout_s``, not a thread for ever (the operator's Lease client uses the renew deadline)."""
    accepted: list[asyncio.StreamWriter] = []

    async def hang(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    configuration = k8s_client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    configuration.retries = 0
    client = KubeClient(k8s_client.ApiClient(configuration), workers=1, timeout_s=0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(ApiError) as refused:
            await asyncio.wait_for(client.get(LEASES, "gputask-operator", "default"), 30)  # 30: the test's own bound
    finally:
        await client.close()
        server.close()
    assert accepted and (refused.value.status, refused.value.reason) == (0, "Unreachable")
    assert loop.time() - started >= 0.5


async def phase_of(cluster: Cluster, name: str) -> str | None:
    """The task's phase, once it exists and has one."""
    try:
        return ((await cluster.task(name)).get("status") or {}).get("phase")
    except NotFound:
        return None


async def test_a_job_that_completed_while_no_operator_ran_makes_its_task_succeed_at_the_rebuild(
    cluster: Cluster,
) -> None:
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("t", gpuMemory="4Gi"))
        assert await eventually(lambda: job_exists(cluster, "t-1"))
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
    await cluster.client.patch(JOBS, "t-1", done, "default", status=True)
    async with running_operator(cluster):

        async def succeeded() -> bool:
            return await phase_of(cluster, "t") == "Succeeded"

        assert await eventually(succeeded)


async def test_events_that_arrive_while_a_new_leader_lists_are_fed_after_its_rebuild(cluster: Cluster) -> None:
    """Between the new leader's listing and the end of its rebuild a task is created and a Job completes:
    the watch events of both are kept and fed afterwards, so the task gets a status and the other succeeds."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("early", gpuMemory="4Gi"))
        assert await eventually(lambda: job_exists(cluster, "early-1"))
    operator = build_operator(
        Config(cycleInterval=0.2, leaderElection=True, leaseDuration=3, leaseRenewDeadline=2, leaseRenewInterval=0.5),
        kubeconfig=str(cluster.kubeconfig),
    )
    listed = operator._list_all

    async def list_then_change() -> dict[str, list[dict[str, Any]]]:
        objects = await listed()
        await cluster.submit(gputask("late", gpuMemory="4Gi"))
        done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
        await cluster.client.patch(JOBS, "early-1", done, "default", status=True)
        await asyncio.sleep(1.0)  # the watch events arrive now, before the rebuild uses the listing
        return objects

    operator._list_all = list_then_change  # type: ignore[method-assign]
    stop, ready = asyncio.Event(), asyncio.Event()
    running = asyncio.create_task(run_operator(operator, stop_flag=stop, ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), timeout=15)

        async def both() -> bool:
            return (await phase_of(cluster, "early"), await phase_of(cluster, "late")) == ("Succeeded", "Admitted")

        assert await eventually(both)
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=15)
        await operator.client.close()


async def test_a_gap_in_the_task_watch_is_closed_by_listing_again(cluster: Cluster) -> None:
    """The GPUTask watch breaks and cannot resume (410 after compaction): the operator lists GPUTasks again,
    forgets the task deleted meanwhile and admits the one created meanwhile; no GPU is booked twice."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster) as op:
        await cluster.submit(gputask("gone", gpuMemory="4Gi"))
        assert await eventually(lambda: job_exists(cluster, "gone-1"))
        emulator = cluster.server.emulator
        emulator.inject("GET", "v1alpha1/gputasks", 500, times=2)  # the watch cannot reopen for about 3 s
        emulator.close_watches()
        await cluster.client.delete(GPUTASKS, "gone", "default")
        await cluster.submit(gputask("new", gpuMemory="4Gi"))
        emulator.compact()

        async def settled() -> bool:
            jobs = {j["metadata"]["name"] for j in await cluster.client.list(JOBS, "default")}
            return jobs == {"new-1"} and sorted(op.controller.tasks) == ["default/new"]

        assert await eventually(settled, timeout_s=30)
        assert (op.informers["tasks"].relists, op.controller.scheduler.violations()) == (1, [])


async def admitted_reason(cluster: Cluster, name: str) -> tuple[str | None, str | None, str | None]:
    """(phase, jobName, the Admitted condition's reason) of a task's stored status."""
    status = (await cluster.task(name)).get("status") or {}
    found = [c["reason"] for c in status.get("conditions") or [] if c["type"] == "Admitted"]
    return status.get("phase"), status.get("jobName"), found[0] if found else None


async def test_a_job_create_served_but_unanswered_is_adopted_and_never_double_books(cluster: Cluster) -> None:
    """The API server serves a Job POST and drops the connection before answering (as when it is killed between
    etcd and the answer): the task keeps its 20 GiB of the 24 GiB GPU until a read finds its Job, then is Admitted
    with it; a second 20 GiB task waits NoFit and never gets a Job beside it."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    cluster.server.emulator.inject("POST", "/jobs", served=True)
    async with running_operator(cluster, Config(cycleInterval=0.2)):
        await cluster.submit(gputask("t", gpuMemory="20Gi"))
        assert await eventually(lambda: job_exists(cluster, "t-1"))
        await cluster.submit(gputask("u", gpuMemory="20Gi"))

        async def settled() -> tuple[Any, ...] | None:
            seen = (await admitted_reason(cluster, "t"), (await admitted_reason(cluster, "u"))[2])
            return seen if seen[0][0] == "Admitted" and seen[1] == "NoFit" else None

        assert await eventually(settled, timeout_s=10) == (("Admitted", "t-1", "Admitted"), "NoFit")
        await asyncio.sleep(1.0)  # several cycles later
        assert (await job_exists(cluster, "u-1"), [a.status for a in cluster.server.emulator.answers
                                                    if a.method == "POST" and a.path.endswith("/jobs")]) == (False, [0])


async def test_a_pod_the_taint_manager_evicted_requeues_its_task(cluster: Cluster) -> None:
    """The pod of a task's Job gets DisruptionTarget (DeletionByTaintManager) and the Job fails: through the
    operator's informers the task is evicted with that reason and admitted again with a new Job, not Failed."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2)):
        await cluster.submit(gputask("t", gpuMemory="4Gi"))
        assert await eventually(lambda: job_exists(cluster, "t-1"))
        job = await cluster.client.get(JOBS, "t-1", "default")
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "t-1", "uid": job["metadata"]["uid"],
                 "controller": True}
        template = job["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "t-1-abcde", "namespace": "default", "labels": template["metadata"]["labels"],
            "ownerReferences": [owner]}, "spec": {**template["spec"], "nodeName": "node-a"}}
        await cluster.client.create(PODS, pod, "default")
        disrupted = {"status": {"phase": "Failed", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
             "message": "Taint manager: deleting due to NoExecute taint"}]}}
        await cluster.client.patch(PODS, "t-1-abcde", disrupted, "default", status=True)
        await cluster.client.delete(PODS, "t-1-abcde", "default")
        await asyncio.sleep(0.5)  # the Job controller marks the Job failed after the pod is gone
        failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                             "message": "Job has reached the specified backoff limit"}]}}
        await cluster.client.patch(JOBS, "t-1", failed, "default", status=True)
        assert await eventually(lambda: job_exists(cluster, "t-2"))
        status = (await cluster.task("t"))["status"]
        evicted = next(c for c in status["conditions"] if c["type"] == "Evicted")
        # Re-admitted: Evicted is False again and says what it was (QuotaReserved, "Previously: ...").
        assert (status["phase"], status["reschedules"], evicted["status"], evicted["reason"],
                evicted["message"].startswith("Previously: pod t-1-abcde of Job t-1 was disrupted by the system "
                                              "(DeletionByTaintManager")) == (
            "Admitted", 1, "False", "QuotaReserved", True)
