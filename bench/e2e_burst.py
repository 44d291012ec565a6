"""A burst of GPUTasks against the real operator, each component in its own process: does the operator keep
pace with what the API server accepts?

Usage::

    python bench/e2e_burst.py [--tasks 2000] [--nodes 100] [--clients 8] [--out bench/results/e2e_burst.json]
                              [--pods] [--churn N]
    python bench/e2e_burst.py --real [--tasks 2000] [--nodes 10] [--job-syncs 50] [--workdir DIR]

Three processes, as in a cluster: the API emulator (``gputask.testing.EmulatorServer``, serving over
loopback HTTP with its request records bounded, so each request costs the same however many came before),
the operator (``gputask run --kubeconfig ...``, its own interpreter) and this driver. The driver seeds
``--nodes`` GPU nodes of 8 x 80Gi and one queue with room for every task, waits until the operator has
written the queue's status (it leads), then creates ``--tasks`` GPUTasks (``gpuFraction: 0.25``, so GPUs
suffice) from ``--clients`` threads as fast as the API answers, while a watch on Jobs records when each
task's Job appears. With ``--pods`` the driver also stands in for the Job controller and the kubelet (as
``gputask demo`` does, :func:`gputask.demo.demo_pod`): each Job seen gets its pod, bound to the Job's node and then
Running, from 4 threads; ``--churn N`` adds N lifecycles of unrelated pods during the burst (each created bound to a
node, Running, Succeeded, deleted; 2 threads), the cluster's other work the operator also watches. With either, the
CPU figures are read once the pods are all written and the operator has gone quiet (under a tenth of a core for
2 s), so they include its work for every pod event.

With ``--real`` the API is a real control plane (:class:`gputask.testing.controlplane.ControlPlane`: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler v1.28.7 and ``--nodes`` kubemark hollow nodes, each holding
enough pods), gputask installed as the chart installs it (CRDs, the chart's RBAC; the operator runs as its
ServiceAccount) and a ``gputask agent --fake-gpus`` per node reporting enough A100s for every quarter-GPU task (5%
spare). The Job controller makes each Job's pod, kube-scheduler binds it to the pinned node and the hollow kubelet
runs it; the driver waits until every task's pod is Running and adds create-to-Running p50/p99, the API server's
CPU (seconds, milliseconds per task, share of a core over the window) and every component's CPU seconds. The
controller-manager and scheduler get a client QPS of 100 (burst 200) and the Job controller ``--job-syncs``
workers (defaults 20, 50 and 5: below a 2,000-pod burst).

Reports: the API's accept rate (creates / time from the first create sent to the last answered), the
operator's Jobs/s (Jobs / time from the first create sent to the last Job seen), their ratio, the
admission latency (a task's create answered to its Job seen) p50 and p99, and the CPU seconds each process
used during the burst; for the operator also its CPU milliseconds per task (user and system seconds) and
context switches per task, the share of a core it uses once nothing changes any more
(``operatorIdleCpuShare``, over 5 s: its loop with the backlog waiting), and the machine's 1-minute load
average before and after (other work on the machine moves every rate). Everything shares this machine's
cores, so CPU figures say who spends what.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def percentile(values: list[float], pct: float) -> float:
    """The ``pct`` percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (from /proc; children not included)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` so far (from /proc; children not included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def context_switches(pid: int) -> int:
    """Voluntary plus involuntary context switches of every thread of process ``pid`` so far."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # the thread ended meanwhile
            continue
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches:" in line)
    return total


def serve_emulator(port: int, kubeconfig: Path) -> None:
    """Run the emulator with the CRDs until SIGTERM (the ``--serve`` mode of this script)."""
    from gputask.testing import EmulatorServer

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with EmulatorServer(port=port, keep_alive=True) as server:  # as kube-apiserver (HTTP keep-alive)
            server.install_crds_from(REPO / "crds")
            server.write_kubeconfig(kubeconfig)
            print("ready", flush=True)
            await stop.wait()
            counts: dict[str, int] = {}
            for answer in server.emulator.answers:  # the writes (bounded deque): what the operator sent, by kind
                parts = answer.path.split("?")[0].strip("/").split("/")
                kind = "/".join(p for p in parts[-3:] if p not in ("default", "namespaces"))
                kind = re.sub(r"/(t[0-9]{5}(-[0-9]+)?(-pod)?|other-[0-9]{6})", "/*", kind)  # tasks, Jobs, pods
                key = f"{answer.method} {kind} {answer.status}"
                counts[key] = counts.get(key, 0) + 1
            Path(str(kubeconfig) + ".writes.json").write_text(json.dumps(counts, indent=1, sort_keys=True))

    asyncio.run(main())


def gpunode(name: str, gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Node and its GPUNode (status as the agent writes it, heartbeat now)."""
    from gputask.k8s.writer import now_rfc3339

    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}
    status = {"gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "product": "NVIDIA-A100-SXM4-80GB", "memory": "80Gi",
                        "memoryUsed": "0", "healthy": True} for i in range(gpus)], "heartbeatTime": now_rfc3339()}
    return node, status


def backlog(api: Any, count: int, clients: int) -> float:
    """``count`` waiting tasks in GPUClusterQueue ``backlog`` (no quota: they wait Inadmissible for good), created
    from ``clients`` threads; returns the seconds it took. What a restart has to rebuild besides the admitted."""
    from kubernetes import client as k8s

    if not count:
        return 0.0
    custom = k8s.CustomObjectsApi(api)
    custom.create_cluster_custom_object("gputask.io", "v1alpha1", "gpuclusterqueues", {
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPUClusterQueue", "metadata": {"name": "backlog"},
        "spec": {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 0}]}})
    custom.create_namespaced_custom_object("gputask.io", "v1alpha1", "default", "gpulocalqueues", {
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPULocalQueue", "metadata": {"name": "backlog"},
        "spec": {"clusterQueue": "backlog"}})
    def create(i: int) -> None:
        body = task_body(f"b{i:06d}")
        body["spec"]["queueName"] = "backlog"
        custom.create_namespaced_custom_object("gputask.io", "v1alpha1", "default", "gputasks", body)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(create, range(count)))
    return time.monotonic() - started


def seed(api: Any, nodes: int, tasks: int) -> None:
    """Nodes, GPUNodes, a GPUClusterQueue with room for every task and its GPULocalQueue."""
    from kubernetes import client as k8s

    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    for n in range(nodes):
        node, status = gpunode(f"node-{n:04d}", 8)
        core.create_node(node)
        core.patch_node_status(node["metadata"]["name"], {"status": {"conditions": [{"type": "Ready",
                                                                                     "status": "True"}]}})
        custom.create_cluster_custom_object("gputask.io", "v1alpha1", "gpunodes", {
            "apiVersion": "gputask.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": node["metadata"]["name"]}})
        custom.patch_cluster_custom_object_status("gputask.io", "v1alpha1", "gpunodes", node["metadata"]["name"],
                                                  {"status": status})
    seed_queue(api, tasks)


def seed_queue(api: Any, tasks: int) -> None:
    """GPUClusterQueue ``burst`` with a nominal quota of ``tasks`` GPUs, and GPULocalQueue default/burst."""
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(api)
    custom.create_cluster_custom_object("gputask.io", "v1alpha1", "gpuclusterqueues", {
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPUClusterQueue", "metadata": {"name": "burst"},
        "spec": {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": tasks}]}})
    custom.create_namespaced_custom_object("gputask.io", "v1alpha1", "default", "gpulocalqueues", {
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPULocalQueue", "metadata": {"name": "burst"},
        "spec": {"clusterQueue": "burst"}})


def heartbeats(api: Any, nodes: int, stop: threading.Event, every_s: float = 30.0) -> None:
    """Refresh every GPUNode's heartbeat, as the agents would, until ``stop`` (a long run outlives
    heartbeatStaleAfter, and stale nodes take no work)."""
    from kubernetes import client as k8s

    from gputask.k8s.writer import now_rfc3339

    custom = k8s.CustomObjectsApi(api)
    while not stop.wait(every_s):
        for n in range(nodes):
            custom.patch_cluster_custom_object_status("gputask.io", "v1alpha1", "gpunodes", f"node-{n:04d}",
                                                      {"status": {"heartbeatTime": now_rfc3339()}})


def wait_leading(api: Any, timeout_s: float = 120.0) -> None:
    """Until the operator has written the queue's status (it has rebuilt and leads)."""
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queue = custom.get_cluster_custom_object("gputask.io", "v1alpha1", "gpuclusterqueues", "burst")
        if (queue.get("status") or {}).get("conditions"):
            return
        time.sleep(0.2)
    raise SystemExit("e2e_burst: the operator wrote no queue status within 120 s")


def task_body(name: str) -> dict[str, Any]:
    """A quarter-GPU GPUTask in the burst queue."""
    return {"apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask", "metadata": {"name": name},
            "spec": {"queueName": "burst", "gpus": 1, "gpuFraction": "0.25",
                     "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}}}


def make_pods(kubeconfig: Path, jobs: queue.Queue[dict[str, Any] | None]) -> int:
    """Until a None comes: for each Job from ``jobs``, its pod (bound to the Job's node, as the Job controller and
    the scheduler would) and then its status Running (as the kubelet would); returns the pods made."""
    from kubernetes import client as k8s

    from gputask.demo import demo_pod
    from gputask.k8s.client import load_api_client

    core = k8s.CoreV1Api(load_api_client(str(kubeconfig), user_agent="e2e-burst-pods", pool_size=2))
    running = {"status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                                             {"type": "Ready", "status": "True"}]}}
    made = 0
    while (job := jobs.get()) is not None:
        name = f"{job['metadata']['name']}-pod"
        core.create_namespaced_pod("default", demo_pod(job, name), _preload_content=False)
        core.patch_namespaced_pod_status(name, "default", running, _preload_content=False)
        made += 1
    return made


def churn_pods(kubeconfig: Path, nodes: int, names: range) -> None:
    """One lifecycle per name of a pod gputask did not create: created bound to a node (1 CPU, no GPU), Running,
    Succeeded, deleted."""
    from kubernetes import client as k8s

    from gputask.k8s.client import load_api_client

    core = k8s.CoreV1Api(load_api_client(str(kubeconfig), user_agent="e2e-burst-churn", pool_size=2))
    for i in names:
        name = f"other-{i:06d}"
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "other"}},
                "spec": {"nodeName": f"node-{i % nodes:04d}", "containers": [
                    {"name": "main", "image": "busybox:1.36", "resources": {"requests": {"cpu": "1"}}}]}}
        core.create_namespaced_pod("default", body, _preload_content=False)
        for phase in ("Running", "Succeeded"):
            core.patch_namespaced_pod_status(name, "default", {"status": {"phase": phase}}, _preload_content=False)
        core.delete_namespaced_pod(name, "default", _preload_content=False)


def watch_jobs(api: Any, seen: dict[str, float], stop: threading.Event,
               made: queue.Queue[dict[str, Any] | None] | None = None) -> None:
    """Record when each task's Job is first seen (a watch on Jobs in default), until ``stop``; with ``made``, each
    Job seen the first time is put there (for its pod). Events are read as plain JSON (no model classes): the driver
    shares the machine with what it measures."""
    from kubernetes import client as k8s

    def note(job: dict[str, Any]) -> None:
        name = ((job.get("metadata") or {}).get("labels") or {}).get("gputask.io/task", "")
        if name and name not in seen:
            seen[name] = time.monotonic()
            if made is not None:
                made.put(job)

    watch_objects(k8s.BatchV1Api(api).list_namespaced_job, note, stop)


def watch_running(api: Any, running: dict[str, float], stop: threading.Event) -> None:
    """Record when each task's pod is first seen Running (a watch on pods in default with the
    ``gputask.io/task`` label: the pods the Job controller made, bound by kube-scheduler, run by a kubelet),
    until ``stop``."""
    from kubernetes import client as k8s

    def note(pod: dict[str, Any]) -> None:
        name = ((pod.get("metadata") or {}).get("labels") or {}).get("gputask.io/task", "")
        if name and name not in running and (pod.get("status") or {}).get("phase") == "Running":
            running[name] = time.monotonic()

    watch_objects(k8s.CoreV1Api(api).list_namespaced_pod, note, stop, label_selector="gputask.io/task",
                  every_event=True)


def watch_objects(lister: Any, note: Any, stop: threading.Event, *, every_event: bool = False,
                  **selectors: str) -> None:
    """List and watch ``lister``'s objects in default (``lister``: a ``list_namespaced_*`` method; ``selectors``
    its label/field selectors) until ``stop``, calling ``note(obj)`` for each object listed and each ADDED (with
    ``every_event``, each ADDED or MODIFIED); lists again after a 410. Events are read as plain JSON."""
    from kubernetes.watch.watch import iter_resp_lines

    version = ""
    while not stop.is_set():
        if not version:  # first, or after 410 (the watch fell behind the server's event log): list again
            listed = json.loads(lister("default", _preload_content=False, **selectors).data)
            version = listed["metadata"]["resourceVersion"]
            for obj in listed.get("items") or []:
                note(obj)
        response = lister("default", watch=True, resource_version=version, timeout_seconds=2,
                          _preload_content=False, _request_timeout=5, **selectors)
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line) if line else {}
                if event.get("type") == "ERROR":
                    version = ""
                    break
                if event.get("object"):
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] == "ADDED" or (every_event and event["type"] == "MODIFIED"):
                        note(event["object"])
                if stop.is_set():
                    break
        finally:
            response.release_conn()


def burst(kubeconfig: Path, tasks: int, clients: int, timeout_s: float, *, pods: bool = False, churn: int = 0,
          nodes: int = 1, until_running: bool = False) -> dict[str, Any]:
    """Create the tasks from ``clients`` threads (with ``pods``, each Job's pod; with ``churn``, that many unrelated
    pod lifecycles besides); return timings once every Job is seen and every pod written. With ``until_running``
    (a real cluster: the Job controller makes the pods, kube-scheduler binds them, kubelets run them) also wait
    until every task's pod is Running, and add create-to-Running figures."""
    from kubernetes import client as k8s

    from gputask.k8s.client import load_api_client

    apis = [load_api_client(str(kubeconfig), user_agent="e2e-burst", pool_size=2) for _ in range(clients)]
    answered: dict[str, float] = {}
    seen: dict[str, float] = {}
    stop = threading.Event()
    jobs: queue.Queue[dict[str, Any] | None] | None = queue.Queue() if pods else None
    watcher = threading.Thread(target=watch_jobs, args=(load_api_client(str(kubeconfig)), seen, stop, jobs),
                               daemon=True)
    watcher.start()
    running: dict[str, float] = {}
    if until_running:
        threading.Thread(target=watch_running, args=(load_api_client(str(kubeconfig)), running, stop),
                         daemon=True).start()
    helpers = ThreadPoolExecutor(max_workers=6)
    makers = [helpers.submit(make_pods, kubeconfig, jobs) for _ in range(4)] if jobs is not None else []
    churners = [helpers.submit(churn_pods, kubeconfig, nodes, range(k, churn, 2)) for k in range(2)] if churn else []
    time.sleep(0.5)

    def create(i: int) -> None:
        name = f"t{i:05d}"
        custom = k8s.CustomObjectsApi(apis[i % clients])
        custom.create_namespaced_custom_object("gputask.io", "v1alpha1", "default", "gputasks", task_body(name))
        answered[name] = time.monotonic()

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(create, range(tasks)))
    accepted = time.monotonic()
    deadline = accepted + timeout_s
    while (len(seen) < tasks or (until_running and len(running) < tasks)) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for _ in makers:
        jobs.put(None)  # type: ignore[union-attr]
    pods_made = sum(m.result() for m in makers)
    for churner in churners:
        churner.result()
    helpers.shutdown()
    last = max(seen.values(), default=time.monotonic())
    latencies = [seen[n] - answered[n] for n in seen if n in answered]
    accept_rate = tasks / (accepted - started)
    jobs_rate = len(seen) / (last - started) if seen else 0.0
    return {
        "acceptedPerSecond": round(accept_rate, 1),
        "jobsSeen": len(seen),
        "jobsPerSecond": round(jobs_rate, 1),
        "ratio": round(jobs_rate / accept_rate, 3),
        "latencyP50S": round(percentile(latencies, 50), 3) if latencies else None,
        "latencyP99S": round(percentile(latencies, 99), 3) if latencies else None,
        "burstSeconds": round(last - started, 2),
        "createSeconds": round(accepted - started, 2),
        **({"podsMade": pods_made} if pods else {}), **({"churnedPods": churn} if churn else {}),
        **(running_figures(running, answered, started) if until_running else {}),
    }


def running_figures(running: dict[str, float], answered: dict[str, float], started: float) -> dict[str, Any]:
    """Pods seen Running, create-answered-to-Running p50 and p99 (s), and seconds from the first create sent to
    the last pod Running."""
    latencies = [running[n] - answered[n] for n in running if n in answered]
    return {
        "podsRunning": len(running),
        "runningP50S": round(percentile(latencies, 50), 3) if latencies else None,
        "runningP99S": round(percentile(latencies, 99), 3) if latencies else None,
        "lastRunningSeconds": round(max(running.values()) - started, 2) if running else None,
    }


def settle(pid: int, idle_share: float = 0.1, quiet_s: float = 3.0, timeout_s: float = 900.0) -> None:
    """Until process ``pid`` has used under ``idle_share`` of a core for ``quiet_s`` seconds: for the emulator,
    no more requests to serve (the backlog's statuses written, as in a cluster that ran a while)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(quiet_s)
        if cpu_seconds(pid) - before < idle_share * quiet_s:
            return


def restart_figures(api: Any, pid: int, started: float, count: int) -> dict[str, Any]:
    """After a restart with ``count`` admitted tasks in the cluster: seconds from the new operator's start until a
    task created then gets its Job, and the operator's resident memory (MiB) at that point."""
    from kubernetes import client as k8s

    custom, batch = k8s.CustomObjectsApi(api), k8s.BatchV1Api(api)
    custom.create_namespaced_custom_object("gputask.io", "v1alpha1", "default", "gputasks", task_body("after"))
    deadline = started + 600
    while time.monotonic() < deadline:
        if batch.list_namespaced_job("default", label_selector="gputask.io/task=after").items:
            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
            return {"tasksInCluster": count + 1, "secondsToNewJob": round(time.monotonic() - started, 2),
                    "operatorRssMiB": round(rss)}
        time.sleep(0.25)
    return {"tasksInCluster": count + 1, "secondsToNewJob": None}


REAL_NAMESPACE = "gputask-system"  # the chart's release namespace on the real control plane
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# Client QPS of kube-controller-manager (the Job controller makes every pod) and kube-scheduler (binds them):
# their defaults (20 and 50 per second) are below a 2,000-pod burst; Kubernetes' kubemark scalability runs raise them.
REAL_QPS = ["--kube-api-qps=100", "--kube-api-burst=200"]
# The Job controller's workers (default 5): at 5, under load, it made about 6 pods/s and tasks waited past the
# operator's podStartTimeout (120 s) for their pod; --job-syncs sets it.
JOB_SYNCS = 50
QUARTERS = 4  # tasks per GPU (gpuFraction 0.25)


def _die_with_parent() -> None:
    """In a child before exec: SIGKILL when the driver dies (Linux), so no operator or agent outlives a run."""
    import contextlib
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` logging into ``log``, in its own session, killed when the driver dies."""
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process, SIGKILL after 10 s."""
    for proc in processes:
        proc.terminate()
    for proc in processes:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def gpus_per_node(tasks: int, nodes: int) -> int:
    """Quarter-GPU tasks need ``tasks / 4`` GPUs; 5% more, spread over ``nodes`` (the fake agent's limit: 64)."""
    need = -(-tasks * 105 // (100 * QUARTERS * nodes))
    if need > 64:
        raise SystemExit(f"e2e_burst --real: {tasks} tasks need {need} GPUs on each of {nodes} nodes (at most 64): "
                         "give more --nodes")
    return need


def wait_gpunodes(api: Any, names: list[str], timeout_s: float = 120.0) -> None:
    """Until every named GPUNode has the GPUs its agent reports."""
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed: list[dict[str, Any]] = custom.list_cluster_custom_object(  # type: ignore[index]
            "gputask.io", "v1alpha1", "gpunodes")["items"]
        if {n["metadata"]["name"] for n in listed if (n.get("status") or {}).get("gpus")} >= set(names):
            return
        time.sleep(0.5)
    raise SystemExit(f"e2e_burst --real: the agents reported no GPUs within {timeout_s:.0f} s")


def main_real(args: argparse.Namespace) -> int:
    """The burst on a real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.28.7,
    ``--nodes`` kubemark hollow nodes), each Job's pod made by the Job controller, bound by kube-scheduler and run
    by a hollow kubelet; GPUs from a ``gputask agent --fake-gpus`` per node, the operator with the chart's RBAC."""
    sys.path.insert(0, str(REPO / "tests"))
    from kubernetes import client as k8s

    from gputask.k8s.client import load_api_client
    from gputask.testing.controlplane import (
        ControlPlane,
        ControlPlaneUnavailable,
        free_port,
        missing_prerequisites,
    )
    from helmtool import find_helm, render

    reason = missing_prerequisites() or (None if find_helm() else "helm not found (make helm)")
    if reason:
        raise SystemExit(f"e2e_burst --real: {reason}")
    gpus = gpus_per_node(args.tasks, args.nodes)
    names = [f"node-{n:04d}" for n in range(args.nodes)]
    controllers = [*REAL_QPS, f"--concurrent-job-syncs={args.job_syncs}"]
    for attempt in range(3):  # a free port taken by another process before a component bound it: again
        plane = ControlPlane(nodes=names, max_pods=gpus * QUARTERS + 10, node_monitor_grace_s=40,
                             extra_args={"kube-controller-manager": controllers, "kube-scheduler": REAL_QPS},
                             workdir=args.workdir / f"try{attempt}" if args.workdir else None)
        try:
            plane.start(timeout_s=180)
            break
        except ControlPlaneUnavailable as exc:
            if "address already in use" not in str(exc) or attempt == 2:
                raise
            print(f"e2e_burst --real: a port was taken, starting again: {str(exc).splitlines()[0]}", file=sys.stderr)
    children: list[subprocess.Popen[bytes]] = []
    try:
        work = plane.dir
        plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
        plane.kubectl("create", "namespace", REAL_NAMESPACE)
        rbac = [d for d in render(find_helm(), namespace=REAL_NAMESPACE) if d["kind"] in RBAC_KINDS]
        plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
        operator_kubeconfig = plane.service_account_kubeconfig(REAL_NAMESPACE, "gputask-operator")
        agent_kubeconfig = plane.service_account_kubeconfig(REAL_NAMESPACE, "gputask-agent")
        for node in names:
            children.append(spawn([sys.executable, "-m", "gputask.cli", "agent", "--node-name", node, "--fake-gpus",
                                   f"{gpus}xNVIDIA-A100-SXM4-80GB:80Gi", "--metrics-port", str(free_port()),
                                   "--metrics-bind-address", "127.0.0.1", "--kubeconfig", str(agent_kubeconfig)],
                                  work / f"agent-{node}.log"))
        api = load_api_client(str(plane.admin_kubeconfig))
        wait_gpunodes(api, names)
        seed_queue(api, args.tasks)
        (work / "config.yaml").write_text(args.config_text)
        env = {**os.environ, "POD_NAMESPACE": REAL_NAMESPACE, "POD_NAME": "gputask-operator-bench"}
        operator = spawn([sys.executable, "-m", "gputask.cli", "run", "--kubeconfig", str(operator_kubeconfig),
                          "--config", str(work / "config.yaml")], work / "operator.log", env)
        children.append(operator)
        wait_leading(api)
        pids = {**plane.pids(), "operator": operator.pid, "driver": os.getpid()}
        groups = {"kube-apiserver": ["kube-apiserver"], "etcd": ["etcd"],
                  "kube-controller-manager": ["kube-controller-manager"], "kube-scheduler": ["kube-scheduler"],
                  "kubelets": names, "operator": ["operator"]}
        agents = [c.pid for c in children if c is not operator]

        def cpu_now() -> dict[str, float]:
            used = {group: sum(cpu_seconds(pids[m]) for m in members) for group, members in groups.items()}
            return {**used, "agents": sum(cpu_seconds(pid) for pid in agents), "driver": time.process_time()}

        cpu, split = cpu_now(), cpu_split(operator.pid)
        load_before, wall = os.getloadavg()[0], time.monotonic()
        loads: list[float] = []
        sampled = threading.Event()

        def sample_load() -> None:
            while not sampled.wait(5.0):
                loads.append(os.getloadavg()[0])

        threading.Thread(target=sample_load, daemon=True).start()
        figures = burst(plane.admin_kubeconfig, args.tasks, args.clients, args.timeout, until_running=True)
        settle(operator.pid, quiet_s=2.0)  # the operator's work for the last pod events done
        wall = time.monotonic() - wall
        sampled.set()
        used = {k: v - cpu[k] for k, v in cpu_now().items()}
        after = cpu_split(operator.pid)
        figures["loadAverage1m"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2),
                                    "maxDuring": round(max(loads, default=load_before), 2)}
        tasks: list[dict[str, Any]] = k8s.CustomObjectsApi(api).list_namespaced_custom_object(  # type: ignore[index]
            "gputask.io", "v1alpha1", "default", "gputasks")["items"]
        figures["tasksAdmittedMoreThanOnce"] = sum((t.get("status") or {}).get("attempt", 0) > 1 for t in tasks)
        figures["operator"] = {"cpuMsPerTask": round(1000 * used["operator"] / args.tasks, 2),
                               "userSeconds": round(after[0] - split[0], 1),
                               "systemSeconds": round(after[1] - split[1], 1)}
        figures["apiServer"] = {"cpuSeconds": round(used["kube-apiserver"], 1),
                                "cpuMsPerTask": round(1000 * used["kube-apiserver"] / args.tasks, 2),
                                "coreShare": round(used["kube-apiserver"] / wall, 2)}
        figures["windowSeconds"] = round(wall, 1)
        before, idle_s = cpu_seconds(operator.pid), 5.0
        time.sleep(idle_s)
        figures["operatorIdleCpuShare"] = round((cpu_seconds(operator.pid) - before) / idle_s, 3)
    finally:
        stop_all(children)
        plane.stop()
    result = {"controlPlane": "real (kube-apiserver, kube-controller-manager, kube-scheduler v1.28.7, etcd, "
                              "kubemark hollow nodes)",
              "tasks": args.tasks, "nodes": args.nodes, "gpusPerNode": gpus, "maxPodsPerNode": gpus * QUARTERS + 10,
              "clients": args.clients, "controllerQps": REAL_QPS, "concurrentJobSyncs": args.job_syncs, **figures,
              "cpuSeconds": {k: round(v, 1) for k, v in used.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if figures["jobsSeen"] == figures["podsRunning"] == args.tasks else 1


def main(argv: list[str] | None = None) -> int:
    """Start the processes, run the burst, print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the Jobs after the burst")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "e2e_burst.json")
    parser.add_argument("--config-text", default="cycleInterval: 0.5\n", help="the operator's configuration (YAML)")
    parser.add_argument("--backlog", type=int, default=0, help="waiting tasks created first (a queue with no quota)")
    parser.add_argument("--restart", action="store_true", help="then restart the operator and time a new admission")
    parser.add_argument("--pods", action="store_true", help="the driver makes each Job's pod and runs it")
    parser.add_argument("--churn", type=int, default=0, help="unrelated pod lifecycles during the burst")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy both processes into this folder")
    parser.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--real", action="store_true",
                        help="on a real control plane with hollow nodes, until every pod is Running")
    parser.add_argument("--job-syncs", type=int, default=JOB_SYNCS,
                        help="with --real: kube-controller-manager --concurrent-job-syncs")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="with --real: keep the control plane's certificates and every component's log here")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the emulator process
    parser.add_argument("--kubeconfig", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve_emulator(args.serve, args.kubeconfig)
        return 0
    if args.real:
        return main_real(args)
    from gputask.k8s.client import load_api_client

    work = Path(tempfile.mkdtemp(prefix="gputask-burst-"))
    kubeconfig = work / "kubeconfig"
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    emulator = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--kubeconfig", str(kubeconfig)],
                                stdout=subprocess.PIPE, text=True)
    operator = None
    try:
        assert emulator.stdout is not None
        if emulator.stdout.readline().strip() != "ready":
            raise SystemExit("e2e_burst: the emulator did not start")
        api = load_api_client(str(kubeconfig))
        seed(api, args.nodes, args.tasks)
        beating = threading.Event()
        threading.Thread(target=heartbeats, args=(api, args.nodes, beating), daemon=True).start()
        (work / "config.yaml").write_text(args.config_text)
        log = (work / "operator.log").open("w")
        operator = subprocess.Popen([sys.executable, "-m", "gputask.cli", "run", "--kubeconfig", str(kubeconfig),
                                     "--config", str(work / "config.yaml")], stdout=log, stderr=subprocess.STDOUT)
        wait_leading(api)
        backlog_s = backlog(api, args.backlog, args.clients)
        spies = []
        if args.profile is not None:  # py-spy on the emulator and the operator for the burst
            args.profile.mkdir(parents=True, exist_ok=True)
            for name, proc in (("emulator", emulator), ("operator", operator)):
                spies.append(subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(proc.pid), "--format",
                     "raw", "--output", str(args.profile / f"{name}.txt"), "--rate", str(args.profile_rate), "--gil"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        cpu = {"emulator": cpu_seconds(emulator.pid), "operator": cpu_seconds(operator.pid),
               "driver": time.process_time()}
        split, switches = cpu_split(operator.pid), context_switches(operator.pid)
        load_before = os.getloadavg()[0]
        figures = burst(kubeconfig, args.tasks, args.clients, args.timeout, pods=args.pods, churn=args.churn,
                        nodes=args.nodes)
        if args.pods or args.churn:
            settle(operator.pid, quiet_s=2.0)  # the operator's work for the last pod events done
        figures["loadAverage1m"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
        used = {"emulator": cpu_seconds(emulator.pid) - cpu["emulator"],
                "operator": cpu_seconds(operator.pid) - cpu["operator"], "driver": time.process_time() - cpu["driver"]}
        after = cpu_split(operator.pid)
        figures["operator"] = {
            "cpuMsPerTask": round(1000 * used["operator"] / args.tasks, 2),
            "userSeconds": round(after[0] - split[0], 1), "systemSeconds": round(after[1] - split[1], 1),
            "contextSwitchesPerTask": round((context_switches(operator.pid) - switches) / args.tasks, 1),
        }
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
        settle(emulator.pid)  # the operator's writes done
        before, idle_s = cpu_seconds(operator.pid), 5.0
        time.sleep(idle_s)  # nothing changes now: what the operator costs with the backlog and the burst waiting
        figures["operatorIdleCpuShare"] = round((cpu_seconds(operator.pid) - before) / idle_s, 3)
        if args.restart:
            operator.terminate()
            operator.wait(timeout=30)
            started = time.monotonic()
            operator = subprocess.Popen([sys.executable, "-m", "gputask.cli", "run", "--kubeconfig", str(kubeconfig),
                                         "--config", str(work / "config.yaml")], stdout=log, stderr=subprocess.STDOUT)
            figures["restart"] = restart_figures(api, operator.pid, started, args.tasks + args.backlog)
    finally:
        for proc in (operator, emulator):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    writes_file = Path(str(kubeconfig) + ".writes.json")
    writes = json.loads(writes_file.read_text()) if writes_file.is_file() else {}
    result = {"tasks": args.tasks, "nodes": args.nodes, "clients": args.clients, "backlog": args.backlog,
              "backlogCreateSeconds": round(backlog_s, 1), **figures, "writes": writes,
              "cpuSeconds": {k: round(v, 1) for k, v in used.items()}, "operatorLog": str(work / "operator.log")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if figures["jobsSeen"] == args.tasks else 1


if __name__ == "__main__":
    sys.exit(main())
