"""The cache (``core/cache.py``): every change bumps ``Cache.generation``, every read leaves it; what admit
(assume), nominate, promote and release book and give back, exactly."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_core_scheduler import GIB, node, placed, task, usage

from gputask.core import QueueSpec, TaskKey
from gputask.core.cache import Cache
from gputask.core.flavors import Flavor
from gputask.core.ledger import Entry

Step = Callable[[Cache], object]


def cache() -> Cache:
    """Queue q (no quota), nodes n1 (two 16 GiB GPUs) and n2 (one), and ns/a running on n1 GPU 0 with 4 GiB."""
    c = Cache(grace_s=60.0)
    c.set_queue(QueueSpec("q"))
    c.set_node(node("n1", 16, 16))
    c.set_node(node("n2", 16))
    c.admit(task("a", memory_gib=4), placed("n1", (0, 4 * GIB)), 0.0)
    return c


def _nominated(c: Cache) -> None:
    c.nominate(task("p", memory_gib=8, priority=5), placed("n2", (0, 8 * GIB)), [TaskKey("ns/a")], 1.0)


def _revised(c: Cache) -> None:
    c.revise(TaskKey("ns/a"), task("a", memory_gib=6))


def _none(c: Cache) -> None:
    return None


CHANGES: dict[str, tuple[Step, Step]] = {  # name: (setup, the change measured)
    "set_queue": (_none, lambda c: c.set_queue(QueueSpec("other"))),
    "set_queue again, changed": (_none, lambda c: c.set_queue(QueueSpec("q", cohort="org"))),
    "remove_queue": (_none, lambda c: c.remove_queue("q")),
    "remove_queue invalid": (_none, lambda c: c.remove_queue("q", invalid="bad spec")),
    "set_flavor": (_none, lambda c: c.set_flavor(Flavor("a10"))),
    "remove_flavor": (lambda c: c.set_flavor(Flavor("a10")), lambda c: c.remove_flavor("a10")),
    "remove_flavor invalid": (_none, lambda c: c.remove_flavor("a10", invalid="is being deleted")),
    "set_node new": (_none, lambda c: c.set_node(node("n3", 8))),
    "set_node changed": (_none, lambda c: c.set_node(node("n2", 24))),
    "set_node loses a GPU under a task": (_none, lambda c: c.set_node(node("n1", 16, product="other"))),
    "node_ready NotReady": (_none, lambda c: c.node_ready(node("n2").name, False, 5.0)),
    "node_ready Ready again": (lambda c: c.node_ready(node("n2").name, False, 5.0),
                               lambda c: c.node_ready(node("n2").name, True, 6.0)),
    "node_failed": (_none, lambda c: c.node_failed(node("n2").name, "out-of-service")),
    "node_removed": (_none, lambda c: c.node_removed(node("n1").name)),
    "forget_node": (_none, lambda c: c.forget_node(node("n2").name)),
    "admit": (_none, lambda c: c.admit(task("b", memory_gib=4), placed("n2", (0, 4 * GIB)), 1.0)),
    "admit_placed": (_none, lambda c: c.admit_placed(task("b", memory_gib=4), placed("n2", (0, 4 * GIB)), 1.0)),
    "nominate": (_none, _nominated),
    "promote": (_nominated, lambda c: c.promote(TaskKey("ns/p"), 2.0)),
    "victim_gone": (_nominated, lambda c: c.victim_gone(TaskKey("ns/a"))),
    "restore": (_none, lambda c: c.restore(task("r", memory_gib=4), placed("n2", (0, 4 * GIB)), 0.0, charge=True)),
    "hold": (_none, lambda c: c.hold(TaskKey("ns/h"), placed("n2", (0, 4 * GIB)))),
    "release running": (_none, lambda c: c.release(TaskKey("ns/a"))),
    "release nominated": (_nominated, lambda c: c.release(TaskKey("ns/p"))),
    "release held": (lambda c: c.hold(TaskKey("ns/h"), placed("n2", (0, 4 * GIB))),
                     lambda c: c.release(TaskKey("ns/h"))),
    "revise": (_none, _revised),
    "forget_revision": (_revised, lambda c: c.forget_revision(TaskKey("ns/a"))),
    "set_reschedules": (_none, lambda c: c.set_reschedules(TaskKey("ns/a"), 2)),
    "count_failure": (_none, lambda c: c.count_failure(TaskKey("ns/a"))),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_every_change_bumps_the_generation(name: str) -> None:
    """Each change a cycle could read moves ``Cache.generation`` forward (the only way a skipped cycle learns of it)."""
    c = cache()
    setup, change = CHANGES[name]
    setup(c)
    before = c.generation
    change(c)
    assert c.generation > before


READS: dict[str, Step] = {
    "generation": lambda c: c.generation,
    "largest_gpu_mib": lambda c: c.largest_gpu_mib,
    "placement_of": lambda c: c.placement_of(TaskKey("ns/a")),
    "reschedules": lambda c: c.reschedules(TaskKey("ns/a")),
    "requeued_as": lambda c: c.requeued_as(c.ledger.running[TaskKey("ns/a")]),
    "flavor_of": lambda c: c.flavor_of(task("a", memory_gib=4), placed("n1", (0, 4 * GIB))),
    "ledger usage": lambda c: c.ledger.usage(placed("n2", (0, 4 * GIB))),
    "set_node the same node": lambda c: c.set_node(node("n2", 16)),
    "node_ready Ready while Ready": lambda c: c.node_ready(node("n2").name, True, 5.0),
    "release of what holds nothing": lambda c: c.release(TaskKey("ns/unknown")),
    "forget_revision of none": lambda c: c.forget_revision(TaskKey("ns/a")),
    "revise a task not placed": lambda c: c.revise(TaskKey("ns/unknown"), task("unknown")),
    "set_reschedules to the count it has": lambda c: c.set_reschedules(TaskKey("ns/a"), 0),
}


@pytest.mark.parametrize("name", list(READS))
def test_reads_and_changes_that_change_nothing_leave_the_generation(name: str) -> None:
    """A read, or an input that leaves everything as it was, keeps ``Cache.generation``: a cycle after it is
    skipped."""
    c = cache()
    before = c.generation
    READS[name](c)
    assert c.generation == before


def test_admit_assumes_at_once_and_release_gives_back_exactly() -> None:
    """An admission reserves its GPUs and charges its queue at once (Kueue's assume); its release gives back both,
    leaving the node and the queue as they were before it."""
    c = cache()
    n2 = c.cluster.node(node("n2").name)
    before = (list(n2.reserved_mib), dict(c.quotas.usage["q"]))
    b = task("b", memory_gib=4)
    entry = c.admit(b, placed("n2", (0, 4 * GIB)), 3.0)
    assert entry == Entry(b, placed("n2", (0, 4 * GIB)), usage(250, 4 * GIB), 3.0)
    assert (list(n2.reserved_mib), c.quotas.usage["q"], c.placement_of(b.key)) == (
        [4 * GIB], usage(500, 8 * GIB), placed("n2", (0, 4 * GIB)))
    assert c.release(b.key) == entry
    assert (list(n2.reserved_mib), dict(c.quotas.usage["q"]), c.placement_of(b.key)) == (*before, None)
    assert c.release(b.key) is None  # a second release holds nothing


def test_a_nomination_reserves_and_charges_and_is_promoted_once_its_victims_are_gone() -> None:
    """A nominated preemptor reserves its placement and charges its queue while it waits; the ledger names it
    ready only after ``victim_gone`` for each victim; ``promote`` makes it running from then on."""
    c = cache()
    _nominated(c)
    key = TaskKey("ns/p")
    assert (c.cluster.node(node("n2").name).reserved_mib, c.quotas.usage["q"], list(c.ledger.ready())) == (
        [8 * GIB], usage(750, 12 * GIB), [])
    assert c.placement_of(key) is None  # nominated, not running
    c.victim_gone(TaskKey("ns/a"))
    assert list(c.ledger.ready()) == [key]
    entry = c.promote(key, 9.0)
    assert (entry.admitted_at, c.placement_of(key), key in c.ledger.nominated) == (9.0, placed("n2", (0, 8 * GIB)),
                                                                                  False)
    assert c.quotas.usage["q"] == usage(750, 12 * GIB)  # promotion charges nothing more


def test_releasing_a_nomination_gives_back_its_reservation_and_charge() -> None:
    """A nominated preemptor released (its admission undone) leaves nothing reserved or charged for it."""
    c = cache()
    _nominated(c)
    released = c.release(TaskKey("ns/p"))
    assert isinstance(released, Entry) and released.waiting_for == {TaskKey("ns/a")}
    assert (c.cluster.node(node("n2").name).reserved_mib, c.quotas.usage["q"], dict(c.ledger.nominated)) == (
        [0], usage(250, 4 * GIB), {})
