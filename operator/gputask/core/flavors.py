"""ResourceFlavors: the kinds of GPU a queue holds quota of, each charged and borrowed on its own.

Kueue's ResourceFlavor at GPU granularity (Kueue documentation, "Resource Flavor" and "Cluster
Queue: flavors and resources"; pkg/scheduler/flavorassigner): a flavor names the nodes it covers
(``nodeLabels``: a node of the flavor carries all of them), the taints those nodes have
(``nodeTaints``: a task must tolerate them to use the flavor) and the tolerations given to the pods
admitted in it (``tolerations``), plus what only GPUs have: the GPU products it covers
(``gpuProducts``, empty: any) and, optionally, the card size it charges against (``gpuMemory``).

A queue with ``resourceGroups`` lists its flavors in order; a task is tried in each flavor as a
*variant*: the same task with the flavor's node labels added to its node selector, the flavor's
tolerations added to its own, its products narrowed to the flavor's, and its quota charged under
flavor-qualified resource names (:func:`flavored`: ``nvidia.com/gpu@h100``). So everything quota
does (nominal, borrowing, lending, fair shares, preemption) is per flavor with no change to its
arithmetic. A queue with the old flat ``resources`` has one implicit flavor, ``""``, whose keys are
the bare resource names and which covers every product and node.

Charging in a flavor (``nvidia.com/gpu``): each device counts reserved MiB over the flavor's
``gpuMemory`` when it is set, else over the device's own memory, rounded up to a milli-GPU and at
most one GPU; a device held whole counts one GPU. A flavor of one product therefore charges the
same on every card of it, and a flavor mixing card sizes states its charge with ``gpuMemory``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gputask.core.fit import Constraints, Taint, Toleration
from gputask.core.model import Node, PodPlacement, PodSet, Task

SEPARATOR = "@"
"""Between a resource name and its flavor in a quota key; neither names may contain it."""


@dataclass(frozen=True, slots=True)
class Flavor:
    """A GPUResourceFlavor: ``node_labels`` (sorted pairs), ``node_taints``, ``tolerations``,
    ``gpu_products`` (empty: any product), ``gpu_memory_mib`` (the card size charged against, MiB;
    None: each device's own)."""

    name: str
    node_labels: tuple[tuple[str, str], ...] = ()
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    gpu_products: frozenset[str] = frozenset()
    gpu_memory_mib: int | None = None


def flavored(resource: str, flavor: str) -> str:
    """The quota key of ``resource`` in ``flavor``: the bare name in the implicit flavor ``""``."""
    return f"{resource}{SEPARATOR}{flavor}" if flavor else resource


def split_key(key: str) -> tuple[str, str]:
    """(resource, flavor) of a quota key (flavor ``""`` for a bare resource name)."""
    resource, _, flavor = key.partition(SEPARATOR)
    return resource, flavor


def describe_key(key: str) -> str:
    """A quota key as messages say it: ``nvidia.com/gpu in flavor h100`` (or the bare name)."""
    resource, flavor = split_key(key)
    return f"{resource} in flavor {flavor}" if flavor else resource


def ineligible(task: Task, flavor: Flavor) -> str | None:
    """Why ``task`` cannot use ``flavor`` whatever the nodes (Kueue's flavor assigner: an untolerated
    node taint; here also no product in common), else None. A task of several PodSets: the first PodSet's
    reason (every PodSet must be able to use it)."""
    for pod in task.podsets:
        why = _pod_ineligible(pod, flavor)
        if why is not None:
            return why
    return None


def _pod_ineligible(task: PodSet, flavor: Flavor) -> str | None:
    products = task.request.products
    if flavor.gpu_products and products and not (products & flavor.gpu_products):
        return f"covers GPU products {sorted(flavor.gpu_products)}, the task allows {sorted(products)}"
    own = task.constraints.tolerations if task.constraints is not None else ()
    tolerations = own + flavor.tolerations
    for taint in flavor.node_taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(t.tolerates(taint) for t in tolerations):
            return f"its nodes have the untolerated taint {taint.text()}"
    return None


def variant(task: Task, flavor: Flavor) -> Task:
    """``task`` as it is tried in ``flavor`` (call :func:`ineligible` first): the flavor's node labels
    joined to its node selector, the flavor's tolerations to its own, its products narrowed, and
    ``flavor``/``card_mib`` set so its quota is charged in that flavor; ``unflavored`` keeps the task."""
    base = task.unflavored or task
    pods = tuple(_pod_variant(pod, flavor) for pod in base.podsets)
    return replace(
        base,
        request=pods[0].request,
        constraints=pods[0].constraints,
        flavor=flavor.name,
        card_mib=flavor.gpu_memory_mib,
        unflavored=base,
        pod_sets=pods if base.pod_sets else (),
    )


def _pod_variant(pod: PodSet, flavor: Flavor) -> PodSet:
    """One PodSet narrowed to ``flavor`` (:func:`variant`)."""
    own = pod.constraints
    constraints = Constraints(
        node_selector=tuple(sorted(set(own.node_selector if own else ()) | set(flavor.node_labels))),
        terms=own.terms if own else None,
        tolerations=(own.tolerations if own else ()) + flavor.tolerations,
    )
    products = pod.request.products
    if flavor.gpu_products:
        products = (products & flavor.gpu_products) if products else flavor.gpu_products
    return replace(pod, request=replace(pod.request, products=products), constraints=constraints)


def holds(flavor: Flavor, node: Node, placement: PodPlacement) -> bool:
    """True when one pod's ``placement`` on ``node`` lies in ``flavor``: the node carries its labels and every
    placed GPU is of one of its products (for work found running at a restart)."""
    labels = dict(node.labels)
    if any(labels.get(k) != v for k, v in flavor.node_labels):
        return False
    if not flavor.gpu_products:
        return True
    products = {g.index: g.product for g in node.gpus}
    return all(products.get(s.index) in flavor.gpu_products for s in placement.gpus)


__all__ = ["SEPARATOR", "Flavor", "describe_key", "flavored", "holds", "ineligible", "split_key", "variant"]
