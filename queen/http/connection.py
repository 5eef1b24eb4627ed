"""HTTP/1.1 connections: non-blocking sockets driven through trio's low-level waits, h11 for every
request shape but the plain one, and the limits that keep one client from hurting the others.

Owns: accepting connections within the open-file budget (and who gives way at the limit), reading
one request at a time within its limits (head size, body size, time to arrive, idle time between
requests, time for the client to take its answer), handing it to the app, writing the response,
keep-alive, and the counts that shutdown waits on.

- No input ends the process. Malformed HTTP answers 400 (or 413/431/408) and closes the
  connection; a handler that fails answers 500 for that request alone and is logged with its
  traceback; a failure in this layer itself closes that one connection, logged the same way.
- Descriptors: at start the open-file limit is raised as far as allowed and the connection limit
  lowered to fit under it with FD_RESERVE to spare, so connections can never starve the log or
  the snapshots of descriptors. At the limit a new connection takes the place of the
  longest-idle keep-alive connection; with none idle, of the connection whose call has been
  parked longest (a pop or lock acquire waiting with waitMs), which is answered now as if its
  wait had run out and closed after that answer; with neither, the new one is answered 503 and
  closed (at most REFUSING_MAX of those at once; past that it is closed at once).
- Why parked calls give way rather than keep a reserve of connections they cannot take: a parked
  call holds its connection for up to a minute (Limits.wait_ms_max) and is never idle, so
  without either, a thousand consumers long-polling as the README shows lock every other client
  out, producers and health checks included, until their waits end. A reserve only moves that
  edge: once parked calls fill their share, the next poll must still be refused or end another,
  and the reserve stands unused whenever nobody else connects. Ending the oldest wait costs its
  client nothing it is not built for: the answer is the one its waitMs running out gives (an
  empty pop, an acquire with reason "timeout"; nothing was handed to it, so nothing is lost),
  and a long-polling client polls again, on a new connection. The call that has waited longest
  is the one that has had its share. How: the router watches the request's `answer_now` beside
  `wait_gone` (queen/runtime/router.py, `_wait_or_abandon`); it returns when this layer needs
  the connection back, and the router withdraws the parked operations as it does for a client
  that hung up, answering them "timeout".
- Framing the HTTP/1.1 grammar leaves open is refused, not guessed at: a request with both
  Content-Length and Transfer-Encoding, a head line ended by a bare LF or continued on the next
  line (obs-fold, RFC 9112 sections 2.2 and 5.2 allow refusing both; h11 would accept them), and
  a chunk announced larger than the body limit (answered 413 at once, as an oversized
  Content-Length is, instead of waiting for bytes that would be refused anyway).
- Deadlines are kept by one reaper task that looks at every connection every REAPER_INTERVAL_S,
  rather than a cancel scope per read and write: a connection idle past idle_timeout_s is closed,
  a request that does not arrive whole within request_read_timeout_s is answered 408, and an
  answer the client does not take within send_timeout_s ends the connection.

Sockets: each connection is a plain non-blocking socket; a read waits with trio.lowlevel's
wait_readable and then takes what is there in one recv, a write sends at once and waits for
writability only when the kernel's buffer is full. trio's stream wrappers cost about as much
again per request (bench/README.md, "HTTP layer").

Requests: a whole request of the plain shape nearly every client sends (one read, CRLF, ASCII
headers, a Content-Length body) is parsed by `parse_simple_request`, a strict subset of what h11
accepts that yields the same request; h11 costs several times more per request. Everything else (a
request split across reads, chunked bodies, 100-continue, obsolete syntax, anything malformed)
goes to h11, which also decides every error. Responses are written here as bytes: ours are a status
line and a few headers the server itself chose. Without h11 knowing about the response its state
machine cannot start a next cycle, so a request h11 reads gets a fresh h11.Connection, seeded with
whatever the client already sent.
"""

from __future__ import annotations

import errno
import logging
import re
import resource
import socket
from functools import partial
from http import HTTPStatus

import h11
import trio

from queen.config import Config
from queen.errors import QueenError
from queen.http.codec import encode_body

logger = logging.getLogger(__name__)

RECEIVE_BYTES = 65536
# After an error answer, how long and how much of the rest of a request is read and dropped.
LINGER_S = 2.0
LINGER_BYTES_MAX = 16 << 20
# Descriptors kept back from connections: listeners, the event loop's own, the WAL segment (two
# while one is cut), a snapshot being written and its directory, the log files, the refusals in
# flight, and room for the unexpected.
FD_RESERVE = 64
REFUSING_MAX = 16
REAPER_INTERVAL_S = 0.25
LISTEN_BACKLOG = 1024

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_NEVER = float("inf")

# What a connection is doing, for the reaper: what its deadline means.
IDLE, READING, HANDLING, WRITING = range(4)


class Request:
    __slots__ = ("method", "target", "content_type", "accept", "body", "keep_alive", "wait_gone", "answer_now")

    def __init__(self, method: bytes, target: bytes, content_type: bytes, accept: bytes, body: bytes,
                 keep_alive: bool = True):
        self.method = method
        self.target = target
        self.content_type = content_type
        self.accept = accept
        self.body = body
        self.keep_alive = keep_alive
        self.wait_gone = None  # async () -> None, returns when the client hangs up (set per connection)
        # async () -> None, returns when the server needs the connection back for a new client: a
        # call parked on it is then answered as if its wait ran out (set per connection).
        self.answer_now = None


class Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int, body: bytes, content_type: bytes, headers: list | None = None):
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class _Reject(Exception):
    """A request broke an HTTP-level rule: answer `status` with the error envelope and close."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.error = QueenError(code, message)


_INTERNAL = QueenError("internal", "the server failed to handle this request; see its log", http_status=500)
# The last resort when even an error answer cannot be built: fixed bytes.
_INTERNAL_BODY = (b'{"error":{"code":"internal","message":"the server failed to handle this request; see its log",'
                  b'"details":{}},"code":"internal","detail":"the server failed to handle this request; see its log"}')


def error_response(error: QueenError, wants_cbor: bool = False) -> Response:
    body, content_type = encode_body(error.to_wire(), wants_cbor)
    headers = None
    if error.http_status == 503:
        headers = [(b"retry-after", b"1")]
    elif error.http_status == 405 and "allow" in error.details:
        headers = [(b"allow", ", ".join(error.details["allow"]).encode())]
    return Response(error.http_status, body, content_type, headers)


def connection_budget(connections_max: int) -> int:
    """Raise the soft open-file limit toward connections_max + FD_RESERVE where the hard limit
    allows, and return how many connections fit under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections_max + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):
                pass
    if soft == resource.RLIM_INFINITY:
        return connections_max
    budget = min(connections_max, soft - FD_RESERVE)
    if budget < connections_max:
        logger.warning("event=connections_capped connections_max=%d allowed=%d open_files_limit=%d reserve=%d "
                       "hint='raise the open-file limit (ulimit -n, LimitNOFILE=) to allow more'",
                       connections_max, max(budget, 1), soft, FD_RESERVE)
    return max(budget, 1)


def open_listeners(host: str, port: int) -> list[socket.socket]:
    """Non-blocking listening sockets for every address host resolves to; port 0 takes one free
    port for all of them."""
    listeners = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                 flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(listeners) > 1:
                address = (address[0], listeners[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


class _Connection:
    """One accepted connection, as the reaper and the idle list see it."""

    __slots__ = ("sock", "scope", "phase", "deadline", "evicted")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.scope = trio.CancelScope()
        self.phase = IDLE
        self.deadline = _NEVER
        # Gave its place to a new connection: closed when idle, or (a parked call) answered now and
        # closed after that answer. No longer counted in `connections` either way.
        self.evicted = False


class HttpServer:
    def __init__(self, app, config: Config, connections_allowed: int | None = None):
        self.app = app
        self.config = config
        self.connections_allowed = connections_allowed or config.connections_max
        self.connections = 0
        self.requests_in_flight = 0
        self.requests_total = 0
        self.connections_refused = 0
        self.idle_closed = 0
        self.parks_ended = 0  # parked calls answered early to make room for a new connection
        self.timeouts = 0
        self.draining = False
        self._idle_event = trio.Event()
        self._open: set[_Connection] = set()
        self._idle: dict[_Connection, None] = {}  # idle keep-alive connections, longest idle first
        # Connections whose call is parked, longest parked first, each with the event that ends its wait.
        self._parked: dict[_Connection, trio.Event] = {}
        self._refusing = 0
        self._sockets = 0  # accepted and not yet closed: served, refused or being closed
        self._socket_closed = trio.lowlevel.ParkingLot()

    async def wait_no_requests(self) -> None:
        while self.requests_in_flight:
            self._idle_event = trio.Event()
            await self._idle_event.wait()

    # -- accepting ------------------------------------------------------------------------------------

    async def serve(self, listeners: list[socket.socket], connections: trio.Nursery) -> None:
        """Accept on every listener until cancelled; connection tasks run in `connections`, with
        the reaper."""
        connections.start_soon(self._reap)
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, connections)

    async def _accept(self, listener: socket.socket, connections: trio.Nursery) -> None:
        while True:
            if self._sockets >= self.connections_allowed + REFUSING_MAX:
                # Every descriptor we may spend is in use: make room by closing the longest-idle
                # connection (or wait for one to end), and take nothing from the backlog meanwhile.
                self._close_longest_idle()
                await self._socket_closed.park()
                continue
            await trio.lowlevel.wait_readable(listener)
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                continue
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Not within our own budget: something else holds descriptors. Leave the
                    # connection in the backlog for a moment rather than spin.
                    logger.warning("event=accept_failed error=%r action=retrying_in_100ms", str(error))
                    await trio.sleep(0.1)
                continue  # otherwise the client gave up before we took it (ECONNABORTED and the like)
            self._sockets += 1
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.connections >= self.connections_allowed and not (
                    self._close_longest_idle() or self._end_longest_park()):
                self._refuse(sock, connections)
                continue
            self.connections += 1
            connections.start_soon(self._serve_connection, sock)

    def _close_longest_idle(self) -> bool:
        """Make room for a new connection by closing the keep-alive connection idle longest."""
        for connection in self._idle:
            del self._idle[connection]
            connection.evicted = True
            connection.scope.cancel()
            self.connections -= 1
            self.idle_closed += 1
            return True
        return False

    def _end_longest_park(self) -> bool:
        """Make room for a new connection by answering the call parked longest now, as if its wait
        had run out; its connection closes after that answer (module docstring: why)."""
        for connection, answer_now in self._parked.items():
            del self._parked[connection]
            connection.evicted = True
            self.connections -= 1
            self.parks_ended += 1
            answer_now.set()
            return True
        return False

    async def _until_room_needed(self, connection: _Connection) -> None:
        """A request's `answer_now`: returns when a new connection needs this one's place. The
        connection counts as parked (it may be asked) only while a call waits on this."""
        answer_now = trio.Event()
        self._parked[connection] = answer_now
        try:
            await answer_now.wait()
        finally:
            if self._parked.get(connection) is answer_now:
                del self._parked[connection]

    def _closed(self, sock: socket.socket) -> None:
        sock.close()
        self._sockets -= 1
        self._socket_closed.unpark_all()

    def _refuse(self, sock: socket.socket, connections: trio.Nursery) -> None:
        self.connections_refused += 1
        if self._refusing >= REFUSING_MAX:
            self._closed(sock)  # a flood: no descriptor is spent on answering it
            return
        self._refusing += 1
        connections.start_soon(self._answer_refused, sock)

    async def _answer_refused(self, sock: socket.socket) -> None:
        try:
            response = error_response(QueenError(
                "too_many_connections", f"the server is at its limit of {self.connections_allowed} connections "
                "and none is idle; try again shortly", http_status=503))
            with trio.move_on_after(LINGER_S):
                await _send_all(sock, encode_response(response, keep_alive=False))
                await _linger(sock)
        except OSError:
            pass
        finally:
            self._refusing -= 1
            self._closed(sock)

    # -- deadlines ------------------------------------------------------------------------------------

    async def _reap(self) -> None:
        while True:
            await trio.sleep(REAPER_INTERVAL_S)
            now = trio.current_time()
            for connection in self._open:
                if connection.deadline <= now:
                    connection.deadline = _NEVER
                    if connection.phase != IDLE:
                        self.timeouts += 1
                    connection.scope.cancel()

    # -- one connection ------------------------------------------------------------------------------

    async def _serve_connection(self, sock: socket.socket) -> None:
        connection = _Connection(sock)
        self._open.add(connection)
        try:
            with connection.scope:
                await self._serve(connection)
            if connection.scope.cancelled_caught and connection.phase == READING:
                await self._send_error_and_close(connection, 408, QueenError(
                    "request_timeout", f"the request did not arrive whole within {self.config.request_read_timeout_s} s"))
        except OSError:
            pass  # the client went away (reset, broken pipe): nothing to answer
        except Exception:
            logger.exception("event=connection_failed action=closed")
        finally:
            self._open.discard(connection)
            self._idle.pop(connection, None)
            if not connection.evicted:
                self.connections -= 1
            self._closed(sock)

    async def _serve(self, connection: _Connection) -> None:
        config = self.config
        sock = connection.sock
        idle = self._idle
        pending = b""
        while True:
            if not pending:
                connection.phase = IDLE
                connection.deadline = trio.current_time() + config.idle_timeout_s
                idle[connection] = None
                pending = await _receive(sock)
                idle.pop(connection, None)
                if not pending or connection.evicted:
                    # Evicted to make room after its request arrived but before this task ran on:
                    # it is no longer counted, so it must not run a request (a parked acquire
                    # would be granted to a client whose connection is already closed).
                    return
            try:
                simple = parse_simple_request(pending, config)
            except _Reject as reject:
                await self._send_error_and_close(connection, reject.status, reject.error)
                return
            if simple is not None:
                request, rest = simple
                buffer = _Buffer(rest)
            else:
                connection.phase = READING
                connection.deadline = trio.current_time() + config.request_read_timeout_s
                buffer = h11_conn = h11.Connection(h11.SERVER, max_incomplete_event_size=config.header_bytes_max)
                try:
                    request = await self._read_request(h11_conn, sock, pending)
                except _Reject as reject:
                    await self._send_error_and_close(connection, reject.status, reject.error)
                    return
                except h11.RemoteProtocolError as error:
                    status = error.error_status_hint if error.error_status_hint in (400, 413, 431) else 400
                    await self._send_error_and_close(connection, status, QueenError("bad_http", f"malformed HTTP request: {error}"))
                    return
                if request is None:
                    return
            connection.phase = HANDLING
            connection.deadline = _NEVER
            request.wait_gone = partial(_wait_gone, buffer, sock)
            request.answer_now = partial(self._until_room_needed, connection)
            self.requests_in_flight += 1
            self.requests_total += 1
            try:
                response = await self._handle(request)
            finally:
                self.requests_in_flight -= 1
                if not self.requests_in_flight:
                    self._idle_event.set()
            # A connection that gave its place to a new one closes after this answer.
            keep_alive = request.keep_alive and not self.draining and not connection.evicted
            if request.method == b"HEAD":
                response.body = b""
            connection.phase = WRITING
            connection.deadline = trio.current_time() + config.send_timeout_s
            await _send_all(sock, encode_response(response, keep_alive))
            if not keep_alive:
                return
            pending, closed = buffer.trailing_data
            if closed and not pending:
                return

    async def _handle(self, request: Request) -> Response:
        wants_cbor = request.accept.startswith(b"application/cbor")
        try:
            return await self.app.handle(request)
        except QueenError as error:
            try:
                return error_response(error, wants_cbor)
            except Exception:
                logger.exception("event=error_answer_failed code=%s", error.code)
                return Response(500, _INTERNAL_BODY, b"application/json")
        except Exception:
            # Logged with its traceback and answered, not hidden: a bug in one route must not
            # drop every other client's connection.
            logger.exception("event=handler_failed method=%r target=%r", request.method[:16], request.target[:200])
            return error_response(_INTERNAL, wants_cbor)

    async def _read_request(self, conn: h11.Connection, sock: socket.socket, pending: bytes) -> Request | None:
        """The rest of a request that has started to arrive (`pending`, its first bytes), or None
        if the client closed. The reaper answers 408 if it takes longer than allowed."""
        config = self.config
        lines = _HeadLines()
        lines.feed(pending)
        conn.receive_data(pending)
        head = None
        body_parts = []
        body_bytes = 0
        continue_sent = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                owed = _chunk_bytes_owed(conn)
                if owed and body_bytes + owed > config.body_bytes_max:
                    raise _Reject(413, "body_too_large", f"a chunk of {owed} more bytes was announced; the body "
                                  f"would be over the limit of {config.body_bytes_max} bytes")
                if conn.they_are_waiting_for_100_continue and not continue_sent:
                    await _send_all(sock, b"HTTP/1.1 100 Continue\r\n\r\n")
                    continue_sent = True
                data = await _receive(sock)
                lines.feed(data)
                conn.receive_data(data)
                continue
            kind = type(event)
            if kind is h11.Data:
                body_bytes += len(event.data)
                if body_bytes > config.body_bytes_max:
                    raise _Reject(413, "body_too_large", f"the body is over the limit of {config.body_bytes_max} bytes")
                body_parts.append(event.data)
            elif kind is h11.Request:
                head = _Head(event, config)
            elif kind is h11.EndOfMessage:
                body = body_parts[0] if len(body_parts) == 1 else b"".join(body_parts)
                return Request(head.method, head.target, head.content_type, head.accept, bytes(body), head.keep_alive)
            elif kind is h11.ConnectionClosed:
                return None

    async def _send_error_and_close(self, connection: _Connection, status: int, error: QueenError) -> None:
        connection.deadline = _NEVER
        connection.phase = WRITING
        error.http_status = status
        with trio.move_on_after(LINGER_S):
            await _send_all(connection.sock, encode_response(error_response(error), keep_alive=False))
            if status != 408:  # a stalled client is not sending anything worth waiting for
                await _linger(connection.sock)


async def _receive(sock: socket.socket) -> bytes:
    """What the client sent next (b"" when it closed its side)."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return sock.recv(RECEIVE_BYTES)
        except BlockingIOError:
            continue  # woken without data after all


async def _send_all(sock: socket.socket, data: bytes) -> None:
    """Send everything, waiting for room only when the kernel's buffer is full."""
    try:
        sent = sock.send(data)
    except BlockingIOError:
        sent = 0
    if sent == len(data):
        await trio.lowlevel.checkpoint_if_cancelled()
        return
    view = memoryview(data)[sent:]
    while view:
        await trio.lowlevel.wait_writable(sock)
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            continue


class _Buffer:
    """What a client sent past a request parsed without h11, shaped like the two members of
    h11.Connection that the connection loop uses."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def receive_data(self, data: bytes) -> None:
        self.data += data

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        return self.data, False


_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_SIMPLE_HEAD = re.compile(
    rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/1\.([01])\r\n"
    rb"((?:" + _TOKEN + rb":[ \t]*(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?[ \t]*\r\n)*)\r\n")


def parse_simple_request(data: bytes, config: Config) -> tuple[Request, bytes] | None:
    """The request at the start of `data` and the bytes after it, when it is whole and of the plain
    shape nearly every client sends; None for anything else, which then goes through h11.

    What this accepts is a strict subset of what h11 accepts, and yields the same request
    (tests/http/test_simple_parse.py checks that against h11): ASCII header values, CRLF line ends,
    no line folding, exactly one Host, at most one Content-Length of at most 19 digits, no
    Transfer-Encoding, no Expect, the whole body present, and head and body within the limits.
    A request with both Content-Length and Transfer-Encoding raises _Reject (400): the two could
    frame the body differently for us and for a proxy in front of us (RFC 9112 section 6.1). So
    does a head with a bare LF line end or a folded header line (_HeadLines), which the h11 path
    refuses too.
    """
    end = data.find(b"\r\n\r\n", 0, config.header_bytes_max)
    if end < 0:
        _HeadLines().feed(data)  # a head ended by bare LFs has no CRLF CRLF
        return None
    match = _SIMPLE_HEAD.fullmatch(data, 0, end + 4)
    if match is None:
        _HeadLines().feed(data)
        return None
    method, target, minor, fields = match.groups()
    content_type = accept = b""
    length = 0
    hosts = lengths = 0
    plain = True
    chunked = False
    keep_alive = minor == b"1"
    for line in fields.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            value = value.strip(b" \t")
            if not value.isdigit() or len(value) > 19:
                plain = False  # h11 answers it (400)
                continue
            length = int(value)
            lengths += 1
        elif name == b"content-type":
            content_type = value.strip(b" \t").lower()
        elif name == b"accept":
            accept = value.strip(b" \t").lower()
        elif name == b"connection":
            if b"close" in value.lower():
                keep_alive = False
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"expect":
            plain = False
    if chunked:
        if lengths:
            raise _Reject(400, "bad_http", _BOTH_FRAMINGS)
        return None
    if not plain or hosts != 1 or lengths > 1 or length > config.body_bytes_max:
        return None
    start = end + 4
    stop = start + length
    if len(data) < stop:
        return None
    return Request(method, target, content_type, accept, data[start:stop], keep_alive), data[stop:]


_OBSOLETE_LINE = re.compile(rb"(?<!\r)\n|\r\n[ \t]")


class _HeadLines:
    """Watches a request head as it arrives, in one or more pieces, for the two line forms h11
    accepts and RFC 9112 lets a server refuse: a line ended by a bare LF (section 2.2) and a
    header line continued on the next one, obs-fold (section 5.2). A proxy in front of us may
    read either differently, so it is refused (400) rather than read one way. Each byte is looked
    at once: a piece is searched with the few bytes before it, up to the end of the head."""

    __slots__ = ("tail", "done")

    def __init__(self):
        self.tail = b""  # the last bytes before the next piece: a line end may span two pieces
        self.done = False

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        window = self.tail + data
        end = window.find(b"\r\n\r\n")
        # From 1 when a tail leads: its first byte was looked at, with what came before it.
        found = _OBSOLETE_LINE.search(window, 1 if self.tail else 0, len(window) if end < 0 else end + 4)
        if found is not None:
            if found.group() == b"\n":
                raise _Reject(400, "bad_http", "a line of the request head ends in a bare LF; end every line with "
                              "CRLF (RFC 9112 section 2.2 allows refusing it, and we do)")
            raise _Reject(400, "bad_http", "a header line is continued on the next line (obsolete line folding); "
                          "send each header on one line (RFC 9112 section 5.2 allows refusing it, and we do)")
        self.tail = window[-3:]
        self.done = end >= 0


def _chunk_bytes_owed(conn: h11.Connection) -> int:
    """The bytes still to come of the chunk h11 is reading: the size its chunk line announced, less
    what has arrived; 0 when it is reading none. h11 keeps this to itself (ChunkedReader's
    _bytes_in_chunk) and would wait for every byte of a chunk announced as ffffffff. Should a
    later h11 keep it elsewhere, this reads 0 and the limit holds only as the bytes arrive, as it
    did before (tests/http/test_bad_input.py, the chunk tests, would then fail)."""
    return getattr(getattr(conn, "_reader", None), "_bytes_in_chunk", 0)


class _Head:
    """What the server needs from a request head, read in one pass over its headers."""

    __slots__ = ("method", "target", "content_type", "accept", "keep_alive")

    def __init__(self, event: h11.Request, config: Config):
        self.method = event.method
        self.target = event.target
        self.content_type = self.accept = b""
        keep_alive = event.http_version == b"1.1"
        # h11 bounds only a head still incomplete in its buffer; one that arrived whole in a single
        # read is measured here.
        head_bytes = len(event.method) + len(event.target)
        framings = 0
        for name, value in event.headers:
            head_bytes += len(name) + len(value) + 4
            if name == b"content-type":
                self.content_type = value.lower()
            elif name == b"transfer-encoding":
                framings |= 1
            elif name == b"content-length":
                framings |= 2
                if int(value) > config.body_bytes_max:
                    raise _Reject(413, "body_too_large", f"the body is {int(value)} bytes; the limit is {config.body_bytes_max}")
            elif name == b"accept":
                self.accept = value.lower()
            elif name == b"connection":
                keep_alive = b"close" not in value.lower() and keep_alive
        if head_bytes > config.header_bytes_max:
            raise _Reject(431, "head_too_large", f"the request head is over the limit of {config.header_bytes_max} bytes")
        if framings == 3:
            raise _Reject(400, "bad_http", _BOTH_FRAMINGS)
        self.keep_alive = keep_alive


_BOTH_FRAMINGS = ("the request has both Content-Length and Transfer-Encoding; send one (RFC 9112 section 6.1 "
                  "allows closing such a connection, and we do)")


def encode_response(response: Response, keep_alive: bool) -> bytes:
    body = response.body
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
        response.status, _REASONS.get(response.status, b""), response.content_type, len(body))
    if response.headers:
        head += b"".join(b"%s: %s\r\n" % header for header in response.headers)
    if not keep_alive:
        head += b"connection: close\r\n"
    return head + b"\r\n" + body


async def _wait_gone(buffer: h11.Connection | _Buffer, sock: socket.socket) -> None:
    """Return when the client closes its side while its request is being handled. Bytes it sends
    meanwhile (a pipelined request) are kept in `buffer` for the next request; past a bound we
    stop watching."""
    buffered = 0
    while buffered < RECEIVE_BYTES:
        try:
            data = await _receive(sock)
        except OSError:
            return
        if not data:
            return
        buffer.receive_data(data)
        buffered += len(data)
    await trio.sleep_forever()


async def _linger(sock: socket.socket) -> None:
    """Read and drop what the client is still sending (for a while, up to a bound) before closing.
    Closing a socket with unread input sends a reset, and the client would lose our answer. The
    caller bounds the time."""
    try:
        sock.shutdown(socket.SHUT_WR)  # the answer is whole: the client sees the end now
    except OSError:
        return
    dropped = 0
    while dropped < LINGER_BYTES_MAX:
        data = await _receive(sock)
        if not data:
            return
        dropped += len(data)
