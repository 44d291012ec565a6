"""Versions claimed = versions the chart installs on: README's supported range against the chart's kubeVersion."""

from __future__ import annotations

import re

import yaml

import helmtool

README = helmtool.ROOT / "README.md"


def claimed_range() -> tuple[str, str]:
    """(oldest, newest) minor version README's 'Supported Kubernetes versions: A to B' claims."""
    found = re.search(r"Supported Kubernetes versions: (1\.\d+) to (1\.\d+)", README.read_text())
    assert found, "README.md no longer says 'Supported Kubernetes versions: A to B'"
    return found.group(1), found.group(2)


def test_the_charts_kube_version_starts_at_the_oldest_version_the_readme_claims() -> None:
    """Chart.yaml's kubeVersion is exactly '>=OLDEST.0-0' for README's oldest supported version."""
    oldest, _ = claimed_range()
    chart = yaml.safe_load((helmtool.CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={oldest}.0-0"


def test_helm_renders_for_every_claimed_version_and_refuses_the_one_before(helm: str) -> None:
    """helm template passes the kubeVersion check at each claimed minor version and fails it one below."""
    oldest, newest = claimed_range()
    low, high = int(oldest.split(".")[1]), int(newest.split(".")[1])

    def refused(minor: int) -> bool:
        args = ["template", "gputask", str(helmtool.CHART), "--kube-version", f"1.{minor}.0"]
        done = helmtool.helm_run(helm, *args, check=False)
        return done.returncode != 0 and "kubeVersion" in done.stderr + done.stdout

    assert [(minor, refused(minor)) for minor in range(low - 1, high + 1)] == [
        (minor, minor < low) for minor in range(low - 1, high + 1)
    ]
