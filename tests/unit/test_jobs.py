"""The Job emitted per admission (DESIGN.md section 2)."""

from __future__ import annotations

import json

import kubernetes_validate

from gputask.core import GpuSlot, NodeName, Placement
from gputask.k8s.jobs import build_job, fit_name, job_name, parse_placement, placement_annotation

TASK = {
    "apiVersion": "gputask.io/v1alpha1",
    "kind": "GPUTask",
    "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1"},
    "spec": {
        "queueName": "default",
        "template": {
            "metadata": {"labels": {"app": "x"}},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "A", "value": "1"}],
                        "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "1"}},
                    }
                ]
            },
        },
    },
}
PLACEMENT = Placement.one(NodeName("node-a"), (GpuSlot(0, "GPU-aaa", 12288), GpuSlot(2, "GPU-ccc", 12288)))


def test_build_job_is_pinned_to_node_and_gpus() -> None:
    """The Job is named per attempt, owned by the task, pinned by a node-name affinity, and sees only its GPUs."""
    annotation = '{"node":"node-a","uuids":["GPU-aaa","GPU-ccc"],"indices":[0,2],"memoryMiB":[12288,12288]}'
    labels = {"gputask.io/task": "train", "gputask.io/queue": "default"}
    assert build_job(TASK, PLACEMENT, attempt=2, queue="default") == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train-2",
            "namespace": "team-a",
            "labels": labels,
            "annotations": {
                "gputask.io/placement": annotation,
                "gputask.io/attempt": "2",
                "gputask.io/task-uid": "uid-1",
            },
            "ownerReferences": [
                {
                    "apiVersion": "gputask.io/v1alpha1",
                    "kind": "GPUTask",
                    "name": "train",
                    "uid": "uid-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "x", **labels}, "annotations": {"gputask.io/placement": annotation}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "env": [
                                {"name": "A", "value": "1"},
                                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-aaa,GPU-ccc"},
                            ],
                            "resources": {"limits": {"cpu": "1"}},
                        }
                    ],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "restartPolicy": "Never",
                },
            },
        },
    }


def test_build_job_leaves_the_task_template_untouched() -> None:
    """Building a Job does not mutate the GPUTask body it reads."""
    before = json.dumps(TASK, sort_keys=True)
    build_job(TASK, PLACEMENT, attempt=1, queue="default")
    assert json.dumps(TASK, sort_keys=True) == before


def test_long_names_are_hashed_to_63_chars_deterministically() -> None:
    """A long task name gives a 63-char Job name that differs per attempt and is stable."""
    long = "x" * 70
    names = [job_name(long, 1), job_name(long, 2), job_name(long, 1)]
    assert [len(n) for n in names] == [63, 63, 63]
    assert names[0] == names[2] != names[1]
    assert fit_name("short") == "short"


def test_placement_annotation_round_trips() -> None:
    """The placement annotation parses back to the same Placement; garbage parses to None."""
    assert parse_placement(placement_annotation(PLACEMENT)) == PLACEMENT
    assert [parse_placement(t) for t in (None, "", "{", '{"node":"a"}')] == [None, None, None, None]


def test_a_placement_annotation_written_by_the_previous_version_is_read_as_one_pod() -> None:
    """Jobs already in clusters carry the one-node format: it reads back as a one-pod placement, and a one-pod
    placement is written in exactly that format."""
    old = '{"node":"n1","uuids":["GPU-a","GPU-b"],"indices":[0,3],"memoryMiB":[8192,8192]}'
    pod = Placement.one(NodeName("n1"), (GpuSlot(0, "GPU-a", 8192), GpuSlot(3, "GPU-b", 8192)))
    assert (parse_placement(old), placement_annotation(pod)) == (pod, old)


def test_the_node_requirement_joins_every_node_selector_term_of_the_users_affinity() -> None:
    """Terms are ORed: the node is required in each of the user's terms (an empty term, which matches nothing,
    is dropped rather than pinned into matching), and the rest of the affinity stays."""
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    gpu = {"key": "gpu", "operator": "Exists"}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [zone]}}]
    task = {
        **TASK,
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "main", "image": "busybox"}],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {}, {"matchFields": [gpu]}]
                            },
                            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
                        },
                        "podAntiAffinity": {"x": 1},
                    },
                }
            }
        },
    }
    host = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
    assert build_job(task, PLACEMENT, attempt=1, queue="q")["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [zone], "matchFields": [host]},
                    {"matchFields": [gpu, host]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAntiAffinity": {"x": 1},
    }


def test_the_emitted_job_is_a_valid_job_on_every_supported_kubernetes() -> None:
    """The pinned Job validates strictly against the batch/v1 schemas of Kubernetes 1.26 to 1.34."""
    job = build_job(TASK, PLACEMENT, attempt=1, queue="default")
    errors = []
    for minor in range(26, 35):
        try:
            kubernetes_validate.validate(job, f"1.{minor}.0", strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"1.{minor}: {exc.message}")
    assert errors == []
