"""HTTP/1.1 on the wire, without sockets or trio: the request and response the app sees, the fast
parser for the plain request shape, what a request head must be to be read at all, and the
response's bytes. connection.py drives these over sockets; tests/http/test_simple_parse.py fuzzes
the parser against h11.

Requests: a whole request of the plain shape nearly every client sends (one read, CRLF, ASCII
headers, a Content-Length body) is parsed by `parse_simple_request`, a strict subset of what h11
accepts that yields the same request; h11 costs several times more per request. Everything else (a
request split across reads, chunked bodies, 100-continue, anything malformed) goes to h11, which
decides every error but the line forms refused here. Responses are written here as bytes: ours are
a status line and a few headers the server itself chose, X-Request-Id among them on every answer
(request_id_of: the client's own when well formed, never echoed otherwise).

Framing the HTTP/1.1 grammar leaves open is refused, not guessed at: a request with both
Content-Length and Transfer-Encoding, a head line ended by a bare LF or continued on the next line
(obs-fold; RFC 9112 sections 2.2 and 5.2 allow refusing both; h11 would accept them), and a chunk
announced larger than the body limit.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from http import HTTPStatus

import h11

from queen.auth import Principal
from queen.config import Config
from queen.errors import QueenError
from queen.histogram import RequestSeries
from queen.http.codec import encode_body

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


class Request:
    __slots__ = ("method", "target", "content_type", "accept", "body", "keep_alive", "wait_gone", "answer_now",
                 "authorization", "principal", "route", "request_id")

    def __init__(self, method: bytes, target: bytes, content_type: bytes, accept: bytes, body: bytes,
                 keep_alive: bool = True, authorization: bytes = b"", request_id: bytes = b""):
        self.method = method
        self.target = target
        self.content_type = content_type
        self.accept = accept
        self.body = body
        self.keep_alive = keep_alive
        # A compiled build (queen/_native.py) checks each attribute's type when it is set.
        self.wait_gone: Callable[[], Awaitable[None]] | None = None  # async () -> None, returns when the client hangs up (set per connection)
        # async () -> None, returns when the server needs the connection back for a new client: a
        # call parked on it is then answered as if its wait ran out (set per connection).
        self.answer_now: Callable[[], Awaitable[None]] | None = None
        self.authorization = authorization  # the Authorization header's value, b"" when absent
        self.principal: Principal | None = None  # who is calling (queen/auth.py), set by the routes before a handler runs
        # The route's RequestSeries (queen/histogram.py) the answer is counted in, set by the routes
        # once the path matched one; None: counted as unmatched.
        self.route: RequestSeries | None = None
        # The X-Request-Id header's value as the client sent it (b"" when absent); the connection
        # replaces it with the id the answer carries (its own, or one it makes: request_id_of).
        self.request_id = request_id


class Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int, body: bytes, content_type: bytes, headers: list | None = None):
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class Reject(Exception):
    """A request broke an HTTP-level rule: answer `status` with the error envelope and close."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.error = QueenError(code, message)


INTERNAL = QueenError("internal", "the server failed to handle this request; see its log", http_status=500)
# The last resort when even an error answer cannot be built: fixed bytes, the envelope every
# refusal has (tests/http/test_error_envelope.py holds the two to the same document).
INTERNAL_BODY = (b'{"error":"the server failed to handle this request; see its log","code":"internal",'
                 b'"details":{},"detail":"the server failed to handle this request; see its log"}\n')

# A client's own X-Request-Id is kept when it is this: short printable ASCII that cannot break a log
# line or a header. Anything else is replaced by one of ours, never echoed.
REQUEST_ID_BYTES_MAX = 128
_CLIENT_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,%d}" % REQUEST_ID_BYTES_MAX)


def request_id_of(sent: bytes, new_ids: Iterator[bytes]) -> bytes:
    """The id a request's answer and log lines carry: the client's X-Request-Id if it is well
    formed, else the next of new_ids (the connection layer's)."""
    if sent and _CLIENT_REQUEST_ID.fullmatch(sent) is not None:
        return sent
    return next(new_ids)


def error_response(error: QueenError, wants_cbor: bool = False) -> Response:
    body, content_type = encode_body(error.to_wire(), wants_cbor)
    headers = getattr(error, "headers", None)  # WWW-Authenticate, Retry-After: the error knows them
    if headers is None:
        if error.http_status == 503:
            headers = [(b"retry-after", b"1")]
        elif error.http_status == 405 and "allow" in error.details:
            headers = [(b"allow", ", ".join(error.details["allow"]).encode())]
    return Response(error.http_status, body, content_type, headers)


class PendingBytes:
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
    A request with both Content-Length and Transfer-Encoding raises Reject (400): the two could
    frame the body differently for us and for a proxy in front of us (RFC 9112 section 6.1). So
    does a head with a bare LF line end or a folded header line (HeadLines), which the h11 path
    refuses too.
    """
    end = data.find(b"\r\n\r\n", 0, config.header_bytes_max)
    if end < 0:
        HeadLines().feed(data)  # a head ended by bare LFs has no CRLF CRLF
        return None
    match = _SIMPLE_HEAD.fullmatch(data, 0, end + 4)
    if match is None:
        HeadLines().feed(data)
        return None
    method, target, minor, fields = match.groups()
    content_type = accept = authorization = request_id = b""
    authorizations = 0
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
        elif name == b"authorization":
            if authorizations:
                plain = False  # two: the h11 path refuses them (Head)
            authorizations += 1
            authorization = value.strip(b" \t")
        elif name == b"connection":
            if b"close" in value.lower():
                keep_alive = False
        elif name == b"x-request-id":
            request_id = value.strip(b" \t")
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"expect":
            plain = False
    if chunked:
        if lengths:
            raise Reject(400, "bad_http", _BOTH_FRAMINGS)
        return None
    if not plain or hosts != 1 or lengths > 1 or length > config.body_bytes_max:
        return None
    start = end + 4
    stop = start + length
    if len(data) < stop:
        return None
    return (Request(method, target, content_type, accept, data[start:stop], keep_alive, authorization, request_id),
            data[stop:])


_OBSOLETE_LINE = re.compile(rb"(?<!\r)\n|\r\n[ \t]")


class HeadLines:
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
                raise Reject(400, "bad_http", "a line of the request head ends in a bare LF; end every line with "
                              "CRLF (RFC 9112 section 2.2 allows refusing it, and we do)")
            raise Reject(400, "bad_http", "a header line is continued on the next line (obsolete line folding); "
                          "send each header on one line (RFC 9112 section 5.2 allows refusing it, and we do)")
        self.tail = window[-3:]
        self.done = end >= 0


def chunk_bytes_owed(conn: h11.Connection) -> int:
    """The bytes still to come of the chunk h11 is reading: the size its chunk line announced, less
    what has arrived; 0 when it is reading none. h11 keeps this to itself (ChunkedReader's
    _bytes_in_chunk) and would wait for every byte of a chunk announced as ffffffff. Should a
    later h11 keep it elsewhere, this reads 0 and the limit holds only as the bytes arrive, as it
    did before (tests/http/test_bad_input.py, the chunk tests, would then fail)."""
    return getattr(getattr(conn, "_reader", None), "_bytes_in_chunk", 0)


class Head:
    """What the server needs from a request head, read in one pass over its headers."""

    __slots__ = ("method", "target", "content_type", "accept", "keep_alive", "authorization", "request_id")

    def __init__(self, event: h11.Request, config: Config):
        self.method = event.method
        self.target = event.target
        self.content_type = self.accept = self.authorization = self.request_id = b""
        keep_alive = event.http_version == b"1.1"
        # h11 bounds only a head still incomplete in its buffer; one that arrived whole in a single
        # read is measured here.
        head_bytes = len(event.method) + len(event.target)
        framings = 0
        authorized = False
        for name, value in event.headers:
            head_bytes += len(name) + len(value) + 4
            if name == b"content-type":
                self.content_type = value.lower()
            elif name == b"transfer-encoding":
                framings |= 1
            elif name == b"content-length":
                framings |= 2
                if int(value) > config.body_bytes_max:
                    raise Reject(413, "body_too_large", f"the body is {int(value)} bytes; the limit is {config.body_bytes_max}")
            elif name == b"accept":
                self.accept = value.lower()
            elif name == b"authorization":
                if authorized:
                    # Which one would a proxy in front of us have checked? Neither is taken.
                    raise Reject(400, "bad_http", "the request has two Authorization headers; send one")
                self.authorization = value
                authorized = True
            elif name == b"connection":
                keep_alive = b"close" not in value.lower() and keep_alive
            elif name == b"x-request-id":
                self.request_id = value
        if head_bytes > config.header_bytes_max:
            raise Reject(431, "head_too_large", f"the request head is over the limit of {config.header_bytes_max} bytes")
        if framings == 3:
            raise Reject(400, "bad_http", _BOTH_FRAMINGS)
        self.keep_alive = keep_alive


_BOTH_FRAMINGS = ("the request has both Content-Length and Transfer-Encoding; send one (RFC 9112 section 6.1 "
                  "allows closing such a connection, and we do)")


def encode_response(response: Response, keep_alive: bool, request_id: bytes) -> bytes:
    return encode_head(response, keep_alive, request_id) + response.body


def encode_head(response: Response, keep_alive: bool, request_id: bytes) -> bytes:
    """The status line and headers, up to the blank line that ends them. request_id: the
    X-Request-Id every answer carries (request_id_of)."""
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nx-request-id: %s\r\n" % (
        response.status, _REASONS.get(response.status, b""), response.content_type, len(response.body), request_id)
    if response.headers:
        head += b"".join(b"%s: %s\r\n" % header for header in response.headers)
    if not keep_alive:
        head += b"connection: close\r\n"
    return head + b"\r\n"
