"""A bug inside a step: an operation that raises before producing any record fails its request
alone (500, logged with its traceback) and the server goes on taking writes; one that raises after
producing records stops writes until a restart (memory may hold what the log does not), and the
server goes on answering, with 503s that say so.

The bug is a requeue whose list of messages raises while it is read (a stand-in for any failure
inside a transition), sent through the router as the HTTP layer would."""

import pytest

from queen.core.queue_ops import QueueAdmin
from queen.errors import QueenError
from queen.testing import HttpClient, open_server


class ExplodingItems:
    """A requeue's (partition id, offset) items: yields `good`, then raises."""

    def __init__(self, good):
        self.good = good

    def __iter__(self):
        yield from self.good
        raise RuntimeError("a bug in a transition")


async def dead_lettered(client: HttpClient) -> tuple[int, int]:
    """A message in the DLQ of queue q: (partitionId, offset)."""
    status, _ = await client.request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1}]})
    assert status == 200
    status, popped = await client.request("GET", "/api/v1/pop/queue/q?batch=1")
    [message] = popped["messages"]
    status, acked = await client.request("POST", "/api/v1/ack", {
        "partitionId": message["partitionId"], "leaseId": message["leaseId"], "offset": message["offset"],
        "status": "dlq"})
    assert status == 200 and acked["success"], acked
    return message["partitionId"], message["offset"]


async def test_an_operation_that_fails_before_any_record_fails_alone(tmp_path, autojump_clock, caplog):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        entry = await dead_lettered(client)
        with pytest.raises(QueenError) as raised:
            await server.router.run_queue("q", QueueAdmin("requeue", "q", group="__QUEUE_MODE__",
                                                          items=ExplodingItems([])))
        assert raised.value.http_status == 500 and raised.value.code == "internal"
        [line] = [r for r in caplog.records if "event=operation_failed" in r.getMessage()]
        assert line.exc_info is not None and "a bug in a transition" in str(line.exc_info[1])
        assert (await client.request("GET", "/healthz"))[0] == 200
        status, body = await client.request("PUT", "/api/v1/kv/app/after", {"value": 2, "forever": True})
        assert status == 200 and body["applied"] is True
        # The entry it never reached is still in the DLQ, and a real requeue takes it.
        status, body = await client.request("POST", "/api/v1/dlq/requeue", {
            "queue": "q", "items": [{"partitionId": entry[0], "offset": entry[1]}]})
        assert status == 200 and body["results"][0]["requeued"] is True, body


async def test_an_operation_that_fails_after_producing_records_stops_writes(
        tmp_path, autojump_clock, caplog):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        entry = await dead_lettered(client)
        with pytest.raises(QueenError) as raised:
            await server.router.run_queue("q", QueueAdmin("requeue", "q", group="__QUEUE_MODE__",
                                                          items=ExplodingItems([entry])))
        assert raised.value.http_status == 500
        assert any("event=step_failed" in r.getMessage() and r.exc_info for r in caplog.records)
        status, body = await client.request("PUT", "/api/v1/kv/app/other", {"value": 1, "forever": True})
        assert status == 503 and body["code"] == "not_durable"
        # Memory holds the half-applied requeue, which will never be durable: a read, which waits for
        # every version before it, is refused rather than shown it; health says why.
        status, body = await client.request("GET", "/api/v1/kv/app/other")
        assert status == 503 and body["code"] == "not_durable"
        status, body = await client.request("GET", "/healthz")
        assert status == 503 and body["status"] == "failed", body
