"""The node filters of one pod of a task (kube-scheduler's Filter step): :func:`node_fits` on the node,
:func:`feasible_gpus` on its GPUs. Shared by placement (:mod:`gputask.core.placement`) and gang placement
(:mod:`gputask.core.gang`); re-exported by placement, where they were first defined."""

from __future__ import annotations

from gputask.core.cluster import NodeState
from gputask.core.fit import static_refusal
from gputask.core.model import Task


def feasible_gpus(state: NodeState, task: Task) -> list[int]:
    """Positions of GPUs on ``state`` that could each hold one GPU of ``task``.

    Checks health, product, exclusivity (whole-GPU tasks need idle GPUs), free MiB and the share group
    (a shared GPU takes only tasks of the group already on it).
    Node-level checks (schedulable, CPU, host memory, count) are in :func:`node_fits`.
    """
    req = task.request
    allows = req.allows
    gpus = state.node.gpus
    if req.exclusive:
        return [pos for pos, gpu in enumerate(gpus) if allows(gpu.product) and state.is_idle(pos)]
    out: list[int] = []
    group, groups = req.share_group, state.groups
    for pos, gpu in enumerate(gpus):
        if not allows(gpu.product):
            continue
        need = req.mib_on(gpu)
        held = groups[pos]  # state.admits, inlined: this loop is placement's hottest
        if state.free_mib(pos) >= need and need <= gpu.memory_mib and (not held or (len(held) == 1 and group in held)):
            out.append(pos)
    return out


def node_fits(state: NodeState, task: Task) -> bool:
    """Node-level filters (:mod:`gputask.core.fit`): schedulable (NodeUnschedulable), enough GPUs at
    all, taints tolerated and selector/affinity matched, then cpu, memory, ephemeral-storage and a pod
    slot free (NodeResourcesFit). :func:`gputask.core.reasons.refusals` names the one that refuses."""
    node = state.node
    if not node.schedulable or len(node.gpus) < task.request.count:
        return False
    if (node.taints or task.constraints is not None) and static_refusal(
        task.constraints, node.labels, node.taints, node.name
    ) is not None:
        return False
    cpu_free = state.cpu_free
    if cpu_free is not None and task.cpu_milli > cpu_free:
        return False
    mem_free = state.memory_free_mib
    if mem_free is not None and task.memory_mib > mem_free:
        return False
    pods_free = state.pods_free
    if pods_free is not None and pods_free < 1:
        return False
    storage_free = state.ephemeral_free_mib
    return storage_free is None or task.ephemeral_mib <= storage_free
