"""A probe without GPUs, for demos, kind clusters and tests (``gputask agent --fake-gpus 2x24Gi``).

Spec grammar: comma-separated groups ``COUNTx[PRODUCT:]MEMORY``, where MEMORY is a whole
number with ``Mi``, ``Gi`` or ``Ti`` and PRODUCT is a name without spaces (as NVML products
are spelled in gputask). Examples: ``2x24Gi``, ``1x16Gi,1x8Gi``, ``2xNVIDIA-A10:24Gi``.
Devices are indexed in spec order; UUIDs are derived from the node name and index, so a
restarted agent reports the same devices.

Links (``gputask agent --fake-links``): comma-separated ``A-B:TYPE[:COUNT]``, TYPE one of
:data:`~gputask.core.model.LINK_TYPES` and COUNT the NVLinks (NVLink only, required there), e.g.
``0-1:NVLink:12,0-2:PCIeSwitch,1-2:CrossNUMA``; pairs not listed have no link info.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gputask.agent.errors import FakeSpecError, ProbeError
from gputask.agent.probe import GpuReading, NodeReading
from gputask.agent.processes import ProcessUse
from gputask.core.model import LINK_TYPES, GpuLink

DEFAULT_PRODUCT = "Fake-GPU"
MAX_FAKE_GPUS = 64
_GROUP = re.compile(r"^(?P<count>\d+)x(?:(?P<product>[A-Za-z0-9][A-Za-z0-9._-]*):)?(?P<amount>\d+)(?P<unit>Mi|Gi|Ti)$")
_UNIT_MIB = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
_UUID_NAMESPACE = uuid.UUID("6f1b7e52-3c1e-4b8e-9d7a-8a1f0c2b5e94")  # fixed: UUIDs must not change


@dataclass(frozen=True, slots=True)
class FakeGpu:
    """One fake device: product and total memory in MiB."""

    product: str
    memory_mib: int


def parse_fake_spec(spec: str) -> tuple[FakeGpu, ...]:
    """The devices a spec describes, in index order; FakeSpecError says what is wrong."""
    gpus: list[FakeGpu] = []
    for raw in spec.split(","):
        group = raw.strip()
        match = _GROUP.match(group)
        if not match:
            raise FakeSpecError(
                f"bad fake GPU group {group!r} in {spec!r}: expected COUNTx[PRODUCT:]MEMORY "
                "such as 2x24Gi or 1xNVIDIA-A10:24Gi (MEMORY in Mi, Gi or Ti)"
            )
        count, memory_mib = int(match["count"]), int(match["amount"]) * _UNIT_MIB[match["unit"]]
        if count < 1 or memory_mib < 1:
            raise FakeSpecError(f"bad fake GPU group {group!r}: count and memory must be positive")
        gpus.extend([FakeGpu(match["product"] or DEFAULT_PRODUCT, memory_mib)] * count)
    if len(gpus) > MAX_FAKE_GPUS:
        raise FakeSpecError(f"fake GPU spec {spec!r} describes {len(gpus)} GPUs; at most {MAX_FAKE_GPUS}")
    return tuple(gpus)


_LINK = re.compile(r"^(?P<a>\d+)-(?P<b>\d+):(?P<kind>[A-Za-z]+)(?::(?P<count>\d+))?$")


def parse_fake_links(spec: str, gpu_count: int) -> tuple[GpuLink, ...]:
    """The links a ``--fake-links`` spec describes between GPUs 0..gpu_count-1, sorted by pair (see the module
    docstring); FakeSpecError says what is wrong (a malformed entry, an unknown type, a count on a non-NVLink
    pair or none on an NVLink one, a GPU out of range, a pair given twice)."""
    links: dict[tuple[int, int], GpuLink] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        match = _LINK.match(entry)
        if not match:
            raise FakeSpecError(f"bad fake link {entry!r} in {spec!r}: expected A-B:TYPE[:COUNT] such as 0-1:NVLink:12")
        a, b = sorted((int(match["a"]), int(match["b"])))
        kind, count = match["kind"], int(match["count"] or 0)
        if kind not in LINK_TYPES:
            raise FakeSpecError(f"bad fake link {entry!r}: type must be one of {', '.join(LINK_TYPES)}")
        if (kind == "NVLink") != (count > 0):
            raise FakeSpecError(f"bad fake link {entry!r}: an NVLink pair needs its link count (> 0), others none")
        if a == b or b >= gpu_count:
            raise FakeSpecError(f"bad fake link {entry!r}: two different GPUs of 0..{gpu_count - 1}")
        if (a, b) in links:
            raise FakeSpecError(f"bad fake link {entry!r}: GPUs {a} and {b} are given twice")
        links[(a, b)] = GpuLink(a, b, kind, count)
    return tuple(links[pair] for pair in sorted(links))


def fake_uuid(node_name: str, index: int) -> str:
    """The stable NVML-style UUID (``GPU-<uuid>``) of fake device ``index`` on ``node_name``."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


class FakeProbe:
    """Returns fake devices; tests change used memory and health, or make reads fail."""

    def __init__(
        self,
        node_name: str,
        gpus: Sequence[FakeGpu],
        *,
        driver_version: str = "fake",
        cuda_version: str = "fake",
        links: Sequence[GpuLink] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._links = tuple(links)
        self._driver_version, self._cuda_version = driver_version, cuda_version
        self._failure: str | None = None
        self._gpus = [
            GpuReading(i, fake_uuid(node_name, i), gpu.product, gpu.memory_mib, 0) for i, gpu in enumerate(gpus)
        ]

    @classmethod
    def from_spec(cls, spec: str, *, node_name: str, links: str | None = None) -> FakeProbe:
        """A probe for ``spec`` with the ``links`` spec (see the module docstring); FakeSpecError when malformed."""
        gpus = parse_fake_spec(spec)
        return cls(node_name, gpus, links=parse_fake_links(links, len(gpus)) if links else ())

    def read(self) -> NodeReading:
        """The fake devices as they are now; ProbeError while a failure is set."""
        with self._lock:
            if self._failure is not None:
                raise ProbeError(self._failure)
            return NodeReading(self._driver_version, self._cuda_version, tuple(self._gpus), self._links)

    def close(self) -> None:
        """Nothing to release."""

    def set_used(self, index: int, used_mib: int) -> None:
        """Report ``used_mib`` in use on device ``index`` (as foreign processes would)."""
        with self._lock:
            self._gpus[index] = replace(self._gpus[index], memory_used_mib=used_mib)

    def set_processes(self, index: int, processes: Sequence[tuple[int, int | None]] | None) -> None:
        """Report compute processes on device ``index`` as ``(host pid, MiB or None)`` (None: not listed), as
        NVML would for an agent asked to list them; their cgroups come from the reporter's proc root."""
        listed = None if processes is None else tuple(ProcessUse(pid, mib) for pid, mib in processes)
        with self._lock:
            self._gpus[index] = replace(self._gpus[index], processes=listed)

    def set_health(self, index: int, healthy: bool, reason: str = "") -> None:
        """Mark device ``index`` healthy or not, with ``reason`` (e.g. ``"XID 79"``)."""
        with self._lock:
            self._gpus[index] = replace(self._gpus[index], healthy=healthy, reason="" if healthy else reason)

    def set_links(self, links: Sequence[GpuLink]) -> None:
        """Report ``links`` (how pairs of the GPUs are connected) from now on."""
        with self._lock:
            self._links = tuple(links)

    def set_failure(self, message: str | None) -> None:
        """Make every read raise ProbeError(message) until called with None."""
        with self._lock:
            self._failure = message
