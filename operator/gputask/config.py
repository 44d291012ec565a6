"""Operator configuration: one versioned file, validated at start with clear errors.

Shape (YAML)::

    apiVersion: gputask.io/v1alpha1
    kind: Configuration
    nodeFailureGracePeriod: 60s     # NotReady/Unknown this long = node failure
    heartbeatStaleAfter: 120s       # a GPUNode heartbeat older than this = node failure
    cycleInterval: 1s               # scheduling cycle period when nothing wakes the loop
    policy: packing                 # placement policy name (packing, fgd, bestfit, firstfit, ...)
    queueing: gputask               # gputask | kueue
    pinning: envvar                 # envvar | cdi | dra: how a Job's pods get their GPUs (README, GPU runtime set-up)
    jobRuntimeClassName: ""         # RuntimeClass of emitted Jobs' pods whose template names none; "" = none
    namespace: ""                   # watch one namespace; "" = cluster-wide
    foreignMemoryToleranceMiB: 1024 # memory used beyond our reservations and this counts as foreign
    memoryBudget:                   # a task using more GPU memory than it reserved (the agent splits memory by pod)
      action: Warn                  # Warn: condition GPUMemoryWithinBudget False, Event, metric; Evict: also evict
      toleranceMiB: 1024            # use beyond the reservation allowed (CUDA contexts are not in the reservation)
    leaderElection: false           # campaign for a coordination.k8s.io/v1 Lease; only the leader schedules
    leaseName: gputask-operator
    leaseNamespace: ""              # "" = $POD_NAMESPACE, else "default"
    leaseDuration: 15s              # a Lease not renewed for this long may be taken over (client-go's defaults)
    leaseRenewDeadline: 10s         # the leader steps down when it could not renew for this long
    leaseRenewInterval: 2s          # how often the leader renews, and a standby tries, the Lease
    podStartTimeout: 120s           # an admitted task without a running pod this long is evicted (PodsNotStarting)
    apiConcurrency: 64              # API requests in flight at once (the Lease has its own connections)
    queuePositionsTracked: 100      # Pending tasks per queue whose status.queuePosition is kept up to date
    userJobs:                       # existing Jobs labelled gputask.io/queue-name (README, Running your own Jobs)
      excludeNamespaces: [kube-system]  # labelled Jobs here are left alone
    fairSharing:
      preemptionStrategies: [LessThanOrEqualToFinalShare, LessThanInitialShare]  # Kueue's, tried in order
    defragmentation:                # move opted-in tasks so a task waiting on fragmentation fits (issue 32)
      mode: Disabled                # Disabled | DryRun (plans reported, nothing moved) | Enabled
      minRuntime: 5m                # a task runs at least this long before it may be moved
      maxMovesPerWindow: 4          # moves in the whole cluster (so per queue too) within any window
      window: 1h                    # the sliding window of maxMovesPerWindow
      priorityThreshold: 0          # moved priority - waiting priority at most this (0: lower or equal)
      maxMovesPerQueue: null        # moves of one queue's tasks per window; null = maxMovesPerWindow
      schedule: ""                  # cron (5 fields, UTC): the minutes moves may start in; "" = any time

Durations accept seconds as a number or a string with s/m/h suffix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError, model_validator

if TYPE_CHECKING:
    from gputask.core.defrag import DefragConfig

_DNS_SUBDOMAIN = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A RuntimeClass name (a DNS subdomain, as the API validates ``runtimeClassName``), or empty."""
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


class MemoryBudgetConfig(BaseModel):
    """``memoryBudget``: what happens to a task whose pods use more GPU memory on a GPU than the task reserved
    there, beyond ``toleranceMiB`` (see :mod:`gputask.core.budget`). ``action``: ``Warn`` (the condition
    GPUMemoryWithinBudget False, a Warning Event, the metric) or ``Evict`` (the same, then evicted with reason
    GPUMemoryExceeded and requeued, counted against maxReschedules)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    action: Literal["Warn", "Evict"] = "Warn"
    tolerance_mib: StrictInt = Field(1024, alias="toleranceMiB", ge=0)


class DefragmentationConfig(BaseModel):
    """``defragmentation``: moves of opted-in tasks (``spec.disruption.movable``) that make room for a task waiting
    on fragmentation (:mod:`gputask.core.defrag`). ``schedule``: a cron expression (five fields, UTC, parsed by
    croniter) whose matching minutes are the maintenance window; empty: any time."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    mode: Literal["Disabled", "DryRun", "Enabled"] = "Disabled"
    min_runtime_s: Duration = Field(300.0, alias="minRuntime", ge=0)
    max_moves_per_window: StrictInt = Field(4, alias="maxMovesPerWindow", ge=1, le=10_000)
    window_s: Duration = Field(3600.0, alias="window", gt=0)
    priority_threshold: StrictInt = Field(0, alias="priorityThreshold")
    max_moves_per_queue: StrictInt | None = Field(None, alias="maxMovesPerQueue", ge=0, le=10_000)
    schedule: str = ""

    @model_validator(mode="after")
    def _cron(self) -> DefragmentationConfig:
        from croniter import croniter

        if self.schedule and (len(self.schedule.split()) != 5 or not croniter.is_valid(self.schedule)):
            raise ValueError(f"schedule {self.schedule!r} is not a cron expression of 5 fields (e.g. '* 1-5 * * 6,0')")
        return self

    def core(self) -> DefragConfig:
        """The core's :class:`~gputask.core.defrag.DefragConfig` (the schedule as a predicate of the time, s)."""
        from gputask.core.defrag import DefragConfig

        allowed = None if not self.schedule else cron_window(self.schedule)
        return DefragConfig(self.mode, self.min_runtime_s, self.max_moves_per_window, self.window_s,
                            self.priority_threshold, self.max_moves_per_queue, allowed)


def cron_window(expression: str) -> Callable[[float], bool]:
    """True at the times (s since the epoch, UTC) whose minute ``expression`` matches (croniter)."""
    from datetime import UTC, datetime

    from croniter import croniter

    def allowed(now: float) -> bool:
        return bool(croniter.match(expression, datetime.fromtimestamp(now, UTC)))

    return allowed


class UserJobsConfig(BaseModel):
    """Existing Jobs admitted by gputask (issue 31): the namespaces whose labelled Jobs are left alone."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    exclude_namespaces: tuple[str, ...] = Field(("kube-system",), alias="excludeNamespaces")


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
    pinning: Literal["envvar", "cdi", "dra"] = "envvar"
    job_runtime_class_name: str = Field("", alias="jobRuntimeClassName", max_length=253, pattern=_DNS_SUBDOMAIN)
    namespace: str = ""
    foreign_tolerance_mib: StrictInt = Field(1024, alias="foreignMemoryToleranceMiB", ge=0)
    leader_election: bool = Field(False, alias="leaderElection")
    lease_name: str = Field("gputask-operator", alias="leaseName")
    lease_namespace: str = Field("", alias="leaseNamespace")
    lease_duration_s: Duration = Field(15.0, alias="leaseDuration", gt=0)
    lease_renew_deadline_s: Duration = Field(10.0, alias="leaseRenewDeadline", gt=0)
    lease_renew_s: Duration = Field(2.0, alias="leaseRenewInterval", gt=0)
    pod_start_timeout_s: Duration = Field(120.0, alias="podStartTimeout", gt=0)
    api_concurrency: StrictInt = Field(64, alias="apiConcurrency", ge=1, le=256)
    queue_positions_tracked: StrictInt = Field(100, alias="queuePositionsTracked", ge=0, le=100_000)
    fair_sharing: FairSharingConfig = Field(default_factory=FairSharingConfig, alias="fairSharing")
    memory_budget: MemoryBudgetConfig = Field(default_factory=MemoryBudgetConfig, alias="memoryBudget")
    defragmentation: DefragmentationConfig = Field(default_factory=DefragmentationConfig)
    user_jobs: UserJobsConfig = Field(default_factory=UserJobsConfig, alias="userJobs")

    @model_validator(mode="after")
    def _pinning_fits_queueing(self) -> Config:
        """``pinning: dra`` needs gputask to write the pod's resourceClaims; in Kueue mode the Job is emitted before
        placement and Kueue's podSetUpdates can only add labels, annotations, a nodeSelector and tolerations."""
        if self.pinning == "dra" and self.queueing == "kueue":
            raise ValueError(
                "pinning: dra cannot be used with queueing: kueue: the Job is created before gputask places it, and "
                "Kueue's podSetUpdates (labels, annotations, nodeSelector, tolerations) cannot give its pods the "
                "resourceClaims that name the placed GPUs; use pinning: cdi or envvar with Kueue"
            )
        return self

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


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(path: Path | None) -> Config:
    """Load and validate the configuration; None gives the defaults. Raises ConfigError."""
    if path is None:
        return Config()
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}  # a SafeLoader: builds plain data only
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
