"""The workload interface (k8s/workload.py) with its one implementation, a GPUTask, against FakeKubeClient: what the
workload is, the Job a placement makes, how it is stopped and finished, and where its status and Events go."""

from __future__ import annotations

from typing import Any

from gputask.core import GpuSlot, NodeName, Placement, TaskKey
from gputask.k8s.client import EVENTS, GPUTASKS, JOBS, Resource
from gputask.k8s.jobrecords import JobRecord
from gputask.k8s.records import TaskRecords
from gputask.k8s.tasks import Transitions
from gputask.k8s.workload import GPUTaskWorkload, PodSetInfo, Workload, owner_uid, workload_of
from gputask.k8s.writer import Writer
from gputask.testing.fake import FakeKubeClient

TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
PLACEMENT = Placement.one(NodeName("node-a"), (GpuSlot(1, "GPU-1", 40960),))


def _stored(client: FakeKubeClient) -> dict[str, Any]:
    body = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": "t", "namespace": "ml"},
            "spec": {"queueName": "team", "template": TEMPLATE}}
    return client.put(GPUTASKS, body, "ml")


def test_a_gputask_is_a_workload_of_one_pod_set() -> None:
    """A GPUTask's workload keeps the protocol; it is one PodSet of one pod (its template) in the queue it names,
    at priority 0 until converted."""
    client = FakeKubeClient()
    obj = _stored(client)
    workload = workload_of(TaskRecords().add(TaskKey("ml/t"), obj["metadata"]["uid"], obj))
    assert isinstance(workload, Workload) and isinstance(workload, GPUTaskWorkload)
    assert workload.status_resource == GPUTASKS  # the RBAC scan (test_rbac.py UNRESOLVED) counts on it
    assert (workload.object() is obj, workload.pod_sets(), workload.queue_name(), workload.priority()) == (
        True, (PodSetInfo("main", 1, TEMPLATE),), "team", 0)


async def test_a_placement_makes_a_pinned_job_owned_by_the_gputask() -> None:
    """The Job of a placement, created through the fake, is owned by the GPUTask, carries its uid (so the Job leads
    back to it) and is pinned to the node; a finished Job says its outcome and why."""
    client = FakeKubeClient()
    obj = _stored(client)
    uid = obj["metadata"]["uid"]
    workload = workload_of(TaskRecords().add(TaskKey("ml/t"), uid, obj))
    created = await client.create(JOBS, workload.job_for(PLACEMENT, attempt=1, queue="cq"), "ml")
    owner = created["metadata"]["ownerReferences"][0]
    terms = created["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert ((owner["kind"], owner["uid"], owner["controller"]), owner_uid(created), created["metadata"]["name"],
            terms) == (("GPUTask", uid, True), uid, "t-1",
                       [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}])
    condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit"}
    failed = {**created, "status": {"conditions": [condition]}}
    assert (workload.finished(created), workload.finished(failed)) == (
        None, ("Failed", "BackoffLimitExceeded: Job has reached the specified backoff limit"))
    assert (workload.stop_propagation("Preempted"), workload.stop_propagation("NodeFailure")) == (
        "Foreground", "Background")


async def test_status_and_events_go_where_the_workload_says() -> None:
    """An admission's status is patched on the workload's status resource (the GPUTask) and its Event names the
    GPUTask as involvedObject."""
    client = FakeKubeClient()
    obj = _stored(client)
    record = TaskRecords().add(TaskKey("ml/t"), obj["metadata"]["uid"], obj)
    await Transitions(Writer(client)).admitted(record, PLACEMENT, job_name="t-1", attempt=1, quota="q", message="m")
    (stored,) = client.all(GPUTASKS, "ml")
    (event,) = client.all(EVENTS, "ml")
    assert (stored["status"]["phase"], stored["status"]["jobName"], event["involvedObject"], event["reason"]) == (
        "Admitted", "t-1", {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "name": "t", "namespace": "ml",
                            "uid": obj["metadata"]["uid"]}, "Admitted")


async def test_a_gputask_is_stopped_by_deleting_its_job_with_the_eviction_s_propagation() -> None:
    """Stopping goes through the workload: a GPUTask's Job is deleted (through the writer, on the fake: gone, and a
    second stop says it was gone already), Foreground for a preemption, Background otherwise."""
    client = FakeKubeClient()
    obj = _stored(client)
    uid = obj["metadata"]["uid"]
    workload = workload_of(TaskRecords().add(TaskKey("ml/t"), uid, obj))
    await client.create(JOBS, workload.job_for(PLACEMENT, attempt=1, queue="cq"), "ml")
    job = JobRecord("t-1", "ml", uid, 1, PLACEMENT)
    writer = Writer(client)
    stopped = (await workload.stop(writer, job, "NodeFailure"), await workload.stop(writer, job, "NodeFailure"))
    sent: list[tuple[str, str, str | None, str]] = []

    class Recorder:
        async def delete(self, res: Resource, name: str, namespace: str | None = None, *,
                         propagation: str = "Background") -> bool:
            sent.append((res.plural, name, namespace, propagation))
            return True

    await workload.stop(Recorder(), job, "Preempted")
    await workload.stop(Recorder(), job, "PlacementConflict")
    assert (stopped, client.all(JOBS, "ml"), sent) == ((True, False), [], [
        ("jobs", "t-1", "ml", "Foreground"), ("jobs", "t-1", "ml", "Background")])
