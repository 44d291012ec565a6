"""Gangs in the core (issue 30): all or nothing, fewest nodes, topology domains, gang preemption."""

from __future__ import annotations

from gputask.core import (
    GPU,
    Admit,
    Gpu,
    GpuRequest,
    Node,
    NodeName,
    PodSet,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
    find_placement,
    make_policy,
)
from gputask.core.cluster import ClusterState
from gputask.core.diagnose import diagnose
from gputask.core.quota import Preemption
from gputask.core.scheduler import Evict, Pending

GIB = 1024
WHOLE = GpuRequest(1)
RACK = "example.com/rack"


def node(name: str, gpus: int, rack: str | None = None) -> Node:
    """A node of ``gpus`` 80 GiB GPUs, in ``rack`` when given."""
    labels = () if rack is None else ((RACK, rack),)
    return Node(NodeName(name), tuple(Gpu(i, f"{name}-{i}", "H100", 80 * GIB) for i in range(gpus)), labels=labels)


def gang(name: str, count: int, per_pod: int, *, priority: int = 0, required: str | None = None,
         preferred: str | None = None) -> Task:
    """``count`` pods of ``per_pod`` whole GPUs in queue ``q``."""
    return Task.of_pod_sets(TaskKey(f"ns/{name}"), "q", (PodSet("workers", count, GpuRequest(per_pod)),),
                            priority=priority, topology_required=required, topology_preferred=preferred)


def one(name: str, gpus: int, *, priority: int = 0) -> Task:
    """A one-pod task of ``gpus`` whole GPUs in queue ``q``."""
    return Task(TaskKey(f"ns/{name}"), "q", GpuRequest(gpus), priority=priority)


def scheduler(nodes: list[Node], *, within: str = "Never", gpus: int | None = None) -> Scheduler:
    """A best-fit scheduler with one queue ``q`` (``gpus`` whole GPUs of quota, unlimited when None)."""
    s = Scheduler(nodes=nodes, policy=make_policy("bestfit"))
    quotas = {} if gpus is None else {GPU: ResourceQuota(gpus * 1000)}
    s.set_queue(QueueSpec("q", quotas=quotas, preemption=Preemption(within_cluster_queue=within)))
    return s


def run(s: Scheduler, *tasks: Task, now: float = 0.0) -> list[tuple[str, str, tuple[str, ...]]]:
    """Submit ``tasks`` and run a cycle: (decision, task, nodes) per decision (reason for a Pending)."""
    for t in tasks:
        s.submit(t)
    out = []
    for d in s.cycle(now):
        if isinstance(d, Admit):
            out.append(("Admit", d.task.key, d.placement.nodes))
        elif isinstance(d, Evict):
            out.append(("Evict", d.task.key, d.placement.nodes))
        elif isinstance(d, Pending):
            out.append(("Pending", d.task.key, (str(d.reason),)))
    return out


def nodes_of(placement: object) -> list[str]:
    """The node of each pod of a placement."""
    return [p.node for p in placement.pods]  # type: ignore[attr-defined]


def test_pods_that_could_share_a_node_go_to_the_fewest_nodes() -> None:
    """Four 2-GPU pods: best fit alone would fill the two 2-GPU holes first; fewest nodes first puts all four on the
    empty 8-GPU node."""
    cluster = ClusterState([node("a", 2), node("b", 2), node("c", 8)])
    placement = find_placement(cluster, gang("g", 4, 2), make_policy("bestfit")).placement
    assert placement is not None and nodes_of(placement) == ["c", "c", "c", "c"]


def test_a_required_topology_keeps_every_pod_in_one_domain_the_tightest_that_holds_it() -> None:
    """Two racks: r1 (two 8-GPU nodes, one busy) cannot hold two 8-GPU pods, r2 can; r3 has more room than
    needed. The gang goes to r2 (the tightest domain that holds it); the unlabelled node takes no pod."""
    s = scheduler([node("a1", 8, "r1"), node("a2", 8, "r1"), node("b1", 8, "r2"), node("b2", 8, "r2"),
                   node("c1", 8, "r3"), node("c2", 8, "r3"), node("c3", 8, "r3"), node("free", 8)])
    run(s, one("busy", 8))  # best fit: the first empty node in name order, a1
    assert run(s, gang("g", 2, 8, required=RACK), now=1.0) == [("Admit", "ns/g", ("b1", "b2"))]


def test_a_required_topology_never_spans_domains() -> None:
    """Two racks of one free 8-GPU node each: the two-pod gang fits the cluster but no rack, so it waits and holds
    nothing; without topology it is admitted across both racks."""
    nodes = [node("a1", 8, "r1"), node("b1", 8, "r2")]
    strict, loose = scheduler(nodes), scheduler(nodes)
    assert (run(strict, gang("g", 2, 8, required=RACK)), dict(strict.running), run(loose, gang("g", 2, 8))) == (
        [("Pending", "ns/g", ("NoFit",))], {}, [("Admit", "ns/g", ("a1", "b1"))])


def test_a_preferred_topology_takes_one_domain_when_one_holds_it_else_the_fewest() -> None:
    """Preferred rack: three pods fit r2 alone (three nodes) though r1 sorts first; five pods span r2 then r1
    (the roomiest domain first), never the unlabelled node while a rack has room."""
    nodes = [node("a1", 8, "r1"), node("a2", 8, "r1"), node("b1", 8, "r2"), node("b2", 8, "r2"),
             node("b3", 8, "r2"), node("x", 8)]
    three = find_placement(ClusterState(nodes), gang("g", 3, 8, preferred=RACK), make_policy("bestfit")).placement
    five = find_placement(ClusterState(nodes), gang("g", 5, 8, preferred=RACK), make_policy("bestfit")).placement
    assert three is not None and five is not None
    assert (nodes_of(three), sorted(nodes_of(five))) == (["b1", "b2", "b3"], ["a1", "a2", "b1", "b2", "b3"])


def test_two_gangs_that_each_fit_alone_but_not_together_never_both_wait() -> None:
    """Two 3-pod gangs on four 1-GPU nodes: the first in order runs, the second waits and holds nothing."""
    s = scheduler([node(n, 1) for n in "abcd"])
    decisions = run(s, gang("first", 3, 1), gang("second", 3, 1))
    assert (decisions, sorted(s.running), sum(st.pods_used for st in s.cluster)) == (
        [("Admit", "ns/first", ("a", "b", "c")), ("Pending", "ns/second", ("NoFit",))], ["ns/first"], 3)


def test_a_gang_that_does_not_fit_holds_nothing_after_the_cycle() -> None:
    """Three of four pods would fit: nothing is reserved, charged or pending as a nomination."""
    s = scheduler([node(n, 1) for n in "abc"], gpus=8)
    decisions = run(s, gang("g", 4, 1))
    assert (decisions, [st.pods_used for st in s.cluster], s.quotas.usage.get("q", {}).get(GPU, 0),
            dict(s.nominated)) == ([("Pending", "ns/g", ("NoFit",))], [0, 0, 0], 0, {})


def test_gang_preemption_takes_victims_in_kueue_order_and_puts_back_what_is_not_needed() -> None:
    """A 2x4-GPU gang; low priority 2-GPU tasks c1, c2 on c, then a and b (4 GPUs each, priority 1). Kueue's order
    takes c1, c2 (lowest first; equal admission times: by key; one pod then fits on c), then a (the other pod fits):
    {c1, c2, a}; fill-back returns none (each is needed)."""
    s = scheduler([node("a", 4), node("b", 4), node("c", 4)], within="LowerPriority")
    run(s, one("a-task", 4, priority=1), one("b-task", 4, priority=1))
    run(s, one("c1", 2), one("c2", 2), now=1.0)
    decisions = run(s, gang("g", 2, 4, priority=10), now=2.0)
    assert decisions == [("Evict", "ns/c1", ("c",)), ("Evict", "ns/c2", ("c",)), ("Evict", "ns/a-task", ("a",)),
                         ("Pending", "ns/g", ("Preempting",))]


def test_gang_preemption_evicts_nothing_where_the_freed_room_cannot_hold_a_pod() -> None:
    """Kueue #5243: 8-GPU pods, and every node keeps 4 GPUs of a task it may not preempt: evicting the 4-GPU
    low-priority tasks would free 8 GPUs of quota split over nodes no pod fits. No plan: nothing is evicted."""
    s = scheduler([node("a", 8), node("b", 8)], within="LowerPriority")
    run(s, one("keep-a", 4, priority=20), one("keep-b", 4, priority=20))
    run(s, one("low-a", 4), one("low-b", 4), now=1.0)
    assert run(s, gang("g", 1, 8, priority=10, required=RACK), now=2.0)[0][0] == "Pending"
    assert run(s, gang("h", 2, 8, priority=10), now=3.0) == [("Pending", "ns/h", ("NoFit",))]
    assert sorted(s.running) == ["ns/keep-a", "ns/keep-b", "ns/low-a", "ns/low-b"]


def test_gang_preemption_never_evicts_a_task_on_a_node_no_pod_can_use() -> None:
    """The lowest-priority candidate sits on a 2-GPU node a 4-GPU pod can never use: it is skipped, and only the
    task on the node the second pod needs (a, where best fit put it) is evicted."""
    s = scheduler([node("a", 4), node("b", 4), node("small", 2)], within="LowerPriority")
    run(s, one("a-task", 4, priority=1))
    run(s, one("small-task", 2), now=1.0)
    assert run(s, gang("g", 2, 4, priority=10), now=2.0) == [("Evict", "ns/a-task", ("a",)),
                                                             ("Pending", "ns/g", ("Preempting",))]


def test_gang_preemption_under_a_required_topology_picks_the_domain_with_the_fewest_victims() -> None:
    """Best fit puts two tasks in rack r1 (a1, a2) and one in r2 (b1): r2 needs one victim, r1 two; the plan evicts
    r2's and nominates the gang there."""
    s = scheduler([node("a1", 4, "r1"), node("a2", 4, "r1"), node("b1", 4, "r2"), node("b2", 4, "r2")],
                  within="LowerPriority")
    run(s, one("t-a1", 4), one("t-b1", 4), one("t-b2", 4))
    decisions = run(s, gang("g", 2, 4, priority=10, required=RACK), now=1.0)
    assert (decisions, dict(s.nominated)["ns/g"].placement.nodes) == (
        [("Evict", "ns/t-b2", ("b1",)), ("Pending", "ns/g", ("Preempting",))], ("b1", "b2"))


def test_a_gang_that_waits_says_how_many_pods_fit_together_and_where_room_is() -> None:
    """Three racks of 8-GPU nodes, three free in r1 and one in r2: a required-rack gang of four 8-GPU pods waits
    with how many pods its best try placed, the nodes with room and the most of them in one domain."""
    s = scheduler([node("a1", 8, "r1"), node("a2", 8, "r1"), node("a3", 8, "r1"), node("b1", 8, "r2")])
    s.submit(gang("g", 4, 8, required=RACK))
    [pending] = s.cycle()
    assert isinstance(pending, Pending)
    assert (pending.reason, pending.message) == (
        "NoFit", "3/4 pods placeable together: 4 nodes have room for a pod of PodSet 'workers' (8 GPUs idle), at "
        "most 3 of them in one example.com/rack domain")


def test_explain_shows_a_gangs_best_partial_placement_and_what_blocks_the_rest() -> None:
    """Three pods of a four-pod rack-bound gang fit r1: explain lists them pod by pod, the fourth with no node, and
    the blocking message naming the domain tried."""
    s = scheduler([node("a1", 8, "r1"), node("a2", 8, "r1"), node("a3", 8, "r1"), node("b1", 8, "r2")])
    s.submit(gang("g", 4, 8, required=RACK))
    s.cycle()
    [view] = diagnose(s, TaskKey("ns/g")).flavors
    gpus = "GPUs 0, 1, 2, 3, 4, 5, 6, 7"
    assert view.gang == (
        f"workers-0 on a1: {gpus}", f"workers-1 on a2: {gpus}", f"workers-2 on a3: {gpus}", "workers-3: no node",
        "blocked (domain example.com/rack=r1): 3/4 pods placeable together: 4 nodes have room for a pod of PodSet "
        "'workers' (8 GPUs idle), at most 3 of them in one example.com/rack domain")


def test_explain_says_a_gang_does_not_fit_now_while_single_pods_would() -> None:
    """A gang bound to a rack label no node has: every node could take one of its pods, yet the gang fits nowhere,
    so explain must not say it fits now (a new user saw "It fits now" beside "0/3 pods placeable together")."""
    s = scheduler([node("a1", 8), node("a2", 8)])
    s.submit(gang("g", 3, 1, required=RACK))
    s.cycle()
    [view] = diagnose(s, TaskKey("ns/g")).flavors
    assert (view.gang_fits, view.fits_now, [n.admits for n in view.nodes]) == (False, False, [True, True])
