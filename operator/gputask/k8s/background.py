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

STOP_TIMEOUT_S = 10.0
"""How long :meth:`Background.stop` waits for a cancelled step to end."""


def _stack(task: asyncio.Task[None]) -> list[str]:
    import io

    out = io.StringIO()
    task.print_stack(file=out)
    return [out.getvalue()]


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

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the task and wait for it, at most ``timeout_s``: a step that does not end when cancelled is logged
        with its stack and left behind, so stepping down (and shutting down) cannot hang on it."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
            if not done:
                self._log.error("%s did not stop within %gs of being cancelled; left running:\n%s", self.name,
                                timeout_s, "".join(_stack(task)))
            elif not task.cancelled() and task.exception() is not None:
                self._log.error("%s ended with %r", self.name, task.exception())

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
