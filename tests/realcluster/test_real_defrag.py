"""Defragmentation through the Eviction API on a real control plane (issue 32): moves are dry-run evictions first,
then real ones; a PodDisruptionBudget, whose status the real disruption controller computes, refuses a move with a
429 that is never sent again, and the budget's pod is never evicted.

These tests have a control plane of their own (the package's operators run with defragmentation Disabled, the
chart's default): etcd, kube-apiserver, kube-controller-manager (its disruption controller), kube-scheduler and two
hollow nodes ``node-p`` and ``node-q`` of two fake 24Gi GPUs each (their node agents), the CRDs and the chart's RBAC,
and one operator process (the chart's ServiceAccount and configuration, ``defragmentation: {mode: Enabled,
minRuntime: 1s}``). The API server audits every eviction the operator asks, with its body (``dryRun``).

Each scenario fragments the cluster the same way, whatever the placement policy: a 2-GPU blocker fills one node, a
movable 1-GPU task ``s1`` goes to the other beside a 1-GPU filler; the blocker is deleted and a movable ``s2`` takes
one GPU of the emptied node; the filler is deleted. One GPU is free on each node, and a 2-GPU task ``big`` waits
Fragmented. ``s2`` ran less than ``s1``: the least lost work, the plan the core proposes first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gputask.testing.controlplane import ControlPlane, ControlPlaneUnavailable
from realcluster.realstack import NAMESPACE, REASON, REPO, Installed, install_chart_rbac, wait_for

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.skipif(REASON is not None, reason=f"real control plane suite skipped: {REASON}"),
]

NODES = {"node-p": "1xNVIDIA-A10:24Gi,1xNVIDIA-A10:24Gi", "node-q": "1xNVIDIA-A10:24Gi,1xNVIDIA-A10:24Gi"}
CLUSTER_QUEUE = "defrag"
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:gputask-operator"
# Every eviction the operator asks, at Request level (its body: deleteOptions.dryRun) with the answer's code.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Request", "users": [OPERATOR_USER], "verbs": ["create"],
         "resources": [{"group": "", "resources": ["pods/eviction"]}]},
        {"level": "None"},
    ],
}
DEFRAGMENTATION = {"mode": "Enabled", "minRuntime": "1s", "maxMovesPerWindow": 10, "window": "1h"}
KCM = "kube-controller-manager"
DRY = "dry run"
REAL = "eviction"


@dataclass
class Stack:
    """This module's control plane and its kubectl access (``api``)."""

    cp: ControlPlane
    api: Installed


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two hollow nodes of two 24Gi GPUs, gputask's CRDs and RBAC, a GPUClusterQueue ``defrag`` open to every
    namespace and one operator with defragmentation Enabled (minRuntime 1s)."""
    kept = os.environ.get("GPUTASK_REALCLUSTER_DIR")  # as conftest.py: keep logs and the audit log there
    plane = ControlPlane(nodes=sorted(NODES), audit_policy=AUDIT_POLICY,
                         workdir=Path(kept) / "defrag" if kept else None)
    try:
        plane.start()
    except ControlPlaneUnavailable as exc:
        pytest.fail(f"the control plane did not start: {exc}")
    try:
        plane.kubectl("apply", "-f", str(REPO / "crds"))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
        config = install_chart_rbac(plane, defragmentation=DEFRAGMENTATION)
        config_path = tmp_path_factory.mktemp("defrag") / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        api = Installed(plane, plane.service_account_kubeconfig(NAMESPACE, "gputask-operator"),
                        plane.service_account_kubeconfig(NAMESPACE, "gputask-agent"), config_path,
                        operators=("operator",))
        for node, gpus in NODES.items():
            api.start_agent(node, gpus)
        api.start_operator("operator")
        plane.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "gputask.io/v1alpha1", "kind": "GPUClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
            "spec": {"namespaceSelector": {}, "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": 8},
                {"name": "gputask.io/gpu-memory", "nominalQuota": "512Gi"},
            ]},
        }))
        for node in NODES:
            wait_for(lambda n=node: (api.get("gpunodes.gputask.io", n, None) or {}).get("status", {}).get("gpus"),
                     60, f"the agent's GPUNode {node}")
        yield Stack(plane, api)
    finally:
        plane.stop()


# ----- helpers ----------------------------------------------------------------------------------------------------


def submit(stack: Stack, namespace: str, name: str, gpus: int, *, movable: bool = False) -> None:
    """Create GPUTask ``namespace/name`` of ``gpus`` whole GPUs in GPULocalQueue ``q`` (opted in to moves when
    ``movable``)."""
    spec: dict[str, Any] = {"queueName": "q", "gpus": gpus,
                            "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}}
    if movable:
        spec["disruption"] = {"movable": True}
    stack.cp.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": name, "namespace": namespace},
        "spec": spec}))


def task_status(stack: Stack, namespace: str, name: str) -> dict[str, Any]:
    """The GPUTask's status ({} before it has one)."""
    found = stack.api.get("gputasks.gputask.io", name, namespace)
    assert found is not None, f"GPUTask {namespace}/{name} is gone"
    return found.get("status") or {}


def live_pods(stack: Stack, namespace: str, job: str) -> list[dict[str, Any]]:
    """The pods of Job ``namespace/job`` not being deleted."""
    listed = stack.api.kubectl("get", "pods", "-n", namespace, "-l", f"job-name={job}", "-o", "json")["items"]
    return [p for p in listed if not p["metadata"].get("deletionTimestamp")]


def running(stack: Stack, namespace: str, name: str) -> tuple[str, str, str, str] | None:
    """(placed node, Job, its pod's name, the node kube-scheduler bound it to) once the task is Running with one
    Running, Ready pod."""
    found = task_status(stack, namespace, name)
    if found.get("phase") != "Running" or not found.get("jobName"):
        return None
    pods = live_pods(stack, namespace, found["jobName"])
    if len(pods) != 1 or pods[0]["status"].get("phase") != "Running" or not any(
            c["type"] == "Ready" and c["status"] == "True" for c in pods[0]["status"].get("conditions") or []):
        return None
    return found["placement"]["node"], found["jobName"], pods[0]["metadata"]["name"], pods[0]["spec"]["nodeName"]


def wait_running(stack: Stack, namespace: str, name: str) -> tuple[str, str, str, str]:
    return wait_for(lambda: running(stack, namespace, name), 90, f"{namespace}/{name} Running with a Ready pod")


def delete_task(stack: Stack, namespace: str, name: str) -> None:
    """Delete the GPUTask and wait until it and its Job's pods are gone."""
    job = task_status(stack, namespace, name).get("jobName")
    stack.cp.kubectl("delete", "gputasks.gputask.io", name, "-n", namespace, "--wait=true", "--timeout=60s")
    if job:
        wait_for(lambda: not stack.api.kubectl("get", "pods", "-n", namespace, "-l", f"job-name={job}",
                                               "-o", "json")["items"], 60, f"the pods of Job {job} gone")


def fragment(stack: Stack, namespace: str) -> dict[str, tuple[str, str, str, str]]:
    """The module doc's fragmented cluster in ``namespace`` (a GPULocalQueue ``q``): movable ``s1`` and ``s2`` on
    different nodes, one GPU free on each; returns their :func:`running` values."""
    stack.cp.kubectl("create", "namespace", namespace)
    stack.cp.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPULocalQueue", "metadata": {"name": "q", "namespace": namespace},
        "spec": {"clusterQueue": CLUSTER_QUEUE}}))
    submit(stack, namespace, "blocker", 2)
    blocker_node = wait_running(stack, namespace, "blocker")[0]
    submit(stack, namespace, "s1", 1, movable=True)
    submit(stack, namespace, "filler", 1)
    s1 = wait_running(stack, namespace, "s1")
    wait_running(stack, namespace, "filler")
    delete_task(stack, namespace, "blocker")
    submit(stack, namespace, "s2", 1, movable=True)
    s2 = wait_running(stack, namespace, "s2")
    delete_task(stack, namespace, "filler")
    assert (s1[0], s2[0]) == (sorted(set(NODES) - {blocker_node})[0], blocker_node), "the cluster is not fragmented"
    return {"s1": s1, "s2": s2}


def evictions(stack: Stack, namespace: str) -> list[tuple[str, str, int]]:
    """(pod, DRY or REAL, response code) of every eviction the operator asked in ``namespace``, in order."""
    found = []
    for event in stack.cp.audit_events():
        ref = event.get("objectRef") or {}
        if ref.get("subresource") == "eviction" and ref.get("namespace") == namespace:
            dry_run = ((event.get("requestObject") or {}).get("deleteOptions") or {}).get("dryRun")
            found.append((ref.get("name", ""), DRY if dry_run == ["All"] else REAL, event["responseStatus"]["code"]))
    return found


def events(stack: Stack, namespace: str, reason: str) -> list[tuple[str, str, str]]:
    """(involved object, type, message) of the Events of ``reason`` in ``namespace``."""
    listed = stack.api.kubectl("get", "events", "-n", namespace, "-o", "json")["items"]
    return sorted((e["involvedObject"]["name"], e["type"], e["message"]) for e in listed if e["reason"] == reason)


def cleanup(stack: Stack, namespace: str) -> None:
    """Delete every GPUTask of ``namespace`` and wait until their pods are gone (the GPUs free for the next)."""
    stack.cp.kubectl("delete", "gputasks.gputask.io", "--all", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(lambda: not stack.api.kubectl("get", "pods", "-n", namespace, "-o", "json")["items"], 60,
             f"every pod of {namespace} gone")


# ----- the tests ------------------------------------------------------------------------------------------------


def test_a_move_without_a_budget_dry_runs_then_evicts_and_admits_the_big_task(stack: Stack) -> None:
    """No budget: s2's pod is asked dry-run (nothing deleted) then evicted, s2 is evicted Defragmented (its Event
    names big) and re-admitted beside s1 with Job s2-2, and big is admitted to s2's old node, its pod bound there by
    kube-scheduler; s1 is never touched."""
    ns = "defrag-free"
    try:
        before = fragment(stack, ns)
        submit(stack, ns, "big", 2)
        big = wait_running(stack, ns, "big")
        s1, s2 = wait_running(stack, ns, "s1"), wait_running(stack, ns, "s2")
        s1_node, s2_node = before["s1"][0], before["s2"][0]
        assert (evictions(stack, ns), big[0], big[3], s1, s2[0], s2[1], s2[3],
                [(n, t) for n, t, _ in events(stack, ns, "Defragmented")]) == (
            [(before["s2"][2], DRY, 201), (before["s2"][2], REAL, 201)], s2_node, s2_node, before["s1"], s1_node,
            "s2-2", s1_node, [("s2", "Warning")],
        )
        assert f"{ns}/big" in events(stack, ns, "Defragmented")[0][2]
    finally:
        cleanup(stack, ns)  # the next test needs every GPU free


def test_a_budget_refuses_one_move_with_one_429_and_another_plan_runs(stack: Stack) -> None:
    """A PodDisruptionBudget (minAvailable 1) selects s2's pod: the dry-run eviction of s2's pod is answered 429
    once and never sent again, a Warning DefragmentationRefused on big names the budget, s1 is moved instead (dry
    run, then eviction) and big admitted to s1's old node; s2's pod (same uid) runs on, and the budget never allowed
    a disruption nor lost its healthy pod."""
    ns = "defrag-budget"
    try:
        before = fragment(stack, ns)
        s2_pod = stack.api.kubectl("get", "pod", before["s2"][2], "-n", ns, "-o", "json")
        stack.cp.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-s2", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"job-name": before["s2"][1]}}}}))

        def budget() -> dict[str, Any] | None:
            found = stack.api.get("poddisruptionbudgets", "keep-s2", ns) or {}
            status = found.get("status") or {}
            observed = status.get("observedGeneration") == found["metadata"]["generation"]
            return status if observed and status.get("currentHealthy") == 1 else None

        assert {k: v for k, v in wait_for(budget, 60, "the disruption controller's status of keep-s2").items()
                if k in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods")} == {
            "currentHealthy": 1, "desiredHealthy": 1, "disruptionsAllowed": 0, "expectedPods": 1}
        submit(stack, ns, "big", 2)
        big = wait_running(stack, ns, "big")
        s1, s2 = wait_running(stack, ns, "s1"), wait_running(stack, ns, "s2")
        time.sleep(1)  # two scheduling cycles after: a resent or late eviction would be in the audit log by now
        s2_now = stack.api.kubectl("get", "pod", before["s2"][2], "-n", ns, "-o", "json")
        after = budget()
        s1_node, s2_node = before["s1"][0], before["s2"][0]
        refused = events(stack, ns, "DefragmentationRefused")
        assert (evictions(stack, ns), big[0], big[3], s2, s2_now["metadata"]["uid"], s1[0], s1[1], s1[3],
                [(n, t) for n, t, _ in refused], [(n, t) for n, t, _ in events(stack, ns, "Defragmented")],
                after and (after["currentHealthy"], after["disruptionsAllowed"])) == (
            [(before["s2"][2], DRY, 429), (before["s1"][2], DRY, 201), (before["s1"][2], REAL, 201)],
            s1_node, s1_node, before["s2"], s2_pod["metadata"]["uid"], s2_node, "s1-2", s2_node,
            [("big", "Warning")], [("s1", "Warning")], (1, 0),
        )
        assert "The disruption budget keep-s2 needs 1 healthy pods and has 1 currently" in refused[0][2]
    finally:
        cleanup(stack, ns)  # the next test needs every GPU free


def test_a_budget_not_yet_processed_refuses_the_move_once_and_its_429_is_not_resent(stack: Stack) -> None:
    """kube-controller-manager stopped, a PodDisruptionBudget on s2's pod has no status yet: the API server answers
    the dry-run eviction of s2's pod 429 with Retry-After 10 ("still being processed"); the operator sends it once,
    refuses the plan (a Warning naming the budget) and moves s1 instead; once kube-controller-manager is back, s1 and
    big run and s2's pod (same uid) runs on."""
    ns = "defrag-unprocessed"
    try:
        before = fragment(stack, ns)
        s2_uid = stack.api.kubectl("get", "pod", before["s2"][2], "-n", ns, "-o", "json")["metadata"]["uid"]
        stack.cp.kill(KCM)
        try:
            stack.cp.kubectl("create", "-f", "-", input=json.dumps({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "keep-s2", "namespace": ns},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"job-name": before["s2"][1]}}}}))
            submit(stack, ns, "big", 2)
            wait_for(lambda: [e for e in evictions(stack, ns) if e[1] == REAL], 60, "a move carried out")
        finally:
            stack.cp.start_component(KCM)
        big = wait_running(stack, ns, "big")
        s1, s2 = wait_running(stack, ns, "s1"), wait_running(stack, ns, "s2")
        time.sleep(1)  # two scheduling cycles after: a resent or late eviction would be in the audit log by now
        s2_now = stack.api.kubectl("get", "pod", before["s2"][2], "-n", ns, "-o", "json")
        refused = events(stack, ns, "DefragmentationRefused")
        assert (evictions(stack, ns), big[0], s1[0], s1[1], s2, s2_now["metadata"]["uid"],
                [(n, t) for n, t, _ in refused]) == (
            [(before["s2"][2], DRY, 429), (before["s1"][2], DRY, 201), (before["s1"][2], REAL, 201)],
            before["s1"][0], before["s2"][0], "s1-2", before["s2"], s2_uid, [("big", "Warning")],
        )
        assert "The disruption budget keep-s2 is still being processed by the server" in refused[0][2]
    finally:
        cleanup(stack, ns)  # the next test needs every GPU free
