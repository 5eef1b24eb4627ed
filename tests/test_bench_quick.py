"""`python -m bench --quick` against Queen alone: the harness runs end to end and its report has
the promised shape. Speed is never asserted here (speed lives in bench/); only that
every figure the issue asks for is present, and that the runs saw no errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_bench_against_queen_alone_writes_json_markdown_and_chart(tmp_path):
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--peers", "none", "--out", str(out), "--data-parent", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]

    document = json.loads((out / "results.json").read_text())
    machine = document["machine"]
    for field in ("cpu_model", "cpus_online", "kernel", "git_commit"):
        assert field in machine
    assert machine["disk_fsync"]["fsyncs_per_s"] > 0
    assert document["systems"] == ["queen"]
    assert document["peers_missing"] == {}

    runs = document["runs"]
    assert {run["workload"] for run in runs} == {"lock-cycle", "lock-hot-wait", "kv-put", "kv-cas", "txn-guarded",
                                                 "queue-push", "queue-cycle", "txn-step", "timer-schedule"}
    assert {(run["workload"], run["ops"]) for run in runs} >= {("lock-cycle", 1), ("lock-cycle", 64)}
    for run in runs:
        assert run["system"] == "queen"
        assert run["errors"] == {} and run["undrained"] == 0, (run["workload"], run["error_samples"])
        assert run["rate_per_s"] > 0 and run["unit"] in run["units_per_s"]
        for percentile in ("p50_us", "p99_us", "p99_9_us"):
            assert run["latency"][percentile] > 0
        assert {"server", "generator"} <= set(run["cpu"]["processes_pct_of_core"])
        assert run["bottleneck"] in ("server CPU", "generator", "disk", "latency (fsync waits)")
        assert run["fsync"]["fsyncs_per_s"] >= 0
    lock_cycle = next(run for run in runs if run["workload"] == "lock-cycle")
    assert {"pairs", "acquired"} <= set(lock_cycle["units_per_s"])
    hot = next(run for run in runs if run["workload"] == "lock-hot-wait")
    assert "acquired" in hot["units_per_s"]

    assert {row["workload"] for row in document["comparison"]} == {run["workload"] for run in runs}
    # No peers: no verdict on a ratio; the one absolute goal (durable push at 64 messages per
    # request) has one, whichever it is on this machine.
    verdicts = {goal["goal"]: goal["met"] for goal in document["goals"]}
    push_goal = next(name for name in verdicts if name.startswith("queue-push, 64 messages/request"))
    assert verdicts.pop(push_goal) in (True, False)
    assert set(verdicts.values()) == {None}
    queue_push = next(run for run in runs if run["workload"] == "queue-push")
    assert queue_push["unit"] == "messages"

    markdown = (out / "results.md").read_text()
    assert "lock-cycle" in markdown and "bound by" in markdown and "fsyncs/s" in markdown
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert any("no chart" in note for note in document["notes"])


def test_quick_bench_over_tls_runs_without_errors(tmp_path):
    """--tls: Queen and the baseline serve HTTPS with a throwaway certificate, and the generator
    (selectors engine) speaks it."""
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--peers", "none", "--tls", "--workloads", "kv-put,lock-cycle,baseline-http",
         "--duration", "0.5", "--out", str(out), "--data-parent", str(tmp_path), "--no-chart"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {(run["system"], run["workload"]) for run in runs} == {
        ("queen", "kv-put"), ("queen", "lock-cycle"), ("baseline", "baseline-http")}
    for run in runs:
        assert run["errors"] == {} and run["undrained"] == 0 and run["rate_per_s"] > 0, run["error_samples"]
    assert "tls=on" in (out / "server-queen.log").read_text()
