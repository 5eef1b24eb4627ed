"""The queue workloads' conversations for Queen (HTTP) and Redis Streams (RESP), and what a run
needs in place before it starts (the queue, its consumer group, the preloaded messages).

Owns: the layout every system follows, so their figures compare. A run's queue is named after its
tag (Queen `bq-<tag>`, Redis streams `bq:<tag>:<p>`), so runs never meet. It has PARTITIONS
partitions; a push of `ops` items spreads them over the partitions (item i of a connection's n-th
request goes to partition (connection + n*ops + i) % PARTITIONS) and gives each a unique producer
id. A cycle consumer pops up to `ops` messages and acks exactly those before its next pop.
Queen's consumers share the queue through leases (a pop takes the ready partition whose oldest
message is oldest); a Redis consumer owns the partitions p with p % connections == its index, the
usual way to keep a stream partition's order with XREADGROUP (one reader per stream).

Two workloads build on the queue: txn-step (pop a message, then one transaction that acks it,
pushes its successor to the run's "next" queue and upserts a KV row) and timer-schedule (timers
set an hour ahead in the run's queue, so they stay pending until the queue is deleted with them).

The PostgreSQL and NATS JetStream sides, queue-latency for every system, and timer-fire (Queen
only) are in the Go loader (bench/peers/peerload), with the same layout.

Never: opens a socket on its own (the servers module sends the setup) or hides an error.
"""

from __future__ import annotations

import itertools

import orjson

from bench import sessions
from bench.sessions import (
    Context,
    RedisSession,
    Session,
    _count,
    _sample,
    http_post,
    key_groups,
    resp_command,
)

PARTITIONS = 64
PAYLOAD = {"v": "v" * 32}
# Items per preload request: few round trips, well inside a push's item limit.
PRELOAD_BATCH = 1000
# The lease a cycle's pop takes: far longer than any run, so no lease ends under a consumer.
LEASE_SECONDS = 300
# Room for every message a session pushes (the default maxSize of a queue is a million).
QUEUE_MAX_SIZE = 100_000_000
REDIS_GROUP = "g"
# txn-step: the KV namespace its upserts go to (rows bounded by the key space, as in the KV
# workloads), and what each step writes there and pushes on.
TXN_NS = "orders"
# timer-schedule: far enough ahead that no timer falls due during a run (they go with the queue).
TIMER_FAR_MS = 3_600_000
TIMER_PAYLOAD = {"n": 1}


def queue_name(tag: str) -> str:
    return f"bq-{tag}"


def next_queue_name(tag: str) -> str:
    """Where txn-step pushes each popped message's successor."""
    return f"bq-{tag}-next"


def partition_name(p: int) -> str:
    return f"p{p:02d}"


def stream_key(tag: str, p: int) -> str:
    return f"bq:{tag}:{p}"


def http_get(host: str, port: int, path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: %s:%d\r\n%s\r\n" % (path.encode(), host.encode(), port, sessions.AUTH_HEADER)


def http_request(method: str, host: str, port: int, path: str, body: bytes = b"") -> bytes:
    return (b"%s %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
            % (method.encode(), path.encode(), host.encode(), port, len(body), sessions.AUTH_HEADER)) + body


def owned_partitions(ctx: Context) -> list[int]:
    if ctx.connections > PARTITIONS:
        raise ValueError(f"a queue cycle has at most {PARTITIONS} consumers (one partition each at least)")
    return [p for p in range(PARTITIONS) if p % ctx.connections == ctx.connection]


# -- Queen ---------------------------------------------------------------------------------------


def queen_configure(host: str, port: int, tag: str, queue: str | None = None) -> bytes:
    body = {"queue": queue or queue_name(tag), "options": {"leaseTimeSeconds": LEASE_SECONDS, "maxSize": QUEUE_MAX_SIZE}}
    return http_post(host, port, "/api/v1/configure", orjson.dumps(body))


def queen_delete(host: str, port: int, tag: str, queue: str | None = None) -> bytes:
    return http_request("DELETE", host, port, f"/api/v1/resources/queues/{queue or queue_name(tag)}")


def queen_preload(host: str, port: int, tag: str, messages: int) -> list[bytes]:
    """Push requests that put `messages` messages in the run's queue, spread evenly over its partitions."""
    queue, out = queue_name(tag), []
    for start in range(0, messages, PRELOAD_BATCH):
        items = [{"queue": queue, "partition": partition_name(m % PARTITIONS), "payload": PAYLOAD,
                  "transactionId": f"{tag}-pre-{m}"} for m in range(start, min(start + PRELOAD_BATCH, messages))]
        out.append(http_post(host, port, "/api/v1/push", orjson.dumps({"items": items})))
    return out


class QueenPush(Session):
    """Push `ops` messages per request, each with its own producer id (what Queen MQ's client
    sends: every push is then deduplicated), spread over the partitions. Counts messages queued."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.queue = queue_name(ctx.tag)
        self.partitions = [partition_name(p) for p in range(PARTITIONS)]
        self.prefix = f"{ctx.tag}-{ctx.connection}-"
        self.sent = itertools.count()

    def request(self) -> bytes:
        ctx, n = self.ctx, next(self.sent)
        first = ctx.connection + n * ctx.ops
        items = [{"queue": self.queue, "partition": self.partitions[(first + i) % PARTITIONS], "payload": PAYLOAD,
                  "transactionId": f"{self.prefix}{n}-{i}"} for i in range(ctx.ops)]
        return http_post(ctx.host, ctx.port, "/api/v1/push", orjson.dumps({"items": items}))

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            return
        queued = bytes(body).count(b'"status":"queued"')
        if queued != self.ctx.ops:
            tally.error("not_queued", _sample(body))
        if counting:
            _count(tally, "messages", queued)


class QueenCycle(Session):
    """Pop up to `ops` messages (one partition, under a lease), then ack them all `completed` in one
    batch. Counts messages acked; an empty pop means the preload ran out (an error: the run then
    measured a drained queue). Subclasses change what follows a pop (follow_up) and how its answer
    counts (settled)."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.pop = http_get(ctx.host, ctx.port, f"/api/v1/pop/queue/{queue_name(ctx.tag)}?batch={ctx.ops}")
        self.next: bytes | None = None  # the request that settles the last pop, when one is due
        self.expected = 0

    def reset(self) -> None:
        self.next = None  # what was popped comes back when its lease ends

    def owes_release(self) -> bool:
        return self.next is not None

    def request(self) -> bytes:
        return self.pop if self.next is None else self.next

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            self.next = None
            return
        if self.next is None:
            self._popped(body, tally, counting)
            return
        self.settled(bytes(body), tally, counting)
        self.next = None

    def settled(self, body: bytes, tally, counting) -> None:
        acked = body.count(b'"success":true')
        if acked != self.expected:
            tally.error("ack_lost", _sample(body))
        if counting:
            _count(tally, "messages", acked)

    def _popped(self, body, tally, counting) -> None:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            tally.error("bad_body", _sample(body))
            return
        if not doc.get("success"):
            if counting:
                _count(tally, "empty", 1)
            tally.error("ran_dry", f"pop answered {doc.get('reason')!r}: the preload ran out; raise --queue-preload")
            return
        self.expected = len(doc["messages"])
        self.next = self.follow_up(doc)

    def follow_up(self, doc: dict) -> bytes:
        acks = [{"partitionId": doc["partitionId"], "leaseId": doc["leaseId"], "offset": m["offset"],
                 "status": "completed"} for m in doc["messages"]]
        return http_post(self.ctx.host, self.ctx.port, "/api/v1/ack/batch", orjson.dumps({"acknowledgments": acks}))


class QueenTxnStep(QueenCycle):
    """A workflow step: pop up to `ops` messages (one partition, under a lease), then ONE
    transaction that acks them (by transactionId), pushes each one's successor to the next queue
    (same partition, producer id = the popped id + "-next", so a retried step is deduplicated)
    and upserts one KV row per message (`forever`: no TTL). Counts steps (messages carried
    through); a transaction answering success:false (lease_lost, ...) is an error, and so is an
    empty pop (the preload ran out)."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.next_queue = next_queue_name(ctx.tag)
        self.key_groups = key_groups(ctx, 64)
        self.position = 0

    def settled(self, body: bytes, tally, counting) -> None:
        if not body.startswith(b'{"success":true'):
            tally.error("txn_failed", _sample(body))
        elif counting:
            _count(tally, "steps", self.expected)

    def follow_up(self, doc: dict) -> bytes:
        return http_post(self.ctx.host, self.ctx.port, "/api/v1/transaction", orjson.dumps(self.settle_document(doc)))

    def settle_document(self, doc: dict) -> dict:
        partition_id, lease_id, messages = doc["partitionId"], doc["leaseId"], doc["messages"]
        keys = self.key_groups[self.position]
        self.position = (self.position + 1) % len(self.key_groups)
        txn = {
            "ack": [{"partitionId": partition_id, "leaseId": lease_id, "transactionId": m["transactionId"]}
                    for m in messages],
            "push": [{"queue": self.next_queue, "partition": m["partition"], "transactionId": f"{m['transactionId']}-next",
                      "payload": {"step": 2, "from": m["transactionId"]}} for m in messages],
            "kv": [{"op": "put", "ns": TXN_NS, "key": key, "value": {"step": 2, "from": m["transactionId"]},
                    "forever": True} for key, m in zip(keys, messages, strict=False)],
        }
        return txn


class _RidesNext:
    """A consumer whose step carries `next`: the ack or transaction that settles a delivery asks for
    the next one in the same request, so in steady state a step is one request (and one fsync)
    where the plain workloads take two. It pops only to start and when a next brought nothing."""

    draining = False

    def owes_release(self) -> bool:
        # The generator asks this only once the window has ended: from then on a settle takes no
        # next delivery, else every ack would bring another message to settle and the drain
        # would never end.
        self.draining = True
        return super().owes_release()

    def follow_up(self, doc: dict) -> bytes:
        document = self.settle_document(doc)
        if not self.draining:
            document["next"] = {"queue": queue_name(self.ctx.tag), "batch": self.ctx.ops}
        return http_post(self.ctx.host, self.ctx.port, self.settle_path, orjson.dumps(document))

    def answer(self, status, body, tally, counting) -> None:
        if status != 200 or self.next is None:
            super().answer(status, body, tally, counting)
            return
        doc = orjson.loads(body)
        self.settled_doc(doc, body, tally, counting)
        following = (doc.get("next") if type(doc) is dict else None) or {}  # a batch ack without next: a list
        if following.get("success"):
            self.expected = len(following["messages"])
            self.next = self.follow_up(following)
        else:
            self.next = None  # nothing came with it: pop (and find the preload ran out, if it did)


class QueenCycleNext(_RidesNext, QueenCycle):
    """queue-cycle, each ack batch carrying `next`."""

    settle_path = "/api/v1/ack/batch"

    def settle_document(self, doc: dict) -> dict:
        return {"acknowledgments": [{"partitionId": doc["partitionId"], "leaseId": doc["leaseId"], "offset": m["offset"],
                                     "status": "completed"} for m in doc["messages"]]}

    def settled_doc(self, doc: dict, body, tally, counting) -> None:
        results = doc["results"] if type(doc) is dict else doc  # the draining settle asked no next: a list
        acked = sum(1 for result in results if result.get("success"))
        if acked != self.expected:
            tally.error("ack_lost", _sample(body))
        if counting:
            _count(tally, "messages", acked)


class QueenTxnStepNext(_RidesNext, QueenTxnStep):
    """txn-step, each transaction carrying `next`."""

    settle_path = "/api/v1/transaction"

    def settled_doc(self, doc: dict, body, tally, counting) -> None:
        if not doc.get("success"):
            tally.error("txn_failed", _sample(body))
        elif counting:
            _count(tally, "steps", self.expected)


class QueenTimerSchedule(Session):
    """Schedule `ops` timers per request in the run's queue, each under a key no request repeats,
    an hour ahead, spread over the partitions: pending timers grow for the whole run (deleting the
    queue afterwards drops them). Counts timers whose answer says scheduled:true and not replaced."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.queue = queue_name(ctx.tag)
        self.partitions = [partition_name(p) for p in range(PARTITIONS)]
        self.prefix = f"{ctx.tag}-{ctx.connection}-"
        self.sent = itertools.count()

    def request(self) -> bytes:
        ctx, n = self.ctx, next(self.sent)
        first = ctx.connection + n * ctx.ops
        ops = [{"op": "schedule", "queue": self.queue, "key": f"{self.prefix}{n}-{i}",
                "partition": self.partitions[(first + i) % PARTITIONS], "delayMs": TIMER_FAR_MS,
                "payload": TIMER_PAYLOAD} for i in range(ctx.ops)]
        return http_post(ctx.host, ctx.port, "/api/v1/timers", orjson.dumps({"operations": ops}))

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            return
        raw = bytes(body)
        scheduled = raw.count(b'"scheduled":true')
        if scheduled != self.ctx.ops or b'"replaced":true' in raw:
            tally.error("not_scheduled", _sample(body))
        if counting:
            _count(tally, "timers", scheduled)


# -- Redis Streams -------------------------------------------------------------------------------


def redis_queue_setup(tag: str) -> list[bytes]:
    """A consumer group reading each partition's stream from its start (created with the stream)."""
    return [resp_command("XGROUP", "CREATE", stream_key(tag, p), REDIS_GROUP, "0", "MKSTREAM") for p in range(PARTITIONS)]


def redis_preload(tag: str, messages: int) -> list[bytes]:
    return [resp_command("XADD", stream_key(tag, m % PARTITIONS), "*", "tid", f"{tag}-pre-{m}", "v", PAYLOAD["v"])
            for m in range(messages)]


def redis_delete(tag: str) -> list[bytes]:
    return [resp_command("DEL", *[stream_key(tag, p) for p in range(PARTITIONS)])]


class RedisStreamPush(RedisSession):
    """`ops` XADDs pipelined in one write, spread over the partitions' streams. Redis has no
    producer-id dedupe; the id rides along as a field so the stored bytes match."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.replies = ctx.ops
        self.keys = [stream_key(ctx.tag, p) for p in range(PARTITIONS)]
        self.prefix = f"{ctx.tag}-{ctx.connection}-"
        self.sent = itertools.count()

    def request(self) -> bytes:
        ctx, n = self.ctx, next(self.sent)
        first = ctx.connection + n * ctx.ops
        return b"".join(resp_command("XADD", self.keys[(first + i) % PARTITIONS], "*", "tid", f"{self.prefix}{n}-{i}",
                                     "v", PAYLOAD["v"]) for i in range(ctx.ops))

    def answer(self, status, replies, tally, counting) -> None:
        added = sum(1 for reply in replies if isinstance(reply, bytes) and b"-" in reply)
        if added != len(replies):
            tally.error("not_added", _sample(replies))
        if counting:
            _count(tally, "messages", added)


class RedisStreamCycle(RedisSession):
    """XREADGROUP up to `ops` new entries of one owned stream (its partitions in turn), then XACK
    them. Counts entries acked."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        consumer = f"c{ctx.connection}"
        self.keys = [stream_key(ctx.tag, p) for p in owned_partitions(ctx)]
        self.reads = [resp_command("XREADGROUP", "GROUP", REDIS_GROUP, consumer, "COUNT", ctx.ops, "STREAMS", key, ">")
                      for key in self.keys]
        self.position = 0
        self.next: bytes | None = None
        self.expected = 0

    def reset(self) -> None:
        self.next = None

    def owes_release(self) -> bool:
        return self.next is not None

    def request(self) -> bytes:
        if self.next is not None:
            return self.next
        read = self.reads[self.position]
        self.position = (self.position + 1) % len(self.reads)
        return read

    def answer(self, status, replies, tally, counting) -> None:
        reply = replies[0]
        if isinstance(reply, str):  # a RESP error
            tally.error("resp_error", reply[:300])
            self.next = None
            return
        if self.next is None:
            if not reply:
                if counting:
                    _count(tally, "empty", 1)
                tally.error("ran_dry", "XREADGROUP answered nothing: the preload ran out; raise --queue-preload")
                return
            [[key, entries]] = reply
            ids = [entry[0] for entry in entries]
            self.expected = len(ids)
            self.next = resp_command("XACK", key, REDIS_GROUP, *ids)
            return
        if reply != self.expected:
            tally.error("ack_lost", _sample(replies))
        if counting and isinstance(reply, int):
            _count(tally, "messages", reply)
        self.next = None
