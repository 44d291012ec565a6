"""Kueue's configuration, conflict detection and Workload reading (the pure parts)."""

from __future__ import annotations

from typing import Any

import pytest

from gputask.core import GpuSlot, LabelRequirement, LabelSelector, NodeName, Placement
from gputask.k8s.kueue import (
    KUEUE_DEFAULT_NAMESPACES,
    KueueDetector,
    KueueManagerConfig,
    parse_manager_config,
    suspended_by_kueue,
)
from gputask.k8s.kueue_api import check_answer, owner_job, pod_set_name, quota_reserved, ready_placement

ML = {"kubernetes.io/metadata.name": "ml", "team": "a"}


def test_manager_config_parsing() -> None:
    """manageJobsWithoutQueueName must be literally true; the namespace selector defaults to Kueue's."""
    selector = "managedJobsNamespaceSelector:\n  matchLabels: {team: a}\n"
    assert [
        parse_manager_config("apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"),
        parse_manager_config("manageJobsWithoutQueueName: true\n"),
        parse_manager_config("manageJobsWithoutQueueName: 'true'\n"),
        parse_manager_config("manageJobsWithoutQueueName: true\n" + selector),
        parse_manager_config(""),
    ] == [
        KueueManagerConfig(False, KUEUE_DEFAULT_NAMESPACES),
        KueueManagerConfig(True, KUEUE_DEFAULT_NAMESPACES),
        KueueManagerConfig(False, KUEUE_DEFAULT_NAMESPACES),
        KueueManagerConfig(True, LabelSelector((("team", "a"),))),
        KueueManagerConfig(),
    ]
    assert (
        LabelSelector(
            match_expressions=(
                LabelRequirement("kubernetes.io/metadata.name", "NotIn", ("kube-system", "kueue-system")),
            )
        )
        == KUEUE_DEFAULT_NAMESPACES
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a mapping, got list"),
        ("a: [", "not YAML"),
        ("managedJobsNamespaceSelector: [1]", "managedJobsNamespaceSelector"),
    ],
)
def test_malformed_manager_config_raises_value_error(text: str, message: str) -> None:
    """A configuration that is not a mapping, not YAML, or has a malformed selector raises ValueError."""
    with pytest.raises(ValueError, match=message):
        parse_manager_config(text)


def test_detector_names_each_cause_only_when_kueue_is_present() -> None:
    """A default LocalQueue and a managing configuration are causes; nothing is one while Kueue is absent."""
    absent = KueueDetector(local_queues={"ml": {"default"}}, config=KueueManagerConfig(True))
    present = KueueDetector(present=True)
    present.on_local_queue({"metadata": {"name": "default", "namespace": "ml"}})
    present.on_local_queue({"metadata": {"name": "team", "namespace": "other"}})
    managing = KueueDetector(present=True, config=KueueManagerConfig(True))
    both = KueueDetector(present=True, local_queues={"ml": {"default"}}, config=KueueManagerConfig(True))
    kube_system = {"kubernetes.io/metadata.name": "kube-system"}
    assert [
        absent.cause("ml", ML),
        present.cause("ml", ML),
        present.cause("other", {}),
        managing.cause("ml", ML),
        managing.cause("kube-system", kube_system),
        both.cause("ml", ML),
    ] == [
        None,
        "namespace 'ml' has a LocalQueue named 'default'",
        None,
        "Kueue's configuration sets manageJobsWithoutQueueName: true and its managedJobsNamespaceSelector "
        "selects namespace 'ml'",
        None,
        "namespace 'ml' has a LocalQueue named 'default' and Kueue's configuration sets "
        "manageJobsWithoutQueueName: true and its managedJobsNamespaceSelector selects namespace 'ml'",
    ]
    present.on_local_queue({"metadata": {"name": "default", "namespace": "ml"}}, deleted=True)
    assert present.cause("ml", ML) is None


def job(
    suspend: bool, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Job named j-1."""
    return {
        "metadata": {"name": "j-1", "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"suspend": suspend},
    }


def test_a_job_counts_as_suspended_by_kueue_only_when_suspended_and_marked_by_kueue() -> None:
    """Suspended plus Kueue's queue-name label or a kueue.x-k8s.io annotation; anything else is not Kueue's doing."""
    remedy = (
        "exclude the namespace from Kueue's managedJobsNamespaceSelector, remove the LocalQueue 'default' from it, "
        "or run gputask with `queueing: kueue`"
    )
    assert [
        suspended_by_kueue(job(True, {"kueue.x-k8s.io/queue-name": "default"})),
        suspended_by_kueue(job(True, annotations={"kueue.x-k8s.io/job-min-parallelism": "1"})),
        suspended_by_kueue(job(False, {"kueue.x-k8s.io/queue-name": "default"})),
        suspended_by_kueue(job(True)),
    ] == [
        f"Kueue suspended Job j-1 through LocalQueue 'default'; it will not start until Kueue admits it: {remedy}",
        f"Kueue suspended Job j-1; it will not start until Kueue admits it: {remedy}",
        None,
        None,
    ]


def workload(
    *conditions: tuple[str, str], admission: bool = False, checks: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A Workload of Job train-1 with the given (type, status) conditions."""
    status: dict[str, Any] = {"conditions": [{"type": t, "status": s} for t, s in conditions]}
    if admission:
        status["admission"] = {"clusterQueue": "cq"}
    if checks is not None:
        status["admissionChecks"] = checks
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "train-1", "uid": "u"}
    meta = {"name": "job-train-1-x", "namespace": "ml", "ownerReferences": [owner]}
    return {"metadata": meta, "spec": {"podSets": [{"name": "workers"}]}, "status": status}


def test_quota_is_reserved_until_kueue_evicts_or_finishes_the_workload() -> None:
    """QuotaReserved True (or an admission without that condition) counts, unless Evicted or Finished is True."""
    assert [
        quota_reserved(workload(("QuotaReserved", "True"))),
        quota_reserved(workload(admission=True)),
        quota_reserved(workload(("QuotaReserved", "False"), admission=True)),
        quota_reserved(workload(("QuotaReserved", "True"), ("Evicted", "True"))),
        quota_reserved(workload(("QuotaReserved", "True"), ("Finished", "True"))),
        quota_reserved(workload()),
    ] == [True, True, False, False, False, False]
    assert (owner_job(workload()), pod_set_name(workload()), pod_set_name({})) == ("ml/train-1", "workers", "main")


def test_check_answers_keep_their_transition_time_while_the_state_holds() -> None:
    """lastTransitionTime is kept for the same state and moves for a new one; a Ready answer's placement reads back."""
    old = {"name": "gputask-placement", "state": "Retry", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    retry = check_answer(old, "Retry", "still no room")
    ready = check_answer(old, "Ready", "placed", [{"name": "main", "annotations": {"gputask.io/placement": "{}"}}])
    assert (retry, ready["lastTransitionTime"] != old["lastTransitionTime"]) == (
        {
            "name": "gputask-placement",
            "state": "Retry",
            "message": "still no room",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
        True,
    )
    annotation = '{"node":"n","uuids":["GPU-1"],"indices":[1],"memoryMiB":[100]}'
    update = {"name": "main", "annotations": {"gputask.io/placement": annotation}}
    answered = workload(checks=[{"name": "gputask-placement", "state": "Ready", "podSetUpdates": [update]}])
    assert ready_placement(answered) == Placement.one(NodeName("n"), (GpuSlot(1, "GPU-1", 100),))
    assert ready_placement(workload(checks=[{"name": "gputask-placement", "state": "Pending"}])) is None
