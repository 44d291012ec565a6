"""A fake kubelet PodResources server: a real gRPC server on a unix socket, for tests and demos.

It serves ``v1.PodResourcesLister/List`` with the message classes of
:mod:`gputask.agent.podresources` (the same descriptors the client parses with), so the agent's
client is tested over a real socket, a real HTTP/2 connection and real gRPC status codes. What
it answers is set on the object between calls:

- :attr:`FakeKubelet.pods`: ``{(namespace, name): {container: {resource: [device IDs]}}}``;
- :attr:`FakeKubelet.container_extra`: raw protobuf bytes appended to each container's entry (fields
  the kubelet sends and the client's descriptors leave out, e.g. ``cpu_ids``, to check they are
  skipped; :func:`packed_varints` writes one);
- :meth:`FakeKubelet.fail_with`: abort the next calls with a gRPC status code;
- :attr:`FakeKubelet.delay_s`: sleep before answering (a slow kubelet, for deadlines);
- :attr:`FakeKubelet.stop_during_call`: stop the server while a call is in flight (a kubelet restart).

``mode`` sets the socket's permission bits (the kubelet's is root's, ``srwxr-xr-x``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gputask.agent.podresources import messages

Devices = Mapping[str, Mapping[str, Sequence[str]]]  # container -> resource -> device IDs


class FakeKubelet:
    """Serves PodResources ``List`` on ``socket_path`` until :meth:`stop`; counts the calls it answered."""

    def __init__(self, socket_path: str | Path, *, mode: int = 0o755) -> None:
        self.socket_path = str(socket_path)
        self.mode = mode
        self.pods: dict[tuple[str, str], Devices] = {}
        self.container_extra = b""
        self.delay_s = 0.0
        self.stop_during_call = False
        self.calls = 0
        self._failure: tuple[grpc.StatusCode, str] | None = None
        self._server: grpc.Server | None = None
        self.stopped = threading.Event()

    def start(self) -> FakeKubelet:
        """Listen on the socket (made anew) with ``mode``."""
        with_dir = Path(self.socket_path).parent
        with_dir.mkdir(parents=True, exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        request, _ = messages()
        handler = grpc.unary_unary_rpc_method_handler(
            self._list, request_deserializer=request.FromString, response_serializer=lambda body: body
        )
        service = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler})
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=(service,))
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        os.chmod(self.socket_path, self.mode)
        self._server = server
        self.stopped.clear()
        return self

    def stop(self) -> None:
        """Stop serving at once (calls in flight are cancelled) and remove the socket; :attr:`stopped` is set
        once both are done (a stop during a call runs on another thread: a test waits for it)."""
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.stopped.set()

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail_with(self, code: grpc.StatusCode | None, details: str = "") -> None:
        """Abort every call with ``code`` and ``details`` until called with None."""
        self._failure = None if code is None else (code, details)

    def answer(self) -> bytes:
        """The serialized ``ListPodResourcesResponse`` for :attr:`pods`, each container followed by
        :attr:`container_extra`."""
        _, response = messages()
        out = b""
        for (namespace, name), containers in self.pods.items():
            template = response().pod_resources.add(name=name, namespace=namespace)
            pod = template.SerializeToString()
            for container, resources in containers.items():
                entry = type(template.containers.add())(name=container)
                for resource, ids in resources.items():
                    entry.devices.add(resource_name=resource, device_ids=list(ids))
                pod += _field(3, entry.SerializeToString() + self.container_extra)  # PodResources.containers
            out += _field(1, pod)  # ListPodResourcesResponse.pod_resources
        return out

    def _list(self, _request: Any, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        if self.stop_during_call:
            threading.Thread(target=self.stop, daemon=True).start()
            time.sleep(5)  # cancelled by the stop
        if self.delay_s:
            time.sleep(self.delay_s)
        if self._failure is not None:
            context.abort(*self._failure)
        return self.answer()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): key, length, payload."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def packed_varints(number: int, values: Sequence[int]) -> bytes:
    """A packed repeated varint field, e.g. ``packed_varints(3, [0, 1])`` for the kubelet's ``cpu_ids = 3``."""
    return _field(number, b"".join(_varint(v) for v in values))


__all__ = ["FakeKubelet", "packed_varints"]
