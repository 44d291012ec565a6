"""Fuzzing the input boundaries: conversion and the scenario parser raise only their documented errors.

Inputs mix valid values with missing fields, wrong types, zero, negative, enormous and
fractional numbers, and unit mix-ups, the way a hand-written manifest or a broken agent would.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gputask.core import InvalidQueueError, InvalidTaskError
from gputask.manifests.convert import node_from_gpunode, queue_from_manifest, task_from_manifest
from gputask.sim.scenario import run_scenario
from gputask.sim.scenario_model import ScenarioError, load_scenario

FUZZ = settings(max_examples=300, deadline=None)

QUANTITIES = st.sampled_from(
    ["16Gi", "16G", "16000Mi", "0", "-1Gi", "1Ei", "0.5Gi", "1e3", "abc", "", "12Ki", "1.5", "999999999Ti", "7m",
     "NaN", "sNaN", "Infinity", " 1", "1_0", "1e400"]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    QUANTITIES,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def maybe(key: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """{} or {key: value}."""
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


WORDS = st.sampled_from(["Exists", "Equal", "In", "NotIn", "Gt", "NoSchedule", "NoExecute", "k", "zone", "", "4"])
RESOURCE_MAP = st.dictionaries(st.sampled_from(["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"]),
                               QUANTITIES | SCALARS, max_size=3)
CONTAINERS = st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["main", "side"]), "image": st.just("x")},
    optional={"resources": st.fixed_dictionaries({}, optional={"requests": RESOURCE_MAP, "limits": RESOURCE_MAP}),
              "restartPolicy": st.sampled_from(["Always", "Never", 3])}), min_size=1, max_size=2)
REQUIREMENT_VALUES = WORDS | st.lists(WORDS | SCALARS, max_size=2) | SCALARS
REQUIREMENTS = st.lists(st.dictionaries(st.sampled_from(["key", "operator", "values"]), REQUIREMENT_VALUES, max_size=3),
                        max_size=2)
TOLERATION_FIELDS = st.sampled_from(["key", "operator", "value", "effect", "tolerationSeconds"])
POD_SPECS = st.fixed_dictionaries({"containers": CONTAINERS}, optional={
    "initContainers": CONTAINERS,
    "nodeSelector": st.dictionaries(WORDS, WORDS | SCALARS, max_size=2) | VALUES,
    "tolerations": st.lists(st.dictionaries(TOLERATION_FIELDS, WORDS | SCALARS, max_size=5), max_size=3) | VALUES,
    "affinity": st.fixed_dictionaries({"nodeAffinity": st.fixed_dictionaries({}, optional={
        "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries({}, optional={
            "nodeSelectorTerms": st.lists(st.fixed_dictionaries({}, optional={
                "matchExpressions": REQUIREMENTS, "matchFields": REQUIREMENTS}), max_size=2) | VALUES}) | VALUES})}),
    "overhead": RESOURCE_MAP | VALUES,
    "resources": st.fixed_dictionaries({}, optional={"requests": RESOURCE_MAP}),
})
"""Pod specs shaped like real ones, with absurd values where the scheduler reads requests and constraints."""


@st.composite
def task_specs(draw: st.DrawFn) -> Any:
    """A GPUTask spec: usually a dict of plausible-to-absurd fields, sometimes not a dict at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(VALUES)
    spec: dict[str, Any] = {}
    for key, values in (
        ("queueName", st.sampled_from(["q", "", None, 3])),
        ("gpus", st.one_of(st.integers(-3, 20), SCALARS)),
        ("gpuMemory", st.one_of(QUANTITIES, SCALARS)),
        ("gpuFraction", st.one_of(st.sampled_from(["0.25", "1", "0", "2", "-0.5", "1e-9", "nan", "inf"]), SCALARS)),
        ("gpuProducts", st.one_of(st.lists(st.sampled_from(["NVIDIA-A10", "", "x"]), max_size=3), SCALARS)),
        ("maxReschedules", st.one_of(st.integers(-2, 2000), SCALARS)),
        ("priorityClassName", st.sampled_from(["high", "missing", ""])),
        ("template", st.one_of(VALUES, st.fixed_dictionaries({"spec": POD_SPECS}))),
    ):
        spec.update(draw(maybe(key, values)))
    return spec


@FUZZ
@given(task_specs(), st.dictionaries(st.sampled_from(["kueue.x-k8s.io/queue-name", "x"]), SCALARS, max_size=2))
def test_task_conversion_raises_only_invalid_task_error(spec: Any, labels: dict[str, Any]) -> None:
    """Any GPUTask body converts to a Task or raises InvalidTaskError with a reason, nothing else."""
    body = {"metadata": {"name": "t", "namespace": "ns", "labels": labels}, "spec": spec}
    try:
        task = task_from_manifest(body, priority_of={"high": 100}.get)
    except InvalidTaskError as exc:
        assert exc.reason and exc.message
    else:
        req = task.request
        assert 1 <= req.count <= 16 and (req.memory_mib is None or 0 < req.memory_mib <= 1 << 20)
        assert req.fraction_milli is None or 1 <= req.fraction_milli <= 1000


@FUZZ
@given(POD_SPECS)
def test_pod_template_conversion_raises_only_invalid_task_error(pod: dict[str, Any]) -> None:
    """Pod templates with odd requests, selectors, affinity and tolerations convert or are InvalidSpec."""
    spec = {"queueName": "q", "gpus": 1, "template": {"spec": pod}}
    body = {"metadata": {"name": "t", "namespace": "ns"}, "spec": spec}
    try:
        task = task_from_manifest(body)
    except InvalidTaskError as exc:
        assert exc.reason == "InvalidSpec" and exc.message
    else:
        assert task.cpu_milli >= 0 and task.memory_mib >= 0 and task.ephemeral_mib >= 0


@FUZZ
@given(
    st.one_of(
        VALUES,
        st.fixed_dictionaries(
            {},
            optional={
                "cohort": st.one_of(st.just("org"), SCALARS),
                "resources": st.one_of(
                    st.lists(
                        st.fixed_dictionaries(
                            {"name": st.sampled_from(["nvidia.com/gpu", "gputask.io/gpu-memory", "cpu", 1])},
                            optional={"nominalQuota": QUANTITIES | SCALARS, "borrowingLimit": QUANTITIES | SCALARS},
                        ),
                        max_size=3,
                    ),
                    SCALARS,
                ),
                "queueingStrategy": st.sampled_from(["StrictFIFO", "BestEffortFIFO", "Fifo", 3]),
                "preemption": VALUES,
                "namespaceSelector": VALUES,
                "fairSharing": VALUES,
                "stopPolicy": st.sampled_from(["None", "Hold", "HoldAndDrain", "Nope", None]),
            },
        ),
    )
)
def test_queue_conversion_raises_only_invalid_queue_error(spec: Any) -> None:
    """Any GPUClusterQueue spec converts or raises InvalidQueueError, nothing else."""
    try:
        queue_from_manifest("q", spec)
    except InvalidQueueError as exc:
        assert str(exc)


@FUZZ
@given(
    st.one_of(
        VALUES,
        st.fixed_dictionaries(
            {
                "gpus": st.lists(
                    VALUES
                    | st.fixed_dictionaries(
                        {
                            "index": st.integers(-1, 3) | SCALARS,
                            "uuid": st.text(max_size=4) | SCALARS,
                            "memory": QUANTITIES | SCALARS,
                            "memoryUsed": QUANTITIES | SCALARS,
                            "healthy": SCALARS,
                        }
                    ),
                    max_size=4,
                )
            }
        ),
    )
)
def test_gpunode_conversion_never_raises_and_rejects_per_field(status: Any) -> None:
    """A broken agent's GPUNode status is converted GPU by GPU: bad entries become error lines, never exceptions."""
    node, errors = node_from_gpunode("n", status if isinstance(status, dict) else {"gpus": status})
    assert all(isinstance(line, str) for line in errors)
    assert len({g.index for g in node.gpus}) == len(node.gpus)
    assert all(g.memory_mib > 0 for g in node.gpus)


EVENT = st.one_of(
    st.fixed_dictionaries(
        {
            "at": SCALARS,
            "submit": st.fixed_dictionaries(
                {"metadata": st.fixed_dictionaries({"name": st.sampled_from(["a", "b", ""])}), "spec": task_specs()}
            ),
        }
    ),
    st.fixed_dictionaries({"at": SCALARS, "delete": st.fixed_dictionaries({"name": st.sampled_from(["a", "zz"])})}),
    st.fixed_dictionaries(
        {"at": SCALARS, "nodeDown": st.fixed_dictionaries({"name": st.sampled_from(["n", "ghost"])})}
    ),
    st.fixed_dictionaries(
        {"at": SCALARS, "gpuUnhealthy": st.fixed_dictionaries({"node": st.just("n"), "index": SCALARS})}
    ),
    st.fixed_dictionaries({"at": SCALARS, "restartOperator": VALUES}),
    st.dictionaries(st.text(max_size=5), VALUES, max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "nodes": st.one_of(st.just([{"name": "n", "gpus": [{"product": "A10", "memory": "24Gi"}]}]), VALUES),
            "queues": st.one_of(st.just([{"name": "q", "spec": {}}]), VALUES),
            "events": st.lists(EVENT, max_size=4),
            "until": SCALARS,
        }
    )
)
def test_scenario_input_is_run_or_refused_with_a_scenario_error(doc: dict[str, Any]) -> None:
    """Any scenario document either runs with no violations or is refused with ScenarioError."""
    try:
        scenario = load_scenario(doc)
    except ScenarioError as exc:
        assert str(exc)
        return
    try:
        out = run_scenario(scenario)
    except ScenarioError as exc:
        assert str(exc)
        return
    assert out["violations"] == []


SELECTORS = st.one_of(
    VALUES,
    st.fixed_dictionaries(
        {},
        optional={
            "matchLabels": st.dictionaries(st.text(max_size=4), SCALARS, max_size=2) | SCALARS,
            "matchExpressions": st.lists(
                st.fixed_dictionaries(
                    {"key": st.just("team") | SCALARS, "operator": st.sampled_from(["In", "NotIn", "Exists", "Nope"])},
                    optional={"values": st.lists(st.text(max_size=3) | SCALARS, max_size=2) | SCALARS},
                ),
                max_size=2,
            )
            | SCALARS,
        },
    ),
)


@FUZZ
@given(selector=SELECTORS, weight=QUANTITIES | SCALARS)
def test_selectors_and_weights_of_a_queue_raise_only_invalid_queue_error(selector: Any, weight: Any) -> None:
    """namespaceSelector shapes (values: 5 among them) and fairSharing weights (-1 among them) convert or
    raise InvalidQueueError; a weight is never negative."""
    try:
        spec = queue_from_manifest("q", {"namespaceSelector": selector, "fairSharing": {"weight": weight}})
    except InvalidQueueError as exc:
        assert str(exc)
    else:
        assert spec.fair_sharing_weight_milli is not None and spec.fair_sharing_weight_milli >= 0


OBJECTS = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": st.sampled_from(["a", "b"])}, optional={"labels": VALUES})},
    optional={"spec": VALUES, "status": VALUES, "value": SCALARS},
)


@FUZZ
@given(
    objects=st.lists(
        st.tuples(st.sampled_from(["queue", "gpunode", "node", "namespace", "priority"]), OBJECTS), max_size=6
    )
)
def test_no_malformed_object_stops_the_inventory(objects: list[tuple[str, dict[str, Any]]]) -> None:
    """Whatever queues, GPUNodes, Nodes, Namespaces and PriorityClasses arrive, the inventory takes each one
    without raising, and a valid queue added after them still works."""
    from gputask.config import Config
    from gputask.k8s.controller import Controller

    controller = Controller(Config())
    inventory = controller.inventory
    feed = {"queue": inventory.on_queue, "namespace": inventory.on_namespace, "priority": inventory.on_priority_class}
    for kind, obj in objects:
        if kind == "gpunode":
            inventory.on_gpunode(obj, 0.0)
        elif kind == "node":
            inventory.on_node(obj, 0.0)
        else:
            feed[kind](obj)
    inventory.on_queue({"metadata": {"name": "fine"}, "spec": {}})
    controller.scheduler.cycle(0.0)
    assert "fine" in controller.scheduler.quotas.specs
