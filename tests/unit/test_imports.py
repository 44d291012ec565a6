"""Import contracts between the parts of the package, each shown to catch a planted violation.

- the core imports only the standard library (and itself): it stays pure and fast;
- the simulator imports no operator code (``gputask.k8s``), no emulator and no kopf;
- the manifests (conversion shared by operator, simulator and emulator) import none of those three;
- nothing but the demo imports the emulator and fakes (``gputask.testing``); tests may;
- the node agent imports only itself, the core, the configuration and the API client (no operator logic, no
  simulator, emulator, manifests or kopf);
- inside the adapter: the records, phase changes, reports, Job records and API vocabulary (``k8s/records.py``,
  ``phases.py``, ``reports.py``, ``jobrecords.py``, ``resources.py``, ``timestamps.py``) import no I/O module
  (client, writer, transitions, executor, controller, loop, handlers, informers, Kueue mode, kopf, aiohttp); the
  workload interface (``k8s/workload.py``) imports neither the controller nor an I/O module.
- no import circle among the core's modules (:func:`import_cycles`; the scheduler split into cache, queue
  manager, cycle and view, issue 29).
Imports are read from the source (every ``import`` statement, ``TYPE_CHECKING`` ones included, and imports inside
functions).

Two more rules of the adapter are read from calls, not imports: only the writer (``k8s/writer.py``) and the
Lease's elector (``k8s/leader.py``, its own client) call a client's create, patch, replace or delete
(:func:`write_calls`); and no module is over :data:`MAX_LINES` lines nor any class over :data:`MAX_METHODS` methods
in ``core/`` and ``k8s/`` (:func:`oversized`).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "gputask"
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


@dataclass(frozen=True)
class Contract:
    """Modules under ``scope`` (folders of the package) may import only what ``allowed`` accepts."""

    name: str
    scope: tuple[str, ...]
    allowed: Callable[[str], bool]
    exempt: tuple[str, ...] = ()


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in prefixes)


IO_MODULES = tuple(f"gputask.k8s.{m}" for m in (
    "client", "kubeconfig", "writer", "tasks", "executor", "controller", "loop", "handlers", "informer", "main",
    "leader", "kueue", "kueue_admission", "relabel", "pinner", "queue_status")) + ("kopf", "aiohttp", "kubernetes")
PURE_ADAPTER = ("k8s/records.py", "k8s/phases.py", "k8s/reports.py", "k8s/jobrecords.py", "k8s/resources.py",
                "k8s/timestamps.py")


CONTRACTS = (
    Contract(
        "the core imports only the standard library",
        ("core",),
        lambda m: m.split(".")[0] in STDLIB or _under(m, "gputask.core"),
    ),
    Contract(
        "the simulator imports no operator or emulator code",
        ("sim",),
        lambda m: not _under(m, "gputask.k8s", "gputask.testing", "kopf"),
    ),
    Contract(
        "the manifests import no operator, simulator or emulator code",
        ("manifests",),
        lambda m: not _under(m, "gputask.k8s", "gputask.sim", "gputask.testing", "kopf"),
    ),
    Contract(
        "only the demo imports gputask.testing",
        ("",),
        lambda m: not _under(m, "gputask.testing"),
        exempt=("testing", "demo.py"),
    ),
    Contract(
        "the agent imports only itself, the core, the configuration and the API client",
        ("agent",),
        lambda m: not _under(m, "gputask", "kopf")
        or _under(m, "gputask.agent", "gputask.core", "gputask.config", "gputask.k8s.client") or m == "gputask",
    ),
    Contract(
        "the adapter's records, phase changes, reports and API vocabulary import no I/O module",
        PURE_ADAPTER,
        lambda m: not _under(m, *IO_MODULES),
    ),
    Contract(
        "the workload interface imports neither the controller nor an I/O module",
        ("k8s/workload.py",),
        lambda m: not _under(m, *IO_MODULES),
    ),
)


def imports_of(path: Path, package: str) -> set[str]:
    """Absolute names of the modules ``path`` (module ``package``-relative) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            if base in ("gputask", "gputask.k8s"):  # ``from gputask.k8s import writer`` imports that module
                found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def violations(root: Path, contract: Contract) -> list[str]:
    """``path: module`` for every import under ``root`` (the gputask folder) that breaks ``contract``."""
    out = []
    for scope in contract.scope:
        paths = [root / scope] if scope.endswith(".py") and (root / scope).exists() else (root / scope).rglob("*.py")
        for path in sorted(paths):
            relative = path.relative_to(root)
            if any(str(relative) == e or relative.parts[0] == e for e in contract.exempt):
                continue
            package = ".".join(("gputask", *relative.parts[:-1]))
            out += [f"{relative}: {m}" for m in sorted(imports_of(path, package)) if not contract.allowed(m)]
    return out


def test_the_package_keeps_every_contract() -> None:
    """No module of operator/gputask breaks an import contract."""
    assert {c.name: violations(PACKAGE, c) for c in CONTRACTS} == {c.name: [] for c in CONTRACTS}


def test_each_contract_catches_a_planted_violation(tmp_path: Path) -> None:
    """A module planted in each part with a forbidden import is reported by that part's contract, alone."""
    planted = {
        "core/bad.py": "import kubernetes\nfrom ..k8s import client\n",
        "sim/bad.py": "from gputask.k8s.convert import x\n",
        "manifests/bad.py": "from ..sim import scenario\n",
        "agent/bad.py": "from gputask.testing import FakeKubeClient\nfrom gputask.k8s.controller import C\n",
        "k8s/records.py": "from gputask.k8s.client import ApiError\nfrom gputask.k8s.names import fit_name\n",
        "k8s/reports.py": "def f():\n    from gputask.k8s import writer\n",  # inside a function, a submodule
        "k8s/workload.py": "from gputask.k8s.controller import Controller\nfrom gputask.k8s.jobs import build_job\n",
    }
    for relative, text in planted.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert {c.name: violations(tmp_path, c) for c in CONTRACTS} == {
        "the core imports only the standard library": [
            "core/bad.py: gputask.k8s", "core/bad.py: gputask.k8s.client", "core/bad.py: kubernetes"],
        "the simulator imports no operator or emulator code": ["sim/bad.py: gputask.k8s.convert"],
        "the manifests import no operator, simulator or emulator code": ["manifests/bad.py: gputask.sim"],
        "only the demo imports gputask.testing": ["agent/bad.py: gputask.testing"],
        "the agent imports only itself, the core, the configuration and the API client": [
            "agent/bad.py: gputask.k8s.controller", "agent/bad.py: gputask.testing"],
        "the adapter's records, phase changes, reports and API vocabulary import no I/O module": [
            "k8s/records.py: gputask.k8s.client", "k8s/reports.py: gputask.k8s.writer"],
        "the workload interface imports neither the controller nor an I/O module": [
            "k8s/workload.py: gputask.k8s.controller"],
    }


MAX_LINES = 600
MAX_METHODS = 30
WRITES = frozenset({"create", "patch", "replace", "delete"})
WRITERS = ("k8s/writer.py", "k8s/leader.py")


def write_calls(root: Path) -> list[str]:
    """``path:line`` of each call of ``<...client>.create/patch/replace/delete`` in ``k8s/`` outside the writer and
    the Lease's elector."""
    out = []
    for path in sorted((root / "k8s").rglob("*.py")):
        relative = str(path.relative_to(root))
        if relative in WRITERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES):
                continue
            target = node.func.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name.endswith("client"):
                out.append(f"{relative}:{node.lineno}")
    return out


def _core_modules(root: Path) -> dict[str, Path]:
    """Module name -> file of every module under ``root``/core (a package by its ``__init__``)."""
    out = {}
    for path in sorted((root / "core").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(("gputask", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        out[name] = path
    return out


def core_imports(root: Path) -> dict[str, set[str]]:
    """The core's import graph from the source (``TYPE_CHECKING`` imports included): module -> the core modules it
    imports (``from gputask.core import policies`` names the submodule; any other name, the package)."""
    modules = _core_modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle through each module that lies on one, each as a path that ends where it starts
    (depth-first search; empty when the graph has none)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    out: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                out.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return out


def oversized(root: Path) -> list[str]:
    """Each module of ``core/`` and ``k8s/`` over MAX_LINES lines and each class there over MAX_METHODS methods
    (functions defined in its body)."""
    out = []
    for path in sorted([*(root / "core").rglob("*.py"), *(root / "k8s").rglob("*.py")]):
        text, relative = path.read_text(), path.relative_to(root)
        if len(text.splitlines()) > MAX_LINES:
            out.append(f"{relative}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > MAX_METHODS:
                    out.append(f"{relative}: class {node.name} has {len(methods)} methods")
    return out


def test_only_the_writer_sends_writes() -> None:
    """No adapter module but the writer and the Lease's elector calls a client's create, patch, replace or
    delete."""
    assert write_calls(PACKAGE) == []


def test_the_write_rule_catches_a_planted_write(tmp_path: Path) -> None:
    """A client write planted outside the writer is reported; the writer's own and a dict's ``pop`` are not."""
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "bad.py").write_text("async def f(self):\n    await self.writer.client.patch(X, 'n', {})\n"
                                             "    await client.delete(X, 'n')\n    d.update({})\n")
    (tmp_path / "k8s" / "writer.py").write_text("async def f(self):\n    await self.client.create(X, {})\n")
    assert write_calls(tmp_path) == ["k8s/bad.py:2", "k8s/bad.py:3"]


def test_core_and_adapter_keep_their_size_limits() -> None:
    """No module of core/ or k8s/ is over 600 lines, no class there over 30 methods."""
    assert oversized(PACKAGE) == []


def test_the_size_rule_catches_a_planted_giant(tmp_path: Path) -> None:
    """A module of 601 lines and a class of 31 methods are reported."""
    (tmp_path / "k8s").mkdir()
    (tmp_path / "core").mkdir()
    (tmp_path / "k8s" / "long.py").write_text("x = 1\n" * 601)
    (tmp_path / "core" / "wide.py").write_text("class C:\n" + "".join(f"    def m{i}(self): ...\n" for i in range(31)))
    assert oversized(tmp_path) == ["core/wide.py: class C has 31 methods", "k8s/long.py: 601 lines"]


def test_the_core_has_no_import_circle() -> None:
    """No circle among the core's modules (not even through ``TYPE_CHECKING``)."""
    assert import_cycles(core_imports(PACKAGE)) == []


def test_the_circle_rule_catches_planted_circles(tmp_path: Path) -> None:
    """A circle planted through a ``TYPE_CHECKING`` import and one through the package are each reported."""
    core = tmp_path / "core"
    core.mkdir()
    (core / "__init__.py").write_text("from gputask.core.b import B\n")
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gputask.core.b import B\n"
    (core / "a.py").write_text(guarded)
    (core / "b.py").write_text("from . import a\nfrom gputask.core import B\n")
    assert import_cycles(core_imports(tmp_path)) == [
        ["gputask.core", "gputask.core.b", "gputask.core"],
        ["gputask.core.b", "gputask.core.a", "gputask.core.b"],
    ]
