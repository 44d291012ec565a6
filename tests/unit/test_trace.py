"""Trace replay (FGD protocol) on tiny synthetic traces written to tmp_path: exact outcomes and the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gputask.core import POLICIES, GpuRequest
from gputask.core.placement import FirstFit
from gputask.core.policies import TargetWorkload, TaskShape
from gputask.sim.report import simulate_command
from gputask.sim.trace import (
    NODE_LIST,
    RunResult,
    RunSpec,
    TraceNode,
    TracePod,
    build_nodes,
    read_nodes,
    read_pods,
    replay,
    request_of,
    run,
    target_shape,
    tie_break_keys,
    workload,
)

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
openb-node-0000,8000,32768,2,T4
openb-node-0001,16000,65536,2,V100M16
"""
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
TWO_NODES = [
    TraceNode("openb-node-0000", 8000, 32768, 2, "T4"),
    TraceNode("openb-node-0001", 16000, 65536, 2, "V100M16"),
]
CAPACITY = 4000  # milli-GPU of TWO_NODES


def pod(name: str, gpus: int, milli: int, cpu: int = 1000, spec: str = "") -> TracePod:
    """A pod of ``gpus`` x ``milli`` with 1 GiB of memory."""
    return TracePod(name, cpu, 1024, gpus, milli, frozenset(m for m in spec.split("|") if m))


ARRIVALS = [
    pod("a", 1, 500),
    pod("b", 2, 1000),
    pod("c", 1, 600),
    pod("d", 1, 900),
    pod("e", 0, 0, cpu=6000),
    pod("f", 1, 400, spec="V100M16"),
    pod("g", 1, 400, cpu=7000),
    pod("h", 1, 400),
]
"""Hand-checked: arrived 12.5, 62.5, 77.5, 100, 100, 110, 120, 130 % of 4 GPUs."""


def curve(points: dict[int, float]) -> list[float | None]:
    """A 0..130 curve with ``points`` set and None elsewhere."""
    return [points.get(p) for p in range(131)]


def write_trace(root: Path, pods: list[TracePod], name: str = "openb_pod_list_tiny.csv") -> Path:
    """Write TWO_NODES and ``pods`` in the trace's CSV schema under ``root/csv``; returns that folder."""
    folder = root / "csv"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / NODE_LIST).write_text(NODES_CSV)
    rows = "".join(
        f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli},{'|'.join(sorted(p.gpu_spec))},"
        f"LS,Running,0,10,0\n"
        for p in pods
    )
    (folder / name).write_text(POD_HEADER + rows)
    return folder


def test_best_fit_replay_fails_exactly_the_pods_that_fit_nowhere() -> None:
    """Best fit packs a, b, c, h, puts CPU-only e on the GPU-full node, and fails d, f and g."""
    nodes = build_nodes(TWO_NODES)
    result = replay(nodes, [(p.name, p) for p in ARRIVALS], "bestfit", seed=1)
    assert result == RunResult(
        "bestfit",
        1,
        "name",
        8,
        ["d", "f", "g"],
        0,
        curve(
            {
                12: 12.5,
                13: 12.5,
                14: 12.5,
                62: 62.5,
                63: 62.5,
                64: 62.5,
                77: 77.5,
                78: 77.5,
                79: 77.5,
                99: 77.5,
                100: 77.5,
                101: 77.5,
                109: 77.5,
                110: 77.5,
                111: 77.5,
                119: 77.5,
                120: 77.5,
                121: 77.5,
                129: 87.5,
                130: 87.5,
            }
        ),
    )
    assert (result.allocation_at_100, result.unallocated_at_100) == (77.5, 22.5)


def test_first_fit_replay_puts_the_cpu_only_pod_first_and_then_lacks_cpu_for_h() -> None:
    """First fit puts CPU-only e on node 0000, whose CPU is then exhausted, so h fails too."""
    result = replay(build_nodes(TWO_NODES), [(p.name, p) for p in ARRIVALS], "firstfit", seed=1)
    assert (result.failed, result.refused_feasible, result.curve[130]) == (["d", "f", "g", "h"], 0, 77.5)


def test_refused_feasible_counts_pods_a_policy_turned_away_while_a_node_fitted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A policy that visits no node fails every pod; all but the 4-GPU one fitted somewhere."""

    class Never(FirstFit):
        def node_order(self, count: int) -> list[int]:
            return []

    monkeypatch.setitem(POLICIES, "never", Never)
    arrivals = [(p.name, p) for p in [*ARRIVALS, pod("huge", 4, 1000)]]
    result = replay(build_nodes(TWO_NODES), arrivals, "never", seed=1)
    assert (result.failed_pods, result.refused_feasible) == (9, 8)


def test_trace_rows_map_onto_core_requests_with_one_mib_per_milli_gpu() -> None:
    """Sharing pods ask a fraction, whole/multi-GPU pods exclusive GPUs, gpu_spec products; a GPU is 1000 MiB."""
    requests = [
        request_of(p)
        for p in (
            pod("s", 1, 470),
            pod("w", 1, 1000),
            pod("m", 8, 1000),
            pod("c", 0, 0),
            pod("p", 1, 250, spec="V100M16|V100M32"),
        )
    ]
    node = build_nodes(TWO_NODES[:1])[0]
    assert (requests, [g.memory_mib for g in node.gpus], node.gpus[0].product, node.cpu_milli, node.memory_mib) == (
        [
            GpuRequest(1, fraction_milli=470),
            GpuRequest(1),
            GpuRequest(8),
            GpuRequest(0),
            GpuRequest(1, fraction_milli=250, products=frozenset({"V100M16", "V100M32"})),
        ],
        [1000, 1000],
        "T4",
        8000,
        32768,
    )


def test_copies_are_added_until_the_next_would_pass_130_percent() -> None:
    """Three 1-GPU pods on 4 GPUs get two copies: 5000 milli, as a sixth pod would make 6000 > 5200."""
    pods = [pod(n, 1, 1000) for n in "xyz"]
    arrivals = workload(pods, 42, CAPACITY)
    assert (
        sorted(k for k, _ in arrivals[:3]),
        [k.split("-tuned-")[1] for k, _ in arrivals[3:]],
        sum(p.demand_milli for _, p in arrivals),
    ) == (["x", "y", "z"], ["0", "1"], 5000)


def test_cpu_only_copies_never_end_the_copying() -> None:
    """With a CPU-only pod in the list, copies still continue until GPU demand would pass the target."""
    pods = [pod("x", 1, 1000), pod("y", 1, 1000), pod("cpu", 0, 0)]
    totals = [sum(p.demand_milli for _, p in workload(pods, seed, CAPACITY)) for seed in range(5)]
    assert totals == [5000] * 5


def test_a_list_past_the_target_loses_random_pods_until_it_is_at_most_130_percent() -> None:
    """8 whole GPUs asked of 4 (200%) keep 5 (125%: the first demand at or under 130%) in their shuffled order,
    no copies."""
    pods = [pod(f"p{i}", 1, 1000) for i in range(8)] + [pod("cpu", 0, 0)]
    shuffled = sorted(pods, key=lambda p: p.name)
    random.Random(3).shuffle(shuffled)
    arrivals = workload(pods, 3, CAPACITY)
    kept = [k for k, _ in arrivals]
    assert (
        sum(p.demand_milli for _, p in arrivals),
        kept == [p.name for p in shuffled if p.name in kept],
        all("-tuned-" not in k for k in kept),
    ) == (5000, True, True)


def test_workload_and_runs_are_deterministic_per_seed(tmp_path: Path) -> None:
    """The same seed gives the same arrival order and the same run; another seed another order."""
    pods = [pod(f"p{i:02d}", 1, 100 + 10 * i) for i in range(20)]
    folder = write_trace(tmp_path, pods)
    spec = RunSpec(str(folder), "openb_pod_list_tiny.csv", "random", 7)
    assert (
        workload(pods, 7, CAPACITY) == workload(pods, 7, CAPACITY),
        workload(pods, 7, CAPACITY) == workload(pods, 8, CAPACITY),
        run(spec) == run(spec),
    ) == (True, False, True)


def test_random_tie_break_prefixes_names_with_a_seeded_key() -> None:
    """tie-break random renames every node KEY-NAME, the same per seed; name mode keeps the names."""
    names = [n.name for n in TWO_NODES]
    keys = tie_break_keys(names, 5)
    renamed = [n.name for n in build_nodes(TWO_NODES, tie_break="random", seed=5)]
    assert (
        [n.name for n in build_nodes(TWO_NODES)],
        renamed,
        keys == tie_break_keys(names, 5),
        keys == tie_break_keys(names, 6),
    ) == (
        names,
        [f"{keys[n]}-{n}" for n in names],
        True,
        False,
    )


def test_random_tie_break_sends_ties_to_a_node_that_varies_by_seed() -> None:
    """On two identical empty nodes a tie goes to the smaller key's node, which differs between seeds."""
    twins = [TraceNode(f"openb-node-000{i}", 8000, 1024, 2, "T4") for i in range(2)]
    chosen = {}
    for seed in range(12):
        nodes = build_nodes(twins, tie_break="random", seed=seed)
        result = replay(nodes, [("a", pod("a", 1, 1000)), ("b", pod("b", 2, 1000))], "bestfit", seed=seed)
        keys = tie_break_keys([t.name for t in twins], seed)
        chosen[seed] = (min(keys, key=keys.__getitem__), result.failed)
    winners = {winner for winner, _ in chosen.values()}
    assert (winners, {tuple(failed) for _, failed in chosen.values()}) == (
        {"openb-node-0000", "openb-node-0001"},
        {()},
    )


def test_simulate_json_has_the_design_shape_and_the_fgd_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three 1-GPU pods and two copies on 4 GPUs: 4 placed, 1 failed, 0% unallocated at 100%, per policy and seed."""
    folder = write_trace(tmp_path, [pod(n, 1, 1000) for n in "xyz"])
    fgd = tmp_path / "fgd-expected-results"
    fgd.mkdir()
    (fgd / "analysis_allo_discrete.csv").write_text(
        "workload,sc_policy,tune,seed,total_gpus,99,100\n"
        "openb_pod_list_tiny,01-Random,1.3,42,4,80,86.0\n"
        "openb_pod_list_tiny,01-Random,1.3,43,4,80,88.0\n"
        "openb_pod_list_tiny,01-Random,1.3,41,4,80,10.0\n"
        "openb_pod_list_tiny,05-BestFit,1.3,42,4,80,92.5\n"
        "openb_pod_list_default,05-BestFit,1.3,42,4,80,50.0\n"
    )
    code = simulate_command(
        folder, pods=["openb_pod_list_tiny.csv"], policies=["bestfit", "random"], seeds="42-43", output="json", jobs=1
    )
    shape = curve(
        {p: float(v) for c, v in ((25, 25), (50, 50), (75, 75), (100, 100), (125, 100)) for p in (c - 1, c, c + 1)}
    )
    zero, hundred, one = ({"mean": v, "min": v, "max": v} for v in (0.0, 100.0, 1.0))
    runs = [
        {
            "seed": s,
            "pods": 5,
            "failedPods": 1,
            "refusedFeasible": 0,
            "allocationPctAt100": 100.0,
            "unallocatedPctAt100": 0.0,
            "allocationPctByArrivedPct": shape,
        }
        for s in (42, 43)
    ]
    body = {
        "unallocatedPctAt100": zero,
        "allocationPctAt100": hundred,
        "failedPods": one,
        "refusedFeasible": zero,
        "seeds": [42, 43],
        "allocationPctByArrivedPct": shape,
        "runs": runs,
    }
    assert (code, json.loads(capsys.readouterr().out)) == (
        0,
        {
            "trace": "openb_pod_list_tiny.csv",
            "nodes": NODE_LIST,
            "tieBreak": "random",  # the default, as the FGD simulator
            "policies": {"bestfit": body, "random": body},
            "fgdExpected": {
                "source": "fgd-expected-results/analysis_allo_discrete.csv",
                "workload": "openb_pod_list_tiny",
                "seeds": [42, 51],
                "tieBreak": "random",
                "unallocatedPctAt100": {"Random": 13.0, "BestFit": 7.5},
            },
        },
    )


def test_simulate_table_states_the_tie_break_and_the_papers_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's caption names the trace, the seeds and the tie-break; no FGD file means no paper figures."""
    monkeypatch.setenv("COLUMNS", "300")
    folder = write_trace(tmp_path, [pod(n, 1, 1000) for n in "xyz"])
    code = simulate_command(
        folder,
        pods=["openb_pod_list_tiny.csv"],
        policies=["firstfit"],
        seeds="1,3",
        output="table",
        jobs=1,
        tie_break="random",
    )
    out = capsys.readouterr().out
    assert (
        code,
        "Trace openb_pod_list_tiny.csv" in out,
        "seeds 1,3, tie-break: random" in out,
        "FGD paper" in out.split("\n", 3)[-1],
    ) == (0, True, True, False)


def test_a_process_pool_gives_the_same_summary_as_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--jobs 2 runs (policy, seed) pairs in worker processes and prints the same JSON as --jobs 1."""
    folder = write_trace(tmp_path, [pod(f"p{i}", 1, 150 * (1 + i % 6)) for i in range(12)])
    outputs = []
    for jobs in (1, 2):
        simulate_command(folder, pods=["openb_pod_list_tiny.csv"], policies=None, seeds="1-3", output="json", jobs=jobs)
        outputs.append(json.loads(capsys.readouterr().out))
    default = ["bestfit", "firstfit", "random", "bestfit-atc23", "fgd", "packing"]
    assert (outputs[0] == outputs[1], list(outputs[0]["policies"])) == (True, default)


def test_missing_trace_exits_2_saying_where_to_get_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the trace the command exits 2 and names alibaba/clusterdata cluster-trace-gpu-v2023."""
    code = simulate_command(tmp_path / "nowhere", pods=None, policies=None, seeds="42", output="json", jobs=1)
    err = capsys.readouterr().err
    assert (code, "alibaba/clusterdata" in err, "cluster-trace-gpu-v2023" in err) == (2, True, True)


def test_bad_policy_and_seeds_exit_2(tmp_path: Path) -> None:
    """An unknown policy or unreadable seeds are usage errors."""
    folder = write_trace(tmp_path, [pod("x", 1, 1000)])
    assert [
        simulate_command(folder, pods=["openb_pod_list_tiny.csv"], policies=p, seeds=s, output="json", jobs=1)
        for p, s in ((["worstfit"], "1"), (None, "a-b"))
    ] == [2, 2]


def test_gpu_spec_as_written_keeps_target_shapes_apart(tmp_path: Path) -> None:
    """V100M16|V100M32|V100M32 and V100M16|V100M32 allow the same models but are two target shapes
    (3 and 1 pods: popularity 3/4 and 1/4), as in the FGD authors' simulator."""
    folder = write_trace(tmp_path, [])
    (folder / "openb_pod_list_tiny.csv").write_text(
        POD_HEADER
        + "".join(
            f"p{i},1000,1024,1,500,{spec},LS,Running,0,10,0\n"
            for i, spec in enumerate(["V100M16|V100M32|V100M32"] * 3 + ["V100M16|V100M32"])
        )
    )
    request = GpuRequest(1, fraction_milli=500, products=frozenset({"V100M16", "V100M32"}))
    shapes = [target_shape(p) for p in read_pods(folder / "openb_pod_list_tiny.csv")]
    assert TargetWorkload.from_shapes(shapes, popularity=1.0).shapes == (
        (TaskShape(request, 1000, 1024, "V100M16|V100M32|V100M32"), 0.75),
        (TaskShape(request, 1000, 1024, "V100M16|V100M32"), 0.25),
    )


def test_reading_the_csv_schema_back_gives_the_rows(tmp_path: Path) -> None:
    """Pod and node lists parse the documented columns, gpu_spec split on '|'."""
    folder = write_trace(tmp_path, ARRIVALS)
    assert (read_nodes(folder / NODE_LIST), read_pods(folder / "openb_pod_list_tiny.csv")) == (TWO_NODES, ARRIVALS)


SHARED_TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "alibaba-gpu-v2023" / "csv"


@pytest.mark.skipif(not (SHARED_TRACE / NODE_LIST).is_file(), reason="the real trace is not in ../shared")
def test_real_trace_has_the_papers_cluster_and_tunes_to_130_percent() -> None:
    """The real GPU node list has 1,213 nodes and 6,212 GPUs; seed 42's workload lands just under 130%."""
    nodes = read_nodes(SHARED_TRACE / NODE_LIST)
    pods = read_pods(SHARED_TRACE / "openb_pod_list_default.csv")
    capacity = 1000 * sum(n.gpus for n in nodes)
    demand = sum(p.demand_milli for _, p in workload(pods, 42, capacity))
    assert (len(nodes), capacity, len(pods), 1.298 * capacity < demand <= 1.3 * capacity) == (
        1213,
        6_212_000,
        8152,
        True,
    )


def test_jobs_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--jobs 0 exits 2 with one line on stderr."""
    folder = write_trace(tmp_path, [pod("p0", 1, 500)])
    code = simulate_command(folder, pods=["openb_pod_list_tiny.csv"], policies=None, seeds="1", output="json", jobs=0)
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", "gputask simulate: --jobs must be 1 or more, not 0\n")
