"""Placement policies beyond the basic ones in :mod:`gputask.core.placement`, registered by name.

- ``fgd``: FGD, fragmentation gradient descent (Weng et al., USENIX ATC '23), as its authors
  score it (:mod:`.fgd`); ``fgd-exact`` compares exact fragmentation growth instead;
- ``bestfit-atc23``: the FGD paper's best-fit baseline, to reproduce its figures (:mod:`.bestfit_atc23`).
"""

from __future__ import annotations

from gputask.core.placement import register_policy
from gputask.core.policies.bestfit_atc23 import BestFitAtc23
from gputask.core.policies.fgd import FGD
from gputask.core.policies.packing import Packing
from gputask.core.policies.workload import RecentWorkload, TargetWorkload, TaskShape


def _fgd_exact() -> FGD:
    policy = FGD(quantize=False)
    policy.name = "fgd-exact"
    return policy


register_policy("fgd", FGD)
register_policy("fgd-exact", _fgd_exact)
register_policy("bestfit-atc23", BestFitAtc23)
register_policy("packing", Packing)

__all__ = ["FGD", "BestFitAtc23", "Packing", "RecentWorkload", "TargetWorkload", "TaskShape"]
