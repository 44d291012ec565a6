"""Kueue's own unit-test tables, ported at GPU granularity (see ``kueue_tables``).

Counts per Kueue test file are printed by ``test_the_tables_port_kueues_cases`` on failure and
listed in the README's queue section.
"""

from __future__ import annotations

import pytest
from kueue_cases_admission import CASES as ADMISSION
from kueue_cases_fair import CASES as FAIR
from kueue_cases_preemption import CASES as PREEMPTION
from kueue_tables import AdmissionCase, PreemptionCase, run_admission, run_preemption


def _id(case: PreemptionCase | AdmissionCase) -> str:
    return f"{case.source.split()[0]}::{case.name}"


@pytest.mark.parametrize("case", PREEMPTION + FAIR, ids=_id)
def test_preemption_table(case: PreemptionCase) -> None:
    assert run_preemption(case) == case.want


@pytest.mark.parametrize("case", ADMISSION, ids=_id)
def test_admission_table(case: AdmissionCase) -> None:
    admitted, preempted = run_admission(case)
    assert admitted == case.want_admitted
    if case.want_preempted is not None:
        assert preempted == case.want_preempted


def test_every_case_names_its_kueue_source_once() -> None:
    """Each case names a Kueue test file and function, and no case is ported twice."""
    seen = set()
    for case in PREEMPTION + FAIR + ADMISSION:
        file, _, function = case.source.partition(" ")
        assert file.endswith("_test.go") and function.startswith("Test"), case.source
        assert (case.source, case.name) not in seen, case.name
        seen.add((case.source, case.name))
