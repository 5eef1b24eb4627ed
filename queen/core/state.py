"""The whole server state, and the one entry point that changes it: `State.apply(step, now_ms)`.

Every state change is a step applied here, synchronously: an actor's batch of operations on its
shard, a transaction across shards, a tick of the timing wheels, the abandoning of a hung-up
client's parked requests. A step returns what it answered (its own operations' results and every
parked request it resolved, which the caller delivers at once), the records it produced (one
submit, so one frame) and the versions those took. Nothing else mutates the shard states, and
nothing awaits while a step is half applied: on one thread that makes every step atomic.

Placement: a row's shard is a stable hash of (ns, key); for lock rows (`queen-locks / name#slot`)
only the name counts, so every slot of one lock lives on one shard.

Pure: no trio, no clock reads, no I/O. `reply_to` values are opaque here.
"""

from __future__ import annotations

import zlib

from queen.core import queues as queue_state
from queen.core import records as rec
from queen.core.kv import LOCKS_NS, VersionCounter, snapshot_records
from queen.core.limits import Limits
from queen.core.shard import ShardState
from queen.core.txn import TransactionOps, apply_transaction, queen_mq_answer

_ns_seeds: dict[str, int] = {}
_NS_SEEDS_MAX = 4096  # namespaces are few; past this, hash without the cache rather than grow it


def shard_of(ns: str, key: str, shard_count: int) -> int:
    """crc32 of ns, NUL, key: stable across runs, and cheap with the namespace's part computed once."""
    if ns == LOCKS_NS:
        key = key.partition("#")[0]
    seed = _ns_seeds.get(ns)
    if seed is None:
        seed = zlib.crc32(ns.encode() + b"\x00")
        if len(_ns_seeds) < _NS_SEEDS_MAX:
            _ns_seeds[ns] = seed
    return zlib.crc32(key.encode(), seed) % shard_count


_LOCKS_SEED = zlib.crc32(LOCKS_NS.encode() + b"\x00")


def shard_of_lock(name: str, shard_count: int) -> int:
    """shard_of(LOCKS_NS, name + "#" + any slot), without building the key."""
    return zlib.crc32(name.encode(), _LOCKS_SEED) % shard_count


_QUEUES_SEED = zlib.crc32(b"queen-queues\x00")


def shard_of_queue(name: str, shard_count: int) -> int:
    """Everything of one queue lives on one shard: its partitions, groups, leases and timers."""
    return zlib.crc32(name.encode(), _QUEUES_SEED) % shard_count


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
    """The client behind reply_to is gone: answer its parked requests on this shard now."""

    __slots__ = ("shard", "reply_to")

    def __init__(self, shard: int, reply_to):
        self.shard = shard
        self.reply_to = reply_to


class Drain:
    """The server is stopping: every parked pop is answered now (503)."""

    __slots__ = ()


class Applied:
    """What a step did: answers [(reply_to, position, result)], records (a flat list for the WAL)
    and the versions they took (0, 0 when none), and failures [(reply_to, position, exception)]:
    operations that raised before producing any record, each to be answered as an internal error."""

    __slots__ = ("answers", "records", "first_version", "last_version", "failures")

    def __init__(self, answers: list, records: list, first_version: int, last_version: int,
                 failures: list | None = None):
        self.answers = answers
        self.records = records
        self.first_version = first_version
        self.last_version = last_version
        self.failures = failures


class State:
    def __init__(self, shard_count: int, now_ms: int, versions: VersionCounter | None = None,
                 limits: Limits | None = None):
        self.versions = versions or VersionCounter()
        self.limits = limits or Limits()
        # Shared by every shard's queues: capacity counters, and which queue an id belongs to.
        self.queues = queue_state.Shared()
        self.shards = [ShardState(self.versions, now_ms, self.limits, self.queues) for _ in range(shard_count)]
        self.shard_count = shard_count

    def apply(self, step, now_ms: int) -> Applied:
        before = self.versions.last
        records: list = []
        answers: list = []
        kind = type(step)
        failures: list = []
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
                touched = ()
            else:
                answers.append((step.reply_to, 0, answer))
        elif kind is Tick:
            touched = self.shards
            for shard in touched:
                shard.locks.tick(now_ms, records)
                shard.queues.tick(now_ms, records)
        elif kind is Abandon:
            touched = (self.shards[step.shard],)
            touched[0].locks.abandon(step.reply_to)
            touched[0].queues.abandon(step.reply_to)
        elif kind is Drain:
            touched = self.shards
            for shard in touched:
                shard.queues.drain()
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
        last = self.versions.last
        if last == before:
            return Applied(answers, records, 0, 0, failures)
        return Applied(answers, records, before + 1, last, failures)

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
        count = self.shard_count
        kv_shards = [self.shards[shard_of(op.ns, op.key, count)] for op in txn.kv]
        partition_queue = self.queues.partition_queue
        # An ack's partition is found through its queue; an unknown one is judged (lease_lost) on shard 0.
        ack_shards = [self.shards[shard_of_queue(partition_queue[item.partition_id], count)
                                  if item.partition_id in partition_queue else 0] for item in txn.ack]
        push_shards = [self.shards[shard_of_queue(item.queue, count)] for item in txn.push]
        timer_shards = [self.shards[shard_of_queue(op.queue, count)] for op in txn.timers]
        lease_queue = self.queues.lease_queue
        lease_checks = [lease_id in lease_queue and self.shards[shard_of_queue(lease_queue[lease_id], count)]
                        .queues.lease_live(lease_id, now_ms) for lease_id in txn.required_leases]
        answer = apply_transaction(txn, [shard.kv for shard in kv_shards], [shard.queues for shard in ack_shards],
                                   [shard.queues for shard in push_shards], [shard.queues for shard in timer_shards],
                                   now_ms, records, lease_checks)
        if txn.queen_mq_order is not None:
            answer = queen_mq_answer(txn, answer)
        touched = {id(shard): shard for shard in (*kv_shards, *ack_shards, *push_shards, *timer_shards)}
        return list(touched.values()), answer

    # -- recovery and snapshots -------------------------------------------------------------------

    def replay(self, record) -> None:
        """Re-apply one typed record from the WAL or a snapshot."""
        if type(record) in rec.QUEUE_RECORDS:
            self.shards[shard_of_queue(record.queue, self.shard_count)].queues.replay(record)
        else:
            self.shards[shard_of(record.ns, record.key, self.shard_count)].kv.replay(record)

    def snapshot_capture(self):
        """Copies of every shard's state, cheap to take at a batch edge; the function returned turns
        them into the snapshot's sections (run it off the event loop)."""
        copies = [shard.kv.snapshot_copy() for shard in self.shards]
        queue_copies = [shard.queues.snapshot_copy() for shard in self.shards]

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

