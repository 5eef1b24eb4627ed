"""The total-queue check against a real `queen serve` killed with SIGKILL several times mid-run.

Producers push messages with unique transactionIds (and push some batches twice, as a producer
does that retries after a lost answer); consumers pop and ack most messages `completed`, some
`failed`, and leave some to expire; a thread kills the server at a random moment of each cycle and
it is restarted. Then everything left is drained. The history is checked for:

- lost: an acknowledged push (answered queued or duplicate) that was never delivered;
- duplicated: two message ids for one transactionId (a retried push appended twice);
- delivered after completed: a message delivered to the group again after an ack of it answered
  success (not `already`);
- retries: a delivery that ended without completion (failed ack, or its lease expired, also across
  a restart) is followed by one with a higher retryCount.

The server's lease is 1 s, so the drain waits on real leases of a real process (long-poll pops),
never on a sleep.
"""

import http.client
import json
import random
import threading

from queen.testing import ServerProcess

SEED = 20261130
CYCLES = 4
PER_CYCLE = 120
PARTITIONS = 6
QUEUE = "tq"


def call(server, method, path, body=None, timeout_s=5.0):
    """The decoded answer, or None when the server went away mid-call (outcome unknown)."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout_s)
        connection.request(method, path, body=None if body is None else json.dumps(body),
                           headers={"content-type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        connection.close()
    except OSError:
        return None
    if response.status != 200:
        assert response.status == 503, (response.status, data[:300])  # only a dying server refuses
        return None
    return json.loads(data)


class History:
    def __init__(self):
        self.pushed = {}  # transactionId -> messageId answered
        self.ids = {}  # transactionId -> set of messageIds ever delivered
        self.deliveries = []  # (transactionId, retryCount, sequence)
        self.completed_at = {}  # transactionId -> sequence of the ack that completed it
        self.delivered_after_completed = []
        # transactionId -> (retryCount of a delivery that ended without completion, whether the next
        # delivery must count higher: its own failed ack or its lease's expiry; a lease ended by
        # another message's failed ack returns it unchanged)
        self.ended = {}
        self.retries_seen = 0
        self.sequence = 0

    def delivered(self, message):
        self.sequence += 1
        tid = message["transactionId"]
        self.ids.setdefault(tid, set()).add(message["messageId"])
        if tid in self.completed_at:
            self.delivered_after_completed.append(tid)
        if tid in self.ended:
            retry, strict = self.ended.pop(tid)
            assert message["retryCount"] > retry if strict else message["retryCount"] >= retry, (tid, message, retry)
            self.retries_seen += strict
        self.deliveries.append((tid, message["retryCount"], self.sequence))


def push_batch(server, history, rng, batch):
    items = [{"queue": QUEUE, "partition": f"p{n % PARTITIONS}", "payload": {"n": n}, "transactionId": f"m-{n:05d}"}
             for n in batch]
    for _ in range(2 if rng.random() < 0.25 else 1):  # a retried push: the same ids again
        answer = call(server, "POST", "/api/v1/push", {"items": items})
        if answer is None:
            return
        for item, result in zip(items, answer, strict=True):
            assert result["status"] in ("queued", "duplicate"), result
            previous = history.pushed.setdefault(item["transactionId"], result["messageId"])
            assert previous == result["messageId"], "a retried push appended a second message"


def consume_some(server, history, rng, rounds, wait_ms=0):
    for _ in range(rounds):
        answer = call(server, "GET", f"/api/v1/pop/queue/{QUEUE}?batch=10&partitions=2&waitMs={wait_ms}",
                      timeout_s=5 + wait_ms / 1000)
        if answer is None:
            return
        if not answer["success"]:
            continue
        acks = []
        for message in answer["messages"]:
            history.delivered(message)
            roll = rng.random()
            if roll < 0.75:
                acks.append((message, "completed"))
            elif roll < 0.85:
                acks.append((message, "failed"))
            # else: left unacked; its lease will expire
        failed_partitions = set()
        interrupted = False
        for message, status in acks:
            result = call(server, "POST", "/api/v1/ack", {"partitionId": message["partitionId"],
                                                          "leaseId": message["leaseId"], "offset": message["offset"],
                                                          "status": status})
            tid = message["transactionId"]
            if result is None:
                interrupted = True  # the server died: whether this ack landed is unknown
                failed_partitions.add(message["partitionId"])
                break
            if not result["success"]:
                assert result["reason"] == "lease_lost", result  # an earlier failed ack ended it
                assert message["partitionId"] in failed_partitions, result
            elif status == "completed" and not result.get("already"):
                history.completed_at[tid] = history.sequence
            elif status == "failed":
                history.ended[tid] = (message["retryCount"], True)
                failed_partitions.add(message["partitionId"])
        for message in answer["messages"]:
            tid = message["transactionId"]
            if tid not in history.completed_at and tid not in history.ended:
                expired = message["partitionId"] not in failed_partitions and not interrupted
                history.ended[tid] = (message["retryCount"], expired)
        if interrupted:
            return


def test_no_acknowledged_push_is_lost_or_duplicated_and_completed_messages_never_come_back(tmp_path):
    rng = random.Random(SEED)
    history = History()
    server = ServerProcess(str(tmp_path / "data")).start()
    kills = 0
    try:
        assert call(server, "POST", "/api/v1/configure", {"queue": QUEUE, "options": {
            "leaseTimeSeconds": 1, "retryLimit": 1000}})["configured"]
        for cycle in range(CYCLES):
            batch = list(range(cycle * PER_CYCLE, (cycle + 1) * PER_CYCLE))
            killer = threading.Timer(rng.uniform(0.05, 0.4), server.kill)
            killer.start()
            for start in range(0, PER_CYCLE, 20):
                push_batch(server, history, rng, batch[start:start + 20])
                consume_some(server, history, rng, 2)
                if server.process.poll() is not None:
                    break
            killer.join()
            server.kill()
            kills += 1
            server.start()
            # Whatever the kill interrupted: push what may be missing again, under the same ids.
            for start in range(0, PER_CYCLE, 20):
                push_batch(server, history, rng, batch[start:start + 20])
        for _ in range(200):  # drain: wait on real 1 s leases with long polls
            missing = set(history.pushed) - set(history.completed_at)
            if not missing:
                break
            consume_some(server, history, rng, 1, wait_ms=1500)
    finally:
        server.stop()
    lost = sorted(set(history.pushed) - set(history.ids))
    duplicated = sorted(tid for tid, ids in history.ids.items() if len(ids) > 1)
    never_completed = sorted(set(history.pushed) - set(history.completed_at))
    print(f"total-queue: {len(history.pushed)} pushes acknowledged, {len(history.deliveries)} deliveries, "
          f"{len(history.completed_at)} completed, {history.retries_seen} redeliveries checked for a higher retryCount, "
          f"{kills} SIGKILLs; lost {len(lost)}, duplicated {len(duplicated)}, "
          f"delivered after completed {len(history.delivered_after_completed)}")
    assert not lost and not duplicated and not history.delivered_after_completed and not never_completed
    assert len(history.pushed) == CYCLES * PER_CYCLE and history.retries_seen > 10 and kills == CYCLES


def test_queues_partitions_floors_leases_dlq_and_dedupe_survive_sigkill_and_ids_keep_rising(tmp_path):
    server = ServerProcess(str(tmp_path / "data")).start()
    try:
        call(server, "POST", "/api/v1/configure", {"queue": "orders", "options": {"leaseTimeSeconds": 600}})
        pushed = call(server, "POST", "/api/v1/push", {"items": [
            {"queue": "orders", "partition": p, "payload": n, "transactionId": f"{p}-{n}"}
            for p in ("a", "b") for n in range(4)]})
        first = call(server, "GET", "/api/v1/pop/queue/orders/partition/a?batch=2")
        call(server, "POST", "/api/v1/ack", {"partitionId": first["partitionId"], "leaseId": first["leaseId"],
                                              "offset": 0})
        dead = call(server, "GET", "/api/v1/pop/queue/orders/partition/b?batch=1")
        call(server, "POST", "/api/v1/ack", {"partitionId": dead["partitionId"], "leaseId": dead["leaseId"],
                                              "offset": 0, "status": "dlq", "error": "poison"})
        held = call(server, "GET", "/api/v1/pop/queue/orders/partition/b?batch=1")  # a live lease at the kill
        before = call(server, "GET", "/api/v1/resources/queues/orders/partitions")
        server.kill()
        server.start()
        assert call(server, "GET", "/api/v1/resources/queues/orders/partitions") == before  # offsets, floors, leases
        # The leases still hold until they expire: their acks work, others cannot pop their partitions.
        assert call(server, "GET", "/api/v1/pop/queue/orders/partition/b")["reason"] == "lease_held"
        assert call(server, "POST", "/api/v1/ack", {"partitionId": first["partitionId"], "leaseId": first["leaseId"],
                                                     "offset": 1})["success"]
        assert call(server, "POST", "/api/v1/ack", {"partitionId": held["partitionId"], "leaseId": held["leaseId"],
                                                     "offset": 1})["success"]
        dlq = call(server, "GET", "/api/v1/dlq?queue=orders")
        assert dlq["total"] == 1 and dlq["messages"][0]["error"] == "poison"
        again = call(server, "POST", "/api/v1/push", {"items": [{"queue": "orders", "partition": "a", "payload": 0,
                                                                 "transactionId": "a-0"}]})
        assert again[0]["status"] == "duplicate" and again[0]["messageId"] == pushed[0]["messageId"]
        fresh = call(server, "POST", "/api/v1/push", {"items": [{"queue": "orders", "partition": "a", "payload": 9}]})
        newest_before = max([r["messageId"] for r in pushed] + [first["leaseId"], dead["leaseId"], held["leaseId"]])
        assert fresh[0]["messageId"] > newest_before and fresh[0]["offset"] == 4
        rest = call(server, "GET", "/api/v1/pop/queue/orders/partition/a?batch=10")
        assert [m["offset"] for m in rest["messages"]] == [2, 3, 4] and rest["leaseId"] > newest_before
    finally:
        server.stop()
