"""Our Jobs as the operator reads them: :class:`JobRecord` (task uid, attempt, placement, outcome) from a Job's
annotations and conditions, and what a pod of one says about it (its Job's names, a system disruption). Pure
functions of objects; no I/O, no state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gputask.core import Placement, TaskKey
from gputask.k8s.gangjobs import GANG_ANNOTATION, GANG_JOBS_ANNOTATION, POD_SET_ANNOTATION
from gputask.k8s.jobs import (
    ATTEMPT_ANNOTATION,
    FLAVOR_ANNOTATION,
    PLACEMENT_ANNOTATION,
    TASK_UID_ANNOTATION,
    parse_placement,
)
from gputask.k8s.records import FAILED, SUCCEEDED

STARTED_POD_PHASES = ("Running", "Succeeded", "Failed")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
DISRUPTION_TARGET = "DisruptionTarget"
# The DisruptionTarget reasons of pods the system, not the workload, ended (k8s.io/api/core/v1: PodReason*;
# pod garbage collection's DeletionByPodGC too): their Job's failure requeues the task.
SYSTEM_DISRUPTIONS = (
    "DeletionByTaintManager",  # a NoExecute taint the pod does not tolerate (the taint manager)
    "TerminationByKubelet",  # node-pressure eviction, or a graceful node shutdown
    "PreemptionByScheduler",  # kube-scheduler preempted it for a higher-priority pod
    "EvictionByEvictionAPI",  # the Eviction API (kubectl drain, the cluster autoscaler)
    "DeletionByPodGC",  # its node is gone (pod garbage collection)
)


@dataclass(slots=True)
class JobRecord:
    """One of our Jobs: its task uid, attempt, placement, outcome, and whether it is being deleted."""

    name: str
    namespace: str
    task_uid: str
    attempt: int
    placement: Placement | None
    outcome: str | None = None  # Succeeded | Failed | None while running
    terminating: bool = False
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as time)
    flavor: str = ""  # the ResourceFlavor it was admitted in (annotation gputask.io/flavor)
    uid: str = ""  # the Job's own metadata.uid ("" when not known)
    why: str = ""  # a failed Job's Failed condition, "reason: message"
    gang: str = ""  # a gang's Job: the name of the gang's lead Job (its task's status.jobName); "" for a lone Job
    gang_jobs: int = 1  # a gang's Job: how many Jobs the gang has (one per PodSet)
    pod_set: str = ""  # a gang's Job: its PodSet

    @property
    def lead(self) -> str:
        """The name its task's records know it by: the gang's lead Job, or its own name."""
        return self.gang or self.name

    @property
    def key(self) -> str:
        """``namespace/name`` of the Job."""
        return f"{self.namespace}/{self.name}"


def job_outcome(job: Mapping[str, Any]) -> str | None:
    """Succeeded/Failed from a Job's conditions (Complete/Failed True), else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return SUCCEEDED
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return FAILED
    return None


def job_failure(job: Mapping[str, Any]) -> str:
    """The Job's Failed condition when True as "reason: message" (BackoffLimitExceeded, ...), else ""."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return ": ".join(str(p) for p in (cond.get("reason"), cond.get("message")) if p)
    return ""


def job_record(obj: Mapping[str, Any]) -> JobRecord | None:
    """The JobRecord of one of our Jobs; None when it carries no task uid annotation."""
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    uid = annotations.get(TASK_UID_ANNOTATION)
    if not uid:
        return None
    try:
        attempt = int(annotations.get(ATTEMPT_ANNOTATION, "1"))
    except ValueError:
        attempt = 1
    return JobRecord(
        meta["name"],
        meta.get("namespace") or "default",
        uid,
        attempt,
        parse_placement(annotations.get(PLACEMENT_ANNOTATION)),
        job_outcome(obj),
        bool(meta.get("deletionTimestamp")),
        str(meta.get("creationTimestamp") or ""),
        str(annotations.get(FLAVOR_ANNOTATION) or ""),
        str(meta.get("uid") or ""),
        job_failure(obj),
        str(annotations.get(GANG_ANNOTATION) or ""),
        _count(annotations.get(GANG_JOBS_ANNOTATION)),
        str(annotations.get(POD_SET_ANNOTATION) or ""),
    )


def _count(value: Any) -> int:
    return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else 1


def holding_key(job: JobRecord) -> TaskKey:
    """Scheduler key under which a departing Job keeps its GPUs until it is gone."""
    return TaskKey(f"{job.key}#terminating")


def job_names(meta: Mapping[str, Any]) -> list[str]:
    """The names of a pod's Job: its ownerReferences of kind Job, then the Job controller's job-name labels."""
    owners = [str(r.get("name")) for r in meta.get("ownerReferences") or [] if r.get("kind") == "Job"]
    labels = meta.get("labels") or {}
    return owners + [str(labels[k]) for k in JOB_NAME_LABELS if k in labels]


__all__ = ["JobRecord", "holding_key", "job_failure", "job_names", "job_outcome", "job_record"]
