"""`python -m bench --cluster 2`: a leader + sync standby Queen cluster measured beside single-node
Queen. Speed is never asserted (it lives in bench/); only that the cluster comes up, its runs go
to the leader without errors, and the report sets it beside Queen with the standby's CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import __main__ as bench_main
from bench import cluster, report
from tests import system_tools

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cluster_without_etcd_is_reported_not_installed(monkeypatch):
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)
    args = bench_main.build_parser().parse_args(["--peers", "none", "--cluster", "2"])
    systems, missing = bench_main.chosen_systems(args)
    assert systems == ["queen"]
    assert missing["queen-cluster2"].startswith("not installed: no `etcd`")
    lines = report._cluster_section({"peers_missing": missing, "cluster_comparison": []})
    assert "**not installed: no `etcd`" in "\n".join(lines)


def test_cluster_bench_runs_against_the_leader_beside_single_queen(tmp_path):
    system_tools.require("etcd", "the bench's cluster run (python -m bench --cluster 2)")
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--peers", "none", "--cluster", "2", "--workloads", "kv-put",
         "--ops", "1", "--duration", "0.5", "--out", str(out), "--data-parent", str(tmp_path), "--no-chart"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    document = json.loads((out / "results.json").read_text())
    assert document["systems"] == ["queen", "queen-cluster2"]
    runs = {run["system"]: run for run in document["runs"]}
    assert set(runs) == {"queen", "queen-cluster2"}
    for run in runs.values():
        assert run["errors"] == {} and run["undrained"] == 0 and run["rate_per_s"] > 0, run["error_samples"]
    on_cluster = runs["queen-cluster2"]
    assert {"server", "standby", "etcd", "generator"} <= set(on_cluster["cpu"]["processes_pct_of_core"])
    assert on_cluster["standby_us_per_request"] > 0  # the standby fsynced and applied what the leader shipped
    assert on_cluster["wal"]["records_per_s"] > 0  # the leader's own /metrics were read
    [row] = document["cluster_comparison"]
    assert row["workload"] == "kv-put" and row["rate_ratio"] == round(row["cluster_rate"] / row["single_rate"], 3)
    # Every node and etcd stopped cleanly, each by its own pid.
    names = {server["name"]: server for server in document["servers"]}
    for name in ("queen-cluster2-n1", "queen-cluster2-n2", "queen-cluster2-etcd"):
        assert names[name]["exit_code"] in (0, -15) and not names[name]["killed"]
    assert "## Queen cluster ÷ single node" in (out / "results.md").read_text()
