"""The deterministic power-loss simulation (tests/faults/simulation.py) as CI runs it: a budget of
seeds, each with no violation; a seed that replays to the same history, in this process and from
the command; and a disk whose fsync does nothing, which the simulation must catch.

A failing seed replays with `python -m tests.faults.simulation --seed N` (--trace prints every
request and answer). Everything runs in virtual time: no test sleeps.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.faults.simulation import run_seed

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
# About 0.3 s a seed on a 2-core machine: the whole file stays within 40 s.
CI_SEEDS = range(75)
REPLAY_SEED = 7
CONTROL_SEEDS = range(6)


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_seed_has_no_violation(seed):
    report = run_seed(seed)
    assert report.violations == [], (
        f"replay with: python -m tests.faults.simulation --seed {seed}\n{report.summary()}\n"
        + "\n".join(json.dumps(v, default=str)[:2000] for v in report.violations[:5]))
    # The seed did what it is there for: crashes and restarts under a workload, every history checked.
    assert report.crashes >= 2 and report.restarts >= 2, report.summary()
    assert report.ops > 500, report.summary()
    assert report.histories["kv key"] == 3, report.summary()
    assert report.histories["lock name"] == 2, report.summary()
    assert report.histories["queue"] == 1, report.summary()


def test_a_seed_replays_to_the_same_history():
    first = run_seed(REPLAY_SEED)
    again = run_seed(REPLAY_SEED)
    assert first.digest == again.digest
    assert first.trace == again.trace
    # Not a digest of nothing: the run had requests in flight at its crashes, and another seed differs.
    assert first.unknown > 0 and first.crashes >= 3, first.summary()
    assert run_seed(REPLAY_SEED + 1).digest != first.digest


def test_the_command_replays_the_seed_the_tests_ran():
    report = run_seed(REPLAY_SEED)
    done = subprocess.run([sys.executable, "-m", "tests.faults.simulation", "--seed", str(REPLAY_SEED)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"seed={REPLAY_SEED}: " in done.stdout
    assert f"digest {report.digest}" in done.stdout, (report.summary(), done.stdout)


def test_a_disk_whose_fsync_does_nothing_is_caught():
    """Negative control: with fsyncs that make nothing durable, a power loss takes back what the
    server acknowledged. Every seed must find violations, and among them acknowledged KV writes
    that a later read no longer sees (a KV history that is not linearizable)."""
    kinds = set()
    for seed in CONTROL_SEEDS:
        report = run_seed(seed, control="fsync_does_nothing")
        assert report.violations, f"seed {seed}: the lying disk went unnoticed\n{report.summary()}"
        kinds |= {violation["kind"] for violation in report.violations}
    assert "not_linearizable" in kinds, kinds


def test_the_command_exits_1_on_a_violation():
    done = subprocess.run([sys.executable, "-m", "tests.faults.simulation", "--seed", "0",
                           "--control", "fsync_does_nothing"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "violation: " in done.stdout and "seeds with violations: 0" in done.stdout, done.stdout
