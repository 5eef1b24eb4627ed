"""Timers and multi-section transactions through the whole server in-process (HTTP, router, steps,
WAL), time in MockClock's virtual seconds: the 50 ms tick fires timers as it does in production."""

import trio

from queen.testing import HttpClient, open_server

TICK_MS = 50


async def timers(client, *operations, status=200):
    code, body = await client.request("POST", "/api/v1/timers", {"operations": list(operations)})
    assert code == status, body
    return body["results"] if status == 200 else body


async def pop_all(client, queue="orders"):
    code, body = await client.request("GET", f"/api/v1/pop/queue/{queue}?batch=100&autoAck=true")
    assert code == 200, body
    return body["messages"]


async def now_ms(client) -> int:
    [probe] = await timers(client, {"op": "schedule", "queue": "clock", "key": "probe", "delayMs": 0, "payload": 0})
    return probe["at"]


async def sleep_until_ms(server_now_ms: int, target_ms: int) -> None:
    await trio.sleep(max(0, target_ms - server_now_ms) / 1000)


async def test_a_timer_fires_never_early_and_within_one_tick(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        for delay_ms in (0, 1, 49, 50, 51, 777, 1000):
            [answer] = await timers(c, {"op": "schedule", "queue": "orders", "key": f"k{delay_ms}",
                                        "partition": "p", "delayMs": delay_ms, "payload": delay_ms})
            at = answer["at"]
            start = server.router.now_ms()
            await sleep_until_ms(start, at - 1)
            early = [m for m in await pop_all(c) if m["data"] == delay_ms]
            assert early == [] or delay_ms == 0 and early[0]["createdAt"] >= at
            if early:
                continue
            await sleep_until_ms(server.router.now_ms(), at + TICK_MS)
            [message] = [m for m in await pop_all(c) if m["data"] == delay_ms]
            assert at <= message["createdAt"] <= at + TICK_MS, (delay_ms, at, message["createdAt"])


async def test_schedule_get_list_move_and_cancel_over_http(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        results = await timers(
            c, {"op": "schedule", "queue": "orders", "key": "order-42:payment-timeout", "partition": "customer-42",
                "delayMs": 900_000, "payload": {"orderId": 42, "kind": "payment-timeout"}},
            {"op": "cancel", "queue": "orders", "key": "order-41:payment-timeout"},
            {"op": "get", "queue": "orders", "key": "order-40:reminder"})
        assert [r["index"] for r in results] == [0, 1, 2] and results[0]["scheduled"] is True
        assert results[1] == {"index": 1, "op": "cancel", "queue": "orders", "key": "order-41:payment-timeout",
                              "cancelled": False, "reason": "absent", "ok": False, "status": "absent"}
        assert results[2]["found"] is False
        [got] = await timers(c, {"op": "get", "queue": "orders", "key": "order-42:payment-timeout"})
        assert got["payload"] == {"orderId": 42, "kind": "payment-timeout"} and got["at"] == results[0]["at"]
        [moved] = await timers(c, {"op": "schedule", "queue": "orders", "key": "order-42:payment-timeout",
                                   "partition": "customer-42", "delayMs": 1_000, "payload": "sooner"})
        assert moved["replaced"] is True and moved["version"] > results[0]["version"]
        await timers(c, *({"op": "schedule", "queue": "orders", "key": f"r{n}", "delayMs": 60_000, "payload": n}
                          for n in range(3)))
        status, page = await c.request("GET", "/api/v1/timers?queue=orders&prefix=r&limit=2")
        assert status == 200 and [i["key"] for i in page["items"]] == ["r0", "r1"] and page["cursor"]
        status, rest = await c.request("GET", f"/api/v1/timers?queue=orders&prefix=r&cursor={page['cursor']}")
        assert [i["key"] for i in rest["items"]] == ["r2"] and rest["cursor"] is None
        assert set(rest["items"][0]) == {"queue", "key", "partition", "at", "version", "scheduledAt", "transactionId"}
        await trio.sleep(1.1)
        assert [m["data"] for m in await pop_all(c)] == ["sooner"]
        [cancelled] = await timers(c, {"op": "cancel", "queue": "orders", "key": "r1"})
        assert cancelled["cancelled"] is True
        [fired] = await timers(c, {"op": "cancel", "queue": "orders", "key": "order-42:payment-timeout"})
        assert fired["reason"] == "absent"  # it fired


async def test_bad_timer_calls_are_refused_with_a_code_and_change_nothing(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        body = await timers(c, {"op": "schedule", "queue": "orders", "key": "fine", "delayMs": 5, "payload": 1},
                            {"op": "schedule", "queue": "orders", "key": "bad", "payload": 1}, status=400)
        assert body["code"] == "at_required" and body["details"]["index"] == 1
        [got] = await timers(c, {"op": "get", "queue": "orders", "key": "fine"})
        assert got["found"] is False
        for path, code in (("/api/v1/timers", "invalid_queue"), ("/api/v1/timers?queue=o&limit=0", "invalid_limit"),
                           ("/api/v1/timers?queue=o&colour=1", "unknown_field")):
            status, body = await c.request("GET", path)
            assert (status, body["code"]) == (400, code), path


async def transaction(client, document):
    status, body = await client.request("POST", "/api/v1/transaction", document)
    assert status == 200, body
    return body


def step(message, who):
    return {"kv": [{"op": "put", "ns": "orders", "key": "42", "value": {"paidBy": who}, "forever": True}],
            "ack": [{"partitionId": message["partitionId"], "leaseId": message["leaseId"],
                     "transactionId": message["transactionId"]}],
            "push": [{"queue": "invoices", "partition": "customer-42", "payload": {"by": who}}]}


async def order_state(client):
    status, body = await client.request("GET", "/api/v1/kv/orders/42")
    return body.get("value") if status == 200 else None


async def test_paused_consumer_with_a_lease_cannot_commit_its_step(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        a, b = HttpClient(server.port), HttpClient(server.port)
        await a.request("POST", "/api/v1/configure", {"queue": "orders", "options": {"leaseTime": 1}})
        await a.request("POST", "/api/v1/push", {"items": [{"queue": "orders", "partition": "customer-42",
                                                            "payload": {"orderId": 42}}]})
        _, got_a = await a.request("GET", "/api/v1/pop/queue/orders")
        await trio.sleep(1 + TICK_MS / 1000)  # A is stopped past its lease
        _, got_b = await b.request("GET", "/api/v1/pop/queue/orders")
        assert got_b["messages"][0]["offset"] == got_a["messages"][0]["offset"]
        refused = await transaction(a, step(got_a["messages"][0], "A"))
        assert refused["success"] is False and refused["reason"] == "lease_lost"
        assert refused["failed"]["section"] == "ack" and refused["failed"]["current"]["state"] == "inFlight"
        assert await order_state(a) is None and await pop_all(a, "invoices") == []
        committed = await transaction(b, step(got_b["messages"][0], "B"))
        assert committed["success"] is True
        assert await order_state(b) == {"paidBy": "B"} and [m["data"] for m in await pop_all(b, "invoices")] == [{"by": "B"}]


async def test_paused_lock_holder_cannot_commit_its_guarded_step(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        a, b = HttpClient(server.port), HttpClient(server.port)
        [lock_a] = await a.locks({"op": "acquire", "name": "billing", "ttlSeconds": 1, "owner": "A"})
        await trio.sleep(1 + TICK_MS / 1000)
        [lock_b] = await b.locks({"op": "acquire", "name": "billing", "ttlSeconds": 30, "owner": "B"})
        assert lock_b["acquired"] is True

        def guarded(lock, who):
            return {"kv": [lock["guard"], {"op": "put", "ns": "orders", "key": "42", "value": {"paidBy": who},
                                           "forever": True}],
                    "push": [{"queue": "invoices", "payload": {"by": who}}],
                    "timers": [{"op": "schedule", "queue": "orders", "key": "42:review", "delayMs": 60_000,
                                "payload": who}]}

        refused = await transaction(a, guarded(lock_a, "A"))
        assert refused["reason"] == "kv_precondition" and refused["failed"]["key"] == "billing#0"
        assert refused["failed"]["current"]["version"] == lock_b["token"]
        assert await order_state(a) is None and await pop_all(a, "invoices") == []
        [review] = await timers(a, {"op": "get", "queue": "orders", "key": "42:review"})
        assert review["found"] is False
        committed = await transaction(b, guarded(lock_b, "B"))
        assert committed["success"] is True and [r["index"] for r in committed["timers"]] == [0]
        [review] = await timers(b, {"op": "get", "queue": "orders", "key": "42:review"})
        assert review["found"] is True and review["payload"] == "B"


async def test_mixed_forms_and_unknown_sections_are_refused(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        for document, code in (({"operations": [{"type": "push", "queue": "q"}], "push": []}, "unsupported_form"),
                               ({"pop": [{"queue": "q"}]}, "unknown_section"),
                               ({"timers": [{"op": "get", "queue": "q", "key": "k"}]}, "not_in_transaction")):
            status, body = await c.request("POST", "/api/v1/transaction", document)
            assert (status, body["code"]) == (400, code)
        # The KV-only form keeps working.
        body = await transaction(c, {"kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]})
        assert body["success"] is True and list(body) == ["success", "kv"]
