"""gputask on a real cluster (kind): admission onto fake GPUs, preemption, and node-failure rescheduling.

Runs with ``make e2e`` where Docker can run kind; skipped, with the reason, anywhere else.
The tests run in file order on one cluster and each frees the GPUs it used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kindtools
import pytest
import yaml
from kindtools import Kube, evictions, run, wait_until

from gputask.k8s.jobs import PLACEMENT_ANNOTATION, job_name

REASON = kindtools.missing_prerequisites()
# Skip every test (collected, so `make e2e` exits 0 and reports them skipped) where kind cannot run.
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"kind e2e suite skipped: {REASON}")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NAMESPACE = "gputask-e2e"
RUNNING_PHASES = ("Admitted", "Running", "Succeeded")
# Simulation fixtures of examples/: on a real cluster the kubelet registers Nodes and the agent writes GPUNodes.
NOT_APPLIED = ("Node", "GPUNode")


def example_objects() -> list[dict[str, Any]]:
    """The objects of examples/*.yaml a user applies to a real cluster (queues and tasks)."""
    docs = [doc for path in sorted(EXAMPLES.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return [doc for doc in docs if doc["kind"] not in NOT_APPLIED]


def task(name: str, *, queue: str, priority: str | None = None) -> dict[str, Any]:
    """A GPUTask for one whole GPU running a long sleep in the test namespace."""
    spec: dict[str, Any] = {
        "queueName": queue,
        "gpus": 1,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 2,
                "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}],
            }
        },
    }
    if priority:
        spec["priorityClassName"] = priority
    return {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUTask",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def queue(name: str, *, gpus: int, preemption: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A GPUClusterQueue open to all namespaces with ``gpus`` GPUs of nominal quota, and the GPULocalQueue of
    the same name in the test namespace that tasks name."""
    spec: dict[str, Any] = {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}
    if preemption:
        spec["preemption"] = preemption
    local = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPULocalQueue",
             "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"clusterQueue": name}}
    return [{"apiVersion": "gputask.io/v1alpha1", "kind": "GPUClusterQueue", "metadata": {"name": name}, "spec": spec},
            local]


def priority_class(name: str, value: int) -> dict[str, Any]:
    """A scheduling.k8s.io PriorityClass that is never the default."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": False,
    }


def admitted(cluster: Kube, name: str, namespace: str = NAMESPACE, *, attempt: int = 1) -> dict[str, Any]:
    """Wait until a GPUTask is admitted (attempt ``attempt``) with its Job named; its status."""

    def probe() -> dict[str, Any] | None:
        status = ((cluster.get("gputask", name, namespace) or {}).get("status")) or {}
        ok = status.get("phase") in RUNNING_PHASES and status.get("jobName") and status.get("attempt") == attempt
        return status if ok else None

    return wait_until(probe, timeout_s=240, what=f"GPUTask {namespace}/{name} admitted (attempt {attempt})")


def pinned(job: dict[str, Any]) -> tuple[dict[str, Any], list[str], str]:
    """A Job's placement annotation, the node names its affinity requires, and NVIDIA_VISIBLE_DEVICES."""
    pod = job["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    return (
        json.loads(job["metadata"]["annotations"][PLACEMENT_ANNOTATION]),
        [v for f in terms[0]["matchFields"] if f["key"] == "metadata.name" for v in f["values"]],
        env["NVIDIA_VISIBLE_DEVICES"],
    )


@pytest.fixture(scope="module")
def namespace(cluster: Kube) -> str:
    """The namespace the preemption and node-failure tasks run in."""
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    return NAMESPACE


def test_examples_are_admitted_onto_fake_gpus_with_pinned_jobs(cluster: Kube) -> None:
    """Each example GPUTask gets Job <task>-1 pinned to a worker and to GPUs that worker's GPUNode reports."""
    objects = example_objects()
    cluster.apply(objects)
    gpus = {g["metadata"]["name"]: {d["uuid"] for d in g["status"]["gpus"]} for g in cluster.list("gpunodes")}
    tasks = [o for o in objects if o["kind"] == "GPUTask"]
    try:
        checks = {obj["metadata"]["name"]: placement_checks(cluster, obj, gpus) for obj in tasks}
    finally:
        cluster.delete(tasks)  # frees the GPUs for the next tests
    assert checks == {name: dict.fromkeys(checks[name], True) for name in checks} and len(checks) == len(tasks)


def placement_checks(cluster: Kube, obj: dict[str, Any], gpus: dict[str, set[str]]) -> dict[str, bool]:
    """Wait for one example task's admission and check its Job's pinning against its status and the GPUNodes."""
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    status = admitted(cluster, name, namespace)
    job = cluster.get("job", status["jobName"], namespace)
    assert job is not None, f"Job {namespace}/{status['jobName']} of admitted task {name} missing"
    placement, hostnames, visible = pinned(job)
    return {
        "job": job["metadata"]["name"] == job_name(name, 1),
        "status agrees": placement["node"] == status["placement"]["node"],
        "node pinned": hostnames == [placement["node"]],
        "GPUs reported": bool(placement["uuids"]) and set(placement["uuids"]) <= gpus.get(placement["node"], set()),
        "devices visible": visible == ",".join(placement["uuids"]),
    }


def test_reapplying_examples_server_side_changes_nothing(cluster: Kube) -> None:
    """Re-applying the queues server-side, as a GitOps tool does, succeeds and changes no spec."""
    queues = [o for o in example_objects() if o["kind"] == "GPUClusterQueue"]  # (LocalQueues: namespaced)
    cluster.apply(queues)
    before = {q["metadata"]["name"]: cluster.get("gpuclusterqueue", q["metadata"]["name"]) for q in queues}
    cluster.apply(queues)
    after = {q["metadata"]["name"]: cluster.get("gpuclusterqueue", q["metadata"]["name"]) for q in queues}
    generations = {name: (obj or {})["metadata"]["generation"] for name, obj in before.items()}
    assert {name: (obj or {})["metadata"]["generation"] for name, obj in after.items()} == generations


def test_high_priority_task_preempts_a_lower_one_in_a_full_queue(cluster: Kube, namespace: str) -> None:
    """With quota for one GPU and withinClusterQueue LowerPriority, a high-priority task evicts the running low one."""
    setup = [
        priority_class("gputask-e2e-low", 100),
        priority_class("gputask-e2e-high", 1000),
        *queue("e2e-preempt", gpus=1, preemption={"withinClusterQueue": "LowerPriority"}),
    ]
    low, high = (
        task("e2e-low", queue="e2e-preempt", priority="gputask-e2e-low"),
        task("e2e-high", queue="e2e-preempt", priority="gputask-e2e-high"),
    )
    cluster.apply(setup)
    try:
        cluster.apply([low])
        victim_job = admitted(cluster, "e2e-low")["jobName"]
        with cluster.watch("gputask", "e2e-low", namespace) as versions:
            cluster.apply([high])
            preemptor = admitted(cluster, "e2e-high")
            wait_until(
                lambda: cluster.get("job", victim_job, namespace) is None,
                timeout_s=180,
                what=f"victim Job {victim_job} deleted",
            )
        victim = cluster.get("gputask", "e2e-low", namespace) or {}
        outcome = {
            "victim evicted by": evictions(versions),
            "victim phase": victim["status"]["phase"],
            "victim Job": cluster.get("job", victim_job, namespace),
            "preemptor Job": (cluster.get("job", job_name("e2e-high", 1), namespace) or {})
            .get("metadata", {})
            .get("name"),
            "preemptor attempt": preemptor["attempt"],
        }
        assert outcome == {
            "victim evicted by": ["Preempted"],
            "victim phase": "Pending",
            "victim Job": None,
            "preemptor Job": job_name("e2e-high", 1),
            "preemptor attempt": 1,
        }
    finally:
        cluster.delete([high, low, *setup])


def test_task_on_a_stopped_node_is_evicted_and_readmitted_elsewhere(cluster: Kube, namespace: str) -> None:
    """Stopping a task's worker evicts it (NodeFailure) after the 20 s grace; attempt 2 runs on the other worker."""
    setup, victim = queue("e2e-resched", gpus=4), task("e2e-resched", queue="e2e-resched")
    cluster.apply(setup)
    cluster.apply([victim])
    try:
        failed_node = admitted(cluster, "e2e-resched")["placement"]["node"]
        with cluster.watch("gputask", "e2e-resched", namespace) as versions:
            run(["docker", "stop", failed_node])  # a kind node is a container named after the node
            try:
                status = admitted(cluster, "e2e-resched", attempt=2)
            finally:
                run(["docker", "start", failed_node])
        job = cluster.get("job", job_name("e2e-resched", 2), namespace)
        assert job is not None, f"Job {job_name('e2e-resched', 2)} missing"
        placement, hostnames, _ = pinned(job)
        outcome = {
            "evicted by": evictions(versions),
            "moved": status["placement"]["node"] != failed_node,
            "Job node": placement["node"] == status["placement"]["node"] == hostnames[0],
            "attempt": status["attempt"],
        }
        assert outcome == {"evicted by": ["NodeFailure"], "moved": True, "Job node": True, "attempt": 2}
    finally:
        cluster.delete([victim, *setup])
