"""Placement: filter nodes and GPUs, then score them with a pluggable policy.

Shaped like the kube-scheduler framework (filter, score, reserve): :func:`feasible_gpus`
filters the GPUs of one node, a :class:`Policy` picks GPUs on a node and scores the
result (lower is better), and :func:`find_placement` returns the best node, ties going to
the smallest node name (then the lowest GPU index inside the node). Policies are plain
objects so the trace benchmark can compete them (issue "Beat FGD").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gputask.core.cluster import ClusterState, NodeState, slots_for
from gputask.core.model import MILLI_PER_GPU, GpuRequest, Placement, Task

QuotaCheck = Callable[[NodeState, Placement], "str | None"]
"""Returns None when a candidate placement fits quota, else the name of the resource that binds."""


def feasible_gpus(state: NodeState, task: Task) -> list[int]:
    """Positions of GPUs on ``state`` that could each hold one GPU of ``task``.

    Checks health, product, exclusivity (whole-GPU tasks need idle GPUs) and free MiB.
    Node-level checks (schedulable, CPU, host memory, count) are in :func:`node_fits`.
    """
    req = task.request
    gpus = state.node.gpus
    out: list[int] = []
    for pos, gpu in enumerate(gpus):
        if not req.allows(gpu.product):
            continue
        if req.exclusive:
            if state.is_idle(pos):
                out.append(pos)
        elif state.free_mib(pos) >= req.mib_on(gpu) and req.mib_on(gpu) <= gpu.memory_mib:
            out.append(pos)
    return out


def node_fits(state: NodeState, task: Task) -> bool:
    """Node-level filter: schedulable, enough GPUs at all, CPU and host memory free."""
    node = state.node
    if not node.schedulable or len(node.gpus) < task.request.count:
        return False
    cpu_free = state.cpu_free
    if cpu_free is not None and task.cpu_milli > cpu_free:
        return False
    mem_free = state.memory_free_mib
    return mem_free is None or task.memory_mib <= mem_free


def free_milli_after(state: NodeState, picked: Sequence[int], request: GpuRequest) -> int:
    """Free GPU capacity left on the node after placing, in milli-GPU summed over GPUs."""
    total = 0
    for pos, gpu in enumerate(state.node.gpus):
        if not gpu.healthy:
            continue
        free = state.free_mib(pos)
        if pos in picked:
            free = 0 if request.exclusive else free - request.mib_on(gpu)
        total += free * MILLI_PER_GPU // gpu.memory_mib if gpu.memory_mib else 0
    return total


def tightest(state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
    """Best fit inside a node: the ``count`` GPUs with the least free MiB, lowest index on ties."""
    ranked = sorted(feasible, key=lambda p: (state.free_mib(p), state.node.gpus[p].index))
    return tuple(ranked[: task.request.count])


class Policy(Protocol):
    """A placement policy: chooses GPUs on one node and scores the choice (lower is better)."""

    name: str

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Pick ``task.request.count`` positions out of ``feasible``."""
        ...

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Score placing ``task`` on ``picked`` of ``state``; lower is better."""
        ...


@dataclass
class BestFit:
    """Best fit: the node left with the least free GPU capacity (milli-GPU), tightest GPUs.

    The classic bin-packing heuristic (Johnson 1974); FGD's baseline "05-BestFit".
    """

    name: str = "bestfit"

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Tightest GPUs first."""
        return tightest(state, task, feasible)

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Free milli-GPU left on the node after placing."""
        return float(free_milli_after(state, picked, task.request))


@dataclass
class FirstFit:
    """First fit: the first feasible node in name order, lowest-index feasible GPUs."""

    name: str = "firstfit"
    stop_at_first: bool = True

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Lowest indices first."""
        return tuple(feasible[: task.request.count])

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """Constant: the name order decides."""
        return 0.0


@dataclass
class RandomFit:
    """Random: a uniformly random feasible node (FGD's "01-Random"), seeded for repeatability."""

    seed: int = 0
    name: str = "random"

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, state: NodeState, task: Task, feasible: Sequence[int]) -> tuple[int, ...]:
        """Random GPUs among the feasible ones."""
        return tuple(sorted(self._rng.sample(list(feasible), task.request.count)))

    def score(self, state: NodeState, task: Task, picked: Sequence[int]) -> float:
        """A fresh random number per candidate."""
        return self._rng.random()


POLICIES: dict[str, Callable[[], Policy]] = {
    "bestfit": BestFit,
    "firstfit": FirstFit,
    "random": RandomFit,
}
"""Policy factories by name; other modules register more (see :func:`register_policy`)."""

DEFAULT_POLICY = "bestfit"


def register_policy(name: str, factory: Callable[[], Policy]) -> None:
    """Make a policy available by name to the operator, scenarios and the simulator."""
    POLICIES[name] = factory


def make_policy(name: str) -> Policy:
    """Return a new policy instance; raises KeyError naming the known policies."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None


@dataclass(frozen=True, slots=True)
class Outcome:
    """Result of a placement search.

    ``placement`` is set when a node fits. Otherwise ``fits_somewhere`` says whether any node
    fitted physically (then ``quota_resource`` names the quota that refused every one).
    ``product_seen`` is False when no node carries an allowed product.
    """

    placement: Placement | None
    fits_somewhere: bool = False
    quota_resource: str | None = None
    product_seen: bool = True


def find_placement(
    cluster: ClusterState,
    task: Task,
    policy: Policy,
    *,
    quota: QuotaCheck | None = None,
    nodes: Sequence[NodeState] | None = None,
) -> Outcome:
    """Find the best placement of ``task`` over ``nodes`` (default: every node, name order).

    The best is the lowest ``(score, node name)``; ``quota`` rejects candidates that
    would exceed a queue's quota. Pure: the cluster is not changed.
    """
    best: tuple[float, str, Placement] | None = None
    fits_somewhere = False
    quota_resource: str | None = None
    product_seen = not task.request.products
    stop = getattr(policy, "stop_at_first", False)
    for state in cluster.sorted_nodes() if nodes is None else nodes:
        if not product_seen and any(task.request.allows(g.product) for g in state.node.gpus):
            product_seen = True
        if not node_fits(state, task):
            continue
        feasible = feasible_gpus(state, task)
        if len(feasible) < task.request.count:
            continue
        picked = policy.choose(state, task, feasible)
        placement = Placement(state.name, slots_for(state, task, picked))
        fits_somewhere = True
        if quota is not None:
            refused = quota(state, placement)
            if refused is not None:
                quota_resource = quota_resource or refused
                continue
        score = policy.score(state, task, picked)
        if best is None or (score, state.name) < best[:2]:
            best = (score, state.name, placement)
            if stop:
                break
    if best is not None:
        return Outcome(best[2], True)
    return Outcome(None, fits_somewhere, quota_resource, product_seen)
