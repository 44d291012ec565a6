"""Lost answers on a real control plane (issue 33): a Job create served but never answered, a Job that completed
while its task waited, the REASON column of a failed task.

These tests have a control plane of their own (about 5 s to start): etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and one hollow node ``node-x`` with one fake 24Gi GPU (its node agent), the CRDs and the chart's
RBAC, and one operator process (the chart's ServiceAccount, leader election on) that talks to the API server
through :class:`LosingProxy`: a TLS proxy that serves the control plane's CA-signed certificate, sends every
request on to kube-apiserver over TLS, and for the first Job create reads the server's whole answer and closes
the operator's connection without sending it. The package's control plane and its operators are not touched.

``GPUTASK_OPERATOR_PYTHONPATH``: the ``PYTHONPATH`` of the operator process (the ``operator/`` folder of another
checkout): how these tests were run against the code before issue 33's fix.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gputask.core.model import GpuSlot, NodeName, Placement
from gputask.k8s.jobs import build_job
from gputask.testing.controlplane import ControlPlane, ControlPlaneUnavailable, free_port
from realcluster.realstack import NAMESPACE, REASON, REPO, Installed, install_chart_rbac, wait_for

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.skipif(REASON is not None, reason=f"real control plane suite skipped: {REASON}"),
]

NODE = "node-x"
GPU = "1xNVIDIA-A10:24Gi"
CLUSTER_QUEUE = "lost"
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:gputask-operator"
KCM = "kube-controller-manager"
# Every write to a Job (create, patch, update, delete; its status too), at Metadata level: user and answer.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": ["create", "patch", "update", "delete"],
         "resources": [{"group": "batch", "resources": ["jobs", "jobs/status"]}]},
        {"level": "None"},
    ],
}
JOB_CREATE = re.compile(r"/apis/batch/v1/namespaces/[^/]+/jobs")


# ----- the proxy ------------------------------------------------------------------------------------------------


def answer_status(buffer: bytes) -> int | None:
    """The status code of the HTTP/1.1 answer in ``buffer`` once it is whole (Content-Length or chunked body),
    else None."""
    head_end = buffer.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    lines = buffer[:head_end].decode("latin-1").split("\r\n")
    code = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    body = buffer[head_end + 4:]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        at = 0
        while True:
            line_end = body.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(body[at:line_end].split(b";")[0], 16)
            if size == 0:
                return code if body.find(b"\r\n\r\n", line_end) == line_end else None
            at = line_end + 2 + size + 2
            if at > len(body):
                return None
    return code if len(body) >= int(headers.get("content-length", "0")) else None


@dataclass
class LosingProxy:
    """A TLS proxy on 127.0.0.1 in front of kube-apiserver (port ``upstream_port``, CA ``ca``) serving ``cert`` and
    ``key``: the answer to the first ``POST`` of a Job (``/apis/batch/v1/namespaces/NS/jobs``) is read whole from
    the server and never sent; the operator's connection is closed instead (what it sees when the server or the
    network fails after the create was served). Every other request and answer (watches too) is passed on as is.
    HTTP/1.1 only (ALPN), one request at a time per connection, as aiohttp sends them.

    ``lost``: set once an answer was swallowed; ``lost_answer``: (request line, status code of the lost answer)."""

    upstream_port: int
    ca: Path
    cert: Path
    key: Path
    port: int = 0
    lost: threading.Event = field(default_factory=threading.Event)
    lost_answer: tuple[str, int] | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _claimed: bool = False

    def start(self) -> None:
        """Listen (on a free port, :attr:`port`) from a daemon thread's event loop."""
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="losing-proxy", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)

    def stop(self) -> None:
        """Stop the event loop (open connections are dropped with it)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _listen(self) -> None:
        served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        served.load_cert_chain(self.cert, self.key)
        served.set_alpn_protocols(["http/1.1"])
        await asyncio.start_server(self._connection, "127.0.0.1", self.port, ssl=served)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = ssl.create_default_context(cafile=str(self.ca))
        upstream.set_alpn_protocols(["http/1.1"])
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port, ssl=upstream)
        except OSError:
            writer.transport.abort()
            return
        swallowing = asyncio.Event()
        request_line = [""]

        async def requests() -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    method, target = lines[0].split(" ")[:2]
                    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                    assert "chunked" not in headers.get("transfer-encoding", ""), "a chunked request body"
                    body = await reader.readexactly(int(headers.get("content-length", "0")))
                    if method == "POST" and JOB_CREATE.fullmatch(target.split("?")[0]) and not self._claimed:
                        self._claimed = True
                        request_line[0] = lines[0]
                        swallowing.set()  # before it is sent: every byte answered after it is its answer
                    up_writer.write(head + body)
                    await up_writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
                pass
            finally:
                up_writer.transport.abort()

        async def answers() -> None:
            held = b""
            try:
                while data := await up_reader.read(1 << 16):
                    if not swallowing.is_set():
                        writer.write(data)
                        await writer.drain()
                        continue
                    held += data
                    code = answer_status(held)
                    if code is not None:
                        self.lost_answer = (request_line[0], code)
                        self.lost.set()
                        break
            except (ConnectionError, ssl.SSLError, OSError):
                pass
            finally:
                writer.transport.abort()
                up_writer.transport.abort()

        await asyncio.gather(requests(), answers())


# ----- the control plane of these tests ---------------------------------------------------------------------------


@dataclass
class Lossy:
    """This module's control plane, its kubectl access (``api``), the proxy the operator talks through."""

    cp: ControlPlane
    api: Installed
    proxy: LosingProxy


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lossy]:
    """One hollow node with one 24Gi GPU, gputask's CRDs and RBAC, a GPUClusterQueue ``lost`` open to every
    namespace, and one operator talking through a :class:`LosingProxy`."""
    kept = os.environ.get("GPUTASK_REALCLUSTER_DIR")  # as conftest.py: keep logs and the audit log there
    plane = ControlPlane(nodes=[NODE], audit_policy=AUDIT_POLICY, workdir=Path(kept) / "lossy" if kept else None)
    try:
        plane.start()
    except ControlPlaneUnavailable as exc:
        pytest.fail(f"the control plane did not start: {exc}")
    proxy = LosingProxy(plane.api_port, plane.dir / "ca.crt", plane.dir / "apiserver.crt", plane.dir / "apiserver.key")
    try:
        plane.kubectl("apply", "-f", str(REPO / "crds"))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
        config = install_chart_rbac(plane, podStartTimeout="10s")
        folder = tmp_path_factory.mktemp("lossy")
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        proxy.start()
        kubeconfig = yaml.safe_load(plane.service_account_kubeconfig(NAMESPACE, "gputask-operator").read_text())
        kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        (folder / "operator.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        api = Installed(plane, folder / "operator.kubeconfig",
                        plane.service_account_kubeconfig(NAMESPACE, "gputask-agent"), folder / "config.yaml",
                        operators=("operator",))
        api.start_agent(NODE, GPU)
        source = os.environ.get("GPUTASK_OPERATOR_PYTHONPATH")
        env = {**os.environ, "POD_NAMESPACE": NAMESPACE, "POD_NAME": "operator", "PYTHONUNBUFFERED": "1",
               **({"PYTHONPATH": source} if source else {})}
        plane.launch("operator", [sys.executable, "-m", "gputask.cli", "run", "--config", str(api.config),
                                  "--kubeconfig", str(api.operator_kubeconfig)], env)
        plane.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "gputask.io/v1alpha1", "kind": "GPUClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
            "spec": {"namespaceSelector": {}, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4},
                                                            {"name": "gputask.io/gpu-memory", "nominalQuota": "64Gi"}]},
        }))
        wait_for(lambda: (api.get("gpunodes.gputask.io", NODE, None) or {}).get("status", {}).get("gpus"), 60,
                 f"the agent's GPUNode {NODE}")
        yield Lossy(plane, api, proxy)
    finally:
        plane.stop()
        proxy.stop()


def namespace_with_queue(lossy: Lossy, namespace: str, queue: str | None = "q") -> None:
    """Namespace ``namespace`` and (unless None) its GPULocalQueue ``queue`` of the GPUClusterQueue ``lost``."""
    lossy.cp.kubectl("create", "namespace", namespace)
    if queue is not None:
        local_queue(lossy, namespace, queue)


def local_queue(lossy: Lossy, namespace: str, name: str) -> None:
    """Create GPULocalQueue ``namespace/name`` of the GPUClusterQueue ``lost``."""
    lossy.cp.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPULocalQueue",
        "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": CLUSTER_QUEUE},
    }))


def submit(lossy: Lossy, namespace: str, name: str, memory: str, queue: str = "q") -> None:
    """Create a one-GPU GPUTask asking for ``memory`` (sharing allowed) in GPULocalQueue ``queue``."""
    lossy.cp.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "gputask.io/v1alpha1", "kind": "GPUTask",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queueName": queue, "gpus": 1, "gpuMemory": memory,
                 "template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "main", "image": "busybox:1.36"}]}}},
    }))


def task_status(lossy: Lossy, namespace: str, name: str) -> dict[str, Any]:
    """The GPUTask's status ({} before it has one)."""
    found = lossy.api.get("gputasks.gputask.io", name, namespace)
    assert found is not None, f"GPUTask {namespace}/{name} is gone"
    return found.get("status") or {}


def conditions(found: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """type -> (status, reason, message) of a status's conditions."""
    return {c["type"]: (c["status"], c.get("reason", ""), c.get("message", "")) for c in found.get("conditions") or []}


def jobs_in(lossy: Lossy, namespace: str) -> list[tuple[str, str, bool]]:
    """(name, uid, being deleted) of every Job in ``namespace``, by name."""
    listed = lossy.api.kubectl("get", "jobs", "-n", namespace, "-o", "json")["items"]
    return sorted((j["metadata"]["name"], j["metadata"]["uid"], "deletionTimestamp" in j["metadata"]) for j in listed)


def operator_job_writes(lossy: Lossy, namespace: str) -> list[tuple[str, str, str, int]]:
    """(verb, Job name, subresource, response code) of every Job write the operator sent in ``namespace``."""
    return [
        (e["verb"], e["objectRef"].get("name", ""), e["objectRef"].get("subresource", ""), e["responseStatus"]["code"])
        for e in lossy.cp.audit_events()
        if e["user"]["username"] == OPERATOR_USER and e["objectRef"].get("namespace") == namespace
    ]


def running(lossy: Lossy, namespace: str, name: str) -> dict[str, Any] | None:
    """The task's status once it is Running and its Job's pod too."""
    found = task_status(lossy, namespace, name)
    if found.get("phase") != "Running":
        return None
    pods = lossy.api.kubectl("get", "pods", "-n", namespace, "-l", f"job-name={found['jobName']}", "-o", "json")
    return found if [p["status"].get("phase") for p in pods["items"]] == ["Running"] else None


def patch_job_status(lossy: Lossy, namespace: str, job: str, status: dict[str, Any]) -> None:
    """Write a Job's status as the Job controller would (its ``status`` subresource, as admin)."""
    done = lossy.cp.kubectl("patch", "job", job, "-n", namespace, "--subresource=status", "--type=merge",
                            "-p", json.dumps({"status": status}), check=False)
    assert done.returncode == 0, f"the status patch of Job {job} was refused: {done.stderr}"


NOW = "2026-01-01T00:00:00Z"

# ----- the tests ------------------------------------------------------------------------------------------------


def test_a_job_create_whose_answer_is_lost_keeps_its_gpus_and_is_adopted(lossy: Lossy) -> None:
    """The answer to t's Job create (201) is lost: t keeps its 20Gi of the 24Gi GPU and is Admitted with Job t-1
    once it is found, u (20Gi, submitted after) waits NoFit, and no other Job is ever created."""
    ns = "lost-create"
    namespace_with_queue(lossy, ns)
    submit(lossy, ns, "t", "20Gi")
    assert lossy.proxy.lost.wait(60), "no Job create was sent"
    submit(lossy, ns, "u", "20Gi")
    wait_for(lambda: running(lossy, ns, "t") or [j for j in jobs_in(lossy, ns) if j[0] != "t-1"], 60,
             "t Running, or a Job besides t-1")
    wait_for(lambda: conditions(task_status(lossy, ns, "u")).get("QuotaReserved"), 30, "u evaluated")
    time.sleep(2)  # four scheduling cycles after: a double booking would have created u-1 by now
    t, u = task_status(lossy, ns, "t"), task_status(lossy, ns, "u")
    assert (lossy.proxy.lost_answer, t.get("phase"), t.get("jobName"), conditions(t).get("Admitted", ("",) * 3)[:2],
            u.get("phase"), conditions(u).get("QuotaReserved", ("",) * 3)[:2], [j[0] for j in jobs_in(lossy, ns)],
            operator_job_writes(lossy, ns)) == (
        (f"POST /apis/batch/v1/namespaces/{ns}/jobs?fieldManager=gputask-operator HTTP/1.1", 201), "Running", "t-1",
        ("True", "Admitted"), "Pending", ("False", "NoFit"), ["t-1"], [("create", "t-1", "", 201)],
    )
    lossy.cp.kubectl("delete", "gputasks.gputask.io", "--all", "-n", ns, "--wait=false")


def test_a_job_that_completed_unseen_finishes_its_waiting_task(lossy: Lossy) -> None:
    """t waits (its GPULocalQueue does not exist yet) while its Job t-1, created as the operator creates it,
    completes (kube-controller-manager stopped, the status written by hand); once the queue exists t is
    Succeeded ("Job t-1 completed"), t-1 is never deleted and no t-2 is created."""
    ns = "unseen-end"
    namespace_with_queue(lossy, ns, queue=None)
    submit(lossy, ns, "t", "2Gi", queue="later")
    wait_for(lambda: task_status(lossy, ns, "t").get("phase") == "Pending", 30, "t Pending")
    task = lossy.api.kubectl("get", "gputasks.gputask.io", "t", "-n", ns, "-o", "json")
    gpu = lossy.api.kubectl("get", "gpunodes.gputask.io", NODE, "-o", "json")["status"]["gpus"][0]
    job = build_job(task, Placement.one(NodeName(NODE), (GpuSlot(0, gpu["uuid"], 2048),)), attempt=1,
                    queue=CLUSTER_QUEUE)
    lossy.cp.kill(KCM)  # no pod for t-1, and its status is ours to write
    try:
        lossy.cp.kubectl("create", "-f", "-", input=json.dumps(job))
        created = jobs_in(lossy, ns)
        patch_job_status(lossy, ns, "t-1", {
            "startTime": NOW, "completionTime": NOW, "succeeded": 1, "active": 0,
            "conditions": [{"type": "Complete", "status": "True", "lastProbeTime": NOW, "lastTransitionTime": NOW}],
        })
        local_queue(lossy, ns, "later")
        wait_for(lambda: task_status(lossy, ns, "t").get("phase") in ("Succeeded", "Failed"), 30, "t finished")
        time.sleep(2)  # four scheduling cycles after: an eviction would have deleted t-1 or created t-2 by now
        done = task_status(lossy, ns, "t")
        assert (done["phase"], done.get("jobName"), conditions(done).get("Finished", ("",) * 3), jobs_in(lossy, ns),
                operator_job_writes(lossy, ns)) == (
            "Succeeded", "t-1", ("True", "Succeeded", "Job t-1 completed"), created, [],
        )
    finally:
        lossy.cp.start_component(KCM)


def test_a_failed_job_shows_phase_failed_and_reason_jobfailed_in_kubectl_get(lossy: Lossy) -> None:
    """A running task's Job fails (a Failed condition, no disruption; kube-controller-manager stopped):
    ``kubectl get gt`` (the CRD's printer columns in the API server's table) shows PHASE Failed, REASON JobFailed."""
    ns = "reason-column"
    namespace_with_queue(lossy, ns)
    submit(lossy, ns, "t", "2Gi")
    wait_for(lambda: running(lossy, ns, "t"), 60, "t Running")
    lossy.cp.kill(KCM)
    try:
        patch_job_status(lossy, ns, "t-1", {
            "failed": 1, "active": 0,
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit",
                            "lastProbeTime": NOW, "lastTransitionTime": NOW}],
        })
        wait_for(lambda: task_status(lossy, ns, "t").get("phase") == "Failed", 30, "t Failed")
        table = lossy.cp.kubectl("get", "gt", "t", "-n", ns).stdout.splitlines()
        header = table[0].split()
        row = dict(zip(header, re.split(r"\s{2,}", table[1].strip()), strict=True))
        assert {k: v for k, v in row.items() if k != "AGE"} == {
            "NAME": "t", "QUEUE": CLUSTER_QUEUE, "PRIORITY": "0", "PHASE": "Failed", "NODE": NODE,
            "PODS": "1x1 on 1 node", "GPUS": "1", "MEMORY": "2Gi", "REASON": "JobFailed",
        }
    finally:
        lossy.cp.start_component(KCM)
