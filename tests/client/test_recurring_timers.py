"""Recurring timers in the SDK against a real `queen serve`, under asyncio and Trio and in the
blocking SyncClient: `client.timers.schedule(..., cron=, timezone=)` and `every=`, the schedule in
the answers, a period's message named by its period, the refusals, and a transaction's timer."""

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import anyio
import pytest

import queen_client


@pytest.fixture(params=["asyncio", "trio"])
def backend(request):
    return request.param


def test_both_recurring_timers_schedule_show_fire_and_refuse(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            timers = client.timers
            beat = await timers.schedule(unique, "beat", "tick", every="1s", delay="50ms", partition="b")
            assert beat.scheduled and beat.every_ms == 1_000 and beat.cron is None
            daily = await timers.schedule(unique, "daily", {"report": "sales"}, cron="0 9 * * 1-5",
                                          timezone="Europe/Berlin", transaction_id="sales")
            assert daily.cron == "0 9 * * 1-5" and daily.timezone == "Europe/Berlin" and daily.every_ms is None
            local = datetime.fromtimestamp(daily.at_ms / 1000, ZoneInfo("Europe/Berlin"))
            assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
            got = await timers.get(unique, "daily")
            assert (got.cron, got.timezone, got.at_ms, got.transaction_id) == ("0 9 * * 1-5", "Europe/Berlin",
                                                                             daily.at_ms, "sales")
            listed = {t.key: t async for t in timers.list(unique)}
            assert listed["beat"].every_ms == 1_000 and listed["daily"].cron == "0 9 * * 1-5"
            delivery = await client.queue(unique).pop(partition="b", wait="5s", auto_ack=True)
            [message] = delivery.messages
            assert message.transaction_id == f"beat@{beat.at_ms}" and message.created_at_ms >= beat.at_ms
            moved = await timers.get(unique, "beat")
            assert moved.at_ms > message.created_at_ms and (moved.at_ms - beat.at_ms) % 1_000 == 0
            assert await timers.cancel(unique, "beat") is True
            with pytest.raises(TypeError):
                await timers.schedule(unique, "k", 1, cron="* * * * *", every="1m")
            with pytest.raises(TypeError):
                await timers.schedule(unique, "k", 1, every="1m", timezone="UTC")
            with pytest.raises(TypeError):
                await timers.schedule(unique, "k", 1, cron="* * * * *", delay="1m")
            for kwargs, code in (({"cron": "0 9 * * *", "timezone": "Europe/Atlantis"}, "unknown_timezone"),
                                 ({"cron": "0 9 *"}, "invalid_cron"), ({"every": "500ms"}, "invalid_every")):
                with pytest.raises(queen_client.BadRequestError) as refused:
                    await timers.schedule(unique, "k", 1, **kwargs)
                assert refused.value.code == code

    anyio.run(body, backend=backend)


def test_sync_recurring_timer_and_a_transaction_that_schedules_one(server, unique):
    with queen_client.SyncClient(server.url) as client:
        every = client.timers.schedule(unique, "every", 1, every=timedelta(hours=1))
        assert every.every_ms == 3_600_000
        result = client.transaction().timer(unique, "nightly", "go", cron="30 2 * * *", timezone="America/New_York") \
            .cancel_timer(unique, "every").commit()
        assert result.success and result.timers[0].cron == "30 2 * * *" and result.timers[1] is True
        nightly = client.timers.get(unique, "nightly")
        assert nightly.timezone == "America/New_York" and client.timers.get(unique, "every") is None
