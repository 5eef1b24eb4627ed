"""The timers of one shard's queues: messages scheduled into a queue partition for later, named by
(queue, key), fired by the tick into their partition.

Model:
  - A pending timer is one packed bytes value (below) in a plain dict per queue, keyed by its key:
    a dict of bytes is never tracked by Python's cyclic GC, so ten million pending timers cost the
    collector nothing (see the same choice for messages in queen/core/queues/packed.py).
  - When they fall due: a hashed timing wheel of 50 ms slots, each slot one bytearray of packed
    (at_ms, version, queue, key) entries, in a dict by absolute slot number. A tick looks at the
    slots from the last one it visited up to now's, so it costs what falls due in it, however many
    are pending. No entry is a Python object: a million pending timers give the cyclic GC nothing
    to walk (a heap of tuples did: each full collection walked its list, tens of ms on the event
    loop). Moving or cancelling a timer leaves its old entry behind, recognized as stale by its
    version when its slot comes up; the slots are rebuilt when stale entries outnumber live ones.
  - Fires of one tick go in (at_ms, version) order, so a partition receives its timers in time
    order.
  - A fire is one step: a `timer_fired` record (the timer is gone) and the push of its message,
    exempt from the queue's capacity (a due timer is never refused), in the same frame, so after
    any crash either both happened or neither and the timer fires after the restart. Its message
    is created at the fire time; a producer id already known in the partition makes it a
    duplicate (the timer is gone, nothing appended).
  - A recurring timer (queen/core/recurrence.py) is a pending timer like the others, due at its
    next period, plus its packed schedule in `recurring` (bytes again: nothing for the GC). Its
    fire is one step too: a `timer_rearm` record (pending again at the first period after now,
    so a fire late by several periods, after a downtime, stands for all of them: no burst) and
    the push of its message, whose transactionId names the period it fired for. After a crash
    the period either fired and was re-armed, or neither: it is never skipped or fired twice.

Every change is a record taking the next version, and the same `_apply_*` functions serve a live
step and replay. Never reads a clock: now_ms is passed in.
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

from orjson import Fragment

from queen.core import records as rec
from queen.core import recurrence
from queen.core.kv import VersionCounter
from queen.core.limits import Limits
from queen.core.outcomes import QueueReason
from queen.core.packing import int_array, read_int_array
from queen.core.queue_ops import PushItem
from queen.core.tenants import shown
from queen.core.timer_ops import TimerList, TimerOp
from queen.core.wheel import TICK_MS
from queen.histogram import TIMER_LATE_SECONDS, Histogram, HistogramSnapshot

# at_ms, version, scheduled_at_ms, bytes of the partition name, of the producer id (-1: none), of
# the trace id (-1: none); then those three (UTF-8) and the payload's JSON encoding. Snapshots store
# it as it is: change it only with the format version.
# Big-endian, so the bytes order packed timers by at_ms: the earliest of a million is min() in C.
_HEAD = struct.Struct(">qqqiii")
_AT_VERSION = struct.Struct(">qq")
SLOT_MS = TICK_MS  # a slot per tick: a tick visits the slots it passed
# at_ms, version, bytes of the queue name, of the key; then both (UTF-8). Only in memory.
_ENTRY = struct.Struct("<qqHH")
def pack_timer(at_ms: int, version: int, scheduled_at_ms: int, partition: str, tid: str | None, trace_id: str | None,
               payload: bytes) -> bytes:
    name = partition.encode()
    tid_raw = b"" if tid is None else tid.encode()
    trace_raw = b"" if trace_id is None else trace_id.encode()
    head = _HEAD.pack(at_ms, version, scheduled_at_ms, len(name), -1 if tid is None else len(tid_raw),
                      -1 if trace_id is None else len(trace_raw))
    return head + name + tid_raw + trace_raw + payload


def unpack_timer(packed: bytes) -> tuple:
    """(at_ms, version, scheduled_at_ms, partition, transaction_id, trace_id, payload)"""
    at_ms, version, scheduled_at_ms, name_length, tid_length, trace_length = _HEAD.unpack_from(packed)
    position = _HEAD.size + name_length
    partition = packed[_HEAD.size:position].decode()
    tid = trace_id = None
    if tid_length >= 0:
        tid = packed[position:position + tid_length].decode()
        position += tid_length
    if trace_length >= 0:
        trace_id = packed[position:position + trace_length].decode()
        position += trace_length
    return at_ms, version, scheduled_at_ms, partition, tid, trace_id, packed[position:]


def _entries(raw: bytearray):
    """(the entry's bytes, at_ms, version, queue, key) of each entry of a slot."""
    position, end = 0, len(raw)
    size = _ENTRY.size
    while position < end:
        at_ms, version, queue_length, key_length = _ENTRY.unpack_from(raw, position)
        names = position + size
        stop = names + queue_length + key_length
        yield (raw[position:stop], at_ms, version, raw[names:names + queue_length].decode(),
               raw[names + queue_length:stop].decode())
        position = stop


def _payload_bytes(packed: bytes) -> int:
    _, _, _, name_length, tid_length, trace_length = _HEAD.unpack_from(packed)
    return len(packed) - _HEAD.size - name_length - max(tid_length, 0) - max(trace_length, 0)


@dataclass(frozen=True, slots=True)
class TimerStatistics:
    pending: int
    fired: int
    fire_duplicates: int  # fires that appended nothing: their producer id was known in the partition
    late: HistogramSnapshot  # seconds each fire came after its due time
    late_ms_max: int
    pending_by_queue: list[tuple[str, int]]  # (stored queue name, its pending timers)


class TimerStats:
    __slots__ = ("scheduled", "cancelled", "fired", "fire_duplicates", "late", "late_ms_max")

    def __init__(self):
        self.scheduled = self.cancelled = self.fired = self.fire_duplicates = 0
        self.late = Histogram(TIMER_LATE_SECONDS)
        self.late_ms_max = 0


class QueueSink(Protocol):
    """What timers need of the shard's queues: all of it, and only it."""

    def has_queue(self, name: str) -> bool: ...

    def create_queue(self, name: str, now_ms: int, records: list) -> None:
        """The queue exists after this (a schedule creates it, as a push does)."""

    def push_fired(self, item: PushItem, now_ms: int, records: list) -> dict:
        """A fired timer's message appended, exempt from capacity: its push result."""


class TimerTable:
    """Owned by the shard's QueueTable: timers fire into its queues, and go with a deleted queue."""

    def __init__(self, versions: VersionCounter, shared, limits: Limits, sink: QueueSink):
        self.versions = versions
        self.shared = shared  # the queues' Shared: capacity counts
        self.limits = limits
        self.sink = sink
        self.pending: dict[str, dict[str, bytes]] = {}  # queue -> key -> packed timer
        # queue -> key -> packed schedule (recurrence.pack_schedule), for the pending timers that recur
        self.recurring: dict[str, dict[str, bytes]] = {}
        self.payload_bytes: dict[str, int] = {}  # queue -> its pending timers' payload bytes
        self.slots: dict[int, bytearray] = {}  # slot (at_ms // SLOT_MS) -> packed entries
        self.entries = 0  # in the slots, stale ones included
        self.cursor = 0  # the last slot a tick visited: earlier ones are empty
        self.count = 0
        self.stats = TimerStats()

    def statistics(self) -> TimerStatistics:
        stats = self.stats
        return TimerStatistics(self.count, stats.fired, stats.fire_duplicates, stats.late.snapshot(), stats.late_ms_max,
                               [(queue, len(timers)) for queue, timers in self.pending.items() if timers])

    # ------------------------------------------------------------------------------------------
    # Operations.

    def apply(self, op, now_ms: int, records: list):
        if type(op) is TimerList:
            return self.page(op.queue, op.prefix, op.after, op.limit)
        return [self.apply_one(timer, now_ms, records) for timer in op.ops]

    def apply_one(self, op: TimerOp, now_ms: int, records: list) -> dict:
        base = {"index": op.index, "op": op.op, "queue": shown(op.queue), "key": op.key}
        if op.op == "schedule":
            return {**base, **self.schedule(op, now_ms, records)}
        if op.op == "cancel":
            return {**base, **self.cancel(op.queue, op.key, records)}
        return {**base, **self.get(op.queue, op.key)}

    def check_schedule(self, op: TimerOp, growth=None) -> str | None:
        """Why a schedule would be refused now ("storage_full"), or None. growth: a transaction's
        (queen/core/queues/model.py Growth), counting what its earlier pushes and schedules add, updated
        here when this one passes."""
        shared, limits = self.shared, self.limits
        exists = self.sink.has_queue(op.queue)
        if growth is None:
            if not exists and shared.queues >= limits.queues_max:
                return QueueReason.STORAGE_FULL
        elif not growth.new_queue(shared, limits, op.queue, exists):
            return QueueReason.STORAGE_FULL
        old = self.pending.get(op.queue, {}).get(op.key)
        extra_timers = growth.timers if growth is not None else 0
        extra_bytes = growth.bytes if growth is not None else 0
        if old is None and shared.timers + extra_timers >= limits.timers_max:
            return QueueReason.STORAGE_FULL
        grows = len(op.payload) - (_payload_bytes(old) if old is not None else 0)
        if shared.bytes + extra_bytes + grows > limits.queue_bytes_max:
            return QueueReason.STORAGE_FULL
        if growth is not None:
            growth.timers += old is None
            growth.bytes += max(grows, 0)
        return None

    def schedule(self, op: TimerOp, now_ms: int, records: list) -> dict:
        reason = self.check_schedule(op)
        if reason is not None:
            return {"scheduled": False, "reason": reason, "error": reason}
        return self._schedule(op, now_ms, records)

    def apply_checked(self, op: TimerOp, now_ms: int, records: list) -> dict:
        """A transaction's schedule or cancel, its capacity already checked."""
        base = {"index": op.index, "op": op.op, "queue": shown(op.queue), "key": op.key}
        if op.op == "schedule":
            return {**base, **self._schedule(op, now_ms, records)}
        return {**base, **self.cancel(op.queue, op.key, records)}

    def _schedule(self, op: TimerOp, now_ms: int, records: list) -> dict:
        self.sink.create_queue(op.queue, now_ms, records)
        replaced = op.key in self.pending.get(op.queue, ())
        version = self.versions.next()
        rec.timer_set(records, version, op.queue, op.key, op.at_ms, now_ms, op.partition, op.payload,
                      op.transaction_id, op.trace_id)
        self._apply_set(op.queue, op.key, pack_timer(op.at_ms, version, now_ms, op.partition, op.transaction_id,
                                                     op.trace_id, op.payload))
        self._apply_unschedule(op.queue, op.key)
        answer = {"scheduled": True, "at": op.at_ms, "version": version, "replaced": replaced}
        if op.every_ms or op.cron is not None:
            rec.timer_schedule(records, op.queue, op.key, op.every_ms, op.cron, op.timezone)
            packed = recurrence.pack_schedule(op.every_ms, op.cron, op.timezone)
            self._apply_schedule(op.queue, op.key, packed)
            answer.update(recurrence.schedule_fields(packed))
        self.stats.scheduled += 1
        return answer

    def cancel(self, queue: str, key: str, records: list) -> dict:
        packed = self.pending.get(queue, {}).get(key)
        if packed is None:  # never scheduled, cancelled before, or already fired
            return {"cancelled": False, "reason": QueueReason.ABSENT}
        rec.timer_cancel(records, self.versions.next(), queue, key)
        self._apply_remove(queue, key)
        self.stats.cancelled += 1
        return {"cancelled": True, "version": _AT_VERSION.unpack_from(packed)[1]}

    def get(self, queue: str, key: str) -> dict:
        packed = self.pending.get(queue, {}).get(key)
        if packed is None:
            return {"found": False}
        at_ms, version, scheduled_at_ms, partition, tid, _, payload = unpack_timer(packed)
        return {"found": True, "at": at_ms, "partition": partition, "payload": Fragment(payload),
                "transactionId": tid, "version": version, "scheduledAt": scheduled_at_ms,
                **self._schedule_fields(queue, key)}

    def _schedule_fields(self, queue: str, key: str) -> dict:
        """A recurring timer's schedule as answers show it; nothing for a one-shot timer."""
        packed = self.recurring.get(queue, {}).get(key)
        return {} if packed is None else recurrence.schedule_fields(packed)

    def page(self, queue: str, prefix: str, after: str | None, limit: int) -> dict:
        timers = self.pending.get(queue, {})
        keys = heapq.nsmallest(limit + 1, (key for key in timers if key.startswith(prefix)
                                           and (after is None or key > after)))
        items = []
        for key in keys[:limit]:
            at_ms, version, scheduled_at_ms, partition, tid, _, _ = unpack_timer(timers[key])
            items.append({"queue": shown(queue), "key": key, "partition": partition, "at": at_ms, "version": version,
                          "scheduledAt": scheduled_at_ms, "transactionId": tid, **self._schedule_fields(queue, key)})
        return {"items": items, "after": keys[limit - 1] if len(keys) > limit else None}

    def summary(self, queue: str) -> dict:
        timers = self.pending.get(queue)
        if not timers:
            return {"pending": 0, "nextAt": None}
        return {"pending": len(timers), "nextAt": _AT_VERSION.unpack_from(min(timers.values()))[0]}

    # ------------------------------------------------------------------------------------------
    # Time.

    def tick(self, now_ms: int, records: list) -> None:
        target = now_ms // SLOT_MS
        slots = self.slots
        if not slots:
            self.cursor = max(self.cursor, target)
            return
        if target - self.cursor <= len(slots):
            visit = [slot for slot in range(self.cursor, target + 1) if slot in slots]
        else:  # a long gap (the first tick after a restart): the slots themselves are fewer
            visit = sorted(slot for slot in slots if slot <= target)
        self.cursor = max(self.cursor, target)
        due = []
        for slot in visit:
            raw = slots.pop(slot)
            later = bytearray()
            for entry, at_ms, version, queue, key in _entries(raw):
                if at_ms <= now_ms:
                    due.append((at_ms, version, queue, key))
                else:  # the current slot: the rest of it is still ahead
                    later += entry
            if later:
                slots[slot] = later
        if not due:
            return
        self.entries -= len(due)
        due.sort()
        budget = self.limits.timer_fires_per_tick_max  # the rest go at the next tick
        for _, version, queue, key in islice(due, budget):
            packed = self.pending.get(queue, {}).get(key)
            if packed is not None and _AT_VERSION.unpack_from(packed)[1] == version:
                self._fire(queue, key, packed, now_ms, records)
        for at_ms, version, queue, key in islice(due, budget, None):
            self._file(at_ms, version, queue, key)  # over the budget: the next tick

    def _fire(self, queue: str, key: str, packed: bytes, now_ms: int, records: list) -> None:
        at_ms, _, _, partition, tid, trace_id, payload = unpack_timer(packed)
        schedules = self.recurring.get(queue)
        schedule = schedules.get(key) if schedules else None
        # Computed before any record is written: whatever it meets, the step stays whole.
        next_ms = recurrence.next_period_ms(schedule, at_ms, now_ms) if schedule is not None else None
        if next_ms is None:  # a one-shot timer, or a schedule that names no time any more: its last fire
            rec.timer_fired(records, self.versions.next(), queue, key)
            self._apply_remove(queue, key)
        else:
            version = self.versions.next()
            rec.timer_rearm(records, version, queue, key, next_ms)
            self._apply_rearm(queue, key, next_ms, version)
        if schedule is not None:
            tid = recurrence.period_id(key if tid is None else tid, at_ms)
        result = self.sink.push_fired(PushItem(0, queue, partition, payload, tid, trace_id, len(payload)), now_ms,
                                      records)
        stats = self.stats
        stats.fired += 1
        if result["status"] == "duplicate":
            stats.fire_duplicates += 1
        late_ms = now_ms - at_ms
        stats.late.observe(late_ms / 1000)
        stats.late_ms_max = max(stats.late_ms_max, late_ms)

    # ------------------------------------------------------------------------------------------
    # State changes, live and in replay.

    def _apply_set(self, queue: str, key: str, packed: bytes) -> None:
        timers = self.pending.setdefault(queue, {})
        old = timers.get(key)
        shared = self.shared
        grows = _payload_bytes(packed)
        if old is None:
            self.count += 1
            shared.timers += 1
        else:
            grows -= _payload_bytes(old)
        timers[key] = packed
        shared.bytes += grows
        self.payload_bytes[queue] = self.payload_bytes.get(queue, 0) + grows
        usage = shared.usage.for_name(queue)
        if usage is not None:
            usage.timers += old is None
            usage.bytes += grows
        self._file(*_AT_VERSION.unpack_from(packed), queue, key)
        if self.entries > 2 * self.count + 1024:
            self._rebuild_slots()

    def _file(self, at_ms: int, version: int, queue: str, key: str) -> None:
        """An entry in the slot of at_ms, or in the current one if that has passed."""
        queue_raw, key_raw = queue.encode(), key.encode()
        slot = max(at_ms // SLOT_MS, self.cursor)
        entries = self.slots.get(slot)
        if entries is None:
            entries = self.slots[slot] = bytearray()
        entries += _ENTRY.pack(at_ms, version, len(queue_raw), len(key_raw))
        entries += queue_raw
        entries += key_raw
        self.entries += 1

    def _apply_rearm(self, queue: str, key: str, at_ms: int, version: int) -> None:
        """The recurring timer fired and is due again at at_ms, as version; all else unchanged."""
        timers = self.pending.get(queue)
        packed = timers.get(key) if timers is not None else None
        if packed is None or key not in self.recurring.get(queue, ()):
            raise ValueError(f"a re-arm of {queue}/{key}, which is not a pending recurring timer")
        timers[key] = _AT_VERSION.pack(at_ms, version) + packed[_AT_VERSION.size:]
        self._file(at_ms, version, queue, key)

    def _apply_schedule(self, queue: str, key: str, packed: bytes) -> None:
        if key not in self.pending.get(queue, ()):
            raise ValueError(f"a schedule for {queue}/{key}, which is not a pending timer")
        self.recurring.setdefault(queue, {})[key] = packed

    def _apply_unschedule(self, queue: str, key: str) -> None:
        schedules = self.recurring.get(queue)
        if schedules is not None and schedules.pop(key, None) is not None and not schedules:
            del self.recurring[queue]

    def _apply_remove(self, queue: str, key: str) -> None:
        timers = self.pending.get(queue)
        packed = timers.pop(key, None) if timers is not None else None
        if packed is None:
            return
        self._apply_unschedule(queue, key)
        size = _payload_bytes(packed)
        if timers:
            self.payload_bytes[queue] -= size
        else:
            del self.pending[queue], self.payload_bytes[queue]
        self.count -= 1
        shared = self.shared
        shared.timers -= 1
        shared.bytes -= size
        usage = shared.usage.for_name(queue)
        if usage is not None:
            usage.timers -= 1
            usage.bytes -= size

    def drop_queue(self, queue: str) -> int:
        """A deleted queue's timers go with it; how many there were."""
        timers = self.pending.pop(queue, None)
        self.recurring.pop(queue, None)
        if not timers:
            return 0
        shared = self.shared
        self.count -= len(timers)
        shared.timers -= len(timers)
        size = self.payload_bytes.pop(queue)
        shared.bytes -= size
        usage = shared.usage.for_name(queue)
        if usage is not None:
            usage.timers -= len(timers)
            usage.bytes -= size
        if not self.count:  # nothing pending: every slot entry is stale, and goes now
            self.slots, self.entries = {}, 0
        return len(timers)  # their slot entries are stale now, skipped when they come up

    def _rebuild_slots(self) -> None:
        self.slots, self.entries = {}, 0
        for queue, timers in self.pending.items():
            for key, packed in timers.items():
                self._file(*_AT_VERSION.unpack_from(packed), queue, key)

    def replay(self, record) -> None:
        kind = type(record)
        if kind is rec.TimerSet:
            self._apply_set(record.queue, record.key, pack_timer(
                record.at_ms, record.version, record.scheduled_at_ms, record.partition, record.transaction_id,
                record.trace_id, record.payload))
            self._apply_unschedule(record.queue, record.key)  # a timer_schedule follows if it recurs
        elif kind is rec.TimerCancel or kind is rec.TimerFired:
            self._apply_remove(record.queue, record.key)
        elif kind is rec.TimerRearm:
            self._apply_rearm(record.queue, record.key, record.at_ms, record.version)
        elif kind is rec.TimerSchedule:
            self._apply_schedule(record.queue, record.key,
                                 recurrence.pack_schedule(record.every_ms, record.cron, record.timezone))
        elif kind is rec.PendingTimers:
            self._apply_pending(record)
        elif kind is rec.PendingSchedules:
            self._apply_pending_schedules(record)
        else:
            raise ValueError(f"not a timer record: {record!r}")

    def _apply_pending(self, record) -> None:
        """A snapshot's pending timers of one queue, taken in whole."""
        lengths, blob = read_int_array("I", record.lengths), record.packed
        if len(lengths) != len(record.keys) or sum(lengths) != len(blob):
            raise ValueError(f"a timers record of {len(record.keys)} keys holds {len(lengths)} lengths, {len(blob)} bytes")
        position = 0
        for key, length in zip(record.keys, lengths, strict=True):
            self._apply_set(record.queue, key, blob[position:position + length])
            position += length

    def _apply_pending_schedules(self, record) -> None:
        """A snapshot's schedules of one queue's recurring timers, after its pending timers."""
        lengths, blob = read_int_array("I", record.lengths), record.packed
        if len(lengths) != len(record.keys) or sum(lengths) != len(blob):
            raise ValueError(f"a schedules record of {len(record.keys)} keys holds {len(lengths)} lengths, {len(blob)} bytes")
        position = 0
        for key, length in zip(record.keys, lengths, strict=True):
            self._apply_schedule(record.queue, key, blob[position:position + length])
            position += length

    # ------------------------------------------------------------------------------------------
    # Snapshots.

    def snapshot_copy(self, queue: str) -> tuple[dict, dict]:
        """The queue's pending timers and the schedules of those that recur."""
        return dict(self.pending.get(queue, {})), dict(self.recurring.get(queue, {}))

    @staticmethod
    def snapshot_records(queue: str, copy: tuple[dict, dict], out: list) -> None:
        timers, schedules = copy
        if timers:
            rec.pending_timers(out, queue, list(timers), int_array("I", map(len, timers.values())),
                               b"".join(timers.values()))
        if schedules:
            rec.pending_schedules(out, queue, list(schedules), int_array("I", map(len, schedules.values())),
                                  b"".join(schedules.values()))
