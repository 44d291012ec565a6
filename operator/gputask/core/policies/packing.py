"""``packing``: gputask's own policy. FGD, made aware of scarce GPU products and of CPU per copy.

A node's score is lexicographic, lower is better:

1. **Product pressure** of the GPUs the task would use, in steps of 0.05 (lowest first). The
   pressure of a product k is the GPU demand of the target workload's shapes restricted to
   products (``gpuProducts``) that include k, spread over their allowed products by capacity,
   relative to k's share of the cluster's GPUs (1.0: restricted work alone would fill k when
   the whole workload fills the cluster). Tasks go first to the products restricted work needs
   least, so scarce products stay free for the tasks that can run nowhere else. Source: our
   analysis of FGD's weak spot (issue 7: on ``gpuspec33`` FGD leaves 12.16% unallocated, first
   fit 6.24%; there the T4-only tasks alone ask for more GPUs than the 842 T4s of the cluster);
   demand over supply per accelerator type is the idea of heterogeneity-aware scheduling
   (Gavel, Narayanan et al., OSDI '20).
2. **Fragmentation growth** against the target workload (FGD: Weng et al., USENIX ATC '23),
   in the authors' score steps (``int(100 * sigmoid(-growth / 1000))``): growths within a step
   tie. The steps matter: with exact growth FGD spreads tasks thinly and leaves twice as much
   unallocated; with steps, the smallest node name among the near-best acts as first fit.
   The fragmentation is FGD's averaged half and half with its per-copy refinement
   (:mod:`~gputask.core.policies.fragmentation`, ``copies_weight=0.5``; ours): GPUs that the
   node's CPU will strand count as fragmented. Alone, the refinement cuts the default trace's
   unallocated share by half a point but, by sending small tasks to CPU-rich nodes, breaks the
   whole 8-GPU nodes that multi-GPU tasks need; the half-half mix keeps most of the gain.
3. The smallest node name (the core's tie-break); inside a node, a shared task takes the GPU
   with the best (step, least free share) pair, whole-GPU tasks the lowest-index idle GPUs.

Tried and dropped (trace benchmark, seeds 42..44): best fit, worst fit or small-nodes-first
among ties (no better than name order), linear growth buckets, counting every shape (not only
the 95% most popular), host memory in the shapes, pressure per node type instead of product
(much worse: strict order between near-equal types).

It never refuses a task that some node can hold: every fitting node gets a finite score.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from gputask.core.cluster import ClusterState, NodeState
from gputask.core.model import MILLI_PER_GPU, GpuRequest, Task
from gputask.core.placement import tightest
from gputask.core.policies.fgd import TargetFollower, framework_score
from gputask.core.policies.workload import TargetWorkload

PRESSURE_STEP = 0.05
"""Pressures closer than this count as equal (near-equal products then compete on fragmentation)."""
COPIES_WEIGHT = 0.5
"""Share of the per-copy fragmentation in the mix (0: FGD's, 1: per-copy only)."""
_FRAG_LEVELS = 101  # framework scores 0..100


def pressures(target: TargetWorkload, capacity: Mapping[str, int]) -> dict[str, float]:
    """Pressure by product (see the module docstring); 0 for products no restricted shape needs."""
    demand: dict[str, float] = {}
    total = 0.0
    for shape, p in target.shapes:
        req = shape.request
        gpus = p * req.count * _share(req)
        total += gpus
        allowed = [k for k in req.products if capacity.get(k, 0) > 0]
        if not gpus or not allowed:
            continue
        pool = sum(capacity[k] for k in allowed)
        for k in allowed:
            demand[k] = demand.get(k, 0.0) + gpus * capacity[k] / pool
    cluster = sum(capacity.values())
    if not total:
        return {}
    return {k: demand.get(k, 0.0) / total * cluster / n for k, n in capacity.items() if n}


def _share(req: GpuRequest) -> float:
    if req.fraction_milli is not None:
        return min(req.fraction_milli, MILLI_PER_GPU) / MILLI_PER_GPU
    return 1.0 if req.memory_mib is None else 0.5  # a memory request: its share depends on the GPU


class Packing(TargetFollower):
    """Product pressure, then FGD's fragmentation steps (see the module docstring)."""

    name = "packing"
    scores_by_state = True

    def __init__(
        self, *, copies_weight: float = COPIES_WEIGHT, pressure_step: float = PRESSURE_STEP, follow_recent: bool = False
    ) -> None:
        super().__init__(copies_weight=copies_weight, follow_recent=follow_recent)
        self.pressure_step = pressure_step
        self._pressure: dict[str, float] = {}
        self._pressure_of: tuple[int, tuple[tuple[str, int], ...]] = (-1, ())
        self._pressure_generation = 0
        self._last: tuple[NodeState, Task, tuple[int, ...], float] | None = None

    @property
    def generation(self) -> int:
        """Changes whenever the target workload or the cluster's GPUs by product change."""
        return super().generation * 1_000_003 + self._pressure_generation

    def prepare(self, cluster: ClusterState, task: Task) -> None:
        """Note the task (target workload) and the cluster's GPUs by product; update pressures."""
        self.observe(task)
        capacity = tuple(sorted((k, n) for k, n in cluster.index().products.items() if n > 0))
        key = (super().generation, capacity)
        if key != self._pressure_of:
            self._pressure_of = key
            self._pressure = pressures(self.frag.target, Counter(dict(capacity)))
            self._pressure_generation += 1

    def pressure_step_of(self, state: NodeState, picked: Sequence[int]) -> int:
        """The highest pressure step among the products of the GPUs used (0 without GPUs)."""
        if not picked:
            return 0
        worst = max(self._pressure.get(state.node.gpus[p].product, 0.0) for p in picked)
        return int(worst / self.pressure_step)

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """A shared GPU: best score, then least free share, then lowest index; else as FGD."""
        req = task.request
        before = self.frag.of_state(state)
        if req.count != 1 or req.exclusive:
            picked = tuple(feasible[: req.count]) if req.exclusive else tightest(state, task, feasible)
            self._last = (state, task, picked, self._score(state, task, picked, before))
            return picked
        best: tuple[float, int, tuple[int, ...]] | None = None
        seen: set[tuple[int, int, str]] = set()
        gpus = state.node.gpus
        for pos in feasible:
            alike = (state.free_mib(pos), gpus[pos].memory_mib, gpus[pos].product)
            if alike in seen:
                continue  # a GPU like one already tried: the same score, a higher index
            seen.add(alike)
            key = (self._score(state, task, (pos,), before), alike[0] * MILLI_PER_GPU // (alike[1] or 1), (pos,))
            if best is None or key[:2] < best[:2]:
                best = key
        assert best is not None
        self._last = (state, task, best[2], best[0])
        return best[2]

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Pressure step, then fragmentation step, as one number (lower is better)."""
        last = self._last
        if last is not None and last[0] is state and last[1] is task and last[2] == tuple(picked):
            return last[3]
        return self._score(state, task, picked, self.frag.of_state(state))

    def _score(self, state: NodeState, task: Task, picked: Sequence[int], before: float) -> float:
        growth = self.frag.after(state, task, picked) - before
        frag_step = _FRAG_LEVELS - 1 - framework_score(-growth)
        return float(self.pressure_step_of(state, picked) * _FRAG_LEVELS + frag_step)
