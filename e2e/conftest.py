"""The kind cluster the suite runs on: created once, the operator image built and loaded, the chart
installed with fake GPUs, torn down at the end (unless GPUTASK_E2E_KEEP=1).

Environment:
- ``GPUTASK_E2E_CLUSTER``: kind cluster name (default ``gputask-e2e``); it must not exist yet.
- ``KIND_NODE_IMAGE``: node image for ``kind create cluster --image`` (default: kind's own).
- ``GPUTASK_E2E_KEEP=1``: keep the cluster afterwards (its kubeconfig path is printed).
Diagnostics (operator and agent logs, objects, Events) land in ``e2e/.artifacts/`` after each run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kindtools import KIND_CONFIG, KIND_VALUES, ROOT, Kube, kind_image, run, wait_until

import helmtool

RELEASE, NAMESPACE = "gputask", "gputask-system"
WORKLOAD_IMAGE = "busybox:1.36"  # what examples/ and the tests run; loaded so nodes need no registry
ARTIFACTS = Path(__file__).resolve().parent / ".artifacts"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A kind cluster with gputask installed from the chart, fake GPUs on both workers."""
    name = os.environ.get("GPUTASK_E2E_CLUSTER", "gputask-e2e")
    if name in run(["kind", "get", "clusters"]).split():
        pytest.fail(f"kind cluster {name!r} exists: `kind delete cluster --name {name}` or set GPUTASK_E2E_CLUSTER")
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    create = ["kind", "create", "cluster", "--name", name, "--config", str(KIND_CONFIG)]
    create += ["--kubeconfig", str(kubeconfig), "--wait", "180s"]
    if os.environ.get("KIND_NODE_IMAGE"):
        create += ["--image", os.environ["KIND_NODE_IMAGE"]]
    kube = Kube(kubeconfig, cluster=name)
    try:
        run(create, timeout_s=900)
        load_images(name)
        install_chart(kube)
        wait_for_gpunodes(kube)
        yield kube
    finally:
        save_artifacts(kube)
        if os.environ.get("GPUTASK_E2E_KEEP") == "1":
            print(f"\nkept kind cluster {name}: export KUBECONFIG={kubeconfig}")
        else:
            run(["kind", "delete", "cluster", "--name", name], check=False)


def load_images(cluster: str) -> None:
    """Build the operator image from the repository's Dockerfile and load it and the workload image into kind."""
    image = kind_image()
    run(["docker", "build", "--tag", image, str(ROOT)], timeout_s=1200)
    run(["kind", "load", "docker-image", image, "--name", cluster], timeout_s=600)
    have_workload = run(["docker", "image", "inspect", WORKLOAD_IMAGE], check=False)
    if not have_workload.strip() or have_workload.strip() == "[]":
        run(["docker", "pull", WORKLOAD_IMAGE], timeout_s=600)
    run(["kind", "load", "docker-image", WORKLOAD_IMAGE, "--name", cluster], timeout_s=600)


def install_chart(kube: Kube) -> None:
    """helm install the chart with the kind values and wait until the operator and the agents are ready."""
    helm = helmtool.find_helm() or str(helmtool.install_helm())
    args = ["install", RELEASE, str(helmtool.CHART), "--namespace", NAMESPACE, "--create-namespace"]
    args += ["--values", str(KIND_VALUES), "--kubeconfig", str(kube.kubeconfig), "--wait", "--timeout", "5m"]
    helmtool.helm_run(helm, *args)


def wait_for_gpunodes(kube: Kube) -> None:
    """Wait until each fake-GPU worker's agent has reported its two GPUs in a GPUNode."""
    workers = {n["metadata"]["name"] for n in kube.list("nodes", "-l", "gputask.io/fake-gpus=true")}

    def reported() -> bool:
        gpunodes = {g["metadata"]["name"]: (g.get("status") or {}).get("gpus") or [] for g in kube.list("gpunodes")}
        return all(len(gpunodes.get(worker, [])) == 2 for worker in workers)

    wait_until(reported, timeout_s=180, what=f"GPUNodes with 2 fake GPUs for {sorted(workers)}")


def save_artifacts(kube: Kube) -> None:
    """Write logs, objects and Events to e2e/.artifacts/<time>/ for diagnosis; never fails the run."""
    folder = ARTIFACTS / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    commands = {
        "operator.log": [
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/component=operator",
            "--prefix",
            "--tail=-1",
        ],
        "agent.log": ["logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent", "--prefix", "--tail=-1"],
        "objects.txt": ["get", "nodes,gpunodes,gcq,gt,jobs,pods,leases", "-A", "-o", "wide"],
        "objects.yaml": ["get", "gpunodes,gcq,gt,jobs", "-A", "-o", "yaml"],
        "events.txt": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
    }
    for file, args in commands.items():
        try:
            (folder / file).write_text(kube.kubectl(*args, check=False, timeout_s=60))
        except Exception as exc:  # a cluster that never came up has nothing to show
            (folder / file).write_text(f"could not collect: {exc}\n")
