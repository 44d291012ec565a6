"""The scenario runner: seed scenarios, each event kind, restarts, bad input and random runs."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputask.config import Config
from gputask.core import POLICIES
from gputask.sim.scenario import ScenarioError, cli_run, run_scenario

SEEDS = Path(__file__).parents[2] / "examples" / "scenarios"

QUANTITY_RULE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


def seed(name: str) -> dict[str, Any]:
    """The seed scenario ``name`` shipped in examples/scenarios/."""
    loaded: dict[str, Any] = yaml.safe_load((SEEDS / f"{name}.yaml").read_text())
    return loaded


def submit(name: str, at: float = 0, duration: float | None = None, **spec: Any) -> dict[str, Any]:
    """A submit event for task ``name`` in namespace default, queue default."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"queueName": "default", **spec},
    }
    if duration is not None:
        body["duration"] = duration
    return {"at": at, "submit": body}


def node(name: str, *memories: str, product: str = "NVIDIA-A10") -> dict[str, Any]:
    """A node with one GPU per memory quantity."""
    return {"name": name, "gpus": [{"product": product, "memory": m} for m in memories]}


def scenario(
    nodes: list[dict[str, Any]],
    events: list[dict[str, Any]],
    until: float = 3600,
    queue_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A scenario with one queue named default."""
    return {
        "nodes": nodes,
        "queues": [{"name": "default", "spec": queue_spec or {}}],
        "events": events,
        "until": until,
    }


def brief(result: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Per task name: phase, node, GPU indices, attempt, admittedAt, finishedAt, reason."""
    return {
        t["name"]: (
            t["phase"],
            t["node"],
            t["gpus"],
            t["attempt"],
            t["admittedAt"],
            t["finishedAt"],
            t["reason"],
        )
        for t in result["tasks"]
    }


def entry(
    at: float,
    event: str,
    reason: str | None = None,
    node: str | None = None,
    gpus: tuple[int, ...] = (),
    by: str | None = None,
) -> dict[str, Any]:
    """One history entry."""
    return {"at": at, "event": event, "reason": reason, "node": node, "gpus": list(gpus), "by": by}


# -- the four seed scenarios, inline so they run without ../shared -----------------------------
BASIC = scenario(
    [node("node-a", "16Gi", "8Gi", product="NVIDIA-T4")],
    [submit("big", gpus=1, gpuMemory="12Gi"), submit("small", gpus=1, gpuMemory="4Gi")],
    until=60,
    queue_spec={"resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]},
)
FRAGMENT = scenario(
    [node("node-a", "24Gi")],
    [
        submit("long-train", gpus=1, gpuMemory="15Gi"),
        submit("small-eval", at=10, duration=300, gpus=1, gpuMemory="5Gi"),
    ],
    until=600,
    queue_spec={"resources": [{"name": "gputask.io/gpu-memory", "nominalQuota": "24Gi"}]},
)
NODE_FAILURE = scenario(
    [node("node-a", "80Gi"), node("node-b", "80Gi")],
    [
        submit("job-1", gpus=1, gpuMemory="30Gi"),
        submit("job-2", gpus=1, gpuMemory="30Gi"),
        {"at": 60, "nodeDown": {"name": "node-a"}},
    ],
)
# As seed-batch-makespan.yaml, except t03 asks 2 GPUs: the seed asks 4 GPUs on ONE node of
# servers with 2 GPUs each, which DESIGN.md forbids, so it can never run (Inadmissible).
BATCH = scenario(
    [node("node-a", "24Gi", "24Gi"), node("node-b", "24Gi", "24Gi")],
    [
        submit("t01-big-2gpu", duration=3600, gpus=2, gpuMemory="20Gi"),
        submit("t02-small", duration=600, gpus=1, gpuMemory="4Gi"),
        submit("t03-big-4gpu", duration=1800, gpus=2),
        submit("t04-small", duration=600, gpus=1, gpuMemory="6Gi"),
        submit("t05-medium", duration=1200, gpus=1, gpuMemory="12Gi"),
        submit("t06-small", duration=300, gpus=1, gpuMemory="3Gi"),
        submit("t07-medium", duration=900, gpus=1, gpuMemory="10Gi"),
        submit("t08-small", duration=300, gpus=1, gpuMemory="2Gi"),
        submit("t09-whole", duration=1200, gpus=1),
        submit("t10-small", duration=600, gpus=1, gpuMemory="8Gi"),
    ],
    until=20000,
    queue_spec={"queueingStrategy": "BestEffortFIFO"},
)


def test_basic_matching_whole_output() -> None:
    """Both tasks start at t=0, the 12Gi one on the 16Gi card (index 0), in the exact output format: a one-pod
    task's ``pods`` is its one pod of PodSet main; its history entries carry no ``pods``."""
    def pod(node: str, mib: int) -> dict[str, Any]:
        return {"podSet": "main", "index": 0, "node": node, "gpus": [0], "memoryPerGpu": mib}

    history = [entry(0, "Admitted", node="node-a", gpus=(0,))]
    task = {
        "namespace": "default",
        "node": "node-a",
        "gpus": [0],
        "phase": "Running",
        "attempt": 1,
        "admittedAt": 0,
        "finishedAt": None,
        "reason": None,
        "message": None,
        "history": history,
    }
    assert run_scenario(BASIC) == {
        "config": Config().public(),
        "policy": "packing",
        "tasks": [
            {**task, "name": "big", "memoryPerGpu": 12288, "pods": [pod("node-a", 12288)]},
            {**task, "name": "small", "memoryPerGpu": 4096, "pods": [pod("node-a", 4096)]},
        ],
        "queues": {
            "default": {
                "usage": {"nvidia.com/gpu": 1000, "gputask.io/gpu-memory": 16384},
                "pending": 0,
                "admitted": 2,
            }
        },
        "violations": [],
        "makespan": None,
        "unfinished": 2,
    }


def test_seed_basic_matching_file() -> None:
    """The shared seed gives what its header promises: both Running from 0, big on node-a GPU 0."""
    result = run_scenario(seed("seed-basic-matching"))
    assert (brief(result)["big"], brief(result)["small"][:5], result["violations"]) == (
        ("Running", "node-a", [0], 1, 0, None, None),
        ("Running", "node-a", [0], 1, 0),
        [],
    )


@pytest.mark.parametrize("doc", [FRAGMENT, "seed-fragment-reuse"], ids=["inline", "file"])
def test_fragment_reuse(doc: dict[str, Any] | str) -> None:
    """small-eval shares GPU 0 from t=10 with 20Gi of 24Gi reserved, then finishes at 310."""
    doc = seed(doc) if isinstance(doc, str) else doc
    during = run_scenario({**doc, "until": 100})
    after = run_scenario(doc)
    assert (
        brief(during),
        during["queues"]["default"]["usage"]["gputask.io/gpu-memory"],
        brief(after),
        during["violations"] + after["violations"],
    ) == (
        {
            "long-train": ("Running", "node-a", [0], 1, 0, None, None),
            "small-eval": ("Running", "node-a", [0], 1, 10, None, None),
        },
        20480,
        {
            "long-train": ("Running", "node-a", [0], 1, 0, None, None),
            "small-eval": ("Succeeded", "node-a", [0], 1, 10, 310, None),
        },
        [],
    )


@pytest.mark.parametrize("doc", [NODE_FAILURE, "seed-node-failure"], ids=["inline", "file"])
def test_node_failure(doc: dict[str, Any] | str) -> None:
    """Both tasks are evicted (NodeFailure) by the first cycle past the 60 s grace period and run on node-b."""
    result = run_scenario(seed(doc) if isinstance(doc, str) else doc)
    assert (brief(result), result["tasks"][0]["history"], result["violations"]) == (
        {
            "job-1": ("Running", "node-b", [0], 2, 121, None, "NodeFailure"),
            "job-2": ("Running", "node-b", [0], 2, 121, None, "NodeFailure"),
        },
        [
            entry(0, "Admitted", node="node-a", gpus=(0,)),
            entry(121, "Evicted", "NodeFailure", "node-a", (0,)),
            entry(121, "Requeued", "NodeFailure"),
            entry(121, "Admitted", node="node-b", gpus=(0,)),
        ],
        [],
    )


def test_batch_makespan_beats_fifo() -> None:
    """Every task succeeds under both policies, and packing finishes sooner than the strict FIFO baseline."""
    packed, fifo = run_scenario(BATCH), run_scenario(BATCH, policy="fifo")
    phases = {t["phase"] for t in packed["tasks"] + fifo["tasks"]}
    message = f"default makespan {packed['makespan']} s, fifo makespan {fifo['makespan']} s"
    assert (phases, packed["violations"] + fifo["violations"], packed["makespan"] < fifo["makespan"]) == (
        {"Succeeded"},
        [],
        True,
    ), message


def test_seed_batch_makespan_file() -> None:
    """As written the shared seed cannot meet its header: t03 wants 4 GPUs on 2-GPU servers, so it is
    Inadmissible (blocking nobody) and t01's 3600 s bounds both makespans; the inline copy shows the gain."""
    doc = seed("seed-batch-makespan")
    runs = {policy: run_scenario(doc, policy=policy) for policy in ("bestfit", "fifo")}
    summary = {
        policy: (
            out["makespan"],
            [(t["name"], t["phase"], t["reason"]) for t in out["tasks"] if t["phase"] != "Succeeded"],
            out["violations"],
        )
        for policy, out in runs.items()
    }
    stuck = [("t03-big-4gpu", "Pending", "Inadmissible")]
    assert summary == {"bestfit": (3600, stuck, []), "fifo": (3600, stuck, [])}


def test_fifo_baseline_takes_whole_gpus() -> None:
    """Under --policy fifo a 4Gi task takes a whole GPU and blocks its queue's later tasks (StrictFIFO)."""
    doc = scenario(
        [node("node-a", "24Gi")],
        [submit("a", duration=100, gpuMemory="4Gi"), submit("b", duration=100, gpuMemory="4Gi")],
    )
    assert brief(run_scenario(doc, policy="fifo")) == {
        "a": ("Succeeded", "node-a", [0], 1, 0, 100, None),
        "b": ("Succeeded", "node-a", [0], 1, 100, 200, "NoFit"),
    }


# -- restarts, node and GPU events, deletes, failures -----------------------------------------
RESTART_BASE = copy.deepcopy(BATCH)
RESTART_BASE["events"] += [
    {"at": 1000, "nodeDown": {"name": "node-b"}},
    {"at": 2500, "nodeUp": {"name": "node-b"}},
]


@pytest.mark.parametrize("at", [0, 300, 1000, 1030, 1060, 1800, 2500, 5000])
def test_restart_changes_nothing(at: float) -> None:
    """A restartOperator at any time gives the same outcome as the run without it."""
    restarted = copy.deepcopy(RESTART_BASE)
    restarted["events"].append({"at": at, "restartOperator": {}})
    assert run_scenario(restarted) == run_scenario(RESTART_BASE)


@pytest.mark.parametrize(
    "failure",
    [{"gpuUnhealthy": {"node": "node-a", "index": 0}}, {"nodeDeleted": {"name": "node-a"}}],
    ids=["gpuUnhealthy", "nodeDeleted"],
)
def test_restart_right_after_a_failure_keeps_the_eviction(failure: dict[str, Any]) -> None:
    """A restart in the same instant as a GPU or node failure still evicts the tasks it hit."""
    plain = scenario(
        [node("node-a", "24Gi", "24Gi"), node("node-b", "24Gi")],
        [submit("a", gpuMemory="20Gi"), submit("b", gpuMemory="20Gi"), {"at": 50, **failure}],
    )
    restarted = copy.deepcopy(plain)
    restarted["events"].append({"at": 50, "restartOperator": {}})
    assert run_scenario(restarted) == run_scenario(plain)


def test_node_up_within_grace_changes_nothing() -> None:
    """A node back before the grace period ends keeps its tasks, as if it never went down."""
    flapping = copy.deepcopy(NODE_FAILURE)
    flapping["events"].append({"at": 100, "nodeUp": {"name": "node-a"}})
    steady = copy.deepcopy(NODE_FAILURE)
    steady["events"].pop()
    assert run_scenario(flapping) == run_scenario(steady)


def test_node_down_blocks_new_work_at_once() -> None:
    """A NotReady node gets no new task even within the grace period."""
    doc = scenario(
        [node("node-a", "80Gi"), node("node-b", "80Gi")],
        [{"at": 0, "nodeDown": {"name": "node-a"}}, submit("late", at=10, gpuMemory="8Gi")],
    )
    assert brief(run_scenario(doc)) == {"late": ("Running", "node-b", [0], 1, 10, None, None)}


def test_node_deleted_evicts_at_once() -> None:
    """A deleted node's tasks are evicted at once (NodeFailure) and placed elsewhere."""
    doc = scenario(
        [node("node-a", "80Gi"), node("node-b", "80Gi")],
        [submit("job", gpuMemory="30Gi"), {"at": 5, "nodeDeleted": {"name": "node-a"}}],
    )
    assert brief(run_scenario(doc)) == {"job": ("Running", "node-b", [0], 2, 5, None, "NodeFailure")}


def test_gpu_unhealthy_evicts_and_fences_the_gpu() -> None:
    """Tasks on an unhealthy GPU move to a healthy one at once, and no new task lands on it."""
    doc = scenario(
        [node("node-a", "24Gi", "24Gi")],
        [
            submit("a", gpuMemory="4Gi"),
            {"at": 50, "gpuUnhealthy": {"node": "node-a", "index": 0}},
            submit("b", at=60, gpuMemory="4Gi"),
        ],
    )
    result = run_scenario(doc)
    assert (brief(result), result["violations"]) == (
        {
            "a": ("Running", "node-a", [1], 2, 50, None, "GPUFailure"),
            "b": ("Running", "node-a", [1], 1, 60, None, None),
        },
        [],
    )


def test_delete_frees_gpus_for_the_next_task() -> None:
    """Deleting a running task frees its GPU for a waiting one; deleting a pending one just drops it."""
    doc = scenario(
        [node("node-a", "24Gi")],
        [
            submit("a"),
            submit("b", at=1),
            submit("c", at=2),
            {"at": 30, "delete": {"name": "a", "namespace": "default"}},
            {"at": 30, "delete": {"name": "c"}},
        ],
    )
    result = run_scenario(doc)
    assert (brief(result), result["tasks"][0]["history"], result["queues"]["default"]["pending"]) == (
        {
            "a": ("Deleted", "node-a", [0], 1, 0, 30, "Deleted"),
            "b": ("Running", "node-a", [0], 1, 30, None, "NoFit"),
            "c": ("Deleted", None, [], 0, None, None, "Deleted"),
        },
        [entry(0, "Admitted", node="node-a", gpus=(0,)), entry(30, "Finished", "Deleted", "node-a", (0,))],
        0,
    )


def test_max_reschedules_exhausted_fails_the_task() -> None:
    """A task evicted for failures more than maxReschedules times ends Failed (MaxReschedulesExceeded)."""
    doc = scenario(
        [node("node-a", "24Gi", "24Gi", "24Gi")],
        [
            submit("a", gpuMemory="4Gi", maxReschedules=1),
            {"at": 10, "gpuUnhealthy": {"node": "node-a", "index": 0}},
            {"at": 20, "gpuUnhealthy": {"node": "node-a", "index": 1}},
        ],
    )
    result = run_scenario(doc)
    assert (brief(result), result["tasks"][0]["history"]) == (
        {"a": ("Failed", None, [], 2, None, 20, "MaxReschedulesExceeded")},
        [
            entry(0, "Admitted", node="node-a", gpus=(0,)),
            entry(10, "Evicted", "GPUFailure", "node-a", (0,)),
            entry(10, "Requeued", "GPUFailure"),
            entry(10, "Admitted", node="node-a", gpus=(1,)),
            entry(20, "Evicted", "GPUFailure", "node-a", (1,)),
            entry(20, "Failed", "MaxReschedulesExceeded"),
        ],
    )


def test_invalid_spec_is_rejected() -> None:
    """A task with a spec the operator refuses is Rejected with the conversion's reason, phase Failed."""
    doc = scenario(
        [node("node-a", "24Gi")],
        [submit("bad", gpuMemory="lots"), submit("ghost-class", priorityClassName="nope")],
    )
    result = run_scenario(doc)
    assert (brief(result), result["tasks"][0]["history"], result["queues"]) == (
        {
            "bad": ("Failed", None, [], 0, None, None, "InvalidSpec"),
            "ghost-class": ("Failed", None, [], 0, None, None, "PriorityClassNotFound"),
        },
        [entry(0, "Rejected", "InvalidSpec")],
        {"default": {"usage": {"nvidia.com/gpu": 0, "gputask.io/gpu-memory": 0}, "pending": 0, "admitted": 0}},
    )


def test_priority_classes_order_the_queue() -> None:
    """A later task of a higher priority class is admitted before an older one."""
    doc = scenario(
        [node("node-a", "24Gi")],
        [
            submit("blocker", duration=100),
            submit("old", at=1, duration=100),
            submit("urgent", at=2, duration=100, priorityClassName="high"),
        ],
    )
    doc["priorityClasses"] = [{"name": "high", "value": 1000}]
    assert brief(run_scenario(doc)) == {
        "blocker": ("Succeeded", "node-a", [0], 1, 0, 100, None),
        "old": ("Succeeded", "node-a", [0], 1, 200, 300, "NoFit"),
        "urgent": ("Succeeded", "node-a", [0], 1, 100, 200, "NoFit"),
    }


def test_grace_period_comes_from_config() -> None:
    """The node-failure grace period is the operator configuration's, and is printed in the output."""
    result = run_scenario(NODE_FAILURE, config=Config.model_validate({"nodeFailureGracePeriod": "5m"}))
    assert (brief(result)["job-1"][:5], result["config"]["nodeFailureGracePeriod"]) == (
        ("Running", "node-b", [0], 2, 361),
        300.0,
    )


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"events": [{"at": 0, "explode": {}}]},
            "events[0]: unknown event kind 'explode'; known: submit, delete, nodeDown, nodeUp, nodeDeleted, "
            "gpuUnhealthy, nodeUpdate, restartOperator",
        ),
        (
            {"events": [{"at": -5, "restartOperator": {}}]},
            "events[0].at: Input should be greater than or equal to 0",
        ),
        (
            {"nodes": [node("node-a", "lots")]},
            "nodes[0].gpus[0].memory: 'lots': " + QUANTITY_RULE,
        ),
        (
            {"nodes": [node("node-a", "1Ei")]},
            "nodes[0].gpus[0].memory: '1Ei' is more than any GPU has (limit 1Ti)",
        ),
        (
            {"nodes": [node("node-a", "24")]},
            "nodes[0].gpus[0].memory: '24' is less than 1Mi (a bare number is bytes; write e.g. 24Gi)",
        ),
        ({"colour": "blue"}, "colour: unknown field"),
        (
            {"events": [{"at": 0, "delete": {"name": "nobody"}}]},
            "events[0] (at 0, delete): no task default/nobody to delete",
        ),
        (
            {"events": [{"at": 0, "gpuUnhealthy": {"node": "node-a", "index": 3}}]},
            "events[0] (at 0, gpuUnhealthy): node 'node-a' has no GPU 3 (it has 1)",
        ),
        (
            {"events": [submit("a"), submit("a", at=5)]},
            "events[1] (at 5, submit): task default/a already exists (delete it first)",
        ),
        (
            {"events": [{"at": 0, "nodeUp": {"name": "node-a"}, "delete": {"name": "x"}}]},
            "events[0]: an event needs exactly one of submit, delete, nodeDown, nodeUp, nodeDeleted, "
            "gpuUnhealthy, nodeUpdate, restartOperator; got ['nodeUp', 'delete']",
        ),
        (
            {
                "events": [
                    {"at": 0, "nodeDown": {"name": "node-z"}},
                    {"at": 9000, "nodeUp": {"name": "node-a"}},
                ]
            },
            "events[0] (at 0, nodeDown): no node 'node-z'\nevents[1] (at 9000, nodeUp): after until (3600)",
        ),
        (
            {"queues": [{"name": "q", "spec": {"queueingStrategy": "Random"}}]},
            "queues[0] (q).spec: queueingStrategy 'Random': use BestEffortFIFO or StrictFIFO",
        ),
        (
            {"nodes": [node("nœud-ü", "24Gi")]},
            "nodes[0].name: 'nœud-ü' is not a Kubernetes name: lower-case letters, digits, '-' and '.', starting "
            "and ending with a letter or digit, at most 253 characters",
        ),
        (
            {"events": [{"at": 0, "submit": {"metadata": {"name": "t", "namespace": "Team_A"}, "spec": {}}}]},
            "events[0].submit.metadata.namespace: 'Team_A' is not a Kubernetes namespace name: lower-case "
            "letters, digits and '-', starting and ending with a letter or digit, at most 63 characters",
        ),
        (
            {"events": [submit("t", duration=1e300)]},
            "events[0].submit.duration: Input should be less than or equal to 1000000000",
        ),
        (
            {"resourceFlavors": [{"name": "a10", "spec": {"gpuMemory": "-1Gi"}}]},
            "resourceFlavors[0] (a10).spec: spec.gpuMemory: '-1Gi' must be positive",
        ),
    ],
)
def test_bad_input_is_a_clear_error(change: dict[str, Any], message: str) -> None:
    """Invalid scenario input raises ScenarioError saying where and what."""
    doc = scenario([node("node-a", "24Gi")], []) | change
    with pytest.raises(ScenarioError) as caught:
        run_scenario(doc)
    assert str(caught.value) == message


def test_unknown_policy_lists_known_ones() -> None:
    """An unknown policy name is refused with the list of known names, fifo included."""
    with pytest.raises(ScenarioError) as caught:
        run_scenario(BASIC, policy="magic")
    assert str(caught.value) == f"unknown policy 'magic'; known: {', '.join(sorted([*POLICIES, 'fifo']))}"


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI answers bad input with exit code 2 and a single line on stderr, no traceback."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(scenario([node("node-a", "24Gi")], [{"at": -1, "explode": {}}])))
    code = cli_run(path, output="json", policy="bestfit", plot=None)
    captured = capsys.readouterr()
    assert (
        code,
        captured.out,
        captured.err.count("\n"),
        captured.err.startswith(f"error: {path}: events[0]"),
    ) == (2, "", 1, True)


def test_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints the same JSON as run_scenario, exits 0 without violations, and writes the plot."""
    pytest.importorskip("matplotlib")
    path = tmp_path / "basic.yaml"
    path.write_text(yaml.safe_dump(NODE_FAILURE))
    code = cli_run(path, output="json", policy="bestfit", plot=tmp_path / "timeline.png")
    printed = json.loads(capsys.readouterr().out)
    assert (code, printed, (tmp_path / "timeline.png").read_bytes()[:4]) == (
        0,
        run_scenario(NODE_FAILURE, policy="bestfit"),
        b"\x89PNG",
    )


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table output names every task, the queue, and says there were no violations."""
    path = tmp_path / "basic.yaml"
    path.write_text(yaml.safe_dump(BASIC))
    code = cli_run(path, output="table", policy="bestfit", plot=None)
    out = capsys.readouterr().out
    assert (code, [w in out for w in ("default/big", "default/small", "queues", "no violations")]) == (
        0,
        [True] * 4,
    )


# -- random scenarios ---------------------------------------------------------------------------
NODE_NAMES = ("n1", "n2", "n3")


@st.composite
def random_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A small random but valid scenario over up to 3 nodes, 2 queues (preempting or not) and 8 tasks."""
    nodes = [
        node(n, *draw(st.lists(st.sampled_from(["8Gi", "16Gi", "24Gi"]), min_size=1, max_size=3)))
        for n in NODE_NAMES[: draw(st.integers(1, 3))]
    ]
    quota = st.fixed_dictionaries(
        {
            "name": st.just("nvidia.com/gpu"),
            "nominalQuota": st.integers(0, 4),
            "borrowingLimit": st.none() | st.integers(0, 2),
        }
    )
    queues = [
        {
            "name": q,
            "spec": {
                "cohort": "org",
                "queueingStrategy": draw(st.sampled_from(["BestEffortFIFO", "StrictFIFO"])),
                "resources": draw(st.lists(quota, max_size=1)),
                "preemption": {
                    "withinClusterQueue": draw(
                        st.sampled_from(["Never", "LowerPriority", "LowerOrNewerEqualPriority"])
                    ),
                    "reclaimWithinCohort": draw(st.sampled_from(["Never", "Any"])),
                },
            },
        }
        for q in ("qa", "qb")
    ]
    times = st.integers(0, 20).map(lambda t: t * 10)
    events: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 8))):
        spec = {
            "queueName": draw(st.sampled_from(["qa", "qb"])),
            "gpus": draw(st.integers(1, 2)),
            "maxReschedules": draw(st.integers(0, 2)),
        }
        if draw(st.booleans()):
            spec["priorityClassName"] = "high"
        spec |= draw(st.sampled_from([{}, {"gpuMemory": "4Gi"}, {"gpuMemory": "10Gi"}, {"gpuFraction": "0.5"}]))
        body = {
            "metadata": {"name": f"t{i}"},
            "spec": spec,
            "duration": draw(st.none() | st.integers(5, 150)),
        }
        events.append({"at": draw(times), "submit": body})
    node_event = st.sampled_from(["nodeDown", "nodeUp", "nodeDeleted", "gpuUnhealthy", "restartOperator", "delete"])
    for _ in range(draw(st.integers(0, 6))):
        kind, name = draw(node_event), draw(st.sampled_from([n["name"] for n in nodes]))
        body: dict[str, Any] = {"name": name}
        if kind == "gpuUnhealthy":
            body = {"node": name, "index": draw(st.integers(0, 2))}
        elif kind == "restartOperator":
            body = {}
        elif kind == "delete":
            body = {"name": f"t{draw(st.integers(0, 7))}"}
        events.append({"at": draw(times), kind: body})
    return {
        "nodes": nodes,
        "queues": queues,
        "priorityClasses": [{"name": "high", "value": 100}],
        "events": _valid_only(nodes, events),
        "until": 400,
    }


def _valid_only(nodes: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop events that name tasks, nodes or GPUs that do not exist at their time."""
    gpus = {n["name"]: len(n["gpus"]) for n in nodes}
    live: set[str] = set()
    kept = []
    for event in sorted(events, key=lambda e: e["at"]):
        if "submit" in event:
            live.add(event["submit"]["metadata"]["name"])
        elif "delete" in event:
            if event["delete"]["name"] not in live:
                continue
            live.discard(event["delete"]["name"])
        elif "gpuUnhealthy" in event:
            ref = event["gpuUnhealthy"]
            if ref["node"] not in gpus or ref["index"] >= gpus[ref["node"]]:
                continue
        elif "restartOperator" not in event:
            kind = next(iter(k for k in event if k != "at"))
            if event[kind]["name"] not in gpus:
                continue
            if kind == "nodeDeleted":
                del gpus[event[kind]["name"]]
        kept.append(event)
    return kept


PHASES = {"Pending", "Running", "Succeeded", "Failed", "Deleted"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=random_scenarios(), grace=st.sampled_from([0, 30, 60]), policy=st.sampled_from(["bestfit", "fifo"]))
def test_random_scenarios_keep_invariants(doc: dict[str, Any], grace: int, policy: str) -> None:
    """No invariant breaks and every submitted task ends in exactly one known phase."""
    result = run_scenario(doc, policy=policy, config=Config.model_validate({"nodeFailureGracePeriod": grace}))
    submitted = sorted(e["submit"]["metadata"]["name"] for e in doc["events"] if "submit" in e)
    assert (
        result["violations"],
        sorted(t["name"] for t in result["tasks"]),
        {t["phase"] for t in result["tasks"]} <= PHASES,
    ) == ([], submitted, True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=random_scenarios(), at=st.integers(0, 40).map(lambda t: t * 10))
def test_random_restarts_change_nothing(doc: dict[str, Any], at: int) -> None:
    """Restarting the operator at any moment of a random run loses, adds or moves nothing."""
    plain = {**doc, "events": [e for e in doc["events"] if "restartOperator" not in e]}
    restarted = {**plain, "events": [*plain["events"], {"at": at, "restartOperator": {}}]}
    assert run_scenario(restarted) == run_scenario(plain)


def test_a_task_lost_across_a_restart_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's own bookkeeping catches a restart that forgets a running task."""
    from gputask.core import Scheduler

    monkeypatch.setattr(Scheduler, "restore", lambda self, *args, **kwargs: None)
    doc = copy.deepcopy(NODE_FAILURE)
    doc["events"] = doc["events"][:2] + [{"at": 30, "restartOperator": {}}]
    assert run_scenario(doc)["violations"] == [
        "at 30: task lost: default/job-1 runs on node-a but the scheduler does not hold it there",
        "at 30: task lost: default/job-2 runs on node-a but the scheduler does not hold it there",
    ]


def test_cli_names_each_bad_file_once_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Broken YAML, non-UTF-8 bytes and a bad --config each give one line naming the file once."""
    broken, binary, config, good = (tmp_path / n for n in ("broken.yaml", "binary.yaml", "cfg.yaml", "ok.yaml"))
    broken.write_text("[1,2\n")
    binary.write_bytes(b"\xff\xfe")
    config.write_text("cycleInterval: x\n")
    good.write_text(yaml.safe_dump(BASIC))
    errors = []
    for path, cfg in ((broken, None), (binary, None), (good, config)):
        code = cli_run(path, output="json", policy="bestfit", plot=None, config=cfg)
        errors.append((code, capsys.readouterr().err))
    assert errors == [
        (2, f"error: {broken}: not valid YAML: expected ',' or ']', but got '<stream end>' at line 2, column 1\n"),
        (2, f"error: {binary}: not UTF-8 text: invalid start byte at byte 0\n"),
        (
            2,
            f"error: {config}: invalid configuration: cycleInterval: Value error, not a duration: 'x' "
            "(use e.g. 30s, 2m, 1h)\n",
        ),
    ]


def test_runs_are_the_same_whatever_the_hash_seed(tmp_path: Path) -> None:
    """A chaos scenario (failures, restarts, preemption) gives the same JSON under two PYTHONHASHSEEDs:
    no decision depends on the iteration order of a set or dict of strings."""
    doc = tmp_path / "chaos.yaml"
    env = {**os.environ, "PYTHONHASHSEED": "1"}
    chaos = [sys.executable, "-m", "gputask.cli", "scenario", "chaos", "--nodes", "12", "--tasks", "120",
             "--seed", "7", "--write", str(doc)]
    subprocess.run(chaos, env=env, capture_output=True, check=False, timeout=300)
    outputs = [
        subprocess.run([sys.executable, "-m", "gputask.cli", "scenario", "run", str(doc), "--output", "json"],
                       env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=300).stdout
        for seed in ("1", "2")
    ]
    assert (len(outputs[0]) > 1000, outputs[0] == outputs[1]) == (True, True)


def test_a_scenario_with_flavors_charges_each_and_its_table_sums_them(tmp_path: Path) -> None:
    """resourceFlavors and resourceGroups in a scenario: an A10 and a T4 quota'd separately; the JSON has the
    usage per flavor, the printed table the sum (GPUs used 2)."""
    from rich.console import Console

    from gputask.sim.scenario_report import print_table

    groups = [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
        {"name": "a10", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]},
        {"name": "t4", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]}]}]
    doc = scenario(
        [node("node-a", "24Gi"), node("node-b", "16Gi", product="Tesla-T4")],
        [submit("x", duration=100), submit("y", duration=100), submit("z", duration=100)],
    ) | {
        "resourceFlavors": [{"name": "a10", "spec": {"gpuProducts": ["NVIDIA-A10"]}},
                            {"name": "t4", "spec": {"gpuProducts": ["Tesla-T4"]}}],
        "queues": [{"name": "default", "spec": {"resourceGroups": groups}}],
        "until": 50,
    }
    result = run_scenario(doc)
    console = Console(width=120, record=True)
    print_table(result, console)
    table = console.export_text()
    queues = table[table.index("queues"):]
    row = next(line for line in queues.splitlines() if " default " in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert ({k: v for k, v in result["queues"]["default"]["usage"].items() if k.startswith("nvidia")},
            result["queues"]["default"]["pending"], cells[1:3]) == (
        {"nvidia.com/gpu@a10": 1000, "nvidia.com/gpu@t4": 1000}, 1, ["2", "40960"],
    )


def test_the_tasks_table_names_its_gpu_column_as_indices_not_a_count() -> None:
    """The tasks table heads its GPU column "GPU index" (a task on GPUs 0 and 1 shows 0,1): "GPUs 0" read as none."""
    from rich.console import Console

    from gputask.sim.scenario_report import print_table

    result = run_scenario(scenario([node("node-a", "24Gi", "24Gi")], [submit("x", gpus=2)]))
    console = Console(width=160, record=True)
    print_table(result, console)
    lines = console.export_text().splitlines()
    header = next(line for line in lines if " task " in line)
    row = next(line for line in lines if "default/x" in line)
    cells = [c.strip() for c in header.strip("┃ ").split("┃")], [c.strip() for c in row.strip("│ ").split("│")]
    assert (cells[0][3], cells[1][3]) == ("GPU index", "0,1")


def test_plot_title_counts_outcomes_and_bad_plot_paths_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    """The plot's title says how many finished and what is left at the end (never "makespan None"); the table
    prints the unfinished count; a --plot that cannot be written is one line on stderr and exit 2."""
    from gputask.sim.scenario_plot import title_of

    result = run_scenario(NODE_FAILURE, policy="bestfit")
    phases = sorted(t["phase"] for t in result["tasks"])
    finished = phases.count("Succeeded")
    assert title_of(result, 1000.0).startswith(f"policy bestfit: {finished} of {len(phases)} tasks finished")
    assert title_of({"policy": "p", "makespan": 310, "tasks": [{"phase": "Succeeded"}, {"phase": "Running"},
                                                                {"phase": "Pending"}]}, 600.0) == (
        "policy p: 1 of 3 tasks finished, the last at 310 s; at the end (600 s): 1 running, 1 waiting")
    path = tmp_path / "basic.yaml"
    path.write_text(yaml.safe_dump(BASIC))
    (tmp_path / "folder.png").mkdir()
    for bad in (tmp_path / "folder.png", tmp_path / "no" / "x.png", tmp_path / "x.svg"):
        assert cli_run(path, output="table", policy="bestfit", plot=bad) == 2
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"error: --plot {bad}: give a .png file path in an existing "
                                                    "folder\n")
    cli_run(path, output="table", policy="bestfit", plot=None)
    assert f"unfinished {run_scenario(BASIC, policy='bestfit')['unfinished']} " in capsys.readouterr().out


# -- MIG devices ---------------------------------------------------------------------------------
A100 = "NVIDIA-A100-SXM4-80GB"
MIG_NODE = {
    "name": "node-a",
    "gpus": [
        {"product": A100, "memory": "80Gi", "mig": [
            {"profile": "1g.10gb", "memory": "9728Mi"},
            {"profile": "1g.10gb", "memory": "9728Mi"},
            {"profile": "3g.40gb", "memory": "40192Mi"},
        ]},
        {"product": A100, "memory": "80Gi"},
    ],
}


def test_mig_devices_take_only_tasks_that_name_their_product() -> None:
    """MIG devices (indices 100..) take the tasks whose gpuProducts name their profile, shared by memory or
    whole; tasks naming no product get the GPU outside MIG or wait, never a MIG device or the MIG-mode GPU."""
    doc = scenario(
        [MIG_NODE],
        [
            submit("small-a", gpuMemory="4Gi", gpuProducts=[f"{A100}-MIG-1g.10gb"]),
            submit("small-b", gpuMemory="4Gi", gpuProducts=[f"{A100}-MIG-1g.10gb"]),
            submit("small-c", gpuMemory="6Gi", gpuProducts=[f"{A100}-MIG-1g.10gb"]),
            submit("big", gpus=1, gpuProducts=[f"{A100}-MIG-3g.40gb"]),
            submit("whole", gpus=1),
            submit("whole-2", gpus=1),
        ],
        until=60,
    )
    result = run_scenario(doc)
    assert ({n: v[:3] for n, v in brief(result).items()}, result["violations"]) == (
        {
            "small-a": ("Running", "node-a", [100]),
            "small-b": ("Running", "node-a", [100]),
            "small-c": ("Running", "node-a", [101]),
            "big": ("Running", "node-a", [102]),
            "whole": ("Running", "node-a", [1]),
            "whole-2": ("Pending", None, []),
        },
        [],
    )


def test_a_failed_gpu_in_mig_mode_takes_its_mig_devices_down() -> None:
    """gpuUnhealthy on the MIG-mode GPU evicts the tasks on its MIG devices, as an XID on the GPU does; a
    MIG device's own index can be named too."""
    doc = scenario(
        [MIG_NODE],
        [
            submit("small", gpuMemory="4Gi", gpuProducts=[f"{A100}-MIG-1g.10gb"]),
            {"at": 10, "gpuUnhealthy": {"node": "node-a", "index": 0}},
            {"at": 20, "gpuUnhealthy": {"node": "node-a", "index": 102}},
        ],
        until=60,
    )
    result = run_scenario(doc)
    assert (brief(result)["small"], result["violations"]) == (("Pending", None, [], 1, None, None, "NoFit"), [])


def test_a_gpu_event_naming_a_missing_mig_device_is_refused() -> None:
    """A gpuUnhealthy index that is neither a GPU nor a MIG device of the node is a clear error."""
    doc = scenario([MIG_NODE], [{"at": 1, "gpuUnhealthy": {"node": "node-a", "index": 103}}], until=60)
    with pytest.raises(ScenarioError) as info:
        run_scenario(doc)
    assert str(info.value) == (
        "events[0] (at 1, gpuUnhealthy): node 'node-a' has no GPU 103 (it has 2, and MIG devices [100, 101, 102])"
    )


def test_mig_devices_larger_than_their_gpu_are_refused() -> None:
    """A GPU whose MIG devices add up to more memory than it has is a clear error, not two tasks in 10Gi."""
    gpu = {"product": A100, "memory": "10Gi", "mig": [{"profile": "7g.80gb", "memory": "80Gi"}] * 2}
    with pytest.raises(ScenarioError) as info:
        run_scenario(scenario([{"name": "node-a", "gpus": [gpu]}], [], until=60))
    assert str(info.value) == "nodes[0].gpus[0].mig: its MIG devices have 163840 MiB, more than the GPU's 10240 MiB"


def test_unknown_fields_in_specs_are_refused_by_name() -> None:
    """A misspelled task field (gpuMemroy) or queue field is refused, naming each, instead of running a whole GPU."""
    doc = scenario([node("node-a", "24Gi")], [submit("t", gpus=1, gpuMemroy="4Gi")],
                   queue_spec={"resources": [{"name": "gputask.io/gpu-memory", "nominalQuota": "24Gi", "borow": 1}]})
    with pytest.raises(ScenarioError) as refused:
        run_scenario(doc)
    assert str(refused.value) == (
        "events[0].submit.spec.gpuMemroy: unknown field (not in the GPUTask CRD)\n"
        "queues[0].spec.resources[0].borow: unknown field (not in the GPUClusterQueue CRD)"
    )


def test_links_per_node_put_a_multi_gpu_task_on_the_nvlinked_pair() -> None:
    """A node's ``links`` (as the GPUNode's): the 2-GPU task gets the NVLinked GPUs 2, 3 of four alike ones;
    without links the same scenario places it on 0, 1, and a 1-GPU task is placed as before either way."""
    links = [{"a": 2, "b": 3, "type": "NVLink", "count": 12}, {"a": 0, "b": 1, "type": "PCIeSwitch"}]
    linked = node("node-a", "24Gi", "24Gi", "24Gi", "24Gi") | {"links": links}
    events = [submit("pair", gpus=2), submit("one", at=1, gpus=1)]
    with_links = brief(run_scenario(scenario([linked], events)))
    without = brief(run_scenario(scenario([node("node-a", "24Gi", "24Gi", "24Gi", "24Gi")], events)))
    assert [(with_links[t][2], without[t][2]) for t in ("pair", "one")] == [([2, 3], [0, 1]), ([0], [2])]


@pytest.mark.parametrize(
    ("links", "message"),
    [
        ([{"a": 0, "b": 2, "type": "CrossNUMA"}], "nodes[0].links[0]: a and b must be two different GPUs of 0..1"),
        ([{"a": 0, "b": 1, "type": "NVLink"}], "nodes[0].links[0]: count (the NVLinks) is required on type NVLink "
                                                "and only there"),
        ([{"a": 0, "b": 1, "type": "CrossNUMA"}, {"a": 1, "b": 0, "type": "CrossNUMA"}],
         "nodes[0].links[1]: GPUs 0 and 1 are linked twice"),
        ([{"a": 0, "b": 1, "type": "Fast"}], "nodes[0].links[0].type: Input should be 'NVLink', 'PCIeSwitch', "
                                              "'HostBridge', 'SameNUMANode' or 'CrossNUMA'"),
    ],
)
def test_bad_links_are_a_clear_error(links: list[dict[str, Any]], message: str) -> None:
    doc = scenario([node("node-a", "24Gi", "24Gi") | {"links": links}], [])
    with pytest.raises(ScenarioError) as caught:
        run_scenario(doc)
    assert str(caught.value) == message


def _fragmented_scenario() -> dict[str, Any]:
    """Two nodes of 4 GPUs; packing fills node-a with a1-a4, node-b with b1-b4; a1, a2, b1, b2 finish at 100 (2 GPUs
    free on each node); a 4-GPU task arrives at 200. The others opted in to moves."""
    nodes = [node("node-a", *["24Gi"] * 4), node("node-b", *["24Gi"] * 4)]
    events = [submit(f"{n}{i}", 0, 100 if i <= 2 else None, gpus=1, **({} if i <= 2 else {
        "disruption": {"movable": True}})) for n in ("a", "b") for i in range(1, 5)]
    events.append(submit("big", 200, gpus=4))
    return scenario(nodes, events, until=400)


def test_defragmentation_moves_two_tasks_and_their_history_shows_it() -> None:
    """Enabled (minRuntime 60s): at 200 a3 and a4 are evicted (Defragmented, by big) and admitted on node-b at once,
    and big is admitted on node-a; Disabled: big waits Fragmented, naming the free blocks."""
    on = Config.model_validate({"defragmentation": {"mode": "Enabled", "minRuntime": "60s"}})
    result = run_scenario(_fragmented_scenario(), config=on)
    tasks = {t["name"]: t for t in result["tasks"]}
    assert tasks["a3"]["history"] == [
        entry(0, "Admitted", node="node-a", gpus=(2,)),
        entry(200, "Evicted", "Defragmented", node="node-a", gpus=(2,), by="default/big"),
        entry(200, "Requeued", "Defragmented"),
        entry(200, "Admitted", node="node-b", gpus=(0,)),
    ]
    assert tasks["big"]["history"] == [entry(200, "Admitted", node="node-a", gpus=(0, 1, 2, 3))]
    assert (tasks["a4"]["node"], tasks["a4"]["attempt"]) == ("node-b", 2)
    assert result["defragmentation"]["plans"] == [{
        "at": 200, "task": "default/big", "node": "node-a", "applied": True,
        "moves": [{"task": "default/a3", "from": "node-a", "to": "node-b", "lostGpuSeconds": 200},
                  {"task": "default/a4", "from": "node-a", "to": "node-b", "lostGpuSeconds": 200}],
    }]
    assert result["violations"] == []
    off = {t["name"]: t for t in run_scenario(_fragmented_scenario())["tasks"]}
    assert (off["big"]["phase"], off["big"]["reason"], off["big"]["message"]) == (
        "Pending", "Fragmented", "needs 4 GPUs idle on one node: 4 are free in the cluster but no node has more than 2 "
        "(largest free blocks: node-a 2, node-b 2)")
