"""A real Kubernetes control plane on loopback for tests and benchmarks (v1.28.7 binaries, hollow nodes).

:class:`ControlPlane` starts etcd, kube-apiserver, kube-controller-manager (node lifecycle controller on,
with a short grace), kube-scheduler and N kubemark hollow nodes (``--morph=kubelet``: the real kubelet
with a fake container runtime), each bound to 127.0.0.1 on free ports, with an openssl-made CA, serving
certificate and service-account key pair in a temporary folder. It writes an admin kubeconfig (a static
token in ``system:masters``, for set-up only) and, on request, a kubeconfig for a ServiceAccount's token,
so the code under test runs with the identity and RBAC it has in a cluster. Nodes and the API server can
be killed, paused, resumed and restarted. Every process is started in its own process group and stopped
by its PID (SIGTERM, then SIGKILL); each is also asked to be killed when the process that started it
dies (``PR_SET_PDEATHSIG``), so none is left behind even when the test run itself is killed.

The binaries come from ``kubernetes-v1.28.7-linux-amd64.tar.xz`` (a ``shared/kube/`` folder beside the
repository, or ``$GPUTASK_KUBE_TARBALL``), unpacked once into
``${XDG_CACHE_HOME:-~/.cache}/gputask/kube-v1.28.7`` after its SHA256 is checked against
``SHA256SUMS``; etcd is the host's (Debian's ``etcd-server``, ``/usr/bin/etcd``). :func:`missing_prerequisites`
says why a control plane cannot start here, for a test suite to skip with that reason.

Used by ``tests/realcluster`` (one control plane per test session) and reusable by a benchmark::

    with ControlPlane(nodes=3) as cp:
        subprocess.run(["kubectl", "--kubeconfig", str(cp.admin_kubeconfig), "get", "nodes"])

Processes are started from the calling thread; call from the main thread (``PR_SET_PDEATHSIG`` fires when
the starting *thread* exits).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KUBE_VERSION = "v1.28.7"
TARBALL = f"kubernetes-{KUBE_VERSION}-linux-amd64.tar.xz"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubemark")
# kube-controller-manager controllers that need a cloud, a network plugin or volumes: off (kube README's list).
CONTROLLERS = "*,-nodeipam,-cloud-node-lifecycle,-route,-service,-persistentvolume-binder,-attachdetach"
_PR_SET_PDEATHSIG = 1
_ADMIN_USER = "gputask-test-admin"


class ControlPlaneUnavailable(Exception):
    """The binaries, etcd, kubectl or openssl are missing here, or a component did not come up."""


def repository_root() -> Path:
    """The repository this module is in (``operator/gputask/testing`` -> the root)."""
    return Path(__file__).resolve().parents[3]


def _shared_candidates() -> list[Path]:
    """``shared/kube`` folders to look in: beside the repository, and beside the main worktree of a git worktree."""
    root = repository_root()
    found = [root.parent / "shared" / "kube", root / "shared" / "kube"]
    dot_git = root / ".git"
    if dot_git.is_file():  # a worktree: "gitdir: MAIN/.git/worktrees/NAME"
        text = dot_git.read_text().strip()
        if text.startswith("gitdir:"):
            main = Path(text.split(":", 1)[1].strip()).resolve().parents[2]
            found.append(main.parent / "shared" / "kube")
    return found


def find_tarball() -> Path | None:
    """``$GPUTASK_KUBE_TARBALL``, else the first ``shared/kube/`` tarball found beside the repository; None if none."""
    explicit = os.environ.get("GPUTASK_KUBE_TARBALL")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    for folder in _shared_candidates():
        if (folder / TARBALL).is_file():
            return folder / TARBALL
    return None


def cache_dir() -> Path:
    """Where the binaries are unpacked: ``${XDG_CACHE_HOME:-~/.cache}/gputask/kube-v1.28.7``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gputask" / f"kube-{KUBE_VERSION}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sums(path: Path) -> dict[str, str]:
    """name -> sha256 from a ``SHA256SUMS`` file (``HEX  NAME`` lines)."""
    sums = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0]
    return sums


def kube_binaries() -> Path:
    """The folder holding kube-apiserver, kube-controller-manager, kube-scheduler and kubemark v1.28.7.

    Unpacks the tarball into :func:`cache_dir` the first time (about 4 s), after checking its SHA256 and then
    each binary's against ``SHA256SUMS`` beside it; later calls find the ``.verified`` stamp and return at once.
    Raises ControlPlaneUnavailable when there is no tarball or a checksum does not match."""
    target = cache_dir()
    if (target / ".verified").is_file() and all(os.access(target / b, os.X_OK) for b in BINARIES):
        return target
    tarball = find_tarball()
    if tarball is None:
        places = ", ".join(str(p) for p in _shared_candidates())
        raise ControlPlaneUnavailable(f"{TARBALL} not found (looked in {places}; or set GPUTASK_KUBE_TARBALL)")
    sums_file = tarball.parent / "SHA256SUMS"
    if not sums_file.is_file():
        raise ControlPlaneUnavailable(f"{sums_file} is missing: cannot check {tarball.name}")
    sums = _sums(sums_file)
    if _sha256(tarball) != sums.get(TARBALL):
        raise ControlPlaneUnavailable(f"{tarball}: SHA256 does not match {sums_file}")
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        with tarfile.open(tarball) as archive:
            archive.extractall(scratch, filter="data")
        for name in BINARIES:
            found = next(scratch.rglob(name), None)
            if found is None or _sha256(found) != sums.get(name):
                raise ControlPlaneUnavailable(f"{tarball}: {name} missing or its SHA256 does not match {sums_file}")
            found.chmod(0o755)
            if found.parent != scratch:
                found.rename(scratch / name)
        for leftover in scratch.iterdir():  # folders of the archive, licence files: only the binaries are kept
            if leftover.name not in BINARIES:
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        scratch.chmod(0o755)
        (scratch / ".verified").write_text(f"{TARBALL} {sums[TARBALL]}\n")
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def missing_prerequisites() -> str | None:
    """Why a control plane cannot start here (no tarball, no etcd, no kubectl, no openssl), or None."""
    if not (cache_dir() / ".verified").is_file() and find_tarball() is None:
        return f"{TARBALL} not found beside the repository (shared/kube/) nor in $GPUTASK_KUBE_TARBALL"
    for tool, hint in (("etcd", "Debian: apt-get install etcd-server"), ("kubectl", "install kubectl"),
                       ("openssl", "install openssl")):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH ({hint})"
    return None


# Listening ports come from below Linux's default ephemeral range (32768-60999): a port the kernel hands out
# for port 0 is from that range, so the outgoing connections of a burst (thousands of them) could take it
# between our pick and the component's bind ("address already in use").
_PORT_RANGE = (20000, 32000)
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now, below the ephemeral range, never the same twice in a process.

    Raises ``OSError`` when no port of the range can be bound."""
    low, high = _PORT_RANGE
    start = low + secrets.randbelow(high - low)
    for offset in range(high - low):
        port = low + (start - low + offset) % (high - low)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port on 127.0.0.1 in {low}-{high}")


def _die_with_parent() -> None:
    """In the child before exec: be killed when the starting thread dies (Linux), whatever ends the tests."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneUnavailable(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()}")


@dataclass
class Component:
    """One started process: its name, command line, environment, log file and Popen (None while stopped)."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The process id while it runs (or is paused), else None."""
        return self.process.pid if self.process is not None and self.process.poll() is None else None


@dataclass
class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and ``nodes`` hollow nodes on 127.0.0.1.

    ``nodes``: hollow node names (``hollow-0``... when an int). ``node_labels``: labels every node
    registers with. ``node_monitor_grace_s``: seconds a silent node stays Ready before the node lifecycle
    controller marks it NotReady and taints it (kube default 40; 20 here). ``node_capacity``: the
    ``--extended-resources`` of each node (cpu, memory). ``workdir``: where certificates, data and logs go
    (a new short folder under the temp dir by default, removed by :meth:`stop`; a given one is kept).
    ``audit_policy``: an ``audit.k8s.io/v1`` Policy; the API server then writes ``workdir/audit.log``
    (JSON lines, read with :meth:`audit_events`), e.g. to count the requests a component made.
    Raises ControlPlaneUnavailable from :meth:`start` when something is missing or does not come up.

    ``max_pods``: each hollow node's ``--max-pods``. ``extra_args``: component name -> flags appended to its
    command line (a later flag overrides an earlier one), e.g. a benchmark's client QPS for the scheduler.
    """

    nodes: int | Sequence[str] = 3
    node_labels: dict[str, str] = field(default_factory=dict)
    node_monitor_grace_s: int = 20
    max_pods: int = 110
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    node_capacity: str = "cpu=16,memory=64Gi"
    workdir: Path | None = None
    audit_policy: dict[str, Any] | None = None
    components: dict[str, Component] = field(default_factory=dict, init=False)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16), init=False)
    api_port: int = field(default=0, init=False)
    api_outages: list[tuple[float, float]] = field(default_factory=list, init=False)
    """(stopped, ready again) in wall-clock seconds (``time.time()``) for each stop and start of kube-apiserver
    here: while it starts its authorizer's caches are still filling, and it may answer 403 to any identity."""
    _api_stopped_at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.node_names = [f"hollow-{i}" for i in range(self.nodes)] if isinstance(self.nodes, int) else list(
            self.nodes
        )
        self._own_workdir = self.workdir is None
        # Short: the kubelet's unix sockets go under each node's folder (107-byte limit on socket paths).
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) < 20 else "/tmp"
        self.dir = Path(self.workdir or tempfile.mkdtemp(prefix="gtcp-", dir=base))
        self.bin = Path()

    # ----- life cycle -------------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        """The API server's URL (``https://127.0.0.1:PORT``)."""
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig with the admin token (``system:masters``): for set-up, never for the code under test."""
        return self.dir / "admin.kubeconfig"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start everything and wait until the API server is ready and every node is Ready (``timeout_s``).

        On any failure every process started so far is stopped and ControlPlaneUnavailable raised with the
        tail of the failing component's log."""
        try:
            self.bin = kube_binaries()
            etcd = shutil.which("etcd")
            if etcd is None:
                raise ControlPlaneUnavailable("etcd is not on PATH (Debian: apt-get install etcd-server)")
            self._write_certificates()
            self._define(etcd)
            for name in ("etcd", "kube-apiserver"):
                self._spawn(name)
            self.wait_ready(timeout_s)
            for name in ("kube-controller-manager", "kube-scheduler", *self.node_names):
                self._spawn(name)
            self.wait_nodes_ready(self.node_names, timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process (nodes first, etcd last) by PID: SIGCONT, SIGTERM, SIGKILL after 5 s. Idempotent;
        removes the work folder when this object made it."""
        for name in reversed(list(self.components)):
            self._terminate(self.components[name])
        if self._own_workdir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> dict[str, int]:
        """component name -> PID of every process running (or paused) now."""
        return {name: c.pid for name, c in self.components.items() if c.pid is not None}

    def launch(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Component:
        """Start another process under this control plane's care (an operator, a node agent): logged to
        ``workdir/NAME.log``, killable with :meth:`kill`, stopped by :meth:`stop` before the control plane.
        ``env`` replaces the environment when given. ValueError when ``name`` is taken by a running process."""
        existing = self.components.get(name)
        if existing is not None and existing.pid is not None:
            raise ValueError(f"{name} is already running (pid {existing.pid})")
        self.components.pop(name, None)  # re-added last: stopped first
        self.components[name] = Component(name, list(argv), self.dir / f"{name}.log", env)
        self._spawn(name)
        return self.components[name]

    def audit_events(self) -> list[dict[str, Any]]:
        """The API server's audit events so far (``audit_policy`` given), one dict per request, in order."""
        path = self.dir / "audit.log"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # ----- faults -----------------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL a component (a node name, ``kube-apiserver``...) and reap it: to the cluster, a crash."""
        component = self.components[name]
        if component.process is not None and component.process.poll() is None:
            self._note_stop(name)
            os.killpg(component.process.pid, signal.SIGKILL)
            component.process.wait()

    def pause(self, name: str) -> None:
        """SIGSTOP a component: a node that stops answering without its process going away."""
        os.killpg(self._running(name).pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT a paused component."""
        os.killpg(self._running(name).pid, signal.SIGCONT)

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Stop a component (SIGTERM, then SIGKILL) and start it again with the same flags; for the API server
        wait until it is ready again, for a node until it is Ready."""
        self._note_stop(name)
        self._terminate(self.components[name])
        self.start_component(name, timeout_s)

    def _note_stop(self, name: str) -> None:
        if name == "kube-apiserver" and self._api_stopped_at is None:
            self._api_stopped_at = time.time()

    def start_component(self, name: str, timeout_s: float = 60.0) -> None:
        """Start a stopped or killed component again (same flags, same data) and wait as :meth:`restart` does."""
        self._spawn(name)
        if name == "kube-apiserver":
            self.wait_ready(timeout_s)
            if self._api_stopped_at is not None:
                self.api_outages.append((self._api_stopped_at, time.time()))
                self._api_stopped_at = None
        elif name in self.node_names:
            self.wait_nodes_ready([name], timeout_s)

    # ----- API access -------------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """One API request as admin (or ``token``): parsed JSON answer; urllib.error.HTTPError on 4xx/5xx."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {token or self.admin_token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        context = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        with urllib.request.urlopen(req, context=context, timeout=10) as answer:
            raw = answer.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def kubectl(self, *args: str, input: str | None = None, kubeconfig: Path | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl ARGS`` with the admin kubeconfig (or ``kubeconfig``); CalledProcessError with its
        output when it fails and ``check``."""
        command = ["kubectl", "--kubeconfig", str(kubeconfig or self.admin_kubeconfig), *args]
        done = subprocess.run(command, input=input, capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr)
        return done

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until ``GET /readyz`` answers ok; ControlPlaneUnavailable (with the log tail) otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, urllib.error.URLError):
                if self.request("GET", "/readyz") == "ok":
                    return
            self._check_alive("kube-apiserver")
            if time.monotonic() > deadline:
                tail = self.log_tail("kube-apiserver")
                raise ControlPlaneUnavailable(f"kube-apiserver not ready after {timeout_s}s\n{tail}")
            time.sleep(0.2)

    def node_ready(self, name: str) -> str:
        """The Node's Ready condition status (``True``, ``False``, ``Unknown``; ``""`` while it has none)."""
        try:
            node = self.request("GET", f"/api/v1/nodes/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return ""
            raise
        conditions = (node.get("status") or {}).get("conditions") or []
        return next((c["status"] for c in conditions if c["type"] == "Ready"), "")

    def wait_nodes_ready(self, names: Sequence[str], timeout_s: float = 60.0) -> None:
        """Wait until every named Node is Ready; ControlPlaneUnavailable (with a node's log tail) otherwise."""
        deadline = time.monotonic() + timeout_s
        pending = list(names)
        while pending:
            pending = [n for n in pending if self.node_ready(n) != "True"]
            for name in pending:
                self._check_alive(name)
            if pending and time.monotonic() > deadline:
                tail = self.log_tail(pending[0])
                raise ControlPlaneUnavailable(f"nodes {pending} not Ready after {timeout_s}s\n{tail}")
            if pending:
                time.sleep(0.3)

    def service_account_kubeconfig(self, namespace: str, name: str, expiration_s: int = 86400) -> Path:
        """A kubeconfig whose user is ServiceAccount ``namespace/name`` (a TokenRequest token; the namespace and
        ServiceAccount are created when missing): what a pod running as that ServiceAccount would be."""
        with contextlib.suppress(urllib.error.HTTPError):
            self.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        with contextlib.suppress(urllib.error.HTTPError):
            self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": expiration_s}}
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
        path = self.dir / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(path, f"system:serviceaccount:{namespace}:{name}", answer["status"]["token"], namespace)
        return path

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last ``lines`` lines of a component's log (stdout and stderr)."""
        component = self.components.get(name)
        if component is None or not component.log.is_file():
            return ""
        text = component.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {name} log ({component.log}) ---\n" + "\n".join(text)

    # ----- internals --------------------------------------------------------------------------------------

    def _running(self, name: str) -> subprocess.Popen[bytes]:
        component = self.components[name]
        if component.process is None or component.process.poll() is not None:
            raise ControlPlaneUnavailable(f"{name} is not running")
        return component.process

    def _check_alive(self, name: str) -> None:
        component = self.components[name]
        if component.process is not None and component.process.poll() is not None:
            raise ControlPlaneUnavailable(
                f"{name} exited with {component.process.returncode}\n{self.log_tail(name)}"
            )

    def _spawn(self, name: str) -> None:
        component = self.components[name]
        if component.pid is not None:
            return
        log = component.log.open("ab")
        try:
            component.process = subprocess.Popen(
                component.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=component.env,
                cwd=self.dir, start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
            )
        finally:
            log.close()

    @staticmethod
    def _terminate(component: Component) -> None:
        process = component.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        component.process = None

    def _write_certificates(self) -> None:
        """CA, serving certificate for 127.0.0.1/localhost, service-account key pair, static tokens."""
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"), "-out",
                 str(d / "ca.crt"), "-days", "30", "-subj", "/CN=gputask-test-ca")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "apiserver.key"), "-out",
                 str(d / "apiserver.csr"), "-subj", "/CN=kube-apiserver")
        (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n")
        _openssl("x509", "-req", "-in", str(d / "apiserver.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
                 str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "apiserver.crt"), "-days", "30",
                 "-extfile", str(d / "san.ext"))
        _openssl("genrsa", "-out", str(d / "sa.key"), "2048")
        _openssl("rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))
        # Static tokens (set-up only): the admin, the controller-manager and scheduler as their default RBAC
        # users, and each node as the Node authorizer's identity (system:node:NAME in system:nodes).
        self.tokens = {
            _ADMIN_USER: (self.admin_token, "system:masters"),
            "system:kube-controller-manager": (secrets.token_hex(16), ""),
            "system:kube-scheduler": (secrets.token_hex(16), ""),
        } | {f"system:node:{n}": (secrets.token_hex(16), "system:nodes") for n in self.node_names}
        rows = [f'{token},{user},{user},"{group}"' if group else f"{token},{user},{user}"
                for user, (token, group) in self.tokens.items()]
        (d / "tokens.csv").write_text("\n".join(rows) + "\n")
        (d / "tokens.csv").chmod(0o600)

    def _write_kubeconfig(self, path: Path, user: str, token: str, namespace: str = "default") -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "real", "cluster": {"server": self.server,
                                                      "certificate-authority": str(self.dir / "ca.crt")}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": user, "namespace": namespace}}],
            "current-context": "real",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def _audit_flags(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(self.audit_policy))
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.dir / 'audit.log'}",
                "--audit-log-format=json", "--audit-log-mode=blocking"]

    def _define(self, etcd: str) -> None:
        d, b = self.dir, self.bin
        self.api_port = free_port()
        client_port, peer_port = free_port(), free_port()
        self._write_kubeconfig(self.admin_kubeconfig, _ADMIN_USER, self.admin_token)
        for user, (token, _) in self.tokens.items():
            if user != _ADMIN_USER:
                self._write_kubeconfig(d / f"{user.replace(':', '-')}.kubeconfig", user, token)

        def add(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
            self.components[name] = Component(name, argv, d / f"{name}.log", env)

        add("etcd", [
            etcd, "--name=gtcp", f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client_port}",
            f"--advertise-client-urls=http://127.0.0.1:{client_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=gtcp=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # test data: nothing to keep across a crash of the machine
        ])
        add("kube-apiserver", [
            str(b / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{client_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            "--endpoint-reconciler-type=none", f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}", f"--client-ca-file={d / 'ca.crt'}",
            f"--token-auth-file={d / 'tokens.csv'}", f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC", "--service-cluster-ip-range=10.96.0.0/24", "--profiling=false",
            *self._audit_flags(),
        ])
        add("kube-controller-manager", [
            str(b / "kube-controller-manager"),
            f"--kubeconfig={d / 'system-kube-controller-manager.kubeconfig'}", "--secure-port=0",
            "--leader-elect=false", f"--service-account-private-key-file={d / 'sa.key'}",
            f"--root-ca-file={d / 'ca.crt'}", f"--controllers={CONTROLLERS}", "--node-monitor-period=2s",
            f"--node-monitor-grace-period={self.node_monitor_grace_s}s", "--use-service-account-credentials=true",
        ])
        add("kube-scheduler", [
            str(b / "kube-scheduler"), f"--kubeconfig={d / 'system-kube-scheduler.kubeconfig'}",
            "--leader-elect=false", "--secure-port=0",
        ])
        empty_path = d / "nopath"
        empty_path.mkdir(exist_ok=True)
        labels = ",".join(f"{k}={v}" for k, v in self.node_labels.items())
        for i, node in enumerate(self.node_names):
            node_dir = d / f"n{i}"
            node_dir.mkdir(exist_ok=True)
            argv = [
                str(b / "kubemark"), "--morph=kubelet", f"--name={node}",
                f"--kubeconfig={d / ('system-node-' + node + '.kubeconfig')}", f"--kubelet-port={free_port()}",
                "--kubelet-read-only-port=0", "--use-host-image-service=false", f"--max-pods={self.max_pods}",
                f"--extended-resources={self.node_capacity}",
            ]
            if labels:
                argv.append(f"--node-labels={labels}")
            env = {"TMPDIR": str(node_dir), "PATH": str(empty_path), "HOME": str(node_dir)}
            add(node, argv, env)
        for name, flags in self.extra_args.items():
            self.components[name].argv.extend(flags)


@contextlib.contextmanager
def running(nodes: int | Sequence[str] = 3, **kwargs: Any) -> Iterator[ControlPlane]:
    """``with running(3) as cp:`` a started :class:`ControlPlane`, stopped when the block ends."""
    plane = ControlPlane(nodes=nodes, **kwargs)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
