"""Every admitted task fits its node as kube-scheduler would judge it, checked by an independent reading.

Hypothesis draws Nodes (labels, taints, allocatable cpu, memory and pods, cordon) and GPUTasks
(pod templates with requests, init containers, nodeSelector, required node affinity and
tolerations), converts them with the operator's converters, runs scheduler cycles with tasks
finishing in between, and checks each admitted task against the raw dicts with the plain rules
written again here (no code shared with gputask.core.fit or gputask.manifests.podfit).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gputask.core import Gpu, Node, NodeName, Scheduler
from gputask.core.placement import feasible_gpus, node_fits
from gputask.core.quota import GPU, QueueSpec, ResourceQuota
from gputask.core.reasons import refusals
from gputask.manifests.convert import task_from_manifest
from gputask.manifests.podfit import node_offer

KEYS = ["zone", "disk", "gen"]
VALUES = ["a", "b", "1", "5"]
OPS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]


@st.composite
def node_objs(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A v1 Node dict."""
    labels = draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3))
    taints = draw(st.lists(st.fixed_dictionaries({"key": st.sampled_from(KEYS), "value": st.sampled_from(VALUES),
                                                  "effect": st.sampled_from(EFFECTS)}), max_size=2))
    allocatable = {"cpu": str(draw(st.integers(1, 16))), "memory": f"{draw(st.integers(1, 64))}Gi",
                   "pods": str(draw(st.integers(0, 4)))}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints,
            "unschedulable": draw(st.booleans()) and draw(st.booleans())},
            "status": {"allocatable": allocatable}}


@st.composite
def requirement(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(OPS))
    out: dict[str, Any] = {"key": draw(st.sampled_from(KEYS)), "operator": op}
    if op in ("In", "NotIn"):
        out["values"] = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=2))
    elif op in ("Gt", "Lt"):
        out["values"] = [str(draw(st.integers(0, 6)))]
    return out


@st.composite
def task_objs(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A GPUTask dict with a pod template."""
    def res() -> dict[str, Any]:
        amounts = {"cpu": f"{draw(st.integers(0, 8000))}m", "memory": f"{draw(st.integers(0, 40))}Gi"}
        return {"limits" if draw(st.booleans()) else "requests": amounts}  # a limit alone is the request

    pod: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": "x", "resources": res()}
                                          for i in range(draw(st.integers(1, 2)))]}
    inits = [{"name": f"i{i}", "image": "x", "resources": res(),
              **({"restartPolicy": "Always"} if draw(st.booleans()) else {})} for i in range(draw(st.integers(0, 3)))]
    if inits:
        pod["initContainers"] = inits
    if draw(st.booleans()):
        pod["overhead"] = {"cpu": f"{draw(st.integers(0, 500))}m", "memory": f"{draw(st.integers(0, 2))}Gi"}
    if draw(st.booleans()):
        pod["nodeSelector"] = draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=1))
    if draw(st.booleans()):
        terms = draw(st.lists(st.lists(requirement(), min_size=1, max_size=2), min_size=1, max_size=2))
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}
    if draw(st.booleans()):
        pod["tolerations"] = draw(st.lists(st.one_of(
            st.just({"operator": "Exists"}),
            st.fixed_dictionaries({"key": st.sampled_from(KEYS), "operator": st.just("Exists")}),
            st.fixed_dictionaries({"key": st.sampled_from(KEYS), "operator": st.just("Equal"),
                                   "value": st.sampled_from(VALUES), "effect": st.sampled_from(EFFECTS)}),
        ), max_size=2))
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"queueName": "q", "gpus": 1, "gpuMemory": f"{draw(st.integers(1, 24))}Gi",
                     "template": {"spec": pod}}}


def _req_matches(r: dict[str, Any], labels: dict[str, str]) -> bool:
    have = labels.get(r["key"])
    op, values = r["operator"], r.get("values", [])
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if have is None or not have.lstrip("-").isdigit():
        return False
    return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if t["operator"] == "Exists" or t.get("value", "") == taint["value"]:
            return True
    return False


def _milli(cpu: str) -> int:
    return int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000


def _gib(memory: str) -> int:
    return int(memory.removesuffix("Gi"))


def _pod_requests(pod: dict[str, Any]) -> tuple[int, int]:
    """(millicores, GiB) by replaying the pod's start: init containers one after another, each beside the
    sidecars started before it; then the containers beside every sidecar; the pod needs its peak."""
    def of(c: dict[str, Any]) -> tuple[int, int]:
        r = c["resources"].get("requests") or c["resources"]["limits"]
        return _milli(r["cpu"]), _gib(r["memory"])

    sidecars = (0, 0)
    peak = (0, 0)  # per resource: the largest amount held at once
    for c in pod.get("initContainers", []):
        cpu, mem = of(c)
        running = (sidecars[0] + cpu, sidecars[1] + mem)
        peak = (max(peak[0], running[0]), max(peak[1], running[1]))
        if c.get("restartPolicy") == "Always":
            sidecars = running
    steady = (sidecars[0] + sum(of(c)[0] for c in pod["containers"]),
              sidecars[1] + sum(of(c)[1] for c in pod["containers"]))
    cpu, mem = max(peak[0], steady[0]), max(peak[1], steady[1])
    overhead = pod.get("overhead", {})
    return cpu + (_milli(overhead["cpu"]) if overhead else 0), mem + (_gib(overhead["memory"]) if overhead else 0)


def fits(node: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Would kube-scheduler's filters let ``pod`` onto an otherwise empty ``node``?"""
    labels = node["metadata"]["labels"]
    if node["spec"]["unschedulable"]:
        return False
    for taint in node["spec"]["taints"]:
        if taint["effect"] != "PreferNoSchedule" and not _tolerated(taint, pod.get("tolerations", [])):
            return False
    if any(labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    affinity = pod.get("affinity")
    if affinity:
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        if not any(all(_req_matches(r, labels) for r in t["matchExpressions"]) for t in terms):
            return False
    return True


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_every_admitted_task_fits_its_node_by_an_independent_check(data: st.DataObject) -> None:
    """After every cycle: each admitted task passes the filters, per node the sums of cpu, memory and pods
    stay within allocatable, and no waiting task would fit some node now (so admitting nothing fails)."""
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 4)))]
    nodes = {n: data.draw(node_objs(n)) for n in names}
    s = Scheduler()
    s.set_queue(QueueSpec("q", quotas={GPU: ResourceQuota(64_000)}))
    for name, obj in nodes.items():
        offer = node_offer(obj)
        cordoned = obj["spec"]["unschedulable"]
        s.set_node(Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", "A10", 24 * 1024) for i in range(2)),
                        cpu_milli=offer.cpu_milli, memory_mib=offer.memory_mib, pods=offer.pods,
                        labels=offer.labels, taints=offer.taints, schedulable=not cordoned,
                        unschedulable_reason="cordoned" if cordoned else ""))
    tasks = {f"t{i}": data.draw(task_objs(f"t{i}")) for i in range(data.draw(st.integers(1, 8)))}
    for obj in tasks.values():
        s.submit(dataclasses.replace(task_from_manifest(obj)))
    for cycle in range(3):
        s.cycle(float(cycle))
        used: dict[str, list[int]] = {n: [0, 0, 0] for n in names}
        gpu_used: dict[tuple[str, int], int] = {}
        for key, entry in s.running.items():
            name = entry.placement.only().node
            pod = tasks[key.split("/")[1]]["spec"]["template"]["spec"]
            assert fits(nodes[name], pod), (key, name)
            cpu, mem = _pod_requests(pod)
            used[name][0] += cpu
            used[name][1] += mem
            used[name][2] += 1
            for slot in entry.placement.only().gpus:
                gpu_used[(name, slot.index)] = gpu_used.get((name, slot.index), 0) + slot.memory_mib
        for name, (cpu, mem, pods) in used.items():
            allocatable = nodes[name]["status"]["allocatable"]
            assert cpu <= _milli(allocatable["cpu"]) and mem <= _gib(allocatable["memory"])
            assert pods <= int(allocatable["pods"])
        for task in s.pending:  # and nothing waits that some node could take now
            pod = tasks[task.key.split("/")[1]]["spec"]["template"]["spec"]
            cpu, mem = _pod_requests(pod)
            need = _gib(tasks[task.key.split("/")[1]]["spec"]["gpuMemory"]) * 1024
            for name, obj in nodes.items():
                allocatable = obj["status"]["allocatable"]
                room = (cpu + used[name][0] <= _milli(allocatable["cpu"]) and mem + used[name][1] <= _gib(
                    allocatable["memory"]) and used[name][2] < int(allocatable["pods"]))
                gpu = any(24 * 1024 - gpu_used.get((name, i), 0) >= need for i in range(2))
                assert not (fits(obj, pod) and room and gpu), (task.key, name)
        assert s.violations() == []
        if s.running:
            s.finish(sorted(s.running)[0])


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_fast_filter_and_the_explained_one_agree_on_every_node(data: st.DataObject) -> None:
    """``node_fits`` + ``feasible_gpus`` (the search) and ``refusals`` (the wait message) are two readings of
    one rule: a node gives no refusal exactly when the search could place the task there."""
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 4)))]
    s = Scheduler()
    s.set_queue(QueueSpec("q", quotas={GPU: ResourceQuota(64_000)}))
    for name in names:
        offer = node_offer(data.draw(node_objs(name)))
        s.set_node(Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", "A10", 24 * 1024) for i in range(2)),
                        cpu_milli=offer.cpu_milli, memory_mib=offer.memory_mib, pods=offer.pods,
                        labels=offer.labels, taints=offer.taints, schedulable=data.draw(st.booleans())))
    tasks = [task_from_manifest(data.draw(task_objs(f"t{i}"))) for i in range(data.draw(st.integers(1, 6)))]
    for task in tasks:
        s.submit(task)
    s.cycle(0.0)  # some tasks admitted: the nodes are partly used
    for task in tasks:
        for state in s.cluster.sorted_nodes():
            placeable = node_fits(state, task) and len(feasible_gpus(state, task)) >= task.request.count
            assert placeable == (refusals(state, task) == []), (task.key, state.name)
