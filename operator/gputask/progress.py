"""How far a long command has got, on stderr: a rich progress bar on a terminal, a plain line every
``every_s`` seconds otherwise (CI logs, pipes), nothing with ``quiet``. stdout keeps only the result,
so ``--output json`` stays parseable.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

PLAIN_EVERY_S = 15.0
"""Seconds between two plain progress lines (and one at the end)."""


class Progress:
    """A counter of ``total`` units (runs, simulated seconds, ...) named ``label``; a context manager.

    ``update(done)`` sets the count, ``advance(n)`` adds to it; both are cheap enough to call per item
    (the display refreshes at most 10 times a second, plain lines every ``every_s`` seconds).
    ``unit`` names what is counted in plain lines (``runs``, ``simulated s``).
    """

    def __init__(
        self,
        label: str,
        total: float,
        *,
        unit: str = "",
        quiet: bool = False,
        stream: TextIO | None = None,
        every_s: float = PLAIN_EVERY_S,
        terminal: bool | None = None,
    ) -> None:
        self.label, self.total, self.unit, self.quiet = label, max(total, 0.0), unit, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.every_s = every_s
        self.done = 0.0
        self._started = self._last_line = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        self._started = self._last_line = time.monotonic()
        if not self.quiet and self.terminal:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            columns = (TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bar = Bar(*columns, console=Console(file=self.stream), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, trace)
            self._bar = None
        elif not self.quiet and kind is None:
            self._line()

    def advance(self, amount: float = 1.0) -> None:
        """Count ``amount`` more units done."""
        self.update(self.done + amount)

    def update(self, done: float) -> None:
        """Set the units done so far (clipped to ``total``)."""
        self.done = min(done, self.total) if self.total else done
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
            return
        if time.monotonic() - self._last_line >= self.every_s:
            self._line()

    def _line(self) -> None:
        self._last_line = now = time.monotonic()
        share = f" ({100.0 * self.done / self.total:.0f}%)" if self.total else ""
        unit = f" {self.unit}" if self.unit else ""
        print(f"{self.label}: {self.done:g}/{self.total:g}{unit}{share}, {now - self._started:.0f} s",
              file=self.stream, flush=True)
