"""Dynamic Resource Allocation objects for ``pinning: dra`` (pure functions; the executor creates and deletes them).

Shapes (``resource.k8s.io``; Kubernetes API reference): ``v1`` from Kubernetes 1.34, ``v1beta1`` on 1.32 and 1.33
(where the API must be switched on). A ResourceClaim's ``spec.devices.requests[]`` is ``{name, exactly:
{deviceClassName, selectors, allocationMode, count}}`` in v1 and ``{name, deviceClassName, selectors, allocationMode,
count}`` in v1beta1; ``spec.devices.config[]`` is ``{requests, opaque: {driver, parameters}}`` in both. A pod names
claims in ``spec.resourceClaims[]`` (``{name, resourceClaimName}`` or ``{name, resourceClaimTemplateName}``, 1.31+) and
each container the ones it uses in ``resources.claims[] = {name}``.

Devices are the NVIDIA DRA driver's (k8s-dra-driver-gpu): driver ``gpu.nvidia.com``, DeviceClasses ``gpu.nvidia.com``
(full GPUs) and ``mig.nvidia.com`` (MIG devices), each device with the attribute ``uuid`` (its GPU or MIG UUID;
``cmd/gpu-kubelet-plugin/deviceinfo.go``), selected in CEL as ``device.attributes["gpu.nvidia.com"].uuid``.

- A task on whole GPUs gets a ResourceClaimTemplate named after its Job (owned by its GPUTask), one request per GPU
  selecting that UUID; each pod of the Job gets a claim of its own from it, deleted with the pod.
- In DRA a device allocated to one claim cannot be allocated to another, so tasks sharing a GPU share one
  ResourceClaim (a claim may be reserved for up to 256 pods): one per GPU and share group in the tasks' namespace
  (share groups keep namespaces apart, :func:`gputask.manifests.convert.share_group`), named
  ``gputask-<uuid>[-mps]``. MPS claims carry the driver's opaque config ``resource.nvidia.com/v1beta1`` ``GpuConfig``
  (``MigDeviceConfig`` for a MIG device) with ``sharing: {strategy: MPS}`` (``api/nvidia.com/resource/v1beta1``);
  time-sliced ones carry none (the driver's default for a shared claim). The operator creates the claim before the
  first Job that uses it and deletes it once no placed task of that group holds the GPU; Kubernetes deallocates a
  claim no pod reserves (the resourceclaim controller), so one left behind holds no device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputask.core import GpuRequest, Placement, PodPlacement
from gputask.k8s.names import API_VERSION, TASK_LABEL, fit_name
from gputask.k8s.pinning import containers, is_mig, is_mps

GROUP = "resource.k8s.io"
DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
CONFIG_API = "resource.nvidia.com/v1beta1"
TEMPLATE_CLAIM = "gpus"  # the pod's name for its template's claim
SHARED_LABEL = "gputask.io/shared-gpu"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gputask")
_UUID = re.compile(r"^[A-Za-z0-9-]+$")


def device_class(uuid: str) -> str:
    """The DeviceClass of a device: ``mig.nvidia.com`` for a MIG UUID, else ``gpu.nvidia.com``."""
    return MIG_CLASS if is_mig(uuid) else GPU_CLASS


def selector(uuid: str) -> dict[str, Any]:
    """The CEL selector matching exactly the device ``uuid``. Raises ValueError for a UUID that is not
    letters, digits and dashes (it is written into a CEL string literal)."""
    if not _UUID.match(uuid):
        raise ValueError(f"{uuid!r} is not a GPU or MIG UUID")
    return {"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}


def device_request(name: str, uuid: str, version: str) -> dict[str, Any]:
    """One request for exactly the device ``uuid``, in the shape of ``resource.k8s.io/<version>``."""
    exact = {"deviceClassName": device_class(uuid), "selectors": [selector(uuid)], "allocationMode": "ExactCount",
             "count": 1}
    return {"name": name, "exactly": exact} if version == "v1" else {"name": name, **exact}


def mps_config(request_name: str, uuid: str) -> dict[str, Any]:
    """The driver's opaque config making the claim's device an MPS device (GpuConfig, or MigDeviceConfig for MIG)."""
    kind = "MigDeviceConfig" if is_mig(uuid) else "GpuConfig"
    parameters = {"apiVersion": CONFIG_API, "kind": kind, "sharing": {"strategy": "MPS"}}
    return {"requests": [request_name], "opaque": {"driver": DRIVER, "parameters": parameters}}


def shared_claim_name(uuid: str, request: GpuRequest) -> str:
    """``gputask-<uuid in lower case>`` (``-mps`` added for MPS): the namespace's shared claim of that GPU."""
    return f"gputask-{uuid.lower()}{'-mps' if is_mps(request) else ''}"


def template_name(job_name: str) -> str:
    """The ResourceClaimTemplate of a Job of whole GPUs: the Job's name."""
    return job_name


def _owner(task_obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = task_obj["metadata"]
    return {"apiVersion": API_VERSION, "kind": "GPUTask", "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def claim_template(task_obj: Mapping[str, Any], job_name: str, placement: Placement, version: str) -> dict[str, Any]:
    """The ResourceClaimTemplate of a Job on whole GPUs: one request ``gpu-<i>`` per GPU of ``placement``.

    Raises KeyError when the task has no name or uid, ValueError for a malformed UUID."""
    meta = task_obj["metadata"]
    requests = [device_request(f"gpu-{i}", g.uuid, version) for i, g in enumerate(placement.only().gpus)]
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(job_name),
            "namespace": meta.get("namespace") or "default",
            "labels": {TASK_LABEL: fit_name(meta["name"]), MANAGED_BY[0]: MANAGED_BY[1]},
            "ownerReferences": [_owner(task_obj)],
        },
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def shared_claim(namespace: str, uuid: str, request: GpuRequest, version: str) -> dict[str, Any]:
    """The ResourceClaim the tasks of one share group in ``namespace`` share the GPU ``uuid`` through."""
    devices: dict[str, Any] = {"requests": [device_request("gpu", uuid, version)]}
    if is_mps(request):
        devices["config"] = [mps_config("gpu", uuid)]
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceClaim",
        "metadata": {
            "name": shared_claim_name(uuid, request),
            "namespace": namespace,
            "labels": {SHARED_LABEL: uuid.lower(), MANAGED_BY[0]: MANAGED_BY[1]},
        },
        "spec": {"devices": devices},
    }


@dataclass(frozen=True, slots=True)
class Claims:
    """What a Job's pod refers to: its ``spec.resourceClaims`` entries (each container uses them all)."""

    pod_claims: tuple[dict[str, str], ...]

    def apply(self, pod_spec: dict[str, Any]) -> None:
        """Add the claims to the pod and to every container's ``resources.claims`` (edited in place)."""
        names = {c["name"] for c in self.pod_claims}
        own = [c for c in pod_spec.get("resourceClaims") or [] if c.get("name") not in names]
        pod_spec["resourceClaims"] = [*own, *(dict(c) for c in self.pod_claims)]
        for container in containers(pod_spec):
            resources = container["resources"] = dict(container.get("resources") or {})
            kept = [c for c in resources.get("claims") or [] if c.get("name") not in names]
            resources["claims"] = [*kept, *({"name": c["name"]} for c in self.pod_claims)]


def claims_for(job_name: str, request: GpuRequest, placement: Placement) -> Claims:
    """The pod's claims: its template's claim for whole GPUs, else one shared claim ``gpu-<i>`` per GPU."""
    if request.exclusive:
        return Claims(({"name": TEMPLATE_CLAIM, "resourceClaimTemplateName": template_name(job_name)},))
    return Claims(tuple({"name": f"gpu-{i}", "resourceClaimName": shared_claim_name(g.uuid, request)}
                        for i, g in enumerate(placement.only().gpus)))


def objects_for(
    task_obj: Mapping[str, Any], job_name: str, request: GpuRequest, placement: Placement, version: str
) -> list[dict[str, Any]]:
    """The DRA objects a Job needs before it is created: its ResourceClaimTemplate (whole GPUs) or the shared
    ResourceClaims of its GPUs."""
    if request.exclusive:
        return [claim_template(task_obj, job_name, placement, version)]
    namespace = task_obj["metadata"].get("namespace") or "default"
    return [shared_claim(namespace, g.uuid, request, version) for g in placement.only().gpus]


def shared_claim_key(namespace: str, uuid: str, request: GpuRequest) -> str:
    """``namespace/name`` of a shared claim."""
    return f"{namespace}/{shared_claim_name(uuid, request)}"


def used_shared_claims(placed: Sequence[tuple[str, GpuRequest, PodPlacement]]) -> set[str]:
    """Keys of the shared claims the placed pods ``(namespace, request, pod placement)`` use."""
    return {shared_claim_key(ns, g.uuid, req) for ns, req, p in placed if not req.exclusive for g in p.gpus}
