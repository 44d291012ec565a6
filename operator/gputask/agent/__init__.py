"""The node agent: reads the node's GPUs through NVML and keeps its GPUNode true (issue 5).

Each GPU node runs ``gputask agent --node-name $NODE_NAME`` (a DaemonSet; ``NODE_NAME`` from
the downward API ``spec.nodeName``). Modules:

- :mod:`~gputask.agent.probe`: :class:`NodeReading` / :class:`GpuReading`, the
  :class:`GpuProbe` protocol and :class:`NvmlProbe` (pynvml, with XID-event health).
- :mod:`~gputask.agent.fake`: :class:`FakeProbe`, devices from a spec like ``2x24Gi``.
- :mod:`~gputask.agent.report`: :class:`Reporter`, GPUNode create / status patch with
  change detection, heartbeat and capped exponential backoff.
- :mod:`~gputask.agent.metrics`: ``/metrics`` (``gputask_agent_*``) and ``/healthz``.
- :mod:`~gputask.agent.main`: wiring and the ``gputask agent`` command.

RBAC (for the Helm chart): the agent needs only

- ``gputask.io`` ``gpunodes``: ``get``, ``create``, ``patch`` (create its GPUNode, add the
  ownerReference to its Node);
- ``gputask.io`` ``gpunodes/status``: ``patch`` (the device report and heartbeat);
- core ``nodes``: ``get`` (the Node's uid for the ownerReference).

No list, watch, delete, nor any namespaced resource. RBAC cannot restrict each agent to its
own node's GPUNode (``resourceNames`` cannot depend on the caller); where that matters, a
ValidatingAdmissionPolicy can compare the object name with the node name bound into the
service-account token (``authentication.kubernetes.io/node-name``). NVML needs no privileged
container when the NVIDIA container runtime exposes the devices (``NVIDIA_VISIBLE_DEVICES=all``,
``NVIDIA_DRIVER_CAPABILITIES=utility``).
"""

from __future__ import annotations

from gputask.agent.errors import AgentError, FakeSpecError, ProbeError, ProbeUnavailable
from gputask.agent.fake import FakeProbe, fake_uuid, parse_fake_spec
from gputask.agent.probe import GpuProbe, GpuReading, NodeReading, NvmlProbe

__all__ = [
    "AgentError",
    "FakeProbe",
    "FakeSpecError",
    "GpuProbe",
    "GpuReading",
    "NodeReading",
    "NvmlProbe",
    "ProbeError",
    "ProbeUnavailable",
    "fake_uuid",
    "parse_fake_spec",
]
