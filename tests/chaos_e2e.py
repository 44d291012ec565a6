"""Fault injection with real operator processes against the API emulator, invariants read from the API.

Two ``gputask run`` processes (leader election on, a short Lease) schedule GPUTasks on emulated GPU
nodes while this process plays the kubelet (a Job's pod runs, then its Job completes) and injects
the faults an operator meets: the leader killed (SIGKILL), the leader paused past its Lease and
resumed (SIGSTOP, SIGCONT), 500s on Job creates and deletes, 409s on status writes, a GPUNode
deleted and written again, Jobs completing while nobody leads, 503s on Lease renewals past the
renew deadline, Job creates and deletes and status writes served with their answer lost (the connection
dropped, as by an API server killed between etcd and its answer). From API state alone it checks, every second
and after each fault:

- no GPU holds more MiB than it has (placement annotations of every unfinished Job, terminating
  ones included: their pods still run);
- at most one live Job per task;
- no queue uses more than its nominal quota;

and, after each fault once things settle, that every status has caught up with the Jobs (within
``converge_s``): every task has a phase, an Admitted or Running task names its live Job, and no
live Job belongs to a task in another phase. At the end every task must have Succeeded (nothing lost).

``python tests/chaos_e2e.py --tasks 300 --nodes 8 --faults 20`` (``make chaos-e2e``) prints the figures
as JSON; tests/integration/test_chaos_e2e.py runs a small one in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gputask.k8s.client import (
    GPUCLUSTERQUEUES,
    GPUNODES,
    GPUTASKS,
    JOBS,
    LEASES,
    NODES,
    PODS,
    KubeClient,
    NotFound,
    load_api_client,
)
from gputask.k8s.jobs import PLACEMENT_ANNOTATION, TASK_UID_ANNOTATION, parse_placement
from gputask.k8s.writer import now_rfc3339
from gputask.testing import EmulatorServer

REPO = Path(__file__).resolve().parents[1]
GPU_MIB = 24576
FAULTS = ("kill", "pause", "job-500", "status-409", "gpunode", "kill-while-completing", "lease-503", "lost-answer")


@dataclass
class Settings:
    """How big a run is and how fast its clocks tick (seconds)."""

    tasks: int = 30
    nodes: int = 3
    gpus_per_node: int = 2
    faults: int = 6
    seed: int = 1
    replicas: int = 2
    lease_s: float = 3.0
    renew_deadline_s: float = 2.0
    retry_s: float = 0.5
    duration_s: tuple[float, float] = (2.0, 6.0)
    submit_window_s: float = 10.0
    settle_s: float = 5.0
    converge_s: float = 3.0  # how long a status may lag its Job (a cycle, a watch event, a retried write)
    finish_timeout_s: float = 120.0


@dataclass
class Report:
    """What a run found: faults injected, invariant breaks (each with when and which fault came before)."""

    settings: dict[str, Any]
    faults: list[str] = field(default_factory=list)
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    phases: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    job_creates_refused: int = 0

    def ok(self) -> bool:
        """No violation and every task Succeeded."""
        return not self.violations and set(self.phases) == {"Succeeded"}


class Run:
    """One chaos run: the emulator here, the operators in processes, the kubelet and the faults here."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.s, self.workdir = settings, workdir
        self.rng = random.Random(settings.seed)
        self.report = Report({k: v for k, v in vars(settings).items()})
        self.processes: dict[int, asyncio.subprocess.Process] = {}  # replica number -> process
        self.durations: dict[str, float] = {}  # task name -> seconds of running
        self.client: KubeClient
        self.server: EmulatorServer
        self.started = 0.0

    # -- set-up ---------------------------------------------------------------------------------------
    async def main(self) -> Report:
        started = self.started = time.monotonic()
        async with EmulatorServer() as self.server:
            self.server.install_crds_from(REPO / "crds")
            kubeconfig = self.server.write_kubeconfig(self.workdir / "kubeconfig")
            self.client = KubeClient(load_api_client(str(kubeconfig), user_agent="chaos"), field_manager="chaos")
            await self._cluster()
            config = self.workdir / "config.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "gputask.io/v1alpha1",
                        "kind": "Configuration",
                        "cycleInterval": 0.5,
                        "leaderElection": True,
                        "leaseDuration": self.s.lease_s,
                        "leaseRenewDeadline": self.s.renew_deadline_s,
                        "leaseRenewInterval": self.s.retry_s,
                        "nodeFailureGracePeriod": 30,
                        "podStartTimeout": 600,
                    }
                )
            )
            for replica in range(self.s.replicas):
                await self._start(replica, kubeconfig, config)
            background = [
                asyncio.create_task(c) for c in (self._kubelet(), self._heartbeats(), self._submit(), self._watch())
            ]
            try:
                await self._faults(kubeconfig, config)
                await self._finish()
            finally:
                for task in background:
                    task.cancel()
                await self._stop_all()
                await self.client.close()
        self.report.seconds = round(time.monotonic() - started, 1)
        self.report.job_creates_refused = sum(
            1 for a in self.server.emulator.answers if a.method == "POST" and "/jobs" in a.path and a.status >= 500
        )
        return self.report

    async def _cluster(self) -> None:
        for n in range(self.s.nodes):
            name = f"node-{n}"
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            }
            await self.client.create(NODES, node)
            await self.client.patch(
                NODES, name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, status=True
            )
            await self._gpunode(name)
        quota = 1000 * self.s.nodes * self.s.gpus_per_node
        queue = {
            "apiVersion": "gputask.io/v1alpha1",
            "kind": "GPUClusterQueue",
            "metadata": {"name": "default"},
            "spec": {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": f"{quota}m"}]},
        }
        await self.client.create(GPUCLUSTERQUEUES, queue)

    async def _gpunode(self, name: str) -> None:
        gpus = [
            {
                "index": i,
                "uuid": f"GPU-{name}-{i}",
                "product": "NVIDIA-A10",
                "memory": f"{GPU_MIB}Mi",
                "memoryUsed": "0",
                "healthy": True,
            }
            for i in range(self.s.gpus_per_node)
        ]
        with contextlib.suppress(Exception):
            await self.client.create(
                GPUNODES, {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": name}}
            )
        await self.client.patch(GPUNODES, name, {"status": {"gpus": gpus, "heartbeatTime": now_rfc3339()}}, status=True)

    async def _start(self, replica: int, kubeconfig: Path, config: Path) -> None:
        log = open(self.workdir / f"operator-{replica}.log", "ab")  # noqa: SIM115 (kept open for the process)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gputask.cli",
            "run",
            "--config",
            str(config),
            "--kubeconfig",
            str(kubeconfig),
            stdout=log,
            stderr=log,
            env={**os.environ, "POD_NAMESPACE": "default"},
        )
        self.processes[replica] = process

    async def _stop_all(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for process in self.processes.values():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 10)
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    # -- the world around the operator ----------------------------------------------------------------
    async def _submit(self) -> None:
        sizes = ["4Gi", "8Gi", "12Gi", "20Gi", None]
        for i in range(self.s.tasks):
            name = f"t{i:04d}"
            self.durations[name] = self.rng.uniform(*self.s.duration_s)
            spec: dict[str, Any] = {
                "queueName": "default",
                "gpus": 1,
                "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            }
            size = self.rng.choice(sizes)
            if size:
                spec["gpuMemory"] = size
            body = {
                "apiVersion": "gputask.io/v1alpha1",
                "kind": "GPUTask",
                "metadata": {"name": name, "namespace": "default"},
                "spec": spec,
            }
            await self.client.create(GPUTASKS, body, "default")
            await asyncio.sleep(self.s.submit_window_s / max(1, self.s.tasks))

    async def _kubelet(self) -> None:
        """Each Job gets a Running pod, and completes after its task's duration (pod Succeeded)."""
        started: dict[str, float] = {}
        while True:
            for job in await self.client.list(JOBS, "default"):
                meta = job["metadata"]
                if meta.get("deletionTimestamp") or _finished(job):
                    continue
                name = meta["name"]
                if name not in started:
                    started[name] = time.monotonic()
                    await self._pod(job)
                task = (job["metadata"].get("labels") or {}).get("gputask.io/task", "")
                if time.monotonic() - started[name] > self.durations.get(task, 1.0):
                    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
                    with contextlib.suppress(NotFound):
                        await self.client.patch(JOBS, name, done, "default", status=True)
            await asyncio.sleep(0.3)

    async def _pod(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": True}
        labels = {
            **(job["spec"]["template"]["metadata"].get("labels") or {}),
            "batch.kubernetes.io/job-name": meta["name"],
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-pod",
                "namespace": "default",
                "labels": labels,
                "ownerReferences": [owner],
            },
            "spec": job["spec"]["template"]["spec"],
        }
        with contextlib.suppress(Exception):
            await self.client.create(PODS, pod, "default")
            await self.client.patch(
                PODS, pod["metadata"]["name"], {"status": {"phase": "Running"}}, "default", status=True
            )

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(5)
            for n in range(self.s.nodes):
                with contextlib.suppress(NotFound):
                    await self.client.patch(
                        GPUNODES, f"node-{n}", {"status": {"heartbeatTime": now_rfc3339()}}, status=True
                    )

    # -- faults ---------------------------------------------------------------------------------------
    async def _leader(self) -> int | None:
        try:
            lease = await self.client.get(LEASES, "gputask-operator", "default")
        except NotFound:
            return None
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        return next((r for r, p in self.processes.items() if f"-{p.pid}-" in holder), None)

    async def _faults(self, kubeconfig: Path, config: Path) -> None:
        await asyncio.sleep(self.s.settle_s)
        for i in range(self.s.faults):
            kind = FAULTS[i % len(FAULTS)] if i < len(FAULTS) else self.rng.choice(FAULTS)
            self.report.faults.append(await self._inject(kind, kubeconfig, config))
            await asyncio.sleep(self.s.settle_s)
            await self.check(f"after fault {i + 1} ({kind})")

    async def _inject(self, kind: str, kubeconfig: Path, config: Path) -> str:
        """Inject one fault; what was done (a fault on the leader when none leads says so)."""
        leader = await self._leader()
        emulator = self.server.emulator
        waited = 0.0
        while kind in ("kill", "kill-while-completing", "pause") and leader is None and waited < 4 * self.s.lease_s:
            await asyncio.sleep(self.s.retry_s)  # a slow machine: the replicas may not have elected one yet
            waited += self.s.retry_s
            leader = await self._leader()
        if kind in ("kill", "kill-while-completing", "pause") and leader is None:
            return f"{kind} (skipped: no leader)"
        if kind in ("kill", "kill-while-completing") and leader is not None:
            self.processes[leader].kill()
            await self.processes[leader].wait()
            if kind == "kill-while-completing":  # Jobs end while nobody leads
                for job in [j for j in await self.client.list(JOBS, "default") if _live(j)][:3]:
                    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
                    with contextlib.suppress(NotFound):
                        await self.client.patch(JOBS, job["metadata"]["name"], done, "default", status=True)
            await asyncio.sleep(1.0)
            await self._start(leader, kubeconfig, config)
        elif kind == "pause" and leader is not None:
            self.processes[leader].send_signal(signal.SIGSTOP)
            await asyncio.sleep(self.s.lease_s + 1.5)
            self.processes[leader].send_signal(signal.SIGCONT)
        elif kind == "job-500":
            emulator.inject("POST", "/jobs", 500, times=3, message="etcdserver: request timed out")
            emulator.inject("DELETE", "/jobs/", 500, times=2, message="etcdserver: request timed out")
        elif kind == "lost-answer":  # served, then the connection dropped: the API server killed before answering
            emulator.inject("POST", "/jobs", served=True, times=3)
            emulator.inject("DELETE", "/jobs/", served=True, times=2)
            emulator.inject("PATCH", "/gputasks/", served=True, times=2)
        elif kind == "status-409":
            emulator.inject("PATCH", "/gputasks/", 409, times=5, message="the object has been modified")
        elif kind == "lease-503":  # the leader cannot renew past its deadline: it steps down, then leads again
            emulator.inject("PUT", "/leases/", 503, times=int(self.s.renew_deadline_s / self.s.retry_s) + 2,
                            message="the server is currently unable to handle the request")
        elif kind == "gpunode":
            name = f"node-{self.rng.randrange(self.s.nodes)}"
            with contextlib.suppress(NotFound):
                await self.client.delete(GPUNODES, name)
            await asyncio.sleep(1.0)
            await self._gpunode(name)
        return kind

    async def _finish(self) -> None:
        deadline = time.monotonic() + self.s.finish_timeout_s
        while time.monotonic() < deadline:
            tasks = await self.client.list(GPUTASKS, "default")
            if len(tasks) == self.s.tasks and all((t.get("status") or {}).get("phase") == "Succeeded" for t in tasks):
                break
            await asyncio.sleep(1.0)
        await self.check("at the end")
        for task in await self.client.list(GPUTASKS, "default"):
            phase = (task.get("status") or {}).get("phase") or "none"
            self.report.phases[phase] = self.report.phases.get(phase, 0) + 1

    # -- invariants -----------------------------------------------------------------------------------
    async def _watch(self) -> None:
        """The invariants that hold at every moment, checked every second."""
        while True:
            await asyncio.sleep(1.0)
            jobs = await self.client.list(JOBS, "default")
            self.report.checks += 1
            self.report.violations += [
                f"at {time.monotonic() - self.started:.0f}s: {line}" for line in _safety(jobs, self.s)
            ]

    async def check(self, when: str) -> None:
        """Check the invariants from API state; each break is recorded with ``when``."""
        self.report.checks += 1
        jobs = await self.client.list(JOBS, "default")
        tasks = await self.client.list(GPUTASKS, "default")
        out = _safety(jobs, self.s)
        lagging = set(_converged(tasks, jobs))
        if lagging:  # a status follows its Job by a cycle or two: only what stays wrong counts
            await asyncio.sleep(self.s.converge_s)
            jobs = await self.client.list(JOBS, "default")
            lagging &= set(_converged(await self.client.list(GPUTASKS, "default"), jobs))
        self.report.violations += [f"{when}: {line}" for line in [*out, *sorted(lagging)]]


def _finished(job: dict[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _live(job: dict[str, Any]) -> bool:
    return not job["metadata"].get("deletionTimestamp") and not _finished(job)


def _gpu_memory(jobs: list[dict[str, Any]]) -> list[str]:
    used: dict[tuple[str, str], int] = {}
    for job in jobs:
        placement = parse_placement((job["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION))
        if placement is None or _finished(job):
            continue
        for slot in placement.only().gpus:
            used[(placement.only().node, slot.uuid)] = used.get((placement.only().node, slot.uuid), 0) + slot.memory_mib
    return [
        f"GPU {uuid} on {node} holds {mib} MiB > {GPU_MIB}"
        for (node, uuid), mib in sorted(used.items())
        if mib > GPU_MIB
    ]


def _one_live_job(jobs: list[dict[str, Any]]) -> list[str]:
    by_task: dict[str, list[str]] = {}
    for job in filter(_live, jobs):
        by_task.setdefault(str(job["metadata"]["annotations"].get(TASK_UID_ANNOTATION)), []).append(
            job["metadata"]["name"]
        )
    return [
        f"task {uid} has {len(names)} live Jobs: {sorted(names)}" for uid, names in by_task.items() if len(names) > 1
    ]


def _safety(jobs: list[dict[str, Any]], settings: Settings) -> list[str]:
    """What must hold at every moment: GPU memory, one live Job per task, the queue's quota."""
    return [*_gpu_memory(jobs), *_one_live_job(jobs), *_quota(jobs, settings)]


def _converged(tasks: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> list[str]:
    """What a status that has caught up with the Jobs satisfies: it has a phase, and says the live Job."""
    out = [f"task {t['metadata']['name']} has no status" for t in tasks if not (t.get("status") or {}).get("phase")]
    return out + _status_matches(tasks, jobs)


def _status_matches(tasks: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> list[str]:
    live = {job["metadata"]["name"]: job for job in filter(_live, jobs)}
    out = []
    for task in tasks:
        status, uid = task.get("status") or {}, task["metadata"]["uid"]
        ours = sorted(n for n, j in live.items() if j["metadata"]["annotations"].get(TASK_UID_ANNOTATION) == uid)
        if status.get("phase") in ("Admitted", "Running") and status.get("jobName") not in ours:
            out.append(
                f"task {task['metadata']['name']} is {status['phase']} on Job {status.get('jobName')}, live: {ours}"
            )
        if ours and status.get("phase") not in ("Admitted", "Running"):
            out.append(f"task {task['metadata']['name']} is {status.get('phase')} with live Jobs {ours}")
    return out


def _quota(jobs: list[dict[str, Any]], settings: Settings) -> list[str]:
    milli = 0
    for job in filter(_live, jobs):
        placement = parse_placement((job["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION))
        milli += sum(math.ceil(s.memory_mib * 1000 / GPU_MIB) for s in placement.only().gpus) if placement else 0
    nominal = 1000 * settings.nodes * settings.gpus_per_node
    return [f"queue default uses {milli}m of nvidia.com/gpu > nominal {nominal}m"] if milli > nominal else []


def main() -> int:
    """``python tests/chaos_e2e.py``: run, print the report as JSON, exit 1 on any violation or lost task."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="Keep the operators' logs here (default: a temporary folder).")
    args = parser.parse_args()
    settings = Settings(
        tasks=args.tasks,
        nodes=args.nodes,
        faults=args.faults,
        seed=args.seed,
        submit_window_s=args.tasks / 5,
        finish_timeout_s=300,
    )
    with tempfile.TemporaryDirectory(prefix="gputask-chaos-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(Run(settings, workdir).main())
    print(json.dumps(vars(report), indent=1))
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
