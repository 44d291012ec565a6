"""Whole-pod fit: kube-scheduler's NodeUnschedulable, TaintToleration, NodeAffinity and NodeResourcesFit
semantics, the pod's effective requests, counted wait messages, and preemption that frees what is short."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from test_core_preemption import cq, preempted, running
from test_core_scheduler import GIB, node, task

from gputask.core import Admit, Node, NodeName, Pending, Scheduler, Task
from gputask.core.fit import Constraints, Requirement, Taint, Term, Toleration, static_refusal
from gputask.core.reasons import nodes_summary, refusals
from gputask.manifests import convert
from gputask.manifests.podfit import Requests, constraints_of, node_offer, pod_requests
from gputask.metrics import OperatorMetrics
from gputask.sim.scenario import run_scenario
from gputask.sim.scenario_model import ScenarioError, load_scenario

W = 24 * GIB
REPO = Path(__file__).resolve().parents[2]


def with_(t: Task, **changes: object) -> Task:
    """``t`` with fields replaced."""
    return dataclasses.replace(t, **changes)  # type: ignore[arg-type]


def host(n: Node, **changes: object) -> Node:
    """``n`` with fields replaced (cpu_milli, labels, taints, ...)."""
    return dataclasses.replace(n, **changes)  # type: ignore[arg-type]


# -- TaintToleration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("dedicated", "Equal", "infra", "NoSchedule"), Taint("dedicated", "infra"), True),
        (Toleration("dedicated", "Equal", "gpu", "NoSchedule"), Taint("dedicated", "infra"), False),
        (Toleration("dedicated", "Exists"), Taint("dedicated", "infra", "NoExecute"), True),
        (Toleration("dedicated", "Exists", effect="NoSchedule"), Taint("dedicated", "infra", "NoExecute"), False),
        (Toleration("", "Exists"), Taint("anything", "x", "NoExecute"), True),  # empty key + Exists: every taint
        (Toleration("", "Exists", effect="NoSchedule"), Taint("anything", "x", "NoExecute"), False),
        (Toleration("other", "Exists"), Taint("dedicated", "infra"), False),
        (Toleration("dedicated", "", "infra"), Taint("dedicated", "infra"), True),  # no operator means Equal
    ],
)
def test_toleration_semantics_are_kubernetes(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    """Toleration.ToleratesTaint of k8s.io/api: effect, key, Exists and Equal exactly."""
    assert toleration.tolerates(taint) is tolerated


def test_only_noschedule_and_noexecute_taints_filter() -> None:
    """PreferNoSchedule is a score, never a filter; NoSchedule and NoExecute keep an intolerant pod off."""
    for effect, refused in (("PreferNoSchedule", False), ("NoSchedule", True), ("NoExecute", True)):
        found = static_refusal(None, (), (Taint("k", "v", effect),), "n")
        assert (found is not None) is refused
        if found is not None:
            assert found.text == "had untolerated taint {k: v}"


# -- NodeAffinity -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requirement", "value", "matches"),
    [
        (Requirement("zone", "In", ("a", "b")), "a", True),
        (Requirement("zone", "In", ("a", "b")), None, False),
        (Requirement("zone", "NotIn", ("a",)), "b", True),
        (Requirement("zone", "NotIn", ("a",)), None, True),  # a missing label is not in any set
        (Requirement("zone", "NotIn", ("a",)), "a", False),
        (Requirement("zone", "Exists"), "", True),
        (Requirement("zone", "Exists"), None, False),
        (Requirement("zone", "DoesNotExist"), None, True),
        (Requirement("zone", "DoesNotExist"), "a", False),
        (Requirement("gen", "Gt", ("3",)), "4", True),
        (Requirement("gen", "Gt", ("3",)), "3", False),
        (Requirement("gen", "Lt", ("3",)), "2", True),
        (Requirement("gen", "Lt", ("3",)), "x", False),  # not an integer: no match
        (Requirement("gen", "Gt", ("3",)), None, False),
    ],
)
def test_selector_operators(requirement: Requirement, value: str | None, matches: bool) -> None:
    """In, NotIn, Exists, DoesNotExist, Gt and Lt as labels selectors evaluate them."""
    assert requirement.matches(value) is matches


def test_terms_are_ored_expressions_anded_and_an_empty_term_matches_nothing() -> None:
    """nodeSelectorTerms: any term; inside a term every expression; matchFields on metadata.name."""
    zone_a = Requirement("zone", "In", ("a",))
    fast = Requirement("disk", "In", ("ssd",))
    labels = (("disk", "hdd"), ("zone", "a"))
    both = Constraints(terms=(Term((zone_a, fast)),))
    either = Constraints(terms=(Term((fast,)), Term((zone_a,))))
    named = Constraints(terms=(Term(fields=(Requirement("metadata.name", "In", ("n1",)),)),))
    empty = Constraints(terms=(Term(),))
    assert static_refusal(both, labels, (), "n1") is not None
    assert static_refusal(either, labels, (), "n1") is None
    assert [static_refusal(named, labels, (), n) is None for n in ("n1", "n2")] == [True, False]
    assert static_refusal(empty, labels, (), "n1") is not None


def test_node_selector_needs_every_pair() -> None:
    """nodeSelector: every key present with that value."""
    constraints = Constraints(node_selector=(("gpu", "a100"), ("zone", "a")))
    assert static_refusal(constraints, (("gpu", "a100"), ("zone", "a")), (), "n") is None
    refusal = static_refusal(constraints, (("gpu", "a100"),), (), "n")
    assert refusal is not None and refusal.text == "did not match nodeSelector"


# -- the pod's effective requests ---------------------------------------------------------------


def resources(cpu: str | None = None, memory: str | None = None, *, limits: bool = False) -> dict[str, object]:
    """A container's resources with these requests (or only limits)."""
    amounts = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"limits" if limits else "requests": amounts}


def test_requests_sum_containers_and_take_the_largest_init_container() -> None:
    """max(sum of containers, largest init container); an init container larger than the containers wins."""
    spec = {
        "containers": [
            {"name": "a", "resources": resources("500m", "1Gi")},
            {"name": "b", "resources": resources("1")},
        ],
        "initContainers": [{"name": "i", "resources": resources("4", "512Mi")}],
    }
    assert pod_requests(spec) == Requests(cpu_milli=4000, memory_mib=1024)


def test_sidecars_add_to_the_containers_and_to_later_init_containers() -> None:
    """A restartable init container (restartPolicy Always) runs beside everything after it."""
    spec = {
        "containers": [{"name": "main", "resources": resources("1", "1Gi")}],
        "initContainers": [
            {"name": "proxy", "restartPolicy": "Always", "resources": resources("500m", "256Mi")},
            {"name": "setup", "resources": resources("2", "1Gi")},
        ],
    }
    # containers + sidecar = 1.5 cpu, 1280Mi; setup + sidecar = 2.5 cpu, 1280Mi
    assert pod_requests(spec) == Requests(cpu_milli=2500, memory_mib=1280)


def test_overhead_is_added_and_a_limit_stands_for_a_missing_request() -> None:
    """spec.overhead adds to the pod; a container with a limit only requests its limit (pod defaulting)."""
    spec = {
        "containers": [{"name": "main", "resources": resources("2", "2Gi", limits=True)}],
        "overhead": {"cpu": "250m", "memory": "120Mi", "ephemeral-storage": "1Gi"},
    }
    assert pod_requests(spec) == Requests(cpu_milli=2250, memory_mib=2168, ephemeral_mib=1024)


def test_constraints_refuse_what_the_pod_api_refuses() -> None:
    """Unknown operators, values with Exists, Gt without an integer, a keyless Equal toleration: InvalidSpec."""
    bad = [
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}]}}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}]}}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "bad key", "operator": "Exists"}]}]}}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["1", "2"]}]}]}}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
        {"tolerations": [{"operator": "Equal", "value": "x"}]},
        {"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]},
        {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}]},
        {"tolerations": [{"key": "bad key!", "operator": "Exists"}]},
        {"tolerations": [{"key": "k", "value": 0}]},
        {"tolerations": [{"key": "k", "value": "bad value!"}]},
        {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "x"}]},
        {"nodeSelector": {"a b": "x"}},
        {"nodeSelector": {"zone": "bad value!"}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": ["In"], "values": ["a"]}]}]}}}},
    ]
    for spec in bad:
        with pytest.raises(ValueError):
            constraints_of(spec)
    assert constraints_of({"containers": []}) is None


def test_gt_and_lt_read_integers_as_go_does_and_a_term_that_cannot_parse_matches_nothing() -> None:
    """The pod API takes any single value for Gt/Lt; kube-scheduler skips a term whose value is no integer
    and evaluates the others. Integers are Go's strconv.ParseInt: no spaces, no underscores, int64."""
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["four"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}}
    constraints = constraints_of(spec)
    assert static_refusal(constraints, (("gen", "9"), ("zone", "a")), (), "n") is not None
    assert static_refusal(constraints, (("gen", "9"), ("zone", "b")), (), "n") is None
    negative = constraints_of({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["-5"]}]}]}}}})
    assert static_refusal(negative, (("gen", "3"),), (), "n") is not None  # "-5" is no label value: no match
    gt4 = Requirement("gen", "Gt", ("4",))
    labels = ("5", "+5", " 5", "0_5", "9" * 20, "-9")
    assert [gt4.matches(v) for v in labels] == [True, True, False, False, False, False]
    assert Requirement("gen", "Gt", (" 4",)).matches("5") is False


def test_pod_level_resources_set_the_pods_cpu_and_memory() -> None:
    """spec.resources (PodLevelResources) replaces the containers' sum for cpu and memory; a pod-level limit
    alone stands for the request only where no container requests that resource (API defaulting)."""
    spec = {"resources": {"requests": {"cpu": "20"}},
            "containers": [{"name": "a", "resources": resources("1", "1Gi")}]}
    assert pod_requests(spec) == Requests(cpu_milli=20000, memory_mib=1024)
    limited = {"resources": {"limits": {"cpu": "4", "memory": "8Gi"}},
               "containers": [{"name": "a", "resources": resources("1")}]}
    assert pod_requests(limited) == Requests(cpu_milli=1000, memory_mib=8192)


@pytest.mark.parametrize("amount", ["NaN", "sNaN", " 1", "1_0", "Infinity", "-1", "1\n"])
def test_a_quantity_the_api_server_refuses_is_invalid_spec_not_a_crash(amount: str) -> None:
    """Python's Decimal takes NaN, spaces and underscores; the API server's quantity grammar does not."""
    obj = {"metadata": {"name": "t", "namespace": "ns"}, "spec": {"queueName": "q", "gpus": 1, "template": {
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"requests": {"cpu": amount}}}]}}}}
    with pytest.raises(convert.InvalidTaskError) as exc:
        convert.task_from_manifest(obj)
    assert exc.value.reason == "InvalidSpec"


def test_a_gputask_template_is_read_for_requests_and_constraints() -> None:
    """The converter gives the core the template's requests, selector, affinity and tolerations."""
    obj = {
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {
            "queueName": "q",
            "gpus": 1,
            "template": {"spec": {
                "nodeSelector": {"zone": "a"},
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "main", "image": "x", "resources": resources("3", "6Gi")}],
            }},
        },
    }
    t = convert.task_from_manifest(obj)
    assert (t.cpu_milli, t.memory_mib, t.constraints) == (
        3000, 6 * GIB, Constraints((("zone", "a"),), None, (Toleration("", "Exists"),))
    )
    broken = {**obj, "spec": {**obj["spec"], "template": {"spec": {
        "containers": [{"name": "main", "image": "x", "resources": resources("lots")}]}}}}
    with pytest.raises(convert.InvalidTaskError) as exc:
        convert.task_from_manifest(broken)
    assert exc.value.reason == "InvalidSpec"


def test_node_offer_reads_allocatable_labels_and_taints() -> None:
    """Allocatable rounds down (never optimistic); only well-formed taints count."""
    obj = {
        "metadata": {"name": "n", "labels": {"zone": "a"}},
        "spec": {"taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}, {"key": "x"}]},
        "status": {"allocatable": {"cpu": "7910m", "memory": "32Gi", "ephemeral-storage": "100Gi", "pods": "110"}},
    }
    offer = node_offer(obj)
    assert (offer.cpu_milli, offer.memory_mib, offer.ephemeral_mib, offer.pods, offer.labels, offer.taints) == (
        7910, 32 * GIB, 100 * GIB, 110, (("zone", "a"),), (Taint("dedicated", "infra", "NoSchedule"),)
    )


# -- admission -----------------------------------------------------------------------------------


def one_queue(*nodes: Node) -> Scheduler:
    """A scheduler with ``nodes`` and queue ``q`` of 8 GPUs."""
    s = Scheduler(nodes=nodes)
    s.set_queue(cq(gpus=8))
    return s


def test_admission_checks_cpu_memory_pods_and_ephemeral_storage() -> None:
    """NodeResourcesFit: each resource the node tracks bounds what is admitted, with our own tasks counted."""
    s = one_queue(host(node("a", 24, 24), cpu_milli=8000, memory_mib=32 * GIB, pods=1, ephemeral_mib=10 * GIB))
    first = with_(task("first"), cpu_milli=6000)
    s.submit(first)
    assert [type(d).__name__ for d in s.cycle(0.0)] == ["Admit"]
    second = with_(task("second"), cpu_milli=1000)
    s.submit(second)
    assert s.cycle(1.0) == [Pending(second, "NoFit", "0/1 nodes fit: 1 too many pods")]
    s.set_node(host(node("a", 24, 24), cpu_milli=8000, memory_mib=32 * GIB, pods=2, ephemeral_mib=10 * GIB))
    s.finish(second.key)
    third = with_(task("third"), cpu_milli=3000, memory_mib=40 * GIB, ephemeral_mib=20 * GIB)
    s.submit(third)
    assert s.cycle(2.0) == [Pending(third, "Inadmissible",
                                    "no node could ever hold it: 0/1 nodes fit: 1 insufficient ephemeral-storage, "
                                    "1 insufficient memory")]
    fourth = with_(task("fourth"), cpu_milli=3000)
    s.finish(third.key)
    s.submit(fourth)
    assert s.cycle(3.0) == [Pending(fourth, "NoFit", "0/1 nodes fit: 1 insufficient cpu")]
    assert s.violations() == []


def test_the_wait_message_counts_each_filter_per_node() -> None:
    """kube-scheduler's '0/N nodes' summary: one count per reason, most frequent first."""
    s = one_queue(
        host(node("a", 24), cpu_milli=8000),
        host(node("b", 24), cpu_milli=8000),
        host(node("c", 24), labels=(("zone", "moon"),), taints=(Taint("dedicated", "infra"),)),
        host(node("d", 24), labels=(("zone", "moon"),), schedulable=False, unschedulable_reason="cordoned"),
        host(node("e", 8), labels=(("zone", "moon"),)),
        host(node("f", 24), labels=(("zone", "moon"),), cpu_milli=1000),
    )
    t = with_(task("t", memory_gib=16), cpu_milli=2000, constraints=Constraints(node_selector=(("zone", "moon"),)))
    s.submit(t)
    [decision] = s.cycle(0.0)
    assert decision == Pending(t, "NoFit", "0/6 nodes fit: 2 did not match nodeSelector, "
                               "1 had untolerated taint {dedicated: infra}, 1 insufficient cpu, "
                               "1 no GPU with 16384 MiB free, 1 unschedulable (cordoned)")
    assert isinstance(decision, Pending) and dict(decision.filters) == {
        "NodeAffinity": 2, "TaintToleration": 1, "NodeResourcesFit": 1, "GPU": 1, "NodeUnschedulable": 1}
    registry = CollectorRegistry()
    OperatorMetrics(registry).refresh(s)
    assert {f: registry.get_sample_value("gputask_waiting_tasks_by_filter", {"filter": f})
            for f in ("NodeAffinity", "GPU")} == {"NodeAffinity": 1.0, "GPU": 1.0}
    # node e's 8Gi GPU can never hold 16Gi and f's CPU is too small even when empty: only d (cordoned) could
    s.set_node(host(node("d", 24), labels=(("zone", "moon"),)))
    assert [type(d).__name__ for d in s.cycle(1.0)] == ["Admit"]


def test_a_taint_or_a_cordon_stops_new_placements_at_the_next_cycle() -> None:
    """set_node with a taint (or unschedulable) leaves running tasks alone and places nothing new there."""
    s = one_queue(node("a", 24, 24, 24))
    running(s, task("first"))
    s.set_node(host(node("a", 24, 24, 24), taints=(Taint("dedicated", "infra"),)))
    second = task("second")
    s.submit(second)
    assert s.cycle(1.0) == [Pending(second, "Inadmissible", "no node could ever hold it: 0/1 nodes fit: "
                                    "1 had untolerated taint {dedicated: infra}")]
    tolerant = with_(task("tolerant"), constraints=Constraints(tolerations=(Toleration("dedicated", "Exists"),)))
    s.submit(tolerant)
    assert [type(d).__name__ for d in s.cycle(2.0)] == ["Admit"]
    s.set_node(host(node("a", 24, 24, 24), schedulable=False, unschedulable_reason="cordoned"))
    s.finish(second.key)
    late = with_(task("late"), constraints=tolerant.constraints)
    s.submit(late)
    assert s.cycle(3.0) == [Pending(late, "NoFit", "0/1 nodes fit: 1 unschedulable (cordoned)")]
    assert set(s.running) == {task("first").key, tolerant.key}


def test_a_node_condition_taint_makes_a_task_wait_not_inadmissible() -> None:
    """A new or NotReady node's taint (node.kubernetes.io/not-ready, added and removed by Kubernetes with the
    node's condition) refuses the node now, but never makes a task Inadmissible ('could ever'); once it is
    lifted the task is admitted."""
    s = one_queue(host(node("a", 24), taints=(Taint("node.kubernetes.io/not-ready", "", "NoSchedule"),)))
    t = task("t")
    s.submit(t)
    assert s.cycle(0.0) == [Pending(t, "NoFit", "0/1 nodes fit: 1 had untolerated taint "
                                    "{node.kubernetes.io/not-ready: }")]
    s.set_node(node("a", 24))
    assert [type(d).__name__ for d in s.cycle(1.0)] == ["Admit"]


def test_match_fields_on_the_node_name_are_not_shared_between_identical_nodes() -> None:
    """Identical nodes share evaluations; a term on metadata.name must still tell them apart."""
    s = one_queue(node("a", 24), node("b", 24))
    only_b = Constraints(terms=(Term(fields=(Requirement("metadata.name", "In", ("b",)),)),))
    t = with_(task("t"), constraints=only_b)
    s.submit(t)
    decisions = s.cycle(0.0)
    assert [(type(d).__name__, d.placement.only().node) for d in decisions if isinstance(d, Admit)] == [("Admit", "b")]


def test_preemption_frees_the_resource_that_is_short() -> None:
    """CPU is the bottleneck: a victim that frees a GPU but not enough CPU is not taken; one that frees both is."""
    s = Scheduler(nodes=[host(node("a", 24, 24), cpu_milli=8000)])
    s.set_queue(cq(gpus=8, within="LowerPriority"))
    small = with_(task("small", priority=-2), cpu_milli=1000)  # lowest priority: tried first
    heavy = with_(task("heavy", priority=-1, created=1.0), cpu_milli=6000)
    running(s, small, heavy)
    pre = with_(task("pre", priority=5), cpu_milli=4000)
    s.submit(pre)
    where = s.placement_of(heavy.key)
    assert where is not None
    decisions = s.cycle(1.0)
    assert decisions[0] == preempted(heavy, ("a", where.only().gpus[0].index, W), pre)
    assert [d for d in decisions if isinstance(d, Pending)] == [
        Pending(pre, "Preempting", "preempting ns/heavy on a")]
    assert [(d.task.key, type(d).__name__) for d in decisions] == [(heavy.key, "Evict"), (pre.key, "Pending")]
    assert s.violations() == []


def test_refusals_follow_kube_scheduler_filter_order() -> None:
    """NodeUnschedulable first, then TaintToleration, then NodeAffinity, then resources, then GPUs."""
    t = with_(task("t"), cpu_milli=9000, constraints=Constraints(node_selector=(("zone", "a"),)))
    s = one_queue(host(node("n", 24), cpu_milli=8000, taints=(Taint("k"),), schedulable=False,
                       unschedulable_reason="cordoned"))
    state = s.cluster.node(NodeName("n"))
    assert [r.filter.value for r in refusals(state, t)] == ["NodeUnschedulable"]
    assert [r.filter.value for r in refusals(state, t, ever=True)] == ["TaintToleration"]
    text, _ = nodes_summary(t, [state], ever=True)
    assert text == "0/1 nodes fit: 1 had untolerated taint {k: }"


def test_the_whole_pod_scenario_runs_as_its_comments_say() -> None:
    """examples/scenarios/whole-pod.yaml (the new node fields and nodeUpdate): what waits, where, and why;
    without node-c's taint plain runs there at once, without the cordon late runs at once."""
    doc = yaml.safe_load((REPO / "examples" / "scenarios" / "whole-pod.yaml").read_text())

    def placements(d: dict[str, Any]) -> dict[str, tuple[object, ...]]:
        out = run_scenario(load_scenario(d))
        assert out["violations"] == []
        return {t["name"]: (t["phase"], t["node"], t["admittedAt"]) for t in out["tasks"]}

    assert placements(doc) == {
        "huge-cpu": ("Pending", None, None),
        "on-moon": ("Running", "node-b", 20),
        "tolerant": ("Running", "node-c", 0),
        "whole-1": ("Succeeded", "node-a", 1),
        "whole-2": ("Succeeded", "node-b", 2),
        "shared": ("Running", "node-b", 3),
        "plain": ("Running", "node-b", 12),
        "late": ("Running", "node-a", 40),
    }
    untainted = copy.deepcopy(doc)
    untainted["nodes"][2]["taints"] = []
    assert placements(untainted)["plain"] == ("Running", "node-c", 4)
    uncordoned = copy.deepcopy(doc)
    uncordoned["events"] = [e for e in doc["events"] if "unschedulable" not in e.get("nodeUpdate", {})]
    assert placements(uncordoned)["late"] == ("Running", "node-a", 31)
    out = run_scenario(load_scenario(doc))
    assert {t["name"]: t["message"] for t in out["tasks"] if t["name"] in ("huge-cpu", "on-moon")} == {
        "huge-cpu": "no node could ever hold it: 0/3 nodes fit: 2 insufficient cpu, 2 insufficient memory, "
                    "1 had untolerated taint {dedicated: infra}",
        "on-moon": "no node could ever hold it: 0/3 nodes fit: 2 did not match nodeSelector, "
                   "1 had untolerated taint {dedicated: infra}",
    }


def test_scenario_node_fields_are_checked() -> None:
    """A bad quantity or taint effect in a scenario node is refused with its place named."""
    base = {"nodes": [{"name": "n", "gpus": [{"memory": "24Gi"}]}], "until": 1}
    for node_fields, where in (({"cpu": "lots"}, "nodes[0].cpu"), ({"taints": [{"key": "k", "effect": "Never"}]},
                                                                   "nodes[0].taints[0].effect")):
        doc = {**base, "nodes": [{**base["nodes"][0], **node_fields}]}
        with pytest.raises(ScenarioError, match=re.escape(where)):
            load_scenario(doc)
