"""The scenario runner: a deterministic discrete-event run of the core on a simulated clock.

``gputask scenario run FILE`` (DESIGN.md section 6) answers "what would the scheduler do":
it feeds the events of a scenario file to the same :class:`gputask.core.Scheduler` the
operator drives, on a simulated clock (no sleeping), and reports every task's fate. The
runner only translates events into the calls the operator makes and records the decisions;
every scheduling, failure and preemption rule is the core's.

How time moves. Happenings wait in one heap, ordered by time and, at the same time, task
finishes first (they free GPUs), then wake-ups, then the file's events in file order. All
happenings at one time form a batch; after each batch the scheduler cycles at that time, and
again while a cycle admits or evicts something (the operator's next cycles would), so every
pending reason is up to date and a preemptor gets in once its victims are gone (victims
terminate at once here). The run stops after the last batch at or before ``until``. The
operator also cycles every ``cycleInterval``; here only the one such cycle that matters is
run: the first after a NotReady node's grace period, at down + grace + ``cycleInterval``
(the core evicts once a node has been down for *more* than the grace period).

What the events do (the operator's calls into the core):
- ``submit``: the GPUTask is converted exactly as the operator does
  (``manifests.convert.task_from_manifest``); an invalid spec is Rejected (phase Failed). It is
  created at ``at`` unless ``metadata.creationTimestamp`` says otherwise. Its namespace
  carries the label ``kubernetes.io/metadata.name`` as every Kubernetes namespace does.
- ``delete``: the task is gone (``Scheduler.finish``); a pending or running one ends in
  phase ``Deleted`` (history ``Finished``, reason ``Deleted``); a finished one keeps its phase.
- ``nodeDown`` / ``nodeUp``: ``Scheduler.node_ready``: NotReady gets no new work at once, and
  its tasks are evicted (NodeFailure) once down past ``nodeFailureGracePeriod``.
- ``nodeDeleted``: ``Scheduler.remove_node``: its tasks are evicted at once (NodeFailure).
- ``gpuUnhealthy``: ``Scheduler.set_node`` with the GPU unhealthy: no new work, its tasks
  evicted at once (GPUFailure).
- ``nodeUpdate``: ``Scheduler.set_node`` with the node's labels, taints or cordon replaced: the
  next cycle places nothing new where the task's selector, affinity or tolerations no longer
  allow it (running tasks stay: filters never evict; a NoExecute eviction is the taint manager's, not simulated).
- ``restartOperator``: the scheduler is dropped and rebuilt from durable state only, as the
  operator rebuilds from the API: nodes (GPU health, and since when a node is NotReady),
  queues, running tasks with their placement and admission time (``restore``), failure
  counts (``set_reschedules``) and pending tasks (``submit``).

An evicted task is requeued in its old place and starts over (its full ``duration``) at its
next admission, with ``attempt`` + 1; the core fails it (MaxReschedulesExceeded) once it has
been evicted for failures more than ``maxReschedules`` times.

Simulated GPUs get index = position in the node's list and UUID ``GPU-<node>-<index>``; a GPU with
``mig`` devices takes no work itself, its MIG devices do (``scenario_model.GpuSpec``), and a
``gpuUnhealthy`` event on it takes its MIG devices down with it, as an XID on a GPU in MIG mode does.

``--policy fifo`` runs the strict FIFO, one-task-per-GPU baseline: a transformation of the
input (every task asks whole GPUs, every queue is StrictFIFO) placed by ``firstfit``.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputask.config import Config, ConfigError, load_config
from gputask.core import (
    DEFAULT_POLICY,
    POLICIES,
    Admit,
    InvalidTaskError,
    NodeName,
    Pending,
    Placement,
    Policy,
    Scheduler,
    Task,
    TaskKey,
    make_policy,
)
from gputask.core.defrag import DefragReport
from gputask.core.failures import GPU_FAILURE, NODE_FAILURE
from gputask.core.model import mig_parent_index
from gputask.core.scheduler import Decision, Evict, Fail
from gputask.manifests.convert import task_from_manifest
from gputask.manifests.podsets import pod_ids
from gputask.sim.scenario_model import (
    Event,
    GpuRef,
    NodeRef,
    NodeUpdate,
    Scenario,
    ScenarioError,
    Submit,
    TaskRef,
    core_flavors,
    core_nodes,
    core_queues,
    fifo_baseline,
    load_scenario,
    scenario_gpus,
    updated,
)

__all__ = [
    "DEFAULT_POLICY",
    "FIFO",
    "Scenario",
    "ScenarioError",
    "cli_run",
    "fifo_baseline",
    "run_scenario",
    "scenario_gpus",
]

FIFO = "fifo"
"""The baseline policy name: whole GPUs, StrictFIFO queues, first fit."""

DELETED = "Deleted"
RUNNING = "Running"  # no pods to start here: a task runs from its admission until its duration ends
SUCCEEDED = "Succeeded"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# Cycles at one time before the run gives up on a steady state (preemption ping-pong).
_MAX_ROUNDS = 100

# Happenings at the same time run in this order (then in the order they were scheduled).
_FINISH, _WAKE, _EVENT = 0, 1, 2


def run_scenario(
    doc: Mapping[str, Any] | Scenario,
    *,
    policy: str = DEFAULT_POLICY,
    config: Config | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> dict[str, Any]:
    """Run a scenario and return the output dict of DESIGN.md section 6.

    ``doc`` is the parsed YAML (or a :class:`Scenario`); ``policy`` a core policy name or
    ``"fifo"`` (first fit on the FIFO baseline); it overrides ``config.policy``, so the output's
    ``config`` shows the policy that ran. Raises :class:`ScenarioError` on invalid input or an
    unknown policy. ``progress`` is told (simulated now, until) in seconds after each cycle.
    """
    scenario = load_scenario(doc)
    if policy == FIFO:
        scenario = fifo_baseline(scenario)
    elif policy not in POLICIES:
        raise ScenarioError(f"unknown policy {policy!r}; known: {', '.join(sorted([*POLICIES, FIFO]))}")
    ran = "firstfit" if policy == FIFO else policy
    config = (config or Config.model_validate({})).model_copy(update={"policy": ran})
    return _Run(scenario, policy=policy, config=config, progress=progress).run()


@dataclass(eq=False)
class _Record:
    """What the API would show of one submitted task (its status), and its history."""

    submit: Submit
    task: Task | None
    phase: str = "Pending"
    placement: Placement | None = None
    attempt: int = 0
    failures: int = 0
    admitted_at: float | None = None
    finished_at: float | None = None
    reason: str | None = None
    message: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.submit.key)

    @property
    def live(self) -> bool:
        return self.phase in ("Pending", RUNNING)

    def log(
        self,
        at: float,
        event: str,
        reason: str | None,
        *,
        placement: Placement | None = None,
        by: str | None = None,
    ) -> None:
        entry = {
            "at": _num(at),
            "event": event,
            "reason": reason,
            "node": _node_of(placement),
            "gpus": _gpus_of(placement),
            "by": by,
        }
        if self.task is not None and self.task.pod_sets:  # a task of podSets: which pod is where
            entry["pods"] = _pods_of(self.task, placement)
        self.history.append(entry)


class _Run:
    """One run of a scenario: the heap of happenings, the task records, the scheduler."""

    def __init__(
        self, scenario: Scenario, *, policy: str, config: Config,
        progress: Callable[[float, float], None] | None = None,
    ) -> None:
        self.progress = progress
        self.scenario = scenario
        self.policy = policy
        self.config = config
        self.nodes = {node.name: node for node in core_nodes(scenario)}  # the GPUNodes
        self.down_since: dict[NodeName, float] = {}  # the Nodes' Ready=False transition times
        self.queues = core_queues(scenario)
        self.priorities = {p.name: p.value for p in scenario.priority_classes}
        self.records: list[_Record] = []
        self.by_key: dict[TaskKey, _Record] = {}
        self.violations: dict[str, str] = {}
        self.defrag_plans: list[dict[str, Any]] = []  # defragmentation plans, applied or dry-run, as they come
        self.checks = _Checks()
        self.heap: list[tuple[float, int, int, tuple[Any, ...]]] = []
        self.seq = itertools.count()
        self.scheduler = self._new_scheduler()

    def _new_scheduler(self) -> Scheduler:
        policy: Policy = make_policy("firstfit" if self.policy == FIFO else self.policy)
        grace = self.config.node_failure_grace_period_s
        scheduler = Scheduler(policy=policy, nodes=self.nodes.values(), node_failure_grace_s=grace,
                              defragmentation=self.config.defragmentation.core())
        for flavor in core_flavors(self.scenario):
            scheduler.set_flavor(flavor)
        for spec in self.queues:
            scheduler.set_queue(spec)
        return scheduler

    def _push(self, at: float, kind: int, item: tuple[Any, ...]) -> None:
        heapq.heappush(self.heap, (at, kind, next(self.seq), item))

    # -- the clock -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Play every batch of happenings up to ``until``, cycling after each; return the output."""
        for i, event in self.scenario.ordered_events():
            self._push(event.at, _EVENT, ("event", i, event))
        while self.heap and self.heap[0][0] <= self.scenario.until:
            now = self.heap[0][0]
            while self.heap and self.heap[0][0] == now:
                _, _, _, item = heapq.heappop(self.heap)
                if item[0] == "finish":
                    self._finish(now, item[1], item[2])
                elif item[0] == "event":
                    self._event(now, item[2])
            self._cycle(now)
            if self.progress is not None:
                self.progress(now, self.scenario.until)
        self.checks.full = True  # the last check looks at everything, whatever changed
        self._check(self.scenario.until)
        return self._output()

    def _event(self, now: float, event: Event) -> None:
        body = event.body
        if isinstance(body, Submit):
            self._submit(now, body)
        elif isinstance(body, TaskRef):
            self._delete(now, self.by_key.pop(TaskKey(body.key)))
        elif isinstance(body, GpuRef):
            self._gpu_unhealthy(NodeName(body.node), body.index)
        elif isinstance(body, NodeUpdate):
            name = NodeName(body.name)
            self.nodes[name] = updated(
                self.nodes[name], labels=body.labels, taints=body.taints, unschedulable=body.unschedulable
            )
            self.scheduler.set_node(self.nodes[name])
        elif isinstance(body, NodeRef):
            name = NodeName(body.name)
            if event.kind == "nodeDeleted":
                self._node_deleted(name)
            else:
                self._node_ready(now, name, ready=event.kind == "nodeUp")
        else:
            self._restart()

    # -- tasks -----------------------------------------------------------------------------------
    def _submit(self, now: float, submit: Submit) -> None:
        namespace = submit.metadata.namespace
        try:
            task = task_from_manifest(
                submit.manifest(),
                priority_of=self.priorities.get,
                namespace_labels={NAMESPACE_NAME_LABEL: namespace},
                share_per_namespace=self.config.pinning == "dra",  # as the operator places with DRA
            )
        except InvalidTaskError as exc:
            record = _Record(submit, None, phase="Failed", reason=exc.reason, message=exc.message)
            record.log(now, "Rejected", exc.reason)
        else:
            created = submit.metadata.creation_timestamp
            if not isinstance(created, str):
                task = dataclasses.replace(task, created=now if created is None else float(created))
            record = _Record(submit, task)
            self.scheduler.submit(task)
        self.records.append(record)
        self.by_key[record.key] = record
        self.checks.touched.add(record.key)

    def _delete(self, now: float, record: _Record) -> None:
        if not record.live:
            return
        self.checks.touched.add(record.key)
        self.scheduler.finish(record.key)
        if record.phase == RUNNING:
            record.finished_at = now
        record.log(now, "Finished", DELETED, placement=record.placement)
        record.phase, record.reason = DELETED, DELETED

    def _finish(self, now: float, record: _Record, attempt: int) -> None:
        if record.phase != RUNNING or record.attempt != attempt:
            return  # evicted or deleted since: this finish belongs to an earlier run
        self.checks.touched.add(record.key)
        self.scheduler.finish(record.key)
        record.phase, record.finished_at = SUCCEEDED, now
        record.log(now, "Finished", SUCCEEDED, placement=record.placement)

    # -- nodes -----------------------------------------------------------------------------------
    def _node_ready(self, now: float, name: NodeName, *, ready: bool) -> None:
        if ready:
            self.down_since.pop(name, None)
        elif name not in self.down_since:
            self.down_since[name] = now
            wake = now + self.config.node_failure_grace_period_s + self.config.cycle_interval_s
            self._push(wake, _WAKE, ("wake",))
        self.scheduler.node_ready(name, ready, now)

    def _node_deleted(self, name: NodeName) -> None:
        self.down_since.pop(name, None)
        del self.nodes[name]
        self.scheduler.remove_node(name)

    def _gpu_unhealthy(self, name: NodeName, index: int) -> None:
        node = self.nodes[name]
        failed = {index} | {g.index for g in node.gpus if mig_parent_index(g.index) == index}  # and its MIG devices
        gpus = tuple(dataclasses.replace(g, healthy=False) if g.index in failed else g for g in node.gpus)
        self.nodes[name] = dataclasses.replace(node, gpus=gpus)
        self.scheduler.set_node(self.nodes[name])

    def _restart(self) -> None:
        """Forget everything in memory; rebuild from what the API holds, as the operator does."""
        self.scheduler = scheduler = self._new_scheduler()
        self.checks.full = True
        for name, since in self.down_since.items():
            scheduler.node_ready(name, False, since)
        for record in self.by_key.values():
            if record.task is None or not record.live:
                continue
            scheduler.set_reschedules(record.key, record.failures)
            if record.phase == RUNNING:
                assert record.placement is not None and record.admitted_at is not None
                scheduler.restore(record.task, record.placement, admitted_at=record.admitted_at)
            else:
                scheduler.submit(record.task)

    # -- cycle and checks ------------------------------------------------------------------------
    def _cycle(self, now: float) -> None:
        """Cycle until a cycle neither admits nor evicts (see the module docstring)."""
        for _ in range(_MAX_ROUNDS):
            decisions = self.scheduler.cycle(now)
            self._apply(now, decisions)
            self.defrag_plans += [_plan_output(r) for r in self.scheduler.defrag.take_reports()]
            self._check(now)
            if not any(isinstance(d, Admit | Evict) for d in decisions):
                return
        self._violation(now, f"no steady state: cycles at {_num(now)} keep admitting and evicting")

    def _apply(self, now: float, decisions: list[Decision]) -> None:
        failed = {d.task.key for d in decisions if isinstance(d, Fail)}
        for decision in decisions:
            record = self.by_key[decision.task.key]
            self.checks.touched.add(record.key)
            if isinstance(decision, Admit):
                self._admitted(now, record, decision.placement)
            elif isinstance(decision, Pending):
                record.reason, record.message = decision.reason, decision.message
            elif isinstance(decision, Evict):
                self._evicted(now, record, decision, requeued=record.key not in failed)
            else:
                record.phase, record.finished_at, record.reason = "Failed", now, decision.reason
                record.message = decision.message
                record.log(now, "Failed", decision.reason)

    def _admitted(self, now: float, record: _Record, placement: Placement) -> None:
        record.phase, record.placement = RUNNING, placement
        record.attempt += 1
        record.admitted_at, record.finished_at = now, None
        record.log(now, "Admitted", None, placement=placement)
        if record.submit.duration is not None:
            self._push(now + record.submit.duration, _FINISH, ("finish", record, record.attempt))

    def _evicted(self, now: float, record: _Record, decision: Evict, *, requeued: bool) -> None:
        """The core evicted the task (and requeued it unless it also failed it)."""
        record.log(now, "Evicted", decision.reason, placement=decision.placement, by=decision.by)
        record.phase, record.placement, record.admitted_at = "Pending", None, None
        record.reason, record.message = decision.reason, decision.message
        if decision.reason in (NODE_FAILURE, GPU_FAILURE):
            record.failures += 1
        if requeued:
            record.log(now, "Requeued", decision.reason)
        if decision.held is not None:
            self.scheduler.finish(decision.held)  # the simulated workload stops at once
        self.scheduler.victim_gone(record.key)

    def _violation(self, now: float, text: str) -> None:
        self.violations.setdefault(text, f"at {_num(now)}: {text}")

    def _check(self, now: float) -> None:
        nodes, keys = self.checks.changed(self.scheduler, self.by_key)
        for text in self.scheduler.violations(nodes=nodes, keys=keys):
            self._violation(now, text)
        for text in _consistency(self.scheduler, self.by_key, nodes, keys):
            self._violation(now, text)

    # -- output ----------------------------------------------------------------------------------
    def _output(self) -> dict[str, Any]:
        finished = [r.finished_at for r in self.records if r.finished_at is not None]
        return {
            "config": self.config.public(),
            "policy": self.policy,
            "tasks": [_task_output(r) for r in self.records],
            "queues": {
                name: {"usage": status["usage"], "pending": status["pending"], "admitted": status["admitted"]}
                for name, status in self.scheduler.queue_status().items()
            },
            "violations": list(self.violations.values()),
            "makespan": _num(max(finished)) if finished else None,
            "unfinished": sum(1 for r in self.records if r.live),
            **({"defragmentation": {"plans": self.defrag_plans}} if self.scheduler.defrag.enabled else {}),
        }


class _Checks:
    """What changed since the last check, so that checking after every cycle costs what changed.

    A node changed when its generation moved (every reservation, release and update moves it); a
    task when the run touched its record (submitted, decided, finished, deleted) or it entered or
    left the scheduler's running, nominated or pending sets. What did not change cannot have broken
    an invariant that held before, so the violations found are those a full check finds; ``full``
    (after a restart, and for the last check) checks everything.
    """

    def __init__(self) -> None:
        self.full = True
        self.touched: set[TaskKey] = set()
        self.generations: dict[NodeName, int] = {}
        self.seen: tuple[set[TaskKey], set[TaskKey], set[TaskKey]] = (set(), set(), set())

    def changed(self, scheduler: Scheduler, by_key: Mapping[TaskKey, _Record]) -> tuple[set[NodeName], set[TaskKey]]:
        """(nodes, task keys) to check now; remembers the present state for the next call."""
        running, nominated, pending = scheduler.running.keys(), scheduler.nominated.keys(), scheduler.pending.keys()
        states = list(scheduler.cluster)
        if self.full:
            nodes = {s.name for s in states}
            keys = set(by_key) | running | nominated
        else:
            nodes = {s.name for s in states if self.generations.get(s.name) != s.generation}
            old_running, old_nominated, old_pending = self.seen
            keys = self.touched | (running ^ old_running) | (nominated ^ old_nominated) | (pending ^ old_pending)
        self.generations = {s.name: s.generation for s in states}
        self.seen = (set(running), set(nominated), set(pending))
        self.touched, self.full = set(), False
        return nodes, keys


def _consistency(
    scheduler: Scheduler, by_key: Mapping[TaskKey, _Record], nodes: set[NodeName], keys: set[TaskKey]
) -> list[str]:
    """Differences between the API's view (the records) and the scheduler's on ``nodes`` and ``keys``:
    lost or doubled tasks."""
    out: list[str] = []
    for name in sorted(nodes):
        for key in scheduler.cluster.node(name).tasks:
            reservation = scheduler.cluster.reservation(key)
            if reservation is None:
                out.append(f"task {key} is on {name} without a reservation")
            elif name not in reservation.placement.nodes:
                placed = ", ".join(reservation.placement.nodes)
                out.append(f"task on a node it is not placed on: {key} on {name}, placed on {placed}")
    running = scheduler.running
    for key in sorted(keys):
        record = by_key.get(key)
        if record is None:
            if key in running:
                out.append(f"task {key} is held by the scheduler but not running")
        elif record.phase == RUNNING and scheduler.placement_of(key) != record.placement:
            node = _node_of(record.placement)
            out.append(f"task lost: {key} runs on {node} but the scheduler does not hold it there")
        elif record.phase == "Pending" and key not in scheduler.pending and key not in scheduler.nominated:
            out.append(f"task lost: {key} is Pending but not queued in the scheduler")
        elif not record.live and (key in running or key in scheduler.pending):
            out.append(f"task {key} is {record.phase} but the scheduler still holds it")
    return out


def _node_of(placement: Placement | None) -> str | None:
    """The ``node`` of a task in the output: its pods' nodes joined by ``, `` (one node for a one-pod task)."""
    return None if placement is None else ", ".join(placement.nodes)


def _gpus_of(placement: Placement | None) -> list[int]:
    """The ``gpus`` of a task in the output: its pods' GPU indices in pod order."""
    return [] if placement is None else [i for pod in placement.pods for i in pod.indices]


def _pods_of(task: Task | None, placement: Placement | None) -> list[dict[str, Any]]:
    """The ``pods`` of a task in the output: ``{podSet, index, node, gpus, memoryPerGpu}`` per pod, in PodSet then
    index order (``[]`` while not placed)."""
    if placement is None or task is None:
        return []
    return [
        {"podSet": name, "index": index, "node": pod.node, "gpus": list(pod.indices),
         "memoryPerGpu": max(s.memory_mib for s in pod.gpus)}
        for (name, index), pod in zip(pod_ids(task), placement.pods, strict=True)
    ]


def _plan_output(report: DefragReport) -> dict[str, Any]:
    """A defragmentation plan in the output: when, for which task on which node, applied or dry-run, its moves."""
    plan = report.plan
    return {
        "at": _num(report.at),
        "task": plan.task.key,
        "node": ", ".join(plan.placement.nodes),
        "applied": report.applied,
        "moves": [{"task": m.task.key, "from": ", ".join(m.origin.nodes), "to": ", ".join(m.target.nodes),
                   "lostGpuSeconds": _num(m.lost_gpu_s)} for m in plan.moves],
    }


def _task_output(record: _Record) -> dict[str, Any]:
    placement = record.placement
    return {
        "namespace": record.submit.metadata.namespace,
        "name": record.submit.metadata.name,
        "phase": record.phase,
        "node": _node_of(placement),
        "gpus": _gpus_of(placement),
        "pods": _pods_of(record.task, placement),
        "memoryPerGpu": None if placement is None else max(s.memory_mib for p in placement.pods for s in p.gpus),
        "attempt": record.attempt,
        "admittedAt": _num(record.admitted_at),
        "finishedAt": _num(record.finished_at),
        "reason": record.reason,
        "message": record.message,
        "history": record.history,
    }


def _num(value: float | None) -> float | int | None:
    """Whole seconds as int (``0`` rather than ``0.0``) so the JSON reads like the input."""
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def cli_run(file: Path, *, output: str, policy: str, plot: Path | None, config: Path | None = None) -> int:
    """``gputask scenario run``: 0 when no invariant broke, 1 with violations, 2 on bad input."""
    from gputask.sim.scenario_report import print_table

    if output not in ("table", "json"):
        return _fail(f"--output {output!r}: use table or json")
    if plot is not None and (plot.suffix.lower() != ".png" or not plot.parent.is_dir() or plot.is_dir()):
        return _fail(f"--plot {plot}: give a .png file path in an existing folder")
    if plot is not None and not os.access(plot.parent, os.W_OK):
        return _fail(f"--plot {plot}: cannot write into {plot.parent}")
    try:
        settings = load_config(config)
    except ConfigError as exc:  # names the configuration file itself
        return _fail(str(exc))
    try:
        scenario = load_scenario(file)
        result = run_scenario(scenario, policy=policy, config=settings)
    except ScenarioError as exc:
        return _fail(f"{file}: {exc}")
    if output == "json":
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    if plot is not None:
        from gputask.sim.scenario_plot import PlotError, write_timeline

        try:
            write_timeline(result, fifo_baseline(scenario) if policy == FIFO else scenario, plot)
        except PlotError as exc:
            return _fail(str(exc))
    return 1 if result["violations"] else 0


def _fail(message: str) -> int:
    """One line on stderr: the lines of ``message`` joined by '; ' (by ' ' after a line ending in ':')."""
    text = ""
    for line in (line.strip() for line in message.splitlines()):
        if line:
            text += (" " if text.endswith(":") else "; ") + line if text else line
    print("error: " + text, file=sys.stderr)
    return 2
