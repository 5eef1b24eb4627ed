"""HTTP/1.1 connections on h11: the socket task around h11's sans-I/O protocol object.

Owns: reading one request at a time within its limits (head size, body size, time to arrive, idle
time between requests), handing it to the app, writing the response, keep-alive, and the count of
open connections and requests in flight that shutdown waits on.

Malformed HTTP answers 400 (or 413/431/408) and closes the connection; it never reaches the app
and never takes the server down.

Requests: a whole request of the plain shape nearly every client sends (one read, CRLF, ASCII
headers, a Content-Length body) is parsed by `parse_simple_request`, a strict subset of what h11
accepts that yields the same request; h11 parsed such a request in ~65 µs, the largest single cost
of a one-operation call (bench/README.md). Everything else (a request split across reads, chunked
bodies, 100-continue, obsolete syntax, anything malformed) goes to h11, which also decides every
error. Responses are written here as bytes: ours are a status line and a few headers the server
itself chose, and h11's validation of them cost as much again. Without h11 knowing about the
response its state machine cannot start a next cycle, so a request h11 reads gets a fresh
h11.Connection (about 3 µs), seeded with whatever the client already sent.
"""

from __future__ import annotations

import logging
import re
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


_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


class Request:
    __slots__ = ("method", "target", "content_type", "accept", "body", "keep_alive", "wait_gone")

    def __init__(self, method: bytes, target: bytes, content_type: bytes, accept: bytes, body: bytes,
                 keep_alive: bool = True):
        self.method = method
        self.target = target
        self.content_type = content_type
        self.accept = accept
        self.body = body
        self.keep_alive = keep_alive
        self.wait_gone = None  # async () -> None, returns when the client hangs up (set per connection)


class Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int, body: bytes, content_type: bytes, headers: list | None = None):
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class _Reject(Exception):
    """A request broke an HTTP-level limit: answer `status` with the error envelope and close."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.error = QueenError(code, message)


def error_response(error: QueenError, wants_cbor: bool = False) -> Response:
    body, content_type = encode_body(error.to_wire(), wants_cbor)
    headers = None
    if error.http_status == 503:
        headers = [(b"retry-after", b"1")]
    elif error.http_status == 405 and "allow" in error.details:
        headers = [(b"allow", ", ".join(error.details["allow"]).encode())]
    return Response(error.http_status, body, content_type, headers)


class HttpServer:
    def __init__(self, app, config: Config):
        self.app = app
        self.config = config
        self.connections = 0
        self.requests_in_flight = 0
        self.requests_total = 0
        self.draining = False
        self._idle = trio.Event()

    async def wait_no_requests(self) -> None:
        while self.requests_in_flight:
            self._idle = trio.Event()
            await self._idle.wait()

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            if self.connections > self.config.connections_max:
                await self._refuse(stream)
                return
            await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away mid-write; nothing to answer
        finally:
            self.connections -= 1
            await stream.aclose()

    async def _refuse(self, stream) -> None:
        response = error_response(QueenError("too_many_connections", "the server is at its connection limit", http_status=503))
        with trio.move_on_after(LINGER_S):
            await stream.send_all(encode_response(response, keep_alive=False))
        await _linger(stream)

    async def _serve(self, stream) -> None:
        config = self.config
        # One timer for the connection's life: its deadline is set while waiting for a request and
        # lifted while handling it, cheaper than a cancel scope per read.
        timer = trio.CancelScope()
        reading = False  # a request has started to arrive: the timer's expiry answers 408
        pending = b""
        with timer:
            while True:
                reading = False
                if not pending:
                    timer.deadline = trio.current_time() + config.idle_timeout_s
                    pending = await stream.receive_some(RECEIVE_BYTES)
                    timer.deadline = _NEVER
                    if not pending:
                        return
                simple = parse_simple_request(pending, config)
                if simple is not None:
                    request, rest = simple
                    buffer = _Buffer(rest)
                else:
                    buffer = conn = h11.Connection(h11.SERVER, max_incomplete_event_size=config.header_bytes_max)
                    conn.receive_data(pending)
                    reading = True
                    try:
                        request = await self._read_request(conn, stream, timer)
                    except _Reject as reject:
                        await self._send_error_and_close(stream, reject.status, reject.error)
                        return
                    except h11.RemoteProtocolError as error:
                        status = error.error_status_hint if error.error_status_hint in (400, 413, 431) else 400
                        await self._send_error_and_close(stream, status, QueenError("bad_http", f"malformed HTTP request: {error}"))
                        return
                    if request is None:
                        return
                request.wait_gone = partial(_wait_gone, buffer, stream)
                self.requests_in_flight += 1
                self.requests_total += 1
                try:
                    response = await self._handle(request)
                finally:
                    self.requests_in_flight -= 1
                    if not self.requests_in_flight:
                        self._idle.set()
                keep_alive = request.keep_alive and not self.draining
                if request.method == b"HEAD":
                    response.body = b""
                await stream.send_all(encode_response(response, keep_alive))
                if not keep_alive:
                    return
                pending, closed = buffer.trailing_data
                if closed and not pending:
                    return
        if timer.cancelled_caught and reading:
            await self._send_error_and_close(stream, 408, QueenError(
                "request_timeout", f"the request did not arrive within {config.request_read_timeout_s} s"))

    async def _handle(self, request: Request) -> Response:
        wants_cbor = request.accept.startswith(b"application/cbor")
        try:
            return await self.app.handle(request)
        except QueenError as error:
            return error_response(error, wants_cbor)
        except Exception:
            # Logged with its traceback and answered, not hidden: a bug in one route must not
            # drop every other client's connection.
            logger.exception("event=handler_failed method=%s target=%r", request.method.decode(), request.target[:200])
            return error_response(QueenError("internal", "the server failed to handle this request; see its log", http_status=500), wants_cbor)

    async def _read_request(self, conn: h11.Connection, stream, timer: trio.CancelScope) -> Request | None:
        """The rest of a request that has started to arrive (conn holds its first bytes), or None
        if the client closed. It must finish within request_read_timeout_s; the timer's expiry is
        handled by _serve (408)."""
        config = self.config
        deadline = trio.current_time() + config.request_read_timeout_s
        head = None
        body_parts = []
        body_bytes = 0
        continue_sent = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue and not continue_sent:
                    await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    continue_sent = True
                timer.deadline = deadline
                data = await stream.receive_some(RECEIVE_BYTES)
                timer.deadline = _NEVER
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
                return Request(head.method, head.target, head.content_type, head.accept, body, head.keep_alive)
            elif kind is h11.ConnectionClosed:
                return None

    async def _send_error_and_close(self, stream, status: int, error: QueenError) -> None:
        error.http_status = status
        with trio.move_on_after(LINGER_S):
            await stream.send_all(encode_response(error_response(error), keep_alive=False))
        if status != 408:  # a stalled client is not sending anything worth waiting for
            await _linger(stream)


_NEVER = float("inf")


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

    h11 costs about 65 µs to parse a small POST, most of a one-operation request's budget
    (bench/README.md). What this accepts is a strict subset of what h11 accepts, and yields the same
    request (tests/http/test_simple_parse.py checks that against h11): ASCII header values, CRLF
    line ends, no line folding, exactly one Host, at most one all-digit Content-Length, no
    Transfer-Encoding, no Expect, the whole body present, and head and body within the limits.
    """
    end = data.find(b"\r\n\r\n", 0, config.header_bytes_max)
    if end < 0:
        return None
    match = _SIMPLE_HEAD.fullmatch(data, 0, end + 4)
    if match is None:
        return None
    method, target, minor, fields = match.groups()
    content_type = accept = b""
    length = 0
    hosts = lengths = 0
    keep_alive = minor == b"1"
    for line in fields.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            value = value.strip(b" \t")
            if not value.isdigit():
                return None
            length = int(value)
            lengths += 1
        elif name == b"content-type":
            content_type = value.strip(b" \t").lower()
        elif name == b"accept":
            accept = value.strip(b" \t").lower()
        elif name == b"connection":
            if b"close" in value.lower():
                keep_alive = False
        elif name == b"transfer-encoding" or name == b"expect":
            return None
    if hosts != 1 or lengths > 1 or length > config.body_bytes_max:
        return None
    start = end + 4
    stop = start + length
    if len(data) < stop:
        return None
    return Request(method, target, content_type, accept, data[start:stop], keep_alive), data[stop:]


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
        for name, value in event.headers:
            head_bytes += len(name) + len(value) + 4
            if name == b"content-type":
                self.content_type = value.lower()
            elif name == b"content-length":
                if int(value) > config.body_bytes_max:
                    raise _Reject(413, "body_too_large", f"the body is {int(value)} bytes; the limit is {config.body_bytes_max}")
            elif name == b"accept":
                self.accept = value.lower()
            elif name == b"connection":
                keep_alive = b"close" not in value.lower() and keep_alive
        if head_bytes > config.header_bytes_max:
            raise _Reject(431, "head_too_large", f"the request head is over the limit of {config.header_bytes_max} bytes")
        self.keep_alive = keep_alive


def encode_response(response: Response, keep_alive: bool) -> bytes:
    body = response.body
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
        response.status, _REASONS.get(response.status, b""), response.content_type, len(body))
    if response.headers:
        head += b"".join(b"%s: %s\r\n" % header for header in response.headers)
    if not keep_alive:
        head += b"connection: close\r\n"
    return head + b"\r\n" + body


async def _wait_gone(buffer: h11.Connection | _Buffer, stream) -> None:
    """Return when the client closes its side while its request is being handled. Bytes it sends
    meanwhile (a pipelined request) are kept in `buffer` for the next request; past a bound we
    stop watching."""
    buffered = 0
    while buffered < RECEIVE_BYTES:
        data = await stream.receive_some(RECEIVE_BYTES)
        if not data:
            return
        buffer.receive_data(data)
        buffered += len(data)
    await trio.sleep_forever()


async def _linger(stream) -> None:
    """Read and drop what the client is still sending (for a while, up to a bound) before closing.
    Closing a socket with unread input sends a reset, and the client would lose our answer."""
    dropped = 0
    with trio.move_on_after(LINGER_S):
        await stream.send_eof()  # the answer is whole: the client sees the end now, not after the linger
        while dropped < LINGER_BYTES_MAX:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                return
            dropped += len(data)
