"""The agent's Prometheus metrics and its small HTTP server (``/metrics``, ``/healthz``).

Metrics (base units, labels ``node``, ``gpu`` (index), ``uuid``, ``product``; one series per
device, so cardinality is the number of GPUs):

- ``gputask_agent_gpu_memory_total_bytes``, ``gputask_agent_gpu_memory_used_bytes``
- ``gputask_agent_gpu_healthy`` (1 healthy, 0 not)
- ``gputask_agent_probe_errors_total``, ``gputask_agent_api_errors_total`` (label ``node``)

Memory *reserved* by gputask on each GPU is the operator's knowledge and is exported by the
operator, not here. ``/healthz`` answers 200 while the last successful probe is younger than
three probe intervals, else 503: a wedged NVML makes the kubelet restart the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from gputask.agent.probe import MIB, NodeReading

log = logging.getLogger("gputask.agent")

DEFAULT_METRICS_PORT = 9401
_GPU_LABELS = ("node", "gpu", "uuid", "product")


class AgentMetrics:
    """The agent's series in their own registry (tests and several agents never collide)."""

    def __init__(self, node_name: str, registry: CollectorRegistry | None = None) -> None:
        self.node_name = node_name
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.memory_total = Gauge(
            "gputask_agent_gpu_memory_total_bytes",
            "Memory of the GPU that processes can allocate.",
            _GPU_LABELS,
            registry=r,
        )
        self.memory_used = Gauge(
            "gputask_agent_gpu_memory_used_bytes", "Memory in use on the GPU (all processes).", _GPU_LABELS, registry=r
        )
        self.healthy = Gauge("gputask_agent_gpu_healthy", "1 when the GPU is healthy, else 0.", _GPU_LABELS, registry=r)
        self.probe_errors = Counter(
            "gputask_agent_probe_errors_total", "Readings of the node's GPUs that failed.", ["node"], registry=r
        )
        self.api_errors = Counter(
            "gputask_agent_api_errors_total", "Kubernetes API calls of the agent that failed.", ["node"], registry=r
        )
        self.probe_errors.labels(node_name)
        self.api_errors.labels(node_name)

    def observe(self, reading: NodeReading) -> None:
        """Replace the per-GPU series with ``reading`` (a removed GPU's series disappear)."""
        for gauge in (self.memory_total, self.memory_used, self.healthy):
            gauge.clear()
        for gpu in reading.gpus:
            labels = (self.node_name, str(gpu.index), gpu.uuid, gpu.product)
            self.memory_total.labels(*labels).set(gpu.memory_total_mib * MIB)
            self.memory_used.labels(*labels).set(gpu.memory_used_mib * MIB)
            self.healthy.labels(*labels).set(1 if gpu.healthy else 0)

    def probe_failed(self) -> None:
        """Count one failed reading."""
        self.probe_errors.labels(self.node_name).inc()

    def api_failed(self) -> None:
        """Count one failed API call."""
        self.api_errors.labels(self.node_name).inc()

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


def make_app(metrics: AgentMetrics, healthy: Callable[[], bool]) -> web.Application:
    """The aiohttp app serving ``/metrics`` and ``/healthz`` (``healthy`` decides 200 or 503)."""

    async def get_metrics(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_healthz(_: web.Request) -> web.Response:
        if healthy():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="no successful GPU probe within three intervals\n")

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_healthz)
    return app


async def start_http(
    metrics: AgentMetrics, healthy: Callable[[], bool], *, port: int = DEFAULT_METRICS_PORT, host: str = "0.0.0.0"
) -> web.AppRunner:
    """Serve the app on ``host:port`` (0 = any free port; see ``runner.addresses``); cleanup() stops it."""
    runner = web.AppRunner(make_app(metrics, healthy), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("metrics and health on %s", runner.addresses)
    return runner
