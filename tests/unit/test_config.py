"""Operator configuration: defaults, durations, and errors that name the bad field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gputask.config import Config, ConfigError, load_config, parse_duration
from gputask.core import DEFAULT_POLICY, POLICIES

INVALID = "FILE: invalid configuration:\n  "


def load(tmp_path: Path, text: str) -> Config:
    """Write ``text`` as a configuration file and load it."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path)


def load_error(tmp_path: Path, text: str) -> str:
    """The ConfigError message of loading ``text``, with the file path replaced by FILE."""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return str(info.value).replace(str(tmp_path / "config.yaml"), "FILE")


def test_no_file_gives_the_documented_defaults() -> None:
    """Without a file: 60s grace, 120s heartbeat, 1s cycle, packing, gputask queueing, envvar pinning, no Job
    RuntimeClass, all namespaces."""
    assert load_config(None).policy == DEFAULT_POLICY
    assert load_config(None).public() == {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "Configuration",
        "nodeFailureGracePeriod": 60.0,
        "heartbeatStaleAfter": 120.0,
        "cycleInterval": 1.0,
        "policy": "packing",
        "queueing": "gputask",
        "pinning": "envvar",
        "jobRuntimeClassName": "",
        "namespace": "",
        "foreignMemoryToleranceMiB": 1024,
        "leaderElection": False,
        "leaseName": "gputask-operator",
        "leaseNamespace": "",
        "leaseDuration": 15.0,
        "leaseRenewDeadline": 10.0,
        "leaseRenewInterval": 2.0,
        "podStartTimeout": 120.0,
        "apiConcurrency": 64,
        "queuePositionsTracked": 100,
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        "memoryBudget": {"action": "Warn", "toleranceMiB": 1024},
        "defragmentation": {"mode": "Disabled", "minRuntime": 300.0, "maxMovesPerWindow": 4, "window": 3600.0,
                            "priorityThreshold": 0, "maxMovesPerQueue": None, "schedule": ""},
        "userJobs": {"excludeNamespaces": ["kube-system"]},
    }


def test_memory_budget_takes_warn_or_evict_and_a_non_negative_tolerance(tmp_path: Path) -> None:
    """memoryBudget reads Evict and a tolerance; another action or a negative tolerance is refused by name."""
    loaded = load(tmp_path, "memoryBudget: {action: Evict, toleranceMiB: 256}\n").memory_budget
    assert ((loaded.action, loaded.tolerance_mib), load_error(tmp_path, "memoryBudget: {action: Kill}\n"),
            load_error(tmp_path, "memoryBudget: {toleranceMiB: -1}\n")) == (
        ("Evict", 256),
        "FILE: invalid configuration:\n  memoryBudget.action: Input should be 'Warn' or 'Evict'",
        "FILE: invalid configuration:\n  memoryBudget.toleranceMiB: Input should be greater than or equal to 0",
    )


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    """An empty file is the same as no file."""
    assert load(tmp_path, "") == load_config(None)


def test_durations_accept_suffixes_and_plain_seconds(tmp_path: Path) -> None:
    """A duration of "2m" is 120 s, "500ms" is 0.5 s and 30 is 30 s; other fields are read as written."""
    text = (
        "apiVersion: gputask.io/v1alpha1\nkind: Configuration\nnodeFailureGracePeriod: 2m\n"
        "cycleInterval: 500ms\nheartbeatStaleAfter: 30\npolicy: firstfit\nqueueing: kueue\nnamespace: ml\n"
        "pinning: cdi\njobRuntimeClassName: nvidia-cdi\n"
    )
    assert load(tmp_path, text).public() == {
        "apiVersion": "gputask.io/v1alpha1",
        "kind": "Configuration",
        "nodeFailureGracePeriod": 120.0,
        "heartbeatStaleAfter": 30.0,
        "cycleInterval": 0.5,
        "policy": "firstfit",
        "queueing": "kueue",
        "pinning": "cdi",
        "jobRuntimeClassName": "nvidia-cdi",
        "namespace": "ml",
        "foreignMemoryToleranceMiB": 1024,
        "leaderElection": False,
        "leaseName": "gputask-operator",
        "leaseNamespace": "",
        "leaseDuration": 15.0,
        "leaseRenewDeadline": 10.0,
        "leaseRenewInterval": 2.0,
        "podStartTimeout": 120.0,
        "apiConcurrency": 64,
        "queuePositionsTracked": 100,
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        "memoryBudget": {"action": "Warn", "toleranceMiB": 1024},
        "defragmentation": {"mode": "Disabled", "minRuntime": 300.0, "maxMovesPerWindow": 4, "window": 3600.0,
                            "priorityThreshold": 0, "maxMovesPerQueue": None, "schedule": ""},
        "userJobs": {"excludeNamespaces": ["kube-system"]},
    }


def test_parse_duration_reads_every_documented_form() -> None:
    """Numbers, bare strings and s/m/h/ms suffixes all become seconds."""
    assert [parse_duration(v) for v in (30, 1.5, "30", "30s", "2m", "1h", "500ms", " 2.5 s ")] == [
        30.0,
        1.5,
        30.0,
        30.0,
        120.0,
        3600.0,
        0.5,
        2.5,
    ]  # fmt: skip (one row reads better than eight)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "cycleInterval: abc",
            INVALID + "cycleInterval: Value error, not a duration: 'abc' (use e.g. 30s, 2m, 1h)",
        ),
        ("cycleInterval: 0", INVALID + "cycleInterval: Input should be greater than 0"),
        (
            "heartbeatStaleAfter: -5",
            INVALID + "heartbeatStaleAfter: Value error, duration must not be negative: -5",
        ),
        (
            "nodeFailureGracePeriod: true",
            INVALID + "nodeFailureGracePeriod: Value error, not a duration: True",
        ),
        (
            "queueing: volcano",
            INVALID + "queueing: Input should be 'gputask' or 'kueue'",
        ),
        (
            "pinning: nvidia",
            INVALID + "pinning: Input should be 'envvar', 'cdi' or 'dra'",
        ),
        (
            "jobRuntimeClassName: Nvidia_CDI",
            INVALID + "jobRuntimeClassName: String should match pattern "
            "'^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
        ),
        (
            "pinning: dra\nqueueing: kueue",
            INVALID + "Value error, pinning: dra cannot be used with queueing: kueue: the Job is created before "
            "gputask places it, and Kueue's podSetUpdates (labels, annotations, nodeSelector, tolerations) cannot give "
            "its pods the resourceClaims that name the placed GPUs; use pinning: cdi or envvar with Kueue",
        ),
        (
            "cycleIntervall: 1s",
            INVALID + "cycleIntervall: Extra inputs are not permitted",
        ),
        ("- cycleInterval", "FILE: expected a mapping, got list"),
        (
            "leaseDuration: 5s\nleaseRenewDeadline: 4s\nleaseRenewInterval: 10s",
            INVALID + "Value error, leaseRenewInterval (10s) must be shorter than leaseRenewDeadline (4s)",
        ),
        (
            "leaseDuration: 5s\nleaseRenewDeadline: 6s",
            INVALID + "Value error, leaseRenewDeadline (6s) must be shorter than leaseDuration (5s)",
        ),
    ],
)
def test_an_invalid_field_is_a_config_error_naming_it(tmp_path: Path, text: str, message: str) -> None:
    """Each invalid value raises ConfigError whose message names the file and the field."""
    assert load_error(tmp_path, text) == message


def test_an_unknown_policy_is_a_config_error_listing_the_known_ones(tmp_path: Path) -> None:
    """A policy name nobody registered is refused with the list of registered policies."""
    assert load_error(tmp_path, "policy: worstfit") == (
        f"FILE: policy 'worstfit' unknown; known: {', '.join(sorted(POLICIES))}"
    )


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A path that does not exist raises ConfigError, not OSError."""
    with pytest.raises(ConfigError):
        load_config(tmp_path / "absent.yaml")


def test_the_demo_without_its_extra_says_which_extra_to_install() -> None:
    """Without kmock (an install of only .[agent]) `gputask demo` prints one line naming the demo extra, exit 2."""
    script = "import sys; sys.modules['kmock'] = None\nfrom gputask.cli import app\napp(['demo'])"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr, run.stdout) == (
        2,
        "gputask demo: the API emulator needs the demo extra: pip install 'gputask[demo]'\n",
        "",
    )


def test_fair_sharing_preemption_strategies_follow_kueues_rules(tmp_path: Path) -> None:
    """Kueue's Configuration fairSharing.preemptionStrategies: both by default, either alone, and the
    second only LessThanInitialShare; anything else is refused with the reason."""
    assert Config().fair_sharing.preemption_strategies == ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
    path = tmp_path / "c.yaml"
    path.write_text("fairSharing: {preemptionStrategies: [LessThanInitialShare]}\n")
    assert load_config(path).fair_sharing.preemption_strategies == ("LessThanInitialShare",)
    path.write_text("fairSharing: {preemptionStrategies: [LessThanInitialShare, LessThanOrEqualToFinalShare]}\n")
    with pytest.raises(ConfigError, match="the second preemption strategy can only be LessThanInitialShare"):
        load_config(path)
    path.write_text("fairSharing: {preemptionStrategies: []}\n")  # Kueue defaults an empty list
    assert load_config(path).fair_sharing == Config().fair_sharing
    path.write_text("fairSharing: {preemptionStrategies: [Fairest]}\n")
    with pytest.raises(ConfigError, match="preemptionStrategies must be one or two of"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memoryBudget: {toleranceMiB: true}\n", "memoryBudget.toleranceMiB: Input should be a valid integer"),
        ("apiConcurrency: '16'\n", "apiConcurrency: Input should be a valid integer"),
        ("policy: packing\npolicy: fgd\n", "key 'policy' is given twice"),
    ],
)
def test_a_boolean_or_string_for_a_number_and_a_key_given_twice_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    """YAML's true is not 1 and '16' is not 16; a key given twice is an error, not the last one silently."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)


def test_defragmentation_reads_its_settings_and_a_cron_schedule_as_a_utc_window(tmp_path: Path) -> None:
    """defragmentation: mode, durations, budgets; the schedule's minutes (UTC) are when moves may start; a bad
    mode or cron expression is refused by name."""
    text = ("defragmentation: {mode: Enabled, minRuntime: 2m, maxMovesPerWindow: 2, window: 30m, "
            "priorityThreshold: -1, maxMovesPerQueue: 1, schedule: '* 1-5 * * *'}\n")
    core = load(tmp_path, text).defragmentation.core()
    assert (core.mode, core.min_runtime_s, core.max_moves_per_window, core.window_s, core.priority_threshold,
            core.max_moves_per_queue) == ("Enabled", 120.0, 2, 1800.0, -1, 1)
    assert core.allowed_at is not None
    assert [core.allowed_at(h * 3600.0) for h in (0, 1, 5, 6)] == [False, True, True, False]
    assert load(tmp_path, "defragmentation: {mode: DryRun}\n").defragmentation.core().allowed_at is None
    assert load_error(tmp_path, "defragmentation: {mode: On}\n") == (
        "FILE: invalid configuration:\n  defragmentation.mode: Input should be 'Disabled', 'DryRun' or 'Enabled'")
    assert "is not a cron expression" in load_error(tmp_path, "defragmentation: {schedule: '61 * * * *'}\n")
    assert "is not a cron expression" in load_error(tmp_path, "defragmentation: {schedule: '* * * * * *'}\n")
