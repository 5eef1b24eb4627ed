"""The cluster flags, the HTTP gating of a node that does not lead, the cluster routes, and the
`queen cluster` command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from queen.cli import build_parser, resolve_config
from queen.cli.cluster import format_table
from queen.config import Config, host_port, validate
from queen.core.limits import Limits
from queen.errors import QueenError
from queen.http.connection import HttpServer
from queen.http.routes import Api
from queen.http.wire import Request
from queen.runtime.metrics import render_cluster
from queen.testing import ServerProcess

CLUSTER_ARGS = ("--cluster", "t", "--node", "n1", "--etcd", "http://e:2379", "--advertise", "http://a:6632",
                "--replication-listen", "a:6642")
CLUSTER = dict(cluster="t", node_id="n1", etcd="http://127.0.0.1:2379,http://127.0.0.1:2380",
               advertise="http://10.0.0.1:6632", replication_listen="10.0.0.1:6642")


def test_cluster_flags_resolve_with_their_short_spellings():
    args = build_parser().parse_args(["serve", "--cluster", "t", "--node", "n1", "--etcd", "http://e:2379",
                                      "--advertise", "http://a:6632", "--replication-listen", "a:6642",
                                      "--leader-ttl", "2", "--sync-mode", "degrade", "--lease-grace", "3"])
    config = resolve_config(args, environ={})
    assert (config.cluster, config.node_id, config.leader_ttl_s, config.sync_mode, config.lease_grace_s) == (
        "t", "n1", 2.0, "degrade", 3.0)
    assert validate(config) == []
    assert config.sync_timeout_s == 5.0  # the default: below the SDK's and the CLI's 10 s timeout
    args = build_parser().parse_args(["serve", *CLUSTER_ARGS, "--sync-timeout", "2.5"])
    assert resolve_config(args, environ={}).sync_timeout_s == 2.5
    assert resolve_config(build_parser().parse_args(["serve", *CLUSTER_ARGS]),
                          environ={"QUEEN_SYNC_TIMEOUT_S": "4"}).sync_timeout_s == 4.0
    assert validate(Config(**CLUSTER, sync_timeout_s=0)) == ["sync timeout must be between 0.1 and 3600 seconds"]


def test_cluster_flags_are_checked():
    assert validate(Config()) == []  # alone: nothing asked
    assert validate(Config(**CLUSTER)) == []
    assert validate(Config(node_id="n1")) == ["--node is for a cluster node: give --cluster NAME too"]
    problems = validate(Config(cluster="t"))
    assert "--cluster needs --node too" in problems and "--cluster needs --etcd too" in problems
    bad = validate(Config(**{**CLUSTER, "etcd": "https://e:2379", "advertise": "a:1", "replication_listen": "a",
                             "leader_ttl_s": 0.5, "sync_mode": "lazy", "cluster": "a b"}))
    assert len(bad) == 6, bad
    assert host_port("[::1]:6642") == ("::1", 6642) and host_port("a") is None and host_port("a:65536") is None
    assert host_port("a:0") == ("a", 0)  # any free port: the node advertises the one it bound
    assert validate(Config(**{**CLUSTER, "replication_listen": "127.0.0.1:0", "advertise": "http://a:0"})) == []


class FakeCluster:
    def __init__(self, role="follower", serving=False, leader="http://leader:6632", epoch=42):
        self.role, self.serving, self.leader_advertise, self.epoch = role, serving, leader, epoch
        self.sync = None  # the coordinator's SyncKey while it leads or promotes
        self.calls = []

    def status(self):
        return {"cluster": "t", "node": "n2", "role": self.role, "epoch": self.epoch, "serving": self.serving,
                "leader": None, "sync": [], "degraded": False, "syncUnavailable": False, "lastVersion": 7,
                "followers": [
                    {"node": "n3", "connected": True, "ackedVersion": 5, "lagVersions": 2}]}

    async def switchover(self, to=None):
        self.calls.append(("switchover", to))
        return {"from": "n2", "to": to or "n3", "epoch": self.epoch, "lastVersion": 7}

    async def force_promote(self, node):
        self.calls.append(("force", node))
        return {"node": node, "syncEpoch": 50, "oldLeader": "n1", "nodeLastVersion": 5,
                "oldLeaderLastVersion": 9, "mayBeLost": 4}


class FakeRouter:
    class writer:  # noqa: N801 - stands for the router's writer
        durable_version = 11
        failed = None
        sync_refusal = None

    draining = False


def request(method: str, target: str, body: bytes = b"") -> Request:
    return Request(method.encode(), target.encode(), b"application/json", b"", body)


def api_with(cluster) -> Api:
    api = Api(FakeRouter(), Limits())
    api.cluster = cluster
    return api


async def test_a_follower_redirects_client_routes_to_the_leader_keeping_path_and_query():
    api = api_with(FakeCluster())
    answer = await api.handle(request("PUT", "/api/v1/kv/ns/k?x=1", b'{"value": 1}'))
    assert answer.status == 307
    assert dict(answer.headers)[b"location"] == b"http://leader:6632/api/v1/kv/ns/k?x=1"
    assert json.loads(answer.body)["code"] == "not_leader"
    answer = await api.handle(request("GET", "/api/v1/pop/queue/q?waitMs=5"))
    assert answer.status == 307


@pytest.mark.parametrize("role,code", [("follower", "no_leader"), ("starting", "no_leader"), ("fenced", "not_leader"),
                                       ("promoting", "not_leader")])
async def test_without_a_leader_to_send_to_the_answer_is_503(role, code):
    api = api_with(FakeCluster(role=role, leader=None))
    with pytest.raises(QueenError) as refused:
        await api.handle(request("POST", "/api/v1/kv", b'{"operations": []}'))
    assert refused.value.http_status == 503 and refused.value.code == code
    assert refused.value.details["retryAfterMs"] == 200  # sub-second, where Retry-After says 1


async def test_a_promoting_node_says_which_sync_members_it_waits_for():
    # Strict mode with its only sync member dead: the refusal must say what the node waits for.
    from queen.cluster.coordinator import SyncKey

    cluster = FakeCluster(role="promoting", leader=None)
    cluster.sync = SyncKey(43, "n2", frozenset({"n1"}), False, 43)
    with pytest.raises(QueenError) as refused:
        await api_with(cluster).handle(request("POST", "/api/v1/kv", b'{"operations": []}'))
    assert refused.value.code == "not_leader" and "sync set (n1)" in str(refused.value)


async def test_local_routes_are_answered_by_any_node_and_every_answer_has_the_epoch():
    cluster = FakeCluster()
    api = api_with(cluster)
    server = HttpServer(api, Config())
    for target in ("/healthz", "/api/v1/cluster", "/api/v1/openapi.json", "/"):
        answer = await server._handle(request("GET", target))
        assert answer.status == 200, target
        assert (b"x-queen-epoch", b"42") in answer.headers
    status = json.loads((await server._handle(request("GET", "/api/v1/cluster"))).body)
    assert status["role"] == "follower" and status["followers"][0]["lagVersions"] == 2
    refused = await server._handle(request("GET", "/api/v1/kv/ns/k"))  # a redirect carries it too
    assert refused.status == 307 and (b"x-queen-epoch", b"42") in refused.headers
    again = await server._handle(request("GET", "/"))  # the dashboard's shared answer is not grown
    assert [h for h in again.headers if h[0] == b"x-queen-epoch"] == [(b"x-queen-epoch", b"42")]
    # force-promote is answered here; switchover goes to the leader
    answer = await server._handle(request("POST", "/api/v1/cluster/force-promote", b'{"node": "n3"}'))
    assert answer.status == 200 and json.loads(answer.body)["mayBeLost"] == 4
    answer = await server._handle(request("POST", "/api/v1/cluster/switchover", b"{}"))
    assert answer.status == 307 and cluster.calls == [("force", "n3")]


async def test_the_serving_leader_answers_and_runs_a_switchover():
    cluster = FakeCluster(role="leader", serving=True, leader=None)
    server = HttpServer(api_with(cluster), Config())
    answer = await server._handle(request("POST", "/api/v1/cluster/switchover", b'{"to": "n3"}'))
    assert answer.status == 200 and json.loads(answer.body)["to"] == "n3" and cluster.calls == [("switchover", "n3")]
    bad = await server._handle(request("POST", "/api/v1/cluster/switchover", b'{"to": 3}'))
    assert bad.status == 400
    bad = await server._handle(request("POST", "/api/v1/cluster/force-promote", b"{}"))
    assert bad.status == 400


async def test_a_single_server_has_no_cluster_to_change():
    server = HttpServer(Api(FakeRouter(), Limits()), Config())
    status = json.loads((await server._handle(request("GET", "/api/v1/cluster"))).body)
    assert status["role"] == "single" and status["lastVersion"] == 11
    answer = await server._handle(request("POST", "/api/v1/cluster/switchover"))
    assert answer.status == 409 and json.loads(answer.body)["code"] == "not_clustered"
    assert answer.headers is None or all(name != b"x-queen-epoch" for name, _ in answer.headers)


def test_cluster_metrics():
    text = render_cluster(FakeCluster().status())
    assert 'queen_cluster_role{node="n2",role="follower"} 1' in text
    assert 'queen_cluster_role{node="n2",role="leader"} 0' in text
    assert 'queen_cluster_epoch{node="n2"} 42' in text
    assert 'queen_cluster_follower_lag_versions{follower="n3"} 2' in text
    assert 'queen_cluster_degraded{node="n2"} 0' in text and 'queen_cluster_sync_unavailable{node="n2"} 0' in text
    text = render_cluster({**FakeCluster(role="leader").status(), "degraded": True, "syncUnavailable": True})
    assert 'queen_cluster_degraded{node="n2"} 1' in text and 'queen_cluster_sync_unavailable{node="n2"} 1' in text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["queen_cluster_sync_unavailable"].type == "gauge"
    assert families["queen_cluster_degraded"].samples[0].value == 1


async def test_a_leader_whose_sync_set_is_out_of_reach_fails_its_health_check():
    from queen.cluster.replication import sync_unavailable_error

    class Writer(FakeRouter.writer):
        sync_refusal = sync_unavailable_error({"n3"}, 10.0, False)

    router = FakeRouter()
    router.writer = Writer
    api = Api(router, Limits())
    api.cluster = FakeCluster(role="leader", serving=True, leader=None)
    answer = await HttpServer(api, Config())._handle(request("GET", "/healthz"))
    assert answer.status == 503
    body = json.loads(answer.body)
    assert body["status"] == "sync_unavailable" and "(n3)" in body["reason"] and "do not restart" in body["reason"]


def test_status_table():
    rows = [{"url": "http://a:1", **FakeCluster(role="leader").status(), "node": "n1", "sync": ["n3"]},
            {"url": "http://b:1", "error": "[Errno 111] Connection refused"},
            {"url": "http://c:1", **FakeCluster().status(), "node": "n3", "sync": ["n3"]}]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["NODE", "ROLE", "EPOCH", "LAST", "VERSION", "LAG", "SYNC", "URL"]
    assert lines[1].split() == ["n1", "leader", "42", "7", "0", "leader", "http://a:1"]
    assert lines[2].split() == ["?", "unreachable", "-", "-", "-", "-", "http://b:1"]
    assert lines[3].split() == ["n3", "follower", "42", "7", "2", "yes", "http://c:1"]


def test_the_command_against_a_single_server(tmp_path):
    with ServerProcess(str(tmp_path / "data")) as server:
        dead = "http://127.0.0.1:1"
        ran = subprocess.run([sys.executable, "-m", "queen", "cluster", "status", "--url", f"{server.url},{dead}"],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        lines = ran.stdout.splitlines()
        assert lines[1].split()[:3] == ["-", "single", "0"] and "unreachable" in lines[2]
        ran = subprocess.run([sys.executable, "-m", "queen", "cluster", "switchover", "--url", server.url],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 1 and "not_clustered" in ran.stderr
        ran = subprocess.run([sys.executable, "-m", "queen", "cluster", "force-promote", "n2", "--url", dead],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 69 and "no node answered" in ran.stderr


def test_status_exits_1_when_nodes_answer_but_none_serves(monkeypatch, capsys):
    from queen.cli import cluster as cluster_cli
    from queen.cli import main

    roles = {"http://a:1": "promoting", "http://b:1": "follower"}
    monkeypatch.setattr(cluster_cli, "call", lambda args, url, *rest, **kw: (200, {**FakeCluster(role=roles[url]).status()}))
    assert main(["cluster", "status", "--url", "http://a:1,http://b:1"]) == 1
    assert "no node serves as leader" in capsys.readouterr().err
    roles["http://b:1"] = "leader"
    assert main(["cluster", "status", "--url", "http://a:1,http://b:1"]) == 0


@pytest.mark.parametrize("field,code,says", [("syncUnavailable", 69, "sync_unavailable: the leader n2 cannot reach"),
                                             ("degraded", 1, "degraded: the leader n2")])
def test_status_exits_non_zero_while_the_leaders_sync_set_is_short_or_out_of_reach(monkeypatch, capsys, field, code,
                                                                                    says):
    from queen.cli import cluster as cluster_cli
    from queen.cli import main

    answer = {**FakeCluster(role="leader", serving=True).status(), "sync": ["n3"], field: True}
    monkeypatch.setattr(cluster_cli, "call", lambda *args, **kw: (200, answer))
    assert main(["cluster", "status", "--url", "http://a:1"]) == code
    assert says in capsys.readouterr().err
