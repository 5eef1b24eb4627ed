"""The code passes the project's ruff configuration (pyproject.toml), so CI checks style too."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    ruff = pytest.importorskip("ruff")
    del ruff
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "queen", "client", "tests", "bench"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
