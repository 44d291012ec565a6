"""GPU links through the GPUNode: the agent's status, the CRD schema and its CEL rules, the operator's reading."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import crdschema
from gputask.agent import FakeProbe, GpuReading, NodeReading
from gputask.agent.mig import MigInfo
from gputask.agent.report import device_view, gpunode_status
from gputask.config import Config
from gputask.core import NodeName, Scheduler
from gputask.core.model import GpuLink
from gputask.k8s.inventory import Inventory, gpu_links

REPO = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
CRD = crdschema.load_crds(REPO / "crds")["GPUNode"]


def gpu(index: int, uuid: str | None = None) -> GpuReading:
    return GpuReading(index, uuid or f"GPU-{index}", "NVIDIA-H100", 81920, 0)


def links_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crdschema.openapi_schema(CRD)["properties"]["status"]["properties"]["links"]
    return schema


def test_the_status_lists_links_with_a_count_on_nvlink_only_and_none_without_links() -> None:
    """Links go to status.links ({a, b, type, count on NVLink}); a reading without links writes no such key, so a
    GPUNode of an agent that could not read them is what it was before links existed."""
    probe = FakeProbe.from_spec("3x80Gi", node_name="n", links="0-1:NVLink:12,0-2:CrossNUMA")
    status = gpunode_status(device_view(probe.read()), NOW)
    bare = gpunode_status(device_view(FakeProbe.from_spec("3x80Gi", node_name="n").read()), NOW)
    assert (status["links"], "links" in bare) == (
        [{"a": 0, "b": 1, "type": "NVLink", "count": 12}, {"a": 0, "b": 2, "type": "CrossNUMA"}], False)
    body = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "n"}, "status": status}
    assert [e.message for e in crdschema.validator_for(CRD).iter_errors(body)] == []


def test_the_device_view_keeps_only_sound_links_between_gpus_it_publishes() -> None:
    """Links to a MIG device or a GPU not read, reversed or repeated pairs, unknown kinds and counts that do not
    fit the kind are dropped; the rest is sorted by pair."""
    mig = GpuReading(100, "MIG-0", "NVIDIA-H100-MIG-1g.10gb", 9728, 0,
                     mig=MigInfo(0, "GPU-0", "1g.10gb", 1, 0))
    links = (GpuLink(1, 2, "PCIeSwitch"), GpuLink(0, 1, "NVLink", 4), GpuLink(0, 1, "NVLink", 8),
             GpuLink(0, 100, "NVLink", 1), GpuLink(0, 3, "CrossNUMA"), GpuLink(2, 1, "CrossNUMA"),
             GpuLink(0, 2, "Fast"), GpuLink(0, 2, "CrossNUMA", 2), GpuLink(1, 2, "NVLink", 0))
    view = device_view(NodeReading("d", "c", (gpu(0), gpu(1), gpu(2), mig), links))
    assert view.links == (GpuLink(0, 1, "NVLink", 4), GpuLink(1, 2, "PCIeSwitch"))


def test_the_crd_refuses_reversed_pairs_and_counts_that_do_not_fit_the_type() -> None:
    """The CEL rules of a links entry: a < b, and count set on NVLink and only there; the enum names the types."""
    item = links_schema()["items"]
    entries = [{"a": 0, "b": 1, "type": "NVLink", "count": 2}, {"a": 1, "b": 0, "type": "CrossNUMA"},
               {"a": 0, "b": 1, "type": "NVLink"}, {"a": 0, "b": 1, "type": "HostBridge", "count": 1}]
    assert [crdschema.rule_failures(item, e) for e in entries] == [
        [], ["a must be less than b"], ["count is set on type NVLink and only there"],
        ["count is set on type NVLink and only there"]]
    assert item["properties"]["type"]["enum"] == ["NVLink", "PCIeSwitch", "HostBridge", "SameNUMANode", "CrossNUMA"]


def test_the_operator_gives_the_node_its_links_and_refuses_malformed_entries() -> None:
    """The inventory turns status.links into Node.links (sorted, a < b), reports malformed entries as it reports
    refused GPU entries, and leaves out links to a GPU it refused (its uuid is another node's) or never saw."""
    inventory = Inventory(Scheduler(), Config())
    now = NOW.timestamp()
    first = gpunode_status(device_view(NodeReading("d", "c", (gpu(0, "GPU-x"),))), NOW)
    inventory.on_gpunode({"metadata": {"name": "other"}, "status": first}, now)
    status = gpunode_status(device_view(NodeReading("d", "c", (gpu(0), gpu(1), gpu(2), gpu(3, "GPU-x")))), NOW)
    status["links"] = [
        {"a": 1, "b": 2, "type": "PCIeSwitch"},
        {"a": 0, "b": 1, "type": "NVLink", "count": 12},
        {"a": 2, "b": 3, "type": "NVLink", "count": 4},  # GPU 3 is refused: its uuid is node other's
        {"a": 0, "b": 7, "type": "CrossNUMA"},  # no GPU 7
        {"a": 2, "b": 1, "type": "CrossNUMA"},  # the pair again
        {"a": 0, "b": 2, "type": "NVLink"},  # no count
        {"a": 0, "b": "3", "type": "CrossNUMA"},
    ]
    inventory.on_gpunode({"metadata": {"name": "node-a"}, "status": status}, now)
    node = inventory.scheduler.cluster.node(NodeName("node-a")).node
    assert node.links == (GpuLink(0, 1, "NVLink", 12), GpuLink(1, 2, "PCIeSwitch"))
    assert [e for e in inventory.gpunode_errors["node-a"] if e.startswith("status.links")] == [
        "status.links[4]: GPUs 1 and 2 are linked twice",
        "status.links[5]: two different GPUs, a type of NVLink, PCIeSwitch, HostBridge, SameNUMANode, CrossNUMA "
        "and a count on NVLink only, got {'a': 0, 'b': 2, 'type': 'NVLink'}",
        "status.links[6]: a, b and count must be non-negative integers, got {'a': 0, 'b': '3', 'type': 'CrossNUMA'}",
    ]


def test_a_gpunode_without_links_gives_a_node_without_links() -> None:
    """No status.links: a node without links (placement treats every pair alike); a links value that is not a
    list is refused whole."""
    inventory = Inventory(Scheduler(), Config())
    status = gpunode_status(device_view(NodeReading("d", "c", (gpu(0), gpu(1)))), NOW)
    inventory.on_gpunode({"metadata": {"name": "n"}, "status": status}, NOW.timestamp())
    found = inventory.scheduler.cluster.node(NodeName("n")).node
    assert (found.links, gpu_links({"links": "none"}, found)) == ((), ((), ["status.links must be a list, got 'none'"]))
