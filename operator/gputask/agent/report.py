"""Keep the node's GPUNode true: probe, compare, create or patch, back off on API errors.

One :meth:`Reporter.tick`:

1. read the probe in a worker thread (a failure is counted and nothing is written, so the
   heartbeat goes stale and the operator's ``heartbeatStaleAfter`` notices a dead probe), then
   the kubelet's PodResources and the GPU processes' pods (:mod:`gputask.agent.attribution`;
   either may be unavailable, which the report says, never a failed tick);
2. normalise the reading into the device view (malformed entries dropped with a warning, a
   GPU in MIG mode reported unschedulable, its MIG devices schedulable, links only between GPUs
   read, see :func:`device_view`);
3. unless backing off: make sure the GPUNode exists (named after the Node, ownerReference to
   the v1 Node when it exists; else created without one and adopted at a later tick);
4. patch ``status`` when the view changed or the heartbeat is due.

Used memory changes all the time; a change smaller than ``used_change_mib`` since the last
patch (on a GPU, or of one pod on a GPU) does not count as a change (the next heartbeat carries
it anyway), which keeps the write rate near one patch per heartbeat per node.

API errors never escape: the reporter counts them, waits ``backoff_initial_s`` doubling up to
``backoff_max_s`` before the next API attempt, and keeps probing meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gputask.agent.attribution import Attribution, attribute, gpu_pods, moved, status_fields
from gputask.agent.metrics import AgentMetrics
from gputask.agent.mig import MigInfo
from gputask.agent.podresources import DISABLED, PodResourcesClient, PodResourcesReading, unavailable
from gputask.agent.probe import GpuProbe, GpuReading, NodeReading
from gputask.agent.processes import read_cgroup
from gputask.core.model import LINK_TYPES, GpuLink
from gputask.k8s.client import GPUNODES, NODES, AlreadyExists, KubeClient, NotFound

log = logging.getLogger("gputask.agent")

API_VERSION = "gputask.io/v1alpha1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gputask-agent"}
MIG_REASON = "MIG mode is enabled; work runs on its MIG devices, reported as devices of their own"
_NO_SOCKET: PodResourcesReading = unavailable(DISABLED, "the agent was started without a PodResources socket")


def device_view(reading: NodeReading) -> NodeReading:
    """``reading`` made safe to publish: malformed GPU entries dropped, MIG GPUs unschedulable.

    A GPU in MIG mode runs work only inside its MIG devices (:mod:`gputask.agent.mig`), which the
    reading lists as devices of their own, so the GPU itself is reported ``healthy: false`` with
    :data:`MIG_REASON` (or the reason its MIG devices could not be read).
    """
    gpus: list[GpuReading] = []
    seen: set[int] = set()
    for raw in reading.gpus:
        problem = _malformed(raw, seen)
        if problem:
            log.warning("dropping malformed GPU reading %r: %s", raw, problem)
            continue
        seen.add(raw.index)
        product = raw.product.strip().replace(" ", "-") if isinstance(raw.product, str) else ""
        gpu = replace(raw, product=product, reason=str(raw.reason or ""))
        if gpu.mig_mode == "Enabled" and gpu.healthy:
            gpu = replace(gpu, healthy=False, reason=MIG_REASON)
        gpus.append(gpu)
    gpus.sort(key=lambda g: g.index)
    links = _sound_links(reading.links, {g.index for g in gpus if g.mig is None})
    return NodeReading(str(reading.driver_version or ""), str(reading.cuda_version or ""), tuple(gpus), links)


def _sound_links(links: Any, indices: set[int]) -> tuple[GpuLink, ...]:
    """The well-formed links between GPUs of ``indices`` (not MIG devices), one per pair, sorted by (a, b)."""
    kept: dict[tuple[int, int], GpuLink] = {}
    for link in links if isinstance(links, tuple) else ():
        problem = _malformed_link(link, indices)
        if problem:
            log.warning("dropping malformed GPU link %r: %s", link, problem)
        else:
            kept.setdefault((link.a, link.b), link)
    return tuple(kept[pair] for pair in sorted(kept))


def _malformed_link(link: Any, indices: set[int]) -> str:
    if not isinstance(link, GpuLink):
        return "not a GpuLink"
    if not (_whole(link.a) and _whole(link.b) and link.a < link.b):
        return "a and b must be GPU indices with a < b"
    if link.a not in indices or link.b not in indices:
        return "a and b must be GPUs of this reading"
    if link.kind not in LINK_TYPES:
        return f"kind must be one of {', '.join(LINK_TYPES)}"
    if not _whole(link.count) or (link.kind == "NVLink") != (link.count > 0):
        return "count must be the NVLinks (> 0) of an NVLink pair and 0 otherwise"
    return ""


def _malformed(gpu: Any, seen: set[int]) -> str:
    if not isinstance(gpu, GpuReading):
        return "not a GpuReading"
    if not _whole(gpu.index) or gpu.index in seen:
        return "index must be a unique non-negative integer"
    if not isinstance(gpu.uuid, str) or not gpu.uuid:
        return "uuid must be a non-empty string"
    if not (_whole(gpu.memory_total_mib) and _whole(gpu.memory_used_mib)):
        return "memory must be non-negative whole MiB"
    if not isinstance(gpu.healthy, bool):
        return "healthy must be a boolean"
    return ""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def gpunode_status(view: NodeReading, heartbeat: dt.datetime, attribution: Attribution | None = None) -> dict[str, Any]:
    """The GPUNode ``status`` for a device view (memory as ``<n>Mi`` quantities), with who uses the GPUs
    when ``attribution`` is given (``gpus[i].pods``, ``podResources``, ``processMemory``)."""
    gpus = []
    for gpu in view.gpus:
        entry: dict[str, Any] = {"index": gpu.index, "uuid": gpu.uuid}
        if gpu.product:
            entry["product"] = gpu.product
        entry |= {
            "memory": f"{gpu.memory_total_mib}Mi",
            "memoryUsed": f"{gpu.memory_used_mib}Mi",
            "healthy": gpu.healthy,
            "reason": gpu.reason,
        }
        if gpu.mig is not None:
            entry["mig"] = mig_status(gpu.mig)
        pods = gpu_pods(attribution, gpu.index)
        if pods is not None:
            entry["pods"] = pods
        gpus.append(entry)
    status = {
        "gpus": gpus,
        "driverVersion": view.driver_version,
        "cudaVersion": view.cuda_version,
        "heartbeatTime": rfc3339(heartbeat),
        "summary": gpu_summary(view),
    }
    if view.links:
        status["links"] = links_status(view.links)
    return status | (status_fields(attribution) if attribution is not None else {})


def links_status(links: tuple[GpuLink, ...]) -> list[dict[str, Any]]:
    """The GPUNode's ``links``: one ``{a, b, type, count?}`` per pair of GPUs the agent could read (``count``, the
    NVLinks between them, only on type NVLink)."""
    out: list[dict[str, Any]] = []
    for link in links:
        entry: dict[str, Any] = {"a": link.a, "b": link.b, "type": link.kind}
        if link.kind == "NVLink":
            entry["count"] = link.count
        out.append(entry)
    return out


def mig_status(info: MigInfo) -> dict[str, Any]:
    """A MIG device's ``mig`` entry in the GPUNode: its parent GPU, profile and instance ids."""
    return {
        "parentIndex": info.parent_index,
        "parentUUID": info.parent_uuid,
        "profile": info.profile,
        "gpuInstanceId": info.gpu_instance_id,
        "computeInstanceId": info.compute_instance_id,
    }


def gpu_summary(view: NodeReading) -> str:
    """``2x NVIDIA-A10 (48Gi)``: GPUs per product with their memory in all, for ``kubectl get gpunodes``
    (an API server prints only the first match of a ``[*]`` column path, so the list cannot be printed)."""
    by_product: dict[str, list[int]] = {}
    for gpu in view.gpus:
        by_product.setdefault(gpu.product or "unknown", []).append(gpu.memory_total_mib)
    parts = [f"{len(mibs)}x {product} ({_mib_text(sum(mibs))})" for product, mibs in sorted(by_product.items())]
    return ", ".join(parts) or "no GPUs"


def _mib_text(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib / 1024:.1f}Gi"


def rfc3339(moment: dt.datetime) -> str:
    """UTC time as ``2026-01-02T03:04:05Z``."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_owner(node_name: str, uid: str) -> dict[str, Any]:
    """The ownerReference to the v1 Node.

    No ``blockOwnerDeletion``: setting it needs ``update`` on ``nodes/finalizers`` under the
    OwnerReferencesPermissionEnforcement admission plugin, and the agent only reads Nodes.
    """
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": uid}


def gpunode_body(node_name: str, node_uid: str | None) -> dict[str, Any]:
    """The GPUNode to create (status is written separately: it is a subresource)."""
    metadata: dict[str, Any] = {"name": node_name, "labels": dict(MANAGED_BY)}
    if node_uid:
        metadata["ownerReferences"] = [node_owner(node_name, node_uid)]
    return {"apiVersion": API_VERSION, "kind": "GPUNode", "metadata": metadata, "spec": {}}


def _owned_by_node(obj: dict[str, Any], node_name: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "Node" and r.get("name") == node_name for r in refs)


class Reporter:
    """Writes one node's GPUNode from a probe. ``tick`` is one step; ``run`` loops until stopped."""

    def __init__(
        self,
        client: KubeClient,
        probe: GpuProbe,
        node_name: str,
        *,
        interval_s: float = 10.0,
        heartbeat_s: float = 30.0,
        used_change_mib: int = 256,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        pod_resources: PodResourcesClient | None = None,
        host_pid: bool = False,
        proc_root: str = "/proc",
    ) -> None:
        self.client, self.probe, self.node_name = client, probe, node_name
        self.pod_resources, self.host_pid, self.proc_root = pod_resources, host_pid, proc_root
        self.interval_s, self.heartbeat_s, self.used_change_mib = interval_s, heartbeat_s, used_change_mib
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.metrics = metrics or AgentMetrics(node_name)
        self._clock, self._wall_clock = clock, wall_clock
        self._exists = False
        self._owner_missing = False
        self._node_missing_said = False
        self._last_sent: NodeReading | None = None
        self._last_sent_attribution: Attribution | None = None
        self._last_sent_at: float | None = None
        self._last_probe_ok_at: float | None = None
        self.failures = 0
        self.retry_at = 0.0

    # -- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set; nothing raised here ends the loop."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:  # a bug must not stop the reports; it is logged with its traceback
                log.exception("agent tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)

    async def tick(self) -> None:
        """Probe once and, unless backing off, bring the GPUNode up to date."""
        read = await self._read()
        if read is None:
            return
        now = self._clock()
        if now < self.retry_at:
            return
        try:
            await self._sync(*read, now)
        except Exception as exc:  # API errors and anything unexpected alike: back off, keep going
            self._api_failed(exc, now)
            return
        self.failures, self.retry_at = 0, 0.0

    def healthy(self) -> bool:
        """True while the last successful probe is younger than three intervals."""
        last = self._last_probe_ok_at
        return last is not None and self._clock() - last <= 3 * self.interval_s

    # -- steps -----------------------------------------------------------------------------

    async def _read(self) -> tuple[NodeReading, Attribution] | None:
        try:
            reading = await asyncio.to_thread(self.probe.read)
            if not isinstance(reading, NodeReading):
                raise TypeError(f"probe returned {type(reading).__name__}, not a NodeReading")
            view = device_view(reading)
        except Exception as exc:  # a probe must never take the agent down; /healthz reports it
            log.warning("GPU probe failed: %s", exc)
            self.metrics.probe_failed()
            return None
        self._last_probe_ok_at = self._clock()
        self.metrics.observe(view)
        try:
            attribution = await asyncio.to_thread(self._attribute, view)
        except Exception:  # a bug here must not stop the device report: say so, report without it
            log.exception("attributing GPUs to pods failed")
            failed = unavailable("Failed", "the agent failed to attribute GPUs to pods (see its log)")
            attribution = attribute(view, failed, host_pid=False, lookup=lambda _: None)
        return view, attribution

    def _attribute(self, view: NodeReading) -> Attribution:
        """Who uses the GPUs of ``view``: one PodResources List, one cgroup read per GPU process (blocking)."""
        listed = self.pod_resources.list() if self.pod_resources is not None else _NO_SOCKET
        lookup = functools.partial(read_cgroup, proc_root=self.proc_root)
        return attribute(view, listed, host_pid=self.host_pid, lookup=lookup)

    async def _sync(self, view: NodeReading, attribution: Attribution, now: float) -> None:
        if not self._exists:
            await self._ensure_gpunode()
        elif self._owner_missing:
            await self._adopt()
        if self._due(view, attribution, now):
            await self._patch_status(view, attribution, now)

    async def _ensure_gpunode(self) -> None:
        try:
            obj = await self.client.get(GPUNODES, self.node_name)
        except NotFound:
            body = gpunode_body(self.node_name, await self._node_uid())
            try:
                obj = await self.client.create(GPUNODES, body)
                log.info("created GPUNode %s", self.node_name)
            except AlreadyExists:
                obj = await self.client.get(GPUNODES, self.node_name)
        self._exists, self._last_sent = True, None  # a new or found object gets a full status
        self._owner_missing = not _owned_by_node(obj, self.node_name)

    async def _adopt(self) -> None:
        uid = await self._node_uid()
        if uid is None:
            return
        obj = await self._get_own()
        meta = obj.get("metadata") or {}
        refs = [r for r in meta.get("ownerReferences") or [] if r.get("kind") != "Node"]
        refs.append(node_owner(self.node_name, uid))
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "ownerReferences": refs}}
        await self.client.patch(GPUNODES, self.node_name, patch)
        self._owner_missing = False
        log.info("GPUNode %s now owned by Node uid %s", self.node_name, uid)

    async def _node_uid(self) -> str | None:
        try:
            node = await self.client.get(NODES, self.node_name)
        except NotFound:
            # Said once (at warning level) until the Node appears: the agent retries every tick.
            level = logging.DEBUG if self._node_missing_said else logging.WARNING
            log.log(level, "Node %s not found; GPUNode without ownerReference for now", self.node_name)
            self._node_missing_said = True
            return None
        self._node_missing_said = False
        return (node.get("metadata") or {}).get("uid") or None

    async def _get_own(self) -> dict[str, Any]:
        try:
            return await self.client.get(GPUNODES, self.node_name)
        except NotFound:
            self._exists = False  # deleted under us: recreate at the next attempt
            raise

    def _due(self, view: NodeReading, attribution: Attribution, now: float) -> bool:
        if self._last_sent is None or self._last_sent_at is None:
            return True
        if moved(self._last_sent_attribution, attribution, self.used_change_mib):
            return True
        return now - self._last_sent_at >= self.heartbeat_s or self._changed(self._last_sent, view)

    def _changed(self, old: NodeReading, new: NodeReading) -> bool:
        def fixed(r: NodeReading) -> tuple[Any, ...]:
            gpus = tuple(replace(g, memory_used_mib=0, processes=None) for g in r.gpus)  # processes: attribution
            return (r.driver_version, r.cuda_version, gpus, r.links)

        if fixed(old) != fixed(new):
            return True
        moved = (abs(a.memory_used_mib - b.memory_used_mib) for a, b in zip(old.gpus, new.gpus, strict=True))
        return any(delta and delta >= self.used_change_mib for delta in moved)

    async def _patch_status(self, view: NodeReading, attribution: Attribution, now: float) -> None:
        status = gpunode_status(view, self._wall_clock(), attribution)
        try:
            await self.client.patch(GPUNODES, self.node_name, {"status": status}, status=True)
        except NotFound:
            self._exists = False
            raise
        self._last_sent, self._last_sent_at, self._last_sent_attribution = view, now, attribution

    def _api_failed(self, exc: Exception, now: float) -> None:
        self.failures += 1
        delay = min(self.backoff_initial_s * 2 ** (self.failures - 1), self.backoff_max_s)
        self.retry_at = now + delay
        self.metrics.api_failed()
        log.warning("GPUNode %s update failed (%s); next attempt in %.1fs", self.node_name, exc, delay)
