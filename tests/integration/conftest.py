"""Fixtures that run the real kopf operator against the project's API emulator over loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gputask.k8s.client import KubeClient, load_api_client
from gputask.testing import EmulatorServer
from harness import REPO, Cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A running emulator with the CRDs installed and a client on it."""
    async with EmulatorServer() as server:
        server.install_crds_from(REPO / "crds")
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        client = KubeClient(load_api_client(str(kubeconfig), user_agent="test"), field_manager="test")
        yield Cluster(server, client, Path(kubeconfig))
        await client.close()


# No ``operator`` fixture on purpose: pytest-asyncio tears fixtures down in a new task, which
# kopf treats as its own and waits 5 s for. Tests run ``async with running_operator(cluster)``
# in their body instead, so kopf stops inside the test's task.
