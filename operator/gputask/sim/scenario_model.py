"""The scenario file (DESIGN.md section 6): pydantic models, loading and reference checks.

:func:`load_scenario` turns a YAML file or a dict into a validated :class:`Scenario`, or
raises :class:`ScenarioError` with one line per problem, each naming where it is
(``events[3].at: ...``). Fields the CRDs do not declare in task, queue and flavor specs
are refused as ``kubectl apply`` refuses them (:func:`check_unknown_fields`). The rest of a
submitted GPUTask's ``spec`` is left to the run: it goes through the operator's own
conversion (``manifests.convert.task_from_manifest``), so an invalid spec is a task Rejected
at run time, exactly as the operator would treat it.

Besides the shape, :func:`check_references` walks the events in run order and refuses
what no API server would accept: deleting a task that does not exist, submitting a name
that is still there, or naming a node (or GPU index) that does not exist (any more).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from gputask.core import Gpu, InvalidQueueError, Node, NodeName, QueueSpec
from gputask.core.fit import Taint
from gputask.core.flavors import Flavor
from gputask.core.model import MIG_PRODUCT_MARK, GpuLink, mig_device_index, mig_parent_index
from gputask.manifests.convert import (
    MAX_GPU_MEMORY_MIB,
    MIB,
    flavor_from_manifest,
    quantity,
    queue_from_manifest,
    to_mib,
)
from gputask.manifests.unknown_fields import crd_schema, prune

HOSTNAME_LABEL = "kubernetes.io/hostname"
EVENT_KINDS = (
    "submit", "delete", "nodeDown", "nodeUp", "nodeDeleted", "gpuUnhealthy", "nodeUpdate", "restartOperator",
)

MAX_SECONDS = 1e9
"""The latest simulated time a scenario may name (about 31 years): later ones lose sub-second precision."""

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _subdomain(value: str) -> str:
    if len(value) > 253 or not _SUBDOMAIN.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kubernetes name: lower-case letters, digits, '-' and '.', starting "
                         "and ending with a letter or digit, at most 253 characters")
    return value


def _label(value: str) -> str:
    if len(value) > 63 or not _LABEL.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kubernetes namespace name: lower-case letters, digits and '-', "
                         "starting and ending with a letter or digit, at most 63 characters")
    return value


KubeName = Annotated[str, AfterValidator(_subdomain)]
"""A Kubernetes object name (DNS subdomain, RFC 1123): nodes, queues, flavors, priority classes, tasks."""
Namespace = Annotated[str, AfterValidator(_label)]
"""A namespace name (DNS label, RFC 1123)."""


class ScenarioError(Exception):
    """The scenario file is unreadable or invalid; the message says where (one line per problem)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MigSpec(_Strict):
    """One MIG device of a GPU in MIG mode: its profile (``1g.10gb``) and memory (a quantity)."""

    profile: str = Field(min_length=1, pattern=r"^[0-9a-z.+-]+$")
    memory: Any = Field(description="a quantity; checked by manifests.convert.to_mib when loading")


class GpuSpec(_Strict):
    """One GPU of a node; ``memory`` is a Kubernetes quantity (``24Gi``). With ``mig`` the GPU is in MIG
    mode: it takes no work itself and each MIG device is a device of its own (index
    :func:`~gputask.core.model.mig_device_index`, UUID ``MIG-<node>-<gpu>-<n>``, product
    ``<product>-MIG-<profile>``), as the agent reports them."""

    product: str = Field("unknown", min_length=1)
    memory: Any = Field(description="a quantity; checked by manifests.convert.to_mib when loading")
    mig: list[MigSpec] | None = Field(None, max_length=8)


class TaintSpec(_Strict):
    """A node taint, as in core/v1: ``key``, ``value`` (may be empty), ``effect``."""

    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class LinkSpec(_Strict):
    """How GPUs ``a`` and ``b`` (indices of the node's GPUs) are connected, as the agent reports it in the
    GPUNode's ``links``: ``type`` one of :data:`~gputask.core.model.LINK_TYPES`, ``count`` the NVLinks (NVLink
    only, required there)."""

    a: Annotated[int, Field(ge=0)]
    b: Annotated[int, Field(ge=0)]
    type: Literal["NVLink", "PCIeSwitch", "HostBridge", "SameNUMANode", "CrossNUMA"]
    count: Annotated[int, Field(ge=1)] | None = None


class NodeSpec(_Strict):
    """A GPU node; its GPUs get index = position and UUID ``GPU-<node>-<index>``.

    ``cpu``, ``memory`` (quantities) and ``pods`` are its allocatable; absent means unlimited.
    ``labels``, ``taints`` and ``unschedulable`` (cordoned) as on a v1 Node; ``kubernetes.io/hostname``
    is the node's name unless ``labels`` says otherwise, as the kubelet labels every Node. ``links``: how
    pairs of its GPUs are connected (absent: not known, every pair alike).
    """

    name: KubeName
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuSpec] = Field(min_length=1)
    cpu: Any = None
    memory: Any = None
    pods: Annotated[int, Field(ge=0)] | None = None
    taints: list[TaintSpec] = Field(default_factory=list)
    unschedulable: StrictBool = False
    links: list[LinkSpec] = Field(default_factory=list)


class NodeUpdate(_Strict):
    """``nodeUpdate``: replace the given fields of a node at that instant (label, taint, cordon)."""

    name: KubeName
    labels: dict[str, str] | None = None
    taints: list[TaintSpec] | None = None
    unschedulable: StrictBool | None = None


class QueueEntry(_Strict):
    """A GPUClusterQueue: its name and its spec as in the CRD."""

    name: KubeName
    spec: dict[str, Any] = Field(default_factory=dict)


class FlavorEntry(_Strict):
    """A GPUResourceFlavor: its name and its spec as in the CRD."""

    name: KubeName
    spec: dict[str, Any] = Field(default_factory=dict)


class PriorityClassSpec(_Strict):
    """A PriorityClass (or Kueue WorkloadPriorityClass): name and value."""

    name: KubeName
    value: int


class TaskMetadata(BaseModel):
    """The metadata of a submitted GPUTask (other metadata fields are accepted and ignored).

    ``creationTimestamp`` is either seconds of simulated time or an RFC 3339 string;
    omitted, the task is created at its event's ``at``.
    """

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    name: KubeName
    namespace: Namespace = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: str | Seconds | None = Field(None, alias="creationTimestamp")

    @field_validator("creation_timestamp")
    @classmethod
    def _rfc3339(cls, value: str | float | None) -> str | float | None:
        if isinstance(value, str):
            try:
                dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"{value!r} is neither seconds nor an RFC 3339 time") from None
        return value


class Submit(_Strict):
    """A GPUTask (metadata + spec as in the CRD) plus ``duration``: seconds of running.

    ``duration`` omitted means the task runs until the end of the scenario. After an
    eviction the task starts over: it runs its full duration from its next admission.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: str | None = Field(None, alias="apiVersion")
    kind: str | None = None
    metadata: TaskMetadata
    spec: Any = None
    duration: Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)] | None = None

    @property
    def key(self) -> str:
        """``namespace/name`` of the task."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def manifest(self) -> dict[str, Any]:
        """The GPUTask object as the operator would read it from the API."""
        meta = self.metadata.model_dump(by_alias=True, exclude_none=True)
        return {"metadata": meta, "spec": self.spec}


class TaskRef(_Strict):
    """Name and namespace of a task."""

    name: KubeName
    namespace: Namespace = "default"

    @property
    def key(self) -> str:
        """``namespace/name`` of the task."""
        return f"{self.namespace}/{self.name}"


class NodeRef(_Strict):
    """A node by name."""

    name: KubeName


class GpuRef(_Strict):
    """One GPU: node name and GPU index."""

    node: KubeName
    index: int = Field(ge=0)


class Nothing(_Strict):
    """An event without parameters (``restartOperator: {}``)."""


class Event(_Strict):
    """One event: ``at`` (seconds of simulated time) and exactly one kind."""

    at: Seconds
    submit: Submit | None = None
    delete: TaskRef | None = None
    node_down: NodeRef | None = Field(None, alias="nodeDown")
    node_up: NodeRef | None = Field(None, alias="nodeUp")
    node_deleted: NodeRef | None = Field(None, alias="nodeDeleted")
    gpu_unhealthy: GpuRef | None = Field(None, alias="gpuUnhealthy")
    node_update: NodeUpdate | None = Field(None, alias="nodeUpdate")
    restart_operator: Nothing | None = Field(None, alias="restartOperator")

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return raw
        unknown = [k for k in raw if k != "at" and k not in EVENT_KINDS]
        if unknown:
            raise ValueError(f"unknown event kind {unknown[0]!r}; known: {', '.join(EVENT_KINDS)}")
        kinds = [k for k in raw if k in EVENT_KINDS]
        if len(kinds) != 1:
            raise ValueError(f"an event needs exactly one of {', '.join(EVENT_KINDS)}; got {kinds or 'none'}")
        if raw[kinds[0]] is None:  # `restartOperator:` with nothing after it reads as null in YAML
            return {**raw, kinds[0]: {}}
        return raw

    @property
    def kind(self) -> str:
        """The event's kind, as spelled in the file."""
        return next(k for k in EVENT_KINDS if getattr(self, _FIELD_OF[k]) is not None)

    @property
    def body(self) -> BaseModel:
        """The event's parameters."""
        value: BaseModel = getattr(self, _FIELD_OF[self.kind])
        return value


_FIELD_OF = {
    "submit": "submit",
    "delete": "delete",
    "nodeDown": "node_down",
    "nodeUp": "node_up",
    "nodeDeleted": "node_deleted",
    "gpuUnhealthy": "gpu_unhealthy",
    "nodeUpdate": "node_update",
    "restartOperator": "restart_operator",
}


class Scenario(_Strict):
    """A whole scenario file; ``until`` (seconds) ends the run."""

    nodes: list[NodeSpec]
    queues: list[QueueEntry] = Field(default_factory=list)
    resource_flavors: list[FlavorEntry] = Field(default_factory=list, alias="resourceFlavors")
    priority_classes: list[PriorityClassSpec] = Field(default_factory=list, alias="priorityClasses")
    events: list[Event] = Field(default_factory=list)
    until: Seconds

    @model_validator(mode="after")
    def _unique_names(self) -> Scenario:
        for what, names in (
            ("nodes", [n.name for n in self.nodes]),
            ("queues", [q.name for q in self.queues]),
            ("resourceFlavors", [f.name for f in self.resource_flavors]),
            ("priorityClasses", [p.name for p in self.priority_classes]),
        ):
            dup = _first_duplicate(names)
            if dup is not None:
                raise ValueError(f"{what}: name {dup!r} appears twice")
        return self

    def ordered_events(self) -> list[tuple[int, Event]]:
        """Events with their file index, sorted by ``at`` (file order for ties)."""
        return sorted(enumerate(self.events), key=lambda pair: pair[1].at)


def _first_duplicate(names: Iterable[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def load_scenario(source: Path | Mapping[str, Any] | Scenario) -> Scenario:
    """Read and validate a scenario (file, dict or model); raises ScenarioError."""
    if isinstance(source, Scenario):
        return source
    raw: Any = source
    if isinstance(source, Path):
        try:
            raw = yaml.safe_load(source.read_text())
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ScenarioError(f"not valid YAML: {exc.problem or exc.context}{where}") from None
        except UnicodeDecodeError as exc:
            raise ScenarioError(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
        except (OSError, yaml.YAMLError) as exc:
            raise ScenarioError(str(exc)) from None
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"expected a mapping at the top level, got {type(raw).__name__}")
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError("\n".join(_error_line(e) for e in exc.errors())) from None
    check_unknown_fields(scenario)
    check_references(scenario)
    core_nodes(scenario)  # quantities and queue specs: refuse them now, not mid-run
    core_queues(scenario)
    core_flavors(scenario)
    return scenario


def _error_line(error: Mapping[str, Any]) -> str:
    where = _location(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    return f"{where}: {message}" if where else message


def _location(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "union[", "nullable[")) and part not in _TYPE_TAGS:
            out += f".{part}" if out else str(part)
    return out


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list"}


def check_unknown_fields(scenario: Scenario) -> None:
    """Refuse fields the CRDs do not declare in task, queue and flavor specs, as kubectl apply does (a
    misspelled ``gpuMemroy`` would otherwise run the task as a whole GPU); raises ScenarioError naming each
    (``events[0].submit.spec.gpuMemroy: unknown field (not in the GPUTask CRD)``)."""
    specs: list[tuple[str, str, Any]] = [
        (f"events[{i}].submit.spec", "GPUTask", event.submit.spec)
        for i, event in enumerate(scenario.events) if event.submit is not None
    ]
    specs += [(f"queues[{i}].spec", "GPUClusterQueue", q.spec) for i, q in enumerate(scenario.queues)]
    flavors = scenario.resource_flavors
    specs += [(f"resourceFlavors[{i}].spec", "GPUResourceFlavor", f.spec) for i, f in enumerate(flavors)]
    problems = []
    for where, kind, spec in specs:
        unknown = prune({"spec": copy.deepcopy(spec)}, crd_schema(kind)) if isinstance(spec, Mapping) else []
        problems += [f"{where}{path.removeprefix('spec')}: unknown field (not in the {kind} CRD)" for path in unknown]
    if problems:
        raise ScenarioError("\n".join(problems))


def check_references(scenario: Scenario) -> None:
    """Refuse events that name tasks, nodes or GPUs that do not exist at their time."""
    gpus = {n.name: _indices(n) for n in scenario.nodes}
    live: set[str] = set()
    problems: list[str] = []
    for i, event in scenario.ordered_events():
        where = f"events[{i}] (at {event.at:g}, {event.kind})"
        body = event.body
        if isinstance(body, Submit):
            if body.key in live:
                problems.append(f"{where}: task {body.key} already exists (delete it first)")
            live.add(body.key)
        elif isinstance(body, TaskRef):
            if body.key not in live:
                problems.append(f"{where}: no task {body.key} to delete")
            live.discard(body.key)
        elif isinstance(body, NodeRef | GpuRef | NodeUpdate):
            name = body.node if isinstance(body, GpuRef) else body.name
            if name not in gpus:
                problems.append(f"{where}: no node {name!r}")
            elif isinstance(body, GpuRef) and body.index not in gpus[name]:
                problems.append(f"{where}: node {name!r} has no GPU {body.index} (it has {_index_text(gpus[name])})")
            if event.kind == "nodeDeleted":
                gpus.pop(name, None)
        if event.at > scenario.until:
            problems.append(f"{where}: after until ({scenario.until:g})")
    if problems:
        raise ScenarioError("\n".join(problems))


def _indices(node: NodeSpec) -> list[int]:
    """The device indices of a node spec: its GPUs by position, then each GPU's MIG devices."""
    migs = [mig_device_index(j, k) for j, gpu in enumerate(node.gpus) for k in range(len(gpu.mig or ()))]
    return [*range(len(node.gpus)), *migs]


def _index_text(indices: list[int]) -> str:
    physical = sum(1 for i in indices if mig_parent_index(i) is None)
    migs = [i for i in indices if mig_parent_index(i) is not None]
    return f"{physical}" + (f", and MIG devices {migs}" if migs else "")


def fifo_baseline(scenario: Scenario) -> Scenario:
    """The same scenario for the strict FIFO baseline: whole GPUs only, every queue StrictFIFO."""
    queues = [q.model_copy(update={"spec": {**q.spec, "queueingStrategy": "StrictFIFO"}}) for q in scenario.queues]
    return scenario.model_copy(update={"queues": queues, "events": [_whole_gpus(e) for e in scenario.events]})


def _whole_gpus(event: Event) -> Event:
    if event.submit is None or not isinstance(event.submit.spec, Mapping):
        return event
    spec = _whole(event.submit.spec)
    if isinstance(spec.get("podSets"), list):
        spec["podSets"] = [_whole(p) if isinstance(p, Mapping) else p for p in spec["podSets"]]
    return event.model_copy(update={"submit": event.submit.model_copy(update={"spec": spec})})


def _whole(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` (a spec or one of its podSets) without gpuMemory and gpuFraction: whole GPUs."""
    return {k: v for k, v in fields.items() if k not in ("gpuMemory", "gpuFraction")}


def scenario_gpus(scenario: Scenario) -> dict[tuple[str, int], Gpu]:
    """Every simulated GPU of the scenario by (node name, index); raises ScenarioError."""
    return {(node.name, gpu.index): gpu for node in core_nodes(scenario) for gpu in node.gpus}


def core_nodes(scenario: Scenario) -> list[Node]:
    """Core Nodes of the scenario: GPU index = position, UUID ``GPU-<node>-<index>``."""
    nodes = []
    for i, spec in enumerate(scenario.nodes):
        gpus: list[Gpu] = []
        for j, gpu in enumerate(spec.gpus):
            memory = _device_mib(gpu.memory, f"nodes[{i}].gpus[{j}].memory")
            product = gpu.product.replace(" ", "-")
            gpus.append(Gpu(j, f"GPU-{spec.name}-{j}", product, memory, healthy=gpu.mig is None))
            migs = [_device_mib(m.memory, f"nodes[{i}].gpus[{j}].mig[{k}].memory") for k, m in enumerate(gpu.mig or ())]
            if sum(migs) > memory:
                raise ScenarioError(f"nodes[{i}].gpus[{j}].mig: its MIG devices have {sum(migs)} MiB, more than the "
                                    f"GPU's {memory} MiB")
            for k, (mig, mib) in enumerate(zip(gpu.mig or (), migs, strict=True)):
                mig_product = f"{product}{MIG_PRODUCT_MARK}{mig.profile}"
                gpus.append(Gpu(mig_device_index(j, k), f"MIG-{spec.name}-{j}-{k}", mig_product, mib))
        try:
            cpu = None if spec.cpu is None else math.floor(_allocatable(spec.cpu, f"nodes[{i}].cpu") * 1000)
            host = None if spec.memory is None else math.floor(_allocatable(spec.memory, f"nodes[{i}].memory") / MIB)
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
        node = Node(NodeName(spec.name), tuple(gpus), cpu_milli=cpu, memory_mib=host, pods=spec.pods,
                    links=_links(spec, f"nodes[{i}]"))
        labels = {HOSTNAME_LABEL: spec.name, **spec.labels}  # as the kubelet labels every Node
        nodes.append(updated(node, labels=labels, taints=spec.taints, unschedulable=spec.unschedulable))
    return nodes


def _links(spec: NodeSpec, where: str) -> tuple[GpuLink, ...]:
    """The node's links sorted by pair; ScenarioError for a GPU it lacks, a pair twice, or a count missing on
    NVLink or given on another type."""
    found: dict[tuple[int, int], GpuLink] = {}
    for k, link in enumerate(spec.links):
        at = f"{where}.links[{k}]"
        pair = (min(link.a, link.b), max(link.a, link.b))
        if link.a == link.b or pair[1] >= len(spec.gpus):
            raise ScenarioError(f"{at}: a and b must be two different GPUs of 0..{len(spec.gpus) - 1}")
        if (link.type == "NVLink") != (link.count is not None):
            raise ScenarioError(f"{at}: count (the NVLinks) is required on type NVLink and only there")
        if pair in found:
            raise ScenarioError(f"{at}: GPUs {pair[0]} and {pair[1]} are linked twice")
        found[pair] = GpuLink(pair[0], pair[1], link.type, link.count or 0)
    return tuple(found[pair] for pair in sorted(found))


def _device_mib(value: Any, field: str) -> int:
    """MiB of a device's ``memory`` quantity; ScenarioError below 1Mi, above 1Ti (the operator's bound) or
    malformed."""
    try:
        memory = to_mib(value, field=field)
        if quantity(value, field=field) < MIB:
            raise ValueError(f"{field}: {value!r} is less than 1Mi (a bare number is bytes; write e.g. 24Gi)")
        if memory > MAX_GPU_MEMORY_MIB:
            raise ValueError(f"{field}: {value!r} is more than any GPU has (limit 1Ti)")
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    return memory


def _allocatable(value: Any, field: str) -> Decimal:
    amount = quantity(value, field=field)
    if amount < 0:
        raise ValueError(f"{field}: {value!r} must not be negative")
    return amount


def updated(
    node: Node,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[TaintSpec] | None = None,
    unschedulable: bool | None = None,
) -> Node:
    """``node`` with the given fields replaced (a ``nodeUpdate``); a cordoned node takes no new work."""
    changes: dict[str, Any] = {}
    if labels is not None:
        changes["labels"] = tuple(sorted({HOSTNAME_LABEL: node.name, **labels}.items()))
    if taints is not None:
        changes["taints"] = tuple(Taint(t.key, t.value, t.effect) for t in taints)
    if unschedulable is not None:
        changes["schedulable"] = not unschedulable
        changes["unschedulable_reason"] = "cordoned" if unschedulable else ""
    return dataclasses.replace(node, **changes)


def core_flavors(scenario: Scenario) -> list[Flavor]:
    """Core Flavors of the scenario's ``resourceFlavors``, converted as the operator converts them."""
    out = []
    for i, entry in enumerate(scenario.resource_flavors):
        try:
            out.append(flavor_from_manifest(entry.name, entry.spec))
        except InvalidQueueError as exc:
            raise ScenarioError(f"resourceFlavors[{i}] ({entry.name}).spec: {exc}") from None
    return out


def core_queues(scenario: Scenario) -> list[QueueSpec]:
    """Core QueueSpecs of the scenario, converted as the operator converts them, except that a scenario
    queue is open by default (no namespaceSelector: every namespace; no GPU resource: unlimited), as
    scenarios have no namespaces to select and the shared samples list no quota."""
    specs = []
    for i, entry in enumerate(scenario.queues):
        try:
            specs.append(queue_from_manifest(entry.name, entry.spec, open_defaults=True))
        except InvalidQueueError as exc:
            raise ScenarioError(f"queues[{i}] ({entry.name}).spec: {exc}") from None
        # manifests.convert lets other errors through on some malformed specs (e.g. `preemption: x`,
        # which the CRD schema would refuse first); here they are the user's input.
        except (ValueError, TypeError, AttributeError) as exc:
            message = f"not a valid GPUClusterQueue spec ({exc})"
            raise ScenarioError(f"queues[{i}] ({entry.name}).spec: {message}") from None
    return specs
