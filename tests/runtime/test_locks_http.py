"""Locks through the whole server in-process (HTTP, router, shard actors, WAL), with time driven by
trio's MockClock: leases, the 50 ms tick and waits run in virtual time."""

import trio
import trio.testing

from queen.core.limits import Limits
from queen.core.locks import parse_lock_ops
from queen.testing import HttpClient, open_server

TICK_S = 0.05


def acquire(name, owner, ttl=30, **extra):
    return {"op": "acquire", "name": name, "ttlSeconds": ttl, "owner": owner, **extra}


async def test_the_documented_curl_example_answers_the_documented_shape(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        client = HttpClient(server.port)
        [got] = await client.locks(acquire("daily-report", "cron-7"))
        assert got["index"] == 0 and got["op"] == "acquire" and got["name"] == "daily-report"
        assert got["acquired"] is True and got["slot"] == 0 and got["owner"] == "cron-7"
        assert got["guard"] == {"op": "check", "ns": "queen-locks", "key": "daily-report#0",
                                "expect": got["token"], "required": True}
        [other] = await client.locks(acquire("daily-report", "cron-8"))
        assert other["acquired"] is False and other["reason"] == "held"
        assert other["holders"][0]["owner"] == "cron-7" and other["holders"][0]["token"] == got["token"]


async def test_paused_holder_is_fenced_out_by_the_guard(tmp_path, autojump_clock):
    lease_s = 1
    async with open_server(tmp_path / "data") as server:
        a, b = HttpClient(server.port), HttpClient(server.port)
        [held_by_a] = await a.locks(acquire("report", "A", ttl=lease_s))
        await trio.sleep(lease_s + TICK_S)  # A is paused past its lease (virtual time)
        [held_by_b] = await b.locks(acquire("report", "B", ttl=30))
        assert held_by_b["acquired"] is True and held_by_b["token"] > held_by_a["token"]

        def step(guard, who):
            return {"kv": [guard, {"op": "put", "ns": "reports", "key": "daily", "value": who, "ttlSeconds": 60}]}

        status, answer = await a.request("POST", "/api/v1/transaction", step(held_by_a["guard"], "A"))
        assert status == 200 and answer["success"] is False and answer["reason"] == "kv_precondition"
        assert answer["failed"]["section"] == "kv" and answer["failed"]["index"] == 0
        assert answer["failed"]["current"]["version"] == held_by_b["token"]
        _, row = await a.request("GET", "/api/v1/kv/reports/daily")
        assert row["found"] is False  # nothing of A's step exists
        status, answer = await b.request("POST", "/api/v1/transaction", step(held_by_b["guard"], "B"))
        assert answer["success"] is True
        _, row = await b.request("GET", "/api/v1/kv/reports/daily")
        assert row["value"] == "B"


async def test_waiter_is_handed_a_released_lock_at_once(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        holder, waiter = HttpClient(server.port), HttpClient(server.port)
        [held] = await holder.locks(acquire("job", "h"))
        answers = []

        async def wait_for_it():
            answers.append((await waiter.locks(acquire("job", "w", waitMs=10_000)))[0])
            answers.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_it)
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(2)
            released_at = trio.current_time()
            [released] = await holder.locks({"op": "release", "name": "job", "slot": 0, "token": held["token"]})
            assert released["released"] is True
        got, answered_at = answers
        assert got["acquired"] is True and got["owner"] == "w" and got["token"] > held["token"]
        assert answered_at - released_at <= TICK_S


async def test_waiter_is_handed_an_expired_lock_within_one_tick(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        holder, waiter = HttpClient(server.port), HttpClient(server.port)
        [held] = await holder.locks(acquire("job", "h", ttl=2))
        lease_ends_s = trio.current_time() + 2
        [got] = await waiter.locks(acquire("job", "w", waitMs=10_000))
        assert got["acquired"] is True and got["fence"] > held["fence"]
        assert lease_ends_s <= trio.current_time() <= lease_ends_s + TICK_S + 0.001


async def test_waiters_are_served_first_come_first_served(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        holder = HttpClient(server.port)
        [held] = await holder.locks(acquire("job", "h"))
        order = []

        async def wait(owner):
            [got] = await HttpClient(server.port).locks(acquire("job", owner, ttl=1, waitMs=30_000))
            order.append(got["owner"])

        async with trio.open_nursery() as nursery:
            for owner in ("w1", "w2", "w3"):
                nursery.start_soon(wait, owner)
                await trio.testing.wait_all_tasks_blocked()  # each parks before the next is sent
            await holder.locks({"op": "release", "name": "job", "slot": 0, "token": held["token"]})
        # w1 got it at the release; w2 and w3 each when the one before them let its 1 s lease expire.
        assert order == ["w1", "w2", "w3"]


async def test_a_wait_that_runs_out_answers_timeout(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        client = HttpClient(server.port)
        await client.locks(acquire("job", "h"))
        started = trio.current_time()
        [got] = await client.locks(acquire("job", "w", waitMs=500))
        assert got["acquired"] is False and got["reason"] == "timeout" and got["holders"][0]["owner"] == "h"
        assert 0.5 <= trio.current_time() - started <= 0.5 + TICK_S + 0.001


async def test_a_waiter_whose_client_hung_up_is_not_handed_the_permit(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        holder = HttpClient(server.port)
        [held] = await holder.locks(acquire("job", "h"))
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        body = b'{"operations":[{"op":"acquire","name":"job","ttlSeconds":60,"owner":"gone","waitMs":30000}]}'
        await stream.send_all(b"POST /api/v1/locks HTTP/1.1\r\nhost: q\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await trio.testing.wait_all_tasks_blocked()
        await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        await holder.locks({"op": "release", "name": "job", "slot": 0, "token": held["token"]})
        [state] = await holder.locks({"op": "get", "name": "job"})
        assert state["holders"] == []


async def test_admin_listing_pages_every_held_permit(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        client = HttpClient(server.port)
        for i in range(0, 30, 10):
            await client.locks(*[acquire(f"lock-{j:02d}", f"o{j}") for j in range(i, i + 10)])
        await client.locks(acquire("sem", "s1", limit=3), )
        names, cursor = [], None
        while True:
            path = "/api/v1/locks?prefix=lock-&limit=7" + (f"&cursor={cursor}" if cursor else "")
            status, page = await client.request("GET", path)
            assert status == 200 and len(page["items"]) <= 7
            names += [item["name"] for item in page["items"]]
            cursor = page["cursor"]
            if cursor is None:
                break
        assert names == [f"lock-{j:02d}" for j in range(30)]
        _, page = await client.request("GET", "/api/v1/locks?prefix=sem")
        [item] = page["items"]
        assert set(item) == {"name", "slot", "owner", "token", "fence", "since", "renewedAt", "expiresAt"}


async def test_locks_survive_a_clean_restart_with_owner_token_and_expiry(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        [held] = await HttpClient(server.port).locks(acquire("job", "keeper", ttl=600))
    async with open_server(tmp_path / "data") as server:
        client = HttpClient(server.port)
        [state] = await client.locks({"op": "get", "name": "job"})
        assert state["holders"][0]["owner"] == "keeper" and state["holders"][0]["token"] == held["token"]
        assert state["holders"][0]["expiresAt"] == held["expiresAt"]


async def test_bad_lock_calls_answer_400_with_a_code_and_change_nothing(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        client = HttpClient(server.port)
        status, body = await client.request("POST", "/api/v1/locks", {"operations": [
            acquire("fine", "o"), {"op": "acquire", "name": "bad#name", "ttlSeconds": 5}]})
        assert status == 400 and body["code"] == "invalid_name" and body["details"]["index"] == 1
        [state] = await client.locks({"op": "get", "name": "fine"})
        assert state["holders"] == []
        status, body = await client.request("POST", "/api/v1/kv", {"operations": [
            {"op": "put", "ns": "queen-locks", "key": "fine#0", "value": "me", "ttlSeconds": 5}]})
        assert status == 400 and body["code"] == "reserved_namespace"


async def test_a_tick_is_not_queued_behind_a_full_shard_queue(tmp_path, autojump_clock):
    # Ticks are steps of their own, never messages in a shard's queue: with thousands of calls
    # queued on the lock's shard when the lease ends, the waiter still gets it within one tick.
    async with open_server(tmp_path / "data", shard_count=1) as server:
        holder, waiter = HttpClient(server.port), HttpClient(server.port)
        [held] = await holder.locks(acquire("job", "h", ttl=1))
        lease_ends_s = trio.current_time() + 1
        answered = []
        flood_ops = parse_lock_ops([{"op": "get", "name": "job"}], Limits())

        async def flood():
            await trio.sleep_until(lease_ends_s - 0.001)
            await server.router.run_locks(flood_ops)

        async with trio.open_nursery() as nursery:
            for _ in range(6000):  # more than a shard queue holds (4096)
                nursery.start_soon(flood)
            [got] = await waiter.locks(acquire("job", "w", waitMs=10_000))
            answered.append(trio.current_time())
        assert got["acquired"] is True and got["fence"] > held["fence"]
        assert lease_ends_s <= answered[0] <= lease_ends_s + TICK_S + 0.001


async def test_lock_metrics_count_permits_waiters_results_and_expiries(tmp_path, autojump_clock):
    from queen.testing import parse_metrics

    async with open_server(tmp_path / "data") as server:
        holder, waiter, other = HttpClient(server.port), HttpClient(server.port), HttpClient(server.port)

        async def metrics():
            status, text = await other.request("GET", "/metrics")
            return parse_metrics(text.decode())

        await holder.locks(acquire("job", "h", ttl=2), acquire("sem", "h", ttl=30, limit=2))
        [refused] = await other.locks(acquire("job", "o"))
        assert refused["acquired"] is False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter.locks, acquire("job", "w", waitMs=10_000))
            await trio.testing.wait_all_tasks_blocked()
            seen = await metrics()
            assert seen["queen_lock_permits"] == 2 and seen["queen_lock_waiters"] == 1
            await trio.sleep(3)  # virtual: the 2 s permit expires and goes to the waiter
        [late] = await other.locks(acquire("sem2", "o", waitMs=500))
        assert late["acquired"] is True
        [timed_out] = await other.locks(acquire("job", "o2", waitMs=500))
        assert timed_out["reason"] == "timeout"
        seen = await metrics()
        assert seen['queen_lock_acquires_total{result="granted"}'] == 4  # job, sem, the waiter, sem2
        assert seen['queen_lock_acquires_total{result="held"}'] == 1
        assert seen['queen_lock_acquires_total{result="timeout"}'] == 1
        assert seen["queen_lock_expiries_total"] == 1 and seen["queen_lock_waiters"] == 0
        assert seen["queen_lock_permits"] == 3
