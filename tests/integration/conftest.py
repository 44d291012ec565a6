"""Fixtures that run the real kopf operator against the project's API emulator over loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gputask.k8s.client import KubeClient, load_api_client
from gputask.k8s.handlers import Operator
from gputask.testing import EmulatorServer
from harness import REPO, Cluster, running_operator


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A running emulator with the CRDs installed and a client on it."""
    async with EmulatorServer() as server:
        server.install_crds_from(REPO / "crds")
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        client = KubeClient(load_api_client(str(kubeconfig)))
        yield Cluster(server, client, Path(kubeconfig))
        await client.close()


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[Operator]:
    """The real kopf operator running against ``cluster``."""
    async with running_operator(cluster) as op:
        yield op
