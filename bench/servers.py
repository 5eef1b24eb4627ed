"""The servers under test, as child processes this benchmark starts, pins, watches and stops.

Owns: Queen, the do-nothing baseline and the peers (Redis with appendfsync always, Redis without
persistence, single-node etcd), each on a free loopback port with a fresh data directory, the child pinned to its CPU from the moment
it starts (sched_setaffinity in preexec_fn, so even its first import runs there), waiting for it
to answer /healthz, reading its /metrics, and stopping it with SIGTERM by its own pid (SIGKILL by
the same pid only if it ignores SIGTERM past a grace period; the report then says so).

Never: signals a process it did not start, or binds anything but 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from bench.loadgen import ResponseError, request_once

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, name: str, argv: list[str], port: int, log_path: str, cpus: list[int] | None,
                 cwd: str | None = None, health=None):
        self.health = health or _http_health
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.cpus = cpus
        self.cwd = cwd
        self.process: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self) -> None:
        cpus = self.cpus

        def pin():
            if cpus:
                os.sched_setaffinity(0, cpus)

        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            preexec_fn=pin, cwd=self.cwd)
        finally:
            log.close()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before answering; see {self.log_path}")
            try:
                if self.health(self.port):
                    return
            except (OSError, ResponseError, ValueError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer its health check within {START_TIMEOUT_S} s; see {self.log_path}")

    def get(self, path: str) -> tuple[int, bytes]:
        return request_once(HOST, self.port, b"GET %s HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (path.encode(), HOST.encode(), self.port))

    def post(self, request: bytes) -> tuple[int, bytes]:
        return request_once(HOST, self.port, request, timeout_s=30)

    def metrics(self) -> dict[str, float]:
        """Prometheus text of /metrics as {name: value} (a labelled series keeps its labels in the name)."""
        status, body = http_get_to_close(self.port, "/metrics")
        if status != 200:
            return {}
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    values[name] = float(value)
                except ValueError:
                    pass
        return values

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.exit_code = None if self.process is None else self.process.returncode
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.exit_code = self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.killed = True
            os.kill(self.process.pid, signal.SIGKILL)
            self.exit_code = self.process.wait(timeout=10)


def queen_server(data_dir: str, log_path: str, cpus: list[int] | None, repo_root: str) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "queen", "serve", "--host", HOST, "--port", str(port), "--data-dir", data_dir]
    return ServerProcess("queen", argv, port, log_path, cpus, cwd=repo_root)


def baseline_server(log_path: str, cpus: list[int] | None, repo_root: str) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "bench.baseline_http", "--host", HOST, "--port", str(port)]
    return ServerProcess("baseline-http", argv, port, log_path, cpus, cwd=repo_root)


def _http_health(port: int) -> bool:
    status, _ = request_once(HOST, port, b"GET /healthz HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (HOST.encode(), port), timeout_s=2)
    return status == 200


def redis_call(port: int, commands: list[bytes], timeout_s: float = 30.0) -> list:
    """Send RESP commands pipelined on one fresh connection; their replies, in order."""
    from bench.sessions import take_replies
    with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
        sock.sendall(b"".join(commands))
        buf = bytearray()
        while True:
            taken = take_replies(buf, len(commands))
            if taken is not None:
                return taken[3]
            data = sock.recv(1 << 18)
            if not data:
                raise ResponseError("redis closed the connection")
            buf += data


def _redis_health(port: int) -> bool:
    return redis_call(port, [b"*1\r\n$4\r\nPING\r\n"], timeout_s=2) == [b"PONG"]


def _etcd_health(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=2) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: %s:%d\r\nconnection: close\r\n\r\n" % (HOST.encode(), port))
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.startswith(b"HTTP/1.1 200") and b'"health":"true"' in data


# Where each peer's binary is looked for; bench/peers/install.sh puts them there from Debian's packages.
PEER_BINARIES = {"redis-aof": "redis-server", "redis-mem": "redis-server", "etcd": "etcd"}


def peer_missing(system: str) -> str | None:
    """None when the peer can run here; otherwise why not ("not installed: ...")."""
    binary = PEER_BINARIES[system]
    if shutil.which(binary) is None:
        return f"not installed: no `{binary}` on PATH (run bench/peers/install.sh)"
    if system == "etcd":
        from bench.peers.etcd import loader_path
        if not os.path.exists(loader_path()):
            return "not installed: the Go loader bench/peers/etcdload/etcdload is not built (run bench/peers/install.sh)"
    return None


def redis_server(system: str, data_dir: str, log_path: str, cpus: list[int] | None) -> ServerProcess:
    """Redis on 127.0.0.1 with its files in data_dir. redis-aof: appendonly yes, appendfsync
    always (every write fsynced before its reply: the durable, comparable setting); redis-mem: no
    persistence at all (the in-memory ceiling)."""
    port = free_port()
    argv = [shutil.which("redis-server") or "redis-server", "--bind", HOST, "--port", str(port), "--dir", data_dir,
            "--save", "", "--daemonize", "no", "--protected-mode", "yes", "--logfile", "", "--databases", "1"]
    if system == "redis-aof":
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", "yes"]
    else:
        argv += ["--appendonly", "no"]
    return ServerProcess(system, argv, port, log_path, cpus, health=_redis_health)


def etcd_server(data_dir: str, log_path: str, cpus: list[int] | None) -> ServerProcess:
    """Single-node etcd on 127.0.0.1, its data dir on the same disk as Queen's. Defaults otherwise:
    etcd fsyncs its WAL before it answers a write, as Queen does."""
    port, peer_port = free_port(), free_port()
    client, peer = f"http://{HOST}:{port}", f"http://{HOST}:{peer_port}"
    argv = [shutil.which("etcd") or "etcd", "--name", "bench", "--data-dir", data_dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bench={peer}", "--initial-cluster-state", "new",
            "--log-level", "warn", "--logger", "zap", "--log-outputs", "stderr"]
    return ServerProcess("etcd", argv, port, log_path, cpus, health=_etcd_health)


def http_get_to_close(port: int, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """GET with `connection: close`, read to the end; a chunked body (etcd's /metrics) is decoded."""
    with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nhost: %s:%d\r\nconnection: close\r\n\r\n" % (path.encode(), HOST.encode(), port))
        chunks = []
        while True:
            chunk = sock.recv(1 << 18)
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        raise ResponseError(f"not an HTTP/1.1 answer: {head[:40]!r}")
    status = int(head[9:12])
    if b"transfer-encoding: chunked" in head.lower():
        out, position = [], 0
        while True:
            end = body.find(b"\r\n", position)
            size = int(body[position:end].split(b";")[0], 16)
            if size == 0:
                break
            out.append(body[end + 2:end + 2 + size])
            position = end + 2 + size + 2
        body = b"".join(out)
    return status, body
