"""Helpers to run the real kopf operator against the project's API emulator over loopback HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gputask.agent.report import Reporter
from gputask.config import Config
from gputask.k8s.client import (
    EVENTS,
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPUNODES,
    GPUTASKS,
    JOBS,
    NODES,
    KubeClient,
    Listed,
    NotFound,
)
from gputask.k8s.handlers import Operator
from gputask.k8s.main import build_operator, run_operator
from gputask.k8s.writer import now_rfc3339
from gputask.testing import EmulatorServer

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T | None]], timeout_s: float = 15.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached within {timeout_s}s: {probe.__name__}")
        await asyncio.sleep(0.05)


def gpunode(name: str, *gpus: tuple[str, str, str]) -> dict[str, Any]:
    """A GPUNode with (uuid, product, memory) GPUs indexed in order."""
    return {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUNode",
        "metadata": {"name": name},
        "status": {
            "gpus": [
                {"index": i, "uuid": u, "product": p, "memory": m, "memoryUsed": "0", "healthy": True}
                for i, (u, p, m) in enumerate(gpus)
            ],
            "heartbeatTime": now_rfc3339(),
        },
    }


def gputask(name: str, *, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """A GPUTask with a busybox template; ``spec`` fields override the defaults."""
    body = {
        "queueName": "default",
        "gpus": 1,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}},
        **spec,
    }
    return {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "GPUTask",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


@dataclass
class Cluster:
    """The emulator, an API client on it, and helpers to seed objects."""

    server: EmulatorServer
    client: KubeClient
    kubeconfig: Path

    async def add_node(self, name: str, *gpus: tuple[str, str, str]) -> None:
        """Create a Ready v1 Node and its GPUNode (status written as the agent would)."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }
        await self.client.create(NODES, node)
        ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        await self.client.patch(NODES, name, ready, status=True)
        body = gpunode(name, *gpus)
        await self.client.create(GPUNODES, {k: v for k, v in body.items() if k != "status"})
        await self.client.patch(GPUNODES, name, {"status": body["status"]}, status=True)

    async def add_queue(self, name: str = "default", *, local_in: tuple[str, ...] = ("default",), **spec: Any) -> None:
        """Create a GPUClusterQueue, and a GPULocalQueue of the same name pointing at it in each namespace of
        ``local_in`` (tasks name LocalQueues). GPUClusterQueues fail closed (no namespaceSelector: no
        namespace; no GPU resource: nothing admitted), so unless ``spec`` says otherwise the queue is open
        to every namespace with 1000 GPUs of quota: what tests that are not about quota mean by "a queue"."""
        spec.setdefault("namespaceSelector", {})
        if "resourceGroups" not in spec:
            spec.setdefault("resources", [{"name": "nvidia.com/gpu", "nominalQuota": 1000}])
        body = {
            "apiVersion": "gputask.io/v1alpha1",
            "kind": "GPUClusterQueue",
            "metadata": {"name": name},
            "spec": spec,
        }
        await self.client.create(GPUCLUSTERQUEUES, body)
        for namespace in local_in:
            await self.add_local_queue(name, namespace, name)

    async def add_local_queue(self, name: str, namespace: str, cluster_queue: str) -> dict[str, Any]:
        """Create a GPULocalQueue ``namespace/name`` pointing at GPUClusterQueue ``cluster_queue``."""
        body = {
            "apiVersion": "gputask.io/v1alpha1",
            "kind": "GPULocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        }
        return await self.client.create(GPULOCALQUEUES, body, namespace)

    async def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a GPUTask; returns the stored object (with uid)."""
        return await self.client.create(GPUTASKS, body, body["metadata"].get("namespace", "default"))

    async def task(self, name: str, namespace: str = "default") -> dict[str, Any]:
        """GET a GPUTask."""
        return await self.client.get(GPUTASKS, name, namespace)

    async def events_for(self, name: str, namespace: str = "default") -> list[tuple[str, str, str]]:
        """(type, reason, message) of the Events about a GPUTask, in creation order."""
        events = await self.client.list(EVENTS, namespace)
        return [
            (e["type"], e["reason"], e["message"])
            for e in events
            if e.get("involvedObject", {}).get("name") == name and e.get("involvedObject", {}).get("kind") == "GPUTask"
        ]


async def add_ready_node(cluster: Cluster, name: str) -> dict[str, Any]:
    """Create a Ready v1 Node (no GPUNode: that is the agent's job); returns the stored Node."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}
    stored = await cluster.client.create(NODES, node)
    await cluster.client.patch(
        NODES, name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, status=True
    )
    return stored


async def gputask_command(cluster: Cluster, *args: str, stdout: int, stderr: int) -> asyncio.subprocess.Process:
    """Start ``gputask ARGS --kubeconfig <the emulator's>`` as a process (this interpreter)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gputask.cli",
        *args,
        "--kubeconfig",
        str(cluster.kubeconfig),
        stdout=stdout,
        stderr=stderr,
    )


@contextlib.asynccontextmanager
async def running_operator(cluster: Cluster, config: Config | None = None) -> AsyncIterator[Operator]:
    """Run one real operator instance until the block ends."""
    operator = build_operator(config or Config(cycleInterval=0.2), kubeconfig=str(cluster.kubeconfig))
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_operator(operator, stop_flag=stop, ready_flag=ready))
    await asyncio.wait_for(ready.wait(), timeout=15)
    try:
        yield operator
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, timeout=15)
        await operator.client.close()


async def job_of(cluster: Cluster, name: str, namespace: str = "default") -> dict[str, Any] | None:
    """The Job ``namespace/name``, or None while there is none."""
    try:
        return await cluster.client.get(JOBS, name, namespace)
    except NotFound:
        return None


@contextlib.asynccontextmanager
async def running_agent(cluster: Cluster, probe: Any, node: str, **kwargs: Any) -> AsyncIterator[Reporter]:
    """The node agent's reporter for ``node`` with a fast interval (``kwargs`` to :class:`Reporter`), until the
    block ends; its PodResources client is closed after."""
    reporter = Reporter(cluster.client, probe, node, interval_s=0.05, heartbeat_s=5, backoff_max_s=0.2, **kwargs)
    stop = asyncio.Event()
    task = asyncio.create_task(reporter.run(stop))
    try:
        yield reporter
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        if reporter.pod_resources is not None:
            reporter.pod_resources.close()


class Recorder:
    """An informer's sink that keeps what it is fed: (type, name) per event, and each listing's names."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.listings: list[list[str]] = []

    async def apply(self, events: list[dict[str, Any]]) -> None:
        self.events += [(e["type"], e["object"]["metadata"]["name"]) for e in events]

    async def replace(self, listed: Listed) -> None:
        self.listings.append([o["metadata"]["name"] for o in listed.items])
