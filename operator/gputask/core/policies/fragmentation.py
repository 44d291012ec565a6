"""Node fragmentation against a target workload: FGD's F_n(M), fast and exact.

Definition (Weng et al., USENIX ATC '23, section 3.2; the authors' simulator,
``NodeGpuShareFragAmountScore``): for a node n and a target workload M of task shapes m with
popularity p_m,

    F_n(M) = sum_m p_m * F_n(m)

where F_n(m), in milli-GPU, is the free GPU capacity of n that a task of shape m cannot use:
- all of the node's free capacity when m cannot run on n at all (m needs no GPU, or n lacks the
  CPU or host memory, or has fewer than m's count of GPUs that could each hold one of m's GPUs);
- otherwise the free capacity of the GPUs that could not hold one of m's GPUs (free share below
  m's per-GPU need, not idle for a whole-GPU shape, or a product m does not allow).

A GPU's free capacity is in milli-GPU of the node's largest GPU (free MiB * 1000 // that GPU's
MiB): on the usual node of one GPU model, its free share, as in the paper; on a node mixing sizes,
4 GiB free is the same capacity on either card, so a memory request is not pushed to the smaller
card just because it takes a larger share of it. A GPU "could hold" a shape under the same rule
:func:`gputask.core.placement.feasible_gpus` applies.

Because the shares sum to 1, F_n(M) = T - sum over hostable shapes m of p_m * A_m, where T is
the node's total free capacity and A_m the free capacity on GPUs that can hold m. Shapes are
grouped by GPU requirement (count, per-GPU need, products); within a group, sorted by CPU, the
hostable ones are a prefix. So one evaluation costs a few dozen operations, and evaluations are
cached by the node's *view* (free CPU, free memory, and the multiset of GPU states), which
recurs constantly: most nodes of a cluster are alike.

**Per-copy refinement** (``copies_weight`` w > 0; gputask's own, used by the ``packing``
policy): FGD asks only whether *one* task of shape m fits, so a node with 8 idle GPUs and CPU
for a single task counts all 8 GPUs as usable. With w, a share w of each shape's term counts
instead min(A_m, k * count_m * 1000), where k is how many copies of m the node's free CPU and
memory allow: GPUs that CPU will strand count as fragmented. (The FGD paper's "lack CPU"
category, Q4, applied to every copy rather than the first.) w = 0 is FGD exactly.

**Sliver term** (``sliver_weight`` b > 0; gputask's own, used by ``packing``): F_n(M) plus b times
the expected eventual sliver of each partly used GPU, :func:`sliver_table`. FGD asks whether the
*next* task could use a GPU's free share; a 230 milli-GPU gap and a 300 gap are both usable by the
popular 230 and 220 shares, but the first is then full and the second keeps a 70 sliver nothing
fills. The term tells them apart. It follows the recursive ("Bellman") fragmentation of the FGD
authors' simulator (hkust-adsl/kubernetes-scheduler-simulator, ``NodeGpuFragBellman``: the
fragmentation expected after further typical tasks), reduced to one GPU so that it stays a table.
b = 0 leaves F_n(M) unchanged.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from gputask.core.cluster import UNTRACKED, NodeState
from gputask.core.model import MILLI_PER_GPU, Gpu, GpuRequest, Task
from gputask.core.policies.workload import TargetWorkload

GpuView = tuple[str, int, int, bool]
"""One GPU as fragmentation sees it: product, total MiB, free MiB, idle."""
NodeView = tuple[int, int, tuple[GpuView, ...]]
"""A node as fragmentation sees it: free CPU, free memory (UNTRACKED when untracked), GPUs sorted."""

_MAX_COPIES = 16
"""Copies of a shape beyond this cannot matter on a node of at most this many GPUs (CPU rounding)."""
_CACHE_LIMIT = 200_000
"""Views remembered before the cache starts over (bounds memory; a miss only costs time)."""


def view_of(state: NodeState) -> NodeView:
    """The fragmentation-relevant view of a node (GPU order does not matter, so it is sorted)."""
    gpus = state.node.gpus
    return (
        _free(state.cpu_free),
        _free(state.memory_free_mib),
        tuple(sorted((g.product, g.memory_mib, state.free_mib(p), state.is_idle(p)) for p, g in enumerate(gpus))),
    )


def view_after(state: NodeState, task: Task, picked: Sequence[int]) -> NodeView:
    """The view of ``state`` after placing ``task`` on the GPUs at positions ``picked``."""
    req = task.request
    gpus = []
    for pos, gpu in enumerate(state.node.gpus):
        free, idle = state.free_mib(pos), state.is_idle(pos)
        if pos in picked:
            free, idle = (0 if req.exclusive else free - req.mib_on(gpu)), False
        gpus.append((gpu.product, gpu.memory_mib, free, idle))
    cpu, memory = _free(state.cpu_free), _free(state.memory_free_mib)
    if cpu != UNTRACKED:
        cpu -= task.cpu_milli
    if memory != UNTRACKED:
        memory -= task.memory_mib
    return (cpu, memory, tuple(sorted(gpus)))


def _free(value: int | None) -> int:
    return UNTRACKED if value is None else value


def sliver_table(shares: Sequence[tuple[int, float]]) -> tuple[float, ...]:
    """Expected eventual sliver phi[g], milli-GPU, of one GPU with g of 1000 milli free (g = 0..1000).

    ``shares`` are (per-GPU share in milli-GPU, popularity) of the shapes that could use the GPU.
    The GPU is topped up with popular shares until none fits: phi[g] = g when no share fits, else
    the popularity-weighted mean of phi[g - s] over the shares s <= g. phi[1000] = 0: an idle GPU is
    left to whole-GPU work. Example: shares 600 and 400, equally popular: phi[500] = phi[100] = 100,
    phi[700] = (phi[100] + phi[300]) / 2 = 200.
    """
    merged: dict[int, float] = {}
    for share, p in shares:
        if 0 < share <= MILLI_PER_GPU and p > 0:
            merged[share] = merged.get(share, 0.0) + p
    items = sorted(merged.items())
    phi = [0.0] * (MILLI_PER_GPU + 1)
    for g in range(1, MILLI_PER_GPU + 1):
        weight = total = 0.0
        for share, p in items:
            if share > g:
                break
            weight += p
            total += p * phi[g - share]
        phi[g] = total / weight if weight else float(g)
    phi[MILLI_PER_GPU] = 0.0
    return tuple(phi)


@lru_cache(maxsize=4096)
def need_mib(request: GpuRequest, memory_mib: int) -> int:
    """MiB one GPU of ``request`` needs on a GPU of ``memory_mib`` (more than it has: never fits)."""
    need = request.mib_on(Gpu(0, "", "", memory_mib))
    return need if need <= memory_mib else memory_mib + 1


@dataclass(slots=True)
class _Group:
    """Shapes that need the same GPUs (count, per-GPU request, products); members sorted by CPU."""

    count: int
    request: GpuRequest
    members: tuple[tuple[int, int, float], ...]  # (cpu_milli, memory_mib, p), sorted by CPU
    needs: dict[int, int]  # per-GPU MiB needed, by GPU size (filled as sizes are met)

    def fitting_milli(self, gpus: tuple[GpuView, ...], milli: list[int]) -> list[int]:
        """Free milli-GPU of the GPUs that could each hold one of the group's GPUs."""
        req = self.request
        products = req.products
        if req.exclusive:
            return [m for g, m in zip(gpus, milli, strict=True) if g[3] and (not products or g[0] in products)]
        needs = self.needs
        out = []
        for g, m in zip(gpus, milli, strict=True):
            need = needs.get(g[1])
            if need is None:
                need = needs[g[1]] = need_mib(req, g[1])
            if g[2] >= need and (not products or g[0] in products):
                out.append(m)
        return out

    def usable_by_copies(self, fitting: int, cpu: int, memory: int) -> float:
        """Popularity-weighted capacity usable when each copy of a shape, limited by the CPU
        and memory left, can put at most ``count`` GPUs to use."""
        total = 0.0
        for cpu_need, memory_need, p in self.members:
            if cpu_need > cpu:
                break
            if memory_need > memory:
                continue
            copies = min(cpu // cpu_need if cpu_need else 1 << 30, memory // memory_need if memory_need else 1 << 30)
            total += p * min(fitting, copies * self.count * MILLI_PER_GPU)
        return total

    def hostable(self, cpu: int, memory: int) -> float:
        """Summed popularity of the members whose CPU and memory the node has."""
        total = 0.0
        for cpu_need, memory_need, p in self.members:
            if cpu_need > cpu:
                break
            if memory_need <= memory:
                total += p
        return total


class Fragmentation:
    """F_n(M) of nodes against one target workload, cached by (canonical) node view.

    Only the CPU and memory thresholds of the workload's shapes matter, so a view's free CPU
    (memory) is rounded down to the largest threshold it reaches before the cache lookup.
    """

    def __init__(self, target: TargetWorkload, *, copies_weight: float = 0.0, sliver_weight: float = 0.0) -> None:
        self.target = target
        self.copies_weight = copies_weight
        self.sliver_weight = sliver_weight
        self._slivers: dict[tuple[str, int], tuple[float, ...]] = {}
        by_request: dict[GpuRequest, list[tuple[int, int, float]]] = {}
        for shape, p in target.shapes:
            if shape.request.count:  # a shape without GPUs leaves all free capacity fragmented
                by_request.setdefault(shape.request, []).append((shape.cpu_milli, shape.memory_mib, p))
        self.groups = tuple(_Group(req.count, req, tuple(sorted(m)), {}) for req, m in by_request.items())
        copies = range(1, _MAX_COPIES + 1) if copies_weight else range(1, 2)
        self._cpu_steps = sorted({k * c for g in self.groups for c, _, _ in g.members for k in copies})
        self._memory_steps = sorted({k * m for g in self.groups for _, m, _ in g.members for k in copies})
        self._cache: dict[NodeView, float] = {}

    def of_state(self, state: NodeState) -> float:
        """F_n(M) of a node state."""
        return self.of_view(view_of(state))

    def after(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """F_n(M) of ``state`` once ``task`` is placed on ``picked``."""
        return self.of_view(view_after(state, task, picked))

    def of_view(self, view: NodeView) -> float:
        """F_n(M) of a node view (cached)."""
        cpu, memory, gpus = view
        if len(gpus) > _MAX_COPIES and self.copies_weight:
            key = view  # more copies than the steps cover could matter: no rounding
        else:
            key = (_step(self._cpu_steps, cpu), _step(self._memory_steps, memory), gpus)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            found = self._cache[key] = self._compute(key)
        return found

    def _compute(self, view: NodeView) -> float:
        cpu, memory, gpus = view
        unit = max((size for _, size, _, _ in gpus), default=0)  # the node's largest GPU
        milli = [free * MILLI_PER_GPU // unit if unit else 0 for _, _, free, _ in gpus]
        total = sum(milli)
        if not total:
            return 0.0
        usable = 0.0
        weight = self.copies_weight
        for group in self.groups:
            fitting = group.fitting_milli(gpus, milli)
            if len(fitting) < group.count:
                continue
            if weight < 1.0:
                usable += (1.0 - weight) * group.hostable(cpu, memory) * sum(fitting)
            if weight:
                usable += weight * group.usable_by_copies(sum(fitting), cpu, memory)
        if self.sliver_weight:
            return total - usable + self.sliver_weight * self._sliver(gpus)
        return total - usable

    def _sliver(self, gpus: tuple[GpuView, ...]) -> float:
        """Summed expected eventual sliver (:func:`sliver_table`) of the partly used GPUs."""
        out = 0.0
        for product, size, free, idle in gpus:
            if idle or free <= 0 or size <= 0:
                continue
            table = self._slivers.get((product, size))
            if table is None:
                table = self._slivers[(product, size)] = sliver_table(self._shares_on(product, size))
            out += table[min(MILLI_PER_GPU, free * MILLI_PER_GPU // size)]
        return out

    def _shares_on(self, product: str, size: int) -> list[tuple[int, float]]:
        """(per-GPU share in milli of a ``size`` MiB GPU, popularity) of the target's shapes a GPU of
        ``product`` could take one GPU of (whole GPUs: 1000; a memory request rounded up)."""
        out = []
        for group in self.groups:
            req = group.request
            if req.products and product not in req.products:
                continue
            need = need_mib(req, size) if not req.exclusive else size
            if need > size:
                continue
            share = max(1, -(-need * MILLI_PER_GPU // size))
            out.append((share, sum(p for _, _, p in group.members)))
        return out


def _step(steps: list[int], value: int) -> int:
    """The largest of ``steps`` not above ``value`` (-1 when none is); UNTRACKED stays."""
    if value == UNTRACKED:
        return value
    i = bisect_right(steps, value)
    return steps[i - 1] if i else -1
