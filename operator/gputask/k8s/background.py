"""A background task that runs a step when woken, or at least every interval.

Shared by the scheduling loop and the Kueue support: start/stop are idempotent, many wakes
coalesce into one step, and an exception in a step is logged, never fatal (a bug must not stop
the operator for everyone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Background:
    """Run ``step()`` after each :meth:`wake` (coalesced) or every ``interval_s()`` seconds."""

    def __init__(self, name: str, step: Callable[[], Awaitable[object]], interval_s: Callable[[], float]) -> None:
        self.name = name
        self._step, self._interval_s = step, interval_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._log = logging.getLogger(f"gputask.{name}")

    def wake(self) -> None:
        """Ask for a step soon."""
        self._wake.set()

    def start(self) -> None:
        """Start the task (idempotent) and ask for a first step."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"gputask-{self.name}")
        self.wake()

    async def stop(self) -> None:
        """Stop the task and wait for it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval_s())
            self._wake.clear()
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._log.exception("%s step failed", self.name)
