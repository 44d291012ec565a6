"""The scheduling loop: wake on change (or every ``cycleInterval``), run a cycle, apply decisions.

Runs as one asyncio task beside kopf's watchers. Handlers call :meth:`SchedulingLoop.wake`;
the loop never runs before :meth:`SchedulingLoop.start` is given a rebuilt controller, so a
restarted operator never admits before it knows what is already running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gputask.core import Pending
from gputask.k8s.controller import Controller
from gputask.k8s.executor import Executor

log = logging.getLogger("gputask.loop")


class SchedulingLoop:
    """Owns the cycle task; one per operator instance."""

    def __init__(self, controller: Controller, executor: Executor) -> None:
        self.controller = controller
        self.executor = executor
        self.cycles = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running = asyncio.Lock()

    def wake(self) -> None:
        """Ask for a cycle soon (cheap; many wakes coalesce into one cycle)."""
        self._wake.set()

    def start(self) -> None:
        """Start the loop task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="gputask-scheduling-loop")

    async def stop(self) -> None:
        """Stop the loop task and wait for it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

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

    async def _run(self) -> None:
        interval = self.controller.config.cycle_interval_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)
            self._wake.clear()
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop scheduling for everyone: log and go on
                log.exception("scheduling cycle failed")
