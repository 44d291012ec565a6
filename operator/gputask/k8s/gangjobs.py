"""The objects a gang (a GPUTask of several pods) is run as, and how each of its pods is pinned.

A gang's placement (:class:`~gputask.core.Placement`, one :class:`~gputask.core.PodPlacement` per pod in PodSet
then index order) becomes, per admission:

- one **Indexed Job per PodSet** (``completionMode: Indexed``, ``parallelism = completions = count``; Kubernetes
  gives each pod its index in the annotation and, from v1.28, the label ``batch.kubernetes.io/job-completion-index``
  and the variable ``JOB_COMPLETION_INDEX``), owned by the GPUTask, named ``<task>-<attempt>-<podSet>``; each
  carries the placement of its own PodSet's pods (``gputask.io/placement``, ``{"podSet", "pods": [...]}``), the
  name of the gang's lead Job (the first PodSet's: the task's ``status.jobName``; ``gputask.io/gang``) and how many
  Jobs the gang has (``gputask.io/gang-jobs``), so a restarted operator rebuilds the gang from its Jobs;
- one **headless Service** per task (``clusterIP: None``, ``publishNotReadyAddresses``, selecting the task's
  pods), named as the task when that is a DNS-1035 label: the pods' template sets ``subdomain`` to it, so pod
  ``i`` of a PodSet's Job has the stable DNS name ``<job>-<i>.<service>``. It is the same Service for every
  attempt (the Jobs' names carry the attempt) and goes with its task (ownerReference);
- the **rendezvous facts** in every container's environment: ``GPUTASK_POD_SET``, ``GPUTASK_POD_INDEX`` (the
  completion index), ``GPUTASK_POD_SETS`` (``name:count,...``), ``GPUTASK_POD_SET_OFFSET`` (the pods of the PodSets
  before it: the global rank is offset + index), ``GPUTASK_WORLD_SIZE`` (every pod of the gang) and
  ``GPUTASK_COORDINATOR`` (the first PodSet's pod 0: ``<job>-0.<service>``).

Pods are pinned **one by one**: the template carries the scheduling gate ``gputask.io/placement``, so
kube-scheduler leaves a new pod alone. When the pod appears, :func:`pin_patch` gives the merge patch that narrows its
required node affinity to its placed node (a ``matchFields`` ``metadata.name`` requirement added to every term: the
mutable scheduling directives of gated pods, KEP-3838, beta and on by default from Kubernetes v1.27, allow
additions only), writes its GPUs into the annotation ``gputask.io/devices`` that ``NVIDIA_VISIBLE_DEVICES`` reads
through the downward API (envvar mode; the kubelet resolves ``fieldRef`` when the container starts, after the
gate is gone) or into the CDI annotation (cdi mode), and removes the gate, all in one patch (Kueue's topology
ungater narrows a gated pod's node selection the same way: ``pkg/controller/tas/topology_ungater.go``). A pod
replaced after a failure (``backoffLimit``) comes gated too and is pinned to its index's node and GPUs again.
DRA mode does not pin gangs: a claim template is per Job, not per index (:func:`gang_refusal`).

Pure functions of objects; the executor sends what they return through the writer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputask.core import GpuRequest, Placement, PodPlacement
from gputask.k8s.jobs import (
    FLAVOR_ANNOTATION,
    FLAVOR_LABEL,
    NODE_NAME_FIELD,
    PLACEMENT_ANNOTATION,
    job_shell,
    pin_node,
    placement_annotation,
    tolerate,
)
from gputask.k8s.names import API_VERSION, TASK_LABEL, fit_name
from gputask.k8s.pinning import (
    CDI_ANNOTATION,
    NO_DEVICES,
    VISIBLE_DEVICES,
    Budget,
    Pinning,
    cdi_annotation,
    is_mps,
    prepare_pod,
    set_env,
)

PLACEMENT_GATE = "gputask.io/placement"  # the scheduling gate a gang's pods wait behind until pinned
GANG_ANNOTATION = "gputask.io/gang"  # on a gang's Job: the name of its lead Job (the task's status.jobName)
GANG_JOBS_ANNOTATION = "gputask.io/gang-jobs"  # on a gang's Job: how many Jobs the gang has
POD_SET_ANNOTATION = "gputask.io/pod-set"  # on a gang's Job and pods: the PodSet's name
DEVICES_ANNOTATION = "gputask.io/devices"  # on a gang's pod: its GPU UUIDs (NVIDIA_VISIBLE_DEVICES reads it)
INDEX_KEY = "batch.kubernetes.io/job-completion-index"  # annotation (v1.21+) and label (v1.28+) of Indexed pods
HOSTNAME_ROOM = 5  # a pod's hostname is <job>-<index>: the Job name leaves room for "-" and 4 digits (count <= 1024)
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class GangPodSet:
    """One PodSet of a gang as the adapter emits it: its name, pod count, pod template (a dict) and the GPU request
    of each pod (its share group and MPS: the memory budget the containers are told)."""

    name: str
    count: int
    template: Mapping[str, Any]
    request: GpuRequest


def gang_job_name(task_name: str, attempt: int, pod_set: str) -> str:
    """``<task>-<attempt>-<podSet>``, hashed to leave room for a pod's ``-<index>`` within 63 characters."""
    return fit_name(f"{task_name}-{attempt}-{pod_set}", 63 - HOSTNAME_ROOM)


def service_name(task_name: str) -> str:
    """The headless Service of a task's gang: the task's name when it is a DNS-1035 label (a Service name), else a
    DNS-1035 form of it (``gt-`` and the name with dots as dashes, hashed to 63)."""
    if len(task_name) <= 63 and _DNS1035.match(task_name):
        return task_name
    return fit_name("gt-" + task_name.replace(".", "-")).rstrip("-")


def slices(pod_sets: Sequence[GangPodSet], placement: Placement) -> list[tuple[PodPlacement, ...]]:
    """The pods of ``placement`` per PodSet (in order; each ``count`` long). Raises ValueError when the counts do
    not add up to the placement's pods."""
    if sum(p.count for p in pod_sets) != len(placement.pods):
        raise ValueError(f"{len(placement.pods)} placed pods for PodSets of {[p.count for p in pod_sets]} pods")
    out, start = [], 0
    for pod_set in pod_sets:
        out.append(placement.pods[start:start + pod_set.count])
        start += pod_set.count
    return out


def gang_placement_annotation(pod_set: str, pods: Sequence[PodPlacement]) -> str:
    """JSON of one PodSet's pods (in index order): ``{"podSet", "pods": [{node, uuids, indices, memoryMiB}]}``."""
    return json.dumps({"podSet": pod_set, "pods": [_pod_json(p) for p in pods]}, separators=(",", ":"))


def _pod_json(pod: PodPlacement) -> dict[str, Any]:
    return {"node": pod.node, "uuids": [g.uuid for g in pod.gpus], "indices": [g.index for g in pod.gpus],
            "memoryMiB": [g.memory_mib for g in pod.gpus]}


def gang_refusal(pinning: Pinning, placement: Placement) -> str | None:
    """Why a placement of several pods cannot be pinned in ``pinning``'s mode, or None: dra mode pins a Job's pods
    through one ResourceClaimTemplate, the same devices for every index, so it cannot give pod ``i`` its own GPUs."""
    if len(placement.pods) > 1 and pinning.mode == "dra":
        return ("GPU pinning 'dra' cannot pin a gang's pods one by one (a Job's ResourceClaimTemplate gives every "
                "index the same devices); run gangs with pinning envvar or cdi")
    return None


def build_service(task_obj: Mapping[str, Any]) -> dict[str, Any]:
    """The headless Service of a task's gang (see the module docstring); raises KeyError without name or uid."""
    meta = task_obj["metadata"]
    name, uid = meta["name"], meta["uid"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(name),
            "namespace": meta.get("namespace") or "default",
            "labels": {TASK_LABEL: fit_name(name)},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": "GPUTask", "name": name, "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {TASK_LABEL: fit_name(name)}},
    }


def build_gang_jobs(
    task_obj: Mapping[str, Any],
    pod_sets: Sequence[GangPodSet],
    placement: Placement,
    *,
    attempt: int,
    queue: str,
    flavor: str = "",
    tolerations: Iterable[Any] = (),
    pinning: Pinning,
) -> list[dict[str, Any]]:
    """One Indexed Job per PodSet of a gang admitted with ``placement`` (see the module docstring), lead Job first.

    Raises KeyError when the task has no name, namespace or uid, ValueError when the placement's pods do not match
    the PodSets, when the pinning mode cannot pin a gang (dra) or a GPU UUID cannot be a CDI name.
    """
    refused = gang_refusal(pinning, placement)
    if refused is not None:
        raise ValueError(refused)
    task_name = task_obj["metadata"]["name"]
    names = [gang_job_name(task_name, attempt, p.name) for p in pod_sets]
    service = service_name(task_name)
    facts = [
        {"name": "GPUTASK_POD_SETS", "value": ",".join(f"{p.name}:{p.count}" for p in pod_sets)},
        {"name": "GPUTASK_WORLD_SIZE", "value": str(sum(p.count for p in pod_sets))},
        {"name": "GPUTASK_COORDINATOR", "value": f"{names[0]}-0.{service}"},
        _from_annotation("GPUTASK_POD_INDEX", INDEX_KEY),
    ]
    jobs, offset = [], 0
    for pod_set, name, pods in zip(pod_sets, names, slices(pod_sets, placement), strict=True):
        annotation = gang_placement_annotation(pod_set.name, pods)
        job = job_shell(task_obj, attempt=attempt, queue=queue, template=pod_set.template, annotations={
            PLACEMENT_ANNOTATION: annotation, GANG_ANNOTATION: names[0], GANG_JOBS_ANNOTATION: str(len(pod_sets)),
            POD_SET_ANNOTATION: pod_set.name})
        job["metadata"]["name"] = name
        if flavor:
            job["metadata"]["labels"][FLAVOR_LABEL] = fit_name(flavor)
            job["metadata"]["annotations"][FLAVOR_ANNOTATION] = flavor
        job["spec"].update({"completionMode": "Indexed", "completions": pod_set.count, "parallelism": pod_set.count})
        template = job["spec"]["template"]
        spec = template["spec"]
        template["metadata"]["annotations"] = {**(template["metadata"].get("annotations") or {}),
                                               POD_SET_ANNOTATION: pod_set.name}
        tolerate(spec, tolerations)
        spec["subdomain"] = service
        gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != PLACEMENT_GATE]
        spec["schedulingGates"] = [*gates, {"name": PLACEMENT_GATE}]
        pin_node(spec, sorted({p.node for p in pods}))  # its pods' nodes; each pod narrowed to its own when ungated
        prepare_pod(spec, pinning)
        devices: dict[str, Any] = (_from_annotation(VISIBLE_DEVICES, DEVICES_ANNOTATION) if pinning.mode == "envvar"
                                   else {"name": VISIBLE_DEVICES, "value": NO_DEVICES})
        own = [{"name": "GPUTASK_POD_SET", "value": pod_set.name},
               {"name": "GPUTASK_POD_SET_OFFSET", "value": str(offset)}]
        set_env(spec, [*facts, *own, devices, *_budget_env(pod_set.request, pods)])
        jobs.append(job)
        offset += pod_set.count
    return jobs


def _from_annotation(name: str, key: str) -> dict[str, Any]:
    """An EnvVar read from the pod's annotation ``key`` through the downward API (resolved when the container
    starts)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}


def _budget_env(request: GpuRequest, pods: Sequence[PodPlacement]) -> list[dict[str, Any]]:
    """A shared request's memory budget (the smallest MiB of any GPU of the PodSet's pods); none for whole GPUs."""
    gpus = [g for pod in pods for g in pod.gpus]
    if request.exclusive or not gpus:
        return []
    return Budget(min(g.memory_mib for g in gpus), len(pods[0].gpus), mps=is_mps(request)).env()


def pod_index(pod: Mapping[str, Any]) -> int | None:
    """A pod's completion index (its annotation, else its label), or None."""
    meta = pod.get("metadata") or {}
    for source in (meta.get("annotations") or {}, meta.get("labels") or {}):
        value = source.get(INDEX_KEY)
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def gated(pod: Mapping[str, Any]) -> bool:
    """True while ``pod`` waits behind gputask's scheduling gate."""
    return any(g.get("name") == PLACEMENT_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def pin_patch(pod: Mapping[str, Any], placement: Placement | None, pinning: Pinning) -> dict[str, Any] | None:
    """The merge patch that pins a gated pod of a gang Job whose PodSet's pods are placed as ``placement`` (index
    order): its node affinity narrowed to its node, its GPUs in its annotations, the gate removed. None when the pod
    is not gated by gputask, has no index, or its index is outside the placement."""
    index = pod_index(pod)
    if not gated(pod) or placement is None or index is None or index >= len(placement.pods):
        return None
    placed = placement.pods[index]
    spec = pod.get("spec") or {}
    narrowed: dict[str, Any] = {"affinity": json.loads(json.dumps(spec.get("affinity") or {}))}
    _add_node(narrowed, placed.node)
    uuids = [g.uuid for g in placed.gpus]
    annotations = {DEVICES_ANNOTATION: ",".join(uuids),
                   PLACEMENT_ANNOTATION: placement_annotation(Placement((placed,)))}
    if pinning.mode == "cdi":
        annotations.update(cdi_annotation(uuids, CDI_ANNOTATION))
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != PLACEMENT_GATE]
    meta = pod.get("metadata") or {}
    patch: dict[str, Any] = {
        "metadata": {"annotations": annotations},
        "spec": {"affinity": {"nodeAffinity": narrowed["affinity"]["nodeAffinity"]}, "schedulingGates": gates or None},
    }
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]  # the pod as read: a conflict reads it again
    return patch


def _add_node(pod_spec: dict[str, Any], node: str) -> None:
    """Add ``metadata.name In [node]`` to every required nodeSelectorTerm (an addition, as the API server allows on a
    gated pod); a pod with no required terms gets one term of it."""
    affinity = pod_spec["affinity"]
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    pin = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    required["nodeSelectorTerms"] = [{**t, "matchFields": [*(t.get("matchFields") or []), pin]} for t in terms]


__all__ = ["DEVICES_ANNOTATION", "GANG_ANNOTATION", "GANG_JOBS_ANNOTATION", "GangPodSet", "INDEX_KEY",
           "PLACEMENT_GATE", "POD_SET_ANNOTATION", "build_gang_jobs", "build_service", "gang_job_name",
           "gang_placement_annotation", "gang_refusal", "gated", "pin_patch", "pod_index",
           "service_name", "slices"]
