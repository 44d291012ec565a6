"""Kueue's objects as gputask reads and writes them (pure functions; Kueue API ``kueue.x-k8s.io/v1beta2``).

Field names follow Kueue's Go types (sigs.k8s.io/kueue ``apis/kueue/v1beta2``: workload_types.go,
admissioncheck_types.go): AdmissionCheck ``spec.controllerName`` and ``status.conditions[type=Active]``;
Workload ``spec.podSets[].name``, ``status.conditions`` (QuotaReserved, Evicted, Finished),
``status.admission.clusterQueue`` and ``status.admissionChecks[]`` = {name, state (Pending, Ready,
Retry, Rejected), lastTransitionTime, message, podSetUpdates[] = {name, labels, annotations,
nodeSelector, tolerations}}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gputask.core import GpuRequest, Placement
from gputask.k8s.jobs import PLACEMENT_ANNOTATION, job_shell, parse_placement, placement_annotation
from gputask.k8s.pinning import (
    ENVVAR,
    MEMORY_BUDGET_ENV,
    MPS_LIMIT_ENV,
    VISIBLE_DEVICES,
    Pinning,
    budget_of,
    cdi_annotation,
    is_mps,
    prepare_pod,
    set_env,
    visible_devices,
)
from gputask.k8s.timestamps import now_rfc3339

API_VERSION = "kueue.x-k8s.io/v1beta2"
CHECK_NAME = "gputask-placement"
CONTROLLER_NAME = "gputask.io/placement"
VISIBLE_DEVICES_ANNOTATION = "gputask.io/visible-devices"
MEMORY_BUDGET_ANNOTATION = "gputask.io/gpu-memory-mib"
MPS_LIMIT_ANNOTATION = "gputask.io/mps-pinned-device-mem-limit"
HOSTNAME_LABEL = "kubernetes.io/hostname"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
DEFAULT_POD_SET = "main"  # Kueue's PodSet name for a batch/v1 Job
CHECK_PENDING, CHECK_READY, CHECK_RETRY = "Pending", "Ready", "Retry"


def _from_annotation(name: str, annotation: str) -> dict[str, Any]:
    """An EnvVar reading the pod annotation ``annotation`` through the downward API."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}}}


def build_kueue_job(
    task_obj: Mapping[str, Any], *, attempt: int, queue: str, pinning: Pinning = ENVVAR,
    request: GpuRequest | None = None,
) -> dict[str, Any]:
    """The suspended Job of a task in Kueue mode; Kueue admits it, gputask's podSetUpdates pin it.

    Its containers read what depends on the placement from pod annotations the podSetUpdate adds
    (:func:`pod_set_annotations`) through the downward API: ``NVIDIA_VISIBLE_DEVICES`` in envvar mode (``void`` in cdi
    mode, whose devices come in the CDI annotation), and for a shared request ``GPUTASK_GPU_MEMORY_MIB`` (and
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` with MPS). ``pinning: dra`` is refused with Kueue by the configuration."""
    job = job_shell(task_obj, attempt=attempt, queue=queue, annotations={})
    labels = job["metadata"]["labels"]
    labels[QUEUE_NAME_LABEL] = queue
    priority = (task_obj["metadata"].get("labels") or {}).get(PRIORITY_CLASS_LABEL)
    if priority:
        labels[PRIORITY_CLASS_LABEL] = priority
    job["spec"]["suspend"] = True
    pod_spec = job["spec"]["template"]["spec"]
    prepare_pod(pod_spec, pinning)
    env = [
        _from_annotation(VISIBLE_DEVICES, VISIBLE_DEVICES_ANNOTATION) if pinning.mode == "envvar"
        else {"name": VISIBLE_DEVICES, "value": visible_devices(pinning, [])}
    ]
    if request is not None and not request.exclusive:
        env.append(_from_annotation(MEMORY_BUDGET_ENV, MEMORY_BUDGET_ANNOTATION))
        if is_mps(request):
            env.append(_from_annotation(MPS_LIMIT_ENV, MPS_LIMIT_ANNOTATION))
    set_env(pod_spec, env)
    return job


def pod_set_annotations(placement: Placement, pinning: Pinning, request: GpuRequest | None = None) -> dict[str, str]:
    """The annotations a podSetUpdate gives the pods of a placed Job: the placement, the devices (envvar: for
    ``NVIDIA_VISIBLE_DEVICES``; cdi: the CDI annotation itself) and the memory budget of a shared request."""
    uuids = [g.uuid for g in placement.only().gpus]
    out = {PLACEMENT_ANNOTATION: placement_annotation(placement)}
    if pinning.mode == "cdi":
        out.update(cdi_annotation(uuids))
    else:
        out[VISIBLE_DEVICES_ANNOTATION] = ",".join(uuids)
    budget = budget_of(request, placement) if request is not None else None
    if budget is not None:
        out[MEMORY_BUDGET_ANNOTATION] = str(budget.memory_mib)
        if budget.mps:
            out[MPS_LIMIT_ANNOTATION] = budget.mps_limit()
    return out


def admission_check() -> dict[str, Any]:
    """The AdmissionCheck gputask answers for."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK_NAME},
        "spec": {"controllerName": CONTROLLER_NAME},
    }


# -- reading Workloads ---------------------------------------------------------------------------
def workload_key(wl: Mapping[str, Any]) -> str:
    """``namespace/name`` of a Workload."""
    meta = wl.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def owner_job(wl: Mapping[str, Any]) -> str | None:
    """``namespace/name`` of the batch Job that owns a Workload, else None."""
    meta = wl.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return f"{meta.get('namespace') or 'default'}/{ref.get('name')}"
    return None


def condition(wl: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    """A Workload condition by type."""
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None)


def condition_true(wl: Mapping[str, Any], ctype: str) -> bool:
    """True when the Workload condition ``ctype`` has status True."""
    return (condition(wl, ctype) or {}).get("status") == "True"


def quota_reserved(wl: Mapping[str, Any]) -> bool:
    """Kueue reserved quota (QuotaReserved True; or, without that condition, an admission set)
    and has neither evicted nor finished it."""
    reserved = condition_true(wl, "QuotaReserved")
    if condition(wl, "QuotaReserved") is None:
        reserved = bool((wl.get("status") or {}).get("admission"))
    return reserved and not condition_true(wl, "Evicted") and not condition_true(wl, "Finished")


def check_state(wl: Mapping[str, Any], name: str = CHECK_NAME) -> Mapping[str, Any] | None:
    """The Workload's ``status.admissionChecks`` entry named ``name``."""
    return next((c for c in (wl.get("status") or {}).get("admissionChecks") or [] if c.get("name") == name), None)


def pod_set_name(wl: Mapping[str, Any]) -> str:
    """The name of the Workload's (first) PodSet."""
    pod_sets = (wl.get("spec") or {}).get("podSets") or [{}]
    return str(pod_sets[0].get("name") or DEFAULT_POD_SET)


def ready_placement(wl: Mapping[str, Any]) -> Placement | None:
    """The placement a Ready check of ours carries in its podSetUpdates, else None."""
    state = check_state(wl) or {}
    if state.get("state") != CHECK_READY:
        return None
    for update in state.get("podSetUpdates") or []:
        placement = parse_placement((update.get("annotations") or {}).get(PLACEMENT_ANNOTATION))
        if placement is not None:
            return placement
    return None


def check_answer(
    old: Mapping[str, Any] | None, state: str, message: str, pod_set_updates: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Our admissionChecks entry; lastTransitionTime moves only when the state changes."""
    since = (old or {}).get("lastTransitionTime") if (old or {}).get("state") == state else None
    answer: dict[str, Any] = {
        "name": CHECK_NAME,
        "state": state,
        "message": message,
        "lastTransitionTime": since or now_rfc3339(),
    }
    if pod_set_updates is not None:
        answer["podSetUpdates"] = pod_set_updates
    return answer
