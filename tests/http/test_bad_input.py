"""Requests that once ended the server, each answered with a 4xx now while the server goes on.

Each test sends its request over a real socket to an in-process server: had an exception escaped a
connection, the server's nursery (and so the test) would have failed with it."""

import logging

import cbor2
import pytest
import trio

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


@pytest.mark.parametrize("document", [
    {"operations": [{"op": "put", "ns": "app", "key": "k", "value": 1, "forever": True, "expct": 3}]},
    {"operations": [], "extra": 1},
])
async def test_unknown_fields_answer_400_unknown_field_and_change_nothing(document, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        status, body = await client.request("POST", "/api/v1/kv", document)
        assert status == 400 and body["error"]["code"] == "unknown_field"
        status, body = await client.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True, "expct": 3})
        assert status == 400 and body["error"]["details"]["field"] == "expct"
        status, body = await client.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True, "key": "other"})
        assert status == 400 and body["error"]["details"]["field"] == "key"
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
        assert status == 500 and body["error"]["code"] == "internal"
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
        assert status == 400 and body["error"]["code"] == "invalid_value"
