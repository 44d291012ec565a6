"""The Kubernetes API emulator used by the integration tests and ``make demo`` (DESIGN.md section 5).

- :class:`GpuTaskEmulator`: kmock's ``KubernetesEmulator`` extended to behave enough like
  kube-apiserver for kopf (versions, conflicts, selectors, status, finalizers, GC, CRDs).
- :class:`EmulatorServer`: serves it on a loopback TCP port; writes kubeconfigs.
- :func:`kopf_login`: connection info for a ``@kopf.on.login()`` handler.
"""

from __future__ import annotations

from gputask.testing.emulator import GpuTaskEmulator
from gputask.testing.server import EmulatorServer, kopf_login

__all__ = ["EmulatorServer", "GpuTaskEmulator", "kopf_login"]
