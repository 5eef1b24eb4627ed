"""`python -m bench.inproc`: the core's parse+apply in one process, no server, no disk: microseconds
per operation for KV puts and gets and lock acquire+release, and the HTTP request parser per request.
Prints whether the compiled core is loaded (queen/_native.py; QUEEN_PURE=1 forces the .py files). Best of --repeat runs, so a loaded host
inflates figures less; for A/B on a shared machine prefer callgrind's instruction counts:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.inproc --repeat 1 --steps 50
"""

from __future__ import annotations

import argparse
import time

import orjson

from queen.core.kv import KvState, VersionCounter, parse_kv_ops
from queen.core.limits import Limits

T0 = 1_700_000_000_000
LIMITS = Limits()


def kv_put(steps: int, ops: int) -> float:
    """Seconds for `steps` batches of `ops` puts (body decode + parse + apply), as the KV route does."""
    state = KvState(VersionCounter(), T0)
    bodies = [orjson.dumps({"operations": [{"op": "put", "ns": "bench", "key": f"k{(s * ops + i) % 10000}",
                                            "value": {"n": i}, "ttlSeconds": 60} for i in range(ops)]})
              for s in range(steps)]
    start = time.perf_counter()
    records: list = []
    for step, body in enumerate(bodies):
        now = T0 + step
        for op in parse_kv_ops(orjson.loads(body)["operations"], LIMITS):
            state.apply(op, now, records)
        records.clear()
    return time.perf_counter() - start


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
    start = time.perf_counter()
    for step, body in enumerate(bodies):
        now = T0 + step
        for op in parse_kv_ops(orjson.loads(body)["operations"], LIMITS):
            state.apply(op, now, records)
    return time.perf_counter() - start


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
    start = time.perf_counter()
    records: list = []
    for step in range(steps):
        now = T0 + step
        tokens = [locks.apply(op, now, records) for op in parse_lock_ops(acquires, LIMITS)]
        releases = [{"op": "release", "name": f"l{i}", "token": t["token"]} for i, t in enumerate(tokens)]
        for op in parse_lock_ops(releases, LIMITS):
            locks.apply(op, now, records)
        records.clear()
    return time.perf_counter() - start


def http_parse(steps: int, ops: int) -> float:
    """Seconds for `steps * ops` parses of a plain POST request."""
    from queen.config import Config
    from queen.http.wire import parse_simple_request
    config = Config()
    body = b'{"operations":[{"op":"get","ns":"a","key":"b"}]}'
    data = (b"POST /api/v1/kv HTTP/1.1\r\nHost: 127.0.0.1:6632\r\nContent-Type: application/json\r\n"
            b"Accept: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    start = time.perf_counter()
    for _ in range(steps * ops):
        parse_simple_request(data, config)
    return time.perf_counter() - start


DRIVERS = {"kv-put": kv_put, "kv-get": kv_get, "kv-get-answer": kv_get_answer, "lock-cycle": lock_cycle, "http-parse": http_parse}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.inproc")
    parser.add_argument("--drivers", default=",".join(DRIVERS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ops", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    import queen.core.kv
    from queen import _native
    print(f"compiled={str(_native.COMPILED).lower()} ({_native.WHY}); queen.core.kv from {queen.core.kv.__file__}")
    for name in args.drivers.split(","):
        best = min(DRIVERS[name](args.steps, args.ops) for _ in range(args.repeat))
        print(f"{name}: {best / (args.steps * args.ops) * 1e6:.2f} µs/op (best of {args.repeat})")


if __name__ == "__main__":
    main()
