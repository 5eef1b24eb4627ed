"""Test helpers shipped with the package (like trio.testing): a real `queen serve` subprocess, a
Disk whose writes or fsyncs fail on demand, and a Disk that forgets what was not synced when the
simulated machine loses power.

Nothing here is imported by the server itself.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import time

from queen.runtime import port_file
from queen.wal.disk import Disk


class FaultyDisk(Disk):
    """A Disk that raises OSError(errno) on chosen operations, to test what the writer acknowledges.

    Set `fail_fsync_after` / `fail_write_after` to the number of calls that still succeed."""

    def __init__(self, fail_fsync_after: int | None = None, fail_write_after: int | None = None, errno_code: int = 5):
        self.fail_fsync_after = fail_fsync_after
        self.fail_write_after = fail_write_after
        self.errno_code = errno_code
        self.fsyncs = 0
        self.writes = 0

    def write(self, fd, data):
        self.writes += 1
        if self.fail_write_after is not None and self.writes > self.fail_write_after:
            raise OSError(self.errno_code, os.strerror(self.errno_code))
        super().write(fd, data)

    def fsync(self, fd):
        self.fsyncs += 1
        if self.fail_fsync_after is not None and self.fsyncs > self.fail_fsync_after:
            raise OSError(self.errno_code, os.strerror(self.errno_code))
        super().fsync(fd)


class Crash(OSError):
    """The simulated machine lost power: raised by the operation a ForgetfulDisk crashes at, and by
    every operation after it until `crash()` is called."""

    def __init__(self):
        super().__init__(errno.EIO, "simulated power loss")


class _Inode:
    __slots__ = ("data", "synced", "pending")

    def __init__(self):
        self.data = bytearray()  # what a reader sees now
        self.synced = b""  # what the last fsync made durable
        self.pending: list = []  # writes since: (offset, bytes), or (size, None) for a truncation


class ForgetfulDisk(Disk):
    """An in-memory disk that keeps written bytes and directory entries apart from synced ones, and
    on `crash()` keeps only what was synced, tearing or dropping the rest (after SQLite's test6.c).

    - A file's bytes are durable up to its last fsync. At a crash, the writes since then survive
      as a random prefix of them in order, the last one kept possibly torn and sometimes followed
      by garbage.
    - A directory entry (a file created, renamed or removed) is durable once its directory is
      fsynced. At a crash every entry changed since independently keeps its old or its new state,
      so a rename can leave both names, or neither.
    - `crash_at = n` makes the n-th mutating operation (write, fsync, create, allocate, rename,
      remove, truncate, directory fsync) raise Crash without taking effect (a write may land in
      part), and every operation after it raise Crash too: the process is dead from there on.
      `ops` counts them, so a first run with `crash_at = None` tells how many crash points a
      workload has.
    Paths are only keys here; nothing touches the real file system.
    """

    def __init__(self, seed: int = 0, crash_at: int | None = None):
        self.rng = random.Random(seed)
        self.crash_at = crash_at
        self.ops = 0
        self.dead = False
        self.crashes = 0
        self._files: dict[str, _Inode] = {}
        self._durable: dict[str, _Inode] = {}
        self._fds: dict[int, list] = {}  # fd -> [inode, position, appending]
        self._next_fd = 1000

    def _tick(self) -> bool:
        """Count a mutating operation; True if it is the one to crash at (the caller may tear it)."""
        if self.dead:
            raise Crash()
        self.ops += 1
        if self.crash_at is not None and self.ops >= self.crash_at:
            self.dead = True
            return True
        return False

    # -- reading ------------------------------------------------------------------------------------

    def list_dir(self, path: str) -> list[str]:
        if self.dead:
            raise Crash()
        prefix = path.rstrip("/") + "/"
        return [name[len(prefix):] for name in self._files if name.startswith(prefix) and "/" not in name[len(prefix):]]

    def read_file(self, path: str) -> bytes:
        if self.dead:
            raise Crash()
        inode = self._files.get(path)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return bytes(inode.data)

    # -- writing --------------------------------------------------------------------------------------

    def _open(self, inode: _Inode, appending: bool) -> int:
        self._next_fd += 1
        self._fds[self._next_fd] = [inode, 0, appending]
        return self._next_fd

    def open_append(self, path: str) -> int:
        if self._tick():
            raise Crash()
        inode = self._files.get(path)
        if inode is None:
            inode = self._files[path] = _Inode()
        return self._open(inode, True)

    def create(self, path: str) -> int:
        if self._tick():
            raise Crash()
        inode = self._files.get(path)
        if inode is None:
            inode = self._files[path] = _Inode()
        else:
            _apply(inode, 0, None)
        return self._open(inode, False)

    def allocate(self, fd: int, size: int) -> None:
        inode = self._fds[fd][0]
        if self._tick():
            raise Crash()
        if size > len(inode.data):
            _apply(inode, len(inode.data), bytes(size - len(inode.data)))

    def write(self, fd: int, data: bytes) -> None:
        entry = self._fds[fd]
        inode = entry[0]
        offset = len(inode.data) if entry[2] else entry[1]
        if self._tick():
            _apply(inode, offset, data[:self.rng.randrange(len(data) + 1)])  # the write may land in part
            raise Crash()
        _apply(inode, offset, data)
        entry[1] = offset + len(data)

    def fsync(self, fd: int) -> None:
        if self._tick():
            raise Crash()
        inode = self._fds[fd][0]
        inode.synced = bytes(inode.data)
        inode.pending = []

    def close(self, fd: int) -> None:
        if self.dead:
            raise Crash()
        del self._fds[fd]

    def fsync_dir(self, path: str) -> None:
        if self._tick():
            raise Crash()
        prefix = path.rstrip("/") + "/"
        for name in set(self._files) | set(self._durable):
            if name.startswith(prefix) and "/" not in name[len(prefix):]:
                if name in self._files:
                    self._durable[name] = self._files[name]
                else:
                    self._durable.pop(name, None)

    def rename(self, source: str, target: str) -> None:
        if self._tick():
            raise Crash()
        self._files[target] = self._files.pop(source)

    def remove(self, path: str) -> None:
        if self._tick():
            raise Crash()
        del self._files[path]

    def truncate(self, path: str, size: int) -> None:
        if self._tick():
            raise Crash()
        inode = self._files[path]
        _apply(inode, size, None)
        inode.synced = bytes(inode.data)
        inode.pending = []

    # -- the power loss -------------------------------------------------------------------------------

    def crash(self) -> None:
        """Keep what was synced, tear or drop the rest, and come back up."""
        rng = self.rng
        survivors: dict[str, _Inode] = {}
        for name in sorted(set(self._files) | set(self._durable)):
            old, new = self._durable.get(name), self._files.get(name)
            inode = old if old is new else rng.choice((old, new))
            if inode is not None:
                survivors[name] = inode
        for inode in {id(i): i for i in survivors.values()}.values():
            kept = _Inode()
            kept.data = bytearray(inode.synced)
            landed = rng.randrange(len(inode.pending) + 1)
            for index, (offset, data) in enumerate(inode.pending[:landed]):
                if data is not None and index == landed - 1 and data:
                    data = data[:rng.randrange(1, len(data) + 1)]  # the last write to land may be torn
                    if rng.random() < 0.3:
                        data += rng.randbytes(rng.randrange(1, 64))  # a torn sector holds garbage
                _apply(kept, offset, data)
            inode.data = kept.data
            inode.synced = bytes(kept.data)
            inode.pending = []
        self._files = dict(survivors)
        self._durable = dict(survivors)
        self._fds.clear()
        self.dead = False
        self.crash_at = None
        self.crashes += 1


def _apply(inode: _Inode, offset: int, data: bytes | None) -> None:
    """Write data at offset (None: truncate to offset), and remember it as not yet synced."""
    if data is None:
        del inode.data[offset:]
    else:
        if offset > len(inode.data):
            inode.data += bytes(offset - len(inode.data))
        inode.data[offset:offset + len(data)] = data
    inode.pending.append((offset, data))


# Every log file a ServerProcess wrote in this interpreter: tests/conftest.py parses each line of
# each of them at the end of the run.
SERVER_LOG_FILES: set[str] = set()

_LOG_KEY = r"[A-Za-z_][A-Za-z0-9_.]*"
_LOG_VALUE = r'(?:[^\s="\\]+|"(?:[^"\\]|\\.)*")'
_LOGFMT_LINE = re.compile(rf"{_LOG_KEY}={_LOG_VALUE}(?: {_LOG_KEY}={_LOG_VALUE})*")
_LOGFMT_PAIR = re.compile(rf"({_LOG_KEY})=({_LOG_VALUE})")
_LOG_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def parse_logfmt(line: str) -> dict:
    """Strict logfmt: key=value pairs, single spaces, values bare or double-quoted with \\ escapes;
    a UTC `ts` and a `level` on every line. AssertionError when the line is anything else."""
    assert _LOGFMT_LINE.fullmatch(line), f"not logfmt: {line!r}"
    fields = {}
    for key, value in _LOGFMT_PAIR.findall(line):
        if value.startswith('"'):
            value = re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), value[1:-1])
        fields[key] = value
    assert _LOG_UTC.fullmatch(fields.get("ts", "")) and fields.get("level") in _LOG_LEVELS, f"no ts or level: {line!r}"
    return fields


def parse_json_log(line: str) -> dict:
    """One JSON object per line with a UTC `ts` and a `level`. AssertionError otherwise."""
    fields = json.loads(line)
    assert isinstance(fields, dict), f"not a JSON object: {line!r}"
    assert _LOG_UTC.fullmatch(fields.get("ts", "")) and fields.get("level") in _LOG_LEVELS, f"no ts or level: {line!r}"
    return fields


def parse_log_line(line: str) -> dict:
    """A server's log line in either format (--log-format logfmt or json)."""
    return parse_json_log(line) if line.startswith("{") else parse_logfmt(line)


class ServerProcess:
    """A real `queen serve` on 127.0.0.1 and a free port, started and stopped by the test.

    The server binds port 0 and says which port it got in its port file (--port-file, beside its
    log unless the test gives one): no port is picked before the server binds it, so none can be
    taken meanwhile. `port` (and a cluster node's `replication_port`) are what it bound.
    Stopped only by its own pid. `kill()` is SIGKILL (a crash); `stop()` is SIGTERM (a clean exit).
    """

    def __init__(self, data_dir: str, *extra_args: str, env: dict | None = None, open_files_max: int | None = None,
                 module: str = "queen", ca_file: str | None = None):
        """open_files_max: run the server under this open-file limit (soft and hard), as a host
        with a tight `ulimit -n` would. module: what `python -m` runs; the fault suite passes its
        own entry point, which wraps `queen serve` in test-only faults. ca_file: the CA that signed
        the server's certificate, which `request` trusts when the server serves HTTPS (--tls-cert)."""
        self.data_dir = data_dir
        self.tls = (any(arg.partition("=")[0] == "--tls-cert" for arg in extra_args)
                    or bool((env or {}).get("QUEEN_TLS_CERT")))
        self.ca_file = ca_file
        self.module = module
        self.extra_args = list(extra_args)
        self.env = env
        self.open_files_max = open_files_max
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.replication_port: int | None = None  # a cluster node's
        base = os.path.join(os.path.dirname(os.path.abspath(data_dir)), os.path.basename(data_dir))
        self.stderr_path = base + ".log"
        self.port_file = _port_file_given(self.extra_args, env) or base + ".port"
        SERVER_LOG_FILES.add(self.stderr_path)

    def start(self, timeout_s: float = 20.0, port: int = 0) -> ServerProcess:
        """Start it on `port` (0: a free one, the server's choice) and wait until it listens."""
        env = dict(os.environ, **(self.env or {}))
        env.setdefault("PYTHONUNBUFFERED", "1")
        port_file.remove(self.port_file)  # a killed server's: the new one writes its own once it listens
        self._log = open(self.stderr_path, "ab")
        start_offset = self._log.tell()
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, "serve", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", self.data_dir, "--port-file", self.port_file, *self.extra_args],
            stdout=subprocess.DEVNULL, stderr=self._log, env=env, preexec_fn=self._limit_open_files)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ports = port_file.read(self.port_file)
            if ports is not None:
                self.port, self.replication_port = ports["port"], ports.get("replicationPort")
                return self
            if self.process.poll() is not None:
                self._close_log()
                with open(self.stderr_path, "rb") as f:
                    f.seek(start_offset)
                    text = f.read().decode(errors="replace")
                raise RuntimeError(f"queen serve exited with {self.process.returncode}:\n{text}")
            time.sleep(0.02)  # waiting on a real process to come up, not on time to pass
        self.kill()
        raise RuntimeError(f"queen serve did not start within {timeout_s} s")

    def restart(self, timeout_s: float = 20.0) -> ServerProcess:
        """Start it again on the port it had, as a broker restarted by systemd comes back where its
        clients look for it. Another process may have taken that port since this one let it go
        (rarely): a test whose clients can follow a new port calls `start()` instead."""
        return self.start(timeout_s, port=self.port)

    def _limit_open_files(self) -> None:
        if self.open_files_max is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files_max, self.open_files_max))

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts the server's CA (ca_file)."""
        return ssl.create_default_context(cafile=self.ca_file)

    def log_text(self) -> str:
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def metrics(self) -> dict[str, float]:
        status, text = self.request("GET", "/metrics")
        assert status == 200, (status, text)
        return parse_metrics(text.decode())

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self._close_log()

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()
        return self.process.returncode

    def _close_log(self) -> None:
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- a tiny blocking client, enough for tests --------------------------------------------------

    def request(self, method: str, path: str, body=None, headers: dict | None = None, timeout_s: float = 10.0):
        """(status, decoded JSON or raw bytes) of one request on a fresh connection."""
        if self.tls:
            connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout_s,
                                                     context=self.ssl_context())
        else:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            connection.request(method, path, body=data, headers={"content-type": "application/json", **(headers or {})})
            response = connection.getresponse()
            raw = response.read()
            try:
                return response.status, json.loads(raw)
            except ValueError:
                return response.status, raw
        finally:
            connection.close()


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {name: value} (a labelled series keeps its labels in the name)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    return values


# -- throwaway certificates (the openssl command line) ---------------------------------------------


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def make_test_ca(directory: str, name: str = "ca") -> tuple[str, str]:
    """A throwaway certificate authority in directory: (certificate path, key path), PEM. Needs the
    `openssl` command (shutil.which("openssl") tells)."""
    cert, key = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN=Queen test CA {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def make_server_cert(directory: str, ca: tuple[str, str], name: str = "server", serial: int = 1,
                     alt_names: str = "IP:127.0.0.1,DNS:localhost") -> tuple[str, str]:
    """A server certificate for 127.0.0.1 and localhost (or `alt_names`, as openssl's
    subjectAltName says them) signed by `ca` (make_test_ca's pair): (certificate path, key path),
    PEM; its subject is CN=<name>, its serial `serial`."""
    cert, key = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    request, extensions = os.path.join(directory, f"{name}.csr"), os.path.join(directory, f"{name}.ext")
    with open(extensions, "w") as f:
        f.write(f"subjectAltName={alt_names}\nbasicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", request, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", request, "-CA", ca[0], "-CAkey", ca[1], "-set_serial", str(serial),
             "-days", "2", "-out", cert, "-extfile", extensions)
    return cert, key


def _port_file_given(args: list[str], env: dict | None) -> str | None:
    """The --port-file a test passes itself (flag or QUEEN_PORT_FILE), if it does."""
    for index, arg in enumerate(args):
        if arg == "--port-file" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--port-file="):
            return arg.partition("=")[2]
    return (env or {}).get("QUEEN_PORT_FILE") or None


def free_port() -> int:
    """A loopback port that nothing listened on a moment ago, for a URL that must find nobody
    there (a dead node, a refused connection). Never to start a server on: another process may
    take it before the server binds it. Start servers on port 0 and read the port they bound
    (ServerProcess, open_server, `queen serve --port-file`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- in-process servers for trio tests (MockClock-friendly) ---------------------------------------


async def run_inline(fn, *args):
    """Run blocking disk work on the event loop. Only for tests: under MockClock's autojump a worker
    thread looks like idleness, and virtual time would leap during every fsync."""
    return fn(*args)


class open_server:
    """`async with open_server(data_dir, **config) as server:` a whole Queen on 127.0.0.1:<free>,
    in this trio run. `server.port` is bound; leaving the block shuts it down."""

    def __init__(self, data_dir: str, *, disk: Disk | None = None, wall_at_start_ms: int | None = None,
                 disk_inline: bool = True, **config):
        """disk_inline=False keeps the production disk thread: for tests of what happens while a
        write is under way, paired with a frozen MockClock rather than autojump."""
        from queen.config import Config
        from queen.runtime.server import Server

        self.server = Server(Config(host="127.0.0.1", port=0, data_dir=str(data_dir), **config),
                             disk=disk, wall_at_start_ms=wall_at_start_ms,
                             run_blocking=run_inline if disk_inline else None)

    async def __aenter__(self):
        import trio

        self._nursery_manager = trio.open_nursery()
        nursery = await self._nursery_manager.__aenter__()
        await nursery.start(self.server.run)
        return self.server

    async def __aexit__(self, *exc):
        for client in [client for client in _open_clients if client.port == self.server.port]:
            await client.aclose()  # a test's keep-alive connections end with its server
        self.server.request_shutdown()
        return await self._nursery_manager.__aexit__(*exc)


# HttpClients with a connection open, held (strongly: a client a test made inline is dropped right
# after its call) until they or their server close, so no socket is left to the garbage collector.
_open_clients: set = set()


class HttpClient:
    """A keep-alive HTTP/1.1 client on trio + h11, for in-process tests. ssl_context: speak HTTPS
    with it (the server's certificate must be valid for 127.0.0.1)."""

    def __init__(self, port: int, ssl_context: ssl.SSLContext | None = None):
        self.port = port
        self.ssl_context = ssl_context
        self._stream = None
        self._conn = None

    async def request(self, method: str, path: str, body=None, headers: dict | None = None):
        """(status, decoded JSON body, or raw bytes when it is not JSON)."""
        import h11
        import trio

        if self._stream is None:
            self._stream = await trio.open_tcp_stream("127.0.0.1", self.port)
            if self.ssl_context is not None:
                self._stream = trio.SSLStream(self._stream, self.ssl_context, server_hostname="127.0.0.1",
                                              https_compatible=True)
            self._conn = h11.Connection(h11.CLIENT)
            _open_clients.add(self)
        conn = self._conn
        data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [("host", "queen"), ("content-length", str(len(data))), ("content-type", "application/json"),
                *(headers or {}).items()]
        await self._stream.send_all(conn.send(h11.Request(method=method, target=path, headers=head))
                                    + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
        status, parts = None, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self._stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                parts.append(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            await self.aclose()
        else:
            conn.start_next_cycle()
        raw = b"".join(parts)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    async def locks(self, *operations):
        status, body = await self.request("POST", "/api/v1/locks", {"operations": list(operations)})
        assert status == 200, body
        return body["results"]

    async def aclose(self):
        _open_clients.discard(self)
        stream, self._stream, self._conn = self._stream, None, None
        if stream is not None:
            await stream.aclose()
