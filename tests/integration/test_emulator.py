"""The project's Kubernetes API emulator, checked over real loopback HTTP (DESIGN.md section 5)."""

from __future__ import annotations

import asyncio
import collections
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import kubernetes
import pytest
import yaml

from gputask.testing import EmulatorServer, kopf_login

REPO = Path(__file__).resolve().parents[2]
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
GROUP = "e2e.gputask.io"


def widget_crd(status: bool = True, plural: str = "widgets", kind: str = "Widget") -> dict[str, Any]:
    """A minimal namespaced CRD, with or without the status subresource."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    version = {"name": "v1", "served": True, "storage": True, "schema": schema,
               "subresources": {"status": {}} if status else {}}
    names = {"plural": plural, "singular": kind.lower(), "kind": kind, "shortNames": ["wd"]}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {"group": GROUP, "scope": "Namespaced", "names": names, "versions": [version]}}


@pytest.fixture
async def server() -> AsyncIterator[EmulatorServer]:
    async with EmulatorServer() as srv:
        yield srv


@pytest.fixture
async def api(server: EmulatorServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(server.url) as session:
        yield session


async def call(api: aiohttp.ClientSession, verb: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None, **params: str) -> tuple[int, Any]:
    async with api.request(verb, path, json=body, headers=headers, params=params) as resp:
        return resp.status, await resp.json()


async def make(api: aiohttp.ClientSession, path: str, name: str, **fields: Any) -> dict[str, Any]:
    meta = {"name": name, **fields.pop("metadata", {})}
    status, obj = await call(api, "POST", path, {"metadata": meta, **fields})
    assert status == 201, obj
    return obj


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def read_events(resp: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    events = []
    while len(events) < count:
        line = await asyncio.wait_for(resp.content.readline(), 5)
        assert line, f"the stream ended after {events}"
        if line.strip():
            events.append(json.loads(line))
    return events


async def test_created_objects_get_uid_timestamp_versions_and_generation(api: aiohttp.ClientSession) -> None:
    """Creation assigns uid4, RFC3339 time, a global rising resourceVersion and generation 1."""
    pod = await make(api, "/api/v1/namespaces/default/pods", "p1", spec={"nodeName": "n1"})
    meta = pod["metadata"]
    assert uuid.UUID(meta["uid"]).version == 4
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1 and (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    cm = await make(api, "/api/v1/namespaces/default/configmaps", "c1", data={"a": "1"})
    assert int(cm["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    path = "/api/v1/namespaces/default/configmaps/c1"
    versions = [cm["metadata"]["resourceVersion"]]
    for patch, generation in [({"metadata": {"labels": {"x": "y"}}}, 1), ({"data": {"a": "2"}}, 2)]:
        status, cm = await call(api, "PATCH", path, patch, MERGE)
        assert status == 200 and cm["metadata"]["generation"] == generation
        versions.append(cm["metadata"]["resourceVersion"])
    status, pod = await call(
        api, "PATCH", "/api/v1/namespaces/default/pods/p1/status", {"status": {"phase": "Running"}}, MERGE
    )
    assert pod["metadata"]["generation"] == 1 and pod["status"]["phase"] == "Running"
    versions.append(pod["metadata"]["resourceVersion"])
    assert [int(v) for v in versions] == sorted({int(v) for v in versions})
    status, same = await call(api, "PATCH", path, {"data": {"a": "2"}}, MERGE)
    assert same["metadata"]["resourceVersion"] == cm["metadata"]["resourceVersion"]  # a no-op


async def test_create_answers_201_then_409_already_exists(api: aiohttp.ClientSession) -> None:
    """A second create of the same name answers a metav1 Status with reason AlreadyExists."""
    body = {"metadata": {"name": "c1"}, "data": {}}
    assert (await call(api, "POST", "/api/v1/namespaces/default/configmaps", body))[0] == 201
    status, error = await call(api, "POST", "/api/v1/namespaces/default/configmaps", body)
    assert status == 409
    assert error | {"message": ...} == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": ...,
        "reason": "AlreadyExists", "code": 409, "details": {"name": "c1", "group": "", "kind": "configmaps"}}


async def test_put_replaces_and_conflicts_on_a_stale_resource_version(api: aiohttp.ClientSession) -> None:
    """PUT replaces the object, and a stale resourceVersion in its body answers 409 Conflict."""
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
    lease = await make(api, path, "leader", spec={"holderIdentity": "a"})
    fresh = {**lease, "spec": {"holderIdentity": "b"}}
    status, replaced = await call(api, "PUT", f"{path}/leader", fresh)
    assert status == 200 and replaced["spec"] == {"holderIdentity": "b"}
    assert replaced["metadata"]["uid"] == lease["metadata"]["uid"]
    status, error = await call(api, "PUT", f"{path}/leader", {**lease, "spec": {"holderIdentity": "c"}})
    assert (status, error["reason"], error["code"]) == (409, "Conflict", 409)
    unconditional = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "d"}}
    assert (await call(api, "PUT", f"{path}/leader", unconditional))[0] == 200
    assert (await call(api, "PUT", f"{path}/missing", {"metadata": {"name": "missing"}}))[0] == 404
    assert (await call(api, "PUT", f"{path}/missing", unconditional))[0] == 400  # names differ


async def test_patches_honour_the_resource_version_and_json_patch_ops(api: aiohttp.ClientSession) -> None:
    """Merge, strategic and JSON patches apply, and a stale resourceVersion in them answers 409."""
    path = "/api/v1/namespaces/default/configmaps/c1"
    cm = await make(api, "/api/v1/namespaces/default/configmaps", "c1", data={"a": "1", "b": "2"})
    old_rv = cm["metadata"]["resourceVersion"]
    status, cm = await call(
        api, "PATCH", path, {"metadata": {"resourceVersion": old_rv}, "data": {"b": None}}, MERGE
    )
    assert status == 200 and cm["data"] == {"a": "1"}
    stale = {"metadata": {"resourceVersion": old_rv}, "data": {"c": "3"}}
    for content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        status, error = await call(api, "PATCH", path, stale, {"Content-Type": content_type})
        assert (status, error["reason"]) == (409, "Conflict")
    status, cm = await call(
        api, "PATCH", path, {"data": {"c": "3"}}, {"Content-Type": "application/strategic-merge-patch+json"}
    )
    assert cm["data"] == {"a": "1", "c": "3"}
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": cm["metadata"]["resourceVersion"]},
           {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
           {"op": "add", "path": "/metadata/finalizers/-", "value": "x/z"},
           {"op": "replace", "path": "/data/a", "value": "9"}, {"op": "remove", "path": "/data/c"},
           {"op": "copy", "from": "/data/a", "path": "/data/d"},
           {"op": "move", "from": "/data/d", "path": "/data/e"}]
    status, patched = await call(api, "PATCH", path, ops, JSON_PATCH)
    assert status == 200 and patched["data"] == {"a": "9", "e": "9"}
    assert patched["metadata"]["finalizers"] == ["x/y", "x/z"]
    status, error = await call(api, "PATCH", path, ops[:1], JSON_PATCH)  # the test op fails now
    assert (status, error["reason"]) == (422, "Invalid")
    ops = [{"op": "replace", "path": "/metadata/resourceVersion", "value": old_rv}]
    assert (await call(api, "PATCH", path, ops, JSON_PATCH))[0] == 409


async def test_generate_name_makes_unique_names(api: aiohttp.ClientSession) -> None:
    """Objects posted with only metadata.generateName get distinct generated names."""
    body = {"metadata": {"generateName": "kopf-event-"}, "reason": "Test", "involvedObject": {"name": "x"}}
    names = {
        (await call(api, "POST", "/api/v1/namespaces/default/events", body))[1]["metadata"]["name"]
        for _ in range(5)
    }
    assert len(names) == 5 and all(re.fullmatch(r"kopf-event-[a-z0-9]{5}", n) for n in names)
    status, error = await call(api, "POST", "/api/v1/namespaces/default/events", {"metadata": {}})
    assert (status, error["reason"]) == (422, "Invalid")


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=a", {"p1", "p2"}), ("app==a,tier=web", {"p1"}), ("app!=a", {"p3", "p4"}),
    ("tier in (web, db)", {"p1", "p2", "p3"}), ("tier notin (web)", {"p2", "p3", "p4"}),
    ("tier", {"p1", "p2", "p3"}), ("!tier", {"p4"}), ("app=a,!tier", set()),
])
async def test_label_selectors_filter_lists(api: aiohttp.ClientSession, selector: str, expected: set[str]) -> None:
    """Every label selector operator filters lists like the API server."""
    labels = {"p1": {"app": "a", "tier": "web"}, "p2": {"app": "a", "tier": "db"},
              "p3": {"app": "b", "tier": "db"}, "p4": {"app": "b"}}
    for name, pod_labels in labels.items():
        await make(api, "/api/v1/namespaces/default/pods", name, metadata={"labels": pod_labels})
    status, pods = await call(api, "GET", "/api/v1/pods", labelSelector=selector)
    assert status == 200 and {p["metadata"]["name"] for p in pods["items"]} == expected


async def test_field_selectors_filter_lists(api: aiohttp.ClientSession) -> None:
    """Field selectors on name, namespace, spec.nodeName and involvedObject.name filter lists."""
    for ns, name, node in [("a", "p1", "n1"), ("a", "p2", "n2"), ("b", "p3", "n1")]:
        await make(api, f"/api/v1/namespaces/{ns}/pods", name, spec={"nodeName": node})
    await make(api, "/api/v1/namespaces/a/events", "e1", involvedObject={"name": "p1"})
    await make(api, "/api/v1/namespaces/a/events", "e2", involvedObject={"name": "p2"})
    cases = [("/api/v1/pods", "spec.nodeName=n1", {"p1", "p3"}), ("/api/v1/pods", "spec.nodeName!=n1", {"p2"}),
             ("/api/v1/pods", "metadata.namespace=a,spec.nodeName==n1", {"p1"}),
             ("/api/v1/namespaces/b/pods", "metadata.name=p3", {"p3"}),
             ("/api/v1/pods", "metadata.name=p3,metadata.namespace=a", set()),
             ("/api/v1/events", "involvedObject.name=p2", {"e2"})]
    for path, selector, expected in cases:
        status, found = await call(api, "GET", path, fieldSelector=selector)
        assert {o["metadata"]["name"] for o in found["items"]} == expected, selector
    status, error = await call(api, "GET", "/api/v1/configmaps", fieldSelector="data.x=1")
    assert (status, error["reason"]) == (400, "BadRequest")


async def test_selectors_filter_watches(api: aiohttp.ClientSession) -> None:
    """Watches apply both selectors; objects moving out of a label selector arrive as DELETED."""
    path = "/api/v1/namespaces/default/pods"
    params = {"watch": "true", "labelSelector": "app=a", "fieldSelector": "spec.nodeName=n1"}
    async with api.get(path, params=params) as resp:
        await make(api, path, "other", spec={"nodeName": "n2"}, metadata={"labels": {"app": "a"}})
        await make(api, path, "p1", spec={"nodeName": "n1"}, metadata={"labels": {"app": "a"}})
        await call(api, "PATCH", f"{path}/p1", {"metadata": {"labels": {"app": "b"}}}, MERGE)
        events = await read_events(resp, 2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "p1"), ("DELETED", "p1")]


async def test_leaving_a_label_selector_is_deleted_with_the_previous_state_at_the_new_version(
    api: aiohttp.ClientSession,
) -> None:
    """A watch with a label selector gets the DELETED of an object that stops matching with its previous content
    (the label still there) at the resourceVersion of the change, as the watch cache sends it."""
    path = "/api/v1/namespaces/default/pods"
    async with api.get(path, params={"watch": "true", "labelSelector": "app=a"}) as resp:
        await make(api, path, "p1", metadata={"labels": {"app": "a"}})
        _, changed = await call(api, "PATCH", f"{path}/p1", {"metadata": {"labels": {"app": None}}}, MERGE)
        events = await read_events(resp, 2)
    deleted = events[1]["object"]["metadata"]
    assert (events[1]["type"], deleted["labels"], deleted["resourceVersion"]) == (
        "DELETED", {"app": "a"}, changed["metadata"]["resourceVersion"])


async def test_leaving_a_field_selector_is_deleted_with_the_previous_state_at_the_new_version(
    api: aiohttp.ClientSession,
) -> None:
    """A watch on bound, unfinished pods (the operator's foreign-pod selector) gets a pod that is bound as ADDED and
    one that finishes (phase Succeeded) as DELETED with its previous content (phase Running) at the resourceVersion
    of the change, as the watch cache sends an object that stops matching a field selector."""
    path = "/api/v1/namespaces/default/pods"
    fields = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    async with api.get(path, params={"watch": "true", "fieldSelector": fields}) as resp:
        await make(api, path, "pending")
        made = await make(api, path, "p1", spec={"nodeName": "n1"})
        _, running = await call(api, "PATCH", f"{path}/p1/status", {"status": {"phase": "Running"}}, MERGE)
        _, finished = await call(api, "PATCH", f"{path}/p1/status", {"status": {"phase": "Succeeded"}}, MERGE)
        events = await read_events(resp, 3)
    seen = [(e["type"], e["object"]["metadata"]["name"], e["object"]["status"]["phase"],
             e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert seen == [("ADDED", "p1", "Pending", made["metadata"]["resourceVersion"]),
                    ("MODIFIED", "p1", "Running", running["metadata"]["resourceVersion"]),
                    ("DELETED", "p1", "Running", finished["metadata"]["resourceVersion"])]


async def test_a_patch_naming_another_uid_is_invalid(api: aiohttp.ClientSession) -> None:
    """A patch whose metadata.uid is not the object's (a precondition, as client-go's adoption patches send it) is
    422 Invalid, field is immutable, and changes nothing."""
    path = "/api/v1/namespaces/default/configmaps"
    made = await make(api, path, "c1", data={"a": "1"})
    status, error = await call(api, "PATCH", f"{path}/c1", {"metadata": {"uid": "other"}, "data": {"a": "2"}}, MERGE)
    _, now = await call(api, "GET", f"{path}/c1")
    assert (status, error["reason"], error["message"], now["data"], now["metadata"]["resourceVersion"]) == (
        422, "Invalid", 'ConfigMap "c1" is invalid: metadata.uid: Invalid value: "other": field is immutable',
        {"a": "1"}, made["metadata"]["resourceVersion"])


async def test_status_subresource_is_isolated_from_the_spec(server: EmulatorServer,
                                                            api: aiohttp.ClientSession) -> None:
    """With a status subresource, /status changes only status and the main resource only the rest."""
    server.emulator.install_crd(widget_crd(status=True))
    server.emulator.install_crd(widget_crd(status=False, plural="gadgets", kind="Gadget"))
    base = f"/apis/{GROUP}/v1/namespaces/default"
    widget = await make(api, f"{base}/widgets", "w1", spec={"size": 1}, status={"phase": "Fake"})
    assert "status" not in widget  # as the API server drops it on create
    status, widget = await call(api, "PATCH", f"{base}/widgets/w1", {"spec": {"size": 2}, "status": {}}, MERGE)
    assert widget["spec"] == {"size": 2} and "status" not in widget and widget["metadata"]["generation"] == 2
    patch = {"spec": {"size": 3}, "status": {"phase": "Ok"}}
    status, widget = await call(api, "PATCH", f"{base}/widgets/w1/status", patch, MERGE)
    assert widget["spec"] == {"size": 2} and widget["status"] == {"phase": "Ok"}
    assert widget["metadata"]["generation"] == 2
    status, widget = await call(api, "PUT", f"{base}/widgets/w1/status", {**widget, "status": {"phase": "Done"}})
    assert widget["spec"] == {"size": 2} and widget["status"] == {"phase": "Done"}
    status, widget = await call(api, "PUT", f"{base}/widgets/w1", {**widget, "status": {}, "spec": {"size": 4}})
    assert widget["spec"] == {"size": 4} and widget["status"] == {"phase": "Done"}
    await make(api, f"{base}/gadgets", "g1", status={"phase": "Kept"})
    status, gadget = await call(api, "PATCH", f"{base}/gadgets/g1", {"status": {"phase": "Changed"}}, MERGE)
    assert gadget["status"] == {"phase": "Changed"}
    assert (await call(api, "GET", f"{base}/gadgets/g1/status"))[0] == 404
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}
    await make(api, "/apis/batch/v1/namespaces/default/jobs", "j1", spec={"parallelism": 1, "template": template})
    status, job = await call(api, "PATCH", "/apis/batch/v1/namespaces/default/jobs/j1", {"status": {}}, MERGE)
    assert "status" not in job


async def test_garbage_collection_follows_owner_references(api: aiohttp.ClientSession) -> None:
    """Deleting an owner deletes its dependents in cascade, after finalizers and unless orphaned."""
    path = "/api/v1/namespaces/default/configmaps"

    async def owned(name: str, *owners: dict[str, Any], finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
        refs = [{"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"],
                 "uid": o["metadata"]["uid"]} for o in owners]
        return await make(api, path, name, metadata={"ownerReferences": refs, "finalizers": list(finalizers)})

    async def exists(name: str) -> bool:
        return (await call(api, "GET", f"{path}/{name}"))[0] == 200

    root = await make(api, path, "root", metadata={"finalizers": ["test/block"]})
    other = await make(api, path, "other")
    child = await owned("child", root)
    await owned("grandchild", child)
    await owned("shared", root, other)
    await owned("held", root, finalizers=("test/hold",))
    status, deleting = await call(api, "DELETE", f"{path}/root")
    assert status == 200 and deleting["metadata"]["deletionTimestamp"] and await exists("child")
    await call(api, "PATCH", f"{path}/root", {"metadata": {"finalizers": None}}, MERGE)
    assert not await exists("root") and not await exists("child") and not await exists("grandchild")
    status, shared = await call(api, "GET", f"{path}/shared")
    assert [r["name"] for r in shared["metadata"]["ownerReferences"]] == ["other"]
    status, held = await call(api, "GET", f"{path}/held")
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["finalizers"] == ["test/hold"]
    for how in ({"params": {"propagationPolicy": "Orphan"}}, {"json": {"propagationPolicy": "Orphan"}}):
        owner = await make(api, path, "owner")
        await owned("orphan", owner)
        async with api.delete(f"{path}/owner", **how) as resp:
            assert resp.status == 200
        status, orphan = await call(api, "GET", f"{path}/orphan")
        assert status == 200 and "ownerReferences" not in orphan["metadata"]
        await call(api, "DELETE", f"{path}/orphan")


async def test_lists_carry_kind_api_version_and_resource_version(server: EmulatorServer,
                                                                 api: aiohttp.ClientSession) -> None:
    """List responses are typed lists with the collection's resourceVersion, and can be paged."""
    server.emulator.install_crd(widget_crd())
    for name in ("w1", "w2", "w3"):
        await make(api, f"/apis/{GROUP}/v1/namespaces/default/widgets", name)
    status, page = await call(api, "GET", f"/apis/{GROUP}/v1/widgets", limit="2")
    assert (page["kind"], page["apiVersion"]) == ("WidgetList", f"{GROUP}/v1")
    assert page["metadata"]["resourceVersion"] == str(server.emulator.resource_version)
    params = {"limit": "2", "continue": page["metadata"]["continue"]}
    status, rest = await call(api, "GET", f"/apis/{GROUP}/v1/widgets", **params)
    assert [w["metadata"]["name"] for w in page["items"] + rest["items"]] == ["w1", "w2", "w3"]
    status, jobs = await call(api, "GET", "/apis/batch/v1/jobs")
    assert (jobs["kind"], jobs["apiVersion"], jobs["items"]) == ("JobList", "batch/v1", [])


async def test_a_paged_list_of_a_namespace_serves_its_objects_in_name_order_and_counts_what_is_left(
    server: EmulatorServer, api: aiohttp.ClientSession
) -> None:
    """Pages of a namespace's list come in name order from the continue token on, with no object of another
    namespace; remainingItemCount counts that namespace's objects still to come (and is left out with a label
    selector, as the API server does); a deleted object is not served."""
    server.emulator.install_crd(widget_crd())
    for namespace, name in (("a", "w3"), ("b", "w0"), ("a", "w1"), ("a", "w2"), ("b", "w4"), ("a", "w5")):
        await make(api, f"/apis/{GROUP}/v1/namespaces/{namespace}/widgets", name, metadata={"labels": {"x": "y"}})
    await call(api, "DELETE", f"/apis/{GROUP}/v1/namespaces/a/widgets/w2")
    path, pages, token = f"/apis/{GROUP}/v1/namespaces/a/widgets", [], None
    while True:
        _, page = await call(api, "GET", path, limit="2", **({"continue": token} if token else {}))
        pages.append(([w["metadata"]["name"] for w in page["items"]], page["metadata"].get("remainingItemCount")))
        token = page["metadata"].get("continue")
        if not token:
            break
    _, selected = await call(api, "GET", path, limit="1", labelSelector="x=y")
    assert (pages, "remainingItemCount" in selected["metadata"]) == ([(["w1", "w3"], 1), (["w5"], None)], False)


@pytest.mark.parametrize(("group_version", "plural", "kind", "namespaced"), [
    ("v1", "namespaces", "Namespace", False), ("v1", "nodes", "Node", False), ("v1", "pods", "Pod", True),
    ("v1", "events", "Event", True), ("v1", "configmaps", "ConfigMap", True), ("batch/v1", "jobs", "Job", True),
    ("coordination.k8s.io/v1", "leases", "Lease", True),
    ("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False),
    ("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False),
    ("events.k8s.io/v1", "events", "Event", True),
    ("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", False),
])
async def test_builtin_resources_are_discoverable(api: aiohttp.ClientSession, group_version: str, plural: str,
                                                  kind: str, namespaced: bool) -> None:
    """Each built-in resource the operator uses is listed in discovery with its kind and scope."""
    path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    status, listing = await call(api, "GET", path)
    entry = next(r for r in listing["resources"] if r["name"] == plural)
    assert (listing["groupVersion"], entry["kind"], entry["namespaced"]) == (group_version, kind, namespaced)
    assert {"get", "list", "watch", "create", "update", "patch", "delete"} <= set(entry["verbs"])


async def test_crds_installed_via_the_api_appear_in_discovery(api: aiohttp.ClientSession) -> None:
    """Creating a CRD serves its resource in discovery; deleting it removes both it and its objects."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    status, crd = await call(api, "POST", crds, widget_crd())
    assert status == 201
    assert {c["type"] for c in crd["status"]["conditions"]} == {"NamesAccepted", "Established"}
    status, groups = await call(api, "GET", "/apis")
    group = next(g for g in groups["groups"] if g["name"] == GROUP)
    assert group["preferredVersion"] == {"groupVersion": f"{GROUP}/v1", "version": "v1"}
    status, listing = await call(api, "GET", f"/apis/{GROUP}/v1")
    entries = {r["name"]: r for r in listing["resources"]}
    assert entries["widgets"] | {"verbs": ...} == {
        "name": "widgets", "singularName": "widget", "namespaced": True, "kind": "Widget", "verbs": ...,
        "shortNames": ["wd"], "categories": []}
    assert entries["widgets/status"]["verbs"] == ["get", "patch", "update"]
    await make(api, f"/apis/{GROUP}/v1/namespaces/default/widgets", "w1")
    bad = widget_crd() | {"metadata": {"name": "wrong.name"}}
    assert (await call(api, "POST", crds, bad))[0] == 422
    assert (await call(api, "DELETE", f"{crds}/widgets.{GROUP}"))[0] == 200
    assert (await call(api, "GET", f"/apis/{GROUP}/v1"))[0] == 404
    assert (await call(api, "GET", f"/apis/{GROUP}/v1/widgets"))[0] == 404


async def test_watches_stream_events_from_a_resource_version(server: EmulatorServer,
                                                             api: aiohttp.ClientSession) -> None:
    """Watches replay events since a resourceVersion (410 if too old) and honour timeoutSeconds."""
    path = "/api/v1/namespaces/default/configmaps"
    await make(api, path, "before")
    status, listing = await call(api, "GET", path)
    since = listing["metadata"]["resourceVersion"]
    await make(api, path, "c1", data={"a": "1"})
    params = {"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"}
    async with api.get(path, params=params) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/json")
        await call(api, "PATCH", f"{path}/c1", {"data": {"a": "2"}}, MERGE)
        await call(api, "DELETE", f"{path}/c1")
        events = await read_events(resp, 3)
        assert await asyncio.wait_for(resp.content.read(), 3) == b""  # ended by timeoutSeconds
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1]["object"]["data"] == {"a": "2"} and events[2]["object"]["metadata"]["name"] == "c1"
    params = {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
    async with api.get(path, params=params) as resp:
        events = await read_events(resp, 2)
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [("ADDED", "before"),
                                                                                  ("BOOKMARK", None)]
    server.emulator.store.log = collections.deque(maxlen=1)  # forget all but the latest event
    await make(api, path, "c2")
    await make(api, path, "c3")
    async with api.get(path, params={"watch": "true", "resourceVersion": since}) as resp:
        [event] = await read_events(resp, 1)
    assert (event["type"], event["object"]["code"], event["object"]["reason"]) == ("ERROR", 410, "Expired")


async def test_reactions_still_override_the_emulator(server: EmulatorServer, api: aiohttp.ClientSession) -> None:
    """kmock's reaction DSL can still inject failures in front of the emulated API."""
    server.emulator["get /api/v1/nodes"] << 503
    assert (await call(api, "GET", "/api/v1/namespaces"))[0] == 200
    async with api.get("/api/v1/nodes") as resp:
        assert resp.status == 503


async def test_kubeconfig_serves_the_kubernetes_client_and_kubectl(server: EmulatorServer, tmp_path: Path) -> None:
    """The written kubeconfig works for the kubernetes Python client and, if present, kubectl."""
    names = ["gpuclusterqueues.gputask.io", "gpulocalqueues.gputask.io", "gpunodes.gputask.io",
             "gpuresourceflavors.gputask.io", "gputasks.gputask.io"]
    assert server.install_crds_from(REPO / "crds") == names
    config = server.write_kubeconfig(tmp_path / "kubeconfig")

    def use_client() -> list[str]:
        client = kubernetes.config.new_client_from_config(config_file=str(config))
        with client:
            kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": "team-a"}})
            crds = kubernetes.client.ApiextensionsV1Api(client).list_custom_resource_definition()
            return [crd.metadata.name for crd in crds.items]

    assert await asyncio.to_thread(use_client) == names
    if shutil.which("kubectl"):
        command = ["kubectl", "--kubeconfig", str(config), "get", "gputasks", "-n", "team-a"]
        result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr


@pytest.mark.integration
async def test_a_real_kopf_operator_works_against_the_emulator(server: EmulatorServer,
                                                               api: aiohttp.ClientSession) -> None:
    """kopf adds its finalizer, runs create/delete handlers, patches status, posts events, stops."""
    server.emulator.install_crd(widget_crd())
    registry = kopf.OperatorRegistry()
    deleted = asyncio.Event()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf_login(server.url)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        settings.watching.server_timeout = 1
        settings.posting.level = 0

    @kopf.on.create(GROUP, "v1", "widgets", registry=registry)
    def admit(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        kopf.info(body, reason="Admitted", message="the widget is admitted")
        patch.status["phase"] = "Ready"

    @kopf.on.delete(GROUP, "v1", "widgets", registry=registry)
    def release(**_: Any) -> None:
        deleted.set()

    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    operator = asyncio.create_task(kopf.operator(
        registry=registry, clusterwide=True, standalone=True, stop_flag=stop_flag, ready_flag=ready_flag))
    try:
        await asyncio.wait_for(ready_flag.wait(), 10)
        path = f"/apis/{GROUP}/v1/namespaces/default/widgets"
        await make(api, path, "w1", spec={"size": 1})

        async def handled() -> bool:
            widget = (await call(api, "GET", f"{path}/w1"))[1]
            events = (await call(api, "GET", "/api/v1/namespaces/default/events",
                                 fieldSelector="involvedObject.name=w1"))[1]["items"]
            return (widget.get("status", {}).get("phase") == "Ready" and bool(widget["metadata"]["finalizers"])
                    and [e["reason"] for e in events] == ["Admitted"])

        await eventually(handled)
        status, deleting = await call(api, "DELETE", f"{path}/w1")
        assert status == 200 and deleting["metadata"]["deletionTimestamp"]
        await asyncio.wait_for(deleted.wait(), 10)

        async def gone() -> bool:
            return (await call(api, "GET", f"{path}/w1"))[0] == 404

        await eventually(gone)
    finally:
        stop_flag.set()
        await asyncio.wait_for(operator, 10)
    assert not server.emulator.errors  # no emulator failures (500s) on the way


async def test_crd_create_is_refused_as_the_api_server_refuses_it(server: EmulatorServer,
                                                                  api: aiohttp.ClientSession) -> None:
    """A CRD breaking the API server's rules gets its 422 (message, reason, causes); crds/ is created."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    broken = yaml.safe_load((REPO / "crds" / "gputask.io_gputasks.yaml").read_text())
    schema = broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["metadata"]["description"] = "Standard object metadata."
    status, body = await call(api, "POST", path, broken)
    files = sorted((REPO / "crds").glob("*.yaml"))
    created = [(await call(api, "POST", path, yaml.safe_load(p.read_text())))[0] for p in files]
    field = "spec.validation.openAPIV3Schema.properties[metadata]"
    why = "Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified"
    assert (status, body["reason"], body["message"], body["details"]["causes"], created) == (
        422,
        "Invalid",
        f'CustomResourceDefinition.apiextensions.k8s.io "gputasks.gputask.io" is invalid: {field}: {why}',
        [{"reason": "FieldValueForbidden", "message": why, "field": field}],
        [201, 201, 201, 201, 201],
    )


async def test_job_create_is_validated_and_quota_counted_as_the_api_server_does(api: aiohttp.ClientSession) -> None:
    """A Job the Job API refuses gets 422 Invalid in the server's words; a count/jobs.batch quota gets 403."""
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    container = {"name": "main", "image": "busybox"}
    always = {"metadata": {"name": "a"}, "spec": {"template": {"spec": {"restartPolicy": "Always",
                                                                        "containers": [container]}}}}
    sourceless = {"metadata": {"name": "b"}, "spec": {"template": {"spec": {"restartPolicy": "Never",
                  "containers": [container], "volumes": [{"name": "data"}]}}}}
    refused = [await call(api, "POST", jobs, body) for body in (always, sourceless)]
    await make(api, "/api/v1/namespaces/default/resourcequotas", "no-jobs", spec={"hard": {"count/jobs.batch": "0"}})
    pod = {"restartPolicy": "Never", "containers": [container]}
    good = {"metadata": {"name": "c"}, "spec": {"template": {"spec": pod}}}
    over = await call(api, "POST", jobs, good)
    assert [(code, body["reason"], body["message"]) for code, body in [*refused, over]] == [
        (422, "Invalid", 'Job.batch "a" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Always": '
                         'supported values: "OnFailure", "Never"'),
        (422, "Invalid", 'Job.batch "b" is invalid: spec.template.spec.volumes[0]: Required value: must specify a '
                         "volume type"),
        (403, "Forbidden", 'jobs.batch "c" is forbidden: exceeded quota: no-jobs, requested: count/jobs.batch=1, '
                           "used: count/jobs.batch=0, limited: count/jobs.batch=0"),
    ]
    assert refused[0][1]["details"]["causes"] == [
        {"reason": "FieldValueNotSupported", "message": 'Unsupported value: "Always": supported values: "OnFailure", '
         '"Never"', "field": "spec.template.spec.restartPolicy"}
    ]


async def test_many_concurrent_requests_are_all_answered(server: EmulatorServer, api: aiohttp.ClientSession) -> None:
    """Hundreds of creates, reads, patches and lists at once, with a reaction in front, each get their answer
    (kmock finds a request's reaction by looking for it in its request records, which the emulator keeps short:
    requests still in flight must stay in them)."""
    server.emulator["get /api/v1/nodes"] << 503  # a reaction in front of the emulated API, as fault tests add

    async def one(i: int) -> int:
        path = "/api/v1/namespaces/default/configmaps"
        status, _ = await call(api, "POST", path, {"metadata": {"name": f"c{i}"}, "data": {"i": str(i)}})
        assert status == 201
        await call(api, "GET", f"{path}/c{i}")
        await call(api, "PATCH", f"{path}/c{i}", {"data": {"j": "1"}})
        async with api.get("/api/v1/nodes") as resp:
            assert resp.status == 503
        status, _ = await call(api, "GET", path)
        return status

    async with asyncio.timeout(60):
        assert await asyncio.gather(*(one(i) for i in range(300))) == [200] * 300


async def test_resource_k8s_io_is_served_only_at_the_versions_asked_for(server: EmulatorServer,
                                                                        api: aiohttp.ClientSession) -> None:
    """Without serve_dra resource.k8s.io answers 404 (a cluster before 1.32 or with DRA off); serve_dra(("v1beta1",))
    serves claims, templates and DeviceClasses there and still 404s v1, as a 1.32 or 1.33 cluster does."""
    before = (await call(api, "GET", "/apis/resource.k8s.io/v1beta1/deviceclasses"))[0]
    server.emulator.serve_dra(("v1beta1",))
    status, listing = await call(api, "GET", "/apis/resource.k8s.io/v1beta1")
    kinds = sorted((r["name"], r["kind"], r["namespaced"]) for r in listing["resources"])
    v1 = (await call(api, "GET", "/apis/resource.k8s.io/v1/deviceclasses"))[0]
    assert (before, status, kinds, v1) == (404, 200, [
        ("deviceclasses", "DeviceClass", False), ("resourceclaims", "ResourceClaim", True),
        ("resourceclaims/status", "ResourceClaim", True), ("resourceclaimtemplates", "ResourceClaimTemplate", True)],
        404)


async def test_claims_of_the_wrong_version_shape_are_refused_in_the_servers_words(server: EmulatorServer,
                                                                                  api: aiohttp.ClientSession) -> None:
    """A v1beta1-shaped request sent to v1 and a v1-shaped one sent to v1beta1 are 422 Invalid, as kube-apiserver
    answers (v1 drops the fields it does not know, then finds neither exactly nor firstAvailable)."""
    server.emulator.serve_dra(("v1", "v1beta1"))
    flat = {"name": "gpu", "deviceClassName": "gpu.nvidia.com"}
    nested = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    answers = [
        await call(api, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                   {"metadata": {"name": "a"}, "spec": {"devices": {"requests": [flat]}}}),
        await call(api, "POST", "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaimtemplates",
                   {"metadata": {"name": "b"}, "spec": {"spec": {"devices": {"requests": [nested]}}}}),
        await call(api, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                   {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [nested]}}}),
    ]
    assert [(code, body.get("reason"), body.get("message")) for code, body in answers[:2]] == [
        (422, "Invalid", 'ResourceClaim.resource.k8s.io "a" is invalid: spec.devices.requests[0]: Required value: '
                         "exactly one of `exactly` or `firstAvailable` is required"),
        (422, "Invalid", 'ResourceClaimTemplate.resource.k8s.io "b" is invalid: '
                         "spec.spec.devices.requests[0].deviceClassName: Required value"),
    ]
    assert answers[2][0] == 201


async def test_a_claims_spec_is_immutable(server: EmulatorServer, api: aiohttp.ClientSession) -> None:
    """Patching a ResourceClaim's spec is 422 field is immutable; its labels may change."""
    server.emulator.serve_dra(("v1",))
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    await make(api, path, "c", spec={"devices": {"requests": [request]}})
    other = {"spec": {"devices": {"requests": [{**request, "name": "other"}]}}}
    spec_change = await call(api, "PATCH", f"{path}/c", other, headers=MERGE)
    label_change = await call(api, "PATCH", f"{path}/c", {"metadata": {"labels": {"a": "b"}}}, headers=MERGE)
    assert (spec_change[0], spec_change[1]["message"].split(": ")[0:2], label_change[0]) == (
        422, ['ResourceClaim.resource.k8s.io "c" is invalid', "spec"], 200)
    assert spec_change[1]["message"].endswith(": field is immutable")



async def test_a_gated_pod_accepts_the_pin_patch_and_refuses_what_the_api_server_refuses(
        api: aiohttp.ClientSession) -> None:
    """A merge patch that adds matchFields to a gated pod's required node affinity (or node affinity to a pod with
    none) and removes its scheduling gate is accepted, as kube-apiserver v1.27+ accepts it; adding a gate, changing
    an existing affinity term, changing the affinity of an ungated pod or another spec field is 422."""
    path = "/api/v1/namespaces/default/pods"
    container = {"name": "main", "image": "busybox"}
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    gates = [{"name": "gputask.io/placement"}]
    await make(api, path, "termed", spec={"containers": [container], "schedulingGates": gates, "affinity": affinity})
    await make(api, path, "bare", spec={"containers": [container], "schedulingGates": gates})
    await make(api, path, "free", spec={"containers": [container]})
    pin = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
    pinned_term = {**term, "matchFields": [pin]}

    def node_affinity(*terms: Any) -> dict[str, Any]:
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [*terms]}}}

    def patch(**spec: Any) -> dict[str, Any]:
        return {"metadata": {"annotations": {"gputask.io/devices": "GPU-0"}}, "spec": spec}

    answers = {}
    for name, body in (
            ("termed", patch(affinity=node_affinity(pinned_term), schedulingGates=None)),
            ("bare", patch(affinity=node_affinity({"matchFields": [pin]}), schedulingGates=None)),
            ("free", patch(affinity=node_affinity({"matchFields": [pin]}))),
            ("free", patch(schedulingGates=gates)),
            ("free", patch(hostname="other")),
            ("free", patch(containers=[{**container, "image": "busybox:2"}]))):
        status, answer = await call(api, "PATCH", f"{path}/{name}", body, headers=MERGE)
        answers.setdefault(name, []).append((status, answer.get("message", "")[len(f'Pod "{name}" is invalid: '):]))
    _, termed = await call(api, "GET", f"{path}/termed")
    status, changed = await call(api, "PATCH", f"{path}/termed", patch(affinity=node_affinity({"matchFields": [pin]})),
                                 headers=MERGE)
    assert (termed["spec"].get("schedulingGates"), termed["spec"]["affinity"], status) == (
        None, node_affinity(pinned_term), 422)
    assert "spec: Forbidden: pod updates may not change fields other than" in changed["message"]
    assert answers["termed"] == [(200, "")] and answers["bare"] == [(200, "")]
    assert [(s, m.split(":")[0:2]) for s, m in answers["free"]] == [
        (422, ["spec", " Forbidden"]), (422, ["spec.schedulingGates", " Forbidden"]), (422, ["spec", " Forbidden"]),
        (200, [""])]
    assert "found new scheduling gate 'gputask.io/placement'" in answers["free"][1][1]

TYPO_TASK = {
    "apiVersion": "gputask.io/v1alpha1",
    "kind": "GPUTask",
    "metadata": {"name": "typo", "namespace": "default", "foo": 1},
    "spec": {"queueName": "default", "gpus": 1, "gpuMemroy": "4Gi", "zz": 1,
             "template": {"spec": {"containers": [{"name": "c", "image": "busybox", "anything": 1}]}}},
}


async def test_unknown_fields_are_refused_warned_of_or_dropped_by_field_validation(
        server: EmulatorServer, api: aiohttp.ClientSession) -> None:
    """Fields the CRD does not declare: Strict refuses a create, PUT or patch in kube-apiserver v1.28.7's words,
    Warn (also the default) stores the task pruned with a Warning header each, Ignore prunes silently."""
    server.install_crds_from(REPO / "crds")
    path = "/apis/gputask.io/v1alpha1/namespaces/default/gputasks"
    fields = 'unknown field "metadata.foo", unknown field "spec.gpuMemroy", unknown field "spec.zz"'
    answers = {}
    for mode in ("Strict", "Warn", "Ignore", None):
        params = {"fieldValidation": mode} if mode else {}
        async with api.post(path, json=TYPO_TASK, params=params) as resp:
            body = await resp.json()
            warnings = resp.headers.getall("Warning", [])
            answers[mode] = (resp.status, body.get("message") or sorted(body["spec"]), warnings)
        await call(api, "DELETE", f"{path}/typo")
    warned = ['299 - "unknown field \\"metadata.foo\\""', '299 - "unknown field \\"spec.gpuMemroy\\""',
              '299 - "unknown field \\"spec.zz\\""']
    kept = ["gpus", "queueName", "template"]
    async with api.post(path, json={**TYPO_TASK, "metadata": {"name": "typo"}}, params={"fieldValidation": "Ignore"}):
        pass
    status, patched = await call(api, "PATCH", f"{path}/typo", {"spec": {"gpuMemroy": "4Gi"}}, MERGE,
                                 fieldValidation="Strict")
    task = (await call(api, "GET", f"{path}/typo"))[1]
    status_put, put = await call(api, "PUT", f"{path}/typo", {**task, "spec": {**task["spec"], "gpuMemroy": "4Gi"}},
                                 fieldValidation="Strict")
    assert (answers, status, patched["reason"], patched["message"].endswith(
        'strict decoding error: unknown field "spec.gpuMemroy"'), status_put, put["message"]) == (
        {
            "Strict": (400, f'GPUTask in version "v1alpha1" cannot be handled as a GPUTask: strict decoding error: '
                            f'{fields}', []),
            "Warn": (201, kept, warned),
            "Ignore": (201, kept, []),
            None: (201, kept, warned),
        },
        422, "Invalid", True, 400,
        'GPUTask in version "v1alpha1" cannot be handled as a GPUTask: strict decoding error: '
        'unknown field "spec.gpuMemroy"',
    )


async def test_kubectl_apply_of_a_misspelled_field_is_refused(server: EmulatorServer, tmp_path: Path) -> None:
    """kubectl apply (fieldValidation=Strict by default) of a task with gpuMemroy fails as on a real API server."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    server.install_crds_from(REPO / "crds")
    config = server.write_kubeconfig(tmp_path / "kubeconfig")
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(yaml.safe_dump({**TYPO_TASK, "metadata": {"name": "typo", "namespace": "default"}}))
    command = ["kubectl", "--kubeconfig", str(config), "apply", "-f", str(manifest)]
    result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stderr.strip()) == (
        1,
        f'Error from server (BadRequest): error when creating "{manifest}": GPUTask in version "v1alpha1" cannot be '
        'handled as a GPUTask: strict decoding error: unknown field "spec.gpuMemroy", unknown field "spec.zz"',
    )
