"""Recurring timers through the whole server in-process (HTTP, router, steps, WAL), in MockClock's
virtual time from a wall time the test sets: each period fires as the 50 ms tick reaches it, the
answers show the schedule and the next time, a restart recovers the timers from the log, a
downtime gives one catch-up fire, and bad schedules are refused with their codes."""

import trio

from queen.testing import HttpClient, open_server

TICK_MS = 50
# 2024-03-31 01:00 UTC: Berlin's clocks jump from 02:00 to 03:00, so a 02:30 job runs at 03:00 CEST.
BERLIN_SPRING_FORWARD_MS = 1_711_846_800_000
NEXT_DAY_0230_CEST_MS = BERLIN_SPRING_FORWARD_MS + 86_400_000 - 1_800_000


async def timers(client, *operations, status=200):
    code, body = await client.request("POST", "/api/v1/timers", {"operations": list(operations)})
    assert code == status, body
    return body["results"] if status == 200 else body


async def pop_all(client, queue, partition):
    code, body = await client.request("GET", f"/api/v1/pop/queue/{queue}/partition/{partition}?batch=100&autoAck=true")
    assert code == 200, body
    return body["messages"]


def period_of(message) -> int:
    return int(message["transactionId"].rpartition("@")[2])


async def sleep_until_ms(server, target_ms: int) -> None:
    await trio.sleep(max(0, target_ms - server.router.now_ms()) / 1000)


async def test_recurring_timers_fire_each_period_and_survive_a_restart_with_one_catch_up_fire(tmp_path, autojump_clock):
    start_ms = BERLIN_SPRING_FORWARD_MS - 4_321
    async with open_server(tmp_path / "d", wall_at_start_ms=start_ms) as server:
        c = HttpClient(server.port)
        asked_ms = server.router.now_ms()
        beat, nightly = await timers(
            c, {"op": "schedule", "queue": "jobs", "key": "beat", "partition": "b", "everyMs": 1_000, "delayMs": 500,
                "payload": "beat"},
            {"op": "schedule", "queue": "jobs", "key": "nightly", "partition": "n", "cron": "30 2 * * *",
             "timezone": "Europe/Berlin", "payload": "nightly", "transactionId": "nightly-run"})
        assert beat["scheduled"] is True and beat["everyMs"] == 1_000 and asked_ms + 500 <= beat["at"] <= asked_ms + 550
        assert "cron" not in beat and nightly["cron"] == "30 2 * * *" and nightly["timezone"] == "Europe/Berlin"
        assert nightly["at"] == BERLIN_SPRING_FORWARD_MS and "everyMs" not in nightly
        first_beat_ms = beat["at"]
        await sleep_until_ms(server, BERLIN_SPRING_FORWARD_MS + TICK_MS)
        [run] = await pop_all(c, "jobs", "n")
        assert run["transactionId"] == f"nightly-run@{BERLIN_SPRING_FORWARD_MS}" and run["data"] == "nightly"
        assert BERLIN_SPRING_FORWARD_MS <= run["createdAt"] <= BERLIN_SPRING_FORWARD_MS + TICK_MS
        beats = await pop_all(c, "jobs", "b")
        assert [period_of(m) for m in beats] == list(range(first_beat_ms, first_beat_ms + 1_000 * len(beats), 1_000))
        assert len(beats) == 4 and all(period_of(m) <= m["createdAt"] <= period_of(m) + TICK_MS for m in beats)
        assert all(m["transactionId"].startswith("beat@") for m in beats)
        # get and the listing show the schedule and the next time.
        [got] = await timers(c, {"op": "get", "queue": "jobs", "key": "nightly"})
        assert got["at"] == NEXT_DAY_0230_CEST_MS and got["cron"] == "30 2 * * *" and got["transactionId"] == "nightly-run"
        status, page = await c.request("GET", "/api/v1/timers?queue=jobs")
        assert status == 200 and [(i["key"], i.get("everyMs"), i.get("cron"), i.get("timezone")) for i in page["items"]] == [
            ("beat", 1_000, None, None), ("nightly", None, "30 2 * * *", "Europe/Berlin")]
        assert page["items"][0]["at"] == first_beat_ms + 4_000
        stopped_ms = server.router.now_ms()
    # Down for ten minutes and a bit: recovered from the log, one catch-up fire, then on its phase again.
    restart_ms = stopped_ms + 600_123
    async with open_server(tmp_path / "d", wall_at_start_ms=restart_ms) as server:
        c = HttpClient(server.port)
        await sleep_until_ms(server, restart_ms + TICK_MS)
        [caught_up] = await pop_all(c, "jobs", "b")
        assert period_of(caught_up) == first_beat_ms + 4_000 and caught_up["createdAt"] >= restart_ms
        [got] = await timers(c, {"op": "get", "queue": "jobs", "key": "beat"})
        next_ms = got["at"]
        # The first period after the catch-up fire: no burst of the ~600 missed ones.
        assert got["everyMs"] == 1_000 and (next_ms - first_beat_ms) % 1_000 == 0
        assert next_ms - 1_000 <= caught_up["createdAt"] < next_ms
        await sleep_until_ms(server, next_ms + 2_000 + TICK_MS)
        assert [period_of(m) for m in await pop_all(c, "jobs", "b")] == [next_ms, next_ms + 1_000, next_ms + 2_000]
        assert await pop_all(c, "jobs", "n") == []  # the nightly run is a day away
        # Cancelled, it never fires again.
        [cancelled] = await timers(c, {"op": "cancel", "queue": "jobs", "key": "beat"})
        assert cancelled["cancelled"] is True
        await trio.sleep(5)
        assert await pop_all(c, "jobs", "b") == []


async def test_a_transaction_schedules_a_recurring_timer_with_the_step(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        status, body = await c.request("POST", "/api/v1/transaction", {
            "kv": [{"op": "put", "ns": "jobs", "key": "report", "value": "on", "forever": True}],
            "timers": [{"op": "schedule", "queue": "jobs", "key": "report", "everyMs": 2_000, "payload": "r"}]})
        assert status == 200 and body["success"] is True
        [answer] = body["timers"]
        assert answer["everyMs"] == 2_000 and answer["scheduled"] is True
        await sleep_until_ms(server, answer["at"] + 2_000 + TICK_MS)
        assert [period_of(m) for m in await pop_all(c, "jobs", "Default")] == [answer["at"], answer["at"] + 2_000]


async def test_bad_recurring_schedules_are_refused_with_a_code_and_change_nothing(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        fine = {"op": "schedule", "queue": "jobs", "key": "fine", "everyMs": 1_000, "payload": 1}
        for fields, code in (({"cron": "0 9 * *"}, "invalid_cron"), ({"cron": "0 25 * * *"}, "invalid_cron"),
                             ({"cron": "0 9 * * *", "timezone": "Europe/Atlantis"}, "unknown_timezone"),
                             ({"cron": "0 9 * * *", "everyMs": 1_000}, "schedule_conflict"),
                             ({"cron": "0 9 * * *", "delayMs": 1_000}, "schedule_conflict"),
                             ({"delayMs": 1_000, "timezone": "UTC"}, "timezone_without_cron"),
                             ({"everyMs": 999}, "invalid_every"), ({"everyMs": 31_536_000_001}, "invalid_every")):
            bad = {"op": "schedule", "queue": "jobs", "key": "bad", "payload": 1, **fields}
            body = await timers(c, fine, bad, status=400)
            assert body["code"] == code and body["details"]["index"] == 1, fields
            status, body = await c.request("POST", "/api/v1/transaction", {"timers": [fine, bad]})
            assert status == 400 and body["code"] == code, fields
            assert body["details"] == {**body["details"], "index": 1, "section": "timers"}
        [got] = await timers(c, {"op": "get", "queue": "jobs", "key": "fine"})
        assert got["found"] is False
        body = await timers(c, {"op": "schedule", "queue": "jobs", "key": "k", "cron": "0 9 * * *",
                                "timezone": "Mars/Olympus", "payload": 1}, status=400)
        assert "IANA" in body["error"] and body["details"]["timezone"] == "Mars/Olympus"
