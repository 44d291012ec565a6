"""What the cluster offers for pinning: the probe of the API and the verdict per mode."""

from __future__ import annotations

from typing import Any

from gputask.config import Config
from gputask.core import GpuSlot, NodeName, Placement
from gputask.k8s import pinner as pinner_module
from gputask.k8s.capabilities import Capabilities, missing_for, probe, summary, verdict
from gputask.k8s.client import ApiError, NotFound, Resource
from gputask.k8s.pinner import Pinner
from gputask.k8s.writer import Writer
from gputask.metrics import OperatorMetrics


class Served:
    """A KubeApi stand-in answering LISTs: the resources it serves (group/version/plural -> names), 404 for others,
    and a 403 for the ones named in ``forbidden``."""

    def __init__(self, served: dict[str, list[str]], forbidden: tuple[str, ...] = ()) -> None:
        self.served, self.forbidden = served, forbidden

    async def list(self, res: Resource, *_: Any, **__: Any) -> list[dict[str, Any]]:
        key = f"{res.group}/{res.version}/{res.plural}"
        if key in self.forbidden:
            raise ApiError(403, "Forbidden", f"cannot list {res.plural}")
        if key not in self.served:
            raise NotFound(404, "NotFound", "the server could not find the requested resource")
        return [{"metadata": {"name": name}} for name in self.served[key]]


async def test_the_probe_prefers_v1_reads_classes_and_says_what_it_could_not_read() -> None:
    """v1 and v1beta1 served: v1 with its DeviceClasses; only v1beta1: v1beta1; none: None; a 403 is unreadable."""
    both = Served({"resource.k8s.io/v1/deviceclasses": ["gpu.nvidia.com"], "resource.k8s.io/v1beta1/deviceclasses": [],
                   "node.k8s.io/v1/runtimeclasses": ["nvidia"]})
    beta = Served({"resource.k8s.io/v1beta1/deviceclasses": ["gpu.nvidia.com", "mig.nvidia.com"]},
                  forbidden=("node.k8s.io/v1/runtimeclasses",))
    neither = Served({"node.k8s.io/v1/runtimeclasses": []})
    assert [await probe(c) for c in (both, beta, neither)] == [  # type: ignore[arg-type]
        Capabilities("v1", frozenset({"gpu.nvidia.com"}), frozenset({"nvidia"})),
        Capabilities("v1beta1", frozenset({"gpu.nvidia.com", "mig.nvidia.com"}), None,
                     ("RuntimeClasses (403 Forbidden)",)),
        Capabilities(None, frozenset(), frozenset()),
    ]


def test_verdicts_per_mode() -> None:
    """envvar/cdi depend on the named RuntimeClass only; dra also on the API and gpu.nvidia.com; unknown is None."""
    dra_ok = Capabilities("v1", frozenset({"gpu.nvidia.com"}), frozenset({"nvidia"}))
    no_api = Capabilities(None, frozenset(), frozenset())
    no_driver = Capabilities("v1beta1", frozenset(), frozenset())
    unreadable = Capabilities(None, None, None, ("DeviceClasses (403 Forbidden)",))
    assert [
        verdict(dra_ok, "cdi", "nvidia"), verdict(dra_ok, "envvar", "nvidia-cdi"), verdict(unreadable, "envvar", "x"),
        verdict(dra_ok, "dra"), verdict(no_api, "dra")[0], verdict(no_driver, "dra"), verdict(unreadable, "dra"),
    ] == [
        (True, "RuntimeClass 'nvidia' exists"),
        (False, "RuntimeClass 'nvidia-cdi' (jobRuntimeClassName) does not exist"),
        (None, "RuntimeClass 'x' could not be looked up"),
        (True, "resource.k8s.io/v1 and DeviceClass gpu.nvidia.com; no DeviceClass mig.nvidia.com, so no MIG device"),
        False,
        (False, "resource.k8s.io/v1beta1 is served but DeviceClass gpu.nvidia.com does not exist (install the NVIDIA "
                "DRA driver, k8s-dra-driver-gpu)"),
        (None, "DeviceClasses could not be listed"),
    ]


def test_the_summary_is_one_line_naming_every_mode() -> None:
    """The line says whether the configured mode can work, then each mode's verdict and why."""
    ok, line = summary(Capabilities("v1", frozenset({"gpu.nvidia.com", "mig.nvidia.com"}), frozenset()), "envvar", "")
    assert (ok, line) == (True, "GPU pinning 'envvar' can work; envvar can work (pods run with the nodes' default "
                                "runtime); cdi can work (pods run with the nodes' default runtime); dra can work "
                                "(resource.k8s.io/v1 and DeviceClass gpu.nvidia.com)")


def test_a_mig_placement_needs_the_mig_device_class_in_dra_mode_only() -> None:
    """Without mig.nvidia.com a MIG device cannot be claimed with DRA; GPUs can, and envvar needs no class."""
    caps = Capabilities("v1", frozenset({"gpu.nvidia.com"}), frozenset())
    mig = ["MIG-5c4b2c1d-7d3e-5f7a-8b9c-0d1e2f3a4b5c"]
    assert [missing_for(caps, "dra", mig), missing_for(caps, "dra", ["GPU-1"]), missing_for(caps, "envvar", mig)] == [
        "DeviceClass mig.nvidia.com does not exist, so the MIG devices of this placement cannot be claimed", None, None]


class Clock:
    """A monotonic clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_what_the_cluster_offers_is_looked_at_again_whatever_it_found(monkeypatch: Any) -> None:
    """cdi: a RuntimeClass deleted after a good check stops admissions at the first one after RECHECK_S (pods
    would be refused); dra: DeviceClasses that could not be read hold admissions (the version to write claims in
    is unknown) until a later look reads them."""
    clock = Clock()
    monkeypatch.setattr(pinner_module.time, "monotonic", clock)
    placement = Placement.one(NodeName("n"), (GpuSlot(0, "GPU-0", 4096),))
    cdi_api = Served({"node.k8s.io/v1/runtimeclasses": ["nvidia-cdi"]})
    cdi = Pinner(Config(pinning="cdi", jobRuntimeClassName="nvidia-cdi"), Writer(cdi_api), OperatorMetrics())  # type: ignore[arg-type]
    dra_api = Served({"node.k8s.io/v1/runtimeclasses": [], "resource.k8s.io/v1/deviceclasses": ["gpu.nvidia.com"]},
                     forbidden=("resource.k8s.io/v1/deviceclasses",))
    dra = Pinner(Config(pinning="dra"), Writer(dra_api), OperatorMetrics())  # type: ignore[arg-type]
    await cdi.check(announce=False)
    await dra.check(announce=False)
    first = [await cdi.refusal(placement), await dra.refusal(placement)]
    cdi_api.served["node.k8s.io/v1/runtimeclasses"] = []
    dra_api.forbidden = ()
    clock.now += pinner_module.RECHECK_S
    second = [await cdi.refusal(placement), await dra.refusal(placement)]
    assert (first, second) == (
        [None, "GPU pinning 'dra' cannot be checked: DeviceClasses could not be listed (DeviceClasses (403 "
               "Forbidden)); looked at again at the next retry"],
        ["GPU pinning 'cdi' cannot work in this cluster: RuntimeClass 'nvidia-cdi' (jobRuntimeClassName) does not "
         "exist", None],
    )
