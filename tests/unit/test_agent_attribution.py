"""Who uses which GPU: cgroup paths to pods, device-plugin IDs to GPUs, NVML processes, and the agent's report."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent_report import NODE, RecordingClient, make

import crdschema
from gputask.agent import FakeProbe, GpuReading, NodeReading, fake_uuid
from gputask.agent.attribution import (
    HOST_PID_MESSAGE,
    Attribution,
    Availability,
    PodGpus,
    attribute,
    gpu_of,
    moved,
    process_memory,
)
from gputask.agent.mig import MigInfo
from gputask.agent.podresources import PodDevices, PodResourcesClient, PodResourcesReading
from gputask.agent.processes import ContainerRef, ProcessUse, memory_by_pod, parse_cgroup, read_cgroup
from gputask.testing.kubelet import FakeKubelet

REPO = Path(__file__).resolve().parents[2]
UID = "0b7632a2-a56e-4278-987a-22de18008dbe"
SLICE_UID = UID.replace("-", "_")
CID = "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376"
V1_REST = "\n".join(f"{n}:{c}:/system.slice/containerd.service" for n, c in ((9, "pids"), (8, "cpuset")))


# -- cgroup paths -------------------------------------------------------------------------------

CGROUPS = [
    # cgroup v1, cgroupfs driver (GKE's containerd; Docker): kubepods/<qos>/pod<uid>/<id>, one line per hierarchy
    (f"11:devices:/kubepods/besteffort/pod{UID}/{CID}\n10:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
     f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}", ContainerRef(UID, CID)),
    (f"4:memory:/kubepods/pod{UID}/{CID}", ContainerRef(UID, CID)),  # Guaranteed: no QoS level
    # cgroup v1, systemd driver: slices with the uid's dashes as underscores, the runtime's scope
    (f"{V1_REST}\n7:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE_UID}.slice/"
     f"cri-containerd-{CID}.scope", ContainerRef(UID, f"containerd://{CID}")),
    (f"5:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice/"
     f"docker-{CID}.scope", ContainerRef(UID, f"docker://{CID}")),
    # cgroup v2 ("0::"), systemd driver: containerd, CRI-O (also with crun's /container subgroup), Guaranteed
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice/crio-{CID}.scope",
     ContainerRef(UID, f"cri-o://{CID}")),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE_UID}.slice/crio-{CID}.scope/"
     "container", ContainerRef(UID, f"cri-o://{CID}")),
    (f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope",
     ContainerRef(UID, f"containerd://{CID}")),
    # cgroup v2, cgroupfs driver with CRI-O
    (f"0::/kubepods/besteffort/pod{UID}/crio-{CID}", ContainerRef(UID, f"cri-o://{CID}")),
    # kind (the kubelet's cgroup root is /kubelet)
    (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope",
     ContainerRef(UID, f"containerd://{CID}")),
    # read from inside a private cgroup namespace (the reader's own cgroup is its root)
    (f"0::/../../kubepods-besteffort-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope",
     ContainerRef(UID, f"containerd://{CID}")),
    # hybrid: an empty unified line first, the pod in a v1 hierarchy
    (f"0::/\n12:memory:/kubepods/burstable/pod{UID}/{CID}", ContainerRef(UID, CID)),
    # CRI-O's monitor process: in the pod, in no container
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SLICE_UID}.slice/crio-conmon-{CID}.scope",
     ContainerRef(UID, "")),
    # outside any pod: host services, init, a user session, a Docker container not run by the kubelet
    ("0::/system.slice/containerd.service", None),
    ("0::/init.scope", None),
    ("0::/user.slice/user-1000.slice/session-3.scope", None),
    (f"0::/system.slice/docker-{CID}.scope", None),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podnot-a-uid.slice/cri-containerd-{CID}.scope",
     None),
    ("", None),
    ("garbage without colons", None),
]


@pytest.mark.parametrize(("text", "expected"), CGROUPS)
def test_cgroup_texts_name_the_pod_and_container(text: str, expected: ContainerRef | None) -> None:
    """Each real /proc/<pid>/cgroup layout (v1/v2, cgroupfs/systemd, containerd/CRI-O/Docker, namespaced) parses."""
    assert parse_cgroup(text) == expected


def test_a_process_is_looked_up_under_the_proc_root(tmp_path: Path) -> None:
    """read_cgroup reads <root>/<pid>/cgroup; a PID that is gone (no file) is None."""
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    assert [read_cgroup(4242, tmp_path), read_cgroup(4243, tmp_path)] == [ContainerRef(UID, CID), None]


def test_memory_is_summed_per_pod_and_unknown_figures_make_the_gpu_unknown() -> None:
    """Processes of one pod add up; a process in no pod counts apart; a None figure makes the split unknown."""
    pods = {1: ContainerRef("pod-a", "c1"), 2: ContainerRef("pod-a", "c2"), 3: ContainerRef("pod-b", "c3")}
    processes = [ProcessUse(1, 1000), ProcessUse(2, 24), ProcessUse(3, 500), ProcessUse(9, 77)]
    assert [
        memory_by_pod(processes, pods.get),
        memory_by_pod([], pods.get),
        memory_by_pod([ProcessUse(1, 10), ProcessUse(3, None)], pods.get),
    ] == [({"pod-a": 1024, "pod-b": 500}, 77), ({}, 0), None]


# -- device IDs -------------------------------------------------------------------------------

G0, G1 = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763", "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
MIG = "MIG-2d4f7c1a-1111-5b3e-8c9d-0a1b2c3d4e5f"
MIG_ON_G1 = GpuReading(200, MIG, "NVIDIA-A100-MIG-1g.10gb", 9728, 0, mig=MigInfo(1, G1, "1g.10gb", 3, 0))
GPUS = (GpuReading(0, G0, "NVIDIA-A100", 40960, 0), GpuReading(1, G1, "NVIDIA-A100", 40960, 0, "Enabled"), MIG_ON_G1)


@pytest.mark.parametrize(
    ("device", "gpu"),
    [
        (G0, G0),  # deviceIDStrategy uuid (the default)
        (f"{G1}::3", G1),  # time-slicing or MPS replica 3 of the GPU
        (MIG, MIG),  # a MIG device (R470+ UUID): a device of its own
        (f"{MIG}::1", MIG),
        (f"MIG-{G1}/3/0", MIG),  # a MIG device in the older MIG-GPU-<uuid>/<gi>/<ci> form
        (f"MIG-{G1}/4/0", G1),  # ... one the reading lacks: on its parent
        ("1", G1),  # deviceIDStrategy index
        ("0::2", G0),
        ("1:0", MIG),  # a MIG device by index
        ("1:5", G1),  # ... one the reading lacks
        ("GPU-00000000-0000-0000-0000-000000000000", None),  # not a GPU of this node
        ("7", None),
        ("0000:3b:00.0", None),  # KubeVirt's nvidia.com/ passthrough IDs are PCI addresses
    ],
)
def test_device_plugin_ids_resolve_to_their_gpu(device: str, gpu: str | None) -> None:
    """Every device-ID form of NVIDIA's device plugin names the GPU it is on; others name none."""
    assert gpu_of(device, GPUS) == gpu


def test_attribution_of_a_reading_and_a_pod_resources_answer() -> None:
    """Pods get their GPUs (raw IDs kept); memory is split on GPUs whose processes were listed, the rest say why."""
    listed_processes = (ProcessUse(7, 1000), ProcessUse(8, 500))
    gpus = (GpuReading(0, G0, "NVIDIA-A100", 40960, 1500, processes=listed_processes),
            GpuReading(1, G1, "NVIDIA-A100", 40960, 0, "Enabled"), MIG_ON_G1)
    listed = PodResourcesReading(True, "Listed", "pods holding NVIDIA devices: 1",
                                 (PodDevices("team", "infer", (("nvidia.com/gpu", f"{G0}::1"),
                                                               ("nvidia.com/mig-1g.10gb", MIG), ("x", "9"))),))
    lookup = {7: ContainerRef("p1", "c")}.get
    assert attribute(NodeReading("d", "c", gpus), listed, host_pid=True, lookup=lookup) == Attribution(
        Availability(True, "Listed", "pods holding NVIDIA devices: 1"),
        (PodGpus("team", "infer", (G0, MIG), (f"{G0}::1", MIG, "9")),),
        Availability(True, "Read", "GPU memory split by pod through each process's cgroup; "
                                   "GPU 200: NVML did not list its processes"),
        ((0, (("p1", 1000),)),),
    )


def test_without_the_host_pid_namespace_or_any_figure_memory_is_not_split() -> None:
    """No host PID namespace: HostPIDDisabled; no GPU with figures: NotAvailable naming each GPU."""
    gpus = (GpuReading(0, G0, "A", 1, 0, processes=(ProcessUse(7, None),)), GpuReading(1, G1, "A", 1, 0))
    assert [process_memory(gpus, host_pid=False, lookup=lambda _: None),
            process_memory(gpus, host_pid=True, lookup=lambda _: None)] == [
        (Availability(False, "HostPIDDisabled", HOST_PID_MESSAGE), ()),
        (Availability(False, "NotAvailable", "GPU 0: NVML gave no memory figure for some process; "
                                             "GPU 1: NVML did not list its processes"), ()),
    ]


def test_pod_memory_moving_less_than_the_threshold_is_no_change() -> None:
    """Memory moves below the threshold are no change; above it, a new pod or a new assignment are."""
    devices = Availability(True, "Listed", "m")
    memory = Availability(True, "Read", "m")

    def of(pods: tuple[tuple[str, int], ...], held: tuple[PodGpus, ...] = ()) -> Attribution:
        return Attribution(devices, held, memory, ((0, pods),))

    base = of((("p1", 1000),))
    assert [
        moved(base, of((("p1", 1200),)), 256),
        moved(base, of((("p1", 1256),)), 256),
        moved(base, of((("p1", 1000), ("p2", 1))), 256),
        moved(base, of((("p1", 1000),), (PodGpus("a", "b", (G0,), (G0,)),)), 256),
        moved(None, base, 256),
    ] == [False, True, True, True, True]


# -- the reporter with a fake kubelet and fake processes -----------------------------------------


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    """A fake kubelet on a socket in tmp_path."""
    with FakeKubelet(tmp_path / "kubelet.sock") as server:
        yield server


async def test_the_report_names_pods_devices_and_memory_and_validates(tmp_path: Path, kubelet: FakeKubelet) -> None:
    """With a kubelet and the host's PIDs, the GPUNode lists each GPU's pods with memory and the pods'
    devices; the stored object validates against the CRD; a dead kubelet is then reported, not fatal."""
    u1 = fake_uuid(NODE, 1)
    kubelet.pods = {("ml", "infer"): {"main": {"nvidia.com/gpu": [f"{u1}::0"]}}}
    proc = tmp_path / "proc"
    for pid, uid in ((100, UID), (200, "9d1e0c55-2f0a-4a53-9d5e-2b1b1c8c3e11")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/{CID}\n")
    probe = FakeProbe.from_spec("2xNVIDIA-A10:24Gi", node_name=NODE)
    probe.set_used(0, 5000)
    probe.set_processes(0, [(100, 4000), (200, 600), (300, 400)])  # 300: a host process (no /proc entry here)
    probe.set_processes(1, [])
    client = RecordingClient()
    reporter, _, _ = make(client, probe, pod_resources=PodResourcesClient(kubelet.socket_path), host_pid=True,
                          proc_root=str(proc))
    await reporter.tick()
    stored = client.objects[("gpunodes", NODE)]
    status = stored["status"]
    validator = crdschema.validator_for(crdschema.load_crds(REPO / "crds")["GPUNode"])
    assert ([g.get("pods") for g in status["gpus"]], status["podResources"], status["processMemory"],
            [e.message for e in validator.iter_errors(stored)]) == (
        [[{"uid": UID, "memoryUsed": "4000Mi"}, {"uid": "9d1e0c55-2f0a-4a53-9d5e-2b1b1c8c3e11", "memoryUsed": "600Mi"}],
         []],
        {"available": True, "reason": "Listed", "message": "pods holding NVIDIA devices: 1",
         "pods": [{"namespace": "ml", "name": "infer", "gpus": [u1], "deviceIDs": [f"{u1}::0"]}]},
        {"available": True, "reason": "Read", "message": "GPU memory split by pod through each process's cgroup"},
        [],
    )
    kubelet.stop()
    await reporter.tick()
    after = client.objects[("gpunodes", NODE)]["status"]["podResources"]
    assert (after["available"], after["reason"], after["pods"], kubelet.calls) == (False, "SocketNotFound", [], 1)
