"""Living beside Kueue: detect what makes Kueue suspend gputask's Jobs, and run Kueue mode.

In gputask mode (``queueing: gputask``) Kueue must leave the Jobs gputask emits alone. Two Kueue
settings make it suspend them instead (Kueue labels or manages Jobs that carry no
``kueue.x-k8s.io/queue-name`` label):

- a LocalQueue named ``default`` in the task's namespace (Kueue's LocalQueue defaulting gives
  such Jobs that queue);
- ``manageJobsWithoutQueueName: true`` in Kueue's manager configuration (ConfigMap
  ``kueue-manager-config`` in ``kueue-system``, key ``controller_manager_config.yaml``) for a
  namespace its ``managedJobsNamespaceSelector`` selects.

Both are looked at only when Kueue's CRDs are discoverable. Each task at risk gets the condition
``KueueConflict`` (status True, reason ``KueueWouldSuspendJob``) and a Warning Event saying what
to change; a Job of ours found suspended with a Kueue label or annotation turns the reason into
``JobSuspendedByKueue``, so no Job is ever left suspended without an explanation.

In Kueue mode (``queueing: kueue``) :class:`~gputask.k8s.kueue_admission.KueueAdmission` does
the work. :class:`KueueSupport` runs either on a small loop of its own beside the scheduling
loop: woken by events, and at least every ``cycleInterval``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gputask.core import InvalidQueueError, LabelRequirement, LabelSelector, TaskKey
from gputask.k8s.background import Background
from gputask.k8s.client import CONFIGMAPS, LOCALQUEUES, ApiError, KubeApi
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor
from gputask.k8s.jobs import TASK_UID_ANNOTATION
from gputask.k8s.kueue_admission import KueueAdmission
from gputask.k8s.tasks import FINISHED_PHASES, TaskRecord
from gputask.manifests import convert

log = logging.getLogger("gputask.kueue")

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PREFIX = "kueue.x-k8s.io/"
DEFAULT_LOCAL_QUEUE = "default"
MANAGER_CONFIG_NAMESPACE = "kueue-system"
MANAGER_CONFIG_NAME = "kueue-manager-config"
MANAGER_CONFIG_KEY = "controller_manager_config.yaml"
CONDITION = "KueueConflict"
WOULD_SUSPEND = "KueueWouldSuspendJob"
SUSPENDED = "JobSuspendedByKueue"
RESOLVED = "NoKueueConflict"
REMEDY = (
    "exclude the namespace from Kueue's managedJobsNamespaceSelector, remove the LocalQueue 'default' "
    "from it, or run gputask with `queueing: kueue`"
)
REFRESH_S = 30.0  # how often the LocalQueue listing and Kueue's configuration are read again

NAME_LABEL = "kubernetes.io/metadata.name"
# Kueue's default managedJobsNamespaceSelector: every namespace but kube-system and its own.
KUEUE_DEFAULT_NAMESPACES = LabelSelector(
    match_expressions=(LabelRequirement(NAME_LABEL, "NotIn", ("kube-system", MANAGER_CONFIG_NAMESPACE)),)
)


@dataclass(frozen=True, slots=True)
class KueueManagerConfig:
    """The parts of Kueue's configuration that decide whether it manages our Jobs."""

    manage_jobs_without_queue_name: bool = False
    managed_namespaces: LabelSelector = KUEUE_DEFAULT_NAMESPACES


def parse_manager_config(text: str) -> KueueManagerConfig:
    """Kueue's ``controller_manager_config.yaml``; raises ValueError when it is not a mapping or
    its selector is malformed."""
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a mapping, got {type(raw).__name__}")
    selector = raw.get("managedJobsNamespaceSelector")
    try:
        namespaces = KUEUE_DEFAULT_NAMESPACES if selector is None else convert.label_selector(selector)
    except (InvalidQueueError, AttributeError, TypeError) as exc:  # a list or scalar where a mapping belongs
        raise ValueError(f"managedJobsNamespaceSelector: {exc}") from None
    return KueueManagerConfig(raw.get("manageJobsWithoutQueueName") is True, namespaces)


@dataclass(slots=True)
class KueueDetector:
    """What the operator knows of Kueue: present at all, LocalQueues by namespace, its configuration."""

    present: bool = False
    local_queues: dict[str, set[str]] = field(default_factory=dict)
    config: KueueManagerConfig | None = None

    def on_local_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Track a LocalQueue by namespace and name (seeing one proves Kueue is installed)."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        self.present = True
        names = self.local_queues.setdefault(namespace, set())
        names.discard(name) if deleted else names.add(name)

    def cause(self, namespace: str, namespace_labels: Mapping[str, str]) -> str | None:
        """Why Kueue would suspend a Job without a queue name in ``namespace``; None when it would not."""
        if not self.present:
            return None
        causes = []
        if DEFAULT_LOCAL_QUEUE in self.local_queues.get(namespace, ()):
            causes.append(f"namespace {namespace!r} has a LocalQueue named 'default'")
        config = self.config
        if config and config.manage_jobs_without_queue_name and config.managed_namespaces.matches(namespace_labels):
            causes.append(
                f"Kueue's configuration sets manageJobsWithoutQueueName: true and its "
                f"managedJobsNamespaceSelector selects namespace {namespace!r}"
            )
        return " and ".join(causes) or None


def suspended_by_kueue(job: Mapping[str, Any]) -> str | None:
    """A message when a Job is suspended and carries Kueue's queue-name label or a Kueue annotation."""
    meta = job.get("metadata") or {}
    if not (job.get("spec") or {}).get("suspend"):
        return None
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    queue = labels.get(QUEUE_NAME_LABEL)
    if queue is None and not any(str(k).startswith(KUEUE_PREFIX) for k in annotations):
        return None
    through = f" through LocalQueue {queue!r}" if queue else ""
    return f"Kueue suspended Job {meta.get('name')}{through}; it will not start until Kueue admits it: {REMEDY}"


class KueueSupport:
    """Kueue detection (gputask mode) or Kueue admission (Kueue mode), on a loop of its own.

    It takes the core ``gate`` around what it reads or changes of the controller, as handlers do.
    """

    def __init__(self, client: KubeApi, controller: Controller, executor: Executor, gate: asyncio.Lock) -> None:
        self.client = client
        self.controller = controller
        self.executor = executor
        self.gate = gate
        self.detector = KueueDetector()
        self.admission = KueueAdmission(client, controller, executor, gate)
        self.suspended: dict[str, str] = {}  # task uid -> message, for Jobs Kueue suspended
        self._read_at = float("-inf")
        self._background = Background("kueue", self.sync, lambda: self.controller.config.cycle_interval_s)
        self._lock = asyncio.Lock()
        # gputask mode reports per task only what changed (no pass over every task per wake, issue 17):
        self._due: set[TaskKey] = set()  # tasks whose KueueConflict condition may have to change
        self._everyone = True  # the detector changed (or a rebuild): every task is due

    @property
    def kueue_mode(self) -> bool:
        """True with ``queueing: kueue``."""
        return self.controller.config.queueing == "kueue"

    # -- lifecycle ----------------------------------------------------------------------------
    async def rebuild(self, workloads: list[dict[str, Any]]) -> None:
        """After the controller was rebuilt: read Kueue's state (and, in Kueue mode, reservations)."""
        if self.kueue_mode:
            await self.admission.rebuild(workloads)
        else:
            await self.refresh()
            self._everyone, self._due = True, set()

    def start(self) -> None:
        """Start the loop (idempotent)."""
        self._background.start()

    async def stop(self) -> None:
        """Stop the loop and wait for it."""
        await self._background.stop()

    def wake(self) -> None:
        """Ask for a sync soon."""
        self._background.wake()

    async def sync(self) -> None:
        """One pass: Kueue mode answers admission checks; gputask mode reports conflicts for the tasks that are
        due (new or changed tasks, Jobs Kueue suspended or released; every task after the detector changed)."""
        async with self._lock:
            if self.kueue_mode:
                await self.admission.sync()
                return
            if time.monotonic() - self._read_at > REFRESH_S:
                before = self._detected()
                await self.refresh()
                self._everyone = self._everyone or self._detected() != before
            tasks = self.controller.tasks
            if self._everyone:
                due, self._everyone, self._due = list(tasks.values()), False, set()
            else:
                keys, self._due = self._due, set()
                due = [tasks[k] for k in sorted(keys) if k in tasks]
            for record in due:
                await self.report(record)

    def _detected(self) -> tuple[object, ...]:
        """What a conflict depends on besides the task: Kueue present, its LocalQueues, its configuration."""
        detector = self.detector
        queues = tuple(sorted((ns, tuple(sorted(names))) for ns, names in detector.local_queues.items()))
        return detector.present, queues, detector.config

    def note_task(self, key: TaskKey) -> None:
        """A task was added or changed: its condition (Kueue mode: its Job) is due (no pass over the others)."""
        if self.kueue_mode:
            self.admission.note_task(key)
        else:
            self._due.add(key)
        self.wake()

    def note_everyone(self) -> None:
        """Something every task's condition depends on changed (Kueue's LocalQueues): all are due."""
        self._everyone = True
        self.wake()

    def note_namespace(self, name: str) -> None:
        """A namespace changed (its labels decide whether Kueue manages its Jobs): its tasks are due, no others."""
        self._due |= self.controller.in_namespace.get(name, set())
        self.wake()

    # -- events -------------------------------------------------------------------------------
    def on_local_queue(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """A LocalQueue changed: every task's condition may change."""
        before = self._detected()
        self.detector.on_local_queue(obj, deleted)
        if self._detected() != before:
            self.note_everyone()

    def on_job(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """One of our Jobs changed: remember whether Kueue holds it suspended (gputask mode)."""
        uid = ((obj.get("metadata") or {}).get("annotations") or {}).get(TASK_UID_ANNOTATION)
        if self.kueue_mode:
            self.admission.on_job(obj)
            self.wake()
            return
        if not uid:
            return
        message = None if deleted else suspended_by_kueue(obj)
        if message != self.suspended.get(uid):
            self.suspended.pop(uid, None) if message is None else self.suspended.__setitem__(uid, message)
            record = self.controller.record_by_uid(uid)
            if record is not None:
                self.note_task(record.key)

    # -- detection ----------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Read LocalQueues and Kueue's configuration; skip the configuration when Kueue is absent."""
        self._read_at = time.monotonic()
        detector = self.detector
        try:
            queues = await self.client.list(LOCALQUEUES)
        except ApiError as exc:
            if exc.status == 404:
                detector.present, detector.local_queues, detector.config = False, {}, None
            else:
                log.warning("listing Kueue LocalQueues failed: %s", exc)
            return
        detector.present, detector.local_queues = True, {}
        for obj in queues:
            detector.on_local_queue(obj)
        detector.config = await self._manager_config()

    async def _manager_config(self) -> KueueManagerConfig | None:
        try:
            obj = await self.client.get(CONFIGMAPS, MANAGER_CONFIG_NAME, MANAGER_CONFIG_NAMESPACE)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("reading Kueue's configuration failed: %s", exc)
            return None
        text = (obj.get("data") or {}).get(MANAGER_CONFIG_KEY)
        if not isinstance(text, str):
            return None
        try:
            return parse_manager_config(text)
        except ValueError as exc:
            log.warning("Kueue's configuration %s/%s: %s", MANAGER_CONFIG_NAMESPACE, MANAGER_CONFIG_NAME, exc)
            return None

    def wanted(self, record: TaskRecord) -> tuple[bool, str, str] | None:
        """The KueueConflict condition a task should carry: (status, reason, message), or None for none."""
        suspended = self.suspended.get(record.uid)
        if suspended is not None:
            return True, SUSPENDED, suspended
        namespace = record.obj["metadata"].get("namespace") or "default"
        cause = self.detector.cause(namespace, self.controller.inventory.labels_of(namespace))
        if cause is not None:
            return True, WOULD_SUSPEND, f"Kueue would suspend the Jobs gputask emits: {cause}. To fix it, {REMEDY}"
        if CONDITION in record.conditions:
            return False, RESOLVED, f"Kueue leaves the Jobs gputask emits in namespace {namespace!r} alone"
        return None

    async def report(self, record: TaskRecord) -> None:
        """Set, change or clear a task's KueueConflict condition; a Warning Event when it turns True."""
        if record.deleting or record.phase in FINISHED_PHASES or record.invalid is not None:
            return
        wanted = self.wanted(record)
        old = record.conditions.get(CONDITION)
        if wanted is None or (old and (old["status"] == "True", old["reason"], old["message"]) == wanted):
            return
        await self.executor.transitions.condition(record, CONDITION, *wanted)
