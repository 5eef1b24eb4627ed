"""A Queen cluster under test: one etcd member, a leader and its synchronous standby, on loopback.

Owns: starting etcd and the `queen serve --cluster` nodes (each on its own data dir, binding
port 0 for HTTP and replication and advertising the ports it got, pinned to the server CPUs like
every server here), waiting until one node leads and serves
with every other node in its sync set and caught up (lag 0), which port the bench drives (the
leader's), the check after a run that the same leader still leads the same epoch with its standby
still in sync, and stopping them (standby, leader, then etcd) by their own pids.

The cluster stands in the session as one system: `port`, `pid`, `process`, `post` and `metrics`
are the leader's, so every workload runs against it as against a single Queen; `cpu_roles` names
the other processes whose CPU the run also reads (the standby, etcd).
"""

from __future__ import annotations

import os
import shutil
import time

import orjson

from bench.loadgen import ResponseError
from bench.servers import (
    HOST,
    ServerProcess,
    etcd_server,
    http_get_to_close,
    queen_server,
)

CLUSTER_NAME = "bench"
LEADER_TTL_S = 5
# Election, the standby's catch-up and its entry into the sync set take a few of the coordinator's
# polls; an empty log catches up at once, so a minute means something is wrong.
READY_TIMEOUT_S = 60.0
# Nodes per cluster system: the coordinator keeps one follower in the sync set (the others would
# be asynchronous, which the bench does not measure).
CLUSTER_SIZES = (2,)


def cluster_system(nodes: int) -> str:
    return f"queen-cluster{nodes}"


def cluster_missing() -> str | None:
    """None when a cluster can run here; otherwise why not ("not installed: ...")."""
    if shutil.which("etcd") is None:
        return "not installed: no `etcd` on PATH (Debian's etcd-server; run bench/peers/install.sh)"
    return None


class QueenCluster:
    def __init__(self, system: str, nodes: int, data_dir: str, out_dir: str, cpus: list[int] | None, repo_root: str):
        self.name = system
        self.ca_file = None
        self.token = None
        self.etcd = etcd_server(_subdir(data_dir, "etcd"), os.path.join(out_dir, f"server-{system}-etcd.log"), cpus,
                                name=f"{system}-etcd")
        self.nodes: list[ServerProcess] = []
        self.node_ids: dict[str, str] = {}  # process name -> the node's id in the cluster
        for index in range(1, nodes + 1):
            node = f"n{index}"

            def flags(node=node) -> list[str]:
                # Asked at the node's start, once etcd is up on the port it got. Port 0 in both
                # addresses: the node advertises the ports it bound.
                return ["--cluster", CLUSTER_NAME, "--node", node, "--etcd", f"http://{HOST}:{self.etcd.port}",
                        "--advertise", f"http://{HOST}:0", "--replication-listen", f"{HOST}:0",
                        "--leader-ttl", str(LEADER_TTL_S)]

            server = queen_server(_subdir(data_dir, node), os.path.join(out_dir, f"server-{system}-{node}.log"),
                                  cpus, repo_root, name=f"{system}-{node}", extra_args=flags)
            self.node_ids[server.name] = node
            self.nodes.append(server)
        self.leader: ServerProcess | None = None
        self.epoch: int | None = None

    # -- what the session drives: the leader ------------------------------------------------------

    @property
    def port(self) -> int:
        return self.leader.port

    @property
    def pid(self) -> int:
        return self.leader.pid

    @property
    def process(self):
        return self.leader.process

    @property
    def log_path(self) -> str:
        return self.leader.log_path

    def post(self, request: bytes) -> tuple[int, bytes]:
        return self.leader.post(request)

    def get(self, path: str) -> tuple[int, bytes]:
        return self.leader.get(path)

    def metrics(self) -> dict[str, float]:
        return self.leader.metrics()

    @property
    def members(self) -> list[ServerProcess]:
        """Every process of the cluster, in the order they stop."""
        standbys = [node for node in self.nodes if node is not self.leader]
        return standbys + [node for node in self.nodes if node is self.leader] + [self.etcd]

    def cpu_roles(self) -> dict[str, list[int]]:
        """The cluster's processes besides the leader, by the role the report names them."""
        return {"standby": [node.pid for node in self.nodes if node is not self.leader], "etcd": [self.etcd.pid]}

    def died(self) -> str | None:
        for member in self.members:
            if member.process is not None and member.process.poll() is not None:
                return f"{member.name} exited with {member.process.returncode}; see {os.path.basename(member.log_path)}"
        return None

    # -- life ---------------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.etcd.start()
            for node in self.nodes:  # n1 first: it is the likely leader, the others join it
                node.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def views(self) -> dict[str, dict | str]:
        """Each node's GET /api/v1/cluster, or why it could not be read."""
        views = {}
        for node in self.nodes:
            try:
                status, body = http_get_to_close(node.port, "/api/v1/cluster", timeout_s=2)
                views[node.name] = orjson.loads(body) if status == 200 else f"HTTP {status} {body[:200]!r}"
            except (OSError, ResponseError, ValueError) as error:
                views[node.name] = f"{type(error).__name__}: {error}"
        return views

    def _leader_problem(self, view, others: list[str]) -> str | None:
        """None when `view` is a serving leader whose sync set holds every other node, each
        connected with lag 0; otherwise what is missing."""
        if not isinstance(view, dict):
            return view
        if view.get("role") != "leader" or not view.get("serving", True):
            return f"role {view.get('role')}, serving {view.get('serving')}"
        if view.get("degraded") or sorted(view.get("sync") or []) != sorted(others):
            return f"sync set {view.get('sync')} (degraded {view.get('degraded')}), want {others}"
        followers = {f["node"]: f for f in view.get("followers") or []}
        for node in others:
            status = followers.get(node)
            if status is None or not status.get("connected") or status.get("lagVersions") != 0:
                return f"follower {node}: {status}"
        return None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until one node leads with every other node in sync and caught up; it becomes the node
        the session drives. Raises with every node's view when that does not happen in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            views = self.views()
            for node in self.nodes:
                others = [self.node_ids[other.name] for other in self.nodes if other is not node]
                if self._leader_problem(views[node.name], others) is None:
                    self.leader, self.epoch = node, views[node.name].get("epoch")
                    return
            dead = self.died()
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no leader with its standby in sync "
                                   f"{'(' + dead + ')' if dead else f'within {timeout_s} s'}; views: "
                                   f"{orjson.dumps(views).decode()[:2000]}")
            time.sleep(0.1)

    def check_after_run(self) -> str | None:
        """What went wrong with the cluster during a run (a new leader or epoch, the standby out
        of the sync set), or None. Lag is not asked for: the run has just ended, the standby may
        still be applying, and every answer the bench counted waited for its ack anyway."""
        dead = self.died()
        if dead:
            return dead
        view = self.views()[self.leader.name]
        if not isinstance(view, dict):
            return f"the leader's status: {view}"
        if view.get("role") != "leader" or view.get("epoch") != self.epoch:
            return f"{self.leader.name} is now {view.get('role')} of epoch {view.get('epoch')} (was leader of {self.epoch})"
        others = sorted(self.node_ids[node.name] for node in self.nodes if node is not self.leader)
        if view.get("degraded") or sorted(view.get("sync") or []) != others:
            return f"sync set {view.get('sync')} (degraded {view.get('degraded')}), want {others}"
        return None


def _subdir(parent: str, name: str) -> str:
    path = os.path.join(parent, name)
    os.makedirs(path, exist_ok=True)
    return path
