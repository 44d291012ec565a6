"""The core stays pure: importing all of gputask.core pulls in no I/O or operator library."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import gputask.core

FORBIDDEN = ("kopf", "kubernetes", "prometheus_client", "pynvml", "asyncio", "aiohttp")

PROBE = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
forbidden = json.loads(sys.argv[2])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in forbidden)))
"""


def core_modules() -> list[str]:
    """Every module of the gputask.core package, by dotted name."""
    found = pkgutil.walk_packages(gputask.core.__path__, prefix="gputask.core.")
    return ["gputask.core", *sorted(m.name for m in found)]


def test_importing_every_core_module_loads_no_io_library() -> None:
    """In a fresh interpreter, importing every core module loads none of the FORBIDDEN libraries."""
    modules = core_modules()
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(modules), json.dumps(FORBIDDEN)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (len(modules) > 5, json.loads(run.stdout)) == (True, [])
