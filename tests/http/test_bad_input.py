"""Requests that once ended the server, each answered with a 4xx now while the server goes on.

Each test sends its request over a real socket to an in-process server: had an exception escaped a
connection, the server's nursery (and so the test) would have failed with it."""

import logging
from urllib.parse import quote

import cbor2
import pytest
import trio
import trio.testing

from queen.testing import HttpClient, open_server


async def exchange(port, data: bytes) -> bytes:
    """Send data, read until the server closes or has answered once."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    received = b""
    with trio.move_on_after(30):
        while b"\r\n\r\n" not in received or not _whole(received):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            received += chunk
    await stream.aclose()
    return received


def _whole(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def post(path: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: q\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
            % (path, content_type, len(body)) + body)


async def still_serving(port):
    status, body = await HttpClient(port).request("PUT", "/api/v1/kv/app/alive", {"value": 1, "forever": True})
    assert status == 200 and body["applied"] is True


CBOR_OPS = {
    "byte string": b"put",
    "bignum": 1 << 200,
    "tagged value": cbor2.CBORTag(4242, "put"),
    "negative bignum": -(1 << 100),
}


@pytest.mark.parametrize("what", list(CBOR_OPS))
async def test_a_cbor_op_that_is_not_a_string_answers_400(what, tmp_path, autojump_clock):
    body = cbor2.dumps({"operations": [{"op": CBOR_OPS[what], "ns": "app", "key": "k", "value": 1, "forever": True}]})
    async with open_server(tmp_path / "d") as server:
        for path in (b"/api/v1/kv", b"/api/v1/locks", b"/api/v1/transaction"):
            raw = await exchange(server.port, post(path, body, b"application/cbor"))
            assert raw.startswith(b"HTTP/1.1 400 "), raw[:200]
        await still_serving(server.port)


async def test_a_cbor_error_detail_echoing_bytes_is_encodable_in_both_formats(tmp_path, autojump_clock):
    body = cbor2.dumps({"operations": [{"op": b"\xff\x00", "ns": "app", "key": "k"}]})
    async with open_server(tmp_path / "d") as server:
        for accept in (b"application/json", b"application/cbor"):
            request = post(b"/api/v1/kv", body, b"application/cbor").replace(b"host: q", b"host: q\r\naccept: " + accept)
            raw = await exchange(server.port, request)
            assert raw.startswith(b"HTTP/1.1 400 ") and b"unknown_op" in raw
        await still_serving(server.port)


@pytest.mark.parametrize("op", ['{"a": 1}', '["put"]', "7", "null"])
async def test_a_json_op_that_is_not_a_string_answers_400_unknown_op(op, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        for path in (b"/api/v1/kv", b"/api/v1/locks"):
            raw = await exchange(server.port, post(path, b'{"operations":[{"op":%s,"ns":"a","key":"k"}]}' % op.encode()))
            assert raw.startswith(b"HTTP/1.1 400 ") and b"unknown_op" in raw, raw[:300]
        await still_serving(server.port)


async def test_a_content_length_of_thousands_of_digits_answers_400(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        raw = await exchange(server.port, b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: "
                             + b"9" * 5000 + b"\r\n\r\n{}")
        assert raw.startswith(b"HTTP/1.1 400 ")
        await still_serving(server.port)


@pytest.mark.parametrize("split", [False, True])
async def test_both_content_length_and_transfer_encoding_answer_400_and_close(split, tmp_path, autojump_clock):
    head = b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
    body = b"5\r\nhello\r\n0\r\n\r\n"
    async with open_server(tmp_path / "d") as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        if split:  # the head alone first: the h11 path
            await stream.send_all(head)
            await trio.sleep(0.01)
            await stream.send_all(body)
        else:  # whole in one read: the plain-request path
            await stream.send_all(head + body)
        received = b""
        while chunk := await stream.receive_some(65536):
            received += chunk
        assert received.startswith(b"HTTP/1.1 400 ") and b"connection: close" in received
        await stream.aclose()
        await still_serving(server.port)


async def read_all(stream) -> bytes:
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    return received


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("head", [
    b"POST /api/v1/kv HTTP/1.1\nhost: q\ncontent-type: application/json\ncontent-length: %d\n\n",
    b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\ncontent-length: %d\n\r\n",
    b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\nx-note: a\r\n b\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n",
], ids=["bare-lf", "bare-lf-ending-the-head", "obs-fold"])
async def test_a_bare_lf_or_a_folded_header_answers_400_and_closes_and_runs_nothing(head, split, tmp_path, autojump_clock):
    body = b'{"operations":[{"op":"put","ns":"app","key":"k","value":1,"forever":true}]}'
    request = head % len(body) + body
    async with open_server(tmp_path / "d") as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        if split:  # a piece at a time, each read on its own: the h11 path
            for piece in (request[:20], request[20:40], request[40:]):
                await stream.send_all(piece)
                await trio.testing.wait_all_tasks_blocked()
        else:  # whole in one read: the plain-request path
            await stream.send_all(request)
        received = await read_all(stream)
        assert received.startswith(b"HTTP/1.1 400 ") and b"bad_http" in received and b"connection: close" in received
        await stream.aclose()
        status, got = await HttpClient(server.port).request("GET", "/api/v1/kv/app/k")
        assert status == 200 and got["found"] is False


@pytest.mark.parametrize("chunks", [
    [b"f" * 20],  # h11 reads chunk sizes of up to 20 hex digits: 2**80 - 1 bytes
    [b"%x" % ((1 << 20) + 1)],  # the limit and one byte
    [b"%x" % ((1 << 20) - 10) + b"\r\n" + b"x" * ((1 << 20) - 10), b"%x" % 11],  # a second chunk past the limit
], ids=["ffff", "one-over", "second-chunk"])
async def test_a_chunk_announced_past_the_body_limit_answers_413_at_once(chunks, tmp_path, autojump_clock):
    """Without waiting for the bytes announced (the read timeout would end it with a 408) and
    however few of them arrive, as an oversized Content-Length is answered."""
    async with open_server(tmp_path / "d", body_bytes_max=1 << 20) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        started = trio.current_time()
        await stream.send_all(b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ntransfer-encoding: chunked\r\n\r\n")
        for chunk in chunks:
            await stream.send_all(chunk + b"\r\nabc")
            await trio.testing.wait_all_tasks_blocked()
        received = b""
        while b"\r\n\r\n" not in received:  # the answer comes while the client still holds the connection open
            received += await stream.receive_some(65536)
        assert received.startswith(b"HTTP/1.1 413 ") and b"body_too_large" in received, received[:300]
        assert trio.current_time() - started < 1
        await stream.aclose()
        await still_serving(server.port)


TOO_LONG = "9" * 4400  # past Python's 4,300 digits, int() raises ValueError
NUMBER_PARAMS = [
    ("GET", "/api/v1/pop/queue/q?wait=true&timeout={}", "invalid_wait_ms"),  # the Queen MQ client's spelling
    ("GET", "/api/v1/pop/queue/q?waitMs={}", "invalid_wait_ms"),
    ("GET", "/api/v1/pop/queue/q?batch={}", "invalid_batch"),
    ("GET", "/api/v1/pop/queue/q/partition/p?partitions={}", "invalid_partitions"),
    ("GET", "/api/v1/kv/app?limit={}", "invalid_limit"),
    ("DELETE", "/api/v1/kv/app/k?expect={}", "invalid_expect"),
    ("GET", "/api/v1/locks?limit={}", "invalid_limit"),
    ("GET", "/api/v1/timers?queue=q&limit={}", "invalid_limit"),
    ("GET", "/api/v1/timers/q?limit={}", "invalid_limit"),
    ("GET", "/api/v1/dlq?queue=q&offset={}", "invalid_offset"),
    ("GET", "/api/v1/dlq?queue=q&limit={}", "invalid_limit"),
    ("GET", "/api/v1/resources/queues?limit={}", "invalid_limit"),
    ("GET", "/api/v1/resources/queues/q/partitions?limit={}", "invalid_limit"),
    ("POST", "/api/v1/lease/{}/release", "invalid_lease_id"),
]


@pytest.mark.parametrize(("method", "path", "code"), NUMBER_PARAMS, ids=[path for _, path, _ in NUMBER_PARAMS])
async def test_a_number_of_thousands_of_digits_in_a_query_or_path_answers_400_with_its_code(
        method, path, code, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        for digits in (TOO_LONG, "1" + "0" * 19, "12a", "-1", "+1", "\u0661"):  # "\u0661": Arabic-Indic 1, isdigit()
            status, body = await client.request(method, path.format(quote(digits)))
            assert status == 400 and body["code"] == code, (digits[:30], status, body)
        await still_serving(server.port)


@pytest.mark.parametrize("document", [
    {"operations": [{"op": "put", "ns": "app", "key": "k", "value": 1, "forever": True, "expct": 3}]},
    {"operations": [], "extra": 1},
])
async def test_unknown_fields_answer_400_unknown_field_and_change_nothing(document, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        status, body = await client.request("POST", "/api/v1/kv", document)
        assert status == 400 and body["code"] == "unknown_field"
        status, body = await client.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True, "expct": 3})
        assert status == 400 and body["details"]["field"] == "expct"
        status, body = await client.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True, "key": "other"})
        assert status == 400 and body["details"]["field"] == "key"
        status, body = await client.request("GET", "/api/v1/kv/app/k")
        assert body["found"] is False


async def test_a_failing_handler_answers_500_for_that_request_alone(tmp_path, autojump_clock, caplog):
    async with open_server(tmp_path / "d") as server:
        real = server.http.app.handle

        async def flaky(request):
            if request.target == b"/boom":
                raise RuntimeError("a bug")
            return await real(request)

        server.http.app.handle = flaky
        client = HttpClient(server.port)
        status, body = await client.request("GET", "/boom")
        assert status == 500 and body["code"] == "internal"
        [record] = [r for r in caplog.records if "event=handler_failed" in r.getMessage()]
        assert record.levelno == logging.ERROR and record.exc_info is not None
        status, _ = await client.request("GET", "/healthz")  # the same connection goes on
        assert status == 200
        await still_serving(server.port)


async def test_byte_strings_round_trip_over_cbor_and_show_in_their_documented_json_form(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        value = {"raw": b"\x00\xff\xfe", "text": "t"}
        raw = await exchange(server.port, post(b"/api/v1/kv", cbor2.dumps({"operations": [
            {"op": "put", "ns": "app", "key": "b", "value": value, "forever": True}]}), b"application/cbor"))
        assert raw.startswith(b"HTTP/1.1 200 ")
        request = b"GET /api/v1/kv/app/b HTTP/1.1\r\nhost: q\r\naccept: application/cbor\r\n\r\n"
        got = cbor2.loads((await exchange(server.port, request)).partition(b"\r\n\r\n")[2])
        assert got["value"] == value
        client = HttpClient(server.port)
        _, as_json = await client.request("GET", "/api/v1/kv/app/b")
        assert as_json["value"] == {"raw": {"$bytes": "AP/+"}, "text": "t"}
        # The JSON form written back is the same bytes.
        await client.request("PUT", "/api/v1/kv/app/c", {"value": as_json["value"], "forever": True})
        got = cbor2.loads((await exchange(server.port, request.replace(b"/b ", b"/c "))).partition(b"\r\n\r\n")[2])
        assert got["value"] == value


async def test_a_queue_payload_with_byte_strings_round_trips_over_cbor_and_json(tmp_path, autojump_clock):
    # A queue keeps a payload as its JSON encoding; a CBOR pop gets the bytes back all the same.
    async with open_server(tmp_path / "d") as server:
        payload = {"raw": b"\x00\xff\xfe", "n": [1, 2.5, None]}
        raw = await exchange(server.port, post(b"/api/v1/push", cbor2.dumps({"items": [
            {"queue": "q", "partition": "p", "payload": payload}]}), b"application/cbor"))
        assert raw.startswith(b"HTTP/1.1 200 ") and b"queued" in raw, raw[:300]
        request = b"GET /api/v1/pop/queue/q?autoAck=true HTTP/1.1\r\nhost: q\r\naccept: application/cbor\r\n\r\n"
        got = cbor2.loads((await exchange(server.port, request)).partition(b"\r\n\r\n")[2])
        assert got["success"] is True and got["messages"][0]["data"] == payload
        json_form = {"raw": {"$bytes": "AP/+"}, "n": [1, 2.5, None]}
        client = HttpClient(server.port)
        await client.request("POST", "/api/v1/push", {"items": [{"queue": "q", "partition": "p", "payload": json_form}]})
        _, as_json = await client.request("GET", "/api/v1/pop/queue/q?autoAck=true")
        assert as_json["messages"][0]["data"] == json_form


@pytest.mark.parametrize("value", [
    cbor2.CBORTag(1, 1700000000),  # a datetime
    cbor2.CBORTag(37, b"\x00" * 16),  # a UUID
    float("nan"),
    float("inf"),
    1 << 64,
    {1: "integer key"},
    {"$bytes": "looks like the JSON form"},
])
async def test_cbor_values_json_could_not_give_back_are_refused_and_change_nothing(value, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        raw = await exchange(server.port, post(b"/api/v1/kv", cbor2.dumps({"operations": [
            {"op": "put", "ns": "app", "key": "k", "value": value, "forever": True}]}), b"application/cbor"))
        assert raw.startswith(b"HTTP/1.1 400 ") and b"invalid_value" in raw, raw[:300]
        _, body = await HttpClient(server.port).request("GET", "/api/v1/kv/app/k")
        assert body["found"] is False


async def test_a_json_bytes_form_that_is_not_base64_answers_400(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        status, body = await HttpClient(server.port).request(
            "PUT", "/api/v1/kv/app/k", {"value": {"$bytes": "not base64!"}, "forever": True})
        assert status == 400 and body["code"] == "invalid_value"


async def test_refusals_say_what_a_caller_can_act_on(tmp_path, autojump_clock):
    """A missing required parameter says it is required (not 'must be a string'), a misspelt queue
    option names the one meant, and a malformed request line is quoted as sent, not as Python's
    repr of a bytearray."""
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        status, body = await client.request("GET", "/api/v1/dlq")
        assert status == 400 and body["error"] == "queue is required", body
        status, body = await client.request("POST", "/api/v1/configure", {"queue": "q", "options": {"retryLimt": 3}})
        assert status == 400 and body["code"] == "unknown_option" and "did you mean 'retryLimit'?" in body["error"], body
        await client.aclose()
        answer = await exchange(server.port, b"GARBAGE\r\n\r\n")
        assert b" 400 " in answer.split(b"\r\n", 1)[0] and b"bytearray" not in answer, answer
        assert b"'GARBAGE'" in answer, answer
