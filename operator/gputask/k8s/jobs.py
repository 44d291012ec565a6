"""The ``batch/v1`` Job emitted per admission (DESIGN.md section 2), and its placement annotation.

Pure functions: the executor sends what :func:`build_job` returns. The Job is pinned with a
required node affinity on the node's name (``matchFields`` ``metadata.name``, as the DaemonSet
controller pins its pods: the ``kubernetes.io/hostname`` label may differ from the name; not
``nodeName``, so kube-scheduler still runs its filters), gets ``NVIDIA_VISIBLE_DEVICES`` with the
GPU UUIDs in every container (and no ``nvidia.com/gpu`` request, which would let the device plugin pick other GPUs), and
carries its placement as JSON so a restarted operator can rebuild its state from Jobs alone.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from gputask.core import GpuSlot, NodeName, Placement
from gputask.core.fit import Toleration

API_VERSION = "gputask.io/v1alpha1"
TASK_LABEL = "gputask.io/task"
QUEUE_LABEL = "gputask.io/queue"
FLAVOR_LABEL = "gputask.io/flavor"
FLAVOR_ANNOTATION = "gputask.io/flavor"
PLACEMENT_ANNOTATION = "gputask.io/placement"
ATTEMPT_ANNOTATION = "gputask.io/attempt"
TASK_UID_ANNOTATION = "gputask.io/task-uid"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NODE_NAME_FIELD = "metadata.name"
MAX_NAME = 63


def fit_name(base: str, limit: int = MAX_NAME) -> str:
    """``base`` if it fits ``limit`` chars, else a prefix plus a 10-hex hash of the whole."""
    if len(base) <= limit:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[: limit - 11].rstrip('-.')}-{digest}"


def job_name(task_name: str, attempt: int) -> str:
    """Deterministic Job name of a task's attempt: ``<task>-<attempt>``, hashed to fit 63 chars."""
    return fit_name(f"{task_name}-{attempt}")


def placement_annotation(placement: Placement) -> str:
    """JSON of a placement: node, GPU UUIDs, indices and MiB per GPU."""
    return json.dumps(
        {
            "node": placement.node,
            "uuids": [g.uuid for g in placement.gpus],
            "indices": [g.index for g in placement.gpus],
            "memoryMiB": [g.memory_mib for g in placement.gpus],
        },
        separators=(",", ":"),
    )


def parse_placement(text: str | None) -> Placement | None:
    """The Placement in a ``gputask.io/placement`` annotation; None when absent or malformed."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        slots = tuple(
            GpuSlot(int(i), str(u), int(m))
            for i, u, m in zip(raw["indices"], raw["uuids"], raw["memoryMiB"], strict=True)
        )
        return Placement(NodeName(str(raw["node"])), slots)
    except (ValueError, KeyError, TypeError):
        return None


def _pin_pod_spec(pod_spec: dict[str, Any], node: str, uuids: str) -> None:
    """Require the node in every nodeSelectorTerm (terms are ORed: one term without it would let the
    pod run elsewhere), keeping the user's own terms and preferred affinity; set the GPUs."""
    affinity = pod_spec["affinity"] = dict(pod_spec.get("affinity") or {})
    node_affinity = affinity["nodeAffinity"] = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    pin = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    given = [t for t in required.get("nodeSelectorTerms") or [] if t.get("matchExpressions") or t.get("matchFields")]
    terms = [dict(term) for term in given] or [{}]  # an empty term matches nothing: pinned, it would match
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), pin]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    set_visible_devices(pod_spec, {"name": VISIBLE_DEVICES, "value": uuids})


def set_visible_devices(pod_spec: dict[str, Any], env_var: Mapping[str, Any]) -> None:
    """Give every container ``env_var`` as its ``NVIDIA_VISIBLE_DEVICES`` and no ``nvidia.com/gpu``
    request (the device plugin must not pick other GPUs); restartPolicy Never unless set."""
    if pod_spec.get("restartPolicy") is None:
        pod_spec["restartPolicy"] = "Never"
    for kind in ("initContainers", "containers"):
        for container in pod_spec.get(kind) or []:
            env = [e for e in container.get("env") or [] if e.get("name") != VISIBLE_DEVICES]
            env.append(dict(env_var))
            container["env"] = env
            for section in ("limits", "requests"):
                resources = (container.get("resources") or {}).get(section)
                if isinstance(resources, dict):
                    resources.pop("nvidia.com/gpu", None)


def build_job(
    task_obj: Mapping[str, Any],
    placement: Placement,
    *,
    attempt: int,
    queue: str,
    flavor: str = "",
    tolerations: Iterable[Toleration] = (),
) -> dict[str, Any]:
    """The Job for ``task_obj`` (a GPUTask dict with metadata.uid) admitted with ``placement``, in the
    ResourceFlavor ``flavor`` (label ``gputask.io/flavor``) whose ``tolerations`` its pods get (Kueue
    adds a flavor's tolerations to the pods it admits in it).

    Raises KeyError when the task has no name, namespace or uid (the caller converts first).
    """
    annotation = placement_annotation(placement)
    job = job_shell(task_obj, attempt=attempt, queue=queue, annotations={PLACEMENT_ANNOTATION: annotation})
    if flavor:  # the label selects (its value fitted to 63 characters); the annotation keeps the exact name
        job["metadata"]["labels"][FLAVOR_LABEL] = fit_name(flavor)
        job["metadata"]["annotations"][FLAVOR_ANNOTATION] = flavor
    template = job["spec"]["template"]
    added = [_toleration(t) for t in tolerations]
    if added:
        own = template["spec"].get("tolerations") or []
        template["spec"]["tolerations"] = [*own, *(t for t in added if t not in own)]
    template["metadata"]["annotations"] = {
        **(template["metadata"].get("annotations") or {}),
        PLACEMENT_ANNOTATION: annotation,
    }
    _pin_pod_spec(template["spec"], placement.node, ",".join(g.uuid for g in placement.gpus))
    return job


def _toleration(t: Toleration) -> dict[str, Any]:
    """A core/v1 Toleration dict (empty fields left out, as the API server prints them)."""
    raw: dict[str, Any] = {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect,
                           "tolerationSeconds": t.seconds}
    return {k: v for k, v in raw.items() if v not in ("", None)}


def job_shell(
    task_obj: Mapping[str, Any], *, attempt: int, queue: str, annotations: Mapping[str, str]
) -> dict[str, Any]:
    """A task's Job before placement: name, labels, ``annotations`` plus attempt and task uid,
    the ownerReference, and a copy of the task's pod template carrying the labels."""
    meta = task_obj["metadata"]
    name, namespace, uid = meta["name"], meta.get("namespace") or "default", meta["uid"]
    template = copy.deepcopy(dict((task_obj.get("spec") or {}).get("template") or {}))
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
