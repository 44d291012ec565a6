"""The API writes a gang needs beyond its lead Job (:mod:`gputask.k8s.gangjobs`): its headless Service and the
Jobs of its other PodSets, sent before the lead Job, and the patches that pin its pods one by one.

The executor creates the lead Job as any task's Job (created, adopted after a 409, or kept "creating" while its
answer is lost); :meth:`GangWrites.prepare` first creates the Service (a 409 means it is there: the same for every
attempt) and the other PodSets' Jobs through the workload's ``start``, as the lead's (a 409: the same name, this
attempt's). A refusal of any of them, or of the
lead Job, stops the Jobs already sent (:meth:`abandon`) and gives the task back for a backoff (``JobRejected``);
while they exist their GPUs are held as any departing Job's. Pod pins (:func:`~gputask.k8s.gangjobs.pin_patch`) the
controller queued are sent by :meth:`pin`: a conflict or a pod gone drops the pin (a newer pod event queues it
again while the pod is still gated), any other failure keeps it for the next loop. Every write goes through the
:class:`~gputask.k8s.writer.Writer`; no scheduling state is changed here (outcomes are applied through the
executor's ``apply``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from gputask.k8s import outcomes
from gputask.k8s.client import AlreadyExists, ApiError, Conflict, Fenced, NotFound
from gputask.k8s.jobrecords import JobRecord, job_record
from gputask.k8s.outcomes import Outcome, Rejected, Step, Stop
from gputask.k8s.records import TaskRecord
from gputask.k8s.resources import PODS, SERVICES, doubling_backoff_s
from gputask.k8s.workload import Workload
from gputask.k8s.writer import Writer

BACKOFF_BASE_S = 10.0  # a refused pin's first wait, doubling (the executor's Job backoff)
BACKOFF_MAX_S = 300.0

log = logging.getLogger("gputask.gangs")

ABANDONED = "GangAbandoned"  # why the Jobs of a gang whose admission was refused are stopped


class GangWrites:
    """A gang's Service and other Jobs, and its pods' pins; keeps only the Jobs sent per task (to stop them if the
    admission fails) and the pins still to send."""

    def __init__(self, writer: Writer, apply: Callable[[Outcome], Awaitable[None]],
                 carry_out: Callable[[Iterable[Step]], Awaitable[None]]) -> None:
        self.writer = writer
        self._apply = apply  # the executor's: an outcome applied under the gate, its steps carried out
        self._carry_out = carry_out
        self.sent: dict[str, tuple[Workload, list[JobRecord]]] = {}  # task key -> the other Jobs of its admission
        self.unpinned: dict[str, tuple[str, str, dict[str, Any]]] = {}  # pod key -> (namespace, name, patch) to retry
        self.refused: dict[str, tuple[int, float]] = {}  # pod key -> (pins refused in a row, monotonic time to retry)

    async def prepare(self, record: TaskRecord, workload: Workload, service: Mapping[str, Any] | None,
                      others: Sequence[Mapping[str, Any]], attempt: int) -> bool:
        """Create the gang's Service and the Jobs of its PodSets after the first; True when all exist. Otherwise the
        admission is given back (Rejected, or Fenced when not leading), the Jobs sent so far stopped, and False."""
        sent: list[JobRecord] = []
        self.sent[record.key] = (workload, sent)
        what = ""
        try:
            if service is not None:
                what = f"Service {service['metadata']['name']}"
                with contextlib.suppress(AlreadyExists):  # the Service of every attempt
                    await self.writer.create(SERVICES, service, record.namespace)
            for job in others:
                what = f"Job {job['metadata']['name']}"
                made = job_record(job)
                if made is not None:
                    sent.append(made)  # sent: it may exist even when the answer is lost
                with contextlib.suppress(AlreadyExists):  # this attempt's, sent before (its name has the attempt)
                    await workload.start(self.writer, job, record.namespace)  # as the lead Job is
        except Fenced:
            await self.abandon(record)
            await self._apply(outcomes.Fenced(record))
            return False
        except ApiError as exc:
            await self.abandon(record)
            await self._apply(Rejected(record, f"the API server refused {what} of the gang (attempt {attempt}): "
                                               f"{exc.status} {exc.reason}: {exc.message}"))
            return False
        return True

    def sent_whole(self, record: TaskRecord) -> None:
        """The lead Job exists: the gang's other Jobs are its task's now (stopped with it)."""
        self.sent.pop(record.key, None)

    async def abandon(self, record: TaskRecord, lead: Mapping[str, Any] | None = None) -> None:
        """The gang's admission failed: stop the other Jobs sent for it (each until it is gone)."""
        workload, sent = self.sent.pop(record.key, (None, []))
        if workload is not None and sent:
            await self._carry_out([Stop(job, workload, ABANDONED) for job in sent])

    async def pin(self, pins: Mapping[str, tuple[str, str, dict[str, Any]]]) -> None:
        """Send the pod pins queued by the controller and those still owed; see the module docstring."""
        self.unpinned.update(pins)
        now = time.monotonic()
        for key, (namespace, name, patch) in list(self.unpinned.items()):
            failures, retry_at = self.refused.get(key, (0, 0.0))
            if retry_at > now and key not in pins:
                continue  # refused before: tried again after the operator's doubling backoff, not every pass
            try:
                await self.writer.patch(PODS, name, patch, namespace)
            except (Conflict, NotFound, Fenced):
                pass  # read again (a newer event pins it), gone, or not leading
            except ApiError as exc:
                delay = doubling_backoff_s(failures + 1, BACKOFF_BASE_S, BACKOFF_MAX_S)
                self.refused[key] = (failures + 1, now + delay)
                log.warning("pinning pod %s failed (%s); tried again in %.0f s", key, exc, delay)
                continue
            self.unpinned.pop(key, None)
            self.refused.pop(key, None)

    def reset(self) -> None:
        """Forget what is owed (a rebuild finds gated pods again)."""
        self.sent.clear()
        self.unpinned.clear()
        self.refused.clear()


__all__ = ["ABANDONED", "GangWrites"]
