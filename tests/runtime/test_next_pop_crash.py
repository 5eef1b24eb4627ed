"""A consumer's ack and the lease its `next` takes are one log entry: SIGKILL a real `queen serve`
while consumers step through their queues with ack + next, restart it, and every queue shows
either both (the message completed and the next one leased) or neither (the message still
leased), never an ack without its next lease; and every step that was answered is there."""

import threading

from queen.testing import ServerProcess

CONSUMERS = 4
MESSAGES = 2_000
STEPS_BEFORE_KILL = 30


def consume(server, queue: str, answered: dict, stop: threading.Event) -> None:
    """Steps ack + next until the server dies; answered[queue]: the last offset whose ack answered."""
    try:
        status, got = server.request("GET", f"/api/v1/pop/queue/{queue}")
        assert status == 200 and got["messages"], got
        message = got["messages"][0]
        while not stop.is_set():
            status, body = server.request("POST", "/api/v1/ack", {
                "partitionId": message["partitionId"], "leaseId": message["leaseId"], "offset": message["offset"],
                "next": {}})
            assert status == 200 and body["success"] is True, body
            answered[queue] = message["offset"]
            message = body["next"]["messages"][0]
    except (OSError, ConnectionError):
        return  # the server was killed under us


def test_an_ack_and_its_next_lease_survive_a_crash_together(tmp_path):
    data_dir = str(tmp_path / "data")
    server = ServerProcess(data_dir).start()
    try:
        queues = [f"crash{i}" for i in range(CONSUMERS)]
        for queue in queues:
            status, _ = server.request("POST", "/api/v1/configure", {"queue": queue, "options": {"leaseTimeSeconds": 3600}})
            assert status == 200
            for start in range(0, MESSAGES, 500):
                status, _ = server.request("POST", "/api/v1/push", {"items": [
                    {"queue": queue, "payload": i} for i in range(start, start + 500)]})
                assert status == 200
        answered: dict = {}
        stop = threading.Event()
        threads = [threading.Thread(target=consume, args=(server, queue, answered, stop)) for queue in queues]
        for thread in threads:
            thread.start()
        try:
            for _ in range(6_000):  # until every consumer made some steps (a busy machine is slow)
                if len(answered) == CONSUMERS and min(answered.values()) >= STEPS_BEFORE_KILL:
                    break
                threading.Event().wait(0.01)
            server.kill()  # mid-flight: some acks with next are being applied or written
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert len(answered) == CONSUMERS and min(answered.values()) >= STEPS_BEFORE_KILL, answered
        server.restart()
        for queue in queues:
            status, page = server.request("GET", f"/api/v1/resources/queues/{queue}/partitions")
            assert status == 200, page
            [group] = page["items"][0]["groups"]
            # Both or neither: exactly one message in flight, at the floor, under a live lease.
            assert group["inFlight"] == 1 and group["lease"] is not None, group
            # Every answered step is durable: its message completed.
            assert group["ackFloor"] > answered[queue], (group, answered[queue])
    finally:
        server.kill()
