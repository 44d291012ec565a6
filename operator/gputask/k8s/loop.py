"""The scheduling loop: wake on change (or every ``cycleInterval``), run a cycle, apply decisions.

Runs as one asyncio task beside kopf's watchers. Handlers call :meth:`SchedulingLoop.wake`;
the loop never runs before :meth:`SchedulingLoop.start` is given a rebuilt controller, so a
restarted operator never admits before it knows what is already running.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gputask.core import Pending
from gputask.k8s.background import Background
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor

log = logging.getLogger("gputask.loop")


class SchedulingLoop:
    """Owns the cycle task; one per operator instance."""

    def __init__(self, controller: Controller, executor: Executor) -> None:
        self.controller = controller
        self.executor = executor
        self.cycles = 0
        self._running = asyncio.Lock()
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
        """Run one cycle and apply its decisions; returns how many decisions it made."""
        async with self._running:
            now = time.time()
            self.controller.inventory.check_heartbeats(now)
            started = time.perf_counter()
            decisions = self.controller.scheduler.cycle(now)
            self.executor.metrics.cycle.observe(time.perf_counter() - started)
            self.cycles += 1
            if decisions:
                await self.executor.apply(decisions)
                if any(not isinstance(d, Pending) for d in decisions):
                    self.wake()  # evictions requeue work and free capacity: look again soon
            await self.executor.report_queues()
            self.executor.metrics.refresh(self.controller.scheduler)
            return len(decisions)
