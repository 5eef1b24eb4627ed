"""The house rules of imports, read from the source (every import statement, those inside
functions too): the core is pure, lower floors never import higher ones, and the SDK and the server
share no code, so `pip install` of one never needs the other."""

import ast
import sys
from pathlib import Path

import pytest

QUEEN = Path(__file__).resolve().parent.parent / "queen"
SDK = Path(__file__).resolve().parent.parent / "client" / "queen_client"
# What the SDK distribution (client/pyproject.toml) declares; everything else it imports is stdlib.
SDK_DEPENDENCIES = {"anyio", "h11", "orjson"}
# Modules the pure core must never import: I/O, clocks, randomness, concurrency, logging.
IMPURE = {"trio", "anyio", "asyncio", "socket", "os", "time", "random", "logging", "threading", "select",
          "subprocess", "signal", "io", "shutil"}
# package -> the queen packages it must not import
FORBIDDEN = {
    "core": {"queen.runtime", "queen.http", "queen.wal", "queen_client", "queen.cli", "queen.config", "queen.clock",
             "queen.testing"},
    "wal": {"queen.runtime", "queen.http", "queen_client", "queen.cli", "queen.testing"},
    "http": {"queen.runtime", "queen.wal", "queen_client", "queen.cli", "queen.testing"},
    "runtime": {"queen_client", "queen.cli", "queen.testing"},
}


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _hits(names: set[str], forbidden: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_a_floor_above_it_or_the_other_side(package):
    for path in sorted((QUEEN / package).rglob("*.py")):
        assert not _hits(imports(path), FORBIDDEN[package]), (path.relative_to(QUEEN.parent), _hits(imports(path), FORBIDDEN[package]))


def test_the_sdk_imports_only_itself_the_stdlib_and_its_declared_dependencies():
    """The SDK installs alone (client/pyproject.toml), so it must not reach into the server
    package `queen` (beside queen-mq, `queen` is not even ours) nor need an undeclared package."""
    paths = sorted(SDK.rglob("*.py"))
    assert len(paths) >= 10, paths
    for path in paths:
        tops = {name.split(".")[0] for name in imports(path)}
        strangers = tops - SDK_DEPENDENCIES - set(sys.stdlib_module_names) - {"queen_client", "__future__"}
        assert not strangers, (path.relative_to(SDK.parent.parent), strangers)


def test_the_core_is_pure():
    for path in sorted((QUEEN / "core").rglob("*.py")):
        impure = _hits(imports(path), IMPURE)
        assert not impure, (path.relative_to(QUEEN.parent), impure)


def test_the_command_loads_neither_side_until_a_command_runs():
    """`queen serve` must not load the SDK, and a client command not the server: the cli package
    imports either only inside the function that runs it."""
    for path in sorted((QUEEN / "cli").rglob("*.py")):
        loaded = _hits(imports(path, top_level_only=True), {"queen_client", "queen.runtime", "trio", "anyio"})
        assert not loaded, (path.relative_to(QUEEN.parent), loaded)
