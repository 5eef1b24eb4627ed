"""The load generator: closed-loop HTTP/1.1 keep-alive clients over raw sockets, in one or more
processes pinned to the generator's CPU.

Owns: opening the connections, sending each connection's requests one at a time (one request
outstanding per connection, the next sent the moment the answer is whole), and timing each
request into a histogram. What a connection sends, how its answer is framed (HTTP/1.1 or RESP)
and checked, and what it counts, is its `Session`'s (sessions.py): a ring of pre-encoded bytes for
stateless workloads, a small state machine that reads the last answer for lock cycles and CAS. A run has three phases on one monotonic clock shared by
all processes: warm-up (sent, not counted), the measured window (answers completed inside it are
counted and timed), and a drain (no new requests; outstanding answers are read and checked).

Engines, one per way of doing concurrent sockets in Python, so the cheapest can be measured
rather than guessed (README.md has the figures): "selectors" (one epoll loop, non-blocking
sockets; the default), "threads" (a blocking socket per thread), "asyncio" (loop.sock_* on plain
sockets, no transports).

Never: has two requests outstanding on a connection (a RESP "request" of N ops is N commands in
one write, answered as one unit), reuses a connection after a malformed answer, or hides an error:
every non-200, short body or closed connection is counted by kind, with samples kept.

TLS (a Queen served with --tls-cert, `ca_file` given): every connection is an ssl.SSLSocket that
trusts that CA, its handshake done while connecting (blocking), before the clock runs. The
selectors and threads engines speak it; asyncio's sock_* calls refuse SSL sockets.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

from bench.histogram import Histogram
from bench.sessions import Context, ResponseError, take_response
from bench.workloads import FAMILY, Workload

RECV_BYTES = 1 << 18
DRAIN_S = 10.0
ERROR_SAMPLES_MAX = 5
ENGINES = ("selectors", "threads", "asyncio")


__all__ = ["ResponseError", "take_response", "Generator", "request_once", "ENGINES"]


@dataclass
class Plan:
    """What one generator process does; plain data so it pickles into the child."""
    host: str
    port: int
    workload: Workload
    system: str
    ops: int
    connections: list[int]  # global indices of this process's connections
    connections_total: int
    keys_total: int
    tag: str  # unique per run: names and keys of stateful workloads carry it
    engine: str = "selectors"
    cpus: list[int] | None = None
    ca_file: str | None = None  # speak TLS, trusting this CA

    def sessions(self) -> list:
        build = self.workload.drivers[FAMILY[self.system]]
        return [build(Context(self.host, self.port, self.ops, index, self.connections_total, self.keys_total, self.tag))
                for index in self.connections]


@dataclass
class Tally:
    """One process's outcome; merged across processes by `merge_tallies`."""
    histogram: Histogram = field(default_factory=Histogram)
    completed: int = 0  # answers completed inside the measured window
    answered: int = 0  # every answer, warm-up and drain included
    errors: dict = field(default_factory=dict)
    error_samples: list = field(default_factory=list)
    bytes_received: int = 0
    undrained: int = 0  # requests still unanswered when the drain gave up
    units: dict = field(default_factory=dict)  # what the sessions counted inside the window
    # Further histograms by name, beside the main one (timer-fire: "delivery_lag"); the Go loader's only.
    histograms: dict = field(default_factory=dict)

    def error(self, kind: str, sample: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.error_samples) < ERROR_SAMPLES_MAX:
            self.error_samples.append(f"{kind}: {sample}")

    def to_wire(self) -> dict:
        return {"histogram": self.histogram.to_wire(), "completed": self.completed, "answered": self.answered,
                "errors": self.errors, "error_samples": self.error_samples,
                "bytes_received": self.bytes_received, "undrained": self.undrained, "units": self.units,
                "histograms": {name: h.to_wire() for name, h in self.histograms.items()}}

    @classmethod
    def from_wire(cls, wire: dict) -> Tally:
        return cls(Histogram.from_wire(wire["histogram"]), wire["completed"], wire["answered"], wire["errors"],
                   wire["error_samples"], wire["bytes_received"], wire["undrained"], wire.get("units", {}),
                   {name: Histogram.from_wire(h) for name, h in (wire.get("histograms") or {}).items()})


def merge_tallies(tallies: list[Tally]) -> Tally:
    merged = Tally()
    for tally in tallies:
        merged.histogram.merge(tally.histogram)
        merged.completed += tally.completed
        merged.answered += tally.answered
        merged.bytes_received += tally.bytes_received
        merged.undrained += tally.undrained
        for unit, count in tally.units.items():
            merged.units[unit] = merged.units.get(unit, 0) + count
        for name, histogram in tally.histograms.items():
            merged.histograms.setdefault(name, Histogram()).merge(histogram)
        for kind, count in tally.errors.items():
            merged.errors[kind] = merged.errors.get(kind, 0) + count
        merged.error_samples.extend(tally.error_samples[: ERROR_SAMPLES_MAX - len(merged.error_samples)])
    return merged


def open_socket(host: str, port: int, ca_file: str | None = None) -> socket.socket:
    """A connected socket; with ca_file, a TLS one whose handshake is done."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ca_file is not None:
        sock = _client_context(ca_file).wrap_socket(sock, server_hostname=host)
    return sock


_contexts: dict[str, ssl.SSLContext] = {}


def _client_context(ca_file: str) -> ssl.SSLContext:
    """One context per CA file and process: loading the CA is not free, and sessions share it."""
    context = _contexts.get(ca_file)
    if context is None:
        context = _contexts[ca_file] = ssl.create_default_context(cafile=ca_file)
    return context


def _count_answer(taken, session, buf: bytearray, tally: Tally, elapsed_ns: int, t_measure: int, t_end: int) -> tuple[bool, int]:
    """Book one whole answer (every engine alike): the session checks and counts it, it leaves the
    buffer, and it is timed if it completed inside the window. Returns (server asked to close, now)."""
    total, status, close, body = taken
    now = time.monotonic_ns()
    counting = t_measure <= now < t_end
    tally.answered += 1
    session.answer(status, body, tally, counting)
    if type(body) is memoryview:
        body.release()
    del buf[:total]
    if counting:
        tally.completed += 1
        tally.histogram.record(elapsed_ns)
    return close, now


def _reopen(plan: Plan, tally: Tally, session, blocking: bool) -> socket.socket | None:
    """A fresh connection for a session whose last one failed; None (counted) if the server refuses."""
    try:
        sock = open_socket(plan.host, plan.port, plan.ca_file)
    except OSError as error:
        tally.error("connect_failed", repr(error))
        return None
    sock.setblocking(blocking)
    session.reset()
    return sock


# -- engine: selectors ---------------------------------------------------------------------------


class _Conn:
    __slots__ = ("session", "sock", "buf", "sent_at_ns", "busy")

    def __init__(self, session):
        self.session = session
        self.sock = None
        self.buf = bytearray()
        self.sent_at_ns = 0
        self.busy = False

    def send_next(self) -> None:
        request = self.session.request()
        self.sent_at_ns = time.perf_counter_ns()
        self.busy = True
        try:
            sent = self.sock.send(request)
        except ssl.SSLWantWriteError:
            sent = 0  # TLS: nothing taken (the record is retried whole, below)
        if sent != len(request):  # the kernel buffer was full: finish this one blocking
            self.sock.setblocking(True)
            self.sock.sendall(request[sent:])
            self.sock.setblocking(False)


def _run_selectors(plan: Plan, sessions, window, tally: Tally) -> None:
    t_end = 0  # set from the window after the connect step; drop() reads it
    selector = selectors.DefaultSelector()
    conns = [_Conn(session) for session in sessions]

    def connect(conn):
        conn.sock = open_socket(plan.host, plan.port, plan.ca_file)
        conn.sock.setblocking(False)
        conn.buf = bytearray()
        conn.busy = False
        conn.session.reset()
        selector.register(conn.sock, selectors.EVENT_READ, conn)

    def drop(conn, kind, sample):
        tally.error(kind, sample)
        selector.unregister(conn.sock)
        conn.sock.close()
        conn.sock = None
        conn.busy = False
        if time.monotonic_ns() < t_end:
            try:
                connect(conn)
                conn.send_next()
            except OSError as error:
                # The server is gone or refusing: this connection stays dead; the run goes on
                # with the others and its report carries the errors.
                tally.error("connect_failed", repr(error))
                if conn.sock is not None:
                    selector.unregister(conn.sock)
                    conn.sock.close()
                    conn.sock = None
                conn.busy = False

    tls = plan.ca_file is not None
    for conn in conns:
        connect(conn)
    yield  # connected: the parent may now fix the window
    t_start, t_measure, t_end = window
    _sleep_until(t_start)
    for conn in conns:
        conn.send_next()
    busy = len(conns)
    drain_until = t_end + int(DRAIN_S * 1e9)
    while busy:
        now = time.monotonic_ns()
        if now >= drain_until:
            break
        events = selector.select(timeout=0.5)
        for key, _ in events:
            conn = key.data
            try:
                data = conn.sock.recv(RECV_BYTES)
                if tls:
                    while conn.sock.pending():  # decrypted bytes the selector cannot see
                        data += conn.sock.recv(RECV_BYTES)
            except ssl.SSLWantReadError:
                continue  # TLS: only part of a record has come
            except OSError as error:
                drop(conn, "conn_error", repr(error))
                continue
            done_ns = time.perf_counter_ns()
            if not data:
                drop(conn, "conn_closed", "the server closed the connection")
                continue
            tally.bytes_received += len(data)
            buf = conn.buf
            buf += data
            try:
                taken = conn.session.take(buf)
            except ResponseError as error:
                drop(conn, "bad_response", str(error))
                continue
            if taken is None:
                continue
            close, now = _count_answer(taken, conn.session, buf, tally, done_ns - conn.sent_at_ns, t_measure, t_end)
            conn.busy = False
            if close or buf:
                drop(conn, "conn_closed" if close else "unasked_bytes", "connection: close" if close else repr(bytes(buf[:80])))
                continue
            if now < t_end or conn.session.owes_release():
                conn.send_next()
        busy = sum(1 for conn in conns if conn.busy)
    tally.undrained = busy
    for conn in conns:
        if conn.sock is not None:
            conn.sock.close()
    selector.close()


# -- engine: threads -----------------------------------------------------------------------------


def _run_threads(plan: Plan, sessions, window, tally: Tally):
    socks = [open_socket(plan.host, plan.port, plan.ca_file) for _ in sessions]
    yield
    t_start, t_measure, t_end = window
    tallies = [Tally() for _ in sessions]

    def worker(sock, session, mine: Tally):
        _sleep_until(t_start)
        buf = bytearray()
        while time.monotonic_ns() < t_end or session.owes_release():
            request = session.request()
            sent_ns = time.perf_counter_ns()
            try:
                sock.sendall(request)
                while True:
                    data = sock.recv(RECV_BYTES)
                    if not data:
                        raise ResponseError("the server closed the connection")
                    mine.bytes_received += len(data)
                    buf += data
                    taken = session.take(buf)
                    if taken is not None:
                        break
            except (OSError, ResponseError) as error:
                mine.error("conn_error", repr(error))
                sock.close()
                sock = _reopen(plan, mine, session, blocking=True)
                if sock is None:
                    return
                buf = bytearray()
                continue
            close, _ = _count_answer(taken, session, buf, mine, time.perf_counter_ns() - sent_ns, t_measure, t_end)
            if close:
                mine.error("conn_closed", "connection: close")
                sock.close()
                sock = _reopen(plan, mine, session, blocking=True)
                if sock is None:
                    return
        sock.close()

    threads = [threading.Thread(target=worker, args=(sock, session, mine), daemon=True)
               for sock, session, mine in zip(socks, sessions, tallies, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=(t_end - time.monotonic_ns()) / 1e9 + DRAIN_S)
        if thread.is_alive():
            tally.undrained += 1
    merged = merge_tallies(tallies)
    tally.histogram, tally.completed, tally.answered = merged.histogram, merged.completed, merged.answered
    tally.errors, tally.error_samples, tally.bytes_received = merged.errors, merged.error_samples, merged.bytes_received
    tally.units = merged.units


# -- engine: asyncio -----------------------------------------------------------------------------


def _run_asyncio(plan: Plan, sessions, window, tally: Tally):
    if plan.ca_file is not None:
        raise ValueError("the asyncio engine cannot speak TLS (loop.sock_* refuses SSL sockets); "
                         "use --engine selectors or threads")
    loop = asyncio.new_event_loop()
    socks = [open_socket(plan.host, plan.port) for _ in sessions]
    for sock in socks:
        sock.setblocking(False)
    yield
    t_start, t_measure, t_end = window

    async def client(sock, session):
        buf = bytearray()
        while time.monotonic_ns() < t_end or session.owes_release():
            request = session.request()
            sent_ns = time.perf_counter_ns()
            try:
                await loop.sock_sendall(sock, request)
                while True:
                    data = await loop.sock_recv(sock, RECV_BYTES)
                    if not data:
                        raise ResponseError("the server closed the connection")
                    tally.bytes_received += len(data)
                    buf += data
                    taken = session.take(buf)
                    if taken is not None:
                        break
            except (OSError, ResponseError) as error:
                tally.error("conn_error", repr(error))
                sock.close()
                sock = _reopen(plan, tally, session, blocking=False)
                if sock is None:
                    return
                buf = bytearray()
                continue
            close, _ = _count_answer(taken, session, buf, tally, time.perf_counter_ns() - sent_ns, t_measure, t_end)
            if close:
                tally.error("conn_closed", "connection: close")
                sock.close()
                sock = _reopen(plan, tally, session, blocking=False)
                if sock is None:
                    return
        sock.close()

    async def main():
        await asyncio.sleep(max(0, (t_start - time.monotonic_ns()) / 1e9))
        tasks = [asyncio.ensure_future(client(sock, session)) for sock, session in zip(socks, sessions, strict=True)]
        done, pending = await asyncio.wait(tasks, timeout=(t_end - time.monotonic_ns()) / 1e9 + DRAIN_S)
        tally.undrained = len(pending)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()  # a bug in the client must not pass as a quiet run

    loop.run_until_complete(main())
    loop.close()


_ENGINES = {"selectors": _run_selectors, "threads": _run_threads, "asyncio": _run_asyncio}


def _sleep_until(deadline_ns: int) -> None:
    delay = (deadline_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


# -- processes -----------------------------------------------------------------------------------


def _child(plan: Plan, pipe) -> None:
    """A generator process: connect, say ready, take the window, run, send the tally back."""
    try:
        if plan.cpus:
            os.sched_setaffinity(0, plan.cpus)
        sessions = plan.sessions()
        window = [0, 0, 0]
        tally = Tally()
        steps = _ENGINES[plan.engine](plan, sessions, window, tally)
        next(steps)  # connects
        pipe.send(("ready", None))
        window[:] = pipe.recv()
        for _ in steps:
            pass
        pipe.send(("done", tally.to_wire()))
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which fails the run loudly
        pipe.send(("failed", repr(error)))
        raise
    finally:
        pipe.close()


class Generator:
    """Generator processes for one run. Use: start() (connects), go(warmup_s, duration_s) -> the
    window's monotonic bounds, then finish() -> merged Tally. `pids` are for CPU accounting."""

    def __init__(self, host: str, port: int, workload: Workload, system: str, ops: int, connections: int,
                 processes: int = 1, engine: str = "selectors", cpus: list[int] | None = None,
                 keys_total: int = 10_000, tag: str = "r", ca_file: str | None = None):
        """ca_file: the server speaks TLS with a certificate this CA signed."""
        if engine not in _ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}")
        processes = max(1, min(processes, connections))
        context = multiprocessing.get_context("fork")
        self._children = []
        for index in range(processes):
            mine = list(range(index, connections, processes))
            plan = Plan(host, port, workload, system, ops, mine, connections, keys_total, tag, engine, cpus, ca_file)
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_child, args=(plan, child_end), daemon=True,
                                      name=f"bench-generator-{index}")
            self._children.append((process, parent_end, child_end))
        self.pids: list[int] = []

    def start(self) -> None:
        for process, _, child_end in self._children:
            process.start()
            child_end.close()
        self.pids = [process.pid for process, _, _ in self._children]
        for _, pipe, _ in self._children:
            kind, detail = _receive(pipe, timeout_s=60)
            if kind != "ready":
                raise RuntimeError(f"a generator process failed to start: {detail}")

    def go(self, warmup_s: float, duration_s: float) -> tuple[int, int, int]:
        t_start = time.monotonic_ns() + 100_000_000  # time for every child to read its window
        t_measure = t_start + int(warmup_s * 1e9)
        t_end = t_measure + int(duration_s * 1e9)
        for _, pipe, _ in self._children:
            pipe.send((t_start, t_measure, t_end))
        return t_start, t_measure, t_end

    def finish(self) -> Tally:
        tallies = []
        failures = []
        for process, pipe, _ in self._children:
            kind, detail = _receive(pipe, timeout_s=DRAIN_S + 30)
            if kind == "done":
                tallies.append(Tally.from_wire(detail))
            else:
                failures.append(detail)
            process.join(timeout=10)
        if failures:
            raise RuntimeError(f"generator process failed: {failures[0]}")
        return merge_tallies(tallies)


def _receive(pipe, timeout_s: float):
    if not pipe.poll(timeout_s):
        return "failed", f"no word from the generator process in {timeout_s} s"
    try:
        return pipe.recv()
    except EOFError:
        return "failed", "the generator process died without a word"


def request_once(host: str, port: int, request: bytes, timeout_s: float = 5.0,
                 ca_file: str | None = None) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, body). For health checks and preloads."""
    with open_socket(host, port, ca_file) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(request)
        buf = bytearray()
        while True:
            data = sock.recv(RECV_BYTES)
            if not data:
                raise ResponseError("the server closed the connection before answering")
            buf += data
            taken = take_response(buf)
            if taken is not None:
                _, status, _, body = taken
                result = status, bytes(body)
                body.release()
                return result
