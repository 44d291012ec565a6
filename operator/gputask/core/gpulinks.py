"""GPU topology inside a node: the best-connected GPUs among equal choices, and how a set is connected.

The agent reports how each pair of a node's GPUs is connected (:class:`~gputask.core.model.GpuLink`, in
:attr:`Node.links <gputask.core.model.Node.links>`): NVLink with its link count, else the PCIe path NVML's
``nvmlDeviceGetTopologyCommonAncestor`` gives. A multi-GPU pod runs its collectives (all-reduce) over every
pair of its GPUs, so the slowest pair bounds it; the same rule orders NVIDIA's own GPU allocation for
multi-GPU containers (k8s-device-plugin's "best effort" allocation policy scores sets by their pairs' links).

:func:`best_connected` is a tie-break only. The policy picks GPUs on a node; any GPU of that node that is
*alike* to a picked one (same product, memory, health, foreign use, reservation, exclusivity and share
groups: :func:`_alike_key`) could take its place, and the node would be left in the same state up to the
numbering of its GPUs, so every score (fragmentation, best fit, product pressure, all sums over GPUs) and
every quota charge (which depend on the GPUs' sizes) is the same. Among those equal choices the pod gets the
set whose worst pair is best connected, then the best sum over pairs, then the policy's own pick, then the
lowest indices. Without links (every trace, every node whose agent could not read them) nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import combinations, product

from gputask.core.cluster import NodeState
from gputask.core.model import LINK_TYPES, GpuLink, Node

MAX_CANDIDATES = 2000
"""Sets of alike GPUs compared exhaustively at most; beyond (16 alike GPUs, 6 or more wanted) greedy sets grown
from each GPU, then single swaps, improve on the policy's pick (a local optimum, the same answer for the same
node; see :data:`MAX_GREEDY_GPUS`)."""

MAX_GREEDY_GPUS = 16
"""Beyond :data:`MAX_CANDIDATES` sets, the search runs only where at most this many GPUs are candidates (every
NVLink machine NVIDIA makes has 16 GPUs at most); on larger (fake) nodes the policy's pick stands, which keeps a
placement's cost bounded (a 64-GPU node would take a second)."""

_TIER = {kind: len(LINK_TYPES) - i for i, kind in enumerate(LINK_TYPES)}  # NVLink 5 ... CrossNUMA 1; unknown 0
_MAX_COUNT = 99


def pair_value(link: GpuLink | None) -> int:
    """How well one pair is connected, higher is better: its kind's rank (NVLink highest, unknown 0), then its
    NVLink count (capped at 99)."""
    if link is None:
        return 0
    return _TIER.get(link.kind, 0) * (_MAX_COUNT + 1) + min(max(link.count, 0), _MAX_COUNT)


def link_table(node: Node) -> dict[tuple[int, int], GpuLink]:
    """The node's links by ``(a, b)`` with ``a < b`` (GPU indices)."""
    return {(link.a, link.b): link for link in node.links}


def set_value(table: Mapping[tuple[int, int], GpuLink], indices: Sequence[int]) -> tuple[int, int]:
    """``(worst pair, sum over pairs)`` of :func:`pair_value` over every pair of ``indices``; higher is better
    ((0, 0) for fewer than two GPUs)."""
    values = [pair_value(table.get((a, b) if a < b else (b, a))) for a, b in combinations(indices, 2)]
    return (min(values), sum(values)) if values else (0, 0)


def _alike_key(state: NodeState, pos: int) -> tuple[object, ...]:
    """What placement reads of the GPU at ``pos`` besides its index and uuid: GPUs with equal keys are
    interchangeable for every policy and quota."""
    gpu = state.node.gpus[pos]
    held = state.groups[pos]
    return (gpu.product, gpu.memory_mib, gpu.healthy, gpu.foreign_mib, state.reserved_mib[pos],
            state.exclusive[pos], tuple(sorted(held.items())) if held else ())


def best_connected(state: NodeState, picked: tuple[int, ...], feasible: Sequence[int]) -> tuple[int, ...]:
    """``picked`` (positions on ``state``, the policy's choice out of ``feasible``) or, when the node reports
    links, the best-connected set of GPUs alike to them (see the module docstring), in ascending position
    order when it differs from ``picked``. Pure; never changes the node's score or the quota charge."""
    node = state.node
    if len(picked) < 2 or not node.links:
        return picked
    table = link_table(node)
    gpus = node.gpus
    wanted: dict[tuple[object, ...], int] = {}
    for pos in picked:
        key = _alike_key(state, pos)
        wanted[key] = wanted.get(key, 0) + 1
    pool: dict[tuple[object, ...], list[int]] = {key: [] for key in wanted}
    for pos in feasible:
        key = _alike_key(state, pos)
        if key in pool:
            pool[key].append(pos)
    if all(len(pool[key]) == n for key, n in wanted.items()):
        return picked  # no alike GPU to swap in
    groups = [(sorted(pool[key]), n) for key, n in wanted.items()]

    def value(positions: Sequence[int]) -> tuple[int, int]:
        return set_value(table, [gpus[p].index for p in positions])

    best, best_value = picked, value(picked)
    if _candidate_count(groups) <= MAX_CANDIDATES:
        for positions in _candidates(groups):
            found = value(positions)
            if found > best_value:
                best, best_value = positions, found
        return best
    return _improved(groups, picked, best_value, value)


def _candidate_count(groups: Sequence[tuple[Sequence[int], int]]) -> int:
    total = 1
    for members, n in groups:
        total *= _choose(len(members), n)
        if total > MAX_CANDIDATES:
            break
    return total


def _choose(n: int, k: int) -> int:
    out = 1
    for i in range(k):
        out = out * (n - i) // (i + 1)
    return out


def _candidates(groups: Sequence[tuple[Sequence[int], int]]) -> Iterator[tuple[int, ...]]:
    """Every set taking ``n`` of each group's members, as ascending positions, in lexicographic order of the
    groups' choices."""
    for parts in product(*(combinations(members, n) for members, n in groups)):
        yield tuple(sorted(p for part in parts for p in part))


def _improved(groups: Sequence[tuple[Sequence[int], int]], picked: tuple[int, ...], start: tuple[int, int],
              value: Callable[[Sequence[int]], tuple[int, int]]) -> tuple[int, ...]:
    """Greedy sets, then local search (at most :data:`MAX_GREEDY_GPUS` candidate GPUs): from each GPU, add the
    GPU that makes the set best (lowest position on ties, each group giving its count) until the set is full;
    then, from the best of those, swap one GPU for an alike one while that makes the set strictly better.
    ``picked`` unless something beats it."""
    group_of = {p: i for i, (members, _) in enumerate(groups) for p in members}
    size = sum(n for _, n in groups)
    best, best_value = tuple(sorted(picked)), start
    if len(group_of) > MAX_GREEDY_GPUS:
        return picked
    for first in sorted(group_of):
        chosen, left = [first], [n for _, n in groups]
        left[group_of[first]] -= 1
        while len(chosen) < size:
            options = [p for p in sorted(group_of) if left[group_of[p]] > 0 and p not in chosen]
            step = max(options, key=lambda p: (value([*chosen, p]), -p))
            chosen.append(step)
            left[group_of[step]] -= 1
        found = value(chosen)
        if found > best_value:
            best, best_value = tuple(sorted(chosen)), found
    current, current_value = set(best), best_value
    improved = True
    while improved:
        improved = False
        for out in sorted(current):
            for into in groups[group_of[out]][0]:
                trial = tuple(sorted((current - {out}) | {into}))
                found = value(trial) if into not in current else current_value
                if found > current_value:
                    current, current_value, improved = set(trial), found, True
                    break
            if improved:
                break
    result = tuple(sorted(current))
    return picked if result == tuple(sorted(picked)) else result


def describe(node: Node, indices: Sequence[int]) -> str:
    """How GPUs ``indices`` of ``node`` are connected, for ``gputask explain``: ``GPUs 0,1,2,3: NVLink x12 each
    pair`` when every pair is alike, else each pair (``0-1 NVLink x12, 0-2 CrossNUMA, ...``; ``no link info``
    for a pair the agent did not report). Empty for fewer than two GPUs or a node without links."""
    if len(indices) < 2 or not node.links:
        return ""
    table = link_table(node)
    ordered = sorted(indices)
    texts = {(a, b): _link_text(table.get((a, b))) for a, b in combinations(ordered, 2)}
    head = f"GPUs {','.join(map(str, ordered))}: "
    kinds = set(texts.values())
    if len(kinds) == 1:
        return head + (f"{kinds.pop()} each pair" if len(texts) > 1 else kinds.pop())
    return head + ", ".join(f"{a}-{b} {text}" for (a, b), text in texts.items())


def _link_text(link: GpuLink | None) -> str:
    if link is None:
        return "no link info"
    return f"NVLink x{link.count}" if link.kind == "NVLink" else link.kind
