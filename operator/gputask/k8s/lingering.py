"""Pods that outlive their Job: an old Job's GPUs stay held until its pods on the node are gone.

A failure eviction (NodeFailure, GPUFailure) deletes the task's Job in the background, and a deleted task's Job goes
the same way. The Job object is gone at once, but its pods are not: on a node that stopped answering they stay
``Running`` with a deletionTimestamp until the node's kubelet comes back and stops their containers (within their
grace period) or the Node object is deleted (the pod garbage collector then removes them). Freeing the GPUs with the
Job would book them again while those containers may still run. So a Job that goes while pods of it are still bound
to a node is kept here, with the hold of its GPUs in the core (:meth:`gputask.core.Scheduler.hold`), until the last
of those pods is deleted or finished (Succeeded or Failed: its containers have stopped); preemption's Foreground
deletion waits for the same thing, as the API server keeps the Job until its pods are gone. A restarted operator
finds such pods in its listing of our pods with no Job to own them, and holds the placement their annotation
``gputask.io/placement`` names (:meth:`gputask.k8s.controller.Controller.rebuild`).

Sans-I/O: the controller feeds it and performs what it returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gputask.core import TaskKey

if TYPE_CHECKING:  # the controller imports this module
    from gputask.k8s.jobrecords import JobRecord

HELD_NOTE = re.compile(r"; GPUs on node \S+ held until pods? .+ (?:is|are) gone$")
"""What :func:`held_note` adds at the end of a condition's message (to take it off again)."""


@dataclass(slots=True)
class GoneJob:
    """A Job that is gone while pods of it are still bound to its node: the Job as last known, the core key its GPUs
    are held under (None: nothing held), and the ``gputask.io/task`` label of its pods (found at a restart, when the
    Job's task uid is not known: the task is found by it)."""

    job: JobRecord
    hold: TaskKey | None = None
    task_label: str = ""


def held_note(node: str, pods: list[str]) -> str:
    """``GPUs on node node-a held until pod train-1-x7k2p is gone`` (``pods``: names, at least one)."""
    names = ", ".join(pods)
    return f"GPUs on node {node} held until pod {names} is gone" if len(pods) == 1 else (
        f"GPUs on node {node} held until pods {names} are gone")


class PodsOfJobs:
    """The unfinished, bound pods of each of our Jobs, and the Jobs gone while some of them remain.

    ``pods`` maps a Job key (``namespace/name``) to its pods (uid to name); ``gone`` the Jobs that went before their
    pods. Both are small beside :attr:`Controller.task_pods <gputask.k8s.controller.Controller.task_pods>`, which
    they mirror by Job.
    """

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, str]] = {}
        self.gone: dict[str, GoneJob] = {}

    def present(self, job_key: str, uid: str, name: str) -> None:
        """Pod ``uid`` (``name``) of Job ``job_key`` is bound to a node and not finished."""
        self.pods.setdefault(job_key, {})[uid] = name

    def absent(self, job_key: str, uid: str) -> GoneJob | None:
        """Pod ``uid`` of Job ``job_key`` was deleted, finished or is not bound: returns the gone Job whose last pod it
        was (its hold is to be released), else None."""
        pods = self.pods.get(job_key)
        if pods is None or pods.pop(uid, None) is None or pods:
            return None
        del self.pods[job_key]
        return self.gone.pop(job_key, None)

    def job_gone(self, job: JobRecord, hold: TaskKey | None) -> bool:
        """Job ``job`` is gone. True when pods of it remain: it is kept, with ``hold``, until they are gone."""
        if not self.pods.get(job.key):
            return False
        kept = self.gone.get(job.key)
        self.gone[job.key] = GoneJob(job, hold if hold is not None else kept.hold if kept else None,
                                     kept.task_label if kept else "")
        return True

    def waiting_on(self, job_key: str) -> list[str]:
        """Names of the pods the gone Job ``job_key`` waits for, sorted."""
        return sorted(self.pods.get(job_key, {}).values())

    def note_of(self, gone: GoneJob) -> str | None:
        """:func:`held_note` for a gone Job that holds GPUs, else None."""
        pods = self.waiting_on(gone.job.key)
        if gone.hold is None or gone.job.placement is None or not pods:
            return None
        return held_note(", ".join(gone.job.placement.nodes), pods)


__all__ = ["HELD_NOTE", "GoneJob", "PodsOfJobs", "held_note"]
