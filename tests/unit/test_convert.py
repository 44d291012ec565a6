"""Conversion of GPUTask, GPUClusterQueue and GPUNode objects into core values, with exact errors."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gputask.core import (
    GPU,
    GPU_MEMORY,
    Gpu,
    GpuRequest,
    InvalidQueueError,
    InvalidTaskError,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeName,
    Preemption,
    QueueSpec,
    ResourceQuota,
    Task,
    TaskKey,
)
from gputask.manifests.convert import gpu_request, node_from_gpunode, queue_from_manifest, task_from_manifest

PRIORITIES = {"high": 1000, "low": -5}

QUANTITY_RULE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


def manifest(spec: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    """A GPUTask object named ``train`` in ``ml`` with queue ``team-a`` and the given spec fields."""
    return {
        "metadata": {"name": "train", "namespace": "ml", **metadata},
        "spec": {"queueName": "team-a", **(spec or {})},
    }


def convert(obj: dict[str, Any]) -> Task:
    """Convert with the priority classes of :data:`PRIORITIES`."""
    return task_from_manifest(obj, priority_of=PRIORITIES.get)


def error_of(spec: dict[str, Any]) -> tuple[str, str]:
    """The (reason, message) of the InvalidTaskError that converting ``spec`` raises."""
    with pytest.raises(InvalidTaskError) as info:
        convert(manifest(spec))
    return info.value.reason, info.value.message


def test_a_full_gputask_becomes_the_exact_core_task() -> None:
    """Every spec and metadata field lands in the Task: key, queue, request, priority, time, labels."""
    obj = manifest(
        {
            "gpus": 2,
            "gpuMemory": "12Gi",
            "gpuProducts": ["NVIDIA-A10", "NVIDIA-L4"],
            "priorityClassName": "high",
            "maxReschedules": 5,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}},
        },
        creationTimestamp="2026-01-02T03:04:05Z",
    )
    task = task_from_manifest(obj, priority_of=PRIORITIES.get, namespace_labels={"team": "ml", "env": "prod"})
    assert task == Task(
        key=TaskKey("ml/train"),
        queue="team-a",
        request=GpuRequest(2, memory_mib=12288, products=frozenset({"NVIDIA-A10", "NVIDIA-L4"})),
        priority=1000,
        created=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC).timestamp(),
        namespace_labels=(("env", "prod"), ("team", "ml")),
        max_reschedules=5,
    )


def test_a_minimal_gputask_gets_the_defaults() -> None:
    """Without optional fields: one whole GPU, priority 0, namespace default, 3 reschedules."""
    obj = {"metadata": {"name": "t"}, "spec": {"queueName": "q"}}
    assert convert(obj) == Task(TaskKey("default/t"), "q", GpuRequest(1), max_reschedules=3)


def test_kueue_labels_name_the_queue_and_the_priority_class() -> None:
    """The labels kueue.x-k8s.io/queue-name and kueue.x-k8s.io/priority-class stand in for the spec fields."""
    labels = {"kueue.x-k8s.io/queue-name": "from-label", "kueue.x-k8s.io/priority-class": "low"}
    obj = {"metadata": {"name": "t", "namespace": "ml", "labels": labels}, "spec": {"gpus": 1}}
    assert convert(obj) == Task(TaskKey("ml/t"), "from-label", GpuRequest(1), priority=-5)


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (0, "spec.gpus must be between 1 and 16, got 0"),
        (-1, "spec.gpus must be between 1 and 16, got -1"),
        (17, "spec.gpus must be between 1 and 16, got 17"),
        ("2", "spec.gpus must be an integer from 1 to 16, got '2'"),
        (1.5, "spec.gpus must be an integer from 1 to 16, got 1.5"),
        (True, "spec.gpus must be an integer from 1 to 16, got True"),
        (99999999999999999999999, "spec.gpus must be between 1 and 16, got 99999999999999999999999"),
        (1e23, "spec.gpus must be an integer from 1 to 16, got 99999999999999991611392"),  # as JSON may decode it
    ],
)
def test_gpus_outside_1_to_16_or_not_an_integer_is_invalid(gpus: Any, message: str) -> None:
    """spec.gpus must be a true integer in 1..16; strings, floats and booleans are refused."""
    assert error_of({"gpus": gpus}) == ("InvalidSpec", message)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"gpuMemory": "-1Gi"}, "spec.gpuMemory: '-1Gi' must be positive"),
        ({"gpuMemory": "0"}, "spec.gpuMemory: '0' must be positive"),
        ({"gpuMemory": "1Ei"}, "spec.gpuMemory: '1Ei' is more than any GPU has (limit 1Ti)"),
        ({"gpuMemory": 4096}, "spec.gpuMemory: 4096 is less than 1Mi (a bare number is bytes): likely a unit mistake, "
                              "write e.g. '4096Mi'"),
        ({"gpuMemory": "512Ki"}, "spec.gpuMemory: '512Ki' is less than 1Mi (a bare number is bytes): likely a unit "
                                 "mistake, write e.g. '4096Mi' or '4Gi'"),
        ({"gpuMemory": "abc"}, "spec.gpuMemory: 'abc': " + QUANTITY_RULE),
        (
            {"gpuMemory": "8Gi", "gpuFraction": "0.5"},
            "set at most one of spec.gpuMemory and spec.gpuFraction",
        ),
        ({"gpuFraction": "0"}, "spec.gpuFraction must be in (0, 1], got '0'"),
        ({"gpuFraction": "1.5"}, "spec.gpuFraction must be in (0, 1], got '1.5'"),
        ({"gpuFraction": "abc"}, "spec.gpuFraction must be a decimal string in (0, 1], got 'abc'"),
        ({"gpuProducts": "NVIDIA-A10"}, "spec.gpuProducts must be a list of product names, got 'NVIDIA-A10'"),
        ({"maxReschedules": 1001}, "spec.maxReschedules must be between 0 and 1000, got 1001"),
        ({"gpuMemory": "4Gi", "gpuSharing": "mps"}, "spec.gpuSharing must be one of TimeSlicing, MPS, got 'mps'"),
        ({"gpuSharing": "MPS"}, "spec.gpuSharing: MPS is for shared GPUs: set spec.gpuMemory, or a spec.gpuFraction "
                                "below 1"),
        ({"gpuFraction": "1", "gpuSharing": "MPS"}, "spec.gpuSharing: MPS is for shared GPUs: set spec.gpuMemory, or a "
                                                    "spec.gpuFraction below 1"),
        (
                {"template": "pod"},
                'the pod template would be refused as a Job\'s: spec.template: Invalid value: "pod": must be an object',
            ),
    ],
)
def test_bad_per_gpu_requests_are_invalid_with_the_exact_message(spec: dict[str, Any], message: str) -> None:
    """Bad gpuMemory, gpuFraction and other spec fields raise InvalidSpec saying which field and why."""
    assert error_of(spec) == ("InvalidSpec", message)


def test_gpu_memory_units_are_exact_mib() -> None:
    """16G (decimal), 16Gi and 16000Mi are three different sizes: 15259, 16384 and 16000 MiB."""
    assert [gpu_request({"gpuMemory": m}).memory_mib for m in ("16G", "16Gi", "16000Mi")] == [
        15259,
        16384,
        16000,
    ]


def test_gpu_fraction_becomes_milli_gpu() -> None:
    """gpuFraction "0.25" is 250 milli-GPU, a shared request; "1" is a whole exclusive GPU."""
    quarter, whole = gpu_request({"gpuFraction": "0.25"}), gpu_request({"gpuFraction": "1"})
    assert (quarter, quarter.exclusive, whole.exclusive) == (GpuRequest(1, fraction_milli=250), False, True)


def test_gpu_sharing_and_pinning_give_the_share_group() -> None:
    """TimeSlicing (or nothing) is the group '', MPS 'MPS'; with DRA each namespace is a group of its own."""
    cases = [({"gpuMemory": "4Gi"}, False), ({"gpuMemory": "4Gi", "gpuSharing": "MPS"}, False),
             ({"gpuFraction": "0.5", "gpuSharing": "TimeSlicing"}, True),
             ({"gpuMemory": "4Gi", "gpuSharing": "MPS"}, True), ({"gpus": 2}, True)]
    groups = [gpu_request(spec, namespace="ml", per_namespace=dra).share_group for spec, dra in cases]
    assert groups == ["", "MPS", "namespace ml", "namespace ml, MPS", ""]


def test_a_missing_queue_is_missing_queue_name() -> None:
    """Neither spec.queueName nor the Kueue label: reason MissingQueueName."""
    obj = {"metadata": {"name": "t"}, "spec": {"gpus": 1}}
    with pytest.raises(InvalidTaskError) as info:
        convert(obj)
    assert (info.value.reason, info.value.message) == (
        "MissingQueueName",
        "set spec.queueName or the label kueue.x-k8s.io/queue-name",
    )


def test_an_unknown_priority_class_is_priority_class_not_found() -> None:
    """A priorityClassName that the resolver does not know: reason PriorityClassNotFound."""
    assert error_of({"priorityClassName": "urgent"}) == (
        "PriorityClassNotFound",
        "priority class 'urgent' does not exist",
    )


def test_a_full_queue_becomes_the_exact_queue_spec() -> None:
    """Cohort, selector, strategy, quotas in milli-GPU and MiB, preemption, fair sharing and stop policy."""
    spec = {
        "cohort": "org",
        "namespaceSelector": {
            "matchLabels": {"team": "ml"},
            "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "dev"]}],
        },
        "queueingStrategy": "StrictFIFO",
        "resources": [
            {"name": "nvidia.com/gpu", "nominalQuota": "1500m", "borrowingLimit": 2, "lendingLimit": "0.5"},
            {"name": "gputask.io/gpu-memory", "nominalQuota": "64Gi"},
        ],
        "preemption": {
            "withinClusterQueue": "LowerPriority",
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
        },
        "fairSharing": {"weight": "1.5"},
        "stopPolicy": "Hold",
    }
    assert queue_from_manifest("team-a", spec) == QueueSpec(
        name="team-a",
        cohort="org",
        namespace_selector=LabelSelector(
            (("team", "ml"),), (LabelRequirement("env", "In", ("prod", "dev")),)
        ),
        strategy="StrictFIFO",
        quotas={GPU: ResourceQuota(1500, 2000, 500), GPU_MEMORY: ResourceQuota(65536)},
        preemption=Preemption("LowerPriority", "Any", "LowerPriority", 100),
        fair_sharing_weight_milli=1500,
        stop_policy="Hold",
        closed=True,
    )


def test_an_empty_queue_spec_gets_kueue_defaults_and_fails_closed() -> None:
    """No fields: no cohort, BestEffortFIFO, never preempt; as in Kueue, no namespaceSelector selects no
    namespace and a queue listing no GPU resource admits nothing. A scenario queue is open instead."""
    spec = queue_from_manifest("q", None)
    assert spec == QueueSpec("q", namespace_selector=None, closed=True)
    assert spec.uncovered() == (
        "GPUClusterQueue 'q' covers no GPU resource: list nvidia.com/gpu or gputask.io/gpu-memory in spec.resources "
        "or spec.resourceGroups"
    )
    assert queue_from_manifest("q", {"namespaceSelector": {}}).namespace_selector == LabelSelector()
    assert queue_from_manifest("q", None, open_defaults=True) == QueueSpec("q")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"resources": [{"name": "cpu", "nominalQuota": 1}]},
            "resources: unknown resource 'cpu'; use nvidia.com/gpu or gputask.io/gpu-memory",
        ),
        (
            {"resources": [{"name": "nvidia.com/gpu", "nominalQuota": -1}]},
            "resources[nvidia.com/gpu].nominalQuota: -1 must not be negative",
        ),
        (
            {"resources": [{"name": "nvidia.com/gpu", "nominalQuota": "lots"}]},
            "resources[nvidia.com/gpu].nominalQuota: 'lots': " + QUANTITY_RULE,
        ),
        ({"queueingStrategy": "LIFO"}, "queueingStrategy 'LIFO': use BestEffortFIFO or StrictFIFO"),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
            "namespaceSelector.matchExpressions: invalid entry {'key': 'a', 'operator': 'Near'}",
        ),
        (
            {"fairSharing": {"weight": "abc"}},
            "fairSharing.weight: 'abc': " + QUANTITY_RULE,
        ),
    ],
)
def test_bad_queue_specs_raise_invalid_queue_error_naming_the_field(
    spec: dict[str, Any], message: str
) -> None:
    """Every bad queue field raises InvalidQueueError (never another exception) saying which field."""
    with pytest.raises(InvalidQueueError) as info:
        queue_from_manifest("q", spec)
    assert str(info.value) == message


def test_a_gpunode_status_becomes_the_exact_node_with_gpus_in_index_order() -> None:
    """GPU entries become Gpus sorted by index, MiB rounded up, spaces in products as dashes."""
    status = {
        "gpus": [
            {
                "index": 1,
                "uuid": "GPU-b",
                "product": "NVIDIA A100-SXM4-80GB",
                "memory": "80Gi",
                "healthy": False,
            },
            {"index": 0, "uuid": "GPU-a", "product": "NVIDIA-A10", "memory": 24 * 10**9},
        ]
    }
    assert node_from_gpunode("node-a", status, unschedulable="cordoned") == (
        Node(
            NodeName("node-a"),
            (
                Gpu(0, "GPU-a", "NVIDIA-A10", 22889),
                Gpu(1, "GPU-b", "NVIDIA-A100-SXM4-80GB", 81920, healthy=False),
            ),
            schedulable=False,
            unschedulable_reason="cordoned",
        ),
        [],
    )


def test_a_malformed_gpu_entry_is_rejected_alone() -> None:
    """Each bad GPU entry is dropped with its own error line (1Ei: above the 1Ti a task may ask); the node keeps
    its good GPUs."""
    good = {"index": 0, "uuid": "GPU-a", "product": "NVIDIA-A10", "memory": "24Gi"}
    status = {
        "gpus": [
            good,
            {"index": 1, "uuid": "GPU-b", "memory": "abc"},
            {"index": 2, "memory": "24Gi"},
            {"index": -1, "uuid": "GPU-c", "memory": "24Gi"},
            "junk",
            {"index": 3, "uuid": "GPU-d", "memory": "24Gi", "healthy": "yes"},
            {"index": 4, "uuid": "GPU-e", "memory": "24Gi", "memoryUsed": "-1Gi"},
            {**good, "uuid": "GPU-dup"},
            {"index": 5, "uuid": "GPU-f", "memory": "16Gi"},
            {"index": 6, "uuid": "GPU-g", "memory": "1Ei"},
        ]
    }
    assert node_from_gpunode("n", status) == (
        Node(NodeName("n"), (Gpu(0, "GPU-a", "NVIDIA-A10", 24576), Gpu(5, "GPU-f", "unknown", 16384))),
        [
            "status.gpus[1]: memory: 'abc': " + QUANTITY_RULE,
            "status.gpus[2]: missing field 'uuid'",
            "status.gpus[3]: index must be a non-negative integer, got -1",
            "status.gpus[4]: expected an object, got 'junk'",
            "status.gpus[5]: healthy must be a boolean, got 'yes'",
            "status.gpus[6]: memoryUsed must not be negative, got '-1Gi'",
            "status.gpus[7]: duplicate index 0",
            "status.gpus[9]: memory '1Ei' is more than any GPU has (limit 1Ti)",
        ],
    )


def test_uuids_must_be_nvml_gpu_or_mig_uuids() -> None:
    """'all', lists, the pre-R470 MIG form and other characters are refused: a UUID reaches
    NVIDIA_VISIBLE_DEVICES and CDI names as it is."""
    bad = ["all", "GPU-1,GPU-2", "MIG-GPU-a/1/0", "GPU-ä", "void", "3"]
    status = {"gpus": [{"index": i, "uuid": u, "memory": "24Gi"} for i, u in enumerate(bad)]}
    rule = "uuid must be a GPU-... or MIG-... UUID (letters, digits and '-'), got"
    assert node_from_gpunode("n", status) == (
        Node(NodeName("n"), ()), [f"status.gpus[{i}]: {rule} {u!r}" for i, u in enumerate(bad)],
    )


def test_mig_devices_that_disagree_with_their_gpu_are_refused_with_it() -> None:
    """A GPU reported schedulable with MIG devices, MIG devices bigger together than their GPU, a MIG device of a
    GPU not reported or whose mig.parentIndex contradicts its index, and a MIG product on a GPU's index are
    refused (the GPU with its MIG devices), so no GPU is placed on twice; a sound GPU in MIG mode stays."""
    a100 = "NVIDIA-A100-SXM4-40GB"

    def gpu(index: int, uuid: str, memory: str = "40Gi", *, healthy: bool = True, **more: object) -> dict[str, object]:
        return {"index": index, "uuid": uuid, "product": a100, "memory": memory, "healthy": healthy, **more}

    def mig(index: int, uuid: str, memory: str = "4864Mi", **more: object) -> dict[str, object]:
        return {**gpu(index, uuid, memory), "product": f"{a100}-MIG-1g.5gb", **more}

    status = {"gpus": [
        gpu(0, "GPU-0"), mig(100, "MIG-a"), mig(101, "MIG-b"),                 # schedulable with MIG devices
        gpu(1, "GPU-1", "8Gi", healthy=False), mig(200, "MIG-c"), mig(201, "MIG-d"),  # 9728 MiB in 8 GiB
        mig(500, "MIG-e"),                                                     # GPU 4 not reported
        gpu(2, "GPU-2", healthy=False), mig(300, "MIG-f", mig={"parentIndex": 7}), mig(301, "MIG-g"),
        {**gpu(3, "GPU-3"), "product": f"{a100}-MIG-1g.5gb"},                  # a MIG product on a GPU's index
    ]}
    node, errors = node_from_gpunode("n", status)
    assert ([g.index for g in node.gpus], errors) == (
        [2, 301],
        [
            "GPU 0: reported schedulable with MIG devices [100, 101] (a GPU in MIG mode runs work only in them)",
            "GPU 1: its MIG devices have 9728 MiB, more than its 8192 MiB",
            f"GPU 3: product {a100}-MIG-1g.5gb is a MIG device's, index 3 a GPU's",
            "GPU 300: mig.parentIndex 7 but its index says GPU 2",
            "GPU 500: a MIG device of GPU 4, which is not reported",
        ],
    )


def test_a_gpunode_without_status_is_a_node_without_gpus() -> None:
    """A GPUNode the agent has not reported yet gives an empty node and no errors."""
    assert node_from_gpunode("n", None) == (Node(NodeName("n"), ()), [])


def test_malformed_queue_specs_are_rejected_with_the_field_named() -> None:
    """Wrong types and unknown policy values in a GPUClusterQueue give InvalidQueueError naming the field."""
    bad = [
        {"preemption": "x"},
        {"namespaceSelector": {"matchLabels": "x"}},
        {"stopPolicy": "Nope"},
        {"preemption": {"withinClusterQueue": "Sometimes"}},
        {"preemption": {"borrowWithinCohort": {"maxPriorityThreshold": "high"}}},
        {"cohort": 3},
        {"resources": "x"},
    ]
    messages = []
    for spec in bad:
        with pytest.raises(InvalidQueueError) as caught:
            queue_from_manifest("q", spec)
        messages.append(str(caught.value))
    assert messages == [
        "preemption must be an object, got 'x'",
        "namespaceSelector.matchLabels must be a map of strings, got 'x'",
        "stopPolicy 'Nope': use one of None, Hold, HoldAndDrain",
        "preemption.withinClusterQueue 'Sometimes': use one of Never, LowerPriority, LowerOrNewerEqualPriority",
        "preemption.borrowWithinCohort.maxPriorityThreshold must be an integer, got 'high'",
        "cohort must be a name, got 3",
        "resources must be a list, got 'x'",
    ]



@pytest.mark.parametrize(
    ("spec", "message"),
    [(None, "spec is missing"), ([1, 2, 3], "spec must be an object, got a list"),
     ("gpus: 1", "spec must be an object, got a string"), (7, "spec must be an object, got a number")],
)
def test_a_spec_that_is_not_an_object_says_what_it_is(spec: Any, message: str) -> None:
    """`spec: [1,2,3]` is refused as not an object, naming what it is."""
    with pytest.raises(InvalidTaskError) as caught:
        task_from_manifest({"metadata": {"name": "t", "namespace": "ns"}, "spec": spec})
    assert (caught.value.reason, caught.value.message) == ("InvalidSpec", message)
