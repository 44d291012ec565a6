"""Existing batch/v1 Jobs admitted by gputask (issue 31): the opt-in, the webhook's mutation, the GPUTask that is a
Job's workload object, and the Job's admission (placement, then unsuspend) and eviction (suspend, then restore).

Pure functions and one :class:`~gputask.k8s.workload.Workload` implementation, :class:`UserJobWorkload`; the
informer sink and the webhook are :mod:`gputask.k8s.userjob_feed`. The model is Kueue's job integration
(sigs.k8s.io/kueue pkg/controller/jobframework: the ``queue-name`` label, ``spec.suspend``, ``RunWithPodSetsInfo``
writing a PodSet's node selector, tolerations, labels and annotations into a suspended Job, and
``RestorePodSetsInfo`` putting back what the user wrote when it is suspended again).

Annotations (all on the Job's ``metadata.annotations`` unless said otherwise):

- ``gputask.io/gpu-request`` (written by the webhook, or by the user): JSON ``{"gpus": N, "gpuMemory": "12Gi",
  "containers": {"<container>": {"nvidia.com/gpu": "2", "gputask.io/gpu-memory": "12Gi"}}}``: what the containers
  requested before the webhook moved it here. ``gpus`` is the pod's GPU count (the containers' ``nvidia.com/gpu``
  summed; an init container's counts when it is larger, as a pod's effective request is computed), ``gpuMemory``
  (optional) the memory wanted on each GPU (the largest ``gputask.io/gpu-memory`` a container gave: a shared
  request, written on a container as ``resources.limits["gputask.io/gpu-memory"]: 12Gi``); ``containers`` keeps
  what each container had, for the record.
- ``gputask.io/original-scheduling``: JSON of the pod template's scheduling fields as the user wrote them
  (:data:`SCHEDULING_FIELDS`), written at the first admission; eviction restores exactly these.
- ``gputask.io/task-uid``, ``gputask.io/attempt``, ``gputask.io/placement``: as on the Jobs gputask emits
  (:mod:`gputask.k8s.jobs`), present while the Job is admitted.
- On the pod template, while admitted: ``gputask.io/visible-devices`` (the GPU UUIDs in envvar mode, ``void``
  otherwise) and ``gputask.io/gpu-memory-mib`` (a shared request's MiB per GPU), which the containers read through
  the downward-API environment the webhook gave them (``NVIDIA_VISIBLE_DEVICES``, ``GPUTASK_GPU_MEMORY_MIB``): a
  Job's container environment cannot change after creation, its template's annotations can while it is suspended.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gputask.core import GpuRequest, Placement
from gputask.core.fit import Toleration
from gputask.k8s.jobrecords import JobRecord, job_failure, job_outcome
from gputask.k8s.jobs import (
    ATTEMPT_ANNOTATION,
    FLAVOR_ANNOTATION,
    FLAVOR_LABEL,
    PLACEMENT_ANNOTATION,
    QUEUE_LABEL,
    TASK_UID_ANNOTATION,
    _toleration,
    pin_node,
    placement_annotation,
)
from gputask.k8s.names import API_VERSION, TASK_LABEL, fit_name
from gputask.k8s.pinning import (
    ENVVAR,
    GPU_RESOURCE,
    MEMORY_BUDGET_ENV,
    VISIBLE_DEVICES,
    Pinning,
    budget_of,
    cdi_annotation,
    containers,
    set_env,
    visible_devices,
)
from gputask.k8s.records import TaskRecord
from gputask.k8s.resources import GPUTASKS, JOBS, ApiError, NotFound, Resource

QUEUE_NAME_LABEL = "gputask.io/queue-name"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GPU_MEMORY_RESOURCE = "gputask.io/gpu-memory"
GPU_REQUEST_ANNOTATION = "gputask.io/gpu-request"
ORIGINAL_ANNOTATION = "gputask.io/original-scheduling"
MUTATED_ANNOTATION = "gputask.io/mutated-by"
DEVICES_ANNOTATION = "gputask.io/visible-devices"
MEMORY_ANNOTATION = "gputask.io/gpu-memory-mib"
SCHEDULING_FIELDS = ("nodeSelector", "affinity", "tolerations", "schedulingGates")
"""The pod-spec fields of a suspended Job's template Kubernetes lets change (with the template's labels and
annotations: ``AllowMutableSchedulingDirectives``, batch/v1 validation, while suspended and not started)."""
MAIN_POD_SET = "main"
CONFLICT_RETRIES = 3


def queue_of(job: Mapping[str, Any]) -> str:
    """The GPULocalQueue a Job names in its ``gputask.io/queue-name`` label ("" for none)."""
    return str(((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_NAME_LABEL) or "")


def opted_in(job: Mapping[str, Any], *, excluded: Iterable[str] = (), queueing: str = "gputask") -> bool:
    """True when gputask admits ``job``: it carries ``gputask.io/queue-name``, its namespace is not ``excluded``,
    and (gputask mode) it carries no ``kueue.x-k8s.io/queue-name`` (then it is Kueue's). Kueue mode admits none
    (Kueue's own Job integration does)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    if not queue_of(job) or queueing != "gputask" or KUEUE_QUEUE_LABEL in labels:
        return False
    return (meta.get("namespace") or "default") not in set(excluded)


def _count(value: Any) -> int:
    """A GPU count quantity ("2", 2) as an int; ValueError otherwise."""
    number = int(str(value))
    if number < 0:
        raise ValueError(f"a negative GPU count: {value!r}")
    return number


def gpu_request(pod_spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the containers of ``pod_spec`` request of GPUs, in the :data:`GPU_REQUEST_ANNOTATION` form; None when
    no container names ``nvidia.com/gpu`` or ``gputask.io/gpu-memory``. Raises ValueError for a count that is no
    whole number."""
    per: dict[str, dict[str, str]] = {}
    total, init_max, memory = 0, 0, None
    for kind in ("initContainers", "containers"):
        for container in pod_spec.get(kind) or []:
            resources = container.get("resources") or {}
            found: dict[str, str] = {}
            for section in ("requests", "limits"):  # a limit wins: an extended resource's request equals it
                for name in (GPU_RESOURCE, GPU_MEMORY_RESOURCE):
                    if name in (resources.get(section) or {}):
                        found[name] = str(resources[section][name])
            if not found:
                continue
            per[str(container.get("name") or "")] = found
            count = _count(found.get(GPU_RESOURCE, "0"))
            if kind == "initContainers":
                init_max = max(init_max, count)
            else:
                total += count
            if GPU_MEMORY_RESOURCE in found:
                memory = found[GPU_MEMORY_RESOURCE] if memory is None else max(memory, found[GPU_MEMORY_RESOURCE],
                                                                               key=_quantity_key)
    if not per:
        return None
    out: dict[str, Any] = {"gpus": max(total, init_max)}
    if memory is not None:
        out["gpuMemory"] = memory
    out["containers"] = per
    return out


def _quantity_key(text: str) -> float:
    from kubernetes.utils import parse_quantity  # the manifests' own parser of quantities

    return float(parse_quantity(text))


def mutate_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Job as the webhook admits it on CREATE (a copy; ``job`` is not changed):

    - ``spec.suspend: true`` (no pod before gputask places it);
    - each container's ``nvidia.com/gpu`` and ``gputask.io/gpu-memory`` requests and limits removed (no device
      plugin picks other GPUs) and written into :data:`GPU_REQUEST_ANNOTATION` (a request already there is kept);
    - every container given ``NVIDIA_VISIBLE_DEVICES`` and ``GPUTASK_GPU_MEMORY_MIB`` from the pod's
      :data:`DEVICES_ANNOTATION` and :data:`MEMORY_ANNOTATION` (downward API): admission writes those annotations;
    - :data:`MUTATED_ANNOTATION` ``webhook``.

    Raises ValueError for a GPU count that is no whole number (the webhook refuses the Job then).
    """
    out = copy.deepcopy(dict(job))
    meta = out.setdefault("metadata", {})
    spec = out.setdefault("spec", {})
    pod_spec = spec.setdefault("template", {}).setdefault("spec", {})
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    request = gpu_request(pod_spec)
    if request is not None and GPU_REQUEST_ANNOTATION not in annotations:
        annotations[GPU_REQUEST_ANNOTATION] = json.dumps(request, separators=(",", ":"), sort_keys=True)
    for container in containers(pod_spec):
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        for section in ("limits", "requests"):
            values = resources.get(section)
            if isinstance(values, dict):
                for name in (GPU_RESOURCE, GPU_MEMORY_RESOURCE):
                    values.pop(name, None)
                if not values:
                    del resources[section]
    set_env(pod_spec, [_from_annotation(VISIBLE_DEVICES, DEVICES_ANNOTATION),
                       _from_annotation(MEMORY_BUDGET_ENV, MEMORY_ANNOTATION)])
    spec["suspend"] = True
    annotations[MUTATED_ANNOTATION] = "webhook"
    return out


def _from_annotation(name: str, annotation: str) -> dict[str, Any]:
    """A core/v1 EnvVar read from a pod annotation (downward API ``fieldRef``)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}}}


def requested(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Job's GPU request: its :data:`GPU_REQUEST_ANNOTATION` (None when absent or not JSON)."""
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(GPU_REQUEST_ANNOTATION)
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def pod_count(job: Mapping[str, Any]) -> int:
    """Pods of the Job that run at once: ``min(parallelism, completions)`` (each 1 when unset), as Kueue counts a
    Job's PodSet."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    parallelism = 1 if parallelism is None else int(parallelism)
    return parallelism if completions is None else min(parallelism, int(completions))


def refusal(job: Mapping[str, Any], pinning: Pinning) -> str | None:
    """Why gputask cannot run ``job`` (it stays suspended, a Warning Event says so), or None.

    A Job of several pods at once needs per-pod pinning (issue 30's gate), not merged here yet; ``dra`` pinning
    needs a pod's resourceClaims, which a Job's template cannot change after creation; a container still asking the
    device plugin for ``nvidia.com/gpu`` (the Job was created without the webhook) would get GPUs gputask did not
    choose, and a Job's resources cannot change after creation."""
    if pinning.mode == "dra":
        return ("pinning: dra cannot pin an existing Job: its pods' resourceClaims are fixed at creation; use the "
                "envvar or cdi pinning mode, or submit a GPUTask")
    if pod_count(job) > 1:
        return (f"a Job running {pod_count(job)} pods at once needs per-pod pinning, which gputask does not give "
                "existing Jobs yet; set parallelism 1, or submit a GPUTask with podSets")
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    found = gpu_request(pod_spec)
    if found is not None:
        names = sorted({name for per in (found.get("containers") or {}).values() for name in per})
        asked = " and ".join(names) or f"{GPU_RESOURCE} or {GPU_MEMORY_RESOURCE}"
        return (f"its containers still request {asked} in their resources (it was created without gputask's "
                "webhook), and a Job's resources cannot change after creation: re-create it with the webhook on, or "
                f"move the request into the {GPU_REQUEST_ANNOTATION} annotation yourself")
    request = requested(job)
    if request is None or int(request.get("gpus") or 0) < 1:
        return f"it requests no GPU (no nvidia.com/gpu, no {GPU_REQUEST_ANNOTATION} annotation)"
    return None


def task_name(job_name: str) -> str:
    """The name of a Job's GPUTask: ``job-<name>`` fitted to 63 characters (Kueue names its Workloads alike)."""
    return fit_name(f"job-{job_name}")


def workload_task(job: Mapping[str, Any]) -> dict[str, Any]:
    """The GPUTask that is ``job``'s workload object: owned by the Job (``controller: true``, so deleting the Job
    deletes it), ``spec.workloadRef`` naming it, the queue from its label, GPUs from :func:`requested`, the
    priority class from the template's ``priorityClassName`` (or the Kueue ``priority-class`` label, copied), and
    the Job's pod template. Raises KeyError when the Job has no name or uid."""
    meta = job["metadata"]
    request = requested(job) or {}
    template = copy.deepcopy(dict((job.get("spec") or {}).get("template") or {}))
    spec: dict[str, Any] = {
        "queueName": queue_of(job),
        "gpus": int(request.get("gpus") or 1),
        "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"]},
        "template": template,
    }
    if request.get("gpuMemory"):
        spec["gpuMemory"] = str(request["gpuMemory"])
    priority_class = (template.get("spec") or {}).get("priorityClassName")
    if priority_class:
        spec["priorityClassName"] = priority_class
    labels = {QUEUE_NAME_LABEL: queue_of(job)}
    kueue_priority = (meta.get("labels") or {}).get(KUEUE_PRIORITY_LABEL)
    if kueue_priority:
        labels[KUEUE_PRIORITY_LABEL] = kueue_priority
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUTask",
        "metadata": {
            "name": task_name(meta["name"]),
            "namespace": meta.get("namespace") or "default",
            "labels": labels,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True}],
        },
        "spec": spec,
    }


def scheduling_fields(template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template's fields a suspended Job lets change, as written (absent ones left out): ``labels`` and
    ``annotations`` of its metadata, and :data:`SCHEDULING_FIELDS` of its spec."""
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    out = {k: copy.deepcopy(meta[k]) for k in ("labels", "annotations") if k in meta}
    out.update({k: copy.deepcopy(spec[k]) for k in SCHEDULING_FIELDS if k in spec})
    return out


def with_fields(template: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``template`` whose changeable fields are exactly ``fields`` (those absent from it removed)."""
    out = copy.deepcopy(dict(template))
    meta, spec = out.setdefault("metadata", {}), out.setdefault("spec", {})
    for key in ("labels", "annotations"):
        meta.pop(key, None)
        if key in fields:
            meta[key] = copy.deepcopy(fields[key])
    for key in SCHEDULING_FIELDS:
        spec.pop(key, None)
        if key in fields:
            spec[key] = copy.deepcopy(fields[key])
    return out


def original_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """The template's changeable fields as the user wrote them: the :data:`ORIGINAL_ANNOTATION` when the Job has
    one, else the template as it is (a Job never admitted)."""
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(ORIGINAL_ANNOTATION)
    if text:
        try:
            value = json.loads(text)
            if isinstance(value, dict):
                return value
        except ValueError:
            pass
    return scheduling_fields((job.get("spec") or {}).get("template") or {})


def admitted_template(original: Mapping[str, Any], *, task: str, queue: str, placement: Placement,
                      tolerations: Iterable[Toleration] = (), pinning: Pinning = ENVVAR,
                      request: GpuRequest | None = None) -> dict[str, Any]:
    """The changeable fields of an admitted Job's template: the user's ``original`` plus the task and queue labels,
    the placement annotation, the node pin (required node affinity on ``metadata.name``, :func:`pin_node`), the
    flavor's tolerations, and the GPUs (:data:`DEVICES_ANNOTATION`, the CDI annotation in cdi mode,
    :data:`MEMORY_ANNOTATION` for a shared request). Raises ValueError for a placement of several pods or a UUID
    that is no CDI name."""
    pod = placement.only()
    uuids = [g.uuid for g in pod.gpus]
    fields = copy.deepcopy(dict(original))
    fields["labels"] = {**(fields.get("labels") or {}), TASK_LABEL: fit_name(task), QUEUE_LABEL: fit_name(queue)}
    annotations = {**(fields.get("annotations") or {}), PLACEMENT_ANNOTATION: placement_annotation(placement),
                   DEVICES_ANNOTATION: visible_devices(pinning, uuids)}
    budget = budget_of(request or GpuRequest(len(uuids)), placement)
    if budget is not None:
        annotations[MEMORY_ANNOTATION] = str(budget.memory_mib)
    if pinning.mode == "cdi":
        annotations.update(cdi_annotation(uuids))
    fields["annotations"] = annotations
    added = [_toleration(t) for t in tolerations]
    if added:
        own = list(fields.get("tolerations") or [])
        fields["tolerations"] = [*own, *(t for t in added if t not in own)]
    spec: dict[str, Any] = {"affinity": fields["affinity"]} if "affinity" in fields else {}
    pin_node(spec, pod.node)
    fields["affinity"] = spec["affinity"]
    return fields


class Reader(Protocol):
    """A client's read by name."""

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """GET by name; raises NotFound."""
        ...


class Api(Protocol):
    """What admitting and stopping an existing Job needs of the API: the writer (its ``replace``, and its
    ``client`` to read)."""

    client: Reader

    async def replace(self, res: Resource, name: str, body: Any, namespace: str | None = None) -> dict[str, Any]:
        """PUT ``body`` (with its resourceVersion: a 409 when the object changed meanwhile)."""
        ...

    async def patch(self, res: Resource, name: str, patch: Any, namespace: str | None = None, *,
                    status: bool = False) -> dict[str, Any]:
        """Merge-patch the object or (``status``) its status."""
        ...


def admit(job: Mapping[str, Any], admission: Mapping[str, Any]) -> dict[str, Any]:
    """``job`` as it is admitted: ``admission`` (what :meth:`UserJobWorkload.job_for` returns) gives the Job's labels
    and annotations to add and the template's changeable fields; the user's own fields are kept in
    :data:`ORIGINAL_ANNOTATION` (once: a Job admitted again keeps the first), ``spec.suspend: false``."""
    out = copy.deepcopy(dict(job))
    meta = out["metadata"]
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    annotations.setdefault(ORIGINAL_ANNOTATION, json.dumps(original_fields(job), separators=(",", ":"),
                                                           sort_keys=True))
    annotations.update(admission["metadata"]["annotations"])
    meta["labels"] = {**(meta.get("labels") or {}), **admission["metadata"]["labels"]}
    out["spec"]["template"] = with_fields(out["spec"].get("template") or {}, admission["spec"]["fields"])
    out["spec"]["suspend"] = False
    return out


def suspend_admitted(job: Mapping[str, Any]) -> dict[str, Any]:
    """``job`` evicted, the first write: ``spec.suspend: true`` (the Job controller removes its pods) and the
    admission's task uid and placement annotations removed (it holds nothing once its pods are gone); the template
    as it is (Kubernetes refuses a template change in the same write: the Job it replaces is not suspended)."""
    out = copy.deepcopy(dict(job))
    meta = out["metadata"]
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    for key in (TASK_UID_ANNOTATION, PLACEMENT_ANNOTATION):
        annotations.pop(key, None)
    out.setdefault("spec", {})["suspend"] = True
    return out


def restore(job: Mapping[str, Any]) -> dict[str, Any]:
    """``job`` with its template's changeable fields put back exactly as the user wrote them
    (:func:`original_fields`). Kueue's ``RestorePodSetsInfo``."""
    out = copy.deepcopy(dict(job))
    out["spec"]["template"] = with_fields(out["spec"].get("template") or {}, original_fields(job))
    return out


def suspend_and_restore(job: Mapping[str, Any]) -> dict[str, Any]:
    """``job`` as eviction leaves it (:func:`suspend_admitted`, then :func:`restore`): suspended, its template's
    fields exactly as the user wrote them, nothing of the admission left but the kept original."""
    return restore(suspend_admitted(job))


def restored(job: Mapping[str, Any]) -> bool:
    """True when the template's changeable fields are those the user wrote (:func:`original_fields`)."""
    return scheduling_fields((job.get("spec") or {}).get("template") or {}) == original_fields(job)


async def rewrite(api: Api, name: str, namespace: str, change: Any) -> dict[str, Any] | None:
    """GET the Job, PUT ``change(job)`` with its resourceVersion; a 409 (changed meanwhile) reads it again, at most
    :data:`CONFLICT_RETRIES` times. None when the Job is gone; raises the API's other errors (and the last 409)."""
    for tries in range(CONFLICT_RETRIES + 1):
        try:
            job = await api.client.get(JOBS, name, namespace)
        except NotFound:
            return None
        try:
            return await api.replace(JOBS, name, change(job), namespace)
        except NotFound:
            return None
        except ApiError as exc:
            if exc.status != 409 or tries == CONFLICT_RETRIES:
                raise
    return None  # not reached


async def suspend(api: Api, name: str, namespace: str, change: Any = suspend_admitted, *,
                  restore_template: bool = True) -> dict[str, Any] | None:
    """Suspend Job ``namespace/name`` so that its template can change again, and (``restore_template``) put its
    template back as the user wrote it. batch/v1 lets a Job's pod template change only while the Job it replaces is
    suspended and has no ``status.startTime`` (``AllowMutableSchedulingDirectives``), and the Job controller keeps
    ``startTime`` when a Job is suspended; so, as Kueue's job integration does (``StopJob``, ``ResetStatus``,
    ``RestorePodSetsInfo``), up to three writes: PUT ``change(job)`` (:func:`suspend_admitted`), merge-patch the
    status's ``startTime`` away when set, PUT :func:`restore` when the template is not restored already. Returns the
    Job as last written or read; None when it is gone. Raises :class:`ApiError` (the last 409 after
    :data:`CONFLICT_RETRIES` re-reads)."""
    job = await rewrite(api, name, namespace, change)
    if job is None:
        return None
    if (job.get("status") or {}).get("startTime"):
        try:
            job = await api.patch(JOBS, name, {"status": {"startTime": None}}, namespace, status=True)
        except NotFound:
            return None
    if restore_template and not restored(job):
        return await rewrite(api, name, namespace, restore)
    return job


class UserJobWorkload:
    """A Job the user wrote, as a :class:`~gputask.k8s.workload.Workload`: its workload object is the GPUTask it
    owns (``spec.workloadRef``), whose status and Events are the admission's; a placement is written into the Job
    itself (:func:`admit`), and stopping it suspends it and restores its template (:func:`suspend_and_restore`)."""

    status_resource = GPUTASKS
    kind = "GPUTask"

    def __init__(self, record: TaskRecord) -> None:
        self.record = record

    def object(self) -> Mapping[str, Any]:
        """The GPUTask (the workload object) as last seen."""
        return self.record.obj

    def job_name(self) -> str:
        """The name of the Job it stands for (``spec.workloadRef.name``)."""
        return str(((self.record.obj.get("spec") or {}).get("workloadRef") or {}).get("name") or "")

    def pod_sets(self) -> tuple[Any, ...]:
        """One PodSet ``main`` of one pod (a Job of one pod at a time; :func:`refusal` keeps the others out)."""
        from gputask.k8s.workload import PodSetInfo

        template = (self.record.obj.get("spec") or {}).get("template") or {}
        return (PodSetInfo(MAIN_POD_SET, 1, template),)

    def priority(self) -> int:
        """The converted task's priority; 0 before conversion."""
        return self.record.task.priority if self.record.task is not None else 0

    def queue_name(self) -> str:
        """The GPULocalQueue of the Job's label (copied into the GPUTask's ``spec.queueName``)."""
        return str((self.record.obj.get("spec") or {}).get("queueName") or "")

    def job_for(self, placement: Placement, *, attempt: int, queue: str, flavor: str = "",
                tolerations: Iterable[Toleration] = (), pinning: Pinning = ENVVAR,
                request: GpuRequest | None = None) -> dict[str, Any]:
        """What admitting the Job on ``placement`` writes into it (:func:`admit` applies it to the Job as it is):
        ``metadata`` (name, namespace, the labels and annotations of a Job of ours) and ``spec.fields`` (the
        template's changeable fields, :func:`admitted_template` over the user's template). Raises ValueError for
        dra pinning or a placement of several pods."""
        if pinning.mode == "dra":
            raise ValueError("pinning: dra cannot pin an existing Job (its resourceClaims are fixed at creation)")
        meta = self.record.obj["metadata"]
        template = (self.record.obj.get("spec") or {}).get("template") or {}
        fields = admitted_template(scheduling_fields(template), task=meta["name"], queue=queue, placement=placement,
                                   tolerations=tolerations, pinning=pinning, request=request)
        labels = {TASK_LABEL: fit_name(meta["name"]), QUEUE_LABEL: fit_name(queue)}
        annotations = {PLACEMENT_ANNOTATION: placement_annotation(placement), ATTEMPT_ANNOTATION: str(attempt),
                       TASK_UID_ANNOTATION: meta["uid"]}
        if flavor:
            labels[FLAVOR_LABEL] = fit_name(flavor)
            annotations[FLAVOR_ANNOTATION] = flavor
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": self.job_name(), "namespace": self.record.namespace, "labels": labels,
                             "annotations": annotations},
                "spec": {"fields": fields}}

    def jobs_for(self, placement: Placement, *, attempt: int, queue: str, flavor: str = "",
                 tolerations: Iterable[Toleration] = (), pinning: Pinning = ENVVAR,
                 request: GpuRequest | None = None) -> list[dict[str, Any]]:
        """:meth:`job_for`'s one admission (an existing Job is one PodSet; raises ValueError as it does)."""
        return [self.job_for(placement, attempt=attempt, queue=queue, flavor=flavor, tolerations=tolerations,
                             pinning=pinning, request=request)]

    def service_for(self, placement: Placement) -> dict[str, Any] | None:
        """None: an existing Job is not a gang."""
        return None

    def suspended_job(self, *, attempt: int, queue: str, pinning: Pinning,
                      request: GpuRequest | None) -> dict[str, Any]:
        """Kueue mode does not admit existing Jobs through gputask; raises ValueError."""
        raise ValueError("existing Jobs are admitted in queueing: gputask mode only")

    async def start(self, api: Api, job: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Write the admission ``job`` (from :meth:`job_for`) into the existing Job and unsuspend it (GET, then
        PUT with its resourceVersion). Raises NotFound when the Job is gone, the API's errors otherwise."""
        name = job["metadata"]["name"]
        written = await rewrite(api, name, namespace, lambda current: admit(current, job))
        if written is None:
            raise NotFound(404, "NotFound", f"jobs.batch \"{name}\" not found")
        return written

    def stop_propagation(self, reason: str) -> str:
        """Not deleted: suspended (the Job controller deletes its pods in the background)."""
        return "Background"

    async def stop(self, api: Api, job: JobRecord, reason: str) -> bool:
        """Suspend ``job`` and restore its template (:func:`suspend`); False when it was gone already.
        Its GPUs stay held until none of its pods is bound (the feed tells the controller once it is suspended
        and has no active pod, :mod:`gputask.k8s.userjob_feed`)."""
        return await suspend(api, job.name, job.namespace) is not None

    def finished(self, job: Mapping[str, Any]) -> tuple[str, str] | None:
        """(Succeeded or Failed, why) from the Job's conditions."""
        outcome = job_outcome(job)
        return None if outcome is None else (outcome, job_failure(job))

    def involved(self) -> dict[str, Any]:
        """The GPUTask as an Event's ``involvedObject``."""
        meta = self.record.obj["metadata"]
        return {"apiVersion": API_VERSION, "kind": self.kind, "name": meta["name"], "namespace": self.record.namespace,
                "uid": meta.get("uid")}


def is_user_job_task(obj: Mapping[str, Any]) -> bool:
    """True for a GPUTask that is an existing Job's workload object (``spec.workloadRef`` names a Job)."""
    ref = (obj.get("spec") or {}).get("workloadRef") or {}
    return isinstance(ref, dict) and ref.get("kind") == "Job" and bool(ref.get("name"))


__all__ = [
    "DEVICES_ANNOTATION", "GPU_REQUEST_ANNOTATION", "MEMORY_ANNOTATION", "ORIGINAL_ANNOTATION", "QUEUE_NAME_LABEL",
    "UserJobWorkload", "admit", "admitted_template", "gpu_request", "is_user_job_task", "mutate_job", "opted_in",
    "pod_count", "refusal", "requested", "restore", "restored", "scheduling_fields", "suspend", "suspend_admitted",
    "suspend_and_restore", "task_name", "workload_task",
]
