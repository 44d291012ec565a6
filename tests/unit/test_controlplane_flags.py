"""The real control plane's command lines: what a benchmark may change (pods per node, extra flags)."""

from __future__ import annotations

from pathlib import Path

from gputask.testing.controlplane import ControlPlane


def test_hollow_nodes_hold_max_pods_and_extra_flags_come_last(tmp_path: Path) -> None:
    """``max_pods`` is each hollow node's ``--max-pods`` and ``extra_args`` are appended to the named components'
    command lines (after the defaults, so they override them); nothing is started."""
    plane = ControlPlane(nodes=["n-a", "n-b"], max_pods=250, workdir=tmp_path,
                         extra_args={"kube-scheduler": ["--kube-api-qps=100"], "n-b": ["--max-pods=300"]})
    plane.tokens = {user: ("t", "") for user in (
        "gputask-test-admin", "system:kube-controller-manager", "system:kube-scheduler", "system:node:n-a",
        "system:node:n-b")}
    plane._define("/usr/bin/etcd")
    argv = {name: c.argv for name, c in plane.components.items()}
    assert ([a for a in argv["n-a"] if a.startswith("--max-pods")], [a for a in argv["n-b"] if a.startswith(
        "--max-pods")], argv["kube-scheduler"][-1]) == (["--max-pods=250"], ["--max-pods=250", "--max-pods=300"],
                                                       "--kube-api-qps=100")
