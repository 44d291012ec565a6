"""Boards: the candidate nodes of one (policy, task shape), best first, kept in step with the cluster.

A scheduling cycle must not rescan every node per decision (kube-scheduler and Kueue keep
incremental caches for the same reason). For a policy whose choice depends only on a node's
state (``scores_by_state``), a :class:`Board` holds each node's evaluation for one task shape,
(score, row, picked GPUs) or "does not fit", in a heap ordered by (score, row); rows are in name
order, so the heap's top is exactly the plain search's winner, smallest name on ties.

Before each search the board catches up with the rows the :class:`~gputask.core.cluster.NodeIndex`
logged as changed since its last search, re-evaluating only those (a node change touches one
row; evaluations are also shared by identical nodes). Entries of re-evaluated rows stay in the
heap until they reach its top, where they are recognised as stale and dropped; the heap is
compacted when stale entries outnumber live ones. A board that fell behind the log's window, or
a new board, evaluates every row once.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Protocol

from gputask.core.cluster import NodeIndex, NodeState, slots_for
from gputask.core.model import PodPlacement, Task


class Scored(Protocol):
    """What a board reads of a placement policy (:class:`~gputask.core.placement.Policy`): the generation of the
    meaning of its scores. (A protocol here, so this module does not import placement, which imports it.)"""

    @property
    def generation(self) -> int:
        """Changes whenever the meaning of the policy's scores changed."""
        ...


Evaluation = tuple[tuple[int, ...], float] | None
"""One node state evaluated for one task shape: (picked GPU positions, score), or no fit."""
Entry = tuple[float, int, tuple[int, ...]]
"""A board entry: (score, row, picked GPU positions); lower (score, row) is better."""

_MEMO_LIMIT = 8
"""A shape's evaluations by group are cleared past this many per node (stale groups pile up)."""
_SHAPES_LIMIT = 512
"""Boards kept per policy; past this many task shapes they all start over."""


class Board:
    """The evaluations of every node for one task shape, best first (see the module docstring)."""

    __slots__ = ("current", "heap", "position")

    def __init__(self) -> None:
        self.current: list[Entry | None] = []
        self.heap: list[Entry] = []
        self.position = -1

    def sync(self, index: NodeIndex, evaluate: Callable[[int], Evaluation]) -> None:
        """Re-evaluate the rows changed since the last sync (every row the first time)."""
        n = len(index.states)
        if self.position < index.log_start or len(self.current) != n:
            self.current = [None] * n
            self.heap = []
            for row in range(n):
                self._put(row, evaluate(row), push=False)
            heapify(self.heap)
        else:
            for row in set(index.log[self.position - index.log_start :]):
                self._put(row, evaluate(row), push=True)
            if len(self.heap) > 2 * n + 64:
                self.heap = [e for e in self.heap if self.current[e[1]] is e]
                heapify(self.heap)
        self.position = index.log_end

    def _put(self, row: int, found: Evaluation, *, push: bool) -> None:
        old = self.current[row]
        if found is None:
            self.current[row] = None
            return
        entry = (found[1], row, found[0])
        if old == entry:
            return  # unchanged: keep the live entry
        self.current[row] = entry
        if push:
            heappush(self.heap, entry)
        else:
            self.heap.append(entry)

    def first(self) -> Entry | None:
        """The live entry of the smallest row (name order), or None when no node fits."""
        return next((entry for entry in self.current if entry is not None), None)

    def best(self, refuse: Callable[[Entry], str | None] | None) -> tuple[Entry | None, bool, str | None]:
        """The best entry that ``refuse`` accepts (returns None for), whether any node fits, and
        when every fitting node is refused, the reason given for the one with the smallest name."""
        heap, current = self.heap, self.current
        aside: list[Entry] = []
        refusal: tuple[int, str] | None = None
        found: Entry | None = None
        while heap:
            entry = heap[0]
            if current[entry[1]] is not entry:
                heappop(heap)  # stale: its row was re-evaluated or no longer fits
                continue
            why = None if refuse is None else refuse(entry)
            if why is None:
                found = entry
                break
            aside.append(heappop(heap))
            if refusal is None or entry[1] < refusal[0]:
                refusal = (entry[1], why)
        for entry in aside:
            heappush(heap, entry)
        fits = found is not None or bool(aside)
        return found, fits, None if found is not None or refusal is None else refusal[1]


def board_for(index: NodeIndex, policy: Scored, task: Task) -> tuple[Board, dict[int, Evaluation]]:
    """The board and the evaluations by group id of ``policy`` for ``task``'s shape.

    Both are forgotten when the policy's ``generation`` changes (its scores changed meaning).
    """
    generation = policy.generation
    entry = index.memos.get(id(policy))
    if entry is None or entry[0] is not policy or entry[1] != generation:  # holding the policy keeps its id unique
        entry = index.memos[id(policy)] = (policy, generation, {})
    shapes: dict[object, tuple[Board, dict[int, Evaluation]]] = entry[2]
    key = task.fit_key
    found = shapes.get(key)
    if found is None:
        if len(shapes) >= _SHAPES_LIMIT:
            shapes.clear()
        found = shapes[key] = (Board(), {})
    memo = found[1]
    if len(memo) > _MEMO_LIMIT * len(index.states) + 1024:
        memo.clear()
    return found


def refuser(
    index: NodeIndex, task: Task, quota: Callable[[NodeState, PodPlacement], str | None]
) -> Callable[[Entry], str | None]:
    """``quota`` asked once per distinct set of picked GPU sizes (its contract: placement's ``QuotaCheck``)."""
    answers: dict[tuple[int, ...], str | None] = {}

    def refuse(entry: Entry) -> str | None:
        state, picked = index.states[entry[1]], entry[2]
        key = tuple(state.node.gpus[p].memory_mib for p in picked)
        if key not in answers:
            answers[key] = quota(state, PodPlacement(state.name, slots_for(state, task, picked)))
        return answers[key]

    return refuse
