"""Cluster nodes on port 0 (`--port 0 --replication-listen 127.0.0.1:0 --advertise
http://127.0.0.1:0`): each binds free ports, names them in its start line and its port file, and
publishes the bound ones in etcd, where a follower finds its leader's replication port (no test
dial override here: the follower dials what etcd says). A node that starts again in-process
(after a switchover) keeps its ports."""

from __future__ import annotations

import base64
import json
import time
import urllib.request

from queen.testing import ServerProcess, parse_logfmt
from tests.cluster.etcd_single import etcd  # noqa: F401 - the fixture


def poll(condition, what: str, timeout_s: float = 30.0):
    """Poll real processes with a generous deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def etcd_prefix(url: str, prefix: str) -> dict[str, dict]:
    """{key: decoded JSON value} of every key under prefix, read through etcd's JSON gateway."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = {"key": base64.b64encode(prefix.encode()).decode(), "range_end": base64.b64encode(end.encode()).decode()}
    request = urllib.request.Request(url + "/v3/kv/range", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=3) as answer:
        kvs = json.loads(answer.read()).get("kvs") or []
    return {base64.b64decode(kv["key"]).decode(): json.loads(base64.b64decode(kv["value"])) for kv in kvs}


def cluster_status(node: ServerProcess) -> dict:
    status, body = node.request("GET", "/api/v1/cluster")
    return body if status == 200 else {}


def test_nodes_on_port_zero_publish_the_ports_they_bound_and_a_follower_reaches_its_leader_there(
        tmp_path, etcd):  # noqa: F811
    flags = ["--cluster", "t", "--etcd", etcd.url, "--advertise", "http://127.0.0.1:0",
             "--replication-listen", "127.0.0.1:0", "--leader-ttl", "2", "--sync-mode", "degrade"]
    nodes = {}
    try:
        for name in ("n1", "n2"):
            nodes[name] = ServerProcess(str(tmp_path / name), *flags, "--node", name).start()
        for node in nodes.values():
            assert node.replication_port not in (None, 0, node.port)
            [start_line] = [parse_logfmt(line) for line in node.log_text().splitlines() if "event=listening" in line]
            assert (int(start_line["port"]), int(start_line["replication_port"])) == (node.port, node.replication_port)

        leader = poll(lambda: next((n for n, node in nodes.items() if cluster_status(node).get("role") == "leader"),
                                   None), "a leader")
        [follower] = [n for n in nodes if n != leader]
        poll(lambda: any(f["node"] == follower and f["connected"] for f in cluster_status(nodes[leader])["followers"]),
             "the follower connected to its leader through the port etcd names")

        published = etcd_prefix(etcd.url, "/queen/t/")
        assert published["/queen/t/leader"]["replication"] == f"127.0.0.1:{nodes[leader].replication_port}"
        assert published["/queen/t/leader"]["advertise"] == nodes[leader].url
        for name, node in nodes.items():
            member = poll(lambda name=name: etcd_prefix(etcd.url, "/queen/t/members/").get(f"/queen/t/members/{name}"),
                          f"{name}'s members/ document")
            assert (member["replication"], member["advertise"]) == (f"127.0.0.1:{node.replication_port}", node.url)

        assert nodes[leader].request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True})[0] == 200
        written = cluster_status(nodes[leader])["lastVersion"]
        poll(lambda: cluster_status(nodes[follower]).get("lastVersion", 0) >= written, "the write replicated")

        # A switchover: the old leader starts again in-process (its memory is rebuilt from its
        # log) on the very ports it bound, and follows the new leader at the port etcd names.
        old, new = nodes[leader], nodes[follower]
        assert old.request("POST", "/api/v1/cluster/switchover", {})[0] == 200
        poll(lambda: cluster_status(new).get("role") == "leader", "the follower leading")
        poll(lambda: "event=restarting" in old.log_text(), "the old leader's in-process restart")
        poll(lambda: any(f["node"] == leader and f["connected"] for f in cluster_status(new).get("followers", [])),
             "the old leader following the new one")
        starts = [parse_logfmt(line) for line in old.log_text().splitlines() if "event=listening" in line]
        assert len(starts) == 2 and {(s["port"], s["replication_port"]) for s in starts} == {
            (str(old.port), str(old.replication_port))}
        assert cluster_status(old)["role"] == "follower"
    finally:
        for node in nodes.values():
            node.stop()
