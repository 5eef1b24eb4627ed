"""The failover harness checked on its own, before any cluster exists: the etcd cluster comes up,
loses quorum and recovers; each proxy mode does what it says; worker processes drive a real
single-node Queen through a proxy, their histories pass every check, and a paused worker resumes."""

import os
import socket
import threading
import time

import pytest

from queen.testing import ServerProcess
from tests.cluster.harness import checks
from tests.cluster.harness.etcd import EtcdCluster, put_times_out
from tests.cluster.harness.proxy import Proxy
from tests.cluster.harness.workers import LOCKS, WorkerProcess, read_log


def poll(condition, timeout_s: float = 20.0, what: str = "condition"):
    """Poll a real process's condition with a generous deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def test_etcd_cluster_loses_and_regains_quorum(tmp_path):
    with EtcdCluster(str(tmp_path), n=3) as etcd:
        etcd.put("/queen/t/probe", "one")
        assert etcd.get("/queen/t/probe") == "one"
        assert len({m.pid for m in etcd.members}) == 3
        etcd.members[1].pause()
        etcd.members[2].pause()
        # The one member left has no quorum: its put never commits.
        assert put_times_out(etcd, "/queen/t/probe", "two", member=0, timeout_s=2.5)
        etcd.members[1].resume()
        etcd.members[2].resume()
        etcd.wait_healthy()
        poll(lambda: not put_times_out(etcd, "/queen/t/probe", "three", member=0, timeout_s=2.0), what="put after SIGCONT")
        assert etcd.get("/queen/t/probe", member=2) == "three"
        assert "/queen/t/probe" in etcd.get_prefix("/queen/t/")


def test_an_etcd_port_taken_before_etcd_binds_it_is_picked_again(tmp_path):
    from tests.cluster.etcd_single import EtcdProcess

    with socket.socket() as holder:  # another process took the port between its pick and etcd's bind
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        etcd = EtcdCluster(str(tmp_path / "cluster"), n=3)
        etcd.members[1].peer_port = taken
        solo = EtcdProcess(str(tmp_path / "solo-data"))
        solo.client_port = taken
        with etcd, solo:
            assert all(m.alive() and m.peer_port != taken for m in etcd.members)
            etcd.put("/queen/t/probe", "one")
            assert etcd.get("/queen/t/probe", member=2) == "one"
            assert solo.client_port != taken and solo.process.poll() is None
    for log_path in (etcd.members[1].log_path, solo.output_path):
        with open(log_path) as log:
            assert "address already in use" in log.read()


def test_etcd_raft_leader_moves_and_steps_down_without_quorum(tmp_path):
    with EtcdCluster(str(tmp_path), n=3) as etcd:
        leader = (etcd.leader_member() + 1) % 3
        etcd.move_leader(leader)
        assert [etcd.leads(i) for i in range(3)] == [i == leader for i in range(3)]
        followers = [i for i in range(3) if i != leader]
        for i in followers:
            etcd.members[i].pause()
        try:
            # check-quorum: a leader that hears no quorum for an election timeout steps down
            poll(lambda: not etcd.leads(leader, timeout_s=0.5), what="the raft leader stepped down")
        finally:
            for i in followers:
                etcd.members[i].resume()
        etcd.wait_healthy()
        assert [etcd.leads(i) for i in range(3)].count(True) == 1


class EchoServer:
    """Echoes every byte back; counts what it received."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.received = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn):
        with conn:
            try:
                while data := conn.recv(65536):
                    self.received += len(data)
                    conn.sendall(data)
            except OSError:
                pass

    def close(self):
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def _roundtrip(port: int, payload: bytes, timeout_s: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_proxy_modes_do_what_they_say():
    echo = EchoServer()
    with Proxy(("127.0.0.1", echo.port), "echo") as proxy:
        assert _roundtrip(proxy.port, b"hello") == b"hello"

        proxy.delay(300)
        started = time.monotonic()
        assert _roundtrip(proxy.port, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.55  # 300 ms each way

        proxy.blackhole()
        before = echo.received
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5) as sock:  # accepted...
            sock.sendall(b"into the void")
            with pytest.raises(TimeoutError):  # ...and silent: no answer, no reset
                sock.recv(10)
        assert echo.received == before and proxy.dropped_bytes >= len(b"into the void")

        proxy.cut("down")  # requests reach the upstream, answers are dropped
        before = echo.received
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5) as sock:
            sock.sendall(b"one-way")
            poll(lambda: echo.received >= before + 7, 5, "the upstream got the bytes")
            with pytest.raises(TimeoutError):
                sock.recv(10)

        proxy.cut("up")  # nothing reaches the upstream
        before = echo.received
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5) as sock:
            sock.sendall(b"lost")
            with pytest.raises(TimeoutError):
                sock.recv(10)
        assert echo.received == before

        proxy.pass_()
        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        held.sendall(b"x")
        assert held.recv(1) == b"x"
        proxy.reset()
        try:
            with pytest.raises(ConnectionResetError):  # the open connection is reset...
                held.recv(1)
        finally:
            held.close()
        with pytest.raises((ConnectionResetError, ConnectionRefusedError)):  # ...and so is a new one
            _roundtrip(proxy.port, b"z")
        proxy.pass_()
        assert _roundtrip(proxy.port, b"back") == b"back"
    echo.close()


def test_proxy_in_front_of_a_real_queen(tmp_path):
    with ServerProcess(str(tmp_path / "data"), "--port", "0") as server, \
            Proxy(("127.0.0.1", server.port), "queen") as proxy:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=1)
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        connection.close()
        proxy.blackhole()
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=0.5)
        with pytest.raises(TimeoutError):
            connection.request("GET", "/healthz")
            connection.getresponse()
        connection.close()
        proxy.pass_()
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=2)
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        connection.close()


def _final_rows(server: ServerProcess) -> dict:
    keys = [f"r{i}" for i in range(5)] + ["c0", "c1"]
    status, answer = server.request("POST", "/api/v1/kv", {"operations": [
        {"op": "get", "ns": "h", "key": key} for key in keys]})
    assert status == 200, answer
    return {key: ({"value": row["value"], "version": row["version"]} if row.get("found") else None)
            for key, row in zip(keys, answer["results"], strict=True)}


def test_workers_against_one_node_pass_every_check(tmp_path):
    work = str(tmp_path)
    with ServerProcess(os.path.join(work, "data"), "--port", "0") as server, \
            Proxy(("127.0.0.1", server.port), "client") as proxy:
        urls = [proxy.url]
        workers = [WorkerProcess("W1", urls, work, f"w1-{i}", ops=40, seed=i).start() for i in range(2)]
        workers += [WorkerProcess("W2", urls, work, f"w2-{i}", ops=8, seed=10 + i, hold_s=0.05).start()
                    for i in range(2)]
        workers += [WorkerProcess("W3", urls, work, "w3-0", ops=30, seed=20).start(),
                    WorkerProcess("W4", urls, work, "w4-0", ops=20, seed=30).start()]
        # One worker paused mid-run (SIGSTOP) comes back and finishes.
        paused = workers[0]
        poll(lambda: len(read_log(paused.log_path)) > 5, what="w1-0 made progress")
        paused.pause()
        frozen = len(read_log(paused.log_path))
        # While it is stopped the others go on: once one of them has logged more, it has not.
        running = workers[1]
        before = len(read_log(running.log_path))
        poll(lambda: len(read_log(running.log_path)) > before + 5 or running.process.poll() is not None,
             what="w1-1 made progress while w1-0 was paused")
        assert len(read_log(paused.log_path)) == frozen
        paused.resume()
        for worker in workers:
            worker.wait()
        final = _final_rows(server)
    events = [event for worker in workers for event in worker.events()]
    assert sum(event["type"] == "end" for event in events) == len(workers)
    calls = checks.calls_of(events)
    assert sum(call.ok for call in calls) > 100
    assert {call.f for call in calls if call.ok} >= {"get", "put", "incr", "acquire", "guarded", "release",
                                                        "push", "pop", "ack", "schedule"}
    store_log = read_log(os.path.join(work, "fenced-store", "store.jsonl"))
    assert store_log, "W2 holders wrote to the fenced store"
    found = checks.check_all(calls, final_rows=final, store_log=store_log, limits=LOCKS)
    assert found == {name: [] for name in found}, {k: v[:2] for k, v in found.items() if v}
    assert checks.failover_time_ms(calls, calls[0].invoke["t"], None) is not None
    # C9 on the one node's log against itself: the reader reads it, and it agrees with itself.
    records, snapshot = checks.log_records(os.path.join(work, "data"))
    top = max(v for v, _ in checks.versioned(records, 0, 1 << 62))
    assert checks.check_convergence({"a": (records, snapshot), "b": (records, snapshot)}, top) == []


def test_cluster_nodes_get_the_spec_flags_and_a_proxy_per_link(tmp_path):
    from tests.cluster.harness.nodes import QueenCluster

    etcd = EtcdCluster(str(tmp_path), n=3)  # not started: only its ports are used here
    cluster = QueenCluster(str(tmp_path), etcd, 3, leader_ttl_s=2, sync_mode="strict")
    try:
        node = cluster.nodes["n1"]
        args = cluster._args(node)
        for flag in ("--cluster", "--node", "--etcd", "--advertise", "--replication-listen", "--leader-ttl",
                     "--sync-mode"):
            assert flag in args
        assert args[args.index("--advertise") + 1] == node.url == cluster.client_link("n1").url
        etcd_urls = args[args.index("--etcd") + 1].split(",")
        assert etcd_urls == [p.url for p in cluster.etcd_link("n1")] and len(etcd_urls) == 3
        assert len({p.port for p in cluster.all_proxies()}) == 3 * (1 + 3 + 2)  # every link its own proxy
        # No port is picked for a node: it binds port 0, and its proxies are pointed at what it bound.
        assert args[args.index("--replication-listen") + 1] == "127.0.0.1:0"
        assert all(p.upstream is None for p in (node.client_proxy, *cluster.replication_link("n1", "n2")))
    finally:
        cluster.stop()


def test_a_restarted_node_binds_new_ports_and_its_proxies_follow(tmp_path):
    from tests.cluster.harness.nodes import QueenCluster, cluster_supported

    if not cluster_supported():
        pytest.skip("this build's queen serve has no --cluster")
    with EtcdCluster(str(tmp_path), n=1) as etcd, \
            QueenCluster(str(tmp_path), etcd, 2, leader_ttl_s=2, sync_mode="degrade") as cluster:
        leader = cluster.wait_leader()
        [follower] = [n for n in cluster.nodes if n != leader]
        node = cluster.nodes[follower]
        assert node.client_proxy.upstream == ("127.0.0.1", node.http_port)
        assert cluster.nodes[leader].dial[follower].upstream == ("127.0.0.1", node.replication_port)
        old_ports = (node.http_port, node.replication_port)
        with socket.socket() as holder:  # the old HTTP port, taken by another process meanwhile
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            cluster.kill(follower)
            assert node.client_proxy.upstream is None  # refused while the node is down
            holder.bind(("127.0.0.1", old_ports[0]))
            holder.listen()
            cluster.start_node(follower)
        assert (node.http_port, node.replication_port) != old_ports
        assert node.client_proxy.upstream == ("127.0.0.1", node.http_port)
        assert cluster.nodes[leader].dial[follower].upstream == ("127.0.0.1", node.replication_port)
        # It answers "starting" until it has joined: what counts is that it answers, through its proxy.
        poll(lambda: (s := _get_cluster(node.url)) and s.get("node") == follower and s.get("role") == "follower",
             what="the restarted node answering through its client proxy, as a follower")
        poll(lambda: any(f["node"] == follower and f["connected"]
                         for f in (cluster.status(leader) or {}).get("followers", [])),
             what="the leader seeing the restarted follower again")


def _get_cluster(url: str) -> dict | None:
    from tests.cluster.harness.nodes import _get_json

    return _get_json(url + "/api/v1/cluster", 2.0)
