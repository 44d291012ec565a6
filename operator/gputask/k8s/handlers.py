"""kopf handlers and the informers' feeds: feed the controller from watch events and wake the scheduling loop.

Handlers never decide and never write: each takes the core gate (the cycle runs on a worker
thread while it is held), feeds :class:`~gputask.k8s.controller.Controller` or the Kueue support,
and wakes the loop, which publishes what they queued. All are ``async def`` (sync handlers would
run in threads and race). They use ``kopf.on.event`` (no finalizers, no kopf state annotations),
so no GPUTask deletion can ever hang on gputask. Handlers are registered on a registry per
operator instance, so tests can run two operators in one process.

GPUTasks, our Jobs and pods, the kinds every task brings events of and the most numerous objects of a
cluster, come through the operator's own informers instead (:mod:`gputask.k8s.informer`: kopf's per-event
cost was most of the operator's CPU in a burst) into :class:`TaskFeed`, :class:`JobFeed`,
:class:`TaskPodFeed` and :class:`ForeignPodFeed`, a batch of events per gate and wake. They run while this
instance leads, from the resourceVersions its rebuild listed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import kopf

from gputask.config import Config
from gputask.core.model import TaskKey, task_key
from gputask.k8s.client import (
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPUNODES,
    GPURESOURCEFLAVORS,
    GPUTASKS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
    ApiError,
    KubeApi,
    Listed,
    NotFound,
    Resource,
)
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor
from gputask.k8s.foreign import FINISHED_POD_PHASES, FOREIGN_PODS
from gputask.k8s.informer import Informer
from gputask.k8s.jobs import TASK_LABEL, TASK_UID_ANNOTATION
from gputask.k8s.kueue import KueueSupport
from gputask.k8s.leader import LeaderElector
from gputask.k8s.loop import SchedulingLoop
from gputask.k8s.relabel import labelled, ours
from gputask.k8s.reports import Report, ReportKind
from gputask.k8s.tasks import PLACED_PHASES
from gputask.k8s.writer import Writer
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.handlers")

Handler = Callable[..., Coroutine[Any, Any, None]]
CLEANUP_TIMEOUT_S = 15.0  # the longest a shutdown waits for the leader election to release the Lease
REBUILD_RETRY_S = 5.0

INFORMED = ("jobs", "tasks", "taskpods", "foreignpods")  # the kinds listed for the operator's informers (not kopf)
FOREIGN_LABELS = f"!{TASK_LABEL}"
REBUILD_ORDER: dict[str, tuple[Resource, str | None]] = {
    "priorityclasses": (PRIORITYCLASSES, None),
    "workloadpriorityclasses": (WORKLOADPRIORITYCLASSES, None),
    "namespaces": (NAMESPACES, None),
    "nodes": (NODES, None),
    "gpunodes": (GPUNODES, None),
    "flavors": (GPURESOURCEFLAVORS, None),
    "queues": (GPUCLUSTERQUEUES, None),
    "localqueues": (GPULOCALQUEUES, None),
    "jobs": (JOBS, TASK_LABEL),
    "tasks": (GPUTASKS, None),
}


class Operator:
    """One operator instance: controller, writer, executor, loop, leader election, kopf registry.

    Without leader election the instance leads from the start. With it, a standby keeps its
    watches open but ignores their events; once elected it rebuilds the controller from the API,
    and only then schedules. Events that arrive while it rebuilds are kept and fed afterwards when
    they are newer than what the rebuild listed, so none is lost. Every write is fenced by
    :meth:`is_leading` (the Lease renewed within its renew deadline).
    """

    def __init__(
        self, config: Config, client: KubeApi, *, identity: str | None = None, lease_client: KubeApi | None = None
    ) -> None:
        self.client = client
        self.lease_client = lease_client or client
        self.metrics = OperatorMetrics()
        self.controller = Controller(config)
        self.leading = False
        self.writer = Writer(client, self.metrics, leading=self.is_leading)
        self.gate = asyncio.Lock()
        self.executor = Executor(self.controller, self.writer, self.metrics, concurrency=config.api_concurrency,
                                 gate=self.gate, job_feed=lambda obj, deleted: self.job_event(obj, deleted=deleted))
        self.loop = SchedulingLoop(self.controller, self.executor, self.gate)
        self.kueue = KueueSupport(client, self.controller, self.executor, self.gate)
        namespace = config.namespace or None
        self.informers = {
            "tasks": Informer(client, GPUTASKS, TaskFeed(self), namespace=namespace),
            "jobs": Informer(client, JOBS, JobFeed(self), namespace=namespace, labels=REBUILD_ORDER["jobs"][1]),
            "taskpods": Informer(client, PODS, TaskPodFeed(self), namespace=namespace, labels=TASK_LABEL,
                                 name="pods of tasks"),
            # every namespace: a node's foreign pods take its GPUs and room whichever namespace they are in
            "foreignpods": Informer(client, PODS, ForeignPodFeed(self), labels=FOREIGN_LABELS, fields=FOREIGN_PODS,
                                    name="foreign pods"),
        }
        self.registry = kopf.OperatorRegistry()
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.elector: LeaderElector | None = None
        self._campaign: asyncio.Task[None] | None = None
        self._buffer: list[tuple[Handler, dict[str, Any]]] | None = None  # events seen while rebuilding
        self._register()

    @property
    def config(self) -> Config:
        """The operator's configuration."""
        return self.controller.config

    def is_leading(self) -> bool:
        """True while this instance may write: it leads, and (with leader election) its Lease is fresh."""
        return self.leading and (self.elector is None or self.elector.leading())

    async def rebuild(self) -> None:
        """List everything and rebuild the controller before the first cycle; then feed the events
        that arrived meanwhile and are newer than what was listed, and watch GPUTasks, Jobs and pods from
        the resourceVersions of their lists."""
        self._buffer = []
        await self._stop_informers()
        try:
            objects, versions = await self._list_all()
            foreign = objects.pop("foreignpods")
            objects["pods"] = [*objects.pop("taskpods"), *foreign]
            unlisted = await self._unlisted_jobs(objects)
            objects["jobs"] = [*objects["jobs"], *unlisted]
            async with self.gate:
                self.controller.foreign.reset(foreign)
                self.executor.reset()
                self.controller.rebuild(objects)
                for job in unlisted:
                    if not labelled(job):
                        self.executor.relabel.found(job)
                await self.kueue.rebuild(objects.get("workloads", []))
            listed = {_identity(o): _version(o) for kind in objects.values() for o in kind}
            buffered, self._buffer = self._buffer, None
            for handler, event in buffered:
                if _version(event["object"]) > listed.get(_identity(event["object"]), -1):
                    await handler(event)
        finally:
            self._buffer = None
        for kind, informer in self.informers.items():
            informer.start(versions[kind])

    async def _list_all(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
        """Every kind's objects, and the list resourceVersions of the informed kinds (GPUTasks, Jobs, our pods and
        foreign pods: one LIST each, with the selectors its informer watches with)."""
        objects: dict[str, list[dict[str, Any]]] = {}
        versions: dict[str, str] = {}
        kueue_mode = self.config.queueing == "kueue"
        lists = {**REBUILD_ORDER, "taskpods": (PODS, TASK_LABEL), "foreignpods": (PODS, FOREIGN_LABELS),
                 **({"workloads": (WORKLOADS, None)} if kueue_mode else {})}
        for kind, (resource, labels) in lists.items():
            try:
                if kind in INFORMED:  # paginated, with the version its informer watches from
                    informer = self.informers[kind]
                    found = await self.client.list_versioned(resource, informer.namespace, labels=informer.labels,
                                                             fields=informer.fields)
                    objects[kind], versions[kind] = found.items, found.resource_version
                else:
                    objects[kind] = await self.client.list(resource, labels=labels)
            except ApiError as exc:
                if exc.status != 404:
                    raise kopf.TemporaryError(f"listing {kind} failed: {exc}", delay=5) from exc
                objects[kind] = []  # e.g. no Kueue WorkloadPriorityClass API in this cluster
        return objects, versions

    async def _unlisted_jobs(self, objects: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Our Jobs the labelled listing missed (their task label removed), found by name: the Job each placed
        task's status names and the Job of each unfinished pod of ours, when not listed; one GET each, so a rebuild
        whose Jobs were all listed asks nothing more. Raises kopf.TemporaryError when a GET fails other than 404:
        releasing a Job that may still run would double-book its GPUs."""
        listed = {_job_key(o) for o in objects.get("jobs", ())}
        wanted = set()
        for task in objects.get("tasks", ()):
            status, meta = task.get("status") or {}, task["metadata"]
            if status.get("phase") in PLACED_PHASES and isinstance(status.get("jobName"), str):
                wanted.add(f"{meta.get('namespace') or 'default'}/{status['jobName']}")
        for pod in objects.get("pods", ()):
            meta = pod.get("metadata") or {}
            if TASK_LABEL in (meta.get("labels") or {}) and (pod.get("status") or {}).get("phase") not in \
                    FINISHED_POD_PHASES:
                wanted.update(f"{meta.get('namespace') or 'default'}/{ref['name']}"
                              for ref in meta.get("ownerReferences") or [] if ref.get("kind") == "Job")
        limit = asyncio.Semaphore(self.config.api_concurrency)

        async def fetch(key: str) -> dict[str, Any] | None:
            namespace, name = key.split("/", 1)
            async with limit:
                try:
                    return await self.client.get(JOBS, name, namespace)
                except NotFound:
                    return None
                except ApiError as exc:
                    raise kopf.TemporaryError(f"looking up Job {key} failed: {exc}", delay=5) from exc

        found = await asyncio.gather(*(fetch(key) for key in sorted(wanted - listed)))
        jobs = [obj for obj in found if obj is not None and ours(obj)]
        for obj in jobs:
            if not labelled(obj):
                log.warning("Job %s lost its label %s: found by name, it keeps its GPUs and the label is put back",
                            _job_key(obj), TASK_LABEL)
        return jobs

    async def _stop_informers(self) -> None:
        for informer in self.informers.values():
            await informer.stop()

    def _kept(self, handler: Handler, event: dict[str, Any]) -> bool:
        """While rebuilding, keep the event for after the rebuild (True: the handler must not feed it now)."""
        if self._buffer is None:
            return False
        self._buffer.append((handler, event))
        return True

    def own_pod(self) -> dict[str, str] | None:
        """The operator's own Pod as an Event's involvedObject (``POD_NAME`` and ``POD_NAMESPACE``, which the chart
        sets from the downward API), or None when not running in one."""
        name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
        if not name or not namespace:
            return None
        return {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}

    async def lead(self) -> None:
        """Become the scheduling instance: check what the cluster offers for pinning GPUs, rebuild (again after a
        failure, every 5 s), then run the loop."""
        self.leading = True
        try:
            await self.executor.pinner.check(self.own_pod())
        except Exception:  # a bug in the check must not keep the leader from leading; admissions say what is wrong
            log.exception("checking what the cluster offers for GPU pinning failed")
        while True:
            try:
                await self.rebuild()
                await self.executor.pinner.rebuild(self.controller.jobs)
                break
            except Exception:  # a listing refused, or a bug: retry rather than lead without a loop
                log.exception("rebuilding the operator's state failed; retried in 5s")
                await asyncio.sleep(REBUILD_RETRY_S)
        self.loop.start()
        self.loop.wake()
        self.kueue.start()

    async def step_down(self) -> None:
        """Stop scheduling (lost the Lease, or shutting down)."""
        self.leading = False
        await self._stop_informers()
        await self.loop.stop()
        await self.kueue.stop()

    # -- handlers -----------------------------------------------------------------------------------
    async def on_startup(self, **_: Any) -> None:
        """Lead at once, or campaign for the Lease when leader election is configured."""
        config = self.config
        if not config.leader_election:
            await self.lead()
            return
        self.elector = LeaderElector(
            self.lease_client,
            identity=self.identity,
            name=config.lease_name,
            namespace=config.lease_namespace or os.environ.get("POD_NAMESPACE", "default"),
            lease_s=config.lease_duration_s,
            renew_deadline_s=config.lease_renew_deadline_s,
            retry_s=config.lease_renew_s,
        )
        self._campaign = asyncio.create_task(self.elector.run(self.lead, self.step_down), name="gputask-leader")

    async def on_cleanup(self, **_: Any) -> None:
        """Stop campaigning (releasing the Lease) and scheduling."""
        if self._campaign is not None:
            campaign, self._campaign = self._campaign, None
            campaign.cancel()
            done, _ = await asyncio.wait({campaign}, timeout=CLEANUP_TIMEOUT_S)  # never hang a shutdown on it
            if not done:
                log.error("the leader election did not stop within %gs of being cancelled", CLEANUP_TIMEOUT_S)
        await self.step_down()

    def task_event(self, obj: dict[str, Any], *, deleted: bool) -> TaskKey | None:
        """A GPUTask added, modified or deleted (the gate held); its key, None when the event was the echo of
        our own status write (nothing new: dropped before any conversion)."""
        meta = obj["metadata"]
        if deleted or meta.get("deletionTimestamp"):
            record = self.controller.on_task_deleted(obj)
            if record is not None and record.job_name and record.phase in PLACED_PHASES:
                self.controller.outbox.append(Report(ReportKind.DELETE_JOB, record))
        elif self.controller.is_echo(obj):
            return None
        else:
            self.controller.on_task(obj)
        return task_key(meta.get("namespace") or "default", meta["name"])

    def job_event(self, obj: dict[str, Any], *, deleted: bool) -> None:
        """One of our Jobs added, changed or deleted (the gate held): running, completion, disappearance."""
        self.kueue.on_job(obj, deleted=deleted)
        if deleted:
            self.controller.on_job_deleted(obj)
        else:
            self.controller.on_job(obj)

    async def on_local_queue(self, event: dict[str, Any], **_: Any) -> None:
        """A Kueue LocalQueue changed (gputask mode: it may make Kueue suspend our Jobs)."""
        self.kueue.on_local_queue(event["object"], deleted=event.get("type") == "DELETED")

    async def on_workload(self, event: dict[str, Any], **_: Any) -> None:
        """A Kueue Workload changed (Kueue mode: it may wait for our placement check)."""
        if self.leading and not self._kept(self.on_workload, event):
            self.kueue.admission.on_workload(event["object"], deleted=event.get("type") == "DELETED")
            self.kueue.wake()

    async def on_priority_class(self, event: dict[str, Any], *, kueue: bool = False, **_: Any) -> None:
        """A PriorityClass (or Kueue WorkloadPriorityClass) changed: tasks waiting for it are looked at again."""
        if not self.leading or self._kept(functools.partial(self.on_priority_class, kueue=kueue), event):
            return
        async with self.gate:
            self.controller.on_priority_class(event["object"], kueue=kueue, deleted=event.get("type") == "DELETED")
        self.loop.wake()

    def _track(
        self,
        method: str,
        *,
        timed: bool = False,
        on: str = "inventory",
        then: Callable[[dict[str, Any]], None] | None = None,
    ) -> Handler:
        """A handler that passes the object to ``controller.<on>.<method>`` (looked up per event), then passes it
        to ``then`` (if given)."""

        async def handler(event: dict[str, Any], **_: Any) -> None:
            if not self.leading or self._kept(handler, event):
                return
            deleted = event.get("type") == "DELETED"
            async with self.gate:
                owner = self.controller if on == "controller" else self.controller.inventory
                call = getattr(owner, method)
                if timed:
                    call(event["object"], time.time(), deleted=deleted)
                else:
                    call(event["object"], deleted=deleted)
            self.loop.wake()
            if then is not None:
                then(event["object"])

        return handler

    def _register(self) -> None:
        reg = self.registry
        kopf.on.startup(registry=reg)(self.on_startup)
        kopf.on.cleanup(registry=reg)(self.on_cleanup)
        if self.config.queueing == "kueue":
            kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", registry=reg)(self.on_workload)
        else:
            kopf.on.event("kueue.x-k8s.io", "v1beta2", "localqueues", registry=reg)(self.on_local_queue)
        kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses", registry=reg)(self.on_priority_class)

        async def on_workload_priority_class(event: dict[str, Any], **kwargs: Any) -> None:
            await self.on_priority_class(event, kueue=True)

        kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", registry=reg)(on_workload_priority_class)
        for resource, handler in (
            (("gputask.io", "v1alpha1", "gpunodes"), self._track("on_gpunode", timed=True, on="controller")),
            (("v1", "nodes"), self._track("on_node", timed=True)),
            (("gputask.io", "v1alpha1", "gpuclusterqueues"), self._track("on_queue", on="controller")),
            (("gputask.io", "v1alpha1", "gpulocalqueues"), self._track("on_local_queue", on="controller")),
            (("gputask.io", "v1alpha1", "gpuresourceflavors"), self._track("on_flavor")),
            (("v1", "namespaces"),
             self._track("on_namespace", then=lambda obj: self.kueue.note_namespace(str(obj["metadata"]["name"])))),
        ):
            kopf.on.event(*resource, registry=reg, id=f"track-{resource[-1]}")(handler)


class Feed:
    """What the informers' feeds share: the operator they feed (only while it leads; a standby drops events, as its
    rebuild lists everything when it becomes the leader)."""

    def __init__(self, operator: Operator) -> None:
        self.operator = operator


class TaskFeed(Feed):
    """GPUTask events from the tasks informer into the controller, a batch per gate and wake."""

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order; tasks that changed are due for the Kueue check."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            keys = [op.task_event(e["object"], deleted=e["type"] == "DELETED") for e in events]
        op.loop.wake()
        for key in keys:
            if key is not None:
                op.kueue.note_task(key)

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed task fed again (unchanged ones are echoes, dropped), every known task
        missing from the listing deleted."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            present = set()
            for obj in listed.items:
                op.task_event(obj, deleted=False)
                present.add(task_key(obj["metadata"].get("namespace") or "default", obj["metadata"]["name"]))
            for key, record in list(op.controller.tasks.items()):
                if key not in present:
                    op.task_event(record.obj, deleted=True)
        op.loop.wake()
        op.kueue.note_everyone()


class JobFeed(Feed):
    """Events of our Jobs from the jobs informer into the controller, a batch per gate and wake.

    A Job with GPUs booked is never released on a DELETED or on its absence from a relisting alone: either may
    mean that it only lost its task label (a real API server sends the same DELETED for both), so the
    :class:`~gputask.k8s.relabel.Relabeler` asks the server first, and puts the label back on a Job still there.
    """

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order (Jobs without our task-uid annotation are not ours: the controller skips
        them); the DELETED of a booked Job is confirmed with the server before it is fed."""
        op = self.operator
        if not op.leading:
            return
        relabel = op.executor.relabel
        async with op.gate:
            for event in events:
                obj, deleted = event["object"], event["type"] == "DELETED"
                key = _job_key(obj)
                if deleted and op.controller.holds_gpus(key):
                    relabel.doubt(op.controller.jobs[key], obj)
                    continue
                relabel.drop(key)
                op.job_event(obj, deleted=deleted)
        await relabel.settle()
        op.loop.wake()

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed Job fed again, every known Job missing from the listing deleted (a booked one
        once the server confirms it is gone)."""
        op = self.operator
        if not op.leading:
            return
        relabel = op.executor.relabel
        async with op.gate:
            present = set()
            for obj in listed.items:
                key = _job_key(obj)
                relabel.drop(key)
                op.job_event(obj, deleted=False)
                present.add(key)
            for key, job in list(op.controller.jobs.items()):
                if key in present:
                    continue
                if op.controller.holds_gpus(key):
                    relabel.doubt(job)
                    continue
                relabel.drop(key)
                gone = {"metadata": {"name": job.name, "namespace": job.namespace,
                                     "annotations": {TASK_UID_ANNOTATION: job.task_uid}}}
                op.job_event(gone, deleted=True)
        await relabel.settle()
        op.loop.wake()


class TaskPodFeed(Feed):
    """Events of the pods of our Jobs from the task-pods informer into the controller, a batch per gate and wake:
    a pod running (the task is Running), one that cannot be scheduled, the pods whose GPU memory is ours."""

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            for event in events:
                op.controller.on_task_pod(event["object"], deleted=event["type"] == "DELETED")
        op.loop.wake()

    async def replace(self, listed: Listed) -> None:
        """After a gap: every listed pod fed again, every known pod missing from the listing forgotten."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            for obj in listed.items:
                op.controller.on_task_pod(obj, deleted=False)
            op.controller.keep_task_pods({str(o["metadata"].get("uid") or "") for o in listed.items})
        op.loop.wake()


class ForeignPodFeed(Feed):
    """Events of foreign pods (no task label, bound, not finished: the informer's selectors) from their informer into
    the foreign-pod index, a batch per gate and wake; the nodes whose foreign pods changed are recounted.

    It runs only while this instance leads: a standby's index would be of no use, as the rebuild lists foreign pods
    again (:meth:`~gputask.k8s.foreign.ForeignPods.reset`) before the new leader's first cycle.
    """

    async def apply(self, events: list[dict[str, Any]]) -> None:
        """Feed the events in order; a pod that finishes leaves the field selector and comes as DELETED."""
        op = self.operator
        if not op.leading:
            return
        async with op.gate:
            changed = {op.controller.foreign.on_pod(e["object"], deleted=e["type"] == "DELETED") for e in events}
            self._recount(changed)

    async def replace(self, listed: Listed) -> None:
        """After a gap: the index is the listing (pods missing from it finished or were deleted meanwhile)."""
        op = self.operator
        if not op.leading:
            return
        foreign = op.controller.foreign
        async with op.gate:
            before = set(foreign.by_node)
            foreign.reset(listed.items)
            self._recount(before | set(foreign.by_node))

    def _recount(self, nodes: set[str | None]) -> None:
        """Recount the GPUs and room of ``nodes`` (the gate held) and wake the loop when there are any."""
        op, now = self.operator, time.time()
        for node in sorted(n for n in nodes if n is not None):
            op.controller.inventory.refresh_node(node, now)
        if nodes - {None}:
            op.loop.wake()


def _job_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` of a Job."""
    meta = obj["metadata"]
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


def _identity(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """What tells one object from another across kinds: apiVersion, kind, namespace, name."""
    meta = obj.get("metadata") or {}
    return (str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def _version(obj: dict[str, Any]) -> int:
    """The object's resourceVersion as a number (etcd's revision; -1 when it is not one)."""
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else -1


__all__ = ["Operator"]
