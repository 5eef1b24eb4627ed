"""The router: splits a call's operations by shard, applies each part as a step of its shard (in the
caller's task: queen/runtime/shard_actor.py), and reassembles the results in order once every part
is applied and durable. Transactions are one step across the shards they touch
(queen/runtime/steps.py), as ticks are (queen/runtime/ticker.py).
"""

from __future__ import annotations

import trio

from queen.core.kv import LOCKS_NS, VERSIONS_WRITABLE_MAX, KvOp, encode_cursor
from queen.core.locks import LockOp
from queen.core.outcomes import Refusal
from queen.core.placement import (
    shard_of,
    shard_of_lease,
    shard_of_lock,
    shard_of_partition,
    shard_of_queue,
)
from queen.core.queue_ops import (
    QUEUE_MODE_GROUP,
    AckItem,
    Acks,
    Configure,
    LeaseCall,
    PopOp,
    Push,
    PushItem,
    QueueAdmin,
)
from queen.core.state import Abandon, Transaction
from queen.core.tenants import is_own, shown
from queen.core.timer_ops import TimerList, TimerOp, Timers
from queen.core.txn import TransactionOps
from queen.errors import BadRequest, QueenError, Unavailable
from queen.runtime.shard_actor import ShardActor
from queen.runtime.steps import Call, StepRunner, versions_exhausted


class Router:
    def __init__(self, actors: list[ShardActor], steps: StepRunner):
        self.actors = actors
        self.shard_count = len(actors)
        self.steps = steps
        self.writer = steps.writer
        self.shared = steps.state.queues  # which queue an ack's partition or a lease is of (placement)
        self.versions = steps.state.versions
        self.usage = self.shared.usage  # what each named tenant holds, for its quotas
        self.draining = False

    def now_ms(self) -> int:
        """The server's clock, as every step reads it (a delayMs becomes an at with it)."""
        return self.steps.clock.now_ms()

    def refuse_writes_if_unavailable(self) -> None:
        """Every call that may write passes here before any part of it is sent, so a refusal
        changes nothing. One comparison for the versions: near their end a call is refused whole
        here, not cut short by the check on each step (queen/runtime/steps.py)."""
        if self.versions.last > VERSIONS_WRITABLE_MAX:
            raise versions_exhausted(self.versions.last)
        if self.writer.failed is not None:
            if isinstance(self.writer.failed, QueenError):
                raise self.writer.failed  # e.g. 503 leader_lost: this node stepped down
            raise Unavailable("not_durable", "the server cannot make writes durable (a disk error, or an internal error: "
                              "see its log); writes are refused until it is restarted", {"cause": str(self.writer.failed)})
        if self.draining:
            raise Unavailable("shutting_down", "the server is shutting down")
        if self.writer.sync_refusal is not None:  # a cluster leader whose sync set is out of reach
            raise self.writer.sync_refusal

    async def run_kv(self, ops: list[KvOp], has_writes: bool, *, from_memory: bool = False) -> list[dict]:
        """from_memory (reads only): answer from memory as soon as the shards have, without waiting
        for durability or a cluster's read barrier: the server's own bookkeeping (tenant pauses),
        on any node, where a row seen a moment before it is durable does no harm."""
        assert not (from_memory and has_writes), "only reads may skip the durability wait"
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
        if from_memory:
            assert not call.parts_left, "a read answers when applied"
            results = call.results
        else:
            results = await call.result()
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

    async def run_locks(self, ops: list[LockOp], wait_gone=None, answer_now=None) -> list[dict]:
        """Lock operations, grouped by the shard of each name. An acquire with waitMs may park; if
        `wait_gone` returns (the client hung up), the parked ones are answered "cancelled" instead
        of being handed a permit nobody would use (`answer_now`: see _wait_or_abandon)."""
        if any(op.op != "get" for op in ops):
            self.refuse_writes_if_unavailable()
        count = self.shard_count
        call = Call(len(ops), len(ops))
        parts: dict[int, list] = {}
        waiting_shards = []
        for position, op in enumerate(ops):
            shard = shard_of_lock(op.ns, op.name, count) if count > 1 else 0
            parts.setdefault(shard, []).append((call, position, op))
            if op.op == "acquire" and op.wait_ms and shard not in waiting_shards:
                waiting_shards.append(shard)
        await self._send_parts(parts)
        # Applied already (_send): a hang-up watcher only for a call that is really parked.
        if waiting_shards and wait_gone is not None and call.parts_left:
            results = await self._wait_or_abandon(call, waiting_shards, wait_gone, answer_now)
        else:
            results = await call.result()
        for position, op in enumerate(ops):
            result = results[position]
            result["index"] = position
            result["op"] = op.op
        return results

    # -- queues ------------------------------------------------------------------------------------

    def queue_shard(self, queue: str) -> int:
        return shard_of_queue(queue, self.shard_count) if self.shard_count > 1 else 0

    async def run_queue(self, queue: str | None, op, wait_gone=None, shard: int | None = None, answer_now=None):
        """One queue operation on its queue's shard. A pop with waitMs may park; if `wait_gone`
        returns meanwhile (the client hung up), it is answered cancelled, never handed anything."""
        if type(op) in (PopOp, LeaseCall, Configure) or (type(op) is QueueAdmin and op.kind in _ADMIN_WRITES):
            self.refuse_writes_if_unavailable()
        shard = self.queue_shard(queue) if shard is None else shard
        call = Call(1, 1)
        await self._send(shard, [(call, 0, op)])
        if type(op) is PopOp and op.wait_ms and wait_gone is not None and call.parts_left:
            results = await self._wait_or_abandon(call, [shard], wait_gone, answer_now)
        else:
            results = await call.result()
        return _checked(results[0])

    async def push(self, items: list[PushItem]) -> list[dict]:
        """Items go to their queues' shards, in order; the answer is one result per item, in order."""
        self.refuse_writes_if_unavailable()
        by_shard: dict[int, list] = {}
        for item in items:
            by_shard.setdefault(self.queue_shard(item.queue), []).append(item)
        return await self._spread(by_shard, Push, len(items))

    async def timers(self, ops: list[TimerOp]) -> list[dict]:
        """Timer operations go to their queues' shards; one result per operation, in order."""
        if any(op.op != "get" for op in ops):
            self.refuse_writes_if_unavailable()
        by_shard: dict[int, list] = {}
        for op in ops:
            by_shard.setdefault(self.queue_shard(op.queue), []).append(op)
        return await self._spread(by_shard, Timers, len(ops))

    async def list_timers(self, queue: str, prefix: str, after: str | None, limit: int) -> dict:
        page = await self.run_queue(queue, TimerList(queue, prefix, after, limit))
        return {"items": page["items"], "cursor": encode_cursor(page["after"]) if page["after"] is not None else None}

    async def ack(self, items: list[AckItem]) -> list[dict]:
        self.refuse_writes_if_unavailable()
        by_shard: dict[int, list] = {}
        for item in items:
            by_shard.setdefault(shard_of_partition(self.shared, item.partition_id, self.shard_count), []).append(item)
        return await self._spread(by_shard, Acks, len(items))

    def next_defaults(self, op: PopOp, item: AckItem, prefix: str) -> None:
        """Fill a `next` pop's queue and group left out from the first acked message: its queue (a
        stored name, so already the tenant's prefixed one) and its group (the ack's, else its
        lease's). A partition that is not the tenant's names no queue: 400, as if unknown."""
        if op.queue is None:
            queue = self.shared.partition_queue.get(item.partition_id)
            if queue is None or not is_own(queue, prefix):
                raise BadRequest("next_queue_unknown", "next names no queue and the acked message's queue is not "
                                 "known: name it (next.queue)", {"section": "next", "partitionId": item.partition_id})
            op.queue = queue
        if op.group is None:
            op.group = item.group if item.group is not None else self._lease_group(item)

    def _lease_group(self, item: AckItem) -> str:
        table = self.steps.state.shards[shard_of_partition(self.shared, item.partition_id, self.shard_count)].queues
        entry = table.leases.get(item.lease_id)
        if entry is not None:
            return entry[1].name
        return table.ended_leases.get(item.lease_id, QUEUE_MODE_GROUP)

    async def ack_next(self, items: list[AckItem], op: PopOp, wait_gone=None, answer_now=None) -> tuple[list, dict]:
        """Acks, then the pop `op` on the state they left: (the acks' results, the pop's answer).
        When every ack and the pop are on one shard (a consumer's step: its acks are of the queue
        it pops), they go as one message, applied in order in one step: one frame, one fsync for
        the ack and the lease. Otherwise the acks go first, and the pop is sent once they are
        answered (durable): a second step and fsync, still decided after the acks."""
        self.refuse_writes_if_unavailable()
        count = self.shard_count
        shard = self.queue_shard(op.queue)
        if any(shard_of_partition(self.shared, item.partition_id, count) != shard for item in items):
            results = await self.ack(items)
            return results, await self._next_answer(op, lambda: self.run_queue(op.queue, op, wait_gone=wait_gone,
                                                                                 answer_now=answer_now))
        call = Call(2, 2)
        await self._send(shard, [(call, 0, Acks(items)), (call, 1, op)])
        if op.wait_ms and wait_gone is not None and call.parts_left:  # a watcher only when parked
            results = await self._wait_or_abandon(call, [shard], wait_gone, answer_now)
        else:
            results = await call.result()
        acks = [None] * len(items)
        for result in results[0]:
            acks[result["index"]] = result
        return acks, next_answer(op, results[1])

    async def _next_answer(self, op: PopOp, pop) -> dict:
        try:
            return await pop()
        except QueenError as error:  # e.g. too_many_groups: the acks stand; the pop is answered as refused
            return next_answer(op, Refusal(error))

    async def lease_call(self, op: LeaseCall) -> dict:
        return await self.run_queue(None, op, shard=shard_of_lease(self.shared, op.lease_id, self.shard_count))

    async def _spread(self, by_shard: dict[int, list], kind, count: int) -> list[dict]:
        call = Call(len(by_shard), len(by_shard))
        parts = {shard: [(call, slot, kind(items))] for slot, (shard, items) in enumerate(by_shard.items())}
        await self._send_parts(parts)
        results: list = [None] * count
        for part in await call.result():
            for result in part:
                results[result["index"]] = result
        return results

    async def list_queues(self, prefix: str, after: str | None, limit: int, tenant: str = "") -> dict:
        """A page of the tenant's queue listing across every shard, in name order (`tenant`: its
        name prefix)."""
        call = Call(self.shard_count, self.shard_count)
        parts = {shard: [(call, shard, QueueAdmin("list", None, tenant=tenant, prefix=prefix, after=after,
                                                  limit=limit))]
                 for shard in range(self.shard_count)}
        await self._send_parts(parts)
        items = sorted((item for part in await call.result() for item in part), key=lambda item: item["queue"])
        more = len(items) > limit
        items = items[:limit]
        return {"items": items, "cursor": encode_cursor(items[-1]["queue"]) if more else None}

    async def delete_group_everywhere(self, group: str, tenant: str = "") -> dict:
        """A consumer group dropped from every queue of the tenant that has it (each shard's queues
        in one step)."""
        self.refuse_writes_if_unavailable()
        call = Call(self.shard_count, self.shard_count)
        parts = {shard: [(call, shard, QueueAdmin("delete_group_everywhere", None, group=group, tenant=tenant))]
                 for shard in range(self.shard_count)}
        await self._send_parts(parts)
        queues = sorted(name for part in await call.result() for name in part)
        return {"deleted": bool(queues), "consumerGroup": group, "queues": queues}

    async def _wait_or_abandon(self, call: Call, shards: list[int], wait_gone, answer_now=None) -> list:
        """Wait for a parked call's answer. If `wait_gone` returns first (the client hung up), its
        parked operations are answered "cancelled", never handed anything; if `answer_now` does
        (queen/http/connection.py: the connection is needed for a new client), they are answered as
        if their wait had run out, which is what their client waited for anyway."""
        async with trio.open_nursery() as nursery:
            async def abandon_when(wait, timed_out: bool) -> None:
                await wait()
                for shard in shards:
                    await self._send(shard, Abandon(shard, call, timed_out))

            nursery.start_soon(abandon_when, wait_gone, False)
            if answer_now is not None:
                nursery.start_soon(abandon_when, answer_now, True)
            await call.done.wait()
            nursery.cancel_scope.cancel()
        return await call.result()

    async def run_transaction(self, txn: TransactionOps | list[KvOp], wait_gone=None, answer_now=None) -> dict:
        """All or nothing, as one step (so one frame), applied here across the shards it touches:
        on one thread that is atomic by construction, where a two-phase exchange between actors
        could deadlock against another transaction. A list is a KV-only transaction. With a `next`
        pop (txn.next), the answer gains "next": the pop's answer, made in the same step once the
        transaction committed (it may park, like a pop); null with nextReason when it was refused."""
        op = txn.next if type(txn) is TransactionOps else None
        step = Transaction(txn, Call(1, 1) if op is None else Call(2, 2))
        if step.txn.writes() or op is not None:
            self.refuse_writes_if_unavailable()
        call = step.reply_to
        writer = self.writer
        writer.hold()
        try:
            self.steps.run(step)
        finally:
            writer.unhold()
        if op is None:
            return (await call.result())[0]
        if op.wait_ms and wait_gone is not None and call.parts_left:  # a watcher only when parked
            results = await self._wait_or_abandon(call, [self.queue_shard(op.queue)], wait_gone, answer_now)
        else:
            results = await call.result()
        answer = results[0]
        if results[1] is None:  # refused: no pop was made
            answer["next"] = None
            answer["nextReason"] = "not_committed"
        else:
            answer["next"] = next_answer(op, results[1])
        return answer

    async def list_permits(self, prefix: str, cursor: str | None, limit: int, ns: str = LOCKS_NS) -> dict:
        """A page of the held permits of a tenant's lock namespace across every shard, in name order."""
        op = KvOp("getPrefix", ns)
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
        """Every part applied, then one unhold: a lone client's call commits once, in its task."""
        writer = self.writer
        writer.hold()
        try:
            for shard, items in parts.items():
                self.actors[shard].apply(items)
        finally:
            writer.unhold()

    async def _send(self, shard: int, message) -> None:
        """Apply a message on its shard now, in this task (queen/runtime/shard_actor.py): no task
        switch into an actor and back. Kept async so callers need not change. Under a hold of the
        writer: when this client is alone, its frame is committed here, before the call waits
        (queen/wal/writer.py, unhold)."""
        writer = self.writer
        writer.hold()
        try:
            self.actors[shard].apply(message)
        finally:
            writer.unhold()


_ADMIN_WRITES = frozenset(("requeue", "purge", "delete", "delete_group", "delete_group_everywhere"))


def next_answer(op: PopOp, result) -> dict:
    """A `next` pop's answer: what the pop route would have answered, or for a refusal (a 400 or
    503 there) a pop answer that delivered nothing, with the refusal's code as its reason: the acks
    beside it were applied and must be answered."""
    if type(result) is not Refusal:
        return result
    error = result.error
    return {"success": False, "reason": error.code, "error": error.code, "message": str(error),
            "queue": shown(op.queue), "consumerGroup": op.group, "messages": []}


def _checked(result):
    """A shard's answer, or the error it stands for: a refusal the state decided (a 400), or the
    server stopping while the call was parked (503)."""
    if type(result) is Refusal:
        raise result.error
    return result


def _merge_prefix_pages(pages: list[dict], limit: int) -> dict:
    """One page (`items`, `cursor`) from every shard's part of it."""
    items = [item for page in pages for item in page["items"]]
    items.sort(key=lambda item: item["key"])
    more = len(items) > limit
    items = items[:limit]
    return {"items": items, "cursor": encode_cursor(items[-1]["key"]) if more else None}
