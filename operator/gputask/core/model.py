"""Value types of the core: GPUs, nodes, task requests, PodSets, tasks and placements.

Units: GPU memory in MiB (int), GPU shares in milli-GPU (1000 = one whole GPU),
CPU in millicores, host memory in MiB, times in seconds (float, any epoch).
All values are frozen, slotted dataclasses so they can be shared between the
cluster state, snapshots and decisions without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NewType

from gputask.core.fit import Constraints, Taint

TaskKey = NewType("TaskKey", str)
"""``namespace/name`` of a GPUTask (or a trace pod's name)."""

NodeName = NewType("NodeName", str)
"""Name of a Kubernetes Node (and of its GPUNode)."""

MILLI_PER_GPU = 1000

MIG_PRODUCT_MARK = "-MIG-"
"""What a MIG device's product carries between its GPU's product and its profile
(``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb``, as NVIDIA's GPU Feature Discovery names it)."""


MIG_INDEX_STRIDE = 100
"""A MIG device's index on its node: ``100 x (parent GPU index + 1) + its NVML MIG device index`` (GPU 0's MIG
devices are 100, 101, ...; GPU 1's 200, ...; NVML numbers at most 8 under one GPU), so every device of a node,
MIG or not, is one integer in the GPUNode's ``gpus`` list and in placements."""


def is_mig_product(product: str) -> bool:
    """True for the product of a MIG device (a slice of a GPU in MIG mode, see :data:`MIG_PRODUCT_MARK`)."""
    return MIG_PRODUCT_MARK in product


def mig_device_index(parent_index: int, slot: int) -> int:
    """The node-wide index of MIG device ``slot`` (its NVML index under the parent) of GPU ``parent_index``."""
    return MIG_INDEX_STRIDE * (parent_index + 1) + slot


def mig_parent_index(index: int) -> int | None:
    """The parent GPU's index of the MIG device at node-wide ``index``; None for a GPU's own index."""
    return index // MIG_INDEX_STRIDE - 1 if index >= MIG_INDEX_STRIDE else None


def task_key(namespace: str, name: str) -> TaskKey:
    """Return the key ``namespace/name`` of a task."""
    return TaskKey(f"{namespace}/{name}")


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU device of a node.

    ``index`` is the NVML index on the node, ``memory_mib`` its total memory,
    ``foreign_mib`` memory held by processes gputask did not place (reported by the agent).
    """

    index: int
    uuid: str
    product: str
    memory_mib: int
    healthy: bool = True
    foreign_mib: int = 0


LINK_TYPES = ("NVLink", "PCIeSwitch", "HostBridge", "SameNUMANode", "CrossNUMA")
"""How two GPUs of a node are connected, best first (the agent's reading of NVML; ``nvidia-smi topo -m`` prints
them as ``NV<count>``, ``PIX``/``PXB``, ``PHB``, ``NODE`` and ``SYS``): NVLink (direct or through NVSwitches, with
the number of links), a path through PCIe switches only (NVML_TOPOLOGY_INTERNAL, _SINGLE, _MULTIPLE), through
one PCIe host bridge (_HOSTBRIDGE), through host bridges of one NUMA node (_NODE), across NUMA nodes or
sockets (_SYSTEM)."""


@dataclass(frozen=True, slots=True)
class GpuLink:
    """How GPUs ``a`` < ``b`` (NVML indices of one node; never MIG devices) are connected: ``kind`` one of
    :data:`LINK_TYPES`, ``count`` the NVLinks between them (0 for the other kinds)."""

    a: int
    b: int
    kind: str
    count: int = 0


@dataclass(frozen=True, slots=True)
class HostUse:
    """Node resources held by pods gputask did not place (DaemonSets, other workloads): millicores,
    MiB of memory, MiB of ephemeral-storage and pod count. They may leave, unlike allocatable."""

    cpu_milli: int = 0
    memory_mib: int = 0
    ephemeral_mib: int = 0
    pods: int = 0


NO_HOST_USE = HostUse()


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node as the scheduler sees it.

    ``cpu_milli``, ``memory_mib``, ``ephemeral_mib`` (MiB of ephemeral-storage) and ``pods`` are the
    Node's allocatable (the operator) or the trace's capacities (the replay); ``None`` means "not
    tracked" (unlimited). ``foreign_use`` is what pods gputask did not place request of them.
    ``labels`` (sorted pairs) and ``taints`` feed the NodeAffinity and TaintToleration
    filters (:mod:`gputask.core.fit`). ``schedulable`` is False for a node that is NotReady,
    cordoned, or whose GPUNode heartbeat is stale; ``unschedulable_reason`` then says which, for the
    wait messages (it never changes where anything is placed). ``links``: how pairs of its GPUs are connected,
    sorted by ``(a, b)`` (empty: not known, all pairs alike); among equal choices a multi-GPU pod gets the
    best-connected GPUs (:mod:`gputask.core.gpulinks`).
    """

    name: NodeName
    gpus: tuple[Gpu, ...]
    cpu_milli: int | None = None
    memory_mib: int | None = None
    labels: tuple[tuple[str, str], ...] = ()
    schedulable: bool = True
    unschedulable_reason: str = ""
    taints: tuple[Taint, ...] = ()
    ephemeral_mib: int | None = None
    pods: int | None = None
    foreign_use: HostUse = NO_HOST_USE
    links: tuple[GpuLink, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a task needs on each of ``count`` GPUs of one node.

    Exactly one of three shapes:
    - whole GPUs (``memory_mib`` and ``fraction_milli`` both None): each GPU exclusively;
    - ``memory_mib``: that many MiB on each GPU, sharing allowed;
    - ``fraction_milli``: that share (1..1000) of each GPU's memory, sharing allowed;
      1000 means the whole GPU and is treated as exclusive.

    ``products`` restricts the allowed GPU products (empty = any product but MIG devices: a MIG device
    has a fraction of a GPU's compute, so only a task that names its product gets one, as the device
    plugin's mixed strategy makes pods ask for ``nvidia.com/mig-<profile>`` by name). ``share_group`` names
    the tasks a shared (non-exclusive) request may share a GPU with: only tasks of the same group (``""``, the
    default group, shares with ``""`` only). The operator derives it from how the GPU is shared (CUDA MPS clients
    cannot share a GPU with processes outside MPS) and, with Dynamic Resource Allocation, from the namespace (one
    ResourceClaim holds a device, and a pod can use only claims of its own namespace). Exclusive requests ignore it.
    """

    count: int
    memory_mib: int | None = None
    fraction_milli: int | None = None
    products: frozenset[str] = field(default_factory=frozenset)
    share_group: str = ""

    @property
    def exclusive(self) -> bool:
        """True when each GPU must be free of any other task."""
        if self.memory_mib is not None:
            return False
        return self.fraction_milli is None or self.fraction_milli >= MILLI_PER_GPU

    def mib_on(self, gpu: Gpu) -> int:
        """MiB this request reserves on ``gpu`` (whole memory when exclusive; rounds up)."""
        if self.memory_mib is not None:
            return self.memory_mib
        if self.exclusive:
            return gpu.memory_mib
        assert self.fraction_milli is not None
        return -(-gpu.memory_mib * self.fraction_milli // MILLI_PER_GPU)

    def allows(self, product: str) -> bool:
        """True when ``product`` is allowed by ``products`` (with none given: every product but MIG devices')."""
        return product in self.products if self.products else MIG_PRODUCT_MARK not in product


MAIN_POD_SET = "main"
"""The name of the one PodSet of a task given by its shorthand fields (every GPUTask today)."""


@dataclass(frozen=True, slots=True)
class PodSet:
    """``count`` alike pods of a task (Kueue's ``PodSet``), each needing ``request`` on its node, and
    ``cpu_milli`` (millicores), ``memory_mib`` and ``ephemeral_mib`` (MiB) of host resources as
    kube-scheduler reckons them, on a node that meets ``constraints`` (None: any node without an
    untolerated taint)."""

    name: str
    count: int
    request: GpuRequest
    cpu_milli: int = 0
    memory_mib: int = 0
    ephemeral_mib: int = 0
    constraints: Constraints | None = None


@dataclass(frozen=True, slots=True)
class Task:
    """A unit of work to admit and place.

    A task runs as the pods of its PodSets (:attr:`podsets`, Kueue's ``Workload.spec.podSets``). With
    ``pod_sets`` empty (every GPUTask today) it is one PodSet :data:`MAIN_POD_SET` of one pod, whose
    shape the shorthand fields give: ``request`` (its GPUs), ``cpu_milli``/``memory_mib``/``ephemeral_mib``
    (its requests as kube-scheduler reckons them, 0 when not tracked) and ``constraints`` (what its pod
    template requires of a node: selector, affinity, tolerations; None: nothing, so no taint is
    tolerated). With ``pod_sets`` given (build it with :meth:`of_pod_sets`) the shorthand fields are
    the first PodSet's pod shape, checked on construction: code that places, charges or frees a task
    reads :attr:`pods`, never the shorthand alone. ``created`` orders tasks of equal priority (seconds);
    ``namespace_labels`` feeds queues' namespaceSelector.
    ``queue`` is the GPUClusterQueue that admits and charges it; ``local_queue`` the GPULocalQueue of
    the task's namespace it named, which resolved to ``queue`` (None: it named ``queue`` directly).
    ``flavor`` is the ResourceFlavor it is tried or admitted in (``""``: the queue's implicit one),
    ``card_mib`` that flavor's charging card size, ``unflavored`` the task before the flavor was
    applied (:func:`gputask.core.flavors.variant`; None for a task not in a flavor).
    ``movable`` is ``spec.disruption.movable``: the task may be moved (evicted and re-admitted elsewhere at once) to
    make room for a task that waits on fragmentation (:mod:`gputask.core.defrag`); None: its GPUClusterQueue's
    default (:attr:`~gputask.core.quota.QueueSpec.movable`).
    ``topology_required`` / ``topology_preferred`` name a node label key (``topology.kubernetes.io/zone``, a rack
    label, ``nvidia.com/gpu.clique``): required = every pod on nodes that share one value of it (a node without the
    label takes none); preferred = its pods on as few values (domains) as possible. At most one is set; None: any
    nodes (:mod:`gputask.core.gang` places them).
    """

    key: TaskKey
    queue: str
    request: GpuRequest
    priority: int = 0
    created: float = 0.0
    cpu_milli: int = 0
    memory_mib: int = 0
    namespace_labels: tuple[tuple[str, str], ...] = ()
    max_reschedules: int = 3
    ephemeral_mib: int = 0
    constraints: Constraints | None = None
    local_queue: str | None = None
    flavor: str = ""
    card_mib: int | None = None
    unflavored: Task | None = None
    pod_sets: tuple[PodSet, ...] = ()
    movable: bool | None = None
    topology_required: str | None = None
    topology_preferred: str | None = None

    def __post_init__(self) -> None:
        if self.topology_required is not None and self.topology_preferred is not None:
            raise ValueError(f"{self.key}: topology is required or preferred, not both")
        first = self.pod_sets[0] if self.pod_sets else None
        if first is not None and (first.request, first.cpu_milli, first.memory_mib, first.ephemeral_mib,
                                  first.constraints) != (self.request, self.cpu_milli, self.memory_mib,
                                                         self.ephemeral_mib, self.constraints):
            raise ValueError(f"{self.key}: the shorthand pod shape differs from PodSet {self.pod_sets[0].name!r}")

    @classmethod
    def of_pod_sets(cls, key: TaskKey, queue: str, pod_sets: tuple[PodSet, ...], **fields: Any) -> Task:
        """A task of ``pod_sets`` (one or more, names unique, counts >= 1); ``fields`` are the other fields.

        Raises ValueError for no PodSet, a repeated name or a count below 1.
        """
        if not pod_sets or len({p.name for p in pod_sets}) != len(pod_sets) or any(p.count < 1 for p in pod_sets):
            raise ValueError(f"{key}: PodSets need unique names and counts >= 1, got {pod_sets!r}")
        first = pod_sets[0]
        task = cls(key, queue, first.request, cpu_milli=first.cpu_milli, memory_mib=first.memory_mib,
                   ephemeral_mib=first.ephemeral_mib, constraints=first.constraints, pod_sets=pod_sets)
        return replace(task, **fields) if fields else task

    @property
    def main(self) -> PodSet:
        """The one-pod PodSet :data:`MAIN_POD_SET` the shorthand fields describe."""
        return PodSet(MAIN_POD_SET, 1, self.request, self.cpu_milli, self.memory_mib, self.ephemeral_mib,
                      self.constraints)

    @property
    def podsets(self) -> tuple[PodSet, ...]:
        """The task's PodSets in order: ``pod_sets``, or the one :attr:`main` PodSet."""
        return self.pod_sets or (self.main,)

    @property
    def pods(self) -> tuple[PodSet, ...]:
        """The PodSet of each pod, in PodSet and index order (a PodSet of count n appears n times): the order
        of :attr:`Placement.pods`."""
        if not self.pod_sets:
            return (self.main,)
        return tuple(p for p in self.pod_sets for _ in range(p.count))

    @property
    def pod_count(self) -> int:
        """How many pods the task runs (1 for a one-pod task)."""
        return sum(p.count for p in self.pod_sets) if self.pod_sets else 1

    @property
    def single_pod(self) -> bool:
        """True for a task of one pod (then :attr:`main` is its whole shape)."""
        return self.pod_count == 1

    def pod_task(self, pod: PodSet) -> Task:
        """A one-pod task of ``pod``'s shape with this task's key, queue, priority and flavor: what placement
        filters and scores for one pod of this task."""
        if not self.pod_sets:
            return self
        return replace(self, request=pod.request, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib,
                       ephemeral_mib=pod.ephemeral_mib, constraints=pod.constraints, pod_sets=(),
                       topology_required=None, topology_preferred=None)

    @property
    def topology(self) -> str | None:
        """The node label key of its topology, required or preferred (None: none)."""
        return self.topology_required or self.topology_preferred

    @property
    def gang(self) -> bool:
        """True when :mod:`gputask.core.gang` places it: several pods, or a required topology (which a one-pod task
        meets only on a node carrying the label)."""
        return not self.single_pod or self.topology_required is not None

    @property
    def fit_key(self) -> tuple[object, ...]:
        """Everything placement and quota read of the task: two tasks with equal keys fit the same nodes alike
        and charge the same quota (the flavor is part of it: two flavors alike to placement differ in quota)."""
        if self.pod_sets or self.topology is not None:
            return (self.podsets, self.flavor, self.card_mib, self.topology_required, self.topology_preferred)
        if self.flavor:
            return (self.request, self.cpu_milli, self.memory_mib, self.ephemeral_mib, self.constraints, self.flavor,
                    self.card_mib)
        return (self.request, self.cpu_milli, self.memory_mib, self.ephemeral_mib, self.constraints)

    @property
    def namespace(self) -> str:
        """The namespace part of the key ('' for keys without one)."""
        ns, _, _ = self.key.rpartition("/")
        return ns


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU of a placement: NVML index, UUID and MiB reserved on it."""

    index: int
    uuid: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod runs: its node and the exact GPUs (with MiB on each)."""

    node: NodeName
    gpus: tuple[GpuSlot, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        """GPU indices in placement order."""
        return tuple(g.index for g in self.gpus)


@dataclass(frozen=True, slots=True)
class Placement:
    """A concrete placement of a whole task: one :class:`PodPlacement` per pod, in the order of
    :attr:`Task.pods` (PodSet, then index). Never partial: every pod has its node and GPUs."""

    pods: tuple[PodPlacement, ...]

    @classmethod
    def one(cls, node: NodeName, gpus: tuple[GpuSlot, ...]) -> Placement:
        """The placement of a one-pod task on ``node``."""
        return cls((PodPlacement(node, gpus),))

    @property
    def nodes(self) -> tuple[NodeName, ...]:
        """The nodes the pods run on, each once, in pod order."""
        if len(self.pods) == 1:
            return (self.pods[0].node,)
        return tuple(dict.fromkeys(p.node for p in self.pods))

    def only(self) -> PodPlacement:
        """The one pod of a one-pod placement (a GPUTask's Job, its status and annotations name one node);
        raises ValueError for a placement of several pods."""
        if len(self.pods) != 1:
            raise ValueError(f"a placement of {len(self.pods)} pods has no single node")
        return self.pods[0]

    def on(self, node: NodeName) -> tuple[PodPlacement, ...]:
        """The pods placed on ``node``."""
        return tuple(p for p in self.pods if p.node == node)
