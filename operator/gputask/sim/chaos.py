"""Chaos scenarios: long randomized runs with failures, restarts and deletions.

:func:`generate` writes a scenario (DESIGN.md section 6) with hundreds of nodes and thousands
of tasks, mixed with random node outages (some back within the grace period, some not), node
deletions, unhealthy GPUs, operator restarts and task deletions. Running it must give no
violations and account for every task: that is the promise of "nothing lost, nothing
double-booked" checked at scale (``gputask scenario chaos``).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

GPU_SHAPES = (
    (1, "24Gi", "NVIDIA-A10"),
    (2, "40Gi", "NVIDIA-A100-40GB"),
    (4, "80Gi", "NVIDIA-H100"),
    (8, "16Gi", "NVIDIA-T4"),
)
QUEUE_SPECS: list[dict[str, Any]] = [
    {
        "name": "team-a",
        "spec": {
            "cohort": "org",
            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 0}],
            "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
        },
    },
    {
        "name": "team-b",
        "spec": {
            "cohort": "org",
            "queueingStrategy": "StrictFIFO",
            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 0}],
            "preemption": {"withinClusterQueue": "LowerOrNewerEqualPriority", "reclaimWithinCohort": "LowerPriority"},
        },
    },
    {
        "name": "batch",
        "spec": {"cohort": "org", "resources": [{"name": "gputask.io/gpu-memory", "nominalQuota": "4Ti"}]},
    },
]


def generate(*, seed: int, nodes: int, tasks: int, until: float = 20000.0, load: float = 1.0) -> dict[str, Any]:
    """A random but valid scenario; the same arguments always give the same scenario.

    Tasks arrive over the first 70 % of ``until`` seconds divided by ``load``: at ``load`` 3 they come
    three times as fast, queues contend for the cohort's GPUs and higher-priority tasks preempt.
    """
    rng = random.Random(seed)
    node_list = [_node(rng, i) for i in range(nodes)]
    total_gpus = sum(len(n["gpus"]) for n in node_list)
    queues = [dict(q, spec=dict(q["spec"])) for q in QUEUE_SPECS]
    for q in queues[:2]:  # each team owns a third of the GPUs; the rest is lent through the cohort
        q["spec"]["resources"] = [{"name": "nvidia.com/gpu", "nominalQuota": total_gpus // 3}]
    events = [_submit(rng, i, until * 0.7 / load) for i in range(tasks)]
    events += _faults(rng, node_list, until)
    events += _deletes(rng, events, until)
    events.sort(key=lambda e: e["at"])
    return {
        "nodes": node_list,
        "queues": queues,
        "priorityClasses": [{"name": "low", "value": 0}, {"name": "high", "value": 100}],
        "events": events,
        "until": until,
    }


def _node(rng: random.Random, i: int) -> dict[str, Any]:
    count, memory, product = rng.choice(GPU_SHAPES)
    return {"name": f"node-{i:04d}", "gpus": [{"product": product, "memory": memory}] * count}


def _submit(rng: random.Random, i: int, window: float) -> dict[str, Any]:
    spec: dict[str, Any] = {"queueName": rng.choice(("team-a", "team-b", "batch")), "gpus": rng.choice((1, 1, 1, 2, 4))}
    shape = rng.random()
    if shape < 0.5:
        spec["gpuMemory"] = rng.choice(("4Gi", "8Gi", "12Gi", "20Gi"))
    elif shape < 0.7:
        spec["gpuFraction"] = rng.choice(("0.25", "0.5"))
    if rng.random() < 0.3:
        spec["priorityClassName"] = "high"
    if spec["queueName"] == "batch" and "gpuMemory" not in spec:
        spec.pop("gpuFraction", None)
        spec["gpuMemory"] = "8Gi"  # the batch queue limits memory, so its tasks state it
    return {
        "at": round(rng.uniform(0, window), 1),
        "submit": {
            "metadata": {"name": f"task-{i:05d}", "namespace": "default"},
            "spec": spec,
            "duration": rng.choice((300, 600, 1200, 2400, 3600)),
        },
    }


def _faults(rng: random.Random, nodes: list[dict[str, Any]], until: float) -> list[dict[str, Any]]:
    """Outages (back soon, back late, never back), deletions, unhealthy GPUs, restarts; never two
    faults on one node, so every reference stays valid."""
    events: list[dict[str, Any]] = []
    victims = rng.sample(nodes, k=max(1, len(nodes) // 10))
    for n, node in enumerate(victims):
        at = round(rng.uniform(100, until * 0.8), 1)
        kind = n % 4
        if kind == 0:  # back within the grace period: nothing changes
            events += [
                {"at": at, "nodeDown": {"name": node["name"]}},
                {"at": at + 30, "nodeUp": {"name": node["name"]}},
            ]
        elif kind == 1:  # back after it: its tasks were evicted and run elsewhere
            events += [
                {"at": at, "nodeDown": {"name": node["name"]}},
                {"at": at + 600, "nodeUp": {"name": node["name"]}},
            ]
        elif kind == 2:
            events.append({"at": at, "nodeDeleted": {"name": node["name"]}})
        else:
            events.append({"at": at, "gpuUnhealthy": {"node": node["name"], "index": rng.randrange(len(node["gpus"]))}})
    events += [{"at": round(rng.uniform(50, until * 0.9), 1), "restartOperator": {}} for _ in range(5)]
    return events


def _deletes(rng: random.Random, events: list[dict[str, Any]], until: float) -> list[dict[str, Any]]:
    submits = [e for e in events if "submit" in e]
    chosen = rng.sample(submits, k=len(submits) // 20)
    return [
        {"at": round(rng.uniform(e["at"] + 1, until * 0.95), 1), "delete": dict(e["submit"]["metadata"])}
        for e in chosen
    ]


def summarize(output: dict[str, Any], submitted: int) -> dict[str, Any]:
    """Phases counted, tasks accounted for, violations and evictions by reason."""
    phases = Counter(t["phase"] for t in output["tasks"])
    evictions = Counter(
        h["reason"] for t in output["tasks"] for h in t.get("history") or [] if h.get("event") == "Evicted"
    )
    return {
        "submitted": submitted,
        "accountedFor": len(output["tasks"]),
        "phases": dict(sorted(phases.items())),
        "evictions": dict(sorted(evictions.items())),
        "violations": output["violations"],
    }
