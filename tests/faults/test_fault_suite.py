"""The fault suite's CI subset: each workload against a real server crashed by SIGKILL and by power
loss, with 0 violations expected; and each negative control (a server with a deliberate bug),
which must be caught. `python -m tests.faults --minutes N` runs the same, longer (the soak)."""

from __future__ import annotations

import signal

import pytest

from tests.faults.controls import CONTROLS, run_control
from tests.faults.workloads import AUTH_VARIABLE, OUTCOMES, WORKLOADS, start_target

# (kills, scale) of each workload in CI: a few crashes each, a few seconds each.
CI_RUNS = {"kv": (4, 1.0), "locks": (3, 0.3), "queues": (3, 0.4), "timers": (3, 1.0), "recurring": (3, 1.0),
           "transactions": (4, 0.5)}
SEED = 20261201


@pytest.mark.parametrize("name", sorted(CI_RUNS))
def test_workload_keeps_its_promises_across_crashes_and_power_loss(tmp_path, name):
    kills, scale = CI_RUNS[name]
    outcome = WORKLOADS[name](str(tmp_path), SEED, kills=kills, scale=scale)
    OUTCOMES.append((outcome, None))
    assert outcome.violations == [], outcome.violations[:3]
    # A failpoint reached while the server recovers is one crash more than the kills planned.
    assert sum(outcome.faults.values()) >= kills and outcome.ops > 100, outcome.summary()


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_negative_control_is_caught(tmp_path, control):
    outcome = run_control(control, str(tmp_path), SEED)
    OUTCOMES.append((outcome, bool(outcome.violations)))
    assert outcome.violations, f"the suite did not catch {control}: {outcome.summary()}"


def test_a_server_that_dies_on_its_own_is_a_violation_not_a_crash_of_ours(tmp_path):
    """The kill loop counts a crash it (or an armed failpoint) caused; a server found dead
    otherwise, here one that exited by itself, is reported, never counted as a SIGKILL."""
    target = start_target(str(tmp_path))
    try:
        target.server.process.send_signal(signal.SIGTERM)  # a clean exit the loop did not ask for
        target.server.process.wait(30)
        target.crash(power_loss=False)
        assert [(e["kind"], e["returncode"]) for e in target.unexpected_exits] == [("server_exited", 0)]
        assert target.faults == {"sigkill": 1}  # the restart still happened, as a crash would
        target.server.kill()  # and one at the failpoint it was armed with is a crash of ours
        target.armed = "fsync"
        target.crash(power_loss=True)
        assert len(target.unexpected_exits) == 1 and target.faults["failpoint_fsync+power_loss"] == 1
    finally:
        target.server.kill()


@pytest.mark.parametrize("name", ["kv", "locks", "queues", "transactions"])
def test_workload_keeps_its_promises_with_auth_on(tmp_path, monkeypatch, name):
    """The same workloads, every client a writer of a named tenant: its names are stored under the
    tenant's prefix through crashes, power loss, replay and snapshots."""
    monkeypatch.setenv(AUTH_VARIABLE, "1")
    kills, scale = CI_RUNS[name]
    outcome = WORKLOADS[name](str(tmp_path), SEED + 1, kills=max(2, kills - 1), scale=scale)
    OUTCOMES.append((outcome, None))
    assert outcome.violations == [], outcome.violations[:3]
    assert outcome.ops > 100, outcome.summary()
    assert "auth=on" in (tmp_path / "data.log").read_text()
