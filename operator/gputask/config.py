"""Operator configuration: one versioned file, validated at start with clear errors.

Shape (YAML)::

    apiVersion: gputask.io/v1alpha1
    kind: Configuration
    nodeFailureGracePeriod: 60s     # NotReady/Unknown this long = node failure
    heartbeatStaleAfter: 120s       # a GPUNode heartbeat older than this = node failure
    cycleInterval: 1s               # scheduling cycle period when nothing wakes the loop
    policy: packing                 # placement policy name (packing, fgd, bestfit, firstfit, ...)
    queueing: gputask               # gputask | kueue
    namespace: ""                   # watch one namespace; "" = cluster-wide
    foreignMemoryToleranceMiB: 1024 # memory used beyond our reservations and this counts as foreign
    leaderElection: false           # campaign for a coordination.k8s.io/v1 Lease; only the leader schedules
    leaseName: gputask-operator
    leaseNamespace: ""              # "" = $POD_NAMESPACE, else "default"
    leaseDuration: 15s              # a Lease not renewed for this long may be taken over (client-go's defaults)
    leaseRenewDeadline: 10s         # the leader steps down when it could not renew for this long
    leaseRenewInterval: 2s          # how often the leader renews, and a standby tries, the Lease
    podStartTimeout: 120s           # an admitted task without a running pod this long is evicted (PodsNotStarting)
    apiConcurrency: 64              # API requests in flight at once (the Lease has its own connections)
    queuePositionsTracked: 100      # Pending tasks per queue whose status.queuePosition is kept up to date
    fairSharing:
      preemptionStrategies: [LessThanOrEqualToFinalShare, LessThanInitialShare]  # Kueue's, tried in order

Durations accept seconds as a number or a string with s/m/h suffix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from ``30``, ``"30"``, ``"30s"``, ``"2m"``, ``"1h"``, ``"500ms"``; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value!r}")
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 2m, 1h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _default_if_empty(value: Any) -> Any:
    """Kueue's defaulting: an empty or null preemptionStrategies means both, in order."""
    return ("LessThanOrEqualToFinalShare", "LessThanInitialShare") if value is None or value == [] else value


class FairSharingConfig(BaseModel):
    """Kueue's Configuration ``fairSharing`` section: how fair-sharing preemption picks victims.

    ``preemptionStrategies``: LessThanOrEqualToFinalShare (rule S2-a), LessThanInitialShare (S2-b),
    tried in order (Kueue's default is both, in that order); see :mod:`gputask.core.preemption`.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    preemption_strategies: Annotated[tuple[str, ...], BeforeValidator(_default_if_empty)] = Field(
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"), alias="preemptionStrategies"
    )

    @model_validator(mode="after")
    def _known(self) -> FairSharingConfig:
        from gputask.core.preemption import strategies_of

        strategies_of(self.preemption_strategies)  # raises ValueError with Kueue's rules
        return self


class Config(BaseModel):
    """Validated operator configuration (durations in seconds)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    api_version: Literal["gputask.io/v1alpha1"] = Field("gputask.io/v1alpha1", alias="apiVersion")
    kind: Literal["Configuration"] = "Configuration"
    node_failure_grace_period_s: Duration = Field(60.0, alias="nodeFailureGracePeriod", ge=0)
    heartbeat_stale_after_s: Duration = Field(120.0, alias="heartbeatStaleAfter", gt=0)
    cycle_interval_s: Duration = Field(1.0, alias="cycleInterval", gt=0)
    policy: str = "packing"  # = gputask.core.placement.DEFAULT_POLICY (tested)
    queueing: Literal["gputask", "kueue"] = "gputask"
    namespace: str = ""
    foreign_tolerance_mib: int = Field(1024, alias="foreignMemoryToleranceMiB", ge=0)
    leader_election: bool = Field(False, alias="leaderElection")
    lease_name: str = Field("gputask-operator", alias="leaseName")
    lease_namespace: str = Field("", alias="leaseNamespace")
    lease_duration_s: Duration = Field(15.0, alias="leaseDuration", gt=0)
    lease_renew_deadline_s: Duration = Field(10.0, alias="leaseRenewDeadline", gt=0)
    lease_renew_s: Duration = Field(2.0, alias="leaseRenewInterval", gt=0)
    pod_start_timeout_s: Duration = Field(120.0, alias="podStartTimeout", gt=0)
    api_concurrency: int = Field(64, alias="apiConcurrency", ge=1, le=256)
    queue_positions_tracked: int = Field(100, alias="queuePositionsTracked", ge=0, le=100_000)
    fair_sharing: FairSharingConfig = Field(default_factory=FairSharingConfig, alias="fairSharing")

    @model_validator(mode="after")
    def _renew_within_lease(self) -> Config:
        """client-go's order: retries (renew interval) < renew deadline < lease duration, so a leader
        steps down before anyone else may take its Lease over, and tries several times before that."""
        if self.lease_renew_s >= self.lease_renew_deadline_s:
            raise ValueError(
                f"leaseRenewInterval ({self.lease_renew_s:g}s) must be shorter than leaseRenewDeadline "
                f"({self.lease_renew_deadline_s:g}s)"
            )
        if self.lease_renew_deadline_s >= self.lease_duration_s:
            raise ValueError(
                f"leaseRenewDeadline ({self.lease_renew_deadline_s:g}s) must be shorter than leaseDuration "
                f"({self.lease_duration_s:g}s)"
            )
        return self

    def public(self) -> dict[str, Any]:
        """The configuration as printed in outputs (aliases, seconds)."""
        return self.model_dump(by_alias=True, mode="json")


class ConfigError(Exception):
    """The configuration file is missing, unreadable or invalid; the message says where."""


def load_config(path: Path | None) -> Config:
    """Load and validate the configuration; None gives the defaults. Raises ConfigError."""
    if path is None:
        return Config()
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping, got {type(raw).__name__}")
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        lines = [": ".join(filter(None, (".".join(map(str, e["loc"])), e["msg"]))) for e in exc.errors()]
        raise ConfigError(f"{path}: invalid configuration:\n  " + "\n  ".join(lines)) from exc
    from gputask.core.placement import POLICIES

    if config.policy not in POLICIES:
        raise ConfigError(f"{path}: policy {config.policy!r} unknown; known: {', '.join(sorted(POLICIES))}")
    return config
