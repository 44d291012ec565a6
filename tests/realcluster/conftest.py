"""One real control plane per test session, with gputask installed on it as the chart installs it.

The control plane (:mod:`gputask.testing.controlplane`): etcd, kube-apiserver v1.28.7,
kube-controller-manager (node lifecycle controller, 20 s grace), kube-scheduler and four kubemark hollow
nodes named as ``examples/00-nodes.yaml`` names them. On it: the CRDs from ``crds/``, the chart's
ServiceAccounts and RBAC (``helm template`` of ``charts/gputask`` with its default values), a node agent
per hollow node (``gputask agent --fake-gpus``, the GPUs of that node in ``examples/01-gpunodes.yaml``,
running as the chart's agent ServiceAccount), and two operator processes (``gputask run`` with the
chart's configuration, timings shortened, leader election on) whose identity is the chart's operator
ServiceAccount. The API server's audit log records every Job create (to count the operator's POSTs).

Everything is skipped, with the reason, where the binaries, etcd, kubectl, openssl or helm are missing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from helmtool import find_helm, render

from gputask.testing.controlplane import ControlPlane, ControlPlaneUnavailable, free_port, missing_prerequisites

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
# Every Job create, at Metadata level (user, response code); nothing else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": ["create"], "resources": [{"group": "batch", "resources": ["jobs"]}]},
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


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and four hollow nodes, for the session."""
    if REASON is not None:
        pytest.skip(f"real control plane suite skipped: {REASON}")
    # GPUTASK_REALCLUSTER_DIR: keep certificates, logs and the audit log there to look at after the run.
    kept = os.environ.get("GPUTASK_REALCLUSTER_DIR")
    plane = ControlPlane(nodes=sorted(example_gpunodes()), audit_policy=AUDIT_POLICY, node_monitor_grace_s=20,
                         workdir=Path(kept) if kept else None)
    try:
        plane.start()
    except ControlPlaneUnavailable as exc:
        pytest.fail(f"the control plane did not start: {exc}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> list[dict[str, Any]]:
    """``kubectl apply -f crds/`` (the API server's structural, CEL and cost checks), waited until Established;
    returns the stored CRDs."""
    done = control_plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds"), check=False)
    assert done.returncode == 0, f"the API server refused a CRD:\n{done.stderr}"
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in sorted((REPO / "crds").glob("*.yaml"))]
    return [json.loads(control_plane.kubectl("get", "crd", n, "-o", "json").stdout) for n in names]


@pytest.fixture(scope="session")
def installed(control_plane: ControlPlane, crds: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Installed]:
    """gputask as the chart installs it: its RBAC and ServiceAccounts, a node agent per hollow node and two
    operator processes (leader election) running as the chart's ServiceAccounts."""
    helm = find_helm()
    assert helm is not None
    rendered = render(helm, namespace=NAMESPACE)
    control_plane.kubectl("create", "namespace", NAMESPACE)
    rbac = [doc for doc in rendered if doc["kind"] in RBAC_KINDS]
    control_plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    config_map = next(d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gputask-config")
    config = yaml.safe_load(config_map["data"]["config.yaml"]) | CONFIG_OVERRIDES
    config_path = tmp_path_factory.mktemp("gputask") / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    found = Installed(
        control_plane,
        control_plane.service_account_kubeconfig(NAMESPACE, "gputask-operator"),
        control_plane.service_account_kubeconfig(NAMESPACE, "gputask-agent"),
        config_path,
    )
    for node, spec in example_gpunodes().items():
        found.start_agent(node, spec)
    for name in found.operators:
        found.start_operator(name)
    yield found
    for name in (*found.operators, *(f"agent-{n}" for n in example_gpunodes())):
        control_plane.kill(name)
