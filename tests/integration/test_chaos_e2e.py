"""The fault-injection run of tests/chaos_e2e.py at CI size, and its invariant checks made to fail.

The run starts two real ``gputask run`` processes against the emulator and injects each fault
once (leader killed, paused past its Lease, 500s on Jobs, 409s on status, a GPUNode deleted,
Jobs completing while nobody leads, Lease renewals refused): no invariant may break and every
task must succeed. ``make chaos-e2e`` runs the larger one (300 tasks, 8 nodes, 20 faults).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chaos_e2e  # tests/chaos_e2e.py, a script (tests/ is on the path, as for harness)
from gputask.core import GpuSlot, NodeName, Placement
from gputask.k8s.jobs import PLACEMENT_ANNOTATION, TASK_UID_ANNOTATION, placement_annotation


def job(name: str, task_uid: str, gpus: list[tuple[str, int]], **status: Any) -> dict[str, Any]:
    """A Job as the operator writes it: placement and task annotations; ``status`` as the Job controller's."""
    slots = tuple(GpuSlot(i, uuid, mib) for i, (uuid, mib) in enumerate(gpus))
    return {
        "metadata": {
            "name": name,
            "annotations": {
                TASK_UID_ANNOTATION: task_uid,
                PLACEMENT_ANNOTATION: placement_annotation(Placement.one(NodeName("node-0"), slots)),
            },
        },
        "status": status,
    }


def task(name: str, uid: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid}, "status": status}


def test_the_checks_see_an_overcommitted_gpu_two_live_jobs_and_a_stale_status() -> None:
    settings = chaos_e2e.Settings(nodes=1, gpus_per_node=1)
    jobs = [job("a-1", "ua", [("GPU-0", 16384)]), job("a-2", "ua", [("GPU-0", 16384)])]
    assert chaos_e2e._safety(jobs, settings) == [
        f"GPU GPU-0 on node-0 holds 32768 MiB > {chaos_e2e.GPU_MIB}",
        "task ua has 2 live Jobs: ['a-1', 'a-2']",
        "queue default uses 1334m of nvidia.com/gpu > nominal 1000m",
    ]
    done = job("b-1", "ub", [("GPU-0", 8192)], conditions=[{"type": "Complete", "status": "True"}])
    assert chaos_e2e._converged([task("b", "ub", phase="Running", jobName="b-1"), task("c", "uc")], [done]) == [
        "task c has no status",
        "task b is Running on Job b-1, live: []",
    ]
    assert chaos_e2e._converged([task("b", "ub", phase="Succeeded")], [job("b-2", "ub", [("GPU-0", 1)])]) == [
        "task b is Succeeded with live Jobs ['b-2']"
    ]


async def test_every_fault_once_breaks_no_invariant_and_loses_no_task(tmp_path: Path) -> None:
    settings = chaos_e2e.Settings(tasks=16, nodes=2, faults=len(chaos_e2e.FAULTS), submit_window_s=4.0)
    report = await chaos_e2e.Run(settings, tmp_path).main()
    assert report.faults == list(chaos_e2e.FAULTS), report.faults  # each injected (a leader was there to hit)
    assert report.violations == []
    assert report.phases == {"Succeeded": 16}
