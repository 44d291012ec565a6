"""Errors raised by the core.

Hierarchy::

    GpuTaskError
    ├── InvalidTaskError        a task spec that can never be scheduled as written
    ├── InvalidQueueError       a GPUClusterQueue spec that cannot be used
    ├── UnknownNodeError        a node name the cluster state does not hold
    └── OverCommitError         a reservation that would exceed a GPU's memory (a bug upstream)
"""

from __future__ import annotations


class GpuTaskError(Exception):
    """Root of every error the core raises."""


class InvalidTaskError(GpuTaskError):
    """A task spec is invalid; ``reason`` is a CamelCase condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class InvalidQueueError(GpuTaskError):
    """A queue spec is invalid; the message says which field."""


class UnknownNodeError(GpuTaskError):
    """The named node is not in the cluster state."""


class OverCommitError(GpuTaskError):
    """Reserving a placement would put more MiB on a GPU than it has, or reuse an exclusive GPU."""
