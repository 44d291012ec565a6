"""GPULocalQueues: which GPUClusterQueue a task's queue name stands for, as Kueue's LocalQueue.

A GPUTask names a queue (``spec.queueName`` or the label ``kueue.x-k8s.io/queue-name``). That name
is a GPULocalQueue in the task's namespace, whose ``spec.clusterQueue`` is the GPUClusterQueue
that admits and charges the task (Kueue: a Workload's ``queueName`` is a LocalQueue, and the
LocalQueue's ``clusterQueue`` holds the quota). For one release a task may still name a
GPUClusterQueue directly when its namespace has no GPULocalQueue of that name; it is then queued
there, with a Warning Event ``DeprecatedQueueName``. A name that is neither waits, outside the
queues, with reason QueueNotFound, until one of them appears.

This module holds no I/O: the controller feeds it watch events and asks it to resolve names; it
keeps, per queue name, which tasks asked for it, so an event re-resolves only those (never a scan
of every task).
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gputask.core import TaskKey
from gputask.core.reasons import Reason

DEPRECATED_QUEUE_NAME = "DeprecatedQueueName"


@dataclass(frozen=True, slots=True)
class LocalQueue:
    """One GPULocalQueue as last seen: ``cluster_queue`` (None when its spec is invalid, ``error`` says
    why), its finalizers and resourceVersion (for the queue-in-use finalizer), whether it is being deleted."""

    namespace: str
    name: str
    cluster_queue: str | None
    error: str | None
    finalizers: tuple[str, ...]
    resource_version: str
    terminating: bool


@dataclass(frozen=True, slots=True)
class Resolution:
    """Where a queue name leads: ``cluster_queue`` to queue in, through ``local_queue`` (None: the name
    is the GPUClusterQueue itself, deprecated); or, when ``cluster_queue`` is None, why it waits
    (``reason``, ``message``)."""

    cluster_queue: str | None
    local_queue: str | None = None
    reason: str = ""
    message: str = ""


class LocalQueues:
    """The GPULocalQueues of the cluster and the tasks that asked for each queue name."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str], LocalQueue] = {}
        self._asking: dict[str, set[TaskKey]] = {}  # queue name -> tasks that named it
        self._asked: dict[TaskKey, str] = {}
        self.warned: set[TaskKey] = set()  # tasks told (by Event) that naming a GPUClusterQueue is deprecated

    def on_local_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> tuple[str, str] | None:
        """Take a GPULocalQueue event; returns its (namespace, name) when where its name leads changed
        (created, deleted, pointed elsewhere, made invalid or valid, being deleted), else None: its own
        status and finalizer writes come back as events and must not re-resolve every task naming it."""
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            return None
        where = (str(meta.get("namespace") or "default"), meta["name"])
        old = self.queues.get(where)
        if deleted:
            self.queues.pop(where, None)
            return where if old is not None else None
        spec = obj.get("spec")
        target = spec.get("clusterQueue") if isinstance(spec, Mapping) else None
        ok = isinstance(target, str) and target != ""
        new = self.queues[where] = LocalQueue(
            namespace=where[0],
            name=where[1],
            cluster_queue=target if ok else None,
            error=None if ok else f"spec.clusterQueue must name a GPUClusterQueue, got {target!r}",
            finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
            resource_version=str(meta.get("resourceVersion") or ""),
            terminating=bool(meta.get("deletionTimestamp")),
        )
        if old is not None and (old.cluster_queue, old.error, old.terminating) == (
            new.cluster_queue, new.error, new.terminating,
        ):
            return None
        return where

    def resolve(self, namespace: str, name: str, cluster_queues: Container[str]) -> Resolution:
        """Where the queue name ``name`` of a task in ``namespace`` leads; ``cluster_queues`` holds the
        names of the GPUClusterQueues that exist (a task may name one directly, deprecated)."""
        local = self.queues.get((namespace, name))
        if local is not None:
            if local.error is not None:
                return Resolution(None, reason=Reason.QUEUE_INACTIVE,
                                  message=f"GPULocalQueue {namespace}/{name} is invalid: {local.error}")
            if local.terminating:
                return Resolution(None, reason=Reason.QUEUE_INACTIVE,
                                  message=f"GPULocalQueue {namespace}/{name} is being deleted: it admits nothing new")
            return Resolution(local.cluster_queue, name)
        if name in cluster_queues:
            return Resolution(name)
        return Resolution(
            None,
            reason=Reason.QUEUE_NOT_FOUND,
            message=f"GPULocalQueue {namespace}/{name} does not exist (nor a GPUClusterQueue {name!r}, "
            "which a task may name directly until the next release)",
        )

    def ask(self, key: TaskKey, name: str) -> None:
        """Remember that task ``key`` named queue ``name`` (replacing what it named before)."""
        self.forget(key, keep_warning=True)
        self._asked[key] = name
        self._asking.setdefault(name, set()).add(key)

    def forget(self, key: TaskKey, *, keep_warning: bool = False) -> None:
        """The task is gone (or names another queue now)."""
        name = self._asked.pop(key, None)
        if name is not None:
            keys = self._asking.get(name)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._asking[name]
        if not keep_warning:
            self.warned.discard(key)

    def asking(self, name: str, namespace: str | None = None) -> Iterator[TaskKey]:
        """Tasks (in ``namespace``, or in any) that named queue ``name``, in key order."""
        for key in sorted(self._asking.get(name, ())):
            if namespace is None or key.rpartition("/")[0] == namespace:
                yield key

    def serves(self, task_queue: str, namespace: str, local_queue: str | None) -> LocalQueue | None:
        """The GPULocalQueue ``namespace/local_queue`` when it leads to GPUClusterQueue ``task_queue`` (a task
        admitted through an earlier queue of that name, pointing elsewhere, is not this one's)."""
        if not local_queue:
            return None
        found = self.queues.get((namespace, local_queue))
        return found if found is not None and found.cluster_queue == task_queue else None


def deprecation_message(namespace: str, name: str) -> str:
    """The Warning Event's message for a task that names GPUClusterQueue ``name`` directly."""
    return (
        f"the queue name {name!r} is a GPUClusterQueue, not a GPULocalQueue of namespace {namespace!r}: naming a "
        "GPUClusterQueue directly is deprecated and stops working in the next release; create a GPULocalQueue "
        f"{name!r} in {namespace!r} with spec.clusterQueue: {name}"
    )


__all__ = ["DEPRECATED_QUEUE_NAME", "LocalQueue", "LocalQueues", "Resolution", "deprecation_message"]
