"""The operator's adapter (controller, executor, inventory, Kueue admission, loop) on the in-process fake client.

No HTTP and no kopf: each test feeds the controller as the watch handlers would and runs the loop
once at a time, against :class:`gputask.testing.FakeKubeClient`, which answers as the API server does.
"""

from __future__ import annotations

import asyncio
import decimal
import time
from typing import Any

import pytest

from gputask.config import Config
from gputask.core import GpuRequest, GpuSlot, NodeName, Placement, TaskKey
from gputask.k8s import executor as executor_module
from gputask.k8s.client import (
    ADMISSIONCHECKS,
    EVENTS,
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPUNODES,
    GPUTASKS,
    JOBS,
    LEASES,
    RESOURCECLAIMTEMPLATES,
    WORKLOADS,
    Fenced,
)
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor
from gputask.k8s.jobs import build_job
from gputask.k8s.kueue_admission import KueueAdmission
from gputask.k8s.leader import LeaderElector
from gputask.k8s.loop import SchedulingLoop
from gputask.k8s.tasks import TaskRecord, reset_requeue_conditions, set_condition
from gputask.k8s.writer import Writer
from gputask.manifests import convert
from gputask.metrics import OperatorMetrics
from gputask.testing.fake import FakeKubeClient

GPU0 = {"index": 0, "uuid": "GPU-0", "product": "NVIDIA-A10", "memory": "24Gi", "memoryUsed": "0", "healthy": True}


class Parts:
    """A controller, writer, executor and loop on a fake client, leading unless told otherwise."""

    def __init__(self, config: Config | None = None) -> None:
        self.client = FakeKubeClient()
        self.leading = True
        self.metrics = OperatorMetrics()
        self.controller = Controller(config or Config(cycleInterval=0.2))
        self.writer = Writer(self.client, self.metrics, leading=lambda: self.leading)
        self.executor = Executor(self.controller, self.writer, self.metrics)
        self.loop = SchedulingLoop(self.controller, self.executor)
        now = time.time()
        inventory = self.controller.inventory
        inventory.on_node(
            {"metadata": {"name": "node-a"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, now
        )
        inventory.on_gpunode(
            self.client.put(
                GPUNODES, {"metadata": {"name": "node-a"}, "status": {"gpus": [GPU0], "heartbeatTime": _now()}}
            ),
            now,
        )
        open_queue = {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1000}]}
        inventory.on_queue({"metadata": {"name": "q"}, "spec": open_queue})
        local = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"clusterQueue": "q"}}
        self.controller.on_local_queue(self.client.put(GPULOCALQUEUES, local, "ns"))

    def submit(self, name: str, **spec: Any) -> dict[str, Any]:
        """Store a GPUTask and feed it to the controller (as the watch would)."""
        body = {
            "apiVersion": "gputask.io/v1alpha1",
            "kind": "GPUTask",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {
                "queueName": "q",
                "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
                **spec,
            },
        }
        stored = self.client.put(GPUTASKS, body, "ns")
        self.controller.on_task(stored)
        return stored

    def status(self, name: str) -> dict[str, Any]:
        """The stored status of a task."""
        return (
            self.client.all(GPUTASKS, "ns")[
                [o["metadata"]["name"] for o in self.client.all(GPUTASKS, "ns")].index(name)
            ].get("status")
            or {}
        )

    def job_creates(self) -> list[str | None]:
        """Names of the Jobs the operator tried to create, in order."""
        return [name for verb, plural, name in self.client.calls if (verb, plural) == ("create", "jobs")]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def admitted_view(status: dict[str, Any]) -> tuple[Any, ...]:
    """What an admission wrote: phase, job, placement, Admitted reason."""
    reason = next(c["reason"] for c in status["conditions"] if c["type"] == "Admitted")
    return status["phase"], status.get("jobName"), status.get("placement"), reason


async def test_a_task_becomes_its_pinned_job_and_an_admitted_status() -> None:
    """One loop pass: the exact Job of build_job (telling the shared task its 8192 MiB budget), the status Admitted
    with the placement, one Event."""
    parts = Parts()
    task = parts.submit("t", gpuMemory="8Gi")
    await parts.loop.run_once()
    placement = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 8192),))
    (job,) = parts.client.all(JOBS, "ns")
    expected = build_job(task, placement, attempt=1, queue="q", request=GpuRequest(1, memory_mib=8192))
    assert ({k: job[k] for k in ("spec",)}, job["metadata"]["annotations"]) == (
        {"spec": expected["spec"]},
        expected["metadata"]["annotations"],
    )
    assert admitted_view(parts.status("t")) == (
        "Admitted",
        "t-1",
        {"node": "node-a", "gpus": [{"index": 0, "uuid": "GPU-0", "memory": 8192}]},
        "Admitted",
    )
    assert [(e["type"], e["reason"]) for e in parts.client.all(EVENTS, "ns")] == [("Normal", "Admitted")]


async def test_a_refused_job_is_not_tried_again_before_its_backoff() -> None:
    """A 422 on create: JobRejected, the GPU released, no second create on the next passes; a new spec
    is tried at once."""
    parts = Parts()
    parts.client.fail("create", "jobs", status=422, message='Job.batch "t-1" is invalid: spec.x: Invalid value')
    parts.submit("t", gpuMemory="8Gi")
    for _ in range(3):
        await parts.loop.run_once()
    status = parts.status("t")
    assert (status["phase"], parts.job_creates(), parts.controller.scheduler.placement_of(TaskKey("ns/t"))) == (
        "Pending",
        ["t-1"],
        None,
    )
    assert next(c["reason"] for c in status["conditions"] if c["type"] == "Admitted") == "JobRejected"
    edited = parts.client.all(GPUTASKS, "ns")[0]
    edited["spec"]["gpuMemory"] = "6Gi"
    edited["metadata"]["generation"] = 2
    parts.controller.on_task(edited)
    await parts.loop.run_once()
    assert (parts.job_creates(), parts.status("t")["phase"]) == (["t-1", "t-1"], "Admitted")


async def test_a_refused_status_write_is_written_later_with_its_event_and_nothing_is_lost() -> None:
    """The Job is created but the API server answers the status patch 500 twice: the status (and the
    Admitted Event, posted after it) waits for the backoff, then is written; one Event, not three."""
    parts = Parts()
    parts.client.fail("patch-status", "gputasks", status=500, message="etcdserver: request timed out", times=2)
    parts.submit("t", gpuMemory="8Gi")
    await parts.loop.run_once()
    assert (parts.job_creates(), parts.status("t"), parts.client.all(EVENTS, "ns")) == (["t-1"], {}, [])
    transitions = parts.executor.transitions
    await transitions.retry(now=time.monotonic())  # before the 1 s backoff: not tried
    assert parts.status("t") == {}
    await transitions.retry(now=time.monotonic() + 1.5)  # refused again: now 2 s
    await transitions.retry(now=time.monotonic() + 2.5)
    assert admitted_view(parts.status("t"))[::2] == ("Admitted", {"node": "node-a", "gpus": [
        {"index": 0, "uuid": "GPU-0", "memory": 8192}]})
    assert [e["reason"] for e in parts.client.all(EVENTS, "ns")] == ["Admitted"]
    assert transitions.unwritten == {}


async def test_an_existing_job_with_another_placement_is_adopted() -> None:
    """409 on create: our Job already exists on GPU 0 with 4 GiB, not the 8 GiB just chosen: its placement wins."""
    parts = Parts()
    task = parts.submit("t", gpuMemory="8Gi")
    theirs = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 4096),))
    parts.client.put(JOBS, build_job(task, theirs, attempt=1, queue="q"), "ns")
    await parts.loop.run_once()
    scheduler = parts.controller.scheduler
    assert (
        scheduler.placement_of(TaskKey("ns/t")),
        parts.status("t")["placement"]["gpus"][0]["memory"],
        parts.metrics.adopted._value.get(),
    ) == (theirs, 4096, 1.0)


async def test_a_failed_job_delete_is_retried_and_the_gpus_stay_held_until_the_job_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An eviction whose Job delete gets a 500 keeps the Job's GPUs held and deletes again after the backoff."""
    monkeypatch.setattr(executor_module, "BACKOFF_BASE_S", 0.05)
    parts = Parts()
    parts.submit("t", gpuMemory="20Gi")
    await parts.loop.run_once()
    parts.controller.on_job(parts.client.all(JOBS, "ns")[0])  # its ADDED event
    job = parts.controller.jobs["ns/t-1"]
    parts.client.fail("delete", "jobs", status=500, message="etcdserver: request timed out")
    parts.controller.scheduler.evict(TaskKey("ns/t"), "Preempted", "test eviction")
    await parts.loop.run_once()
    hold = parts.controller.held[job.key]
    ledger = parts.controller.scheduler.ledger
    assert (ledger.held.get(hold), [j["metadata"]["name"] for j in parts.client.all(JOBS, "ns")]) == (
        job.placement,
        ["t-1"],
    )
    await asyncio.sleep(0.1)
    await parts.executor.retry_deletions()
    parts.controller.on_job_deleted({"metadata": {"name": "t-1", "namespace": "ns"}})  # its DELETED event
    assert (parts.client.all(JOBS, "ns"), hold in ledger.held) == ([], False)


async def test_an_evicted_jobs_gpus_are_not_given_to_the_next_task_while_it_terminates() -> None:
    """The core holds an evicted workload's GPUs from the moment it is evicted: a task submitted in
    the same pass waits (NoFit) until the old Job is gone, then gets the GPU."""
    parts = Parts()
    parts.submit("old", gpuMemory="20Gi")
    await parts.loop.run_once()
    parts.controller.on_job(parts.client.all(JOBS, "ns")[0])
    parts.controller.scheduler.evict(TaskKey("ns/old"), "Preempted", "test eviction")
    parts.client.objects[("batch", "jobs", "ns", "old-1")]["metadata"]["finalizers"] = ["foregroundDeletion"]
    parts.submit("new", gpuMemory="20Gi")
    await parts.loop.run_once()
    waiting = [c["reason"] for c in parts.status("new")["conditions"] if c["type"] == "Admitted"]
    assert (parts.job_creates(), waiting) == (["old-1"], ["NoFit"])
    parts.controller.on_job_deleted(parts.client.all(JOBS, "ns")[0])
    await parts.loop.run_once()
    assert sorted(parts.job_creates()) == ["new-1", "old-1"]


async def test_a_replica_that_does_not_lead_writes_nothing_and_undoes_its_admissions() -> None:
    """With leadership gone, no create, patch or Event reaches the API, and the task is pending again."""
    parts = Parts()
    parts.leading = False
    parts.submit("t", gpuMemory="8Gi")
    await parts.loop.run_once()
    scheduler = parts.controller.scheduler
    assert (parts.client.writes(), TaskKey("ns/t") in scheduler.pending, scheduler.running) == ([], True, {})


async def test_the_writer_abandons_a_write_whose_leadership_ends_before_it_is_sent() -> None:
    """The guard runs again right before sending: leadership lost meanwhile means Fenced, not a write."""
    client = FakeKubeClient()
    state = {"leading": True}
    writer = Writer(client, leading=lambda: state["leading"])
    original = client.create

    async def slow_create(*args: Any, **kwargs: Any) -> dict[str, Any]:
        state["leading"] = False  # the Lease is lost while the write waits for a thread
        return await original(*args, **kwargs)

    client.create = slow_create  # type: ignore[method-assign]
    with pytest.raises(Fenced):
        await writer.create(JOBS, {"metadata": {"name": "j"}}, "ns")
    assert client.all(JOBS) == []


async def test_a_converter_crash_fails_that_task_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error converting one task (a converter bug on odd input) makes it Failed/InvalidSpec;
    the next task is admitted as usual (before, the handler failed and so did every rebuild)."""
    parts = Parts()
    real = convert.task_from_manifest

    def flaky(obj: dict[str, Any], **kwargs: Any) -> Any:
        if obj["metadata"]["name"] == "odd":
            raise decimal.InvalidOperation("comparison with NaN")
        return real(obj, **kwargs)

    monkeypatch.setattr(convert, "task_from_manifest", flaky)
    parts.submit("odd")
    parts.submit("fine")
    await parts.loop.run_once()
    odd = parts.status("odd")
    reason = next(c["reason"] for c in odd["conditions"] if c["type"] == "Admitted")
    assert (odd["phase"], reason, odd["message"]) == (
        "Failed", "InvalidSpec", "the spec cannot be read (InvalidOperation: comparison with NaN)")
    assert parts.status("fine")["phase"] == "Admitted"


def test_a_malformed_queue_is_inactive_and_stops_nothing_else() -> None:
    """A queue whose spec cannot be used is recorded with its error and leaves the other queues working."""
    controller = Controller(Config())
    inventory = controller.inventory
    inventory.on_queue({"metadata": {"name": "bad"}, "spec": {"resources": "lots"}})
    inventory.on_queue({"metadata": {"name": "good"}, "spec": {}})
    assert (inventory.queue_errors, sorted(controller.scheduler.quotas.specs), controller.scheduler.inactive) == (
        {"bad": "resources must be a list, got 'lots'"},
        ["good"],
        {"bad": "resources must be a list, got 'lots'"},
    )


async def test_kueue_mode_placements_are_in_the_ledger_violations_and_metrics() -> None:
    """A Workload with quota reserved is placed and answered Ready; the placement is the scheduler's like
    any other: counted as admitted in the metrics, and an over-commit of two shows in violations()."""
    parts = Parts(Config(cycleInterval=0.2, queueing="kueue"))
    gate = asyncio.Lock()
    admission = KueueAdmission(parts.client, parts.controller, parts.executor, gate)
    parts.client.put(
        ADMISSIONCHECKS, {"metadata": {"name": "gputask-placement"}, "spec": {"controllerName": "gputask.io/placement"}}
    )
    for name in ("a", "b"):
        parts.submit(name, gpuMemory="20Gi")
        job = parts.client.put(
            JOBS,
            {
                "metadata": {
                    "name": f"{name}-1",
                    "namespace": "ns",
                    "annotations": {
                        "gputask.io/task-uid": parts.controller.tasks[TaskKey(f"ns/{name}")].uid,
                        "gputask.io/attempt": "1",
                    },
                },
                "spec": {},
            },
            "ns",
        )
        parts.controller.on_job(job)
        admission.on_workload(parts.client.put(WORKLOADS, _workload(name), "ns"))
    await admission.sync()
    scheduler = parts.controller.scheduler
    ready = [c["state"] for w in parts.client.all(WORKLOADS, "ns") for c in w["status"]["admissionChecks"]]
    assert (sorted(scheduler.running), sorted(ready)) == (["ns/a"], ["Ready", "Retry"])
    parts.metrics.refresh(scheduler)
    assert parts.metrics.admitted.labels("q")._value.get() == 1.0
    other = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-0", 20480),))
    scheduler.restore(parts.controller.tasks[TaskKey("ns/b")].task, other, charge=False)  # what a stale book says
    assert scheduler.violations() == ["node-a GPU 0: 40960 MiB reserved > 24576 MiB"]


async def test_a_kueue_mode_pass_looks_at_what_events_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    """In Kueue mode a pass with no event since looks at no task and no Workload; a Workload changed (its check
    Pending again after a Retry) is the one answered, and a task changed the one whose Job is looked at."""
    parts = Parts(Config(cycleInterval=0.2, queueing="kueue"))
    admission = KueueAdmission(parts.client, parts.controller, parts.executor, asyncio.Lock())
    parts.client.put(
        ADMISSIONCHECKS, {"metadata": {"name": "gputask-placement"}, "spec": {"controllerName": "gputask.io/placement"}}
    )
    for name in ("a", "b", "c"):
        parts.submit(name, gpuMemory="20Gi")
    await admission.sync()  # after the rebuild, everything: each task gets its suspended Job
    for job in parts.client.all(JOBS, "ns"):
        parts.controller.on_job(job)
        admission.on_job(job)
    for name in ("a", "b", "c"):
        admission.on_workload(parts.client.put(WORKLOADS, _workload(name), "ns"))
    await admission.sync()
    looked: list[str] = []
    for method in ("_ensure_job", "_answer"):
        real = getattr(KueueAdmission, method)

        async def counted(self: KueueAdmission, subject: Any, *args: Any, _real: Any = real, _name: str = method
                          ) -> Any:
            looked.append(f"{_name} {getattr(subject, 'key', subject)}")
            return await _real(self, subject, *args)

        monkeypatch.setattr(KueueAdmission, method, counted)
    await admission.sync()
    quiet = list(looked)
    retried = parts.client.all(WORKLOADS, "ns")[1]  # b: Kueue requeued it and asks again
    retried["status"]["admissionChecks"][0]["state"] = "Pending"
    admission.on_workload(retried)
    admission.note_task(TaskKey("ns/c"))
    await admission.sync()
    assert (quiet, looked) == ([], ["_ensure_job ns/c", "_answer ns/job-b-1"])


def _workload(name: str) -> dict[str, Any]:
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-1", "uid": "u", "controller": True}
    check = {"name": "gputask-placement", "state": "Pending", "message": "", "lastTransitionTime": _now()}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": f"job-{name}-1", "namespace": "ns", "ownerReferences": [owner]},
        "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1}]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "main", "count": 1}]},
            "admissionChecks": [check],
        },
    }


async def test_the_lease_is_renewed_while_a_long_cycle_runs() -> None:
    """A cycle of 1.2 s (longer than the 0.2 s renewal interval) runs on its worker thread: the elector,
    on the event loop, renews the Lease several times meanwhile."""
    parts = Parts()
    lease_client = FakeKubeClient()
    elector = LeaderElector(lease_client, identity="me", namespace="ns", lease_s=2.0, renew_deadline_s=1.5, retry_s=0.2)
    slow = parts.controller.scheduler.cycle

    def long_cycle(now: float) -> Any:
        time.sleep(1.2)  # a cycle over a large cluster: CPU-bound, on the worker thread
        return slow(now)

    parts.controller.scheduler.cycle = long_cycle  # type: ignore[method-assign]

    async def lead() -> None:
        return None

    campaign = asyncio.create_task(elector.run(lead, lead))
    await asyncio.sleep(0.3)
    before = sum(1 for c in lease_client.calls if c[0] == "replace")
    await parts.loop.run_once()
    renewed = sum(1 for c in lease_client.calls if c[0] == "replace") - before
    campaign.cancel()
    assert renewed >= 4, renewed
    assert lease_client.all(LEASES, "ns")[0]["spec"]["holderIdentity"] == "me"


async def test_a_queue_finalizer_patch_refused_as_stale_is_not_retried_until_a_newer_version_is_seen() -> None:
    """The queue-in-use finalizer is patched with the resourceVersion last seen: a 409 (the queue changed
    since) is not retried on every loop pass, only once the watch shows the newer version; then it lands."""
    parts = Parts()
    stored = parts.client.put(GPUCLUSTERQUEUES, {"metadata": {"name": "q"}, "spec": {"namespaceSelector": {}}})
    stale = {**stored, "metadata": {**stored["metadata"], "resourceVersion": "0"}}
    inventory = parts.controller.inventory
    inventory.on_queue(stale)
    await parts.executor.keep_queue_finalizers()
    await parts.executor.keep_queue_finalizers()

    def queue_writes() -> list[tuple[str, str, str | None]]:
        return [w for w in parts.client.writes() if w[1] == "gpuclusterqueues"]

    assert queue_writes() == [("patch", "gpuclusterqueues", "q")]  # one try, refused with 409
    inventory.on_queue(stored)  # the watch's newer version
    await parts.executor.keep_queue_finalizers()
    finalizers = (await parts.client.get(GPUCLUSTERQUEUES, "q"))["metadata"].get("finalizers")
    assert (len(queue_writes()), finalizers) == (2, ["gputask.io/queue-in-use"])


async def test_gpunode_conditions_say_whether_the_kubelets_device_assignments_are_read() -> None:
    """The agent's podResources becomes PodResourcesAvailable beside Accepted (written together, by the operator);
    turning False posts one Warning Event, a deliberately disabled read none, and an unchanged report no write."""
    parts = Parts()
    inventory, now = parts.controller.inventory, time.time()

    async def report(available: bool, reason: str, message: str) -> None:
        status = {"gpus": [GPU0], "heartbeatTime": _now(),
                  "podResources": {"available": available, "reason": reason, "message": message, "pods": []}}
        inventory.on_gpunode(await parts.client.patch(GPUNODES, "node-a", {"status": status}, status=True), now)

    def writes() -> int:
        return len([c for c in parts.client.calls if c[:2] == ("patch-status", "gpunodes")])

    def conditions() -> list[tuple[str, str, str]]:
        stored = parts.client.all(GPUNODES)[0].get("status") or {}
        return [(c["type"], c["status"], c["reason"]) for c in stored.get("conditions") or []]

    def warnings() -> list[str]:
        return [e["reason"] for e in parts.client.all(EVENTS, "default") if e.get("type") == "Warning"]

    seen = []
    for available, reason in ((True, "Listed"), (True, "Listed"), (False, "SocketNotFound"), (False, "Disabled")):
        await report(available, reason, "m")
        before = writes()
        await parts.executor.report_gpunodes()
        seen.append((conditions(), warnings(), writes() - before))
    accepted = ("Accepted", "True", "Sound")
    assert seen == [
        ([accepted, ("PodResourcesAvailable", "True", "Listed")], [], 1),
        ([accepted, ("PodResourcesAvailable", "True", "Listed")], [], 0),
        ([accepted, ("PodResourcesAvailable", "False", "SocketNotFound")], ["PodResourcesUnavailable"], 1),
        ([accepted, ("PodResourcesAvailable", "False", "Disabled")], ["PodResourcesUnavailable"], 1),
    ]


async def test_dra_mode_makes_the_template_before_the_job_and_deletes_it_with_the_job() -> None:
    """pinning dra: the ResourceClaimTemplate is created before the Job, deleting the task's Job deletes its template
    (the claim of a pod goes with the pod), and a refused Job takes the template just made with it."""

    def dra_calls(parts: Parts) -> list[tuple[str, str, str | None]]:
        return [c for c in parts.client.calls if c[1] in ("resourceclaimtemplates", "jobs") and c[0] != "get"]

    parts = Parts(Config(cycleInterval=0.2, pinning="dra"))
    parts.submit("t")
    await parts.loop.run_once()
    await parts.executor.delete_job(parts.controller.tasks[TaskKey("ns/t")])
    refused = Parts(Config(cycleInterval=0.2, pinning="dra"))
    refused.client.fail("create", "jobs", status=422, message="refused")
    refused.submit("u")
    await refused.loop.run_once()
    assert (dra_calls(parts), dra_calls(refused), refused.client.all(RESOURCECLAIMTEMPLATES, "ns")) == (
        [("create", "resourceclaimtemplates", "t-1"), ("create", "jobs", "t-1"), ("delete", "jobs", "t-1"),
         ("delete", "resourceclaimtemplates", "t-1")],
        [("create", "resourceclaimtemplates", "u-1"), ("create", "jobs", "u-1"),
         ("delete", "resourceclaimtemplates", "u-1")],
        [],
    )


def test_heartbeats_turn_stale_and_fresh_as_time_passes_and_only_due_nodes_are_looked_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPUNode's heartbeat goes stale once older than heartbeatStaleAfter and one from the future turns fresh
    once within the clock skew, with no event; a check before either moment reads no GPUNode at all."""
    from gputask.k8s import inventory as inventory_module

    parts = Parts(Config(heartbeatStaleAfter=120))
    inventory, start = parts.controller.inventory, time.time()
    beat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + 3600))
    for name, when in (("node-a", beat), ("node-b", future)):
        status = {"gpus": [{**GPU0, "uuid": f"GPU-{name}"}], "heartbeatTime": when}
        inventory.on_gpunode({"metadata": {"name": name}, "status": status}, start)
    read: list[str] = []
    real = inventory_module.Inventory._heartbeat

    def counted(self: Any, status: Any, now: float) -> Any:
        read.append(str(status.get("heartbeatTime")))
        return real(self, status, now)

    monkeypatch.setattr(inventory_module.Inventory, "_heartbeat", counted)
    seen = []
    for at in (start + 60, start + 125, start + 3600 - 50):
        inventory.check_heartbeats(at)
        seen.append((sorted(inventory.stale), len(read)))
    assert seen == [(["node-b"], 0), (["node-a", "node-b"], 2), (["node-a"], 4)]


def test_the_tasks_of_a_namespace_are_known_without_a_pass_over_every_task() -> None:
    """The controller keeps task keys by namespace as tasks come and go: a namespace's event (its labels decide
    whether Kueue manages its Jobs) makes only those due for the Kueue check."""
    parts = Parts()
    for name in ("a", "b"):
        parts.submit(name)
    other = parts.client.put(GPUTASKS, {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask",
                                        "metadata": {"name": "c", "namespace": "ml"}, "spec": {}}, "ml")
    parts.controller.on_task(other)
    parts.controller.on_task_deleted(parts.client.all(GPUTASKS, "ns")[0])
    assert parts.controller.in_namespace == {"ns": {TaskKey("ns/b")}, "ml": {TaskKey("ml/c")}}


class Counted(dict):  # type: ignore[type-arg]  # a dict that counts passes over it
    """A dict that counts how often something walks its keys, values or items."""

    walks = 0

    def __iter__(self) -> Any:
        Counted.walks += 1
        return super().__iter__()

    def values(self) -> Any:
        Counted.walks += 1
        return super().values()

    def items(self) -> Any:
        Counted.walks += 1
        return super().items()


async def test_a_loop_pass_costs_what_changed_not_the_number_of_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 300 tasks waiting behind one running, a loop pass with nothing new tries no task and walks neither the
    task records, the pending queue nor the running tasks (queue statuses, finalizers, metrics, heartbeats
    included); a pass with one new task tries that one."""
    from gputask.core.queues import QueueManager

    parts = Parts()
    parts.submit("running", gpuMemory="24Gi")
    for i in range(300):
        parts.submit(f"w{i:03d}", gpuMemory="24Gi")
    for _ in range(3):
        await parts.loop.run_once()
    walks = {"pending": 0}
    real_iter = QueueManager.__iter__

    def counted_iter(self: QueueManager) -> Any:
        walks["pending"] += 1
        return real_iter(self)

    monkeypatch.setattr(QueueManager, "__iter__", counted_iter)
    controller, scheduler = parts.controller, parts.controller.scheduler
    controller.tasks = Counted(controller.tasks)
    scheduler.ledger.running = Counted(scheduler.ledger.running)
    Counted.walks = 0
    parts.loop._metrics_at = float("-inf")  # the once-a-second gauges too
    await parts.loop.run_once()
    quiet = (scheduler.stats.mode, scheduler.stats.tried, walks["pending"], Counted.walks)
    parts.submit("late", gpuMemory="24Gi")
    parts.loop._metrics_at = float("-inf")
    await parts.loop.run_once()
    assert (quiet, (scheduler.stats.mode, scheduler.stats.tried, walks["pending"], Counted.walks)) == (
        ("skipped", 0, 0, 0), ("incremental", 1, 0, 0)
    )


def task_pod(job: dict[str, Any], *, node: str | None = "node-a", phase: str = "Running") -> dict[str, Any]:
    """Pod ``<job>-abcde`` (uid ``pod-1``) of ``job`` as the Job controller makes it, bound to ``node`` (None: not
    bound), in ``phase``."""
    template = job["spec"]["template"]
    meta = {"name": f"{job['metadata']['name']}-abcde", "namespace": "ns", "uid": "pod-1",
            "labels": template["metadata"]["labels"] | {"batch.kubernetes.io/job-name": job["metadata"]["name"]},
            "annotations": template["metadata"]["annotations"],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"]}]}
    spec = {**template["spec"], **({"nodeName": node} if node else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


async def evicted_with_its_pod(parts: Parts, *, node: str | None = "node-a") -> dict[str, Any]:
    """Task ``t`` (20Gi of node-a's only GPU) with its pod, evicted for NodeFailure; its Job deleted and the DELETED
    event fed while the pod is still there. Returns the pod."""
    parts.submit("t", gpuMemory="20Gi")
    await parts.loop.run_once()
    job = parts.client.all(JOBS, "ns")[0]
    parts.controller.on_job(job)
    pod = task_pod(job, node=node)
    parts.controller.on_task_pod(pod)
    parts.controller.scheduler.evict(TaskKey("ns/t"), "NodeFailure", "node node-a failed", failure=True)
    await parts.loop.run_once()
    parts.controller.on_job_deleted(job)
    await parts.loop.run_once()
    return pod


async def test_a_jobs_gpus_stay_held_while_its_bound_pod_outlives_it_and_are_freed_when_it_finishes() -> None:
    """An evicted task's Job is gone but its pod still runs on node-a: the GPU stays held (the task waits, the
    Evicted condition and held_for say why) until the pod is Failed; then the task gets it back as attempt 2 and
    Evicted turns False with reason QuotaReserved."""
    parts = Parts()
    pod = await evicted_with_its_pod(parts)
    note = "GPUs on node node-a held until pod t-1-abcde is gone"
    conditions = {c["type"]: (c["status"], c["reason"], c["message"]) for c in parts.status("t")["conditions"]}
    assert (parts.job_creates(), conditions["Evicted"], conditions["Admitted"][1],
            parts.controller.held_for(TaskKey("ns/t"))) == (
        ["t-1"], ("True", "NodeFailure", f"node node-a failed; {note}"), "NoFit", [note])
    parts.controller.on_task_pod(pod | {"status": {"phase": "Failed"}})
    await parts.loop.run_once()
    conditions = {c["type"]: (c["status"], c["reason"], c["message"]) for c in parts.status("t")["conditions"]}
    assert (parts.job_creates(), conditions["Evicted"], conditions["Requeued"],
            parts.controller.held_for(TaskKey("ns/t")), parts.controller.scheduler.ledger.held) == (
        ["t-1", "t-2"], ("False", "QuotaReserved", "Previously: node node-a failed"),
        ("False", "QuotaReserved", "Previously: requeued after NodeFailure"), [], {})


async def test_a_pod_not_bound_to_a_node_does_not_keep_a_gone_jobs_gpus() -> None:
    """A pod still Pending and unbound runs nowhere: once its Job is gone the GPU is free and the task re-admitted."""
    parts = Parts()
    await evicted_with_its_pod(parts, node=None)
    await parts.loop.run_once()
    assert (parts.job_creates(), parts.controller.scheduler.ledger.held) == (["t-1", "t-2"], {})


async def test_a_relisting_without_the_pod_frees_a_gone_jobs_gpus() -> None:
    """After a gap in the pod watch, a relisting that lacks the lingering pod (it was deleted meanwhile) releases the
    GPU held for it."""
    parts = Parts()
    await evicted_with_its_pod(parts)
    held_before = sorted(parts.controller.scheduler.ledger.held)
    parts.controller.keep_task_pods(set())
    await parts.loop.run_once()
    assert (held_before, parts.job_creates(), parts.controller.scheduler.ledger.held) == (
        ["ns/t#departing-1"], ["t-1", "t-2"], {})


def test_quota_reserved_again_resets_evicted_and_requeued_once() -> None:
    """Evicted and Requeued True turn False (QuotaReserved, "Previously: ...") at a quota reservation; a second one
    with no eviction between (a refused Job tried again) leaves them as they are, and absent ones stay absent."""
    record = TaskRecord(TaskKey("ns/t"), "uid-t", {"metadata": {"name": "t", "namespace": "ns", "generation": 1}})
    set_condition(record, "Evicted", True, "Preempted", "preempted by ns/high")
    set_condition(record, "Requeued", True, "Preempted", "requeued after Preempted")
    reset_requeue_conditions(record)
    first = {k: dict(c) for k, c in record.conditions.items()}
    reset_requeue_conditions(record)
    assert (record.conditions, {k: (c["status"], c["reason"], c["message"]) for k, c in first.items()}) == (first, {
        "Evicted": ("False", "QuotaReserved", "Previously: preempted by ns/high"),
        "Requeued": ("False", "QuotaReserved", "Previously: requeued after Preempted"),
    })


async def test_a_task_of_pod_sets_is_admitted_as_its_indexed_jobs() -> None:
    """A GPUTask of spec.podSets (two pods sharing node-a's GPU) is admitted and gets the Indexed Job of its PodSet;
    a bad PodSet, and a PodSet without the template its Job is made of, go Failed/InvalidSpec with no Job."""
    parts = Parts()
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    for name, pod_sets in (("gang", [{"name": "workers", "count": 2, "gpuMemory": "8Gi", "template": template}]),
                           ("bad", [{"name": "workers", "count": 0, "template": template}]),
                           ("bare", [{"name": "workers", "count": 2, "gpuMemory": "8Gi"}])):
        body = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": name, "namespace": "ns"},
                "spec": {"queueName": "q", "podSets": pod_sets}}
        parts.controller.on_task(parts.client.put(GPUTASKS, body, "ns"))
    await parts.loop.run_once()
    found = {n: (parts.status(n)["phase"], parts.status(n).get("message")) for n in ("bad", "bare")}
    assert found == {
        "bad": ("Failed", "spec.podSets[0].count: Invalid value: 0: spec.podSets[0].count in body should be greater "
                          "than or equal to 1"),
        "bare": ("Failed", "spec.podSets[0].template: Required value: the PodSet's pods run as an Indexed Job of it"),
    }
    (job,) = parts.client.all(JOBS)
    assert (parts.status("gang")["phase"], parts.status("gang")["jobName"]) == ("Admitted", "gang-1-workers")
    assert (job["metadata"]["name"], job["spec"]["completionMode"], job["spec"]["completions"],
            job["spec"]["parallelism"]) == ("gang-1-workers", "Indexed", 2, 2)
    assert [p["node"] for p in parts.status("gang")["placement"]["pods"]] == ["node-a", "node-a"]
