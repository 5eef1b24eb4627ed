"""The queue routes over HTTP, route by route, against the shapes, defaults and reasons the README
documents; time in MockClock's virtual seconds."""

import pytest
import trio
import trio.testing

from queen.testing import HttpClient, open_server

TICK_S = 0.05


async def push(client, *items, queue="orders", partition="p"):
    status, body = await client.request("POST", "/api/v1/push", {"items": [
        {"queue": queue, "partition": partition, **(item if isinstance(item, dict) and "payload" in item else {"payload": item})}
        for item in items]})
    assert status == 200, body
    return body


async def pop(client, path="/api/v1/pop/queue/orders", **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    status, body = await client.request("GET", path + ("?" + query if query else ""))
    assert status == 200, body
    return body


async def ack(client, message, **extra):
    status, body = await client.request("POST", "/api/v1/ack", {
        "partitionId": message["partitionId"], "leaseId": message["leaseId"], "offset": message["offset"], **extra})
    assert status == 200, body
    return body


async def test_configure_merges_shows_every_option_and_refuses_what_it_does_not_do(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        status, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": {"leaseTime": 60},
                                                                      "namespace": None, "task": None})
        assert status == 200 and body["created"] is True and body["options"]["leaseTimeSeconds"] == 60
        assert body["options"]["retryLimit"] == 3 and body["options"]["maxSize"] == 1_000_000
        _, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": {
            "retryLimit": 5, "priority": 0, "encryptionEnabled": False}})
        assert body["created"] is False and body["options"]["leaseTimeSeconds"] == 60 and body["options"]["retryLimit"] == 5
        assert "priority" not in body["options"]
        for options, code in (({"priority": 5}, "unsupported_option"), ({"colour": 1}, "unknown_option"),
                              ({"retryLimit": 1001}, "invalid_option"),
                              ({"leaseTime": 5, "leaseTimeSeconds": 6}, "option_conflict")):
            status, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": options})
            assert (status, body["code"]) == (400, code), options
        status, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "namespace": "x"})
        assert body["code"] == "unknown_field"
        _, body = await c.request("GET", "/api/v1/resources/queues/orders")
        assert body["options"]["retryLimit"] == 5  # the refused calls changed nothing


async def test_push_answers_a_bare_array_with_queued_duplicate_and_failed(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": {"maxSize": 2}})
        body = await push(c, {"payload": 1, "transactionId": "a"}, {"payload": 2, "transactionId": "a"}, 3, 4)
        assert [r["status"] for r in body] == ["queued", "duplicate", "queued", "failed"]
        assert [r["index"] for r in body] == [0, 1, 2, 3]
        assert body[3]["reason"] == body[3]["error"] == "queue_full"
        status, body = await c.request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1}], "bufferMs": 5})
        assert (status, body["code"]) == (400, "unsupported_field")


async def test_pop_ack_and_the_lease_routes(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, "a", "b", "c", partition="customer-42")
        got = await pop(c, batch=2)
        assert got["success"] is True and got["partition"] == "customer-42" and got["partitionsClaimed"] == 1
        assert got["consumerGroup"] == "__QUEUE_MODE__" and [m["data"] for m in got["messages"]] == ["a", "b"]
        held = await pop(c, "/api/v1/pop/queue/orders/partition/customer-42")
        assert held == {"success": False, "reason": "lease_held", "error": "lease_held", "queue": "orders",
                        "consumerGroup": "__QUEUE_MODE__", "messages": []}
        first = await ack(c, got["messages"][0])
        assert first["success"] is True and "index" not in first and first["leaseReleased"] is False
        status, batch = await c.request("POST", "/api/v1/ack/batch", {"consumerGroup": None, "acknowledgments": [
            {"partitionId": str(got["partitionId"]), "leaseId": str(got["leaseId"]), "offset": 1, "error": None}]})
        assert status == 200 and isinstance(batch, list) and batch[0]["leaseReleased"] is True
        status, body = await c.request("POST", "/api/v1/ack", {"partitionId": got["partitionId"], "offset": 2})
        assert (status, body["code"]) == (400, "invalid_lease_id")
        third = await pop(c)
        _, extended = await c.request("POST", f"/api/v1/lease/{third['leaseId']}/extend", b"")
        assert extended["success"] is True and extended["partitions"][0]["partition"] == "customer-42"
        _, released = await c.request("POST", f"/api/v1/lease/{third['leaseId']}/release", {})
        assert released["success"] is True
        _, gone = await c.request("POST", f"/api/v1/lease/{third['leaseId']}/extend", {"seconds": 10})
        assert gone["reason"] == "lease_lost"
        assert (await pop(c))["messages"][0]["retryCount"] == 0


async def test_a_parked_pop_is_answered_the_moment_a_push_lands(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        answers = []

        async def consumer():
            answers.append((await pop(HttpClient(server.port), waitMs=20_000), trio.current_time()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(3)
            pushed_at = trio.current_time()
            await push(HttpClient(server.port), "late")
        got, answered_at = answers[0]
        assert got["messages"][0]["data"] == "late" and answered_at == pushed_at  # no tick, no poll


async def test_a_parked_pop_gets_an_expired_lease_within_one_tick(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": {"leaseTimeSeconds": 2}})
        await push(c, "m")
        first = await pop(c)
        lease_ends = trio.current_time() + 2
        again = await pop(HttpClient(server.port), waitMs=10_000)
        assert lease_ends <= trio.current_time() <= lease_ends + TICK_S + 0.001
        assert again["messages"][0]["retryCount"] == 1 and again["leaseId"] > first["leaseId"]
        timed_out = await pop(HttpClient(server.port), wait="true", timeout=500)
        assert timed_out["reason"] == "timeout"


async def test_a_waiter_that_hung_up_is_never_handed_a_message(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        async with trio.open_nursery() as nursery:
            gone = HttpClient(server.port)
            nursery.start_soon(gone.request, "GET", "/api/v1/pop/queue/orders?waitMs=30000")
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        await gone.aclose()
        await trio.testing.wait_all_tasks_blocked()
        c = HttpClient(server.port)
        await push(c, "m")
        got = await pop(c)
        assert got["messages"][0]["data"] == "m" and got["messages"][0]["retryCount"] == 0


async def test_dlq_listing_requeue_and_purge_routes(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, "poison", "fine")
        got = await pop(c, batch=2)
        moved = await ack(c, got["messages"][0], status="dlq", error="cannot parse")
        assert moved["dlq"] is True
        _, listing = await c.request("GET", "/api/v1/dlq?queue=orders")
        assert listing["total"] == 1 and listing["messages"][0]["error"] == "cannot parse" and listing["cursor"] is None
        entry = listing["messages"][0]
        _, requeued = await c.request("POST", "/api/v1/dlq/requeue", {"queue": "orders", "items": [
            {"partitionId": entry["partitionId"], "offset": entry["offset"]}]})
        assert requeued == {"results": [{"index": 0, "requeued": True}]}
        again = await pop(c, batch=2)
        assert [m["data"] for m in again["messages"]] == ["poison", "fine"]
        await ack(c, again["messages"][0], status="dlq")
        _, purged = await c.request("DELETE", "/api/v1/dlq?queue=orders")
        assert purged == {"purged": 1}


async def test_admin_views_group_and_queue_deletion(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, "a", "b", partition="p1")
        await push(c, "c", partition="p2")
        got = await pop(c, consumerGroup="mailer")
        _, listing = await c.request("GET", "/api/v1/resources/queues")
        [summary] = listing["items"]
        assert summary["queue"] == "orders" and summary["partitions"] == 2 and summary["groups"] == ["mailer"]
        assert summary["inFlight"] == 1 and summary["pending"] == 2
        _, parts = await c.request("GET", "/api/v1/resources/queues/orders/partitions?consumerGroup=mailer")
        p1 = next(item for item in parts["items"] if item["partition"] == "p1")
        assert p1["nextOffset"] == 2 and p1["groups"][0]["lease"]["leaseId"] == got["leaseId"]
        _, deleted = await c.request("DELETE", "/api/v1/consumer-groups/mailer/queues/orders")
        assert deleted == {"deleted": True}
        assert (await ack(c, got["messages"][0]))["reason"] == "lease_lost"
        _, gone = await c.request("DELETE", "/api/v1/resources/queues/orders")
        assert gone["deleted"] is True and gone["messages"] == 3
        _, info = await c.request("GET", "/api/v1/resources/queues/orders")
        assert info == {"found": False, "queue": "orders"}


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["from-log", "from-snapshot"])
async def test_leases_offsets_dlq_and_dedupe_survive_a_restart_and_ids_keep_rising(from_snapshot, tmp_path, autojump_clock):
    data_dir = tmp_path / "d"
    settings = {"snapshot_wal_bytes": 1, "shard_count": 1} if from_snapshot else {}  # a snapshot after every write
    async with open_server(data_dir, **settings) as server:
        c = HttpClient(server.port)
        pushed = await push(c, {"payload": 1, "transactionId": "t1"}, 2, 3)
        got = await pop(c, batch=2)
        await ack(c, got["messages"][0], status="dlq")
        await trio.testing.wait_all_tasks_blocked()  # the last snapshot written
    if from_snapshot:
        assert list(data_dir.glob("*.snap"))
    async with open_server(data_dir, **settings) as server:
        c = HttpClient(server.port)
        again = await push(c, {"payload": 9, "transactionId": "t1"})
        assert again[0]["status"] == "duplicate" and again[0]["messageId"] == pushed[0]["messageId"]
        _, dlq = await c.request("GET", "/api/v1/dlq?queue=orders")
        assert dlq["total"] == 1
        fresh = await push(c, 4)
        assert fresh[0]["messageId"] > max(r["messageId"] for r in pushed) and fresh[0]["offset"] == 3
        rest = await pop(c, batch=5)
        assert [m["data"] for m in rest["messages"]] == [2, 3, 4] and rest["leaseId"] > got["leaseId"]


async def test_queue_metrics(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, {"payload": 1, "transactionId": "a"}, {"payload": 2, "transactionId": "a"}, 3)
        got = await pop(c)
        await ack(c, got["messages"][0], status="failed")
        _, text = await c.request("GET", "/metrics")
        text = text.decode()
        for line in ('queen_queue_messages{queue="orders"} 2', 'queen_queue_pending{queue="orders",group="__QUEUE_MODE__"} 2',
                     'queen_queue_in_flight{queue="orders",group="__QUEUE_MODE__"} 0', 'queen_push_total{result="queued"} 2',
                     'queen_push_total{result="duplicate"} 1',
                     'queen_redeliveries_total{queue="orders",cause="failed"} 1',
                     # per queue, what the dashboard's rates come from: the duplicate appended nothing
                     'queen_queue_pushed_total{queue="orders"} 2', 'queen_queue_popped_total{queue="orders"} 1'):
            assert line in text, line
        again = await pop(c)
        await ack(c, again["messages"][0])
        _, text = await c.request("GET", "/metrics")
        assert 'queen_queue_popped_total{queue="orders"} 2' in text.decode()
        assert 'queen_queue_acked_total{queue="orders"} 1' in text.decode()


async def test_metrics_an_on_call_person_alerts_on_and_the_dlq_and_expiry_log_lines(tmp_path, autojump_clock, caplog):
    """Oldest unfinished message's age, parked pops, redeliveries and DLQ moves by queue; a DLQ
    move logged at info, a lease expiry at debug."""
    caplog.set_level("DEBUG", logger="queen.runtime.steps")

    def sample(text: str, name: str) -> float:
        [value] = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.rsplit(" ", 1)[0] == name]
        return float(value)

    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await c.request("POST", "/api/v1/configure", {"queue": "mail", "options": {"leaseTimeSeconds": 2,
                                                                                   "retryLimit": 1}})
        await push(c, "first", queue="mail")
        await trio.sleep(30)
        await push(c, "second", queue="mail")
        got = await pop(c, "/api/v1/pop/queue/mail")  # "first", in flight: still unfinished
        await trio.sleep(2.5)  # its lease expires: redelivered
        _, text = await c.request("GET", "/metrics")
        text = text.decode()
        age = sample(text, 'queen_queue_oldest_pending_age_seconds{queue="mail",group="__QUEUE_MODE__"}')
        assert 32.4 <= age <= 32.6
        assert sample(text, 'queen_redeliveries_total{queue="mail",cause="expired"}') == 1
        again = await pop(c, "/api/v1/pop/queue/mail")
        assert again["messages"][0]["data"] == "first" and again["messages"][0]["retryCount"] == 1
        await ack(c, again["messages"][0], status="failed", error="smtp refused")  # past retryLimit: the DLQ

        async def idle_consumer():
            await pop(HttpClient(server.port), "/api/v1/pop/queue/empty", waitMs=5_000)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(idle_consumer)
            await trio.testing.wait_all_tasks_blocked()
            _, text = await c.request("GET", "/metrics")
            text = text.decode()
        assert sample(text, "queen_pops_parked") == 1
        assert sample(text, 'queen_dlq_moves_total{queue="mail"}') == 1
        age = sample(text, 'queen_queue_oldest_pending_age_seconds{queue="mail",group="__QUEUE_MODE__"}')
        assert 2.4 <= age <= 2.6 + 5  # now "second", pushed 2.5 s (and the parked pop's wait) ago
        assert got["messages"][0]["data"] == "first"
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "queen.runtime.steps"]
    assert ("INFO", "event=dlq_move queue=mail group=__QUEUE_MODE__ partition=p offset=0 retry_count=2 "
                    "error='smtp refused'") in messages
    assert any(level == "DEBUG" and text.startswith("event=lease_expired queue=mail group=__QUEUE_MODE__ ")
               and text.endswith(" messages=1") for level, text in messages)


async def test_a_parked_pop_answers_503_when_the_server_stops(tmp_path, autojump_clock):
    answers = []
    async with open_server(tmp_path / "d") as server:
        async def consumer():
            answers.append(await HttpClient(server.port).request("GET", "/api/v1/pop/queue/orders?waitMs=60000"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            server.request_shutdown()
    [(status, body)] = answers
    assert status == 503 and body["code"] == "shutting_down"


async def test_acks_naming_offsets_past_2_to_the_32_are_not_delivered_and_the_server_stays_healthy(
        tmp_path, autojump_clock):
    """Such an ack once reached a 32-bit bitmap and failed the whole server: 503 for every write
    until a restart. Every way an offset arrives: /ack, /ack/batch, a transaction's ack section,
    the Queen MQ form, and a `queen:` transaction id."""
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await push(c, "a", "b")
        got = await pop(c, batch=1)
        [message] = got["messages"]
        for offset in (2**32, 2**32 + 1, 2**53 - 1, 2**63 - 1):
            assert (await ack(c, message, offset=offset))["reason"] == "not_delivered"
            _, batch = await c.request("POST", "/api/v1/ack/batch", {"acknowledgments": [
                {"partitionId": message["partitionId"], "leaseId": got["leaseId"], "offset": offset}]})
            assert batch[0]["reason"] == "not_delivered", batch
            _, txn = await c.request("POST", "/api/v1/transaction", {"ack": [
                {"partitionId": message["partitionId"], "leaseId": got["leaseId"], "offset": offset}]})
            assert txn["success"] is False and txn["reason"] == "not_delivered", txn
            _, txn = await c.request("POST", "/api/v1/transaction", {"operations": [
                {"type": "ack", "partitionId": message["partitionId"], "transactionId": f"queen:{offset}"}],
                "requiredLeases": [got["leaseId"]]})
            assert txn["success"] is False, txn
        assert (await ack(c, message, offset=None, transactionId="queen:4294967296"))["reason"] == "not_delivered"
        status, health = await c.request("GET", "/healthz")
        assert status == 200, health
        assert (await ack(c, message))["success"] is True
        await push(c, "c")  # writes go on


async def test_the_retry_backoff_over_http_in_either_spelling_and_its_bounds(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        status, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": {
            "retryDelayMs": 200, "retryDelayMaxMs": 1_000}})
        assert status == 200 and (body["options"]["retryDelayMs"], body["options"]["retryDelayMaxMs"]) == (200, 1_000)
        for options, option, low, high in (({"retryDelayMs": -1}, "retryDelayMs", 0, 86_400_000),
                                           ({"retryDelayMs": 86_400_001}, "retryDelayMs", 0, 86_400_000),
                                           ({"retryDelayMs": 2.5}, "retryDelayMs", 0, 86_400_000),
                                           ({"retryDelayMaxMs": 0}, "retryDelayMaxMs", 1, 86_400_000),
                                           ({"retryDelay": 86_400_001}, "retryDelayMs", 0, 86_400_000)):
            status, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": options})
            assert status == 400 and body["code"] == "invalid_option", options
            assert body["details"] == {"option": option, "min": low, "max": high}
            assert f"{option} must be an integer from {low} to {high}" in body["error"]
        status, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": {"retryDelay": 500},
                                                                      "namespace": None, "task": None})
        assert status == 200 and body["options"]["retryDelayMs"] == 500 and body["options"]["retryDelayMaxMs"] == 1_000
        status, body = await c.request("POST", "/api/v1/configure", {"queue": "orders", "options": {
            "retryDelay": 500, "retryDelayMs": 500}})
        assert (status, body["code"]) == (400, "option_conflict")
        _, info = await c.request("GET", "/api/v1/resources/queues/orders")
        assert (info["options"]["retryDelayMs"], info["options"]["retryDelayMaxMs"]) == (500, 1_000)

        # Held back 500 ms on the server: a parked pop is answered when that time comes, within a tick.
        await push(c, "m")
        got = await pop(c)
        failing_at = trio.current_time()
        await ack(c, got["messages"][0], status="failed")
        failed_at = trio.current_time()
        _, parts = await c.request("GET", "/api/v1/resources/queues/orders/partitions")
        assert parts["items"][0]["groups"][0]["retryAt"] is not None
        again = await pop(HttpClient(server.port), waitMs=10_000)
        assert failing_at + 0.5 <= trio.current_time() <= failed_at + 0.5 + TICK_S + 0.001
        assert again["messages"][0]["retryCount"] == 1
        _, parts = await c.request("GET", "/api/v1/resources/queues/orders/partitions")
        assert parts["items"][0]["groups"][0]["retryAt"] is None
