"""GPULocalQueues: a task's queue name resolves to a GPUClusterQueue through the LocalQueue of its namespace.

Driven on the controller directly (no I/O): what it queues in the core, what it reports, and that the
index it keeps re-resolves exactly the tasks an event concerns.
"""

from __future__ import annotations

import time
from typing import Any

from gputask.config import Config
from gputask.core import Admit, Pending
from gputask.k8s.controller import Controller
from gputask.k8s.tasks import PENDING

GPU0 = {"index": 0, "uuid": "GPU-0", "product": "NVIDIA-A10", "memory": "24Gi", "memoryUsed": "0", "healthy": True}
OPEN = {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1000}]}


def controller(config: Config | None = None) -> Controller:
    """A controller with one ready node of one A10 and an open GPUClusterQueue ``cq``."""
    c = Controller(config or Config())
    now = time.time()
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    c.inventory.on_node({"metadata": {"name": "node-a"}, "status": ready}, now)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    c.inventory.on_gpunode({"metadata": {"name": "node-a"}, "status": {"gpus": [GPU0], "heartbeatTime": stamp}}, now)
    c.on_queue(cluster_queue("cq"))
    return c


def cluster_queue(name: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1", **meta}, "spec": OPEN}


def local_queue(name: str, namespace: str, target: Any, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "1", **meta},
            "spec": {"clusterQueue": target}}


def gputask(name: str, queue: str, namespace: str = "ns", memory: str = "4Gi") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "generation": 1},
        "spec": {"queueName": queue, "gpuMemory": memory,
                 "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }


def where(c: Controller, key: str) -> tuple[str | None, str | None, tuple[str, str] | None]:
    """(GPUClusterQueue, GPULocalQueue) the record's task is queued in, and why it waits outside the queues."""
    record = c.tasks[key]
    task = record.task
    return (task.queue if task else None, task.local_queue if task else None, record.blocked)


def reports(c: Controller) -> list[tuple[str, str, str]]:
    out = [(r.kind, r.record.key, r.detail) for r in c.outbox]
    c.outbox.clear()
    return out


def test_a_task_names_the_local_queue_of_its_namespace_and_is_admitted_by_its_cluster_queue() -> None:
    """Two namespaces with a LocalQueue of the same name point at different GPUClusterQueues; each task is
    charged to its own, and nothing is reported but the admissions."""
    c = controller()
    c.on_queue(cluster_queue("other"))
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    c.on_local_queue(local_queue("gpus", "team-b", "other"))
    c.on_task(gputask("a", "gpus"))
    c.on_task(gputask("b", "gpus", namespace="team-b"))
    decisions = c.scheduler.cycle(time.time())
    assert (where(c, "ns/a"), where(c, "team-b/b"), reports(c)) == (("cq", "gpus", None), ("other", "gpus", None), [])
    assert sorted((d.task.key, d.task.queue) for d in decisions if isinstance(d, Admit)) == [
        ("ns/a", "cq"), ("team-b/b", "other"),
    ]  # fmt: skip


def test_naming_a_cluster_queue_directly_still_queues_there_with_one_deprecation_report() -> None:
    """No LocalQueue of that name in the namespace, but a GPUClusterQueue: queued there, reported once
    (an edit of the spec does not report it again)."""
    c = controller()
    c.on_task(gputask("t", "cq"))
    first = reports(c)
    edited = gputask("t", "cq")
    edited["spec"]["gpuMemory"] = "8Gi"
    edited["metadata"]["generation"] = 2
    c.on_task(edited)
    assert (where(c, "ns/t"), first, reports(c)) == (("cq", None, None), [("deprecated-queue", "ns/t", "cq")], [])


def test_a_task_waits_outside_the_queues_until_its_local_queue_appears() -> None:
    """GitOps order: the task before its LocalQueue. It waits with QueueNotFound (not Failed); the
    LocalQueue's creation queues it in the GPUClusterQueue it names."""
    c = controller()
    c.on_task(gputask("t", "gpus"))
    waiting = where(c, "ns/t")
    blocked = reports(c)
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    assert (waiting, blocked, c.tasks["ns/t"].phase) == (
        (None, None, ("QueueNotFound", "GPULocalQueue ns/gpus does not exist (nor a GPUClusterQueue 'gpus', "
                                       "which a task may name directly until the next release)")),
        [("blocked", "ns/t", "")],
        PENDING,
    )
    assert (where(c, "ns/t"), [d.task.key for d in c.scheduler.cycle(time.time()) if isinstance(d, Admit)]) == (
        ("cq", "gpus", None), ["ns/t"],
    )  # fmt: skip


def test_a_local_queue_of_a_missing_cluster_queue_queues_its_tasks_there_which_say_so() -> None:
    """A LocalQueue pointing at a GPUClusterQueue not created yet: its tasks wait in the core with
    QueueNotFound naming both; the GPUClusterQueue's creation lets them in."""
    c = controller()
    c.on_local_queue(local_queue("gpus", "ns", "later"))
    c.on_task(gputask("t", "gpus"))
    (pending,) = c.scheduler.cycle(time.time())
    assert isinstance(pending, Pending)
    assert (pending.reason, pending.message) == (
        "QueueNotFound", "GPUClusterQueue 'later' (of GPULocalQueue ns/gpus) does not exist",
    )  # fmt: skip
    c.on_queue(cluster_queue("later"))
    assert [d.task.queue for d in c.scheduler.cycle(time.time()) if isinstance(d, Admit)] == ["later"]


def test_a_local_queue_being_deleted_or_invalid_admits_nothing_new() -> None:
    """Terminating (its finalizer held by admitted tasks) or with a spec the schema should have refused:
    its waiting tasks leave the queues with QueueInactive; its deletion makes them resolve again."""
    c = controller()
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    c.on_local_queue(local_queue("bad", "ns", ""))
    c.on_task(gputask("t", "gpus"))
    c.on_task(gputask("u", "bad"))
    c.on_local_queue(local_queue("gpus", "ns", "cq", deletionTimestamp="2026-12-01T10:00:00Z"))
    deleting, invalid = where(c, "ns/t"), where(c, "ns/u")
    c.on_local_queue(local_queue("gpus", "ns", "cq"), deleted=True)
    assert (deleting, invalid, where(c, "ns/t"), [t.key for t in c.scheduler.pending]) == (
        (None, None, ("QueueInactive", "GPULocalQueue ns/gpus is being deleted: it admits nothing new")),
        (None, None, ("QueueInactive", "GPULocalQueue ns/bad is invalid: spec.clusterQueue must name a "
                                       "GPUClusterQueue, got ''")),
        (None, None, ("QueueNotFound", "GPULocalQueue ns/gpus does not exist (nor a GPUClusterQueue 'gpus', "
                                       "which a task may name directly until the next release)")),
        [],
    )


def test_a_placed_task_keeps_the_cluster_queue_it_was_admitted_in() -> None:
    """A LocalQueue re-created to point elsewhere moves waiting tasks, not admitted ones; after a rebuild
    an admitted task is put back in the GPUClusterQueue its status names."""
    c = controller()
    c.on_queue(cluster_queue("other"))
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    c.on_task(gputask("run", "gpus"))
    c.on_task(gputask("wait", "gpus", memory="30Gi"))  # more than the A10 has: never placed
    c.scheduler.cycle(time.time())
    running = {e.task.key: e.task.queue for e in c.scheduler.running.values()}
    c.on_local_queue(local_queue("gpus", "ns", "cq"), deleted=True)
    c.on_local_queue(local_queue("gpus", "ns", "other"))
    assert (running, {e.task.key: e.task.queue for e in c.scheduler.running.values()}, where(c, "ns/wait")) == (
        {"ns/run": "cq"}, {"ns/run": "cq"}, ("other", "gpus", None),
    )  # fmt: skip


def test_the_index_forgets_deleted_tasks_and_kueue_mode_leaves_names_to_kueue() -> None:
    """A deleted task is no longer re-resolved by a later LocalQueue event; in Kueue mode the name is
    Kueue's LocalQueue and gputask resolves nothing."""
    c = controller()
    c.on_task(gputask("t", "gpus"))
    c.on_task_deleted(gputask("t", "gpus"))
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    kueue = controller(Config(queueing="kueue"))
    kueue.on_task(gputask("k", "gpus"))
    assert (list(c.local_queues.asking("gpus")), "ns/t" in c.tasks, where(kueue, "ns/k")) == (
        [], False, ("gpus", None, None),
    )  # fmt: skip


def test_a_local_queue_event_that_changes_nothing_it_resolves_to_re_resolves_nobody() -> None:
    """Its own status and finalizer writes come back as events (new resourceVersion, same spec): they must
    not requeue every task naming it (that was O(tasks) per write, O(tasks^2) in all)."""
    c = controller()
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    for i in range(3):
        c.on_task(gputask(f"t{i}", "gpus"))
    requeued: list[str] = []
    original = c.requeue
    c.requeue = lambda record: (requeued.append(record.key), original(record))[1]  # type: ignore[method-assign]
    written = local_queue("gpus", "ns", "cq", resourceVersion="7", finalizers=["gputask.io/queue-in-use"])
    written["status"] = {"pendingTasks": 3}
    c.on_local_queue(written)
    quiet = list(requeued)
    c.on_local_queue(local_queue("gpus", "ns", "cq", resourceVersion="8", deletionTimestamp="2026-12-01T10:00:00Z"))
    assert (quiet, requeued) == ([], ["ns/t0", "ns/t1", "ns/t2"])


def test_a_restarted_operator_does_not_warn_again_about_a_task_it_already_queued_directly() -> None:
    """The deprecation Event goes with the first status naming the GPUClusterQueue; a task whose status
    already names it (an earlier leader warned) is not warned again."""
    c = controller()
    seen = gputask("t", "cq")
    seen["status"] = {"phase": "Pending", "queue": "cq"}
    c.on_task(seen)
    c.on_task(gputask("u", "cq"))
    assert reports(c) == [("deprecated-queue", "ns/u", "cq")]


def test_a_local_queue_re_created_elsewhere_counts_only_the_tasks_it_admits() -> None:
    """A task admitted through gpus -> cq stays charged to cq; gpus re-created -> other does not count it
    (nor hold its finalizer for it); the waiting task that moved is counted there."""
    from gputask.k8s.queue_status import local_queue_statuses

    c = controller()
    c.on_queue(cluster_queue("other"))
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    c.on_task(gputask("run", "gpus"))
    c.scheduler.cycle(time.time())
    c.on_task(gputask("wait", "gpus", memory="30Gi"))
    c.on_local_queue(local_queue("gpus", "ns", "cq"), deleted=True)
    c.on_local_queue(local_queue("gpus", "ns", "other"))
    status = local_queue_statuses(c)[("ns", "gpus")]
    assert (status["pendingTasks"], status["admittedTasks"], status["usage"]) == (
        1, 0, [{"name": "gputask.io/gpu-memory", "total": "0Mi"}, {"name": "nvidia.com/gpu", "total": "0m"}],
    )  # fmt: skip


def test_a_local_queue_is_inactive_while_its_cluster_queue_cannot_admit() -> None:
    """Held (stopPolicy) or listing a missing flavor, the GPUClusterQueue's Active is False (Kueue's Stopped,
    FlavorNotFound), and the GPULocalQueue pointing at it says ClusterQueueIsInactive with why."""
    from gputask.k8s.queue_status import local_queue_statuses, queue_statuses

    c = controller()
    c.on_queue({"metadata": {"name": "held"}, "spec": {**OPEN, "stopPolicy": "Hold"}})
    groups = [{"coveredResources": ["nvidia.com/gpu"],
               "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]}]}]
    c.on_queue({"metadata": {"name": "flavored"}, "spec": {"namespaceSelector": {}, "resourceGroups": groups}})
    c.on_local_queue(local_queue("a", "ns", "held"))
    c.on_local_queue(local_queue("b", "ns", "flavored"))

    def active(status: dict[str, Any]) -> tuple[str, str, str]:
        (cond,) = status["conditions"]
        return cond["status"], cond["reason"], cond["message"]

    cluster, local = queue_statuses(c), local_queue_statuses(c)
    assert (active(cluster["held"]), active(cluster["flavored"]), active(local[("ns", "a")]),
            active(local[("ns", "b")])) == (
        ("False", "Stopped", "stopPolicy Hold: admits nothing new"),
        ("False", "FlavorNotFound", "GPUResourceFlavor h100 does not exist"),
        ("False", "ClusterQueueIsInactive", "GPUClusterQueue 'held' cannot admit: stopPolicy Hold: admits nothing new"),
        ("False", "ClusterQueueIsInactive", "GPUClusterQueue 'flavored' cannot admit: GPUResourceFlavor h100 does not "
                                            "exist"),
    )


def test_a_local_queue_being_deleted_counts_the_tasks_it_keeps_waiting() -> None:
    """Its waiting tasks leave the core's queues while it is Terminating, and it still counts them pending."""
    from gputask.k8s.queue_status import local_queue_statuses

    c = controller()
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    c.on_task(gputask("t", "gpus", memory="30Gi"))  # never fits: stays pending
    before = local_queue_statuses(c)[("ns", "gpus")]["pendingTasks"]
    c.on_local_queue(local_queue("gpus", "ns", "cq", deletionTimestamp="2026-12-01T10:00:00Z"))
    after = local_queue_statuses(c)[("ns", "gpus")]
    assert (before, after["pendingTasks"], [t.key for t in c.scheduler.pending], after["conditions"][0]["reason"]) == (
        1, 1, [], "Terminating",
    )  # fmt: skip


def test_a_cluster_queue_being_deleted_reports_itself_terminating_with_its_admitted_tasks() -> None:
    """A GPUClusterQueue deleted under a running task keeps writing its status (Active False, Kueue's
    Terminating, its admitted task counted) and its GPULocalQueue says it is being deleted, not missing."""
    from gputask.k8s.queue_status import local_queue_statuses, queue_statuses

    c = controller()
    c.on_local_queue(local_queue("gpus", "ns", "cq"))
    c.on_task(gputask("run", "gpus"))
    c.scheduler.cycle(time.time())
    c.on_queue(cluster_queue("cq", deletionTimestamp="2026-12-01T10:00:00Z", finalizers=["gputask.io/queue-in-use"]))
    cluster, local = queue_statuses(c), local_queue_statuses(c)
    (cq_active,), (lq_active,) = cluster["cq"]["conditions"], local[("ns", "gpus")]["conditions"]
    assert (
        cluster["cq"]["admittedTasks"], (cq_active["status"], cq_active["reason"], cq_active["message"]),
        (lq_active["status"], lq_active["reason"], lq_active["message"]),
    ) == (
        1, ("False", "Terminating", "being deleted: admits nothing new; goes once its admitted tasks finish"),
        ("False", "ClusterQueueIsInactive", "GPUClusterQueue 'cq' is inactive: it is being deleted, and waits for its "
                                            "admitted tasks to finish (its finalizer stays until then)"),
    )  # fmt: skip
