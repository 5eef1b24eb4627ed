"""The SDK's queues against a real `queen serve`, under asyncio and Trio (`test_both_*`), and the
blocking SyncClient: push, pop, ack, the consumer's acks, its background lease extension, what
leaving the loop does, and process() acking failed on an exception."""

from contextlib import aclosing

import anyio
import pytest

import queen_client


@pytest.fixture(params=["asyncio", "trio"])
def backend(request):
    return request.param


def run(backend, fn, *args):
    return anyio.run(fn, *args, backend=backend)


def test_both_push_pop_ack_round_trip(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            first = await queue.push({"orderId": 1}, partition="customer-42", transaction_id="order-1")
            again = await queue.push({"orderId": 1}, partition="customer-42", transaction_id="order-1")
            assert first.status == "queued" and again.status == "duplicate" and again.message_id == first.message_id
            results = await queue.push_many([{"orderId": 2}, queen_client.Push({"orderId": 3}, partition="other")],
                                            partition="customer-42")
            assert [r.partition for r in results] == ["customer-42", "other"] and all(results)
            delivery = await queue.pop(batch=10)
            assert [m.data for m in delivery.messages] == [{"orderId": 1}, {"orderId": 2}]
            assert delivery.lease_id and delivery.messages[0].retry_count == 0
            assert (await delivery.messages[0].ack()).success
            failed = await delivery.messages[1].fail("boom")
            assert failed.lease_released and failed.retry_count == 1
            redelivered = await queue.pop(partition="customer-42")
            assert redelivered.messages[0].data == {"orderId": 2} and redelivered.messages[0].retry_count == 1
            assert not await queue.pop(partition="customer-42")  # leased: nothing more now
            assert (await queue.pop(wait="100ms", partition="nothing")).reason == "timeout"

    run(backend, body)


def test_both_consume_acks_each_message_and_leaving_releases_the_rest(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            await queue.push_many(range(5), partition="p")
            seen = []
            async with aclosing(queue.consume(batch=5, wait="1s")) as messages:
                async for message in messages:
                    seen.append(message.data)
                    if len(seen) == 3:
                        break
            assert seen == [0, 1, 2]
            # 0 and 1 were acked when the loop asked for the next one. The loop was left while 2
            # was its current message: as after an exception, it was not acked, and the lease was
            # released at once, so 2, 3 and 4 are the next consumer's, retry counts unchanged.
            rest = await queue.pop(batch=10)
            assert [m.data for m in rest.messages] == [2, 3, 4] and rest.messages[0].retry_count == 0

    run(backend, body)


def test_both_process_acks_failed_on_an_exception_and_the_dlq_takes_a_poison_message(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            await queue.configure(retryLimit=1)
            await queue.push_many(["ok-1", "poison", "ok-2"], partition="p")
            handled = []

            async def handler(message):
                handled.append((message.data, message.retry_count))
                if message.data == "poison":
                    raise ValueError("cannot parse")
                if message.data == "ok-2":
                    cancel.cancel()

            with anyio.CancelScope() as cancel:
                await queue.process(handler, batch=3, wait="1s")
            assert handled == [("ok-1", 0), ("poison", 0), ("poison", 1), ("ok-2", 0)]
            [entry] = [e async for e in queue.dlq()]
            assert entry["data"] == "poison" and entry["error"] == "cannot parse" and entry["retryCount"] == 2
            assert (await queue.info())["messages"] == 1  # only the DLQ entry is left

    run(backend, body)


def test_both_a_handlers_error_wrapped_by_its_own_nursery_is_the_dlq_entrys_error(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            await queue.configure(retryLimit=0)
            await queue.push("poison")

            stop = anyio.Event()

            async def handler(message):
                stop.set()  # after this message
                async with anyio.create_task_group() as tasks:  # raises ExceptionGroup([ValueError])
                    async def parse():
                        raise ValueError(f"cannot parse {message.data!r}")

                    tasks.start_soon(parse)

            await queue.process(handler, wait="1s", stop=stop, handle_signals=False)
            [entry] = [e async for e in queue.dlq()]
            assert entry["error"] == "cannot parse 'poison'"  # not "unhandled errors in a TaskGroup (1 sub-exception)"

    run(backend, body)


def test_push_refuses_a_list_rather_than_guess_and_push_many_is_the_same_in_a_transaction(server, unique):
    with queen_client.SyncClient(server.url) as client:
        queue = client.queue(unique)
        before = client.statistics()["requests"]
        for ambiguous in ([{"data": {"order": 1}}], ("a", "b")):  # the Queen MQ client's items; a tuple
            with pytest.raises(TypeError, match=r"push_many\(\[a, b\]\) appends each item as a message"):
                queue.push(ambiguous)
        assert client.statistics()["requests"] == before  # nothing was sent
        assert [r.status for r in queue.push_many([[1, 2]])] == ["queued"]  # one message whose payload is a list
        assert client.transaction().queue(unique).push_many(["a", "b"]).commit().success
        assert client.transaction().queue(unique).push(["c"]).commit().success  # the Queen MQ client's spelling
        assert [m.data for m in queue.pop(batch=10, auto_ack=True).messages] == [[1, 2], "a", "b", "c"]
        with pytest.raises(TypeError, match=r"a transaction's push takes a list of items"):
            client.transaction().queue(unique).push({"order": 1})


def test_both_the_consumer_extends_its_lease_while_a_message_is_handled(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            await queue.configure(leaseTimeSeconds=1)
            await queue.push("slow")
            async with aclosing(queue.consume(wait="1s")) as messages:
                async for message in messages:
                    # Another consumer parks on the server for 2.5 s, past the 1 s lease twice over:
                    # it gets nothing, since the consumer's lease is extended all along.
                    other = await queue.pop(wait="2500ms")
                    assert not other.messages and other.reason == "timeout"
                    result = await message.ack()
                    assert result.success and not result.already  # the lease held all along
                    break

    run(backend, body)


def test_the_sync_client_pushes_consumes_and_processes(server, unique):
    with queen_client.SyncClient(server.url) as client:
        queue = client.queue(unique)
        assert queue.push("a", partition="p") and queue.push("b", partition="p")
        got = []
        for message in queue.consume(batch=2, wait="1s"):
            got.append(message.data)
            if len(got) == 2:
                break
        assert got == ["a", "b"]
        # "a" was acked when the loop asked for "b"; the loop was left on "b", so it came back.
        delivery = queue.pop(partition="p")
        assert delivery.messages[0].data == "b" and delivery.messages[0].ack().success
        queue.push("bad")

        class Stop(BaseException):  # an Exception would count as the message failing, again and again
            pass

        def handler(message):
            if message.retry_count:
                raise Stop
            raise RuntimeError("first try fails")

        with pytest.raises(Stop):
            queue.process(handler, wait="1s")
        assert queue.info()["messages"] == 1


def _route_count(server, route: str, method: str) -> float:
    prefix = f'queen_http_request_duration_seconds_count{{route="{route}",method="{method}"'
    return sum(value for name, value in server.metrics().items() if name.startswith(prefix))


def test_both_consume_gets_each_next_delivery_with_its_ack(backend, server, unique):
    """In steady state a consumer's step is one request: its ack carries `next`, so it pops only
    to start (and when a next brings nothing)."""
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            await queue.push_many(list(range(40)))
            pops = _route_count(server, "/api/v1/pop/queue/{queue}", "GET")
            acks = _route_count(server, "/api/v1/ack/batch", "POST")
            seen = []
            async with aclosing(queue.consume(batch=2, wait="1s")) as messages:
                async for message in messages:
                    seen.append(message.data)
                    if len(seen) == 40:
                        break
            assert seen == list(range(40))
            assert _route_count(server, "/api/v1/ack/batch", "POST") - acks == 20  # one per delivery
            assert _route_count(server, "/api/v1/pop/queue/{queue}", "GET") - pops == 1  # the first only

    run(backend, body)


def test_both_a_stopping_consumer_takes_no_lease_with_its_last_ack(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            queue = client.queue(unique)
            await queue.push_many(list(range(10)))
            stop = anyio.Event()
            handled = []

            def handler(message):
                handled.append(message.data)
                if len(handled) == 3:
                    stop.set()

            await queue.process(handler, batch=1, wait="1s", stop=stop, handle_signals=False)
            assert handled == [0, 1, 2]
            page = await client._transport.call("GET", f"/api/v1/resources/queues/{unique}/partitions", None, safe=True)
            [group] = page["items"][0]["groups"]
            assert group["lease"] is None and group["inFlight"] == 0 and group["pending"] == 7, group

    run(backend, body)
