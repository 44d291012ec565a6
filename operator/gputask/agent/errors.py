"""The agent's exceptions, in one small hierarchy::

    AgentError
    ├── ProbeError            one reading of the whole node failed (the next may succeed)
    │   └── ProbeUnavailable  NVML cannot initialise here (no driver, no library): do not retry
    └── FakeSpecError         a ``--fake-gpus`` spec is malformed (also a ValueError)

A failed query of one device is not an exception: that device is reported unhealthy with the
NVML error text as its reason, and the other devices are reported as usual.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of the agent's errors."""


class ProbeError(AgentError):
    """Reading the node's GPUs failed as a whole."""


class ProbeUnavailable(ProbeError):
    """NVML cannot initialise on this machine (no NVIDIA driver or library)."""


class FakeSpecError(AgentError, ValueError):
    """A fake GPU spec such as ``2x24Gi`` could not be parsed."""
