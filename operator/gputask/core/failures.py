"""Node and GPU failure: which running tasks to evict, and when.

- A node NotReady (or Unknown) gets no new work at once; its tasks are evicted only once it has
  been down for longer than the grace period (a node back in time changes nothing).
- A node deleted or tainted ``node.kubernetes.io/out-of-service`` fails at once.
- A GPU marked unhealthy, or gone from its node's inventory, gets no new work and its tasks are
  evicted at once (reason GPUFailure).
Each failure eviction counts against the task's ``maxReschedules``; past it the task fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputask.core.cluster import NodeState
from gputask.core.model import NodeName, PodPlacement, TaskKey
from gputask.core.reasons import Reason

NODE_FAILURE, GPU_FAILURE = Reason.NODE_FAILURE, Reason.GPU_FAILURE
MAX_RESCHEDULES_EXCEEDED = Reason.MAX_RESCHEDULES_EXCEEDED


@dataclass(frozen=True, slots=True)
class FailureNotice:
    """A task to evict because of a failure: reason (NodeFailure, GPUFailure) and message."""

    key: TaskKey
    reason: str
    message: str


@dataclass(slots=True)
class FailureTracker:
    """Down-since times per node, queued failure notices, and failure-eviction counts per task."""

    grace_s: float = 60.0
    down_since: dict[NodeName, float] = field(default_factory=dict)
    notices: dict[TaskKey, FailureNotice] = field(default_factory=dict)
    counts: dict[TaskKey, int] = field(default_factory=dict)

    def node_down(self, name: NodeName, now: float) -> None:
        """Remember when a node went NotReady (the first report counts)."""
        self.down_since.setdefault(name, now)

    def node_up(self, name: NodeName) -> None:
        """A node is Ready again: nothing is evicted for its past down time."""
        self.down_since.pop(name, None)

    def expired(self, now: float) -> list[NodeName]:
        """Nodes down for longer than the grace period at ``now``, in name order."""
        return sorted(n for n, since in self.down_since.items() if now - since > self.grace_s)

    def notify(self, keys: list[TaskKey], reason: str, message: str, *, override: bool = False) -> None:
        """Queue failure evictions; the first notice of a task wins until it is handled, unless
        ``override`` (a node gone outright explains more than one of its GPUs failing)."""
        for key in keys:
            if override:
                self.notices[key] = FailureNotice(key, reason, message)
            else:
                self.notices.setdefault(key, FailureNotice(key, reason, message))

    def take(self) -> list[FailureNotice]:
        """All queued notices, in key order, and clear them."""
        out = [self.notices[k] for k in sorted(self.notices)]
        self.notices.clear()
        return out


def tasks_on_bad_gpus(state: NodeState) -> list[TaskKey]:
    """Tasks with a pod placed on a GPU of ``state`` that is unhealthy or no longer reported (by UUID)."""
    healthy = {(g.index, g.uuid) for g in state.node.gpus if g.healthy}
    return sorted(key for key, placement in state.tasks.items() if not _all_on(placement, healthy))


def _all_on(placement: PodPlacement, healthy: set[tuple[int, str]]) -> bool:
    return all((slot.index, slot.uuid) in healthy for slot in placement.gpus)
