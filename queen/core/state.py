"""The whole server state, and the one entry point that changes it: `State.apply(step, now_ms)`.

Every state change is a step applied here, synchronously: an actor's batch of operations on its
shard, a transaction across shards, a tick of the timing wheels, the abandoning of a hung-up
client's parked requests. A step returns what it answered (its own operations' results and every
parked request it resolved, which the caller delivers at once), the records it produced (one
submit, so one frame) and the versions those took. Nothing else mutates the shard states, and
nothing awaits while a step is half applied: on one thread that makes every step atomic.

Which shard owns what is queen/core/placement.py's.

Pure: no trio, no clock reads, no I/O. `reply_to` values are opaque here.
"""

from __future__ import annotations

import struct

from queen.core import queues as queue_state
from queen.core import records as rec
from queen.core.kv import VersionCounter, is_locks_ns, snapshot_records
from queen.core.limits import Limits
from queen.core.placement import shard_of, shard_of_lease, shard_of_partition, shard_of_queue
from queen.core.shard import ShardState
from queen.core.txn import TransactionOps, apply_transaction

# -- steps --------------------------------------------------------------------------------------------

class Ops:
    """Operations on one shard, applied in order: items are (reply_to, position, op)."""

    __slots__ = ("shard", "items")

    def __init__(self, shard: int, items: list):
        self.shard = shard
        self.items = items


class Transaction:
    """A transaction's sections, on any shards, all or nothing; answered as (reply_to, 0, answer)."""

    __slots__ = ("txn", "reply_to")

    def __init__(self, txn: TransactionOps | list, reply_to):
        self.txn = TransactionOps(txn) if type(txn) is list else txn  # a list: KV operations only
        self.reply_to = reply_to


class Tick:
    """Time has reached now_ms: free what expired, hand freed permits on, time out waits."""

    __slots__ = ()


class Abandon:
    """Answer reply_to's parked requests on this shard now: "cancelled" when its client is gone (it
    must not be handed anything), or as if their wait had run out (timed_out: the connection is
    needed for a new client)."""

    __slots__ = ("shard", "reply_to", "timed_out")

    def __init__(self, shard: int, reply_to, timed_out: bool = False):
        self.shard = shard
        self.reply_to = reply_to
        self.timed_out = timed_out


class Drain:
    """The server is stopping: every parked pop is answered now (503)."""

    __slots__ = ()


class BeginEpoch:
    """This node begins leading `epoch`: one EPOCH record (queen/core/records.py), the epoch's first
    version, applied like any record (leases live at clock_floor_ms end no earlier than
    lease_grace_until_ms); answered as (reply_to, 0, its version). previous_version: the last
    version of the log before it (the counter may already stand higher: a version floor)."""

    __slots__ = ("epoch", "node", "previous_version", "clock_floor_ms", "lease_grace_until_ms", "reply_to")

    def __init__(self, epoch: int, node: str, previous_version: int, clock_floor_ms: int, lease_grace_until_ms: int,
                 reply_to):
        self.epoch = epoch
        self.node = node
        self.previous_version = previous_version
        self.clock_floor_ms = clock_floor_ms
        self.lease_grace_until_ms = lease_grace_until_ms
        self.reply_to = reply_to


class Applied:
    """What a step did: answers [(reply_to, position, result)], records (a flat list for the WAL)
    and the versions they took (0, 0 when none), and failures [(reply_to, position, exception)]:
    operations that raised before producing any record, each to be answered as an internal error;
    and notices, events for the log."""

    __slots__ = ("answers", "records", "first_version", "last_version", "failures", "notices")

    def __init__(self, answers: list, records: list, first_version: int, last_version: int,
                 failures: list | None = None, notices: list | None = None):
        self.answers = answers
        self.records = records
        self.first_version = first_version
        self.last_version = last_version
        self.failures = failures
        self.notices = notices  # what the queues want logged (QueueTable.notices)


class State:
    def __init__(self, shard_count: int, now_ms: int, versions: VersionCounter | None = None,
                 limits: Limits | None = None):
        self.versions = versions or VersionCounter()
        self.limits = limits or Limits()
        # Shared by every shard's queues: capacity counters, and which queue an id belongs to.
        self.queues = queue_state.Shared()
        self.shards = [ShardState(self.versions, now_ms, self.limits, self.queues) for _ in range(shard_count)]
        self.shard_count = shard_count
        # (epoch, first_version, previous_version) of every EPOCH record applied, in log order.
        self.epochs: list[tuple[int, int, int]] = []

    def apply(self, step, now_ms: int) -> Applied:
        before = self.versions.last
        records: list = []
        answers: list = []
        kind = type(step)
        failures: list = []
        notices = None
        if kind is Ops:
            shard = self.shards[step.shard]
            apply = shard.apply
            versions = self.versions
            for reply_to, position, op in step.items:
                produced, taken = len(records), versions.last
                try:
                    result = apply(op, now_ms, records, reply_to, position)
                except Exception as error:
                    self._fail_alone(error, produced, taken, records)
                    failures.append((reply_to, position, error))
                    continue
                if result is not None:
                    answers.append((reply_to, position, result))
            touched = (shard,)
        elif kind is Transaction:
            try:
                touched, answer = self._transaction(step.txn, now_ms, records)
            except Exception as error:
                self._fail_alone(error, 0, before, records)
                failures.append((step.reply_to, 0, error))
                if step.txn.next is not None:
                    failures.append((step.reply_to, 1, error))
                touched = ()
            else:
                answers.append((step.reply_to, 0, answer))
                if step.txn.next is not None:
                    touched = self._next_pop(step.txn.next, answer["success"], now_ms, records, step.reply_to,
                                             touched, answers)
        elif kind is Tick:
            touched = self.shards
            for shard in touched:
                shard.locks.tick(now_ms, records)
                shard.queues.tick(now_ms, records)
        elif kind is Abandon:
            touched = (self.shards[step.shard],)
            touched[0].locks.abandon(step.reply_to, now_ms, step.timed_out)
            touched[0].queues.abandon(step.reply_to, step.timed_out)
        elif kind is Drain:
            touched = self.shards
            for shard in touched:
                shard.queues.drain()
        elif kind is BeginEpoch:
            record = rec.Epoch(step.epoch, step.node, self.versions.next(), step.previous_version, step.clock_floor_ms,
                               step.lease_grace_until_ms)
            rec.encode(records, record)
            self._apply_epoch(record)
            answers.append((step.reply_to, 0, record.version))
            touched = ()
        else:
            raise TypeError(f"not a step: {step!r}")
        for shard in touched:
            locks = shard.locks
            locks.after_step(now_ms, records)  # a permit found expired by any read goes on at once
            if locks.resolved:
                answers += locks.resolved
                locks.resolved = []
            queues = shard.queues
            queues.after_step(now_ms, records)  # parked pops served by whatever this step changed
            if queues.resolved:
                answers += queues.resolved
                queues.resolved = []
            if queues.notices:
                notices = (notices or []) + queues.notices
                queues.notices = []
        last = self.versions.last
        if last == before:
            return Applied(answers, records, 0, 0, failures, notices)
        return Applied(answers, records, before + 1, last, failures, notices)

    def _fail_alone(self, error: Exception, produced: int, taken: int, records: list) -> None:
        """An operation raised (a bug). If it produced no records, nothing of it can reach the log
        and, as state changes only with their records, nothing of it is in memory: it fails alone,
        the versions it took unused are given back (a frame's versions stay dense) and the step
        goes on. Once it produced records, memory and log may disagree: re-raise, and the caller
        stops taking writes."""
        if len(records) != produced:
            raise error
        self.versions.last = taken

    def _transaction(self, txn: TransactionOps, now_ms: int, records: list) -> tuple[list, dict]:
        """Applies a transaction; the shards it touched, and its answer."""
        count, shards, shared = self.shard_count, self.shards, self.queues
        kv_shards = [shards[shard_of(op.ns, op.key, count)] for op in txn.kv]
        ack_shards = [shards[shard_of_partition(shared, item.partition_id, count)] for item in txn.ack]
        push_shards = [shards[shard_of_queue(item.queue, count)] for item in txn.push]
        timer_shards = [shards[shard_of_queue(op.queue, count)] for op in txn.timers]
        lease_checks = [shards[shard_of_lease(shared, lease_id, count)].queues.lease_live(lease_id, now_ms, None, txn.prefix)
                        for lease_id in txn.required_leases]
        answer = apply_transaction(txn, [shard.kv for shard in kv_shards], [shard.queues for shard in ack_shards],
                                   [shard.queues for shard in push_shards], [shard.queues for shard in timer_shards],
                                   now_ms, records, lease_checks)
        touched = {id(shard): shard for shard in (*kv_shards, *ack_shards, *push_shards, *timer_shards)}
        return list(touched.values()), answer

    def _next_pop(self, op, committed: bool, now_ms: int, records: list, reply_to, touched: list,
                  answers: list) -> list:
        """A transaction's `next`: the pop on the state the transaction left, in the same step (so
        the same frame); None at position 1 when the transaction was refused (no pop is made). It
        may park like any pop, and is then answered by a later step. The shards touched, its own
        included (its parked line is served after the step)."""
        if not committed:
            answers.append((reply_to, 1, None))
            return touched
        shard = self.shards[shard_of_queue(op.queue, self.shard_count)]
        result = shard.apply(op, now_ms, records, reply_to, 1)
        if result is not None:
            answers.append((reply_to, 1, result))
        return touched if any(s is shard for s in touched) else [*touched, shard]

    # -- recovery and snapshots -------------------------------------------------------------------

    def replay(self, record) -> None:
        """Re-apply one typed record from the WAL or a snapshot."""
        if type(record) in rec.QUEUE_RECORDS:
            self.shards[shard_of_queue(record.queue, self.shard_count)].queues.replay(record)
        elif type(record) is rec.Epoch:
            self._apply_epoch(record)
        else:
            self.shards[shard_of(record.ns, record.key, self.shard_count)].kv.replay(record)

    def _apply_epoch(self, record: rec.Epoch) -> None:
        """A new leader's epoch begins: no lease live at clock_floor_ms ends before
        lease_grace_until_ms. Live and on replay alike, from the state and the record alone."""
        self.epochs.append((record.epoch, record.version, record.previous_version))
        live_after, grace = record.clock_floor_ms, record.lease_grace_until_ms
        for shard in self.shards:
            extend_lock_permits(shard.kv, live_after, grace)
            shard.queues.extend_leases(live_after, grace)

    def snapshot_capture(self):
        """Copies of every shard's state, cheap to take at a batch edge; the function returned turns
        them into the snapshot's sections (run it off the event loop)."""
        copies = [shard.kv.snapshot_copy() for shard in self.shards]
        queue_copies = [queue_state.snapshot_copy(shard.queues.queues, shard.queues.timers) for shard in self.shards]

        def sections() -> dict[str, list]:
            kv: list = []
            locks: list = []
            for shard_copies in copies:
                snapshot_records(shard_copies, kv, locks)
            queues: list = []
            for shard_copies in queue_copies:
                queue_state.snapshot_records(shard_copies, queues)
            return {"kv": kv, "locks": locks, "queues": queues}

        return sections

    def row_count(self) -> int:
        return sum(shard.kv.row_count() for shard in self.shards)



_EXPIRES_AT = struct.Struct("<q")  # a packed row's expires_at_ms, at byte 32 (queen/core/kv.py)
_EXPIRES_AT_OFFSET = 32


def extend_lock_permits(kv, live_after_ms: int, until_ms: int) -> None:
    """Every lock permit (a row of a locks namespace) whose lease ends after live_after_ms but
    before until_ms now ends at until_ms. The row keeps its version (token) and fence; its entry
    in the TTL wheel fires at the old time, finds the later expiry and is filed again."""
    for ns, table in kv.tables.items():
        if not is_locks_ns(ns):
            continue
        rows = table.rows
        for key, packed in rows.items():
            expires_at_ms = _EXPIRES_AT.unpack_from(packed, _EXPIRES_AT_OFFSET)[0]
            if live_after_ms < expires_at_ms < until_ms:
                rows[key] = (packed[:_EXPIRES_AT_OFFSET] + _EXPIRES_AT.pack(until_ms)
                             + packed[_EXPIRES_AT_OFFSET + _EXPIRES_AT.size:])
