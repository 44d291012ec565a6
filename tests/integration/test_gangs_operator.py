"""Gangs through the real operator on the HTTP emulator: a GPUTask of two PodSets (1 launcher + 3 workers, one GPU
each) over nodes of two GPUs gets one Indexed Job per PodSet and a headless Service; each pod, made here as the Job
controller makes it (gated, its completion index in an annotation and a label), is pinned by the operator's merge
patch to its own node and GPUs and ungated (the emulator refuses pod updates the API server refuses); the task is
Running only once all 4 pods run. A failed node under one pod re-places the whole gang (attempt 2, every Job of
attempt 1 deleted); a gang whose pods do not all start within podStartTimeout is evicted whole (PodsNotStarting)."""

from __future__ import annotations

from typing import Any

from gputask.config import Config
from gputask.k8s.client import JOBS, NODES, PODS, NotFound
from gputask.k8s.gangjobs import DEVICES_ANNOTATION, INDEX_KEY, PLACEMENT_GATE
from gputask.k8s.handlers import Operator
from gputask.k8s.resources import SERVICES
from harness import Cluster, eventually, gputask, running_operator

FAST = Config(cycleInterval=0.2, nodeFailureGracePeriod=1)
TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "pytorch"}]}}
POD_SETS = [{"name": "launcher", "count": 1, "gpus": 1, "template": TEMPLATE},
            {"name": "workers", "count": 3, "gpus": 1, "template": TEMPLATE}]
UUIDS = {f"node-{n}": (f"GPU-{n}0", f"GPU-{n}1") for n in "abc"}


async def add_nodes(cluster: Cluster, *names: str) -> None:
    """Nodes of two A10s each, and the open queue."""
    for name in names:
        await cluster.add_node(name, *((uuid, "NVIDIA-A10", "24Gi") for uuid in UUIDS[name]))
    await cluster.add_queue()


def gang(name: str = "g", **spec: Any) -> dict[str, Any]:
    """The 4-pod gang: launcher 1 + workers 3, one whole GPU each."""
    body = gputask(name, podSets=POD_SETS, **spec)
    for one_pod in ("gpus", "template"):
        body["spec"].pop(one_pod)
    return body


async def jobs_of(cluster: Cluster, attempt: int) -> list[dict[str, Any]] | None:
    """The gang's two Jobs of ``attempt`` (launcher, workers), or None until both exist."""
    jobs = []
    for pod_set in ("launcher", "workers"):
        try:
            jobs.append(await cluster.client.get(JOBS, f"g-{attempt}-{pod_set}", "default"))
        except NotFound:
            return None
    return jobs


async def make_pods(cluster: Cluster, job: dict[str, Any]) -> list[str]:
    """Create the pods of Indexed Job ``job`` as the Job controller does (v1.28): one per completion index, named
    ``<job>-<index>-<suffix>``, the template's labels and annotations with the job-name and completion-index ones,
    owned by the Job, hostname ``<job>-<index>``; returns their names."""
    template, name = job["spec"]["template"], job["metadata"]["name"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"], "controller": True,
             "blockOwnerDeletion": True}
    names = []
    for index in range(job["spec"]["completions"]):
        labels = {**template["metadata"]["labels"], "batch.kubernetes.io/job-name": name, "job-name": name,
                  INDEX_KEY: str(index)}
        meta = {"name": f"{name}-{index}-x7k2p", "namespace": "default", "labels": labels,
                "annotations": {**template["metadata"].get("annotations", {}), INDEX_KEY: str(index)},
                "ownerReferences": [owner]}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
               "spec": {**template["spec"], "hostname": f"{name}-{index}"}}
        names.append((await cluster.client.create(PODS, pod, "default"))["metadata"]["name"])
    return names


def pinned_node(pod: dict[str, Any]) -> list[str]:
    """The nodes a pod's required node affinity allows by name: in each term the intersection of its matchFields
    ``metadata.name In`` requirements (the Job's: its PodSet's nodes; the pin's: the pod's own), over all terms."""
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    allowed: set[str] = set()
    for term in terms:
        sets = [set(f["values"]) for f in term.get("matchFields") or [] if f["key"] == "metadata.name"]
        allowed |= set.intersection(*sets) if sets else {"*"}
    return sorted(allowed)


async def pinned(cluster: Cluster, names: list[str]) -> list[dict[str, Any]] | None:
    """The pods ``names`` once every one is ungated (pinned), else None."""
    pods = [await cluster.client.get(PODS, name, "default") for name in names]
    return pods if all(not p["spec"].get("schedulingGates") for p in pods) else None


async def run_pod(cluster: Cluster, name: str) -> None:
    """Pod ``name`` is Running, as its kubelet writes it."""
    await cluster.client.patch(PODS, name, {"status": {"phase": "Running"}}, "default", status=True)


async def status_of(cluster: Cluster) -> dict[str, Any]:
    return (await cluster.task("g")).get("status") or {}


async def admitted_gang(cluster: Cluster) -> tuple[list[dict[str, Any]], list[str]]:
    """Submit the gang, wait for its Jobs of attempt 1, create their pods; returns the Jobs and the pod names (the
    launcher's first, then workers 0..2)."""
    await cluster.submit(gang())
    jobs = await eventually(lambda: jobs_of(cluster, 1))
    return jobs, [name for job in jobs for name in await make_pods(cluster, job)]


async def test_a_four_pod_gang_gets_its_indexed_jobs_each_pod_pinned_and_runs_when_all_four_do(
        cluster: Cluster) -> None:
    await add_nodes(cluster, "node-a", "node-b")
    async with running_operator(cluster, FAST) as operator:
        jobs, names = await admitted_gang(cluster)
        assert [(j["spec"]["completionMode"], j["spec"]["completions"], j["spec"]["parallelism"]) for j in jobs] == [
            ("Indexed", 1, 1), ("Indexed", 3, 3)]
        assert all(j["spec"]["template"]["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}] for j in jobs)
        service = await cluster.client.get(SERVICES, "g", "default")
        assert (service["spec"]["clusterIP"], service["spec"]["selector"]) == ("None", {"gputask.io/task": "g"})
        pods = await eventually(lambda: pinned(cluster, names))
        placed = (await status_of(cluster))["placement"]["pods"]
        assert [(p["podSet"], p["index"]) for p in placed] == [("launcher", 0), ("workers", 0), ("workers", 1),
                                                               ("workers", 2)]
        assert sorted(p["node"] for p in placed) == ["node-a", "node-a", "node-b", "node-b"]
        for pod, place in zip(pods, placed, strict=True):  # each pod on its own placed node and GPU
            (gpu,) = place["gpus"]
            assert (pinned_node(pod), pod["metadata"]["annotations"][DEVICES_ANNOTATION]) == (
                [place["node"]], UUIDS[place["node"]][gpu["index"]])
        assert len({p["metadata"]["annotations"][DEVICES_ANNOTATION] for p in pods}) == 4
        for name in names[:3]:
            await run_pod(cluster, name)

        async def three_seen() -> bool:  # the operator has read the 3 pods Running, and run a cycle since
            started = operator.controller.pods.gang_started.get("default/g-1-launcher") or set()
            return len(started) == 3

        await eventually(three_seen)
        await after_cycles(operator)
        assert (await status_of(cluster))["phase"] == "Admitted"
        await run_pod(cluster, names[3])
        found = await eventually(lambda: _phase_is(cluster, "Running"))
        assert found["jobName"] == "g-1-launcher"


async def after_cycles(operator: Operator, count: int = 3) -> None:
    """Return once the operator's scheduling loop has run ``count`` more cycles."""
    target = operator.loop.cycles + count

    async def ran() -> bool:
        return operator.loop.cycles >= target

    await eventually(ran)


async def _phase_is(cluster: Cluster, phase: str) -> dict[str, Any] | None:
    status = await status_of(cluster)
    return status if status.get("phase") == phase else None


async def test_a_failed_node_under_one_pod_replaces_the_whole_gang(cluster: Cluster) -> None:
    await add_nodes(cluster, "node-a", "node-b", "node-c")
    async with running_operator(cluster, FAST):
        _, names = await admitted_gang(cluster)
        await eventually(lambda: pinned(cluster, names))
        for name in names:
            await run_pod(cluster, name)
        await eventually(lambda: _phase_is(cluster, "Running"))
        first = {p["node"] for p in (await status_of(cluster))["placement"]["pods"]}
        failed = sorted(first)[0]
        not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
        await cluster.client.patch(NODES, failed, not_ready, status=True)
        jobs = await eventually(lambda: jobs_of(cluster, 2))

        async def replaced() -> dict[str, Any] | None:
            status = await status_of(cluster)
            return status if status.get("attempt") == 2 and status.get("phase") == "Admitted" else None

        status = await eventually(replaced)
        nodes = sorted(p["node"] for p in status["placement"]["pods"])
        assert (status["reschedules"], failed in nodes, len(nodes), len(set(nodes))) == (1, False, 4, 2)
        assert [j["metadata"]["name"] for j in jobs] == ["g-2-launcher", "g-2-workers"]

        async def old_jobs_gone() -> bool:
            names = {j["metadata"]["name"] for j in await cluster.client.list(JOBS, "default")}
            return names == {"g-2-launcher", "g-2-workers"}

        await eventually(old_jobs_gone)


async def test_a_gang_whose_pods_do_not_all_start_is_evicted_after_pod_start_timeout(cluster: Cluster) -> None:
    await add_nodes(cluster, "node-a", "node-b")
    # podStartTimeout counts from admission: long enough for the pins and three pods to start on a loaded machine
    # (at 1 s the gang could be evicted, its pods gone, before the test had started any), short for a test.
    async with running_operator(cluster, Config(cycleInterval=0.2, podStartTimeout=5)):
        _, names = await admitted_gang(cluster)
        await eventually(lambda: pinned(cluster, names))
        for name in names[:3]:  # the last worker never starts
            await run_pod(cluster, name)

        async def evicted() -> dict[str, Any] | None:
            status = await status_of(cluster)
            found = [c for c in status.get("conditions") or [] if c["type"] == "Evicted" and c["status"] == "True"]
            return {"reason": found[0]["reason"], "reschedules": status.get("reschedules")} if found else None

        assert await eventually(evicted) == {"reason": "PodsNotStarting", "reschedules": 1}

        async def jobs_deleted() -> bool:
            names = {j["metadata"]["name"] for j in await cluster.client.list(JOBS, "default")}
            return not names & {"g-1-launcher", "g-1-workers"}

        await eventually(jobs_deleted)
