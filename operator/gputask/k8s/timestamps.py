"""Timestamps as the API writes them (no I/O: imported by the records as well as the writer)."""

from __future__ import annotations

import datetime as dt


def now_rfc3339() -> str:
    """Current UTC time as RFC 3339 with a Z suffix."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


__all__ = ["now_rfc3339"]
