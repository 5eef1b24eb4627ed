"""kv-fill: how long CPython's full collections pause a big KV store, and what a key costs in memory.

In-process, on one shard's KvState (queen/core/kv.py), so the figures are the store's own: no
HTTP, no WAL, no other allocations of a server competing for the collector. Like `queen serve`
(queen/cli/serve.py) it calls gc.freeze() once everything is imported, so the modules are out of
the collector's sight and what a full collection walks is what the store built.

    python -m bench.kv_fill                  # 5,000,000 keys
    python -m bench.kv_fill --keys 200000    # a quick look

Steps: fill N keys through parse_kv_ops + apply in batches of 64 puts (half with a one-day
ttlSeconds, so the TTL wheel holds them, half forever; values are small JSON documents with a
nested list), read one prefix page so the ordered index exists, then run --ops more operations
(puts of existing keys, gets, new keys) with the collector on its default thresholds, timing every
generation-2 collection through gc.callbacks, and time one explicit gc.collect() at the end.
Prints a JSON line of the figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time

from queen.core.kv import KvState, VersionCounter, parse_kv_ops
from queen.core.limits import Limits

T0 = 1_700_000_000_000
BATCH = 64
DAY_S = 86_400


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def value_of(i: int) -> dict:
    return {"id": i, "name": f"user-{i}", "score": i % 1000, "tags": ["a", "b"]}


def put_op(i: int) -> dict:
    lifetime = {"ttlSeconds": DAY_S} if i % 2 else {"forever": True}
    return {"op": "put", "ns": "app", "key": f"user:{i:09d}", "value": value_of(i), **lifetime}


class Gen2Pauses:
    """Wall time of every generation-2 collection, from the collector's own start/stop callbacks."""

    def __init__(self):
        self.pauses_ms: list[float] = []
        self._started = 0

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.pauses_ms.append((time.perf_counter_ns() - self._started) / 1e6)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_fill", description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=5_000_000, help="keys to fill (5,000,000)")
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations after the fill (1,000,000)")
    args = parser.parse_args(argv)

    limits = Limits()
    gc.collect()
    gc.freeze()  # as queen serve does: what is imported stays out of every collection
    state = KvState(VersionCounter(), T0)
    now = T0
    records: list = []
    rss_before = rss_bytes()

    started = time.perf_counter()
    for first in range(0, args.keys, BATCH):
        ops = parse_kv_ops([put_op(i) for i in range(first, min(first + BATCH, args.keys))], limits,
                           values_checked=True)
        for op in ops:
            state.apply(op, now, records)
        records.clear()
        now += 1
        if first % (BATCH * 1024) == 0:
            state.expire(now)
    fill_s = time.perf_counter() - started
    state.expire(now)
    page = parse_kv_ops([{"op": "getPrefix", "ns": "app", "prefix": "user:", "limit": 10}], limits)[0]
    state.apply(page, now, records)  # builds the ordered index a paged store keeps
    gc.collect()
    rss_after = rss_bytes()

    pauses = Gen2Pauses()
    gc.callbacks.append(pauses)
    started = time.perf_counter()
    for first in range(0, args.ops, BATCH):
        raw = []
        for i in range(first, min(first + BATCH, args.ops)):
            kind = i % 4
            if kind == 0:  # a new key
                raw.append(put_op(args.keys + i))
            elif kind == 1:  # an existing key rewritten
                raw.append(put_op((i * 7919) % args.keys))
            else:
                raw.append({"op": "get", "ns": "app", "key": f"user:{(i * 104729) % args.keys:09d}"})
        for op in parse_kv_ops(raw, limits, values_checked=True):
            state.apply(op, now, records)
        records.clear()
        now += 1
        if first % (BATCH * 16) == 0:
            state.expire(now)
    mixed_s = time.perf_counter() - started
    during = list(pauses.pauses_ms)
    gc.collect()
    explicit_ms = pauses.pauses_ms[-1]
    gc.callbacks.remove(pauses)

    figures = {
        "keys": args.keys,
        "put_us_per_op": round(fill_s / args.keys * 1e6, 3),
        "rss_bytes_per_key": round((rss_after - rss_before) / args.keys, 1),
        "rss_mib": round(rss_after / 2**20, 1),
        "mixed_ops": args.ops,
        "mixed_us_per_op": round(mixed_s / max(args.ops, 1) * 1e6, 3),
        "gen2_collections_during_ops": len(during),
        "gen2_max_ms_during_ops": round(max(during, default=0.0), 2),
        "gen2_explicit_collect_ms": round(explicit_ms, 2),
        "tracked_objects": len(gc.get_objects()),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
