"""The pure scheduling core: synchronous, deterministic, no I/O.

It imports nothing from kopf, Kubernetes clients, prometheus_client, pynvml or asyncio
(a test enforces it). The operator, the scenario runner and the trace replay all drive it.
"""

from gputask.core import policies as policies  # registers fgd, packing and bestfit-atc23 in POLICIES
from gputask.core.cluster import ClusterState, NodeState
from gputask.core.errors import (
    GpuTaskError,
    InvalidQueueError,
    InvalidTaskError,
    OverCommitError,
    UnknownNodeError,
)
from gputask.core.model import (
    MILLI_PER_GPU,
    Gpu,
    GpuRequest,
    GpuSlot,
    Node,
    NodeName,
    Placement,
    PodPlacement,
    PodSet,
    Task,
    TaskKey,
    task_key,
)
from gputask.core.placement import (
    DEFAULT_POLICY,
    POLICIES,
    Outcome,
    Policy,
    find_placement,
    make_policy,
    register_policy,
)
from gputask.core.quota import (
    GPU,
    GPU_MEMORY,
    LabelRequirement,
    LabelSelector,
    Preemption,
    QueueSpec,
    QuotaBook,
    ResourceQuota,
    usage_of,
)
from gputask.core.scheduler import Admit, Decision, Pending, Scheduler

__all__ = [
    "DEFAULT_POLICY",
    "GPU",
    "GPU_MEMORY",
    "MILLI_PER_GPU",
    "POLICIES",
    "Admit",
    "ClusterState",
    "Decision",
    "Gpu",
    "GpuRequest",
    "GpuSlot",
    "GpuTaskError",
    "InvalidQueueError",
    "InvalidTaskError",
    "LabelRequirement",
    "LabelSelector",
    "Node",
    "NodeName",
    "NodeState",
    "Outcome",
    "OverCommitError",
    "Pending",
    "Placement",
    "PodPlacement",
    "PodSet",
    "Policy",
    "Preemption",
    "QueueSpec",
    "QuotaBook",
    "ResourceQuota",
    "Scheduler",
    "Task",
    "TaskKey",
    "UnknownNodeError",
    "find_placement",
    "make_policy",
    "register_policy",
    "task_key",
    "usage_of",
]
