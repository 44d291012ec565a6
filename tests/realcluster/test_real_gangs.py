"""A gang on the real control plane (kube-apiserver, the Job controller, kube-scheduler v1.28.7, hollow nodes): a
GPUTask of two PodSets of 2 pods each, one PodSet's template on node-a and the other's on node-c (their
nodeSelector), 1Gi of GPU memory per pod. The operator creates an Indexed Job per PodSet; the real Job controller
makes the gated pods; gputask pins each with its merge patch (matchFields added to the required node affinity, the
devices annotation written, the scheduling gate removed), which the real API server must accept on a gated pod;
kube-scheduler binds each pod to its placed node; all 4 run and the task is Running. Hollow nodes run no
containers, so the downward-API env is checked in the pod spec: it reads the annotation that names the pod's GPUs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gputask.k8s.gangjobs import DEVICES_ANNOTATION, INDEX_KEY
from realcluster.realstack import REASON, Installed, wait_for

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.skipif(REASON is not None, reason=f"real control plane suite skipped: {REASON}"),
]

CONTAINER = {"name": "main", "image": "busybox:1.36"}


def pod_set(name: str, node: str) -> dict[str, Any]:
    """A PodSet of 2 pods of 1Gi each whose template keeps them on ``node``."""
    return {"name": name, "count": 2, "gpuMemory": "1Gi",
            "template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [CONTAINER]}}}


GANG = {
    "apiVersion": "gputask.io/v1alpha1",
    "kind": "GPUTask",
    "metadata": {"name": "gang", "namespace": "default"},
    "spec": {"queueName": "default", "podSets": [pod_set("launcher", "node-a"), pod_set("workers", "node-c")]},
}


def gang_pods(installed: Installed) -> list[dict[str, Any]]:
    """The live pods of the gang's Jobs of attempt 1, in (Job, completion index) order."""
    pods = [p for job in ("gang-1-launcher", "gang-1-workers")
            for p in installed.kubectl("get", "pods", "-n", "default", "-l", f"job-name={job}", "-o", "json")["items"]
            if not p["metadata"].get("deletionTimestamp")]
    return sorted(pods, key=lambda p: (p["metadata"]["labels"]["job-name"], int(p["metadata"]["annotations"][
        INDEX_KEY])))


def all_running(installed: Installed) -> list[dict[str, Any]] | None:
    """The 4 pods once each is Running and the task is Running, else None."""
    task = installed.get("gputasks.gputask.io", "gang") or {}
    pods = gang_pods(installed)
    running = len(pods) == 4 and all(p["status"].get("phase") == "Running" for p in pods)
    return pods if running and (task.get("status") or {}).get("phase") == "Running" else None


def test_a_four_pod_gang_is_ungated_pod_by_pod_and_kube_scheduler_binds_each_to_its_placed_node(
        installed: Installed) -> None:
    installed.cp.kubectl("create", "-f", "-", input=json.dumps(GANG))
    try:
        pods = wait_for(lambda: all_running(installed), 120, "the gang's 4 pods and the task Running")
        placed = (installed.get("gputasks.gputask.io", "gang") or {})["status"]["placement"]["pods"]
        assert [(p["podSet"], p["index"], p["node"]) for p in placed] == [
            ("launcher", 0, "node-a"), ("launcher", 1, "node-a"), ("workers", 0, "node-c"), ("workers", 1, "node-c")]
        for pod, place in zip(pods, placed, strict=True):
            spec = pod["spec"]
            env = {e["name"]: e.get("valueFrom") for e in spec["containers"][0]["env"]}
            terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"]
            assert (spec["nodeName"], spec.get("schedulingGates"), terms[0]["matchFields"][-1]) == (
                place["node"], None, {"key": "metadata.name", "operator": "In", "values": [place["node"]]})
            assert pod["metadata"]["annotations"][DEVICES_ANNOTATION] == ",".join(g["uuid"] for g in place["gpus"])
            assert env["NVIDIA_VISIBLE_DEVICES"] == {
                "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{DEVICES_ANNOTATION}']"}}
            assert env["GPUTASK_POD_INDEX"] == {
                "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}
            assert (spec["hostname"], spec["subdomain"]) == (
                f"{pod['metadata']['labels']['job-name']}-{place['index']}", "gang")
    finally:
        installed.cp.kubectl("delete", "gputasks.gputask.io", "gang", "-n", "default", "--wait=false", check=False)
