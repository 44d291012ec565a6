"""How a Job's pods get exactly the GPUs of their placement, and the memory budget they are told.

Three modes (configuration ``pinning``; README, "GPU runtime set-up"):

- ``envvar``: every container gets ``NVIDIA_VISIBLE_DEVICES=<uuid>,...``. The NVIDIA Container Toolkit's runtime
  (or its hook) reads it and mounts those GPUs, and only honours it in an unprivileged container while
  ``accept-nvidia-visible-devices-envvar-when-unprivileged`` is true in ``/etc/nvidia-container-runtime/config.toml``
  (NVIDIA Container Toolkit ``internal/modifier/cdi.go`` ``getDevicesFromSpec``: devices from the variable are dropped
  with "Ignoring devices specified in NVIDIA_VISIBLE_DEVICES" otherwise). A runtime without the toolkit ignores it.
- ``cdi``: the pod annotation ``cdi.k8s.io/gputask`` lists the fully qualified CDI device names
  ``nvidia.com/gpu=<UUID>`` (the names ``nvidia-ctk cdi generate --device-name-strategy=uuid`` gives GPUs and MIG
  devices); containers get ``NVIDIA_VISIBLE_DEVICES=void`` so an image's default ``all`` exposes nothing. Key and value
  follow the CDI producer rules (container-device-interface ``pkg/cdi/producer/annotations``: key
  ``cdi.k8s.io/`` + a name of at most 63 characters, alphanumeric at both ends, ``-_.`` inside; value the device names
  joined by ``,``; a name is ``vendor/class=device`` with ``[A-Za-z0-9_.:-]`` device characters, ``pkg/parser``).
  The kubelet does not copy pod annotations into a container's CRI annotations (``newContainerAnnotations``), so
  containerd's and CRI-O's own CDI injection never see a pod annotation: the annotation works where containerd passes
  it into the container's OCI spec (runtime option ``pod_annotations = ["cdi.k8s.io/*"]``) and the NVIDIA runtime in
  CDI mode reads it there (``nvidia-container-runtime.modes.cdi.annotation-prefixes``, default ``["cdi.k8s.io/"]``).
- ``dra``: Dynamic Resource Allocation with the NVIDIA DRA driver (:mod:`gputask.k8s.dra`).

Every container of a task on a shared GPU gets ``GPUTASK_GPU_MEMORY_MIB`` (the MiB reserved for it on each of its
GPUs, the smallest where they differ), and with ``gpuSharing: MPS`` also ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in
the MPS client form ``<device>=<limit>`` joined by ``,`` (NVIDIA MPS documentation, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
e.g. ``0=1G``; a limit is an integer with ``M`` or ``G``, the form of ``set_default_device_pinned_mem_limit``, whose
``M`` the NVIDIA DRA driver writes as MiB: ``api/nvidia.com/resource/v1beta1/sharing.go`` ``Megabyte``). Devices are
the client's CUDA ordinals ``0..n-1``, one per GPU of the task, each given the same (smallest) budget, so the order in
which CUDA enumerates them does not matter. Ordinals, not UUIDs: NVIDIA's k8s-device-plugin 0.15.0 switched its
own MPS limits from UUIDs to indices because limits set by UUID were not applied (its release notes). The MPS server
enforces the limit; a client can only lower the server's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gputask.core import GpuRequest, Placement

Mode = Literal["envvar", "cdi", "dra"]
MODES: tuple[Mode, ...] = ("envvar", "cdi", "dra")
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES = "void"  # the NVIDIA toolkit's value for "no GPU", whatever the image's default
MEMORY_BUDGET_ENV = "GPUTASK_GPU_MEMORY_MIB"
MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
CDI_PREFIX = "cdi.k8s.io/"
CDI_ANNOTATION = f"{CDI_PREFIX}gputask"
CDI_KIND = "nvidia.com/gpu"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "MIG-"
_CDI_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_CDI_KEY_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Pinning:
    """How emitted Jobs are pinned: the mode, the RuntimeClass given to pods whose template names none ("": none),
    and the ``resource.k8s.io`` version DRA objects are written in (``v1``, or ``v1beta1`` on 1.32 and 1.33)."""

    mode: Mode = "envvar"
    runtime_class: str = ""
    dra_version: str = "v1"


ENVVAR = Pinning()
"""The default: ``NVIDIA_VISIBLE_DEVICES``, no RuntimeClass."""


def is_mig(uuid: str) -> bool:
    """True for a MIG device's UUID (``MIG-...``, as NVML reports MIG devices since driver R470)."""
    return uuid.startswith(MIG_PREFIX)


def cdi_device_name(uuid: str) -> str:
    """The fully qualified CDI name of a GPU or MIG device: ``nvidia.com/gpu=<UUID>``.

    Raises ValueError for a UUID that is no valid CDI device name (the old MIG form ``MIG-GPU-<uuid>/<gi>/<ci>``
    has ``/``, which CDI names cannot hold).
    """
    if not _CDI_DEVICE.match(uuid):
        raise ValueError(f"{uuid!r} is not a valid CDI device name (letters, digits and _ . : - only)")
    return f"{CDI_KIND}={uuid}"


def cdi_annotation(uuids: Iterable[str], key: str = CDI_ANNOTATION) -> dict[str, str]:
    """The CDI pod annotation requesting ``uuids``: ``{key: "nvidia.com/gpu=<a>,nvidia.com/gpu=<b>"}``.

    Raises ValueError for a key outside the CDI rules or an invalid device name."""
    name = key.removeprefix(CDI_PREFIX)
    if not key.startswith(CDI_PREFIX) or not _CDI_KEY_NAME.match(name):
        raise ValueError(f"{key!r} is not a CDI annotation key (cdi.k8s.io/ and a name of at most 63 characters)")
    return {key: ",".join(cdi_device_name(u) for u in uuids)}


@dataclass(frozen=True, slots=True)
class Budget:
    """What a task on shared GPUs is told: MiB per GPU (the smallest of its GPUs), its GPU count, MPS or not."""

    memory_mib: int
    gpus: int
    mps: bool = False

    def mps_limit(self) -> str:
        """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``0=<MiB>M,1=<MiB>M,...``, one entry per GPU of the task."""
        return ",".join(f"{device}={self.memory_mib}M" for device in range(self.gpus))

    def env(self) -> list[dict[str, Any]]:
        """The environment variables, as core/v1 EnvVar dicts."""
        out = [{"name": MEMORY_BUDGET_ENV, "value": str(self.memory_mib)}]
        if self.mps:
            out.append({"name": MPS_LIMIT_ENV, "value": self.mps_limit()})
        return out


def budget_of(request: GpuRequest, placement: Placement) -> Budget | None:
    """The budget of a shared request placed as ``placement`` (one pod); None for whole GPUs (the task owns them)."""
    gpus = placement.only().gpus
    if request.exclusive or not gpus:
        return None
    return Budget(min(g.memory_mib for g in gpus), len(gpus), mps=is_mps(request))


def is_mps(request: GpuRequest) -> bool:
    """True when the request's share group is an MPS one (``gpuSharing: MPS``)."""
    return request.share_group == "MPS" or request.share_group.endswith(", MPS")


def containers(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The init containers and containers of a pod spec (the dicts themselves, to edit in place)."""
    return [c for kind in ("initContainers", "containers") for c in pod_spec.get(kind) or []]


def set_env(pod_spec: Mapping[str, Any], env: Sequence[Mapping[str, Any]]) -> None:
    """Give every container the variables ``env`` (core/v1 EnvVar dicts), replacing those of the same names."""
    names = {e["name"] for e in env}
    for container in containers(pod_spec):
        kept = [e for e in container.get("env") or [] if e.get("name") not in names]
        container["env"] = [*kept, *(dict(e) for e in env)]


def drop_gpu_requests(pod_spec: Mapping[str, Any]) -> None:
    """Remove ``nvidia.com/gpu`` from every container's requests and limits: the device plugin must not pick other
    GPUs (and in DRA mode the claim brings them)."""
    for container in containers(pod_spec):
        for section in ("limits", "requests"):
            resources = (container.get("resources") or {}).get(section)
            if isinstance(resources, dict):
                resources.pop(GPU_RESOURCE, None)


def prepare_pod(pod_spec: dict[str, Any], pinning: Pinning) -> None:
    """What every mode does: restartPolicy Never unless set, no ``nvidia.com/gpu`` request, and the configured
    RuntimeClass where the template names none (a template's own choice is kept)."""
    if pod_spec.get("restartPolicy") is None:
        pod_spec["restartPolicy"] = "Never"
    drop_gpu_requests(pod_spec)
    if pinning.runtime_class and not pod_spec.get("runtimeClassName"):
        pod_spec["runtimeClassName"] = pinning.runtime_class


def visible_devices(pinning: Pinning, uuids: Sequence[str]) -> str:
    """The value of ``NVIDIA_VISIBLE_DEVICES``: the UUIDs in envvar mode, ``void`` otherwise (CDI or DRA brings the
    devices; ``void`` keeps an image's ``all`` from exposing every GPU through a legacy-mode NVIDIA runtime)."""
    return ",".join(uuids) if pinning.mode == "envvar" else NO_DEVICES


def pin_pod(
    pod_spec: dict[str, Any],
    pod_annotations: dict[str, str],
    placement: Placement,
    pinning: Pinning,
    budget: Budget | None = None,
) -> None:
    """Pin a pod (spec and annotations, edited in place) to the GPUs of ``placement`` in the envvar or cdi mode,
    and tell its containers their ``budget``. DRA's claims are added by :func:`gputask.k8s.dra.claim_pod`."""
    uuids = [g.uuid for g in placement.only().gpus]
    prepare_pod(pod_spec, pinning)
    env = [{"name": VISIBLE_DEVICES, "value": visible_devices(pinning, uuids)}]
    set_env(pod_spec, [*env, *(budget.env() if budget else [])])
    if pinning.mode == "cdi":
        pod_annotations.update(cdi_annotation(uuids))
