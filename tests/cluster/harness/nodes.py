"""`queen serve --cluster` nodes for the failover tests, every link through its own proxy.

Topology for n nodes and an etcd cluster of m members, all on 127.0.0.1:
  client → node     one proxy per node; its URL is the node's --advertise (307s point at it) and
                    what the workers dial, so a node can be cut from its clients alone;
  node → etcd       one proxy per (node, etcd member); the node's --etcd lists its own proxies, so
                    `etcd_link(node).blackhole()` cuts that node from etcd and nobody else;
  node → node       one proxy per (follower, leader) pair in front of the leader's replication
                    listener; a follower dials it through QUEEN_TEST_REPLICATION_DIAL (JSON
                    {leader node id: "host:port"}), so `replication_link(a, b)` cuts one pair.
A node starts on port 0 for HTTP and for replication and says which ports it bound in its port
file (--port-file): nothing picks a port for it beforehand, which another process could take
first. Once it listens, the proxies in front of it are pointed at those ports; a restarted node
binds new ones and they are pointed again, so what dials a proxy never sees the change. Nodes are
killed, paused and resumed by their own pid; `wipe` removes a stopped node's data directory (N8).

Test-only switches the server honours in cluster mode (environment, read at start; the product
never sets them), used by the negative controls and N3b:
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

from queen.testing import ServerProcess
from tests.cluster.harness.etcd import EtcdCluster
from tests.cluster.harness.proxy import Proxy

# The names of the hidden switches (each documented where the merge wires it):
TEST_FLAGS = {
    "QUEEN_TEST_FOLLOWER_ACK_BEFORE_FSYNC": "a follower acks a frame before its fsync (C1 must fail after "
                                            "both nodes are killed)",
    "QUEEN_TEST_NO_EPOCH_CHECK": "a follower takes messages of any epoch and keeps the old leader's stream "
                                 "through its own campaign (C3 must fail: the zombie's pinned reads, N3b's cut)",
    "QUEEN_TEST_NO_READ_BARRIER": "a leader answers reads without the sync-set round trip (C2 must fail: the "
                                  "zombie's pinned reads, N3b's cut)",
    "QUEEN_TEST_IGNORE_CEILING": "a new leader starts versions at its local last + 1, ignoring etcd's "
                                 "version-ceiling (C4 must fail in N9)",
    "QUEEN_TEST_NO_LEASE_GRACE": "applying EPOCH extends no lease (C6 must fail when a lease would end during "
                                 "the failover)",
    "QUEEN_TEST_NO_SELF_FENCE": "N3b: the leader neither fences itself when etcd is unreachable nor resigns",
    "QUEEN_TEST_NO_HEARD_LEADER_RULE": "N3b: a sync follower campaigns even while it still hears a serving leader",
    "QUEEN_TEST_WALL_OFFSET_MS": "N7: ms added to the node's wall clock at start (a skewed host clock)",
    "QUEEN_TEST_REPLICATION_DIAL": "JSON {leader node: host:port}: the address a follower dials for that "
                                   "leader's replication (the harness's per-pair proxy)",
}
__doc__ += "".join(f"  {name}: {what}\n" for name, what in TEST_FLAGS.items())


@functools.cache
def cluster_supported() -> bool:
    """Whether this build's `queen serve` takes --cluster (the HA merge landed)."""
    done = subprocess.run([sys.executable, "-m", "queen", "serve", "--help"], capture_output=True, text=True,
                          timeout=60)
    return "--cluster" in done.stdout


class ClusterNode:
    def __init__(self, node_id: str, work_dir: str, etcd: EtcdCluster):
        self.node_id = node_id
        self.data_dir = os.path.join(work_dir, node_id)
        self.http_port: int | None = None  # what the running (or last) process bound
        self.replication_port: int | None = None
        self.client_proxy = Proxy(None, f"client-{node_id}").start()
        self.etcd_proxies = [Proxy(("127.0.0.1", member.client_port), f"{node_id}-etcd-{member.name}").start()
                             for member in etcd.members]
        self.dial: dict[str, Proxy] = {}  # leader node id -> the proxy this node dials it through
        self.server: ServerProcess | None = None
        self.paused = False

    @property
    def url(self) -> str:
        """The node's client URL, through its proxy (also its --advertise)."""
        return self.client_proxy.url

    @property
    def direct_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int:
        return self.server.process.pid

    def alive(self) -> bool:
        return self.server is not None and self.server.process is not None and self.server.process.poll() is None


class QueenCluster:
    """`QueenCluster(work_dir, etcd, n=3, leader_ttl_s=2).start()`: n nodes of cluster "t"."""

    def __init__(self, work_dir: str, etcd: EtcdCluster, n: int = 3, *, leader_ttl_s: float = 2.0,
                 sync_mode: str | None = None, extra_args: tuple = (), env: dict | None = None, name: str = "t"):
        self.work_dir = work_dir
        self.etcd = etcd
        self.name = name
        self.leader_ttl_s = leader_ttl_s
        self.sync_mode = sync_mode
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.node_env: dict[str, dict] = {}  # per-node extra environment (a control on one node)
        self.nodes = {f"n{i + 1}": ClusterNode(f"n{i + 1}", work_dir, etcd) for i in range(n)}
        for follower in self.nodes.values():
            for leader in self.nodes.values():
                if leader is not follower:
                    follower.dial[leader.node_id] = Proxy(None, f"{follower.node_id}-to-{leader.node_id}").start()

    # -- links -------------------------------------------------------------------------------------

    def client_link(self, node: str) -> Proxy:
        return self.nodes[node].client_proxy

    def etcd_link(self, node: str) -> list[Proxy]:
        """The node's proxies to every etcd member (act on all of them to cut it from etcd)."""
        return self.nodes[node].etcd_proxies

    def replication_link(self, a: str, b: str) -> list[Proxy]:
        """Both proxies between a and b (a dialing b, b dialing a)."""
        return [self.nodes[a].dial[b], self.nodes[b].dial[a]]

    def all_proxies(self) -> list[Proxy]:
        return [p for node in self.nodes.values()
                for p in (node.client_proxy, *node.etcd_proxies, *node.dial.values())]

    def heal(self) -> None:
        for proxy in self.all_proxies():
            proxy.pass_()

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    # -- processes ---------------------------------------------------------------------------------

    def _args(self, node: ClusterNode) -> list[str]:
        args = ["--cluster", self.name, "--node", node.node_id,
                "--etcd", ",".join(p.url for p in node.etcd_proxies), "--advertise", node.url,
                "--replication-listen", "127.0.0.1:0",
                "--leader-ttl", str(self.leader_ttl_s)]
        if self.sync_mode:
            args += ["--sync-mode", self.sync_mode]
        return args + list(self.extra_args)

    def start_node(self, node_id: str, timeout_s: float = 30.0) -> None:
        node = self.nodes[node_id]
        dial = {leader: f"127.0.0.1:{proxy.port}" for leader, proxy in node.dial.items()}
        env = {**self.env, **self.node_env.get(node_id, {}), "QUEEN_TEST_REPLICATION_DIAL": json.dumps(dial)}
        for proxy, member in zip(node.etcd_proxies, self.etcd.members, strict=True):
            proxy.retarget(("127.0.0.1", member.client_port))  # the ports etcd started on
        node.server = ServerProcess(node.data_dir, *self._args(node), env=env)
        node.server.start(timeout_s)
        node.http_port, node.replication_port = node.server.port, node.server.replication_port
        node.paused = False
        node.client_proxy.retarget(("127.0.0.1", node.http_port))
        for other in self.nodes.values():
            if other is not node:
                other.dial[node_id].retarget(("127.0.0.1", node.replication_port))

    def _detach(self, node: ClusterNode) -> None:
        """The node's process is gone: its proxies refuse new connections (as its dead ports
        would) rather than dial ports another process may have taken since."""
        node.client_proxy.retarget(None)
        for other in self.nodes.values():
            if other is not node:
                other.dial[node.node_id].retarget(None)

    def start(self) -> QueenCluster:
        for node_id in self.nodes:
            self.start_node(node_id)
        self.wait_leader()
        return self

    def kill(self, node_id: str) -> None:
        self.nodes[node_id].server.kill()
        self._detach(self.nodes[node_id])

    def pause(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.server.process.send_signal(signal.SIGSTOP)
        node.paused = True

    def resume(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.server.process.send_signal(signal.SIGCONT)
        node.paused = False

    def restart(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.alive():
            self.kill(node_id)
        self.start_node(node_id)

    def wipe(self, node_id: str) -> None:
        """rm -rf the (stopped) node's data directory."""
        assert not self.nodes[node_id].alive(), "stop the node first"
        shutil.rmtree(self.nodes[node_id].data_dir, ignore_errors=True)

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.server is not None:
                if node.paused and node.alive():
                    node.server.process.send_signal(signal.SIGCONT)
                node.server.stop(timeout_s=10)
        for proxy in self.all_proxies():
            proxy.close()

    def __enter__(self) -> QueenCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what the nodes say ------------------------------------------------------------------------

    def status(self, node_id: str, timeout_s: float = 1.0) -> dict | None:
        """GET /api/v1/cluster of the node, directly (no proxy), or None when it does not answer."""
        node = self.nodes[node_id]
        if not node.alive() or node.paused:
            return None
        return _get_json(node.direct_url + "/api/v1/cluster", timeout_s)

    def leader(self) -> str | None:
        """The serving leader of the newest epoch. A deposed leader cut from etcd with its
        self-fence off (N3b) still says "leader" for an older epoch, by design: the newest epoch
        is the cluster's leader; two claims of one epoch give None."""
        claims = {}
        for node_id in self.nodes:
            status = self.status(node_id) or {}
            if status.get("role") == "leader":
                claims.setdefault(status.get("epoch") or 0, []).append(node_id)
        if not claims:
            return None
        newest = claims[max(claims)]
        return newest[0] if len(newest) == 1 else None

    def wait_leader(self, timeout_s: float = 30.0, other_than: str | None = None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader != other_than:
                return leader
            time.sleep(0.05)  # polling real processes
        raise AssertionError(f"no leader (other than {other_than}) within {timeout_s} s: "
                             f"{ {n: self.status(n) for n in self.nodes} }")

    def epoch(self) -> int | None:
        leader = self.leader()
        return None if leader is None else self.status(leader).get("epoch")

    def wait_converged(self, timeout_s: float = 30.0) -> int:
        """Until every live node reports the same lastVersion; that version (the commit point)."""
        deadline = time.monotonic() + timeout_s
        seen = None
        while time.monotonic() < deadline:
            seen = {n: (self.status(n) or {}).get("lastVersion") for n in self.nodes if self.nodes[n].alive()}
            if seen and None not in seen.values() and len(set(seen.values())) == 1:
                return next(iter(seen.values()))
            time.sleep(0.05)
        raise AssertionError(f"nodes did not converge within {timeout_s} s: {seen}")

    def final_rows(self, keys: list[str], ns: str = "h") -> dict:
        """The final value and version of each key, read from the leader."""
        leader = self.wait_leader()
        answer = _post_json(self.nodes[leader].direct_url + "/api/v1/kv",
                            {"operations": [{"op": "get", "ns": ns, "key": key} for key in keys]})
        return {key: ({"value": row["value"], "version": row["version"]} if row.get("found") else None)
                for key, row in zip(keys, answer["results"], strict=True)}


def _get_json(url: str, timeout_s: float) -> dict | None:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        connection.request("GET", parts.path)
        response = connection.getresponse()
        data = response.read()
        return json.loads(data) if response.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()


def _post_json(url: str, body: dict, timeout_s: float = 5.0) -> dict:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        connection.request("POST", parts.path, json.dumps(body), {"content-type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        assert response.status == 200, (response.status, data[:300])
        return json.loads(data)
    finally:
        connection.close()
