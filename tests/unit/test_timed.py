"""Time-based trace replay: arrivals and departures on the trace's clock, QoS queues vs strict FIFO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputask.sim.timed import cli_timed, replay_timed

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def trace(tmp_path: Path) -> Path:
    """One node with one GPU; a long BE pod, then an LS pod and a short BE pod that both wait. Both QoS
    queues then borrow (each pod is a whole GPU, more than either queue's nominal share)."""
    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,1,T4\n")
    (tmp_path / "pods.csv").write_text(
        HEADER
        + "be-long,1000,1024,1,1000,,BE,Running,0,100,0\n"
        + "be-small,1000,1024,1,1000,,BE,Running,10,60,10\n"
        + "ls,1000,1024,1,1000,,LS,Running,20,70,20\n"
        + "cpu-only,1000,1024,0,0,,BE,Running,0,10,0\n"
        + "never-ran,1000,1024,1,1000,,LS,Pending,5,,\n"
    )
    return tmp_path


def test_fifo_waits_in_arrival_order(tmp_path: Path) -> None:
    """Strict FIFO: be-small waits for be-long (100 s), ls waits behind it; utilisation over the arrival window."""
    result = replay_timed(trace(tmp_path), "pods.csv", mode="fifo", policy="bestfit")
    assert (sorted(result.delays_s), result.makespan_s, result.unadmitted, result.preemptions) == (
        [0.0, 90.0, 130.0],
        200.0,
        0,
        0,
    )
    assert result.summary()["gpuUtilizationPct"] == 100.0


def test_gputask_admits_the_higher_priority_class_first(tmp_path: Path) -> None:
    """QoS queues: when be-long leaves, LS (priority 1000) goes before the older BE pod, unlike FIFO (both
    heads borrow, so Kueue's order across the cohort falls to priority)."""
    result = replay_timed(trace(tmp_path), "pods.csv", mode="gputask", policy="bestfit")
    assert (sorted(result.delays_s), result.makespan_s, result.unadmitted, result.preemptions) == (
        [0.0, 80.0, 140.0],
        200.0,
        0,
        0,
    )


def test_cli_reports_both_modes_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--output json prints the trace, the knobs and each mode's exact figures."""
    root = trace(tmp_path)
    (root / "openb_pod_list_default.csv").write_text((root / "pods.csv").read_text())
    code = cli_timed(root, pods_file="openb_pod_list_default.csv", policy="bestfit", speedup=1.0, load=1, output="json")
    figures = {"makespanS": 200.0, "gpuUtilizationPct": 100.0, "admitted": 3, "unadmitted": 0, "preemptions": 0}
    assert (code, json.loads(capsys.readouterr().out)) == (
        0,
        {
            "trace": "openb_pod_list_default.csv",
            "speedup": 1.0,
            "load": 1,
            "policy": "bestfit",
            "modes": {
                "gputask": {"meanQueueDelayS": 73.3, "p95QueueDelayS": 140.0, **figures},
                "fifo": {"meanQueueDelayS": 73.3, "p95QueueDelayS": 130.0, **figures},
            },
        },
    )


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"speedup": 0.0}, "--speedup 0: must be above 0 (arrival times are divided by it)"),
        ({"speedup": -1.0}, "--speedup -1: must be above 0 (arrival times are divided by it)"),
        ({"policy": "fifo"}, "unknown policy 'fifo' for --timed; known: "),
        ({"output": "xml"}, "--output 'xml': use table or json"),
    ],
)
def test_cli_refuses_bad_knobs_before_replaying(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], knobs: dict[str, object], message: str
) -> None:
    """Bad --speedup, policy or --output: exit 2 at once, one line on stderr, nothing on stdout."""
    args: dict[str, object] = {
        "pods_file": "pods.csv",
        "policy": "bestfit",
        "speedup": 1.0,
        "load": 1,
        "output": "json",
    }
    code = cli_timed(trace(tmp_path), **{**args, **knobs})  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert (code, out, err.startswith(f"gputask simulate: {message}"), err.count("\n")) == (2, "", True, 1)


def test_the_table_keeps_every_column_in_a_pipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Into a pipe (not a terminal) the table is not cut to 80 columns: every header is whole on one line."""
    root = trace(tmp_path)
    (root / "openb_pod_list_default.csv").write_text((root / "pods.csv").read_text())
    code = cli_timed(root, pods_file="openb_pod_list_default.csv", policy="bestfit", speedup=1.0, load=1,
                     output="table", quiet=True)
    header = next(line for line in capsys.readouterr().out.splitlines() if "mode" in line)
    assert (code, header.split()) == (0, ["┃", "mode", "┃", "meanQueueDelayS", "┃", "p95QueueDelayS", "┃", "makespanS",
                                          "┃", "gpuUtilizationPct", "┃", "admitted", "┃", "unadmitted", "┃",
                                          "preemptions", "┃"])
