"""Wire the agent together and run it: probe, reporter, HTTP server, signals.

``gputask agent`` calls :func:`cli_agent`. Exit codes: 0 after SIGTERM/SIGINT, 2 on bad
input or when NVML cannot initialise (no NVIDIA driver: use ``--fake-gpus`` for demos).
The permissions it needs are listed in :mod:`gputask.agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys

from gputask.agent.errors import AgentError
from gputask.agent.fake import FakeProbe
from gputask.agent.metrics import DEFAULT_METRICS_PORT, start_http
from gputask.agent.podresources import PodResourcesClient
from gputask.agent.probe import GpuProbe, NvmlProbe
from gputask.agent.report import Reporter
from gputask.config import parse_duration
from gputask.k8s.client import KubeClient, load_api_client

log = logging.getLogger("gputask.agent")


class UsageError(Exception):
    """A command-line value is missing or malformed."""


TERMINATION_LOG = "/dev/termination-log"
"""Where Kubernetes reads a container's termination message (``terminationMessagePath``'s default), shown by
``kubectl describe pod`` and in the pod's status."""


def termination_message(text: str, path: str | None = None) -> bool:
    """Write ``text`` as the container's termination message when running in a pod (the file exists); True if
    written. ``path`` defaults to $TERMINATION_LOG, else :data:`TERMINATION_LOG`."""
    target = path or os.environ.get("TERMINATION_LOG") or TERMINATION_LOG
    if not os.path.exists(target):
        return False
    try:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text[:4096])  # the kubelet keeps at most 4096 bytes
    except OSError:
        return False
    return True


def build_probe(
    node_name: str, fake_gpus: str | None, *, processes: bool = False, fake_links: str | None = None
) -> GpuProbe:
    """FakeProbe for a spec (with ``fake_links``), else an opened NvmlProbe (listing GPU processes when
    ``processes``); AgentError when neither can start or ``fake_links`` comes without ``fake_gpus``."""
    if fake_links and not fake_gpus:
        raise UsageError("--fake-links needs --fake-gpus (a real node's links come from NVML)")
    if fake_gpus:
        return FakeProbe.from_spec(fake_gpus, node_name=node_name, links=fake_links)
    probe = NvmlProbe(processes=processes)
    probe.open()
    return probe


async def run_agent(reporter: Reporter, *, stop: asyncio.Event, metrics_port: int, host: str = "0.0.0.0") -> None:
    """Serve /metrics and /healthz and run the reporter until ``stop`` is set."""
    runner = await start_http(reporter.metrics, reporter.healthy, port=metrics_port, host=host)
    try:
        await reporter.run(stop)
    finally:
        await runner.cleanup()


def cli_agent(
    *,
    node_name: str | None,
    fake_gpus: str | None,
    interval: str,
    heartbeat: str,
    metrics_port: int,
    kubeconfig: str | None,
    metrics_address: str = "0.0.0.0",
    pod_resources_socket: str = "",
    host_pid: bool = False,
    fake_links: str | None = None,
) -> int:
    """The ``gputask agent`` command; returns the exit code.

    ``pod_resources_socket``: the kubelet's PodResources socket ("" = not read); ``host_pid``: the agent
    runs in the host's PID namespace, so NVML's process IDs can be mapped to pods.
    """
    try:
        node = _node_name(node_name)
        interval_s, heartbeat_s = (
            _positive_duration("--interval", interval),
            _positive_duration("--heartbeat", heartbeat),
        )
        if not 0 <= metrics_port <= 65535:
            raise UsageError(f"--metrics-port must be 0..65535, got {metrics_port}")
        probe = build_probe(node, fake_gpus, processes=host_pid, fake_links=fake_links)
    except (UsageError, AgentError) as exc:
        print(f"gputask agent: {exc}", file=sys.stderr)
        termination_message(f"gputask agent: {exc}")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        client = KubeClient(load_api_client(kubeconfig, user_agent="gputask-agent", pool_size=2), workers=2,
                            field_manager="gputask-agent")
    except Exception as exc:  # kubernetes raises ConfigException or OSError for a bad kubeconfig
        probe.close()
        print(f"gputask agent: cannot load the Kubernetes configuration: {exc}", file=sys.stderr)
        return 2
    kubelet = PodResourcesClient(pod_resources_socket)
    reporter = Reporter(client, probe, node, interval_s=interval_s, heartbeat_s=heartbeat_s, pod_resources=kubelet,
                        host_pid=host_pid)
    try:
        asyncio.run(_serve(reporter, metrics_port, metrics_address))
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise
        print(f"gputask agent: cannot serve metrics on {metrics_address} port {metrics_port}: {exc}", file=sys.stderr)
        return 2
    finally:
        kubelet.close()
        probe.close()
    return 0


async def _serve(reporter: Reporter, metrics_port: int, host: str = "0.0.0.0") -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):  # platforms without signal handlers
            loop.add_signal_handler(sig, stop.set)
    log.info("agent for node %s, metrics on %s port %d", reporter.node_name, host, metrics_port)
    try:
        await run_agent(reporter, stop=stop, metrics_port=metrics_port, host=host)
    finally:
        await reporter.client.close()


def _node_name(value: str | None) -> str:
    name = (value or os.environ.get("NODE_NAME") or "").strip()
    if not name:
        raise UsageError("no node name: pass --node-name or set NODE_NAME (a DaemonSet sets it from spec.nodeName)")
    return name


def _positive_duration(flag: str, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if seconds <= 0:
        raise UsageError(f"{flag} must be positive, got {value!r}")
    return seconds


__all__ = ["DEFAULT_METRICS_PORT", "build_probe", "cli_agent", "run_agent"]
