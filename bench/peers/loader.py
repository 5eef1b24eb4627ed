"""Drive the Go loader (bench/peers/peerload) like a generator: etcd, PostgreSQL and NATS
JetStream for every workload they have, and queue-latency for every system.

Owns: starting `peerload` pinned to the generator CPU with the run's shape, the same start / go /
finish protocol as `bench.loadgen.Generator` (so a run it drives is measured, CPU-accounted and
reported exactly as a run of the Python generator), and the preload of etcd's KV key space.

Never: points the loader anywhere but 127.0.0.1, or leaves it running: a loader that does not
finish is killed by its own pid.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
import time

from bench.loadgen import DRAIN_S, Tally

HERE = os.path.dirname(os.path.abspath(__file__))
# Setup connects every client and may preload a queue (a million messages into PostgreSQL).
SETUP_TIMEOUT_S = 300.0
# The loader starts its window this long after it reads it, as the Python generator does.
START_DELAY_NS = 100_000_000


def loader_path() -> str:
    return os.path.join(HERE, "peerload", "peerload")


def preload(port: int, keys_total: int) -> None:
    subprocess.run([loader_path(), "-system", "etcd", "-endpoint", f"127.0.0.1:{port}", "-keys", str(keys_total), "-preload"],
                   check=True, timeout=120, stdin=subprocess.DEVNULL)


def _read_line(process: subprocess.Popen, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
            raise RuntimeError(f"peerload said nothing within {timeout_s} s")
        chunk = os.read(process.stdout.fileno(), 1 << 20)
        if not chunk:
            raise RuntimeError("peerload exited early")
        line += chunk
    return line


class PeerLoader:
    """One peerload process for one run. Use as a Generator: start() (connects every client and
    sets it up), go(warmup_s, duration_s) -> the window's monotonic bounds, finish() -> Tally.
    `pids` is for CPU accounting."""

    def __init__(self, host: str, port: int, system: str, workload: str, ops: int, connections: int,
                 cpus: list[int] | None = None, keys_total: int = 10_000, tag: str = "r", extra: tuple = ()):
        if host != "127.0.0.1":
            raise ValueError("the bench drives 127.0.0.1 only")
        self.argv = [loader_path(), "-system", system, "-endpoint", f"{host}:{port}", "-workload", workload,
                     "-ops", str(ops), "-connections", str(connections), "-keys", str(keys_total), "-tag", tag,
                     *extra]
        self.cpus = cpus
        self.process: subprocess.Popen | None = None
        self.pids: list[int] = []
        self.window_ms = (0, 0)

    def start(self) -> None:
        cpus = self.cpus
        # stderr to a file, not a pipe: a client library may log more than a pipe holds while nobody reads it.
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self.pids = [self.process.pid]
        try:
            line = _read_line(self.process, SETUP_TIMEOUT_S)
        except RuntimeError as error:
            self._kill()
            raise RuntimeError(f"{error}: {self._stderr_tail()}") from None
        if line.strip() != b"ready":
            self._kill()
            raise RuntimeError(f"peerload did not get ready: {line[:300]!r}")

    def go(self, warmup_s: float, duration_s: float) -> tuple[int, int, int]:
        self.window_ms = (round(warmup_s * 1000), round(duration_s * 1000))
        self.process.stdin.write(b"%d %d\n" % self.window_ms)
        self.process.stdin.flush()
        t_start = time.monotonic_ns() + START_DELAY_NS
        t_measure = t_start + int(warmup_s * 1e9)
        return t_start, t_measure, t_measure + int(duration_s * 1e9)

    def finish(self) -> Tally:
        try:
            line = _read_line(self.process, DRAIN_S + 30)
        except RuntimeError as error:
            self._kill()
            raise RuntimeError(f"{error}: {self._stderr_tail()}") from None
        self.process.wait(timeout=10)
        if self.process.returncode != 0:
            raise RuntimeError(f"peerload exited with {self.process.returncode}: {self._stderr_tail()}")
        self.stderr.close()
        wire = json.loads(line)
        # The loader counts in the window it was told; a stale binary that ignores it would be
        # divided by the wrong duration, so the two must agree.
        if wire.get("window_ms") != list(self.window_ms):
            raise RuntimeError(f"peerload used the window {wire.get('window_ms')} ms, not {list(self.window_ms)}: "
                               "rebuild it (bench/peers/build_peerload.sh)")
        return Tally.from_wire(wire)

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-500:]

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
