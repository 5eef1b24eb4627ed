"""An N-member etcd cluster on 127.0.0.1 for the failover tests, every member a process of ours.

Debian's etcd-server 3.4 (/usr/bin/etcd), each member on free ports with its own data directory
under the test's tmp dir, elections tuned for tests (--heartbeat-interval 100 --election-timeout
1000, etcd's own failover in about a second). Members are stopped, paused and killed by their own
pid only. `EtcdCluster.put/get` speak the v3 JSON gateway (plain HTTP, keys base64), the same door
Queen uses, so a test can see what the nodes see.

Ports: etcd 3.4 listens on port 0 but its JSON gateway then dials port 0 (it dials the listen
URL, not the bound port), and every member's peer URL must be known to all before any starts. So
ports are picked free beforehand, and a start that lost one to another process (the member exits
saying "address already in use") is done again on fresh ports, up to BIND_ATTEMPTS times.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

from queen.testing import free_port
from tests import system_tools

# Debian's etcd-server; QUEEN_TEST_ETCD names another etcd 3.4+ binary.
ETCD = system_tools.find("etcd") or system_tools.TOOLS["etcd"].path
# A port lost between its pick and etcd's bind is rare (another process must take that very port
# in those milliseconds); five tries in a row cannot all lose unless something else is wrong.
BIND_ATTEMPTS = 5


def log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def lost_its_port(path: str, offset: int) -> bool:
    """Whether etcd's output since offset says a port it was to listen on was taken."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return b"address already in use" in f.read().lower()
    except OSError:
        return False


def etcd_installed() -> bool:
    return system_tools.find("etcd") is not None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdMember:
    def __init__(self, name: str, data_dir: str, client_port: int, peer_port: int):
        self.name = name
        self.data_dir = data_dir
        self.client_port = client_port
        self.peer_port = peer_port
        self.process: subprocess.Popen | None = None
        self.log_path = data_dir + ".log"
        self.log_offset = 0  # where the latest start's output begins in log_path
        self.paused = False

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, initial_cluster: str, state: str = "new") -> None:
        self.log_offset = log_size(self.log_path)
        os.makedirs(self.data_dir, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([
                ETCD, "--name", self.name, "--data-dir", self.data_dir,
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", "queen-test", "--heartbeat-interval", "100",
                "--election-timeout", "1000", "--log-level", "warn", "--logger", "zap",
            ], stdout=subprocess.DEVNULL, stderr=log)
        self.paused = False

    def signal(self, signum: int) -> None:
        if self.alive():
            self.process.send_signal(signum)

    def pause(self) -> None:
        """SIGSTOP: the member is frozen, its sockets still open (peers see silence, not a reset)."""
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.paused = False

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self.alive():
            return
        if self.paused:
            self.resume()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def healthy(self, timeout_s: float = 1.0) -> bool:
        """/health says true: this member is part of a cluster with a leader and quorum."""
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=timeout_s) as answer:
                return json.loads(answer.read()).get("health") == "true"
        except (OSError, ValueError):
            return False


class EtcdCluster:
    """`with EtcdCluster(tmp_dir, n=3) as etcd:` an n-member cluster, healthy on entry."""

    def __init__(self, work_dir: str, n: int = 3):
        self.members = [EtcdMember(f"e{i}", os.path.join(work_dir, f"etcd-e{i}"), free_port(), free_port())
                        for i in range(n)]

    @property
    def client_urls(self) -> list[str]:
        return [member.client_url for member in self.members]

    def start(self, timeout_s: float = 30.0) -> EtcdCluster:
        """Start every member and wait until all are up and healthy. A member that lost a port
        to another process stops this attempt: every member is stopped and wiped (they were
        formed with the old peer URLs) and the cluster starts again on fresh ports."""
        for _ in range(BIND_ATTEMPTS):
            initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
            for member in self.members:
                member.start(initial)
            if self._wait_started(timeout_s):
                return self
            self.stop()
            for member in self.members:
                shutil.rmtree(member.data_dir, ignore_errors=True)
                member.client_port, member.peer_port = free_port(), free_port()
        raise RuntimeError(f"etcd lost a port to another process {BIND_ATTEMPTS} times in a row")

    def _wait_started(self, timeout_s: float) -> bool:
        """True once every member runs and reports health; False when one exited because a port
        was taken. Raises when one exited for any other reason, or time ran out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [m for m in self.members if not m.alive()]
            if any(lost_its_port(m.log_path, m.log_offset) for m in dead):
                return False
            if dead:
                break
            if all(m.healthy() for m in self.members):
                return True
            time.sleep(0.05)  # polling real processes, not waiting for time to pass
        logs = {m.name: _tail(m.log_path) for m in self.members}
        self.stop()
        raise RuntimeError(f"etcd cluster did not start within {timeout_s} s: {logs}")

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every live, running member reports health (a leader and quorum); polls a real process."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            running = [m for m in self.members if m.alive() and not m.paused]
            if running and all(m.healthy() for m in running):
                return
            time.sleep(0.05)  # polling a real process, not waiting for time to pass
        logs = {m.name: _tail(m.log_path) for m in self.members}
        raise RuntimeError(f"etcd cluster not healthy within {timeout_s} s: {logs}")

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the v3 JSON gateway ---------------------------------------------------------------------

    def call(self, path: str, body: dict, member: int | None = None, timeout_s: float = 3.0) -> dict:
        """POST to /v3/<path> of one member (default: the first live running one)."""
        target = self.members[member] if member is not None else next(
            m for m in self.members if m.alive() and not m.paused)
        request = urllib.request.Request(f"{target.client_url}/v3/{path}", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return json.loads(answer.read())

    def leader_member(self) -> int:
        """The index of etcd's raft leader (N5 picks which members to pause by it)."""
        return next(i for i, m in enumerate(self.members) if m.alive() and not m.paused and self.leads(i))

    def leads(self, member: int, timeout_s: float = 1.0) -> bool:
        """Whether the member says it is the raft leader (its status, served without quorum);
        False when it does not answer."""
        try:
            answer = self.call("maintenance/status", {}, member, timeout_s)
        except (OSError, ValueError):
            return False
        return answer.get("leader") == answer["header"]["member_id"]

    def move_leader(self, to: int, timeout_s: float = 10.0) -> None:
        """Hand raft leadership to member `to` (etcd's transfer-leadership), until it leads."""
        deadline = time.monotonic() + timeout_s
        while not self.leads(to):
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.members[to].name} did not become the raft leader within {timeout_s} s")
            target = self.call("maintenance/status", {}, to)["header"]["member_id"]
            try:
                self.call("maintenance/transfer-leadership", {"targetID": target}, self.leader_member(), timeout_s)
            except (OSError, StopIteration):
                pass  # an election meanwhile: look again
            time.sleep(0.05)  # polling a real process

    def put(self, key: str, value: str, member: int | None = None, timeout_s: float = 3.0) -> dict:
        return self.call("kv/put", {"key": _b64(key), "value": _b64(value)}, member, timeout_s)

    def get(self, key: str, member: int | None = None, timeout_s: float = 3.0) -> str | None:
        """The value of key by a linearizable range (it needs quorum), or None when absent."""
        answer = self.call("kv/range", {"key": _b64(key)}, member, timeout_s)
        kvs = answer.get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")).decode() if kvs else None

    def get_prefix(self, prefix: str, member: int | None = None) -> dict[str, dict]:
        """Every key under prefix: {key: {"value", "create_revision", "mod_revision", "lease"}}."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        answer = self.call("kv/range", {"key": _b64(prefix), "range_end": _b64(end)}, member)
        rows = {}
        for kv in answer.get("kvs") or []:
            rows[base64.b64decode(kv["key"]).decode()] = {
                "value": base64.b64decode(kv.get("value", "")).decode(),
                "create_revision": int(kv.get("create_revision", 0)),
                "mod_revision": int(kv.get("mod_revision", 0)), "lease": int(kv.get("lease", 0))}
        return rows


def put_times_out(cluster: EtcdCluster, key: str, value: str, member: int, timeout_s: float) -> bool:
    """True when a put through `member` gets no answer within timeout_s (no quorum), or an error."""
    try:
        cluster.put(key, value, member=member, timeout_s=timeout_s)
    except (OSError, urllib.error.URLError, TimeoutError):
        return True
    return False


def _tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except OSError:
        return ""
