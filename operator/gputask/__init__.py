"""gputask: a Kubernetes operator that packs GPU tasks onto fragmented GPU memory.

Subpackages:
- :mod:`gputask.core`: the pure, synchronous scheduler (no I/O).
- :mod:`gputask.k8s`: the kopf operator that drives the core from the Kubernetes API.
- :mod:`gputask.sim`: scenario runner and trace replay over the same core.
- :mod:`gputask.testing`: the Kubernetes API emulator used by tests and ``make demo``.
"""

__version__ = "0.1.0"
