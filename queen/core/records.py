"""Every kind of record the write-ahead log and the snapshots hold: one table, one encoder per kind,
one decoder for all. Nothing else in the code knows where a field sits or what number a kind has.

Each kind's number is written once, in `Kind`; `SCHEMA` maps it to its record type (whose fields,
in order, are the record's) and to the check decoding runs on those fields. The table below is the
same schema in words; tests/core/test_records.py holds it to the code.

A record is an effect, never a request: what changed, so replay reaches the same state whatever the
clock says then. On disk a frame's (or a snapshot section's) records are one flat CBOR array, each
record its kind number followed by its fields in the order below. Flat, because the CBOR encoder
spends about as much on opening a nested array as on three of its items (bench/README.md, "WAL
encoding"), and a frame holds hundreds of records.

| kind | name      | fields (in order)                                                                  | takes a version |
| ---- | --------- | ---------------------------------------------------------------------------------- | --------------- |
| 1    | put       | ns, key, value, version, create_version, created_at_ms, updated_at_ms, expires_at_ms | version         |
| 2    | delete    | ns, key, version                                                                   | version         |
| 3    | ceiling   | version_max                                                                        | no              |
| 4    | segment_cut | next_segment                                                                     | no              |
| 5    | epoch     | epoch, node, version (the epoch's first), previous_version, clock_floor_ms, lease_grace_until_ms | version |
| 16   | queue_set | version, queue, created_at_ms, options                                             | version         |
| 17   | queue_delete | version, queue                                                                  | version         |
| 18   | partition | version (the partition id), queue, name, created_at_ms                            | version         |
| 19   | append    | version (the message id), queue, partition_id, offset, transaction_id, data, trace_id, created_at_ms, available_at_ms, dedupe_until_ms | version |
| 20   | group_join | version, queue, group, mode, joined_at_ms                                         | version         |
| 21   | group_delete | version, queue, group                                                           | version         |
| 22   | grant     | version (the lease id), queue, group, acquired_at_ms, expires_at_ms, auto_ack, deliveries | version   |
| 23   | message_state | version, queue, group, partition_id, offset, state, retry_count, error, at_ms  | version         |
| 24   | lease_end | version, queue, group, lease_id, partition_id, at_ms                               | version         |
| 25   | lease_extend | version, queue, group, lease_id, expires_at_ms                                  | version         |
| 26   | remove    | version, queue, partition_id, below_offset, dlq_too, at_ms                         | version         |
| 27   | group_partition_32 | queue, group, partition_id, floor, resolved, retries, dlq                 | no (snapshots)  |
| 28   | dedupe    | queue, partition_id, ids, entries                                                  | no (snapshots)  |
| 29   | partition_state | queue, partition_id, next_offset, removed_below                              | no (snapshots)  |
| 30   | partition_messages | queue, partition_id, offsets, lengths, packed                             | no (snapshots)  |
| 31   | group_partition | queue, group, partition_id, floor, resolved, retries, dlq                    | no (snapshots)  |
| 40   | timer_set | version, queue, key, at_ms, scheduled_at_ms, partition, payload, transaction_id, trace_id | version  |
| 41   | timer_cancel | version, queue, key                                                             | version         |
| 42   | timer_fired | version, queue, key                                                              | version         |
| 43   | pending_timers | queue, keys, lengths, packed                                                  | no (snapshots)  |
| 44   | timer_schedule | queue, key, every_ms, cron, timezone                                          | no              |
| 45   | timer_rearm | version, queue, key, at_ms                                                       | version         |
| 46   | pending_schedules | queue, keys, lengths, packed                                               | no (snapshots)  |

- put: the row (ns, key) now holds value at version; expires_at_ms 0 = forever. Lock permits are
  rows of the namespace `queen-locks` (of a tenant's, too): a permit's put carries its owner (a
  string, or null when the acquire named none) as value, and the row holds `{"owner": value}`
  (queen/core/kv.py, permit_json). The log keeps the owner alone, as every build wrote it.
- delete: the row (ns, key) is gone; the delete takes a version so the counter survives in the log.
- ceiling: no version up to version_max may be handed out again after a restart. The writer puts
  one on disk before any frame whose versions come near the last one, so a restart can always
  begin above every version an answer ever showed, even if recovery had to cut the frame that
  held it.
- segment_cut: the last record of a segment that was closed; the next one exists and is
  next_segment. A newest segment that went missing is noticed through it.
- epoch: node began leading epoch `epoch` (a cluster's term, queen/cluster/replication.py); the
  first record it wrote, at its epoch's first version (`first_version` reads it).
  previous_version is the last version of the log before it (where the earlier epochs end on this
  leader: what a rejoining node keeps). Applying it extends every lease live at clock_floor_ms
  (lock permits, queue partition leases) to end no earlier than lease_grace_until_ms, so a failover
  never shortens a lease; KV lifetimes and timers are not touched. A function of the state and the
  record alone, so replay gives the same state under any clock.

Queues (kinds 16-30; every count and id is an integer, every name a string):
- queue_set: the queue exists with these options (a map of every option's canonical name to its
  value), created at created_at_ms.
- queue_delete: the queue and everything of it (partitions, messages, groups, leases) is gone.
- partition: a partition named name exists in queue, with this id.
- append: a message at offset of a partition. transaction_id is the producer's, or null when it
  gave none (the message's id is then `queen:<offset>`); dedupe_until_ms is when that producer id
  may be forgotten once the message is gone (0 without one). data is the payload's JSON encoding
  (bytes); trace_id a string or null.
- group_join: a consumer group joined the queue; mode "all" or "new" (a "new" group counts every
  message already appended as resolved).
- group_delete: the group and all its state in the queue are gone; its leases end.
- grant: a pop. deliveries is an array of [partition_id, [offset, ...]]; with auto_ack the
  messages are completed at once and no lease exists (expires_at_ms 0).
- message_state: a delivered or dead-lettered message of a group changed state: "completed",
  "pending" (back for redelivery, retry_count its new count), "dlq" (with error), or "purged"
  (a DLQ entry dropped).
- lease_end: the lease no longer holds partition_id (0: any partition) for the group.
- lease_extend: the lease now ends at expires_at_ms.
- remove: retention removed the partition's messages below below_offset (those in a group's DLQ
  too when dlq_too, otherwise they stay); groups behind it move up.
- group_partition, dedupe, partition_state and partition_messages appear only in snapshots: one
  group's state in one partition (its floor, the resolved offsets above it as a serialized 64-bit
  roaring bitmap in the portable format, [offset, retry_count, retry_at_ms, ...] of its messages
  whose deliveries ended without completion (retry_at_ms: when the queue's retry backoff lets the
  message be delivered again, 0 when it holds it back no more) and [offset, error, at_ms, ...] of its DLQ); a partition's
  producer ids with their packed entries, oldest first; a partition's next offset and the offset
  below which everything was removed (its messages may all be gone); a partition's retained
  messages, packed, as three byte strings (queen/core/queues/packed.py owns both packed layouts).
- group_partition_32 is group_partition as builds before 64-bit offsets wrote it: the resolved
  offsets as a 32-bit roaring bitmap, and retries as [offset, retry_count, ...] (those builds had
  no retry backoff: nothing is held back). This build reads it and never writes it.

Timers (kinds 40-46):
- timer_set: the timer (queue, key) is pending, due at at_ms, scheduled at scheduled_at_ms; its
  message goes to partition (a name) with payload (JSON bytes), transaction_id and trace_id (each
  a string or null). A timer_set of a pending key replaces it.
- timer_cancel: the timer (queue, key) is gone, unfired.
- timer_fired: the timer (queue, key) is gone because it fired; the append of its message (or
  nothing, when its producer id was a duplicate) follows in the same frame.
- pending_timers appears only in snapshots: one queue's pending timers, their keys, the uint32
  lengths of their packed forms and those packed forms concatenated (queen/core/timers.py owns
  the layout).
- timer_schedule: the timer (queue, key) that the timer_set just before it (same frame) set is a
  recurring one: every every_ms ms (cron and timezone null), or at the times the 5-field cron
  expression names in the IANA zone timezone (every_ms 0). A timer_set without one makes the key
  a one-shot timer again.
- timer_rearm: the recurring timer (queue, key) fired and is pending again, due at at_ms, with its
  message and schedule unchanged; the append of its message (or nothing, when its producer id was
  a duplicate) follows in the same frame. The timer's version is now this record's.
- pending_schedules appears only in snapshots, after the queue's pending_timers: the schedules of
  its recurring timers, their keys, the uint32 lengths of their packed forms and those packed
  forms concatenated (queen/core/recurrence.py owns the layout).

Versions are global, dense and rising: every versioned record takes the next one, in log order. A
kind this build does not know is refused as "written by a newer build": guessing at it could only
lose data.

Pure: no I/O. Encoders append to a flat list (the frame's); `decode` turns a flat list back into
typed records and checks every field's type, raising RecordError for anything else.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

INT64_MAX = (1 << 63) - 1


class Kind(enum.IntEnum):
    PUT = 1
    DELETE = 2
    CEILING = 3
    SEGMENT_CUT = 4
    EPOCH = 5
    QUEUE_SET = 16
    QUEUE_DELETE = 17
    PARTITION = 18
    APPEND = 19
    GROUP_JOIN = 20
    GROUP_DELETE = 21
    GRANT = 22
    MESSAGE_STATE = 23
    LEASE_END = 24
    LEASE_EXTEND = 25
    REMOVE = 26
    GROUP_PARTITION_32 = 27
    DEDUPE = 28
    PARTITION_STATE = 29
    PARTITION_MESSAGES = 30
    GROUP_PARTITION = 31
    TIMER_SET = 40
    TIMER_CANCEL = 41
    TIMER_FIRED = 42
    PENDING_TIMERS = 43
    TIMER_SCHEDULE = 44
    TIMER_REARM = 45
    PENDING_SCHEDULES = 46


class RecordError(Exception):
    pass


class UnknownKind(RecordError):
    """A record kind this build does not know: written by a newer build."""


class Put(NamedTuple):
    ns: str
    key: str
    value: object
    version: int
    create_version: int
    created_at_ms: int
    updated_at_ms: int
    expires_at_ms: int


class Delete(NamedTuple):
    ns: str
    key: str
    version: int


class Ceiling(NamedTuple):
    version_max: int


class SegmentCut(NamedTuple):
    next_segment: int


class Epoch(NamedTuple):
    epoch: int
    node: str
    version: int
    previous_version: int
    clock_floor_ms: int
    lease_grace_until_ms: int

    @property
    def first_version(self) -> int:
        """The epoch's first version: this record's own."""
        return self.version


class QueueSet(NamedTuple):
    version: int
    queue: str
    created_at_ms: int
    options: dict


class QueueDelete(NamedTuple):
    version: int
    queue: str


class PartitionCreate(NamedTuple):
    version: int
    queue: str
    name: str
    created_at_ms: int


class Append(NamedTuple):
    version: int
    queue: str
    partition_id: int
    offset: int
    transaction_id: str | None
    data: object
    trace_id: str | None
    created_at_ms: int
    available_at_ms: int
    dedupe_until_ms: int


class GroupJoin(NamedTuple):
    version: int
    queue: str
    group: str
    mode: str
    joined_at_ms: int


class GroupDelete(NamedTuple):
    version: int
    queue: str
    group: str


class Grant(NamedTuple):
    version: int
    queue: str
    group: str
    acquired_at_ms: int
    expires_at_ms: int
    auto_ack: bool
    deliveries: list


class MessageState(NamedTuple):
    version: int
    queue: str
    group: str
    partition_id: int
    offset: int
    state: str
    retry_count: int
    error: str | None
    at_ms: int


class LeaseEnd(NamedTuple):
    version: int
    queue: str
    group: str
    lease_id: int
    partition_id: int
    at_ms: int


class LeaseExtend(NamedTuple):
    version: int
    queue: str
    group: str
    lease_id: int
    expires_at_ms: int


class Remove(NamedTuple):
    version: int
    queue: str
    partition_id: int
    below_offset: int
    dlq_too: bool
    at_ms: int


class GroupPartition(NamedTuple):
    queue: str
    group: str
    partition_id: int
    floor: int
    resolved: bytes  # a serialized 64-bit roaring bitmap
    retries: list  # [offset, retry_count, retry_at_ms (0: not held back), ...]
    dlq: list


class GroupPartition32(NamedTuple):
    """GroupPartition as builds before 64-bit offsets wrote it: resolved is a 32-bit bitmap."""
    queue: str
    group: str
    partition_id: int
    floor: int
    resolved: bytes
    retries: list  # [offset, retry_count, ...]
    dlq: list


class PartitionState(NamedTuple):
    queue: str
    partition_id: int
    next_offset: int
    removed_below: int


class Dedupe(NamedTuple):
    """A snapshot's producer ids of one partition, as the queue keeps them, oldest first."""
    queue: str
    partition_id: int
    ids: list  # of str
    entries: bytes  # their packed entries, concatenated (fixed size each)


class PartitionMessages(NamedTuple):
    """A snapshot's retained messages of one partition, as the queue keeps them: one record of
    three byte strings, not one record per message, so a snapshot of a million messages is built
    by C loops while the server goes on (it shares the interpreter with the snapshot's thread)."""
    queue: str
    partition_id: int
    offsets: bytes  # int64 little-endian, in offset order
    lengths: bytes  # uint32 little-endian: each packed message's length
    packed: bytes  # the packed messages, concatenated


class TimerSet(NamedTuple):
    version: int
    queue: str
    key: str
    at_ms: int
    scheduled_at_ms: int
    partition: str
    payload: bytes
    transaction_id: str | None
    trace_id: str | None


class TimerCancel(NamedTuple):
    version: int
    queue: str
    key: str


class TimerFired(NamedTuple):
    version: int
    queue: str
    key: str


class PendingTimers(NamedTuple):
    """A snapshot's pending timers of one queue, packed like PartitionMessages."""
    queue: str
    keys: list  # of str
    lengths: bytes  # uint32 little-endian: each packed timer's length
    packed: bytes  # the packed timers, concatenated


class TimerSchedule(NamedTuple):
    queue: str
    key: str
    every_ms: int  # 0: a cron schedule
    cron: str | None
    timezone: str | None


class TimerRearm(NamedTuple):
    version: int
    queue: str
    key: str
    at_ms: int


class PendingSchedules(NamedTuple):
    """A snapshot's schedules of one queue's recurring timers, packed like PendingTimers."""
    queue: str
    keys: list  # of str
    lengths: bytes  # uint32 little-endian: each packed schedule's length
    packed: bytes  # the packed schedules, concatenated


Record = Put | Delete | Ceiling | SegmentCut | Epoch | QueueSet | QueueDelete | PartitionCreate | Append | GroupJoin | \
    GroupDelete | Grant | MessageState | LeaseEnd | LeaseExtend | Remove | GroupPartition | GroupPartition32 | Dedupe | PartitionState | \
    PartitionMessages | TimerSet | TimerCancel | TimerFired | PendingTimers | TimerSchedule | TimerRearm | PendingSchedules

# The kind numbers as plain ints for the encoders: the hot path appends them without an enum lookup.
_PUT, _DELETE, _CEILING, _SEGMENT_CUT = int(Kind.PUT), int(Kind.DELETE), int(Kind.CEILING), int(Kind.SEGMENT_CUT)
_EPOCH = int(Kind.EPOCH)
_QUEUE_SET, _QUEUE_DELETE, _PARTITION, _APPEND = (int(Kind.QUEUE_SET), int(Kind.QUEUE_DELETE), int(Kind.PARTITION),
                                                  int(Kind.APPEND))
_GROUP_JOIN, _GROUP_DELETE, _GRANT, _MESSAGE_STATE = (int(Kind.GROUP_JOIN), int(Kind.GROUP_DELETE), int(Kind.GRANT),
                                                      int(Kind.MESSAGE_STATE))
_LEASE_END, _LEASE_EXTEND, _REMOVE = int(Kind.LEASE_END), int(Kind.LEASE_EXTEND), int(Kind.REMOVE)
_DEDUPE, _PARTITION_STATE, _PARTITION_MESSAGES, _GROUP_PARTITION = (
    int(Kind.DEDUPE), int(Kind.PARTITION_STATE), int(Kind.PARTITION_MESSAGES), int(Kind.GROUP_PARTITION))
_TIMER_SET, _TIMER_CANCEL, _TIMER_FIRED, _PENDING_TIMERS = (int(Kind.TIMER_SET), int(Kind.TIMER_CANCEL),
                                                            int(Kind.TIMER_FIRED), int(Kind.PENDING_TIMERS))
_TIMER_SCHEDULE, _TIMER_REARM, _PENDING_SCHEDULES = (int(Kind.TIMER_SCHEDULE), int(Kind.TIMER_REARM),
                                                     int(Kind.PENDING_SCHEDULES))


# -- encoders: append one record to a flat list ---------------------------------------------------

def put(out: list, ns: str, key: str, value, version: int, create_version: int, created_at_ms: int,
        updated_at_ms: int, expires_at_ms: int) -> None:
    out += (_PUT, ns, key, value, version, create_version, created_at_ms, updated_at_ms, expires_at_ms)


def delete(out: list, ns: str, key: str, version: int) -> None:
    out += (_DELETE, ns, key, version)


def ceiling(out: list, version_max: int) -> None:
    out += (_CEILING, version_max)


def segment_cut(out: list, next_segment: int) -> None:
    out += (_SEGMENT_CUT, next_segment)


def epoch(out: list, epoch: int, node: str, version: int, previous_version: int, clock_floor_ms: int,
          lease_grace_until_ms: int) -> None:
    out += (_EPOCH, epoch, node, version, previous_version, clock_floor_ms, lease_grace_until_ms)


def queue_set(out: list, version: int, queue: str, created_at_ms: int, options: dict) -> None:
    out += (_QUEUE_SET, version, queue, created_at_ms, options)


def queue_delete(out: list, version: int, queue: str) -> None:
    out += (_QUEUE_DELETE, version, queue)


def partition(out: list, version: int, queue: str, name: str, created_at_ms: int) -> None:
    out += (_PARTITION, version, queue, name, created_at_ms)


def append(out: list, version: int, queue: str, partition_id: int, offset: int, transaction_id, data, trace_id,
           created_at_ms: int, available_at_ms: int, dedupe_until_ms: int) -> None:
    out += (_APPEND, version, queue, partition_id, offset, transaction_id, data, trace_id, created_at_ms, available_at_ms,
            dedupe_until_ms)


def group_join(out: list, version: int, queue: str, group: str, mode: str, joined_at_ms: int) -> None:
    out += (_GROUP_JOIN, version, queue, group, mode, joined_at_ms)


def group_delete(out: list, version: int, queue: str, group: str) -> None:
    out += (_GROUP_DELETE, version, queue, group)


def grant(out: list, version: int, queue: str, group: str, acquired_at_ms: int, expires_at_ms: int, auto_ack: bool,
          deliveries: list) -> None:
    out += (_GRANT, version, queue, group, acquired_at_ms, expires_at_ms, auto_ack, deliveries)


def message_state(out: list, version: int, queue: str, group: str, partition_id: int, offset: int, state: str,
                  retry_count: int, error, at_ms: int) -> None:
    out += (_MESSAGE_STATE, version, queue, group, partition_id, offset, state, retry_count, error, at_ms)


def lease_end(out: list, version: int, queue: str, group: str, lease_id: int, partition_id: int, at_ms: int) -> None:
    out += (_LEASE_END, version, queue, group, lease_id, partition_id, at_ms)


def lease_extend(out: list, version: int, queue: str, group: str, lease_id: int, expires_at_ms: int) -> None:
    out += (_LEASE_EXTEND, version, queue, group, lease_id, expires_at_ms)


def remove(out: list, version: int, queue: str, partition_id: int, below_offset: int, dlq_too: bool, at_ms: int) -> None:
    out += (_REMOVE, version, queue, partition_id, below_offset, dlq_too, at_ms)


def timer_set(out: list, version: int, queue: str, key: str, at_ms: int, scheduled_at_ms: int, partition: str,
              payload: bytes, transaction_id, trace_id) -> None:
    out += (_TIMER_SET, version, queue, key, at_ms, scheduled_at_ms, partition, payload, transaction_id, trace_id)


def group_partition(out: list, queue: str, group: str, partition_id: int, floor: int, resolved: bytes,
                    retries: list, dlq: list) -> None:
    out += (_GROUP_PARTITION, queue, group, partition_id, floor, resolved, retries, dlq)


def dedupe(out: list, queue: str, partition_id: int, ids: list, entries: bytes) -> None:
    out += (_DEDUPE, queue, partition_id, ids, entries)


def partition_state(out: list, queue: str, partition_id: int, next_offset: int, removed_below: int) -> None:
    out += (_PARTITION_STATE, queue, partition_id, next_offset, removed_below)


def partition_messages(out: list, queue: str, partition_id: int, offsets: bytes, lengths: bytes, packed: bytes) -> None:
    out += (_PARTITION_MESSAGES, queue, partition_id, offsets, lengths, packed)


def pending_timers(out: list, queue: str, keys: list, lengths: bytes, packed: bytes) -> None:
    out += (_PENDING_TIMERS, queue, keys, lengths, packed)


def timer_cancel(out: list, version: int, queue: str, key: str) -> None:
    out += (_TIMER_CANCEL, version, queue, key)


def timer_fired(out: list, version: int, queue: str, key: str) -> None:
    out += (_TIMER_FIRED, version, queue, key)


def timer_schedule(out: list, queue: str, key: str, every_ms: int, cron, timezone) -> None:
    out += (_TIMER_SCHEDULE, queue, key, every_ms, cron, timezone)


def timer_rearm(out: list, version: int, queue: str, key: str, at_ms: int) -> None:
    out += (_TIMER_REARM, version, queue, key, at_ms)


def pending_schedules(out: list, queue: str, keys: list, lengths: bytes, packed: bytes) -> None:
    out += (_PENDING_SCHEDULES, queue, keys, lengths, packed)


def encode(out: list, record: Record) -> None:
    """Append a typed record (as `decode` gives them) to a flat list."""
    out.append(_KIND_OF[type(record)])
    out += record




# -- decoding ---------------------------------------------------------------------------------------

def _version(raw) -> bool:
    return type(raw) is int and 0 < raw <= INT64_MAX


def _time(raw) -> bool:
    return type(raw) is int and 0 <= raw <= INT64_MAX


def _check_put(f) -> bool:
    return (type(f[0]) is str and type(f[1]) is str and _version(f[3]) and _version(f[4]) and f[4] <= f[3]
            and _time(f[5]) and _time(f[6]) and _time(f[7]))


def _check_delete(f) -> bool:
    return type(f[0]) is str and type(f[1]) is str and _version(f[2])


def _str(raw) -> bool:
    return type(raw) is str


def _opt_str(raw) -> bool:
    return raw is None or type(raw) is str


def _int(raw) -> bool:
    return type(raw) is int and 0 <= raw <= INT64_MAX


def _check_grant(f) -> bool:
    if not (_version(f[0]) and _str(f[1]) and _str(f[2]) and _time(f[3]) and _time(f[4]) and type(f[5]) is bool
            and type(f[6]) is list):
        return False
    for delivery in f[6]:
        if type(delivery) is not list or len(delivery) != 2 or not _version(delivery[0]) or type(delivery[1]) is not list:
            return False
        if not all(_int(offset) for offset in delivery[1]):
            return False
    return True


def _check_group_partition(f) -> bool:
    return (_str(f[0]) and _str(f[1]) and _version(f[2]) and _int(f[3]) and type(f[4]) is bytes and type(f[5]) is list
            and type(f[6]) is list)


def _check_group_partition_retry_at(f) -> bool:
    """group_partition's retries are [offset, retry_count, retry_at_ms, ...]."""
    return _check_group_partition(f) and len(f[5]) % 3 == 0 and all(_int(x) for x in f[5])


_STATES = frozenset(("completed", "pending", "dlq", "purged"))


def _check_timer_schedule(f) -> bool:
    """A period (every_ms > 0, no cron) or a cron in a zone (every_ms 0), never both or neither."""
    if not (_str(f[0]) and _str(f[1]) and _int(f[2]) and _opt_str(f[3]) and _opt_str(f[4])):
        return False
    return f[3] is None and f[4] is None if f[2] else f[3] is not None and f[4] is not None


def _check_packed_keys(f) -> bool:
    return (_str(f[0]) and type(f[1]) is list and all(type(k) is str for k in f[1]) and type(f[2]) is bytes
            and type(f[3]) is bytes and len(f[2]) == 4 * len(f[1]))


# The one schema: each kind's record type (its fields, in order, are the type's) and the check of
# those fields' types that decoding runs. A kind number is written once, in Kind.
SCHEMA: dict[Kind, tuple] = {
    Kind.PUT: (Put, _check_put),
    Kind.DELETE: (Delete, _check_delete),
    Kind.CEILING: (Ceiling, lambda f: _version(f[0])),
    Kind.SEGMENT_CUT: (SegmentCut, lambda f: type(f[0]) is int and 1 <= f[0] <= INT64_MAX),
    Kind.EPOCH: (Epoch, lambda f: _version(f[0]) and _str(f[1]) and _version(f[2]) and _int(f[3]) and f[3] < f[2]
                 and _time(f[4]) and _time(f[5])),
    Kind.QUEUE_SET: (QueueSet, lambda f: _version(f[0]) and _str(f[1]) and _time(f[2]) and type(f[3]) is dict),
    Kind.QUEUE_DELETE: (QueueDelete, lambda f: _version(f[0]) and _str(f[1])),
    Kind.PARTITION: (PartitionCreate, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2]) and _time(f[3])),
    Kind.APPEND: (Append, lambda f: _version(f[0]) and _str(f[1]) and _version(f[2]) and _int(f[3]) and _opt_str(f[4])
         and type(f[5]) is bytes and _opt_str(f[6]) and _time(f[7]) and _time(f[8]) and _time(f[9])),
    Kind.GROUP_JOIN: (GroupJoin, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2]) and f[3] in ("all", "new") and _time(f[4])),
    Kind.GROUP_DELETE: (GroupDelete, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2])),
    Kind.GRANT: (Grant, _check_grant),
    Kind.MESSAGE_STATE: (MessageState, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2]) and _version(f[3]) and _int(f[4])
         and f[5] in _STATES and _int(f[6]) and _opt_str(f[7]) and _time(f[8])),
    Kind.LEASE_END: (LeaseEnd, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2]) and _version(f[3]) and _int(f[4]) and _time(f[5])),
    Kind.LEASE_EXTEND: (LeaseExtend, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2]) and _version(f[3]) and _time(f[4])),
    Kind.REMOVE: (Remove, lambda f: _version(f[0]) and _str(f[1]) and _version(f[2]) and _int(f[3]) and type(f[4]) is bool
         and _time(f[5])),
    Kind.GROUP_PARTITION_32: (GroupPartition32, _check_group_partition),
    Kind.GROUP_PARTITION: (GroupPartition, _check_group_partition_retry_at),
    Kind.DEDUPE: (Dedupe, lambda f: _str(f[0]) and _version(f[1]) and type(f[2]) is list and all(type(i) is str for i in f[2])
         and type(f[3]) is bytes),
    Kind.PARTITION_STATE: (PartitionState, lambda f: _str(f[0]) and _version(f[1]) and _int(f[2]) and _int(f[3]) and f[3] <= f[2]),
    Kind.PARTITION_MESSAGES: (PartitionMessages, lambda f: _str(f[0]) and _version(f[1]) and type(f[2]) is bytes and type(f[3]) is bytes
         and type(f[4]) is bytes and len(f[2]) == 2 * len(f[3]) and len(f[2]) % 8 == 0),
    Kind.TIMER_SET: (TimerSet, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2]) and _time(f[3]) and _time(f[4])
         and _str(f[5]) and type(f[6]) is bytes and _opt_str(f[7]) and _opt_str(f[8])),
    Kind.TIMER_CANCEL: (TimerCancel, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2])),
    Kind.TIMER_FIRED: (TimerFired, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2])),
    Kind.PENDING_TIMERS: (PendingTimers, _check_packed_keys),
    Kind.TIMER_SCHEDULE: (TimerSchedule, _check_timer_schedule),
    Kind.TIMER_REARM: (TimerRearm, lambda f: _version(f[0]) and _str(f[1]) and _str(f[2]) and _time(f[3])),
    Kind.PENDING_SCHEDULES: (PendingSchedules, _check_packed_keys),
}

_DECODERS = {int(kind): (cls, len(cls._fields), check) for kind, (cls, check) in SCHEMA.items()}
_KIND_OF = {cls: int(kind) for kind, (cls, _) in SCHEMA.items()}
# The records of queues and their timers (kept by the queue's shard), and those that take no version.
QUEUE_RECORDS = tuple(cls for cls, _ in SCHEMA.values() if "queue" in cls._fields)
_UNVERSIONED = tuple(cls for cls, _ in SCHEMA.values() if "version" not in cls._fields)


def decode(flat) -> list[Record]:
    """The typed records of a flat list; RecordError if it is not a whole sequence of known,
    well-formed records."""
    if type(flat) is not list:
        raise RecordError("records must be an array")
    records = []
    position, end = 0, len(flat)
    new = tuple.__new__
    while position < end:
        kind = flat[position]
        spec = _DECODERS.get(kind) if type(kind) is int else None
        if spec is None:
            raise UnknownKind(f"record kind {kind!r} at item {position} is unknown: written by a newer build of "
                              "Queen? This build will not guess at it")
        cls, count, check = spec
        fields = flat[position + 1:position + 1 + count]
        if len(fields) != count or not check(fields):
            raise RecordError(f"malformed {Kind(kind).name.lower()} record at item {position}")
        records.append(new(cls, fields))
        position += 1 + count
    return records




def version_of(record: Record) -> int:
    """The version a record took, or 0 for the kinds that take none."""
    if type(record) in _UNVERSIONED:
        return 0
    return record.version


def versions_of(records: list[Record]) -> tuple[int, int]:
    """(first, last) version taken by a list of records; (0, 0) when none takes one. RecordError if
    they do not rise."""
    first = last = 0
    for record in records:
        version = version_of(record)
        if not version:
            continue
        if version <= last:
            raise RecordError(f"versions do not rise: {version} after {last}")
        if not first:
            first = version
        last = version
    return first, last
