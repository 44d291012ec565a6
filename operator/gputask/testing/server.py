"""Serve :class:`GpuTaskEmulator` over real loopback HTTP, for tests, kopf, kubectl and ``make demo``.

Usage from a plain script (the demo)::

    async def main() -> None:
        async with EmulatorServer() as server:
            server.install_crds_from("crds")
            server.write_kubeconfig("/tmp/kubeconfig")  # for kubectl and the kubernetes client
            ...  # run kopf with a @kopf.on.login() handler that returns kopf_login(server.url)

    asyncio.run(main())

Connections are not kept alive by default (every response says ``Connection: close``): when
kopf runs in the same event loop as the server, it waits up to 5 s at exit for every task started
after it, and an idle keep-alive connection's server task is such a task.

Usage from pytest (pytest-asyncio, function-scoped event loop)::

    @pytest.fixture
    async def server() -> AsyncIterator[EmulatorServer]:
        async with EmulatorServer() as srv:
            yield srv
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp.web
import kopf
import yaml

from gputask.testing.emulator import GpuTaskEmulator

TOKEN = "gputask-emulator-token"  # a dummy bearer token: the emulator does no authentication


def kopf_login(url: str, *, namespace: str = "default") -> kopf.ConnectionInfo:
    """Credentials for a ``@kopf.on.login()`` handler that connect kopf to an emulator URL."""
    return kopf.ConnectionInfo(
        server=url, insecure=True, scheme="Bearer", token=TOKEN, default_namespace=namespace
    )


class EmulatorServer:
    """An async context manager that runs a :class:`GpuTaskEmulator` on a loopback TCP port.

    ``port=0`` picks a free port; ``.url`` tells which, once entered. On exit it ends all open
    watch streams first, so that clients (kopf) and the server shut down promptly.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 emulator: GpuTaskEmulator | None = None, keep_alive: bool = False) -> None:
        """Prepare (not start) a server; pass ``emulator`` to serve a pre-populated one."""
        self.host = host
        self.port = port
        self.keep_alive = keep_alive
        self.emulator = emulator if emulator is not None else GpuTaskEmulator()
        self._runner: aiohttp.web.ServerRunner | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:12345`` (only once the server is started)."""
        if self._runner is None:
            raise RuntimeError("The emulator server is not started; use `async with` first.")
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> EmulatorServer:
        """Start serving; return self."""
        await self.emulator.__aenter__()
        web_server = aiohttp.web.Server(self._serve, handler_cancellation=True)
        runner = aiohttp.web.ServerRunner(web_server, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await aiohttp.web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            await self.emulator.__aexit__(None, None, None)
            raise
        self.port = int(runner.addresses[0][1])
        self._runner = runner
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """End the watch streams, stop serving, and release the emulator."""
        self.emulator.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.emulator.__aexit__(exc_type, exc, tb)

    async def _serve(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        response = await self.emulator(raw_request)
        if not self.keep_alive and not response.prepared:  # watch streams end their connection
            response.force_close()
        return response

    def install_crds_from(self, directory: str | Path) -> list[str]:
        """Install every CustomResourceDefinition in the directory's YAML files; return their names."""
        names = []
        paths = sorted(Path(directory).glob("*.yaml")) + sorted(Path(directory).glob("*.yml"))
        for path in paths:
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    names.append(self.emulator.install_crd(doc)["metadata"]["name"])
        return names

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        """A kubeconfig for this server: plain HTTP and a dummy bearer token."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [
                {
                    "name": "gputask-emulator",
                    "cluster": {"server": self.url, "insecure-skip-tls-verify": True},
                }
            ],
            "users": [{"name": "gputask-emulator", "user": {"token": TOKEN}}],
            "contexts": [
                {
                    "name": "gputask-emulator",
                    "context": {
                        "cluster": "gputask-emulator",
                        "user": "gputask-emulator",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "gputask-emulator",
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """Write :meth:`kubeconfig` to a file for ``kubectl --kubeconfig`` and the kubernetes client."""
        path = Path(path)
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False), encoding="utf-8")
        return path
