"""ResourceFlavors in the core: quota, borrowing, fungibility, preemption and charging per flavor.

Queues and flavors are written as manifests (Kueue's shapes) and read by the same converter the
operator uses, so each case reads as a user would write it.
"""

from __future__ import annotations

from typing import Any

from gputask.core import Admit, Gpu, GpuRequest, GpuSlot, Node, NodeName, Pending, Placement, Scheduler, Task, TaskKey
from gputask.core.fit import Taint
from gputask.core.scheduler import Evict
from gputask.manifests.convert import flavor_from_manifest, queue_from_manifest

GIB = 1024
H100, T4 = "NVIDIA-H100-80GB-HBM3", "Tesla-T4"


def node(name: str, product: str, count: int, gib: int, *, labels: dict[str, str] | None = None,
         taints: tuple[Taint, ...] = ()) -> Node:
    gpus = tuple(Gpu(i, f"{name}-{i}", product, gib * GIB) for i in range(count))
    return Node(NodeName(name), gpus, labels=tuple(sorted((labels or {}).items())), taints=taints)


def cluster(*nodes: Node, flavors: dict[str, dict[str, Any]]) -> Scheduler:
    s = Scheduler(nodes=nodes)
    for name, spec in flavors.items():
        s.set_flavor(flavor_from_manifest(name, spec))
    return s


def flavored_queue(name: str, quotas: dict[str, int | str], *, cohort: str | None = None,
                   **extra: Any) -> Any:
    """A GPUClusterQueue with one resource group over nvidia.com/gpu, flavors in the order given."""
    spec = {
        "namespaceSelector": {},
        "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": f, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": q}]}
                        for f, q in quotas.items()],
        }],
        **({"cohort": cohort} if cohort else {}),
        **extra,
    }
    return queue_from_manifest(name, spec)


def whole(name: str, *, queue: str = "q", priority: int = 0, created: float = 0.0, memory_gib: int | None = None,
          products: tuple[str, ...] = ()) -> Task:
    mib = None if memory_gib is None else memory_gib * GIB
    return Task(TaskKey(f"ns/{name}"), queue, GpuRequest(1, memory_mib=mib, products=frozenset(products)),
                priority=priority, created=created)


BY_LABEL = {"h100": {"nodeLabels": {"gpu": "h100"}, "gpuProducts": [H100]},
            "t4": {"nodeLabels": {"gpu": "t4"}, "gpuProducts": [T4]}}


def two_pools() -> Scheduler:
    return cluster(node("h", H100, 2, 80, labels={"gpu": "h100"}), node("t", T4, 4, 16, labels={"gpu": "t4"}),
                   flavors=BY_LABEL)


def admitted(decisions: list[Any]) -> list[tuple[str, str, str]]:
    return [(d.task.key, d.task.flavor, d.placement.only().node) for d in decisions if isinstance(d, Admit)]


def test_h100_and_t4_are_quotad_separately_in_the_queues_flavor_order() -> None:
    """One H100 and two T4s of quota: the first task takes the first flavor, the next ones the second
    once the first is full; the fifth waits, told each flavor's quota; usage is kept per flavor."""
    s = two_pools()
    s.set_queue(flavored_queue("q", {"h100": 1, "t4": 2}))
    for i in range(4):
        s.submit(whole(f"t{i}", created=i))
    decisions = s.cycle(0.0)
    assert admitted(decisions) == [("ns/t0", "h100", "h"), ("ns/t1", "t4", "t"), ("ns/t2", "t4", "t")]
    (waiting,) = [d for d in decisions if isinstance(d, Pending)]
    assert (waiting.reason, waiting.message) == (
        "QuotaExceeded",
        "flavor h100: quota of nvidia.com/gpu in flavor h100 in GPUClusterQueue 'q' has 0 milli-GPU left; "
        "flavor t4: quota of nvidia.com/gpu in flavor t4 in GPUClusterQueue 'q' has 0 milli-GPU left",
    )
    assert s.quotas.usage["q"] == {"nvidia.com/gpu@h100": 1000, "gputask.io/gpu-memory@h100": 81920,
                                   "nvidia.com/gpu@t4": 2000, "gputask.io/gpu-memory@t4": 32768}
    assert s.queue_status()["q"]["usage"] == s.quotas.usage["q"]


def test_a_flavor_charges_against_its_card_size_whatever_card_the_task_lands_on() -> None:
    """A flavor covering 40 and 80 GiB A100s with gpuMemory 80Gi charges a 20Gi task 250m on either card;
    the implicit flavor (flat resources) charges it over each card's own memory: 500m on the 40 GiB one."""
    flavors = {"a100": {"gpuProducts": ["A100-40", "A100-80"], "gpuMemory": "80Gi"}}
    charges = {}
    for product in ("A100-40", "A100-80"):
        gib = 40 if product == "A100-40" else 80
        s = cluster(node("n", product, 1, gib), flavors=flavors)
        s.set_queue(flavored_queue("q", {"a100": 4}))
        s.set_queue(queue_from_manifest("flat", {"namespaceSelector": {},
                                                 "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}))
        s.submit(whole("f", memory_gib=20))
        s.submit(whole("g", queue="flat", memory_gib=20, created=1))
        s.cycle(0.0)
        charges[product] = (s.quotas.usage["q"]["nvidia.com/gpu@a100"], s.quotas.usage["flat"]["nvidia.com/gpu"])
    assert charges == {"A100-40": (250, 500), "A100-80": (250, 250)}


def test_when_can_borrow_try_next_flavor_prefers_a_flavor_within_nominal() -> None:
    """Queue a has no H100 quota of its own (b lends it) and one T4: Kueue's default (Borrow) takes the
    first flavor by borrowing; TryNextFlavor takes the T4 within nominal instead."""
    chosen = {}
    for mode in ("Borrow", "TryNextFlavor"):
        s = two_pools()
        s.set_queue(flavored_queue("a", {"h100": 0, "t4": 1}, cohort="org", flavorFungibility={"whenCanBorrow": mode}))
        s.set_queue(flavored_queue("b", {"h100": 2, "t4": 0}, cohort="org"))
        s.submit(whole("x", queue="a"))
        chosen[mode] = admitted(s.cycle(0.0))
    assert chosen == {"Borrow": [("ns/x", "h100", "h")], "TryNextFlavor": [("ns/x", "t4", "t")]}


def test_when_can_preempt_decides_between_preempting_in_the_first_flavor_and_trying_the_next() -> None:
    """The H100 quota is full with a low-priority task and the T4 quota is free: TryNextFlavor (Kueue's
    default) admits the high one on a T4; Preempt preempts the H100 task, in its flavor."""
    outcome = {}
    for mode in ("TryNextFlavor", "Preempt"):
        s = two_pools()
        s.set_queue(flavored_queue("q", {"h100": 1, "t4": 1}, preemption={"withinClusterQueue": "LowerPriority"},
                                   flavorFungibility={"whenCanPreempt": mode}))
        s.submit(whole("low", priority=0))
        s.cycle(0.0)
        s.submit(whole("high", priority=10, created=1))
        decisions = s.cycle(1.0)
        outcome[mode] = (admitted(decisions), [(d.task.key, d.reason) for d in decisions if isinstance(d, Evict)])
    assert outcome == {
        "TryNextFlavor": ([("ns/high", "t4", "t")], []),
        "Preempt": ([], [("ns/low", "Preempted")]),
    }


def test_flavor_taints_need_tolerating_and_its_tolerations_are_the_tasks() -> None:
    """A flavor whose nodes are tainted, with a toleration for them: its tasks go there and carry the
    toleration (the Job gets it); a flavor whose taint nobody tolerates is skipped for the next one."""
    taint = Taint("dedicated", "gpu", "NoSchedule")
    flavors = {
        "closed": {"nodeLabels": {"pool": "closed"}, "nodeTaints": [{"key": "other", "effect": "NoSchedule"}]},
        "tainted": {"nodeLabels": {"pool": "tainted"},
                    "nodeTaints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]},
    }
    s = cluster(node("c", T4, 1, 16, labels={"pool": "closed"}, taints=(Taint("other", "", "NoSchedule"),)),
                node("d", T4, 1, 16, labels={"pool": "tainted"}, taints=(taint,)), flavors=flavors)
    s.set_queue(flavored_queue("q", {"closed": 1, "tainted": 1}))
    s.submit(whole("t"))
    (decision,) = s.cycle(0.0)
    assert isinstance(decision, Admit)
    assert (decision.task.flavor, decision.placement.only().node,
            decision.task.constraints.tolerations[0].tolerates(taint),
            decision.task.constraints.node_selector) == ("tainted", "d", True, (("pool", "tainted"),))


def test_a_queue_naming_a_missing_flavor_is_inactive_and_a_task_no_flavor_covers_is_inadmissible() -> None:
    """Kueue's FlavorNotFound: the queue admits nothing until the flavor exists; a task whose products no
    flavor covers is Inadmissible, with each flavor's reason."""
    s = two_pools()
    s.set_queue(flavored_queue("q", {"h100": 1, "a100": 1}))
    s.submit(whole("t"))
    first = s.cycle(0.0)
    s.set_queue(flavored_queue("q", {"h100": 1, "t4": 1}))
    s.submit(whole("u", products=("A100-80",), created=1))
    second = [d for d in s.cycle(1.0) if isinstance(d, Pending)]
    assert [(d.reason, d.message) for d in first] == [
        ("QueueInactive", "GPUClusterQueue 'q' is inactive: GPUResourceFlavor a100 does not exist"),
    ]
    assert [(d.task.key, d.reason, d.message) for d in second] == [
        ("ns/u", "Inadmissible", "no flavor of GPUClusterQueue 'q' can hold it (h100: covers GPU products "
         f"['{H100}'], the task allows ['A100-80']; t4: covers GPU products ['{T4}'], the task allows ['A100-80'])"),
    ]


def test_restored_work_is_charged_in_the_flavor_holding_it_and_requeued_unflavored() -> None:
    """After a restart the placement's node and GPUs say which flavor it was admitted in; evicted, the
    task is queued again as it was submitted, so it may land in another flavor."""
    s = two_pools()
    s.set_queue(flavored_queue("q", {"h100": 1, "t4": 1}))

    task = whole("t")
    assert s.restore(task, Placement.one(NodeName("t"), (GpuSlot(0, "t-0", 16 * GIB),)))
    charged = dict(s.quotas.usage["q"])
    requeued = s.requeue(task.key)
    assert charged == {"nvidia.com/gpu@t4": 1000, "gputask.io/gpu-memory@t4": 16384}
    assert requeued == task and requeued.flavor == "" and admitted(s.cycle(0.0)) == [("ns/t", "h100", "h")]


def test_flavors_alike_to_placement_are_each_tried_for_their_own_quota() -> None:
    """Two flavors covering the same nodes (no labels, no products): once the first one's quota is full the
    next tasks go to the second; one flavor's refusal is not remembered for the other (the flavor is part
    of a task's shape)."""
    s = cluster(node("n", H100, 4, 80), flavors={"reserved": {}, "spot": {}})
    s.set_queue(flavored_queue("q", {"reserved": 1, "spot": 2}))
    for i in range(3):
        s.submit(whole(f"t{i}", created=i))
    assert admitted(s.cycle(0.0)) == [("ns/t0", "reserved", "n"), ("ns/t1", "spot", "n"), ("ns/t2", "spot", "n")]


def test_restored_work_stays_in_the_flavor_its_job_names_even_when_two_flavors_hold_it() -> None:
    """Two flavors alike to placement: a restart puts each task back in the flavor it was admitted in
    (the Job's annotation, passed as ``flavor``), not the first flavor that holds its placement, so no
    quota is overdrawn; a flavor gone since still gets its charge back."""
    s = cluster(node("n", H100, 4, 80), flavors={"reserved": {}, "spot": {}})
    s.set_queue(flavored_queue("q", {"reserved": 1, "spot": 2}))
    slots = [Placement.one(NodeName("n"), (GpuSlot(i, f"n-{i}", 80 * GIB),)) for i in range(3)]
    for i, flavor in enumerate(("reserved", "spot", "spot")):
        assert s.restore(whole(f"t{i}"), slots[i], flavor=flavor)
    s.remove_flavor("spot")
    assert s.restore(whole("t3"), Placement.one(NodeName("n"), (GpuSlot(3, "n-3", 80 * GIB),)), flavor="spot")
    assert ({k: v for k, v in s.quotas.usage["q"].items() if k.startswith("nvidia")}, s.violations()) == (
        {"nvidia.com/gpu@reserved": 1000, "nvidia.com/gpu@spot": 3000},
        ["queue q: nvidia.com/gpu@spot usage 3000 > 2000"],  # t3 restored in spot beyond it: reported, not hidden
    )


def test_the_least_charge_in_a_flavor_is_counted_against_its_card_size() -> None:
    """gpuMemory 80Gi over 40Gi cards, 300m of quota: a half-GPU task charges 250m there, so a higher-priority
    copy is not Inadmissible (500m would be, counted over the card) and preempts the running one."""
    flavors = {"a100": {"gpuProducts": ["A100-40"], "gpuMemory": "80Gi"}}
    s = cluster(node("n", "A100-40", 1, 40), flavors=flavors)
    s.set_queue(flavored_queue("q", {"a100": "300m"}, preemption={"withinClusterQueue": "LowerPriority"}))
    s.submit(whole("low", memory_gib=20))
    first = admitted(s.cycle(0.0))
    s.submit(whole("high", memory_gib=20, priority=10, created=1))
    second = s.cycle(1.0)
    assert (first, [(d.task.key, d.reason) for d in second if isinstance(d, Evict)]) == (
        [("ns/low", "a100", "n")], [("ns/low", "Preempted")],
    )  # fmt: skip


def test_reclaim_counts_the_victim_queues_borrowing_only_in_the_preemptors_flavor() -> None:
    """b runs two H100 tasks within its H100 nominal and borrows a T4: a's H100 task may not reclaim from b
    (b does not borrow H100s), whatever b borrows of T4s."""
    s = two_pools()
    s.set_queue(flavored_queue("a", {"h100": 2, "t4": 2}, cohort="org", preemption={"reclaimWithinCohort": "Any"}))
    s.set_queue(flavored_queue("b", {"h100": 2, "t4": 0}, cohort="org"))
    for i in range(2):
        s.submit(whole(f"b{i}", queue="b", products=(H100,), created=i))
    s.submit(whole("bt", queue="b", products=(T4,), created=2))
    before = admitted(s.cycle(0.0))
    s.submit(whole("a0", queue="a", products=(H100,), created=3))
    decisions = s.cycle(1.0)
    assert (len(before), [d for d in decisions if isinstance(d, Evict)]) == (3, [])
