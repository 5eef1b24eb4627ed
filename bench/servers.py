"""The servers under test, as child processes this benchmark starts, pins, watches and stops.

Owns: a free loopback port, a fresh data directory, the child pinned to its CPU from the moment
it starts (sched_setaffinity in preexec_fn, so even its first import runs there), waiting for it
to answer /healthz, reading its /metrics, and stopping it with SIGTERM by its own pid (SIGKILL by
the same pid only if it ignores SIGTERM past a grace period; the report then says so).

Never: signals a process it did not start, or binds anything but 127.0.0.1.
"""

from __future__ import annotations

import os
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
                 cwd: str | None = None):
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
        request = b"GET /healthz HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (HOST.encode(), self.port)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before answering; see {self.log_path}")
            try:
                status, _ = request_once(HOST, self.port, request, timeout_s=2)
                if status == 200:
                    return
            except (OSError, ResponseError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer /healthz within {START_TIMEOUT_S} s; see {self.log_path}")

    def get(self, path: str) -> tuple[int, bytes]:
        return request_once(HOST, self.port, b"GET %s HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (path.encode(), HOST.encode(), self.port))

    def post(self, request: bytes) -> tuple[int, bytes]:
        return request_once(HOST, self.port, request, timeout_s=30)

    def metrics(self) -> dict[str, float]:
        """Prometheus text of /metrics as {name: value} (Queen's metrics have no labels yet)."""
        status, body = self.get("/metrics")
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
    argv = [sys.executable, "-m", "bench.baseline_h11", "--host", HOST, "--port", str(port)]
    return ServerProcess("baseline-h11", argv, port, log_path, cpus, cwd=repo_root)
