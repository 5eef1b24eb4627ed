"""The HTTP layer in-process: routes, codecs, limits, and what malformed or slow clients get.
Timeouts run in MockClock's virtual time."""

import cbor2
import trio
import trio.testing

from queen.testing import HttpClient, open_server


async def raw_exchange(port, data: bytes, read_until_close=True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    received = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        received += chunk
        if not read_until_close:
            break
    await stream.aclose()
    return received


async def test_one_key_routes_put_get_incr_delete(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        status, put = await client.request("PUT", "/api/v1/kv/app/a%2Fb", {"value": {"n": 1}, "ttlSeconds": 60})
        assert status == 200 and put["applied"] is True
        status, got = await client.request("GET", "/api/v1/kv/app/a%2Fb")
        assert got["value"] == {"n": 1} and got["version"] == put["version"]
        _, stale = await client.request("PUT", "/api/v1/kv/app/a%2Fb", {"value": 2, "ttlSeconds": 60, "expect": 999})
        assert stale["applied"] is False and stale["reason"] == "version" and stale["current"]["value"] == {"n": 1}
        _, counted = await client.request("POST", "/api/v1/kv/app/hits/incr", {"by": 5, "max": 5, "forever": True})
        assert counted["value"] == 5
        _, over = await client.request("POST", "/api/v1/kv/app/hits/incr", {"max": 5, "forever": True})
        assert over["applied"] is False and over["reason"] == "limit"
        _, deleted = await client.request("DELETE", f"/api/v1/kv/app/a%2Fb?expect={put['version']}")
        assert deleted["applied"] is True
        _, gone = await client.request("GET", "/api/v1/kv/app/a%2Fb")
        assert gone["found"] is False


async def test_ttl_is_exact_for_readers(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        await client.request("PUT", "/api/v1/kv/app/k", {"value": 1, "ttlSeconds": 2})
        await trio.sleep(1.99)
        assert (await client.request("GET", "/api/v1/kv/app/k"))[1]["found"] is True
        await trio.sleep(0.011)
        assert (await client.request("GET", "/api/v1/kv/app/k"))[1]["found"] is False


async def test_put_if_absent_race_of_two_callers_has_one_winner(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        answers = []

        async def claim(who):
            _, body = await HttpClient(server.port).request("POST", "/api/v1/kv", {"operations": [
                {"op": "putIfAbsent", "ns": "app", "key": "leader", "value": who, "ttlSeconds": 30}]})
            answers.append(body["results"][0])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(claim, "a")
            nursery.start_soon(claim, "b")
        assert sorted(a["applied"] for a in answers) == [False, True]
        loser = next(a for a in answers if not a["applied"])
        assert loser["reason"] == "exists"


async def test_get_prefix_pages_2500_keys_with_a_cursor(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        keys = [f"user:{i:05d}" for i in range(2500)]
        for start in range(0, 2500, 500):
            status, _ = await client.request("POST", "/api/v1/kv", {"operations": [
                {"op": "put", "ns": "app", "key": k, "value": k, "forever": True} for k in keys[start:start + 500]]})
            assert status == 200
        await client.request("PUT", "/api/v1/kv/app/other", {"value": 0, "forever": True})
        seen, cursor, pages = [], None, 0
        while True:
            query = "prefix=user:&limit=1000" + (f"&cursor={cursor}" if cursor else "")
            status, page = await client.request("GET", f"/api/v1/kv/app?{query}")
            assert status == 200
            seen += [item["key"] for item in page["items"]]
            pages += 1
            cursor = page["cursor"]
            if cursor is None:
                break
        assert seen == keys and pages == 3


async def test_cbor_in_and_out(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        body = cbor2.dumps({"operations": [{"op": "put", "ns": "app", "key": "c", "value": [1, "two"], "forever": True},
                                           {"op": "get", "ns": "app", "key": "c"}]})
        status, raw = await HttpClient(server.port).request(
            "POST", "/api/v1/kv", body, {"content-type": "application/cbor", "accept": "application/cbor"})
        assert status == 200
        results = cbor2.loads(raw)["results"]
        assert results[1]["value"] == [1, "two"]


async def test_write_without_lifetime_is_400_ttl_required_and_changes_nothing(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        status, body = await client.request("POST", "/api/v1/kv", {"operations": [
            {"op": "put", "ns": "app", "key": "first", "value": 1, "forever": True},
            {"op": "put", "ns": "app", "key": "second", "value": 2}]})
        assert status == 400 and body["code"] == "ttl_required" and body["details"]["index"] == 1
        assert (await client.request("GET", "/api/v1/kv/app/first"))[1]["found"] is False


async def test_unknown_route_is_404_and_wrong_method_is_405_with_allow(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        status, body = await client.request("GET", "/api/v2/nothing")
        assert status == 404 and body["code"] == "not_found"
        raw = await raw_exchange(server.port, b"GET /api/v1/kv HTTP/1.1\r\nhost: q\r\nconnection: close\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 405 ") and b"allow: POST" in raw


async def test_invalid_json_is_400(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        status, body = await HttpClient(server.port).request("POST", "/api/v1/kv", b"{not json")
        assert status == 400 and body["code"] == "invalid_json"


async def test_body_over_the_limit_is_413(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        body = b"x" * (2 << 20)
        raw = await raw_exchange(server.port, b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        assert raw.startswith(b"HTTP/1.1 413 ") and b"body_too_large" in raw


async def test_garbage_instead_of_http_is_400_and_the_server_keeps_serving(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        raw = await raw_exchange(server.port, b"\x16\x03\x01 hello this is not http\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 400 ") and b"bad_http" in raw
        status, _ = await HttpClient(server.port).request("GET", "/healthz")
        assert status == 200


async def test_oversized_head_is_rejected(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", header_bytes_max=4096) as server:
        raw = await raw_exchange(server.port, b"GET /healthz HTTP/1.1\r\nhost: q\r\nx-big: " + b"a" * 8000 + b"\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 431 ")


async def test_a_stalled_request_is_cut_off_with_408(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", request_read_timeout_s=5) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: 100\r\n\r\n{")
        started = trio.current_time()
        received = await stream.receive_some(65536)
        assert received.startswith(b"HTTP/1.1 408 ")
        assert 5 <= trio.current_time() - started < 6
        while await stream.receive_some(65536):
            pass  # then the server closes
        await stream.aclose()


async def test_an_idle_keep_alive_connection_is_closed(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", idle_timeout_s=30) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        started = trio.current_time()
        assert await stream.receive_some(10) == b""
        assert 30 <= trio.current_time() - started < 31
        await stream.aclose()


async def test_metrics_and_healthz(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        await client.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True})
        status, text = await client.request("GET", "/metrics")
        assert status == 200 and b"queen_wal_batches_total 1" in text
        assert (await client.request("GET", "/healthz")) == (200, {"status": "ok"})
