"""The operator's informer (list, then watch) and its feeds, on the in-process fake client's watches."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from gputask.config import Config
from gputask.k8s import informer as informer_module
from gputask.k8s.client import GPUTASKS, JOBS, ApiError
from gputask.k8s.handlers import Operator
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
