"""The executor's pinning: the configured mode, what the cluster offers for it, and the DRA objects of Jobs.

- :meth:`Pinner.check` probes the API (:mod:`gputask.k8s.capabilities`), sets the ``resource.k8s.io`` version DRA
  objects are written in, the gauge ``gputask_pinning_mode_supported{mode}``, and (announced at start) logs one line
  (at error when the configured mode cannot work) and posts one Event on the operator's own Pod.
- :meth:`Pinner.refusal` says why an admission cannot be pinned now (reason ``PinningUnavailable``): the configured
  mode cannot work, or (dra) cannot be checked, so the version to write DRA objects in is unknown, or a MIG device
  needs a DeviceClass that does not exist. What the cluster offers is looked at again at an admission once the last
  look is older than :data:`RECHECK_S`, whatever it found: a driver installed later is found at a task's next retry,
  and a RuntimeClass or DeviceClass deleted since stops admissions before pods are made that cannot start.
- In ``dra`` mode :meth:`Pinner.prepare` creates what a Job needs before the Job (:mod:`gputask.k8s.dra`), a deleted
  Job's ResourceClaimTemplate goes with it (:meth:`job_deleted`), and :meth:`collect` deletes each shared
  ResourceClaim no placed task uses any more. :meth:`rebuild` (a new leader) finds the shared claims that exist and
  deletes templates whose Job is gone. Every write goes through the :class:`~gputask.k8s.writer.Writer` (fenced).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gputask.config import Config
from gputask.core import GpuRequest, Placement
from gputask.core.cluster import Reservation
from gputask.k8s import dra
from gputask.k8s.capabilities import Capabilities, missing_for, probe, summary, verdict
from gputask.k8s.client import (
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    AlreadyExists,
    ApiError,
    Fenced,
    NotFound,
    Resource,
    at_version,
)
from gputask.k8s.pinning import MODES, Pinning
from gputask.k8s.writer import Writer
from gputask.metrics import OperatorMetrics

log = logging.getLogger("gputask.pinning")

PINNING_UNAVAILABLE = "PinningUnavailable"
RECHECK_S = 30.0
"""What the cluster offers is looked at again, at an admission, once the last look is older than this (seconds)."""


class Pinner:
    """Pinning state of one operator instance (see the module docstring)."""

    def __init__(self, config: Config, writer: Writer, metrics: OperatorMetrics) -> None:
        self.writer = writer
        self.metrics = metrics
        self.pinning = Pinning(config.pinning, config.job_runtime_class_name)
        self.caps: Capabilities | None = None
        self.ok: bool | None = None  # the configured mode's verdict at the last check
        self.checked_at = float("-inf")
        self.shared: set[str] = set()  # namespace/name of the shared ResourceClaims that exist
        self._collected_at: object = None  # the ledger version the last collection saw

    def _resource(self, res: Resource) -> Resource:
        return at_version(res, self.pinning.dra_version)

    # -- what the cluster offers -----------------------------------------------------------------
    async def check(self, involved: Mapping[str, Any] | None = None, *, announce: bool = True) -> bool | None:
        """Probe the API and set the DRA version and the gauges; with ``announce``, log the verdict and post it as an
        Event on ``involved`` (the operator's Pod; no Event when None). Returns the configured mode's verdict."""
        caps = await probe(self.writer.client)
        self.caps, self.checked_at = caps, time.monotonic()
        if caps.dra_version is not None:
            self.pinning = Pinning(self.pinning.mode, self.pinning.runtime_class, caps.dra_version)
        for mode in MODES:
            ok, _ = verdict(caps, mode, self.pinning.runtime_class)
            if ok is None:
                with contextlib.suppress(KeyError):  # not exported: nothing to take back
                    self.metrics.pinning_supported.remove(mode)
            else:
                self.metrics.pinning_supported.labels(mode).set(1 if ok else 0)
        self.ok, line = summary(caps, self.pinning.mode, self.pinning.runtime_class)
        if caps.unreadable:
            line += f"; could not read {', '.join(caps.unreadable)}"
        if announce:
            log.log(logging.ERROR if self.ok is False else logging.INFO, "%s", line)
            if involved is not None:
                etype, reason = ("Warning", "PinningUnsupported") if self.ok is False else ("Normal", "PinningChecked")
                await self.writer.event(involved, etype, reason, line)
        return self.ok

    async def refusal(self, placement: Placement) -> str | None:
        """Why ``placement`` cannot be pinned now, or None (see the module docstring)."""
        if self.caps is not None and time.monotonic() - self.checked_at >= RECHECK_S:
            before = self.ok
            await self.check(announce=False)
            if self.ok != before:
                word = {True: "can work now", False: "CANNOT WORK now", None: "cannot be checked now"}[self.ok]
                log.log(logging.ERROR if self.ok is False else logging.INFO, "GPU pinning %r %s", self.pinning.mode,
                        word)
        caps = self.caps
        if caps is None:
            return None
        _, why = verdict(caps, self.pinning.mode, self.pinning.runtime_class)
        if self.ok is False:
            return f"GPU pinning {self.pinning.mode!r} cannot work in this cluster: {why}"
        if self.ok is None and self.pinning.mode == "dra":  # the version to write claims in is not known
            unread = ", ".join(caps.unreadable)
            return f"GPU pinning 'dra' cannot be checked: {why} ({unread}); looked at again at the next retry"
        return missing_for(caps, self.pinning.mode, [g.uuid for pod in placement.pods for g in pod.gpus])

    # -- DRA objects ------------------------------------------------------------------------------
    async def prepare(
        self, task_obj: Mapping[str, Any], job_name: str, request: GpuRequest, placement: Placement
    ) -> str | None:
        """Create the DRA objects a Job needs before it is created (dra mode; nothing otherwise); None when they
        exist, else why not (the API's refusal, or a shared claim still being deleted). Raises Fenced."""
        if self.pinning.mode != "dra":
            return None
        for body in dra.objects_for(task_obj, job_name, request, placement, self.pinning.dra_version):
            meta = body["metadata"]
            res = self._resource(RESOURCECLAIMTEMPLATES if body["kind"] == "ResourceClaimTemplate" else RESOURCECLAIMS)
            try:
                await self.writer.create(res, body, meta["namespace"])
            except AlreadyExists:
                problem = await self._existing(res, body)
                if problem:
                    return problem
            except Fenced:
                raise
            except ApiError as exc:
                return f"the API server refused {body['kind']} {meta['name']}: {exc.status} {exc.reason}: {exc.message}"
            if body["kind"] == "ResourceClaim":
                self.shared.add(f"{meta['namespace']}/{meta['name']}")
        return None

    async def _existing(self, res: Resource, body: Mapping[str, Any]) -> str | None:
        """A claim or template of that name exists: fine unless it is being deleted (then wait for it to go)."""
        meta = body["metadata"]
        try:
            found = await self.writer.client.get(res, meta["name"], meta["namespace"])
        except ApiError:
            return None  # gone meanwhile, or unreadable: the Job's pod will say what is wrong
        if (found.get("metadata") or {}).get("deletionTimestamp"):
            return f"{body['kind']} {meta['name']} is being deleted; it is created again once it is gone"
        if body["kind"] == "ResourceClaim":
            self.shared.add(f"{meta['namespace']}/{meta['name']}")
        return None

    async def job_deleted(self, namespace: str, job_name: str) -> None:
        """A Job was deleted: delete its ResourceClaimTemplate too (dra mode; a failure is left to the next
        rebuild, the template holds no device)."""
        if self.pinning.mode != "dra":
            return
        try:
            await self.writer.delete(self._resource(RESOURCECLAIMTEMPLATES), dra.template_name(job_name), namespace)
        except ApiError as exc:
            if not isinstance(exc, (NotFound, Fenced)):  # not leading: the next leader's rebuild deletes it
                log.warning("deleting ResourceClaimTemplate %s/%s failed: %s", namespace, job_name, exc)

    async def collect(self, reservations: Mapping[Any, Reservation], version: object) -> None:
        """Delete the shared ResourceClaims no reservation (running, nominated or held) uses; looked at only when the
        ledger changed (``version``) or a deletion is still owed."""
        if self.pinning.mode != "dra" or (version == self._collected_at and not self._owed(reservations)):
            return
        self._collected_at = version
        for key in sorted(self._owed(reservations)):
            namespace, name = key.split("/", 1)
            try:
                await self.writer.delete(self._resource(RESOURCECLAIMS), name, namespace)
            except NotFound:
                pass
            except Fenced:
                return  # not leading any more: the next leader lists the claims and collects them
            except ApiError as exc:
                log.warning("deleting shared ResourceClaim %s failed (%s); tried again later", key, exc)
                continue
            self.shared.discard(key)

    def _owed(self, reservations: Mapping[Any, Reservation]) -> set[str]:
        used = dra.used_shared_claims(
            [(r.task.namespace, pod.request, placed) for r in reservations.values()
             for pod, placed in zip(r.task.pods, r.placement.pods, strict=True) if not pod.request.exclusive]
        )
        return self.shared - used

    async def rebuild(self, jobs: Iterable[str]) -> None:
        """After a rebuild (dra mode): learn the shared claims that exist, delete the templates of Jobs that do not
        (``jobs``: namespace/name of the Jobs that exist). Listing failures are logged; nothing is deleted then."""
        if self.pinning.mode != "dra":
            return
        live = set(jobs)
        try:
            claims = await self.writer.client.list(self._resource(RESOURCECLAIMS), labels=dra.SHARED_LABEL)
            templates = await self.writer.client.list(
                self._resource(RESOURCECLAIMTEMPLATES), labels=f"{dra.MANAGED_BY[0]}={dra.MANAGED_BY[1]}"
            )
        except ApiError as exc:
            log.warning("listing gputask's ResourceClaims and ResourceClaimTemplates failed: %s", exc)
            return
        self.shared = {f"{c['metadata'].get('namespace')}/{c['metadata']['name']}" for c in claims}
        self._collected_at = None
        for template in templates:
            meta = template["metadata"]
            if f"{meta.get('namespace')}/{meta['name']}" not in live:
                await self.job_deleted(str(meta.get("namespace")), str(meta["name"]))

