"""Shared pytest setup: make the ``gputask`` package importable from the ``operator/`` source folder."""

from __future__ import annotations

import sys
from pathlib import Path

OPERATOR_SRC = str(Path(__file__).resolve().parents[1] / "operator")
if OPERATOR_SRC not in sys.path:
    sys.path.insert(0, OPERATOR_SRC)
