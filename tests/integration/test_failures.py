"""The real operator under preemption, node failure, restarts, deletion while down, two replicas, conflicts."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from gputask.config import Config
from gputask.k8s.client import GPUCLUSTERQUEUES, GPUNODES, GPUTASKS, JOBS, NODES, PODS, PRIORITYCLASSES, NotFound
from gputask.live import build_view, explain_task, list_all, render_diagnosis
from harness import Cluster, eventually, gputask, job_of, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")
FAST = Config(cycleInterval=0.2, nodeFailureGracePeriod=1)


async def job_names(cluster: Cluster) -> list[str]:
    """Names of the Jobs in namespace default, sorted."""
    return sorted(j["metadata"]["name"] for j in await cluster.client.list(JOBS, "default"))


async def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    """A GPUTask's status ({} while it has none)."""
    return (await cluster.task(name)).get("status") or {}


def condition(status: dict[str, Any], ctype: str) -> tuple[str, str, str] | None:
    """(status, reason, message) of a condition, or None."""
    for cond in status.get("conditions") or []:
        if cond["type"] == ctype:
            return cond["status"], cond["reason"], cond["message"]
    return None


async def priority_class(cluster: Cluster, name: str, value: int) -> None:
    """Create a scheduling.k8s.io/v1 PriorityClass."""
    body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}
    await cluster.client.create(PRIORITYCLASSES, body)


async def test_preemption_end_to_end(cluster: Cluster) -> None:
    """A high-priority task evicts the low one: Job deleted, task requeued as Preempted, preemptor on its GPU."""
    await cluster.add_node("node-a", A10)
    await priority_class(cluster, "low", 10)
    await priority_class(cluster, "high", 1000)
    await cluster.add_queue(preemption={"withinClusterQueue": "LowerPriority"})
    async with running_operator(cluster, FAST) as op:
        await cluster.submit(gputask("low", priorityClassName="low"))
        await eventually(lambda: _has_job(cluster, "low-1"))
        await cluster.submit(gputask("high", priorityClassName="high"))

        await eventually(lambda: _has_job(cluster, "high-1"))

        assert await job_names(cluster) == ["high-1"]
        low = await status_of(cluster, "low")
        message = "preempted by default/high (priority 1000) in GPUClusterQueue 'default'"
        assert (low["phase"], condition(low, "Evicted"), low["priority"]) == (
            "Pending",
            ("True", "Preempted", message),
            10,
        )
        async def warned() -> bool:  # Events follow the status write they belong to
            return ("Warning", "Preempted", message) in await cluster.events_for("low")

        assert await eventually(warned)
        high_job = await cluster.client.get(JOBS, "high-1", "default")
        assert high_job["metadata"]["annotations"]["gputask.io/placement"] == (
            '{"node":"node-a","uuids":["GPU-a10-0"],"indices":[0],"memoryMiB":[24576]}'
        )
        await op.loop.run_once()
        sample = op.metrics.registry.get_sample_value
        q = {"queue": "default"}
        assert {
            "preemptions": sample("gputask_preemptions_total", q),
            "evicted": sample("gputask_evictions_total", {"reason": "Preempted"}),
            "admitted": sample("gputask_admitted_tasks", q),
            "pending": sample("gputask_pending_tasks", q),
            "gpus": sample("gputask_queue_usage", {**q, "resource": "nvidia.com/gpu"}),
            "bytes": sample("gputask_queue_usage", {**q, "resource": "gputask.io/gpu-memory"}),
            "reserved": sample("gputask_node_gpu_memory_reserved_bytes", {"node": "node-a"}),
            "free": sample("gputask_node_gpu_memory_free_bytes", {"node": "node-a"}),
            "latency_count": sample("gputask_admission_latency_seconds_count", q),
            "active": sample("gputask_pending_tasks_by_status", {**q, "status": "active"}),
            "inadmissible": sample("gputask_pending_tasks_by_status", {**q, "status": "inadmissible"}),
            "nominal": sample("gputask_queue_nominal_quota", {**q, "flavor": "", "resource": "nvidia.com/gpu"}),
            "gpu0_reserved": sample("gputask_gpu_memory_reserved_bytes", {"node": "node-a", "gpu": "0"}),
            "gpu0_free": sample("gputask_gpu_memory_free_bytes", {"node": "node-a", "gpu": "0"}),
        } == {
            "preemptions": 1.0,
            "evicted": 1.0,
            "admitted": 1.0,
            "pending": 1.0,
            "gpus": 1.0,
            "bytes": float(24 << 30),
            "reserved": float(24 << 30),
            "free": 0.0,
            "latency_count": 2.0,
            "active": 1.0,
            "inadmissible": 0.0,
            "nominal": 1000.0,
            "gpu0_reserved": float(24 << 30),
            "gpu0_free": 0.0,
        }


async def _has_job(cluster: Cluster, name: str) -> bool:
    try:
        await cluster.client.get(JOBS, name, "default")
    except NotFound:
        return False
    return True


async def test_node_failure_reschedules_on_another_node_with_a_new_job(cluster: Cluster) -> None:
    """After the grace period a NotReady node's task is evicted (NodeFailure) and runs on node-b as attempt 2."""
    await cluster.add_node("node-a", ("GPU-a", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("train", gpuMemory="10Gi"))
        await eventually(lambda: _has_job(cluster, "train-1"))
        await cluster.add_node("node-b", ("GPU-b", "NVIDIA-A10", "24Gi"))
        not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
        await cluster.client.patch(NODES, "node-a", not_ready, status=True)

        await eventually(lambda: _has_job(cluster, "train-2"))

        async def readmitted() -> dict[str, Any] | None:  # the status is written just after the Job
            found = await status_of(cluster, "train")
            return found if found.get("attempt") == 2 and found.get("phase") == "Admitted" else None

        status = await eventually(readmitted)
        assert (status["attempt"], status["reschedules"], status["placement"]["node"]) == (2, 1, "node-b")
        assert await job_names(cluster) == ["train-2"]


async def test_readmission_turns_evicted_and_requeued_false_as_kueue_does(cluster: Cluster) -> None:
    """Re-admitted after a NodeFailure eviction, Evicted and Requeued turn False (reason QuotaReserved, "Previously:
    <their message>"), as Kueue's SetQuotaReservation does; once its Job completes the task shows Finished=True beside
    them, not beside Evicted=True."""
    await cluster.add_node("node-a", ("GPU-a", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("train"))
        await eventually(lambda: _has_job(cluster, "train-1"))
        await cluster.add_node("node-b", ("GPU-b", "NVIDIA-A10", "24Gi"))
        not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
        await cluster.client.patch(NODES, "node-a", not_ready, status=True)
        await eventually(lambda: _has_job(cluster, "train-2"))
        complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
        await cluster.client.patch(JOBS, "train-2", complete, "default", status=True)

        async def succeeded() -> dict[str, Any] | None:
            found = await status_of(cluster, "train")
            return found if found.get("phase") == "Succeeded" else None

        status = await eventually(succeeded)
        why = "node node-a NotReady for more than 1s"
        placed = "Admitted by GPUClusterQueue 'default' on node-b GPUs [0] (24576 MiB each)"
        assert {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]} == {
            "QuotaReserved": ("True", "QuotaReserved", "quota reserved in 'default'"),
            "Admitted": ("True", "Admitted", placed),
            "Evicted": ("False", "QuotaReserved", f"Previously: {why}"),
            "Requeued": ("False", "QuotaReserved", "Previously: requeued after NodeFailure"),
            "Finished": ("True", "Succeeded", "Job train-2 completed"),
        }


async def test_a_restarted_operator_holds_the_gpus_of_pods_whose_job_is_gone(cluster: Cluster) -> None:
    """The operator restarts while the pod of a Job gone after a NodeFailure eviction lingers on node-a: the rebuild
    finds the pod with no Job and holds the GPU its placement annotation names, so a new task waits until the pod
    is gone; `gputask explain` says what is held."""
    await cluster.add_node("node-a", ("GPU-a", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await fail_node_a_with_a_running_task(cluster)
    await node_a_back(cluster)
    await cluster.submit(gputask("other"))
    async with running_operator(cluster, FAST):
        no_gpu = ("False", "NoFit", "0/2 nodes fit: 2 no idle GPU (position 0 in GPUClusterQueue 'default')")

        async def waits() -> bool:
            return condition(await status_of(cluster, "other"), "Admitted") == no_gpu

        await eventually(waits)
        objects = await list_all(cluster.client)
        status = await status_of(cluster, "train")
        found = explain_task(build_view(objects), "default", "train", status)
        console = Console(file=io.StringIO(), width=200, highlight=False, color_system=None)
        render_diagnosis(console, found, status)
        assert (found.state, found.node, found.held, await job_names(cluster)) == (
            "admitted", "node-b", ("GPUs on node node-a held until pod train-1-x7k2p is gone",), ["train-2"])
        assert console.file.getvalue().splitlines()[1:] == [  # type: ignore[attr-defined]
            "An earlier Job of it is gone, its pods are not: GPUs on node node-a held until pod train-1-x7k2p is "
            "gone.", "GPUClusterQueue: default (through GPULocalQueue default); priority 0", "Admitted on node node-b."]
        await pod_stopped(cluster, "train-1-x7k2p")
        await eventually(lambda: _has_job(cluster, "other-1"))
        objects = await list_all(cluster.client)
        assert explain_task(build_view(objects), "default", "train").held == ()


async def test_deleting_a_task_while_the_operator_is_down_frees_its_gpu(cluster: Cluster) -> None:
    """A task deleted while no operator runs: the restarted operator sees its GPU free and admits the next task."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("first"))
        await eventually(lambda: _has_job(cluster, "first-1"))
    await cluster.client.delete(GPUTASKS, "first", "default")
    await cluster.submit(gputask("second"))
    async with running_operator(cluster, FAST):
        await eventually(lambda: _has_job(cluster, "second-1"))
    assert await job_names(cluster) == ["second-1"]


async def test_two_replicas_one_leader_no_duplicate_jobs_and_failover(cluster: Cluster) -> None:
    """With leader election only one replica schedules; when it stops, the other takes over without duplicates."""
    await cluster.add_node("node-a", ("GPU-0", "NVIDIA-A10", "24Gi"), ("GPU-1", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    elect = Config(
        cycleInterval=0.2, leaderElection=True, leaseDuration=2, leaseRenewDeadline=1.5, leaseRenewInterval=0.3
    )
    async with running_operator(cluster, elect) as one, running_operator(cluster, elect) as two:
        await cluster.submit(gputask("a", gpuMemory="20Gi"))
        await eventually(lambda: _has_job(cluster, "a-1"))
        assert sorted([one.leading, two.leading]) == [False, True]
        leader, standby = (one, two) if one.leading else (two, one)
        await leader.step_down()
        leader.leading = False
        await leader.on_cleanup()
        await cluster.submit(gputask("b", gpuMemory="20Gi"))
        await eventually(lambda: _has_job(cluster, "b-1"), timeout_s=20)
        await cluster.submit(gputask("c", gpuMemory="20Gi"))

        async def c_waits() -> tuple[str, str, str] | None:
            return condition(await status_of(cluster, "c"), "Admitted")

        message = "0/1 nodes fit: 1 no GPU with 20480 MiB free (position 0 in GPUClusterQueue 'default')"
        assert await eventually(c_waits) == ("False", "NoFit", message)
        assert (await status_of(cluster, "c"))["queuePosition"] == 0
        assert standby.leading is True
        assert await job_names(cluster) == ["a-1", "b-1"]


async def test_status_write_retries_from_fresh_state_on_conflict(cluster: Cluster) -> None:
    """A status write with a stale resourceVersion gets 409 from the emulator and succeeds after re-reading."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, FAST) as op:
        await cluster.submit(gputask("t"))
        await eventually(lambda: _has_job(cluster, "t-1"))

        async def admitted() -> bool | None:  # the loop's own Admitted write is done: no second writer races
            return (await status_of(cluster, "t")).get("jobName") == "t-1" or None

        await eventually(admitted)
        record = op.controller.tasks["default/t"]  # type: ignore[index]
        stale = dict(record.obj["metadata"], resourceVersion="1")
        record.obj = {**record.obj, "metadata": stale}
        transitions = op.executor.transitions
        before = transitions.conflicts
        assert await transitions.write_status(record, "written after a conflict")
        assert transitions.conflicts == before + 1
        assert (await status_of(cluster, "t"))["message"] == "written after a conflict"


async def test_queue_status_shows_counts_and_usage(cluster: Cluster) -> None:
    """The GPUClusterQueue status reports admitted and pending counts and usage in milli-GPU and MiB."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue(resources=[{"name": "nvidia.com/gpu", "nominalQuota": 1}])
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("one", gpuMemory="12Gi"))
        await cluster.submit(gputask("two", gpuMemory="12Gi"))
        await cluster.submit(gputask("three", gpuMemory="12Gi"))

        async def reported() -> dict[str, Any] | None:
            status = (await cluster.client.get(GPUCLUSTERQUEUES, "default")).get("status") or {}
            return status if status.get("admittedTasks") == 2 and status.get("pendingTasks") == 1 else None

        status = await eventually(reported)
    assert status["usage"] == [
        {"name": "gputask.io/gpu-memory", "total": "24576Mi", "borrowed": "0Mi"},
        {"name": "nvidia.com/gpu", "total": "1000m", "borrowed": "0m"},
    ]


async def test_restart_between_job_create_and_status_patch_adopts_the_job(cluster: Cluster) -> None:
    """A Job created just before a crash (status never written) is adopted: no second Job, status caught up."""
    from gputask.core import GpuSlot, NodeName, Placement
    from gputask.k8s.jobs import build_job

    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    task = await cluster.submit(gputask("t", gpuMemory="10Gi"))
    placement = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-a10-0", 10240),))
    await cluster.client.create(JOBS, build_job(task, placement, attempt=1, queue="default"), "default")
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("u", gpuMemory="20Gi"))

        async def caught_up() -> dict[str, Any] | None:
            status = await status_of(cluster, "t")
            return status if status.get("jobName") == "t-1" else None

        status = await eventually(caught_up)
        u_waits = await eventually(lambda: _reason(cluster, "u"))
    assert (status["phase"], status["attempt"], status["placement"]["node"]) == ("Admitted", 1, "node-a")
    assert u_waits == "NoFit"  # 10Gi of 24Gi are held by the adopted Job: 20Gi does not fit
    assert await job_names(cluster) == ["t-1"]


async def _reason(cluster: Cluster, name: str) -> str | None:
    found = condition(await status_of(cluster, name), "Admitted")
    return found[1] if found else None


async def test_a_queue_with_admitted_tasks_is_deleted_only_once_they_finish(cluster: Cluster) -> None:
    """As Kueue's resource-in-use finalizer: every queue carries gputask.io/queue-in-use; deleting one with
    an admitted task leaves it Terminating (its pending tasks wait, saying so) until that task finishes."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("running", gpuMemory="12Gi"))
        await eventually(lambda: _has_job(cluster, "running-1"))

        async def finalized() -> list[str] | None:
            meta = (await cluster.client.get(GPUCLUSTERQUEUES, "default"))["metadata"]
            return meta.get("finalizers") or None

        assert await eventually(finalized) == ["gputask.io/queue-in-use"]
        await cluster.client.delete(GPUCLUSTERQUEUES, "default")
        await cluster.submit(gputask("late", gpuMemory="4Gi"))

        async def waits() -> tuple[str, str, str] | None:
            found = condition(await status_of(cluster, "late"), "Admitted")
            return found if found is not None and found[1] == "QueueInactive" else None

        assert await eventually(waits) == (
            "False",
            "QueueInactive",
            "GPUClusterQueue 'default' is inactive: it is being deleted, and waits for its admitted tasks "
            "to finish (its finalizer stays until then) (position 0 in GPUClusterQueue 'default')",
        )
        terminating = await cluster.client.get(GPUCLUSTERQUEUES, "default")
        assert terminating["metadata"].get("deletionTimestamp")
        complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
        await cluster.client.patch(JOBS, "running-1", complete, "default", status=True)

        async def gone() -> bool | None:
            try:
                await cluster.client.get(GPUCLUSTERQUEUES, "default")
            except NotFound:
                return True
            return None

        assert await eventually(gone)
        assert (await status_of(cluster, "running"))["phase"] == "Succeeded"


async def test_a_restart_rewrites_no_status_that_already_says_the_same(cluster: Cluster) -> None:
    """After a restart the first cycle decides the same waits again; statuses that already say so are not
    written again (with tens of thousands waiting, those writes held up new admissions for minutes)."""
    await cluster.add_node("node-a", ("GPU-0", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("big", gpuMemory="20Gi"))
        await eventually(lambda: _has_job(cluster, "big-1"))
        for name in ("w1", "w2"):
            await cluster.submit(gputask(name, gpuMemory="20Gi"))

        async def waiting() -> bool:
            reasons = [(condition(await status_of(cluster, n), "Admitted") or ("", ""))[1] for n in ("w1", "w2")]
            return reasons == ["NoFit", "NoFit"]

        await eventually(waiting)
    before = [a for a in cluster.server.emulator.answers if "/gputasks/w" in a.path]
    async with running_operator(cluster) as again:
        await cluster.submit(gputask("probe", gpuMemory="1Gi"))
        await eventually(lambda: _has_job(cluster, "probe-1"))
        skipped = again.executor.transitions.skipped
    after = [a for a in cluster.server.emulator.answers if "/gputasks/w" in a.path]
    assert (len(after) - len(before), skipped >= 2) == (0, True)


KUBELET_FINALIZER = "test.gputask.io/kubelet"  # keeps a deleted pod Running, as a kubelet that does not answer does


async def bound_pod(cluster: Cluster, job_name: str, pod_name: str, node: str) -> None:
    """A pod of Job ``job_name`` as the Job controller makes it (template labels and annotations, owner), bound to
    ``node`` by kube-scheduler and Running; its finalizer :data:`KUBELET_FINALIZER` keeps it, once deleted, Running
    with a deletionTimestamp, as a pod on an unreachable node stays until its kubelet comes back."""
    job = await cluster.client.get(JOBS, job_name, "default")
    template = job["spec"]["template"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    meta = {"name": pod_name, "namespace": "default", "ownerReferences": [owner], "finalizers": [KUBELET_FINALIZER],
            "labels": template["metadata"]["labels"] | {"batch.kubernetes.io/job-name": job_name},
            "annotations": template["metadata"].get("annotations") or {}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {**template["spec"], "nodeName": node}}
    await cluster.client.create(PODS, pod, "default")
    await cluster.client.patch(PODS, pod_name, {"status": {"phase": "Running"}}, "default", status=True)


async def pod_lingers(cluster: Cluster, name: str) -> bool:
    """True while pod ``name`` is deleted (a deletionTimestamp) but still there, Running."""
    try:
        pod = await cluster.client.get(PODS, name, "default")
    except NotFound:
        return False
    return bool(pod["metadata"].get("deletionTimestamp")) and pod["status"]["phase"] == "Running"


async def fail_node_a_with_a_running_task(cluster: Cluster) -> None:
    """Task ``train`` Running on node-a (its pod ``train-1-x7k2p``), node-b free, then node-a NotReady: returns once
    the task is re-placed on node-b (Job train-2) and the pod of the gone Job train-1 lingers."""
    await cluster.submit(gputask("train"))
    await eventually(lambda: _has_job(cluster, "train-1"))
    await bound_pod(cluster, "train-1", "train-1-x7k2p", "node-a")

    async def running() -> bool:
        return (await status_of(cluster, "train")).get("phase") == "Running"

    await eventually(running)
    await cluster.add_node("node-b", ("GPU-b", "NVIDIA-A10", "24Gi"))
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    await cluster.client.patch(NODES, "node-a", not_ready, status=True)
    await eventually(lambda: _has_job(cluster, "train-2"))

    async def job_gone_pod_not() -> bool:
        return not await _has_job(cluster, "train-1") and await pod_lingers(cluster, "train-1-x7k2p")

    await eventually(job_gone_pod_not)


async def node_a_back(cluster: Cluster) -> None:
    """node-a Ready again (its kubelet answers; the old pod still runs until the kubelet stops it)."""
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    await cluster.client.patch(NODES, "node-a", ready, status=True)


async def pod_stopped(cluster: Cluster, name: str) -> None:
    """The kubelet stopped pod ``name``'s containers and confirmed its deletion: it is gone."""
    await cluster.client.patch(PODS, name, {"metadata": {"finalizers": []}}, "default")


async def test_a_failed_nodes_gpus_stay_held_until_the_old_pod_is_gone(cluster: Cluster) -> None:
    """After a NodeFailure eviction the task runs on node-b at once, but node-a's GPU stays held while the old pod
    lingers there (deleted, Running): a new task waits after node-a is back, and gets the GPU once the pod is gone;
    the Evicted condition says what was held until then."""
    await cluster.add_node("node-a", ("GPU-a", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await fail_node_a_with_a_running_task(cluster)
        await node_a_back(cluster)
        await cluster.submit(gputask("other"))

        no_gpu = ("False", "NoFit", "0/2 nodes fit: 2 no idle GPU (position 0 in GPUClusterQueue 'default')")

        async def waits_with_node_a_back() -> bool:  # node-a back in the books: only the hold keeps its GPU
            return condition(await status_of(cluster, "other"), "Admitted") == no_gpu

        held = "GPUs on node node-a held until pod train-1-x7k2p is gone"

        async def said() -> tuple[str, str, str] | None:
            found = condition(await status_of(cluster, "train"), "Evicted")
            return found if found is not None and found[2].endswith(held) else None

        await eventually(waits_with_node_a_back)
        assert (await eventually(said), await job_names(cluster)) == (
            ("False", "QuotaReserved", f"Previously: node node-a NotReady for more than 1s; {held}"),
            ["train-2"],
        )
        await pod_stopped(cluster, "train-1-x7k2p")
        await eventually(lambda: _has_job(cluster, "other-1"))
        events = sorted(e for e in await cluster.events_for("train") if e[1].startswith("GPUs"))
        assert (condition(await status_of(cluster, "train"), "Evicted"), events) == (
            ("False", "QuotaReserved", "Previously: node node-a NotReady for more than 1s"),
            [("Normal", "GPUsHeld", held),
             ("Normal", "GPUsReleased", "GPUs on node node-a released: the pods of Job train-1 are gone")],
        )


async def test_an_unhealthy_gpus_task_moves_at_once_and_the_gpu_stays_held_while_its_pod_terminates(
    cluster: Cluster,
) -> None:
    """GPUFailure: the task is re-placed on node-a's other GPU at once, while the failed GPU stays held as long as the
    old pod terminates (deleted, still Running in its grace period); the GPU reported healthy again is given to the
    next task only once that pod is gone."""
    await cluster.add_node("node-a", ("GPU-a0", "NVIDIA-A10", "24Gi"), ("GPU-a1", "NVIDIA-A10", "24Gi"))
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("train"))
        job = await eventually(lambda: job_of(cluster, "train-1"))
        index = json.loads(job["metadata"]["annotations"]["gputask.io/placement"])["indices"][0]
        await bound_pod(cluster, "train-1", "train-1-x7k2p", "node-a")
        gpunode = await cluster.client.get(GPUNODES, "node-a")
        gpus = gpunode["status"]["gpus"]
        gpus[index] |= {"healthy": False, "reason": "XID 79"}
        await cluster.client.patch(GPUNODES, "node-a", {"status": {"gpus": gpus}}, status=True)
        await eventually(lambda: _has_job(cluster, "train-2"))

        async def job_gone_pod_not() -> bool:
            return not await _has_job(cluster, "train-1") and await pod_lingers(cluster, "train-1-x7k2p")

        await eventually(job_gone_pod_not)
        gpus[index] |= {"healthy": True, "reason": ""}
        await cluster.client.patch(GPUNODES, "node-a", {"status": {"gpus": gpus}}, status=True)
        await cluster.submit(gputask("other"))
        no_gpu = ("False", "NoFit", "0/1 nodes fit: 1 no idle GPU (position 0 in GPUClusterQueue 'default')")

        async def waits() -> bool:
            return condition(await status_of(cluster, "other"), "Admitted") == no_gpu

        await eventually(waits)
        await pod_stopped(cluster, "train-1-x7k2p")
        await eventually(lambda: _has_job(cluster, "other-1"))
        placements = [json.loads(j["metadata"]["annotations"]["gputask.io/placement"])["indices"]
                      for j in await cluster.client.list(JOBS, "default")]
        assert (await job_names(cluster), sorted(placements)) == (["other-1", "train-2"], [[0], [1]])


async def test_a_pod_that_started_while_no_operator_led_makes_its_task_running_at_the_rebuild(cluster: Cluster) -> None:
    """A task Admitted whose pod started while no replica led (a failover, the API server restarted): the new
    leader's rebuild sees the pod Running and the task turns Running, instead of waiting for an event that came
    before it led (and being evicted as PodsNotStarting)."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("t", gpuMemory="10Gi"))

        async def admitted() -> bool:
            return (await status_of(cluster, "t")).get("phase") == "Admitted"

        await eventually(admitted)
    await bound_pod(cluster, "t-1", "t-1-abcde", "node-a")
    await cluster.client.patch(PODS, "t-1-abcde", {"metadata": {"finalizers": []}}, "default")
    async with running_operator(cluster, FAST):

        async def running() -> dict[str, Any] | None:
            status = await status_of(cluster, "t")
            return status if status.get("phase") == "Running" else None

        status = await eventually(running)
    assert (status["phase"], status["jobName"], status["attempt"], await job_names(cluster)) == (
        "Running", "t-1", 1, ["t-1"])
