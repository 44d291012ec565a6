"""Every kind the operator watches besides GPUTasks, Jobs and pods comes through its informers into typed feeds.

Each test runs the operator's rebuild and informers on the in-process fake client (no HTTP, no kopf) and looks at
what the controller or the Kueue support knows after changes to one kind.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

import pytest

from gputask.config import Config
from gputask.k8s import informer as informer_module
from gputask.k8s.client import (
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPUNODES,
    GPURESOURCEFLAVORS,
    GPUTASKS,
    LOCALQUEUES,
    NAMESPACES,
    NODES,
    PRIORITYCLASSES,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
    Resource,
)
from gputask.k8s.handlers import Operator
from gputask.testing.fake import FakeKubeClient

GPU0 = {"index": 0, "uuid": "GPU-0", "product": "NVIDIA-A10", "memory": "24Gi", "memoryUsed": "0", "healthy": True}
READY = {"conditions": [{"type": "Ready", "status": "True"}]}
QUEUE_SPEC = {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1000}]}


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries after 10 ms instead of 1 s."""
    monkeypatch.setattr(informer_module, "RETRY_S", 0.01)


async def until(probe: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``probe()`` is true (fail after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not probe():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail("condition not reached")
        await asyncio.sleep(0.01)


async def leading(client: FakeKubeClient, config: Config | None = None, *, watching: bool = True) -> Operator:
    """An operator on ``client`` that leads, rebuilt, its informers started (no loop, no kopf); with ``watching``,
    once each has its listing (those the rebuild did not list, list first)."""
    operator = Operator(config or Config(), client)
    operator.leading = True
    await operator.rebuild()
    if not watching:
        return operator
    await until(lambda: all(informer.resource_version for informer in operator.informers.values()))  # all watch
    return operator


def workload(name: str) -> dict[str, Any]:
    """A Kueue Workload owned by Job ``name``."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {
        "name": name, "namespace": "ns",
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": f"uid-{name}"}]}}


# kind -> (its resource, namespace, a body, what the operator knows of that kind, what it knows once the body is in)
KINDS: dict[str, tuple[Resource, str | None, dict[str, Any], Callable[[Operator], object], object]] = {
    "priorityclasses": (PRIORITYCLASSES, None, {"metadata": {"name": "high"}, "value": 1000},
                        lambda op: op.controller.inventory.priority_classes, {"high": 1000}),
    "workloadpriorityclasses": (WORKLOADPRIORITYCLASSES, None, {"metadata": {"name": "urgent"}, "value": 7},
                                lambda op: op.controller.inventory.workload_priority_classes, {"urgent": 7}),
    "namespaces": (NAMESPACES, None, {"metadata": {"name": "team", "labels": {"tier": "gold"}}},
                   lambda op: op.controller.inventory.namespace_labels,
                   {"team": {"tier": "gold", "kubernetes.io/metadata.name": "team"}}),
    "nodes": (NODES, None, {"metadata": {"name": "node-a"}, "status": READY},
              lambda op: sorted(op.controller.inventory.nodes), ["node-a"]),
    "gpunodes": (GPUNODES, None, {"metadata": {"name": "node-a"}, "status": {"gpus": [GPU0]}},
                 lambda op: sorted(op.controller.inventory.gpunodes), ["node-a"]),
    "flavors": (GPURESOURCEFLAVORS, None, {"metadata": {"name": "a10"}, "spec": {}},
                lambda op: sorted(op.controller.inventory.flavor_meta), ["a10"]),
    "queues": (GPUCLUSTERQUEUES, None, {"metadata": {"name": "cq"}, "spec": QUEUE_SPEC},
               lambda op: sorted(op.controller.inventory.queue_meta), ["cq"]),
    "localqueues": (GPULOCALQUEUES, "ns",
                    {"metadata": {"name": "lq", "namespace": "ns"}, "spec": {"clusterQueue": "cq"}},
                    lambda op: sorted(op.controller.local_queues.queues), [("ns", "lq")]),
    "kueuelocalqueues": (LOCALQUEUES, "ns", {"metadata": {"name": "default", "namespace": "ns"}},
                         lambda op: {ns: names for ns, names in op.kueue.detector.local_queues.items() if names},
                         {"ns": {"default"}}),
    "workloads": (WORKLOADS, "ns", workload("t-1"), lambda op: sorted(op.kueue.admission.workloads), ["ns/t-1"]),
}


def config_for(kind: str) -> Config:
    """Kueue mode for Workloads (only watched there), gputask mode otherwise."""
    return Config(queueing="kueue" if kind == "workloads" else "gputask")


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_each_kinds_changes_after_the_rebuild_reach_the_operator_through_its_informer(kind: str) -> None:
    """An object of the kind created after the rebuild is known once its informer feeds it, and forgotten once it
    is deleted; no kopf handler is involved."""
    resource, namespace, body, known, expected = KINDS[kind]
    client = FakeKubeClient()
    operator = await leading(client, config_for(kind))
    empty = copy.deepcopy(known(operator))
    await client.create(resource, body, namespace)
    await until(lambda: known(operator) == expected)
    await client.delete(resource, body["metadata"]["name"], namespace)
    await until(lambda: not known(operator))
    await operator._stop_informers()
    assert (empty, operator.informers[kind].events, operator.informers[kind].resource) == (
        type(expected)(), 2, resource)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_each_kinds_listing_after_a_gap_deletes_what_it_lacks(kind: str) -> None:
    """An object the rebuild listed and that was deleted while the informer could not watch (its resourceVersion
    compacted away: 410) is forgotten from the new listing, as client-go's Replace deletes what a relisting lacks."""
    resource, namespace, body, known, expected = KINDS[kind]
    client = FakeKubeClient()
    await client.create(resource, body, namespace)
    operator = await leading(client, config_for(kind))
    listed = copy.deepcopy(known(operator))
    informer = operator.informers[kind]
    await informer.stop()
    since, relists = informer.resource_version, informer.relists
    await client.delete(resource, body["metadata"]["name"], namespace)
    client.compact()
    informer.start(since)
    await until(lambda: informer.relists == relists + 1)
    await operator._stop_informers()
    assert (listed, known(operator), informer.events) == (expected, type(expected)(), 0)


async def test_a_node_added_between_the_rebuilds_listing_and_the_watch_is_fed_once() -> None:
    """A Node created right after the rebuild listed Nodes (before its informer watches) comes through the watch
    from the listing's resourceVersion: fed once, none lost (kopf's events were kept and fed after the rebuild)."""
    client = FakeKubeClient()
    listing = client.list_versioned

    async def list_then_change(res: Resource, namespace: str | None = None, **selectors: Any) -> Any:
        listed = await listing(res, namespace, **selectors)
        if res == NODES:
            await client.create(NODES, {"metadata": {"name": "node-b"}, "status": READY})
        return listed

    client.list_versioned = list_then_change  # type: ignore[method-assign]
    operator = await leading(client, watching=False)
    rebuilt = sorted(operator.controller.inventory.nodes)
    await until(lambda: operator.informers["nodes"].events == 1)
    await asyncio.sleep(0.05)  # nothing more arrives
    await operator._stop_informers()
    assert (rebuilt, sorted(operator.controller.inventory.nodes), operator.informers["nodes"].events) == (
        [], ["node-b"], 1)


async def test_a_gpunode_status_the_agent_writes_reaches_the_inventory() -> None:
    """The agent's status write to a GPUNode (a patch of its status subresource) comes through the GPUNodes
    informer as MODIFIED: the inventory takes the GPUs it reports."""
    client = FakeKubeClient()
    await client.create(GPUNODES, {"metadata": {"name": "node-a"}})
    operator = await leading(client)
    before = operator.controller.inventory.gpunodes["node-a"].get("status")
    await client.patch(GPUNODES, "node-a", {"status": {"gpus": [GPU0]}}, status=True)
    await until(lambda: bool(operator.controller.inventory.gpunodes["node-a"].get("status")))
    await operator._stop_informers()
    assert (before, operator.controller.inventory.gpunodes["node-a"]["status"]["gpus"]) == (None, [GPU0])


async def test_a_namespace_change_makes_its_tasks_due_for_the_kueue_check() -> None:
    """A Namespace's labels decide whether Kueue manages its Jobs: its event makes the tasks of that namespace (and
    no other's) due for the KueueConflict check."""
    client = FakeKubeClient()
    for name, namespace in (("a", "team"), ("b", "other")):
        await client.create(GPUTASKS, {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {
            "name": name, "namespace": namespace}, "spec": {"queueName": "q", "template": {"spec": {
                "containers": [{"name": "main", "image": "busybox"}]}}}}, namespace)
    operator = await leading(client)
    operator.kueue._due.clear()
    await client.create(NAMESPACES, {"metadata": {"name": "team", "labels": {"kueue": "yes"}}})
    await until(lambda: "team" in operator.controller.inventory.namespace_labels)
    await operator._stop_informers()
    assert sorted(operator.kueue._due) == ["team/a"]


async def test_a_standby_feeds_none_of_the_kinds() -> None:
    """A standby (not leading) drops the events of every kind: its rebuild lists them when it becomes the leader."""
    client = FakeKubeClient()
    operator = Operator(Config(), client)
    for kind, (resource, namespace, body, _, _) in KINDS.items():
        if kind in operator.informers:
            made = await client.create(resource, body, namespace)
            await operator.informers[kind].sink.apply([{"type": "ADDED", "object": made}])
    assert [KINDS[kind][3](operator) for kind in sorted(KINDS) if kind in operator.informers] == [
        type(KINDS[kind][4])() for kind in sorted(KINDS) if kind in operator.informers]


async def test_a_kueue_kind_that_is_not_served_is_looked_for_again_and_fed_once_served(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Kueue's CRDs may be absent: a 404 listing of WorkloadPriorityClasses at the rebuild leaves none known, and
    the informer lists again (a 404 is said once at info level, not as a failure) until the API is served, then
    feeds it."""
    monkeypatch.setattr(informer_module, "ABSENT_RETRY_S", 0.01)
    caplog.set_level(logging.DEBUG, logger="gputask.informer")
    client = FakeKubeClient()
    await client.create(WORKLOADPRIORITYCLASSES, {"metadata": {"name": "urgent"}, "value": 7})
    client.fail("list", "workloadpriorityclasses", status=404, times=3)
    operator = await leading(client, watching=False)
    rebuilt = dict(operator.controller.inventory.workload_priority_classes)
    await until(lambda: operator.informers["workloadpriorityclasses"].relists == 1)
    await operator._stop_informers()
    lists = sum(call[:2] == ("list", "workloadpriorityclasses") for call in client.calls)
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records if r.levelno >= logging.INFO]
    assert (rebuilt, operator.controller.inventory.workload_priority_classes, lists, said) == (
        {}, {"urgent": 7}, 4, [("INFO", "workloadpriorityclasses are not served"),
                               ("INFO", "listing of workloadpriorityclasses works again")])


def test_a_namespaced_operator_watches_tasks_jobs_and_their_pods_there_and_every_other_kind_cluster_wide() -> None:
    """With ``namespace`` set, GPUTasks, our Jobs, the labelled Jobs gputask admits and their pods are listed and
    watched in it; every other kind (its GPULocalQueues too) cluster-wide, as the rebuild lists it, so a relisting
    compares like with like."""
    operator = Operator(Config(namespace="ns"), FakeKubeClient())
    assert {kind: informer.namespace for kind, informer in operator.informers.items()} == {
        "priorityclasses": None, "workloadpriorityclasses": None, "namespaces": None, "nodes": None,
        "gpunodes": None, "flavors": None, "queues": None, "localqueues": None, "jobs": "ns", "tasks": "ns",
        "taskpods": "ns", "foreignpods": None, "userjobs": "ns", "kueuelocalqueues": None}
