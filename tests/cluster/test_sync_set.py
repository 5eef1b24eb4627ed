"""A two-node strict cluster and its sync set, with real processes: one etcd member, two `queen serve
--cluster` nodes (tests/cluster/harness), the client's calls straight to the leader's own port.

- The follower SIGKILLed: a write answers 503 sync_unavailable within --sync-timeout (2 s here),
  and /healthz, GET /api/v1/cluster, /metrics and `queen cluster status` show the outage; once the
  follower runs again writes are answered, and every acknowledged write is there.
- A leader whose follower has not joined yet says degraded until it does.
- A follower started while a client writes as fast as it can joins the sync set (the two nodes
  50 ms apart, so that the follower is never level with the leader at any instant).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

from tests import system_tools
from tests.cluster.harness.etcd import EtcdCluster
from tests.cluster.harness.load import LoadProcess
from tests.cluster.harness.nodes import QueenCluster, cluster_supported

pytestmark = pytest.mark.skipif(not cluster_supported(), reason="queen serve --cluster is not in this build")

SYNC_TIMEOUT_S = 2
CALL_TIMEOUT_S = 30  # far past the bound: without it, the write got no answer at all
# Under the load below it joined in 1.1-1.5 s; by the old rule (lag 0 at a poll) not in 20 s, 3 runs of 3.
JOIN_BOUND_S = 20
LOAD_CONNECTIONS = 16
LINK_DELAY_MS = 50  # each way, on the follower's replication link


def call(url: str, method: str, path: str, body: dict | None = None, timeout_s: float = CALL_TIMEOUT_S):
    """(status, headers, decoded body) of one call to one node, no redirect followed."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        connection.request(method, path, json.dumps(body) if body is not None else None,
                           {"content-type": "application/json"})
        answer = connection.getresponse()
        raw = answer.read()
        headers = {name.lower(): value for name, value in answer.getheaders()}
    finally:
        connection.close()
    try:
        return answer.status, headers, json.loads(raw)
    except ValueError:
        return answer.status, headers, raw.decode(errors="replace")


def put(url: str, key: str, value) -> tuple[int, dict, dict]:
    return call(url, "PUT", f"/api/v1/kv/h/{key}", {"value": value, "forever": True})


def details(body: dict) -> dict:
    return body.get("details") or body["error"]["details"]


def cluster_status(*urls: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queen", "cluster", "status", "--url", ",".join(urls)],
                          capture_output=True, text=True, timeout=60)


def metric(url: str, name: str) -> str:
    """The line of /metrics that starts with name (its value and labels), or ''."""
    status, _, text = call(url, "GET", "/metrics")
    assert status == 200
    return next((line for line in text.splitlines() if line.startswith(name)), "")


def promtool_accepts(text: str) -> None:
    promtool = system_tools.find("promtool")
    if promtool is None:
        print(system_tools.missing_message("promtool", "`promtool check metrics` on a cluster node's /metrics"),
              file=sys.stderr)
        return
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # polling real processes
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def in_sync(cluster: QueenCluster, leader: str, follower: str):
    view = cluster.status(leader) or {}
    return view.get("sync") == [follower] and view.get("degraded") is False and view


def test_a_strict_pair_whose_follower_is_killed_answers_sync_unavailable_and_shows_it_until_it_is_back(tmp_path):
    work = str(tmp_path)
    with EtcdCluster(work, 1) as etcd:
        cluster = QueenCluster(work, etcd, 2, sync_mode="strict", extra_args=("--sync-timeout", str(SYNC_TIMEOUT_S)))
        try:
            cluster.start()
            leader = cluster.wait_leader()
            follower = next(node for node in cluster.nodes if node != leader)
            url = cluster.nodes[leader].direct_url
            wait_until(lambda: in_sync(cluster, leader, follower), JOIN_BOUND_S, "the follower in the sync set")
            acked = {}
            for i in range(20):
                status, _, body = put(url, f"k{i}", i)
                assert status == 200, body
                acked[f"k{i}"] = (i, body["version"])
            cluster.kill(follower)
            started = time.monotonic()
            status, headers, body = put(url, "unknown", "x")
            waited_s = time.monotonic() - started
            print(f"\nsync_unavailable after {waited_s:.2f} s (--sync-timeout {SYNC_TIMEOUT_S})", file=sys.stderr)
            assert status == 503 and body["code"] == "sync_unavailable", body
            assert details(body)["applied"] == "unknown" and details(body)["retryAfterMs"] == 1000
            assert headers["retry-after"] == "1"
            # Known now: refused at once, nothing applied.
            status, _, body = put(url, "refused", "y")
            assert status == 503 and body["code"] == "sync_unavailable" and details(body)["applied"] is False
            # Everywhere an operator looks.
            status, _, body = call(url, "GET", "/healthz")
            assert status == 503 and body["status"] == "sync_unavailable", body
            view = cluster.status(leader)
            assert view["syncUnavailable"] is True and view["serving"] is True and view["role"] == "leader"
            assert metric(url, "queen_cluster_sync_unavailable").endswith(" 1")
            promtool_accepts(call(url, "GET", "/metrics")[2])
            ran = cluster_status(cluster.nodes[leader].url, cluster.nodes[follower].url)
            assert ran.returncode == 69, (ran.stdout, ran.stderr)
            assert "sync_unavailable" in ran.stderr and follower in ran.stderr
            # The follower runs again: once it has caught up, writes are answered; nothing acked is lost.
            cluster.start_node(follower)
            wait_until(lambda: put(url, "after", "z")[0] == 200, 60, "a write answered again")
            assert call(url, "GET", "/healthz")[0] == 200
            assert cluster.status(leader)["syncUnavailable"] is False
            assert metric(url, "queen_cluster_sync_unavailable").endswith(" 0")
            assert cluster_status(cluster.nodes[leader].url, cluster.nodes[follower].url).returncode == 0
            final = cluster.final_rows([*acked, "refused"], ns="h")
            assert {key: (row["value"], row["version"]) for key, row in final.items() if key != "refused"} == acked
            assert final["refused"] is None
            assert cluster.wait_converged() >= max(version for _, version in acked.values())
        finally:
            cluster.stop()


def test_a_strict_leader_says_degraded_until_its_follower_has_joined(tmp_path):
    work = str(tmp_path)
    with EtcdCluster(work, 1) as etcd:
        cluster = QueenCluster(work, etcd, 2, sync_mode="strict")
        try:
            cluster.start_node("n1")
            assert cluster.wait_leader() == "n1"
            url = cluster.nodes["n1"].direct_url
            view = cluster.status("n1")
            assert view["degraded"] is True and view["sync"] == [] and view["syncUnavailable"] is False
            assert json.loads(etcd.get("/queen/t/sync"))["degraded"] is True
            assert metric(url, "queen_cluster_degraded").endswith(" 1")
            ran = cluster_status(cluster.nodes["n1"].url)
            assert ran.returncode == 1 and "degraded" in ran.stderr, (ran.stdout, ran.stderr)
            # Before a follower first joins, strict acknowledges on the leader's disk alone (README).
            assert put(url, "alone", 1)[0] == 200
            cluster.start_node("n2")
            wait_until(lambda: in_sync(cluster, "n1", "n2"), JOIN_BOUND_S, "n2 in the sync set")
            assert json.loads(etcd.get("/queen/t/sync"))["degraded"] is False
            assert metric(url, "queen_cluster_degraded").endswith(" 0")
            ran = cluster_status(cluster.nodes["n1"].url, cluster.nodes["n2"].url)
            assert ran.returncode == 0, (ran.stdout, ran.stderr)
        finally:
            cluster.stop()


def test_a_follower_started_under_a_full_write_load_joins_the_sync_set(tmp_path):
    work = str(tmp_path)
    with EtcdCluster(work, 1) as etcd:
        cluster = QueenCluster(work, etcd, 2, sync_mode="strict")
        load = None
        try:
            cluster.start_node("n1")
            assert cluster.wait_leader() == "n1"
            url = cluster.nodes["n1"].direct_url
            load = LoadProcess(url, work, connections=LOAD_CONNECTIONS).start()
            wait_until(lambda: load.progress()["ok"] >= 2000, 60, "the load under way")
            # 50 ms between the nodes, as between sites: the follower's ack of the newest frame comes
            # long after the next one is written, so at no instant is it level with the leader
            # (on one machine it sometimes is, by chance, and the old rule let it join then).
            cluster.nodes["n2"].dial["n1"].delay(LINK_DELAY_MS)
            started, before = time.monotonic(), load.progress()["ok"]
            cluster.start_node("n2")
            wait_until(lambda: in_sync(cluster, "n1", "n2"), JOIN_BOUND_S, "n2 in the sync set under load")
            joined_s, during = time.monotonic() - started, load.progress()["ok"] - before
            print(f"\njoined under load after {joined_s:.2f} s; {during} writes meanwhile "
                  f"({during / joined_s:.0f}/s)", file=sys.stderr)
            assert during > 0, "the load went on while n2 joined"
            after = load.progress()["ok"]
            wait_until(lambda: load.progress()["ok"] >= after + 200, 60, "writes answered with n2 in the sync set")
            totals = load.stop()
            assert totals["codes"] == {}, totals  # nothing failed: a join is no outage
            assert in_sync(cluster, "n1", "n2"), "n2 stayed in the sync set"
            final = cluster.final_rows(sorted(totals["acked"]), ns="load")
            assert all(final[key]["value"] >= value for key, value in totals["acked"].items()), (final, totals)
        finally:
            if load is not None:
                load.kill()
            cluster.stop()
