"""Defragmentation within budgets: move a few opted-in tasks so a task that waits on fragmentation fits (issue 32).

Packing keeps fragmentation low as tasks arrive, but departures fragment a cluster again: a 4-GPU task can wait
while 4 idle GPUs are free, one or two per node. Such a task waits with reason ``Fragmented``
(:func:`fragmented`: its queue would admit it, the GPUs it needs are free in the cluster, on no one node it fits).
For it, :class:`Defragmenter` plans on a snapshot (:class:`~gputask.core.snapshot.Trial`): the waiting task placed on
one node, and every task moved off that node re-placed elsewhere at once. A task may move only when

- it opted in (``spec.disruption.movable``, else its GPUClusterQueue's default), runs (not nominated), is charged
  to its queue (not Kueue's) and has no spec change waiting (a revision);
- its priority is at most the waiting task's plus ``priorityThreshold`` (0: lower or equal);
- it has run for at least ``minRuntime``;
- its queue and the cluster have moves left in the sliding ``window`` (``maxMovesPerWindow`` each).

A task of several pods (a gang) moves whole: every pod is re-placed, never one alone. The plan with the fewest
moves wins, then the least GPU-seconds of lost work (the GPUs each moved task holds times how long it has run),
then the node name. Nothing is applied unless the whole plan holds, checked again from scratch on a fresh snapshot
(:func:`plan_holds`). A move is an ``Evict`` (reason ``Defragmented``, naming the task it makes room for) and an
immediate nomination of the moved task to its new placement, admitted once its old workload is gone; the waiting
task is nominated to its placement (reason ``Defragmenting``) and admitted once every moved task is gone. KAI
Scheduler consolidates likewise but without budgets (KAI-Scheduler #146); Kueue has none.

Modes: ``Disabled`` (nothing planned), ``DryRun`` (planned and reported, :attr:`Defragmenter.reports`, never
applied), ``Enabled``. An optional maintenance window (``schedule``, cron syntax, parsed outside the core) is a
predicate of the time (:attr:`DefragConfig.allowed_at`). Times in seconds, GPU memory in MiB.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import combinations

from gputask.core.cache import Cache
from gputask.core.cluster import ClusterState, NodeState
from gputask.core.decisions import Decision, Evict, Pending, Wait
from gputask.core.errors import OverCommitError
from gputask.core.ledger import Entry, Ledger
from gputask.core.model import NodeName, Placement, PodPlacement, Task, TaskKey
from gputask.core.placement import Policy, QuotaCheck, candidate_rows, feasible_gpus, find_placement, node_fits
from gputask.core.preemption import Victim, could_fit_without
from gputask.core.queueing import Queues
from gputask.core.quota import QuotaBook, usage_of
from gputask.core.reasons import Reason, could_ever_fit, min_usage, need_text
from gputask.core.snapshot import Trial
from gputask.core.transitions import Transitions

DISABLED, DRY_RUN, ENABLED = "Disabled", "DryRun", "Enabled"
MODES = (DISABLED, DRY_RUN, ENABLED)

MAX_PLAN_MOVES = 3
"""The most tasks one plan moves (the search tries 1, then 2, then 3); fewer when the budgets have fewer left."""

MAX_CANDIDATES_PER_NODE = 8
"""Movable tasks of one node a plan chooses among (those of least lost work): bounds the search to C(8, 3) trials
per node."""

REFUSAL_RETRY_S = 60.0
"""A task whose move a PodDisruptionBudget refused is left out of plans this long (s), then asked again (the
operator does not watch budgets: a pod of the budget's set may become ready any time)."""

TOP_BLOCKS = 5
"""Nodes named in a ``Fragmented`` message (largest free block first)."""


@dataclass(frozen=True, slots=True)
class DefragConfig:
    """The operator's ``defragmentation`` section as the core reads it (seconds).

    ``priority_threshold``: a task may move for a waiting one when its priority minus the waiting task's is at most
    this (0: lower or equal; -1: strictly lower). ``max_moves_per_queue``: the moves of one queue's tasks in the
    window (None: ``max_moves_per_window``, which bounds every queue anyway). ``allowed_at(now)``: the maintenance
    window (``schedule``), None: any time. ``ask_budgets`` (the operator): an Enabled plan is first proposed
    (:meth:`Defragmenter.take_proposals`) for the adapter to ask the Eviction API whether every PodDisruptionBudget
    allows its moves, then applied (:meth:`Defragmenter.approved`) or refused (:meth:`Defragmenter.refused`)."""

    mode: str = DISABLED
    min_runtime_s: float = 300.0
    max_moves_per_window: int = 4
    window_s: float = 3600.0
    priority_threshold: int = 0
    max_moves_per_queue: int | None = None
    allowed_at: Callable[[float], bool] | None = field(default=None, compare=False)
    ask_budgets: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"defragmentation mode {self.mode!r}: use one of {', '.join(MODES)}")


@dataclass(frozen=True, slots=True)
class Move:
    """One moved task: its ``task`` (as admitted), where it runs (``origin``), where it goes (``target``), and the
    GPU-seconds of work it loses (``lost_gpu_s``: GPUs held times seconds run; a shared GPU counts whole)."""

    task: Task
    origin: Placement
    target: Placement
    lost_gpu_s: float


@dataclass(frozen=True, slots=True)
class DefragPlan:
    """Place waiting ``task`` at ``placement`` after ``moves`` (each a whole task, every pod re-placed)."""

    task: Task
    placement: Placement
    moves: tuple[Move, ...]

    @property
    def lost_gpu_s(self) -> float:
        """GPU-seconds of work the moves lose."""
        return sum(m.lost_gpu_s for m in self.moves)

    def describe(self) -> str:
        """``a/x (node-1 to node-2), a/y (node-1 to node-3)``."""
        return ", ".join(
            f"{m.task.key} ({', '.join(m.origin.nodes)} to {', '.join(m.target.nodes)})" for m in self.moves
        )


@dataclass(frozen=True, slots=True)
class DefragReport:
    """A plan found at ``at``: ``applied`` (Enabled) or only reported (DryRun). For the adapter to log."""

    plan: DefragPlan
    applied: bool
    at: float


@dataclass(slots=True)
class DefragStats:
    """Counts since start: ``moves`` made, ``plans`` applied, ``dry_runs`` reported, ``refused_by_budget``
    (plans a budget stopped: no moves left in the window), ``lost_gpu_s`` (GPU-seconds of work lost)."""

    moves: int = 0
    plans: int = 0
    dry_runs: int = 0
    refused_by_budget: int = 0
    lost_gpu_s: float = 0.0


def _gpus(placement: Placement) -> int:
    return sum(len(p.gpus) for p in placement.pods)


def _ok(state: NodeState, task: Task) -> bool:
    """Schedulable and the node's filters (taints, affinity, capacities) allow the task, whatever its GPUs hold."""
    return state.node.schedulable and could_ever_fit(state, task)


def free_blocks(cluster: ClusterState, task: Task) -> list[tuple[int, NodeName]]:
    """Per schedulable node whose filters allow ``task``: how many of its GPUs could each take one GPU of the task
    now (its largest free block for this task), largest first, then node name; nodes with none left out.
    Identical nodes in identical states (the index's groups) are looked at once, unless the task's affinity reads
    node names."""
    index = cluster.index()
    share = not (task.constraints is not None and task.constraints.by_name)
    seen: dict[int, int] = {}
    out = []
    for state, group in zip(index.states, index.group, strict=True):
        n = seen.get(group) if share else None
        if n is None:
            n = len(feasible_gpus(state, task)) if _ok(state, task) else 0
            seen[group] = n
        if n:
            out.append((n, state.name))
    return sorted(out, key=lambda b: (-b[0], b[1]))


def fragmented(task: Task, cluster: ClusterState, quotas: QuotaBook, largest_gpu_mib: int = 0) -> Wait | None:
    """Reason ``Fragmented`` when ``task`` (one pod, 2+ GPUs) waits on fragmentation, not quota: its queue allows
    the least it could charge, the nodes its filters allow hold enough GPUs it could use between them, and no one
    of them enough. The message names the largest free blocks (top :data:`TOP_BLOCKS`). None otherwise."""
    count = task.request.count
    if not task.single_pod or count < 2 or task.queue not in quotas.specs:
        return None
    if quotas.refuses(task.queue, min_usage(task, largest_gpu_mib)) is not None:
        return None
    blocks = free_blocks(cluster, task)
    total = sum(n for n, _ in blocks)
    if total < count or blocks[0][0] >= count:
        return None
    what = f"GPUs {need_text(task)}"
    top = ", ".join(f"{name} {n}" for n, name in blocks[:TOP_BLOCKS])
    more = f" and {len(blocks) - TOP_BLOCKS} more" if len(blocks) > TOP_BLOCKS else ""
    message = (f"needs {count} {what} on one node: {total} are free in the cluster but no node has more than "
               f"{blocks[0][0]} (largest free blocks: {top}{more})")
    return Wait(Reason.FRAGMENTED, message)


class Defragmenter:
    """Plans moves for tasks that wait on fragmentation and keeps the move budgets (module doc).

    State: the moves made in the sliding window (time, queue), the plans reported (``reports``, taken by the
    adapter), the counts (``stats``), the next time a refused plan could hold for time alone (``wake_at``: a
    candidate reaching ``minRuntime``, a move leaving the window, the next minute of the schedule).
    """

    def __init__(self, config: DefragConfig | None = None) -> None:
        self.config = config or DefragConfig()
        self.log: deque[tuple[float, str]] = deque()
        self.reports: list[DefragReport] = []
        self.stats = DefragStats()
        self.wake_at = float("inf")
        self._said: dict[TaskKey, tuple[object, ...]] = {}  # the last plan reported per waiting task
        self.asking: dict[TaskKey, DefragPlan] = {}  # proposed plans (ask_budgets) by waiting task, not yet answered
        self.proposals: list[DefragPlan] = []  # proposed and not yet taken by the adapter
        self.dry_runs: list[DefragPlan] = []  # plans reported (DryRun) and not yet taken by the adapter (its Events)
        self.refusals: dict[TaskKey, tuple[float, str]] = {}  # moved task -> (until s, why a budget refused its move)

    @property
    def enabled(self) -> bool:
        """True unless the mode is Disabled."""
        return self.config.mode != DISABLED

    # -- budgets --------------------------------------------------------------------------------------
    def _trim(self, now: float) -> None:
        while self.log and self.log[0][0] <= now - self.config.window_s:
            self.log.popleft()

    def moves_left(self, now: float, queue: str | None = None) -> int:
        """Moves the cluster (``queue`` None) or ``queue`` may still make in the window ending at ``now``."""
        self._trim(now)
        used = sum(1 for _, q in self.log if queue is None or q == queue)
        config = self.config
        most = config.max_moves_per_window
        if queue is not None and config.max_moves_per_queue is not None:
            most = min(most, config.max_moves_per_queue)
        return max(0, most - used)

    def _wake(self, at: float) -> None:
        self.wake_at = min(self.wake_at, at)

    # -- candidates -----------------------------------------------------------------------------------
    def movable(self, entry: Entry, waiting: Task, cache: Cache, now: float) -> str | None:
        """Why running ``entry`` may not move for ``waiting`` now (None: it may, budgets aside)."""
        task, spec = entry.task, cache.quotas.specs.get(entry.task.queue)
        opted = task.movable if task.movable is not None else (spec is not None and spec.movable)
        if task.key == waiting.key or not opted:
            return "not movable"
        if not entry.charged or task.key in cache.revisions:
            return "not movable now"
        if task.priority - waiting.priority > self.config.priority_threshold:
            return "priority too high"
        if now - entry.admitted_at < self.config.min_runtime_s:
            self._wake(entry.admitted_at + self.config.min_runtime_s)
            return "runs for less than minRuntime"
        refusal = self.refusals.get(task.key)
        if refusal is not None:
            if refusal[0] > now:
                self._wake(refusal[0])
                return f"refused by a disruption budget ({refusal[1]})"
            del self.refusals[task.key]
        return None

    # -- planning -------------------------------------------------------------------------------------
    def plan(
        self, task: Task, cache: Cache, policy: Policy, now: float, *, count: bool = False
    ) -> tuple[DefragPlan | None, str]:
        """The best plan for waiting ``task`` at ``now`` and why there is none (``""`` with a plan). Changes
        nothing but ``wake_at`` and, with ``count`` (the cycle's attempts), the count of plans budgets refused.
        Works on snapshots only."""
        config = self.config
        if not task.single_pod:
            return None, "not yet planned for tasks of several pods"
        if config.allowed_at is not None and not config.allowed_at(now):
            self._wake(now - now % 60 + 60)
            return None, "outside the maintenance window (defragmentation.schedule)"
        left = self.moves_left(now)
        if left == 0:
            self.stats.refused_by_budget += count
            self._wake(self.log[0][0] + config.window_s)
            return None, f"no moves left: maxMovesPerWindow {config.max_moves_per_window} spent in the window"
        by_node: dict[NodeName, list[Entry]] = {}
        reasons: dict[str, int] = {}
        queue_left: dict[str, int] = {}
        for entry in cache.ledger.running.values():
            why = self.movable(entry, task, cache, now)
            if why is None:
                queue = entry.task.queue
                if queue not in queue_left:
                    queue_left[queue] = self.moves_left(now, queue)
                if queue_left[queue] == 0:
                    why = f"queue {queue!r} has no moves left in the window"
                    self._wake(min(t for t, q in self.log if q == queue) + config.window_s)
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
                continue
            for node in entry.placement.nodes:
                by_node.setdefault(node, []).append(entry)
        if not by_node:
            detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
            if any("moves left" in why for why in reasons):
                self.stats.refused_by_budget += count
            return None, f"no running task may move ({detail or 'none runs'})"
        cluster = cache.cluster
        nodes = [name for name in sorted(by_node) if _ok(cluster.node(name), task)]
        for k in range(1, min(MAX_PLAN_MOVES, left) + 1):
            best: DefragPlan | None = None
            for name in nodes:
                state = cluster.node(name)
                ranked = sorted(by_node[name], key=lambda e: (_lost(e, now), e.task.key))[:MAX_CANDIDATES_PER_NODE]
                for combo in combinations(ranked, k):
                    if not _within(combo, queue_left):
                        continue
                    victims = [Victim(e.task, e.placement, e.usage, e.admitted_at) for e in combo]
                    if not could_fit_without(state, task, victims):
                        continue
                    found = self._try(task, name, combo, cache, policy, now)
                    if found is not None and (best is None or found.lost_gpu_s < best.lost_gpu_s):
                        best = found
            if best is not None:
                return best, ""
        if self.log and (left < MAX_PLAN_MOVES or any(n < MAX_PLAN_MOVES for n in queue_left.values())):
            self._wake(self.log[0][0] + config.window_s)  # more moves, once some leave the window, might
        return None, f"no move of up to {min(MAX_PLAN_MOVES, left)} movable tasks makes room on one node"

    def _try(
        self, task: Task, node: NodeName, combo: Iterable[Entry], cache: Cache, policy: Policy, now: float
    ) -> DefragPlan | None:
        """Move ``combo`` off ``node`` and place ``task`` there, on a fresh snapshot; None when any part fails."""
        trial = Trial.of(cache.cluster, cache.quotas)
        live, moved = cache.cluster, list(combo)
        touched: set[NodeName] = {node}
        for entry in moved:
            for name in entry.placement.nodes:  # read first: a snapshot knows the reservations of the nodes it read
                trial.cluster.node(name)
            trial.cluster.release(entry.task.key)
            trial.quotas.charge(entry.task.queue, entry.usage, -1)
            touched.update(entry.placement.nodes)
        here = find_placement(trial.cluster, task, policy, quota=_quota(trial.quotas, task),
                              nodes=[trial.cluster.node(node)]).placement
        if here is None:
            return None
        _book(trial, task, here, cache)
        _departing(trial, moved)
        moves = []
        for entry in sorted(moved, key=lambda e: (-_gpus(e.placement), e.task.key)):  # the hardest first
            mover = entry.task
            names = [n for n in _rows(live, mover) if n != node]
            if mover.single_pod:  # read-only search: the live state of a node the trial has not changed
                scope = [trial.cluster.node(n) if n in touched else live.node(n) for n in names]
            else:  # a gang is placed pod by pod on a copy of the trial: every node in scope must be the trial's
                scope = [trial.cluster.node(n) for n in names]

            def whole(placement: Placement, mover: Task = mover) -> str | None:
                return trial.quotas.refuses(mover.queue, cache.ledger.usage(placement, mover))

            target = find_placement(trial.cluster, mover, policy, quota=_quota(trial.quotas, mover),
                                    nodes=scope, total_quota=whole).placement
            if target is None:
                return None
            touched.update(target.nodes)
            _book(trial, mover, target, cache)
            moves.append(Move(mover, entry.placement, target, _lost(entry, now)))
        return DefragPlan(task, here, tuple(sorted(moves, key=lambda m: m.task.key)))

    def explain(self, task: Task, cache: Cache, policy: Policy, now: float) -> tuple[str, ...]:
        """For a task that waits Fragmented: the mode, the plan (each move, where it goes, the work lost) and the
        budget left, or why there is no plan; () for any other task. Changes nothing but ``wake_at``."""
        if fragmented(task, cache.cluster, cache.quotas, cache.largest_gpu_mib) is None:
            return ()
        mode = self.config.mode
        plan, why = self.plan(task, cache, policy, now)
        left = f"{self.moves_left(now)} of {self.config.max_moves_per_window} moves left in the window"
        if plan is None:
            return (f"mode {mode}; no plan now: {why}", left)
        run = "" if mode == ENABLED else f" (not run: {mode})"
        lines = [f"mode {mode}; the plan{run}: place it on {', '.join(plan.placement.nodes)} after "
                 f"{len(plan.moves)} move(s), {plan.lost_gpu_s / 3600:.2f} GPU-hours of work lost"]
        lines += [f"move {m.task.key} (priority {m.task.priority}) from {', '.join(m.origin.nodes)} to "
                  f"{', '.join(m.target.nodes)}" for m in plan.moves]
        lines.append(left)
        return tuple(lines)

    # -- acting ---------------------------------------------------------------------------------------
    def attempt(
        self, task: Task, cache: Cache, queues: Queues, moves: Transitions, policy: Policy, now: float,
        failed: set[tuple[object, ...]], *, probing: bool = False,
    ) -> list[Decision] | None:
        """The cycle's step for ``task`` waiting Fragmented: plan, then act (:meth:`act`). ``failed`` holds the
        (queue, shape, priority) whose plan failed earlier in this cycle (capacity and budgets only shrink within
        it: a later task alike fails too). None, instead of acting, when ``probing`` and the plan would change
        state (the cycle then walks); [] when no plan holds or it is only reported (DryRun)."""
        attempt = ((task.queue, task.fit_key), task.priority)
        if attempt in failed or task.key in self.asking:
            return []
        plan, _ = self.plan(task, cache, policy, now, count=True)
        if plan is None:
            failed.add(attempt)
            return []
        if probing and self.config.mode == ENABLED:
            return None
        return self.act(plan, cache, queues, moves, now)

    def act(self, plan: DefragPlan, cache: Cache, queues: Queues, moves: Transitions, now: float) -> list[Decision]:
        """Apply ``plan`` (Enabled) or report it (DryRun); [] when reported, or when it no longer holds."""
        if self.config.mode == DRY_RUN:
            said = (plan.placement, tuple((m.task.key, m.target) for m in plan.moves))
            if self._said.get(plan.task.key) != said:
                self._said[plan.task.key] = said
                self.stats.dry_runs += 1
                self._report(DefragReport(plan, False, now))
                self.dry_runs = [*self.dry_runs[-99:], plan]
            return []
        if not plan_holds(plan, cache):
            return []
        if self.config.ask_budgets and plan.moves:  # the adapter asks the budgets first (approved, refused)
            self.asking[plan.task.key] = plan
            self.proposals.append(plan)
            return []
        return self._apply(plan, cache, queues, moves, now)

    def take_proposals(self) -> list[DefragPlan]:
        """The plans proposed since the last call (``ask_budgets``), cleared; each stays asked (its waiting task
        plans nothing else) until :meth:`approved`, :meth:`refused` or :meth:`cancel` answers it."""
        out, self.proposals = self.proposals, []
        return out

    def take_dry_runs(self) -> list[DefragPlan]:
        """The plans reported in DryRun since the last call (the latest 100), cleared: the adapter's Events."""
        out, self.dry_runs = self.dry_runs, []
        return out

    def approved(
        self, plan: DefragPlan, cache: Cache, queues: Queues, moves: Transitions, now: float
    ) -> list[Decision]:
        """Every budget allowed ``plan``'s moves (the moved pods are being evicted): apply it as :meth:`act` does
        when it still holds (:func:`plan_holds`); [] when it no longer does or was not asked."""
        if self.asking.get(plan.task.key) != plan:
            return []
        del self.asking[plan.task.key]
        if self.config.mode != ENABLED or not plan_holds(plan, cache):
            return []
        return self._apply(plan, cache, queues, moves, now)

    def refused(self, plan: DefragPlan, task: TaskKey, why: str, now: float) -> None:
        """A PodDisruptionBudget refused the move of ``task`` in ``plan`` (``why`` names it): nothing of the plan is
        done, it counts as a plan refused by budgets, and ``task`` is left out of plans for
        :data:`REFUSAL_RETRY_S` (the next cycle tries another plan, or the waiting task waits saying why)."""
        self.cancel(plan)
        self.stats.refused_by_budget += 1
        self.refusals[task] = (now + REFUSAL_RETRY_S, why)
        self._wake(now + REFUSAL_RETRY_S)

    def cancel(self, plan: DefragPlan) -> None:
        """Forget asked ``plan`` without counting it (an API error: the next cycle plans again)."""
        if self.asking.get(plan.task.key) == plan:
            del self.asking[plan.task.key]

    def _apply(self, plan: DefragPlan, cache: Cache, queues: Queues, moves: Transitions, now: float) -> list[Decision]:
        entries = [cache.ledger.get(m.task.key) for m in plan.moves]
        for move in plan.moves:
            moves.requeue(move.task.key)
        queues.take(plan.task.key)
        cache.nominate(plan.task, plan.placement, [m.task.key for m in plan.moves], now)
        out: list[Decision] = []
        for move, entry in zip(plan.moves, entries, strict=True):
            held = moves.hold_departing(entry) if entry is not None else None  # what the waiting task did not take
            queues.take(move.task.key)
            cache.nominate(move.task, move.target, [move.task.key], now)  # admitted once its old workload is gone
            where = ", ".join(plan.placement.nodes)
            message = (f"moved to {', '.join(move.target.nodes)} to make room for {plan.task.key} "
                       f"(priority {plan.task.priority}) on {where}")
            out.append(Evict(move.task, move.origin, Reason.DEFRAGMENTED, message, by=plan.task.key, held=held))
            self.log.append((now, move.task.queue))
        self.stats.moves += len(plan.moves)
        self.stats.plans += 1
        self.stats.lost_gpu_s += plan.lost_gpu_s
        self._said.pop(plan.task.key, None)
        self._report(DefragReport(plan, True, now))
        waiting = f"moving {plan.describe()} to make room on {', '.join(plan.placement.nodes)}"
        out.append(Pending(plan.task, Reason.DEFRAGMENTING, waiting))
        return out

    def _report(self, report: DefragReport) -> None:
        if len(self.reports) >= 1000:  # nobody takes them: keep the latest
            del self.reports[:500]
        self.reports.append(report)

    def take_reports(self) -> list[DefragReport]:
        """The plans found since the last call (applied or dry-run), cleared."""
        out, self.reports = self.reports, []
        return out


def _within(combo: Iterable[Entry], queue_left: dict[str, int]) -> bool:
    counts: dict[str, int] = {}
    for entry in combo:
        counts[entry.task.queue] = counts.get(entry.task.queue, 0) + 1
    return all(n <= queue_left[q] for q, n in counts.items())


def _lost(entry: Entry, now: float) -> float:
    return _gpus(entry.placement) * max(0.0, now - entry.admitted_at)


def _rows(cluster: ClusterState, task: Task) -> list[NodeName]:
    """Nodes that might take ``task`` (pod by pod: any pod's aggregates allow it), name order."""
    index = cluster.index()
    rows: set[int] = set()
    for pod in task.podsets:
        rows.update(candidate_rows(index, task.pod_task(pod)))
    return [index.states[r].name for r in sorted(rows)]


def _quota(quotas: QuotaBook, task: Task) -> QuotaCheck:
    def check(state: NodeState, placement: PodPlacement) -> str | None:
        memory = {g.index: g.memory_mib for g in state.node.gpus}
        return quotas.refuses(task.queue, usage_of(placement, memory, task.flavor, task.card_mib))

    return check


def _departing(trial: Trial, moved: Iterable[Entry]) -> None:
    """Hold on the trial what the moved tasks' old pods keep until their workloads are gone: what the waiting task
    did not take of their GPUs (as :meth:`~gputask.core.transitions.Transitions.hold_departing` holds it live)."""
    holds = Ledger(trial.cluster, trial.quotas)
    for entry in moved:
        holds.hold(TaskKey(f"{entry.task.key}#departing"), entry.placement, fit=True)


def _book(trial: Trial, task: Task, placement: Placement, cache: Cache) -> None:
    """Reserve and charge ``placement`` on the trial (its usage as the ledger reckons it)."""
    trial.cluster.reserve(task, placement)
    trial.quotas.charge(task.queue, cache.ledger.usage(placement, task))


def plan_holds(plan: DefragPlan, cache: Cache) -> bool:
    """Check ``plan`` from scratch on a fresh snapshot: every moved task still runs where the plan found it, and
    once they are gone the waiting task and then every moved task (beside what their old pods still hold) fit together,
    pod by pod (the node's filters and
    free host resources, :func:`~gputask.core.placement.node_fits`; the GPUs and their MiB, a reservation that
    refuses to over-commit) and within their queues' quota. Changes nothing."""
    trial = Trial.of(cache.cluster, cache.quotas)
    for move in plan.moves:
        entry = cache.ledger.running.get(move.task.key)
        if entry is None or entry.placement != move.origin:
            return False
        for name in entry.placement.nodes:
            trial.cluster.node(name)
        trial.cluster.release(move.task.key)
        trial.quotas.charge(entry.task.queue, entry.usage, -1)
    placed = [(plan.task, plan.placement)] + [(m.task, m.target) for m in plan.moves]
    for n, (task, placement) in enumerate(placed):
        if n == 1:  # the moved tasks' old pods run on until their workloads are gone
            _departing(trial, [Entry(m.task, m.origin, {}, 0.0) for m in plan.moves])
        if len(task.pods) != len(placement.pods):
            return False
        for i, (pod, where) in enumerate(zip(task.pods, placement.pods, strict=True)):
            one = replace(task.pod_task(pod), key=TaskKey(f"{task.key}#pod-{i}"))
            if not cache.cluster.has_node(where.node):
                return False
            state = trial.cluster.node(where.node)
            if not node_fits(state, one) or len(where.gpus) != pod.request.count:
                return False
            try:
                trial.cluster.reserve(one, Placement((where,)))
            except OverCommitError:
                return False
        usage = cache.ledger.usage(placement, task)
        if trial.quotas.refuses(task.queue, usage) is not None:
            return False
        trial.quotas.charge(task.queue, usage)
    return True
