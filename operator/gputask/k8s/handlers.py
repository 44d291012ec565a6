"""The operator instance: kopf's start-up and clean-up handlers, the rebuild, and the informers of every watched kind.

kopf is the operator's framework (start-up, clean-up, login, liveness probe, peering) and watches nothing of the
cluster for it. Every kind the operator rebuilds from and keeps watching comes through its own informers
(:mod:`gputask.k8s.informer`: client-go's reflector rules; kopf's per-event cost was most of the operator's CPU in a
burst) into the typed feeds of :mod:`gputask.k8s.feeds`, a batch of events per gate and wake. They run while this
instance leads, from the resourceVersions its rebuild listed: an event that comes while it rebuilds is one its
watch replays, so none is lost and none is fed twice. kopf's handlers are ``async def`` (sync handlers would run in
threads and race) and registered on a registry per operator instance, so tests can run two operators in one
process; no kopf handler puts a finalizer or a kopf annotation on anything, so no deletion can hang on gputask.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
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
    LOCALQUEUES,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
    ApiError,
    KubeApi,
    NotFound,
    Resource,
)
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor
from gputask.k8s.feeds import Feed, ForeignPodFeed, JobFeed, KindFeed, TaskFeed, TaskPodFeed, job_key
from gputask.k8s.foreign import FINISHED_POD_PHASES, FOREIGN_PODS
from gputask.k8s.informer import Informer
from gputask.k8s.jobs import TASK_LABEL
from gputask.k8s.kueue import KueueSupport
from gputask.k8s.leader import LeaderElector
from gputask.k8s.loop import SchedulingLoop
from gputask.k8s.relabel import labelled, ours
from gputask.k8s.reports import Report, ReportKind
from gputask.k8s.tasks import PLACED_PHASES
from gputask.k8s.userjob_feed import UserJobFeed
from gputask.k8s.userjobs import QUEUE_NAME_LABEL
from gputask.k8s.writer import Writer
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.handlers")

CLEANUP_TIMEOUT_S = 15.0  # the longest a shutdown waits for the leader election to release the Lease
REBUILD_RETRY_S = 5.0

FOREIGN_LABELS = f"!{TASK_LABEL}"
# What the rebuild lists, in the order the controller takes it (each kind's informer then watches from that list).
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
# Informers the rebuild does not list: they list first (Kueue's LocalQueues, read by the Kueue support's own refresh).
UNLISTED = ("kueuelocalqueues", "userjobs")


class Operator:
    """One operator instance: controller, writer, executor, loop, informers, leader election, kopf registry.

    Without leader election the instance leads from the start. With it, a standby watches nothing (its informers
    are stopped) and feeds nothing; once elected it rebuilds the controller from the API, starts its informers
    from the resourceVersions of the rebuild's lists, and only then schedules. Every write is fenced by
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
        self.informers = self._informers(config.namespace or None)
        self.registry = kopf.OperatorRegistry()
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.elector: LeaderElector | None = None
        self._campaign: asyncio.Task[None] | None = None
        self._register()

    def _informers(self, namespace: str | None) -> dict[str, Informer]:
        """One informer per watched kind, by the name the rebuild's listing has. GPUTasks, our Jobs and their pods
        are watched in the operator's namespace when it has one; every other kind cluster-wide, as the rebuild lists
        it (a node's foreign pods take its GPUs whichever namespace they are in)."""
        client, controller, kueue_mode = self.client, self.controller, self.config.queueing == "kueue"

        def kind(resource: Resource, feed: Feed, *, name: str | None = None, optional: bool = False) -> Informer:
            return Informer(client, resource, feed, name=name, optional=optional)

        def priority(kueue: bool) -> KindFeed:
            return KindFeed(self, lambda obj, deleted, _: controller.on_priority_class(obj, kueue=kueue,
                                                                                       deleted=deleted))

        def note_namespace(obj: dict[str, Any]) -> None:
            self.kueue.note_namespace(str(obj["metadata"]["name"]))

        informers = {
            "priorityclasses": kind(PRIORITYCLASSES, priority(False)),
            "workloadpriorityclasses": kind(WORKLOADPRIORITYCLASSES, priority(True), optional=True),
            "namespaces": kind(NAMESPACES, KindFeed(self, lambda obj, deleted, _: controller.inventory.on_namespace(
                obj, deleted=deleted), then=note_namespace)),
            "nodes": kind(NODES, KindFeed(self, lambda obj, deleted, now: controller.inventory.on_node(
                obj, now, deleted=deleted))),
            "gpunodes": kind(GPUNODES, KindFeed(self, lambda obj, deleted, now: controller.on_gpunode(
                obj, now, deleted=deleted))),
            "flavors": kind(GPURESOURCEFLAVORS, KindFeed(self, lambda obj, deleted, _: controller.inventory.on_flavor(
                obj, deleted=deleted))),
            "queues": kind(GPUCLUSTERQUEUES, KindFeed(self, lambda obj, deleted, _: controller.on_queue(
                obj, deleted=deleted))),
            "localqueues": kind(GPULOCALQUEUES, KindFeed(self, lambda obj, deleted, _: controller.on_local_queue(
                obj, deleted=deleted))),
            "jobs": Informer(client, JOBS, JobFeed(self), namespace=namespace, labels=REBUILD_ORDER["jobs"][1]),
            "tasks": Informer(client, GPUTASKS, TaskFeed(self), namespace=namespace),
            "taskpods": Informer(client, PODS, TaskPodFeed(self), namespace=namespace, labels=TASK_LABEL,
                                 name="pods of tasks"),
            "foreignpods": Informer(client, PODS, ForeignPodFeed(self), labels=FOREIGN_LABELS, fields=FOREIGN_PODS,
                                    name="foreign pods"),
        }
        if kueue_mode:  # Workloads wait for our placement check; the Kueue support's loop answers them
            informers["workloads"] = kind(WORKLOADS, KindFeed(
                self, lambda obj, deleted, _: self.kueue.admission.on_workload(obj, deleted=deleted), gated=False,
                wake="kueue"), optional=True)
        else:  # Kueue's LocalQueues may make it suspend our Jobs (the detector wakes the Kueue support itself)
            informers["userjobs"] = Informer(client, JOBS, UserJobFeed(self), namespace=namespace,
                                             labels=QUEUE_NAME_LABEL, name="labelled Jobs")
            informers["kueuelocalqueues"] = kind(LOCALQUEUES, KindFeed(
                self, lambda obj, deleted, _: self.kueue.on_local_queue(obj, deleted=deleted), gated=False,
                wake=None), name="Kueue LocalQueues", optional=True)
        return informers

    @property
    def config(self) -> Config:
        """The operator's configuration."""
        return self.controller.config

    def is_leading(self) -> bool:
        """True while this instance may write: it leads, and (with leader election) its Lease is fresh."""
        return self.leading and (self.elector is None or self.elector.leading())

    async def rebuild(self) -> None:
        """List everything and rebuild the controller before the first cycle; then start every informer from the
        resourceVersion of its kind's list, so what changed since that list comes through its watch (an informer
        whose kind was not listed, or whose listing said 404, lists first)."""
        await self._stop_informers()
        objects, versions = await self._list_all()
        for kind, informer in self.informers.items():
            if isinstance(informer.sink, Feed):
                informer.sink.seed(objects.get(kind, ()))
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
        for kind, informer in self.informers.items():
            informer.start(versions.get(kind, ""))

    async def _list_all(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
        """Every listed kind's objects and the resourceVersion of its list: one paginated LIST each, with the
        namespace and selectors its informer watches with. A kind answered 404 (e.g. no Kueue WorkloadPriorityClass
        API in this cluster) has no objects and no version. Raises kopf.TemporaryError when a LIST fails otherwise."""
        objects: dict[str, list[dict[str, Any]]] = {}
        versions: dict[str, str] = {}
        for kind, informer in self.informers.items():
            if kind in UNLISTED:
                continue
            try:
                found = await self.client.list_versioned(informer.resource, informer.namespace,
                                                         labels=informer.labels, fields=informer.fields)
            except ApiError as exc:
                if exc.status != 404:
                    raise kopf.TemporaryError(f"listing {kind} failed: {exc}", delay=5) from exc
                objects[kind] = []
                continue
            objects[kind], versions[kind] = found.items, found.resource_version
        return objects, versions

    async def _unlisted_jobs(self, objects: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Our Jobs the labelled listing missed (their task label removed), found by name: the Job each placed
        task's status names and the Job of each unfinished pod of ours, when not listed; one GET each, so a rebuild
        whose Jobs were all listed asks nothing more. Raises kopf.TemporaryError when a GET fails other than 404:
        releasing a Job that may still run would double-book its GPUs."""
        listed = {job_key(o) for o in objects.get("jobs", ())}
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
                            job_key(obj), TASK_LABEL)
        return jobs

    async def _stop_informers(self) -> None:
        for informer in self.informers.values():
            await informer.stop()

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

    def _register(self) -> None:
        """kopf's handlers: start-up and clean-up only (every watched kind comes through the informers)."""
        reg = self.registry
        kopf.on.startup(registry=reg)(self.on_startup)
        kopf.on.cleanup(registry=reg)(self.on_cleanup)


__all__ = ["Operator"]
