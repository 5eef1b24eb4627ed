"""The router: splits a call's operations by shard, sends each part to its actor, and reassembles
the results in order once every part is applied and durable.

The shard of a row is a stable hash of (ns, key); for lock rows (`queen-locks / name#slot`) only the
name counts, so every slot of one lock lives on one shard.
"""

from __future__ import annotations

import zlib

import trio

from queen.core.kv import LOCKS_NS, KvOp, encode_cursor
from queen.core.locks import LockOp
from queen.core.txn import apply_transaction
from queen.errors import Unavailable
from queen.runtime.shard_actor import ABANDON, OPS, TICK, WAIT, Call, ShardActor

_ns_seeds: dict[str, int] = {}
_NS_SEEDS_MAX = 4096  # namespaces are few; past this, hash without the cache rather than grow it


def shard_of(ns: str, key: str, shard_count: int) -> int:
    """crc32 of ns, NUL, key: stable, and cheap with the namespace's part computed once."""
    if ns == LOCKS_NS:
        key = key.partition("#")[0]
    seed = _ns_seeds.get(ns)
    if seed is None:
        seed = zlib.crc32(ns.encode() + b"\x00")
        if len(_ns_seeds) < _NS_SEEDS_MAX:
            _ns_seeds[ns] = seed
    return zlib.crc32(key.encode(), seed) % shard_count


class Router:
    def __init__(self, actors: list[ShardActor], writer, clock):
        self.actors = actors
        self.shard_count = len(actors)
        self.writer = writer
        self.clock = clock
        self.draining = False

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
            await _send(self.actors[shard], (OPS, call, work))
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
                for key, item in zip(op.keys, pieces, strict=True):
                    item["key"] = key
                results[position] = {"items": pieces}
        out = results[: len(ops)]
        for position, op in enumerate(ops):
            result = out[position]
            result["index"] = position
            result["op"] = op.op
        return out

    async def run_locks(self, ops: list[LockOp], wait_gone=None) -> list[dict]:
        """Lock operations, grouped by the shard of each name. Acquires with waitMs go one per
        message, since each may park; if `wait_gone` returns (the client hung up), the parked
        ones are answered "cancelled" instead of being handed a permit nobody would use."""
        if any(op.op != "get" for op in ops):
            self.refuse_writes_if_unavailable()
        count = self.shard_count
        parts: dict[int, list] = {}
        waits = []
        for position, op in enumerate(ops):
            shard = shard_of(LOCKS_NS, op.name, count)
            if op.op == "acquire" and op.wait_ms:
                waits.append((shard, position, op))
            else:
                parts.setdefault(shard, []).append((position, op))
        call = Call(len(ops), len(parts) + len(waits))
        for shard, work in parts.items():
            await _send(self.actors[shard], (OPS, call, work))
        for shard, position, op in waits:
            await _send(self.actors[shard], (WAIT, call, (position, op)))
        if waits and wait_gone is not None:
            async with trio.open_nursery() as nursery:
                async def abandon_when_gone():
                    await wait_gone()
                    for shard in {shard for shard, _, _ in waits}:
                        await _send(self.actors[shard], (ABANDON, call, None))

                nursery.start_soon(abandon_when_gone)
                await call.done.wait()
                nursery.cancel_scope.cancel()
        else:
            await call.done.wait()
        if call.error is not None:
            raise call.error
        results = call.results
        for position, op in enumerate(ops):
            result = results[position]
            result["index"] = position
            result["op"] = op.op
        return results

    async def run_transaction(self, ops: list[KvOp]) -> dict:
        """All or nothing, as one WAL submit (one frame). Applied in one synchronous step across
        the shards it touches: on one thread that is atomic by construction, where a two-phase
        exchange between actors could deadlock against another transaction."""
        if any(op.op != "get" and op.op != "check" for op in ops):
            self.refuse_writes_if_unavailable()
        count = self.shard_count
        states = [self.actors[shard_of(op.ns, op.key, count)].state.kv for op in ops]
        effects: list = []
        answer, wait_version = apply_transaction(ops, states, self.clock.now_ms(), effects)
        if effects:
            self.writer.submit(effects)
        await self.wait_durable(wait_version)
        return answer

    async def list_permits(self, prefix: str, cursor: str | None, limit: int) -> dict:
        """The admin's page of held permits across every shard, in name order."""
        op = KvOp("getPrefix", LOCKS_NS)
        op.prefix, op.cursor, op.limit = prefix, cursor, limit
        op.detail = True
        page = (await self.run_kv([op], has_writes=False))[0]
        items = []
        for item in page["items"]:
            name, _, slot = item["key"].rpartition("#")
            items.append({"name": name, "slot": int(slot), "owner": item["value"], "token": item["version"],
                          "fence": item["createVersion"], "since": item["createdAt"],
                          "renewedAt": item["updatedAt"], "expiresAt": item["expiresAt"]})
        return {"items": items, "cursor": page["cursor"]}

    async def wait_durable(self, version: int) -> None:
        waiter = Call(0, 0)
        self.writer.when_durable(version, waiter)
        await waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error


async def _send(actor: ShardActor, message) -> None:
    """Queue a message for an actor. send_nowait first: `await send` always passes through the
    scheduler, a task switch per request that the caller pays again when it waits for the answer
    anyway; only a full queue (backpressure) needs the awaiting form."""
    try:
        actor.send_channel.send_nowait(message)
    except trio.WouldBlock:
        await actor.send_channel.send(message)


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
