"""Connections as a resource: the limit, who gives way at it (an idle connection, else the call
parked longest, else nobody: 503), and clients that hold a connection without using it (idle, or
never reading their answer). Timeouts run in MockClock's virtual time."""

import json

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


async def start_a_request(port: int):
    """A connection busy reading a request whose head has only begun to arrive: neither idle nor
    parked, so it cannot give its place to a new connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\n")
    return stream


async def test_at_the_limit_with_none_idle_or_parked_a_new_connection_gets_503(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", connections_max=2, request_read_timeout_s=30) as server:
        busy = [await start_a_request(server.port) for _ in range(2)]
        await trio.testing.wait_all_tasks_blocked()
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(HEALTH)
        raw = await read_until_closed(stream)
        assert raw.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in raw
        assert server.http.connections_refused == 1 and server.http.parks_ended == 0
        await stream.aclose()
        for stream in busy:
            await stream.aclose()


def acquire(owner: str, wait_ms: int = 10_000) -> bytes:
    body = json.dumps({"operations": [{"op": "acquire", "name": "busy", "ttlSeconds": 60, "owner": owner,
                                       "waitMs": wait_ms}]}).encode()
    return (b"POST /api/v1/locks HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


def pop(queue: str, wait_ms: int) -> bytes:
    return b"GET /api/v1/pop/queue/%s?waitMs=%d HTTP/1.1\r\nhost: q\r\n\r\n" % (queue.encode(), wait_ms)


async def park(port: int, request: bytes):
    """A connection whose request is parked on the server (the server has taken it up)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    await trio.testing.wait_all_tasks_blocked()
    return stream


def parse_answer(raw: bytes) -> tuple[int, bytes, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head.lower(), json.loads(body)


async def test_at_the_limit_the_call_parked_longest_is_answered_as_its_timeout_to_make_room(tmp_path, autojump_clock):
    """With every connection parked (a waiting acquire, then a long-polling pop), a new client is
    served at once: the call parked longest is answered as if its wait had run out (acquired
    false, reason timeout; an empty pop) and its connection closed. Nothing is handed to a call
    that gave way: the lock, once released, goes to nobody, and a message pushed goes to the pop
    still waiting."""
    async with open_server(tmp_path / "d", connections_max=2) as server:
        client = HttpClient(server.port)
        [held] = await client.locks({"op": "acquire", "name": "busy", "ttlSeconds": 60, "owner": "holder"})
        await client.aclose()
        started = trio.current_time()
        acquiring = await park(server.port, acquire("waiter"))
        first_pop = await park(server.port, pop("jobs", 10_000))
        assert server.http.connections == 2

        fresh = HttpClient(server.port)
        assert (await fresh.request("GET", "/healthz"))[0] == 200
        status, head, body = parse_answer(await read_until_closed(acquiring))
        assert status == 200 and b"connection: close" in head
        assert body["results"][0]["acquired"] is False and body["results"][0]["reason"] == "timeout", body
        await fresh.aclose()

        second_pop = await park(server.port, pop("jobs", 10_000))
        fresh = HttpClient(server.port)
        assert (await fresh.request("GET", "/healthz"))[0] == 200
        status, head, body = parse_answer(await read_until_closed(first_pop))
        assert status == 200 and b"connection: close" in head
        assert (body["success"], body["reason"], body["messages"]) == (False, "timeout", []), body
        assert trio.current_time() - started < 1, "answered only when the waits ran out"
        assert server.http.parks_ended == 2 and server.http.connections_refused == 0

        status, pushed = await fresh.request("POST", "/api/v1/push", {"items": [{"queue": "jobs", "payload": 1}]})
        assert status == 200, pushed
        status, head, body = parse_answer(await read_until_closed_or_answered(second_pop))
        assert status == 200 and body["success"] is True and len(body["messages"]) == 1, body
        [released] = await fresh.locks({"op": "release", "name": "busy", "slot": 0, "token": held["token"],
                                        "owner": "holder"})
        assert released["released"] is True
        [got] = await fresh.locks({"op": "get", "name": "busy"})
        assert got["holders"] == [], got  # the acquire that gave way was withdrawn, not left waiting
        for stream in (acquiring, first_pop, second_pop):
            await stream.aclose()


async def read_until_closed_or_answered(stream) -> bytes:
    """One whole answer on a keep-alive connection (or all there is until the server closes)."""
    received = b""
    while True:
        head, sep, body = received.partition(b"\r\n\r\n")
        if sep:
            length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")))
            if len(body) >= length:
                return received
        chunk = await stream.receive_some(65536)
        if not chunk:
            return received
        received += chunk


async def test_a_thousand_long_polls_past_the_limit_do_not_lock_out_a_producer_or_health_checks(tmp_path, autojump_clock):
    """1,100 consumers each long-poll a pop for a minute, the README's way to consume, against a
    limit of 100 connections. Each one past the limit takes the place of the poll parked longest,
    which is answered empty ("timeout") and closed; a producer connecting then is answered at once,
    its push and a health check both 200, with no poll's minute run out."""
    clients, limit = 1100, 100
    async with open_server(tmp_path / "d", connections_max=limit) as server:
        started = trio.current_time()
        polls = [await park(server.port, pop("work", 60_000)) for _ in range(clients)]

        producer = HttpClient(server.port)
        status, pushed = await producer.request("POST", "/api/v1/push", {"items": [{"queue": "other", "payload": "p"}]})
        assert status == 200 and pushed[0]["status"] == "queued", pushed
        assert (await producer.request("GET", "/healthz")) == (200, {"status": "ok"})
        assert trio.current_time() - started < 5, "the producer waited for the polls' minute to run out"
        assert server.http.connections == limit and server.http.connections_refused == 0

        # The polls that gave way (the longest parked first) each got an empty answer and a close.
        gave_way = clients - limit + 1
        for stream in polls[:gave_way]:
            status, head, body = parse_answer(await read_until_closed(stream))
            assert status == 200 and b"connection: close" in head
            assert (body["success"], body["reason"], body["messages"]) == (False, "timeout", []), body
        assert server.http.parks_ended == gave_way and len(server.http._parked) == limit - 1
        for stream in polls:
            await stream.aclose()


async def test_a_connection_evicted_after_its_request_arrived_does_not_run_it(tmp_path, autojump_clock):
    """A new connection can evict an idle one after that one's request has arrived but before its
    task has run on (the accept loop ran first). The evicted connection is no longer counted and
    its socket is closed, so its request must not run: here a waiting acquire, which would be
    granted to a client that is gone and hold the lock for its whole lease."""
    async with open_server(tmp_path / "d") as server:
        real_receive = server.http.receive
        holder_client = HttpClient(server.port)
        holder = (await holder_client.locks({"op": "acquire", "name": "busy", "ttlSeconds": 60, "owner": "holder"}))[0]
        await holder_client.aclose()  # so the ghost is the only idle connection to evict
        await trio.testing.wait_all_tasks_blocked()

        async def receive_then_evicted(sock):
            data = await real_receive(sock)
            if b"ghost" in data:  # the accept loop's eviction lands in this window
                assert server.http._close_longest_idle()
            return data

        server.http.receive = receive_then_evicted
        ghost = await trio.open_tcp_stream("127.0.0.1", server.port)
        await trio.testing.wait_all_tasks_blocked()
        body = b'{"operations":[{"op":"acquire","name":"busy","ttlSeconds":60,"owner":"ghost","waitMs":10000}]}'
        await ghost.send_all(b"POST /api/v1/locks HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
        assert await read_until_closed(ghost) == b""  # closed unanswered: as if evicted a moment earlier
        await ghost.aclose()
        server.http.receive = real_receive
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
    async with open_server(tmp_path / "d", connections_max=1, request_read_timeout_s=30) as server:
        busy = await start_a_request(server.port)
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
        await busy.aclose()
