"""The compiled core (queen/_native.py, setup.py): which build runs is decided all or nothing, a
stale extension never runs in place of edited source, and QUEEN_PURE=1 forces the .py files."""

import importlib.machinery
import os
import shutil
import subprocess
import sys

import pytest

from queen import _native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _loaded_from() -> dict:
    """module -> whether it was loaded from an extension, for every compiled-core module."""
    import importlib
    files = {name: importlib.import_module(name).__file__ for name in _native.MODULES}
    return {name: not file.endswith(".py") for name, file in files.items()}


def test_every_hot_module_comes_from_the_build_the_process_reports():
    assert set(_loaded_from().values()) == {_native.COMPILED}


def test_ci_with_a_compiler_runs_compiled():
    """.ci/run sets QUEEN_EXPECT_COMPILED=1 where a C compiler is present: a build that fell back to
    pure Python there (a type error mypyc refused, a broken build) fails here, not silently."""
    if os.environ.get("QUEEN_EXPECT_COMPILED") != "1":
        pytest.skip("QUEEN_EXPECT_COMPILED is not set")
    assert _native.COMPILED, _native.WHY


def _run(code: str, cwd: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


PROBE = "import queen._native as n, queen.core.kv as kv; print(n.COMPILED, n.WHY.split()[0], kv.__file__.endswith('.py'))"


def test_queen_pure_at_run_time_loads_the_py_files():
    done = _run(PROBE, ROOT, QUEEN_PURE="1")
    assert done.returncode == 0, done.stderr
    compiled, *_, from_py = done.stdout.split()
    assert (compiled, from_py) == ("False", "True")


def test_an_edited_source_wins_over_its_stale_extension(tmp_path):
    """A copy of the package whose kv.py changed after the build: the .py files run, for every
    compiled module, and stderr says why."""
    if not _native.COMPILED:
        pytest.skip("this process runs the pure-Python core: no extension to go stale")
    copy = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "queen"), copy / "queen", ignore=shutil.ignore_patterns("__pycache__"))
    for name in os.listdir(ROOT):  # mypyc's shared library of the group sits beside the package
        if name.startswith("queen_native__mypyc") and name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            shutil.copy(os.path.join(ROOT, name), copy / name)
    fresh = _run(PROBE, str(copy))
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split()[0] == "True"
    kv = copy / "queen" / "core" / "kv.py"
    kv.write_text(kv.read_text() + "\n# edited after the build\n")
    stale = _run(PROBE + "; import queen.core.locks as l; print(l.__file__.endswith('.py'))", str(copy))
    assert stale.returncode == 0, stale.stderr
    compiled, why_first, from_py, locks_from_py = stale.stdout.split()
    assert (compiled, why_first, from_py, locks_from_py) == ("False", "stale", "True", "True")
    assert "queen.core.kv changed since the compiled build" in stale.stderr
