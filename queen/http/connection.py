"""HTTP/1.1 connections on h11: the socket task around h11's sans-I/O protocol object.

Owns: reading one request at a time within its limits (head size, body size, time to arrive, idle
time between requests), handing it to the app, writing the response, keep-alive, and the count of
open connections and requests in flight that shutdown waits on.

Malformed HTTP answers 400 (or 413/431/408) and closes the connection; it never reaches the app
and never takes the server down.
"""

from __future__ import annotations

import logging
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
    __slots__ = ("method", "target", "content_type", "accept", "body", "wait_gone")

    def __init__(self, method: bytes, target: bytes, content_type: bytes, accept: bytes, body: bytes):
        self.method = method
        self.target = target
        self.content_type = content_type
        self.accept = accept
        self.body = body
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
        # h11 needs a request before it writes a response; the refusal goes out on the raw stream.
        head = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(response.body))
        with trio.move_on_after(LINGER_S):
            await stream.send_all(head + response.body)
        await _linger(stream)

    async def _serve(self, stream) -> None:
        config = self.config
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=config.header_bytes_max)
        while True:
            try:
                request = await self._read_request(conn, stream)
            except _Reject as reject:
                await self._send_error_and_close(conn, stream, reject.status, reject.error)
                return
            except h11.RemoteProtocolError as error:
                status = error.error_status_hint if error.error_status_hint in (400, 413, 431) else 400
                await self._send_error_and_close(conn, stream, status, QueenError("bad_http", f"malformed HTTP request: {error}"))
                return
            if request is None:
                return
            request.wait_gone = partial(_wait_gone, conn, stream)
            self.requests_in_flight += 1
            self.requests_total += 1
            try:
                response = await self._handle(request)
            finally:
                self.requests_in_flight -= 1
                if not self.requests_in_flight:
                    self._idle.set()
            keep_alive = not self.draining
            await self._send(conn, stream, response, keep_alive)
            # h11 moves to MUST_CLOSE by itself for HTTP/1.0 or a client's "connection: close".
            if not keep_alive or conn.our_state is not h11.DONE:
                return
            conn.start_next_cycle()

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

    async def _read_request(self, conn: h11.Connection, stream) -> Request | None:
        config = self.config
        deadline = trio.current_time() + config.idle_timeout_s
        started = False
        head = None
        body_parts = []
        body_bytes = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = None
                with trio.move_on_at(deadline):
                    data = await stream.receive_some(RECEIVE_BYTES)
                if data is None:
                    if started:
                        raise _Reject(408, "request_timeout", f"the request did not arrive within {config.request_read_timeout_s} s")
                    return None  # idle keep-alive connection: close quietly
                conn.receive_data(data)
                if not started and data:
                    started = True
                    deadline = trio.current_time() + config.request_read_timeout_s
                continue
            kind = type(event)
            if kind is h11.Request:
                head = event
                # h11 bounds only a head still incomplete in its buffer; one that arrived whole in
                # a single read is measured here.
                head_bytes = len(event.method) + len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
                if head_bytes > config.header_bytes_max:
                    raise _Reject(431, "head_too_large", f"the request head is over the limit of {config.header_bytes_max} bytes")
                for name, value in event.headers:
                    if name == b"content-length" and int(value) > config.body_bytes_max:
                        raise _Reject(413, "body_too_large", f"the body is {int(value)} bytes; the limit is {config.body_bytes_max}")
            elif kind is h11.Data:
                body_bytes += len(event.data)
                if body_bytes > config.body_bytes_max:
                    raise _Reject(413, "body_too_large", f"the body is over the limit of {config.body_bytes_max} bytes")
                body_parts.append(event.data)
            elif kind is h11.EndOfMessage:
                content_type = accept = b""
                for name, value in head.headers:
                    if name == b"content-type":
                        content_type = value.lower()
                    elif name == b"accept":
                        accept = value.lower()
                body = body_parts[0] if len(body_parts) == 1 else b"".join(body_parts)
                return Request(head.method, head.target, content_type, accept, body)
            elif kind is h11.ConnectionClosed:
                return None

    async def _send(self, conn: h11.Connection, stream, response: Response, keep_alive: bool) -> None:
        headers = [(b"content-type", response.content_type), (b"content-length", b"%d" % len(response.body))]
        if response.headers:
            headers.extend(response.headers)
        if not keep_alive:
            headers.append((b"connection", b"close"))
        data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=_REASONS.get(response.status, b"")))
        if response.body:
            data += conn.send(h11.Data(data=response.body))
        data += conn.send(h11.EndOfMessage())
        await stream.send_all(data)

    async def _send_error_and_close(self, conn: h11.Connection, stream, status: int, error: QueenError) -> None:
        error.http_status = status
        response = error_response(error)
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await self._send(conn, stream, response, keep_alive=False)
            except h11.LocalProtocolError:
                return  # h11 refuses to answer in this state; closing says enough
            if status != 408:  # a stalled client is not sending anything worth waiting for
                await _linger(stream)


async def _wait_gone(conn: h11.Connection, stream) -> None:
    """Return when the client closes its side while its request is being handled. Bytes it sends
    meanwhile (a pipelined request) are kept for h11; past a bound we stop watching."""
    buffered = 0
    while buffered < RECEIVE_BYTES:
        data = await stream.receive_some(RECEIVE_BYTES)
        if not data:
            return
        conn.receive_data(data)
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
