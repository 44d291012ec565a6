"""Human-readable rendering of a scenario run's output dict (``--output table``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gputask.core.flavors import split_key

GPU = "nvidia.com/gpu"
GPU_MEMORY = "gputask.io/gpu-memory"


def print_table(result: dict[str, Any], console: Console | None = None) -> None:
    """Print the tasks, the queues and the violations of a run as rich tables."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
            console = Console(width=160)
    config = result["config"]
    makespan = result["makespan"]
    console.print(
        f"policy [bold]{result['policy']}[/]  makespan (last finish) "
        f"{'-' if makespan is None else f'{makespan} s'}  unfinished {result['unfinished']} "
        f"(running or waiting at the end)  nodeFailureGracePeriod {config['nodeFailureGracePeriod']:g} s"
    )
    console.print(_tasks_table(result["tasks"]))
    console.print(_queues_table(result["queues"]))
    if result["violations"]:
        console.print("[bold red]violations:[/]")
        for line in result["violations"]:
            console.print(f"  [red]{escape(line)}[/]")
    else:
        console.print("[green]no violations[/]")


def _tasks_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table(title="tasks")
    for name in ("task", "phase", "node", "GPU index"):  # NVML indices; "GPUs 0" read as a count
        table.add_column(name)
    for name in ("MiB per GPU", "attempt", "admitted at", "finished at"):
        table.add_column(name, justify="right")
    table.add_column("last reason")
    for t in tasks:
        table.add_row(
            escape(f"{t['namespace']}/{t['name']}"),
            t["phase"],
            _text(t["node"]),
            ",".join(str(i) for i in t["gpus"]) or "-",
            _text(t["memoryPerGpu"]),
            str(t["attempt"]),
            _text(t["admittedAt"]),
            _text(t["finishedAt"]),
            _text(t["reason"]),
        )
    return table


def _queues_table(queues: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="queues")
    table.add_column("queue")
    for name in ("GPUs used", "MiB used", "pending", "admitted"):
        table.add_column(name, justify="right")
    for name, q in queues.items():
        usage: dict[str, int] = {}
        for key, amount in q["usage"].items():  # summed over a queue's flavors (keys nvidia.com/gpu@<flavor>)
            usage[split_key(key)[0]] = usage.get(split_key(key)[0], 0) + amount
        table.add_row(
            name,
            f"{usage.get(GPU, 0) / 1000:g}",
            str(usage.get(GPU_MEMORY, 0)),
            str(q["pending"]),
            str(q["admitted"]),
        )
    return table


def _text(value: object) -> str:
    return "-" if value is None else escape(str(value))  # reasons and names from the file are never markup
