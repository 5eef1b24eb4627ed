"""Connections as a resource: the limit, who gives way at it, and clients that hold a connection
without using it (idle, or never reading their answer). Timeouts run in MockClock's virtual time."""

import trio
import trio.testing

from queen.testing import HttpClient, open_server

HEALTH = b"GET /healthz HTTP/1.1\r\nhost: q\r\n\r\n"


async def read_until_closed(stream) -> bytes:
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    return received


async def test_at_the_limit_the_longest_idle_connection_makes_room_for_a_new_one(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", connections_max=2) as server:
        oldest = HttpClient(server.port)
        newer = HttpClient(server.port)
        assert (await oldest.request("GET", "/healthz"))[0] == 200
        await trio.sleep(1)
        assert (await newer.request("GET", "/healthz"))[0] == 200
        # Both are idle keep-alive connections now; a third client is served all the same.
        assert (await HttpClient(server.port).request("GET", "/healthz"))[0] == 200
        assert await oldest._stream.receive_some(10) == b""  # the longest idle was closed for it
        assert (await newer.request("GET", "/healthz"))[0] == 200  # the other one still works
        assert server.http.idle_closed == 1


async def test_at_the_limit_with_none_idle_a_new_connection_gets_503(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", connections_max=2) as server:
        client = HttpClient(server.port)
        await client.locks({"op": "acquire", "name": "busy", "ttlSeconds": 60, "owner": "h"})
        busy = []
        async with trio.open_nursery() as nursery:
            for i in range(2):  # both connections wait for the lock: neither is idle
                waiter = HttpClient(server.port)
                busy.append(waiter)
                nursery.start_soon(waiter.request, "POST", "/api/v1/locks", {"operations": [
                    {"op": "acquire", "name": "busy", "ttlSeconds": 5, "owner": f"w{i}", "waitMs": 10_000}]})
            await trio.testing.wait_all_tasks_blocked()
            await client.aclose()
            await trio.testing.wait_all_tasks_blocked()
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            await stream.send_all(HEALTH)
            raw = await read_until_closed(stream)
            assert raw.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in raw
            nursery.cancel_scope.cancel()
        assert server.http.connections_refused == 1


async def test_a_connection_evicted_after_its_request_arrived_does_not_run_it(tmp_path, autojump_clock, monkeypatch):
    """A new connection can evict an idle one after that one's request has arrived but before its
    task has run on (the accept loop ran first). The evicted connection is no longer counted and
    its socket is closed, so its request must not run: here a waiting acquire, which would be
    granted to a client that is gone and hold the lock for its whole lease."""
    import queen.http.connection as connection_module

    real_receive = connection_module._receive
    async with open_server(tmp_path / "d") as server:
        holder = (await HttpClient(server.port).locks(
            {"op": "acquire", "name": "busy", "ttlSeconds": 60, "owner": "holder"}))[0]
        await trio.testing.wait_all_tasks_blocked()

        async def receive_then_evicted(sock):
            data = await real_receive(sock)
            if b"ghost" in data:  # the accept loop's eviction lands in this window
                assert server.http._close_longest_idle()
            return data

        monkeypatch.setattr(connection_module, "_receive", receive_then_evicted)
        ghost = await trio.open_tcp_stream("127.0.0.1", server.port)
        await trio.testing.wait_all_tasks_blocked()
        body = b'{"operations":[{"op":"acquire","name":"busy","ttlSeconds":60,"owner":"ghost","waitMs":10000}]}'
        await ghost.send_all(b"POST /api/v1/locks HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
        assert await read_until_closed(ghost) == b""  # closed unanswered: as if evicted a moment earlier
        monkeypatch.setattr(connection_module, "_receive", real_receive)
        client = HttpClient(server.port)
        [released] = await client.locks({"op": "release", "name": "busy", "slot": 0, "token": holder["token"],
                                         "owner": "holder"})
        assert released["released"] is True
        [got] = await client.locks({"op": "get", "name": "busy"})
        assert got["holders"] == [], got  # nobody was waiting for it
        assert server.http.idle_closed == 1 and server.http.connections == 1


async def test_a_client_that_never_reads_its_answers_is_cut_off_after_the_send_timeout(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", send_timeout_s=5) as server:
        client = HttpClient(server.port)
        await client.request("PUT", "/api/v1/kv/app/big", {"value": "x" * (200 << 10), "forever": True})
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        request = b"GET /api/v1/kv/app/big HTTP/1.1\r\nhost: q\r\n\r\n"
        started = trio.current_time()
        with trio.move_on_after(1):
            while True:  # pipeline requests and never read: the answers fill both socket buffers
                await stream.send_all(request * 50)
        while server.http.connections > 1:  # the client's connection, stuck writing
            await trio.sleep(0.1)
        assert 5 <= trio.current_time() - started <= 6.5
        assert server.http.timeouts == 1
        assert (await client.request("GET", "/healthz"))[0] == 200  # others were served meanwhile
        await stream.aclose()


async def test_a_refused_flood_spends_no_more_than_a_few_descriptors_answering(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", connections_max=1) as server:
        client = HttpClient(server.port)
        await client.locks({"op": "acquire", "name": "busy", "ttlSeconds": 60, "owner": "h"})
        async with trio.open_nursery() as nursery:
            holder = HttpClient(server.port)
            nursery.start_soon(holder.request, "POST", "/api/v1/locks", {"operations": [
                {"op": "acquire", "name": "busy", "ttlSeconds": 5, "owner": "w", "waitMs": 10_000}]})
            await trio.testing.wait_all_tasks_blocked()
            await client.aclose()
            await trio.testing.wait_all_tasks_blocked()
            flood = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(60)]
            await trio.testing.wait_all_tasks_blocked()
            # Some were answered 503; the rest wait in the listen backlog instead of each taking a
            # descriptor: the server holds the one connection it serves plus at most 16 refusals.
            assert server.http.connections_refused >= 1
            assert server.http._sockets <= 1 + 16
            first = await flood[0].receive_some(65536)
            assert first.startswith(b"HTTP/1.1 503 ")
            for stream in flood:
                await stream.aclose()
            nursery.cancel_scope.cancel()
