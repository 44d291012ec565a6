"""GPU memory budgets: a running task's pods against the memory its placement reserved on each GPU.

A task's budget on a GPU is what its placement reserved there (``GpuSlot.memory_mib``; a whole
GPU reserves all of it). The node agent reports how much memory each pod's processes use per GPU;
the adapter sums a task's pods per GPU index and asks :meth:`gputask.core.Scheduler.memory_used`.
Use beyond budget plus ``tolerance_mib`` is an overuse (each CUDA process holds a context of
several hundred MiB that no reservation counts: 526 MiB per process on an H200 with driver
580.159, bench/device_check.sh). Memory on a GPU of the node outside the placement has a budget
of 0: the task uses a GPU it was not given (its pinning was ignored).

With :data:`EVICT` the scheduler evicts an overusing task (reason :data:`GPU_MEMORY_EXCEEDED`,
counted against ``maxReschedules``: a task that keeps overusing ends Failed
MaxReschedulesExceeded rather than looping). With :data:`WARN` it only reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gputask.core.model import PodPlacement
from gputask.core.reasons import Reason

WARN, EVICT = "Warn", "Evict"
GPU_MEMORY_EXCEEDED = Reason.GPU_MEMORY_EXCEEDED


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """What to do with a task over budget (``action``: Warn or Evict) and the MiB allowed beyond it."""

    action: str = WARN
    tolerance_mib: int = 1024


@dataclass(frozen=True, slots=True)
class Overuse:
    """A task on GPU ``index`` (``uuid``; "" outside its placement) of ``node`` uses ``used_mib`` MiB, more than
    ``budget_mib`` plus the tolerance."""

    node: str
    index: int
    uuid: str
    used_mib: int
    budget_mib: int

    @property
    def over_mib(self) -> int:
        """MiB used beyond the budget (the tolerance not deducted)."""
        return self.used_mib - self.budget_mib


def overuses(placement: PodPlacement, used_by_index: Mapping[int, int], tolerance_mib: int) -> tuple[Overuse, ...]:
    """The GPUs on which ``used_by_index`` (MiB per GPU index of the pod's node) exceeds the pod's budget plus
    ``tolerance_mib``, in index order."""
    budget = {g.index: (g.uuid, g.memory_mib) for g in placement.gpus}
    found = []
    for index in sorted(used_by_index):
        uuid, mib = budget.get(index, ("", 0))
        if used_by_index[index] > mib + tolerance_mib:
            found.append(Overuse(placement.node, index, uuid, used_by_index[index], mib))
    return tuple(found)


def overuse_text(found: tuple[Overuse, ...], tolerance_mib: int) -> str:
    """``node-a GPU 0 (GPU-...): 13000 MiB used, budget 12288 MiB (+1024 MiB tolerance)``, joined by ``; ``."""
    parts = []
    for o in found:
        where = f"{o.node} GPU {o.index} ({o.uuid})" if o.uuid else f"{o.node} GPU {o.index}, not in its placement"
        parts.append(f"{where}: {o.used_mib} MiB used, budget {o.budget_mib} MiB (+{tolerance_mib} MiB tolerance)")
    return "; ".join(parts)


__all__ = ["EVICT", "GPU_MEMORY_EXCEEDED", "WARN", "MemoryBudget", "Overuse", "overuse_text", "overuses"]
