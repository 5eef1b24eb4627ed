"""Negative controls: each deliberate bug of tests/faults/sut.py, run under the workload that must
catch it. A control the suite does not catch fails the suite: it would mean a checker (or the
fault that exposes the bug) has gone blind.
"""

from __future__ import annotations

import os

from tests.faults.workloads import Outcome, run_kv, run_locks, run_queues

# control -> (workload, kills, share of the kills that lose power, scale). The bug comes in with
# the first start; the first crash after it (or, for the lease bugs, no crash at all) shows it.
# Controls crash at the kill loop's moments only (no failpoints), so each run is the one designed.
CONTROLS = {
    # Answers go out before their fsync: the power loss drops acknowledged writes.
    "ack_before_fsync": (run_kv, 2, 1.0, 1.0),
    # A new segment's directory entry is never made durable: power loss drops the whole file.
    "skip_dir_fsync": (run_kv, 1, 1.0, 1.0),
    # Versions restart below the log's after a crash: a key's version goes back. One crash only:
    # the next start refuses the log, whose versions no longer rise.
    "reuse_version": (run_kv, 1, 0.0, 1.0),
    # Leases end a tick early: a walked-away holder's permit is handed on inside its lease.
    "lease_early": (run_locks, 0, 0.0, 1.0),
    # A pop takes a partition under a live lease: two consumers hold it at once.
    "double_grant": (run_queues, 0, 0.0, 0.5),
}


# Runs (seeds seed, seed+1, ...) a control may take to be caught. An early handover shows only
# when a waiter is granted more than the checker's tolerance before the old lease's end, which a
# loaded machine's latency can hide in one run; three runs have caught it every time measured.
ATTEMPTS = 3


def run_control(name: str, work_dir: str, seed: int) -> Outcome:
    """The control's workload against a server with that bug; caught when it has violations."""
    workload, kills, power_loss_share, scale = CONTROLS[name]
    for attempt in range(ATTEMPTS):
        attempt_dir = os.path.join(work_dir, str(attempt))
        os.makedirs(attempt_dir, exist_ok=True)
        outcome = workload(attempt_dir, seed + attempt, kills=kills, control=name, scale=scale,
                           power_loss_share=power_loss_share, failpoint_share=0.0)
        if outcome.violations:
            break
    return outcome
