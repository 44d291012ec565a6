"""Gangs in scenario files: spec.podSets and spec.topology in a submitted task, each pod's placement in the
output and in the gang's history, one Admitted per gang, node failures evicting the whole gang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gputask.sim.scenario import ScenarioError, run_scenario
from gputask.sim.scenario_model import fifo_baseline, load_scenario

SAMPLE = Path(__file__).parents[2] / "examples" / "scenarios" / "gang-node-failure.yaml"


def pod(pod_set: str, index: int, node: str, gpus: list[int], mib: int) -> dict[str, Any]:
    """One pod of a task's ``pods`` output."""
    return {"podSet": pod_set, "index": index, "node": node, "gpus": gpus, "memoryPerGpu": mib}


def gang_scenario(*pod_sets: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """Two 2-GPU nodes (48Gi each GPU), one open queue, one task ``g`` of ``pod_sets`` submitted at 0."""
    nodes = [{"name": n, "gpus": [{"memory": "48Gi"}, {"memory": "48Gi"}]} for n in ("a", "b")]
    task = {"metadata": {"name": "g"}, "spec": {"queueName": "q", "podSets": list(pod_sets), **spec}}
    return {"nodes": nodes, "queues": [{"name": "q"}], "events": [{"at": 0, "submit": task}], "until": 100}


def test_the_sample_gang_is_evicted_whole_by_a_node_failure_and_placed_again_in_the_other_rack() -> None:
    """One Admitted for the whole gang in rack r1; node-a's failure evicts every pod (the Evicted entry lists the
    Admitted entry's pods); the gang is admitted again, attempt 2, all in rack r2; no violations."""
    result = run_scenario(yaml.safe_load(SAMPLE.read_text()))
    (task,) = result["tasks"]
    first = [pod("launcher", 0, "node-a", [0], 8192), pod("workers", 0, "node-a", [1, 2, 3], 81920),
             pod("workers", 1, "node-b", [0, 1, 2], 81920)]
    again = [pod("launcher", 0, "node-c", [0], 8192), pod("workers", 0, "node-c", [1, 2, 3], 81920),
             pod("workers", 1, "node-d", [0, 1, 2], 81920)]
    history = [(h["at"], h["event"], h["reason"], h["pods"]) for h in task["history"]]
    assert (history, task["pods"], task["attempt"], task["phase"], result["violations"]) == (
        [(0, "Admitted", None, first), (121, "Evicted", "NodeFailure", first), (121, "Requeued", "NodeFailure", []),
         (121, "Admitted", None, again)],
        again, 2, "Running", [],
    )  # fmt: skip


def test_a_gangs_node_and_gpus_list_every_pods_and_a_finished_gang_keeps_its_pods() -> None:
    """A gang's ``node`` joins its nodes and ``gpus`` its pods' indices in pod order (as before); its pods run
    until its duration ends, and the Finished entry lists them."""
    doc = gang_scenario({"name": "w", "count": 2, "gpus": 2})
    doc["events"][0]["submit"]["duration"] = 50
    (task,) = run_scenario(doc)["tasks"]
    pods = [pod("w", 0, "a", [0, 1], 49152), pod("w", 1, "b", [0, 1], 49152)]
    assert ((task["node"], task["gpus"], task["pods"], task["phase"]),
            [(h["event"], h["pods"]) for h in task["history"]]) == (
        ("a, b", [0, 1, 0, 1], pods, "Succeeded"), [("Admitted", pods), ("Finished", pods)])


def test_a_gang_that_cannot_fit_together_waits_with_nothing_placed() -> None:
    """Three 2-GPU pods on two 2-GPU nodes: none is placed (all or nothing), the gang waits NoFit."""
    (task,) = run_scenario(gang_scenario({"name": "w", "count": 3, "gpus": 2}))["tasks"]
    assert (task["phase"], task["pods"], task["history"], task["reason"]) == ("Pending", [], [], "NoFit")


def test_a_required_topology_keeps_the_gang_in_one_domain() -> None:
    """With topology required on a label only node b carries, both pods go to b; with it preferred, too."""
    for topology in ({"required": "zone"}, {"preferred": "zone"}):
        doc = gang_scenario({"name": "w", "count": 2, "gpus": 1}, topology=topology)
        doc["nodes"][1]["labels"] = {"zone": "z1"}
        (task,) = run_scenario(doc)["tasks"]
        assert [(p["node"], p["gpus"]) for p in task["pods"]] == [("b", [0]), ("b", [1])], topology


def test_an_invalid_gang_is_rejected_with_the_api_servers_words() -> None:
    """A gang giving a one-pod field too is Rejected (phase Failed, InvalidSpec) at its submit."""
    (task,) = run_scenario(gang_scenario({"name": "w"}, gpuMemory="4Gi"))["tasks"]
    assert (task["phase"], task["reason"], task["message"], task["pods"]) == (
        "Failed", "InvalidSpec", 'spec: Invalid value: "object": set podSets or the one-pod fields (gpus, gpuMemory, '
        "gpuFraction, gpuProducts, template), not both", [])


def test_an_unknown_pod_set_field_is_refused_by_name() -> None:
    """A misspelled PodSet field is refused as kubectl apply refuses it (the GPUTask CRD declares PodSets)."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(gang_scenario({"name": "w", "gpuMemroy": "4Gi"}))
    assert str(info.value) == "events[0].submit.spec.podSets[0].gpuMemroy: unknown field (not in the GPUTask CRD)"


def test_the_fifo_baseline_gives_each_pod_set_whole_gpus() -> None:
    """The FIFO baseline drops gpuMemory and gpuFraction from every PodSet, as from the one-pod fields."""
    doc = gang_scenario({"name": "a", "gpuMemory": "4Gi"}, {"name": "b", "count": 2, "gpuFraction": "0.5"})
    (event,) = fifo_baseline(load_scenario(doc)).events
    assert event.submit is not None and event.submit.spec["podSets"] == [{"name": "a"}, {"name": "b", "count": 2}]
