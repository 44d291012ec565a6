"""A task's spec to the core: conversion (:func:`gputask.manifests.convert.task_from_manifest`), its queue name
resolved through its namespace's GPULocalQueue, tasks blocked until the (Workload)PriorityClass or queue they name
exists, and a placed task's edited spec kept for its next admission. Synchronous, no I/O."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gputask.core import InvalidTaskError, Task, TaskKey
from gputask.k8s import records
from gputask.k8s.records import (
    PENDING,
    PRIORITY_CLASS_NOT_FOUND,
    TaskRecord,
)
from gputask.k8s.reports import Report, ReportKind
from gputask.manifests import convert

if TYPE_CHECKING:
    from gputask.k8s.controller import Controller

log = logging.getLogger("gputask.controller")

class Specs:
    """Spec conversion and queue resolution of the controller's tasks (one per controller, :attr:`Controller.specs`)."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def convert_task(self, obj: Mapping[str, Any]) -> Task:
        """Core Task of a GPUTask body; raises InvalidTaskError (a pod template the Job API refuses, or none: the
        one pod's ``spec.template``, or a ``spec.podSets`` entry's ``template``, which its Indexed Job is made of;
        also, logged, for anything else the converter raises on odd input)."""
        spec = obj.get("spec")
        if isinstance(spec, Mapping) and spec.get("template") is None and spec.get("podSets") is None:
            raise InvalidTaskError("InvalidSpec", "spec.template: Required value: the task runs as a Job of it")
        task = self._converted(obj)
        pod_sets = spec.get("podSets") if isinstance(spec, Mapping) else None
        for i, entry in enumerate(pod_sets if isinstance(pod_sets, list) else ()):
            if isinstance(entry, Mapping) and entry.get("template") is None:
                raise InvalidTaskError("InvalidSpec", f"spec.podSets[{i}].template: Required value: the PodSet's "
                                                      "pods run as an Indexed Job of it")
        return task

    def _converted(self, obj: Mapping[str, Any]) -> Task:
        inv = self.ctl.inventory
        namespace = obj["metadata"].get("namespace") or "default"
        try:
            return convert.task_from_manifest(
                obj,
                priority_of=lambda name: inv.priority_of(name, kueue=False),
                workload_priority_of=lambda name: inv.priority_of(name, kueue=True),
                namespace_labels=inv.labels_of(namespace),
                share_per_namespace=self.ctl.config.pinning == "dra",
            )
        except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError, IndexError) as exc:
            # A converter bug on odd input must fail this task, not the handler or every rebuild.
            log.exception("GPUTask %s/%s: conversion failed", namespace, obj["metadata"].get("name"))
            raise InvalidTaskError("InvalidSpec", f"the spec cannot be read ({type(exc).__name__}: {exc})") from None

    def queued(self, record: TaskRecord, task: Task) -> Task:
        """``task`` with its queue name resolved to the GPUClusterQueue that admits it (gputask mode; in Kueue
        mode the name is Kueue's LocalQueue and stays). Raises InvalidTaskError QueueNotFound or QueueInactive
        when it must wait outside the queues; a task naming a GPUClusterQueue directly gets a deprecation
        Event, once."""
        if self.ctl.config.queueing == "kueue":
            return task
        lqs = self.ctl.local_queues
        lqs.ask(record.key, task.queue)
        found = lqs.resolve(record.namespace, task.queue, self.ctl.inventory.queue_meta)
        if found.cluster_queue is None:
            raise InvalidTaskError(found.reason, found.message)
        published = (record.obj.get("status") or {}).get("queue")  # an earlier leader queued it there, and warned
        if found.local_queue is None and record.key not in lqs.warned and published != found.cluster_queue:
            lqs.warned.add(record.key)
            self.ctl.outbox.append(Report(ReportKind.DEPRECATED_QUEUE, record, task.queue))
        return replace(task, queue=found.cluster_queue, local_queue=found.local_queue)

    def placed_in(self, record: TaskRecord, task: Task, queue: Any) -> Task:
        """``task`` of a placed task, in the GPUClusterQueue it was admitted in (``status.queue``), which
        outlives a GPULocalQueue pointed elsewhere since; resolved anew when the status names none."""
        if self.ctl.config.queueing == "kueue" or not isinstance(queue, str) or not queue:
            return self.queued(record, task)
        self.ctl.local_queues.ask(record.key, task.queue)
        local = self.ctl.local_queues.queues.get((record.namespace, task.queue))
        via = task.queue if local is not None and local.cluster_queue == queue else None
        return replace(task, queue=queue, local_queue=via)

    def revise(self, record: TaskRecord, *, spec_changed: bool) -> None:
        """A placed task's spec changed: it runs on as admitted; its next admission takes the new spec
        (in the queue it then names; in its current one while that name leads nowhere)."""
        try:
            task = self.convert_task(record.obj)
            try:
                task = self.queued(record, task)
            except InvalidTaskError:
                current = record.task
                if current is not None:
                    task = replace(task, queue=current.queue, local_queue=current.local_queue)
        except InvalidTaskError as exc:
            records.revised(record, None, (exc.reason, exc.message))
            self.ctl.scheduler.revise(record.key, None)
        else:
            records.revised(record, task)
            self.ctl.scheduler.revise(record.key, task)
        if spec_changed:
            self.ctl.outbox.append(Report(ReportKind.SPEC_IGNORED, record))

    def block(self, record: TaskRecord, exc: InvalidTaskError) -> None:
        """Wait outside the queues until the named priority class exists, or the queue name leads to a
        GPUClusterQueue (GitOps order: tasks applied before their queues)."""
        records.block(record, exc.reason, exc.message)
        if exc.reason == PRIORITY_CLASS_NOT_FOUND:
            self.ctl.blocked_on.setdefault(convert.priority_class_name(record.obj) or "", set()).add(record.key)
        self.ctl.outbox.append(Report(ReportKind.BLOCKED, record))

    def unblock(self, record: TaskRecord) -> None:
        if record.blocked is not None:
            waiting = self.ctl.blocked_on.get(convert.priority_class_name(record.obj) or "")
            if waiting is not None:
                waiting.discard(record.key)

    def reresolve(self, keys: Iterable[TaskKey]) -> None:
        for key in list(keys):
            record = self.ctl.tasks.get(key)
            if record is None or record.deleting or record.phase != PENDING or record.invalid is not None:
                continue
            if record.blocked is not None and record.blocked[0] == PRIORITY_CLASS_NOT_FOUND:
                continue  # waits for its priority class first
            self.ctl.requeue(record)

    def on_priority_class(self, obj: Mapping[str, Any], *, kueue: bool, deleted: bool = False) -> None:
        """A (Workload)PriorityClass changed: tasks waiting for that name are converted again."""
        if kueue:
            self.ctl.inventory.on_workload_priority_class(obj, deleted)
        else:
            self.ctl.inventory.on_priority_class(obj, deleted)
        name = str((obj.get("metadata") or {}).get("name"))
        for key in sorted(self.ctl.blocked_on.pop(name, set())) if not deleted else ():
            record = self.ctl.tasks.get(key)
            if record is not None and record.blocked is not None:
                records.unblock(record)
                self.ctl.requeue(record)

    def on_local_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """A GPULocalQueue changed: the waiting tasks of its namespace that name it are resolved again
        (placed ones keep the GPUClusterQueue they were admitted in)."""
        where = self.ctl.local_queues.on_local_queue(obj, deleted)
        if where is not None:
            self.reresolve(self.ctl.local_queues.asking(where[1], where[0]))

    def on_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """A GPUClusterQueue changed. When one appears or goes, tasks that name it directly (or wait for a
        name that leads nowhere) are resolved again."""
        name = (obj.get("metadata") or {}).get("name")
        known = name in self.ctl.inventory.queue_meta
        self.ctl.inventory.on_queue(obj, deleted)
        if isinstance(name, str) and known != (name in self.ctl.inventory.queue_meta):
            self.reresolve(
                key for key in self.ctl.local_queues.asking(name)
                if (r := self.ctl.tasks.get(key)) is not None and (r.task is None or r.task.local_queue is None)
            )  # fmt: skip
