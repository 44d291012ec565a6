"""Defragmentation moves through the Eviction API, so that no PodDisruptionBudget is ever broken (issue 32).

The core proposes an Enabled plan instead of applying it (:attr:`~gputask.core.defrag.DefragConfig.ask_budgets`).
For each proposal, :class:`DefragMoves`:

1. lists the running pods of every moved task's Job;
2. asks a dry-run eviction (policy/v1 Eviction, ``deleteOptions.dryRun: [All]``) of every one of them: the API
   server makes every check, the budget's included, and deletes nothing. A 429 (TooManyRequests: a
   PodDisruptionBudget refuses) ends there: nothing of the plan is done, the core is told
   (:meth:`~gputask.core.defrag.Defragmenter.refused`: the plan cancelled, counted in
   ``gputask_defrag_plans_refused_by_budget_total``, the refused task left out of plans for a while, so the next
   cycle tries another plan or the waiting task waits) and a Warning Event on the waiting task names the budget;
3. then evicts every one of them for real, in the same order;
4. then, under the core gate, has the core apply the plan (:meth:`~gputask.core.scheduler.Scheduler.defrag_approved`:
   each moved task evicted with reason ``Defragmented``, its Event naming the task it made room for, and
   re-admitted to its reserved placement), and the executor carries the decisions out.

Asking every pod of the plan dry-run first means a budget that refuses the second task's move never leaves the
first one moved for nothing. Only a budget that changes between the dry run and the real eviction (a pod of its set
turning unready in that instant) can refuse a real one: the plan is then refused as in 2, and the pods already
evicted are restarted by their Jobs where they ran (the budget still holds: the API server refused the one that
would break it). In mode DryRun the plans are only reported: a Normal Event ``DefragmentationPlanned`` on the
waiting task, nothing evicted. Every write goes through the :class:`~gputask.k8s.writer.Writer`; the core is
changed under the gate only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from gputask.core import TaskKey
from gputask.core.defrag import DefragPlan
from gputask.k8s.client import PODS, ApiError, NotFound

if TYPE_CHECKING:
    from gputask.k8s.executor import Executor

log = logging.getLogger("gputask.evictions")

PLANNED = "DefragmentationPlanned"
REFUSED = "DefragmentationRefused"
JOB_NAME_LABEL = "job-name"  # set by the Job controller on every pod of a Job (and batch.kubernetes.io/job-name)


class Refused(Exception):
    """A PodDisruptionBudget refused the eviction of a pod of ``task``: ``why`` names the budget."""

    def __init__(self, task: TaskKey, why: str) -> None:
        super().__init__(why)
        self.task, self.why = task, why


def refusal_text(exc: ApiError, pod: str) -> str:
    """What a 429 on pod ``pod``'s eviction says: the API server's DisruptionBudget cause (``The disruption budget
    NAME needs N healthy pods and has M currently``), else its message."""
    said = [str(c.get("message") or "") for c in exc.causes if c.get("reason") == "DisruptionBudget"]
    return f"eviction of pod {pod}: {'; '.join(m for m in said if m) or exc.message or exc.reason}"


class DefragMoves:
    """Asks the budgets for the core's proposed plans and reports the DryRun ones (module doc)."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.controller = executor.controller
        self.gate: asyncio.Lock = executor.gate

    async def run(self) -> bool:
        """Report the DryRun plans and carry out the proposed ones; True when a plan was applied (or refused: the
        next cycle plans again)."""
        scheduler = self.controller.scheduler
        async with self.gate:
            proposals = scheduler.defrag.take_proposals()
            dry_runs = scheduler.defrag.take_dry_runs()
        for plan in dry_runs:
            await self._note(plan, "Normal", PLANNED, f"would move {plan.describe()} to place it on "
                             f"{', '.join(plan.placement.nodes)} (defragmentation mode DryRun: nothing moved)")
        acted = False
        for plan in proposals:
            acted = await self.carry_out(plan) or acted
        return acted

    async def carry_out(self, plan: DefragPlan) -> bool:
        """Evict the pods of every task ``plan`` moves (all dry-run first, then for real), then apply the plan in
        the core and carry its decisions out. True when it was applied or refused; False when an API error (or a
        lost leadership) cancelled it: the next cycle plans again."""
        scheduler = self.controller.scheduler
        try:
            pods = [(m.task.key, ns, name) for m in plan.moves for ns, name in await self._pods(m.task.key)]
            for dry_run in (True, False):
                for key, namespace, name in pods:
                    await self._evict(key, namespace, name, dry_run)
        except Refused as refused:
            async with self.gate:
                scheduler.defrag_refused(plan, refused.task, refused.why, time.time())
            log.info("defragmentation for %s refused by a disruption budget: %s", plan.task.key, refused.why)
            await self._note(plan, "Warning", REFUSED, f"the move of {refused.task} was refused by a "
                             f"PodDisruptionBudget ({refused.why}): nothing moved; another plan is tried, or it waits")
            return True
        except ApiError as exc:
            async with self.gate:
                scheduler.defrag.cancel(plan)
            log.warning("defragmentation for %s cancelled: %s", plan.task.key, exc)
            return False
        async with self.gate:
            decisions = scheduler.defrag_approved(plan, time.time())
        if decisions:
            await self.executor.apply(decisions)
        return True

    async def _pods(self, key: TaskKey) -> list[tuple[str, str]]:
        """(namespace, name) of the running pods of task ``key``'s Job: neither finished nor being deleted."""
        record = self.controller.tasks.get(key)
        if record is None or not record.job_name:
            return []
        namespace = key.split("/", 1)[0]
        found = await self.executor.writer.client.list(PODS, namespace, labels=f"{JOB_NAME_LABEL}={record.job_name}")
        return sorted((namespace, str(p["metadata"]["name"])) for p in found
                      if not p["metadata"].get("deletionTimestamp")
                      and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))

    async def _evict(self, key: TaskKey, namespace: str, name: str, dry_run: bool) -> None:
        try:
            await self.executor.writer.evict(name, namespace, dry_run=dry_run)
        except NotFound:
            return  # gone already: nothing to disrupt
        except ApiError as exc:
            if exc.status == 429:
                raise Refused(key, refusal_text(exc, name)) from exc
            raise

    async def _note(self, plan: DefragPlan, etype: str, reason: str, message: str) -> None:
        record = self.controller.tasks.get(plan.task.key)
        if record is not None:
            await self.executor.transitions.note(record, etype, reason, message)
