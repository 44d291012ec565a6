"""The cycle (``core/cycle.py``) on its own parts: exact decisions from a hand-made cache, a cycle skipped when
neither generation moved (and walked again when either did), and preemption plans that leave the cache as it was,
byte for byte."""

from __future__ import annotations

from test_core_preemption import cq
from test_core_scheduler import GIB, node, over_quota, placed, task, usage

from gputask.core import Admit, Pending, Scheduler, Task, TaskKey, make_policy
from gputask.core.budget import MemoryBudget
from gputask.core.cache import Cache
from gputask.core.cycle import Cycle
from gputask.core.decisions import TRACKED_POSITIONS
from gputask.core.flavors import Flavor
from gputask.core.preemption import DEFAULT_STRATEGIES, strategies_of
from gputask.core.queueing import Queues
from gputask.core.transitions import Transitions


def parts(cache: Cache) -> tuple[Queues, Cycle]:
    """A queue manager and a best-fit cycle over ``cache``, wired as the scheduler wires them."""
    queues = Queues()
    moves = Transitions(cache, queues, MemoryBudget())
    cycle = Cycle(cache, queues, moves, make_policy("bestfit"), strategies_of(DEFAULT_STRATEGIES), TRACKED_POSITIONS)
    return queues, cycle


def test_a_walk_over_a_hand_made_cache_returns_exact_decisions_and_assumes_its_admission() -> None:
    """On one 16 GiB GPU and a queue of one GPU of quota, the first of two whole-GPU tasks is admitted (and
    assumed in the cache at once), the second waits for quota at the head of its queue."""
    cache = Cache(grace_s=60.0)
    cache.set_queue(cq("q", gpus=1))
    cache.set_node(node("n1", 16, 16))
    queues, cycle = parts(cache)
    a, b = task("a"), task("b", created=1.0)
    queues.submit(a)
    queues.submit(b)
    decisions = cycle.walk(0.0)
    assert decisions == [Admit(a, placed("n1", (0, 16 * GIB)), usage(1000, 16 * GIB)), over_quota(b, "q")]
    assert [d.position for d in decisions if isinstance(d, Pending)] == [0]
    assert (cache.placement_of(a.key), cache.quotas.usage["q"], list(queues.pending.keys())) == (
        placed("n1", (0, 16 * GIB)), usage(1000, 16 * GIB), [b.key])
    assert cycle.walk(1.0) == []  # b's wait is said once


def waiting() -> Scheduler:
    """A scheduler whose last cycle changed nothing: task ns/big waits for a GPU no node has."""
    s = Scheduler(nodes=[node("n1", 16)])
    s.set_queue(cq("q"))
    s.submit(task("big", memory_gib=40))
    assert [type(d) for d in s.cycle(0.0)] == [Pending]
    return s


def test_a_cycle_nothing_changed_for_is_skipped_by_the_generations() -> None:
    """After a cycle that changed nothing, the next is skipped while neither ``Cache.generation`` nor
    ``Queues.generation`` moves; a change in the cache (a flavor no queue uses) or in the queues (a pending
    task submitted again as it was) makes the next cycle walk, and it finds nothing new to say."""
    s = waiting()
    assert (s.cycle(1.0), s.stats.mode) == ([], "skipped")
    s.set_flavor(Flavor("unused"))  # moves the cache's generation only
    assert (s.cycle(2.0), s.stats.mode) == ([], "full")
    assert (s.cycle(3.0), s.stats.mode) == ([], "skipped")
    s.submit(task("big", memory_gib=40))  # pending already: replaced, the queues' generation only
    assert (s.cycle(4.0), s.stats.mode) == ([], "full")
    assert (s.cycle(5.0), s.stats.mode, s.stats.skipped) == ([], "skipped", 3)


def test_a_cycle_after_a_change_that_admits_is_never_skipped() -> None:
    """A node added (the cache's generation) lets the waiting task in at the very next cycle."""
    s = waiting()
    s.set_node(node("n2", 48))
    assert s.cycle(1.0) == [Admit(task("big", memory_gib=40), placed("n2", (0, 40 * GIB)), usage(834, 40 * GIB))]


def books(cache: Cache) -> tuple[object, ...]:
    """Everything a preemption trial could touch, in order: reservations (dict order), each node's tasks (dict
    order), reserved MiB, exclusive and share-group holds, host use, generations; quota usage; the ledger."""
    nodes = [
        (s.name, list(s.tasks.items()), list(s.reserved_mib), list(s.exclusive), [sorted(g.items()) for g in s.groups],
         s.cpu_used, s.memory_used_mib, s.ephemeral_used_mib, s.pods_used, s.generation)
        for s in cache.cluster
    ]
    reservations = [(k, r.task, r.placement) for k, r in cache.cluster.reservations().items()]
    usage_ = [(q, sorted(u.items())) for q, u in cache.quotas.usage.items()]
    ledger = (list(cache.ledger.running), list(cache.ledger.nominated), cache.ledger.version)
    return nodes, reservations, usage_, ledger, cache.cluster.generation, cache.generation


def crowded() -> tuple[Cache, Cycle, list[Task]]:
    """One 24 GiB GPU holding, in this order, low1 and low2 (priority 0, 8 GiB each) then top (priority 20, 8
    GiB); queue q preempts lower priorities."""
    cache = Cache(grace_s=60.0)
    cache.set_queue(cq("q", gpus=8, within="LowerPriority"))
    cache.set_node(node("n1", 24))
    running = [task("low1", memory_gib=8), task("low2", memory_gib=8, created=1.0),
               task("top", memory_gib=8, priority=20, created=2.0)]
    for t in running:
        cache.admit(t, placed("n1", (0, 8 * GIB)), 0.0)
    return cache, parts(cache)[1], running


def test_a_preemption_plan_leaves_the_cache_byte_for_byte_as_it_was() -> None:
    """Planning (victims released and put back, reprieves) runs on a snapshot: the cache's reservations, each
    node's tasks in their order, quota usage and every generation are as before, whether a plan is found or not."""
    cache, cycle, (low1, low2, _) = crowded()
    before = books(cache)
    plan = cycle.plan(task("mid", memory_gib=8, priority=10, created=3.0))
    assert plan is not None and [v.task for v in plan.victims] == [low2]  # one victim is enough: the newer one
    assert books(cache) == before
    assert cycle.plan(task("mid", memory_gib=16, priority=10, created=3.0)) is not None
    assert books(cache) == before
    assert cycle.plan(task("huge", memory_gib=24, priority=10, created=3.0)) is None  # top stays: never room
    assert books(cache) == before
    assert cycle.preemption_plan(task("huge", memory_gib=24, priority=10, created=3.0)) is None
    assert books(cache) == before


def test_the_cycle_that_acts_on_a_plan_nominates_the_preemptor_and_evicts_only_the_victims() -> None:
    """The walk books what the plan found: the victims requeued and their GPUs held for their departing pods, the
    preemptor nominated on their room, the untouched task still running."""
    cache, cycle, (low1, low2, top) = crowded()
    mid = task("mid", memory_gib=8, priority=10, created=3.0)
    cycle.queues.submit(mid)
    decisions = cycle.walk(1.0)
    assert [(type(d).__name__, d.task.key) for d in decisions] == [("Evict", low2.key), ("Pending", mid.key)]
    assert (sorted(cache.ledger.running), list(cache.ledger.nominated), list(cycle.queues.pending.keys())) == (
        [low1.key, top.key], [mid.key], [low2.key])
    assert cache.ledger.nominated[mid.key].waiting_for == {TaskKey("ns/low2")}
