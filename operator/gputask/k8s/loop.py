"""The scheduling loop: wake on change (or every ``cycleInterval``), run a cycle, apply decisions.

Runs as one asyncio task beside the informers. Their feeds call :meth:`SchedulingLoop.wake`;
the loop never runs before :meth:`SchedulingLoop.start` is given a rebuilt controller, so a
restarted operator never admits before it knows what is already running.

The cycle itself runs on a worker thread while the loop holds the core gate (an asyncio lock
every handler takes around its synchronous feeding of the controller), so watches and the
Lease renewal go on during a long cycle, and nothing touches the core while the thread does. The executor's API
calls run with the gate released; what their answers change in the core and the records is applied under it
(:class:`~gputask.k8s.outcomes.Outcomes`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from gputask.core import Pending
from gputask.k8s.background import Background
from gputask.k8s.controller import Controller
from gputask.k8s.evictions import DefragMoves
from gputask.k8s.executor import Executor

log = logging.getLogger("gputask.loop")

METRICS_EVERY_S = 1.0
"""The waiting gauges and the fragmentation ratio (it reads every GPU) are set at most this often; the others
after every pass."""


class SchedulingLoop:
    """Owns the cycle task; one per operator instance."""

    def __init__(self, controller: Controller, executor: Executor, gate: asyncio.Lock | None = None) -> None:
        self.controller = controller
        self.executor = executor
        self.gate = gate or executor.gate  # the executor applies its outcomes under the same gate
        self.cycles = 0
        self._metrics_at = float("-inf")
        self._running = asyncio.Lock()
        self.defrag_moves = DefragMoves(executor)  # proposed defragmentation plans, through the Eviction API
        self._background = Background("scheduling-loop", self.run_once, lambda: self.controller.config.cycle_interval_s)

    def wake(self) -> None:
        """Ask for a cycle soon (cheap; many wakes coalesce into one cycle)."""
        self._background.wake()

    def start(self) -> None:
        """Start the loop task (idempotent)."""
        self._background.start()

    async def stop(self) -> None:
        """Stop the loop task and wait for it."""
        await self._background.stop()

    async def run_once(self) -> int:
        """Publish what handlers queued, run one cycle, apply its decisions; returns how many it made."""
        async with self._running:
            controller, executor = self.controller, self.executor
            now = time.time()
            async with self.gate:
                controller.inventory.check_heartbeats(now)
                reports = controller.take_reports()
                pins = controller.pods.take_pins()
            await executor.publish(reports)
            await executor.gangs.pin(pins)  # a gang's gated pods, pinned to their nodes and GPUs
            overdue = controller.overdue(now)
            if overdue:
                await executor.pods_not_starting(overdue)  # evictions the next lines' cycle emits
            async with self.gate:
                started = time.perf_counter()
                decisions = await asyncio.to_thread(controller.scheduler.cycle, now)
                executor.metrics.cycle.observe(time.perf_counter() - started)
            self.cycles += 1
            if decisions:
                await executor.apply(decisions)
                if any(not isinstance(d, Pending) for d in decisions):
                    self.wake()  # evictions requeue work and free capacity: look again soon
            if await self.defrag_moves.run():
                self.wake()  # a plan applied (its moves to admit) or refused (another plan to try)
            await executor.publish(controller.take_reports())
            await executor.retry_deletions()
            await executor.confirm_creates()
            await executor.relabel.settle()
            await executor.collect_claims()
            await executor.transitions.retry()
            await executor.keep_queue_finalizers()
            await executor.report_queues()
            await executor.report_gpunodes()
            waiting = time.monotonic() - self._metrics_at >= METRICS_EVERY_S  # the fragmentation reads every GPU
            if waiting:
                self._metrics_at = time.monotonic()
            executor.metrics.refresh(controller.scheduler, waiting=waiting)
            executor.metrics.refresh_budgets(controller.over_budget, controller.scheduler)
            return len(decisions)
