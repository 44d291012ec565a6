"""The example manifests, applied as a user (and a GitOps tool) would, against the real operator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputask.config import Config
from gputask.demo import apply, load_manifests
from gputask.k8s.client import EVENTS, GPUCLUSTERQUEUES, GPULOCALQUEUES, GPUTASKS, JOBS
from harness import REPO, Cluster, eventually, running_operator

EXAMPLES = REPO / "examples"


def files(folder: Path, *names: str) -> list[Path]:
    """The named YAML files of ``folder``, in order."""
    return [folder / n for n in names]


async def outcome(cluster: Cluster) -> dict[str, tuple[str, str, str | None]]:
    """namespace/name -> (phase, Admitted reason, node) of every GPUTask."""
    out = {}
    for task in await cluster.client.list(GPUTASKS):
        status = task.get("status") or {}
        admitted = next((c for c in status.get("conditions") or [] if c["type"] == "Admitted"), {})
        key = f"{task['metadata']['namespace']}/{task['metadata']['name']}"
        out[key] = (status.get("phase", ""), admitted.get("reason", ""), (status.get("placement") or {}).get("node"))
    return out


async def generations(cluster: Cluster) -> dict[str, Any]:
    """metadata.generation of every GPUTask, GPUClusterQueue and GPULocalQueue, and the Job names."""
    objs = await cluster.client.list(GPUTASKS) + await cluster.client.list(GPUCLUSTERQUEUES)
    objs += [{"metadata": {**q["metadata"], "name": f"{q['metadata']['namespace']}/{q['metadata']['name']}"}}
             for q in await cluster.client.list(GPULOCALQUEUES)]
    jobs = sorted(j["metadata"]["name"] for j in await cluster.client.list(JOBS))
    return {"objects": {o["metadata"]["name"]: o["metadata"].get("generation") for o in objs}, "jobs": jobs}


async def test_team_examples_admit_explain_preempt_and_survive_reapply(cluster: Cluster) -> None:
    """Two teams in a cohort, on top of the demo's own tasks (in the demo's tainted pool): each feature's task
    lands as documented, urgent preempts, re-applying changes nothing, the demo's tasks stay where they were."""
    demo = load_manifests(sorted(EXAMPLES.glob("*.yaml")))
    teams = EXAMPLES / "teams"
    first = files(teams, "00-namespaces.yaml", "10-priorityclasses.yaml", "20-queues.yaml", "30-tasks.yaml")
    async with running_operator(cluster, Config(cycleInterval=0.2)):
        for obj in demo:
            await apply(cluster.client, obj)

        async def demo_settled() -> dict[str, Any] | None:
            found = await outcome(cluster)
            return found if len(found) == 3 and all(v[0] == "Admitted" for v in found.values()) else None

        placed_demo = await eventually(demo_settled)
        assert {v[2] for v in placed_demo.values()} <= {"node-a", "node-b"}  # the pool is tainted
        for obj in load_manifests(first):
            await apply(cluster.client, obj)
        expected = {
            **placed_demo,
            "team-a/multi-gpu": ("Admitted", "Admitted", "node-c"),
            "team-b/a10-only": ("Admitted", "Admitted", "node-d"),
            # packing (the default) puts it on node-c's 16Gi card, where fragmentation against its
            # target workload grows least (bestfit: node-d)
            "team-b/quarter-gpu": ("Admitted", "Admitted", "node-c"),
            "team-a/too-big": ("Pending", "Inadmissible", None),
        }

        async def settled() -> dict[str, Any] | None:
            found = await outcome(cluster)
            return found if found == expected else None

        await eventually(settled)
        flavors = {f"{t['metadata']['namespace']}/{t['metadata']['name']}": (t.get("status") or {}).get("flavor")
                   for t in await cluster.client.list(GPUTASKS)}

        async def summaries() -> dict[str, str] | None:
            queues = [q for q in await cluster.client.list(GPUCLUSTERQUEUES) if q["metadata"]["name"] != "default"]
            found = {q["metadata"]["name"]: (q.get("status") or {}).get("flavorsSummary") for q in queues}
            admitted = {q["metadata"]["name"]: (q.get("status") or {}).get("admittedTasks") for q in queues}
            return found if admitted == {"team-a": 1, "team-b": 2} else None

        # rtx charges both RTX cards against 16Gi: multi-gpu's 2 x 6Gi is 750m, on the 8Gi card too
        assert (flavors, await eventually(summaries)) == (
            {"default/eval-fraction": None, "default/infer-whole": None, "default/train-small": None,
             "team-a/multi-gpu": "rtx", "team-a/too-big": None, "team-b/a10-only": "a10", "team-b/quarter-gpu": "rtx"},
            {"team-a": "rtx 750m/1500m, a10 0/0", "team-b": "rtx 250m/500m, a10 417m/1"},
        )
        before = await generations(cluster)
        for obj in load_manifests(first):  # what a GitOps tool does on every sync
            await apply(cluster.client, obj)
        for obj in load_manifests([teams / "40-urgent.yaml"]):
            await apply(cluster.client, obj)

        async def preempted() -> dict[str, Any] | None:
            found = await outcome(cluster)
            ok = found.get("team-a/urgent") == ("Admitted", "Admitted", "node-c")
            return found if ok and found["team-a/multi-gpu"][0] == "Pending" else None

        after = await eventually(preempted)
        assert after["team-a/multi-gpu"][1] in ("Preempted", "NoFit")
        warning = ("Warning", "Preempted", "preempted by team-a/urgent (priority 1000) in GPUClusterQueue 'team-a'")

        async def warned() -> bool:  # Events follow the status write they belong to
            return warning in await cluster.events_for("multi-gpu", "team-a")

        assert await eventually(warned)
        again = await generations(cluster)
        assert again["objects"] == {**before["objects"], "urgent": 1}
        assert {k: v for k, v in after.items() if k.startswith("default/")} == placed_demo
        assert sorted(k for k in again["objects"] if "/" in k) == ["default/default", "team-a/gpus", "team-b/gpus"]
        reasons = {e["reason"] for ns in ("team-a", "team-b") for e in await cluster.client.list(EVENTS, ns)}
        assert "DeprecatedQueueName" not in reasons  # every task names its namespace's GPULocalQueue

        async def counted() -> dict[str, tuple[int, int]] | None:
            found = {
                q["metadata"]["namespace"]: ((q.get("status") or {}).get("pendingTasks"),
                                             (q.get("status") or {}).get("admittedTasks"))
                for q in await cluster.client.list(GPULOCALQUEUES)
            }
            return found if found == {"default": (0, 3), "team-a": (2, 1), "team-b": (0, 2)} else None

        assert await eventually(counted)  # team-a: urgent admitted; multi-gpu and too-big wait
