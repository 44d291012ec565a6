"""Progress of long commands: plain lines off a terminal, nothing with --quiet, stdout left to the result."""

from __future__ import annotations

import io
import json
import re

from typer.testing import CliRunner

from gputask.cli import app
from gputask.progress import Progress


def test_plain_lines_off_a_terminal_and_none_when_quiet() -> None:
    stream = io.StringIO()
    with Progress("replaying", 4, unit="runs", stream=stream, every_s=0.0) as progress:
        for _ in range(4):
            progress.advance()
    lines = [re.sub(r", \d+ s$", ", <t> s", line) for line in stream.getvalue().splitlines()]
    assert lines == [
        "replaying: 1/4 runs (25%), <t> s", "replaying: 2/4 runs (50%), <t> s", "replaying: 3/4 runs (75%), <t> s",
        "replaying: 4/4 runs (100%), <t> s", "replaying: 4/4 runs (100%), <t> s",  # and once at the end
    ]
    quiet = io.StringIO()
    with Progress("replaying", 4, stream=quiet, every_s=0.0, quiet=True) as progress:
        progress.advance(4)
    assert quiet.getvalue() == ""


def test_chaos_reports_progress_on_stderr_and_json_on_stdout() -> None:
    result = CliRunner().invoke(app, ["scenario", "chaos", "--nodes", "5", "--tasks", "20"])
    summary = json.loads(result.stdout)
    assert (result.exit_code, summary["accountedFor"], re.sub(r", \d+ s", ", <t> s", result.stderr)) == (
        0, 20, "chaos: 20000/20000 simulated s (100%), <t> s\n")
    quiet = CliRunner().invoke(app, ["scenario", "chaos", "--nodes", "5", "--tasks", "20", "-q"])
    assert (quiet.exit_code, quiet.stderr, json.loads(quiet.stdout) == summary) == (0, "", True)
