"""The servers under test, as child processes this benchmark starts, pins, watches and stops.

Owns: Queen, the do-nothing baseline and the peers (Redis with appendfsync always, Redis without
persistence, single-node etcd, PostgreSQL 15, NATS with JetStream), each on a free loopback port
with a fresh data directory, the child pinned to its CPU from the moment it starts
(sched_setaffinity in preexec_fn, so even its first import runs there), waiting for it to answer
its health check, reading its /metrics, and stopping it with SIGTERM by its own pid (SIGKILL by
the same pid only if it ignores SIGTERM past a grace period; the report then says so). Queen can
be served over HTTPS: a throwaway CA and certificate made with openssl in the run's directory,
and `ca_file` on the server for every client of it to trust.

Ports: Queen and the baseline bind port 0 and name the port they got in a port file (queen
serve --port-file), so nothing can take it first. A peer is given a port picked free just before
(none of them reports a port 0 it bound in a form read as easily); one that exits saying the
address is in use (another process took the port in between) is started again on fresh ports, up
to BIND_ATTEMPTS times.

Never: signals a process it did not start, or binds anything but 127.0.0.1.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.loadgen import ResponseError, open_socket, request_once
from queen.runtime import port_file
from queen.testing import make_server_cert, make_test_ca, parse_metrics

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 30.0
# A peer's port lost between its pick and the peer's bind is rare (another process must take that
# very port in those milliseconds); five in a row means something else is wrong.
BIND_ATTEMPTS = 5


def free_port() -> int:
    """A port nothing listened on a moment ago: for a peer that must be told its port up front
    (its start is retried if another process took it meanwhile, ServerProcess.start)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@dataclass
class Launch:
    """One start of a server: its command line, and the port it serves on, or None when it binds
    port 0 and names the port in its port file. health(port): whether it answers (None: the
    server's own check)."""

    argv: list[str]
    port: int | None = None
    health: Callable[[int], bool] | None = None


class ServerProcess:
    def __init__(self, name: str, launch: Callable[[], Launch], log_path: str, cpus: list[int] | None,
                 cwd: str | None = None, health=None, user: str | None = None, ca_file: str | None = None,
                 token: str | None = None, port_file_path: str | None = None):
        """launch(): the command line of one start, on ports picked then (called again for a
        start that lost its port). port_file_path: where a server given port 0 names its port."""
        self.ca_file = ca_file  # it speaks HTTPS with a certificate this CA signed
        self.token = token  # it has an auth file: a token's secret, sent with every request
        self.health = health or (lambda port: _http_health(port, ca_file))
        self.user = user  # run as this user (PostgreSQL refuses to run as root)
        self.name = name
        self.launch = launch
        self.port_file_path = port_file_path
        self.argv: list[str] = []
        self.port: int | None = None
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

        for _ in range(BIND_ATTEMPTS):
            launch = self.launch()
            self.argv, self.port = launch.argv, launch.port
            if self.port_file_path:
                port_file.remove(self.port_file_path)  # a killed run's: the server writes its own
            log_offset = _size(self.log_path)
            log = open(self.log_path, "ab")
            try:
                self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                preexec_fn=pin, cwd=self.cwd, user=self.user)
            finally:
                log.close()
            if self._wait_healthy(launch.health or self.health, log_offset):
                return
        raise RuntimeError(f"{self.name} lost its port to another process {BIND_ATTEMPTS} times in a row; "
                           f"see {self.log_path}")

    def _wait_healthy(self, health, log_offset: int) -> bool:
        """True once it answers its health check; False when it exited because its port was
        taken (its log says the address is in use). Raises when it exited otherwise or never
        answered."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if _lost_its_port(self.log_path, log_offset):
                    return False
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before answering; see {self.log_path}")
            if self.port is None:
                ports = port_file.read(self.port_file_path)
                self.port = ports["port"] if ports else None
            try:
                if self.port is not None and health(self.port):
                    return True
            except (OSError, ResponseError, ValueError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer its health check within {START_TIMEOUT_S} s; see {self.log_path}")

    def get(self, path: str) -> tuple[int, bytes]:
        return request_once(HOST, self.port, b"GET %s HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (path.encode(), HOST.encode(), self.port),
                            ca_file=self.ca_file)

    def post(self, request: bytes) -> tuple[int, bytes]:
        return request_once(HOST, self.port, request, timeout_s=30, ca_file=self.ca_file)

    def metrics(self) -> dict[str, float]:
        """Prometheus text of /metrics as {name: value} (a labelled series keeps its labels in the name)."""
        status, body = http_get_to_close(self.port, "/metrics", ca_file=self.ca_file, token=self.token)
        if status != 200:
            return {}
        return parse_metrics(body.decode())

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


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _lost_its_port(log_path: str, offset: int) -> bool:
    """Whether the server's output since offset says its address was in use (Redis, etcd, NATS,
    PostgreSQL and Queen each say "address already in use" or Queen's reason=address_in_use)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().lower()
    except OSError:
        return False
    return b"address already in use" in text or b"reason=address_in_use" in text


def queen_server(data_dir: str, log_path: str, cpus: list[int] | None, repo_root: str,
                 tls_dir: str | None = None, auth_dir: str | None = None, name: str = "queen",
                 extra_args=None) -> ServerProcess:
    """tls_dir: serve HTTPS, with a certificate for 127.0.0.1 made there (and its CA, which the
    bench's clients trust). auth_dir: run with an auth file made there, whose admin token (of a
    named tenant, so every name is stored under its prefix) the bench's clients send.
    extra_args(): more flags, asked for at each start (a cluster node's --etcd names the port
    etcd got when it started). It binds port 0 and names its port in a port file beside its log."""
    ports = os.path.splitext(log_path)[0] + ".port"
    argv = [sys.executable, "-m", "queen", "serve", "--host", HOST, "--port", "0", "--port-file", ports,
            "--data-dir", data_dir]
    tls_args, ca_file = _tls_files(tls_dir)
    auth_args, token = _auth_file(auth_dir, repo_root)
    return ServerProcess(name, lambda: Launch(argv + tls_args + auth_args + (extra_args() if extra_args else [])),
                         log_path, cpus, cwd=repo_root, ca_file=ca_file, token=token, port_file_path=ports)


def _auth_file(auth_dir: str | None, repo_root: str) -> tuple[list[str], str | None]:
    """([--auth-file FILE], an admin's secret) for an auth file made in auth_dir by the measured
    checkout's own `queen auth add`; ([], None) without one."""
    if auth_dir is None:
        return [], None
    os.makedirs(auth_dir, exist_ok=True)
    path = os.path.join(auth_dir, "auth.json")
    done = subprocess.run([sys.executable, "-m", "queen", "auth", "add", "bench", "--role", "admin", "--tenant",
                           "bench", "--auth-file", path], cwd=repo_root, capture_output=True, text=True, check=True)
    return ["--auth-file", path], done.stdout.strip()


def baseline_server(log_path: str, cpus: list[int] | None, repo_root: str, tls_dir: str | None = None) -> ServerProcess:
    ports = os.path.splitext(log_path)[0] + ".port"
    argv = [sys.executable, "-m", "bench.baseline_http", "--host", HOST, "--port", "0", "--port-file", ports]
    tls_args, ca_file = _tls_files(tls_dir)
    return ServerProcess("baseline-http", lambda: Launch(argv + tls_args), log_path, cpus, cwd=repo_root,
                         ca_file=ca_file, port_file_path=ports)


def _tls_files(tls_dir: str | None) -> tuple[list[str], str | None]:
    """([--tls-cert FILE --tls-key FILE], the CA file) for a certificate for 127.0.0.1 made in
    tls_dir; ([], None) without one."""
    if tls_dir is None:
        return [], None
    os.makedirs(tls_dir, exist_ok=True)
    ca = make_test_ca(tls_dir)
    cert, key = make_server_cert(tls_dir, ca)
    return ["--tls-cert", cert, "--tls-key", key], ca[0]


def _http_health(port: int, ca_file: str | None = None) -> bool:
    status, _ = request_once(HOST, port, b"GET /healthz HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (HOST.encode(), port), timeout_s=2,
                             ca_file=ca_file)
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
PEER_BINARIES = {"redis-aof": "redis-server", "redis-mem": "redis-server", "etcd": "etcd", "nats": "nats-server"}
# Peers driven only by the Go loader; the others it drives for queue-latency alone.
LOADER_DRIVEN = ("etcd", "postgres", "nats")
POSTGRES_BIN = "/usr/lib/postgresql/15/bin"  # Debian's postgresql-15 keeps its programs off PATH


def peer_missing(system: str) -> str | None:
    """None when the peer can run here; otherwise why not ("not installed: ...")."""
    if system == "postgres":
        if not os.path.exists(os.path.join(POSTGRES_BIN, "postgres")):
            found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
            return ("not installed: no PostgreSQL 15 in " + POSTGRES_BIN
                    + (f" (found {', '.join(found)}; the bench compares with 15)" if found else "")
                    + " (run bench/peers/install.sh)")
    elif shutil.which(PEER_BINARIES[system]) is None:
        return f"not installed: no `{PEER_BINARIES[system]}` on PATH (run bench/peers/install.sh)"
    if system in LOADER_DRIVEN and not loader_built():
        return "not installed: the Go loader bench/peers/peerload/peerload is not built (run bench/peers/install.sh)"
    return None


def loader_built() -> bool:
    from bench.peers.loader import loader_path
    return os.path.exists(loader_path())


def redis_server(system: str, data_dir: str, log_path: str, cpus: list[int] | None) -> ServerProcess:
    """Redis on 127.0.0.1 with its files in data_dir. redis-aof: appendonly yes, appendfsync
    always (every write fsynced before its reply: the durable, comparable setting); redis-mem: no
    persistence at all (the in-memory ceiling)."""
    def launch() -> Launch:
        port = free_port()
        argv = [shutil.which("redis-server") or "redis-server", "--bind", HOST, "--port", str(port), "--dir", data_dir,
                "--save", "", "--daemonize", "no", "--protected-mode", "yes", "--logfile", "", "--databases", "1"]
        if system == "redis-aof":
            argv += ["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", "yes"]
        else:
            argv += ["--appendonly", "no"]
        return Launch(argv, port)

    return ServerProcess(system, launch, log_path, cpus, health=_redis_health)


def etcd_server(data_dir: str, log_path: str, cpus: list[int] | None, name: str = "etcd") -> ServerProcess:
    """Single-node etcd on 127.0.0.1, its data dir on the same disk as Queen's. Defaults otherwise:
    etcd fsyncs its WAL before it answers a write, as Queen does."""
    def launch() -> Launch:
        port, peer_port = free_port(), free_port()
        client, peer = f"http://{HOST}:{port}", f"http://{HOST}:{peer_port}"
        argv = [shutil.which("etcd") or "etcd", "--name", "bench", "--data-dir", data_dir,
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"bench={peer}", "--initial-cluster-state", "new",
                "--log-level", "warn", "--logger", "zap", "--log-outputs", "stderr"]
        return Launch(argv, port)

    return ServerProcess(name, launch, log_path, cpus, health=_etcd_health)


def _postgres_health(port: int) -> bool:
    done = subprocess.run([os.path.join(POSTGRES_BIN, "pg_isready"), "-q", "-h", HOST, "-p", str(port)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5)
    return done.returncode == 0


def postgres_server(data_dir: str, log_path: str, cpus: list[int] | None) -> ServerProcess:
    """PostgreSQL 15 on 127.0.0.1 from a fresh initdb in data_dir (trust auth for the user
    `bench`, loopback only). Durable as shipped: fsync on, synchronous_commit on (a commit answers
    after its WAL is fsynced). Sized for the run rather than for a laptop: 1 GB of shared buffers
    and a WAL big enough that no checkpoint is forced mid-run. Run as the `postgres` user when the
    bench runs as root, since PostgreSQL refuses root."""
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        account = pwd.getpwnam(user)
        os.chown(data_dir, account.pw_uid, account.pw_gid)
    cluster = os.path.join(data_dir, "cluster")
    with open(log_path, "ab") as log:
        subprocess.run([os.path.join(POSTGRES_BIN, "initdb"), "-D", cluster, "-U", "bench", "--auth=trust", "-E", "UTF8",
                        "--no-instructions"], check=True, stdin=subprocess.DEVNULL, stdout=log, stderr=log, user=user,
                       timeout=120)
    def launch() -> Launch:
        port = free_port()
        argv = [os.path.join(POSTGRES_BIN, "postgres"), "-D", cluster, "-k", data_dir, "-h", HOST, "-p", str(port),
                "-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "shared_buffers=1GB", "-c", "max_wal_size=8GB",
                "-c", "max_connections=300"]
        return Launch(argv, port)

    return ServerProcess("postgres", launch, log_path, cpus, health=_postgres_health, user=user)


def nats_server(data_dir: str, log_path: str, cpus: list[int] | None) -> ServerProcess:
    """nats-server with JetStream, file storage in data_dir. Its durability is what the packaged
    version offers: 2.9 has no per-write fsync setting (`sync_interval` arrived in 2.10 and 2.9
    refuses it), so a publish is acknowledged once it is in the OS's page cache, and the file
    store syncs on its own timer. The report says so beside every NATS figure."""
    def launch() -> Launch:
        port, monitor = free_port(), free_port()
        argv = [shutil.which("nats-server") or "nats-server", "-a", HOST, "-p", str(port), "-m", str(monitor),
                "-js", "-sd", data_dir]
        return Launch(argv, port, health=lambda _port: _http_health_at(monitor, "/healthz"))

    return ServerProcess("nats", launch, log_path, cpus)


def _http_health_at(port: int, path: str) -> bool:
    status, _ = http_get_to_close(port, path, timeout_s=2)
    return status == 200


def http_get_to_close(port: int, path: str, timeout_s: float = 5.0, ca_file: str | None = None,
                      token: str | None = None) -> tuple[int, bytes]:
    """GET with `connection: close`, read to the end; a chunked body (etcd's /metrics) is decoded."""
    authorization = b"authorization: Bearer %s\r\n" % token.encode() if token else b""
    with open_socket(HOST, port, ca_file) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(b"GET %s HTTP/1.1\r\nhost: %s:%d\r\nconnection: close\r\n%s\r\n"
                     % (path.encode(), HOST.encode(), port, authorization))
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
