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
- Deadlines are kept by one reaper task that looks at every connection every REAPER_INTERVAL_S,
  rather than a cancel scope per read and write: a connection idle past idle_timeout_s is closed,
  a request that does not arrive whole within request_read_timeout_s is answered 408, and an
  answer the client does not take within send_timeout_s ends the connection.

Sockets: each connection is a plain non-blocking socket; a read waits with trio.lowlevel's
wait_readable and then takes what is there in one recv, a write sends at once and waits for
writability only when the kernel's buffer is full. trio's stream wrappers cost about as much
again per request (bench/README.md, "HTTP layer").

TLS (config.tls_cert): a connection is then a trio.SSLStream over a trio.SocketStream of its
socket, with the standard library's ssl. How a connection reads and writes is chosen once, when it
is accepted (_ConnectionIo), so a plain connection runs the very code it ran before TLS existed.
- The handshake runs under the request read deadline: a client that connects and never finishes
  it is cut off after request_read_timeout_s, like a stalled request (no 408: there is no channel
  to send it on). A plain HTTP request at a TLS port is answered 400 in plain text, saying so
  (OpenSSL recognizes GET, POST, HEAD and PUT; other bytes just fail the handshake, logged at debug).
- A parked call's hangup watch (wait_gone) reads through the SSLStream exactly as a plain one
  reads the socket: a close (TCP FIN, with or without close_notify) or a reset means gone, and
  bytes that arrive meanwhile are decrypted and kept for the next request. Peeking is no use here
  (ciphertext, and records the SSL object may already hold), and a read cancelled while it waits
  for the socket leaves the stream intact; only a cancelled handshake or send breaks it, and those
  end the connection anyway.
- Connections close without a close_notify (https_compatible: the peer's missing one is not an
  error either), as HTTPS servers commonly do: every answer is framed, so nothing is truncated
  unseen.
- reload_tls() (SIGHUP) builds a new context from the same files; connections accepted afterwards
  use it, open ones keep theirs.

Request ids: every answer carries X-Request-Id, the client's own when it is well formed
(queen/http/wire.py, request_id_of), else one made here: a random prefix per process and a
counter. The log lines about a request (a handler's traceback, an audit line) carry it as
request_id, so a client's report of a failed call finds its line. With config.access_log, each
answer written (refusals of this layer included) is one line of the `queen.access` logger; off,
it costs one flag check per request.

Requests are parsed by queen/http/wire.py (no sockets there): the plain shape by its fast parser,
everything else through h11. Without h11 knowing about the response its state machine cannot
start a next cycle, so a request h11 reads gets a fresh h11.Connection, seeded with whatever the
client already sent.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import resource
import socket
import ssl
import time
from bisect import bisect_left
from dataclasses import dataclass
from functools import partial

import h11
import trio

from queen.config import Config
from queen.errors import QueenError
from queen.histogram import REQUEST_SECONDS, RequestSeries
from queen.http.tls import TlsSetupError, server_context
from queen.http.wire import (
    INTERNAL,
    INTERNAL_BODY,
    Head,
    HeadLines,
    PendingBytes,
    Reject,
    Request,
    Response,
    chunk_bytes_owed,
    encode_head,
    encode_response,
    error_response,
    parse_simple_request,
    request_id_of,
)

logger = logging.getLogger(__name__)
# One line per answered request when config.access_log is on (off: never called, one flag check).
access_logger = logging.getLogger("queen.access")

RECEIVE_BYTES = 65536
# An answer longer than this is sent in pieces of this size, the send deadline renewed for each.
SEND_PIECE_BYTES = 1 << 20
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

_NEVER = float("inf")

# What a connection is doing, for the reaper: what its deadline means.
IDLE, READING, HANDLING, WRITING, HANDSHAKING = range(5)

# What a read or write raises when the client went away: a socket's errors, and an SSLStream's
# (a reset or a TLS failure on the way).
_CLIENT_GONE = (OSError, trio.BrokenResourceError)


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


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """Non-blocking sockets bound to every address host resolves to, not yet listening: the port
    is held (port 0 takes one free port for all of them), and a client that dials it is refused
    until `start_listening`. A port in use raises OSError(EADDRINUSE) here, before a start
    touches anything."""
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
            sock.setblocking(False)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def start_listening(listeners: list[socket.socket]) -> None:
    """Let clients connect (they wait in the backlog until accepted); again is harmless."""
    for sock in listeners:
        sock.listen(LISTEN_BACKLOG)


def open_listeners(host: str, port: int) -> list[socket.socket]:
    """Non-blocking listening sockets for every address host resolves to; port 0 takes one free
    port for all of them."""
    listeners = bind_listeners(host, port)
    try:
        start_listening(listeners)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


class _ConnectionIo:
    """How one connection reads and writes, chosen when it is accepted: the socket functions of
    this module bound to its socket, or a TLS stream over it (`tls`)."""

    __slots__ = ("receive", "send_all", "wait_gone", "tls")

    def __init__(self, receive, send_all, tls: trio.SSLStream | None = None):
        self.receive = receive  # async () -> bytes: what the client sent next, b"" when it closed
        self.send_all = send_all  # async (bytes) -> None
        self.wait_gone = partial(_wait_gone, receive)  # async (buffer) -> None: see _wait_gone
        self.tls = tls


def _plain_io(sock: socket.socket, receive) -> _ConnectionIo:
    return _ConnectionIo(partial(receive, sock), partial(_send_all, sock))


def _tls_io(sock: socket.socket, context: ssl.SSLContext) -> _ConnectionIo:
    stream = trio.SSLStream(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), context, server_side=True,
                            https_compatible=True)
    return _ConnectionIo(partial(stream.receive_some, RECEIVE_BYTES), stream.send_all, stream)


class _Connection:
    """One accepted connection, as the reaper and the idle list see it."""

    __slots__ = ("sock", "io", "scope", "phase", "deadline", "evicted", "peer")

    def __init__(self, sock: socket.socket, io: _ConnectionIo, peer):
        self.sock = sock
        self.io = io
        self.peer = peer  # the client's address as accept() gave it, for the access log
        self.scope = trio.CancelScope()
        self.phase = IDLE
        self.deadline = _NEVER
        # Gave its place to a new connection: closed when idle, or (a parked call) answered now and
        # closed after that answer. No longer counted in `connections` either way.
        self.evicted = False


@dataclass(frozen=True, slots=True)
class HttpStatistics:
    requests_total: int
    connections: int
    connections_allowed: int
    connections_refused: int  # answered 503 at the limit, every connection busy mid-request
    idle_closed: int  # idle keep-alive connections closed to make room
    parks_ended: int  # parked calls answered early to make room
    timeouts: int  # a request that did not arrive, or an answer not taken, in time


class HttpServer:
    def __init__(self, app, config: Config, connections_allowed: int | None = None, receive=None,
                 tls_context: ssl.SSLContext | None = None):
        """receive(sock) -> bytes: how a plain connection reads its requests (a seam for tests that
        need a moment between a request's bytes arriving and its task going on).
        tls_context: serve HTTPS with it; by default one is built from config.tls_cert/tls_key when
        those are set (raises TlsSetupError if they cannot be loaded)."""
        self.app = app
        self.config = config
        self.receive = receive or _receive
        if tls_context is None and config.tls_cert:
            tls_context = server_context(config.tls_cert, config.tls_key)
        self.tls_context = tls_context  # what connections accepted from now on are wrapped with
        self.connections_allowed = connections_allowed or config.connections_max
        self.connections = 0
        self.requests_in_flight = 0
        self.requests_total = 0
        self.connections_refused = 0
        self.idle_closed = 0
        self.parks_ended = 0  # parked calls answered early to make room for a new connection
        self.timeouts = 0
        # Requests the app's routes did not claim (no route matched), as one series: a raw path is
        # never a label.
        self.unmatched = RequestSeries("unmatched", "")
        self.draining = False
        self._idle_event = trio.Event()
        self._open: set[_Connection] = set()
        self._idle: dict[_Connection, None] = {}  # idle keep-alive connections, longest idle first
        # Connections whose call is parked, longest parked first, each with the event that ends its wait.
        self._parked: dict[_Connection, trio.Event] = {}
        self._refusing = 0
        self._sockets = 0  # accepted and not yet closed: served, refused or being closed
        self._socket_closed = trio.lowlevel.ParkingLot()
        # Request ids this server makes (a client's own well-formed X-Request-Id is kept instead):
        # a random prefix per process, so ids from two runs or two nodes do not collide, and a
        # counter. An iterator run in C: about 0.2 us an id, where a uuid4 costs several times that.
        template = os.urandom(6).hex().encode() + b"-%d"
        self._new_request_ids = map(template.__mod__, itertools.count(1))

    async def wait_no_requests(self) -> None:
        while self.requests_in_flight:
            self._idle_event = trio.Event()
            await self._idle_event.wait()

    def reload_tls(self) -> bool:
        """Read the certificate and key again (SIGHUP: a renewed certificate) for the connections
        accepted from now on; open ones keep the context they started with. If the files cannot be
        loaded, the current context stays and the failure is logged. True if a new one is in use."""
        config = self.config
        if self.tls_context is None or not config.tls_cert:
            return False
        try:
            self.tls_context = server_context(config.tls_cert, config.tls_key)
        except TlsSetupError as error:
            logger.error("event=tls_reload_failed file=%s error=%r action=kept_previous_certificate",
                         error.path, error.detail)
            return False
        logger.info("event=tls_reloaded cert=%s key=%s", config.tls_cert, config.tls_key)
        return True

    def _connection_io(self, sock: socket.socket) -> _ConnectionIo:
        if self.tls_context is None:
            return _plain_io(sock, self.receive)
        return _tls_io(sock, self.tls_context)

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
                sock, peer = listener.accept()
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
                self._refuse(sock, peer, connections)
                continue
            self.connections += 1
            connections.start_soon(self._serve_connection, sock, peer)


    def statistics(self) -> HttpStatistics:
        return HttpStatistics(self.requests_total, self.connections, self.connections_allowed,
                              self.connections_refused, self.idle_closed, self.parks_ended, self.timeouts)

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

    def _refuse(self, sock: socket.socket, peer, connections: trio.Nursery) -> None:
        self.connections_refused += 1
        if self._refusing >= REFUSING_MAX:
            self._closed(sock)  # a flood: no descriptor is spent on answering it
            return
        self._refusing += 1
        connections.start_soon(self._answer_refused, sock, peer)

    async def _answer_refused(self, sock: socket.socket, peer) -> None:
        try:
            io = self._connection_io(sock)
            response = error_response(QueenError(
                "too_many_connections", f"the server is at its limit of {self.connections_allowed} connections "
                "and none is idle; try again shortly", http_status=503))
            request_id = next(self._new_request_ids)
            with trio.move_on_after(LINGER_S):
                if io.tls is not None:
                    await io.tls.do_handshake()
                await io.send_all(encode_response(response, keep_alive=False, request_id=request_id))
                if self.config.access_log:
                    _log_access(None, "-", response, 0.0, request_id, peer)
                await _linger(sock)
        except _CLIENT_GONE:
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

    async def _serve_connection(self, sock: socket.socket, peer) -> None:
        connection = _Connection(sock, self._connection_io(sock), peer)
        self._open.add(connection)
        try:
            with connection.scope:
                if connection.io.tls is None or await self._handshake(connection):
                    await self._serve(connection)
            if connection.scope.cancelled_caught and connection.phase == READING:
                await self._send_error_and_close(connection, 408, QueenError(
                    "request_timeout", f"the request did not arrive whole within {self.config.request_read_timeout_s} s"))
        except _CLIENT_GONE:
            pass  # the client went away (reset, broken pipe, a broken TLS stream): nothing to answer
        except Exception:
            logger.exception("event=connection_failed action=closed")
        finally:
            self._open.discard(connection)
            self._idle.pop(connection, None)
            if not connection.evicted:
                self.connections -= 1
            self._closed(sock)

    async def _handshake(self, connection: _Connection) -> bool:
        """The TLS handshake, within the request read deadline. False if it failed (the client is
        answered if it spoke plain HTTP, and the connection ends)."""
        connection.phase = HANDSHAKING
        connection.deadline = trio.current_time() + self.config.request_read_timeout_s
        try:
            await connection.io.tls.do_handshake()
            return True
        except trio.BrokenResourceError as error:
            cause = error.__cause__
            if isinstance(cause, ssl.SSLError) and cause.reason == "HTTP_REQUEST":
                # A plain HTTP request at the HTTPS port: say so in words its client can show, not
                # a TLS alert it cannot read.
                await self._send_error_and_close(connection, 400, QueenError(
                    "bad_http", "this port speaks HTTPS: use an https:// URL"), plain=True)
            else:
                logger.debug("event=tls_handshake_failed error=%r", str(cause or error))
            return False

    async def _serve(self, connection: _Connection) -> None:
        config = self.config
        io = connection.io
        receive, send_all, wait_gone = io.receive, io.send_all, io.wait_gone
        idle = self._idle
        answer_now = partial(self._until_room_needed, connection)  # one for the connection's requests
        new_request_ids = self._new_request_ids
        access_log = config.access_log
        pending = b""
        while True:
            if not pending:
                connection.phase = IDLE
                connection.deadline = trio.current_time() + config.idle_timeout_s
                idle[connection] = None
                pending = await receive()
                idle.pop(connection, None)
                if not pending or connection.evicted:
                    # Evicted to make room after its request arrived but before this task ran on:
                    # it is no longer counted, so it must not run a request (a parked acquire
                    # would be granted to a client whose connection is already closed).
                    return
            try:
                simple = parse_simple_request(pending, config)
            except Reject as reject:
                await self._send_error_and_close(connection, reject.status, reject.error)
                return
            if simple is not None:
                request, rest = simple
                buffer = PendingBytes(rest)
            else:
                connection.phase = READING
                connection.deadline = trio.current_time() + config.request_read_timeout_s
                buffer = h11_conn = h11.Connection(h11.SERVER, max_incomplete_event_size=config.header_bytes_max)
                try:
                    request = await self._read_request(h11_conn, io, pending)
                except Reject as reject:
                    await self._send_error_and_close(connection, reject.status, reject.error)
                    return
                except h11.RemoteProtocolError as error:
                    status = error.error_status_hint if error.error_status_hint in (400, 413, 431) else 400
                    await self._send_error_and_close(connection, status, QueenError("bad_http", f"malformed HTTP request: {_readable(error)}"))
                    return
                if request is None:
                    return
            connection.phase = HANDLING
            connection.deadline = _NEVER
            request.request_id = request_id = request_id_of(request.request_id, new_request_ids)
            request.wait_gone = partial(wait_gone, buffer)
            request.answer_now = answer_now
            self.requests_in_flight += 1
            self.requests_total += 1
            started = time.perf_counter()
            try:
                response = await self._handle(request)
            finally:
                self.requests_in_flight -= 1
                if not self.requests_in_flight:
                    self._idle_event.set()
            # RequestSeries.observe written out: a call frame is a third of its cost (~0.2 us of ~0.5).
            seconds = time.perf_counter() - started
            series = request.route or self.unmatched
            histogram = series.by_status.get(response.status) or series.add(response.status)
            histogram.counts[bisect_left(REQUEST_SECONDS, seconds)] += 1
            histogram.sum += seconds
            # A connection that gave its place to a new one closes after this answer.
            keep_alive = request.keep_alive and not self.draining and not connection.evicted
            if request.method == b"HEAD":
                response.body = b""
            connection.phase = WRITING
            connection.deadline = trio.current_time() + config.send_timeout_s
            if len(response.body) <= SEND_PIECE_BYTES:
                await send_all(encode_response(response, keep_alive, request_id))
            else:
                await self._send_in_pieces(connection, response, keep_alive, request_id)
            if access_log:
                _log_access(request, series.route if request.route is not None else _path_of(request.target),
                            response, time.perf_counter() - started, request_id, connection.peer)
            if not keep_alive:
                return
            pending, closed = buffer.trailing_data
            if closed and not pending:
                return

    async def _send_in_pieces(self, connection: _Connection, response: Response, keep_alive: bool,
                              request_id: bytes) -> None:
        """A long answer (a backup) goes out a piece at a time, each piece within send_timeout_s, so
        a client that keeps reading is not cut off because the whole takes longer than that. Its
        length is known (the body is whole in memory; queen/runtime/backup.py says why that is
        the simplest correct choice), so it is framed by Content-Length, not chunked."""
        send_all = connection.io.send_all
        await send_all(encode_head(response, keep_alive, request_id))
        body = memoryview(response.body)
        for start in range(0, len(body), SEND_PIECE_BYTES):
            connection.deadline = trio.current_time() + self.config.send_timeout_s
            await send_all(body[start:start + SEND_PIECE_BYTES])

    async def _handle(self, request: Request) -> Response:
        response = await self._answer(request)
        cluster = getattr(self.app, "cluster", None)
        if cluster is not None:
            # Every answer of a cluster node says which epoch it speaks for. A new Response: the
            # dashboard's are shared between requests.
            response = Response(response.status, response.body, response.content_type,
                                [*(response.headers or ()), (b"x-queen-epoch", b"%d" % cluster.epoch)])
        return response

    async def _answer(self, request: Request) -> Response:
        wants_cbor = request.accept.startswith(b"application/cbor")
        try:
            return await self.app.handle(request)
        except QueenError as error:
            try:
                return error_response(error, wants_cbor)
            except Exception:
                logger.exception("event=error_answer_failed code=%s request_id=%s", error.code,
                                 request.request_id.decode())
                return Response(500, INTERNAL_BODY, b"application/json")
        except Exception:
            # Logged with its traceback and answered, not hidden: a bug in one route must not
            # drop every other client's connection.
            logger.exception("event=handler_failed method=%r target=%r request_id=%s", request.method[:16],
                             request.target[:200], request.request_id.decode())
            return error_response(INTERNAL, wants_cbor)

    async def _read_request(self, conn: h11.Connection, io: _ConnectionIo, pending: bytes) -> Request | None:
        """The rest of a request that has started to arrive (`pending`, its first bytes), or None
        if the client closed. The reaper answers 408 if it takes longer than allowed."""
        config = self.config
        lines = HeadLines()
        lines.feed(pending)
        conn.receive_data(pending)
        head = None
        body_parts = []
        body_bytes = 0
        continue_sent = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                owed = chunk_bytes_owed(conn)
                if owed and body_bytes + owed > config.body_bytes_max:
                    raise Reject(413, "body_too_large", f"a chunk of {owed} more bytes was announced; the body "
                                  f"would be over the limit of {config.body_bytes_max} bytes")
                if conn.they_are_waiting_for_100_continue and not continue_sent:
                    await io.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    continue_sent = True
                data = await io.receive()
                lines.feed(data)
                conn.receive_data(data)
                continue
            kind = type(event)
            if kind is h11.Data:
                body_bytes += len(event.data)
                if body_bytes > config.body_bytes_max:
                    raise Reject(413, "body_too_large", f"the body is over the limit of {config.body_bytes_max} bytes")
                body_parts.append(event.data)
            elif kind is h11.Request:
                head = Head(event, config)
            elif kind is h11.EndOfMessage:
                body = body_parts[0] if len(body_parts) == 1 else b"".join(body_parts)
                return Request(head.method, head.target, head.content_type, head.accept, bytes(body), head.keep_alive,
                               head.authorization, head.request_id)
            elif kind is h11.ConnectionClosed:
                return None

    async def _send_error_and_close(self, connection: _Connection, status: int, error: QueenError,
                                    plain: bool = False) -> None:
        """plain: write to the socket itself, even on a TLS connection (no handshake happened)."""
        connection.deadline = _NEVER
        connection.phase = WRITING
        error.http_status = status
        send_all = partial(_send_all, connection.sock) if plain else connection.io.send_all
        # The request was never read whole: no id of the client's to keep.
        request_id = next(self._new_request_ids)
        response = error_response(error)
        with trio.move_on_after(LINGER_S):
            await send_all(encode_response(response, keep_alive=False, request_id=request_id))
            if self.config.access_log:
                _log_access(None, "-", response, 0.0, request_id, connection.peer)
            if status != 408:  # a stalled client is not sending anything worth waiting for
                await _linger(connection.sock)


def _log_access(request: Request | None, route: str, response: Response, seconds: float, request_id: bytes,
                peer) -> None:
    """The access log's line for one answer. request None: refused before a request was read
    whole (malformed, too large, too slow, no room), so no method, route or caller is known."""
    principal = request.principal if request is not None else None
    access_logger.info(
        "event=access method=%s route=%s status=%d duration_ms=%.3f bytes=%d request_id=%s token=%s tenant=%s "
        "remote=%s", request.method.decode("latin-1") if request is not None else "-", route, response.status,
        seconds * 1000, len(response.body), request_id.decode(), principal.name if principal is not None else "-",
        principal.tenant if principal is not None else "-", _address(peer))


def _path_of(target: bytes) -> str:
    """A request target without its query (which may hold names and cursors), cut to a bound."""
    return target.partition(b"?")[0][:200].decode("latin-1")


def _address(peer) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = peer[0]
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer) if peer else "-"


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


async def _wait_gone(receive, buffer: h11.Connection | PendingBytes) -> None:
    """Return when the client closes its side while its request is being handled. Bytes it sends
    meanwhile (a pipelined request) are kept in `buffer` for the next request; past a bound we
    stop watching. receive: the connection's (plain or TLS)."""
    buffered = 0
    while buffered < RECEIVE_BYTES:
        try:
            data = await receive()
        except _CLIENT_GONE:
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


def _readable(error: Exception) -> str:
    """h11's message in a client's words: it shows what it could not parse as Python's repr of a
    bytearray (`bytearray(b'GARBAGE')`), which means nothing to someone calling with curl."""
    return re.sub(r"bytearray\(b(['\"])(.*?)\1\)", r"\1\2\1", str(error))
