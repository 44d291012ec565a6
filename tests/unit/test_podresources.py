"""The agent's PodResources client against a real gRPC server on a unix socket (gputask.testing.kubelet)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from gputask.agent.podresources import (
    PodDevices,
    PodResourcesClient,
    PodResourcesReading,
    file_descriptor,
    unavailable,
)
from gputask.testing.kubelet import FakeKubelet, packed_varints

REPO = Path(__file__).resolve().parents[2]
PROTO = REPO / "operator" / "gputask" / "agent" / "podresources.proto"
G0, G1 = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763", "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
MIG = "MIG-2d4f7c1a-1111-5b3e-8c9d-0a1b2c3d4e5f"


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    """A fake kubelet serving PodResources on <tmp>/pod-resources/kubelet.sock."""
    with FakeKubelet(tmp_path / "pod-resources" / "kubelet.sock") as server:
        yield server


def client_of(kubelet: FakeKubelet, timeout_s: float = 2.0) -> PodResourcesClient:
    """A client on the fake kubelet's socket."""
    return PodResourcesClient(kubelet.socket_path, timeout_s=timeout_s)


def test_the_proto_file_compiles_to_the_descriptors_built_at_run_time(tmp_path: Path) -> None:
    """protoc's FileDescriptorProto for agent/podresources.proto equals file_descriptor(), field by field."""
    out = tmp_path / "set.pb"
    code = protoc.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={out}", str(PROTO)])
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert (code, list(compiled.file)) == (0, [file_descriptor()])


def test_list_reports_the_nvidia_devices_of_each_pod(kubelet: FakeKubelet) -> None:
    """Pods with nvidia.com/ devices (UUIDs, shared replicas, MIG UUIDs, renamed and mixed-strategy resources)
    are reported, sorted, duplicates dropped; other resources, device-less pods and the kubelet's fields the
    client does not declare (cpu_ids) are skipped."""
    kubelet.pods = {
        ("team-b", "infer"): {"main": {"nvidia.com/gpu": [f"{G1}::0", f"{G1}::3"]},
                              "side": {"nvidia.com/gpu": [f"{G1}::0"]}},
        ("team-a", "train"): {"main": {"nvidia.com/gpu": [G0], "example.com/fpga": ["fpga-1"]},
                              "init": {"nvidia.com/mig-1g.10gb": [MIG], "nvidia.com/gpu.shared": ["1::2"]}},
        ("kube-system", "coredns"): {"coredns": {}},
        ("team-c", "cpu-only"): {"main": {"example.com/fpga": ["fpga-2"]}},
    }
    kubelet.container_extra = packed_varints(3, [0, 1, 2])  # ContainerResources.cpu_ids in the kubelet's proto
    assert client_of(kubelet).list() == PodResourcesReading(
        True,
        "Listed",
        "pods holding NVIDIA devices: 2",
        (
            PodDevices("team-a", "train", (("nvidia.com/gpu", G0), ("nvidia.com/mig-1g.10gb", MIG),
                                           ("nvidia.com/gpu.shared", "1::2"))),
            PodDevices("team-b", "infer", (("nvidia.com/gpu", f"{G1}::0"), ("nvidia.com/gpu", f"{G1}::3"))),
        ),
    )


def test_a_missing_socket_and_an_empty_path_say_so_without_calling(tmp_path: Path) -> None:
    """No socket file: SocketNotFound naming the chart value; no path: Disabled; neither makes a call."""
    missing = PodResourcesClient(str(tmp_path / "kubelet.sock"))
    disabled = PodResourcesClient("")
    assert ([missing.list(), disabled.list()], missing.calls + disabled.calls) == (
        [
            unavailable("SocketNotFound", f"{tmp_path}/kubelet.sock does not exist: the kubelet's pod-resources "
                        "directory is not mounted into the agent (chart: agent.podResources.enabled), or this "
                        "kubelet does not serve the PodResources API"),
            unavailable("Disabled", "no PodResources socket configured (--pod-resources-socket is empty)"),
        ],
        0,
    )


def test_a_socket_nobody_listens_on_is_unavailable(tmp_path: Path) -> None:
    """A socket file left by a kubelet that died: the connection is refused, reported as Unavailable."""
    path = tmp_path / "kubelet.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    reading = PodResourcesClient(str(path), timeout_s=2).list()
    assert (reading.available, reading.reason, reading.message.startswith(f"{path}: ")) == (False, "Unavailable", True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the client as another uid")
def test_a_non_root_agent_is_denied_the_kubelets_socket() -> None:
    """As the kubelet's socket (root's, srwxr-xr-x, in a directory all may enter), a uid without write permission
    gets PermissionDenied, and the connect itself is refused by the kernel too."""
    folder = Path(tempfile.mkdtemp(prefix="pod-resources-", dir="/tmp"))
    folder.chmod(0o755)
    code = (
        "import os, socket, grpc; from gputask.agent.podresources import PodResourcesClient, messages; messages(); "
        "os.setgid(65534); os.setuid(65534); "
        f"r = PodResourcesClient({str(folder / 'kubelet.sock')!r}).list(); print(r.reason); print(r.message); "
        f"s = socket.socket(socket.AF_UNIX)\ntry: s.connect({str(folder / 'kubelet.sock')!r})\n"
        "except PermissionError as e: print(e.strerror)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    try:
        with FakeKubelet(folder / "kubelet.sock") as kubelet:
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    hint = "the kubelet's socket is root's; the agent must run as uid 0 to connect (chart: agent.podResources)"
    assert (result.stdout.splitlines(), kubelet.calls) == (
        ["PermissionDenied", f"{folder}/kubelet.sock: no write permission for uid 65534: {hint}", "Permission denied"],
        0,
    ), result.stderr


def test_server_errors_are_reported_with_the_grpc_status(kubelet: FakeKubelet) -> None:
    """An aborted call is Failed with its code and details; UNIMPLEMENTED (a kubelet without v1) is Unimplemented."""
    client = client_of(kubelet)
    kubelet.fail_with(grpc.StatusCode.INTERNAL, "podresources: checkpoint unreadable")
    failed = client.list()
    kubelet.fail_with(grpc.StatusCode.UNIMPLEMENTED, "unknown service v1.PodResourcesLister")
    old = client.list()
    kubelet.fail_with(None)
    assert [failed, old, client.list().reason] == [
        unavailable("Failed", f"List on {kubelet.socket_path} failed: INTERNAL: podresources: checkpoint unreadable"),
        unavailable("Unimplemented", "the kubelet does not serve v1.PodResourcesLister/List "
                                     "(unknown service v1.PodResourcesLister)"),
        "Listed",
    ]


def test_a_slow_kubelet_hits_the_deadline_and_the_next_call_succeeds(kubelet: FakeKubelet) -> None:
    """A List slower than timeout_s is DeadlineExceeded; once the kubelet is fast again the same client lists."""
    client = client_of(kubelet, timeout_s=0.2)
    kubelet.delay_s = 1.0
    slow = client.list()
    kubelet.delay_s = 0.0
    assert (slow, client.list().reason) == (
        unavailable("DeadlineExceeded", f"List on {kubelet.socket_path} took longer than 0.2s"),
        "Listed",
    )


def test_a_kubelet_stopping_mid_call_is_unavailable_then_missing_then_back(kubelet: FakeKubelet) -> None:
    """The server stops while answering: that call is Unavailable, the next finds no socket, and a restarted
    kubelet (a new socket) is listed again by the same client: one call per list(), never a retry loop."""
    client = client_of(kubelet)
    kubelet.stop_during_call = True
    cut = client.list()
    kubelet.stopped.wait(10)  # the stop runs on the server's thread and may end after the cut call returns
    gone = client.list()
    kubelet.stop_during_call = False
    kubelet.start()
    back = client.list()
    assert ((cut.available, cut.reason), gone.reason, back.reason, kubelet.calls, client.calls) == (
        (False, "Unavailable"), "SocketNotFound", "Listed", 2, 2
    )


def test_an_unreadable_answer_is_failed(kubelet: FakeKubelet) -> None:
    """Bytes that are not a ListPodResourcesResponse make the call Failed (INTERNAL), not a crash."""
    kubelet.pods = {("a", "b"): {"c": {"nvidia.com/gpu": [G0]}}}
    kubelet.container_extra = b"\x0f"  # a truncated field: no protobuf parser accepts it
    reading = client_of(kubelet).list()
    assert (reading.available, reading.reason, reading.message.startswith(f"List on {kubelet.socket_path} failed: "
                                                                          "INTERNAL")) == (False, "Failed", True)
