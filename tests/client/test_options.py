"""Options take their Python names and the wire's alike (`retry_limit=3` is `retryLimit=3`), and a
misspelt one raises TypeError saying which was meant, before anything is sent."""

import pytest

import queen_client
from queen.core.queue_ops import OPTIONS
from queen_client.options import QUEUE_OPTIONS, snake


def test_the_sdk_knows_every_queue_option_the_server_has():
    assert QUEUE_OPTIONS == tuple(OPTIONS)


def test_configure_takes_python_names_and_the_wires(server, unique):
    with queen_client.SyncClient(server.url) as client:
        queue = client.queue(unique)
        assert queue.configure(retry_limit=7, lease_time_seconds=30, dlq_after_max_retries=False)["retryLimit"] == 7
        options = queue.configure(retryLimit=8, maxSize=10)
        assert (options["retryLimit"], options["leaseTimeSeconds"], options["maxSize"]) == (8, 30, 10)
        assert not options["dlqAfterMaxRetries"]
        assert set(options) == set(QUEUE_OPTIONS)  # the answer as the wire spells it
        every = {snake(name): OPTIONS[name][0] for name in QUEUE_OPTIONS}
        assert queue.configure(**every) == {name: spec[0] for name, spec in OPTIONS.items()}


@pytest.mark.parametrize("misspelt, meant", [("retry_limt", "retry_limit"), ("retryLimt", "retryLimit"),
                                             ("RetryLimit", "retryLimit"), ("lease_time", "lease_time_seconds")])
def test_a_misspelt_queue_option_says_what_was_meant_and_sends_nothing(server, unique, misspelt, meant):
    with queen_client.SyncClient(server.url) as client:
        before = client.statistics()["requests"]
        with pytest.raises(TypeError, match=rf"^Queue\.configure\(\) has no option '{misspelt}': did you mean '{meant}'\?$"):
            client.queue(unique).configure(**{misspelt: 3})
        with pytest.raises(TypeError, match="twice"):
            client.queue(unique).configure(retry_limit=3, retryLimit=3)
        assert client.statistics()["requests"] == before


def test_push_and_pop_take_the_wires_names(server, unique):
    with queen_client.SyncClient(server.url) as client:
        queue = client.queue(unique)
        assert queue.push({"n": 1}, transactionId="order-1", traceId="t-1").status == "queued"
        assert queue.push({"n": 1}, transaction_id="order-1").status == "duplicate"  # the same option
        delivery = queue.pop(consumerGroup="mailer", waitMs=1000, autoAck=True)
        [message] = delivery.messages
        assert message.consumer_group == "mailer" and message.trace_id == "t-1" and message.lease_id is None
        assert not queue.pop(group="mailer", wait=0, auto_ack=True).messages


def test_a_misspelt_call_option_says_what_was_meant_and_sends_nothing(server, unique):
    with queen_client.SyncClient(server.url) as client:
        queue = client.queue(unique)
        before = client.statistics()["requests"]
        with pytest.raises(TypeError, match=r"^Queue\.push\(\) has no option 'transactionID': did you mean 'transactionId'\?"):
            queue.push({"n": 1}, transactionID="x")
        with pytest.raises(TypeError, match=r"did you mean 'group'\?"):
            queue.pop(grup="mailer")
        with pytest.raises(TypeError, match=r"did you mean 'waitMs'\?"):
            queue.consume(wait_ms=100)  # refused at the call, before the loop starts
        with pytest.raises(TypeError, match=r"did you mean 'ttlSeconds'\?"):
            client.kv.put(unique, "k", 1, ttl_seconds=5)
        with pytest.raises(TypeError, match=r"did you mean 'delay'\?"):
            client.timers.schedule(unique, "k", {}, dealy="1m")
        assert client.statistics()["requests"] == before
        assert client.kv.put(unique, "k", 1, ttlSeconds=5).applied
        assert client.timers.schedule(unique, "k", {}, delayMs=60_000).scheduled
