"""Existing Jobs on the real control plane (issue 31): the real kube-apiserver calls gputask's admission webhook.

A third operator process (the chart's operator ServiceAccount, with the ClusterRole the chart adds for
``webhook.enabled``) runs ``gputask run --webhook-listen 127.0.0.1:PORT``:
kopf serves the webhook with the operator's self-signed certificate and registers it by URL in the
MutatingWebhookConfiguration ``gputask.io`` it manages (the RBAC for that is the chart's). It is a standby of the
leader election or the leader, whichever it is: the webhook answers in every process, the leader admits. What the
emulator cannot show: the API server's own call of the webhook (the Job it stores is suspended, with the
``gputask.io/gpu-request`` annotation instead of ``nvidia.com/gpu``), the Job controller making the pod once gputask
unsuspends the Job, kube-scheduler binding it to the placed node, and a node failure suspending the Job (its pod
removed by the Job controller) and placing it again on another node.

Hollow nodes never finish a container: the Job's completion is written into its status by the test, as the Job
controller would write it. The tests run after the other files of the package, on the same control plane, in a
namespace of their own with a queue of their own.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gputask.k8s.userjobs import GPU_REQUEST_ANNOTATION, QUEUE_NAME_LABEL
from gputask.k8s.webhook import CONFIGURATION
from gputask.testing.controlplane import free_port
from helmtool import find_helm, render
from realcluster.realstack import NAMESPACE, OPERATOR_USER, REASON, Installed, example_gpunodes, wait_for

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.skipif(REASON is not None, reason=f"real control plane suite skipped: {REASON}"),
]

NS = "userjobs"
QUEUE = "userjobs"
WEBHOOK_OPERATOR = "operator-webhook"
NOW = "2026-01-01T00:00:00Z"


def user_job(name: str, *, labelled: bool = True, suspend: bool | None = None) -> dict[str, Any]:
    """A one-pod Job asking one GPU and 2Gi of its memory in its container's limits, labelled for gputask's queue
    :data:`QUEUE` unless ``labelled`` is false."""
    labels = {QUEUE_NAME_LABEL: QUEUE} if labelled else {}
    spec: dict[str, Any] = {"backoffLimit": 0, "template": {"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"],
                        "resources": {"limits": {"nvidia.com/gpu": "1", "gputask.io/gpu-memory": "2Gi"}}}]}}}
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": spec}


def create(installed: Installed, obj: dict[str, Any]) -> dict[str, Any]:
    """``kubectl create`` as admin; the object the API server stored."""
    return dict(installed.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(obj)))


def job(installed: Installed, name: str) -> dict[str, Any]:
    """The Job ``userjobs/name`` (it must exist)."""
    found = installed.get("jobs", name, NS)
    assert found is not None, f"Job {name} is gone"
    return found


def task_status(installed: Installed, name: str) -> dict[str, Any]:
    """The status of GPUTask ``userjobs/name`` ({} before it has one or exists)."""
    return (installed.get("gputasks.gputask.io", name, NS) or {}).get("status") or {}


def live_pods(installed: Installed, name: str) -> list[dict[str, Any]]:
    """The pods of Job ``name`` not being deleted."""
    pods = installed.kubectl("get", "pods", "-n", NS, "-l", f"job-name={name}", "-o", "json")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def running(installed: Installed, name: str, attempt: int) -> tuple[str, str, list[str]] | None:
    """(placed node, node its one live pod runs on, the placed GPUs' UUIDs) once the Job's GPUTask is Running in
    ``attempt``, the Job unsuspended and its one live pod Running."""
    found = task_status(installed, f"job-{name}")
    if found.get("phase") != "Running" or found.get("attempt") != attempt or job(installed, name)["spec"]["suspend"]:
        return None
    pods = live_pods(installed, name)
    if len(pods) != 1 or pods[0]["status"].get("phase") != "Running":
        return None
    return found["placement"]["node"], pods[0]["spec"]["nodeName"], [g["uuid"] for g in found["placement"]["gpus"]]


def operator_writes(installed: Installed, name: str) -> list[tuple[str, str, int]]:
    """(verb, subresource, response code) of every write the operators' ServiceAccount made to Job
    ``userjobs/name`` (audit log)."""
    found = []
    for event in installed.cp.audit_events():
        ref = event.get("objectRef") or {}
        if (event["user"]["username"] == OPERATOR_USER and ref.get("resource") == "jobs"
                and ref.get("namespace") == NS and ref.get("name") == name
                and event.get("verb") not in ("get", "list", "watch")):
            found.append((event["verb"], ref.get("subresource", ""), event["responseStatus"]["code"]))
    return found


def registered(installed: Installed) -> list[tuple[str, str, str, dict[str, Any]]] | None:
    """(name, URL, failurePolicy, objectSelector) of each webhook of the managed configuration once it has one."""
    found = installed.get("mutatingwebhookconfigurations", CONFIGURATION, None)
    hooks = (found or {}).get("webhooks") or []
    return [(h["name"], h["clientConfig"].get("url", ""), h["failurePolicy"], h["objectSelector"])
            for h in hooks] or None


@pytest.fixture(scope="module")
def webhooked(installed: Installed) -> Iterator[tuple[Installed, int]]:
    """The control plane with every hollow node and agent back, namespace userjobs with a GPUClusterQueue and
    GPULocalQueue of its own, and a third operator process serving the webhook on 127.0.0.1:PORT (yields the
    port). Afterwards the process is stopped and the configuration deleted, so no later create waits for it."""
    pids = installed.cp.pids()
    for node, spec in example_gpunodes().items():
        if node not in pids:
            installed.cp.start_component(node)
        if f"agent-{node}" not in pids:
            installed.start_agent(node, spec)
    installed.cp.wait_nodes_ready(list(example_gpunodes()))
    installed.cp.kubectl("create", "namespace", NS)
    installed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUClusterQueue", "metadata": {"name": QUEUE},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                  "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4},
                                {"name": "gputask.io/gpu-memory", "nominalQuota": "64Gi"}]}},
        {"apiVersion": "gputask.io/v1alpha1", "kind": "GPULocalQueue", "metadata": {"name": QUEUE, "namespace": NS},
         "spec": {"clusterQueue": QUEUE}},
    ]}))
    helm = find_helm()
    assert helm is not None
    roles = [d for d in render(helm, namespace=NAMESPACE, sets=["webhook.enabled=true", "operator.replicas=1"])
             if d["kind"] in ("ClusterRole", "ClusterRoleBinding") and d["metadata"]["name"].endswith("-webhook")]
    assert len(roles) == 2
    installed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": roles}))
    port = free_port()
    env = {"POD_NAMESPACE": NAMESPACE, "POD_NAME": WEBHOOK_OPERATOR, "PYTHONUNBUFFERED": "1"}
    installed.cp.launch(WEBHOOK_OPERATOR, [
        sys.executable, "-m", "gputask.cli", "run", "--config", str(installed.config),
        "--kubeconfig", str(installed.operator_kubeconfig), "--webhook-listen", f"127.0.0.1:{port}",
    ], {**os.environ, **env})
    wait_for(lambda: registered(installed), 60, f"the webhook registered in {CONFIGURATION}")
    try:
        yield installed, port
    finally:
        installed.cp.kill(WEBHOOK_OPERATOR)
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            installed.cp.kubectl("delete", kind, CONFIGURATION, "--ignore-not-found")


def test_kopf_registers_the_webhook_by_url_on_the_label_with_failure_policy_fail(
        webhooked: tuple[Installed, int]) -> None:
    """The operator's ServiceAccount (the chart's RBAC) creates and patches the managed configuration: one webhook,
    called at the process's URL, only for objects carrying the label, failing closed."""
    installed, port = webhooked
    [(name, url, policy, selector)] = registered(installed) or []
    assert (name, url.startswith(f"https://127.0.0.1:{port}/"), policy, selector) == (
        "userjobs.gputask.io", True, "Fail",
        {"matchExpressions": [{"key": QUEUE_NAME_LABEL, "operator": "Exists"}]},
    )


def test_the_api_server_stores_a_labelled_job_suspended_and_gputask_runs_it_on_the_placed_node(
        webhooked: tuple[Installed, int]) -> None:
    """``kubectl create`` of a labelled, unsuspended Job asking ``nvidia.com/gpu``: the Job the API server stores
    (its answer to the create) is suspended, with the request moved into ``gputask.io/gpu-request``. gputask admits
    it, writes the placement in and unsuspends it; the Job controller makes one pod, kube-scheduler binds it to the
    placed node and the hollow kubelet runs it with the placed GPU named. Its completion releases the GPU; an
    unlabelled Job created beside it is never written by the operators (audit log) nor mutated."""
    installed, _ = webhooked
    plain = create(installed, user_job("plain", labelled=False, suspend=True))
    stored = create(installed, user_job("train"))
    container = stored["spec"]["template"]["spec"]["containers"][0]
    assert (stored["spec"]["suspend"], container.get("resources", {}),
            json.loads(stored["metadata"]["annotations"][GPU_REQUEST_ANNOTATION])) == (
        True, {}, {"gpus": 1, "gpuMemory": "2Gi",
                   "containers": {"main": {"nvidia.com/gpu": "1", "gputask.io/gpu-memory": "2Gi"}}},
    )
    assert (plain["spec"]["template"]["spec"]["containers"][0]["resources"], plain["metadata"].get("annotations")) == (
        {"limits": {"nvidia.com/gpu": "1", "gputask.io/gpu-memory": "2Gi"}}, None)

    node, pod_node, uuids = wait_for(lambda: running(installed, "train", 1), 90, "train Running on its placed node")
    admitted = job(installed, "train")
    assert (pod_node, admitted["spec"]["template"]["metadata"]["annotations"]["gputask.io/visible-devices"]) == (
        node, ",".join(uuids))
    owner = installed.get("gputasks.gputask.io", "job-train", NS)["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", "train", stored["metadata"]["uid"])

    installed.cp.kubectl("patch", "job", "train", "-n", NS, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"succeeded": 1, "active": 0, "completionTime": NOW, "conditions": [
            {"type": "Complete", "status": "True", "lastProbeTime": NOW, "lastTransitionTime": NOW}]}}))
    wait_for(lambda: task_status(installed, "job-train").get("phase") == "Succeeded", 30, "job-train Succeeded")

    def usage() -> dict[str, Any] | None:
        queue = installed.get("gpuclusterqueues.gputask.io", QUEUE, None) or {}
        found = (queue.get("status") or {}).get("admittedTasks")
        return queue["status"] if found == 0 else None

    assert wait_for(usage, 30, "the queue's usage released")["admittedTasks"] == 0
    assert (operator_writes(installed, "plain"), job(installed, "plain")["metadata"].get("annotations")) == ([], None)
    writes = operator_writes(installed, "train")
    assert writes and {(verb, code) for verb, _, code in writes} == {("update", 200)}


def test_a_failed_node_suspends_the_job_and_it_is_placed_again_on_another_node(
        webhooked: tuple[Installed, int]) -> None:
    """The hollow node (and agent) running a labelled Job's pod is killed: the node lifecycle controller marks it
    NotReady, gputask evicts the Job (suspended, the Job controller removes its pod, the template restored) and
    admits it again (attempt 2) on another node, where kube-scheduler binds its new pod. The API server refused
    none of the operator's writes: the eviction cleared the Job's status.startTime before restoring its template
    (batch/v1 refuses a template change of a Job that started)."""
    installed, _ = webhooked
    create(installed, user_job("moved"))
    node, _, _ = wait_for(lambda: running(installed, "moved", 1), 90, "moved Running")
    installed.cp.kill(node)
    installed.cp.kill(f"agent-{node}")
    try:
        new_node, pod_node, _ = wait_for(lambda: running(installed, "moved", 2), 120, "moved Running again (attempt 2)")
        writes = operator_writes(installed, "moved")
        assert (new_node != node, pod_node, ("patch", "status", 200) in writes,
                [w for w in writes if w[2] not in (200, 409)]) == (True, new_node, True, [])
    finally:
        installed.cp.start_component(node)
        installed.start_agent(node, example_gpunodes()[node])
