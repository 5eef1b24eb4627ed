"""`python -m bench.inproc`: the core's parse+apply in one process, no server, no disk: microseconds
per operation for KV puts and gets, lock acquire+release, queue push, pop+ack and transaction steps
(through State.apply), and the HTTP request parser per request.
Prints whether the compiled core is loaded (queen/_native.py; QUEEN_PURE=1 forces the .py files). Best of --repeat runs, so a loaded host
inflates figures less; for A/B on a shared machine prefer callgrind's instruction counts:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.inproc --repeat 1 --steps 50
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import orjson

from queen.core.kv import KvState, VersionCounter, parse_kv_ops
from queen.core.limits import Limits

T0 = 1_700_000_000_000
LIMITS = Limits()
CALLGRIND = False  # --callgrind: zero callgrind's counters where a driver's timing starts, dump where it ends


def _mark(command: str) -> float:
    if CALLGRIND:
        subprocess.run(["callgrind_control", command, str(os.getpid())], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter()


def kv_put(steps: int, ops: int) -> float:
    """Seconds for `steps` batches of `ops` puts (body decode + parse + apply), as the KV route does."""
    state = KvState(VersionCounter(), T0)
    bodies = [orjson.dumps({"operations": [{"op": "put", "ns": "bench", "key": f"k{(s * ops + i) % 10000}",
                                            "value": {"n": i}, "ttlSeconds": 60} for i in range(ops)]})
              for s in range(steps)]
    start = _mark("-z")
    records: list = []
    for step, body in enumerate(bodies):
        now = T0 + step
        for op in parse_kv_ops(orjson.loads(body)["operations"], LIMITS):
            state.apply(op, now, records)
        records.clear()
    return _mark("-d") - start


def kv_get(steps: int, ops: int) -> float:
    """Seconds for `steps` batches of `ops` gets of present keys (body decode + parse + apply)."""
    state = KvState(VersionCounter(), T0)
    records: list = []
    fill = [{"op": "put", "ns": "bench", "key": f"k{i}", "value": {"n": i}, "ttlSeconds": 60} for i in range(10000)]
    for op in parse_kv_ops(fill, Limits(ops_per_call_max=len(fill))):
        state.apply(op, T0, records)
    bodies = [orjson.dumps({"operations": [{"op": "get", "ns": "bench", "key": f"k{(s * ops + i) % 10000}"}
                                           for i in range(ops)]})
              for s in range(steps)]
    start = _mark("-z")
    for step, body in enumerate(bodies):
        now = T0 + step
        for op in parse_kv_ops(orjson.loads(body)["operations"], LIMITS):
            state.apply(op, now, records)
    return _mark("-d") - start


def kv_get_answer(steps: int, ops: int) -> float:
    """kv-get and the answer's encoding, as the KV route answers a JSON client: a read's value is
    the row's stored JSON, so what it costs shows only once the answer is encoded."""
    from queen.core.values import json_default
    state = KvState(VersionCounter(), T0)
    records: list = []
    fill = [{"op": "put", "ns": "bench", "key": f"k{i}", "value": {"id": i, "name": f"item {i}", "score": i / 7,
                                                                  "tags": ["a", "b"]}, "ttlSeconds": 60}
            for i in range(10000)]
    for op in parse_kv_ops(fill, Limits(ops_per_call_max=len(fill))):
        state.apply(op, T0, records)
    bodies = [orjson.dumps({"operations": [{"op": "get", "ns": "bench", "key": f"k{(s * ops + i) % 10000}"}
                                           for i in range(ops)]})
              for s in range(steps)]
    start = time.perf_counter()
    for step, body in enumerate(bodies):
        now = T0 + step
        results = [state.apply(op, now, records) for op in parse_kv_ops(orjson.loads(body)["operations"], LIMITS)]
        orjson.dumps({"results": results}, default=json_default)
    return time.perf_counter() - start


def lock_cycle(steps: int, ops: int) -> float:
    """Seconds for `steps` batches of `ops` lock acquire+release pairs (parse + apply)."""
    from queen.core.locks import LockTable, parse_lock_ops
    locks = LockTable(KvState(VersionCounter(), T0), T0)
    acquires = [{"op": "acquire", "name": f"l{i}", "ttlSeconds": 30, "owner": "w"} for i in range(ops)]
    start = _mark("-z")
    records: list = []
    for step in range(steps):
        now = T0 + step
        tokens = [locks.apply(op, now, records) for op in parse_lock_ops(acquires, LIMITS)]
        releases = [{"op": "release", "name": f"l{i}", "token": t["token"]} for i, t in enumerate(tokens)]
        for op in parse_lock_ops(releases, LIMITS):
            locks.apply(op, now, records)
        records.clear()
    return _mark("-d") - start


def lock_owned_cycle(steps: int, ops: int) -> float:
    """Seconds for `steps` batches of `ops` acquire+renew+release triples that name their owner and
    slot, as the SDK's handles send them (parse + apply): every renew and release reads the permit's
    owner."""
    from queen.core.locks import LockTable, parse_lock_ops
    locks = LockTable(KvState(VersionCounter(), T0), T0)
    acquires = [{"op": "acquire", "name": f"l{i}", "ttlSeconds": 30, "owner": f"host-{i % 7}:4242:5f3c9a1e"}
                for i in range(ops)]
    start = _mark("-z")
    records: list = []
    for step in range(steps):
        now = T0 + step
        granted = [locks.apply(op, now, records) for op in parse_lock_ops(acquires, LIMITS)]
        renews = [{"op": "renew", "name": a["name"], "slot": g["slot"], "token": g["token"], "ttlSeconds": 30,
                   "owner": a["owner"]} for a, g in zip(acquires, granted, strict=True)]
        renewed = [locks.apply(op, now, records) for op in parse_lock_ops(renews, LIMITS)]
        releases = [{"op": "release", "name": a["name"], "slot": r["slot"], "token": r["token"], "owner": a["owner"]}
                    for a, r in zip(acquires, renewed, strict=True)]
        for op in parse_lock_ops(releases, LIMITS):
            locks.apply(op, now, records)
        records.clear()
    return _mark("-d") - start


def http_parse(steps: int, ops: int) -> float:
    """Seconds for `steps * ops` parses of a plain POST request."""
    from queen.config import Config
    from queen.http.wire import parse_simple_request
    config = Config()
    body = b'{"operations":[{"op":"get","ns":"a","key":"b"}]}'
    data = (b"POST /api/v1/kv HTTP/1.1\r\nHost: 127.0.0.1:6632\r\nContent-Type: application/json\r\n"
            b"Accept: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    start = _mark("-z")
    for _ in range(steps * ops):
        parse_simple_request(data, config)
    return _mark("-d") - start


# -- queues and transactions: through State.apply, as the shard actors and the router call it -------

QUEUE = "bq"
NEXT_QUEUE = "bq-next"
PARTITIONS = 64
PAYLOAD = {"v": "v" * 32}


def _queue_state(preload: int):
    """A 4-shard State (the default) with QUEUE configured as the bench's runs make it, holding
    `preload` messages spread over its partitions, and NEXT_QUEUE."""
    from queen.core.queue_ops import Configure, Push, parse_push
    from queen.core.state import Ops, State
    state = State(4, T0)
    for queue in (QUEUE, NEXT_QUEUE):
        _ops(state, queue, Configure(queue, {"leaseTimeSeconds": 300, "maxSize": 100_000_000}), T0)
    limits = Limits(ops_per_call_max=1000)
    for start in range(0, preload, 1000):
        items = [{"queue": QUEUE, "partition": f"p{m % PARTITIONS:02d}", "payload": PAYLOAD, "transactionId": f"pre-{m}"}
                 for m in range(start, min(start + 1000, preload))]
        _ops(state, QUEUE, Push(parse_push({"items": items}, limits)), T0)
    return state, Ops


def _ops(state, queue: str, op, now: int):
    from queen.core.placement import shard_of_queue
    from queen.core.state import Ops
    applied = state.apply(Ops(shard_of_queue(queue, state.shard_count), [(None, 0, op)]), now)
    return applied.answers[0][2]


def _answer(result) -> dict:
    """The answer as its client reads it: encoded by the server, decoded by the client."""
    from queen.core.values import json_default
    return orjson.loads(orjson.dumps(result, default=json_default))


def queue_push(steps: int, ops: int) -> float:
    """Seconds for `steps` push requests of `ops` items, each with its own producer id, spread over
    the partitions (bench.queue_sessions.QueenPush): body decode + parse + apply + answer encode."""
    from queen.core.queue_ops import Push, parse_push
    state, _ = _queue_state(0)
    bodies = [orjson.dumps({"items": [{"queue": QUEUE, "partition": f"p{(s * ops + i) % PARTITIONS:02d}",
                                       "payload": PAYLOAD, "transactionId": f"t-{s}-{i}"} for i in range(ops)]})
              for s in range(steps)]
    start = _mark("-z")
    for step, body in enumerate(bodies):
        _answer(_ops(state, QUEUE, Push(parse_push(orjson.loads(body), LIMITS)), T0 + step))
    return _mark("-d") - start


def _pop(state, ops: int, now: int) -> dict:
    from queen.core.queue_ops import parse_pop
    doc = _answer(_ops(state, QUEUE, parse_pop(QUEUE, None, {"batch": str(ops)}, LIMITS), now))
    assert doc["success"], doc
    return doc


def queue_cycle(steps: int, ops: int) -> float:
    """Seconds for `steps` cycles of a pop of up to `ops` messages and the batch ack of all of them
    (bench.queue_sessions.QueenCycle)."""
    from queen.core.queue_ops import Acks, parse_acks
    state, _ = _queue_state(steps * ops + PARTITIONS)
    start = _mark("-z")
    for step in range(steps):
        now = T0 + step
        doc = _pop(state, ops, now)
        body = orjson.dumps({"acknowledgments": [
            {"partitionId": doc["partitionId"], "leaseId": doc["leaseId"], "offset": m["offset"], "status": "completed"}
            for m in doc["messages"]]})
        answers = _answer(_ops(state, QUEUE, Acks(parse_acks(orjson.loads(body), LIMITS)), now))
        assert all(a["success"] for a in answers), answers
    return _mark("-d") - start


def txn_step(steps: int, ops: int) -> float:
    """Seconds for `steps` workflow steps (bench.queue_sessions.QueenTxnStep): a pop of up to `ops`
    messages, then one transaction that acks them, pushes each one's successor to NEXT_QUEUE and
    upserts one KV row per message."""
    from queen.core.state import Transaction
    from queen.core.txn import parse_transaction
    state, _ = _queue_state(steps * ops + PARTITIONS)
    start = _mark("-z")
    for step in range(steps):
        now = T0 + step
        doc = _pop(state, ops, now)
        messages = doc["messages"]
        body = orjson.dumps({
            "ack": [{"partitionId": doc["partitionId"], "leaseId": doc["leaseId"], "transactionId": m["transactionId"]}
                    for m in messages],
            "push": [{"queue": NEXT_QUEUE, "partition": m["partition"], "transactionId": f"{m['transactionId']}-next",
                      "payload": {"step": 2, "from": m["transactionId"]}} for m in messages],
            "kv": [{"op": "put", "ns": "orders", "key": f"k{(step * ops + i) % 10000}",
                    "value": {"step": 2, "from": m["transactionId"]}, "forever": True} for i, m in enumerate(messages)]})
        txn = parse_transaction(orjson.loads(body), LIMITS, now)
        answer = _answer(state.apply(Transaction(txn, None), now).answers[0][2])
        assert answer["success"], answer
    return _mark("-d") - start


DRIVERS = {"kv-put": kv_put, "kv-get": kv_get, "kv-get-answer": kv_get_answer, "lock-cycle": lock_cycle,
           "lock-owned-cycle": lock_owned_cycle,
           "http-parse": http_parse, "queue-push": queue_push, "queue-cycle": queue_cycle, "txn-step": txn_step}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.inproc")
    parser.add_argument("--drivers", default=",".join(DRIVERS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ops", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--callgrind", action="store_true",
                        help="running under callgrind: zero the counters before each driver's measured part and dump "
                             "them after it (one dump per driver and repeat, in order)")
    args = parser.parse_args(argv)
    global CALLGRIND
    CALLGRIND = args.callgrind
    import queen.core.kv
    from queen import _native
    print(f"compiled={str(_native.COMPILED).lower()} ({_native.WHY}); queen.core.kv from {queen.core.kv.__file__}")
    for name in args.drivers.split(","):
        best = min(DRIVERS[name](args.steps, args.ops) for _ in range(args.repeat))
        print(f"{name}: {best / (args.steps * args.ops) * 1e6:.2f} µs/op (best of {args.repeat})")


if __name__ == "__main__":
    main()
