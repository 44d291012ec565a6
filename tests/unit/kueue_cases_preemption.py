"""Kueue's classic-preemption table, ported at GPU granularity (see ``kueue_tables``).

Ports the cases of ``TestPreemption`` in kubernetes-sigs/kueue
``pkg/scheduler/preemption/preemption_test.go`` (stored versions cd6c1d08a30a and 014d9490c7f3, whose
``TestPreemption`` tables are identical) that map exactly: one ``cpu`` unit is one GPU; every case runs
on Kueue's ``defaultClusterQueues``; ``ReserveQuotaAt(..., now)`` is ``admitted=0.0`` and
``now.Add(time.Second)`` is ``admitted=1.0``; ``Creation(t)`` is ``created`` in seconds from ``now``.
``want`` is Kueue's ``wantPreempted`` (names only). Cases that cannot be mapped exactly are listed in
:data:`SKIPPED` with the reason.

``defaultClusterQueues`` also give ``standalone`` memory quotas on the ``alpha``/``beta`` flavors and
``c1``, ``c2``, ``d1``, ``d2``, ``l1``, ``a``, ``b``, ``c`` a ``memory`` quota beside ``cpu``. No ported
case's workloads request memory (except one, where memory is always proportional to cpu; see there),
so those quotas never bind and are left out.
"""

from __future__ import annotations

from kueue_tables import PreemptionCase, Q, W

SOURCE = "preemption_test.go TestPreemption"

DEFAULT_CLUSTER_QUEUES = (
    Q("standalone", 6, within="LowerPriority"),
    Q("c1", 6, cohort="cohort", borrowing=6, within="LowerPriority", reclaim="LowerPriority"),
    Q("c2", 6, cohort="cohort", borrowing=6, within="Never", reclaim="Any"),
    Q("d1", 6, cohort="cohort-no-limits", within="LowerPriority", reclaim="LowerPriority"),
    Q("d2", 6, cohort="cohort-no-limits", within="Never", reclaim="Any"),
    Q("l1", 6, cohort="legion", borrowing=12, within="LowerPriority", reclaim="LowerPriority"),
    Q("preventStarvation", 6, within="LowerOrNewerEqualPriority"),
    Q(
        "a_standard",
        1,
        cohort="with_shared_cq",
        borrowing=12,
        within="Never",
        reclaim="LowerPriority",
        borrow="LowerPriority",
        threshold=0,
    ),
    Q(
        "b_standard",
        1,
        cohort="with_shared_cq",
        borrowing=12,
        within="LowerPriority",
        reclaim="Any",
        borrow="LowerPriority",
        threshold=0,
    ),
    Q(
        "a_best_effort",
        1,
        cohort="with_shared_cq",
        borrowing=12,
        within="Never",
        reclaim="LowerPriority",
        borrow="LowerPriority",
        threshold=0,
    ),
    Q(
        "b_best_effort",
        0,
        cohort="with_shared_cq",
        borrowing=13,
        within="Never",
        reclaim="LowerPriority",
        borrow="LowerPriority",
        threshold=0,
    ),
    Q("shared", 10, cohort="with_shared_cq"),
    Q("lend1", 6, cohort="cohort-lend", lending=4, within="LowerPriority", reclaim="LowerPriority"),
    Q("lend2", 6, cohort="cohort-lend", lending=2, within="LowerPriority", reclaim="LowerPriority"),
    Q("a", 2, cohort="cohort-three", within="LowerPriority", reclaim="Any"),
    Q("b", 2, cohort="cohort-three"),
    Q("c", 2, cohort="cohort-three"),
)
"""Kueue's ``defaultClusterQueues`` (cpu quotas only; see the module doc)."""


def _case(name: str, admitted: tuple[W, ...], incoming: W, *want: str) -> PreemptionCase:
    return PreemptionCase(
        source=SOURCE,
        name=name,
        queues=DEFAULT_CLUSTER_QUEUES,
        admitted=admitted,
        incoming=incoming,
        want=frozenset(want),
    )


# The cohort-three cases share their admitted workloads.
_A1_A2_A3_B1_B2_B3 = (
    W("a1", "a", 1, priority=-2),
    W("a2", "a", 1, priority=-2),
    W("a3", "a", 1, priority=-1),
    W("b1", "b", 1),
    W("b2", "b", 1),
    W("b3", "b", 1),
)

CASES: tuple[PreemptionCase, ...] = (
    _case(
        "preempt lowest priority",
        (
            W("low", "standalone", 2, priority=-1),
            W("mid", "standalone", 2),
            W("high", "standalone", 2, priority=1),
        ),
        W("in", "standalone", 2, priority=1),
        "low",
    ),
    _case(
        "preempt multiple",
        (
            W("low", "standalone", 2, priority=-1),
            W("mid", "standalone", 2),
            W("high", "standalone", 2, priority=1),
        ),
        W("in", "standalone", 3, priority=1),
        "low",
        "mid",
    ),
    _case(
        "no preemption for low priority",
        (
            W("low", "standalone", 3, priority=-1),
            W("mid", "standalone", 3),
        ),
        W("in", "standalone", 1, priority=-1),
    ),
    _case(
        "not enough low priority workloads",
        (
            W("low", "standalone", 3, priority=-1),
            W("mid", "standalone", 3),
        ),
        W("in", "standalone", 4),
    ),
    _case(
        "some free quota, preempt low priority",
        (
            W("low", "standalone", 1, priority=-1),
            W("mid", "standalone", 1),
            W("high", "standalone", 3, priority=1),
        ),
        W("in", "standalone", 2, priority=1),
        "low",
    ),
    _case(
        "minimal set excludes low priority",
        (
            W("low", "standalone", 1, priority=-1),
            W("mid", "standalone", 2),
            W("high", "standalone", 3, priority=1),
        ),
        W("in", "standalone", 2, priority=1),
        "mid",
    ),
    _case(
        "reclaim quota from borrower",
        (
            W("c1-low", "c1", 3, priority=-1),
            W("c2-mid", "c2", 3),
            W("c2-high", "c2", 6, priority=1),
        ),
        W("in", "c1", 3, priority=1),
        "c2-mid",
    ),
    # The incoming fits quota as it is (c1 would borrow 2 of the cohort's 4 unused); Kueue's table
    # forces mode Preempt, gputask admits it directly: either way nothing is preempted.
    _case(
        "no workloads borrowing",
        (
            W("c1-high", "c1", 4, priority=1),
            W("c2-low-1", "c2", 4, priority=-1),
        ),
        W("in", "c1", 4, priority=1),
    ),
    _case(
        "not enough workloads borrowing",
        (
            W("c1-high", "c1", 4, priority=1),
            W("c2-low-1", "c2", 4, priority=-1),
            W("c2-low-2", "c2", 4, priority=-1),
        ),
        W("in", "c1", 4, priority=1),
    ),
    _case(
        "preempting locally and borrowing same resource in cohort",
        (
            W("c1-med", "c1", 4),
            W("c1-low", "c1", 4, priority=-1),
            W("c2-low-1", "c2", 4, priority=-1),
        ),
        W("in", "c1", 4, priority=1),
        "c1-low",
    ),
    _case(
        "preempting locally and borrowing same resource in cohort; no borrowing limit in the cohort",
        (
            W("d1-med", "d1", 4),
            W("d1-low", "d1", 4, priority=-1),
            W("d2-low-1", "d2", 4, priority=-1),
        ),
        W("in", "d1", 4, priority=1),
        "d1-low",
    ),
    _case(
        "preempting locally and not borrowing same resource in 1-queue cohort",
        (
            W("l1-med", "l1", 4),
            W("l1-low", "l1", 2, priority=-1),
        ),
        W("in", "l1", 4, priority=1),
        "l1-med",
    ),
    _case(
        "do not reclaim borrowed quota from same priority for withinCohort=ReclaimFromLowerPriority",
        (
            W("c1", "c1", 2),
            W("c2-1", "c2", 4),
            W("c2-2", "c2", 4),
        ),
        W("in", "c1", 4),
    ),
    _case(
        "reclaim borrowed quota from same priority for withinCohort=ReclaimFromAny",
        (
            W("c1-1", "c1", 4),
            W("c1-2", "c1", 4, priority=1),
            W("c2", "c2", 2),
        ),
        W("in", "c2", 4),
        "c1-1",
    ),
    _case(
        "preempt from all ClusterQueues in cohort",
        (
            W("c1-low", "c1", 3, priority=-1),
            W("c1-mid", "c1", 2),
            W("c2-low", "c2", 3, priority=-1),
            W("c2-mid", "c2", 4),
        ),
        W("in", "c1", 4),
        "c1-low",
        "c2-low",
    ),
    # The incoming fits quota as it is (c2 would borrow 1 of the cohort's 9 unused); Kueue's table
    # forces mode Preempt, gputask admits it directly: either way nothing is preempted.
    _case(
        "can't preempt workloads in ClusterQueue for withinClusterQueue=Never",
        (W("c2-low", "c2", 3, priority=-1),),
        W("in", "c2", 4, priority=1),
    ),
    # wl1 has no Creation (Kueue's zero time); it is of higher priority, so no candidate either way.
    _case(
        "preempt newer workloads with the same priority",
        (
            W("wl1", "preventStarvation", 2, priority=2),
            W("wl2", "preventStarvation", 2, priority=1, admitted=1.0, created=0.0),
            W("wl3", "preventStarvation", 2, priority=1, created=0.0),
        ),
        W("in", "preventStarvation", 2, priority=1, created=-15.0),
        "wl2",
    ),
    _case(
        "use BorrowWithinCohort; allow preempting a lower-priority workload from another ClusterQueue while borrowing",
        (
            W("a_best_effort_low", "a_best_effort", 10, priority=-1),
            W("b_best_effort_low", "b_best_effort", 1, priority=-1),
        ),
        W("in", "a_standard", 10),
        "a_best_effort_low",
    ),
    _case(
        "use BorrowWithinCohort; don't allow preempting a lower-priority workload with priority above "
        "MaxPriorityThreshold, if borrowing is required even after the preemption",
        (W("b_standard", "b_standard", 10, priority=1),),
        W("in", "a_standard", 10, priority=2),
    ),
    _case(
        "use BorrowWithinCohort; allow preempting a lower-priority workload with priority above "
        "MaxPriorityThreshold, if borrowing is not required after the preemption",
        (W("b_standard", "b_standard", 13, priority=1),),
        W("in", "a_standard", 1, priority=2),
        "b_standard",
    ),
    _case(
        "use BorrowWithinCohort; don't allow for preemption of lower-priority workload from the same ClusterQueue",
        (W("a_standard", "a_standard", 13, priority=1),),
        W("in", "a_standard", 1, priority=2),
    ),
    _case(
        "use BorrowWithinCohort; only preempt from CQ if no workloads below threshold and already above nominal",
        (
            W("a_standard_1", "a_standard", 10, priority=1),
            W("a_standard_2", "a_standard", 1, priority=1),
            W("b_standard_1", "b_standard", 1, priority=1),
            W("b_standard_2", "b_standard", 1, priority=2),
        ),
        W("in", "b_standard", 1, priority=3),
        "b_standard_1",
    ),
    _case(
        "use BorrowWithinCohort; preempt from CQ and from other CQs with workloads below threshold",
        (
            W("b_standard_high", "b_standard", 10, priority=2),
            W("b_standard_mid", "b_standard", 1, priority=1),
            W("a_best_effort_low", "a_best_effort", 1, priority=-1),
            W("a_best_effort_lower", "a_best_effort", 1, priority=-2),
        ),
        W("in", "b_standard", 2, priority=2),
        "b_standard_mid",
        "a_best_effort_lower",
    ),
    _case(
        "reclaim quota from lender",
        (
            W("lend1-low", "lend1", 3, priority=-1),
            W("lend2-mid", "lend2", 3),
            W("lend2-high", "lend2", 4, priority=1),
        ),
        W("in", "lend1", 3, priority=1),
        "lend2-mid",
    ),
    _case(
        "preempt from all ClusterQueues in cohort-lend",
        (
            W("lend1-low", "lend1", 3, priority=-1),
            W("lend1-mid", "lend1", 2),
            W("lend2-low", "lend2", 3, priority=-1),
            W("lend2-mid", "lend2", 4),
        ),
        W("in", "lend1", 4),
        "lend1-low",
        "lend2-low",
    ),
    _case(
        "cannot preempt from other ClusterQueues if exceeds requestable quota including lending limit",
        (W("lend2-low", "lend2", 10, priority=-1),),
        W("in", "lend1", 9),
    ),
    _case(
        "preemptions from cq when target queue is exhausted for the single requested resource",
        _A1_A2_A3_B1_B2_B3,
        W("in", "a", 2),
        "a1",
        "a2",
    ),
    # Every workload requests memory equal to its cpu (1:1, the incoming 2 and 2) and queues a, b, c
    # have equal cpu and memory quotas (2 and 2): memory binds exactly when cpu does, so the outcome
    # cannot depend on it and the case is ported with cpu only.
    _case(
        "preemptions from cq when target queue is exhausted for two requested resources",
        _A1_A2_A3_B1_B2_B3,
        W("in", "a", 2),
        "a1",
        "a2",
    ),
    _case(
        "allow preemption from other cluster queues if target cq is not exhausted for the requested resource",
        (
            W("a1", "a", 1, priority=-1),
            W("b1", "b", 1),
            W("b2", "b", 1),
            W("b3", "b", 1),
            W("b4", "b", 1),
            W("b5", "b", 1, priority=-1),
        ),
        W("in", "a", 2),
        "a1",
        "b5",
    ),
)

SKIPPED: dict[str, str] = {
    "only preempt workloads using the chosen flavor": (
        "several flavors: memory on the alpha and beta flavors, the incoming's cpu in mode Fit"
    ),
    "reclaim quota if workload requests 0 resources for a resource at nominal quota": (
        "cpu and memory in different ratios (c1-low 3 cpu + 3Gi, others cpu only, the incoming memory 0); "
        "its cpu-only part is 'reclaim quota from borrower'"
    ),
    "preempting locally and borrowing other resources in cohort, without cohort candidates": (
        "cpu and memory in different ratios: only the incoming requests memory (5Gi, borrowing it)"
    ),
    "preempting locally and borrowing other resources in cohort, with cohort candidates": (
        "cpu and memory in different ratios: only the incoming requests memory (5Gi), and its borrowing "
        "of memory decides the answer"
    ),
    "each podset preempts a different flavor": "multiple podsets, each on its own memory flavor (alpha, beta)",
    "preemptions from cq when target queue is exhausted for one requested resource, but not the other": (
        "cpu and memory in different ratios: only the incoming requests memory (2)"
    ),
    "long range preemption": "hierarchical cohorts (kueue.Cohort objects with a parent)",
}
