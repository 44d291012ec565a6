"""What a real API server answers, and how the real kopf operator takes it (the real-cluster issue).

The emulator answers these paths as kube-apiserver documents them: 422 Invalid for a Job the Job
API refuses, 403 Forbidden for an object-count ResourceQuota, 422 for a CRD breaking the CRD
rules (see test_emulator.py); each test here fails without the operator's handling of it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import crdschema
from gputask.config import Config
from gputask.k8s import executor
from gputask.k8s.client import EVENTS, GPUTASKS, JOBS, NODES, PODS, NotFound, Resource
from harness import REPO, Cluster, eventually, gputask, running_operator

A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")
RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas")
JOB_POSTS = "/apis/batch/v1/namespaces/default/jobs"


def condition(task: dict[str, Any], ctype: str) -> dict[str, Any]:
    """One condition of a stored task ({} when absent)."""
    return next((c for c in (task.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


async def reason_of(cluster: Cluster, name: str) -> tuple[str, str, str] | None:
    """(phase, Admitted reason, Admitted message) of a task, once it has a status."""
    task = await cluster.task(name)
    admitted = condition(task, "Admitted")
    return (task["status"]["phase"], admitted.get("reason", ""), admitted.get("message", "")) if admitted else None


async def has_job(cluster: Cluster, name: str) -> bool:
    """True when the Job exists."""
    try:
        await cluster.client.get(JOBS, name, "default")
    except NotFound:
        return False
    return True


def refused_posts(cluster: Cluster, status: int) -> int:
    """Job creates the emulator answered with ``status``."""
    return sum(
        1 for a in cluster.server.emulator.answers if a.method == "POST" and a.path == JOB_POSTS and a.status == status
    )


def with_template(body: dict[str, Any], **pod: Any) -> dict[str, Any]:
    """``body`` with these pod spec fields added to its template."""
    body["spec"]["template"]["spec"] |= pod
    return body


async def test_a_job_the_api_server_refuses_backs_off_says_why_and_frees_its_gpu(cluster: Cluster) -> None:
    """A 422 the operator could not foresee (a volume without a source): JobRejected with the server's
    message and a Warning Event, one Job create per backoff step, the GPU free for the next task; a
    mended spec is tried at once."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(with_template(gputask("bad", gpuMemory="20Gi"), volumes=[{"name": "data"}]))

        async def rejected() -> tuple[str, str, str] | None:
            found = await reason_of(cluster, "bad")
            return found if found and found[1] == "JobRejected" else None

        why = (
            'the API server refused Job bad-1: 422 Invalid: Job.batch "bad-1" is invalid: '
            "spec.template.spec.volumes[0]: Required value: must specify a volume type; retried in 10s (attempt 1)"
        )
        assert await eventually(rejected) == ("Pending", "JobRejected", why)
        await cluster.submit(gputask("good", gpuMemory="20Gi"))
        assert await eventually(lambda: has_job(cluster, "good-1"))
        await asyncio.sleep(1.5)  # several cycles: the refused task is not tried again before its backoff
        warnings = [e for e in await cluster.events_for("bad") if e[0] == "Warning"]
        assert (refused_posts(cluster, 422), warnings) == (1, [("Warning", "JobRejected", why)])
        mended = {"spec": {"template": {"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}}}
        await cluster.client.patch(GPUTASKS, "bad", mended, "default")

        async def no_fit() -> tuple[str, str, str] | None:
            found = await reason_of(cluster, "bad")
            return found if found and found[1] == "NoFit" else None

        assert (await eventually(no_fit))[0] == "Pending"  # tried at once with the new spec; the GPU is taken
        await cluster.client.delete(Resource("gputask.io", "v1alpha1", "gputasks"), "good", "default")
        assert await eventually(lambda: has_job(cluster, "bad-1"))


async def test_a_quota_that_forbids_jobs_backs_off_and_the_task_runs_once_it_is_lifted(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace ResourceQuota with count/jobs.batch 0: 403 in the task's condition; retried with a
    doubling backoff (shortened here), admitted once the quota is gone."""
    monkeypatch.setattr(executor, "BACKOFF_BASE_S", 0.4)
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-jobs", "namespace": "default"},
        "spec": {"hard": {"count/jobs.batch": "0"}},
    }
    await cluster.client.create(RESOURCE_QUOTAS, quota, "default")
    async with running_operator(cluster):
        await cluster.submit(gputask("t", gpuMemory="4Gi"))

        async def forbidden() -> str | None:
            found = await reason_of(cluster, "t")
            return found[2] if found and found[1] == "JobRejected" else None

        message = await eventually(forbidden)
        assert message.startswith(
            'the API server refused Job t-1: 403 Forbidden: jobs.batch "t-1" is forbidden: exceeded quota: no-jobs, '
            "requested: count/jobs.batch=1, used: count/jobs.batch=0, limited: count/jobs.batch=0; retried in"
        )
        await asyncio.sleep(1.0)
        tries = refused_posts(cluster, 403)
        assert 1 <= tries <= 3  # 0.4 s, 0.8 s, 1.6 s: not one per cycle (the cycle runs every 0.2 s)
        await cluster.client.delete(RESOURCE_QUOTAS, "no-jobs", "default")
        assert await eventually(lambda: has_job(cluster, "t-1"), timeout_s=20)


async def test_a_template_the_job_api_would_refuse_fails_at_once_without_a_job(cluster: Cluster) -> None:
    """env written as a string: InvalidSpec, Failed, a Warning Event, and not one Job create."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        body = gputask("t", gpuMemory="4Gi")
        body["spec"]["template"]["spec"]["containers"][0]["env"] = "X=1"
        await cluster.submit(body)
        why = (
            "the pod template would be refused as a Job's: spec.template.spec.containers[0].env: Invalid value: "
            '"X=1": must be a list'
        )
        assert await eventually(lambda: reason_of(cluster, "t")) == ("Failed", "InvalidSpec", why)
        assert await eventually(lambda: cluster.events_for("t")) == [("Warning", "InvalidSpec", why)]
        assert [a for a in cluster.server.emulator.answers if a.path == JOB_POSTS] == []


async def pod_of_job(cluster: Cluster, job_name: str, pod_name: str, status: dict[str, Any]) -> None:
    """Create a pod as the Job controller would (labels, owner) and give it ``status`` as the kubelet would."""
    job = await cluster.client.get(JOBS, job_name, "default")
    labels = job["spec"]["template"]["metadata"]["labels"] | {"batch.kubernetes.io/job-name": job_name}
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job_name,
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": "default", "labels": labels, "ownerReferences": [owner]},
        "spec": job["spec"]["template"]["spec"],
    }
    await cluster.client.create(PODS, pod, "default")
    await cluster.client.patch(PODS, pod_name, {"status": status}, "default", status=True)


async def phase_of(cluster: Cluster, name: str) -> str:
    """The task's status.phase ('' before it has one)."""
    return str(((await cluster.task(name)).get("status") or {}).get("phase") or "")


async def test_running_means_a_pod_runs_not_that_the_job_exists(cluster: Cluster) -> None:
    """Admitted while its pod is Pending (Job.status.active counts it), Running once the pod runs."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("t", gpuMemory="4Gi"))
        assert await eventually(lambda: has_job(cluster, "t-1"))
        await pod_of_job(cluster, "t-1", "t-1-abcde", {"phase": "Pending"})
        await cluster.client.patch(JOBS, "t-1", {"status": {"active": 1}}, "default", status=True)
        await asyncio.sleep(0.6)
        assert await phase_of(cluster, "t") == "Admitted"
        await cluster.client.patch(PODS, "t-1-abcde", {"status": {"phase": "Running"}}, "default", status=True)

        async def running() -> str | None:
            task = await cluster.task("t")
            return task["status"]["message"] if task["status"]["phase"] == "Running" else None

        assert await eventually(running) == "pod t-1-abcde of Job t-1 is Running"


async def test_pods_that_cannot_be_created_are_evicted_with_the_jobs_failed_create_text(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Job whose pods PodSecurity forbids (FailedCreate on the Job): after podStartTimeout the task is
    evicted (PodsNotStarting, counted as a reschedule), its Job deleted and its GPU freed; retried later."""
    monkeypatch.setattr(executor, "BACKOFF_BASE_S", 0.5)
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2, podStartTimeout=1)):
        await cluster.submit(gputask("t", gpuMemory="20Gi"))
        assert await eventually(lambda: has_job(cluster, "t-1"))
        job = await cluster.client.get(JOBS, "t-1", "default")
        forbidden = (
            'Error creating: pods "t-1-x7k2p" is forbidden: violates PodSecurity "restricted:latest": '
            "allowPrivilegeEscalation != false"
        )
        await cluster.client.create(
            EVENTS,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": "t-1.", "namespace": "default"},
                "involvedObject": {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "t-1",
                    "namespace": "default",
                    "uid": job["metadata"]["uid"],
                },
                "reason": "FailedCreate",
                "message": forbidden,
                "type": "Warning",
                "source": {"component": "job-controller"},
            },
            "default",
        )

        async def evicted() -> dict[str, Any] | None:
            task = await cluster.task("t")
            found = condition(task, "Evicted")
            return (
                {"reason": found["reason"], "message": found["message"], "reschedules": task["status"]["reschedules"]}
                if found
                else None
            )

        message = f"no pod of Job t-1 running 1s after admission: FailedCreate: {forbidden}"
        assert await eventually(evicted) == {"reason": "PodsNotStarting", "message": message, "reschedules": 1}

        async def gone() -> bool:
            return not await has_job(cluster, "t-1")

        assert await eventually(gone)
        assert await eventually(lambda: has_job(cluster, "t-2"), timeout_s=20)


async def test_an_unschedulable_pod_is_evicted_with_the_schedulers_message(cluster: Cluster) -> None:
    """A pod kube-scheduler cannot place (PodScheduled False, Unschedulable): its message names the cause;
    with maxReschedules 0 the task fails for good."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster, Config(cycleInterval=0.2, podStartTimeout=1)):
        await cluster.submit(gputask("t", gpuMemory="4Gi", maxReschedules=0))
        assert await eventually(lambda: has_job(cluster, "t-1"))
        unschedulable = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient cpu.",
                }
            ],
        }
        await pod_of_job(cluster, "t-1", "t-1-abcde", unschedulable)

        async def failed() -> tuple[str, str] | None:
            task = await cluster.task("t")
            found = condition(task, "Finished")
            return (task["status"]["phase"], found["message"]) if found else None

        why = (
            "no pod of Job t-1 running 1s after admission: pod t-1-abcde is Unschedulable: 0/3 nodes are "
            "available: 3 Insufficient cpu."
        )
        assert await eventually(failed) == ("Failed", f"{why}; rescheduled 0 times already")
        assert (await cluster.task("t"))["status"].get("jobName") is None  # its evicted Job is no longer its Job


PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", namespaced=False)


async def test_a_missing_priority_class_keeps_the_task_pending_until_it_exists(cluster: Cluster) -> None:
    """GitOps order: the class arrives after the task. Pending (PriorityClassNotFound, a Warning), then
    admitted with the class's priority once it is created."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        await cluster.submit(gputask("t", gpuMemory="4Gi", priorityClassName="high"))
        why = "priority class 'high' does not exist"
        assert await eventually(lambda: reason_of(cluster, "t")) == ("Pending", "PriorityClassNotFound", why)
        assert await eventually(lambda: cluster.events_for("t")) == [("Warning", "PriorityClassNotFound", why)]
        await cluster.client.create(
            PRIORITY_CLASSES,
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "high"},
                "value": 1000,
            },
        )
        assert await eventually(lambda: has_job(cluster, "t-1"))
        status = (await cluster.task("t"))["status"]
        assert (status["phase"], status["priority"]) == ("Admitted", 1000)


async def test_kubectl_get_shows_resolved_queue_and_memory_and_writes_name_their_manager(cluster: Cluster) -> None:
    """The printer columns read what the operator writes: the queue of the queue-name label, the MiB a
    fraction resolves to, the node; admittedAt is written; every operator write names gputask-operator."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue()
    async with running_operator(cluster):
        body = gputask("t", gpuFraction="0.5")
        del body["spec"]["queueName"]
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "default"}
        await cluster.submit(body)
        assert await eventually(lambda: has_job(cluster, "t-1"))

        async def admitted() -> dict[str, Any] | None:
            task = await cluster.task("t")
            return task if (task.get("status") or {}).get("phase") == "Admitted" else None

        task = await eventually(admitted)
    (version,) = crdschema.load_crds(REPO / "crds")["GPUTask"]["spec"]["versions"]
    shown = crdschema.column_values(version["additionalPrinterColumns"], task)
    assert {k: v for k, v in shown.items() if k != "Age"} == {
        "Queue": "default",
        "Priority": 0,
        "Phase": "Admitted",
        "Node": "node-a",
        "Pods": "1x1 on 1 node",
        "GPUs": 1,
        "Memory": "12Gi",
        "Reason": "Admitted",
    }
    assert task["status"]["admittedAt"].endswith("Z")
    managers = {a.manager for a in cluster.server.emulator.answers if "/gputasks" in a.path or "/jobs" in a.path}
    assert managers == {"test", "gputask-operator"}


async def test_wait_reasons_say_what_is_true(cluster: Cluster) -> None:
    """A queue that exists but is invalid is QueueInactive (not QueueNotFound); a cordoned node is named as
    such, not as a node without free GPUs."""
    await cluster.add_node("node-a", A10)
    await cluster.add_queue(
        "broken", resources=[{"name": "nvidia.com/gpu", "nominalQuota": "1", "lendingLimit": "1500m"}]
    )
    await cluster.add_queue()
    await cluster.client.patch(NODES, "node-a", {"spec": {"unschedulable": True}})
    async with running_operator(cluster):
        await cluster.submit(gputask("in-broken", gpuMemory="4Gi", queueName="broken"))
        await cluster.submit(gputask("on-cordoned", gpuMemory="4Gi"))
        inactive = (
            "GPUClusterQueue 'broken' is inactive: resources[nvidia.com/gpu].lendingLimit '1500m' is more than "
            "nominalQuota '1': a queue can lend only what it has (position 0 in GPUClusterQueue 'broken')"
        )
        cordoned = (
            "0/1 nodes fit: 1 unschedulable (cordoned) "
            "(position 0 in GPUClusterQueue 'default')"
        )
        assert await eventually(lambda: reason_of(cluster, "in-broken")) == ("Pending", "QueueInactive", inactive)
        assert await eventually(lambda: reason_of(cluster, "on-cordoned")) == ("Pending", "NoFit", cordoned)
