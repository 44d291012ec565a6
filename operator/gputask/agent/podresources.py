"""The kubelet's PodResources API: which devices the device plugins gave each pod on this node.

The kubelet serves ``v1.PodResourcesLister`` over gRPC on the unix socket
``/var/lib/kubelet/pod-resources/kubelet.sock`` (Kubernetes docs, "Monitoring device plugin
resources"; GA since 1.28). NVIDIA's dcgm-exporter reads it the same way to label GPU metrics
with pods. :class:`PodResourcesClient` calls ``List`` once per :meth:`~PodResourcesClient.list`
and returns a :class:`PodResourcesReading`: the pods with devices of resources named
``nvidia.com/...``, or *unavailable* with a reason and a message. It never raises and never
retries by itself: the agent calls it once per tick, so a dead socket costs one failed call per
interval, never a hot loop.

``List`` is enough: one call answers for every pod, which is what a node report needs; ``Get``
(one pod per call, 1.27+) would take one call per pod.

What the kubelet's answer is known to hold (kubernetes/kubernetes#119423): ``List`` can still
name pods in a terminal phase, whose devices the kubelet may already have given to another pod.
The agent reports what it is told; the operator uses an entry only for a pod it knows to be
bound and not finished.

Reasons (``reason`` when not available): ``Disabled`` (no socket configured), ``SocketNotFound``
(the directory is not mounted, or the kubelet does not serve the API), ``PermissionDenied``
(connecting to a unix socket needs write permission on it; the kubelet's socket is root's and
not group- or world-writable, so the agent must run as uid 0 to read it), ``Unavailable``,
``DeadlineExceeded`` (slower than ``timeout_s``), ``Unimplemented`` (a kubelet without the v1
API, before 1.20), ``Failed`` (anything else, with the gRPC status). ``available`` is True with
reason ``Listed``.

Stubs: none are generated. The messages are built at run time from descriptors
(:func:`file_descriptor`) with ``protobuf``'s message factory, and the call is a plain
``channel.unary_unary`` with their (de)serialisers. Generated ``_pb2`` modules pin the
protobuf runtime to the generator's major version (newer generated code checks it at import),
which would tie the agent's protobuf to whichever grpcio-tools produced them; descriptors built
here work with any protobuf 4.22 or later. ``podresources.proto`` beside this module is the
readable source, and a test compiles it with protoc and compares it with :func:`file_descriptor`
field by field, so the two cannot drift.
"""

from __future__ import annotations

import importlib
import logging
import os
import stat
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any

log = logging.getLogger("gputask.agent")

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves the PodResources API (the ``--pod-resources-socket`` default)."""
DEFAULT_TIMEOUT_S = 5.0
NVIDIA_PREFIX = "nvidia.com/"
"""Resources of NVIDIA's device plugin: ``nvidia.com/gpu``, ``nvidia.com/gpu.shared`` (time-slicing renamed),
``nvidia.com/mig-<profile>`` (the mixed MIG strategy)."""
LIST_METHOD = "/v1.PodResourcesLister/List"

LISTED, DISABLED, SOCKET_NOT_FOUND, PERMISSION_DENIED = "Listed", "Disabled", "SocketNotFound", "PermissionDenied"
UNAVAILABLE, DEADLINE_EXCEEDED, UNIMPLEMENTED, FAILED = "Unavailable", "DeadlineExceeded", "Unimplemented", "Failed"


@dataclass(frozen=True, slots=True)
class PodDevices:
    """One pod and the NVIDIA device IDs the kubelet assigned to its containers (in the kubelet's order,
    duplicates dropped), as ``(resource name, device ID)``."""

    namespace: str
    name: str
    devices: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class PodResourcesReading:
    """What one ``List`` gave: ``available`` with the pods holding NVIDIA devices (sorted by namespace and
    name), or not, with ``reason`` (CamelCase, see the module docstring) and ``message``."""

    available: bool
    reason: str
    message: str
    pods: tuple[PodDevices, ...] = ()


def unavailable(reason: str, message: str) -> PodResourcesReading:
    """A reading that says the API could not be read, and why."""
    return PodResourcesReading(False, reason, message)


# -- descriptors ---------------------------------------------------------------------------------

_REPEATED, _OPTIONAL = "LABEL_REPEATED", "LABEL_OPTIONAL"
_MESSAGES: tuple[tuple[str, tuple[tuple[str, int, str, str], ...]], ...] = (
    ("ListPodResourcesRequest", ()),
    ("ListPodResourcesResponse", (("pod_resources", 1, _REPEATED, ".v1.PodResources"),)),
    (
        "PodResources",
        (("name", 1, _OPTIONAL, "string"), ("namespace", 2, _OPTIONAL, "string"),
         ("containers", 3, _REPEATED, ".v1.ContainerResources")),
    ),
    ("ContainerResources", (("name", 1, _OPTIONAL, "string"), ("devices", 2, _REPEATED, ".v1.ContainerDevices"))),
    ("ContainerDevices", (("resource_name", 1, _OPTIONAL, "string"), ("device_ids", 2, _REPEATED, "string"))),
)
"""podresources.proto as (message, ((field, number, label, type), ...)); a type is ``string`` or a message."""


def _json_name(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(part.capitalize() for part in rest)


def file_descriptor() -> Any:
    """podresources.proto as a ``FileDescriptorProto`` (what ``protoc --descriptor_set_out`` gives for it)."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto(name="podresources.proto", package="v1", syntax="proto3")
    kinds = descriptor_pb2.FieldDescriptorProto
    for name, fields in _MESSAGES:
        message = proto.message_type.add(name=name)
        for field, number, label, kind in fields:
            entry = message.field.add(name=field, number=number, json_name=_json_name(field))
            entry.label = getattr(kinds, label)
            if kind == "string":
                entry.type = kinds.TYPE_STRING
            else:
                entry.type, entry.type_name = kinds.TYPE_MESSAGE, kind
    method = proto.service.add(name="PodResourcesLister").method.add(
        name="List", input_type=".v1.ListPodResourcesRequest", output_type=".v1.ListPodResourcesResponse"
    )
    method.options.SetInParent()  # protoc records the empty "{}" options block
    return proto


@cache
def messages() -> tuple[Any, Any]:
    """The (ListPodResourcesRequest, ListPodResourcesResponse) message classes, built once.

    In a pool of their own, so another ``v1`` package loaded in the same process cannot clash.
    Raises ImportError without ``protobuf``.
    """
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor())
    request = pool.FindMessageTypeByName("v1.ListPodResourcesRequest")
    response = pool.FindMessageTypeByName("v1.ListPodResourcesResponse")
    return message_factory.GetMessageClass(request), message_factory.GetMessageClass(response)


# -- the client -----------------------------------------------------------------------------------


def pods_with_nvidia_devices(response: Any) -> tuple[PodDevices, ...]:
    """The pods of a ``ListPodResourcesResponse`` that hold devices of ``nvidia.com/...`` resources."""
    pods: list[PodDevices] = []
    for pod in response.pod_resources:
        seen: dict[tuple[str, str], None] = {}
        for container in pod.containers:
            for group in container.devices:
                if group.resource_name.startswith(NVIDIA_PREFIX):
                    seen.update(dict.fromkeys((group.resource_name, str(i)) for i in group.device_ids))
        if seen:
            pods.append(PodDevices(pod.namespace, pod.name, tuple(seen)))
    return tuple(sorted(pods, key=lambda p: (p.namespace, p.name)))


class PodResourcesClient:
    """Lists pod devices from the kubelet over ``socket_path`` (empty: disabled). Thread-safe; blocking."""

    def __init__(self, socket_path: str = SOCKET, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.calls = 0  # gRPC calls made (one per list() that reached the socket)
        self._lock = threading.Lock()
        self._channel: Any = None

    def list(self) -> PodResourcesReading:
        """One ``List`` call; never raises. An unavailable reading names the reason (module docstring)."""
        if not self.socket_path:
            return unavailable(DISABLED, "no PodResources socket configured (--pod-resources-socket is empty)")
        problem = self._socket_problem()
        if problem is not None:
            return problem
        with self._lock:
            try:
                grpc = importlib.import_module("grpc")
                request, response = messages()
            except ImportError as exc:
                return unavailable(FAILED, f"{exc.name or exc} is not installed (pip install 'gputask[agent]')")
            return self._call(grpc, request, response)

    def close(self) -> None:
        """Close the gRPC channel (a later list() opens a new one)."""
        with self._lock:
            self._drop_channel()

    def _socket_problem(self) -> PodResourcesReading | None:
        path = self.socket_path
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return unavailable(SOCKET_NOT_FOUND, f"{path} does not exist: the kubelet's pod-resources directory is "
                                                 "not mounted into the agent (chart: agent.podResources.enabled), "
                                                 "or this kubelet does not serve the PodResources API")
        except PermissionError as exc:
            return unavailable(PERMISSION_DENIED, f"{path}: {exc.strerror}: {_ROOT_HINT}")
        except OSError as exc:
            return unavailable(FAILED, f"{path}: {exc}")
        if not stat.S_ISSOCK(mode):
            return unavailable(FAILED, f"{path} is not a unix socket")
        if not os.access(path, os.W_OK):
            return unavailable(PERMISSION_DENIED, f"{path}: no write permission for uid {os.getuid()}: {_ROOT_HINT}")
        return None

    def _call(self, grpc: Any, request: Any, response: Any) -> PodResourcesReading:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        method = self._channel.unary_unary(
            LIST_METHOD, request_serializer=request.SerializeToString, response_deserializer=response.FromString
        )
        self.calls += 1
        try:
            answer = method(request(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self._drop_channel()  # a restarted kubelet makes a new socket: connect afresh next time
            return _from_rpc_error(grpc, exc, self.socket_path, self.timeout_s)
        except Exception as exc:  # never let a client bug stop the agent's report
            self._drop_channel()
            log.exception("PodResources List failed")
            return unavailable(FAILED, f"List failed: {type(exc).__name__}: {exc}")
        pods = pods_with_nvidia_devices(answer)
        return PodResourcesReading(True, LISTED, f"pods holding NVIDIA devices: {len(pods)}", pods)

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


_ROOT_HINT = "the kubelet's socket is root's; the agent must run as uid 0 to connect (chart: agent.podResources)"


def _from_rpc_error(grpc: Any, exc: Any, path: str, timeout_s: float) -> PodResourcesReading:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = (exc.details() if callable(getattr(exc, "details", None)) else None) or str(exc)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return unavailable(DEADLINE_EXCEEDED, f"List on {path} took longer than {timeout_s:g}s")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return unavailable(UNIMPLEMENTED, f"the kubelet does not serve v1.PodResourcesLister/List ({details})")
    if code == grpc.StatusCode.UNAVAILABLE:
        if "permission denied" in details.lower():
            return unavailable(PERMISSION_DENIED, f"{path}: {details}: {_ROOT_HINT}")
        return unavailable(UNAVAILABLE, f"{path}: {details}")
    name = code.name if code is not None else "UNKNOWN"
    return unavailable(FAILED, f"List on {path} failed: {name}: {details}")


__all__ = ["SOCKET", "PodDevices", "PodResourcesClient", "PodResourcesReading", "file_descriptor", "messages"]
