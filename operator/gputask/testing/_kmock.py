"""The one place the emulator reaches into kmock's private modules (pinned: ``kmock==0.8``).

kmock 0.8 exports its emulator, request and resource types but keeps the pieces a faithful
emulator needs private: the rendered :class:`Response` and :class:`StreamingError`, the parsed
URL :class:`ParsedPath`, and its request parsing helpers. Everything else imports them from here,
so a kmock upgrade touches one module.
"""

from __future__ import annotations

from kmock._internal import parsing
from kmock._internal.parsing import ParsedPath
from kmock._internal.rendering import Response, StreamingError

__all__ = ["ParsedPath", "Response", "StreamingError", "parsing"]
