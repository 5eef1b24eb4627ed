"""The house rules of imports, read from the source (every import statement, those inside
functions too): the core is pure, lower floors never import higher ones, and the SDK and the server
share no code, so `pip install` of one never needs the other."""

import ast
from pathlib import Path

import pytest

QUEEN = Path(__file__).resolve().parent.parent / "queen"
# Modules the pure core must never import: I/O, clocks, randomness, concurrency, logging.
IMPURE = {"trio", "anyio", "asyncio", "socket", "os", "time", "random", "logging", "threading", "select",
          "subprocess", "signal", "io", "shutil"}
# package -> the queen packages it must not import
FORBIDDEN = {
    "core": {"queen.runtime", "queen.http", "queen.wal", "queen.client", "queen.cli", "queen.config", "queen.clock",
             "queen.testing"},
    "wal": {"queen.runtime", "queen.http", "queen.client", "queen.cli", "queen.testing"},
    "http": {"queen.runtime", "queen.wal", "queen.client", "queen.cli", "queen.testing"},
    "runtime": {"queen.client", "queen.cli", "queen.testing"},
    "client": {"queen.core", "queen.runtime", "queen.http", "queen.wal", "queen.cli", "queen.config", "queen.clock",
               "queen.errors", "queen.testing"},
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


def test_the_core_is_pure():
    for path in sorted((QUEEN / "core").rglob("*.py")):
        impure = _hits(imports(path), IMPURE)
        assert not impure, (path.relative_to(QUEEN.parent), impure)


def test_the_command_loads_neither_side_until_a_command_runs():
    """`queen serve` must not load the SDK, and a client command not the server: the cli package
    imports either only inside the function that runs it."""
    for path in sorted((QUEEN / "cli").rglob("*.py")):
        loaded = _hits(imports(path, top_level_only=True), {"queen.client", "queen.runtime", "trio", "anyio"})
        assert not loaded, (path.relative_to(QUEEN.parent), loaded)
