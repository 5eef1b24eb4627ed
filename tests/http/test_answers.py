"""What every answer carries. X-Request-Id: the client's own when it sent a well-formed one, else
one the server makes; log lines about a request (a handler's traceback, an audit line) carry it as
request_id. And a JSON answer ends with a newline (answers printed one after another, as curl does
in a shell, do not run together), counted in its Content-Length; CBOR answers are left as they are."""

import logging
import re

import cbor2
import orjson
import pytest
import trio
import trio.testing

from queen.testing import open_server

OURS = re.compile(r"[0-9a-f]{12}-[0-9]+")


async def answers(port: int, data: bytes) -> list[tuple[int, dict, bytes]]:
    """Send data (one request or several pipelined) on one connection; every answer back, parsed by
    its Content-Length, until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    received = b""
    with trio.move_on_after(30):
        while chunk := await stream.receive_some(65536):
            received += chunk
    await stream.aclose()
    out = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            assert name.lower().decode() not in headers, f"{name!r} twice"
            headers[name.lower().decode()] = value.strip().decode()
        length = int(headers["content-length"])
        assert len(rest) >= length, (head, rest)
        out.append((int(lines[0].split()[1]), headers, rest[:length]))
        received = rest[length:]
    return out


def get(target: str, *headers: str, close: bool = True) -> bytes:
    head = f"GET {target} HTTP/1.1\r\nhost: q\r\n" + "".join(f"{header}\r\n" for header in headers)
    return (head + ("connection: close\r\n" if close else "") + "\r\n").encode()


def send(method: str, target: str, body: bytes, *headers: str, close: bool = True) -> bytes:
    head = (f"{method} {target} HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
            "\r\n" + "".join(f"{header}\r\n" for header in headers))
    return (head + ("connection: close\r\n" if close else "") + "\r\n").encode() + body


async def one(port: int, data: bytes) -> tuple[int, dict, bytes]:
    [answer] = await answers(port, data)
    return answer


class NotServing:
    """A cluster node that does not lead, with a leader to send clients to."""

    serving = False
    epoch = 3
    role = "follower"
    sync = None
    leader_advertise = "http://leader:6632"


async def test_every_kind_of_answer_carries_a_request_id_of_its_own(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        port = server.port
        got = {
            "200 write": await one(port, send("PUT", "/api/v1/kv/app/k", b'{"value": 1, "forever": true}')),
            "200 read": await one(port, get("/api/v1/kv/app/k")),
            "400": await one(port, send("POST", "/api/v1/kv", b'{"nonsense": 1}')),
            "404": await one(port, get("/nothing")),
            "405": await one(port, send("PATCH", "/api/v1/kv", b"")),
            "health": await one(port, get("/healthz")),
            "metrics": await one(port, get("/metrics")),
            "dashboard page": await one(port, get("/")),
            "dashboard file": await one(port, get("/dashboard/app.js")),
            "openapi": await one(port, get("/api/v1/openapi.json")),
            "bad HTTP": await one(port, b"GET / HTTP/1.1\nhost: q\n\n"),
        }
        server.http.app.cluster = NotServing()
        got["307"] = await one(port, get("/api/v1/kv/app/k"))
        server.http.app.cluster = None
        server.router.draining = True  # shutting down: health answers 503
        got["503"] = await one(port, get("/healthz"))
        server.router.draining = False
    statuses = {what: status for what, (status, _, _) in got.items()}
    assert statuses["307"] == 307 and statuses["503"] == 503 and statuses["bad HTTP"] == 400, statuses
    ids = {what: headers.get("x-request-id") for what, (_, headers, _) in got.items()}
    assert all(value is not None and OURS.fullmatch(value) for value in ids.values()), ids
    assert len(set(ids.values())) == len(ids), ids


@pytest.mark.parametrize("sent", ["abc", "9f1c2d7e-0b5a-4c1e-8a51-3f0e8b6d2a11", "job-7.step:2_retry", "x" * 128])
async def test_a_client_s_well_formed_request_id_is_kept(sent, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        for data in (get("/healthz", f"X-Request-Id: {sent}"),
                     send("POST", "/api/v1/kv", b'{"nonsense": 1}', f"x-request-id: {sent}"),
                     get("/nothing", f"X-REQUEST-ID:{sent}")):
            status, headers, _ = await one(server.port, data)
            assert headers["x-request-id"] == sent, (data, status)
        # Chunked: read by h11, not the fast parser, with the same header.
        chunked = (b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ntransfer-encoding: chunked\r\nx-request-id: %s\r\n"
                   b"connection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n" % sent.encode())
        status, headers, _ = await one(server.port, chunked)
        assert status == 400 and headers["x-request-id"] == sent


@pytest.mark.parametrize("sent", [b"two words", b"x" * 129, b"caf\xc3\xa9", b"a/b", b"",
                                  b"a;b=c", b'"quoted"', b"<script>"])
async def test_a_malformed_request_id_is_replaced_never_echoed(sent, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        data = b"GET /healthz HTTP/1.1\r\nhost: q\r\nx-request-id: %s\r\nconnection: close\r\n\r\n" % sent
        status, headers, _ = await one(server.port, data)
        assert status == 200 and OURS.fullmatch(headers["x-request-id"]), headers


async def test_requests_on_one_connection_each_get_their_own_id(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        pipelined = (get("/healthz", close=False) + get("/healthz", "x-request-id: mine", close=False)
                     + send("PUT", "/api/v1/kv/app/k", b'{"value": 2, "forever": true}', close=False)
                     + get("/api/v1/kv/app/k"))
        got = await answers(server.port, pipelined)
    ids = [headers["x-request-id"] for _, headers, _ in got]
    assert len(ids) == 4 and ids[1] == "mine" and len(set(ids)) == 4, ids
    assert [status for status, _, _ in got] == [200, 200, 200, 200]


async def test_a_handler_s_traceback_line_carries_the_request_id(tmp_path, autojump_clock, caplog):
    async with open_server(tmp_path / "d") as server:
        real = server.http.app.handle

        async def failing(request):
            if request.target == b"/boom":
                raise RuntimeError("a bug")
            return await real(request)

        server.http.app.handle = failing
        status, headers, _ = await one(server.port, get("/boom", "x-request-id: trace-me-1"))
        status_ours, headers_ours, _ = await one(server.port, get("/boom"))
    assert status == status_ours == 500
    lines = [record.getMessage() for record in caplog.records if "event=handler_failed" in record.getMessage()]
    assert len(lines) == 2 and "request_id=trace-me-1" in lines[0], lines
    assert f"request_id={headers_ours['x-request-id']}" in lines[1], lines


async def test_an_audit_line_carries_the_request_id(tmp_path, autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="queen.audit")
    async with open_server(tmp_path / "d") as server:
        status, headers, _ = await one(server.port, send("POST", "/api/v1/pause", b'{"kv": true}', "x-request-id: ops-42"))
        assert status == 200
        status, headers, _ = await one(server.port, send("POST", "/api/v1/resume", b'{"kv": true}'))
        assert status == 200
    audits = [record.getMessage() for record in caplog.records if "event=audit" in record.getMessage()]
    assert len(audits) == 2, audits
    assert "action=pause" in audits[0] and "request_id=ops-42" in audits[0], audits
    assert "action=resume" in audits[1] and f"request_id={headers['x-request-id']}" in audits[1], audits


# -- JSON answers end with a newline ------------------------------------------------------------------


async def test_every_json_answer_ends_with_one_newline_inside_its_length(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        port = server.port
        got = [
            await one(port, send("PUT", "/api/v1/kv/app/k", b'{"value": {"a": [1, 2]}, "forever": true}')),
            await one(port, get("/api/v1/kv/app/k")),
            await one(port, send("POST", "/api/v1/kv", b'{"operations": [{"op": "get", "ns": "app", "key": "k"}]}')),
            await one(port, send("POST", "/api/v1/kv", b'{"nonsense": 1}')),
            await one(port, get("/nothing")),
            await one(port, get("/healthz")),
            await one(port, get("/api/v1/openapi.json")),
            await one(port, b"GET / HTTP/1.1\r\nhost: q\r\nx-big: " + b"a" * 20_000 + b"\r\n\r\n"),  # 431
        ]
    for status, headers, body in got:
        assert headers["content-type"] == "application/json", (status, headers)
        assert body.endswith(b"\n") and not body.endswith(b"\n\n"), (status, body[-40:])
        assert len(body) == int(headers["content-length"])
        orjson.loads(body)  # still one JSON document


async def test_a_cbor_answer_is_left_as_it_is(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        port = server.port
        await one(port, send("PUT", "/api/v1/kv/app/k", b'{"value": "v", "forever": true}'))
        status, headers, body = await one(port, get("/api/v1/kv/app/k", "accept: application/cbor"))
        refused, refused_headers, refused_body = await one(port, send("POST", "/api/v1/kv", b'{"nonsense": 1}',
                                                                      "accept: application/cbor"))
    assert status == 200 and headers["content-type"] == "application/cbor"
    assert cbor2.loads(body)["value"] == "v" and cbor2.dumps(cbor2.loads(body)) == body
    assert refused == 400 and refused_headers["content-type"] == "application/cbor"
    assert cbor2.loads(refused_body)["code"] == "unknown_field" and cbor2.dumps(cbor2.loads(refused_body)) == refused_body
