"""gputask on a real control plane: kube-apiserver, kube-controller-manager, kube-scheduler v1.28.7 and hollow nodes.

What the emulator cannot say: the real API server's CRD checks (CEL cost budgets included) and strict
validation, RBAC with the chart's ServiceAccounts, kube-scheduler binding the pinned pods, the node
lifecycle controller, leader election between processes. The tests run in file order on one control plane
(``conftest.py``); ``pytest -m realcluster`` runs them alone. Skipped, with the reason, where the
binaries, etcd, kubectl, openssl or helm are missing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gputask.testing.controlplane import ControlPlane, ControlPlaneUnavailable
from helmtool import find_helm, render
from realcluster.realstack import EXAMPLES, NAMESPACE, REASON, REPO, Installed, example_gpunodes, wait_for

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.skipif(REASON is not None, reason=f"real control plane suite skipped: {REASON}"),
]

OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:gputask-operator"
# Files (and folders, ending in /) of examples/ that are not applied here, and why.
NOT_APPLIED = {
    "scenarios/": "`gputask scenario run` files, not manifests",
    "kueue/kueue-mode.yaml": "needs Kueue's own CRDs (kueue.x-k8s.io ClusterQueue, ResourceFlavor) installed",
    "policies/deny-unmanaged-visible-devices.yaml": "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy: 1.30+",
}
EXAMPLE_TASKS = ("train-small", "eval-fraction", "infer-whole")
# Kinds of the chart that need an operator not installed here (prometheus-operator's ServiceMonitor).
FOREIGN_KINDS = ("ServiceMonitor",)


def example_files() -> list[Path]:
    """Every YAML file under examples/ that is applied (sorted)."""
    def applied(path: Path) -> bool:
        relative = str(path.relative_to(EXAMPLES))
        return not any(relative == skip or (skip.endswith("/") and relative.startswith(skip)) for skip in NOT_APPLIED)

    return [p for p in sorted(EXAMPLES.rglob("*.yaml")) if applied(p)]


def task_of(installed: Installed, name: str) -> dict[str, Any]:
    """The GPUTask ``default/name`` (it must exist)."""
    found = installed.get("gputasks.gputask.io", name)
    assert found is not None, f"GPUTask {name} is gone"
    return found


def status(installed: Installed, name: str) -> dict[str, Any]:
    """A GPUTask's status ({} before it has one)."""
    return task_of(installed, name).get("status") or {}


def condition(task_status: dict[str, Any], ctype: str) -> dict[str, Any]:
    """One condition of a status ({} when absent)."""
    return next((c for c in task_status.get("conditions") or [] if c["type"] == ctype), {})


def pods_of(installed: Installed, job: str) -> list[dict[str, Any]]:
    """The pods the Job controller made for Job ``default/job``."""
    return installed.kubectl("get", "pods", "-n", "default", "-l", f"job-name={job}", "-o", "json")["items"]


def running_on(installed: Installed, name: str) -> tuple[str, int, str, str] | None:
    """(placed node, attempt, node its pod is bound to, pod phase) once the task is Running with a Running pod."""
    found = status(installed, name)
    if found.get("phase") != "Running":
        return None
    pods = [p for p in pods_of(installed, found["jobName"]) if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != 1 or pods[0]["status"].get("phase") != "Running":
        return None
    return found["placement"]["node"], found["attempt"], pods[0]["spec"]["nodeName"], pods[0]["status"]["phase"]


def job_creates(plane: ControlPlane, job: str | None = None) -> list[tuple[str, str, int]]:
    """(user, Job name, response code) of every Job create the API server audited (of ``job`` only when given)."""
    found = []
    for event in plane.audit_events():
        ref = event.get("objectRef") or {}
        if event.get("verb") == "create" and ref.get("resource") == "jobs" and not ref.get("subresource"):
            entry = (event["user"]["username"], ref.get("name", ""), event["responseStatus"]["code"])
            if job is None or entry[1] == job:
                found.append(entry)
    return found


def test_every_crd_is_accepted_within_the_cel_cost_budget_and_established(crds: list[dict[str, Any]]) -> None:
    """kube-apiserver v1.28.7 accepts every CRD of crds/ (structural schema, CEL rules within their cost budget)
    and serves each (Established, NamesAccepted)."""
    def state(crd: dict[str, Any]) -> tuple[str, str, str]:
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        return crd["metadata"]["name"], conditions.get("Established", ""), conditions.get("NamesAccepted", "")

    assert [state(c) for c in crds] == [
        (f"{plural}.gputask.io", "True", "True")
        for plural in ("gpuclusterqueues", "gpulocalqueues", "gpunodes", "gpuresourceflavors", "gputasks")
    ]


def test_the_api_server_checks_gangs_by_the_crds_schema_and_cel_rules(control_plane: ControlPlane,
                                                                      crds: list[dict[str, Any]]) -> None:
    """A GPUTask of podSets with a topology passes a server-side dry run; giving the one-pod fields too, a repeated
    PodSet name, a count of 0 or both topology keys is refused with the CRD's words."""
    template = {"spec": {"containers": [{"name": "main", "image": "trainer:1"}], "restartPolicy": "Never"}}

    def dry_run(**spec: Any) -> str:
        body = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask",
                "metadata": {"name": "g", "namespace": "default"}, "spec": {"queueName": "q", **spec}}
        done = control_plane.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                                     input=json.dumps(body), check=False)
        return "accepted" if done.returncode == 0 else done.stderr

    workers = {"name": "workers", "count": 4, "gpus": 8, "template": template}
    launcher = {"name": "launcher", "gpuMemory": "4Gi", "template": template}
    found = [
        dry_run(podSets=[launcher, workers], topology={"required": "nvidia.com/gpu.clique"}),
        dry_run(podSets=[workers], gpuMemory="4Gi"),
        dry_run(podSets=[workers, workers]),
        dry_run(podSets=[{**workers, "count": 0}]),
        dry_run(podSets=[workers], topology={"required": "rack", "preferred": "zone"}),
    ]
    assert [f if f == "accepted" else next((m for m in (
        "set podSets or the one-pod fields", 'Duplicate value: map[string]interface {}{"name":"workers"}',
        "spec.podSets[0].count: Invalid value: 0", "set exactly one of topology.required and topology.preferred",
    ) if m in f), f) for f in found] == [
        "accepted", "set podSets or the one-pod fields", 'Duplicate value: map[string]interface {}{"name":"workers"}',
        "spec.podSets[0].count: Invalid value: 0", "set exactly one of topology.required and topology.preferred",
    ]


def test_every_example_passes_the_api_servers_strict_validation(control_plane: ControlPlane,
                                                                crds: list[dict[str, Any]]) -> None:
    """Every manifest under examples/ (Node and GPUNode fixtures included) is accepted by a server-side dry
    run with strict field validation, after the Namespaces they use are created."""
    refused = []
    for path in example_files():
        namespaces = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Namespace"]
        if namespaces:
            control_plane.kubectl("apply", "-f", "-", input=json.dumps({"kind": "List", "apiVersion": "v1",
                                                                         "items": namespaces}))
        done = control_plane.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", str(path), check=False)
        if done.returncode != 0:
            refused.append((str(path.relative_to(REPO)), done.stderr.strip()))
    assert refused == []


@pytest.mark.parametrize("values", sorted((REPO / "charts" / "gputask" / "ci").glob("*-values.yaml")),
                         ids=lambda p: p.name)
def test_the_chart_renders_and_the_api_server_accepts_it(control_plane: ControlPlane,
                                                        crds: list[dict[str, Any]], values: Path) -> None:
    """The chart rendered with each ci/*-values.yaml for this server's version passes a server-side dry run
    with strict field validation (a ServiceMonitor needs prometheus-operator's CRD: not applied)."""
    helm = find_helm()
    assert helm is not None
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    namespace = "chart-" + values.name.removesuffix("-values.yaml")
    objects = [d for d in render(helm, [values], namespace=namespace) if d["kind"] not in FOREIGN_KINDS]
    namespaces = {d["metadata"].get("namespace") for d in objects} - {None}
    for name in sorted(namespaces):
        control_plane.kubectl("create", "namespace", name, check=False)
    done = control_plane.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                                 input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}), check=False)
    assert (version, done.returncode, done.stderr) == ("v1.28.7", 0, "")


def test_the_operator_admits_the_examples_and_each_pod_runs_on_its_pinned_node(installed: Installed) -> None:
    """With the agents' GPUNodes in place, the examples' queue and tasks applied: the operator (the chart's
    ServiceAccount) creates each Job, kube-scheduler binds its pod to the node the task was placed on, the
    hollow kubelet runs it, and its container names the placed GPUs (NVIDIA_VISIBLE_DEVICES)."""
    def gpunodes_reported() -> list[str]:
        listed = installed.kubectl("get", "gpunodes.gputask.io", "-o", "json")["items"]
        return sorted(n["metadata"]["name"] for n in listed if (n.get("status") or {}).get("gpus"))

    assert wait_for(lambda: gpunodes_reported() if len(gpunodes_reported()) == 4 else None, 60,
                    "an agent's GPUNode per node") == ["node-a", "node-b", "node-c", "node-d"]
    for name in ("10-queue.yaml", "20-gputask.yaml", "21-gputask-fraction.yaml", "22-gputask-whole.yaml"):
        installed.cp.kubectl("apply", "-f", str(EXAMPLES / name))
    placed = {t: wait_for(lambda t=t: running_on(installed, t), 90, f"{t} Running") for t in EXAMPLE_TASKS}
    assert {t: (node, attempt, phase) for t, (node, attempt, _, phase) in placed.items()} == {
        t: (placed[t][2], 1, "Running") for t in EXAMPLE_TASKS
    }
    def visible_devices(task: str) -> tuple[str, str]:
        """(the pod's NVIDIA_VISIBLE_DEVICES, the placed GPUs' UUIDs joined) of a task."""
        found = status(installed, task)
        pod = next(p for p in pods_of(installed, found["jobName"]) if p["status"].get("phase") == "Running")
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
        return env.get("NVIDIA_VISIBLE_DEVICES", ""), ",".join(g["uuid"] for g in found["placement"]["gpus"])

    pinned = {t: visible_devices(t) for t in EXAMPLE_TASKS}
    assert {t: devices for t, (devices, _) in pinned.items()} == {t: uuids for t, (_, uuids) in pinned.items()}
    jobs = {status(installed, t)["jobName"] for t in EXAMPLE_TASKS}
    assert sorted(c for c in job_creates(installed.cp) if c[1] in jobs) == sorted(
        (OPERATOR_USER, job, 201) for job in jobs
    )


def test_a_job_the_api_server_refuses_is_reported_at_once_without_a_post_storm(installed: Installed) -> None:
    """A template the operator does not foresee as invalid (dnsPolicy None without dnsConfig): the API server's
    422 is in the task's Admitted condition and a Warning Event, and the Job create is not retried every cycle.
    (A volume without a source, the emulator's 422 case, is no such template: the real server defaults it to
    emptyDir.)"""
    task = {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUTask",
        "metadata": {"name": "bad-dns", "namespace": "default"},
        "spec": {
            "queueName": "default",
            "gpus": 1,
            "gpuMemory": "1Gi",
            "template": {"spec": {"dnsPolicy": "None",
                                  "containers": [{"name": "main", "image": "busybox:1.36"}]}},
        },
    }
    installed.cp.kubectl("create", "-f", "-", input=json.dumps(task))

    def rejected() -> tuple[str, str, str] | None:
        admitted = condition(status(installed, "bad-dns"), "Admitted")
        return (admitted["status"], admitted["reason"], admitted["message"]) if admitted.get(
            "reason") == "JobRejected" else None

    state, reason, message = wait_for(rejected, 30, "bad-dns JobRejected")
    assert (state, reason) == ("False", "JobRejected")
    assert re.fullmatch(
        r'the API server refused Job bad-dns-1: 422 Invalid: Job.batch "bad-dns-1" is invalid: '
        r"spec.template.spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None; "
        r"retried in \d+s \(attempt 1\)",
        message,
    ), message
    time.sleep(3)  # six scheduling cycles: a storm would have posted again
    events = installed.kubectl("get", "events", "-n", "default", "--field-selector",
                               "involvedObject.name=bad-dns,reason=JobRejected", "-o", "json")["items"]
    assert ([(e["type"], e["reason"], e["message"]) for e in events],
            job_creates(installed.cp, "bad-dns-1")) == (
        [("Warning", "JobRejected", message)], [(OPERATOR_USER, "bad-dns-1", 422)]
    )
    installed.cp.kubectl("delete", "gputasks.gputask.io", "bad-dns", "-n", "default", "--wait=false")


def leader(installed: Installed) -> str | None:
    """The operator process (its component name) holding the Lease, or None while no running one does."""
    lease = installed.get("lease", "gputask-operator", NAMESPACE)
    holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
    pids = installed.cp.pids()
    return next((n for n in installed.operators if n in pids and f"-{pids[n]}-" in holder), None)


def submit_small_task(installed: Installed, name: str) -> None:
    """``kubectl create`` a GPUTask ``name`` of one GPU with 2Gi in queue ``default``."""
    task = {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUTask",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"queueName": "default", "gpus": 1, "gpuMemory": "2Gi",
                 "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}},
    }
    installed.cp.kubectl("create", "-f", "-", input=json.dumps(task))


def test_when_the_leader_is_killed_the_standby_takes_over_and_admits(installed: Installed) -> None:
    """Two operator processes: one holds the Lease; SIGKILL it and the other takes the Lease over and admits a
    task submitted after, which runs on its pinned node."""
    first = wait_for(lambda: leader(installed), 30, "a leader")
    installed.cp.kill(first)
    second = wait_for(lambda: leader(installed), 30, "the standby holding the Lease")
    submit_small_task(installed, "after-failover")
    node, attempt, pod_node, phase = wait_for(lambda: running_on(installed, "after-failover"), 60,
                                              "after-failover Running")
    installed.start_operator(first)  # a standby again, for the tests after
    assert (second != first, attempt, pod_node, phase) == (True, 1, node, "Running")


def test_a_failed_node_is_tainted_and_its_task_is_placed_again_on_another_node(installed: Installed) -> None:
    """The hollow node (and its agent) of a running task's pod is killed: the node lifecycle controller marks
    it NotReady and taints it unreachable, and gputask evicts the task and places it again (attempt 2) on
    another node, where its new pod runs."""
    node, attempt, _, _ = wait_for(lambda: running_on(installed, "infer-whole"), 30, "infer-whole Running")
    assert attempt == 1
    installed.cp.kill(node)
    installed.cp.kill(f"agent-{node}")

    def tainted() -> list[tuple[str, str]] | None:
        found = installed.get("node", node, None) or {}
        taints = [(t["key"], t["effect"]) for t in (found.get("spec") or {}).get("taints") or []]
        return taints if ("node.kubernetes.io/unreachable", "NoSchedule") in taints else None

    wait_for(tainted, 60, f"{node} tainted unreachable")
    assert installed.cp.node_ready(node) == "Unknown"
    new_node, new_attempt, pod_node, phase = wait_for(
        lambda: (found := running_on(installed, "infer-whole")) and found[1] == 2 and found, 60,
        "infer-whole Running again (attempt 2)",
    )
    assert (new_node != node, new_attempt, pod_node, phase) == (True, 2, new_node, "Running")
    installed.cp.start_component(node)  # the node comes back (its agent too), for the tests after
    installed.start_agent(node, example_gpunodes()[node])


def test_after_the_api_server_restarts_the_operator_admits_again(installed: Installed) -> None:
    """kube-apiserver stopped and started again (same etcd): the operator's watches reconnect and a task
    submitted after runs on its pinned node."""
    installed.cp.restart("kube-apiserver")
    submit_small_task(installed, "after-restart")
    node, attempt, pod_node, phase = wait_for(lambda: running_on(installed, "after-restart"), 60,
                                              "after-restart Running")
    assert (attempt, pod_node, phase) == (1, node, "Running")


def test_a_component_that_dies_at_start_is_named_with_its_log_and_nothing_is_left_running(tmp_path: Path) -> None:
    """A hollow node given a bad flag exits at start: ControlPlaneUnavailable names it with its log, and every
    process started before it is stopped."""
    plane = ControlPlane(nodes=["bad-node"], node_capacity="not-a-resource-list", workdir=tmp_path / "cp")
    with pytest.raises(ControlPlaneUnavailable) as raised:
        plane.start()
    started = [c.log.stem for c in plane.components.values() if c.log.is_file()]
    assert (str(raised.value).splitlines()[0], started, processes_using(tmp_path / "cp")) == (
        "bad-node exited with 2", ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                   "bad-node"], []
    )


def processes_using(folder: Path) -> list[str]:
    """Command lines of the running processes that name ``folder`` (their data, certificates, kubeconfigs)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited while listed
            continue
        if str(folder) in text:
            found.append(text)
    return found
