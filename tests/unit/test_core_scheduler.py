"""Scheduler: exact decision lists for small clusters (order, quota, cohorts, FIFO, reasons)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gputask.core import (
    GPU,
    GPU_MEMORY,
    Admit,
    Gpu,
    GpuRequest,
    GpuSlot,
    LabelSelector,
    Node,
    NodeName,
    Pending,
    Placement,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
)
from gputask.core.scheduler import CycleStats, Evict

GIB = 1024  # MiB


def node(name: str, *gib: int, product: str = "NVIDIA-A10") -> Node:
    """A node whose GPUs 0..n-1 have the given sizes in GiB and uuids ``<name>-<index>``."""
    return Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", product, g * GIB) for i, g in enumerate(gib)))


def task(
    name: str,
    *,
    queue: str = "q",
    count: int = 1,
    memory_gib: int | None = None,
    priority: int = 0,
    created: float = 0.0,
    products: tuple[str, ...] = (),
    namespace_labels: tuple[tuple[str, str], ...] = (),
) -> Task:
    """A task in namespace ``ns``: whole GPUs unless ``memory_gib`` is given."""
    mib = None if memory_gib is None else memory_gib * GIB
    return Task(
        TaskKey(f"ns/{name}"),
        queue,
        GpuRequest(count, memory_mib=mib, products=frozenset(products)),
        priority=priority,
        created=created,
        namespace_labels=namespace_labels,
    )


def queue(
    name: str = "q",
    *,
    cohort: str | None = None,
    strategy: str = "BestEffortFIFO",
    stop_policy: str = "None",
    selector: LabelSelector | None = None,
    **quotas: ResourceQuota,
) -> QueueSpec:
    """A queue; keyword ``gpu`` and ``memory`` set the quotas of nvidia.com/gpu and gpu-memory."""
    names = {"gpu": GPU, "memory": GPU_MEMORY}
    return QueueSpec(
        name,
        cohort=cohort,
        strategy=strategy,
        stop_policy=stop_policy,
        namespace_selector=selector or LabelSelector(),
        quotas={names[k]: q for k, q in quotas.items()},
    )


def placed(node_name: str, *slots: tuple[int, int]) -> Placement:
    """A placement on ``node_name`` of (index, MiB) slots, with the uuids of :func:`node`."""
    return Placement.one(NodeName(node_name), tuple(GpuSlot(i, f"{node_name}-{i}", m) for i, m in slots))


def usage(milli: int, mib: int) -> dict[str, int]:
    """A quota usage value."""
    return {GPU: milli, GPU_MEMORY: mib}


def over_quota(t: Task, queue_name: str, left: int = 0, resource: str = GPU) -> Pending:
    """The QuotaExceeded wait of ``t`` in ``queue_name`` with ``left`` of ``resource`` remaining."""
    unit = "milli-GPU" if resource == GPU else "MiB"
    return Pending(t, "QuotaExceeded", f"quota of {resource} in GPUClusterQueue {queue_name!r} has {left} {unit} left")


def scheduler(nodes: Iterable[Node], queues: Iterable[QueueSpec], tasks: Iterable[Task] = ()) -> Scheduler:
    """A best-fit scheduler holding the nodes, queues and submitted tasks."""
    s = Scheduler(nodes=nodes)
    for q in queues:
        s.set_queue(q)
    for t in tasks:
        s.submit(t)
    return s


NO_IDLE_GPU = "0/1 nodes fit: 1 no idle GPU"


def test_tasks_are_admitted_by_priority_then_creation_time() -> None:
    """Higher priority goes first, then the older task; the rest wait with NoFit."""
    old_low, new_high = task("old-low", created=1), task("new-high", priority=10, created=5)
    old_high, newest = task("old-high", priority=10, created=2), task("newest", created=9)
    s = scheduler([node("a", 16, 16)], [queue()], [newest, old_low, new_high, old_high])
    assert s.cycle() == [
        Admit(old_high, placed("a", (0, 16 * GIB)), usage(1000, 16 * GIB)),
        Admit(new_high, placed("a", (1, 16 * GIB)), usage(1000, 16 * GIB)),
        Pending(old_low, "NoFit", NO_IDLE_GPU),
        Pending(newest, "NoFit", NO_IDLE_GPU),
    ]


def test_gpu_quota_is_charged_in_milli_gpu_of_the_actual_device() -> None:
    """12Gi on a 16Gi GPU costs 750 milli-GPU, so a 1.5-GPU quota holds two such tasks, not three."""
    t1, t2, t3 = (task(f"t{i}", memory_gib=12, created=i) for i in range(3))
    s = scheduler([node("a", 16, 16, 16)], [queue(gpu=ResourceQuota(1500))], [t1, t2, t3])
    assert s.cycle() == [
        Admit(t1, placed("a", (0, 12 * GIB)), usage(750, 12 * GIB)),
        Admit(t2, placed("a", (1, 12 * GIB)), usage(750, 12 * GIB)),
        over_quota(t3, "q"),
    ]


def test_gpu_quota_rounds_each_device_share_up() -> None:
    """5Gi on a 24Gi GPU is 208.33 milli-GPU, charged as 209 per device."""
    t = task("t", count=2, memory_gib=5)
    s = scheduler([node("a", 24, 24)], [queue(gpu=ResourceQuota(1000))], [t])
    assert s.cycle() == [Admit(t, placed("a", (0, 5 * GIB), (1, 5 * GIB)), usage(418, 10 * GIB))]


def test_gpu_quota_depends_on_the_device_so_a_bigger_gpu_can_fit_where_a_smaller_cannot() -> None:
    """With 500 milli-GPU left, 12Gi fits only on the 80Gi GPU (150 milli), not on a 16Gi one (750)."""
    t = task("t", memory_gib=12)
    s = scheduler([node("a", 16), node("b", 80)], [queue(gpu=ResourceQuota(500))], [t])
    assert s.cycle() == [Admit(t, placed("b", (0, 12 * GIB)), usage(150, 12 * GIB))]


def test_gpu_memory_quota_is_counted_in_mib() -> None:
    """A 20Gi gpu-memory quota admits 12Gi then refuses 10Gi, naming gputask.io/gpu-memory."""
    t1, t2 = task("t1", memory_gib=12, created=1), task("t2", memory_gib=10, created=2)
    s = scheduler([node("a", 24, 24)], [queue(memory=ResourceQuota(20 * GIB))], [t1, t2])
    assert s.cycle() == [
        Admit(t1, placed("a", (0, 12 * GIB)), usage(500, 12 * GIB)),
        over_quota(t2, "q", 8192, GPU_MEMORY),
    ]


def test_a_queue_borrows_unused_cohort_quota_up_to_its_borrowing_limit() -> None:
    """Team a (nominal 1, borrowingLimit 1) takes 2 GPUs out of an idle cohort of 4, not 3."""
    tasks = [task(f"a{i}", queue="a", created=i) for i in range(3)]
    s = scheduler(
        [node("n", 16, 16, 16, 16)],
        [
            queue("a", cohort="org", gpu=ResourceQuota(1000, borrowing_limit=1000)),
            queue("b", cohort="org", gpu=ResourceQuota(3000)),
        ],
        tasks,
    )
    assert s.cycle() == [
        Admit(tasks[0], placed("n", (0, 16 * GIB)), usage(1000, 16 * GIB)),
        Admit(tasks[1], placed("n", (1, 16 * GIB)), usage(1000, 16 * GIB)),
        over_quota(tasks[2], "a"),
    ]


def test_a_queue_borrows_no_more_than_the_lenders_lending_limit() -> None:
    """Team b (nominal 3, lendingLimit 1) lends one GPU, so team a (nominal 1) gets 2 in all."""
    tasks = [task(f"a{i}", queue="a", created=i) for i in range(3)]
    s = scheduler(
        [node("n", 16, 16, 16, 16)],
        [
            queue("a", cohort="org", gpu=ResourceQuota(1000)),
            queue("b", cohort="org", gpu=ResourceQuota(3000, lending_limit=1000)),
        ],
        tasks,
    )
    assert s.cycle() == [
        Admit(tasks[0], placed("n", (0, 16 * GIB)), usage(1000, 16 * GIB)),
        Admit(tasks[1], placed("n", (1, 16 * GIB)), usage(1000, 16 * GIB)),
        over_quota(tasks[2], "a"),
    ]


def test_unused_quota_is_lent_once_not_to_every_borrower() -> None:
    """Two borrowers share the lender's 2 idle GPUs: 2 admissions in all, never the cohort's 2 twice over."""
    tasks = [task(f"{q}{i}", queue=q, created=2 * i + (q == "c")) for i in range(2) for q in "bc"]
    s = scheduler(
        [node("n", 16, 16, 16, 16, 16, 16)],
        [
            queue("lender", cohort="org", gpu=ResourceQuota(2000)),
            queue("b", cohort="org", gpu=ResourceQuota(0)),
            queue("c", cohort="org", gpu=ResourceQuota(0)),
        ],
        tasks,
    )
    b0, c0, b1, c1 = tasks
    assert s.cycle() == [
        Admit(b0, placed("n", (0, 16 * GIB)), usage(1000, 16 * GIB)),
        Admit(c0, placed("n", (1, 16 * GIB)), usage(1000, 16 * GIB)),
        over_quota(b1, "b"),
        over_quota(c1, "c"),
    ]


def test_a_lender_keeps_only_its_guaranteed_quota_while_its_lent_quota_is_borrowed() -> None:
    """As in Kueue: lent quota in use by a borrower is not the lender's again until released."""
    borrowers = [task(f"a{i}", queue="a", created=i) for i in range(2)]
    owners = [task(f"b{i}", queue="b", created=10 + i) for i in range(3)]
    s = scheduler(
        [node("n", 16, 16, 16, 16, 16, 16)],
        [
            queue("a", cohort="org", gpu=ResourceQuota(1000)),
            queue("b", cohort="org", gpu=ResourceQuota(3000, lending_limit=1000)),
        ],
        borrowers,
    )
    first = s.cycle()
    for t in owners:
        s.submit(t)
    assert (first, s.cycle()) == (
        [
            Admit(borrowers[0], placed("n", (0, 16 * GIB)), usage(1000, 16 * GIB)),
            Admit(borrowers[1], placed("n", (1, 16 * GIB)), usage(1000, 16 * GIB)),
        ],
        [
            Admit(owners[0], placed("n", (2, 16 * GIB)), usage(1000, 16 * GIB)),
            Admit(owners[1], placed("n", (3, 16 * GIB)), usage(1000, 16 * GIB)),
            over_quota(owners[2], "b"),
        ],
    )


def test_a_queue_without_a_cohort_never_goes_beyond_nominal() -> None:
    """Without a cohort there is nothing to borrow, whatever the borrowingLimit says."""
    t1, t2 = task("t1", created=1), task("t2", created=2)
    s = scheduler([node("a", 16, 16)], [queue(gpu=ResourceQuota(1000, borrowing_limit=5000))], [t1, t2])
    assert s.cycle() == [
        Admit(t1, placed("a", (0, 16 * GIB)), usage(1000, 16 * GIB)),
        over_quota(t2, "q"),
    ]


def _fifo_case(strategy: str) -> tuple[Scheduler, list[Task]]:
    """One GPU busy out of two; a 2-GPU head, then a small task in the same queue and one in another."""
    busy = task("busy", created=0)
    big, small = task("big", count=2, created=1), task("small", memory_gib=4, created=2)
    other = task("other", queue="o", memory_gib=4, created=3)
    s = scheduler([node("a", 16, 16)], [queue(strategy=strategy), queue("o", strategy=strategy)], [busy])
    s.cycle()
    for t in (big, small, other):
        s.submit(t)
    return s, [big, small, other]


def test_best_effort_fifo_lets_a_later_small_task_pass_a_blocked_big_one() -> None:
    """BestEffortFIFO: the 2-GPU head waits while the small task behind it is admitted."""
    s, (big, small, other) = _fifo_case("BestEffortFIFO")
    assert s.cycle() == [
        Pending(big, "NoFit", "0/1 nodes fit: 1 fewer than 2 idle GPUs"),
        Admit(small, placed("a", (1, 4 * GIB)), usage(250, 4 * GIB)),
        Admit(other, placed("a", (1, 4 * GIB)), usage(250, 4 * GIB)),
    ]


def test_strict_fifo_blocks_only_the_queue_of_the_waiting_head() -> None:
    """StrictFIFO: the small task waits behind its head, while another queue's task is admitted."""
    s, (big, small, other) = _fifo_case("StrictFIFO")
    assert s.cycle() == [
        Pending(big, "NoFit", "0/1 nodes fit: 1 fewer than 2 idle GPUs"),
        Pending(small, "StrictFIFOBlocked", "StrictFIFO: waiting behind the head of 'q'"),
        Admit(other, placed("a", (1, 4 * GIB)), usage(250, 4 * GIB)),
    ]


def test_every_pending_reason_names_its_cause() -> None:
    """Each way of waiting has its own reason and a message that says what is missing."""
    allowed = LabelSelector(match_labels=(("team", "ml"),))
    tasks = [
        task("no-queue", queue="missing"),
        task("held", queue="held"),
        task("wrong-ns", queue="ml-only", namespace_labels=(("team", "web"),)),
        task("over-memory-quota", queue="small", memory_gib=12),
        task("h100", products=("NVIDIA-H100",)),
        task("too-many", count=3),
        task("first", count=2, created=1, memory_gib=20),
        task("no-room", created=2, memory_gib=20),
    ]
    s = scheduler(
        [node("a", 24, 24)],
        [
            queue(),
            queue("held", stop_policy="Hold"),
            queue("ml-only", selector=allowed),
            queue("small", memory=ResourceQuota(8 * GIB)),
        ],
        tasks,
    )
    decisions = s.cycle()
    assert sorted(decisions, key=lambda d: d.task.key) == [
        Admit(tasks[6], placed("a", (0, 20 * GIB), (1, 20 * GIB)), usage(1668, 40 * GIB)),
        Pending(tasks[4], "ProductUnavailable", "no node has a GPU of product ['NVIDIA-H100']"),
        Pending(tasks[1], "QueueHeld", "GPUClusterQueue 'held' is stopped (Hold)"),
        Pending(tasks[0], "QueueNotFound", "GPUClusterQueue 'missing' does not exist"),
        Pending(tasks[7], "NoFit", "0/1 nodes fit: 1 no GPU with 20480 MiB free"),
        Pending(
            tasks[3],
            "Inadmissible",
            "needs at least 12288 MiB of gputask.io/gpu-memory; GPUClusterQueue 'small' can never hold more than 8192",
        ),
        Pending(tasks[5], "Inadmissible", "no node could ever hold it: 0/1 nodes fit: 1 fewer than 3 GPUs"),
        Pending(tasks[2], "NamespaceNotAllowed", "namespace 'ns' is not selected by GPUClusterQueue 'ml-only'"),
    ]


def test_a_pending_reason_is_emitted_once_and_again_only_when_it_changes() -> None:
    """Unchanged reasons are not repeated; a held queue that is released reports the new reason."""
    waiting = task("waiting")
    s = scheduler([node("a", 16)], [queue(stop_policy="Hold")], [task("busy", created=-1), waiting])
    first, second = s.cycle(), s.cycle()
    s.set_queue(queue())
    third, fourth = s.cycle(), s.cycle()
    busy = task("busy", created=-1)
    assert (first, second, third, fourth) == (
        [
            Pending(busy, "QueueHeld", "GPUClusterQueue 'q' is stopped (Hold)"),
            Pending(waiting, "QueueHeld", "GPUClusterQueue 'q' is stopped (Hold)"),
        ],
        [],
        [
            Admit(busy, placed("a", (0, 16 * GIB)), usage(1000, 16 * GIB)),
            Pending(waiting, "NoFit", NO_IDLE_GPU),
        ],
        [],
    )


def test_an_evicted_task_keeps_its_creation_time_and_goes_ahead_of_newer_work() -> None:
    """Requeue releases the GPU and queues the task in its old place, ahead of a newer waiting task."""
    old, new = task("old", created=1), task("new", created=5)
    s = scheduler([node("a", 16)], [queue(gpu=ResourceQuota(1000))], [old, new])
    s.cycle()
    evicted = s.requeue(old.key)
    assert (evicted, s.requeue(TaskKey("ns/ghost")), dict(s.quotas.usage["q"]), s.cycle()) == (
        old,
        None,
        usage(0, 0),
        [Admit(old, placed("a", (0, 16 * GIB)), usage(1000, 16 * GIB))],
    )


def test_requeue_undoes_an_admission_and_the_task_is_admitted_again_next_cycle() -> None:
    """After a failed API write, requeue releases GPU and quota and the next cycle re-admits."""
    t = task("t")
    s = scheduler([node("a", 16)], [queue(gpu=ResourceQuota(1000))], [t])
    first = s.cycle()
    s.requeue(t.key)
    undone = (
        s.placement_of(t.key),
        t.key in s.pending,
        dict(s.quotas.usage["q"]),
        dict(s.cluster.reservations()),
    )
    assert (first, undone, s.cycle()) == (
        [Admit(t, placed("a", (0, 16 * GIB)), usage(1000, 16 * GIB))],
        (None, True, usage(0, 0), {}),
        [Admit(t, placed("a", (0, 16 * GIB)), usage(1000, 16 * GIB))],
    )


def test_restore_records_running_work_even_beyond_quota_and_capacity() -> None:
    """restore never refuses: an over-committing, over-quota placement is recorded and shows as violations."""
    a, b = task("a", memory_gib=12), task("b", memory_gib=12)
    s = scheduler([node("n", 16)], [queue(gpu=ResourceQuota(1000))], [b])
    s.restore(a, placed("n", (0, 12 * GIB)))
    s.restore(b, placed("n", (0, 12 * GIB)))
    assert (
        s.placement_of(b.key),
        b.key in s.pending,
        s.quotas.usage["q"],
        s.violations(),
    ) == (
        placed("n", (0, 12 * GIB)),
        False,
        usage(1500, 24 * GIB),
        ["n GPU 0: 24576 MiB reserved > 16384 MiB", "queue q: nvidia.com/gpu usage 1500 > 1000"],
    )


def test_restore_of_a_gpu_that_no_longer_exists_is_still_recorded() -> None:
    """A running task on a GPU index the node no longer reports is kept running and charged a whole GPU."""
    t = task("t", memory_gib=4)
    s = scheduler([node("n", 16)], [queue()])
    s.restore(t, placed("n", (3, 4 * GIB)))
    assert (s.placement_of(t.key), s.quotas.usage["q"], s.cluster.node(NodeName("n")).reserved_mib) == (
        placed("n", (3, 4 * GIB)),
        usage(1000, 4 * GIB),
        [0],
    )


def test_finish_releases_gpus_and_quota_for_the_next_task() -> None:
    """Finishing a running task frees its quota so the waiting task is admitted next cycle."""
    t1, t2 = task("t1", created=1, memory_gib=4), task("t2", created=2, memory_gib=4)
    s = scheduler([node("a", 16, 16)], [queue(gpu=ResourceQuota(250))], [t1, t2])
    first = s.cycle()
    released = s.finish(t1.key)
    assert (first, released, s.finish(TaskKey("ns/ghost")), s.cycle()) == (
        [
            Admit(t1, placed("a", (0, 4 * GIB)), usage(250, 4 * GIB)),
            over_quota(t2, "q"),
        ],
        placed("a", (0, 4 * GIB)),
        None,
        [Admit(t2, placed("a", (0, 4 * GIB)), usage(250, 4 * GIB))],
    )


def test_finish_of_a_pending_task_drops_it_from_the_queue() -> None:
    """A deleted pending task leaves the queue and is never admitted."""
    t = task("t")
    s = scheduler([node("a", 16)], [queue(stop_policy="Hold")], [t])
    s.finish(t.key)
    s.set_queue(queue())
    assert (len(s.pending), s.cycle()) == (0, [])


def test_submit_of_a_running_task_is_ignored() -> None:
    """Submitting a task that is already running neither queues it again nor changes its placement."""
    t = task("t")
    s = scheduler([node("a", 16, 16)], [queue()], [t])
    s.cycle()
    s.submit(t)
    assert (len(s.pending), s.placement_of(t.key), s.cycle()) == (0, placed("a", (0, 16 * GIB)), [])


def test_queue_status_reports_usage_borrowed_pending_and_admitted() -> None:
    """queue_status sums usage per queue and counts pending and admitted tasks."""
    s = scheduler(
        [node("a", 16, 16)],
        [queue("a", cohort="org", gpu=ResourceQuota(0)), queue("b", cohort="org", gpu=ResourceQuota(2000))],
        [task("x", queue="a", memory_gib=8, created=1), task("y", queue="a", count=3, created=2)],
    )
    s.cycle()
    assert s.queue_status() == {
        "a": {"usage": usage(500, 8 * GIB), "borrowed": {GPU: 500}, "pending": 1, "admitted": 1},
        "b": {"usage": usage(0, 0), "borrowed": {GPU: 0}, "pending": 0, "admitted": 0},
    }


def _run(policy: str) -> list[list[object]]:
    """A fixed script of submissions, finishes and evictions; returns every cycle's decisions."""
    from gputask.core import make_policy

    s = Scheduler(policy=make_policy(policy), nodes=[node("a", 24, 24), node("b", 16, 16, 16), node("c", 80)])
    s.set_queue(queue("a", cohort="org", gpu=ResourceQuota(2000, borrowing_limit=1000)))
    s.set_queue(queue("b", cohort="org", gpu=ResourceQuota(2000)))
    out: list[list[object]] = []
    for i in range(12):
        s.submit(task(f"t{i}", queue="ab"[i % 2], count=1 + i % 3, memory_gib=(4, 8, None)[i % 3], created=i))
        out.append(list(s.cycle(float(i))))
        if i % 4 == 3:
            s.finish(TaskKey(f"ns/t{i - 2}"))
        if i % 5 == 4:
            s.requeue(TaskKey(f"ns/t{i - 4}"))
    return out


def test_the_same_calls_give_the_same_decisions() -> None:
    """Two schedulers fed the same calls decide identically, for every policy including random."""
    assert [_run(p) for p in ("bestfit", "firstfit", "random")] == [_run(p) for p in ("bestfit", "firstfit", "random")]


def test_across_a_cohort_a_head_within_nominal_goes_before_one_that_borrows() -> None:
    """Kueue's entryOrdering: qa's second task would borrow qb's unused GPU; qb's own newer task, within
    its nominal quota, is taken first, so the lender is not starved by a borrower that came earlier."""
    s = scheduler(
        [node("a", 24, 24)],
        [queue("qa", cohort="org", gpu=ResourceQuota(1000)), queue("qb", cohort="org", gpu=ResourceQuota(1000))],
        [task("a1", queue="qa", created=0), task("a2", queue="qa", created=1), task("b1", queue="qb", created=2)],
    )
    admitted = [d.task.key for d in s.cycle(0.0) if isinstance(d, Admit)]
    assert admitted == ["ns/a1", "ns/b1"]


def test_with_fair_sharing_the_queue_with_the_lower_share_after_admission_goes_first() -> None:
    """Fair sharing orders heads by their queue's share once the head is admitted (Kueue's
    DominantResourceShareWith), keyed again after each admission: qa and qb alternate on a
    4-GPU node although all of qa's tasks are older."""
    fair = [
        QueueSpec(n, cohort="org", quotas={GPU: ResourceQuota(1000)}, fair_sharing_weight_milli=1000)
        for n in ("qa", "qb")
    ]
    lender = QueueSpec("qc", cohort="org", quotas={GPU: ResourceQuota(4000)}, fair_sharing_weight_milli=1000)
    tasks = [task(f"a{i}", queue="qa", created=i) for i in range(3)] + [
        task(f"b{i}", queue="qb", created=10 + i) for i in range(3)
    ]
    s = scheduler([node("a", 24, 24, 24, 24)], [*fair, lender], tasks)
    admitted = [d.task.key for d in s.cycle(0.0) if isinstance(d, Admit)]
    assert admitted == ["ns/a0", "ns/b0", "ns/a1", "ns/b1"]


def test_a_queue_read_from_a_manifest_fails_closed() -> None:
    """Kueue's rules: a GPUClusterQueue without namespaceSelector admits no namespace, and one that lists
    no GPU resource admits nothing; each task waits saying which (a scenario queue stays open)."""
    no_selector = QueueSpec("nosel", quotas={GPU: ResourceQuota(1000)}, namespace_selector=None, closed=True)
    uncovered = QueueSpec("bare", closed=True)
    a, b = task("a", queue="nosel"), task("b", queue="bare")
    s = scheduler([node("n", 24)], [no_selector, uncovered], [a, b])
    assert s.cycle(0.0) == [
        Pending(
            a,
            "NamespaceNotAllowed",
            "GPUClusterQueue 'nosel' has no namespaceSelector, so it admits no namespace "
            "(namespaceSelector: {} admits all)",
        ),
        Pending(
            b,
            "Inadmissible",
            "GPUClusterQueue 'bare' covers no GPU resource: list nvidia.com/gpu or gputask.io/gpu-memory "
            "in spec.resources or spec.resourceGroups",
        ),
    ]


def test_an_unchanged_cycle_is_skipped_and_new_tasks_behind_a_full_node_are_tried_alone() -> None:
    """With 200 tasks waiting on a full node, a cycle with nothing new tries none; one with two new tasks tries those
    two (the walk tries all 202): the early one waits at position 0 and the tracked heads behind it move down one."""
    s = scheduler([node("n", 16)], [queue("q")], [task("holder")])
    for i in range(200):
        s.submit(task(f"w{i}", created=1.0 + i))
    s.cycle(1.0)  # holder admitted: the next cycle walks again (what waits sees less room)
    s.cycle(1.5)
    quiet = (s.cycle(2.0), s.stats)
    s.submit(task("late", created=500.0))
    s.submit(task("early", created=0.5))
    new = [(d.task.key, d.position) for d in s.cycle(3.0)]
    assert (quiet, s.stats, new[:3], new[-1], len(new)) == (
        ([], CycleStats("skipped", 0, 1)),
        CycleStats("incremental", 2, 1),
        [("ns/early", 0), ("ns/w0", 1), ("ns/w1", 2)],
        ("ns/late", 201),
        101,  # early, w0-w98 (the first 100 of the queue), late
    )


def test_a_task_its_queue_never_admits_takes_no_place_and_is_no_pending_work_even_when_held() -> None:
    """NamespaceNotAllowed tasks get no queue position and are not counted pending; stopping the queue (Hold)
    does not hide that cause behind QueueHeld."""
    ml = LabelSelector(match_labels=(("team", "ml"),))
    outsider = task("outsider", queue="ml-only", namespace_labels=(("team", "web"),))
    member = task("member", queue="ml-only", count=2, created=1.0, namespace_labels=(("team", "ml"),))
    s = scheduler([node("a", 24)], [queue("ml-only", selector=ml)], [outsider, member])
    open_cycle = [(d.task.key, d.reason, d.position) for d in s.cycle(0.0) if isinstance(d, Pending)]
    pending_open = s.queue_status()["ml-only"]["pending"]
    s.set_queue(queue("ml-only", selector=ml, stop_policy="Hold"))
    held_cycle = [(d.task.key, d.reason, d.position) for d in s.cycle(1.0) if isinstance(d, Pending)]
    assert (open_cycle, pending_open, held_cycle) == (
        [("ns/outsider", "NamespaceNotAllowed", -1), ("ns/member", "Inadmissible", 0)],
        1,
        [("ns/member", "QueueHeld", 0)],
    )


def test_a_deleted_nodes_holds_are_released_with_it_and_the_others_stay() -> None:
    """Holds of departing workloads on a node whose Node is deleted are released (their pods go with it); a hold on
    another node stays, and the ledger keeps no hold the cluster no longer reserves."""
    s = scheduler([node("a", 16), node("b", 16)], [queue()])
    on_a, on_b = TaskKey("ns/old-1#terminating"), TaskKey("ns/other-1#terminating")
    s.hold(on_a, placed("a", (0, 16 * GIB)))
    s.hold(on_b, placed("b", (0, 16 * GIB)))
    s.remove_node(NodeName("a"))
    assert (s.ledger.held, sorted(s.cluster.reservations())) == ({on_b: placed("b", (0, 16 * GIB))}, [on_b])


def test_a_gpu_failure_eviction_holds_the_failed_gpu_for_the_old_pods() -> None:
    """A task on a GPU reported unhealthy is evicted (GPUFailure) and re-placed on the node's other GPU in the same
    cycle; the failed GPU stays held for its old pods (they run until stopped), so when it is healthy again the
    next task waits for the hold to end, then gets it."""
    first, second = task("first"), task("second")
    s = scheduler([node("a", 16, 16)], [queue()], [first])
    s.cycle(1.0)
    gpu0, gpu1 = node("a", 16, 16).gpus
    failed = Node(NodeName("a"), (replace(gpu0, healthy=False), gpu1))
    s.set_node(failed)
    decisions = s.cycle(2.0)
    held = next(d.held for d in decisions if isinstance(d, Evict))
    s.set_node(node("a", 16, 16))
    s.submit(second)
    waiting, holds = s.cycle(3.0), dict(s.ledger.held)
    s.finish(held)  # type: ignore[arg-type]
    assert (decisions, holds, waiting, s.cycle(4.0)) == (
        [Evict(first, placed("a", (0, 16 * GIB)), "GPUFailure", "a GPU of node a failed or disappeared"),
         Admit(first, placed("a", (1, 16 * GIB)), usage(1000, 16 * GIB))],
        {held: placed("a", (0, 16 * GIB))},
        [Pending(second, "NoFit", NO_IDLE_GPU)],
        [Admit(second, placed("a", (0, 16 * GIB)), usage(1000, 16 * GIB))],
    )
