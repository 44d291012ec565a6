"""One real control plane for this package's tests, with gputask installed on it as the chart installs it.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gputask.testing.controlplane import ControlPlane, ControlPlaneUnavailable
from realcluster.realstack import (
    AUDIT_POLICY,
    NAMESPACE,
    REASON,
    REPO,
    Installed,
    example_gpunodes,
    install_chart_rbac,
)


@pytest.fixture(scope="package")
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


@pytest.fixture(scope="package")
def crds(control_plane: ControlPlane) -> list[dict[str, Any]]:
    """``kubectl apply -f crds/`` (the API server's structural, CEL and cost checks), waited until Established;
    returns the stored CRDs."""
    done = control_plane.kubectl("apply", "-f", str(REPO / "crds"), check=False)  # as README says
    assert done.returncode == 0, f"the API server refused a CRD:\n{done.stderr}"
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in sorted((REPO / "crds").glob("*.yaml"))]
    return [json.loads(control_plane.kubectl("get", "crd", n, "-o", "json").stdout) for n in names]


@pytest.fixture(scope="package")
def installed(control_plane: ControlPlane, crds: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Installed]:
    """gputask as the chart installs it: its RBAC and ServiceAccounts, a node agent per hollow node and two
    operator processes (leader election) running as the chart's ServiceAccounts."""
    config = install_chart_rbac(control_plane)
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
