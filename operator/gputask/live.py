"""``gputask get``, ``gputask explain`` and ``gputask top``: a live cluster as the operator sees it.

Each command LISTs what the operator rebuilds its state from (:data:`gputask.k8s.handlers.REBUILD_ORDER`,
plus unfinished pods for foreign GPU use) and feeds it to a :class:`~gputask.k8s.controller.Controller`
of its own, exactly as a new leader does at start (:meth:`Controller.rebuild`), so positions, per-node
reasons and free memory are computed by the same code that admits. It writes nothing: the user's
``view`` rights on GPUTasks and ``list`` on nodes, pods and Jobs suffice.

Tables are rich tables on a terminal and plain aligned text otherwise; ``-o json`` gives the rows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from kubernetes import config as k8s_config
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gputask.config import Config
from gputask.core.diagnose import Diagnosis, change_for, diagnose
from gputask.core.model import mig_parent_index, task_key
from gputask.core.reasons import Wait
from gputask.k8s.client import PODS, ApiError, KubeClient, load_api_client
from gputask.k8s.controller import Controller
from gputask.k8s.foreign import UNFINISHED_PODS
from gputask.k8s.handlers import REBUILD_ORDER
from gputask.k8s.tasks import memory_text
from gputask.manifests.convert import QUEUE_LABEL


class LiveError(Exception):
    """A command cannot answer: no kubeconfig or context, the API unreachable or refusing (one line)."""


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context in use (``default`` when it names none or there is no file).

    Raises :class:`LiveError` when ``context`` is not in the kubeconfig.
    """
    try:
        contexts, current = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
    except (k8s_config.ConfigException, OSError, TypeError):
        if context:
            raise LiveError(f"context {context!r}: no kubeconfig to read it from") from None
        return "default"
    except Exception as exc:  # a file that is no kubeconfig (YAML errors and the like)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LiveError(f"cannot read the kubeconfig {kubeconfig or '(default)'}: {first}") from None
    chosen = current if not context else next((c for c in contexts if c.get("name") == context), None)
    if chosen is None:
        names = ", ".join(sorted(str(c.get("name")) for c in contexts))
        raise LiveError(f"context {context!r} is not in the kubeconfig (it has: {names})")
    return str((chosen.get("context") or {}).get("namespace") or "default")


def connect(kubeconfig: str | None, context: str | None) -> KubeClient:
    """A read-only client for the command (user agent ``gputask-cli``); :class:`LiveError` when no config loads."""
    try:
        api = load_api_client(kubeconfig, user_agent="gputask-cli", pool_size=4, context=context, retries=0)
    except Exception as exc:  # kubernetes.config raises several types for a missing or broken kubeconfig
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LiveError(f"cannot load the Kubernetes configuration: {first}") from None
    return KubeClient(api, workers=4, field_manager="gputask-cli", timeout_s=15.0)


async def list_all(client: KubeClient) -> dict[str, list[dict[str, Any]]]:
    """Every kind the operator rebuilds from, plus unfinished pods; an API that lacks one (404) gives []."""
    objects: dict[str, list[dict[str, Any]]] = {}
    kinds = {**REBUILD_ORDER, "pods": (PODS, None)}
    for kind, (resource, labels) in kinds.items():
        fields = UNFINISHED_PODS if resource is PODS else None
        try:
            objects[kind] = await client.list(resource, labels=labels, fields=fields)
        except ApiError as exc:
            if exc.status == 404 and kind not in ("tasks", "gpunodes", "queues"):
                objects[kind] = []  # e.g. no Kueue WorkloadPriorityClass API
                continue
            if exc.status == 404:
                raise LiveError(f"the API server does not serve {resource.plural}.{resource.group}: are the "
                                "gputask CRDs installed (helm install, or kubectl apply -f crds/)?") from None
            if exc.status == 0:
                raise LiveError(f"the API server is unreachable: {exc.message or exc.reason}") from None
            if exc.status == 403:
                raise LiveError(f"listing {resource.plural} is forbidden: these commands read the whole pool (bind "
                                "the chart's ClusterRole gputask-inspect to you with a ClusterRoleBinding)") from None
            raise LiveError(f"listing {resource.plural} failed: {exc}") from None
    return objects


def build_view(objects: Mapping[str, list[dict[str, Any]]], config: Config | None = None,
               now: float | None = None) -> Controller:
    """A controller rebuilt from ``objects`` (as :func:`list_all` returns them), as a new leader builds it."""
    controller = Controller(config or Config())
    controller.foreign.reset(objects.get("pods", []))
    inventory_log = logging.getLogger("gputask.inventory")
    level = inventory_log.level
    inventory_log.setLevel(logging.ERROR)  # each refused GPUNode entry: summed up once by refused_summary
    try:
        controller.rebuild(objects, now=now)
    finally:
        inventory_log.setLevel(level)
    return controller


def refused_summary(view: Controller) -> str | None:
    """One line for a command's stderr when GPUNode entries are refused (the operator says each on the GPUNode's
    Accepted condition and in a GPUNodeRefused Event), or None: ``3 GPUNode entries refused on node-a, node-b
    (kubectl describe gpunode NAME says why)``."""
    refused = {name: len(lines) for name, lines in sorted(view.inventory.gpunode_errors.items()) if lines}
    if not refused:
        return None
    count = sum(refused.values())
    entries = "entry" if count == 1 else "entries"
    return f"{count} GPUNode {entries} refused on {', '.join(refused)} (kubectl describe gpunode NAME says why)"


def _age(timestamp: str | None, now: float) -> str:
    """kubectl's age: ``45s``, ``12m``, ``3h``, ``5d``."""
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "-"
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= 120):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _reason(status: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Admitted":
            return str(condition.get("reason") or "")
    return ""


def task_rows(objects: Mapping[str, list[dict[str, Any]]], view: Controller, namespace: str | None,
              now: float) -> list[dict[str, Any]]:
    """One row per GPUTask (of ``namespace``; None: all): queue (the GPULocalQueue as written: ``spec.queueName``
    or the ``kueue.x-k8s.io/queue-name`` label), cluster_queue (the GPUClusterQueue it resolves to, ``-`` while
    none), phase, position, node, GPUs, memory per GPU (``status.gpuMemory``: reserved once placed, else asked;
    read from the spec before the operator wrote a status), reason, age.

    ``position`` (0 = head) is the task's place among the pending tasks of its GPUClusterQueue, in the
    scheduler's order, computed for every pending task (``status.queuePosition`` is kept only for the
    first 100 of each queue).
    """
    positions: dict[str, int] = {}
    seen: dict[str, int] = {}
    for task in view.scheduler.pending:
        if view.scheduler.never_admits(task):
            continue  # no place in a queue that never admits it
        positions[task.key] = seen.get(task.queue, 0)
        seen[task.queue] = positions[task.key] + 1
    rows = []
    for obj in objects.get("tasks", []):
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        if namespace is not None and ns != namespace:
            continue
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        key = task_key(ns, str(meta.get("name")))
        placement = status.get("placement") or {}
        record = view.tasks.get(key)
        phase = record.phase if record is not None else str(status.get("phase") or "Pending")
        resolved = record.task.queue if record is not None and record.task is not None else None
        labels = meta.get("labels") or {}
        rows.append({
            "namespace": ns,
            "name": str(meta.get("name")),
            "queue": str(spec.get("queueName") or labels.get(QUEUE_LABEL) or "-"),
            "cluster_queue": str(resolved or status.get("queue") or "-"),
            "phase": phase,
            "position": positions.get(key),
            "node": str(placement.get("node") or "-"),
            "gpus": spec.get("gpus", 1),
            "memory": str(status.get("gpuMemory") or (record is not None and memory_text(record)) or _asked(spec)),
            "reason": _reason(status),
            "age": _age(meta.get("creationTimestamp"), now),
        })
    rows.sort(key=lambda r: (r["namespace"], r["name"]))
    return rows


def _asked(spec: Mapping[str, Any]) -> str:
    """What a task asks per GPU, read from its spec as written (the operator has not converted it yet)."""
    if spec.get("gpuMemory") is not None:
        return str(spec["gpuMemory"])
    if spec.get("gpuFraction") is not None:
        return f"{spec['gpuFraction']} GPU"
    return "whole GPU"


def queue_rows(view: Controller) -> list[dict[str, Any]]:
    """One row per GPUClusterQueue: cohort, pending, admitted, active (``yes``, ``held``, ``no``) and ``usage``:
    per listed quota key (``nvidia.com/gpu`` in milli-GPU, ``gputask.io/gpu-memory`` in MiB; ``@flavor`` keys per
    flavor), ``{"used", "nominal"}``."""
    status = view.scheduler.queue_status()
    quotas = view.scheduler.quotas
    rows = []
    for name, info in status.items():
        spec = quotas.specs.get(name)
        usage = info["usage"]
        assert isinstance(usage, dict)
        listed = spec.quotas if spec is not None else {}
        rows.append({
            "name": name,
            "cohort": (spec.cohort if spec is not None else None) or "-",
            "pending": info["pending"],
            "admitted": info["admitted"],
            "active": "no" if spec is None else ("held" if spec.stop_policy != "None" else "yes"),
            "usage": {key: {"used": usage.get(key, 0), "nominal": quota.nominal} for key, quota in listed.items()},
        })
    return rows


def _usage_text(usage: Mapping[str, Mapping[str, int]]) -> str:
    """``nvidia.com/gpu 750m/1500m, ...``: used over nominal, both in the same unit."""
    parts = []
    for key, value in usage.items():
        used, nominal = value["used"], value["nominal"]
        if key.startswith("nvidia.com/gpu"):
            whole = used % 1000 == 0 and nominal % 1000 == 0
            text = f"{used // 1000}/{nominal // 1000}" if whole else f"{used}m/{nominal}m"
        else:
            whole = used % 1024 == 0 and nominal % 1024 == 0
            text = f"{used // 1024}Gi/{nominal // 1024}Gi" if whole else f"{used}Mi/{nominal}Mi"
        parts.append(f"{key} {text}")
    return ", ".join(parts) or "-"


def node_rows(view: Controller) -> list[dict[str, Any]]:
    """One row per node with GPUs: schedulable (or why not), GPUs (``{product: count}``), MiB reserved, used by
    others (foreign), free and total, and how many tasks it holds. A GPU in MIG mode is counted through its MIG
    devices (listed by their products), not itself: its memory is theirs."""
    rows = []
    for state in view.scheduler.cluster.sorted_nodes():
        node = state.node
        in_mig_mode = {mig_parent_index(g.index) for g in node.gpus} - {None}
        products: dict[str, int] = {}
        for gpu in node.gpus:
            if gpu.index not in in_mig_mode:
                products[gpu.product] = products.get(gpu.product, 0) + 1
        total = sum(g.memory_mib for g in node.gpus if g.index not in in_mig_mode)
        free = sum(state.free_mib(pos) for pos, g in enumerate(node.gpus) if g.index not in in_mig_mode)
        rows.append({
            "node": node.name,
            "schedulable": "yes" if node.schedulable else f"no ({node.unschedulable_reason or 'unschedulable'})",
            "gpus": dict(sorted(products.items())),
            "reserved_mib": sum(state.reserved_mib),
            "foreign_mib": sum(g.foreign_mib for g in node.gpus),
            "free_mib": free,
            "total_mib": total,
            "tasks": len(state.tasks),
        })
    return rows


def gpu_rows(view: Controller) -> list[dict[str, Any]]:
    """One row per GPU: node, index, product, health, MiB reserved by gputask, used by others, free, total, and
    the tasks on it (``namespace/name`` with their MiB)."""
    rows = []
    for state in view.scheduler.cluster.sorted_nodes():
        on: dict[int, list[str]] = {}
        for key, placement in sorted(state.tasks.items()):
            for slot in placement.gpus:
                on.setdefault(slot.index, []).append(f"{key} ({slot.memory_mib})")
        for pos, gpu in enumerate(state.node.gpus):
            rows.append({
                "node": state.name,
                "gpu": gpu.index,
                "product": gpu.product,
                "healthy": gpu.healthy,
                "reserved_mib": state.reserved_mib[pos],
                "foreign_mib": gpu.foreign_mib,
                "free_mib": state.free_mib(pos),
                "total_mib": gpu.memory_mib,
                "exclusive": state.exclusive[pos],
                "tasks": on.get(gpu.index, []),
            })
    return rows


def explain_task(view: Controller, namespace: str, name: str, status: Mapping[str, Any] | None = None) -> Diagnosis:
    """The diagnosis of task ``namespace/name`` in ``view``. A task the scheduler does not hold but the operator
    keeps waiting before any queue (its GPULocalQueue missing, its PriorityClass missing) is reported ``pending``
    with that reason (from ``status``) as its gate."""
    key = task_key(namespace, name)
    found = replace(diagnose(view.scheduler, key, time.time()), held=tuple(view.held_for(key)))
    record = view.tasks.get(key)
    reason = _reason(status or {})
    if found.state == "unknown" and record is not None and record.phase == "Pending" and reason:
        gate = Wait(reason, str((status or {}).get("message") or ""))
        return replace(found, state="pending", gate=gate, changes=(change_for(gate),))
    return found


# -- rendering ---------------------------------------------------------------------------------------
TASK_COLUMNS = ("queue", "cluster_queue", "phase", "position", "node", "gpus", "memory", "reason", "age")
TASK_HEADERS = {"position": "POS", "cluster_queue": "CLUSTERQUEUE"}


def _cell(column: str, value: Any) -> str:
    """A row value as table text (JSON keeps the structure)."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dict) and column == "usage":
        return _usage_text(value)
    if isinstance(value, dict):
        return ", ".join(f"{n}x {k}" for k, n in value.items()) or "0"
    return str(value)


def render_table(console: Console, rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                 headers: Mapping[str, str] | None = None, *, empty: str = "No resources found.") -> None:
    """``rows`` as a table of ``columns`` (kubectl's upper-case headers), or ``empty`` when there are none."""
    if not rows:
        console.print(empty)
        return
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column((headers or {}).get(column, column.replace("_", " ").upper()), overflow="fold")
    for row in rows:
        table.add_row(*(Text(_cell(c, row[c])) for c in columns))  # Text: cluster values are never markup
    with console.capture() as captured:
        console.print(table)
    lines = "\n".join(line.rstrip() for line in captured.get().splitlines())
    console.out(lines, highlight=False)


def render_diagnosis(console: Console, found: Diagnosis, status: Mapping[str, Any]) -> None:
    """``gputask explain``'s text: the state, the gate or each flavor's quota, nodes and preemption, then the
    smallest changes."""
    def out(text: str, bold: str = "") -> None:  # never markup: names and messages come from the cluster
        console.print(Text.assemble((bold, "bold"), text), soft_wrap=True)

    out(f": {status.get('phase') or found.state.capitalize()}"
        + (f" ({_reason(status)}: {status.get('message')})" if _reason(status) else ""), bold=found.key)
    for note in found.held:
        out(f"An earlier Job of it is gone, its pods are not: {note}.")
    if found.state == "unknown":
        out("The operator's view has no such task waiting or running (it finished, or failed for good).")
        return
    queue = found.queue + (f" (through GPULocalQueue {found.local_queue})" if found.local_queue else "")
    if found.queue:
        out(f"GPUClusterQueue: {queue}; priority {found.priority}")
    if found.state == "admitted":
        out(f"Admitted on node {found.node}.")
        for line in found.links:
            out(f"GPU links: {line}")
        return
    if found.position is not None:
        out(f"Position: {found.position} of {found.waiting_in_queue} waiting in {found.queue!r} (0 = head)")
    if found.gate is not None:
        out(f"Held before placement: {found.gate.reason}: {found.gate.message}")
    for view in found.flavors:
        title = f"flavor {view.flavor}" if view.flavor else "placement"
        out("", bold=f"\n{title}")
        for line in view.quota:
            left = "unlimited" if line.left is None else str(line.left)
            verdict = "ok" if not line.short else f"short by {line.short}"
            out(f"  quota {line.resource}: needs {line.needs} {line.unit}, {left} left ({verdict})")
        fitting = sum(1 for n in view.nodes if n.fits)
        out(f"  nodes: {fitting}/{len(view.nodes)} fit now")
        for verdict in view.nodes:
            text = "; ".join(verdict.refusals) if not verdict.fits else "fits" if verdict.quota is None else (
                f"fits, but its charge there exceeds the quota of {verdict.quota}")
            out(f"    {verdict.node}: {text}")
        if view.gang:
            out("  gang (best try, every pod at once):")
            for line in view.gang:
                out(f"    {line}")
        if view.preemption.victims:
            names = ", ".join(f"{v.key} (priority {v.priority}, {v.queue})" for v in view.preemption.victims)
            out(f"  preemption: would evict {names} on node {view.preemption.node}")
        else:
            out(f"  preemption: none: {view.preemption.why_not}")
    if found.defragmentation:
        out("", bold="\ndefragmentation (it waits Fragmented)")
        for line in found.defragmentation:
            out(f"  {line}")
    if found.gate is None and any(v.fits_now for v in found.flavors):
        out("\nIt fits now: the operator's next cycle admits it (unless tasks ahead of it take the room first).")
    elif found.changes:
        out("", bold="\nSmallest changes that would let it in")
        for change in found.changes:
            out(f"  - {change}")
    else:
        out("\nNo single change found that would let it in now; it waits for running tasks to finish.")


def diagnosis_json(found: Diagnosis, status: Mapping[str, Any] | None = None) -> str:
    """The diagnosis as JSON (field names as in :class:`~gputask.core.diagnose.Diagnosis`), with the task's
    ``phase``, ``reason`` and ``message`` from its status."""
    status = status or {}
    head = {"phase": status.get("phase") or found.state.capitalize(), "reason": _reason(status) or None,
            "message": status.get("message")}
    return json.dumps({**head, **asdict(found)}, indent=1, default=str)


def console_for(width: int | None = None) -> Console:
    """A console that wraps at the terminal's width, or at ``width`` (default 200) into a pipe or file."""
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=width or 200, color_system=None)
    return console


async def fetch(kubeconfig: str | None, context: str | None) -> dict[str, list[dict[str, Any]]]:
    """Connect, list everything, close."""
    client = connect(kubeconfig, context)
    try:
        return await list_all(client)
    finally:
        await client.close()


def load(kubeconfig: str | None, context: str | None, config: Config | None = None
         ) -> tuple[dict[str, list[dict[str, Any]]], Controller, float]:
    """(objects, view, now) for a command; :class:`LiveError` on any failure to read the cluster."""
    objects = asyncio.run(fetch(kubeconfig, context))
    now = time.time()
    return objects, build_view(objects, config, now), now

