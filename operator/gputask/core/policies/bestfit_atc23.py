"""Best fit as the FGD paper's baseline defines it ("05-BestFit"), for reproducing its figures.

Source: the FGD authors' simulator (hkust-adsl/kubernetes-scheduler-simulator, ``BestFitScore``):
a node's score is ``int(100 * (1 - (0.5 * cpu_left / 128 cores + 0.5 * gpu_left / 8 GPUs)))``
where ``cpu_left`` and ``gpu_left`` are what the node would have left after placing (free CPU,
and free milli-GPU summed over its GPUs); higher is better, ties to the smallest node name
(the min-max normalisation the simulator applies afterwards keeps the order). Inside the node:
the GPU with the least free share that fits (lowest index on ties), or the lowest-index idle GPUs.

It differs from :class:`gputask.core.placement.BestFit` (GPU capacity only, exact) by weighing
CPU as much as GPU and by rounding to 101 score levels, which makes many more ties; on the
default trace it leaves about a point more GPU unallocated. It is here only to check that the
replay reproduces the paper; it is not meant for the operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gputask.core.cluster import NodeState
from gputask.core.model import MILLI_PER_GPU, Task
from gputask.core.placement import PolicyBase, free_milli_after, tightest

MAX_SPEC_CPU_MILLI = 128_000
"""The simulator's CPU normalisation constant (128 cores)."""
MAX_SPEC_GPU_MILLI = 8 * MILLI_PER_GPU
"""The simulator's GPU normalisation constant (8 GPUs)."""


@dataclass
class BestFitAtc23(PolicyBase):
    """The FGD paper's best-fit baseline: CPU and GPU left after placing, equally weighted, rounded."""

    name: str = "bestfit-atc23"
    scores_by_state: bool = True

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """The tightest GPU for a shared task; the lowest-index idle GPUs for whole ones."""
        if task.request.exclusive:
            return tuple(feasible[: task.request.count])
        return tightest(state, task, feasible)

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Minus the simulator's integer score (lower is better here)."""
        cpu_free = state.cpu_free
        cpu_left = 0 if cpu_free is None else cpu_free - task.cpu_milli
        gpu_left = free_milli_after(state, picked, task.request)
        fraction = 0.5 * cpu_left / MAX_SPEC_CPU_MILLI + 0.5 * gpu_left / MAX_SPEC_GPU_MILLI
        return -float(int((1.0 - fraction) * 100.0))
