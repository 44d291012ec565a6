"""Capture one NvmlProbe reading as JSON, to commit as a test fixture from a real GPU machine.

Usage (on a node with an NVIDIA driver; needs ``pip install 'gputask[agent]'``)::

    python bench/agent_probe_capture.py [--output tests/fixtures/nvml_reading_<product>.json]

The JSON holds the reading exactly as the agent would publish it (device view, status body
without the time), plus what NVML itself says about the machine: per-device XID event
support, MIG mode and raw memory figures, and the pynvml version. Exit code 2 when NVML
cannot initialise (no driver here). tests/fixtures/nvml_reading_h200.json came from it on one
NVIDIA H200 (driver 580.159.04, CUDA 13.0, nvidia-ml-py 13.615.71) on 2026-11-29, through
bench/device_check.sh; tests/unit/test_agent_report.py replays it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from gputask.agent import NvmlProbe, ProbeError, ProbeUnavailable
from gputask.agent.report import device_view, gpunode_status


def capture() -> dict[str, Any]:
    """Open NVML, read once, and describe the result (raises ProbeUnavailable without a driver)."""
    with NvmlProbe(processes=True) as probe:
        reading = probe.read()
        events = dict(probe.events)
    view = device_view(reading)
    status = gpunode_status(view, dt.datetime.now(dt.UTC))
    status.pop("heartbeatTime")
    return {
        "capturedAt": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {"machine": platform.machine(), "system": platform.system(), "release": platform.release()},
        "pynvml": _version("nvidia-ml-py"),
        "reading": dataclasses.asdict(reading),
        "xidEventsSupported": {str(index): supported for index, supported in sorted(events.items())},
        "gpunodeStatus": status,
    }


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    """Write the capture to ``--output`` (default: stdout)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="write the JSON here instead of stdout")
    args = parser.parse_args(argv)
    try:
        result = capture()
    except ProbeUnavailable as exc:
        print(f"agent_probe_capture: {exc}", file=sys.stderr)
        return 2
    except ProbeError as exc:
        print(f"agent_probe_capture: reading failed: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
