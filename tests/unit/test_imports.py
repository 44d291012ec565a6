"""Import contracts between the parts of the package, each shown to catch a planted violation.

- the core imports only the standard library (and itself): it stays pure and fast;
- the simulator imports no operator code (``gputask.k8s``), no emulator and no kopf;
- the manifests (conversion shared by operator, simulator and emulator) import none of those three;
- nothing but the demo imports the emulator and fakes (``gputask.testing``); tests may;
- no import circle among the core's modules, and no core module over 600 lines or class over 30 methods
  (the scheduler split into cache, queue manager, cycle and view, issue 29).
Imports are read from the source (every ``import`` statement, ``TYPE_CHECKING`` ones included).
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
    return found


def violations(root: Path, contract: Contract) -> list[str]:
    """``path: module`` for every import under ``root`` (the gputask folder) that breaks ``contract``."""
    out = []
    for scope in contract.scope:
        for path in sorted((root / scope).rglob("*.py")):
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
        "agent/bad.py": "from gputask.testing import FakeKubeClient\n",
    }
    for relative, text in planted.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert {c.name: violations(tmp_path, c) for c in CONTRACTS} == {
        "the core imports only the standard library": ["core/bad.py: gputask.k8s", "core/bad.py: kubernetes"],
        "the simulator imports no operator or emulator code": ["sim/bad.py: gputask.k8s.convert"],
        "the manifests import no operator, simulator or emulator code": ["manifests/bad.py: gputask.sim"],
        "only the demo imports gputask.testing": ["agent/bad.py: gputask.testing"],
    }


CORE_MAX_LINES = 600
CORE_MAX_METHODS = 30


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
    """Core modules over :data:`CORE_MAX_LINES` lines and classes over :data:`CORE_MAX_METHODS` methods (functions
    defined in the class body, properties included)."""
    out = []
    for name, path in _core_modules(root).items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > CORE_MAX_LINES:
            out.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
                if methods > CORE_MAX_METHODS:
                    out.append(f"{name}.{node.name}: {methods} methods")
    return out


def test_the_core_has_no_import_circle_and_no_oversized_part() -> None:
    """No circle among the core's modules (not even through ``TYPE_CHECKING``); no module over 600 lines, no class
    over 30 methods."""
    assert (import_cycles(core_imports(PACKAGE)), oversized(PACKAGE)) == ([], [])


def test_the_core_contracts_catch_planted_violations(tmp_path: Path) -> None:
    """A circle planted through a ``TYPE_CHECKING`` import (and one through the package), a long module and a
    class with too many methods are each reported."""
    core = tmp_path / "core"
    core.mkdir()
    (core / "__init__.py").write_text("from gputask.core.b import B\n")
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gputask.core.b import B\n"
    (core / "a.py").write_text(guarded)
    (core / "b.py").write_text("from . import a\nfrom gputask.core import B\n" + "\n" * 600)
    methods = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(31))
    (core / "c.py").write_text(f"class Big:\n{methods}")
    assert import_cycles(core_imports(tmp_path)) == [
        ["gputask.core", "gputask.core.b", "gputask.core"],
        ["gputask.core.b", "gputask.core.a", "gputask.core.b"],
    ]
    assert oversized(tmp_path) == ["gputask.core.b: 602 lines", "gputask.core.c.Big: 31 methods"]
