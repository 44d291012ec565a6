"""Helpers of the kind suite: prerequisites, a kubectl wrapper, polling and watching objects.

Everything goes through the real command-line tools (docker, kind, kubectl, helm) so the suite
exercises what a user runs; nothing here talks to the API directly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

import helmtool

T = TypeVar("T")
ROOT = helmtool.ROOT
KIND_VALUES = helmtool.CHART / "ci" / "kind-fake-gpus-values.yaml"
KIND_CONFIG = Path(__file__).resolve().parent / "kind-config.yaml"


def run(args: Sequence[str], *, check: bool = True, timeout_s: float = 600, stdin: str | None = None) -> str:
    """Run a command; return stdout, or raise AssertionError with its output when it fails and ``check``."""
    done = subprocess.run(list(args), capture_output=True, text=True, input=stdin, timeout=timeout_s, check=False)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done.stdout


def missing_prerequisites() -> str | None:
    """Why the suite cannot run here (no docker engine, no kind, no kubectl, no helm), or None."""
    reasons = [f"{tool} is not on PATH" for tool in ("docker", "kind", "kubectl") if shutil.which(tool) is None]
    if shutil.which("docker") is not None:
        try:
            info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
            if info.returncode != 0:
                last = (info.stderr.strip().splitlines() or ["no output"])[-1]
                reasons.append(f"`docker info` failed, no Docker engine to run kind ({last})")
        except subprocess.TimeoutExpired:
            reasons.append("`docker info` did not answer within 30 s")
    if helmtool.find_helm() is None:
        try:
            helmtool.install_helm()
        except helmtool.HelmUnavailable as exc:
            reasons.append(str(exc))
    return "; ".join(reasons) or None


def kind_image() -> str:
    """The operator image the kind values file names (repository:tag, loaded into kind, never pulled)."""
    image = yaml.safe_load(KIND_VALUES.read_text())["image"]
    return f"{image['repository']}:{image['tag']}"


def wait_until(probe: Callable[[], T | None], *, timeout_s: float, what: str, interval_s: float = 2.0) -> T:
    """Call ``probe`` until it returns something truthy and return that; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last seen: {last!r}")
        time.sleep(interval_s)


class Kube:
    """kubectl against one cluster (its kubeconfig)."""

    def __init__(self, kubeconfig: Path, *, cluster: str) -> None:
        self.kubeconfig, self.cluster = kubeconfig, cluster

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None, timeout_s: float = 300) -> str:
        """Run kubectl with this cluster's kubeconfig; stdout."""
        return run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args], check=check, stdin=stdin, timeout_s=timeout_s
        )

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """One object as a dict, or None when it does not exist."""
        scope = ["--namespace", namespace] if namespace else []
        out = self.kubectl("get", kind, name, *scope, "--ignore-not-found", "--output", "json")
        return json.loads(out) if out.strip() else None

    def list(self, kind: str, *selectors: str) -> list[dict[str, Any]]:
        """Objects of ``kind`` in all namespaces (``selectors`` are extra kubectl flags such as -l)."""
        items: list[dict[str, Any]] = json.loads(
            self.kubectl("get", kind, "--all-namespaces", *selectors, "-o", "json")
        )["items"]
        return items

    def apply(self, objects: Sequence[dict[str, Any]]) -> str:
        """Server-side apply, as a GitOps tool does (one field manager, conflicts are errors)."""
        manifest = yaml.safe_dump_all(list(objects), sort_keys=False)
        return self.kubectl("apply", "--server-side", "--field-manager", "gputask-e2e", "-f", "-", stdin=manifest)

    def delete(self, objects: Sequence[dict[str, Any]]) -> None:
        """Delete objects and wait until they are gone."""
        manifest = yaml.safe_dump_all(list(objects), sort_keys=False)
        self.kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=180s", "-f", "-", stdin=manifest)

    @contextmanager
    def watch(self, kind: str, name: str, namespace: str) -> Iterator[list[dict[str, Any]]]:
        """Every version of one object while the block runs (``kubectl get --watch``): no transient state is missed."""
        args = [
            "kubectl",
            "--kubeconfig",
            str(self.kubeconfig),
            "get",
            kind,
            name,
            "-n",
            namespace,
            "-o",
            "json",
            "--watch",
        ]
        versions: list[dict[str, Any]] = []
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        reader = threading.Thread(target=_decode_stream, args=(process, versions), daemon=True)
        reader.start()
        try:
            yield versions
        finally:
            time.sleep(2)  # let the last update arrive
            process.terminate()
            process.wait(timeout=10)
            reader.join(timeout=10)


def _decode_stream(process: subprocess.Popen[str], versions: list[dict[str, Any]]) -> None:
    """Append each JSON object kubectl prints (pretty-printed, one after another) to ``versions``."""
    decoder, buffer = json.JSONDecoder(), ""
    assert process.stdout is not None
    for line in process.stdout:
        buffer += line
        while buffer.strip():
            try:
                obj, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                break  # incomplete: read more
            versions.append(obj)
            buffer = buffer.lstrip()[end:]


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """An object's status conditions by type."""
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def evictions(versions: Sequence[dict[str, Any]]) -> list[str]:
    """The reasons of every Evicted=True condition seen across the versions of a GPUTask, in order, deduplicated."""
    reasons: list[str] = []
    for version in versions:
        evicted = conditions(version).get("Evicted")
        if evicted and evicted["status"] == "True" and (not reasons or reasons[-1] != evicted["reason"]):
            reasons.append(evicted["reason"])
    return reasons
