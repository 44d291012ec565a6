"""The ``batch/v1`` Job emitted per admission (DESIGN.md section 2), and its placement annotation.

Pure functions: the executor sends what :func:`build_job` returns. The Job is pinned with a
required node affinity on the node's name (``matchFields`` ``metadata.name``, as the DaemonSet
controller pins its pods: the ``kubernetes.io/hostname`` label may differ from the name; not
``nodeName``, so kube-scheduler still runs its filters), gets its GPUs the configured way
(:mod:`gputask.k8s.pinning`: ``NVIDIA_VISIBLE_DEVICES``, a CDI annotation, or DRA claims, :mod:`gputask.k8s.dra`),
never an ``nvidia.com/gpu`` request (the device plugin would pick other GPUs), and carries its placement as JSON so
a restarted operator can rebuild its state from Jobs alone.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

from gputask.core import GpuRequest, GpuSlot, NodeName, Placement, PodPlacement
from gputask.core.fit import Toleration
from gputask.k8s import dra
from gputask.k8s.names import API_VERSION, MAX_NAME, TASK_LABEL, fit_name
from gputask.k8s.pinning import ENVVAR, VISIBLE_DEVICES, Pinning, budget_of, pin_pod

QUEUE_LABEL = "gputask.io/queue"
FLAVOR_LABEL = "gputask.io/flavor"
FLAVOR_ANNOTATION = "gputask.io/flavor"
PLACEMENT_ANNOTATION = "gputask.io/placement"
ATTEMPT_ANNOTATION = "gputask.io/attempt"
TASK_UID_ANNOTATION = "gputask.io/task-uid"
NODE_NAME_FIELD = "metadata.name"
__all__ = ["API_VERSION", "MAX_NAME", "TASK_LABEL", "VISIBLE_DEVICES", "build_job", "fit_name", "job_name",
           "job_shell", "parse_placement", "pin_node", "placement_annotation", "tolerate"]


def job_name(task_name: str, attempt: int) -> str:
    """Deterministic Job name of a task's attempt: ``<task>-<attempt>``, hashed to fit 63 chars."""
    return fit_name(f"{task_name}-{attempt}")


def placement_annotation(placement: Placement) -> str:
    """JSON of a one-pod placement (a GPUTask's Job): node, GPU UUIDs, indices and MiB per GPU. Raises
    ValueError for a placement of several pods. Jobs already in clusters carry it: :func:`parse_placement`
    reads it back."""
    pod = placement.only()
    return json.dumps(
        {
            "node": pod.node,
            "uuids": [g.uuid for g in pod.gpus],
            "indices": [g.index for g in pod.gpus],
            "memoryMiB": [g.memory_mib for g in pod.gpus],
        },
        separators=(",", ":"),
    )


def parse_placement(text: str | None) -> Placement | None:
    """The Placement in a ``gputask.io/placement`` annotation: one pod (``{node, uuids, indices, memoryMiB}``), or
    a gang Job's PodSet (``{"podSet", "pods": [...]}``, :mod:`gputask.k8s.gangjobs`); None when absent or
    malformed."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        pods = [raw] if "pods" not in raw else list(raw["pods"])
        placed = []
        for pod in pods:
            slots = tuple(
                GpuSlot(int(i), str(u), int(m))
                for i, u, m in zip(pod["indices"], pod["uuids"], pod["memoryMiB"], strict=True)
            )
            placed.append(PodPlacement(NodeName(str(pod["node"])), slots))
        return Placement(tuple(placed)) if placed else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def pin_node(pod_spec: dict[str, Any], node: str | list[str]) -> None:
    """Require the node (or one of the nodes) in every nodeSelectorTerm (terms are ORed: one term without it would
    let the pod run elsewhere), keeping the user's own terms and preferred affinity."""
    affinity = pod_spec["affinity"] = dict(pod_spec.get("affinity") or {})
    node_affinity = affinity["nodeAffinity"] = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    pin = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node] if isinstance(node, str) else list(node)}
    given = [t for t in required.get("nodeSelectorTerms") or [] if t.get("matchExpressions") or t.get("matchFields")]
    terms = [dict(term) for term in given] or [{}]  # an empty term matches nothing: pinned, it would match
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), pin]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required


def build_job(
    task_obj: Mapping[str, Any],
    placement: Placement,
    *,
    attempt: int,
    queue: str,
    flavor: str = "",
    tolerations: Iterable[Toleration] = (),
    pinning: Pinning = ENVVAR,
    request: GpuRequest | None = None,
) -> dict[str, Any]:
    """The Job for ``task_obj`` (a GPUTask dict with metadata.uid) admitted with ``placement``, in the
    ResourceFlavor ``flavor`` (label ``gputask.io/flavor``) whose ``tolerations`` its pods get (Kueue
    adds a flavor's tolerations to the pods it admits in it), pinned the ``pinning`` way. ``request`` is the
    task's GPU request (its share group and MPS; default: whole GPUs, so no memory budget).

    Raises KeyError when the task has no name, namespace or uid (the caller converts first), ValueError for a
    GPU UUID that cannot be written as a CDI name or a DRA selector.
    """
    pod = placement.only()  # a GPUTask's Job runs one pod
    request = request or GpuRequest(len(pod.gpus))
    annotation = placement_annotation(placement)
    job = job_shell(task_obj, attempt=attempt, queue=queue, annotations={PLACEMENT_ANNOTATION: annotation})
    if flavor:  # the label selects (its value fitted to 63 characters); the annotation keeps the exact name
        job["metadata"]["labels"][FLAVOR_LABEL] = fit_name(flavor)
        job["metadata"]["annotations"][FLAVOR_ANNOTATION] = flavor
    template = job["spec"]["template"]
    tolerate(template["spec"], tolerations)
    pod_annotations = template["metadata"]["annotations"] = {
        **(template["metadata"].get("annotations") or {}),
        PLACEMENT_ANNOTATION: annotation,
    }
    pin_node(template["spec"], pod.node)
    pin_pod(template["spec"], pod_annotations, placement, pinning, budget_of(request, placement))
    if pinning.mode == "dra":
        dra.claims_for(job["metadata"]["name"], request, placement).apply(template["spec"])
    return job


def tolerate(pod_spec: dict[str, Any], tolerations: Iterable[Toleration]) -> None:
    """Add a flavor's ``tolerations`` to a pod spec (those it has already are not repeated)."""
    added = [_toleration(t) for t in tolerations]
    if added:
        own = pod_spec.get("tolerations") or []
        pod_spec["tolerations"] = [*own, *(t for t in added if t not in own)]


def _toleration(t: Toleration) -> dict[str, Any]:
    """A core/v1 Toleration dict (empty fields left out, as the API server prints them)."""
    raw: dict[str, Any] = {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect,
                           "tolerationSeconds": t.seconds}
    return {k: v for k, v in raw.items() if v not in ("", None)}


def job_shell(
    task_obj: Mapping[str, Any], *, attempt: int, queue: str, annotations: Mapping[str, str],
    template: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A task's Job before placement: name, labels, ``annotations`` plus attempt and task uid,
    the ownerReference, and a copy of the pod template (``template``, else the task's ``spec.template``) carrying
    the labels."""
    meta = task_obj["metadata"]
    name, namespace, uid = meta["name"], meta.get("namespace") or "default", meta["uid"]
    given = template if template is not None else (task_obj.get("spec") or {}).get("template")
    template = copy.deepcopy(dict(given or {}))
    pod_meta = template.setdefault("metadata", {})
    template.setdefault("spec", {})
    labels = {TASK_LABEL: fit_name(name), QUEUE_LABEL: fit_name(queue)}
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name, attempt),
            "namespace": namespace,
            "labels": labels,
            "annotations": {**annotations, ATTEMPT_ANNOTATION: str(attempt), TASK_UID_ANNOTATION: uid},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "GPUTask",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"backoffLimit": 0, "template": template},
    }
