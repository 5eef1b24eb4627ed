"""The queues of one shard: partitions of messages, consumer groups reading them under leases,
acks, redelivery, dead letters, retention, and the pops parked until something can be delivered.

Model (everything of one queue lives on one shard):
  - A partition is an ordered lane of messages with dense offsets; a message is retained until
    every group has resolved it (or retention removes it).
  - Per (partition, group): an ack floor (the lowest unresolved offset), a roaring bitmap of the
    resolved offsets above it, retry counts, the group's DLQ entries there, and at most one lease.
  - A lease (its id is the version of the pop that granted it) holds partitions for one group
    until expires_at_ms; it is live while now < expires_at_ms and it still holds the partition.
  - Each group keeps a heap of partitions that may be ready, keyed by the availability of their
    head (oldest head first, then partition id), checked lazily when popped, so a pop costs what it
    delivers, not the number of partitions.

Every change is a record (queen/core/records.py) appended in version order, and the same
`_apply_*` functions change state for a live step and for replay, so replay reaches the same
state. Decisions (who gets what, when a lease has ended, what the DLQ takes) are made once, live,
and recorded as their effects; replay never reads a clock.

Never: reads a clock, awaits, or knows what a reply_to is.
"""

from __future__ import annotations

import base64
import heapq
import struct
from collections import deque

import orjson
from orjson import Fragment
from pyroaring import BitMap, BitMap64

from queen.core import records as rec
from queen.core.kv import VersionCounter
from queen.core.limits import Limits
from queen.core.packing import int_array, read_int_array
from queen.core.queue_ops import (
    DEFAULT_OPTIONS,
    GENERATED_ID_PREFIX,
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
from queen.core.timer_ops import TimerList, Timers
from queen.core.timers import TimerTable
from queen.core.wheel import TimingWheel
from queen.errors import BadRequest

# What a dedupe entry is counted as, besides its id, against the storage limit.
DEDUPE_ENTRY_BYTES = 64
# How often a producer id kept past its window (its message is still retained) is looked at again.
DEDUPE_RECHECK_MS = 60_000
# Ended leases remembered (about 100 bytes each), so a retried ack without a group is answered right.
ENDED_LEASES_KEPT = 100_000


# A retained message is one bytes value, packed (below), in a plain dict keyed by its offset; a
# producer id's dedupe entry likewise. A queue may hold millions of messages, and Python's cyclic
# GC walks every object it tracks and every entry of every container it tracks on each full
# collection: with messages as objects (or tuples, or payloads as dicts) collections paused the
# server for 100-400 ms at 600,000 messages. A dict of bytes is never tracked, so it costs the
# collector nothing however large it grows. The payload is kept as its JSON encoding and reaches
# an answer as an orjson.Fragment, written out as is.
#   head: message_id, created_at_ms, available_at_ms, bytes of the producer id (-1: none, then
#   it is queen:<offset>), bytes of the trace id (-1: none); then the two ids (UTF-8), then the payload.
# Snapshots store messages and dedupe entries packed as they are (records kinds 28 and 30), so the
# two layouts are part of the on-disk format: change them only with the format version.
_HEAD = struct.Struct("<qqqii")
_CREATED = struct.Struct("<q")
_AVAILABLE_AT = 16
_ID_LENGTHS = struct.Struct("<ii")
_ID_LENGTHS_AT = 24


def pack_message(message_id: int, tid: str | None, data: bytes, trace_id: str | None, created_at_ms: int,
                 available_at_ms: int) -> bytes:
    tid_raw = b"" if tid is None else tid.encode()
    trace_raw = b"" if trace_id is None else trace_id.encode()
    head = _HEAD.pack(message_id, created_at_ms, available_at_ms, -1 if tid is None else len(tid_raw),
                      -1 if trace_id is None else len(trace_raw))
    return head + tid_raw + trace_raw + data


def unpack_message(packed: bytes) -> tuple:
    """(message_id, transaction_id, data, trace_id, created_at_ms, available_at_ms)"""
    message_id, created_at_ms, available_at_ms, tid_length, trace_length = _HEAD.unpack_from(packed)
    position = _HEAD.size
    tid = trace_id = None
    if tid_length >= 0:
        tid = packed[position:position + tid_length].decode()
        position += tid_length
    if trace_length >= 0:
        trace_id = packed[position:position + trace_length].decode()
        position += trace_length
    return message_id, tid, packed[position:], trace_id, created_at_ms, available_at_ms


def created_at(packed: bytes) -> int:
    return _CREATED.unpack_from(packed, 8)[0]


def available_at(packed: bytes) -> int:
    return _CREATED.unpack_from(packed, _AVAILABLE_AT)[0]


def payload_bytes(packed: bytes) -> int:
    """The payload's size (what the limits count), without unpacking the message."""
    tid_length, trace_length = _ID_LENGTHS.unpack_from(packed, _ID_LENGTHS_AT)
    return len(packed) - _HEAD.size - max(tid_length, 0) - max(trace_length, 0)


def transaction_id_of(packed: bytes) -> str | None:
    tid_length = _ID_LENGTHS.unpack_from(packed, _ID_LENGTHS_AT)[0]
    return None if tid_length < 0 else packed[_HEAD.size:_HEAD.size + tid_length].decode()


# A producer id known in a partition: offset, message_id, created_at_ms, until_ms.
_DEDUPE = struct.Struct("<qqqq")
# Producer ids one partition's expiry sweep looks at per tick at most, so a backlog of millions
# whose windows end together is forgotten over several ticks instead of in one long pause.
DEDUPE_SWEEP_BUDGET = 2000


class GroupState:
    """One group's state in one partition."""

    __slots__ = ("floor", "resolved", "retries", "dlq", "lease", "in_heap")

    def __init__(self, floor: int):
        self.floor = floor  # the lowest offset not resolved
        # Resolved offsets above the floor. 64-bit: a partition passes 2^32 offsets in about five
        # days at 10,000 messages a second.
        self.resolved = BitMap64()
        self.retries: dict[int, int] = {}  # offset -> deliveries that ended without completion
        self.dlq: dict[int, tuple] = {}  # offset -> (error, dlq_at_ms); resolved, and kept
        self.lease: Lease | None = None
        self.in_heap = False  # an entry for this partition is in the group's ready heap

    def unresolved(self, next_offset: int) -> int:
        return next_offset - self.floor - len(self.resolved)


class Partition:
    __slots__ = ("queue", "name", "id", "created_at_ms", "messages", "next_offset", "removed_below", "groups",
                 "dedupe", "dedupe_due_ms", "bytes", "completed_at")

    def __init__(self, queue: str, name: str, partition_id: int, created_at_ms: int):
        self.queue = queue
        self.name = name
        self.id = partition_id
        self.created_at_ms = created_at_ms
        self.messages: dict[int, bytes] = {}  # offset -> packed message, retained, in offset order
        self.next_offset = 0
        self.removed_below = 0  # every offset below was removed or is pinned in a DLQ
        self.groups: dict[str, GroupState] = {}
        # producer id -> packed entry (_DEDUPE), oldest first: the expiry sweep walks it from the front
        self.dedupe: dict[str, bytes] = {}
        self.dedupe_due_ms = 0  # when the sweep next looks at its front (0: not scheduled)
        self.bytes = 0
        self.completed_at: deque = deque()  # (offset the groups' lowest floor reached, at_ms)

    def first_offset(self) -> int:
        for offset in self.messages:
            return offset
        return self.next_offset


class Lease:
    __slots__ = ("lease_id", "group", "acquired_at_ms", "expires_at_ms", "held")

    def __init__(self, lease_id, group, acquired_at_ms, expires_at_ms):
        self.lease_id = lease_id
        self.group = group
        self.acquired_at_ms = acquired_at_ms
        self.expires_at_ms = expires_at_ms
        self.held: dict[int, list[int]] = {}  # partition id -> offsets delivered and not yet resolved


class Group:
    __slots__ = ("name", "mode", "joined_at_ms", "join_version", "leases", "ready")

    def __init__(self, name, mode, joined_at_ms, join_version):
        self.name = name
        self.mode = mode
        self.joined_at_ms = joined_at_ms
        self.join_version = join_version
        self.leases: dict[int, Lease] = {}
        self.ready: list = []  # heap of (head available_at_ms, partition id)


class Queue:
    __slots__ = ("name", "created_at_ms", "options", "partitions", "by_id", "groups", "messages", "bytes",
                 "dedupe_due", "version")

    def __init__(self, name, created_at_ms, options, version):
        self.name = name
        self.created_at_ms = created_at_ms
        self.options = options
        self.partitions: dict[str, Partition] = {}
        self.by_id: dict[int, Partition] = {}
        self.groups: dict[str, Group] = {}
        self.messages = 0  # retained, DLQ entries included
        self.bytes = 0
        self.dedupe_due: list = []  # heap of (due_ms, partition id): partitions whose producer ids may expire
        self.version = version  # of its last queue_set


class Shared:
    """What every shard's queue table shares: capacity counters, and which queue an id belongs to
    (so acks and lease calls, which name only ids, reach the queue's shard)."""

    __slots__ = ("queues", "bytes", "timers", "partition_queue", "lease_queue")

    def __init__(self):
        self.queues = 0
        self.bytes = 0  # payloads retained (timers' included) and producer ids kept
        self.timers = 0
        self.partition_queue: dict[int, str] = {}
        self.lease_queue: dict[int, str] = {}


class PopWaiter:
    __slots__ = ("op", "deadline_ms", "reply_to", "position", "parked_at_ms")

    def __init__(self, op: PopOp, deadline_ms: int, reply_to, position: int, parked_at_ms: int):
        self.op = op
        self.deadline_ms = deadline_ms
        self.reply_to = reply_to
        self.position = position
        self.parked_at_ms = parked_at_ms


class QueueStats:
    __slots__ = ("pushed", "duplicates", "push_failed", "redelivered_failed", "redelivered_expired", "dlq_moves",
                 "pop_waits", "pop_wait_ms_total")

    def __init__(self):
        self.pushed = self.duplicates = self.push_failed = 0
        self.redelivered_failed = self.redelivered_expired = self.dlq_moves = 0
        self.pop_waits = self.pop_wait_ms_total = 0


def refusal(code: str, message: str, **details) -> dict:
    """An answer that is a 400 for its call (the router raises it): state decided it, nothing applied."""
    return {"_refused": BadRequest(code, message, details)}


class Growth:
    """What the earlier pushes and schedules of one transaction will add, so the capacity check of
    each later one counts them (every check is judged before anything is applied)."""

    __slots__ = ("bytes", "timers", "queues", "messages", "partitions", "ids")

    def __init__(self):
        self.bytes = 0
        self.timers = 0
        self.queues: set[str] = set()  # queues the transaction creates
        self.messages: dict[str, int] = {}  # queue -> messages it appends
        self.partitions: dict[str, set[str]] = {}  # queue -> partitions it creates
        self.ids: set[tuple] = set()  # (queue, partition, producer id) it appends

    def new_queue(self, shared: Shared, limits: Limits, name: str, exists: bool) -> bool:
        """Whether a queue the transaction names may exist (counting it as created if it is new)."""
        if exists or name in self.queues:
            return True
        if shared.queues + len(self.queues) >= limits.queues_max:
            return False
        self.queues.add(name)
        return True


class QueueTable:
    def __init__(self, versions: VersionCounter, shared: Shared, limits: Limits, now_ms: int):
        self.versions = versions
        self.shared = shared
        self.limits = limits
        self.queues: dict[str, Queue] = {}
        self.leases: dict[int, tuple[Queue, Group, Lease]] = {}
        self.lease_wheel = TimingWheel(now_ms)  # lease id -> expires_at_ms
        self.sweep_wheel = TimingWheel(now_ms)  # (queue, partition id) -> when retention may remove some
        self.waiters: dict[str, dict[str, deque[PopWaiter]]] = {}  # queue -> group -> oldest first
        self.wait_deadlines = TimingWheel(now_ms)
        self.dirty: dict[str, None] = {}  # queues whose waiters may be served now
        self.resolved: list = []  # (reply_to, position, answer) of parked pops answered
        self.ended_leases: dict[int, str] = {}  # lease id -> group, the most recent ENDED_LEASES_KEPT
        self.stats = QueueStats()
        self.timers = TimerTable(self)

    def apply(self, op, now_ms: int, records: list, reply_to=None, position: int = 0):
        """The answer to one operation on this shard (None: a pop was parked)."""
        kind = type(op)
        if kind is Push:
            return self.push(op.items, now_ms, records)
        if kind is PopOp:
            return self.pop(op, now_ms, records, reply_to, position)
        if kind is Acks:
            return self.ack(op.items, now_ms, records)
        if kind is Timers or kind is TimerList:
            return self.timers.apply(op, now_ms, records)
        if kind is Configure:
            return self.configure(op.queue, op.changes, now_ms, records)
        if kind is LeaseCall:
            if op.kind == "extend":
                return self.extend(op.lease_id, op.seconds, now_ms, records)
            return self.release(op.lease_id, now_ms, records)
        return self.admin(op, now_ms, records)

    def admin(self, op: QueueAdmin, now_ms: int, records: list):
        args = op.args
        kind = op.kind
        if kind == "dlq":
            return self.dlq_list(op.queue, args["group"], args["partition"], args["cursor"], args["skip"], args["limit"])
        if kind == "requeue":
            return self.requeue(op.queue, args["group"], args["items"], now_ms, records)
        if kind == "purge":
            return self.purge(op.queue, args["group"], now_ms, records)
        if kind == "delete":
            return self.delete_queue(op.queue, now_ms, records)
        if kind == "delete_group":
            return self.delete_group(op.queue, args["group"], now_ms, records)
        if kind == "delete_group_everywhere":
            names = [name for name, queue in self.queues.items() if args["group"] in queue.groups]
            for name in names:
                self.delete_group(name, args["group"], now_ms, records)
            return names
        if kind == "info":
            return self.queue_info(op.queue, now_ms)
        if kind == "partitions":
            return self.partitions_page(op.queue, args["group"], args["prefix"], args["cursor"], args["limit"], now_ms)
        if kind == "list":
            return self.queue_summaries(args["prefix"], args["after"], args["limit"], now_ms)
        raise ValueError(f"unknown admin call {kind!r}")

    # ------------------------------------------------------------------------------------------
    # Creating queues, partitions, groups.

    def _queue(self, name: str, now_ms: int, records: list, create: bool) -> Queue | None:
        queue = self.queues.get(name)
        if queue is None and create and self.shared.queues < self.limits.queues_max:
            version = self.versions.next()
            options = dict(DEFAULT_OPTIONS)
            rec.queue_set(records, version, name, now_ms, options)
            queue = self._apply_queue_set(version, name, now_ms, options)
        return queue

    def _apply_queue_set(self, version: int, name: str, created_at_ms: int, options: dict) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = Queue(name, created_at_ms, dict(options), version)
            self.shared.queues += 1
        else:
            queue.options = dict(options)
            queue.version = version
            for partition in queue.partitions.values():
                self._schedule_sweep(queue, partition, created_at_ms)
        return queue

    def _partition(self, queue: Queue, name: str, now_ms: int, records: list) -> Partition:
        version = self.versions.next()
        rec.partition(records, version, queue.name, name, now_ms)
        return self._apply_partition(queue, version, name, now_ms)

    def _apply_partition(self, queue: Queue, partition_id: int, name: str, created_at_ms: int) -> Partition:
        partition = Partition(queue.name, name, partition_id, created_at_ms)
        queue.partitions[name] = partition
        queue.by_id[partition_id] = partition
        self.shared.partition_queue[partition_id] = queue.name
        for group in queue.groups.values():
            partition.groups[group.name] = GroupState(0)
        return partition

    def _group(self, queue: Queue, name: str, mode: str, now_ms: int, records: list) -> Group | dict:
        group = queue.groups.get(name)
        if group is None:
            if len(queue.groups) >= self.limits.groups_per_queue_max:
                return refusal("too_many_groups", f"queue {queue.name!r} has {len(queue.groups)} consumer groups, "
                               f"the most it may have; delete one first", queue=queue.name)
            version = self.versions.next()
            rec.group_join(records, version, queue.name, name, mode, now_ms)
            group = self._apply_group_join(queue, version, name, mode, now_ms)
        return group

    def _apply_group_join(self, queue: Queue, version: int, name: str, mode: str, joined_at_ms: int) -> Group:
        group = queue.groups[name] = Group(name, mode, joined_at_ms, version)
        for partition in queue.partitions.values():
            # A "new" group counts what is already there as resolved.
            state = partition.groups[name] = GroupState(partition.next_offset if mode == "new" else partition.removed_below)
            self._requeue(queue, group, partition, state)
        return group

    # ------------------------------------------------------------------------------------------
    # Configure.

    def configure(self, name: str, changes: dict, now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        created = queue is None
        if created and self.shared.queues >= self.limits.queues_max:
            return {"configured": False, "queue": name, "reason": "storage_full", "error": "storage_full"}
        options = dict(DEFAULT_OPTIONS if created else queue.options)
        options.update(changes)
        if created or options != queue.options:
            version = self.versions.next()
            created_at_ms = now_ms if created else queue.created_at_ms
            rec.queue_set(records, version, name, created_at_ms, options)
            queue = self._apply_queue_set(version, name, created_at_ms, options)
            self.dirty[name] = None
        return {"configured": True, "queue": name, "created": created, "createdAt": queue.created_at_ms,
                "options": dict(queue.options)}

    # ------------------------------------------------------------------------------------------
    # Push.

    def push(self, items: list[PushItem], now_ms: int, records: list) -> list[dict]:
        return [self.push_one(item, now_ms, records) for item in items]

    def push_one(self, item: PushItem, now_ms: int, records: list, exempt: bool = False) -> dict:
        """exempt: a timer's fire, which no capacity refuses."""
        queue = self._queue(item.queue, now_ms, records, create=True)
        if queue is None:
            return self._push_failed(item, "storage_full")
        partition = queue.partitions.get(item.partition)
        tid = item.transaction_id
        if partition is not None and tid is not None:
            entry = partition.dedupe.get(tid)
            if entry is not None:
                known_offset, message_id, created_at_ms, until_ms = _DEDUPE.unpack(entry)
                if until_ms > now_ms or known_offset in partition.messages:
                    self.stats.duplicates += 1
                    return {"index": item.index, "queue": queue.name, "partition": partition.name,
                            "partitionId": partition.id, "transactionId": tid, "status": "duplicate",
                            "messageId": message_id, "offset": known_offset, "createdAt": created_at_ms}
        if not exempt:
            max_size = queue.options["maxSize"]
            if max_size and queue.messages >= max_size:
                return self._push_failed(item, "queue_full")
            if self.shared.bytes + item.size + _dedupe_cost(tid) > self.limits.queue_bytes_max:
                return self._push_failed(item, "storage_full")
            if partition is None and len(queue.partitions) >= self.limits.partitions_per_queue_max:
                return self._push_failed(item, "partition_limit")
        if partition is None:
            partition = self._partition(queue, item.partition, now_ms, records)
        version = self.versions.next()
        offset = partition.next_offset
        available_at_ms = now_ms + queue.options["delayedProcessingSeconds"] * 1000
        until_ms = now_ms + queue.options["dedupWindowSeconds"] * 1000 if tid is not None else 0
        rec.append(records, version, queue.name, partition.id, offset, tid, item.payload, item.trace_id, now_ms,
                   available_at_ms, until_ms)
        self._apply_append(queue, partition, version, offset, tid, item.payload, item.trace_id, now_ms,
                           available_at_ms, until_ms)
        self.stats.pushed += 1
        return {"index": item.index, "queue": queue.name, "partition": partition.name, "partitionId": partition.id,
                "transactionId": tid if tid is not None else f"{GENERATED_ID_PREFIX}{offset}", "status": "queued",
                "messageId": version, "offset": offset, "createdAt": now_ms}

    def _push_failed(self, item: PushItem, reason: str) -> dict:
        self.stats.push_failed += 1
        result = {"index": item.index, "queue": item.queue, "partition": item.partition, "status": "failed",
                  "reason": reason, "error": reason}
        if item.transaction_id is not None:
            result["transactionId"] = item.transaction_id
        return result

    def _apply_append(self, queue: Queue, partition: Partition, message_id: int, offset: int, tid, data: bytes,
                      trace_id, created_at_ms: int, available_at_ms: int, until_ms: int) -> None:
        partition.messages[offset] = pack_message(message_id, tid, data, trace_id, created_at_ms, available_at_ms)
        size = len(data)
        partition.next_offset = offset + 1
        partition.bytes += size
        queue.messages += 1
        queue.bytes += size
        self.shared.bytes += size
        if tid is not None:
            self._remember_producer_id(queue, partition, tid, offset, message_id, created_at_ms, until_ms)
        for name, state in partition.groups.items():
            if state.lease is None and not state.in_heap:
                self._requeue(queue, queue.groups[name], partition, state)
        self._schedule_sweep(queue, partition, created_at_ms)
        self.dirty[queue.name] = None

    # ------------------------------------------------------------------------------------------
    # Pop.

    def pop(self, op: PopOp, now_ms: int, records: list, reply_to=None, position: int = 0) -> dict | None:
        """The answer, or None when the pop was parked (answered later, in resolved)."""
        queue = self._queue(op.queue, now_ms, records, create=True)
        if queue is None:
            return {"success": False, "reason": "storage_full", "error": "storage_full", "queue": op.queue,
                    "consumerGroup": op.group, "messages": []}
        group = self._group(queue, op.group, op.mode, now_ms, records)
        if type(group) is dict:
            return group
        answer, reason = self._deliver(queue, group, op, now_ms, records)
        if answer is not None:
            return answer
        if op.wait_ms > 0 and reply_to is not None:
            groups = self.waiters.setdefault(queue.name, {})
            waiter = PopWaiter(op, now_ms + op.wait_ms, reply_to, position, now_ms)
            groups.setdefault(op.group, deque()).append(waiter)
            self.wait_deadlines.add(waiter, waiter.deadline_ms)
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
                return None, "empty"
            state = partition.groups[group.name]
            if state.lease is not None:
                if state.lease.expires_at_ms > now_ms:
                    head = partition.messages.get(state.floor)
                    held = head is not None and available_at(head) <= now_ms
                    return None, "lease_held" if held else "empty"
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
                available_at_ms, partition_id = heap[0]
                partition = queue.by_id.get(partition_id)
                state = partition.groups.get(group.name) if partition is not None else None
                if state is None:
                    heapq.heappop(heap)
                    continue
                if state.lease is not None:
                    if state.lease.expires_at_ms > now_ms:
                        heapq.heappop(heap)
                        state.in_heap = False
                        continue
                    self._expire(queue, group, state.lease, now_ms, records)
                head = partition.messages.get(state.floor) if state.floor < partition.next_offset else None
                if head is None:
                    heapq.heappop(heap)
                    state.in_heap = False
                    continue
                head_available_at_ms = available_at(head)
                if head_available_at_ms != available_at_ms:
                    heapq.heapreplace(heap, (head_available_at_ms, partition_id))
                    continue
                if available_at_ms > now_ms:
                    break  # the oldest head is not available yet: none behind it is either
                offsets, size = self._take(partition, state, now_ms, left, bytes_left, not taken)
                if not offsets:
                    break  # the byte budget is spent
                heapq.heappop(heap)
                state.in_heap = False
                taken.append((partition, offsets))
                left -= len(offsets)
                bytes_left -= size
        if not taken:
            return None, "empty"
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
        if op.auto_ack:  # resolved now; the messages were read above, before they could be removed
            for partition, offsets in taken:
                retries = partition.groups[group.name].retries
                for offset in offsets:
                    retries.pop(offset, None)
                self._settle(queue, partition, now_ms)
        first = taken[0][0]
        return {"success": True, "queue": queue.name, "partition": first.name, "partitionId": first.id,
                "leaseId": answer_lease, "consumerGroup": group.name, "expiresAt": expires_at_ms or None,
                "partitionsClaimed": len(taken), "messages": messages}, ""

    def _take(self, partition: Partition, state: GroupState, now_ms: int, count: int, bytes_left: int,
              first: bool) -> tuple[list[int], int]:
        """Unresolved, available offsets from the floor up, in order, stopping at the first that is
        not available (head of line), at count, or before the byte budget is passed (but at least
        one message in an answer)."""
        offsets, size = [], 0
        resolved = state.resolved
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
            if available_at(message) > now_ms:
                break
            message_size = payload_bytes(message)
            if size + message_size > bytes_left and (offsets or not first):
                break
            offsets.append(offset)
            size += message_size
            offset += 1
        return offsets, size

    def _apply_grant(self, queue: Queue, group: Group, lease_id: int, acquired_at_ms: int, expires_at_ms: int,
                     auto_ack: bool, deliveries: list) -> None:
        if auto_ack:
            for partition_id, offsets in deliveries:
                partition = queue.by_id[partition_id]
                state = partition.groups[group.name]
                for offset in offsets:
                    self._resolve(state, offset)
                self._requeue(queue, group, partition, state)  # no lease holds it: free for the next pop
            return
        lease = Lease(lease_id, group.name, acquired_at_ms, expires_at_ms)
        for partition_id, offsets in deliveries:
            partition = queue.by_id[partition_id]
            state = partition.groups[group.name]
            state.lease = lease
            lease.held[partition_id] = list(offsets)
        group.leases[lease_id] = lease
        self.leases[lease_id] = (queue, group, lease)
        self.shared.lease_queue[lease_id] = queue.name
        self.lease_wheel.add(lease_id, expires_at_ms)

    # ------------------------------------------------------------------------------------------
    # Resolving, floors, removal.

    def _resolve(self, state: GroupState, offset: int) -> None:
        if offset < state.floor:
            return
        if offset == state.floor:
            floor = offset + 1
            resolved = state.resolved
            while floor in resolved:
                resolved.discard(floor)
                floor += 1
            state.floor = floor
        else:
            state.resolved.add(offset)

    def _unresolve(self, state: GroupState, offset: int) -> None:
        """A DLQ entry goes back to pending: the floor comes down to it."""
        if offset >= state.floor:
            state.resolved.discard(offset)
            return
        if offset + 1 < state.floor:
            state.resolved.add_range(offset + 1, state.floor)
        state.floor = offset

    def _settle(self, queue: Queue, partition: Partition, now_ms: int) -> None:
        """After resolutions in a partition: remove what every group has resolved (at once, or
        after completedRetentionSeconds by the sweep)."""
        if not partition.groups:
            return  # no group yet: messages are kept
        low = min(state.floor for state in partition.groups.values())
        if low <= partition.removed_below:
            return
        if queue.options["completedRetentionSeconds"]:
            history = partition.completed_at
            if not history or history[-1][0] < low:
                history.append((low, now_ms))
                self._schedule_sweep(queue, partition, now_ms)
            return
        self._remove_below(queue, partition, low, dlq_too=False)

    def _remove_below(self, queue: Queue, partition: Partition, below: int, dlq_too: bool) -> None:
        messages = partition.messages
        pinned = [] if dlq_too else [state.dlq for state in partition.groups.values() if state.dlq]
        start = partition.removed_below if not dlq_too else partition.first_offset()
        for offset in range(start, below):
            message = messages.get(offset)
            if message is None or any(offset in dlq for dlq in pinned):
                continue
            del messages[offset]
            size = payload_bytes(message)
            partition.bytes -= size
            queue.messages -= 1
            queue.bytes -= size
            self.shared.bytes -= size
        if below > partition.removed_below:
            partition.removed_below = below
        if dlq_too:
            for state in partition.groups.values():
                for offset in [offset for offset in state.dlq if offset < below]:
                    del state.dlq[offset]
                if state.floor < below:
                    state.resolved.remove_range(0, below)
                    state.floor = below
                    while state.floor in state.resolved:
                        state.resolved.discard(state.floor)
                        state.floor += 1
                for offset in [offset for offset in state.retries if offset < below]:
                    del state.retries[offset]

    # ------------------------------------------------------------------------------------------
    # Ack.

    def ack(self, items: list[AckItem], now_ms: int, records: list) -> list[dict]:
        return [self.ack_one(item, now_ms, records) for item in items]

    def check_ack(self, item: AckItem, now_ms: int, in_transaction: bool = False) -> tuple[str, dict] | None:
        """What an ack would miss on, without applying it: (reason, current) or None. For a
        transaction, a message already completed passes (answered `already`) only while the lease
        named is live: a consumer whose lease expired cannot commit a step, even a retried one, and
        current.state ("completed") tells it that its earlier attempt committed."""
        found = self._ack_target(item, now_ms)
        kind = found[0]
        if kind == "already":
            if in_transaction and not self.lease_live(item.lease_id, now_ms, item.group):
                return "lease_lost", {"state": "completed"}
            return None
        if kind in ("lease_lost", "not_delivered"):
            return kind, {"state": found[1]}
        return None

    def lease_live(self, lease_id: int, now_ms: int, group: str | None = None) -> bool:
        """Whether the lease (of this shard's queues) is live, and of `group` when one is named."""
        entry = self.leases.get(lease_id)
        if entry is None:
            return False
        lease = entry[2]
        return lease.expires_at_ms > now_ms and (group is None or group == lease.group)

    def check_push(self, item: PushItem, now_ms: int, growth: Growth) -> str | None:
        """Why push_one would refuse this push now, counting what earlier pushes of the same
        transaction add (growth, updated here when it passes); None when it would not. The same
        checks in the same order as push_one's; a duplicate passes and adds nothing."""
        queue = self.queues.get(item.queue)
        if not growth.new_queue(self.shared, self.limits, item.queue, queue is not None):
            return "storage_full"
        partition = queue.partitions.get(item.partition) if queue is not None else None
        tid = item.transaction_id
        if tid is not None:
            if (item.queue, item.partition, tid) in growth.ids:
                return None
            entry = partition.dedupe.get(tid) if partition is not None else None
            if entry is not None:
                known_offset, _, _, until_ms = _DEDUPE.unpack(entry)
                if until_ms > now_ms or known_offset in partition.messages:
                    return None
        max_size = queue.options["maxSize"] if queue is not None else DEFAULT_OPTIONS["maxSize"]
        added = growth.messages.get(item.queue, 0)
        if max_size and (queue.messages if queue is not None else 0) + added >= max_size:
            return "queue_full"
        cost = item.size + _dedupe_cost(tid)
        if self.shared.bytes + growth.bytes + cost > self.limits.queue_bytes_max:
            return "storage_full"
        created = growth.partitions.setdefault(item.queue, set())
        if partition is None and item.partition not in created:
            existing = len(queue.partitions) if queue is not None else 0
            if existing + len(created) >= self.limits.partitions_per_queue_max:
                return "partition_limit"
            created.add(item.partition)
        growth.messages[item.queue] = added + 1
        growth.bytes += cost
        if tid is not None:
            growth.ids.add((item.queue, item.partition, tid))
        return None

    def _ack_target(self, item: AckItem, now_ms: int):
        """("already" | "lease_lost" | "not_delivered", state) or ("ok", queue, group, lease, partition, state, offset)."""
        name = self.shared.partition_queue.get(item.partition_id)
        queue = self.queues.get(name) if name is not None else None
        partition = queue.by_id.get(item.partition_id) if queue is not None else None
        if partition is None:
            return "lease_lost", "unknown"
        entry = self.leases.get(item.lease_id)
        lease = entry[2] if entry is not None and entry[0] is queue else None
        group_name = item.group
        if group_name is None:
            group_name = lease.group if lease is not None else self.ended_leases.get(item.lease_id, QUEUE_MODE_GROUP)
        state = partition.groups.get(group_name)
        offset = self._offset_of(partition, item)
        if offset is not None and offset >= partition.next_offset:
            return "not_delivered", "unknown"  # never appended: judged before any set of offsets is asked
        if state is not None and offset is not None and self._completed(state, offset):
            return "already", "completed"
        message_state = self._state_name(partition, state, offset) if state is not None and offset is not None else "unknown"
        if lease is None or lease.expires_at_ms <= now_ms or item.partition_id not in lease.held or \
                (item.group is not None and item.group != lease.group):
            return "lease_lost", message_state
        if offset is None or offset not in lease.held[item.partition_id]:
            return "not_delivered", message_state
        return "ok", queue, queue.groups[lease.group], lease, partition, partition.groups[lease.group], offset

    @staticmethod
    def _offset_of(partition: Partition, item: AckItem) -> int | None:
        if item.offset is not None:
            return item.offset
        tid = item.transaction_id
        if tid.startswith(GENERATED_ID_PREFIX):
            digits = tid[len(GENERATED_ID_PREFIX):]
            return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else None
        entry = partition.dedupe.get(tid)
        return _DEDUPE.unpack(entry)[0] if entry is not None else None

    @staticmethod
    def _completed(state: GroupState, offset: int) -> bool:
        return (offset < state.floor or offset in state.resolved) and offset not in state.dlq

    def _state_name(self, partition: Partition, state: GroupState, offset: int) -> str:
        if offset in state.dlq:
            return "dlq"
        if self._completed(state, offset):
            return "completed"
        if offset >= partition.next_offset:
            return "unknown"
        lease = state.lease
        if lease is not None and offset in lease.held.get(partition.id, ()):
            return "inFlight"
        return "pending"

    def ack_together(self, items: list[AckItem], now_ms: int, records: list) -> list[dict]:
        """A transaction's acks on this shard, every one already checked: all apply, and a lease
        partition one of them ends (a failed or dead-lettered message, or the last one completed)
        ends after the last of them, so no ack of the same step finds its lease gone."""
        ending: dict[tuple, list] = {}
        results = [self.ack_one(item, now_ms, records, ending) for item in items]
        ended = set()
        for (lease_id, partition_id), (queue, group, lease, must_end) in ending.items():
            held = lease.held.get(partition_id)
            if held is not None and (must_end or not held):
                self._lease_end(queue, group, lease, partition_id, now_ms, records)
                ended.add((lease_id, partition_id))
        for item, result in zip(items, results, strict=True):
            if "leaseReleased" in result:
                result["leaseReleased"] = (item.lease_id, item.partition_id) in ended
        return results

    def ack_one(self, item: AckItem, now_ms: int, records: list, ending: dict | None = None) -> dict:
        """ending: a transaction's, to end lease partitions after its last ack instead of at once."""
        found = self._ack_target(item, now_ms)
        base = {"index": item.index, "partitionId": item.partition_id}
        kind = found[0]
        if kind == "already":
            offset = self._offset_of_known(item)
            return {**base, "offset": offset, "transactionId": item.transaction_id, "success": True, "already": True}
        if kind != "ok":
            return {**base, "offset": item.offset, "transactionId": item.transaction_id, "success": False,
                    "reason": kind, "error": kind}
        _, queue, group, lease, partition, state, offset = found
        message = partition.messages.get(offset)
        tid = transaction_id_of(message) if message is not None else None
        if tid is None:
            tid = f"{GENERATED_ID_PREFIX}{offset}"
        retry = state.retries.get(offset, 0)
        dlq = False
        if item.status == "completed":
            self._message_state(queue, group.name, partition, offset, "completed", retry, None, now_ms, records)
            released = not lease.held[partition.id]
            if ending is not None:
                ending.setdefault((lease.lease_id, partition.id), [queue, group, lease, False])
            elif released:
                self._lease_end(queue, group, lease, partition.id, now_ms, records)
        else:
            retry += 1
            dlq = item.status == "dlq" or (retry > queue.options["retryLimit"] and queue.options["dlqAfterMaxRetries"])
            error = item.error if item.error is not None else None
            self._message_state(queue, group.name, partition, offset, "dlq" if dlq else "pending", retry,
                                error if dlq else None, now_ms, records)
            if not dlq:
                self.stats.redelivered_failed += 1
            released = True
            if ending is not None:
                ending.setdefault((lease.lease_id, partition.id), [queue, group, lease, True])[3] = True
            elif partition.id in lease.held:
                self._lease_end(queue, group, lease, partition.id, now_ms, records)
        return {**base, "offset": offset, "transactionId": tid, "success": True, "leaseReleased": released,
                "dlq": dlq, "retryCount": retry}

    def _offset_of_known(self, item: AckItem) -> int | None:
        name = self.shared.partition_queue.get(item.partition_id)
        queue = self.queues.get(name) if name is not None else None
        partition = queue.by_id.get(item.partition_id) if queue is not None else None
        return self._offset_of(partition, item) if partition is not None else item.offset

    def _message_state(self, queue: Queue, group: str, partition: Partition, offset: int, state: str, retry: int,
                       error, now_ms: int, records: list) -> None:
        version = self.versions.next()
        rec.message_state(records, version, queue.name, group, partition.id, offset, state, retry, error, now_ms)
        if state == "dlq":
            self.stats.dlq_moves += 1
        self._apply_message_state(queue, group, partition, offset, state, retry, error, now_ms)

    def _apply_message_state(self, queue: Queue, group: str, partition: Partition, offset: int, state_name: str,
                             retry: int, error, at_ms: int) -> None:
        state = partition.groups[group]
        lease = state.lease
        if lease is not None:
            held = lease.held.get(partition.id)
            if held is not None and offset in held:
                held.remove(offset)
        if state_name == "completed":
            self._resolve(state, offset)
            state.retries.pop(offset, None)
            self._settle(queue, partition, at_ms)
        elif state_name == "pending":
            if offset in state.dlq:  # requeued from the DLQ
                del state.dlq[offset]
                self._unresolve(state, offset)
            if retry:
                state.retries[offset] = retry
            else:
                state.retries.pop(offset, None)
            if state.lease is None:
                self._requeue(queue, queue.groups[group], partition, state)
        elif state_name == "dlq":
            state.dlq[offset] = (error, at_ms)
            state.retries[offset] = retry
            self._resolve(state, offset)
            self._settle(queue, partition, at_ms)
        else:  # purged: the DLQ entry is dropped, the message stays resolved
            state.dlq.pop(offset, None)
            state.retries.pop(offset, None)
            self._settle(queue, partition, at_ms)
            if offset < partition.removed_below:
                self._drop_one(queue, partition, offset)
        self.dirty[queue.name] = None

    def _drop_one(self, queue: Queue, partition: Partition, offset: int) -> None:
        """A message below the removal point that a DLQ held: once no DLQ holds it, it goes."""
        if any(offset in state.dlq for state in partition.groups.values()):
            return
        message = partition.messages.pop(offset, None)
        if message is not None:
            size = payload_bytes(message)
            partition.bytes -= size
            queue.messages -= 1
            queue.bytes -= size
            self.shared.bytes -= size

    # ------------------------------------------------------------------------------------------
    # Leases: end, expiry, extend, release.

    def _lease_end(self, queue: Queue, group: Group, lease: Lease, partition_id: int, now_ms: int, records: list) -> None:
        version = self.versions.next()
        rec.lease_end(records, version, queue.name, group.name, lease.lease_id, partition_id, now_ms)
        self._apply_lease_end(queue, group, lease, partition_id)

    def _apply_lease_end(self, queue: Queue, group: Group, lease: Lease, partition_id: int) -> None:
        ending = list(lease.held) if partition_id == 0 else [partition_id]
        for pid in ending:
            lease.held.pop(pid, None)
            partition = queue.by_id.get(pid)
            if partition is None:
                continue
            state = partition.groups.get(group.name)
            if state is not None and state.lease is lease:
                state.lease = None
                self._requeue(queue, group, partition, state)
        if not lease.held:
            group.leases.pop(lease.lease_id, None)
            self.leases.pop(lease.lease_id, None)
            self.shared.lease_queue.pop(lease.lease_id, None)
            self.lease_wheel.remove(lease.lease_id)
            self._remember_ended(lease)
        self.dirty[queue.name] = None

    def _remember_ended(self, lease: Lease) -> None:
        """Which group an ended lease was of, for a while: a retried ack that names no group still
        finds its message completed (answered already) after the lease auto-released."""
        self.ended_leases[lease.lease_id] = lease.group
        if len(self.ended_leases) > ENDED_LEASES_KEPT:
            del self.ended_leases[next(iter(self.ended_leases))]

    def _expire(self, queue: Queue, group: Group, lease: Lease, now_ms: int, records: list) -> None:
        """The lease's time passed: each message it delivered and that is still unresolved counts a
        delivery that ended without completion; the lease ends everywhere."""
        options = queue.options
        for partition_id, offsets in list(lease.held.items()):
            partition = queue.by_id.get(partition_id)
            if partition is None:
                continue
            state = partition.groups[group.name]
            for offset in list(offsets):
                retry = state.retries.get(offset, 0) + 1
                dlq = retry > options["retryLimit"] and options["dlqAfterMaxRetries"]
                self._message_state(queue, group.name, partition, offset, "dlq" if dlq else "pending", retry,
                                    "lease_expired" if dlq else None, now_ms, records)
                if not dlq:
                    self.stats.redelivered_expired += 1
        self._lease_end(queue, group, lease, 0, now_ms, records)

    def extend(self, lease_id: int, seconds: int | None, now_ms: int, records: list) -> dict:
        entry = self.leases.get(lease_id)
        if entry is None or entry[2].expires_at_ms <= now_ms or not entry[2].held:
            return {"leaseId": lease_id, "success": False, "reason": "lease_lost", "error": "lease_lost"}
        queue, group, lease = entry
        seconds = seconds if seconds is not None else queue.options["leaseTimeSeconds"]
        expires_at_ms = max(lease.expires_at_ms, now_ms + seconds * 1000)
        if expires_at_ms != lease.expires_at_ms:
            version = self.versions.next()
            rec.lease_extend(records, version, queue.name, group.name, lease_id, expires_at_ms)
            self._apply_lease_extend(lease, expires_at_ms)
        return {"leaseId": lease_id, "success": True, "expiresAt": lease.expires_at_ms,
                "partitions": self._lease_partitions(queue, lease)}

    def _apply_lease_extend(self, lease: Lease, expires_at_ms: int) -> None:
        lease.expires_at_ms = expires_at_ms
        self.lease_wheel.add(lease.lease_id, expires_at_ms)

    def release(self, lease_id: int, now_ms: int, records: list) -> dict:
        entry = self.leases.get(lease_id)
        if entry is None or entry[2].expires_at_ms <= now_ms or not entry[2].held:
            return {"leaseId": lease_id, "success": False, "reason": "lease_lost", "error": "lease_lost"}
        queue, group, lease = entry
        partitions = self._lease_partitions(queue, lease)
        self._lease_end(queue, group, lease, 0, now_ms, records)
        return {"leaseId": lease_id, "success": True, "partitions": partitions}

    @staticmethod
    def _lease_partitions(queue: Queue, lease: Lease) -> list[dict]:
        out = []
        for partition_id in lease.held:
            partition = queue.by_id.get(partition_id)
            if partition is not None:
                out.append({"queue": queue.name, "partition": partition.name, "partitionId": partition_id})
        return out

    def owns_lease(self, lease_id: int) -> bool:
        return lease_id in self.leases

    # ------------------------------------------------------------------------------------------
    # The ready heaps and waiters.

    def _requeue(self, queue: Queue, group: Group, partition: Partition, state: GroupState) -> None:
        """Put a partition in the group's ready heap if it may deliver (checked again when popped)."""
        if state.in_heap or state.lease is not None or state.floor >= partition.next_offset:
            return
        head = partition.messages.get(state.floor)
        if head is None:
            return
        heapq.heappush(group.ready, (available_at(head), partition.id))
        state.in_heap = True

    def after_step(self, now_ms: int, records: list) -> None:
        """Serve parked pops of the queues something happened to, oldest first per group."""
        if not self.dirty:
            return
        dirty, self.dirty = self.dirty, {}
        for name in dirty:
            self._serve(name, now_ms, records)

    def _serve(self, name: str, now_ms: int, records: list) -> None:
        groups = self.waiters.get(name)
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
                if type(group) is dict:
                    break
                answer, _ = self._deliver(queue, group, waiter.op, now_ms, records)
                if answer is None:
                    break
                waiting.popleft()
                self.wait_deadlines.remove(waiter)
                self.stats.pop_waits += 1
                self.stats.pop_wait_ms_total += now_ms - waiter.parked_at_ms
                self.resolved.append((waiter.reply_to, waiter.position, answer))
            if not waiting:
                del groups[group_name]
        if not groups:
            del self.waiters[name]

    def _unpark(self, waiter: PopWaiter) -> bool:
        groups = self.waiters.get(waiter.op.queue)
        waiting = groups.get(waiter.op.group) if groups is not None else None
        if waiting is None or waiter not in waiting:
            return False
        waiting.remove(waiter)
        if not waiting:
            del groups[waiter.op.group]
            if not groups:
                del self.waiters[waiter.op.queue]
        return True

    def abandon(self, reply_to) -> None:
        """Answer and forget the parked pops of a client that hung up: never hand them anything."""
        for groups in list(self.waiters.values()):
            for waiting in list(groups.values()):
                for waiter in [w for w in waiting if w.reply_to is reply_to]:
                    self._unpark(waiter)
                    self.wait_deadlines.remove(waiter)
                    self.resolved.append((reply_to, waiter.position, {**_nothing(waiter.op, "cancelled")}))

    def drain(self) -> None:
        """At shutdown: every parked pop is answered shutting_down."""
        for groups in list(self.waiters.values()):
            for waiting in list(groups.values()):
                for waiter in list(waiting):
                    self._unpark(waiter)
                    self.resolved.append((waiter.reply_to, waiter.position, {
                        "_unavailable": ("shutting_down", "the server is shutting down")}))

    # ------------------------------------------------------------------------------------------
    # Time.

    def tick(self, now_ms: int, records: list) -> None:
        for lease_id in self.lease_wheel.advance(now_ms):
            entry = self.leases.get(lease_id)
            if entry is None:
                continue
            queue, group, lease = entry
            if lease.expires_at_ms > now_ms:
                self.lease_wheel.add(lease_id, lease.expires_at_ms)
                continue
            self._expire(queue, group, lease, now_ms, records)
        for waiter in self.wait_deadlines.advance(now_ms):
            if self._unpark(waiter):
                self.resolved.append((waiter.reply_to, waiter.position, _nothing(waiter.op, "timeout")))
        for queue_name, partition_id in self.sweep_wheel.advance(now_ms):
            queue = self.queues.get(queue_name)
            partition = queue.by_id.get(partition_id) if queue is not None else None
            if partition is not None:
                self._sweep(queue, partition, now_ms, records)
        for queue in self.queues.values():
            self._forget_producer_ids(queue, now_ms)
        self.timers.tick(now_ms, records)
        for name in self.waiters:  # a delay may have run out
            self.dirty[name] = None

    def _schedule_sweep(self, queue: Queue, partition: Partition, now_ms: int) -> None:
        options = queue.options
        due = []
        if options["retentionSeconds"] and partition.messages:
            head = partition.messages[partition.first_offset()]
            due.append(created_at(head) + options["retentionSeconds"] * 1000)
        if options["completedRetentionSeconds"] and partition.completed_at:
            due.append(partition.completed_at[0][1] + options["completedRetentionSeconds"] * 1000)
        if due:
            self.sweep_wheel.schedule((queue.name, partition.id), max(min(due), now_ms))

    def _sweep(self, queue: Queue, partition: Partition, now_ms: int, records: list) -> None:
        """Retention: remove the messages it allows to go, as a record."""
        options = queue.options
        below = partition.removed_below
        dlq_too = False
        if options["completedRetentionSeconds"]:
            keep_ms = options["completedRetentionSeconds"] * 1000
            history = partition.completed_at
            while history and history[0][1] + keep_ms <= now_ms:
                below = max(below, history.popleft()[0])
        if options["retentionSeconds"]:
            keep_ms = options["retentionSeconds"] * 1000
            in_flight = set()
            for state in partition.groups.values():
                if state.lease is not None and state.lease.expires_at_ms > now_ms:
                    in_flight.update(state.lease.held.get(partition.id, ()))
            for offset, message in partition.messages.items():
                if created_at(message) + keep_ms > now_ms or offset in in_flight:
                    break
                below = max(below, offset + 1)
                dlq_too = True
        if below > partition.removed_below or (dlq_too and below > partition.first_offset()):
            version = self.versions.next()
            rec.remove(records, version, queue.name, partition.id, below, dlq_too, now_ms)
            self._apply_remove(queue, partition, below, dlq_too)
        self._schedule_sweep(queue, partition, now_ms)

    def _apply_remove(self, queue: Queue, partition: Partition, below: int, dlq_too: bool) -> None:
        self._remove_below(queue, partition, below, dlq_too)
        for name, state in partition.groups.items():
            if state.lease is None:
                self._requeue(queue, queue.groups[name], partition, state)
        self.dirty[queue.name] = None

    def _remember_producer_id(self, queue: Queue, partition: Partition, tid: str, offset: int, message_id: int,
                              created_at_ms: int, until_ms: int) -> None:
        """Known from now to until_ms (and while its message is retained), at the back of the
        partition's oldest-first order."""
        if partition.dedupe.pop(tid, None) is None:
            self.shared.bytes += _dedupe_cost(tid)
        partition.dedupe[tid] = _DEDUPE.pack(offset, message_id, created_at_ms, until_ms)
        if not partition.dedupe_due_ms:
            self._schedule_forgetting(queue, partition, until_ms)

    @staticmethod
    def _schedule_forgetting(queue: Queue, partition: Partition, due_ms: int) -> None:
        partition.dedupe_due_ms = due_ms
        heapq.heappush(queue.dedupe_due, (due_ms, partition.id))

    def _forget_producer_ids(self, queue: Queue, now_ms: int) -> None:
        """Forget producer ids whose window has passed and whose message is gone, walking each due
        partition's ids oldest first: one whose message is retained moves to the back, to be looked
        at again in a minute; the walk stops at the first whose window is still open."""
        due = queue.dedupe_due
        while due and due[0][0] <= now_ms:
            due_ms, partition_id = heapq.heappop(due)
            partition = queue.by_id.get(partition_id)
            if partition is None or partition.dedupe_due_ms != due_ms:
                continue  # deleted, or rescheduled since
            partition.dedupe_due_ms = 0
            dedupe = partition.dedupe
            forget, keep, next_due_ms = [], [], 0
            for tid, entry in dedupe.items():
                if len(forget) + len(keep) >= DEDUPE_SWEEP_BUDGET:
                    next_due_ms = now_ms + 1  # the rest at the next tick
                    break
                offset, message_id, created_at_ms, until_ms = _DEDUPE.unpack(entry)
                if until_ms > now_ms:
                    next_due_ms = until_ms
                    break
                if offset in partition.messages:
                    keep.append((tid, offset, message_id, created_at_ms))
                else:
                    forget.append(tid)
            for tid in forget:
                del dedupe[tid]
                self.shared.bytes -= _dedupe_cost(tid)
            for tid, offset, message_id, created_at_ms in keep:
                del dedupe[tid]
                dedupe[tid] = _DEDUPE.pack(offset, message_id, created_at_ms, now_ms + DEDUPE_RECHECK_MS)
            if keep and not next_due_ms:
                next_due_ms = now_ms + DEDUPE_RECHECK_MS
            if next_due_ms:
                self._schedule_forgetting(queue, partition, max(next_due_ms, now_ms))

    # ------------------------------------------------------------------------------------------
    # DLQ, deletion.

    def dlq_list(self, name: str, group: str | None, partition_name: str | None, cursor: str | None,
                 skip: int, limit: int) -> dict:
        queue = self.queues.get(name)
        entries = []
        if queue is not None:
            for partition in queue.partitions.values():
                if partition_name is not None and partition.name != partition_name:
                    continue
                for group_name, state in partition.groups.items():
                    if group is not None and group_name != group:
                        continue
                    for offset, (error, at_ms) in state.dlq.items():
                        entries.append((at_ms, partition.id, offset, group_name, partition, error, state))
        entries.sort(key=lambda e: e[:4])
        total = len(entries)
        if cursor is not None:
            entries = [e for e in entries if tuple(e[:4]) > cursor]
        entries = entries[skip:]
        page = entries[:limit]
        messages = []
        for at_ms, partition_id, offset, group_name, partition, error, state in page:
            packed = partition.messages.get(offset)
            message_id, tid, data, _, created_at_ms, _ = unpack_message(packed) if packed else (None,) * 6
            messages.append({"queue": name, "partition": partition.name, "partitionId": partition_id,
                             "consumerGroup": group_name, "messageId": message_id,
                             "offset": offset, "transactionId": tid if tid is not None else f"{GENERATED_ID_PREFIX}{offset}",
                             "data": Fragment(data) if packed else None, "createdAt": created_at_ms,
                             "retryCount": state.retries.get(offset, 0), "error": error, "dlqAt": at_ms})
        next_cursor = _encode_dlq_cursor(page[-1][:4]) if len(entries) > limit else None
        return {"messages": messages, "total": total, "cursor": next_cursor}

    def requeue(self, name: str, group: str, items: list, now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        results = []
        for index, (partition_id, offset) in enumerate(items):
            partition = queue.by_id.get(partition_id) if queue is not None else None
            state = partition.groups.get(group) if partition is not None else None
            if state is None or offset >= partition.next_offset or offset not in state.dlq:
                results.append({"index": index, "requeued": False, "reason": "absent"})
                continue
            self._message_state(queue, group, partition, offset, "pending", 0, None, now_ms, records)
            results.append({"index": index, "requeued": True})
        return {"results": results}

    def purge(self, name: str, group: str | None, now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        purged = 0
        if queue is not None:
            for partition in list(queue.partitions.values()):
                for group_name, state in list(partition.groups.items()):
                    if group is not None and group_name != group:
                        continue
                    for offset in list(state.dlq):
                        self._message_state(queue, group_name, partition, offset, "purged", state.retries.get(offset, 0),
                                            None, now_ms, records)
                        purged += 1
        return {"purged": purged}

    def delete_queue(self, name: str, now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        if queue is None:
            return {"deleted": False, "reason": "absent"}
        messages = queue.messages
        timers = len(self.timers.pending.get(name, ()))
        version = self.versions.next()
        rec.queue_delete(records, version, name)
        self._apply_queue_delete(queue)
        return {"deleted": True, "messages": messages, "timers": timers}

    def _apply_queue_delete(self, queue: Queue) -> None:
        for group in queue.groups.values():
            for lease_id in group.leases:
                self.leases.pop(lease_id, None)
                self.shared.lease_queue.pop(lease_id, None)
                self.lease_wheel.remove(lease_id)
        for partition in queue.partitions.values():
            self.shared.partition_queue.pop(partition.id, None)
            self.sweep_wheel.remove((queue.name, partition.id))
            for tid in partition.dedupe:
                self.shared.bytes -= _dedupe_cost(tid)
        self.shared.bytes -= queue.bytes
        self.shared.queues -= 1
        del self.queues[queue.name]
        self.timers.drop_queue(queue.name)

    def delete_group(self, name: str, group_name: str, now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        if queue is None or group_name not in queue.groups:
            return {"deleted": False, "reason": "absent"}
        version = self.versions.next()
        rec.group_delete(records, version, name, group_name)
        self._apply_group_delete(queue, group_name, now_ms)
        return {"deleted": True}

    def _apply_group_delete(self, queue: Queue, group_name: str, now_ms: int) -> None:
        group = queue.groups.pop(group_name)
        for lease_id in group.leases:
            self.leases.pop(lease_id, None)
            self.shared.lease_queue.pop(lease_id, None)
            self.lease_wheel.remove(lease_id)
        for partition in queue.partitions.values():
            partition.groups.pop(group_name, None)
            self._settle(queue, partition, now_ms)

    # ------------------------------------------------------------------------------------------
    # Admin views: read from live state.

    def _counts(self, partition: Partition, state: GroupState, now_ms: int) -> tuple[int, int, int]:
        """(pending, inFlight, dlq) of one group in one partition."""
        lease = state.lease
        in_flight = len(lease.held.get(partition.id, ())) if lease is not None and lease.expires_at_ms > now_ms else 0
        unresolved = state.unresolved(partition.next_offset)
        return unresolved - in_flight, in_flight, len(state.dlq)

    def queue_summaries(self, prefix: str, after: str | None, limit: int, now_ms: int) -> list[dict]:
        """This shard's part of a page of the queue listing: up to limit+1 queues after `after`."""
        names = sorted(name for name in self.queues if name.startswith(prefix) and (after is None or name > after))
        out = []
        for name in names[:limit + 1]:
            queue = self.queues[name]
            pending = in_flight = dlq = 0
            for partition in queue.partitions.values():
                for state in partition.groups.values():
                    p, f, d = self._counts(partition, state, now_ms)
                    pending += p
                    in_flight += f
                    dlq += d
            out.append({"queue": name, "createdAt": queue.created_at_ms, "partitions": len(queue.partitions),
                        "messages": queue.messages, "pending": pending, "inFlight": in_flight, "dlq": dlq,
                        "timers": len(self.timers.pending.get(name, ())), "groups": sorted(queue.groups)})
        return out

    def queue_info(self, name: str, now_ms: int) -> dict:
        queue = self.queues.get(name)
        if queue is None:
            return {"found": False, "queue": name}
        groups = []
        for group in queue.groups.values():
            pending = in_flight = dlq = 0
            for partition in queue.partitions.values():
                p, f, d = self._counts(partition, partition.groups[group.name], now_ms)
                pending += p
                in_flight += f
                dlq += d
            leases = sum(1 for lease in group.leases.values() if lease.expires_at_ms > now_ms and lease.held)
            groups.append({"consumerGroup": group.name, "subscriptionMode": group.mode, "joinedAt": group.joined_at_ms,
                           "pending": pending, "inFlight": in_flight, "dlq": dlq, "leases": leases})
        return {"found": True, "queue": name, "createdAt": queue.created_at_ms, "options": dict(queue.options),
                "partitions": len(queue.partitions), "messages": queue.messages, "bytes": queue.bytes,
                "timers": self.timers.summary(name), "groups": groups}

    def partitions_page(self, name: str, group: str | None, prefix: str, after: str | None, limit: int,
                        now_ms: int) -> dict:
        queue = self.queues.get(name)
        if queue is None:
            return {"items": [], "after": None}
        names = sorted(n for n in queue.partitions if n.startswith(prefix) and (after is None or n > after))
        items = []
        for partition_name in names[:limit]:
            partition = queue.partitions[partition_name]
            groups = []
            for group_name, state in partition.groups.items():
                if group is not None and group_name != group:
                    continue
                pending, in_flight, dlq = self._counts(partition, state, now_ms)
                lease = state.lease
                live = lease is not None and lease.expires_at_ms > now_ms
                groups.append({"consumerGroup": group_name, "ackFloor": state.floor, "pending": pending,
                               "inFlight": in_flight, "dlq": dlq,
                               "lease": {"leaseId": lease.lease_id, "acquiredAt": lease.acquired_at_ms,
                                         "expiresAt": lease.expires_at_ms} if live else None})
            items.append({"partition": partition.name, "partitionId": partition.id, "createdAt": partition.created_at_ms,
                          "firstOffset": partition.first_offset(), "nextOffset": partition.next_offset,
                          "messages": len(partition.messages), "groups": groups})
        return {"items": items, "after": names[limit - 1] if len(names) > limit else None}

    def metrics(self, now_ms: int) -> list[tuple[str, str, str, int]]:
        """(queue, group, what, value) gauges: messages (group ""), pending, in_flight, dlq."""
        out = []
        for queue in self.queues.values():
            out.append((queue.name, "", "messages", queue.messages))
            for group in queue.groups.values():
                pending = in_flight = dlq = 0
                for partition in queue.partitions.values():
                    p, f, d = self._counts(partition, partition.groups[group.name], now_ms)
                    pending += p
                    in_flight += f
                    dlq += d
                out += [(queue.name, group.name, "pending", pending), (queue.name, group.name, "in_flight", in_flight),
                        (queue.name, group.name, "dlq", dlq)]
        return out

    # ------------------------------------------------------------------------------------------
    # Replay and snapshots.

    def replay(self, record) -> None:
        kind = type(record)
        if kind is rec.QueueSet:
            self._apply_queue_set(record.version, record.queue, record.created_at_ms, record.options)
            return
        queue = self.queues[record.queue]
        if kind is rec.Append:
            self._apply_append(queue, queue.by_id[record.partition_id], record.version, record.offset,
                               record.transaction_id, record.data, record.trace_id, record.created_at_ms,
                               record.available_at_ms, record.dedupe_until_ms)
        elif kind is rec.MessageState:
            self._apply_message_state(queue, record.group, queue.by_id[record.partition_id], record.offset, record.state,
                                      record.retry_count, record.error, record.at_ms)
        elif kind is rec.Grant:
            self._apply_grant(queue, queue.groups[record.group], record.version, record.acquired_at_ms,
                              record.expires_at_ms, record.auto_ack, record.deliveries)
            if record.auto_ack:
                for partition_id, _ in record.deliveries:
                    self._settle(queue, queue.by_id[partition_id], record.acquired_at_ms)
        elif kind is rec.LeaseEnd:
            entry = self.leases.get(record.lease_id)
            if entry is not None:
                self._apply_lease_end(queue, entry[1], entry[2], record.partition_id)
        elif kind is rec.LeaseExtend:
            entry = self.leases.get(record.lease_id)
            if entry is not None:
                self._apply_lease_extend(entry[2], record.expires_at_ms)
        elif kind is rec.PartitionCreate:
            self._apply_partition(queue, record.version, record.name, record.created_at_ms)
        elif kind is rec.GroupJoin:
            self._apply_group_join(queue, record.version, record.group, record.mode, record.joined_at_ms)
        elif kind is rec.GroupDelete:
            self._apply_group_delete(queue, record.group, 0)
        elif kind is rec.QueueDelete:
            self._apply_queue_delete(queue)
        elif kind is rec.Remove:
            self._apply_remove(queue, queue.by_id[record.partition_id], record.below_offset, record.dlq_too)
        elif kind is rec.GroupPartition:
            self._apply_group_partition(queue, record, BitMap64.deserialize(record.resolved))
        elif kind is rec.GroupPartition32:
            self._apply_group_partition(queue, record, BitMap64(BitMap.deserialize(record.resolved)))
        elif kind is rec.PartitionState:
            partition = queue.by_id[record.partition_id]
            partition.next_offset = record.next_offset
            partition.removed_below = record.removed_below
        elif kind is rec.PartitionMessages:
            self._apply_messages(queue, queue.by_id[record.partition_id], record)
        elif kind in _TIMER_RECORDS:
            self.timers.replay(record)
        elif kind is rec.Dedupe:
            partition = queue.by_id[record.partition_id]
            if len(record.entries) != len(record.ids) * _DEDUPE.size:
                raise ValueError(f"a dedupe record of {len(record.ids)} ids holds {len(record.entries)} bytes")
            for tid, entry in zip(record.ids, _DEDUPE.iter_unpack(record.entries), strict=True):
                self._remember_producer_id(queue, partition, tid, *entry)
        else:
            raise ValueError(f"not a queue record: {record!r}")

    def _apply_messages(self, queue: Queue, partition: Partition, record) -> None:
        """A snapshot's messages of one partition, taken in whole (the effects of _apply_append,
        once for all of them)."""
        offsets, lengths, blob = read_int_array("q", record.offsets), read_int_array("I", record.lengths), record.packed
        if sum(lengths) != len(blob) or not offsets:
            raise ValueError(f"a messages record of {len(offsets)} messages holds {len(blob)} bytes")
        messages = partition.messages
        size = position = 0
        for offset, length in zip(offsets, lengths, strict=True):
            packed = blob[position:position + length]
            position += length
            messages[offset] = packed
            size += payload_bytes(packed)
        partition.next_offset = max(partition.next_offset, offsets[-1] + 1)
        partition.bytes += size
        queue.messages += len(offsets)
        queue.bytes += size
        self.shared.bytes += size
        self._schedule_sweep(queue, partition, created_at(packed))
        self.dirty[queue.name] = None

    def _apply_group_partition(self, queue: Queue, record, resolved: BitMap64) -> None:
        partition = queue.by_id[record.partition_id]
        state = partition.groups[record.group]
        state.floor = record.floor
        state.resolved = resolved
        retries = record.retries
        state.retries = {retries[i]: retries[i + 1] for i in range(0, len(retries), 2)}
        dlq = record.dlq
        state.dlq = {dlq[i]: (dlq[i + 1], dlq[i + 2]) for i in range(0, len(dlq), 3)}
        # The group's join already put the partition in its ready heap when it had a head; that
        # entry stays (its key is corrected when it comes up). A second entry would let one pop
        # take the partition twice.
        self._requeue(queue, queue.groups[record.group], partition, state)

    def snapshot_copy(self):
        """A consistent copy of every queue, cheap enough to take at a batch edge: messages are
        immutable, so a shallow copy of each partition's dict does; mutable group states are copied."""
        copies = []
        for queue in self.queues.values():
            partitions = []
            for partition in queue.partitions.values():
                states = [(name, state.floor, state.resolved.copy(), dict(state.retries), dict(state.dlq))
                          for name, state in partition.groups.items()]
                partitions.append((partition.id, partition.name, partition.created_at_ms, dict(partition.messages),
                                   states, dict(partition.dedupe), partition.next_offset, partition.removed_below))
            groups = [(g.join_version, g.name, g.mode, g.joined_at_ms) for g in queue.groups.values()]
            leases = [(lease.lease_id, g.name, lease.acquired_at_ms, lease.expires_at_ms,
                       [[pid, list(offsets)] for pid, offsets in lease.held.items()])
                      for g in queue.groups.values() for lease in g.leases.values() if lease.held]
            copies.append((queue.version, queue.name, queue.created_at_ms, dict(queue.options), partitions, groups, leases,
                           self.timers.snapshot_copy(queue.name)))
        return copies


def snapshot_records(copies, out: list) -> None:
    """The records that rebuild the queues of snapshot_copy()'s copies, in an order replay accepts."""
    for version, name, created_at_ms, options, partitions, groups, leases, timers in copies:
        rec.queue_set(out, version, name, created_at_ms, options)
        TimerTable.snapshot_records(name, timers, out)
        for partition_id, partition_name, partition_created, messages, _, dedupe, next_offset, removed_below in partitions:
            rec.partition(out, partition_id, name, partition_name, partition_created)
            if messages:
                out += (30, name, partition_id, int_array("q", messages.keys()),
                        int_array("I", map(len, messages.values())), b"".join(messages.values()))
            if dedupe:
                out += (28, name, partition_id, list(dedupe), b"".join(dedupe.values()))
            out += (29, name, partition_id, next_offset, removed_below)
        for join_version, group, mode, joined_at_ms in groups:
            rec.group_join(out, join_version, name, group, mode, joined_at_ms)
        for partition_id, _, _, _, states, _, _, _ in partitions:
            for group, floor, resolved, retries, dlq in states:
                rec.group_partition(out, name, group, partition_id, floor, resolved.serialize(),
                                    [x for item in retries.items() for x in item],
                                    [x for offset, (error, at_ms) in dlq.items() for x in (offset, error, at_ms)])
        for lease_id, group, acquired_at_ms, expires_at_ms, deliveries in leases:
            rec.grant(out, lease_id, name, group, acquired_at_ms, expires_at_ms, False, deliveries)


_TIMER_RECORDS = (rec.TimerSet, rec.TimerCancel, rec.TimerFired, rec.PendingTimers)


def _nothing(op: PopOp, reason: str) -> dict:
    return {"success": False, "reason": reason, "error": reason, "queue": op.queue, "consumerGroup": op.group,
            "messages": []}


def _dedupe_cost(tid) -> int:
    return 0 if tid is None else len(tid) + DEDUPE_ENTRY_BYTES


def _encode_dlq_cursor(key: tuple) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode().rstrip("=")
