"""Workloads as data: what a run does, on which systems, and what it counts.

Owns: the table of named workloads. A workload names the unit its headline rate counts (ops,
pairs, renewals, answers, messages) and, per system family, how a connection's conversation is
built: a `Session` factory for the raw-socket generator (Queen and the baseline over HTTP, Redis
over RESP) or the workload's name in the Go loader (bench/peers/peerload: etcd, PostgreSQL, NATS,
and queue-latency for every system). A workload a family lacks is reported as "n/a" for it, never
silently left out. Nothing here opens a socket or reads a clock.

Key layout, shared by every KV workload so that a preload serves any connection count: the key
space is `keys_total` keys "k00000".."k{keys_total-1}" in namespace "bench". Connection i of C
starts at key i * keys_total // C and walks forward, wrapping, `ops` keys per request; so the
connections write disjoint stretches, no request repeats a key (while keys_total // C >= ops),
and the number of rows stays bounded at keys_total however long the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from bench import queue_sessions as q
from bench import sessions as s
from bench.sessions import Context, http_post, key_groups, key_name, resp_command

NS = s.KV_NS
KEYS_TOTAL = 10_000
# Long enough that no row expires during a run (expiry would turn puts into inserts mid-run), and
# still a TTL: every put goes through the timing wheel as a real client's would.
TTL_SECONDS = s.KV_TTL_S
VALUE = s.VALUE
# Requests each connection pre-encodes and then cycles through; bounded so 64-op bodies for many
# connections stay a few MB.
RING_REQUESTS_MAX = 1024

# Systems, and the family (driver) each belongs to. Both Redis systems speak the same protocol;
# only the server's persistence settings differ.
# A Queen cluster (bench/cluster.py) is driven as Queen is: through its leader.
FAMILY = {"queen": "queen", "queen-cluster2": "queen", "baseline": "baseline", "redis-aof": "redis",
          "redis-mem": "redis", "etcd": "etcd", "postgres": "postgres", "nats": "nats"}
SYSTEM_ORDER = ("queen", "queen-cluster2", "baseline", "redis-aof", "redis-mem", "etcd", "postgres",
                "nats")  # run order within one shape
# Consumers of queue-cycle and queue-latency (and producers of queue-latency): the shape,
# 16 consumers over 64 partitions, whatever --connections says.
QUEUE_CONSUMERS = 16
# The pop batch of a queue-latency consumer: it takes what has arrived, up to this many.
LATENCY_POP_BATCH = 64
# timer-fire: timers per schedule request (and the consumers' pop batch), and how many timers fall
# due per second when --timer-rate does not say.
TIMER_FIRE_BATCH = 64
TIMER_FIRE_RATE = 5000


@dataclass(frozen=True)
class Workload:
    name: str
    unit: str  # what the headline rate counts: ops, pairs, renewals, answers, txns
    description: str
    # family -> Session factory (ctx -> Session) for the socket generator, or a str: the workload's
    # name in the Go etcd loader.
    drivers: dict = field(default_factory=dict)
    preload: bool = False  # write every key once before measuring (reads must find what they ask for)
    fixed_ops: int | None = None  # one shape whatever --ops says
    # Units besides the headline one that the report shows as rates (hand-overs, timeouts).
    extra_units: tuple = ()
    fixed_connections: int | None = None  # one connection count whatever --connections says
    queue: bool = False  # the run has its own queue, made before it starts and deleted after
    preload_queue: bool = False  # ... holding enough messages for the whole run (queue-cycle)
    # The -ops the Go loader is given instead of the run's ops (queue-latency: its pop batch, while
    # every push carries one message).
    loader_ops: int | None = None
    next_queue: bool = False  # ... and a second queue it pushes into (txn-step), made and deleted alike
    # timer-fire: the far-future timers pending in the server while the run measures; one run per
    # --timer-pending value, named after it ("timer-fire pending=1M"). 0 for every other workload.
    timer_pending: int = 0

    @property
    def target(self) -> str:  # the system of a single-system workload (the baseline)
        return next(iter(self.drivers))


def operation(op: str, key: str) -> dict:
    if op == "put":
        return {"op": "put", "ns": NS, "key": key, "value": VALUE, "ttlSeconds": TTL_SECONDS}
    if op == "get":
        return {"op": "get", "ns": NS, "key": key}
    raise ValueError(f"no encoder for op {op!r}")


def kv_request(host: str, port: int, op: str, keys: list[str]) -> bytes:
    return http_post(host, port, "/api/v1/kv", orjson.dumps({"operations": [operation(op, key) for key in keys]}))


def _queen_ring(op: str, needle: bytes):
    def build(ctx: Context):
        ring = [kv_request(ctx.host, ctx.port, op, keys) for keys in key_groups(ctx, RING_REQUESTS_MAX)]
        return s.RingSession(ctx, ring, needle)
    build.__qualname__ = f"queen_{op}_ring"
    return build


def _baseline(ctx: Context):
    # The same bytes as a 1-op kv-put; the baseline answers each with a fixed document.
    ring = [kv_request(ctx.host, ctx.port, "put", keys) for keys in key_groups(ctx, RING_REQUESTS_MAX)]
    return s.RingSession(ctx, ring, None)


def _redis_put(ctx: Context):
    ring = [b"".join(resp_command("SET", f"{NS}/{k}", VALUE, "PX", TTL_SECONDS * 1000) for k in keys)
            for keys in key_groups(ctx, RING_REQUESTS_MAX)]
    return s.RedisRing(ctx, ring, lambda reply: reply == b"OK")


def _redis_get(ctx: Context):
    ring = [b"".join(resp_command("GET", f"{NS}/{k}") for k in keys) for keys in key_groups(ctx, RING_REQUESTS_MAX)]
    return s.RedisRing(ctx, ring, lambda reply: reply is not None)


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("baseline-http", "ops",
             "the kv-put 1-op request answered with a fixed document by Queen's own HTTP layer (bench/baseline_http.py): the per-request ceiling",
             {"baseline": _baseline}, fixed_ops=1),
    Workload("lock-cycle", "pairs",
             "acquire `ops` free locks on distinct names in one call, release them in the next with the slot and token "
             "each acquire answered; a pair = acquire + release",
             {"queen": s.QueenLockCycle, "redis": s.RedisLockCycle, "etcd": "lock-cycle"}, extra_units=("acquired",)),
    Workload("lock-renew", "renewals",
             "renew `ops` held locks per call, each with the token the last renew answered",
             {"queen": s.QueenLockRenew, "redis": s.RedisLockRenew, "etcd": "lock-renew"}),
    Workload("lock-hot", "answers",
             "every connection acquires the same lock, fail-fast: held answers at once and the client asks again; "
             "a grant is released at once. answers = acquire answers/s, acquired = hand-overs/s",
             {"queen": s.QueenContended, "redis": s.RedisContended, "etcd": "lock-hot"}, fixed_ops=1,
             extra_units=("acquired", "pairs")),
    Workload("lock-hot-wait", "acquired",
             f"every connection acquires the same lock with waitMs {s.WAIT_MS}: the server parks it and hands the lock "
             "over when the holder releases (Queen only: the peers have no waiting acquire)",
             {"queen": s.QueenHotWait}, fixed_ops=1, extra_units=("answers", "pairs", "timeouts")),
    Workload("sem8", "pairs",
             f"a semaphore of {s.SEMAPHORE_PERMITS} permits, every connection acquiring it fail-fast and releasing each "
             "grant at once; pairs = permits granted and released per second",
             {"queen": s.QueenSemaphore, "redis": s.RedisSemaphore, "etcd": "sem8"}, fixed_ops=1,
             extra_units=("answers", "acquired")),
    Workload("sem8-wait", "pairs",
             f"the semaphore of {s.SEMAPHORE_PERMITS} with waitMs {s.WAIT_MS}: refused acquires park and are handed a "
             "permit when one frees (Queen only)",
             {"queen": s.QueenSemaphoreWait}, fixed_ops=1, extra_units=("answers", "acquired", "timeouts")),
    Workload("kv-put", "ops", "put with a TTL on distinct keys (rows bounded by the key space)",
             {"queen": _queen_ring("put", b'"applied":true'), "redis": _redis_put, "etcd": "kv-put"}),
    Workload("kv-get", "ops", "get of preloaded keys",
             {"queen": _queen_ring("get", b'"found":true'), "redis": _redis_get, "etcd": "kv-get"}, preload=True),
    Workload("kv-cas", "ops",
             "compare-and-set on the connection's own keys: each put expects the version (Redis: the value) the last "
             "answer gave, so every one applies",
             {"queen": s.QueenKvCas, "redis": s.RedisKvCas, "etcd": "kv-cas"}),
    Workload("txn-guarded", "txns",
             "hold a lock; commit transactions of its guard + `ops` puts (Redis: one script that checks the owner, "
             "then sets; etcd: a txn comparing the lock key's value)",
             {"queen": s.QueenGuardedTxn, "redis": s.RedisGuardedTxn, "etcd": "txn-guarded"}),
    Workload("queue-push", "messages",
             f"push `ops` messages per request, each with its own producer id, spread over {q.PARTITIONS} partitions "
             "(Redis: XADD ×ops pipelined, no dedupe; PostgreSQL: one multi-row INSERT .. ON CONFLICT DO NOTHING; "
             "NATS: ops async publishes with a Msg-Id, then their acks)",
             {"queen": q.QueenPush, "redis": q.RedisStreamPush, "postgres": "queue-push", "nats": "queue-push"},
             queue=True),
    Workload("queue-cycle", "messages",
             f"{QUEUE_CONSUMERS} consumers over {q.PARTITIONS} preloaded partitions: pop up to `ops` messages, ack "
             "them in one batch, repeat (Redis: XREADGROUP + XACK; PostgreSQL: UPDATE .. FOR UPDATE SKIP LOCKED "
             "RETURNING, then DELETE; NATS: pull consumer Fetch + acks)",
             {"queen": q.QueenCycle, "redis": q.RedisStreamCycle, "postgres": "queue-cycle", "nats": "queue-cycle"},
             fixed_connections=QUEUE_CONSUMERS, queue=True, preload_queue=True, extra_units=("empty",)),
    Workload("queue-peak", "messages",
             f"{QUEUE_CONSUMERS} producers push one message per request, closed loop; {QUEUE_CONSUMERS} consumers "
             f"parked on long-poll pops (up to {LATENCY_POP_BATCH}) take and ack them: the highest end-to-end rate. "
             "Latency = push → delivery per message (Go loader, every system)",
             {"queen": "queue-latency", "redis": "queue-latency", "postgres": "queue-latency", "nats": "queue-latency"},
             fixed_ops=1, fixed_connections=QUEUE_CONSUMERS, queue=True, loader_ops=LATENCY_POP_BATCH,
             extra_units=("pushed", "redelivered")),
    Workload("queue-latency", "messages",
             "queue-peak's flow with the producers paced at half the rate queue-peak measured (open loop: a late "
             "push keeps its schedule, so lateness counts); latency = push → delivery per message",
             {"queen": "queue-latency", "redis": "queue-latency", "postgres": "queue-latency", "nats": "queue-latency"},
             fixed_ops=1, fixed_connections=QUEUE_CONSUMERS, queue=True, loader_ops=LATENCY_POP_BATCH,
             extra_units=("pushed", "redelivered")),
    Workload("txn-step", "steps",
             f"{QUEUE_CONSUMERS} consumers over {q.PARTITIONS} preloaded partitions: pop up to `ops` messages, then ONE "
             "transaction that acks them, pushes each one's successor to a second queue and upserts a KV row per "
             "message (PostgreSQL: BEGIN; SELECT .. FOR UPDATE SKIP LOCKED; INSERT the successors; INSERT .. ON "
             "CONFLICT DO UPDATE the KV rows; DELETE the popped rows; COMMIT)",
             {"queen": q.QueenTxnStep, "postgres": "txn-step"},
             fixed_connections=QUEUE_CONSUMERS, queue=True, preload_queue=True, next_queue=True, extra_units=("empty",)),
    Workload("queue-cycle-next", "messages",
             "queue-cycle with each ack batch carrying `next`: the ack and the next pop in one request and one "
             "fsync (Queen only)",
             {"queen": q.QueenCycleNext},
             fixed_connections=QUEUE_CONSUMERS, queue=True, preload_queue=True, extra_units=("empty",)),
    Workload("txn-step-next", "steps",
             "txn-step with each transaction carrying `next`: the step and the next pop in one request and one "
             "fsync (Queen only)",
             {"queen": q.QueenTxnStepNext},
             fixed_connections=QUEUE_CONSUMERS, queue=True, preload_queue=True, next_queue=True, extra_units=("empty",)),
    Workload("timer-schedule", "timers",
             "schedule `ops` timers per request an hour ahead, every key new, spread over the partitions: pending "
             "timers grow for the whole run (Queen only: no peer has durable timers)",
             {"queen": q.QueenTimerSchedule}, queue=True),
    Workload("timer-fire", "fires",
             f"far-future timers pending (--timer-pending) while paced producers schedule timers "
             f"{TIMER_FIRE_BATCH} per request, 200-1000 ms ahead, so --timer-rate fall due per second; "
             f"{QUEUE_CONSUMERS} consumers long-poll the queue they fire into. Histogram = fire lateness "
             "(message createdAt - the timer's at, both the server's clock), in ms (Go loader; Queen only)",
             {"queen": "timer-fire"}, fixed_ops=TIMER_FIRE_BATCH, fixed_connections=QUEUE_CONSUMERS, queue=True,
             extra_units=("scheduled", "redelivered")),
)}


def preload_requests(host: str, port: int, keys_total: int = KEYS_TOTAL, ops: int = 500) -> list[bytes]:
    """Queen puts that create every key of the key space once, `ops` per request."""
    return [kv_request(host, port, "put", [key_name(k) for k in range(start, min(start + ops, keys_total))])
            for start in range(0, keys_total, ops)]


def redis_preload_commands(keys_total: int = KEYS_TOTAL) -> list[bytes]:
    return [resp_command("SET", f"{NS}/{key_name(k)}", VALUE, "PX", TTL_SECONDS * 1000) for k in range(keys_total)]
