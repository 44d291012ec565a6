"""The real-control-plane suite's helpers: what gputask installs, how its processes start, waiting for state.

See ``conftest.py`` for what the session's control plane holds.
"""


from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gputask.testing.controlplane import ControlPlane, free_port, missing_prerequisites
from helmtool import find_helm, render

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
NAMESPACE = "gputask-system"  # the chart's release namespace in these tests
T = TypeVar("T")


def _why_skipped() -> str | None:
    reason = missing_prerequisites()
    if reason is None and find_helm() is None:
        reason = "helm not found (make helm installs it into .tools/bin/helm)"
    return reason


REASON = _why_skipped()
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:gputask-operator"
# Every Job create, and every request of the operator's ServiceAccount (to find a 403), at Metadata level (user,
# verb, object, response code); nothing else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": ["create"], "resources": [{"group": "batch", "resources": ["jobs"]}]},
        {"level": "Metadata", "users": [OPERATOR_USER]},
        {"level": "None"},
    ],
}
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# The chart's configuration with the timings shortened: a failed node is one 2 s after it is NotReady, and a
# standby takes over 4 s after the leader stopped renewing.
CONFIG_OVERRIDES = {
    "nodeFailureGracePeriod": "2s",
    "cycleInterval": "0.5s",
    "leaseDuration": "4s",
    "leaseRenewDeadline": "3s",
    "leaseRenewInterval": "1s",
}


def wait_for(probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.25) -> T:
    """Call ``probe`` until it returns something truthy; fail the test saying ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout_s}s: {what} (last: {value!r})")
        time.sleep(interval_s)


def example_gpunodes() -> dict[str, str]:
    """node name -> ``--fake-gpus`` spec of the GPUs ``examples/01-gpunodes.yaml`` gives it, in index order."""
    specs = {}
    for doc in yaml.safe_load_all((EXAMPLES / "01-gpunodes.yaml").read_text()):
        gpus = sorted(doc["status"]["gpus"], key=lambda g: g["index"])
        specs[doc["metadata"]["name"]] = ",".join(f"1x{g['product']}:{g['memory']}" for g in gpus)
    return specs


@dataclass
class Installed:
    """The control plane with gputask installed: kubeconfigs of the chart's identities, the operators' names."""

    cp: ControlPlane
    operator_kubeconfig: Path
    agent_kubeconfig: Path
    config: Path
    operators: tuple[str, ...] = ("operator-0", "operator-1")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        """``kubectl ARGS -o json`` as admin, parsed; a non-JSON answer as text."""
        done = self.cp.kubectl(*args, input=input, check=check)
        text = done.stdout.strip()
        return json.loads(text) if text[:1] in ("{", "[") else (text if check else done)

    def get(self, kind: str, name: str, namespace: str | None = "default") -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        ns = ["-n", namespace] if namespace else []
        done = self.cp.kubectl("get", kind, name, *ns, "-o", "json", check=False)
        if done.returncode != 0:
            if "NotFound" in done.stderr:
                return None
            raise AssertionError(f"kubectl get {kind} {name}: {done.stderr}")
        return json.loads(done.stdout)

    def start_operator(self, name: str) -> None:
        """Start ``gputask run`` as the chart's Deployment runs it (its ServiceAccount, POD_NAMESPACE)."""
        env = {**os.environ, "POD_NAMESPACE": NAMESPACE, "POD_NAME": name, "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "gputask.cli", "run", "--config", str(self.config),
                "--kubeconfig", str(self.operator_kubeconfig)]
        self.cp.launch(name, argv, env)

    def start_agent(self, node: str, fake_gpus: str) -> None:
        """Start ``gputask agent`` for ``node`` as the chart's DaemonSet pod on it would run (fake GPUs)."""
        env = {**os.environ, "NODE_NAME": node, "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "gputask.cli", "agent", "--node-name", node, "--fake-gpus", fake_gpus,
                "--interval", "2s", "--heartbeat", "10s", "--metrics-port", str(free_port()),
                "--metrics-bind-address", "127.0.0.1", "--kubeconfig", str(self.agent_kubeconfig)]
        self.cp.launch(f"agent-{node}", argv, env)




def install_chart_rbac(plane: ControlPlane, **overrides: Any) -> dict[str, Any]:
    """Create NAMESPACE and apply the chart's ServiceAccounts, roles and bindings there (``helm template`` of
    ``charts/gputask`` with its default values); return the chart's operator configuration (its ConfigMap's
    ``config.yaml``) with CONFIG_OVERRIDES and ``overrides`` on top. Raises AssertionError without helm."""
    helm = find_helm()
    assert helm is not None
    rendered = render(helm, namespace=NAMESPACE)
    plane.kubectl("create", "namespace", NAMESPACE)
    rbac = [doc for doc in rendered if doc["kind"] in RBAC_KINDS]
    plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    config_map = next(d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gputask-config")
    return dict(yaml.safe_load(config_map["data"]["config.yaml"]) | CONFIG_OVERRIDES | overrides)
