"""The router: splits a call's operations by shard, sends each part to its actor, and reassembles
the results in order once every part is applied and durable.

The shard of a row is a stable hash of (ns, key); for lock rows (`queen-locks / name#slot`) only the
name counts, so every slot of one lock lives on one shard.
"""

from __future__ import annotations

import zlib

import trio

from queen.core.kv import LOCKS_NS, KvOp, encode_cursor
from queen.errors import Unavailable
from queen.runtime.shard_actor import OPS, RUN, TICK, Call, ShardActor


def shard_of(ns: str, key: str, shard_count: int) -> int:
    if ns == LOCKS_NS:
        key = key.partition("#")[0]
    return zlib.crc32(f"{ns}\x00{key}".encode()) % shard_count


class Router:
    def __init__(self, actors: list[ShardActor], writer):
        self.actors = actors
        self.shard_count = len(actors)
        self.writer = writer
        self.draining = False

    def states(self):
        return [actor.state for actor in self.actors]

    def refuse_writes_if_unavailable(self) -> None:
        if self.writer.failed is not None:
            raise Unavailable("not_durable", "the server cannot make writes durable (disk error); writes are refused until it is restarted",
                              {"cause": str(self.writer.failed)})
        if self.draining:
            raise Unavailable("shutting_down", "the server is shutting down")

    async def run_kv(self, ops: list[KvOp], has_writes: bool) -> list[dict]:
        if has_writes:
            self.refuse_writes_if_unavailable()
        count = self.shard_count
        parts: dict[int, list] = {}
        slots = len(ops)
        # getPrefix asks every shard; getMany asks each key's shard. Their parts get extra result
        # slots past len(ops), merged back into the op's own slot below.
        spread: dict[int, list[int]] = {}
        for position, op in enumerate(ops):
            name = op.op
            if name == "getPrefix":
                for shard in range(count):
                    parts.setdefault(shard, []).append((slots, op))
                    spread.setdefault(position, []).append(slots)
                    slots += 1
            elif name == "getMany" and count > 1:
                for key in op.keys:
                    parts.setdefault(shard_of(op.ns, key, count), []).append((slots, KvOp("get", op.ns, key)))
                    spread.setdefault(position, []).append(slots)
                    slots += 1
            else:
                shard = shard_of(op.ns, op.key if op.key is not None else op.keys[0], count) if count > 1 else 0
                parts.setdefault(shard, []).append((position, op))
        call = Call(slots, len(parts))
        for shard, work in parts.items():
            await self.actors[shard].send_channel.send((OPS, call, work))
        await call.done.wait()
        if call.error is not None:
            raise call.error
        results = call.results
        for position, spread_slots in spread.items():
            op = ops[position]
            pieces = [results[slot] for slot in spread_slots]
            if op.op == "getPrefix":
                results[position] = _merge_prefix_pages(pieces, op.limit)
            else:
                for key, item in zip(op.keys, pieces):
                    item["key"] = key
                results[position] = {"items": pieces}
        out = results[: len(ops)]
        for position, op in enumerate(ops):
            result = out[position]
            result["index"] = position
            result["op"] = op.op
        return out

    async def run_on_shard(self, shard: int, fn, has_writes: bool):
        """Run fn(state, now_ms, effects) inside one shard actor and wait for durability of what it
        wrote or read. Returns what fn stored in call.results[0]."""
        if has_writes:
            self.refuse_writes_if_unavailable()
        call = Call(1, 1)

        def work(state, now_ms, effects):
            call.results[0] = fn(state, now_ms, effects)

        await self.actors[shard].send_channel.send((RUN, call, work))
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.results[0]

    async def wait_durable(self, version: int) -> None:
        waiter = Call(0, 0)
        self.writer.when_durable(version, waiter)
        await waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error


def _merge_prefix_pages(pages: list[dict], limit: int) -> dict:
    items = [item for page in pages for item in page["items"]]
    items.sort(key=lambda item: item["key"])
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "cursor": encode_cursor(items[-1]["key"]) if more else None}


async def send_ticks(actors: list[ShardActor], tick_ms: int) -> None:
    """Every tick, ask each shard to free what expired (the wheel does the bookkeeping)."""
    while True:
        await trio.sleep(tick_ms / 1000)
        for actor in actors:
            try:
                actor.send_channel.send_nowait((TICK, None, None))
            except trio.WouldBlock:
                pass  # a shard that busy will get the next tick; expiry stays exact for readers
