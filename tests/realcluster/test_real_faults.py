"""Faults on the real control plane (issue 33, issue 28 item 5): what only real components show.

A NoExecute taint's eviction by the taint manager (a ``DisruptionTarget`` pod), a failed node's pod that
outlives its Job until the kubelet returns, the API server SIGKILLed and restarted while Jobs are being
created (creates served whose answer was lost), and the chart's RBAC through each path with zero 403s in
the API server's audit log. These tests run after ``test_real_control_plane.py`` on the same control plane
(``conftest.py``) and start by deleting the tasks it left running.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from gputask.k8s.jobs import parse_placement
from gputask.testing.controlplane import ControlPlane
from realcluster.realstack import EXAMPLES, OPERATOR_USER, REASON, Installed, example_gpunodes, wait_for

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.skipif(REASON is not None, reason=f"real control plane suite skipped: {REASON}"),
]

TASK_LABEL = "gputask.io/task"
BURST_NAMESPACE = "burst"
BURST_TASKS = 40  # 4Gi each: 24 fit on the four nodes' six GPUs (16+8+24+16+8+24 Gi), 16 wait
BURST_FIT = 24
BURST_KILL_AT = 2  # Jobs seen before the API server is SIGKILLed: the others are being created
NO_ANSWER = re.compile(r"creating Job (\S+) got no answer")


def gputask(name: str, namespace: str = "default", queue: str = "default", memory: str = "2Gi",
            products: list[str] | None = None, node: str | None = None, priority: str | None = None,
            grace_s: int | None = None, tolerate_down: bool = False) -> dict[str, Any]:
    """A one-GPU GPUTask manifest asking ``memory`` (a quantity) of ``products``, its pod on ``node`` when given
    (``nodeSelector``), with ``priority`` (a PriorityClass), ``grace_s`` (terminationGracePeriodSeconds), and
    when ``tolerate_down`` the unreachable and not-ready taints tolerated for ever."""
    pod: dict[str, Any] = {"restartPolicy": "Never",
                           "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}
    if node:
        pod["nodeSelector"] = {"kubernetes.io/hostname": node}
    if grace_s is not None:
        pod["terminationGracePeriodSeconds"] = grace_s
    if tolerate_down:
        pod["tolerations"] = [{"key": f"node.kubernetes.io/{k}", "operator": "Exists"}
                              for k in ("unreachable", "not-ready")]
    spec: dict[str, Any] = {"queueName": queue, "gpus": 1, "gpuMemory": memory, "template": {"spec": pod}}
    if products:
        spec["gpuProducts"] = products
    if priority:
        spec["priorityClassName"] = priority
    return {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def apply(installed: Installed, *objects: dict[str, Any]) -> None:
    """``kubectl apply`` the objects (one List) as admin."""
    installed.cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                  "items": list(objects)}))


def listed(installed: Installed, kind: str, namespace: str = "default", *selector: str) -> list[dict[str, Any]]:
    """Every object of ``kind`` in ``namespace`` (``-l`` selector arguments when given)."""
    return installed.kubectl("get", kind, "-n", namespace, *selector, "-o", "json")["items"]


def task_status(installed: Installed, name: str, namespace: str = "default") -> dict[str, Any]:
    """A GPUTask's status ({} before it has one, or when it is gone)."""
    return (installed.get("gputasks.gputask.io", name, namespace) or {}).get("status") or {}


def condition(found: dict[str, Any], ctype: str) -> tuple[str, str, str]:
    """(status, reason, message) of a status's condition; empty strings when absent."""
    cond = next((c for c in found.get("conditions") or [] if c["type"] == ctype), {})
    return cond.get("status", ""), cond.get("reason", ""), cond.get("message", "")


def pods_of(installed: Installed, job: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The pods of Job ``job`` (by the Job controller's ``job-name`` label), even after the Job is gone."""
    return listed(installed, "pods", namespace, "-l", f"job-name={job}")


def running_on(installed: Installed, name: str, attempt: int = 1) -> str | None:
    """The node of a task Running in ``attempt`` whose one live pod runs there (bound to the placed node)."""
    found = task_status(installed, name)
    if found.get("phase") != "Running" or found.get("attempt") != attempt:
        return None
    pods = [p for p in pods_of(installed, found["jobName"]) if not p["metadata"].get("deletionTimestamp")]
    placed = found["placement"]["node"]
    if len(pods) == 1 and pods[0]["status"].get("phase") == "Running" and pods[0]["spec"].get("nodeName") == placed:
        return str(placed)
    return None


def events(installed: Installed, name: str, namespace: str = "default") -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events about object ``name``, oldest first."""
    found = installed.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}",
                              "-o", "json")["items"]
    found.sort(key=lambda e: (e.get("firstTimestamp") or e.get("eventTime") or "", e["metadata"]["name"]))
    return [(e["type"], e["reason"], e["message"]) for e in found]


def delete_tasks(installed: Installed, namespace: str = "default", timeout_s: float = 120) -> None:
    """Delete every GPUTask of ``namespace`` and wait until they, their Jobs and their pods are gone."""
    installed.cp.kubectl("delete", "gputasks.gputask.io", "--all", "-n", namespace, "--wait=false")
    wait_for(lambda: not any(listed(installed, k, namespace) for k in ("gputasks.gputask.io", "jobs", "pods")),
             timeout_s, f"the tasks, Jobs and pods of {namespace} gone")


def all_nodes_back(installed: Installed) -> None:
    """Every hollow node Ready and its agent's GPUNode reporting GPUs (restart what an earlier test killed)."""
    pids = installed.cp.pids()
    for node, spec in example_gpunodes().items():
        if node not in pids:
            installed.cp.start_component(node)
        if f"agent-{node}" not in pids:
            installed.start_agent(node, spec)
    installed.cp.wait_nodes_ready(list(example_gpunodes()))


def fresh(installed: Installed) -> None:
    """No GPUTask left in namespaces default and burst (what an earlier test, failed or not, left running)."""
    for namespace in ("default", BURST_NAMESPACE):
        delete_tasks(installed, namespace)


@pytest.fixture(scope="module")
def emptied(installed: Installed) -> Iterator[Installed]:
    """The control plane with the examples' queue ``default``, every agent's GPUNode reported, and no GPUTask left
    in namespace default (the earlier tests' tasks deleted)."""
    all_nodes_back(installed)
    installed.cp.kubectl("apply", "-f", str(EXAMPLES / "10-queue.yaml"))
    wait_for(lambda: sum(bool((n.get("status") or {}).get("gpus")) for n in installed.kubectl(
        "get", "gpunodes.gputask.io", "-o", "json")["items"]) == len(example_gpunodes()), 60, "every GPUNode")
    delete_tasks(installed)
    yield installed


def test_a_noexecute_taint_eviction_requeues_the_task_and_places_it_again(emptied: Installed) -> None:
    """A NoExecute taint on the node a task's pod was just bound to: the taint manager deletes the pod
    (DisruptionTarget DeletionByTaintManager) before it starts and the Job fails; gputask evicts and requeues the
    task with that reason in the Evicted condition and a Warning Event, then places it on another node (attempt
    2); the task is never Failed. (The kubelets are paused meanwhile: a hollow node's container stopped once
    running exits 0, and its Job completes.)"""
    installed = emptied
    fresh(installed)
    nodes = list(example_gpunodes())
    for node in nodes:
        installed.cp.pause(node)
    try:
        apply(installed, gputask("tainted"))
        bound = wait_for(lambda: [p["spec"].get("nodeName") for p in pods_of(installed, "tainted-1")
                                  if p["spec"].get("nodeName")], 60, "pod tainted-1-* bound")
        node = bound[0]
        installed.cp.kubectl("taint", "node", node, "gputask.io/test=evict:NoExecute")
        pod = wait_for(lambda: [p for p in pods_of(installed, "tainted-1") if p["metadata"].get("deletionTimestamp")],
                       30, "pod tainted-1-* deleted by the taint manager")[0]
    finally:
        for paused in nodes:
            installed.cp.resume(paused)
    phases = []

    def again() -> str | None:
        phases.append(task_status(installed, "tainted").get("phase"))
        return running_on(installed, "tainted", attempt=2)

    try:
        new_node = wait_for(again, 60, "tainted Running again (attempt 2)")
    finally:
        installed.cp.kubectl("taint", "node", node, "gputask.io/test-")
    target = next(c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget")
    said = (f"pod {pod['metadata']['name']} of Job tainted-1 was disrupted by the system (DeletionByTaintManager: "
            f"{target['message']}); requeued")
    found = task_status(installed, "tainted")
    assert (target["reason"], new_node != node, "Failed" in phases, condition(found, "Evicted"),
            condition(found, "Requeued"), installed.get("job", "tainted-1")) == (
        "DeletionByTaintManager", True, False, ("False", "QuotaReserved", f"Previously: {said}"),
        ("False", "QuotaReserved", "Previously: requeued after DeletionByTaintManager"),
        None,  # the failed Job is deleted with the eviction
    )
    assert [e for e in events(installed, "tainted") if e[1] == "DeletionByTaintManager"] == [
        ("Warning", "DeletionByTaintManager", said)]
    delete_tasks(installed)


def test_a_failed_nodes_gpus_stay_held_until_its_old_pod_is_gone(emptied: Installed) -> None:
    """node-b's kubelet (one A10) dies under task hold-a: after the grace period its Job hold-a-1 is gone while
    pod hold-a-1-* stays Running with a deletionTimestamp; hold-a is placed again on node-d (the other A10) with
    Evicted and Requeued False (QuotaReserved, 'Previously: ...' naming the held GPUs) and a GPUsHeld Event.
    hold-b, for node-b and tolerating its taints, waits while that pod exists, and its Job is created only once
    the returning kubelet has removed it (never both), with a GPUsReleased Event."""
    installed = emptied
    fresh(installed)
    a10 = ["NVIDIA-A10"]
    apply(installed, gputask("hold-filler", memory="24Gi", products=a10, node="node-d"))
    wait_for(lambda: running_on(installed, "hold-filler"), 60, "hold-filler Running on node-d")
    apply(installed, gputask("hold-a", memory="24Gi", products=a10, grace_s=1))
    assert wait_for(lambda: running_on(installed, "hold-a"), 60, "hold-a Running") == "node-b"
    installed.cp.kubectl("delete", "gputasks.gputask.io", "hold-filler", "-n", "default")
    wait_for(lambda: not pods_of(installed, "hold-filler-1"), 60, "hold-filler's pod gone: node-d free")
    installed.cp.kill("node-b")
    installed.cp.kill("agent-node-b")
    assert wait_for(lambda: running_on(installed, "hold-a", attempt=2), 90, "hold-a Running again") == "node-d"
    lingering = pods_of(installed, "hold-a-1")
    assert (installed.get("job", "hold-a-1"), [(p["spec"]["nodeName"], bool(p["metadata"].get("deletionTimestamp")),
                                                p["status"]["phase"]) for p in lingering]) == (
        None, [("node-b", True, "Running")])
    old_pod = lingering[0]["metadata"]["name"]
    note = f"GPUs on node node-b held until pod {old_pod} is gone"
    found = task_status(installed, "hold-a")
    evicted, requeued = condition(found, "Evicted"), condition(found, "Requeued")
    assert (evicted[:2], requeued[:2], evicted[2].startswith("Previously: "), evicted[2].endswith(f"; {note}"),
            requeued[2].startswith("Previously: ")) == (
        ("False", "QuotaReserved"), ("False", "QuotaReserved"), True, True, True), (evicted, requeued)
    assert ("Normal", "GPUsHeld", note) in events(installed, "hold-a")

    apply(installed, gputask("hold-b", memory="24Gi", products=a10, node="node-b", tolerate_down=True))
    seen: list[tuple[bool, bool]] = []  # (pod hold-a-1-* exists unfinished, Job hold-b-1 exists), at each look

    def look() -> tuple[bool, bool]:
        # The Job first: seen at t1 and the pod unfinished at t2 > t1 means both at t2 (hold-b-1 is not deleted
        # here). Read the other way round, the kubelet could finish the pod and the operator create the Job
        # between the two reads (each a kubectl call), and an overlap that never was would be seen.
        job = installed.get("job", "hold-b-1") is not None
        state = (any(p["status"].get("phase") not in ("Succeeded", "Failed") for p in pods_of(installed, "hold-a-1")),
                 job)
        if not seen or seen[-1] != state:
            seen.append(state)
        return state

    for _ in range(8):  # node-b still down: hold-b waits on the held GPU
        look()
        time.sleep(0.5)
    installed.cp.start_component("node-b")
    installed.start_agent("node-b", example_gpunodes()["node-b"])
    wait_for(lambda: look() == (False, True), 90, "pod hold-a-1-* gone and Job hold-b-1 created", interval_s=0.1)
    released = "GPUs on node node-b released: the pods of Job hold-a-1 are gone"
    assert ([s for s in seen if s != (False, False)], ("Normal", "GPUsReleased", released) in events(
        installed, "hold-a")) == ([(True, False), (False, True)], True)
    assert wait_for(lambda: running_on(installed, "hold-b"), 60, "hold-b Running") == "node-b"
    delete_tasks(installed)


def queue(name: str, gpus: int, memory: str, within: str = "Never",
          namespace: str = "default") -> list[dict[str, Any]]:
    """A GPUClusterQueue ``name`` open to every namespace (``gpus`` and ``memory`` of nominal quota, preemption
    ``within`` its own tasks) and a GPULocalQueue of that name in ``namespace`` pointing at it."""
    return [
        {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUClusterQueue", "metadata": {"name": name},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": within},
                  "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus},
                                {"name": "gputask.io/gpu-memory", "nominalQuota": memory}]}},
        {"apiVersion": "gputask.io/v1alpha1", "kind": "GPULocalQueue",
         "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": name}},
    ]


def mib(quantity: str) -> int:
    """MiB in a binary quantity of the agents' GPUNodes (``24Gi``, ``8192Mi``)."""
    number, unit = re.fullmatch(r"(\d+)(Gi|Mi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def live(job: dict[str, Any]) -> bool:
    """A Job neither finished (Complete or Failed True) nor being deleted."""
    ended = any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
                for c in (job.get("status") or {}).get("conditions") or [])
    return not ended and not job["metadata"].get("deletionTimestamp")


def broken_invariants(installed: Installed, namespace: str) -> dict[str, Any]:
    """What the API state breaks: GPUs over their memory (uuid -> [booked MiB, MiB] from the live Jobs' placement
    annotations and the GPUNodes), tasks with more than one live Job, tasks whose status does not match their
    Job (Running: its one live Job, same placement; otherwise none), finished tasks with a live Job."""
    capacity = {g["uuid"]: mib(g["memory"]) for n in installed.kubectl("get", "gpunodes.gputask.io", "-o", "json")[
        "items"] for g in (n.get("status") or {}).get("gpus") or []}
    jobs = [j for j in listed(installed, "jobs", namespace) if live(j)]
    booked: Counter[str] = Counter()
    live_jobs: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        placement = parse_placement(job["metadata"]["annotations"].get("gputask.io/placement"))
        assert placement is not None, job["metadata"]["name"]
        for gpu in placement.only().gpus:
            booked[gpu.uuid] += gpu.memory_mib
        live_jobs.setdefault(job["metadata"]["labels"].get(TASK_LABEL, ""), []).append(job)
    mismatched, finished_rerun = [], []
    for task in listed(installed, "gputasks.gputask.io", namespace):
        name, found = task["metadata"]["name"], task.get("status") or {}
        mine = live_jobs.get(name, [])
        if found.get("phase") in ("Succeeded", "Failed"):
            if mine:
                finished_rerun.append(name)
        elif found.get("phase") == "Running":
            job = mine[0] if len(mine) == 1 else None
            placed = job and parse_placement(job["metadata"]["annotations"]["gputask.io/placement"])
            if job is None or job["metadata"]["name"] != found.get("jobName") or placed is None or (
                    [g.uuid for g in placed.only().gpus] != [g["uuid"] for g in found["placement"]["gpus"]]):
                mismatched.append(name)
        elif mine:
            mismatched.append(name)
    return {
        "over memory": {u: [booked[u], capacity.get(u, 0)] for u in booked if booked[u] > capacity.get(u, 0)},
        "two live Jobs": sorted(t for t, js in live_jobs.items() if len(js) > 1),
        "status not its Job": sorted(mismatched),
        "finished re-run": sorted(finished_rerun),
    }


def operator_log_lines(installed: Installed, pattern: str) -> list[str]:
    """Lines of both operator processes' logs containing ``pattern``."""
    found = []
    for name in installed.operators:
        log = installed.cp.components[name].log
        found += [line for line in log.read_text(errors="replace").splitlines() if pattern in line]
    return found


def test_the_api_server_killed_during_a_burst_of_job_creates_loses_nothing(emptied: Installed) -> None:
    """40 tasks of 4Gi (24 fit): kube-apiserver is SIGKILLed once 2 of their Jobs exist and started again at once
    (same flags, same etcd), so Job creates in flight lose their answer (some though served). Once 24 tasks run: no
    GPU over its memory, no task with two live Jobs, every task's status matches its Job, no finished task re-run."""
    installed = emptied
    fresh(installed)
    installed.cp.kubectl("create", "namespace", BURST_NAMESPACE, check=False)
    apply(installed, *queue("burst", 1000, "1Ti", namespace=BURST_NAMESPACE))
    said_before = {p: len(operator_log_lines(installed, p)) for p in ("got no answer", "adopted", "sent again")}
    tasks = [gputask(f"b-{i:03d}", BURST_NAMESPACE, "burst", memory="4Gi") for i in range(BURST_TASKS)]
    installed.cp.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": tasks}))

    def jobs_made() -> int | None:
        count = len(installed.cp.request("GET", f"/apis/batch/v1/namespaces/{BURST_NAMESPACE}/jobs")["items"])
        return count if count >= BURST_KILL_AT else None

    wait_for(jobs_made, 120, f"{BURST_KILL_AT} Jobs", interval_s=0.02)
    installed.cp.kill("kube-apiserver")
    installed.cp.start_component("kube-apiserver")

    def quiet() -> Counter[str] | None:
        phases = Counter((t.get("status") or {}).get("phase", "") for t in
                         listed(installed, "gputasks.gputask.io", BURST_NAMESPACE))
        return phases if phases["Running"] >= BURST_FIT and sum(phases.values()) == BURST_TASKS else None

    phases = wait_for(quiet, 240, f"{BURST_FIT} burst tasks Running", interval_s=1)
    time.sleep(2)  # four scheduling cycles: a later double booking would show
    said = {p: len(operator_log_lines(installed, p)) - n for p, n in said_before.items()}
    print(f"\nburst: {dict(phases)}; Job creates without an answer {said['got no answer']}, adopted after it "
          f"{said['adopted']}, never created and sent again {said['sent again']}")
    assert (dict(phases), broken_invariants(installed, BURST_NAMESPACE)) == (
        {"Running": BURST_FIT, "Pending": BURST_TASKS - BURST_FIT},
        {"over memory": {}, "two live Jobs": [], "status not its Job": [], "finished re-run": []},
    )
    delete_tasks(installed, BURST_NAMESPACE, timeout_s=180)
    installed.cp.kubectl("delete", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": queue("burst", 1000, "1Ti", namespace=BURST_NAMESPACE)}))


def while_starting(cp: ControlPlane, event: dict[str, Any]) -> bool:
    """True when the audited request reached kube-apiserver while it was starting again after a stop (until its
    /readyz said ok): its RBAC caches are still filling then, and it forbids every identity alike; the operator
    retries those requests (seen after the burst test's SIGKILL, never outside such a window)."""
    received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
    return any(stopped <= received <= ready for stopped, ready in cp.api_outages)


def test_the_operator_gets_no_403_as_the_charts_service_account(emptied: Installed) -> None:
    """Through admission, node failure, a taint eviction, the API server's restart (the tests before), a Job
    relabelled after ``kubectl label job J gputask.io/task-``, a preemption and the deletion of queues (their
    finalizers): the API server's audit log shows no 403 for the chart's operator ServiceAccount, and the
    relabel puts the label back."""
    installed = emptied
    fresh(installed)
    apply(installed, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                      "metadata": {"name": "gputask-test-high"}, "value": 1000},
          *queue("preempt", 1, "2Gi", within="LowerPriority"))
    apply(installed, gputask("relabel"), gputask("low", queue="preempt"))
    for name in ("relabel", "low"):
        wait_for(lambda name=name: running_on(installed, name), 60, f"{name} Running")
    installed.cp.kubectl("label", "job", "relabel-1", "-n", "default", f"{TASK_LABEL}-")
    assert wait_for(lambda: ((installed.get("job", "relabel-1") or {}).get("metadata", {}).get("labels") or {}).get(
        TASK_LABEL), 30, "relabel-1 labelled again") == "relabel"
    apply(installed, gputask("high", queue="preempt", priority="gputask-test-high"))
    wait_for(lambda: running_on(installed, "high"), 60, "high Running")
    assert (task_status(installed, "low").get("phase"), condition(task_status(installed, "low"), "Evicted")[:2]) == (
        "Pending", ("True", "Preempted"))
    delete_tasks(installed)
    installed.cp.kubectl("delete", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": queue("preempt", 1, "2Gi")}))  # waits for the finalizers
    audited = installed.cp.audit_events()
    forbidden = sorted({(e["verb"], (e.get("objectRef") or {}).get("resource", ""),
                         (e.get("objectRef") or {}).get("subresource", "")) for e in audited
                        if e["user"]["username"] == OPERATOR_USER and e["responseStatus"]["code"] == 403
                        and not while_starting(installed.cp, e)})
    relabels = [e["responseStatus"]["code"] for e in audited if e["user"]["username"] == OPERATOR_USER
                and e["verb"] == "patch" and (e.get("objectRef") or {}).get("resource") == "jobs"]
    assert (forbidden, 200 in relabels) == ([], True)
