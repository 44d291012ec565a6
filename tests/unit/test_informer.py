"""The operator's informer (list, then watch) and its feeds, on the in-process fake client's watches."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from gputask.config import Config
from gputask.k8s import informer as informer_module
from gputask.k8s.client import GPUTASKS, JOBS, PODS, ApiError
from gputask.k8s.foreign import FOREIGN_PODS
from gputask.k8s.handlers import FOREIGN_LABELS, Operator
from gputask.k8s.informer import Informer
from gputask.testing.fake import FakeKubeClient
from harness import Recorder


def task(name: str) -> dict[str, Any]:
    """A GPUTask body."""
    return {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"gpus": 1}}


async def until(probe: Any, timeout_s: float = 5.0) -> None:
    """Wait until ``probe()`` is true (fail after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not probe():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail("condition not reached")
        await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries after 10 ms instead of 1 s."""
    monkeypatch.setattr(informer_module, "RETRY_S", 0.01)


async def test_every_change_after_the_list_reaches_the_sink_once_in_order() -> None:
    """Changes made after the LIST (and before the watch opens) arrive in order, none lost or doubled."""
    client, sink = FakeKubeClient(), Recorder()
    await client.create(GPUTASKS, task("before"), "ns")
    listed = await client.list_versioned(GPUTASKS)
    await client.create(GPUTASKS, task("a"), "ns")
    informer = Informer(client, GPUTASKS, sink)
    informer.start(listed.resource_version)
    await client.patch(GPUTASKS, "a", {"spec": {"gpus": 2}}, "ns")
    await client.delete(GPUTASKS, "before", "ns")
    await until(lambda: len(sink.events) == 3)
    await informer.stop()
    assert (sink.events, sink.listings) == ([("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "before")], [])


async def test_a_resource_version_too_old_lists_again_and_hands_the_listing_over() -> None:
    """410 Expired: the informer lists again, hands the whole listing over, and watches on from it."""
    client, sink = FakeKubeClient(), Recorder()
    old = (await client.list_versioned(GPUTASKS)).resource_version
    await client.create(GPUTASKS, task("a"), "ns")
    await client.create(GPUTASKS, task("b"), "ns")
    client.compact()  # the changes since ``old`` are no longer kept
    informer = Informer(client, GPUTASKS, sink)
    informer.start(old)
    await until(lambda: sink.listings)
    await client.create(GPUTASKS, task("c"), "ns")
    await until(lambda: sink.events)
    await informer.stop()
    assert (sink.listings, sink.events, informer.relists) == ([["a", "b"]], [("ADDED", "c")], 1)


async def test_a_refused_watch_is_tried_again_from_the_same_version() -> None:
    """A watch answered 500 twice is opened again from the version it had: nothing lost, nothing doubled."""
    client, sink = FakeKubeClient(), Recorder()
    listed = await client.list_versioned(GPUTASKS)
    client.fail("watch", "gputasks", status=500, times=2)
    informer = Informer(client, GPUTASKS, sink)
    informer.start(listed.resource_version)
    await client.create(GPUTASKS, task("a"), "ns")
    await until(lambda: sink.events)
    await client.create(GPUTASKS, task("b"), "ns")
    await until(lambda: len(sink.events) == 2)
    await informer.stop()
    watches = sum(call[0] == "watch" for call in client.calls)
    assert (sink.events, sink.listings, watches) == ([("ADDED", "a"), ("ADDED", "b")], [], 3)


async def test_a_watch_the_server_ends_resumes_where_it_ended() -> None:
    """A watch that times out on the server is opened again from the last version seen (no LIST)."""
    client, sink = FakeKubeClient(), Recorder()
    listed = await client.list_versioned(GPUTASKS)
    informer = Informer(client, GPUTASKS, sink, timeout_s=0)
    informer.start(listed.resource_version)
    await client.create(GPUTASKS, task("a"), "ns")
    await until(lambda: sink.events)
    await client.create(GPUTASKS, task("b"), "ns")
    await until(lambda: len(sink.events) == 2)
    await informer.stop()
    lists = sum(call[0] == "list" for call in client.calls)
    assert (sink.events, lists) == ([("ADDED", "a"), ("ADDED", "b")], 1)


def operator_with(client: FakeKubeClient) -> Operator:
    """An operator on the fake client that leads (its feeds take events), nothing started."""
    operator = Operator(Config(), client)
    operator.leading = True
    return operator


async def test_a_listing_after_a_gap_forgets_the_tasks_deleted_meanwhile() -> None:
    """The tasks feed's replace keeps listed tasks and deletes the known ones the listing lacks."""
    client = FakeKubeClient()
    operator = operator_with(client)
    kept, gone = await client.create(GPUTASKS, task("kept"), "ns"), await client.create(GPUTASKS, task("gone"), "ns")
    await operator.informers["tasks"].sink.apply([{"type": "ADDED", "object": kept}, {"type": "ADDED", "object": gone}])
    await client.delete(GPUTASKS, "gone", "ns")
    await operator.informers["tasks"].sink.replace(await client.list_versioned(GPUTASKS))
    assert sorted(operator.controller.tasks) == ["ns/kept"]


async def test_a_listing_after_a_gap_forgets_the_jobs_deleted_meanwhile() -> None:
    """The Jobs feed's replace keeps listed Jobs and forgets the known ones the listing lacks."""
    client = FakeKubeClient()
    operator = operator_with(client)

    def job(name: str) -> dict[str, Any]:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": name, "namespace": "ns", "labels": {"gputask.io/task": name},
            "annotations": {"gputask.io/task-uid": f"uid-{name}"}}}

    kept, gone = await client.create(JOBS, job("kept"), "ns"), await client.create(JOBS, job("gone"), "ns")
    await operator.informers["jobs"].sink.apply([{"type": "ADDED", "object": kept}, {"type": "ADDED", "object": gone}])
    await client.delete(JOBS, "gone", "ns")
    await operator.informers["jobs"].sink.replace(await client.list_versioned(JOBS, labels="gputask.io/task"))
    assert sorted(operator.controller.jobs) == ["ns/kept"]


async def test_the_echo_of_our_own_status_write_is_recognised_and_nothing_else_is() -> None:
    """The GPUTask as our status write left it is an echo; the same task after a spec edit is not, nor is the
    version a conflict's re-read took (only its resourceVersion was taken: its event must still be seen)."""
    from test_adapter import Parts

    parts = Parts()
    parts.submit("t")
    await parts.loop.run_once()  # admitted: one status write
    (echo,) = parts.client.all(GPUTASKS, "ns")
    edited = await parts.client.patch(GPUTASKS, "t", {"spec": {"priority": 5}}, "ns")
    pod = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    body = {**task("u"), "spec": {"queueName": "q", "template": pod}}
    parts.controller.on_task(copy.deepcopy(parts.client.put(GPUTASKS, body, "ns")))  # put returns the stored dict
    await parts.client.patch(GPUTASKS, "u", {"spec": {"priority": 7}}, "ns")  # not fed: the write conflicts
    await parts.loop.run_once()
    stored = {o["metadata"]["name"]: o for o in parts.client.all(GPUTASKS, "ns")}
    conflicts = parts.executor.transitions.conflicts
    assert [parts.controller.is_echo(o) for o in (echo, edited, stored["u"])] + [conflicts] == [True, False, False, 1]


async def test_an_object_leaving_or_entering_the_label_selector_is_deleted_or_added() -> None:
    """As the API server does for a watch with a label selector, a Job whose label is removed reaches the informer
    as DELETED and one that gets it back as ADDED; a change to an object that never matched is not seen."""
    client, sink = FakeKubeClient(), Recorder()
    labelled = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "j", "namespace": "ns", "labels": {"gputask.io/task": "t"}}}
    informer = Informer(client, JOBS, sink, labels="gputask.io/task")
    informer.start((await client.list_versioned(JOBS, labels="gputask.io/task")).resource_version)
    await client.create(JOBS, labelled, "ns")
    await client.create(JOBS, {**labelled, "metadata": {"name": "other", "namespace": "ns"}}, "ns")
    await client.patch(JOBS, "other", {"metadata": {"annotations": {"a": "b"}}}, "ns")
    await client.patch(JOBS, "j", {"metadata": {"labels": {"gputask.io/task": None}}}, "ns")
    await client.patch(JOBS, "j", {"metadata": {"labels": {"gputask.io/task": "t"}}}, "ns")
    await client.delete(JOBS, "other", "ns")
    await until(lambda: len(sink.events) == 3)
    await client.delete(JOBS, "j", "ns")
    await until(lambda: len(sink.events) == 4)
    await informer.stop()
    assert sink.events == [("ADDED", "j"), ("DELETED", "j"), ("ADDED", "j"), ("DELETED", "j")]


async def test_the_deleted_of_an_object_leaving_the_selector_carries_its_previous_state() -> None:
    """The DELETED a label-selected watch gets when a Job loses its label carries the Job as it was (labelled) at
    the resourceVersion of the change, as the watch cache sends it; a patch naming another uid is 422 Invalid."""
    client = FakeKubeClient()
    labelled = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "j", "namespace": "ns", "labels": {"gputask.io/task": "t"}}}
    since = (await client.list_versioned(JOBS)).resource_version
    await client.create(JOBS, labelled, "ns")
    changed = await client.patch(JOBS, "j", {"metadata": {"labels": {"gputask.io/task": None}}}, "ns")
    stream = client.watch(JOBS, resource_version=since, labels="gputask.io/task", timeout_s=1)
    batch = await anext(stream)
    await stream.aclose()
    with pytest.raises(ApiError) as refused:
        await client.patch(JOBS, "j", {"metadata": {"uid": "other", "labels": {"x": "y"}}}, "ns")
    seen = [(e["type"], e["object"]["metadata"].get("labels"), e["object"]["metadata"]["resourceVersion"])
            for e in batch]
    assert (seen, refused.value.status, refused.value.reason) == (
        [("ADDED", {"gputask.io/task": "t"}, str(int(changed["metadata"]["resourceVersion"]) - 1)),
         ("DELETED", {"gputask.io/task": "t"}, changed["metadata"]["resourceVersion"])], 422, "Invalid")


async def test_the_rebuild_looks_up_by_name_only_the_jobs_its_listing_missed() -> None:
    """At a rebuild, only the Job a placed task's status names that the labelled listing lacks (its label removed)
    is asked for by name: one GET, none for the task whose Job was listed nor for a pending task; the Job found is
    known to the controller and its label is to be put back."""
    client = FakeKubeClient()
    operator = operator_with(client)
    for name, labels in (("a", {"gputask.io/task": "a"}), ("b", {})):
        made = await client.create(GPUTASKS, task(name), "ns")
        status = {"phase": "Running", "jobName": f"{name}-1", "attempt": 1}
        await client.patch(GPUTASKS, name, {"status": status}, "ns", status=True)
        await client.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": f"{name}-1", "namespace": "ns", "labels": labels,
            "annotations": {"gputask.io/task-uid": made["metadata"]["uid"]}}}, "ns")
    await client.create(GPUTASKS, task("waiting"), "ns")
    await operator.rebuild()
    await operator._stop_informers()
    gets = [call for call in client.calls if call[:2] == ("get", "jobs")]
    assert (gets, sorted(operator.controller.jobs), sorted(operator.executor.relabel.lost)) == (
        [("get", "jobs", "b-1")], ["ns/a-1", "ns/b-1"], ["ns/b-1"])


def pod(name: str, *, node: str | None = "node-a", job: str | None = None, gpus: int = 1) -> dict[str, Any]:
    """A pod in ``ns`` asking ``gpus`` nvidia.com/gpu, bound to ``node`` (a pod of Job ``job``, with its task label,
    when given; foreign otherwise). No status: a create does not take one."""
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if job is not None:
        meta |= {"labels": {"gputask.io/task": "t"}, "ownerReferences": [{"kind": "Job", "name": job, "uid": "j"}]}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def foreign_view(operator: Operator) -> dict[str, list[str]]:
    """The operator's foreign-pod index: node -> names of the pods counted on it."""
    return {node: sorted(p.name for p in pods.values()) for node, pods in operator.controller.foreign.by_node.items()}


async def test_a_pod_that_finishes_leaves_the_foreign_selectors_as_deleted_with_its_previous_state() -> None:
    """With the foreign-pod selectors, an unbound pod is not seen, its binding is ADDED and its finishing (phase
    Succeeded) is DELETED carrying the pod as it was (Running) at the change's resourceVersion; a pod of ours never
    shows."""
    client = FakeKubeClient()
    since = (await client.list_versioned(PODS)).resource_version
    await client.create(PODS, pod("p", node=None), "ns")
    await client.create(PODS, pod("ours", job="t-1"), "ns")
    await client.patch(PODS, "p", {"spec": {"nodeName": "node-a"}}, "ns")
    await client.patch(PODS, "p", {"status": {"phase": "Running"}}, "ns", status=True)
    changed = await client.patch(PODS, "p", {"status": {"phase": "Succeeded"}}, "ns", status=True)
    stream = client.watch(PODS, resource_version=since, labels=FOREIGN_LABELS, fields=FOREIGN_PODS, timeout_s=1)
    batch = await anext(stream)
    await stream.aclose()
    seen = [(e["type"], e["object"]["metadata"]["name"], (e["object"].get("status") or {}).get("phase"),
             e["object"]["metadata"]["resourceVersion"]) for e in batch]
    rv = int(changed["metadata"]["resourceVersion"])
    assert seen == [("ADDED", "p", None, str(rv - 2)), ("MODIFIED", "p", "Running", str(rv - 1)),
                    ("DELETED", "p", "Running", str(rv))]


async def test_pod_changes_between_the_rebuilds_listing_and_the_watch_are_applied_once() -> None:
    """A foreign pod bound and a task pod deleted right after the rebuild listed pods (before the informers' watches
    open) reach the index and the controller once each, with the listed foreign pod that finished meanwhile gone."""
    client = FakeKubeClient()
    operator = operator_with(client)
    await client.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "t-1", "namespace": "ns", "labels": {"gputask.io/task": "t"},
        "annotations": {"gputask.io/task-uid": "uid-t"}}}, "ns")
    await client.create(PODS, pod("old"), "ns")
    await client.create(PODS, pod("t-1-x", job="t-1"), "ns")
    listing = client.list_versioned

    async def list_then_change(res: Any, namespace: str | None = None, **selectors: Any) -> Any:
        listed = await listing(res, namespace, **selectors)
        if res == PODS and selectors.get("fields") == FOREIGN_PODS:  # the last pod listing of the rebuild
            await client.create(PODS, pod("new", node="node-b"), "ns")
            await client.patch(PODS, "old", {"status": {"phase": "Succeeded"}}, "ns", status=True)
            await client.delete(PODS, "t-1-x", "ns")
        return listed

    client.list_versioned = list_then_change  # type: ignore[method-assign]
    await operator.rebuild()
    listed = (foreign_view(operator), sorted(operator.controller.task_pods.values()))
    await until(lambda: operator.informers["foreignpods"].events == 2 and operator.informers["taskpods"].events == 1)
    await asyncio.sleep(0.05)  # nothing more arrives
    await operator._stop_informers()
    assert (listed, foreign_view(operator), operator.controller.task_pods,
            operator.informers["foreignpods"].events, operator.informers["taskpods"].events) == (
        ({"node-a": ["old"]}, ["ns/t-1"]), {"node-b": ["new"]}, {}, 2, 1)


async def test_a_listing_after_a_gap_forgets_the_task_pods_deleted_meanwhile() -> None:
    """The task-pods feed's replace keeps the listed pods of our Jobs and forgets the known ones the listing lacks."""
    client = FakeKubeClient()
    operator = operator_with(client)
    operator.controller.on_job({"metadata": {"name": "t-1", "namespace": "ns", "labels": {"gputask.io/task": "t"},
                                             "annotations": {"gputask.io/task-uid": "uid-t"}}})
    kept = await client.create(PODS, pod("kept", job="t-1"), "ns")
    gone = await client.create(PODS, pod("gone", job="t-1"), "ns")
    feed = operator.informers["taskpods"].sink
    await feed.apply([{"type": "ADDED", "object": kept}, {"type": "ADDED", "object": gone}])
    known = sorted(operator.controller.task_pods)
    await client.delete(PODS, "gone", "ns")
    await feed.replace(await client.list_versioned(PODS, labels="gputask.io/task"))
    assert (known, operator.controller.task_pods) == (
        sorted([kept["metadata"]["uid"], gone["metadata"]["uid"]]), {kept["metadata"]["uid"]: "ns/t-1"})


async def test_a_listing_after_a_gap_counts_each_foreign_pod_once_and_drops_the_finished() -> None:
    """The foreign-pods feed's replace makes the index the listing: a pod that finished meanwhile is released, the
    others are counted once however often a listing is handed over."""
    client = FakeKubeClient()
    operator = operator_with(client)
    kept, done = await client.create(PODS, pod("kept"), "ns"), await client.create(PODS, pod("done"), "ns")
    feed = operator.informers["foreignpods"].sink
    await feed.apply([{"type": "ADDED", "object": kept}, {"type": "ADDED", "object": done}])
    before = foreign_view(operator)
    await client.patch(PODS, "done", {"status": {"phase": "Succeeded"}}, "ns", status=True)
    for _ in range(2):
        await feed.replace(await client.list_versioned(PODS, labels=FOREIGN_LABELS, fields=FOREIGN_PODS))
    assert (before, foreign_view(operator), operator.controller.foreign.requests_on("node-a")[1]) == (
        {"node-a": ["done", "kept"]}, {"node-a": ["kept"]}, 1)


async def test_a_standby_keeps_no_foreign_pod_index() -> None:
    """A standby (not leading) ignores foreign-pod events: its rebuild lists them when it becomes the leader."""
    client = FakeKubeClient()
    operator = Operator(Config(), client)
    made = await client.create(PODS, pod("p"), "ns")
    await operator.informers["foreignpods"].sink.apply([{"type": "ADDED", "object": made}])
    assert foreign_view(operator) == {}
