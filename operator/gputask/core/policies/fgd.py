"""FGD: Fragmentation Gradient Descent (Weng et al., USENIX ATC '23), reproduced from its definition.

Place each task on the node, and the GPU(s) in it, where the node's fragmentation against the
target workload grows least: minimise F_n(M) after placing minus F_n(M) before
(:mod:`gputask.core.policies.fragmentation`). Ties go to the smallest node name, then to the
lowest GPU index.

As the authors' simulator does (hkust-adsl/kubernetes-scheduler-simulator, ``FGDScorePlugin``),
the default ``quantize=True`` turns the decrease of fragmentation into the scheduler-framework
score ``int(100 * sigmoid((F_before - F_after) / 1000))`` (0..100, higher is better), so increases
that differ by less than a few tens of milli-GPU tie and the tie-break decides. ``quantize=False``
compares the exact increases instead. GPU choice, as theirs: a task sharing one GPU goes to the
GPU with the best score (lowest index on ties); a whole-GPU task takes the lowest-index idle GPUs.

The target workload is fixed with :meth:`FGD.set_workload` (the trace replay: the pod list's
shapes, as the authors do); otherwise it is a built-in default mix
(:data:`~gputask.core.policies.workload.DEFAULT_TARGET`), or, opted into with
``follow_recent``, the tasks placement has recently seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

from gputask.core.cluster import ClusterState, NodeState
from gputask.core.model import Task
from gputask.core.placement import PolicyBase, tightest
from gputask.core.policies.fragmentation import Fragmentation
from gputask.core.policies.workload import DEFAULT_TARGET, POPULARITY, RecentWorkload, TargetWorkload, TaskShape


def framework_score(decrease: float) -> int:
    """The authors' FGD score of a fragmentation decrease (milli-GPU): 0..100, higher is better."""
    return int(100.0 / (1.0 + math.exp(-decrease / 1000.0)))


class TargetFollower(PolicyBase):
    """The target-workload half of a fragmentation policy.

    The target is :data:`~gputask.core.policies.workload.DEFAULT_TARGET` until
    :meth:`set_workload` fixes another (the trace replay: the pod list's shapes), or, with
    ``follow_recent``, the shapes of the tasks placement has recently seen. ``generation``
    changes whenever the target does (placement then forgets cached scores). Shapes enter the
    target without host memory unless ``with_memory`` (the authors' choice).
    """

    def __init__(
        self,
        *,
        popularity: float = POPULARITY,
        copies_weight: float | None = 0.0,
        with_memory: bool = False,
        follow_recent: bool = False,
    ) -> None:
        self.popularity, self.copies_weight, self.with_memory = popularity, copies_weight, with_memory
        self._recent = RecentWorkload(popularity=popularity) if follow_recent else None
        self.learns = follow_recent  # every task it sees moves the recent workload
        self._fixed_generation = 0
        self.frag = self.fragmentation(DEFAULT_TARGET)
        self._frag_generation = -1

    @property
    def generation(self) -> int:
        """Changes exactly when the target workload changes."""
        return self._fixed_generation if self._recent is None else self._recent.generation

    def set_workload(self, shapes: Iterable[TaskShape]) -> None:
        """Fix the target workload to the popular shapes of ``shapes`` (stops following tasks)."""
        self._recent, self.learns = None, False
        self._fixed_generation += 1
        if not self.with_memory:
            shapes = [replace(s, memory_mib=0) for s in shapes]
        target = TargetWorkload.from_shapes(shapes, popularity=self.popularity)
        self.frag = self.fragmentation(target)
        self._frag_generation = self._fixed_generation

    def copies_weight_for(self, target: TargetWorkload) -> float:
        """The per-copy weight of the fragmentation against ``target``: the one given (None: 0)."""
        return self.copies_weight or 0.0

    def fragmentation(self, target: TargetWorkload) -> Fragmentation:
        """The fragmentation measure against ``target`` (with :meth:`copies_weight_for` it)."""
        return Fragmentation(target, copies_weight=self.copies_weight_for(target))

    def prepare(self, cluster: ClusterState, task: Task) -> None:
        """Before a search (placement's hook): note the task about to be placed."""
        self.observe(task)

    def observe(self, task: Task) -> None:
        """Note a task about to be placed (ignored once the workload is fixed)."""
        if self._recent is None:
            return
        self._recent.observe(task)
        if self._recent.generation != self._frag_generation:
            target = self._recent.target
            self.frag = self.fragmentation(target)
            self._frag_generation = self._recent.generation


class FGD(TargetFollower):
    """Fragmentation gradient descent: the node and GPUs where fragmentation grows least."""

    name = "fgd"
    scores_by_state = True

    def __init__(
        self, *, quantize: bool = True, follow_recent: bool = False, copies_weight: float | None = 0.0
    ) -> None:
        """``copies_weight``: share of the per-copy refinement in the fragmentation (0, the default,
        is the paper's FGD; :class:`~gputask.core.policies.packing.Packing` passes None to let
        :meth:`copies_weight_for` decide per target workload)."""
        super().__init__(follow_recent=follow_recent, copies_weight=copies_weight)
        self.quantize = quantize
        self._last: tuple[NodeState, Task, tuple[int, ...], float] | None = None

    def growth_score(self, state: NodeState, task: Task, picked: Sequence[int], before: float) -> float:
        """Lower is better: minus the framework score, or the exact growth of F when not quantized."""
        growth = self.frag.after(state, task, picked) - before
        return -framework_score(-growth) if self.quantize else growth

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """A shared GPU: the best-scoring one (lowest index on ties); else the authors' choice."""
        req = task.request
        before = self.frag.of_state(state)
        if req.count != 1 or req.exclusive:
            picked = tuple(feasible[: req.count]) if req.exclusive else tightest(state, task, feasible)
            self._last = (state, task, picked, self.growth_score(state, task, picked, before))
            return picked
        best: tuple[float, tuple[int, ...]] | None = None
        seen: set[tuple[int, int, str]] = set()
        gpus = state.node.gpus
        for pos in feasible:
            alike = (state.free_mib(pos), gpus[pos].memory_mib, gpus[pos].product)
            if alike in seen:
                continue  # a GPU like one already tried: the same view after, a higher index
            seen.add(alike)
            score = self.growth_score(state, task, (pos,), before)
            if best is None or score < best[0]:
                best = (score, (pos,))
        assert best is not None
        self._last = (state, task, best[1], best[0])
        return best[1]

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Growth of the node's fragmentation (quantized as the authors' score unless told not to)."""
        last = self._last
        if last is not None and last[0] is state and last[1] is task and last[2] == tuple(picked):
            return last[3]
        return self.growth_score(state, task, picked, self.frag.of_state(state))
