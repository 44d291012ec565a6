"""Import contracts between the parts of the package, each shown to catch a planted violation.

- the core imports only the standard library (and itself): it stays pure and fast;
- the simulator imports no operator code (``gputask.k8s``), no emulator and no kopf;
- the manifests (conversion shared by operator, simulator and emulator) import none of those three;
- nothing but the demo imports the emulator and fakes (``gputask.testing``); tests may.
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
