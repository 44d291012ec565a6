"""Invariants of the core under random clusters and random submit/cycle/finish/evict streams.

Each property drives a real :class:`Scheduler` and checks the cluster state and quota book
directly (recomputing them from the running placements), not only ``violations()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gputask.core import (
    GPU,
    GPU_MEMORY,
    Decision,
    Gpu,
    GpuRequest,
    Node,
    NodeName,
    QueueSpec,
    ResourceQuota,
    Scheduler,
    Task,
    TaskKey,
    make_policy,
)
from gputask.core.ledger import group_of

GIB = 1024  # MiB
GPU_SIZES_MIB = (8 * GIB, 16 * GIB, 24 * GIB, 80 * GIB)
PRODUCTS = ("NVIDIA-A10", "NVIDIA-H100")
QUEUES = ("qa", "qb", "qc")
PROPERTY = settings(max_examples=200, deadline=None)


@st.composite
def nodes(draw: st.DrawFn) -> list[Node]:
    """1-6 nodes of 1-8 GPUs of 8/16/24/80 GiB; a few GPUs unhealthy, a few nodes unschedulable."""
    out = []
    for n in range(draw(st.integers(1, 6))):
        product = draw(st.sampled_from(PRODUCTS))
        sizes = draw(st.lists(st.sampled_from(GPU_SIZES_MIB), min_size=1, max_size=8))
        healthy = draw(st.lists(st.booleans() | st.just(True), min_size=len(sizes), max_size=len(sizes)))
        gpus = tuple(
            Gpu(i, f"node-{n}-{i}", product, m, healthy=h) for i, (m, h) in enumerate(zip(sizes, healthy, strict=True))
        )
        schedulable = draw(st.sampled_from((True, True, True, False)))
        out.append(Node(NodeName(f"node-{n}"), gpus, schedulable=schedulable))
    return out


def quotas() -> st.SearchStrategy[ResourceQuota | None]:
    """None (unlimited) or a quota with optional borrowing and lending limits, in milli-GPU."""
    amount = st.integers(0, 16).map(lambda q: q * 250)  # small next to the cluster, so quota binds
    limited = st.builds(ResourceQuota, amount, st.none() | amount, st.none() | amount)
    return st.one_of(limited, limited, st.none())  # mostly limited: unlimited queues test little


@st.composite
def queue_specs(draw: st.DrawFn) -> list[QueueSpec]:
    """Three queues, all in one cohort or none in a cohort, with GPU and sometimes memory quotas."""
    cohort = draw(st.sampled_from((None, "org", "org")))
    specs = []
    for name in QUEUES:
        gpu = draw(quotas())
        memory = draw(st.none() | st.integers(0, 200).map(lambda g: ResourceQuota(g * GIB)))
        limits = {r: q for r, q in ((GPU, gpu), (GPU_MEMORY, memory)) if q is not None}
        strategy = draw(st.sampled_from(("BestEffortFIFO", "StrictFIFO")))
        specs.append(QueueSpec(name, cohort=cohort, strategy=strategy, quotas=limits))
    return specs


def requests() -> st.SearchStrategy[GpuRequest]:
    """Whole GPUs, MiB per GPU, or a fraction per GPU; 1-4 GPUs (sometimes 8); sometimes one product."""
    count = st.integers(1, 4) | st.just(8)
    products = st.sampled_from((frozenset(), frozenset(), frozenset({"NVIDIA-H100"})))
    memory = st.sampled_from((1, 4, 8, 12, 20, 40, 79)).map(lambda g: g * GIB) | st.integers(1, 81 * GIB)
    groups = st.sampled_from(("", "", "MPS", "namespace b"))
    return st.one_of(
        st.builds(GpuRequest, count, products=products),
        st.builds(GpuRequest, count, memory_mib=memory, products=products, share_group=groups),
        st.builds(GpuRequest, count, fraction_milli=st.integers(1, 1000), products=products, share_group=groups),
    )


Op = tuple[str, Any]
"""(kind, argument): submit (request, queue, priority), cycle None, or an index for the others."""

submit = st.tuples(st.just("submit"), st.tuples(requests(), st.sampled_from(QUEUES), st.integers(0, 2)))
churn = st.one_of(
    st.tuples(st.just("cycle"), st.none()),
    st.tuples(st.just("finish"), st.integers(0, 1000)),
    st.tuples(st.just("requeue"), st.integers(0, 1000)),
)


@st.composite
def streams(draw: st.DrawFn) -> list[Op]:
    """Rounds of a few submissions, a cycle, then some churn (cycles, finishes, requeues).

    Built in rounds rather than as one flat list so that most examples fill the cluster and
    quota before they churn it (a flat list of ops is mostly short and mostly idle).
    """
    out: list[Op] = []
    for _ in range(draw(st.integers(1, 6))):
        out += draw(st.lists(submit, min_size=1, max_size=8))
        out.append(("cycle", None))
        out += draw(st.lists(churn, max_size=4))
    return out


@dataclass(frozen=True)
class Scenario:
    """A cluster, its queues, a placement policy and a stream of operations."""

    nodes: list[Node]
    queues: list[QueueSpec]
    policy: str
    ops: list[Op]


scenarios = st.builds(
    Scenario,
    nodes(),
    queue_specs(),
    st.sampled_from(("bestfit", "firstfit", "random")),
    streams(),
)


@dataclass
class Run:
    """A scheduler after a scenario, with what was submitted, finished and decided."""

    scheduler: Scheduler
    submitted: list[TaskKey] = field(default_factory=list)
    finished: set[TaskKey] = field(default_factory=set)
    decisions: list[list[Decision]] = field(default_factory=list)


def simulate(scenario: Scenario, check: Callable[[Run], None] = lambda run: None) -> Run:
    """Apply the scenario's operations in order, calling ``check`` after each, then a final cycle."""
    run = Run(Scheduler(policy=make_policy(scenario.policy), nodes=scenario.nodes))
    for spec in scenario.queues:
        run.scheduler.set_queue(spec)
    for kind, arg in scenario.ops:
        _apply(run, kind, arg)
        check(run)
    run.decisions.append(run.scheduler.cycle())
    check(run)
    return run


def _apply(run: Run, kind: str, arg: Any) -> None:
    s = run.scheduler
    if kind == "submit":
        request, queue, priority = arg
        key = TaskKey(f"ns/t{len(run.submitted)}")
        s.submit(Task(key, queue, request, priority=priority, created=float(len(run.submitted))))
        run.submitted.append(key)
    elif kind == "cycle":
        run.decisions.append(s.cycle(float(len(run.decisions))))
    elif kind == "finish":
        alive = [k for k in run.submitted if k not in run.finished]
        if alive:
            key = alive[arg % len(alive)]
            s.finish(key)
            run.finished.add(key)
    else:  # requeue a running task (an eviction, or an admission undone)
        running = sorted(s.running)
        if running:
            key = running[arg % len(running)]
            s.requeue(key)


def held_mib(s: Scheduler) -> dict[tuple[str, int], int]:
    """MiB per (node, GPU index) recomputed from the running tasks' placements."""
    out: dict[tuple[str, int], int] = {}
    for key in s.running:
        placement = s.placement_of(key)
        assert placement is not None
        for pod in placement.pods:
            for slot in pod.gpus:
                out[pod.node, slot.index] = out.get((pod.node, slot.index), 0) + slot.memory_mib
    return out


def capacity_problems(s: Scheduler) -> list[str]:
    """GPUs whose reserved MiB exceed their memory or disagree with the running placements."""
    held = held_mib(s)
    problems = []
    for state in s.cluster:
        for pos, gpu in enumerate(state.node.gpus):
            reserved = state.reserved_mib[pos]
            if reserved > gpu.memory_mib or reserved != held.get((state.name, gpu.index), 0):
                problems.append(f"{state.name}/{gpu.index}: {reserved} reserved, {gpu.memory_mib} MiB")
    return problems


def exclusivity_problems(s: Scheduler) -> list[str]:
    """GPUs held by an exclusive task together with any other task, or with a wrong exclusive flag."""
    holders: dict[tuple[str, int], list[Task]] = {}
    for run in s.running.values():
        for pod in run.placement.pods:
            for slot in pod.gpus:
                holders.setdefault((pod.node, slot.index), []).append(run.task)
    problems = []
    for state in s.cluster:
        for pos, gpu in enumerate(state.node.gpus):
            tasks = holders.get((state.name, gpu.index), [])
            exclusive = any(t.request.exclusive for t in tasks)
            if (exclusive and len(tasks) > 1) or state.exclusive[pos] != exclusive:
                problems.append(f"{state.name}/{gpu.index}: {[t.key for t in tasks]}, flag {state.exclusive[pos]}")
            groups = {t.request.share_group for t in tasks if not t.request.exclusive}
            if len(groups) > 1 or set(state.groups[pos]) != groups:
                problems.append(f"{state.name}/{gpu.index}: share groups {sorted(groups)}, counted {state.groups[pos]}")
    return problems


def quota_problems(s: Scheduler) -> list[str]:
    """Usage unlike the running tasks' sum, or beyond nominal, nominal+borrowingLimit or the cohort."""
    expected: dict[str, dict[str, int]] = {}
    for run in s.running.values():
        for resource, amount in run.usage.items():
            by_queue = expected.setdefault(run.task.queue, {})
            by_queue[resource] = by_queue.get(resource, 0) + amount
    problems = []
    cohort_used: dict[str, int] = {}
    cohort_nominal: dict[str, int] = {}
    for name, spec in s.quotas.specs.items():
        used = s.quotas.usage.get(name, {})
        for resource in (GPU, GPU_MEMORY):
            if used.get(resource, 0) != expected.get(name, {}).get(resource, 0):
                problems.append(f"{name} {resource}: usage {used.get(resource, 0)} != running tasks")
        for resource, quota in spec.quotas.items():
            amount = used.get(resource, 0)
            cap = quota.nominal if spec.cohort is None else None
            if spec.cohort is not None and quota.borrowing_limit is not None:
                cap = quota.nominal + quota.borrowing_limit
            if cap is not None and amount > cap:
                problems.append(f"{name} {resource}: {amount} > {cap}")
            if spec.cohort is not None:
                cohort_used[resource] = cohort_used.get(resource, 0) + amount
                cohort_nominal[resource] = cohort_nominal.get(resource, 0) + quota.nominal
    for resource, amount in cohort_used.items():
        if amount > cohort_nominal[resource]:
            problems.append(f"cohort {resource}: {amount} > {cohort_nominal[resource]} nominal in all")
    return problems


def placement_problems(s: Scheduler) -> list[str]:
    """Placements not on one known node, with repeated GPUs, the wrong count, MiB, uuid or product."""
    problems = []
    for key, run in s.running.items():
        placement, request = run.placement.only(), run.task.request  # these tasks are one pod each
        gpus = {g.index: g for g in s.cluster.node(placement.node).node.gpus}
        indices = [slot.index for slot in placement.gpus]
        ok = len(indices) == request.count == len(set(indices)) and all(
            slot.index in gpus
            and slot.uuid == gpus[slot.index].uuid
            and slot.memory_mib == request.mib_on(gpus[slot.index])
            and request.allows(gpus[slot.index].product)
            for slot in placement.gpus
        )
        reserved_on = [n for n in s.cluster if key in n.tasks]
        if not ok or [n.name for n in reserved_on] != [placement.node]:
            problems.append(f"{key}: {placement} for {request}, reserved on {[n.name for n in reserved_on]}")
    by_queue = {(q, k) for q, entries in s.ledger.by_queue.items() for k in entries}
    if by_queue != {(e.task.queue, k) for k, e in s.running.items()}:  # the ledger's index of running by queue
        problems.append(f"ledger.by_queue {sorted(by_queue)} is not running by queue")
    return problems


def tally_problems(s: Scheduler) -> list[str]:
    """The ledger's tallies and the queue's pending counts unlike those recomputed from every task."""
    tallies: dict[tuple[object, ...], list[Any]] = {}
    for entries, running in ((s.running.values(), 1), (s.nominated.values(), 0)):
        for entry in entries:
            tally = tallies.setdefault(group_of(entry.task), [0, 0, {}])
            tally[0 if running else 1] += 1
            for key, amount in entry.usage.items():
                tally[2][key] = tally[2].get(key, 0) + amount
    kept = {g: [t.running, t.nominated, {k: v for k, v in t.usage.items() if v}] for g, t in s.ledger.tallies.items()}
    pending: dict[tuple[str, str, str | None], int] = {}
    for task in s.pending:
        group = (task.queue, task.namespace, task.local_queue)
        pending[group] = pending.get(group, 0) + 1
    problems = [] if kept == tallies else [f"tallies {kept} != {tallies}"]
    return problems + ([] if pending == s.pending.count_by_group() else [f"pending groups {pending}"])


def checker(find: Callable[[Scheduler], list[str]]) -> Callable[[Run], None]:
    """A step check that fails with the problems ``find`` reports."""

    def check(run: Run) -> None:
        assert find(run.scheduler) == []

    return check


@PROPERTY
@given(scenarios)
def test_no_gpu_ever_holds_more_mib_than_it_has(scenario: Scenario) -> None:
    """After every step, each GPU's reserved MiB equals its running placements and fits its memory."""
    simulate(scenario, checker(capacity_problems))


@PROPERTY
@given(scenarios)
def test_queue_report_tallies_always_equal_a_count_of_every_task(scenario: Scenario) -> None:
    """After every step, admitted tasks and their charges per queue, namespace, local queue and flavor, and
    pending tasks per queue, namespace and local queue, as kept, equal a count over every task."""
    simulate(scenario, checker(tally_problems))


@PROPERTY
@given(scenarios)
def test_an_exclusive_gpu_is_never_shared(scenario: Scenario) -> None:
    """After every step, a GPU held by a whole-GPU task holds nothing else, and only then is flagged; the shared
    tasks on a GPU are of one share group, the one counted."""
    simulate(scenario, checker(exclusivity_problems))


@PROPERTY
@given(scenarios)
def test_quota_usage_never_exceeds_what_the_queue_and_cohort_allow(scenario: Scenario) -> None:
    """Usage is the running tasks' sum, within nominal, nominal+borrowingLimit and the cohort total."""
    simulate(scenario, checker(quota_problems))


@PROPERTY
@given(scenarios)
def test_every_placement_is_the_requested_count_of_distinct_gpus_on_one_node(scenario: Scenario) -> None:
    """Each running task holds its count of distinct, matching GPUs on the one node it is reserved on."""
    simulate(scenario, checker(placement_problems))


@PROPERTY
@given(scenarios)
def test_the_same_input_gives_the_same_decisions(scenario: Scenario) -> None:
    """Two fresh schedulers fed the same scenario decide identically and end with the same placements."""
    first, second = simulate(scenario), simulate(scenario)
    assert (first.decisions, first.scheduler.cluster.reservations().keys()) == (
        second.decisions,
        second.scheduler.cluster.reservations().keys(),
    )


def lost_or_duplicated(run: Run) -> list[tuple[TaskKey, int]]:
    """Submitted tasks that are not in exactly one of pending, running and finished."""
    s = run.scheduler
    places = {k: (k in s.pending) + (k in s.running) + (k in run.finished) for k in run.submitted}
    strangers = set(s.running) - set(run.submitted)
    return sorted((k, n) for k, n in places.items() if n != 1) + sorted((k, -1) for k in strangers)


@PROPERTY
@given(scenarios)
def test_no_task_is_ever_lost(scenario: Scenario) -> None:
    """After every step, each submitted task is exactly one of pending, running or finished."""

    def check(run: Run) -> None:
        assert lost_or_duplicated(run) == []

    simulate(scenario, check)


def first_cycle(s: Scheduler, policy: str, tasks: list[Task]) -> list[Decision]:
    """Submit ``tasks`` to ``s`` with a fresh policy and run one cycle."""
    s.policy = make_policy(policy)
    for task in tasks:
        s.submit(task)
    return s.cycle()


@PROPERTY
@given(scenarios)
def test_finishing_everything_releases_every_gpu_and_all_quota(scenario: Scenario) -> None:
    """After all tasks finish nothing is reserved or charged, and the cluster decides as a fresh one."""
    run = simulate(scenario)
    s = run.scheduler
    tasks = [t for t in (*s.pending, *(r.task for r in s.running.values())) if t.key not in run.finished]
    for key in run.submitted:
        s.finish(key)
    released = (
        sorted((n.name, list(n.reserved_mib), list(n.exclusive)) for n in s.cluster),
        {q: {r: a for r, a in u.items() if a} for q, u in s.quotas.usage.items()},
        dict(s.cluster.reservations()),
        len(s.pending),
        dict(s.running),
    )
    fresh = simulate(Scenario(scenario.nodes, scenario.queues, scenario.policy, [])).scheduler
    tasks.sort(key=lambda t: t.key)
    assert (released, first_cycle(s, scenario.policy, tasks)) == (
        (
            sorted((n.name, [0] * len(n.gpus), [False] * len(n.gpus)) for n in scenario.nodes),
            {q.name: {} for q in scenario.queues},
            {},
            0,
            {},
        ),
        first_cycle(fresh, scenario.policy, tasks),
    )
