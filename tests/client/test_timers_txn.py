"""The SDK's timers and transactions against a real `queen serve`, under asyncio and Trio
(`test_both_*`), and the blocking SyncClient: schedule, get, list, cancel, a timer's message
arriving; a transaction with every section, also from inside a consume loop; a paused consumer
whose step answers lease_lost."""

from contextlib import aclosing
from datetime import UTC, datetime, timedelta

import anyio
import pytest

import queen_client


@pytest.fixture(params=["asyncio", "trio"])
def backend(request):
    return request.param


def run(backend, fn, *args):
    return anyio.run(fn, *args, backend=backend)


def test_both_timers_schedule_get_list_cancel_and_fire(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            timers = client.timers
            first = await timers.schedule(unique, "order-42:payment-timeout", {"orderId": 42}, delay="15m",
                                          partition="customer-42", transaction_id="timeout-42")
            assert first.scheduled and first.version and not first.replaced
            moved = await timers.schedule(unique, "order-42:payment-timeout", {"orderId": 42}, delay="20m",
                                          partition="customer-42")
            assert moved.replaced and moved.version > first.version and moved.at_ms > first.at_ms
            got = await timers.get(unique, "order-42:payment-timeout")
            assert got.payload == {"orderId": 42} and got.partition == "customer-42" and got.at_ms == moved.at_ms
            assert await timers.get(unique, "nothing") is None
            for n in range(5):
                await timers.schedule(unique, f"r{n}", n, delay="1h")
            listed = [t.key async for t in timers.list(unique, prefix="r", limit=2)]
            assert listed == ["r0", "r1", "r2", "r3", "r4"]
            assert await timers.cancel(unique, "r3") is True and await timers.cancel(unique, "r3") is False
            with pytest.raises(TypeError):
                await timers.schedule(unique, "k", 1)  # neither at nor delay
            with pytest.raises(queen_client.BadRequestError) as refused:
                await timers.schedule(unique, "k", 1, at=datetime.now(UTC) + timedelta(days=366))
            assert refused.value.code == "at_too_far"
            soon = await timers.schedule(unique, "soon", "ding", delay="100ms", partition="p")
            delivery = await client.queue(unique).pop(partition="p", wait="5s", auto_ack=True)
            assert [m.data for m in delivery.messages] == ["ding"]
            assert delivery.messages[0].created_at_ms >= soon.at_ms  # never early
            assert await timers.cancel(unique, "soon") is False  # fired

    run(backend, body)


def test_both_one_step_from_inside_a_consume_loop(backend, server, unique):
    orders, invoices = f"{unique}-orders", f"{unique}-invoices"

    async def body():
        async with queen_client.Client(server.url) as client:
            await client.timers.schedule(orders, "order-42:payment-timeout", {"orderId": 42}, delay="15m")
            await client.queue(orders).push({"orderId": 42, "event": "paid"}, partition="customer-42")
            async with aclosing(client.queue(orders).consume(wait="2s")) as messages:
                async for message in messages:
                    result = await (client.transaction()
                                    .ack(message)
                                    .kv.put(unique, "order-42", {"state": "paid"}, forever=True)
                                    .queue(invoices).push([{"orderId": 42}], partition="customer-42")
                                    .cancel_timer(orders, "order-42:payment-timeout")
                                    .timer(orders, "order-42:review", {"orderId": 42}, delay="1d",
                                           partition="customer-42")
                                    .commit())
                    break
            assert result.success and message.settled
            assert result.acks[0].success and result.acks[0].lease_released
            assert result.pushes[0].status == "queued" and result.results[0].version
            assert result.timers[0] is True and result.timers[1].scheduled
            assert (await client.kv.get(unique, "order-42")).value == {"state": "paid"}
            assert await client.timers.get(orders, "order-42:payment-timeout") is None
            assert (await client.timers.get(orders, "order-42:review")).payload == {"orderId": 42}
            assert [m.data for m in (await client.queue(invoices).pop(auto_ack=True)).messages] == [{"orderId": 42}]
            assert not await client.queue(orders).pop()  # acked once, in the step

    run(backend, body)


def test_both_a_paused_consumer_cannot_commit_and_the_new_owner_can(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            await queue.configure(leaseTimeSeconds=1)
            await queue.push({"orderId": 42}, partition="customer-42")
            a = (await queue.pop()).messages[0]  # A stops here, its lease not extended
            b = (await queue.pop(wait="10s")).messages[0]  # handed over when A's lease ran out
            assert b.offset == a.offset and b.lease_id != a.lease_id and b.retry_count == 1

            def step(message, who):
                return (client.transaction().ack(message)
                        .kv.put(unique, "order-42", {"paidBy": who}, forever=True)
                        .queue(f"{unique}-next").push([who]))

            refused = await step(a, "A").commit()
            assert not refused and refused.reason == "lease_lost" and refused.failed_section == "ack"
            assert refused.failed_index == 0 and refused.current == {"state": "inFlight"} and a.settled
            assert not (await client.kv.get(unique, "order-42")).found
            committed = await step(b, "B").commit()
            assert committed.success and (await client.kv.get(unique, "order-42")).value == {"paidBy": "B"}
            assert [m.data for m in (await client.queue(f"{unique}-next").pop(batch=5, auto_ack=True)).messages] == ["B"]

    run(backend, body)


def test_sync_timers_and_a_guarded_transaction(server, unique):
    with queen_client.SyncClient(server.url) as client:
        assert client.timers.schedule(unique, "k", {"n": 1}, delay="1h").scheduled
        assert client.timers.get(unique, "k").payload == {"n": 1}
        assert [t.key for t in client.timers.list(unique)] == ["k"]
        with client.lock(f"{unique}-cron", ttl="30s").hold() as lock:
            result = (client.transaction().guard(lock)
                      .queue(unique).push(["report"])
                      .cancel_timer(unique, "k")
                      .commit())
        assert result.success and result.timers == [True] and result.pushes[0].status == "queued"
        assert client.timers.get(unique, "k") is None
        delivery = client.queue(unique).pop(auto_ack=True)
        assert [m.data for m in delivery.messages] == ["report"]
        with pytest.raises(TypeError):
            client.transaction().queue(unique).push("not a list")
