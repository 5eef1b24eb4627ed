"""parse_simple_request against h11, the oracle: whatever the fast path accepts, h11 accepts too and
reads as the same request with the same bytes left over; whatever h11 refuses, the fast path
declines (and h11 then answers the error). The oracle is h11 as the server drives it: the head's
line ends are looked at first (HeadLines), since a bare LF and obs-fold, which h11 accepts, are
refused on both paths. Then the connection loop over real sockets, for the shapes that leave the
fast path: pipelining, split reads, 100-continue, chunked bodies, HTTP/1.0."""

import h11
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from queen.config import Config
from queen.http.wire import Head, HeadLines, Reject, parse_simple_request
from queen.testing import open_server

CONFIG = Config()


def parse_with_h11(data: bytes):
    """(method, target, content_type, accept, body, keep_alive, request_id, rest), or None where the
    server's h11 path refuses or needs more data."""
    try:
        HeadLines().feed(data)
    except Reject:
        return None
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=CONFIG.header_bytes_max)
    conn.receive_data(data)
    head, body = None, b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if type(event) is h11.Request:
                head = Head(event, CONFIG)
            elif type(event) is h11.Data:
                body += event.data
            elif type(event) is h11.EndOfMessage:
                return (head.method, head.target, head.content_type, head.accept, body, head.keep_alive,
                        head.request_id, conn.trailing_data[0])
            else:
                return None
    except Exception:  # h11's protocol errors and our Head's limits: refused
        return None


REJECTED = "rejected"


def parse_fast(data: bytes):
    try:
        parsed = parse_simple_request(data, CONFIG)
    except Reject:
        return REJECTED
    if parsed is None:
        return None
    request, rest = parsed
    return (request.method, request.target, request.content_type, request.accept, request.body, request.keep_alive,
            request.request_id, rest)


PLAIN = (b"POST /api/v1/locks HTTP/1.1\r\nHost: 127.0.0.1:6632\r\nContent-Type: application/json\r\n"
         b"Accept: application/cbor\r\nX-Request-Id:  job-7.step:2 \r\nContent-Length: 15\r\n\r\n{\"operations\":}")


def test_the_plain_shape_is_parsed_like_h11_does():
    fast = parse_fast(PLAIN + b"GET /h")
    assert fast is not None
    assert fast == parse_with_h11(PLAIN + b"GET /h")
    assert fast[1] == b"/api/v1/locks" and fast[2] == b"application/json" and fast[7] == b"GET /h"
    assert fast[6] == b"job-7.step:2"  # as sent, less the spaces around it


def test_shapes_it_leaves_to_h11():
    head = b"POST /x HTTP/1.1\r\nhost: q\r\n"
    for declined in (
        PLAIN[:-3],  # body still arriving
        PLAIN[:40],  # head still arriving
        head + b"transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        head + b"expect: 100-continue\r\ncontent-length: 1\r\n\r\nx",
        head + b"content-length: 1\r\ncontent-length: 1\r\n\r\nx",
        b"POST /x HTTP/1.1\r\ncontent-length: 0\r\n\r\n",  # no host
        head + b"x-latin: caf\xe9\r\n\r\n",
        b"\r\n" + head + b"\r\n",
        b"POST /x HTTP/2.0\r\nhost: q\r\n\r\n",
        head + b"content-length: %d\r\n\r\n" % (CONFIG.body_bytes_max + 1),
        head + b"x-big: " + b"a" * CONFIG.header_bytes_max + b"\r\n\r\n",
        head + b"content-length: " + b"9" * 5000 + b"\r\n\r\n",  # int() of it would raise
        head + b"content-length: " + b"0" * 20 + b"\r\n\r\n",
    ):
        assert parse_fast(declined) is None, declined


@pytest.mark.parametrize("fields", [
    b"content-length: 3\r\ntransfer-encoding: chunked\r\n",
    b"transfer-encoding: chunked\r\ncontent-length: 3\r\n",
])
def test_both_content_length_and_transfer_encoding_are_refused_on_both_paths(fields):
    data = b"POST /x HTTP/1.1\r\nhost: q\r\n" + fields + b"\r\n3\r\nabc\r\n0\r\n\r\n"
    assert parse_fast(data) == REJECTED
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    with pytest.raises(Reject) as caught:
        Head(conn.next_event(), CONFIG)
    assert caught.value.status == 400


OBSOLETE_LINES = {
    "bare LF everywhere": b"POST /x HTTP/1.1\nhost: q\ncontent-length: 2\n\n{}",
    "bare LF on one line": b"POST /x HTTP/1.1\r\nhost: q\ncontent-length: 2\r\n\r\n{}",
    "bare LF ending the head": b"POST /x HTTP/1.1\r\nhost: q\r\ncontent-length: 2\r\n\n{}",
    "bare LF after the request line": b"POST /x HTTP/1.1\nhost: q\r\ncontent-length: 2\r\n\r\n{}",
    "obs-fold with a space": b"POST /x HTTP/1.1\r\nhost: q\r\nx-note: a\r\n b\r\ncontent-length: 2\r\n\r\n{}",
    "obs-fold with a tab": b"POST /x HTTP/1.1\r\nhost: q\r\nx-note: a\r\n\tb\r\ncontent-length: 2\r\n\r\n{}",
    "obs-fold of the last header": b"POST /x HTTP/1.1\r\nhost: q\r\ncontent-length: 2\r\nx-note: a\r\n b\r\n\r\n{}",
}


@pytest.mark.parametrize("what", list(OBSOLETE_LINES))
def test_bare_lf_and_obs_fold_are_refused_on_both_paths_though_h11_reads_them(what):
    data = OBSOLETE_LINES[what]
    assert parse_fast(data) == REJECTED
    assert parse_fast(data[:-2]) == REJECTED  # the body still arriving
    assert parse_with_h11(data) is None
    conn = h11.Connection(h11.SERVER)  # h11 alone reads them: why the server looks first
    conn.receive_data(data)
    assert type(conn.next_event()) is h11.Request
    for split in range(1, len(data)):  # arriving in two pieces, cut anywhere
        lines = HeadLines()
        with pytest.raises(Reject) as caught:
            lines.feed(data[:split])
            lines.feed(data[split:])
        assert caught.value.status == 400 and caught.value.error.code == "bad_http"


def test_line_ends_past_the_head_are_the_body_s_business():
    head = b"POST /x HTTP/1.1\r\nhost: q\r\ncontent-length: 6\r\n\r\n"
    for body in (b"a\nb\n c", b"\n\n\n\n\n\n", b" \r\n \t\n"):
        data = head + body[:6]
        assert parse_fast(data) == parse_with_h11(data) != None  # noqa: E711
        for split in range(1, len(data)):
            lines = HeadLines()
            lines.feed(data[:split])
            lines.feed(data[split:])


def mostly(good: list, odd: list):
    """Valid parts most of the time, so that whole requests are often valid and each odd part is
    tried against an otherwise acceptable request."""
    return st.sampled_from(good * (4 * len(odd)) + odd)


METHODS = mostly([b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"X-Odd!"], [b"G T", b"", b"P\x00", b"G\xe9T"])
TARGETS = mostly([b"/", b"/api/v1/kv/a%2Fb?x=1", b"*", b"/~!$&'()*+,;=:@"],
                 [b"/sp ace", b"/tab\t", b"/\x7f", b"/caf\xe9", b""])
VERSIONS = mostly([b"HTTP/1.1", b"HTTP/1.0"], [b"HTTP/2.0", b"HTTP/1.1 ", b"http/1.1", b"HTTP/11", b"HTTP/1.9"])
NAMES = mostly([b"Host", b"host", b"Content-Type", b"Accept", b"Connection", b"X-Thing", b"x_y", b"X-Request-Id"],
               [b"Content-Length", b"Transfer-Encoding", b"Expect", b"Bad Name", b"", b"X:Y", b"\xe9"])
VALUES = mostly([b"q", b"application/json", b"APPLICATION/CBOR", b"close", b"keep-alive, Close", b"a\tb", b"",
            b"x  y", b"!~"],
           [b"chunked", b"100-continue", b"5", b"05", b" 3 ", b"-1", b"1,1", b"  ", b"a\x00b", b"caf\xe9",
            b"a\rb", b"a\nb"])
SEPARATORS = mostly([b"\r\n"], [b"\n", b"\r", b"\r\n "])


@st.composite
def requests(draw):
    sep = draw(SEPARATORS)
    head = draw(METHODS) + b" " + draw(TARGETS) + b" " + draw(VERSIONS) + b"\r\n"
    body = draw(st.binary(max_size=8))
    fields = draw(st.lists(st.tuples(NAMES, VALUES), max_size=4))
    fields = [(name, value if draw(st.integers(0, 9)) else draw(st.binary(max_size=4))) for name, value in fields]
    fields.extend([(b"Host", b"q")] * draw(mostly([1], [0, 2])))
    length = draw(mostly([b"%d" % len(body)], [None, b"%d" % (len(body) + 1), b" %d" % len(body), b"+1"]))
    if length is not None:
        fields.append((b"Content-Length", length))
    for name, value in draw(st.permutations(fields)):
        head += name + b":" + draw(st.sampled_from([b"", b" ", b"\t"])) + value + draw(st.sampled_from([b"", b" "])) + sep
    data = head + b"\r\n" + body + draw(st.sampled_from([b"", b"GET / HTTP/1.1\r\n", b"\x00junk"]))
    if draw(st.integers(0, 4)) == 0:
        return data[:draw(st.integers(0, len(data)))]  # still arriving
    return data


@settings(max_examples=1500, deadline=None)
@given(requests())
def test_whatever_the_fast_path_accepts_h11_reads_the_same(data):
    fast = parse_fast(data)
    if fast == REJECTED:
        assert parse_with_h11(data) is None  # the h11 path refuses it too
    elif fast is not None:
        assert parse_with_h11(data) == fast


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"GET", b"POST"]), min_size=1, max_size=4), st.binary(max_size=10))
def test_plain_requests_never_leave_the_fast_path(methods, body):
    for method in methods:
        data = method + b" /k HTTP/1.1\r\nhost: q\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        assert parse_fast(data) == parse_with_h11(data) != None  # noqa: E711


async def exchange(port, *writes: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    for data in writes:
        await stream.send_all(data)
        await trio.sleep(0.01)  # virtual time (autojump): lets the server read each write on its own
    await stream.send_eof()
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    await stream.aclose()
    return received


async def test_pipelined_requests_are_answered_in_order(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        put = (b'PUT /api/v1/kv/app/k HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n'
               b'content-length: 27\r\n\r\n{"value":7,"ttlSeconds":60}')
        get = b"GET /api/v1/kv/app/k HTTP/1.1\r\nhost: q\r\n\r\n"
        raw = await exchange(server.port, put + get + b"GET /healthz HTTP/1.1\r\nhost: q\r\n\r\n")
        answers = raw.split(b"HTTP/1.1 ")[1:]
        assert [answer[:3] for answer in answers] == [b"200"] * 3
        assert b'"applied":true' in answers[0] and b'"value":7' in answers[1] and b'"ok"' in answers[2]


async def test_requests_split_across_reads_chunked_and_continue_go_through_h11(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        body = b'{"value":1,"ttlSeconds":60}'
        head = b"PUT /api/v1/kv/app/k HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
        split = head + b"content-length: %d\r\n\r\n" % len(body)
        chunked = head + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        expect = head + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(body)
        raw = await exchange(server.port, split[:20], split[20:], body, chunked, expect, body,
                             b"GET /healthz HTTP/1.1\r\nhost: q\r\n\r\n")
        assert raw.count(b"HTTP/1.1 100 Continue\r\n\r\n") == 1
        answers = raw.replace(b"HTTP/1.1 100 Continue\r\n\r\n", b"").split(b"HTTP/1.1 ")[1:]
        assert [answer[:3] for answer in answers] == [b"200"] * 4
        assert all(b'"applied":true' in answer for answer in answers[:3])


async def test_http_1_0_gets_its_answer_and_the_connection_closes(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(b"GET /healthz HTTP/1.0\r\nhost: q\r\n\r\n")
        received = b""
        while chunk := await stream.receive_some(65536):  # ends: the server closed
            received += chunk
        await stream.aclose()
        assert received.startswith(b"HTTP/1.1 200 ") and b"connection: close\r\n" in received
