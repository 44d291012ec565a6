"""Foreign GPU use: claims read from pod specs, the incremental index, and the GPUs claims occupy."""

from __future__ import annotations

from typing import Any

from gputask.core import Gpu, Node, NodeName
from gputask.k8s.foreign import ForeignPod, ForeignPods, GpuClaim, claim_of, occupied_gpus, pod_claim
from gputask.manifests.podfit import Requests

NODE = Node(NodeName("node-a"), tuple(Gpu(i, f"GPU-{i}", "NVIDIA-A10", 24576) for i in range(4)))


def container(*, gpus: Any = None, section: str = "limits", visible: str | None = None) -> dict[str, Any]:
    """A container requesting ``gpus`` nvidia.com/gpu and/or setting NVIDIA_VISIBLE_DEVICES."""
    body: dict[str, Any] = {"name": "c", "image": "busybox"}
    if gpus is not None:
        body["resources"] = {section: {"nvidia.com/gpu": gpus, "cpu": "1"}}
    if visible is not None:
        body["env"] = [{"name": "A", "value": "1"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": visible}]
    return body


def pod(uid: str, node: str | None = "node-a", phase: str = "Running", **spec: Any) -> dict[str, Any]:
    """A pod bound to ``node`` with the given spec fields."""
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"nodeName": node, **spec} if node else spec,
        "status": {"phase": phase},
    }


def test_claims_read_from_pod_specs() -> None:
    """GPU counts add up over containers (init containers count as their largest), devices come from the env."""
    specs = [
        {"containers": [container(gpus=1), container(gpus="2", section="requests")]},
        {"initContainers": [container(gpus=4)], "containers": [container(gpus=1)]},
        {"containers": [container(visible="GPU-1, 3")]},
        {"containers": [container(visible="all")]},
        {"containers": [container(visible="void"), container(visible="none"), container(visible="")]},
        {"containers": [container()]},
        {"containers": [container(gpus=1, visible="GPU-0")]},
        {"containers": [{"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"x": 1}}]}]},
    ]
    assert [claim_of(s) for s in specs] == [
        GpuClaim(count=3),
        GpuClaim(count=4),
        GpuClaim(devices=("GPU-1", "3")),
        GpuClaim(every=True),
        None,
        None,
        GpuClaim(count=1, devices=("GPU-0",)),
        None,
    ]


def test_only_bound_unfinished_foreign_pods_hold_gpus() -> None:
    """Our own pods, unbound pods and finished pods hold nothing; a running foreign pod holds its claim."""
    ours = pod("ours", containers=[container(visible="GPU-0")])
    ours["metadata"]["labels"] = {"gputask.io/task": "train"}
    pods = [
        ours,
        pod("unbound", node=None, containers=[container(gpus=1)]),
        pod("done", phase="Succeeded", containers=[container(gpus=1)]),
        pod("failed", phase="Failed", containers=[container(gpus=1)]),
        pod("pending", phase="Pending", containers=[container(gpus=1)]),
    ]
    assert [pod_claim(p) for p in pods] == [None, None, None, None, ("node-a", GpuClaim(count=1))]


def test_index_follows_pod_events_and_reports_changed_nodes() -> None:
    """The index adds, keeps, and drops foreign pods per pod event and names the node whose pods changed
    (a pod without GPUs counts too: its requests take the node's cpu and memory)."""
    index = ForeignPods()
    running = pod("p1", containers=[container(gpus=1)])
    changes = [
        index.on_pod(running),
        index.on_pod(running),
        index.on_pod(pod("p2", node="node-b", containers=[container(visible="GPU-9")])),
        index.on_pod(pod("p1", phase="Succeeded", containers=[container(gpus=1)])),
        index.on_pod(pod("p3", containers=[container()])),
    ]
    assert (changes, index.by_node, index.node_of) == (
        ["node-a", None, "node-b", "node-a", "node-a"],
        {
            "node-b": {"p2": ForeignPod(GpuClaim(devices=("GPU-9",)), Requests(), "default", "p2")},
            "node-a": {"p3": ForeignPod(None, Requests(), "default", "p3")},
        },
        {"p2": "node-b", "p3": "node-a"},
    )
    assert index.on_pod(pod("p2", node="node-b"), deleted=True) == "node-b"
    assert index.claims_on("node-a") == [] and index.requests_on("node-a") == (Requests(), 1)
    assert index.on_pod(pod("p3", node="node-a"), deleted=True) == "node-a"
    assert index.by_node == {}


def test_named_devices_and_all_occupy_exactly_those_gpus() -> None:
    """GPUs named by UUID or index are occupied; 'all' occupies every GPU; unknown names are ignored."""
    assert occupied_gpus(NODE, [GpuClaim(devices=("GPU-2", "0", "GPU-x"))], set()) == {0, 2}
    assert occupied_gpus(NODE, [GpuClaim(every=True)], set()) == {0, 1, 2, 3}


def test_counted_gpus_prefer_reported_foreign_use_then_idle_then_ours() -> None:
    """nvidia.com/gpu counts take GPUs with foreign memory first, then idle ones in index order, ours last."""
    busy = Node(
        NODE.name,
        tuple(g if g.index != 3 else Gpu(3, "GPU-3", "NVIDIA-A10", 24576, foreign_mib=900) for g in NODE.gpus),
    )
    named_and_counted = [GpuClaim(devices=("GPU-1",)), GpuClaim(count=2)]
    assert [
        occupied_gpus(busy, [GpuClaim(count=1)], set()),
        occupied_gpus(busy, [GpuClaim(count=2)], {0}),
        occupied_gpus(busy, named_and_counted, set()),
        occupied_gpus(busy, [GpuClaim(count=4)], {0, 1}),
        occupied_gpus(busy, [GpuClaim(count=9)], set()),
    ] == [{3}, {1, 3}, {0, 1, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}]


# -- MIG devices ------------------------------------------------------------------------------
A100 = "NVIDIA-A100-SXM4-40GB"
MIG_NODE = Node(NodeName("node-m"), (
    Gpu(0, "GPU-0", A100, 40960, healthy=False),  # in MIG mode
    Gpu(1, "GPU-1", A100, 40960),
    Gpu(100, "MIG-a", f"{A100}-MIG-1g.5gb", 4864),
    Gpu(101, "MIG-b", f"{A100}-MIG-1g.5gb", 4864),
    Gpu(102, "MIG-c", f"{A100}-MIG-2g.10gb", 9984),
))


def test_mig_resources_are_read_per_profile() -> None:
    """nvidia.com/mig-<profile> requests are counted per profile, beside nvidia.com/gpu, with the kubelet's rules."""
    mig = {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/gpu": 1}}}
    init = {"name": "i", "resources": {"requests": {"nvidia.com/mig-2g.10gb": "1"}}}
    assert claim_of({"initContainers": [init], "containers": [mig, mig]}) == GpuClaim(
        count=2, mig=(("1g.5gb", 4), ("2g.10gb", 1))
    )


def test_counted_mig_devices_are_of_their_profile_and_gpus_never_in_mig_mode() -> None:
    """A MIG count takes MIG devices of its profile (ours last); an nvidia.com/gpu count never takes the GPU in
    MIG mode; 'GPU:MIG' names a MIG device as NVIDIA_VISIBLE_DEVICES does."""
    assert [
        occupied_gpus(MIG_NODE, [GpuClaim(mig=(("1g.5gb", 1),))], {100}),
        occupied_gpus(MIG_NODE, [GpuClaim(mig=(("2g.10gb", 2),))], set()),
        occupied_gpus(MIG_NODE, [GpuClaim(count=2)], {1}),
        occupied_gpus(MIG_NODE, [GpuClaim(devices=("0:1",))], set()),
    ] == [{101}, {102}, {100, 101}, {101}]
