"""The router: splits a call's operations by shard, sends each part to its actor, and reassembles
the results in order once every part is applied and durable. Transactions and ticks do not go
through actors: they are steps of their own (queen/runtime/steps.py).
"""

from __future__ import annotations

import trio

from queen.core.kv import LOCKS_NS, KvOp, encode_cursor
from queen.core.locks import LockOp
from queen.core.state import Abandon, Tick, Transaction, shard_of, shard_of_lock
from queen.errors import Unavailable
from queen.runtime.shard_actor import ShardActor
from queen.runtime.steps import Call, StepRunner


class Router:
    def __init__(self, actors: list[ShardActor], steps: StepRunner):
        self.actors = actors
        self.shard_count = len(actors)
        self.steps = steps
        self.writer = steps.writer
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
        slots = len(ops)
        call = Call(0, 0)
        parts: dict[int, list] = {}
        # getPrefix asks every shard; getMany asks each key's shard. Their parts get extra result
        # slots past len(ops), merged back into the op's own slot below.
        spread: dict[int, list[int]] = {}
        for position, op in enumerate(ops):
            name = op.op
            if name == "getPrefix":
                for shard in range(count):
                    parts.setdefault(shard, []).append((call, slots, op))
                    spread.setdefault(position, []).append(slots)
                    slots += 1
            elif name == "getMany" and count > 1:
                for key in op.keys:
                    parts.setdefault(shard_of(op.ns, key, count), []).append((call, slots, KvOp("get", op.ns, key)))
                    spread.setdefault(position, []).append(slots)
                    slots += 1
            else:
                shard = shard_of(op.ns, op.key if op.key is not None else op.keys[0], count) if count > 1 else 0
                parts.setdefault(shard, []).append((call, position, op))
        call.results = [None] * slots
        call.parts_left = slots - len(spread)
        await self._send_parts(parts)
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
        """Lock operations, grouped by the shard of each name. An acquire with waitMs may park; if
        `wait_gone` returns (the client hung up), the parked ones are answered "cancelled" instead
        of being handed a permit nobody would use."""
        if any(op.op != "get" for op in ops):
            self.refuse_writes_if_unavailable()
        count = self.shard_count
        call = Call(len(ops), len(ops))
        parts: dict[int, list] = {}
        waiting_shards = []
        for position, op in enumerate(ops):
            shard = shard_of_lock(op.name, count) if count > 1 else 0
            parts.setdefault(shard, []).append((call, position, op))
            if op.op == "acquire" and op.wait_ms and shard not in waiting_shards:
                waiting_shards.append(shard)
        await self._send_parts(parts)
        if waiting_shards and wait_gone is not None:
            async with trio.open_nursery() as nursery:
                async def abandon_when_gone():
                    await wait_gone()
                    for shard in waiting_shards:
                        await self._send(shard, Abandon(shard, call))

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
        """All or nothing, as one step (so one frame), applied here across the shards it touches:
        on one thread that is atomic by construction, where a two-phase exchange between actors
        could deadlock against another transaction."""
        if any(op.op != "get" and op.op != "check" for op in ops):
            self.refuse_writes_if_unavailable()
        call = Call(1, 1)
        self.steps.run(Transaction(ops, call))
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.results[0]

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

    async def _send_parts(self, parts: dict[int, list]) -> None:
        for shard, items in parts.items():
            await self._send(shard, items)

    async def _send(self, shard: int, message) -> None:
        """send_nowait first: `await send` always passes through the scheduler, a task switch per
        request that the caller pays again when it waits for the answer anyway; only a full queue
        (backpressure) needs the awaiting form."""
        actor = self.actors[shard]
        if not actor.send_nowait(message):
            await actor.send_channel.send(message)


def _merge_prefix_pages(pages: list[dict], limit: int) -> dict:
    items = [item for page in pages for item in page["items"]]
    items.sort(key=lambda item: item["key"])
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "cursor": encode_cursor(items[-1]["key"]) if more else None}


async def tick_forever(steps: StepRunner, tick_ms: int) -> None:
    """Every tick, a Tick step: expiry, hand-overs and timeouts. Applied directly, never queued
    behind operations, and never dropped: a tick that comes late catches up at once."""
    interval_s = tick_ms / 1000
    next_at = trio.current_time()
    while True:
        next_at = max(next_at + interval_s, trio.current_time())
        await trio.sleep_until(next_at)
        steps.run(Tick())
