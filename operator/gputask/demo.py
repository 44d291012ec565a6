"""``gputask demo``: the real operator against the embedded API emulator, end to end.

Starts the emulator on 127.0.0.1, installs the CRDs, applies ``examples/*.yaml`` (Nodes,
simulated GPUNodes, a queue, GPUTasks) in name order, then runs the real kopf operator (which
rebuilds from the API and places every example task in its first cycle, the same way on every
run), waits for the pinned Jobs and prints them. ``--keep`` leaves everything running and prints a kubeconfig
so ``kubectl apply -f examples/20-gputask.yaml`` works against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gputask.config import Config
from gputask.k8s.client import (
    GPUCLUSTERQUEUES,
    GPULOCALQUEUES,
    GPUNODES,
    GPURESOURCEFLAVORS,
    GPUTASKS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    AlreadyExists,
    ApiError,
    KubeClient,
    Resource,
    load_api_client,
)
from gputask.k8s.jobs import PLACEMENT_ANNOTATION, TASK_UID_ANNOTATION, parse_placement
from gputask.k8s.main import build_operator, run_operator
from gputask.k8s.writer import now_rfc3339

KINDS: dict[str, Resource] = {
    "GPUTask": GPUTASKS,
    "GPUClusterQueue": GPUCLUSTERQUEUES,
    "GPULocalQueue": GPULOCALQUEUES,
    "GPUResourceFlavor": GPURESOURCEFLAVORS,
    "GPUNode": GPUNODES,
    "Node": NODES,
    "Namespace": NAMESPACES,
    "PriorityClass": PRIORITYCLASSES,
}


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def project_dir(name: str) -> Path:
    """A folder shipped beside the package (``crds``, ``examples``): package data or the repo's."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_data" / name, here.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the {name}/ folder next to {here}")


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every YAML document of ``paths`` (in the order given), skipping empty ones."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


def last_applied(obj: Mapping[str, Any]) -> str:
    """The ``kubectl.kubernetes.io/last-applied-configuration`` value kubectl writes for ``obj``, byte for byte (so
    a later ``kubectl apply`` of the same file finds nothing to change): Go's JSON of the object with its
    annotations but that one (an empty map kept), keys sorted, compact, ``<``, ``>`` and ``&`` escaped, a newline."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    text = json.dumps({**obj, "metadata": meta}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text + "\n"


async def apply(client: KubeClient, obj: Mapping[str, Any]) -> None:
    """Create or merge-patch one object as ``kubectl apply`` does (the last-applied-configuration annotation,
    unknown fields refused: ApiError 400 or 422); its ``status`` (if any) goes through /status."""
    res = KINDS.get(str(obj.get("kind")))
    if res is None:
        raise ValueError(f"demo cannot apply kind {obj.get('kind')!r}")
    meta = obj["metadata"]
    namespace = meta.get("namespace", "default") if res.namespaced else None
    annotations = {**(meta.get("annotations") or {}), LAST_APPLIED: last_applied(obj)}
    body = {k: v for k, v in obj.items() if k != "status"} | {"metadata": {**meta, "annotations": annotations}}
    try:
        await client.create(res, body, namespace, field_validation="Strict")
    except AlreadyExists:
        await client.patch(res, meta["name"], body, namespace, field_validation="Strict")
    if "status" in obj:
        status = dict(obj["status"])
        if res is GPUNODES:  # stands in for the agent: a fresh heartbeat, or the node counts as failed
            status["heartbeatTime"] = now_rfc3339()
        await client.patch(res, meta["name"], {"status": status}, namespace, status=True, field_validation="Strict")


async def keep_heartbeats(client: KubeClient, names: list[str], interval_s: float = 20.0) -> None:
    """Refresh the simulated GPUNodes' heartbeat like an agent would, until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        for name in names:
            await client.patch(GPUNODES, name, {"status": {"heartbeatTime": now_rfc3339()}}, status=True)


async def run_pods(client: KubeClient, interval_s: float = 1.0) -> None:
    """Stand in for the Job controller and the kubelet, until cancelled: each pinned Job gets one pod, bound to
    its placement's node and Running (the emulator runs no pods; without them every task would be evicted as
    PodsNotStarting after podStartTimeout). A deleted Job's pod goes with it (ownerReference, garbage
    collection)."""
    while True:
        try:
            jobs = await client.list(JOBS, labels="gputask.io/task")
            pods = {(p["metadata"].get("namespace"), p["metadata"]["name"])
                    for p in await client.list(PODS, labels="gputask.io/task")}
            for job in jobs:
                meta = job["metadata"]
                namespace, name = meta.get("namespace") or "default", f"{meta['name']}-pod"
                if meta.get("deletionTimestamp") or (namespace, name) in pods:
                    continue
                await client.create(PODS, demo_pod(job, name), namespace)
                await client.patch(PODS, name, {"status": {"phase": "Running", "conditions": [
                    {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}},
                    namespace, status=True)
        except (ApiError, KeyError):  # a Job deleted meanwhile, an injected error: the next round tries again
            pass
        await asyncio.sleep(interval_s)


def demo_pod(job: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The pod a Job's controller would create for it, bound to the node of the Job's placement."""
    meta, template = job["metadata"], job["spec"]["template"]
    placement = parse_placement((meta.get("annotations") or {}).get(PLACEMENT_ANNOTATION))
    labels = {**(template.get("metadata") or {}).get("labels", {}), "job-name": meta["name"],
              "batch.kubernetes.io/job-name": meta["name"]}
    spec = dict(template["spec"])
    if placement is not None:
        spec["nodeName"] = placement.only().node
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": True,
             "blockOwnerDeletion": True}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "ownerReferences": [owner]}, "spec": spec}


async def wait_for_jobs(client: KubeClient, timeout_s: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Poll until every GPUTask has a Job or is Failed, or ``timeout_s`` passes; returns (tasks, jobs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = await client.list(GPUTASKS)
        jobs = await client.list(JOBS, labels="gputask.io/task")
        owners = {(j["metadata"].get("annotations") or {}).get(TASK_UID_ANNOTATION) for j in jobs}
        settled = all(
            t["metadata"].get("uid") in owners or (t.get("status") or {}).get("phase") == "Failed" for t in tasks
        )
        if (tasks and settled) or time.monotonic() > deadline:
            return tasks, jobs
        await asyncio.sleep(0.2)


def jobs_table(tasks: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> Table:
    """Task, node, GPU UUIDs, MiB per GPU and Job name; pending tasks show their reason."""
    table = Table(title="GPUTasks and their pinned Jobs")
    for column in ("task", "node", "GPU UUIDs", "MiB per GPU", "Job"):
        table.add_column(column)
    by_uid = {(j["metadata"].get("annotations") or {}).get(TASK_UID_ANNOTATION): j for j in jobs}
    for task in sorted(tasks, key=lambda t: (t["metadata"].get("namespace", ""), t["metadata"]["name"])):
        name = f"{task['metadata'].get('namespace', 'default')}/{task['metadata']['name']}"
        job = by_uid.get(task["metadata"].get("uid"))
        annotations = ((job or {}).get("metadata") or {}).get("annotations") or {}
        placement = parse_placement(annotations.get(PLACEMENT_ANNOTATION))
        if job is None or placement is None:
            status = task.get("status") or {}
            why = f"({status.get('phase', 'Pending')}: {status.get('message', '')})"
            table.add_row(escape(name), "-", "-", "-", escape(why))
            continue
        table.add_row(
            escape(name),
            escape(placement.only().node),
            ", ".join(g.uuid for g in placement.only().gpus),
            ", ".join(str(g.memory_mib) for g in placement.only().gpus),
            escape(job["metadata"]["name"]),
        )
    return table


async def run_demo(*, keep: bool, port: int, workdir: Path, timeout_s: float = 60.0) -> int:
    """The whole demo; returns the exit code (0 when every example task got its Job)."""
    from gputask.testing import EmulatorServer

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a pipe or CI log: do not cut UUIDs at 80 columns
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = workdir / "kubeconfig"
    async with EmulatorServer(port=port) as server:
        server.install_crds_from(project_dir("crds"))
        server.write_kubeconfig(kubeconfig)
        console.print(f"[bold]emulated API server[/] {server.url}  (kubeconfig: {kubeconfig})")
        client = KubeClient(load_api_client(str(kubeconfig)))
        examples = sorted(project_dir("examples").glob("*.yaml"))
        manifests = load_manifests(examples)
        # Everything before the operator starts, so its first cycle sees every task (applied under a running
        # operator, cycles interleave with the creates); the tasks within one second of creationTimestamp (its
        # resolution), so they are ordered by name alone: every run places them alike.
        tasks = [o for o in manifests if o.get("kind") == "GPUTask"]
        try:
            for obj in manifests:
                if obj.get("kind") != "GPUTask":
                    await apply(client, obj)
            await asyncio.sleep(1.0 - time.time() % 1.0 + 0.01)
            for obj in tasks:
                await apply(client, obj)
        except ApiError as exc:  # an example edited into something the API server refuses (gpuMemroy: 4Gi)
            refused = f"gputask demo: the API server refused an example: {exc.message}"
            console.print(refused, markup=False, soft_wrap=True)
            await client.close()
            return 2
        operator = build_operator(Config(cycleInterval=0.5), kubeconfig=str(kubeconfig))
        stop = asyncio.Event()
        runner = asyncio.create_task(run_operator(operator, stop_flag=stop))
        gpunodes = [o["metadata"]["name"] for o in manifests if o.get("kind") == "GPUNode"]
        heartbeats = asyncio.create_task(keep_heartbeats(client, gpunodes))
        kubelet = asyncio.create_task(run_pods(client))
        console.print(f"applied {', '.join(p.name for p in examples)}")
        tasks, jobs = await wait_for_jobs(client, timeout_s)
        console.print(jobs_table(tasks, jobs))
        ok = bool(tasks) and len(jobs) >= len(tasks)
        if keep:
            console.print(
                f"\nThe operator keeps running. In another shell:\n"
                f"  export KUBECONFIG={kubeconfig.resolve()}\n"
                f"  kubectl apply -f examples/20-gputask.yaml   # or your own GPUTask\n"
                f"  kubectl get gt,jobs -A\n"
                f"(the emulator refuses fields the CRDs do not declare, as kube-apiserver does, but checks\n"
                f"few other schema rules, so it accepts some specs a real API server would refuse)\n"
                f"Press Ctrl-C to stop."
            )
            with contextlib.suppress(asyncio.CancelledError):
                await runner  # kopf owns SIGINT/SIGTERM: it returns when one arrives
        heartbeats.cancel()
        kubelet.cancel()
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(runner, timeout=10)
        await client.close()
    if not ok:
        console.print("[red]not every task got a Job[/]")
        console.print(json.dumps([t.get("status") for t in tasks], indent=1), markup=False)
    return 0 if ok else 1
