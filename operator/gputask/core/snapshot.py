"""Snapshots of the cache for preemption trials: copy-on-write, so a trial never touches live state.

Kueue's preemptor simulates removing candidates from its cycle's snapshot (pkg/scheduler/preemption, on
pkg/cache's ``Snapshot``) and puts them back; the cache itself never sees a trial. Here :class:`Trial` gives the
:class:`~gputask.core.preemption.Planner` a :class:`TrialCluster`, which copies a node's state the first time the
trial reads it (only the nodes that hold candidates are ever copied), and a copy of the quota usage
(:meth:`~gputask.core.quota.QuotaBook.trial_copy`). The planner releases and restores victims on those copies
(assume, forget); the live :class:`~gputask.core.cluster.ClusterState`, its index and the live
:class:`~gputask.core.quota.QuotaBook` are only read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gputask.core.cluster import ClusterState, NodeIndex, NodeState
from gputask.core.model import NodeName
from gputask.core.quota import QuotaBook


class TrialCluster(ClusterState):
    """A copy-on-write snapshot of ``live`` for one trial: :meth:`node` copies a node's state (and the
    reservations on it) on first read; reservations and releases change the copies only.

    Placement's policies prepare against the live cluster's index (:meth:`index`: the GPU products of the whole
    cluster, which a trial never changes). Only the nodes read so far are listed (:meth:`sorted_nodes`): a trial
    searches the node states it was given, never the whole cluster.
    """

    def __init__(self, live: ClusterState) -> None:
        super().__init__()
        self.live = live

    def node(self, name: NodeName) -> NodeState:
        """The trial's copy of ``name``'s state (made on first read); raises UnknownNodeError."""
        state = self._nodes.get(name)
        if state is None:
            state = self._nodes[name] = self.live.node(name).copy()
            for key in state.tasks:
                found = self.live.reservation(key)
                if found is not None:
                    self._reservations[key] = found
        return state

    def copied(self, name: NodeName) -> NodeState | None:
        """The trial's copy of ``name``'s state if one was made, else None (then the live state is current)."""
        return self._nodes.get(name)

    def current(self, name: NodeName) -> NodeState:
        """``name``'s state as the trial sees it, to read only: its copy if one was made, else the live state
        (not copied); raises UnknownNodeError."""
        state = self._nodes.get(name)
        if state is not None:
            return state
        return self.live.current(name) if isinstance(self.live, TrialCluster) else self.live.node(name)

    def has_node(self, name: NodeName) -> bool:
        """True when the live cluster knows the node."""
        return self.live.has_node(name)

    def index(self) -> NodeIndex:
        """The live cluster's index (read only: what a policy prepares against)."""
        return self.live.index()

    def sorted_nodes(self) -> list[NodeState]:
        """The copies made so far, in name order."""
        return [self._nodes[n] for n in sorted(self._nodes)]

    def __iter__(self) -> Iterator[NodeState]:
        return iter(self.sorted_nodes())


@dataclass(frozen=True, slots=True)
class Trial:
    """One preemption trial's snapshot: a copy-on-write cluster and a copy of the quota book. Dropped after the
    trial (forget): nothing of it reaches the cache."""

    cluster: TrialCluster
    quotas: QuotaBook

    @classmethod
    def of(cls, cluster: ClusterState, quotas: QuotaBook) -> Trial:
        """A trial over the live ``cluster`` and ``quotas`` (neither is changed by it)."""
        return cls(TrialCluster(cluster), quotas.trial_copy())
