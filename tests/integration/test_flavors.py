"""GPUResourceFlavors through the real operator: quota per GPU product, Job tolerations, status and metrics."""

from __future__ import annotations

from typing import Any

from gputask.config import Config
from gputask.k8s.client import GPUCLUSTERQUEUES, GPURESOURCEFLAVORS, JOBS, NODES, NotFound
from harness import Cluster, eventually, gputask, running_operator

FAST = Config(cycleInterval=0.2)
A10 = ("GPU-a10-0", "NVIDIA-A10", "24Gi")
A10B = ("GPU-a10-1", "NVIDIA-A10", "24Gi")
T4 = ("GPU-t4-0", "Tesla-T4", "16Gi")
T4B = ("GPU-t4-1", "Tesla-T4", "16Gi")


async def flavor(cluster: Cluster, name: str, **spec: Any) -> None:
    body = {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUResourceFlavor", "metadata": {"name": name}, "spec": spec}
    await cluster.client.create(GPURESOURCEFLAVORS, body)


def groups(**nominal: int | str) -> list[dict[str, Any]]:
    """One resource group over nvidia.com/gpu with the flavors and nominal quotas given, in order."""
    return [{"coveredResources": ["nvidia.com/gpu"],
             "flavors": [{"name": f, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": q}]}
                         for f, q in nominal.items()]}]


async def test_quota_per_gpu_product_with_the_flavors_tolerations_on_the_job(cluster: Cluster) -> None:
    """A10 and T4 flavors, one GPU of quota each; the T4 nodes are tainted and the flavor tolerates it.
    Two whole-GPU tasks: one per flavor; the T4 one's Job carries the flavor's toleration and label; the
    task's status names its flavor; the queue reports usage per flavor, in kubectl get's column too;
    a third waits with each flavor's quota named."""
    await cluster.add_node("a", A10, A10B)  # two GPUs per node: quota, not room, stops the third task
    await cluster.add_node("t", T4, T4B)
    taint = {"key": "gpu", "value": "t4", "effect": "NoSchedule"}
    await cluster.client.patch(NODES, "t", {"spec": {"taints": [taint]}})
    await flavor(cluster, "a10", gpuProducts=["NVIDIA-A10"])
    await flavor(cluster, "t4", gpuProducts=["Tesla-T4"],
                 nodeTaints=[{"key": "gpu", "value": "t4", "effect": "NoSchedule"}],
                 tolerations=[{"key": "gpu", "operator": "Equal", "value": "t4", "effect": "NoSchedule"}])
    await cluster.add_queue(resourceGroups=groups(a10=1, t4=1))
    async with running_operator(cluster, FAST):
        for i in range(3):
            await cluster.submit(gputask(f"w{i}"))

        async def settled() -> dict[str, Any] | None:
            queue = (await cluster.client.get(GPUCLUSTERQUEUES, "default")).get("status") or {}
            return queue if queue.get("admittedTasks") == 2 and queue.get("pendingTasks") == 1 else None

        queue = await eventually(settled)
        statuses = {n: (await cluster.task(n)).get("status") or {} for n in ("w0", "w1", "w2")}
        t4_task = next(n for n, st in statuses.items() if st.get("flavor") == "t4")
        job = await cluster.client.get(JOBS, statuses[t4_task]["jobName"], "default")
    assert sorted(st.get("flavor") or "-" for st in statuses.values()) == ["-", "a10", "t4"]
    assert (job["metadata"]["labels"]["gputask.io/flavor"], job["spec"]["template"]["spec"]["tolerations"]) == (
        "t4", [{"key": "gpu", "operator": "Equal", "value": "t4", "effect": "NoSchedule"}],
    )  # fmt: skip
    assert (queue["flavorsSummary"], queue["flavorsUsage"]) == ("a10 1/1, t4 1/1", [
        {"name": "a10", "resources": [{"name": "gputask.io/gpu-memory", "total": "24576Mi", "borrowed": "0Mi"},
                                      {"name": "nvidia.com/gpu", "total": "1000m", "borrowed": "0m"}]},
        {"name": "t4", "resources": [{"name": "gputask.io/gpu-memory", "total": "16384Mi", "borrowed": "0Mi"},
                                     {"name": "nvidia.com/gpu", "total": "1000m", "borrowed": "0m"}]},
    ])  # fmt: skip
    waiting = next(st for st in statuses.values() if not st.get("flavor"))
    admitted = next(c for c in waiting["conditions"] if c["type"] == "Admitted")
    assert (admitted["reason"], admitted["message"].split(" (position")[0]) == (
        "QuotaExceeded",
        "flavor a10: quota of nvidia.com/gpu in flavor a10 in GPUClusterQueue 'default' has 0 milli-GPU left; "
        "flavor t4: quota of nvidia.com/gpu in flavor t4 in GPUClusterQueue 'default' has 0 milli-GPU left",
    )


async def test_a_queue_applied_before_its_flavor_is_inactive_until_the_flavor_exists(cluster: Cluster) -> None:
    """GitOps order: the queue names a flavor not created yet; its task waits QueueInactive saying which,
    and is admitted once the GPUResourceFlavor is applied."""
    await cluster.add_node("a", A10)
    await cluster.add_queue(resourceGroups=groups(a10=1))
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("t"))

        async def reason() -> tuple[str, str] | None:
            status = (await cluster.task("t")).get("status") or {}
            found = next((c for c in status.get("conditions") or [] if c["type"] == "Admitted"), None)
            return (found["reason"], found["message"]) if found else None

        waits = await eventually(reason)
        await flavor(cluster, "a10", gpuProducts=["NVIDIA-A10"])

        async def admitted() -> str | None:
            return ((await cluster.task("t")).get("status") or {}).get("flavor")

        assert await eventually(admitted) == "a10"
    assert (waits[0], waits[1].split(" (position")[0]) == (
        "QueueInactive", "GPUClusterQueue 'default' is inactive: GPUResourceFlavor a10 does not exist",
    )  # fmt: skip


async def test_a_restart_keeps_each_task_in_the_flavor_its_job_names(cluster: Cluster) -> None:
    """Two flavors covering the same nodes: after a restart each admitted task is charged to the flavor its
    Job's gputask.io/flavor annotation names (not the first that holds the placement), so the queue is not
    overdrawn and a third task still waits; its flavor's NoExecute toleration keeps tolerationSeconds."""
    await cluster.add_node("a", A10, A10B)
    await flavor(cluster, "reserved")
    await flavor(cluster, "spot", tolerations=[{"key": "spot", "operator": "Exists", "effect": "NoExecute",
                                                 "tolerationSeconds": 30}])
    await cluster.add_queue(resourceGroups=groups(reserved=1, spot=1))
    async with running_operator(cluster, FAST):
        for i in range(2):
            await cluster.submit(gputask(f"w{i}"))

        async def both() -> list[str] | None:
            found = [((await cluster.task(f"w{i}")).get("status") or {}).get("flavor") for i in range(2)]
            return found if all(found) else None

        flavors = await eventually(both)
    spot_task = f"w{flavors.index('spot')}"
    job = await cluster.client.get(JOBS, f"{spot_task}-1", "default")
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("w2"))

        async def summarized() -> str | None:
            status = (await cluster.client.get(GPUCLUSTERQUEUES, "default")).get("status") or {}
            return status.get("flavorsSummary") if status.get("pendingTasks") == 1 else None

        summary = await eventually(summarized)
    assert (sorted(flavors), summary) == (["reserved", "spot"], "reserved 1/1, spot 1/1")
    assert (job["metadata"]["annotations"]["gputask.io/flavor"], job["spec"]["template"]["spec"]["tolerations"]) == (
        "spot", [{"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
    )  # fmt: skip


async def test_a_queue_is_not_active_while_a_flavor_it_lists_is_missing(cluster: Cluster) -> None:
    """Kueue's FlavorNotFound on the queue's Active condition, then Ready once the flavor exists."""
    await cluster.add_queue(resourceGroups=groups(a10=1))
    async with running_operator(cluster, FAST):

        async def active() -> tuple[str, str, str] | None:
            status = (await cluster.client.get(GPUCLUSTERQUEUES, "default")).get("status") or {}
            found = next((c for c in status.get("conditions") or [] if c["type"] == "Active"), None)
            return (found["status"], found["reason"], found["message"]) if found else None

        missing = await eventually(active)
        await flavor(cluster, "a10", gpuProducts=["NVIDIA-A10"])

        async def ready() -> tuple[str, str, str] | None:
            found = await active()
            return found if found and found[0] == "True" else None

        assert await eventually(ready) == ("True", "Ready", "Can admit new tasks")
    assert missing == ("False", "FlavorNotFound", "GPUResourceFlavor a10 does not exist")


async def test_a_flavor_with_admitted_tasks_goes_only_once_they_finish(cluster: Cluster) -> None:
    """Kueue's resource-in-use finalizer on a flavor: deleted while a task admitted in it runs, it stays
    (its queue says the flavor is being deleted and admits nothing new in it) until that task's Job completes."""
    await cluster.add_node("a", A10, A10B)
    await flavor(cluster, "a10", gpuProducts=["NVIDIA-A10"])
    await cluster.add_queue(resourceGroups=groups(a10=2))
    async with running_operator(cluster, FAST):
        await cluster.submit(gputask("running"))

        async def finalized() -> list[str] | None:
            found = (await cluster.client.get(GPURESOURCEFLAVORS, "a10"))["metadata"].get("finalizers")
            job = await _job(cluster, "running-1")
            return found if found and job else None

        finalizers = await eventually(finalized)
        await cluster.client.delete(GPURESOURCEFLAVORS, "a10")
        await cluster.submit(gputask("late"))

        async def late_waits() -> str | None:
            status = (await cluster.task("late")).get("status") or {}
            found = next((c for c in status.get("conditions") or [] if c["type"] == "Admitted"), None)
            return found["message"].split(" (position")[0] if found and found["reason"] == "QueueInactive" else None

        waits = await eventually(late_waits)
        still = (await cluster.client.get(GPURESOURCEFLAVORS, "a10"))["metadata"].get("deletionTimestamp")
        complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
        await cluster.client.patch(JOBS, "running-1", complete, "default", status=True)

        async def gone() -> bool | None:
            try:
                await cluster.client.get(GPURESOURCEFLAVORS, "a10")
            except NotFound:
                return True
            return None

        assert await eventually(gone)
    assert (finalizers, bool(still), waits) == (
        ["gputask.io/queue-in-use"], True,
        "GPUClusterQueue 'default' is inactive: GPUResourceFlavor a10 is being deleted: it waits for the tasks "
        "admitted in it to finish (its finalizer stays until then)",
    )


async def _job(cluster: Cluster, name: str) -> dict[str, Any] | None:
    try:
        return await cluster.client.get(JOBS, name, "default")
    except NotFound:
        return None
