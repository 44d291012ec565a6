"""Replay of the Alibaba GPU cluster trace v2023 ("openb") through the core, FGD protocol.

The protocol is the one of the FGD paper (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23) and its simulator:

1. The cluster is ``openb_node_list_gpu_node.csv`` (1,213 nodes, 6,212 GPUs), with CPU and host
   memory tracked (core ``Node(cpu_milli=..., memory_mib=...)``).
2. Per seed, the pod list (in name order) is shuffled with ``random.Random(seed)``, then tuned to
   130% of the cluster's GPUs (total GPU demand, the sum of ``num_gpu * gpu_milli``): random
   copies of its pods, sampled with replacement from the same generator, are appended until the
   next copy would pass it, or, for a list already above it (multigpu30, 40, 50), random pods are
   removed until it is at most 130% (:func:`workload`). This is Python's Mersenne Twister, not the
   authors' Go ``math/rand``, so the orders differ from theirs: compare distributions over seeds,
   not single runs.
   The random policy is seeded with the same seed (its own ``random.Random(seed)``).
3. Pods arrive one at a time and never leave. Each goes to the core's ``find_placement`` with
   the policy under test and, when placed, is reserved in the core's ``ClusterState`` (the two
   steps ``Scheduler.cycle`` performs per task; the trace has no queues or quota, so the cycle's
   queue round trip is skipped). A pod that fits nowhere fails but still counts as arrived.
   CPU-only pods (``num_gpu`` 0) are placed too: they take CPU and memory only.
4. After every pod: arrived workload % (cumulative GPU requests, failed pods included, over the
   cluster's GPUs) and GPU allocation % (allocated milli-GPU over the cluster's milli-GPU). The
   figure "at 100% arrived" is, as in the authors' result files, the mean allocation over the
   events whose arrived % rounds to 100 (a missing bucket is filled from its neighbours +-1).

Unit mapping. Trace GPUs have no memory column; ``gpu_milli`` is a share of one GPU. Every trace
GPU is modelled as a core ``Gpu`` with ``memory_mib=1000``, so one core "MiB" is one milli-GPU
and the core's per-GPU MiB arithmetic is exactly the FGD simulator's milli-GPU arithmetic:
``gpu_milli < 1000`` becomes ``GpuRequest(1, fraction_milli=gpu_milli)`` (reserves ``gpu_milli``
"MiB" on one GPU, sharing allowed); ``num_gpu == 1, gpu_milli == 1000`` and every multi-GPU pod
become whole, exclusive GPUs; ``gpu_spec`` (``|``-separated models) becomes
``GpuRequest.products`` and each GPU's product is its node's ``model``; a target-workload shape
keeps ``gpu_spec`` as written, so ``V100M16|V100M32|V100M32`` and ``V100M16|V100M32`` count apart
(as the authors' ``PodResource.GpuType``) though they allow the same models.

Tie-break. The core breaks score ties by the smallest node name (``openb-node-NNNN``: name order
is numeric order). ``tie_break="random"`` instead prefixes every node name with a key drawn per
seed, so name order becomes a random node priority, as the authors' simulator does by renaming
nodes with a random prefix per run. Results move by tenths of a point between the two.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from gputask.core.cluster import ClusterState
from gputask.core.model import MILLI_PER_GPU, Gpu, GpuRequest, Node, NodeName, Task, TaskKey
from gputask.core.placement import candidate_rows, feasible_gpus, find_placement, make_policy, node_fits
from gputask.core.policies.workload import TaskShape

NODE_LIST = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"
TUNE_PCT = 130
"""Workload is tuned to this percentage of the cluster's GPUs (the paper's 1.3x)."""
GPU_MIB = MILLI_PER_GPU
"""Core memory of one trace GPU: 1000 "MiB", so one MiB is one milli-GPU."""
MAX_PCT = 130
"""The curve covers arrived workload 0..130%."""
TIE_BREAKS = ("name", "random")
QUEUE = "trace"


class TraceError(Exception):
    """The trace folder or one of its files is missing or malformed."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One row of a node list: name, host resources, GPU count and model."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of a pod list (only the columns the FGD protocol reads)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] = frozenset()
    gpu_spec_text: str = ""
    """``gpu_spec`` as written in the file (default: the models sorted, ``|``-joined)."""

    def __post_init__(self) -> None:
        if not self.gpu_spec_text and self.gpu_spec:
            object.__setattr__(self, "gpu_spec_text", "|".join(sorted(self.gpu_spec)))

    @property
    def demand_milli(self) -> int:
        """GPU demand in milli-GPU: ``num_gpu * gpu_milli``."""
        return self.num_gpu * self.gpu_milli


@dataclass(slots=True)
class RunResult:
    """Outcome of one (policy, seed) replay.

    ``curve[p]`` is the mean allocation % over events whose arrived % rounds to ``p``
    (``p`` in 0..130; None when neither the bucket nor its neighbours had an event).
    ``failed`` lists the keys of the pods that fitted nowhere, in arrival order.
    """

    policy: str
    seed: int
    tie_break: str
    pods: int
    failed: list[str] = field(default_factory=list)
    refused_feasible: int = 0
    curve: list[float | None] = field(default_factory=list)

    @property
    def failed_pods(self) -> int:
        """How many pods fitted nowhere."""
        return len(self.failed)

    @property
    def allocation_at_100(self) -> float:
        """Allocation % at 100% arrived workload (NaN when the run never got there)."""
        value = self.curve[100] if len(self.curve) > 100 else None
        return float("nan") if value is None else value

    @property
    def unallocated_at_100(self) -> float:
        """Unallocated GPU % at 100% arrived workload: 100 minus the allocation."""
        return 100.0 - self.allocation_at_100


# -- reading the trace ---------------------------------------------------------------------------
def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            return list(csv.DictReader(handle))
    except FileNotFoundError:
        raise TraceError(f"{path} not found") from None


def read_nodes(path: Path) -> list[TraceNode]:
    """Read a node list (``sn, cpu_milli, memory_mib, gpu, model``)."""
    try:
        return [
            TraceNode(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
            for r in _rows(path)
        ]
    except (KeyError, ValueError) as err:
        raise TraceError(f"{path}: not a node list ({err})") from None


def read_pods(path: Path) -> list[TracePod]:
    """Read a pod list; ``gpu_spec`` may be absent (the ``multigpu*`` files)."""
    try:
        return [
            TracePod(
                r["name"],
                int(r["cpu_milli"]),
                int(r["memory_mib"]),
                int(r["num_gpu"]),
                int(r["gpu_milli"]),
                frozenset(m for m in (r.get("gpu_spec") or "").split("|") if m),
                r.get("gpu_spec") or "",
            )
            for r in _rows(path)
        ]
    except (KeyError, ValueError) as err:
        raise TraceError(f"{path}: not a pod list ({err})") from None


@lru_cache(maxsize=8)
def load_trace(trace_dir: str, pods_file: str) -> tuple[tuple[TraceNode, ...], tuple[TracePod, ...]]:
    """Nodes and pods of one trace, read once per process (worker processes reuse them)."""
    root = Path(trace_dir)
    return tuple(read_nodes(root / NODE_LIST)), tuple(read_pods(root / pods_file))


# -- building the run ----------------------------------------------------------------------------
def tie_break_keys(names: Sequence[str], seed: int) -> dict[str, str]:
    """A random, seed-determined priority prefix per node name (same seed, same prefixes)."""
    rng = random.Random(f"tie-break:{seed}")
    return {name: f"{rng.getrandbits(48):012x}" for name in names}


def build_nodes(nodes: Iterable[TraceNode], *, tie_break: str = "name", seed: int = 0) -> list[Node]:
    """Core nodes for the trace's nodes: 1000 "MiB" per GPU, CPU and memory tracked.

    With ``tie_break="random"`` each name gets a seed-dependent prefix so that the core's
    smallest-name tie-break becomes a random node priority.
    """
    nodes = list(nodes)
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie-break must be one of {TIE_BREAKS}, not {tie_break!r}")
    prefix = tie_break_keys([n.name for n in nodes], seed) if tie_break == "random" else {}
    out = []
    for n in nodes:
        name = f"{prefix[n.name]}-{n.name}" if prefix else n.name
        gpus = tuple(Gpu(i, f"{name}/gpu{i}", n.model, GPU_MIB) for i in range(n.gpus))
        out.append(Node(NodeName(name), gpus, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib))
    return out


def request_of(pod: TracePod) -> GpuRequest:
    """The core request of a pod (see the module docstring for the unit mapping)."""
    if pod.num_gpu == 1 and pod.gpu_milli < MILLI_PER_GPU:
        return GpuRequest(1, fraction_milli=pod.gpu_milli, products=pod.gpu_spec)
    return GpuRequest(pod.num_gpu, products=pod.gpu_spec)


def target_shape(pod: TracePod) -> TaskShape:
    """A pod's shape for a target workload: GPU request, CPU and memory (a policy may drop memory),
    labelled with ``gpu_spec`` as written, which the FGD authors' simulator keys shapes by."""
    return TaskShape(request_of(pod), pod.cpu_milli, pod.memory_mib, pod.gpu_spec_text)


def workload(
    pods: Sequence[TracePod], seed: int, capacity_milli: int, *, tune_pct: int = TUNE_PCT
) -> list[tuple[str, TracePod]]:
    """Arrival order for one seed: the shuffled pods, tuned to ``tune_pct`` % of ``capacity_milli``.

    Returns ``(key, pod)`` pairs. As the authors' simulator (``TunePodsByNodeTotalResource``):
    below the target, random copies (keyed ``NAME-tuned-I``) are appended, drawn with replacement
    until the next one would push total demand past the target (a copy of a CPU-only pod never
    does); above it (multigpu30, 40 and 50: 130.2%, 152% and 183% of the GPUs), random pods are
    removed from the shuffled list, keeping the others' order, until the demand is at most the
    target. The authors' Go code compares only a copy's per-GPU share with the target, so its last
    multi-GPU copy can overshoot by a few GPUs; this compares the copy's whole demand.
    """
    rng = random.Random(seed)
    order = sorted(pods, key=lambda p: p.name)
    rng.shuffle(order)
    total = sum(p.demand_milli for p in order)
    limit = tune_pct * capacity_milli  # compare total * 100 against it: exact integers
    while order and total * 100 > limit:
        total -= order.pop(rng.randrange(len(order))).demand_milli
    out = [(p.name, p) for p in order]
    if not order or total * 100 >= limit:
        return out
    if all(p.demand_milli == 0 for p in order):
        return out
    i = 0
    while True:
        pod = order[rng.randrange(len(order))]
        if (total + pod.demand_milli) * 100 > limit:
            return out
        total += pod.demand_milli
        out.append((f"{pod.name}-tuned-{i}", pod))
        i += 1


# -- the replay ----------------------------------------------------------------------------------
class Curve:
    """Allocation % per rounded arrived % (0..MAX_PCT), averaged over scheduling events."""

    def __init__(self, capacity_milli: int) -> None:
        self.capacity = capacity_milli
        self.sums = [0.0] * (MAX_PCT + 1)
        self.counts = [0] * (MAX_PCT + 1)

    def add(self, arrived_milli: int, allocated_milli: int) -> None:
        """Record one event (round half up, exact in integers)."""
        bucket = (200 * arrived_milli + self.capacity) // (2 * self.capacity)
        if bucket <= MAX_PCT:
            self.sums[bucket] += 100.0 * allocated_milli / self.capacity
            self.counts[bucket] += 1

    def values(self) -> list[float | None]:
        """Mean per bucket; an empty bucket takes the mean of its non-empty neighbours."""
        means = [s / c if c else None for s, c in zip(self.sums, self.counts, strict=True)]
        out: list[float | None] = []
        for p, value in enumerate(means):
            if value is None:
                near = [v for v in means[max(0, p - 1) : p + 2] if v is not None]
                value = sum(near) / len(near) if near else None
            out.append(value)
        return out


@dataclass(slots=True)
class FeasibilityMemo:
    """Plain feasibility scan for failed pods, with a memo of shapes known not to fit anywhere.

    Pods only arrive, so free capacity only shrinks: a request shape that fits nowhere now
    fits nowhere later, and the memo is exact.
    """

    cluster: ClusterState
    nowhere: set[tuple[GpuRequest, int, int]] = field(default_factory=set)

    def fits_somewhere(self, task: Task) -> bool:
        """True when some node could hold ``task`` now (core ``node_fits``/``feasible_gpus``)."""
        shape = (task.request, task.cpu_milli, task.memory_mib)
        if shape in self.nowhere:
            return False
        index = self.cluster.index()
        for row in candidate_rows(index, task):
            state = index.states[row]
            if node_fits(state, task) and len(feasible_gpus(state, task)) >= task.request.count:
                return True
        self.nowhere.add(shape)
        return False


def replay(
    nodes: Sequence[Node],
    arrivals: Sequence[tuple[str, TracePod]],
    policy_name: str,
    *,
    seed: int,
    tie_break: str = "name",
    target_pods: Sequence[TracePod] = (),
) -> RunResult:
    """Schedule ``arrivals`` one by one on a fresh cluster of ``nodes`` with one policy.

    A policy that packs for a target workload (``set_workload``) gets the shapes of
    ``target_pods`` (the pod list before tuning, as the FGD authors' simulator does).
    """
    cluster = ClusterState(nodes)
    policy = make_policy(policy_name, seed=seed)
    policy.set_workload([target_shape(pod) for pod in target_pods])
    capacity = GPU_MIB * sum(len(n.gpus) for n in nodes)
    curve = Curve(capacity)
    memo = FeasibilityMemo(cluster)
    requests = {pod: request_of(pod) for _, pod in arrivals}
    arrived = allocated = refused = 0
    failed: list[str] = []
    for key, pod in arrivals:
        task = Task(TaskKey(key), QUEUE, requests[pod], cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)
        placement = find_placement(cluster, task, policy).placement
        arrived += pod.demand_milli
        if placement is None:
            failed.append(key)
            refused += memo.fits_somewhere(task)
        else:
            cluster.reserve(task, placement)
            allocated += sum(slot.memory_mib for pod in placement.pods for slot in pod.gpus)
        curve.add(arrived, allocated)
    return RunResult(policy_name, seed, tie_break, len(arrivals), failed, refused, curve.values())


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One (trace, policy, seed) run, picklable for a process pool."""

    trace_dir: str
    pods_file: str
    policy: str
    seed: int
    tie_break: str = "name"


def run(spec: RunSpec) -> RunResult:
    """Load the trace (cached per process), build the run's workload and replay it."""
    trace_nodes, pods = load_trace(spec.trace_dir, spec.pods_file)
    nodes = build_nodes(trace_nodes, tie_break=spec.tie_break, seed=spec.seed)
    capacity = GPU_MIB * sum(len(n.gpus) for n in nodes)
    arrivals = workload(pods, spec.seed, capacity)
    return replay(nodes, arrivals, spec.policy, seed=spec.seed, tie_break=spec.tie_break, target_pods=pods)
