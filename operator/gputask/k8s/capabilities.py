"""What the cluster offers for pinning GPUs, read from the API at start, and which pinning modes can work.

The operator lists DeviceClasses at ``resource.k8s.io/v1``, then ``v1beta1`` (a 404 means the version is not served:
Kubernetes before 1.32, or 1.32/1.33 without the API switched on), and RuntimeClasses (``node.k8s.io/v1``). What the
nodes' runtime does with ``NVIDIA_VISIBLE_DEVICES`` or a CDI annotation cannot be seen from the API, so envvar and
cdi are judged only by the RuntimeClass they name; dra needs a served ``resource.k8s.io`` version and the NVIDIA DRA
driver's DeviceClass ``gpu.nvidia.com`` (``mig.nvidia.com`` too for MIG devices).

:func:`verdict` gives, per mode, True (nothing the API shows stands in the way), False (something does; the reason
says what) or None (the API could not be read: a 403, a timeout). The operator says the result in one log line, one
Event and the gauge ``gputask_pinning_mode_supported{mode}``, and admits nothing while the configured mode cannot
work (:class:`PinningGate`): tasks wait with reason ``PinningUnavailable``, checked again at each retry.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputask.k8s.client import DEVICECLASSES, RUNTIMECLASSES, ApiError, KubeApi, NotFound, at_version
from gputask.k8s.dra import GPU_CLASS, MIG_CLASS
from gputask.k8s.pinning import MODES, Mode, is_mig

DRA_VERSIONS = ("v1", "v1beta1")
DRA_MISSING = (
    "resource.k8s.io is served at neither v1 nor v1beta1 (Kubernetes 1.34+, or 1.32/1.33 with "
    "--runtime-config=resource.k8s.io/v1beta1=true and the DynamicResourceAllocation feature gate)"
)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the API showed: the ``resource.k8s.io`` version served (None: neither), the DeviceClasses and the
    RuntimeClasses (None: that listing failed), and what could not be read."""

    dra_version: str | None = None
    device_classes: frozenset[str] | None = frozenset()
    runtime_classes: frozenset[str] | None = frozenset()
    unreadable: tuple[str, ...] = ()


async def probe(client: KubeApi) -> Capabilities:
    """List DeviceClasses (v1, else v1beta1) and RuntimeClasses; never raises for an API error."""
    unreadable: list[str] = []
    version: str | None = None
    classes: frozenset[str] | None = frozenset()
    for candidate in DRA_VERSIONS:
        try:
            items = await client.list(at_version(DEVICECLASSES, candidate))
        except NotFound:
            continue
        except ApiError as exc:
            unreadable.append(f"DeviceClasses ({exc.status} {exc.reason})")
            classes = None
            break
        version, classes = candidate, frozenset(str(i["metadata"]["name"]) for i in items)
        break
    try:
        runtime: frozenset[str] | None = frozenset(
            str(i["metadata"]["name"]) for i in await client.list(RUNTIMECLASSES)
        )
    except ApiError as exc:
        unreadable.append(f"RuntimeClasses ({exc.status} {exc.reason})")
        runtime = None
    return Capabilities(version, classes, runtime, tuple(unreadable))


def _runtime_class(caps: Capabilities, name: str) -> tuple[bool | None, str]:
    if not name:
        return True, "pods run with the nodes' default runtime"
    if caps.runtime_classes is None:
        return None, f"RuntimeClass {name!r} could not be looked up"
    if name in caps.runtime_classes:
        return True, f"RuntimeClass {name!r} exists"
    return False, f"RuntimeClass {name!r} (jobRuntimeClassName) does not exist"


def verdict(caps: Capabilities, mode: Mode, runtime_class: str = "") -> tuple[bool | None, str]:
    """Whether ``mode`` can work as far as the API shows, and why (see the module docstring)."""
    runtime_ok, runtime_why = _runtime_class(caps, runtime_class)
    if mode != "dra":
        return runtime_ok, runtime_why
    if caps.device_classes is None:
        return None, "DeviceClasses could not be listed"
    if caps.dra_version is None:
        return False, DRA_MISSING
    if GPU_CLASS not in caps.device_classes:
        return False, (f"resource.k8s.io/{caps.dra_version} is served but DeviceClass {GPU_CLASS} does not exist "
                       "(install the NVIDIA DRA driver, k8s-dra-driver-gpu)")
    if runtime_ok is not True:
        return runtime_ok, runtime_why
    mig = "" if MIG_CLASS in caps.device_classes else f"; no DeviceClass {MIG_CLASS}, so no MIG device"
    return True, f"resource.k8s.io/{caps.dra_version} and DeviceClass {GPU_CLASS}{mig}"


def summary(caps: Capabilities, configured: Mode, runtime_class: str) -> tuple[bool | None, str]:
    """(can the configured mode work, one line naming every mode's verdict)."""
    parts = []
    for mode in MODES:
        ok, why = verdict(caps, mode, runtime_class)
        word = "can work" if ok else "cannot work" if ok is False else "unknown"
        parts.append(f"{mode} {word} ({why})")
    ok, _ = verdict(caps, configured, runtime_class)
    state = "can work" if ok else "CANNOT WORK" if ok is False else "cannot be checked"
    return ok, f"GPU pinning {configured!r} {state}; " + "; ".join(parts)


def missing_for(caps: Capabilities, mode: Mode, uuids: list[str]) -> str | None:
    """Why a placement on devices ``uuids`` cannot be pinned in ``mode`` though the mode works (a MIG device in dra
    mode without the ``mig.nvidia.com`` DeviceClass), else None."""
    classes = caps.device_classes
    if mode == "dra" and classes is not None and MIG_CLASS not in classes and any(map(is_mig, uuids)):
        return f"DeviceClass {MIG_CLASS} does not exist, so the MIG devices of this placement cannot be claimed"
    return None
