"""The command line itself: --version on every command, a help page for users."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from gputask import __version__
from gputask.cli import app


def gputask(*args: str) -> subprocess.CompletedProcess[str]:
    """``gputask ARGS`` through the console-script entry point (``gputask.cli:main``)."""
    code = "import sys; from gputask.cli import main; sys.argv = ['gputask', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_version_after_any_command() -> None:
    for args in (("--version",), ("get", "tasks", "--version"), ("explain", "x", "--version"),
                 ("scenario", "run", "--version"), ("simulate", "--version")):
        done = gputask(*args)
        assert (done.returncode, done.stdout, done.stderr) == (0, f"gputask {__version__}\n", ""), args


def test_top_level_help_lists_commands_for_users() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=120)
    assert result.exit_code == 0
    for command in ("run", "agent", "get", "explain", "top", "demo", "scenario", "simulate"):
        assert f"│ {command} " in result.output, command
    assert "lazily" not in result.output and "matplotlib" not in result.output  # no developer notes


def test_cluster_text_with_brackets_prints_verbatim_in_tables_and_explain() -> None:
    """Names and messages from the cluster are never read as rich markup: a regex keeps its brackets."""
    from rich.console import Console

    from gputask.core.diagnose import Diagnosis
    from gputask.live import render_diagnosis, render_table

    regex = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    console = Console(width=200, color_system=None, record=True)
    render_table(console, [{"name": "t", "reason": f"InvalidSpec [bold]{regex}"}], ["name", "reason"])
    status = {"phase": "Failed", "conditions": [{"type": "Admitted", "reason": "InvalidSpec",
                                                 "message": f"must match {regex}"}], "message": f"must match {regex}"}
    render_diagnosis(console, Diagnosis(key="default/t", state="unknown"), status)
    assert console.export_text().splitlines() == [
        "NAME  REASON",
        f"t     InvalidSpec [bold]{regex}",
        f"default/t: Failed (InvalidSpec: must match {regex})",
        "The operator's view has no such task waiting or running (it finished, or failed for good).",
    ]


def test_scenario_run_takes_dash_o_like_the_other_commands() -> None:
    """``scenario run FILE -o json`` prints the same JSON as ``--output json``."""
    path = str(Path(__file__).parents[2] / "examples" / "scenarios" / "seed-fragment-reuse.yaml")
    short, long = (CliRunner().invoke(app, ["scenario", "run", path, flag, "json"]) for flag in ("-o", "--output"))
    assert (short.exit_code, json.loads(short.stdout)) == (0, json.loads(long.stdout))
