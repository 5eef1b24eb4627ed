"""`next` on an ack or a transaction: the consumer's step and its next pop in one request, the pop
decided on the state the step left, in the same shard step (so the same frame and fsync). Through
the whole server in-process, time in MockClock's virtual seconds."""

import trio

from queen.core import records as rec
from queen.core.placement import shard_of_queue
from queen.core.state import Ops
from queen.testing import HttpClient, open_server
from tests.runtime.test_tenancy import auth_file

SHAPE = {"partitionId", "offset", "transactionId", "success", "leaseReleased", "dlq", "retryCount"}


async def push(client, *payloads, queue="orders", partition="p", headers=None):
    status, body = await client.request("POST", "/api/v1/push", {"items": [
        {"queue": queue, "partition": partition, "payload": payload} for payload in payloads]}, headers)
    assert status == 200, body
    return body


async def pop(client, queue="orders", headers=None, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    status, body = await client.request("GET", f"/api/v1/pop/queue/{queue}" + ("?" + query if query else ""),
                                        None, headers)
    assert status == 200, body
    return body


def ack_of(message, **extra):
    return {"partitionId": message["partitionId"], "leaseId": message["leaseId"], "offset": message["offset"], **extra}


async def parked_count(server) -> int:
    return sum(len(shard.queues.parked) for shard in server.state.shards)


async def wait_parked(server, count: int) -> None:
    """Poll (virtual time) until `count` pops are parked in the server."""
    for _ in range(10_000):
        if await parked_count(server) >= count:
            return
        await trio.sleep(0.001)
    raise AssertionError("the pop never parked")


async def test_an_ack_without_next_answers_as_before_and_with_next_adds_the_pop_answer(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, "a", "b", "c")
        first = (await pop(c))["messages"][0]
        status, plain = await c.request("POST", "/api/v1/ack", ack_of(first))
        assert status == 200 and set(plain) == SHAPE and plain["success"] is True
        second = (await pop(c))["messages"][0]
        status, body = await c.request("POST", "/api/v1/ack", ack_of(second, next={"batch": 5}))
        assert status == 200 and set(body) == SHAPE | {"next"}
        assert {k: v for k, v in body.items() if k != "next"} == {**plain, "offset": 1, "transactionId": "queen:1"}
        nxt = body["next"]
        # Exactly a pop answer: the queue and group inferred from the acked message.
        assert set(nxt) == {"success", "queue", "partition", "partitionId", "leaseId", "consumerGroup", "expiresAt",
                            "partitionsClaimed", "messages"}
        assert nxt["queue"] == "orders" and nxt["consumerGroup"] == "__QUEUE_MODE__"
        assert [m["data"] for m in nxt["messages"]] == ["c"]
        # The batch route answers a list without next, and an object with it.
        status, body = await c.request("POST", "/api/v1/ack/batch", {"acknowledgments": [ack_of(nxt["messages"][0])],
                                                                     "next": {"queue": "orders"}})
        assert status == 200 and body["results"][0]["success"] is True
        assert body["next"] == {"success": False, "reason": "empty", "error": "empty", "queue": "orders",
                                "consumerGroup": "__QUEUE_MODE__", "messages": []}
        status, body = await c.request("POST", "/api/v1/ack/batch", {"acknowledgments": [ack_of(nxt["messages"][0])]})
        assert status == 200 and type(body) is list and body[0]["already"] is True
        for bad, code in (({"batch": 0}, "invalid_batch"), ({"autoAck": True}, "unknown_field"), (3, "invalid_next"),
                          ({"waitMs": -1}, "invalid_wait_ms"), ({"queue": "queen-x"}, "reserved_queue")):
            status, body = await c.request("POST", "/api/v1/ack", ack_of(first, next=bad))
            assert (status, body["code"]) == (400, code), bad


async def test_a_failed_ack_is_redelivered_by_next_in_order(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, 0, 1, 2, 3)
        got = await pop(c, batch=2)
        m0, m1 = got["messages"]
        # m0 fails: its partition's lease ends, so m0 and m1 come back first, in order.
        status, body = await c.request("POST", "/api/v1/ack/batch", {
            "acknowledgments": [ack_of(m0, status="failed")], "next": {"batch": 3}})
        assert status == 200 and body["results"][0]["leaseReleased"] is True
        nxt = body["next"]["messages"]
        assert [(m["data"], m["retryCount"]) for m in nxt] == [(0, 1), (1, 0), (2, 0)]
        status, body = await c.request("POST", "/api/v1/ack/batch", {
            "acknowledgments": [ack_of(m) for m in nxt], "next": {"batch": 3}})
        assert [m["data"] for m in body["next"]["messages"]] == [3]


async def test_next_takes_one_lease_per_partition_and_group(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, "a1", "a2", partition="a")
        await push(c, "b1", "b2", partition="b")
        held = await pop(c)  # one consumer holds partition a (or b)
        other = await pop(c)
        assert {held["partition"], other["partition"]} == {"a", "b"}
        status, body = await c.request("POST", "/api/v1/ack", ack_of(other["messages"][0], next={"partitions": 2}))
        # Its own partition again (its lease ended with its last message); never the one held.
        assert [m["partition"] for m in body["next"]["messages"]] == [other["partition"]]
        status, body = await c.request("POST", "/api/v1/ack", ack_of(body["next"]["messages"][0],
                                                                     next={"partition": held["partition"]}))
        assert body["next"]["reason"] == "lease_held"
        # Another group has its own leases: it joins at what is left (the rest of the held partition).
        status, body = await c.request("POST", "/api/v1/ack", ack_of(held["messages"][0], next={
            "consumerGroup": "audit", "batch": 10, "partitions": 2}))
        assert body["next"]["consumerGroup"] == "audit"
        assert [m["data"] for m in body["next"]["messages"]] == [held["partition"] + "2"]


async def test_a_parked_pop_is_served_before_a_later_next(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c, waiter = HttpClient(server.port), HttpClient(server.port)
        await push(c, "only")
        got = (await pop(c))["messages"][0]
        answers = {}

        async def parked_pop():
            answers["parked"] = await pop(waiter, waitMs=5000)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(parked_pop)
            await wait_parked(server, 1)
            # The failed message is free again: the pop that was waiting gets it, not the next.
            status, body = await c.request("POST", "/api/v1/ack", ack_of(got, status="failed", next={}))
            assert status == 200 and body["success"] is True
            assert body["next"]["reason"] == "empty"
        assert [(m["data"], m["retryCount"]) for m in answers["parked"]["messages"]] == [("only", 1)]

        # A next that parks joins the end of the line: the pop parked before it is served first.
        mine = answers["parked"]["messages"][0]
        order = []

        async def plain():
            order.append(("plain", (await pop(waiter, waitMs=5000))["messages"][0]["data"]))

        async def with_next():
            status, body = await c.request("POST", "/api/v1/ack", ack_of(mine, next={"waitMs": 5000}))
            order.append(("next", body["next"]["messages"][0]["data"]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(plain)
            await wait_parked(server, 1)
            nursery.start_soon(with_next)
            await wait_parked(server, 2)
            await push(HttpClient(server.port), "x", partition="p2")
            await push(HttpClient(server.port), "z", partition="p3")
        assert dict(order) == {"plain": "x", "next": "z"}


async def test_the_ack_and_the_next_lease_are_one_step_of_the_shard(tmp_path, autojump_clock):
    """One step applies the ack and the pop, so their records are one submit: one frame."""
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, 1, 2)
        got = (await pop(c))["messages"][0]
        steps = []
        runner = server.router.steps
        original = runner.state.apply

        def spying(step, now_ms):
            applied = original(step, now_ms)
            if type(step) is Ops:
                steps.append([type(r) for r in rec.decode(applied.records)])
            return applied

        runner.state.apply = spying
        status, body = await c.request("POST", "/api/v1/ack", ack_of(got, next={}))
        assert body["next"]["messages"][0]["data"] == 2
        assert any(rec.MessageState in kinds and rec.Grant in kinds for kinds in steps), steps


async def test_next_on_another_shard_pops_after_the_ack(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", shard_count=4) as server:
        names = [f"q{i}" for i in range(40)]
        first = names[0]
        other = next(n for n in names if shard_of_queue(n, 4) != shard_of_queue(first, 4))
        c = HttpClient(server.port)
        await push(c, "a", queue=first)
        await push(c, "b", queue=other)
        got = (await pop(c, queue=first))["messages"][0]
        status, body = await c.request("POST", "/api/v1/ack", ack_of(got, next={"queue": other}))
        assert status == 200 and body["success"] is True and body["next"]["queue"] == other
        assert [m["data"] for m in body["next"]["messages"]] == ["b"]


async def test_a_transaction_with_next(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, 1, 2, 3)
        got = (await pop(c))["messages"][0]
        status, body = await c.request("POST", "/api/v1/transaction", {
            "ack": [ack_of(got)], "push": [{"queue": "out", "payload": 10}],
            "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}], "next": {"batch": 2}})
        assert status == 200 and body["success"] is True and body["push"][0]["status"] == "queued"
        assert [m["data"] for m in body["next"]["messages"]] == [2, 3]
        held = body["next"]["messages"]
        # Refused (an ack under a lease already ended): nothing applied, no pop made.
        status, body = await c.request("POST", "/api/v1/transaction", {
            "ack": [ack_of(got, leaseId=got["leaseId"] + 10_000)], "push": [{"queue": "out", "payload": 11}],
            "next": {"queue": "out"}})
        assert status == 200 and body["success"] is False and body["reason"] == "lease_lost"
        assert body["next"] is None and body["nextReason"] == "not_committed"
        assert [m["data"] for m in (await pop(c, queue="out", batch=5))["messages"]] == [10]
        # Without an ack to infer from, next names its queue.
        status, body = await c.request("POST", "/api/v1/transaction", {"push": [{"queue": "out", "payload": 12}],
                                                                        "next": {}})
        assert (status, body["code"]) == (400, "next_queue_required")
        status, body = await c.request("POST", "/api/v1/transaction", {"ack": [ack_of(m) for m in held],
                                                                        "next": {"waitMs": 2000}})
        assert body["success"] is True and body["next"]["reason"] == "timeout"  # parked, then gave up
        # The Queen MQ client's form takes next beside its operations.
        await push(c, 4)
        got = (await pop(c))["messages"][0]
        status, body = await c.request("POST", "/api/v1/transaction", {
            "operations": [{"type": "ack", "partitionId": got["partitionId"], "leaseId": got["leaseId"],
                            "transactionId": got["transactionId"], "status": "completed"}],
            "next": {"queue": "orders"}})
        assert status == 200 and body["success"] is True and body["next"]["reason"] == "empty"


async def test_next_is_the_tenants_own_and_counted_as_a_pop(tmp_path, autojump_clock):
    path, who = auth_file(tmp_path, {})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        c = HttpClient(server.port)
        await push(c, "mine", "mine2", headers=who["writer"])
        got = (await pop(c, headers=who["writer"]))["messages"][0]
        # Another tenant acking acme's ids cannot reach acme's queue through next.
        status, body = await c.request("POST", "/api/v1/ack", ack_of(got, next={}), who["other"])
        assert (status, body["code"]) == (400, "next_queue_unknown")
        status, body = await c.request("POST", "/api/v1/ack", ack_of(got, next={"queue": "orders"}), who["other"])
        assert body["success"] is False and body["reason"] == "lease_lost"
        assert body["next"]["reason"] == "empty" and body["next"]["queue"] == "orders"  # zeta's own, empty
        # A reader may run a read-only transaction, not one that pops.
        status, body = await c.request("POST", "/api/v1/transaction", {
            "kv": [{"op": "get", "ns": "n", "key": "k"}], "next": {"queue": "orders"}}, who["reader"])
        assert (status, body["code"]) == (403, "forbidden")
        status, body = await c.request("POST", "/api/v1/ack", ack_of(got, next={}), who["writer"])
        assert body["success"] is True and body["next"]["queue"] == "orders"
        assert [m["data"] for m in body["next"]["messages"]] == ["mine2"]


async def test_an_ack_with_next_counts_two_writes_on_the_rate(tmp_path, autojump_clock):
    rate = 100
    path, who = auth_file(tmp_path, {"writesPerSecond": rate})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        c = HttpClient(server.port)
        taken = refused = 0
        started = trio.current_time()
        body = {"partitionId": 1, "leaseId": 1, "offset": 0, "next": {"queue": "orders"}}
        while trio.current_time() - started < 5.0:
            status, answer = await c.request("POST", "/api/v1/ack", body, who["writer"])
            if status == 200:
                taken += 1
            else:
                assert status == 429 and answer["code"] == "rate_limited", answer
                refused += 1
                await trio.sleep(0.001)
        expected = rate * 5 / 2  # each call is an ack and a pop
        assert refused > 0 and abs(taken - expected) <= expected * 0.15, (taken, expected)
