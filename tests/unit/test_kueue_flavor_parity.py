"""Kueue's scheduler tables that need ResourceFlavors, ported at GPU granularity (see ``kueue_flavor_tables``).

Read at kubernetes-sigs/kueue ``pkg/scheduler/scheduler_test.go`` 005e97cfe1cc (v1beta1 API, ``wantPreempted``
and ``wantAssignments``) and a later v1beta2 version of the same file (whenCanPreempt ``MayStopSearch``,
preemptions asserted through the Evicted condition; stored without its commit), which renames
"use second flavor ...; WhenCanPreempt: Preempt" to "...: MayStopSearch" and adds "admit to second flavor when
first needs preemption; WhenCanPreempt: TryNextFlavor". These are the TestSchedule cases that
``kueue_cases_admission`` skipped for want of flavors (and the inline fair-sharing copies TestSchedule still
had at 005e97cfe1cc). As there:

- ``eng-alpha``/``eng-beta`` are Kueue's shared queues with both flavors, on-demand then spot; eng-beta's
  second resource group (``model-a``, example.com/gpu) is dropped: no ported workload requests it. Their
  namespace selectors match every ported workload.
- ``want_admitted`` is what is newly admitted; ``want_preempted`` is always compared (Kueue compares the
  preempted set exactly); ``want_flavors`` is the flavor of each newly admitted workload (wantAssignments).
- Kueue runs one cycle, the harness runs cycles until nothing changes; where the two differ ``differs`` says
  how, and the wants are what further Kueue cycles end with (victims gone and requeued, as Kueue requeues
  them; a requeued victim that fits again is admitted again).
- Kueue's namespaces are dropped; where two workloads share a name it becomes ``<namespace>.<name>``.
- Every ported case passes: none is marked expected-to-fail.
"""

from __future__ import annotations

import kueue_cases_admission
import pytest
from kueue_flavor_tables import FQ, FW, FlavorCase, run_flavor_admission

SOURCE = "scheduler_test.go TestSchedule"
NONE: frozenset[str] = frozenset()
LP = "LowerPriority"
OD, SPOT = "on-demand", "spot"


def eng(*, weight: float | None = None) -> tuple:
    """Kueue's eng-alpha and eng-beta (StrictFIFO), both flavors; ``weight`` for the fair-sharing cases."""
    return (
        FQ("eng-alpha", {OD: (50, 50, None), SPOT: (100, 0, None)}, cohort="eng", strategy="StrictFIFO", weight=weight),
        FQ(
            "eng-beta",
            {OD: (50, 10, None), SPOT: (0, 100, None)},
            cohort="eng",
            within=LP,
            reclaim="Any",
            strategy="StrictFIFO",
            weight=weight,
        ),
    )


def other_first_flavor(*, beta_preempts: bool, weight: float | None = None, alpha: int = 10, beta: int = 0) -> tuple:
    """The other-alpha/other-beta pair of the "prefer ... preemption flavor" cases: quota of gpu in on-demand
    and spot, other-alpha preempting within its queue and reclaiming from lower priorities."""
    return (
        FQ("other-alpha", {OD: alpha, SPOT: alpha}, cohort="other", within=LP, reclaim=LP, weight=weight),
        FQ(
            "other-beta",
            {OD: beta, SPOT: beta},
            cohort="other",
            weight=weight,
            **({"within": LP, "reclaim": LP} if beta_preempts else {}),
        ),
    )


def _second_flavor_case(name: str) -> FlavorCase:
    return FlavorCase(
        source=SOURCE,
        name=name,
        queues=(FQ("other-alpha", {OD: (50, 50, None), SPOT: (100, 0, None)}, within=LP, when_can_preempt="Preempt"),),
        admitted=(FW("admitted", "other-alpha", 50, flavor=OD),),
        pending=(FW("new", "other-alpha", 20),),
        want_admitted=frozenset({"new"}),
        want_preempted=NONE,
        want_flavors={"new": SPOT},
    )




CASES: tuple[FlavorCase, ...] = (
    _second_flavor_case("use second flavor when the first has no preemption candidates; WhenCanPreempt: Preempt"),
    _second_flavor_case("use second flavor when the first has no preemption candidates; WhenCanPreempt: MayStopSearch"),
    FlavorCase(
        source=SOURCE,
        name="can borrow if needs reclaim from cohort in different flavor",
        queues=eng(),
        admitted=(FW("user-on-demand", "eng-beta", 50, flavor=OD), FW("user-spot", "eng-beta", 1, flavor=SPOT)),
        pending=(FW("can-reclaim", "eng-alpha", 100), FW("needs-to-borrow", "eng-beta", 1)),
        # can-reclaim fits neither flavor (on-demand: 50 left to eng-alpha; spot: 99, user-spot borrows 1) and
        # eng-alpha may not reclaim; needs-to-borrow borrows 1 of eng-alpha's unused on-demand quota.
        want_admitted=frozenset({"needs-to-borrow"}),
        want_preempted=NONE,
        want_flavors={"needs-to-borrow": OD},
    ),
    FlavorCase(
        source=SOURCE,
        name="not enough resources to borrow, fallback to next flavor; WhenCanPreempt: TryNextFlavor",
        queues=eng(),
        admitted=(FW("existing", "eng-beta", 45, flavor=OD),),
        pending=(FW("new", "eng-alpha", 60),),
        want_admitted=frozenset({"new"}),
        want_preempted=NONE,
        want_flavors={"new": SPOT},
    ),
    FlavorCase(
        source=SOURCE,
        name="cannot borrow if cohort was assigned and would result in overadmission",
        queues=eng(),
        pending=(FW("eng-alpha.new", "eng-alpha", 45), FW("eng-beta.new", "eng-beta", 56)),
        want_admitted=frozenset({"eng-alpha.new", "eng-beta.new"}),
        want_preempted=NONE,
        want_flavors={"eng-alpha.new": OD, "eng-beta.new": SPOT},
        differs=(
            "Kueue's cycle assigns both on-demand from one snapshot, admits eng-alpha.new (within nominal, first) "
            "and leaves eng-beta.new pending: after it on-demand has 55 of the 56 it needs. Kueue's next cycle "
            "finds on-demand NoFit and spot Fit by borrowing 56 of eng-alpha's unused spot quota (whenCanBorrow "
            "Borrow), so it admits eng-beta.new in spot; gputask does that in the first cycle, its second "
            "flavor being tried against usage that already has eng-alpha.new"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="preempt workloads in ClusterQueue and cohort",
        queues=eng(),
        admitted=(
            FW("use-all-spot", "eng-alpha", 100, flavor=SPOT),
            FW("low-1", "eng-beta", 30, priority=-1, flavor=OD),
            FW("low-2", "eng-beta", 10, priority=-2, flavor=OD),
            FW("borrower", "eng-alpha", 60, flavor=OD),
        ),
        pending=(FW("preemptor", "eng-beta", 20),),
        want_admitted=frozenset({"preemptor", "low-2"}),
        want_preempted=frozenset({"borrower", "low-2"}),
        want_flavors={"preemptor": OD, "low-2": OD},
        differs=(
            "Kueue's cycle preempts borrower (reclaim) and low-2 (so the preemptor fits eng-beta's nominal "
            "quota: it may not borrow while preempting) and leaves the preemptor pending; once they are gone it "
            "fits on-demand, and low-2, requeued, fits on-demand again by borrowing 10 (eng-beta's "
            "borrowingLimit) of eng-alpha's now unused quota, where borrower (60) fits neither flavor"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="prefer reclamation over cq priority based preemption",
        queues=other_first_flavor(beta_preempts=True),
        admitted=(
            FW("a1", "other-alpha", 5, priority=50, flavor=OD),
            FW("b1", "other-beta", 5, priority=50, flavor=SPOT),
        ),
        pending=(FW("preemptor", "other-alpha", 6, priority=100),),
        want_admitted=frozenset({"preemptor", "b1"}),
        want_preempted=frozenset({"b1"}),
        want_flavors={"preemptor": SPOT, "b1": OD},
        differs=(
            "Kueue's cycle preempts b1 (reclaim in spot) and leaves the preemptor pending; once b1 is gone the "
            "preemptor fits spot, and b1, requeued, fits on-demand by borrowing the 5 other-alpha leaves unused"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="with fair sharing: prefer reclamation over cq priority based preemption; with preemption while borrowing",
        queues=other_first_flavor(beta_preempts=False, weight=1, alpha=7, beta=3),
        admitted=(
            FW("a1", "other-alpha", 5, priority=50, flavor=OD),
            FW("b1", "other-beta", 5, priority=50, flavor=SPOT),
        ),
        pending=(FW("preemptor", "other-alpha", 8, priority=100),),
        want_admitted=frozenset({"preemptor", "b1"}),
        want_preempted=frozenset({"b1"}),
        want_flavors={"preemptor": SPOT, "b1": OD},
        differs=(
            "Kueue's cycle preempts b1 (fair sharing, in spot) and leaves the preemptor pending; once b1 is gone "
            "the preemptor fits spot (7 + other-beta's 3), and b1, requeued, fits on-demand (other-beta's 3 and "
            "2 of other-alpha's)"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="prefer first preemption flavor when second flavor requires both reclaim and cq priority preemption",
        queues=other_first_flavor(beta_preempts=False),
        admitted=(
            FW("a1", "other-alpha", 5, priority=50, flavor=OD),
            FW("a2", "other-alpha", 5, priority=50, flavor=SPOT),
            FW("b1", "other-beta", 5, priority=50, flavor=SPOT),
        ),
        pending=(FW("preemptor", "other-alpha", 6, priority=100),),
        want_admitted=frozenset({"preemptor"}),
        want_preempted=frozenset({"a1"}),
        want_flavors={"preemptor": OD},
        differs=(
            "Kueue's cycle preempts a1 and leaves the preemptor pending; once a1 is gone it fits on-demand, and "
            "a1, requeued, fits neither flavor and may preempt nothing"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="prefer first preemption flavor when second flavor also requires cq preemption",
        queues=other_first_flavor(beta_preempts=False),
        admitted=(
            FW("a1", "other-alpha", 6, priority=50, flavor=OD),
            FW("a2", "other-alpha", 5, priority=50, flavor=SPOT),
            FW("b1", "other-beta", 5, priority=9001, flavor=SPOT),
        ),
        pending=(FW("preemptor", "other-alpha", 5, priority=100),),
        want_admitted=frozenset({"preemptor"}),
        want_preempted=frozenset({"a1"}),
        want_flavors={"preemptor": OD},
        differs=(
            "Kueue's cycle preempts a1 and leaves the preemptor pending; once a1 is gone it fits on-demand, and "
            "a1, requeued, fits neither flavor and may preempt nothing"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="don't assign flavor if there are no candidates for preemption",
        queues=(
            # 005e97cfe1cc: whenCanPreempt Preempt, whenCanBorrow Borrow (v1beta2: MayStopSearch for both).
            FQ(
                "cq1",
                {OD: (0, 1, None), SPOT: (0, 1, None)},
                cohort="cohort",
                within=LP,
                reclaim="Any",
                borrow=LP,
                when_can_preempt="Preempt",
                when_can_borrow="Borrow",
            ),
            FQ("cq2", {OD: 1, SPOT: 1}, cohort="cohort"),
        ),
        admitted=(FW("admitted", "cq2", 1, flavor=OD),),
        pending=(FW("new", "cq1", 1, priority=100),),
        want_admitted=frozenset({"new"}),
        want_preempted=NONE,
        want_flavors={"new": SPOT},
    ),
    FlavorCase(
        source=SOURCE,
        name="admit to second flavor when first needs preemption; WhenCanPreempt: TryNextFlavor",
        queues=(FQ("preempt-attempts-cq", {OD: 1, SPOT: 1}, within=LP, when_can_preempt="TryNextFlavor"),),
        admitted=(FW("blocker", "preempt-attempts-cq", 1, priority=50, flavor=OD),),
        pending=(FW("test-wl", "preempt-attempts-cq", 1, priority=100),),
        want_admitted=frozenset({"test-wl"}),
        want_preempted=NONE,
        want_flavors={"test-wl": SPOT},
    ),
    FlavorCase(
        source=SOURCE,
        name="with fair sharing: schedule workload with lowest share first",
        queues=(*eng(weight=1), FQ("eng-shared", {OD: (10, 0, None)}, cohort="eng", weight=1)),
        admitted=(FW("all_nominal", "eng-alpha", 50, flavor=OD), FW("borrowing", "eng-beta", 55, flavor=OD)),
        pending=(FW("older_new", "eng-beta", 1, created=0), FW("new", "eng-alpha", 5, created=60)),
        want_admitted=frozenset({"new", "older_new"}),
        want_preempted=NONE,
        want_flavors={"new": OD, "older_new": SPOT},
        differs=(
            "Kueue's cycle admits new first (the lower share after admission) in on-demand and leaves older_new "
            "pending: its on-demand assignment from the cycle's snapshot no longer fits. Kueue's next cycle finds "
            "on-demand full (Preempt mode) and spot Fit by borrowing eng-alpha's unused spot quota, so it admits "
            "older_new in spot; gputask does that in the first cycle"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="with fair sharing: preempt workload from CQ with the highest share",
        queues=(*eng(weight=1), FQ("eng-gamma", {OD: (50, 0, None)}, cohort="eng", weight=1)),
        admitted=(
            FW("all_spot", "eng-alpha", 100, flavor=SPOT),
            *(FW(f"alpha{i}", "eng-alpha", 20, flavor=OD) for i in range(1, 5)),
            FW("gamma1", "eng-gamma", 10, flavor=OD),
            *(FW(f"gamma{i}", "eng-gamma", 20, flavor=OD) for i in range(2, 5)),
        ),
        pending=(FW("preemptor", "eng-beta", 30),),
        want_admitted=frozenset({"preemptor"}),
        want_preempted=frozenset({"alpha1", "gamma1"}),
        want_flavors={"preemptor": OD},
        differs=(
            "Kueue's cycle preempts alpha1 and gamma1 and leaves the preemptor pending; once they are gone it "
            "fits on-demand, and neither victim fits again (on-demand is full, spot is all_spot's)"
        ),
    ),
    FlavorCase(
        source=SOURCE,
        name="workload should not fit in clusterQueue with nonexistent flavor",
        queues=(FQ("flavor-nonexistent-cq", {"nonexistent-flavor": 50}, strategy="StrictFIFO"),),
        absent=frozenset({"nonexistent-flavor"}),
        pending=(FW("foo", "flavor-nonexistent-cq", 1),),
        want_admitted=NONE,
        want_preempted=NONE,
    ),
)

_PREFERENCE = (
    "flavorFungibility.preference (BorrowingOverPreemption/PreemptionOverBorrowing): gputask's QueueSpec has "
    "when_can_borrow and when_can_preempt only, no equivalent; the case is also in neither stored version of "
    "the file read for this port"
)
_COHORT_OBJ = "a Cohort object supplies quota (hierarchical cohorts)"

SKIPPED: dict[str, str] = {
    # scheduler_test.go TestSchedule
    "PreemptionOverBorrowing preference: preempt in first flavor instead of borrowing in second": _PREFERENCE,
    "BorrowingOverPreemption preference: borrow in second flavor instead of preempting in first": _PREFERENCE,
    "prefer flavor with most local capacity": _COHORT_OBJ,
    "prefer flavor with most local capacity (FS=false)": _COHORT_OBJ,
    "pending admission check with nofit and fit flavors": "admission checks",
    "assign multiple resources and flavors": "several podsets and a second resource (example.com/gpu)",
    "no overadmission while borrowing": "an admitted workload with two podsets on two flavors",
    # scheduler_fs_test.go TestScheduleForFairSharing
    "PreemptionOverBorrowing with fair sharing: preempt in first flavor instead of borrowing in second": _PREFERENCE,
}


def _id(case: FlavorCase) -> str:
    return f"{case.source.split()[0]}::{case.name}"


def _param(case: FlavorCase) -> object:
    return pytest.param(case, id=_id(case))


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_flavor_table(case: FlavorCase) -> None:
    admitted, preempted, flavors = run_flavor_admission(case)
    assert (admitted, preempted) == (case.want_admitted, case.want_preempted)
    assert {n: flavors[n] for n in case.want_flavors} == dict(case.want_flavors)


def test_every_flavor_case_names_its_kueue_source_once() -> None:
    """Each case names a Kueue test file and function, is ported once, not also by ``kueue_cases_admission``,
    and states a flavor for each workload it expects admitted, unless it admits none."""
    seen = set()
    elsewhere = {(c.source, c.name) for c in kueue_cases_admission.CASES}
    for case in CASES:
        file, _, function = case.source.partition(" ")
        assert file.endswith("_test.go") and function.startswith("Test"), case.source
        assert (case.source, case.name) not in seen, case.name
        assert (case.source, case.name) not in elsewhere, case.name
        assert set(case.want_flavors) == set(case.want_admitted), case.name
        assert case.name not in SKIPPED, case.name
        seen.add((case.source, case.name))


def test_flavor_skips_of_the_admission_port_are_ported_or_skipped_here() -> None:
    """Every case ``kueue_cases_admission`` still skips for a reason naming flavors is ported here or skipped
    here with a reason."""
    ported = {c.name for c in CASES}
    left = [
        name
        for name, why in kueue_cases_admission.SKIPPED.items()
        if "flavor" in why.lower() and name not in ported and name not in SKIPPED
    ]
    assert not left, left
