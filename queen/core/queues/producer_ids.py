"""Producer ids (a push's transactionId) known in one shard's partitions: what makes a retried push
a duplicate, and their forgetting once their window has passed and their message is gone.

A partition keeps its ids in a dict, producer id -> packed entry (queen/core/queues/packed.py),
oldest first. One heap for the whole shard says when a partition's oldest ids may be forgotten, so
a tick looks only at the partitions due, whatever the number of queues.

Forgetting is memory management, not a decision: a push asks `known`, which judges the entry's
window and its message itself, so when forgetting runs changes no answer and writes no record.
"""

from __future__ import annotations

import heapq

from queen.core.queues.model import Partition, Queue, Shared
from queen.core.queues.packed import DEDUPE_ENTRY, dedupe_cost

# How often a producer id kept past its window (its message is still retained) is looked at again.
RECHECK_MS = 60_000


class ProducerIds:
    __slots__ = ("shared", "due", "per_tick_max")

    def __init__(self, shared: Shared, per_tick_max: int):
        self.shared = shared
        self.per_tick_max = per_tick_max  # ids of one partition looked at per tick (Limits)
        self.due: list = []  # heap of (due_ms, queue name, partition id) whose oldest ids may go

    @staticmethod
    def known(partition: Partition, tid: str, now_ms: int) -> tuple[int, int, int] | None:
        """(offset, message_id, created_at_ms) of the message a push with this producer id is a
        duplicate of: while its window is open, or while that message is retained."""
        entry = partition.dedupe.get(tid)
        if entry is None:
            return None
        offset, message_id, created_at_ms, until_ms = DEDUPE_ENTRY.unpack(entry)
        if until_ms > now_ms or offset in partition.messages:
            return offset, message_id, created_at_ms
        return None

    @staticmethod
    def offset_of(partition: Partition, tid: str) -> int | None:
        """The offset of the message a producer id named, while the id is kept."""
        entry = partition.dedupe.get(tid)
        return DEDUPE_ENTRY.unpack(entry)[0] if entry is not None else None

    def remember(self, queue: Queue, partition: Partition, tid: str, offset: int, message_id: int,
                 created_at_ms: int, until_ms: int) -> None:
        """Known from now to until_ms (and while its message is retained), at the back of the
        partition's oldest-first order."""
        if partition.dedupe.pop(tid, None) is None:
            self.shared.bytes += dedupe_cost(tid)
        partition.dedupe[tid] = DEDUPE_ENTRY.pack(offset, message_id, created_at_ms, until_ms)
        if not partition.dedupe_due_ms:
            self._schedule(queue, partition, until_ms)

    def restore(self, queue: Queue, partition: Partition, ids: list, entries: bytes) -> None:
        """A snapshot's producer ids of one partition, oldest first."""
        if len(entries) != len(ids) * DEDUPE_ENTRY.size:
            raise ValueError(f"a dedupe record of {len(ids)} ids holds {len(entries)} bytes")
        for tid, entry in zip(ids, DEDUPE_ENTRY.iter_unpack(entries), strict=True):
            self.remember(queue, partition, tid, *entry)

    def drop(self, partition: Partition) -> None:
        """A deleted partition's ids stop counting against storage (its heap entries go stale)."""
        for tid in partition.dedupe:
            self.shared.bytes -= dedupe_cost(tid)

    def _schedule(self, queue: Queue, partition: Partition, due_ms: int) -> None:
        partition.dedupe_due_ms = due_ms
        heapq.heappush(self.due, (due_ms, queue.name, partition.id))

    def forget_due(self, queues: dict[str, Queue], now_ms: int) -> None:
        """Forget producer ids whose window has passed and whose message is gone, walking each due
        partition's ids oldest first: one whose message is retained moves to the back, to be looked
        at again in a minute; the walk stops at the first whose window is still open."""
        due = self.due
        while due and due[0][0] <= now_ms:
            due_ms, queue_name, partition_id = heapq.heappop(due)
            queue = queues.get(queue_name)
            partition = queue.by_id.get(partition_id) if queue is not None else None
            if partition is None or partition.dedupe_due_ms != due_ms:
                continue  # deleted, or rescheduled since
            partition.dedupe_due_ms = 0
            dedupe = partition.dedupe
            forget, keep, next_due_ms = [], [], 0
            for tid, entry in dedupe.items():
                if len(forget) + len(keep) >= self.per_tick_max:
                    next_due_ms = now_ms + 1  # the rest at the next tick
                    break
                offset, message_id, created_at_ms, until_ms = DEDUPE_ENTRY.unpack(entry)
                if until_ms > now_ms:
                    next_due_ms = until_ms
                    break
                if offset in partition.messages:
                    keep.append((tid, offset, message_id, created_at_ms))
                else:
                    forget.append(tid)
            for tid in forget:
                del dedupe[tid]
                self.shared.bytes -= dedupe_cost(tid)
            for tid, offset, message_id, created_at_ms in keep:
                del dedupe[tid]
                dedupe[tid] = DEDUPE_ENTRY.pack(offset, message_id, created_at_ms, now_ms + RECHECK_MS)
            if keep and not next_due_ms:
                next_due_ms = now_ms + RECHECK_MS
            if next_due_ms:
                self._schedule(queue, partition, max(next_due_ms, now_ms))
