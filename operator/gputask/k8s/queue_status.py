"""What the operator writes on its queues: each GPUClusterQueue's and GPULocalQueue's status, and the
queue-in-use finalizer (Kueue's ``kueue.x-k8s.io/resource-in-use``) that keeps a queue with admitted
tasks from going while they run.

Run by the scheduling loop after each pass; a status is patched only when it changed since the last
write, and a finalizer patch is sent at most once per resourceVersion (after a 409 the next try
waits for the watch to bring a newer version), so neither costs a write per pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gputask.core.flavors import flavored, split_key
from gputask.core.quota import GPU, GPU_MEMORY, QueueSpec
from gputask.core.reasons import Reason
from gputask.k8s.client import (
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPURESOURCEFLAVORS,
    ApiError,
    Conflict,
    NotFound,
    Resource,
)
from gputask.k8s.controller import Controller
from gputask.k8s.inventory import QUEUE_FINALIZER, TERMINATING
from gputask.k8s.writer import Fenced, Writer, now_rfc3339

log = logging.getLogger("gputask.queues")

QueueId = tuple[str | None, str]  # (namespace, name); namespace None for a GPUClusterQueue
TERMINATING_MESSAGE = "being deleted: admits nothing new; goes once its admitted tasks finish"
FLAVOR = "\x00flavor"  # the "namespace" of a GPUResourceFlavor's id (cluster-scoped; no namespace is named so)


class QueueUpkeep:
    """Writes queue statuses and finalizers for the loop; remembers only what it last wrote."""

    def __init__(self, controller: Controller, writer: Writer) -> None:
        self.controller = controller
        self.writer = writer
        self._reports: dict[QueueId, dict[str, Any]] = {}
        self._finalizer_writes: dict[QueueId, str] = {}  # queue -> resourceVersion its finalizers were patched at

    def reset(self) -> None:
        """Forget what was written (a rebuild writes every status again)."""
        self._reports.clear()

    async def keep_finalizers(self) -> None:
        """Every GPUClusterQueue, GPULocalQueue and GPUResourceFlavor carries :data:`QUEUE_FINALIZER`; one being
        deleted keeps it until none of its tasks (for a flavor: tasks admitted in it) is admitted (running
        or nominated), then it goes, as Kueue's resource-in-use finalizer."""
        lqs = self.controller.local_queues
        admitted: set[QueueId] = set()
        groups = self.controller.scheduler.ledger.tallies  # admitted tasks by queue, namespace, local queue, flavor
        for queue, namespace, local_queue, flavor in groups:
            admitted.add((None, queue))
            if lqs.serves(queue, namespace, local_queue) is not None:
                admitted.add((namespace, str(local_queue)))
            if flavor:
                admitted.add((FLAVOR, flavor))
        queues: list[tuple[Resource, QueueId, tuple[str, ...], str, bool]] = [
            (GPUCLUSTERQUEUES, (None, name), m.finalizers, m.resource_version, m.terminating)
            for name, m in sorted(self.controller.inventory.queue_meta.items())
        ]
        queues += [
            (GPULOCALQUEUES, (q.namespace, q.name), q.finalizers, q.resource_version, q.terminating)
            for _, q in sorted(self.controller.local_queues.queues.items())
        ]
        queues += [
            (GPURESOURCEFLAVORS, (FLAVOR, name), m.finalizers, m.resource_version, m.terminating)
            for name, m in sorted(self.controller.inventory.flavor_meta.items())
        ]
        for resource, qid, finalizers, version, terminating in queues:
            has = QUEUE_FINALIZER in finalizers
            if not terminating and not has:
                wanted = [*finalizers, QUEUE_FINALIZER]
            elif terminating and has and qid not in admitted:
                wanted = [f for f in finalizers if f != QUEUE_FINALIZER]
            else:
                continue
            if self._finalizer_writes.get(qid) == version:
                continue  # written for this version already: wait for the watch to show it
            patch = {"metadata": {"finalizers": wanted, "resourceVersion": version}}
            try:
                await self.writer.patch(resource, qid[1], patch, None if qid[0] == FLAVOR else qid[0])
            except Conflict:
                pass  # that version is stale: the watch brings the newer one, and the next pass tries it
            except ApiError as exc:
                if not isinstance(exc, (Fenced, NotFound)):
                    log.warning("finalizer patch of %s %s failed: %s", resource.plural, _name(qid), exc)
                continue  # tried again at the next loop pass (the cycle interval paces it)
            self._finalizer_writes[qid] = version

    async def report(self) -> None:
        """Patch each queue's status when its counts, usage or condition changed since the last write."""
        statuses: dict[QueueId, dict[str, Any]] = {(None, n): s for n, s in queue_statuses(self.controller).items()}
        statuses.update(local_queue_statuses(self.controller))
        for gone in set(self._reports) - set(statuses):  # deleted: a queue re-created by that name is written anew
            del self._reports[gone]
        for qid, status in statuses.items():
            seen = {**status, "conditions": [{**c, "lastTransitionTime": ""} for c in status["conditions"]]}
            if self._reports.get(qid) == seen:
                continue
            resource = GPUCLUSTERQUEUES if qid[0] is None else GPULOCALQUEUES
            try:
                await self.writer.patch(resource, qid[1], {"status": status}, qid[0], status=True)
            except NotFound:
                continue
            except ApiError as exc:
                if not isinstance(exc, Fenced):
                    log.warning("status patch of %s %s failed: %s", resource.plural, _name(qid), exc)
                continue
            self._reports[qid] = seen


def queue_statuses(controller: Controller) -> dict[str, dict[str, Any]]:
    """The ``status`` of every known GPUClusterQueue: counts, usage (quantities) and an Active condition."""
    out: dict[str, dict[str, Any]] = {}
    inventory = controller.inventory
    for name, report in controller.scheduler.queue_status().items():
        if (
            name not in controller.scheduler.quotas.specs
            and name not in inventory.queue_errors
            and not _terminating(controller, name)
        ):
            continue
        usage, borrowed = report["usage"], report["borrowed"]
        assert isinstance(usage, dict) and isinstance(borrowed, dict)
        out[name] = {
            "pendingTasks": report["pending"],
            "admittedTasks": report["admitted"],
            "conditions": [_queue_active(controller, name)],
            **_usage_status(controller.scheduler.quotas.specs.get(name), usage, borrowed),
        }
    for name, error in inventory.queue_errors.items():
        out.setdefault(name, {"conditions": [_active(error)]})
    for name, meta in inventory.queue_meta.items():  # being deleted with nothing admitted or pending: going
        if meta.terminating:
            active = _queue_active(controller, name)
            out.setdefault(name, {"pendingTasks": 0, "admittedTasks": 0, "conditions": [active]})
    return out


def _terminating(controller: Controller, name: str) -> bool:
    """GPUClusterQueue ``name`` is being deleted (its finalizer holds it while tasks it admitted run)."""
    meta = controller.inventory.queue_meta.get(name)
    return meta is not None and meta.terminating


def _queue_active(controller: Controller, name: str) -> dict[str, Any]:
    """A GPUClusterQueue's Active condition: False for an invalid spec, while stopped (Kueue's Stopped), or
    (Kueue's FlavorNotFound) while a flavor it lists does not exist, is invalid or is being deleted."""
    error = controller.inventory.queue_errors.get(name)
    if error is not None:
        return _active(error)
    if _terminating(controller, name):  # Kueue: Active False, reason Terminating
        return _active(TERMINATING_MESSAGE, "Terminating")
    spec, scheduler = controller.scheduler.quotas.specs.get(name), controller.scheduler
    if spec is not None and spec.stop_policy != "None":  # Kueue: Active False, reason Stopped
        return _active(f"stopPolicy {spec.stop_policy}: admits nothing new", "Stopped")
    missing = [f for f in spec.flavors if f not in scheduler.flavors] if spec is not None else []
    if not missing:
        return _active(None)
    why = "; ".join(f"GPUResourceFlavor {f} {scheduler.invalid_flavors.get(f, 'does not exist')}" for f in missing)
    return _active(why, "FlavorNotFound")


def _usage_status(spec: QueueSpec | None, usage: Mapping[str, int], borrowed: Mapping[str, int]) -> dict[str, Any]:
    """``usage`` (per resource, summed over flavors) and, for a queue with resourceGroups, ``flavorsUsage``
    (Kueue's per-flavor list) and ``flavorsSummary`` (GPUs used / nominal per flavor, for kubectl get)."""
    totals: dict[str, list[int]] = {}
    flavors: dict[str, dict[str, tuple[int, int]]] = {}
    for key, amount in usage.items():
        resource, flavor = split_key(key)
        total = totals.setdefault(resource, [0, 0])
        total[0] += amount
        total[1] += borrowed.get(key, 0)
        if flavor:
            flavors.setdefault(flavor, {})[resource] = (amount, borrowed.get(key, 0))
    out: dict[str, Any] = {"usage": [
        {"name": r, "total": _quantity(r, t[0]), "borrowed": _quantity(r, t[1])} for r, t in sorted(totals.items())
    ]}
    if spec is not None and spec.flavors:
        order = list(spec.flavors) + sorted(set(flavors) - set(spec.flavors))
        out["flavorsUsage"] = [
            {"name": f, "resources": [{"name": r, "total": _quantity(r, u), "borrowed": _quantity(r, b)}
                                      for r, (u, b) in sorted(flavors.get(f, {}).items())]}
            for f in order
        ]
        out["flavorsSummary"] = ", ".join(
            f"{f} {_gpus(flavors.get(f, {}).get(GPU, (0, 0))[0])}/"
            + (_gpus(spec.quotas[flavored(GPU, f)].nominal) if flavored(GPU, f) in spec.quotas else "-")
            for f in order
        )
    return out


def _gpus(milli: int) -> str:
    """Milli-GPU as kubectl would print the quantity: ``2`` or ``1500m``."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def local_queue_statuses(controller: Controller) -> dict[QueueId, dict[str, Any]]:
    """The ``status`` of every GPULocalQueue: its tasks pending and admitted, the quota they use of its
    GPUClusterQueue (quantities) and an Active condition (False while its GPUClusterQueue cannot admit).

    Counts from the core's tallies of pending and admitted tasks by queue, namespace and local queue: O(those
    groups), not O(tasks); nothing when no GPULocalQueue exists.
    """
    index = controller.local_queues
    lqs = index.queues
    if not lqs:
        return {}
    pending: dict[tuple[str, str], int] = {}
    for (queue, namespace, local_queue), count in controller.scheduler.pending.count_by_group().items():
        if index.serves(queue, namespace, local_queue) is not None:
            where = (namespace, str(local_queue))
            pending[where] = pending.get(where, 0) + count
    for where, lq in lqs.items():  # tasks it keeps waiting outside the queues: only while deleted or invalid
        if not lq.terminating and lq.error is None:
            continue  # (a scan of every task that ever named it, on every pass, would be O(tasks))
        for key in index.asking(where[1], where[0]):
            record = controller.tasks.get(key)
            if record is not None and record.blocked is not None and record.blocked[0] == Reason.QUEUE_INACTIVE:
                pending[where] = pending.get(where, 0) + 1
    admitted: dict[tuple[str, str], int] = {}
    usage: dict[tuple[str, str], dict[str, int]] = {}
    for (queue, namespace, local_queue, _), tally in controller.scheduler.ledger.tallies.items():
        if index.serves(queue, namespace, local_queue) is not None:
            where = (namespace, str(local_queue))
            admitted[where] = admitted.get(where, 0) + tally.running + tally.nominated
            used = usage.setdefault(where, {GPU: 0, GPU_MEMORY: 0})
            for key, amount in tally.usage.items():
                resource = split_key(key)[0]
                used[resource] = used.get(resource, 0) + amount
    queues = controller.scheduler.quotas.specs
    out: dict[QueueId, dict[str, Any]] = {}
    for where, lq in sorted(lqs.items()):
        reason, error = "", None
        if lq.error is not None:
            reason, error = "InvalidSpec", lq.error
        elif lq.terminating:
            reason, error = "Terminating", TERMINATING_MESSAGE
        elif lq.cluster_queue not in queues:  # Kueue's reason: ClusterQueueIsInactive
            why = controller.inventory.queue_errors.get(str(lq.cluster_queue))
            if why is None and _terminating(controller, str(lq.cluster_queue)):
                why = TERMINATING
            reason = "ClusterQueueIsInactive"
            error = f"GPUClusterQueue {lq.cluster_queue!r} " + (f"is inactive: {why}" if why else "does not exist")
        elif (target := _queue_active(controller, str(lq.cluster_queue)))["status"] == "False":
            reason = "ClusterQueueIsInactive"
            error = f"GPUClusterQueue {lq.cluster_queue!r} cannot admit: {target['message']}"
        used = usage.get(where, {GPU: 0, GPU_MEMORY: 0})
        out[where] = {
            "pendingTasks": pending.get(where, 0),
            "admittedTasks": admitted.get(where, 0),
            "usage": [{"name": r, "total": _quantity(r, used.get(r, 0))} for r in sorted(used)],
            "conditions": [_active(error, reason)],
        }
    return out


def _active(error: str | None, reason: str = "InvalidSpec") -> dict[str, Any]:
    return {
        "type": "Active",
        "status": "True" if error is None else "False",
        "reason": "Ready" if error is None else reason,
        "message": "Can admit new tasks" if error is None else error,
        "lastTransitionTime": now_rfc3339(),
    }


def _quantity(resource: str, amount: int) -> str:
    """A quota amount as a Kubernetes quantity: milli-GPU as ``1500m``, MiB as ``16384Mi``."""
    return f"{amount}m" if resource == GPU else f"{amount}Mi"


def _name(qid: QueueId) -> str:
    return qid[1] if qid[0] is None else f"{qid[0]}/{qid[1]}"

__all__ = ["QueueUpkeep", "local_queue_statuses", "queue_statuses"]
