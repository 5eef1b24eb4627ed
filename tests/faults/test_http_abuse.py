"""Abusive HTTP clients against a real server process, end to end: the in-process tests of
tests/http/ check each limit under a mocked clock; these check that a real `queen serve`, on real
sockets and real time, holds them and goes on serving.

Promises checked, each named in the test that checks it:
  P7  bad input gets a 4xx with an error code and a message, and changes nothing;
  P8  the HTTP server survives slowloris, floods of connections, oversized and malformed requests,
      and clients that never read their answers.

After every abuse a fresh client's KV put and get must be answered correctly, the process must
be alive, and the server must have let go of every connection the abuse opened. The server runs
with small limits (below) so that each abuse takes a second or less. Nothing sleeps for time to
pass: the tests wait on sockets (answers, EOF, resets), with generous socket timeouts as guards.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import time

import pytest

from queen.testing import ServerProcess
from tests.faults.workloads import OUTCOMES, Outcome

READ_TIMEOUT_S = 1.0
SEND_TIMEOUT_S = 1.0
CONNECTIONS_MAX = 16
HEAD_MAX = 4096
BODY_MAX = 65536
OPS_MAX = 8
KEY_MAX = 300
VALUE_MAX = 32768
SERVER_ARGS = ("--header-bytes-max", str(HEAD_MAX), "--body-bytes-max", str(BODY_MAX),
               "--request-read-timeout-s", str(READ_TIMEOUT_S), "--send-timeout-s", str(SEND_TIMEOUT_S),
               "--idle-timeout-s", "30", "--connections-max", str(CONNECTIONS_MAX),
               "--ops-per-call-max", str(OPS_MAX), "--key-bytes-max", str(KEY_MAX), "--value-bytes-max", str(VALUE_MAX))
# The longest any socket wait may take before the test gives up: a guard, never a pace.
GUARD_S = 15.0

_checks = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(str(tmp_path_factory.mktemp("abuse") / "data"), *SERVER_ARGS).start()
    yield process
    process.stop()


def record(workload: str, ops: int, histories: int, promises: tuple, detail: str = "") -> None:
    OUTCOMES.append((Outcome(workload=workload, seed=0, ops=ops, histories=histories, promises=promises,
                             detail=detail), None))


def assert_serves(server: ServerProcess) -> None:
    """The process is alive, a fresh client's put is read back as written, and the server holds
    no connection but the one asking (the abuse's connections were all let go)."""
    assert server.process.poll() is None, "the server process died"
    n = next(_checks)
    value = {"check": n, "text": "still serving"}
    status, put = server.request("PUT", f"/api/v1/kv/health/check-{n}", {"value": value, "forever": True})
    assert status == 200 and put["applied"] is True, put
    status, got = server.request("GET", f"/api/v1/kv/health/check-{n}")
    assert status == 200 and (got["value"], got["version"]) == (value, put["version"]), got
    # The server sees a closed socket on its next pass; a few polls of a real process, bounded.
    deadline = time.monotonic() + GUARD_S
    while server.metrics()["queen_connections"] > 1:
        assert time.monotonic() < deadline, "the server still holds connections the abuse opened"


def connect(server: ServerProcess, timeout_s: float = GUARD_S) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s)


def read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """One whole response: status, headers (lower-case names) and body."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed without answering: {received[:200]!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "the server closed in the middle of its answer"
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed the connection (EOF or reset) with nothing more to say."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def error_of(body: bytes) -> dict:
    """The error envelope (its code, and its message as `error`), which every refusal with a body carries."""
    document = json.loads(body)
    assert document["code"] and isinstance(document["error"], str) and document["error"], document
    return document


def hidden_put(key: str) -> bytes:
    """A whole request to write `key`, to hide inside another request's body."""
    body = b'{"value":"smuggled","forever":true}'
    return (b"PUT /api/v1/kv/abuse/%s HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (key.encode(), len(body), body))


def assert_refused_and_closed(server: ServerProcess, what: str, request: bytes, status: int, code: str) -> None:
    """request, sent whole on a new connection, is answered status with the error code, and the
    server closes the connection after it."""
    sock = connect(server)
    try:
        sock.sendall(request)
        got, headers, body = read_response(sock)
        assert got == status and error_of(body)["code"] == code, (what, got, body)
        assert headers.get("connection") == "close" and closed_by_server(sock), what
    finally:
        sock.close()


def assert_absent(server: ServerProcess, key: str) -> None:
    status, got = server.request("GET", f"/api/v1/kv/abuse/{key}")
    assert status == 200 and got["found"] is False, (key, got)


# -- slow and idle clients ------------------------------------------------------------------------


def test_p8_slowloris_heads_are_cut_off_after_the_read_timeout_while_others_are_served(server):
    """Ten connections start a request and never finish it: five drip its head a byte at a time,
    five send part of it once and go quiet. Each is cut off once the request has taken longer than
    the read timeout (the drip does not extend it): 408 request_timeout and close (a drip that
    crosses the close may see a reset instead). Meanwhile a normal client is served every round."""
    before = server.metrics()
    head = b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    slow = {}  # socket -> {"drip": bool, "sent": bytes count, "started", "ended", "received", "reset"}
    for i in range(10):
        sock = connect(server)
        drip = i % 2 == 0
        sock.sendall(head[:1] if drip else head[:40])
        slow[sock] = {"drip": drip, "sent": 1 if drip else 40, "started": time.monotonic(), "ended": None,
                      "received": b"", "reset": False}
    served = 0
    open_socks = set(slow)
    deadline = time.monotonic() + GUARD_S
    while open_socks and time.monotonic() < deadline:
        # The drip's pace is 0.3 s of silence from the server, off the beat of its 0.25 s reaper.
        readable, _, _ = select.select(list(open_socks), [], [], 0.3)
        for sock in readable:
            state = slow[sock]
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk, state["reset"] = b"", True
            state["received"] += chunk
            if not chunk:
                state["ended"] = time.monotonic()
                open_socks.discard(sock)
        if not readable:
            for sock in open_socks:
                state = slow[sock]
                if state["drip"] and not state["received"] and state["sent"] < len(head) - 1:
                    try:
                        sock.sendall(head[state["sent"]:state["sent"] + 1])
                        state["sent"] += 1
                    except OSError:
                        pass  # closed under us: the read above will say how
            status, put = server.request("PUT", "/api/v1/kv/abuse/slowloris-neighbour", {"value": served, "forever": True})
            assert status == 200 and put["applied"] is True
            served += 1
    assert not open_socks, f"{len(open_socks)} slow connections were never cut off"
    for sock, state in slow.items():
        took = state["ended"] - state["started"]
        assert READ_TIMEOUT_S - 0.1 <= took <= READ_TIMEOUT_S + 4, (state, took)
        if state["drip"] and state["reset"]:
            continue
        assert state["received"].startswith(b"HTTP/1.1 408 ") and b"request_timeout" in state["received"], state
        sock.close()
    assert any(state["drip"] and state["sent"] > 2 for state in slow.values()), "no byte was dripped"
    assert served >= 2, "the normal client was not served while the slow ones hung on"
    assert server.metrics()["queen_connections_timed_out_total"] - before["queen_connections_timed_out_total"] == 10
    assert_serves(server)
    record("http-slowloris", sum(s["sent"] for s in slow.values()) + 2 * served, len(slow), ("P8",),
           detail=f"{len(slow)} slow heads, {served} requests served meanwhile")


def test_p8_an_idle_flood_past_the_connection_limit_makes_room_for_new_clients(server):
    """Forty connections that never send a byte, against a limit of sixteen: each new one takes
    the place of the longest-idle one, which the server closes, so a fresh client is still served
    and the server never holds more than its limit."""
    before = server.metrics()
    flood = [connect(server) for _ in range(40)]
    assert_serves_now(server)
    # Every connection past the limit closed an older idle one; wait on those sockets to see it.
    closed = set()
    deadline = time.monotonic() + GUARD_S
    while len(closed) < len(flood) - CONNECTIONS_MAX and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in flood if s not in closed], [], [], 1.0)
        closed.update(sock for sock in readable if closed_by_server(sock))
    assert len(closed) >= len(flood) - CONNECTIONS_MAX, len(closed)
    after = server.metrics()
    assert after["queen_connections"] <= CONNECTIONS_MAX
    assert after["queen_connections_idle_closed_total"] - before["queen_connections_idle_closed_total"] >= len(closed)
    for sock in flood:
        sock.close()
    assert_serves(server)
    record("http-idle-flood", len(flood) + 2, len(flood), ("P8",), detail=f"{len(closed)} idle connections closed")


def assert_serves_now(server: ServerProcess) -> None:
    """A put and get answered while the abuse is still connected."""
    status, put = server.request("PUT", "/api/v1/kv/abuse/during", {"value": "during", "forever": True})
    assert status == 200 and put["applied"] is True
    status, got = server.request("GET", "/api/v1/kv/abuse/during")
    assert status == 200 and got["value"] == "during"


def test_p8_at_the_limit_with_every_connection_parked_a_new_client_is_served_and_the_longest_parked_gives_way(server):
    """Sixteen connections each park an acquire on a held lock (busy, not idle). A new client is
    served all the same: the acquire parked longest is answered as if its wait had run out
    (acquired false, reason timeout) and its connection closed, and nobody is answered 503. Once
    the parked clients hang up, their acquires are withdrawn: when the holder releases, none of
    them is handed the lock."""
    holder = server.request("POST", "/api/v1/locks", {"operations": [
        {"op": "acquire", "name": "busy", "ttlSeconds": 60, "owner": "holder"}]})[1]["results"][0]
    assert holder["acquired"] is True
    before = server.metrics()

    def park(owner: str) -> socket.socket:
        sock = connect(server)
        body = json.dumps({"operations": [{"op": "acquire", "name": "busy", "ttlSeconds": 5, "owner": owner,
                                           "waitMs": 30_000}]}).encode()
        sock.sendall(b"POST /api/v1/locks HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        return sock

    # Park all but one, and wait until the server has taken up each of their requests (its request
    # count shows it; each metrics read counts itself too): a parked connection whose request is
    # not read yet is idle, and a probe would take its place. Then park the last one.
    parked = []
    gave_way = None
    try:
        base = server.metrics()["queen_requests_total"]
        parked += [park(f"w{i}") for i in range(CONNECTIONS_MAX - 1)]
        deadline = time.monotonic() + GUARD_S
        polls = 0
        while server.metrics()["queen_requests_total"] - base - (polls := polls + 1) < len(parked):
            assert time.monotonic() < deadline, "the server never took up the parked requests"
        parked.append(park("last"))
        for attempt in range(10):
            status, answer = server.request("GET", "/healthz")
            assert status == 200, (status, answer)  # served, never 503: somebody gave way
            readable, _, _ = select.select(parked, [], [], GUARD_S)
            assert len(readable) == 1, "a new client was served with every connection busy"
            sock = readable[0]
            parked.remove(sock)
            try:
                unanswered = sock.recv(1, socket.MSG_PEEK) == b""
            except ConnectionResetError:
                unanswered = True
            if unanswered:
                # The last parked client's request was not read yet (its connection was still
                # idle), so it was closed for the new one unanswered. Park another in its place
                # and try again: bounded, each attempt waits on the server.
                sock.close()
                parked.append(park(f"again{attempt}"))
                continue
            gave_way = sock
            break
        assert gave_way is not None, "no parked call gave way"
        status, headers, body = read_response(gave_way)
        result = json.loads(body)["results"][0]
        assert status == 200 and (result["acquired"], result["reason"]) == (False, "timeout"), (status, body)
        assert headers.get("connection") == "close" and closed_by_server(gave_way)
    finally:
        for sock in parked + [gave_way] * (gave_way is not None):
            sock.close()
    assert server.metrics()["queen_connections_refused_total"] == before["queen_connections_refused_total"]
    # The server learns of each hang-up on its own next pass over that socket.
    assert_serves(server)
    # The hung-up acquires were withdrawn: released now, the lock goes to none of them.
    released = server.request("POST", "/api/v1/locks", {"operations": [
        {"op": "release", "name": "busy", "slot": holder["slot"], "token": holder["token"], "owner": "holder"}]})
    assert released[1]["results"][0]["released"] is True, released
    status, got = server.request("POST", "/api/v1/locks", {"operations": [{"op": "get", "name": "busy"}]})
    assert got["results"][0]["holders"] == [], got
    record("http-busy-flood", len(parked) + 4, len(parked), ("P8",))


def test_p8_a_client_that_pipelines_and_never_reads_is_cut_off_after_the_send_timeout(server):
    """A client pipelines GETs of a 30 KB value and never reads an answer, with a small receive
    buffer: the server's answers back up, and once one is not taken within the send timeout the
    server cuts the connection (our next send sees the reset). Other clients are served while it
    is stuck."""
    before = server.metrics()
    status, _ = server.request("PUT", "/api/v1/kv/abuse/big", {"value": "v" * 30_000, "forever": True})
    assert status == 200
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    requests = b"GET /api/v1/kv/abuse/big HTTP/1.1\r\nhost: q\r\n\r\n" * 20
    sent = 0
    stuck_served = False
    cut = None
    deadline = time.monotonic() + GUARD_S
    while cut is None and time.monotonic() < deadline:
        # Wait until the socket takes more (or reports the server's reset); a full buffer is the
        # point, and a stuck client is when the others must still be served.
        _, writable, _ = select.select([], [sock], [], 0.2)
        if not writable:
            if not stuck_served:
                assert_serves_now(server)
                stuck_served = True
            continue
        try:
            sent += sock.send(requests)
        except (ConnectionResetError, BrokenPipeError) as error:
            cut = error
    sock.close()
    assert cut is not None, "the server never cut off a client that does not read"
    assert stuck_served, "the client's buffers never filled"
    assert server.metrics()["queen_connections_timed_out_total"] > before["queen_connections_timed_out_total"]
    assert_serves(server)
    record("http-never-reads", sent // 46 + 3, 1, ("P8",), detail=f"{sent} bytes of requests pipelined")


# -- oversized and malformed requests -------------------------------------------------------------


def test_p8_an_oversized_head_gets_431_and_close(server):
    """A head over the limit, whole or never finished, is answered 431 with a JSON error and the
    connection closed."""
    shapes = {
        "whole": b"GET /healthz HTTP/1.1\r\nhost: q\r\nx-big: " + b"a" * (2 * HEAD_MAX) + b"\r\n\r\n",
        "never finished": b"GET /healthz HTTP/1.1\r\nhost: q\r\nx-big: " + b"a" * (2 * HEAD_MAX),
        "many headers": b"GET /healthz HTTP/1.1\r\nhost: q\r\n" + b"x-h: 1\r\n" * (HEAD_MAX // 8 + 10) + b"\r\n",
    }
    for name, request in shapes.items():
        sock = connect(server)
        sock.sendall(request)
        status, headers, body = read_response(sock)
        assert status == 431 and error_of(body) and headers.get("connection") == "close", (name, status, body)
        assert closed_by_server(sock), name
        sock.close()
    assert_serves(server)
    record("http-oversized-head", len(shapes) + 2, len(shapes), ("P7", "P8"))


def test_p8_an_oversized_body_gets_413_and_writes_nothing(server):
    """A body over the limit, announced by Content-Length, sent in chunks, or announced by a chunk
    size, is answered 413 body_too_large and the connection closed; the KV write it holds is not
    applied."""
    def put_document(key: str) -> bytes:
        return json.dumps({"operations": [{"op": "put", "ns": "abuse", "key": key, "value": "x" * (BODY_MAX + 1000),
                                           "forever": True}]}).encode()

    by_length = put_document("huge-by-length")
    chunked = put_document("huge-chunked")
    requests = {
        "huge-by-length": b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (len(by_length), by_length),
        "huge-chunked": b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
                        b"transfer-encoding: chunked\r\n\r\n"
                        + b"".join(b"%x\r\n%s\r\n" % (len(chunked[i:i + 8192]), chunked[i:i + 8192])
                                   for i in range(0, len(chunked), 8192)) + b"0\r\n\r\n",
        # One chunk announced as 2**80 - 1 bytes, and a few of them: answered at once, not at the
        # read timeout (which would be a 408).
        "huge-chunk-size": b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
                           b"transfer-encoding: chunked\r\n\r\n" + b"f" * 20 + b"\r\n" + chunked[:100],
    }
    for key, request in requests.items():
        assert_refused_and_closed(server, key, request, 413, "body_too_large")
        assert_absent(server, key)
    assert_serves(server)
    record("http-oversized-body", len(requests) * 2 + 2, len(requests), ("P7", "P8"))


def smuggling_shapes() -> dict[str, bytes]:
    """Requests whose framing is ambiguous or broken, each with a whole KV put hidden where one
    reading of the framing would take it for a second request."""
    start = b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"

    def chunked(key, chunk_head):
        return start + b"transfer-encoding: chunked\r\n\r\n" + chunk_head + b"\r\n" + hidden_put(key) + b"\r\n0\r\n\r\n"

    shapes = {
        "length-and-chunked": start + b"content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
                              + hidden_put("length-and-chunked"),
        "two-lengths": start + b"content-length: 2\r\ncontent-length: %d\r\n\r\n{}" % (2 + len(hidden_put("two-lengths")))
                       + hidden_put("two-lengths"),
        "length-list": start + b"content-length: 2, %d\r\n\r\n{}" % (2 + len(hidden_put("length-list")))
                       + hidden_put("length-list"),
        "gzip-encoding": start + b"transfer-encoding: gzip\r\n\r\n" + hidden_put("gzip-encoding"),
        "gzip-then-chunked": start + b"transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + hidden_put("gzip-then-chunked"),
        "space-before-colon": start + b"transfer-encoding : chunked\r\ncontent-length: 2\r\n\r\n{}"
                              + hidden_put("space-before-colon"),
        "chunk-size-not-hex": chunked("chunk-size-not-hex", b"zz"),
        "chunk-size-negative": chunked("chunk-size-negative", b"-5"),
        "chunk-size-overflow": chunked("chunk-size-overflow", b"1" + b"0" * 20),
        "chunk-size-0x": chunked("chunk-size-0x", b"0x10"),
        "chunk-shorter-than-said": start + b"transfer-encoding: chunked\r\n\r\n1\r\n{}\r\n0\r\n\r\n"
                                   + hidden_put("chunk-shorter-than-said"),
        "double-space-in-request-line": b"POST  /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: 2\r\n\r\n{}"
                                        + hidden_put("double-space-in-request-line"),
        "tab-in-request-line": b"POST\t/api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: 2\r\n\r\n{}"
                               + hidden_put("tab-in-request-line"),
        "nul-in-header-value": start + b"x-note: a\x00b\r\ncontent-length: 2\r\n\r\n{}" + hidden_put("nul-in-header-value"),
        "nul-in-header-name": start + b"x-n\x00te: ab\r\ncontent-length: 2\r\n\r\n{}" + hidden_put("nul-in-header-name"),
        "bare-cr-in-head": start + b"x-note: a\rcontent-length: 2\r\n\r\n{}" + hidden_put("bare-cr-in-head"),
        "bare-lf-line-ends": b"POST /api/v1/kv HTTP/1.1\nhost: q\ncontent-type: application/json\ncontent-length: 2\n\n{}"
                             + hidden_put("bare-lf-line-ends"),
        "bare-lf-ending-the-head": start + b"content-length: 2\n\r\n{}" + hidden_put("bare-lf-ending-the-head"),
    }
    return shapes


def test_p8_smuggling_shapes_get_400_and_close_and_nothing_hidden_runs(server):
    """Content-Length with Transfer-Encoding, two different Content-Lengths, a Transfer-Encoding
    other than chunked, broken chunk sizes, bad spacing in the request line or a header, NUL and
    bare CR in the head, bare LF line ends: each is answered 400 bad_http with a JSON error and the
    connection closed, and the KV put hidden in it never runs."""
    shapes = smuggling_shapes()
    for key, request in shapes.items():
        assert_refused_and_closed(server, key, request, 400, "bad_http")
    for key in shapes:
        assert_absent(server, key)
    assert_serves(server)
    record("http-smuggling", 2 * len(shapes) + 2, len(shapes), ("P7", "P8"))


def test_p8_an_obs_fold_header_is_refused_and_never_lets_a_hidden_request_run(server):
    """A header continued on a second line (obs-fold), whole in one read or arriving in pieces.
    RFC 9112 section 5.2 lets a server refuse it (400) or read the fold as a space; a proxy in
    front of us may do the other, so Queen refuses it: 400 bad_http and the connection closed, and
    the KV put inside the body is never run, as a request of its own or otherwise."""
    hidden = hidden_put("obs-fold")
    request = (b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\nx-note: first\r\n"
               b" continued\r\ncontent-length: %d\r\n\r\n%s" % (len(hidden), hidden))
    assert_refused_and_closed(server, "obs-fold", request, 400, "bad_http")
    sock = connect(server)
    try:
        for piece in (request[:70], request[70:90], request[90:]):  # the fold's line end split across sends
            sock.sendall(piece)
        status, headers, body = read_response(sock)
        assert (status, error_of(body)["code"]) == (400, "bad_http"), (status, body)
        assert headers.get("connection") == "close" and closed_by_server(sock)
    finally:
        sock.close()
    assert_absent(server, "obs-fold")
    assert_serves(server)
    record("http-obs-fold", 4, 2, ("P7", "P8"))


# -- P7: malformed API bodies ---------------------------------------------------------------------


def p7_cases() -> list[tuple[str, str, str, object, str]]:
    """(what, method, path, body, error code): each would write p7/k if it were applied."""
    put = {"op": "put", "ns": "p7", "key": "k", "value": "after", "forever": True}
    return [
        ("ttl of the wrong type", "POST", "/api/v1/kv", {"operations": [
            {"op": "put", "ns": "p7", "key": "k", "value": "after", "ttlSeconds": "ten"}]}, "invalid_ttl"),
        ("key of the wrong type", "POST", "/api/v1/kv", {"operations": [put, {**put, "key": 7}]}, "invalid_key"),
        ("forever of the wrong type", "PUT", "/api/v1/kv/p7/k", {"value": "after", "forever": "yes"}, "invalid_forever"),
        ("operations not a list", "POST", "/api/v1/kv", {"operations": "put"}, "invalid_operations"),
        ("body not an object", "POST", "/api/v1/kv", [put], "invalid_body"),
        ("body not JSON", "POST", "/api/v1/kv", b'{"operations": [{"op": "put", "ns": "p7", ', "invalid_json"),
        ("unknown op", "POST", "/api/v1/kv", {"operations": [put, {"op": "frobnicate", "ns": "p7", "key": "k"}]},
         "unknown_op"),
        ("unknown field", "PUT", "/api/v1/kv/p7/k", {"value": "after", "forever": True, "expct": 1}, "unknown_field"),
        ("too many operations", "POST", "/api/v1/kv", {"operations": [put] + [
            {"op": "get", "ns": "p7", "key": f"g{i}"} for i in range(OPS_MAX)]}, "too_many_operations"),
        ("oversize key", "POST", "/api/v1/kv", {"operations": [put, {**put, "key": "x" * (KEY_MAX + 1)}]}, "invalid_key"),
        ("oversize key in the path", "PUT", "/api/v1/kv/p7/" + "x" * (KEY_MAX + 1),
         {"value": "after", "forever": True}, "invalid_key"),
        ("oversize value", "POST", "/api/v1/kv", {"operations": [{**put, "value": "v" * (VALUE_MAX + 1)}]},
         "value_too_large"),
        ("unknown transaction section", "POST", "/api/v1/transaction", {"kv": [put], "bogus": []}, "unknown_section"),
        ("the same key twice in a transaction", "POST", "/api/v1/transaction", {"kv": [put, put]}, "duplicate_key"),
        ("an ack of the wrong type beside a put", "POST", "/api/v1/transaction", {"kv": [put], "ack": [
            {"partitionId": "x", "leaseId": 1, "offset": 0}]}, "invalid_partition_id"),
    ]


def test_p7_malformed_api_bodies_get_a_4xx_with_a_code_and_change_nothing(server):
    """Wrong types, unknown ops and fields, too many operations, oversize keys and values, broken
    transactions: each is answered 400 with its error code and a message, and the key it would
    have written keeps its value and version."""
    status, before = server.request("PUT", "/api/v1/kv/p7/k", {"value": "before", "forever": True})
    assert status == 200
    cases = p7_cases()
    for what, method, path, body, code in cases:
        status, answer = server.request(method, path, body)
        assert status == 400 and answer["code"] == code and answer["error"], (what, status, answer)
        status, got = server.request("GET", "/api/v1/kv/p7/k")
        assert (got["value"], got["version"]) == ("before", before["version"]), (what, got)
    assert_serves(server)
    record("http-bad-bodies", 2 * len(cases) + 3, len(cases), ("P7",))
