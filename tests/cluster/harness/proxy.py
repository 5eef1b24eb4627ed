"""A TCP proxy for one link (client→node, node→etcd, node→node), driven by the test.

It runs in its own threads, so the test can change its mode while pytest code blocks on a
process. Modes, per direction ("up": from the dialing side to the upstream, "down": back):
  pass        bytes flow;
  blackhole   the proxy still accepts and reads, and silently drops what it read: a partition
              that looks like silence, not like a refusal (new connections are accepted too);
  delay N ms  each chunk is sent N ms after it was read (latency without netem; order kept);
  cut         `cut(direction)`: blackhole one direction only (one-way partition).
`reset()` closes every connection now with a TCP RST and answers each new one with a RST until
the mode changes. A connection that lost bytes to a blackhole or a cut is reset when the link
heals: a real partition delays bytes (TCP retransmits), it never drops some from the middle of a
stream, so such a stream must not carry on as if whole.

Owns: a listening socket on 127.0.0.1 (a port that stays the same for the proxy's life), the
upstream it dials for each new connection, which `retarget` changes (a restarted node binds new
ports: the proxy is pointed at them, and the dialing side never sees the change), and for each
connection two reader and two sender threads. Nothing here sleeps for time to pass except a
delayed chunk waiting its due time.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time

PASS, BLACKHOLE, DELAY, RESET = "pass", "blackhole", "delay", "reset"
UP, DOWN = "up", "down"
CHUNK = 65536


def _rst(sock: socket.socket) -> None:
    """Close with a RST (SO_LINGER 0). SHUT_RD wakes a thread blocked reading it without sending
    anything (SHUT_WR would send a FIN first)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    sock.close()


class _Direction:
    """One direction of one connection: a reader fills a queue of (due time, bytes), a sender drains it."""

    def __init__(self, link: _Link, source: socket.socket, sink: socket.socket, name: str):
        self.link, self.source, self.sink, self.name = link, source, sink, name
        self.queue: collections.deque = collections.deque()
        self.ready = threading.Condition()
        self.closed = False

    def read_loop(self) -> None:
        proxy = self.link.proxy
        try:
            while True:
                data = self.source.recv(CHUNK)
                if not data:
                    break
                mode, delay_ms = proxy.mode_of(self.name)
                if mode == BLACKHOLE:
                    self.link.lost_bytes = True
                    proxy.dropped_bytes += len(data)
                    continue
                with self.ready:
                    self.queue.append((time.monotonic() + delay_ms / 1000, data))
                    self.ready.notify()
        except OSError:
            pass
        with self.ready:
            self.closed = True
            self.ready.notify()

    def send_loop(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue and not self.closed:
                        self.ready.wait()
                    if not self.queue:
                        break
                    due, data = self.queue[0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        self.ready.wait(wait)  # a delayed chunk waits its due time (or a close)
                        continue
                    self.queue.popleft()
                self.sink.sendall(data)
            if not self.link.resetting:
                self.sink.shutdown(socket.SHUT_WR)  # pass the half-close on
        except OSError:
            pass
        self.link.direction_done()


class _Link:
    def __init__(self, proxy: Proxy, client: socket.socket, upstream: socket.socket | None):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.lost_bytes = False
        self.resetting = False
        self._done = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.upstream is None:  # accepted during a blackhole with no upstream: read and drop
            threading.Thread(target=self._swallow, daemon=True).start()
            return
        for source, sink, name in ((self.client, self.upstream, UP), (self.upstream, self.client, DOWN)):
            direction = _Direction(self, source, sink, name)
            threading.Thread(target=direction.read_loop, daemon=True).start()
            threading.Thread(target=direction.send_loop, daemon=True).start()

    def _swallow(self) -> None:
        try:
            while data := self.client.recv(CHUNK):
                self.lost_bytes = True
                self.proxy.dropped_bytes += len(data)
        except OSError:
            pass
        self.close(reset=False)

    def direction_done(self) -> None:
        with self._lock:
            self._done += 1
            done = self._done
        if done == 2:
            self.close(reset=False)

    def close(self, reset: bool) -> None:
        self.resetting = self.resetting or reset
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            if reset:
                _rst(sock)
            else:
                try:
                    sock.close()
                except OSError:
                    pass
        self.proxy._forget(self)


class Proxy:
    """`Proxy(("127.0.0.1", upstream_port)).start()`; dial `proxy.port` instead of the upstream.
    With no upstream (None: not started yet, or stopped) a new connection is refused, as a dead
    upstream's would be."""

    def __init__(self, upstream: tuple[str, int] | None, name: str = ""):
        self.upstream = upstream
        self.name = name
        self._modes = {UP: (PASS, 0), DOWN: (PASS, 0)}
        self._reset_all = False
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.port: int | None = None
        self.accepted = 0
        self.dropped_bytes = 0

    # -- control, from the test ------------------------------------------------------------------

    def mode_of(self, direction: str) -> tuple[str, int]:
        return self._modes[direction]

    @property
    def mode(self) -> str:
        if self._reset_all:
            return RESET
        up, down = self._modes[UP][0], self._modes[DOWN][0]
        return up if up == down else f"cut-{UP if up == BLACKHOLE else DOWN}"

    def pass_(self) -> None:
        """Heal: bytes flow both ways. Connections that lost bytes meanwhile are reset."""
        self._set(PASS, PASS)

    def blackhole(self) -> None:
        self._set(BLACKHOLE, BLACKHOLE)

    def delay(self, ms: int) -> None:
        self._set(PASS, PASS, ms)

    def cut(self, direction: str) -> None:
        """One-way partition: bytes going `direction` ("up": towards the upstream; "down": back
        to the dialing side) are dropped; the other way flows."""
        assert direction in (UP, DOWN), direction
        self._set(BLACKHOLE if direction == UP else PASS, BLACKHOLE if direction == DOWN else PASS)

    def reset(self) -> None:
        """Every open connection is reset now, every new one at once, until another mode is set."""
        with self._lock:
            self._reset_all = True
            links = list(self._links)
        for link in links:
            link.close(reset=True)

    def retarget(self, upstream: tuple[str, int] | None) -> None:
        """Dial `upstream` for every connection from now on (None: refuse them). Open connections
        keep the upstream they have."""
        self.upstream = upstream

    def _set(self, up: str, down: str, delay_ms: int = 0) -> None:
        with self._lock:
            self._reset_all = False
            self._modes = {UP: (up, delay_ms if up == PASS else 0), DOWN: (down, delay_ms if down == PASS else 0)}
            damaged = [link for link in self._links if link.lost_bytes] if up == down == PASS else []
        for link in damaged:
            link.close(reset=True)

    # -- running ----------------------------------------------------------------------------------

    def start(self, port: int = 0) -> Proxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        self._listener = listener
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True, name=f"proxy-{self.name}").start()
        return self

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept_loop(self, listener: socket.socket) -> None:
        # Its own listener, not self._listener: close() clears that while this thread may be
        # between two accepts.
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._reset_all:
                _rst(client)
                continue
            upstream = None
            if self._modes[UP][0] != BLACKHOLE:
                target = self.upstream
                if target is None:
                    _rst(client)  # nothing to dial: refused, as by a dead upstream
                    continue
                try:
                    upstream = socket.create_connection(target, timeout=5)
                    upstream.settimeout(None)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    _rst(client)  # the upstream refused (it is down): so does the link
                    continue
            link = _Link(self, client, upstream)
            with self._lock:
                self._links.add(link)
            link.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def connections(self) -> int:
        with self._lock:
            return len(self._links)

    def close(self) -> None:
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (Linux)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close(reset=True)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
