"""Delivery: the live decisions of a pop. Which partitions a group's pop takes (oldest available
head first, one lease per partition and group), which messages of each (head of line, within the
batch and byte budgets), and the pops parked until something can be delivered, served first come
first served after any step that may have made something deliverable.

A message may be delivered once its available_at has come (delayedProcessingSeconds) and, if the
retry backoff holds it back, its retry time too (GroupState.retry_at): until then it is not
available, and neither is anything behind it in its partition.

A mixin of QueueTable (queen/core/queues/table.py), which owns the state and every transition:
these methods decide, then record a grant through the table's `_apply_grant`, as replay does.
Split out by verb, as etcd splits its store's methods across files, to keep each file to one idea.

Never: reads a clock, awaits, or knows what a reply_to is.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from orjson import Fragment

from queen.core import records as rec
from queen.core.outcomes import QueueReason, Refusal
from queen.core.queue_ops import GENERATED_ID_PREFIX, PopOp
from queen.core.queues.model import Group, GroupState, Partition, PopWaiter, Queue, count
from queen.core.queues.packed import available_at, payload_bytes, unpack_message
from queen.core.tenants import shown
from queen.errors import Unavailable

if TYPE_CHECKING:
    from queen.core.kv import VersionCounter
    from queen.core.limits import Limits
    from queen.core.queues.model import Lease, QueueStats
    from queen.core.queues.parking import ParkedPops


class Delivery:
    """Delivery's half of QueueTable (table.py), which sets these attributes and implements the
    methods below that only raise here: declared, so the compiled build (queen/_native.py) knows
    their types."""

    versions: VersionCounter
    limits: Limits
    parked: ParkedPops
    resolved: list
    dirty: dict[str, None]
    stats: QueueStats

    def _queue(self, name: str, now_ms: int, records: list, create: bool) -> Queue | None:
        raise NotImplementedError

    def _group(self, queue: Queue, name: str, mode: str, now_ms: int, records: list) -> Group | Refusal:
        raise NotImplementedError

    def _expire(self, queue: Queue, group: Group, lease: Lease, now_ms: int, records: list) -> None:
        raise NotImplementedError

    def _apply_grant(self, queue: Queue, group: Group, lease_id: int, acquired_at_ms: int, expires_at_ms: int,
                     auto_ack: bool, deliveries: list) -> None:
        raise NotImplementedError

    def _settle(self, queue: Queue, partition: Partition, now_ms: int) -> None:
        raise NotImplementedError

    def pop(self, op: PopOp, now_ms: int, records: list, reply_to=None, position: int = 0) -> dict | Refusal | None:
        """The answer, or None when the pop was parked (answered later, in resolved)."""
        queue = self._queue(op.queue, now_ms, records, create=True)
        if queue is None:
            return {"success": False, "reason": QueueReason.STORAGE_FULL, "error": QueueReason.STORAGE_FULL, "queue": shown(op.queue),
                    "consumerGroup": op.group, "messages": []}
        group = self._group(queue, op.group, op.mode, now_ms, records)
        if isinstance(group, Refusal):
            return group
        if op.after and op.queue in self.dirty:
            # A `next` pop rides the step of the ack that may just have made something deliverable:
            # the pops parked on this queue come first, as they would before a pop of a later step.
            del self.dirty[op.queue]
            self._serve(op.queue, now_ms, records)
        answer, reason = self._deliver(queue, group, op, now_ms, records)
        if answer is not None:
            return answer
        if op.wait_ms > 0 and reply_to is not None:
            self.parked.park(PopWaiter(op, now_ms + op.wait_ms, reply_to, position, now_ms))
            self._wake_when_available(queue, group, op, now_ms)
            return None
        return _nothing(op, reason)

    def _deliver(self, queue: Queue, group: Group, op: PopOp, now_ms: int, records: list) -> tuple[dict | None, str]:
        limits = self.limits
        left = op.batch
        bytes_left = limits.pop_bytes_max
        taken: list[tuple[Partition, list[int]]] = []
        if op.partition is not None:
            partition = queue.partitions.get(op.partition)
            if partition is None:
                return None, QueueReason.EMPTY
            state = partition.groups[group.name]
            if state.lease is not None:
                if state.lease.expires_at_ms > now_ms:
                    head = partition.messages.get(state.floor)
                    held = head is not None and ready_at(head, state) <= now_ms
                    return None, QueueReason.LEASE_HELD if held else QueueReason.EMPTY
                self._expire(queue, group, state.lease, now_ms, records)
            offsets, _ = self._take(partition, state, now_ms, left, bytes_left, not taken)
            if offsets:
                taken.append((partition, offsets))
        else:
            # A lease that ran out frees its partitions from that moment, tick or not.
            for lease in [lease for lease in group.leases.values() if lease.expires_at_ms <= now_ms]:
                self._expire(queue, group, lease, now_ms, records)
            heap = group.ready
            while heap and left > 0 and len(taken) < op.partitions:
                ready_at_ms, partition_id = heap[0]
                found = queue.by_id.get(partition_id)
                found_state = found.groups.get(group.name) if found is not None else None
                if found is None or found_state is None or found_state.ready_at_ms != ready_at_ms:
                    heapq.heappop(heap)  # its partition or group is gone, or an earlier entry superseded it
                    continue
                partition, state = found, found_state
                holder = state.lease
                if holder is not None:
                    if holder.expires_at_ms > now_ms:
                        heapq.heappop(heap)
                        state.ready_at_ms = None
                        continue
                    # Its messages come back (held back by the retry backoff, if the queue has one):
                    # the lease's end files the partition again, so look at the heap afresh.
                    self._expire(queue, group, holder, now_ms, records)
                    continue
                head = partition.messages.get(state.floor) if state.floor < partition.next_offset else None
                if head is None:
                    heapq.heappop(heap)
                    state.ready_at_ms = None
                    continue
                # ready_at(head, state), inline: this runs for every partition a pop takes.
                head_ready_at_ms = available_at(head)
                retry_at = state.retry_at
                if retry_at:
                    retry_at_ms = retry_at.get(state.floor, 0)
                    if retry_at_ms > head_ready_at_ms:
                        head_ready_at_ms = retry_at_ms
                if head_ready_at_ms != ready_at_ms:
                    heapq.heapreplace(heap, (head_ready_at_ms, partition_id))
                    state.ready_at_ms = head_ready_at_ms
                    continue
                if ready_at_ms > now_ms:
                    break  # the oldest head is not available yet: none behind it is either
                offsets, size = self._take(partition, state, now_ms, left, bytes_left, not taken)
                if not offsets:
                    break  # the byte budget is spent
                heapq.heappop(heap)
                state.ready_at_ms = None
                taken.append((partition, offsets))
                left -= len(offsets)
                bytes_left -= size
        if not taken:
            return None, QueueReason.EMPTY
        lease_id = self.versions.next()
        expires_at_ms = 0 if op.auto_ack else now_ms + queue.options["leaseTimeSeconds"] * 1000
        deliveries = [[partition.id, offsets] for partition, offsets in taken]
        rec.grant(records, lease_id, queue.name, group.name, now_ms, expires_at_ms, op.auto_ack, deliveries)
        self._apply_grant(queue, group, lease_id, now_ms, expires_at_ms, op.auto_ack, deliveries)
        messages = []
        answer_lease = None if op.auto_ack else lease_id
        for partition, offsets in taken:
            state = partition.groups[group.name]
            for offset in offsets:
                message_id, tid, data, trace_id, created_at_ms, _ = unpack_message(partition.messages[offset])
                messages.append({"messageId": message_id, "offset": offset,
                                 "transactionId": tid if tid is not None else f"{GENERATED_ID_PREFIX}{offset}",
                                 "partition": partition.name, "partitionId": partition.id, "leaseId": answer_lease,
                                 "consumerGroup": group.name, "data": Fragment(data), "createdAt": created_at_ms,
                                 "retryCount": state.retries.get(offset, 0), "traceId": trace_id})
        count(self.stats.popped_by_queue, queue.name, len(messages))
        if op.auto_ack:  # resolved now; the messages were read above, before they could be removed
            count(self.stats.acked_by_queue, queue.name, len(messages))
            for partition, offsets in taken:
                retries = partition.groups[group.name].retries
                for offset in offsets:
                    retries.pop(offset, None)
                self._settle(queue, partition, now_ms)
        first = taken[0][0]
        return {"success": True, "queue": queue.shown, "partition": first.name, "partitionId": first.id,
                "leaseId": answer_lease, "consumerGroup": group.name, "expiresAt": expires_at_ms or None,
                "partitionsClaimed": len(taken), "messages": messages}, ""

    def _take(self, partition: Partition, state: GroupState, now_ms: int, count: int, bytes_left: int,
              first: bool) -> tuple[list[int], int]:
        """Unresolved, available offsets from the floor up, in order, stopping at the first that is
        not available or is held back by the retry backoff (head of line), at count, or before the
        byte budget is passed (but at least one message in an answer)."""
        offsets: list[int] = []
        size = 0
        resolved = state.resolved
        retry_at = state.retry_at
        messages = partition.messages
        offset, end = state.floor, partition.next_offset
        while offset < end and len(offsets) < count:
            if offset in resolved:
                offset += 1
                continue
            message = messages.get(offset)
            if message is None:  # removed while pinned in another group's DLQ: nothing to deliver
                offset += 1
                continue
            if available_at(message) > now_ms or (retry_at and retry_at.get(offset, 0) > now_ms):
                break
            message_size = payload_bytes(message)
            if size + message_size > bytes_left and (offsets or not first):
                break
            offsets.append(offset)
            size += message_size
            offset += 1
        return offsets, size

    def _wake_when_available(self, queue: Queue, group: Group, op: PopOp, now_ms: int) -> None:
        """A parked pop found nothing: if what it waits for is a head that is delayed or held back by
        the retry backoff, have the tick mark the queue when that head may be delivered (nothing
        else would: no step changes it). The wildcard's is the top of the ready heap: a pop that
        found nothing has left it correct there."""
        if op.partition is not None:
            partition = queue.partitions.get(op.partition)
            head = None
            if partition is not None:
                state = partition.groups[group.name]
                head = partition.messages.get(state.floor)
            at_ms = ready_at(head, state) if head is not None else 0
        else:
            at_ms = group.ready[0][0] if group.ready else 0
        if at_ms > now_ms:
            self.parked.wakes.schedule(queue.name, at_ms)

    def after_step(self, now_ms: int, records: list) -> None:
        """Serve parked pops of the queues something happened to, oldest first per group."""
        if not self.dirty:
            return
        dirty = list(self.dirty)
        self.dirty.clear()
        for name in dirty:
            self._serve(name, now_ms, records)

    def tick_parked(self, now_ms: int) -> None:
        """Parked pops whose wait ran out answer "empty" as the timeout; queues whose awaited head
        (delayed, or held back by the retry backoff) may now be delivered are served after the step."""
        for waiter in self.parked.timed_out(now_ms):
            self.resolved.append((waiter.reply_to, waiter.position, _nothing(waiter.op, QueueReason.TIMEOUT)))
        for name in self.parked.woken(now_ms):
            self.dirty[name] = None

    def _serve(self, name: str, now_ms: int, records: list) -> None:
        groups = self.parked.by_queue.get(name)
        if not groups:
            return
        for group_name in list(groups):
            waiting = groups[group_name]
            while waiting:
                waiter = waiting[0]
                queue = self._queue(name, now_ms, records, create=True)
                if queue is None:
                    break
                group = self._group(queue, group_name, waiter.op.mode, now_ms, records)
                if isinstance(group, Refusal):
                    break
                answer, _ = self._deliver(queue, group, waiter.op, now_ms, records)
                if answer is None:
                    self._wake_when_available(queue, group, waiter.op, now_ms)
                    break
                self.parked.served(waiting, now_ms)
                self.resolved.append((waiter.reply_to, waiter.position, answer))
        self.parked.prune(name)

    def abandon(self, reply_to, timed_out: bool = False) -> None:
        """Answer and forget the parked pops of reply_to: "cancelled" when its client hung up (never
        hand them anything), or "timeout" as their wait running out would."""
        for waiter in self.parked.of(reply_to):
            self.parked.unpark(waiter)
            self.resolved.append((reply_to, waiter.position, _nothing(waiter.op, QueueReason.TIMEOUT if timed_out else QueueReason.CANCELLED)))

    def drain(self) -> None:
        """At shutdown: every parked pop is answered shutting_down."""
        for waiter in self.parked.everyone():
            self.parked.unpark(waiter)
            self.resolved.append((waiter.reply_to, waiter.position,
                                  Refusal(Unavailable("shutting_down", "the server is shutting down"))))


def ready_at(head: bytes, state: GroupState) -> int:
    """When a group's head in a partition (its message at the floor) may be delivered: its
    available_at, or its retry time when the retry backoff holds it back longer."""
    ready_at_ms = available_at(head)
    retry_at = state.retry_at
    if retry_at:
        return max(ready_at_ms, retry_at.get(state.floor, 0))
    return ready_at_ms


def _nothing(op: PopOp, reason: str) -> dict:
    return {"success": False, "reason": reason, "error": reason, "queue": shown(op.queue), "consumerGroup": op.group,
            "messages": []}
