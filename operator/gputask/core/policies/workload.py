"""Target workloads: the task shapes a fragmentation-aware policy packs for, with their popularity.

FGD (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC '23, section 3) measures fragmentation *against a target workload*:
the distribution of task shapes, weighted by how often each shape occurs. The authors' simulator
(hkust-adsl/kubernetes-scheduler-simulator, ``GetTypicalPods``; config ``podPopularityThreshold:
95``, ``podIncreaseStep: 1``, CPU-only pods included) keeps the most popular shapes, most popular
first, until they cover 95% of the tasks, and renormalises their shares to sum to 1. A shape is
the task's GPU request (count, per-GPU share or memory, allowed products) and its CPU request;
the simulator leaves host memory out of the shape, and so does :meth:`TargetWorkload.from_shapes`
unless asked.

Sources: a workload fixed from a list of shapes (the trace replay computes it from the pod list,
as the authors do); :data:`DEFAULT_TARGET`, the operator's default; or, opted into,
:class:`RecentWorkload`, a window over the tasks the scheduler has recently seen, rebuilt every
so many new tasks so that cached scores stay valid meanwhile (not restart-safe: see there).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from gputask.core.model import GpuRequest, Task, TaskKey

POPULARITY = 0.95
"""Share of tasks the kept shapes cover (the authors' ``podPopularityThreshold`` of 95%)."""


@dataclass(frozen=True, slots=True)
class TaskShape:
    """What placement reads of a task: GPU request, CPU (millicores) and host memory (MiB)."""

    request: GpuRequest
    cpu_milli: int = 0
    memory_mib: int = 0
    label: str = ""
    """Counts shapes with the same request apart: the trace's ``gpu_spec`` as written
    (``V100M16|V100M32|V100M32`` and ``V100M16|V100M32`` are two shapes to the FGD authors)."""

    @classmethod
    def of(cls, task: Task, *, with_memory: bool = False) -> TaskShape:
        """The shape of ``task``; host memory only when ``with_memory`` (the authors leave it out)."""
        return cls(task.request, task.cpu_milli, task.memory_mib if with_memory else 0)

    def order_key(self) -> tuple[int, int, int, str]:
        """The authors' order among equally popular shapes: CPU, per-GPU share, count, products as written."""
        req = self.request
        share = req.fraction_milli if req.fraction_milli is not None else (req.memory_mib or 1000)
        return (self.cpu_milli, share if req.count else 0, req.count, self.label or "|".join(sorted(req.products)))


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """Task shapes and their probabilities (summing to 1; empty = no target)."""

    shapes: tuple[tuple[TaskShape, float], ...] = ()

    @classmethod
    def from_shapes(cls, shapes: Iterable[TaskShape], *, popularity: float = POPULARITY) -> TargetWorkload:
        """The most popular shapes covering ``popularity`` of ``shapes``, renormalised.

        Most popular first; equally popular shapes in the authors' order (larger CPU first,
        then larger share, more GPUs, products), so the cut falls where theirs does.
        """
        counts = Counter(shapes)
        total = sum(counts.values())
        if not total:
            return cls()
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].order_key()), reverse=True)
        kept: list[tuple[TaskShape, int]] = []
        covered = 0
        for shape, count in ranked:
            if covered >= popularity * total:
                break
            kept.append((shape, count))
            covered += count
        return cls(tuple((shape, count / covered) for shape, count in kept))

    def __len__(self) -> int:
        return len(self.shapes)


def _default_target() -> TargetWorkload:
    shares = {
        GpuRequest(1): 0.55,
        GpuRequest(1, fraction_milli=810): 0.15,
        GpuRequest(1, fraction_milli=470): 0.12,
        GpuRequest(1, fraction_milli=320): 0.08,
        GpuRequest(1, fraction_milli=650): 0.07,
        GpuRequest(2): 0.01,
        GpuRequest(4): 0.01,
        GpuRequest(8): 0.01,
    }
    return TargetWorkload(tuple((TaskShape(request), p) for request, p in shares.items()))


DEFAULT_TARGET = _default_target()
"""The target workload when none is given: the GPU task mix of the Alibaba GPU trace v2023
(default pod list, rounded): 55% whole single GPUs, 42% GPU shares (0.81, 0.47, 0.32, 0.65 of a
GPU, the four commonest), 3% on 2, 4 or 8 GPUs; no CPU or memory (the operator leaves them to
kube-scheduler). A fixed target keeps placement a function of the cluster's state, so an
operator restarted from the API makes the same decisions (DESIGN.md principle 3)."""


class RecentWorkload:
    """The target workload of the last ``window`` distinct tasks seen, rebuilt every ``refresh`` new ones.

    ``generation`` changes exactly when :attr:`target` does, so a policy's cached scores know when
    to start over. Before any task is seen the target is empty; the first task seen builds it at
    once, so the first placements are already scored against something real. Opt-in
    (``follow_recent``): what it learnt is lost on a restart, so a restarted operator may place
    differently from one that kept running.
    """

    def __init__(self, *, window: int = 1000, refresh: int = 500, popularity: float = POPULARITY) -> None:
        self.window, self.refresh, self.popularity = window, refresh, popularity
        self._seen: OrderedDict[TaskKey, TaskShape] = OrderedDict()
        self._new = 0
        self.target = TargetWorkload()
        self.generation = 0

    def observe(self, task: Task) -> None:
        """Count ``task`` once (by key); rebuild the target when enough new tasks arrived."""
        if task.key in self._seen:
            return
        self._seen[task.key] = TaskShape.of(task)
        if len(self._seen) > self.window:
            self._seen.popitem(last=False)
        self._new += 1
        if self._new >= self.refresh or not self.target.shapes:
            self.target = TargetWorkload.from_shapes(self._seen.values(), popularity=self.popularity)
            self.generation += 1
            self._new = 0
