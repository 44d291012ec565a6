"""gputask: GPU tasks admitted through Kueue-style queues and packed onto specific GPUs.

Operate a cluster (run, agent), look at one (get, explain, top), try things out (demo, scenario, simulate).
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Annotated

import typer

from gputask import __version__
from gputask.core.placement import DEFAULT_POLICY

BIND_ERRORS = (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)
"""OSError numbers of a port that cannot be listened on: a one-line error, exit 2."""

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
scenario_app = typer.Typer(no_args_is_help=True, help="Deterministic what-if runs of the scheduler.")
app.add_typer(scenario_app, name="scenario")
get_app = typer.Typer(no_args_is_help=True, help="List GPUTasks, queues and nodes as the operator sees them.")
app.add_typer(get_app, name="get")
top_app = typer.Typer(no_args_is_help=True, help="Per-GPU use: memory reserved, used by others, free; tasks on it.")
app.add_typer(top_app, name="top")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gputask {__version__}")
        raise typer.Exit(0)


MetricsAddress = Annotated[
    str, typer.Option("--metrics-bind-address", help="IP address the metrics endpoint listens on (0.0.0.0: every "
                      "interface; 127.0.0.1 behind a proxy sidecar).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")]

VersionOption = Annotated[
    bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
]


@app.callback()
def _root(version: VersionOption = False) -> None:
    """gputask: GPU tasks admitted through Kueue-style queues and packed onto specific GPUs."""


Kubeconfig = Annotated[
    str | None, typer.Option("--kubeconfig", help="Kubeconfig file; default $KUBECONFIG, then ~/.kube/config.")
]
Context = Annotated[str | None, typer.Option("--context", help="Kubeconfig context; default its current-context.")]
Namespace = Annotated[
    str | None, typer.Option("--namespace", "-n", help="Namespace; default the context's namespace, else default.")
]
AllNamespaces = Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")]
Output = Annotated[str, typer.Option("--output", "-o", help="table or json")]
OperatorConfig = Annotated[
    Path | None, typer.Option("--config", help="The operator's configuration (policy), to judge as it does.")
]


def _live(kubeconfig: str | None, context: str | None, config: Path | None, output: str):  # type: ignore[no-untyped-def]
    """Load the cluster for a live command: (objects, view, now); one line and exit 2 on failure."""
    from gputask.config import ConfigError, load_config
    from gputask.live import LiveError, load, refused_summary

    if output not in ("table", "json"):
        typer.echo(f"gputask: --output {output!r}: choose table or json", err=True)
        raise typer.Exit(2)
    try:
        settings = load_config(config)
        loaded = load(kubeconfig, context, settings)
    except (LiveError, ConfigError) as exc:
        typer.echo(f"gputask: {exc}", err=True)
        raise typer.Exit(2) from None
    if (refused := refused_summary(loaded[1])) is not None:
        typer.echo(f"gputask: {refused}", err=True)
    return loaded


def _namespace(kubeconfig: str | None, context: str | None, namespace: str | None, all_namespaces: bool) -> str | None:
    from gputask.live import LiveError, default_namespace

    if all_namespaces:
        return None
    if namespace:
        return namespace
    try:
        return default_namespace(kubeconfig, context)
    except LiveError as exc:
        typer.echo(f"gputask: {exc}", err=True)
        raise typer.Exit(2) from None


def _emit(rows: list[dict[str, object]], columns: tuple[str, ...], output: str,
          headers: dict[str, str] | None = None, empty: str = "No resources found.") -> None:
    import json

    from gputask.live import console_for, render_table

    if output == "json":
        typer.echo(json.dumps(rows, indent=1))
        return
    render_table(console_for(), rows, columns, headers, empty=empty)


@get_app.command("tasks")
def get_tasks(
    namespace: Namespace = None,
    all_namespaces: AllNamespaces = False,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    output: Output = "table",
    config: OperatorConfig = None,
) -> None:
    """GPUTasks: queue, phase, position in its queue (0 = head), node, GPUs, memory per GPU, reason, age."""
    from gputask.live import TASK_COLUMNS, TASK_HEADERS, task_rows

    ns = _namespace(kubeconfig, context, namespace, all_namespaces)
    objects, view, now = _live(kubeconfig, context, config, output)
    rows = task_rows(objects, view, ns, now)
    columns = ("name", *TASK_COLUMNS) if ns is not None else ("namespace", "name", *TASK_COLUMNS)
    _emit(rows, columns, output, TASK_HEADERS, empty=f"No GPUTasks found in {ns} namespace." if ns else
          "No GPUTasks found.")


@get_app.command("queues")
def get_queues(
    kubeconfig: Kubeconfig = None, context: Context = None, output: Output = "table", config: OperatorConfig = None
) -> None:
    """GPUClusterQueues: cohort, pending and admitted tasks, usage over nominal quota per resource."""
    from gputask.live import queue_rows

    _, view, _ = _live(kubeconfig, context, config, output)
    _emit(queue_rows(view), ("name", "cohort", "pending", "admitted", "active", "usage"), output)


@get_app.command("nodes")
def get_nodes(
    kubeconfig: Kubeconfig = None, context: Context = None, output: Output = "table", config: OperatorConfig = None
) -> None:
    """Nodes with GPUs: schedulable, GPUs, GPU memory reserved, used by others and free (MiB), tasks."""
    from gputask.live import node_rows

    _, view, _ = _live(kubeconfig, context, config, output)
    columns = ("node", "schedulable", "gpus", "reserved_mib", "foreign_mib", "free_mib", "total_mib", "tasks")
    _emit(node_rows(view), columns, output)


@top_app.command("gpus")
def top_gpus(
    kubeconfig: Kubeconfig = None, context: Context = None, output: Output = "table", config: OperatorConfig = None
) -> None:
    """Per GPU: product, MiB reserved by gputask, used by others (foreign), free and total; the tasks on it."""
    from gputask.live import gpu_rows

    _, view, _ = _live(kubeconfig, context, config, output)
    columns = ("node", "gpu", "product", "reserved_mib", "foreign_mib", "free_mib", "total_mib", "tasks")
    _emit(gpu_rows(view), columns, output, {"tasks": "TASKS (MIB)"})


@app.command()
def explain(
    task: Annotated[str, typer.Argument(help="GPUTask name (or namespace/name).")],
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    output: Output = "table",
    config: OperatorConfig = None,
) -> None:
    """Why a GPUTask waits: its position, its quota, every node's verdict, preemption, the smallest change.

    Exit code 0, 1 when there is no such GPUTask, 2 on bad input or an unreachable cluster.
    """
    from gputask.live import console_for, diagnosis_json, explain_task, render_diagnosis

    if "/" in task:
        namespace, _, task = task.partition("/")
    ns = _namespace(kubeconfig, context, namespace, False) or "default"
    objects, view, _ = _live(kubeconfig, context, config, output)
    obj = next((o for o in objects.get("tasks", []) if (o.get("metadata") or {}).get("name") == task
                and ((o.get("metadata") or {}).get("namespace") or "default") == ns), None)
    if obj is None:
        typer.echo(f'gputask: GPUTask "{task}" not found in namespace {ns}', err=True)
        raise typer.Exit(1)
    status = obj.get("status") or {}
    found = explain_task(view, ns, task, status)
    if output == "json":
        typer.echo(diagnosis_json(found, status))
        return
    render_diagnosis(console_for(), found, status)


@scenario_app.command("run")
def scenario_run(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Scenario YAML (DESIGN.md section 6).")],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
    policy: Annotated[
        str, typer.Option(help="Placement policy, or 'fifo' for the strict FIFO baseline.")
    ] = DEFAULT_POLICY,
    plot: Annotated[Path | None, typer.Option(help="Write a per-GPU timeline PNG here (matplotlib).")] = None,
    config: Annotated[Path | None, typer.Option(help="Operator configuration (timing knobs).")] = None,
) -> None:
    """Run a scenario on a simulated clock and print what the scheduler decided.

    Exit code 0 when no invariant broke, 1 when the run found violations, 2 on bad input.
    """
    from gputask.sim.scenario import cli_run

    raise typer.Exit(cli_run(file, output=output, policy=policy, plot=plot, config=config))


@scenario_app.command("chaos")
def scenario_chaos(
    nodes: Annotated[int, typer.Option(min=1, help="GPU nodes.")] = 300,
    tasks: Annotated[int, typer.Option(min=1, help="Tasks submitted.")] = 3000,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same scenario).")] = 1,
    load: Annotated[
        float, typer.Option(min=0.1, help="Arrival rate relative to the base mix (3: queues contend and preempt).")
    ] = 3.0,
    write: Annotated[Path | None, typer.Option(help="Also write the generated scenario YAML here.")] = None,
    quiet: Quiet = False,
) -> None:
    """Generate and run a randomized scenario with failures, restarts and deletions; exit 1 on any violation.

    Progress (simulated seconds) goes to stderr; the JSON summary to stdout.
    """
    import json

    import yaml

    from gputask.progress import Progress
    from gputask.sim.chaos import generate, summarize
    from gputask.sim.scenario import run_scenario

    doc = generate(seed=seed, nodes=nodes, tasks=tasks, load=load)
    if write is not None:
        write.write_text(yaml.safe_dump(doc, sort_keys=False))
    until = float(doc.get("until") or 0.0)
    with Progress("chaos", until, unit="simulated s", quiet=quiet) as progress:
        ran = run_scenario(doc, progress=lambda now, _until: progress.update(now))
        progress.update(until)  # the run played everything up to until
    summary = summarize(ran, tasks)
    typer.echo(json.dumps(summary, indent=1))
    raise typer.Exit(0 if not summary["violations"] and summary["accountedFor"] == tasks else 1)


def _defrag_replay(trace_dir: Path, pods_file: str, policy: str, speedup: float, load: int, config: Path) -> int:
    """``simulate --timed --defrag-config FILE``: defragmentation off and on, as JSON
    (:mod:`gputask.sim.defrag_replay`)."""
    import json

    from gputask.config import ConfigError, load_config
    from gputask.sim.defrag_replay import compare

    try:
        settings = load_config(config).defragmentation.core()
        doc = compare(trace_dir, pods_file, policy=policy, speedup=speedup, load=load, config=settings)
    except (ConfigError, ValueError) as exc:
        typer.echo(f"gputask simulate: {exc}", err=True)
        return 2
    typer.echo(json.dumps(doc, indent=2))
    return 0


@app.command()
def simulate(
    trace_dir: Annotated[Path, typer.Option(help="Folder of the Alibaba GPU trace v2023 CSVs (not shipped).")],
    pods: Annotated[
        list[str] | None, typer.Option(help="Pod list file name(s); default openb_pod_list_default.csv")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="Policies to compare (repeatable; 'all' = every one). Default: bestfit, firstfit, random, "
            "bestfit-atc23, fgd and the default policy. --timed takes one."
        ),
    ] = None,
    seeds: Annotated[str, typer.Option(help="Seed range, e.g. 42-51 (not used by --timed).")] = "42-51",
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
    jobs: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    tie_break: Annotated[
        str,
        typer.Option(
            help="Equal scores go to a random node priority per seed ('random', as the FGD simulator and the "
            "README's figures) or to the smallest node name ('name')."
        ),
    ] = "random",
    timed: Annotated[
        bool, typer.Option(help="Time-based replay (arrivals and departures, QoS queues) against strict FIFO.")
    ] = False,
    speedup: Annotated[float, typer.Option(help="--timed: divide arrival times by this.")] = 2000.0,
    load: Annotated[int, typer.Option(min=1, help="--timed: copies of every pod (raises demand).")] = 2,
    defrag_config: Annotated[
        Path | None,
        typer.Option(help="--timed: compare defragmentation off and on, as this operator configuration's "
                     "defragmentation section sets it (mode Enabled), instead of gputask against FIFO."),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Replay the Alibaba GPU trace (FGD protocol) through the core and compare policies.

    Exit code 0, 1 when a policy refused a pod that fitted somewhere, 2 on bad input.
    """
    if timed:
        from gputask.sim.timed import cli_timed

        if policy and len(policy) > 1:
            typer.echo(
                f"gputask simulate: --timed compares one policy with strict FIFO; got {', '.join(policy)}", err=True
            )
            raise typer.Exit(2)
        chosen = (policy or [DEFAULT_POLICY])[0]
        pods_file = (pods or ["openb_pod_list_default.csv"])[0]
        if defrag_config is not None:
            raise typer.Exit(_defrag_replay(trace_dir, pods_file, chosen, speedup, load, defrag_config))
        raise typer.Exit(
            cli_timed(
                trace_dir, pods_file=pods_file, policy=chosen, speedup=speedup, load=load, output=output, quiet=quiet
            )
        )
    from gputask.sim.report import simulate_command

    raise typer.Exit(
        simulate_command(
            trace_dir, pods=pods, policies=policy, seeds=seeds, output=output, jobs=jobs, tie_break=tie_break,
            quiet=quiet,
        )
    )


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="Keep the emulator and operator running for kubectl.")] = False,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Emulator port on 127.0.0.1 (0 = any free port).")] = 0,
    workdir: Annotated[Path, typer.Option(help="Where to write the kubeconfig.")] = Path(".demo"),
) -> None:
    """Run the real operator against the embedded API emulator and print the pinned Jobs."""
    import asyncio
    import logging

    from gputask.demo import run_demo

    logging.getLogger("kopf._core.reactor.observation").setLevel(logging.ERROR)  # no Kueue CRDs here: fine
    try:
        code = asyncio.run(run_demo(keep=keep, port=port, workdir=workdir))
    except KeyboardInterrupt:
        code = 0
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "kmock":
            raise
        typer.echo("gputask demo: the API emulator needs the demo extra: pip install 'gputask[demo]'", err=True)
        code = 2
    except OSError as exc:  # e.g. the port is taken by a demo still running
        typer.echo(f"gputask demo: {exc}", err=True)
        code = 2
    raise typer.Exit(code)


@app.command()
def run(
    config: Annotated[Path | None, typer.Option(help="Configuration file (YAML).")] = None,
    kubeconfig: Annotated[str | None, typer.Option(help="Kubeconfig; default in-cluster, then ~/.kube/config.")] = None,
    peering: Annotated[
        str | None, typer.Option(help="kopf peering name (leaderElection in the config is preferred).")
    ] = None,
    liveness: Annotated[str | None, typer.Option(help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Serve Prometheus metrics on this port.")
    ] = None,
    metrics_bind_address: MetricsAddress = "0.0.0.0",
    verbose: Annotated[bool, typer.Option("--verbose", help="Also log kopf's line per handled event (INFO).")] = False,
    webhook_listen: Annotated[str | None, typer.Option(
        help="Serve the admission webhook for Jobs labelled gputask.io/queue-name on HOST:PORT (self-signed "
        "certificate) and register it by URL; default: no webhook (labelled Jobs are suspended when seen).")] = None,
    webhook_host: Annotated[str | None, typer.Option(
        help="The host name or address the API server calls the webhook at (default: the --webhook-listen host).")
    ] = None,
    webhook_service: Annotated[str | None, typer.Option(
        help="Register the webhook by this Service (NAMESPACE/NAME, on the --webhook-listen port) instead of a URL: "
        "in a cluster, with a Service selecting the operator pods.")] = None,
    webhook_cert_dir: Annotated[Path | None, typer.Option(
        help="Serve tls.crt and tls.key of this directory (a mounted kubernetes.io/tls Secret; ca.crt, when there, "
        "is the caBundle) instead of a self-signed certificate: the same certificate for every replica.")] = None,
) -> None:
    """Run the operator against a cluster."""
    import asyncio
    import logging

    from gputask.config import ConfigError, load_config
    from gputask.k8s.main import build_operator, run_operator

    try:
        settings = load_config(config)
    except ConfigError as exc:
        typer.echo(f"gputask: {exc}", err=True)
        raise typer.Exit(2) from None
    if webhook_listen is not None:
        from gputask.k8s.webhook import parse_listen, parse_service

        try:
            parse_listen(webhook_listen)
            if webhook_service is not None:
                parse_service(webhook_service)
        except ValueError as exc:
            typer.echo(f"gputask run: {exc}", err=True)
            raise typer.Exit(2) from None
    if liveness is not None and not liveness.startswith(("http://", "https://")):
        typer.echo(f"gputask run: --liveness {liveness!r}: give a URL such as http://0.0.0.0:8080/healthz", err=True)
        raise typer.Exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        operator = build_operator(settings, kubeconfig=kubeconfig)
    except Exception as exc:  # kubernetes.config raises several types for a missing or broken kubeconfig
        typer.echo(f"gputask run: cannot load the Kubernetes configuration: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        asyncio.run(run_operator(operator, peering=peering, liveness_endpoint=liveness, metrics_port=metrics_port,
                                 metrics_address=metrics_bind_address, verbose=verbose,
                                 webhook_listen=webhook_listen, webhook_host=webhook_host,
                                 webhook_service=webhook_service, webhook_cert_dir=webhook_cert_dir))
    except OSError as exc:
        if exc.errno not in BIND_ERRORS:
            raise
        typer.echo(f"gputask run: cannot listen: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def agent(
    node_name: Annotated[str | None, typer.Option(help="This node's name; default $NODE_NAME.")] = None,
    fake_gpus: Annotated[str | None, typer.Option(help="Fake GPUs instead of NVML, e.g. 2xNVIDIA-A10:24Gi.")] = None,
    fake_links: Annotated[str | None, typer.Option(
        help="With --fake-gpus: how pairs of them are connected, e.g. 0-1:NVLink:12,0-2:PCIeSwitch.")] = None,
    interval: Annotated[str, typer.Option(help="Probe period (e.g. 10s).")] = "10s",
    heartbeat: Annotated[str, typer.Option(help="Status patch period when nothing changed.")] = "30s",
    metrics_port: Annotated[int, typer.Option(help="Port of /metrics and /healthz.")] = 9401,
    metrics_bind_address: MetricsAddress = "0.0.0.0",
    kubeconfig: Annotated[str | None, typer.Option(help="Kubeconfig; default in-cluster, then ~/.kube/config.")] = None,
    pod_resources_socket: Annotated[str | None, typer.Option(
        help="The kubelet's PodResources socket, to report which GPUs device-plugin pods hold; empty: do not read it. "
        "Default /var/lib/kubelet/pod-resources/kubelet.sock, none with --fake-gpus (fake GPUs are no kubelet's).",
        show_default=False,
    )] = None,
    host_pid: Annotated[bool, typer.Option(
        "--host-pid",
        help="The agent shares the host's PID namespace: split GPU memory by pod (the NVML processes' cgroups).",
    )] = False,
) -> None:
    """Run the node agent: report this node's GPUs (NVML) into its GPUNode.

    Exit code 2 on bad input or when NVML cannot initialise (no NVIDIA driver).
    """
    from gputask.agent.main import cli_agent
    from gputask.agent.podresources import SOCKET as KUBELET_SOCKET

    raise typer.Exit(
        cli_agent(
            node_name=node_name,
            fake_gpus=fake_gpus,
            interval=interval,
            heartbeat=heartbeat,
            metrics_port=metrics_port,
            kubeconfig=kubeconfig,
            metrics_address=metrics_bind_address,
            pod_resources_socket=(
                pod_resources_socket if pod_resources_socket is not None else "" if fake_gpus else KUBELET_SOCKET
            ),
            host_pid=host_pid,
            fake_links=fake_links,
        )
    )


def main() -> None:
    """Console-script entry point: ``--version`` after any command prints the version too."""
    if "--version" in sys.argv[1:] and "--" not in sys.argv[1 : sys.argv.index("--version")]:
        print(f"gputask {__version__}")
        sys.exit(0)
    app()


if __name__ == "__main__":
    main()
