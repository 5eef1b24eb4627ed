"""The queues of one shard: every state transition of queues, partitions, groups, leases, acks,
the DLQ and retention, the live decisions that produce them (delivery's are in delivery.py), and
replay.

Every change is a record (queen/core/records.py) appended in version order, and the same
`_apply_*` functions change state for a live step and for replay, so replay reaches the same
state. Decisions (who gets what, when a lease has ended, what the DLQ takes) are made once, live,
and recorded as their effects; replay never reads a clock. The model is model.py; the admin reads
are views.py; snapshots are snapshot.py.

Never: reads a clock, awaits, or knows what a reply_to is.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable

from pyroaring import BitMap, BitMap64

from queen.core import records as rec
from queen.core.kv import VersionCounter
from queen.core.limits import Limits
from queen.core.outcomes import MessageState, QueueReason, Refusal
from queen.core.packing import read_int_array
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
from queen.core.queues import views
from queen.core.queues.delivery import Delivery, ready_at
from queen.core.queues.model import (
    Group,
    GroupState,
    Growth,
    Lease,
    Partition,
    Queue,
    QueueStatistics,
    QueueStats,
    Shared,
    count,
)
from queen.core.queues.packed import (
    created_at,
    dedupe_cost,
    pack_message,
    payload_bytes,
    transaction_id_of,
)
from queen.core.queues.parking import ParkedPops
from queen.core.queues.producer_ids import ProducerIds
from queen.core.tenants import is_own, shown
from queen.core.timer_ops import TimerList, Timers
from queen.core.timers import TimerTable
from queen.core.wheel import TimingWheel
from queen.errors import BadRequest

# Ended leases remembered (about 100 bytes each), so a retried ack without a group is answered right.
ENDED_LEASES_KEPT = 100_000


class QueueTable(Delivery):
    def __init__(self, versions: VersionCounter, shared: Shared, limits: Limits, now_ms: int):
        self.versions = versions
        self.shared = shared
        self.limits = limits
        self.queues: dict[str, Queue] = {}
        self.leases: dict[int, tuple[Queue, Group, Lease]] = {}
        self.lease_wheel = TimingWheel(now_ms)  # lease id -> expires_at_ms
        self.sweep_wheel = TimingWheel(now_ms)  # (queue, partition id) -> when retention may remove some
        self.producer_ids = ProducerIds(shared, limits.producer_ids_per_tick_max)
        self.parked = ParkedPops(now_ms)
        self.dirty: dict[str, None] = {}  # queues whose parked pops may be served now
        self.resolved: list = []  # (reply_to, position, answer) of parked pops answered
        # lease id -> group, the most recent ENDED_LEASES_KEPT; an OrderedDict because dropping the
        # oldest of a plain dict slows down as its deleted slots pile up at the front
        self.ended_leases: OrderedDict[int, str] = OrderedDict()
        self.stats = QueueStats()
        # What an operator should hear of, for the server to log after the step: ("dlq_move", queue,
        # group, partition, offset, retry_count, error) and ("lease_expired", queue, group,
        # lease_id, messages). Live steps only; replay adds none.
        self.notices: list[tuple] = []
        self.timers = TimerTable(versions, shared, limits, self)

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
                return self.extend(op.lease_id, op.seconds, now_ms, records, op.prefix)
            return self.release(op.lease_id, now_ms, records, op.prefix)
        return self.admin(op, now_ms, records)

    def admin(self, op: QueueAdmin, now_ms: int, records: list):
        args = op.args
        kind = op.kind
        name = op.queue if op.queue is not None else ""  # None only for the calls on every queue
        if kind == "dlq":
            return views.dlq_page(self.queues, name, args["group"], args["partition"], args["cursor"], args["skip"],
                                  args["limit"])
        if kind == "requeue":
            return self.requeue(name, args["group"], args["items"], now_ms, records)
        if kind == "purge":
            return self.purge(name, args["group"], now_ms, records)
        if kind == "delete":
            return self.delete_queue(name, now_ms, records)
        if kind == "delete_group":
            return self.delete_group(name, args["group"], now_ms, records)
        if kind == "delete_group_everywhere":
            tenant = args.get("tenant", "")
            names = [each for each, queue in self.queues.items()
                     if args["group"] in queue.groups and is_own(each, tenant)]
            for each in names:
                self.delete_group(each, args["group"], now_ms, records)
            return [shown(each) for each in names]
        if kind == "info":
            return views.queue_info(self.queues, self.timers, name, now_ms, self.stats, self.parked)
        if kind == "partitions":
            return views.partitions_page(self.queues, name, args["group"], args["prefix"], args["cursor"],
                                         args["limit"], now_ms)
        if kind == "list":
            return views.queue_summaries(self.queues, self.timers, args.get("tenant", ""), args["prefix"], args["after"],
                                         args["limit"], now_ms, self.stats, self.parked)
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
        # The defaults first: a queue_set of an earlier build lacks the options added since. A
        # compiled build wrote dlqAfterMaxRetries as 1 or 0 (see DEFAULT_OPTIONS): it is a boolean.
        options = {**DEFAULT_OPTIONS, **options}
        options["dlqAfterMaxRetries"] = bool(options["dlqAfterMaxRetries"])
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = Queue(name, created_at_ms, options, version, self.shared.usage.for_name(name))
            self.shared.queues += 1
        else:
            queue.options = options
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

    def _group(self, queue: Queue, name: str, mode: str, now_ms: int, records: list) -> Group | Refusal:
        group = queue.groups.get(name)
        if group is None:
            if len(queue.groups) >= self.limits.groups_per_queue_max:
                return Refusal(BadRequest("too_many_groups", f"queue {shown(queue.name)!r} has {len(queue.groups)} consumer "
                                          "groups, the most it may have; delete one first", {"queue": queue.shown}))
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

    def statistics(self, now_ms: int) -> QueueStatistics:
        stats, parked = self.stats, self.parked
        return QueueStatistics(stats.pushed, stats.duplicates, stats.push_failed, dict(stats.redelivered_failed),
                               dict(stats.redelivered_expired), dict(stats.dlq_moves), dict(stats.pushed_by_queue),
                               dict(stats.popped_by_queue), dict(stats.acked_by_queue), parked.served_total,
                               parked.wait_ms_total, len(parked), tuple(views.gauges(self.queues, now_ms)))

    # What the shard's timers need of its queues (queen/core/timers.py, QueueSink).

    def has_queue(self, name: str) -> bool:
        return name in self.queues

    def create_queue(self, name: str, now_ms: int, records: list) -> None:
        self._queue(name, now_ms, records, create=True)

    def push_fired(self, item: PushItem, now_ms: int, records: list) -> dict:
        return self.push_one(item, now_ms, records, exempt=True)

    # ------------------------------------------------------------------------------------------
    # Configure.

    def configure(self, name: str, changes: dict, now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        created = queue is None
        if created and self.shared.queues >= self.limits.queues_max:
            return {"configured": False, "queue": shown(name), "reason": QueueReason.STORAGE_FULL, "error": QueueReason.STORAGE_FULL}
        options = dict(DEFAULT_OPTIONS if queue is None else queue.options)
        options.update(changes)
        if queue is None or options != queue.options:
            version = self.versions.next()
            created_at_ms = now_ms if queue is None else queue.created_at_ms
            rec.queue_set(records, version, name, created_at_ms, options)
            queue = self._apply_queue_set(version, name, created_at_ms, options)
            self.dirty[name] = None
        return {"configured": True, "queue": shown(name), "created": created, "createdAt": queue.created_at_ms,
                "options": dict(queue.options)}

    # ------------------------------------------------------------------------------------------
    # Push.

    def push(self, items: list[PushItem], now_ms: int, records: list) -> list[dict]:
        return [self.push_one(item, now_ms, records) for item in items]

    def push_one(self, item: PushItem, now_ms: int, records: list, exempt: bool = False) -> dict:
        """exempt: a timer's fire, which no capacity refuses."""
        queue = self._queue(item.queue, now_ms, records, create=True)
        if queue is None:
            return self._push_failed(item, QueueReason.STORAGE_FULL)
        partition = queue.partitions.get(item.partition)
        tid = item.transaction_id
        if partition is not None and tid is not None:
            known = self.producer_ids.known(partition, tid, now_ms)
            if known is not None:
                known_offset, message_id, created_at_ms = known
                self.stats.duplicates += 1
                return {"index": item.index, "queue": queue.shown, "partition": partition.name,
                        "partitionId": partition.id, "transactionId": tid, "status": "duplicate",
                        "messageId": message_id, "offset": known_offset, "createdAt": created_at_ms}
        if not exempt:
            max_size = queue.options["maxSize"]
            if max_size and queue.messages >= max_size:
                return self._push_failed(item, QueueReason.QUEUE_FULL)
            if self.shared.bytes + item.size + dedupe_cost(tid) > self.limits.queue_bytes_max:
                return self._push_failed(item, QueueReason.STORAGE_FULL)
            if partition is None and len(queue.partitions) >= self.limits.partitions_per_queue_max:
                return self._push_failed(item, QueueReason.PARTITION_LIMIT)
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
        count(self.stats.pushed_by_queue, queue.name)
        return {"index": item.index, "queue": queue.shown, "partition": partition.name, "partitionId": partition.id,
                "transactionId": tid if tid is not None else f"{GENERATED_ID_PREFIX}{offset}", "status": "queued",
                "messageId": version, "offset": offset, "createdAt": now_ms}

    def _push_failed(self, item: PushItem, reason: str) -> dict:
        self.stats.push_failed += 1
        result = {"index": item.index, "queue": shown(item.queue), "partition": item.partition, "status": "failed",
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
        if queue.usage is not None:
            queue.usage.messages += 1
            queue.usage.bytes += size
        self.shared.bytes += size
        if tid is not None:
            self.producer_ids.remember(queue, partition, tid, offset, message_id, created_at_ms, until_ms)
        for name, state in partition.groups.items():
            if state.lease is None and state.ready_at_ms is None:
                self._requeue(queue, queue.groups[name], partition, state)
        self._schedule_sweep(queue, partition, created_at_ms)
        self.dirty[queue.name] = None

    def _apply_grant(self, queue: Queue, group: Group, lease_id: int, acquired_at_ms: int, expires_at_ms: int,
                     auto_ack: bool, deliveries: list) -> None:
        if auto_ack:
            for partition_id, offsets in deliveries:
                partition = queue.by_id[partition_id]
                state = partition.groups[group.name]
                if state.retry_at:
                    _redelivered(state.retry_at, offsets)
                for offset in offsets:
                    self._resolve(state, offset)
                self._requeue(queue, group, partition, state)  # no lease holds it: free for the next pop
            return
        lease = Lease(lease_id, group.name, acquired_at_ms, expires_at_ms)
        for partition_id, offsets in deliveries:
            partition = queue.by_id[partition_id]
            state = partition.groups[group.name]
            if state.retry_at:
                _redelivered(state.retry_at, offsets)
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
            if queue.usage is not None:
                queue.usage.messages -= 1
                queue.usage.bytes -= size
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
                    state.retry_at.pop(offset, None)

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
                return QueueReason.LEASE_LOST, {"state": MessageState.COMPLETED}
            return None
        if kind is QueueReason.LEASE_LOST or kind is QueueReason.NOT_DELIVERED:
            return kind, {"state": found[1]}
        return None

    def lease_live(self, lease_id: int, now_ms: int, group: str | None = None, prefix: str = "") -> bool:
        """Whether the lease (of this shard's queues) is live, of `group` when one is named, and of
        a queue of the tenant with that name prefix."""
        entry = self.leases.get(lease_id)
        if entry is None or not is_own(entry[0].name, prefix):
            return False
        lease = entry[2]
        return lease.expires_at_ms > now_ms and (group is None or group == lease.group)

    def check_push(self, item: PushItem, now_ms: int, growth: Growth) -> str | None:
        """Why push_one would refuse this push now, counting what earlier pushes of the same
        transaction add (growth, updated here when it passes); None when it would not. The same
        checks in the same order as push_one's; a duplicate passes and adds nothing."""
        queue = self.queues.get(item.queue)
        if not growth.new_queue(self.shared, self.limits, item.queue, queue is not None):
            return QueueReason.STORAGE_FULL
        partition = queue.partitions.get(item.partition) if queue is not None else None
        tid = item.transaction_id
        if tid is not None:
            if (item.queue, item.partition, tid) in growth.ids:
                return None
            if partition is not None and self.producer_ids.known(partition, tid, now_ms) is not None:
                return None
        max_size = queue.options["maxSize"] if queue is not None else DEFAULT_OPTIONS["maxSize"]
        added = growth.messages.get(item.queue, 0)
        if max_size and (queue.messages if queue is not None else 0) + added >= max_size:
            return QueueReason.QUEUE_FULL
        cost = item.size + dedupe_cost(tid)
        if self.shared.bytes + growth.bytes + cost > self.limits.queue_bytes_max:
            return QueueReason.STORAGE_FULL
        created = growth.partitions.setdefault(item.queue, set())
        if partition is None and item.partition not in created:
            existing = len(queue.partitions) if queue is not None else 0
            if existing + len(created) >= self.limits.partitions_per_queue_max:
                return QueueReason.PARTITION_LIMIT
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
        if queue is None or partition is None or name is None or not is_own(name, item.prefix):
            return QueueReason.LEASE_LOST, MessageState.UNKNOWN
        entry = self.leases.get(item.lease_id)
        lease = entry[2] if entry is not None and entry[0] is queue else None
        group_name = item.group
        if group_name is None:
            group_name = lease.group if lease is not None else self.ended_leases.get(item.lease_id, QUEUE_MODE_GROUP)
        state = partition.groups.get(group_name)
        offset = self._offset_of(partition, item)
        if offset is not None and offset >= partition.next_offset:
            return QueueReason.NOT_DELIVERED, MessageState.UNKNOWN  # never appended: judged before any set of offsets is asked
        if state is not None and offset is not None and self._completed(state, offset):
            return "already", MessageState.COMPLETED
        message_state = self._state_name(partition, state, offset) if state is not None and offset is not None else MessageState.UNKNOWN
        if lease is None or lease.expires_at_ms <= now_ms or item.partition_id not in lease.held or \
                (item.group is not None and item.group != lease.group):
            return QueueReason.LEASE_LOST, message_state
        if offset is None or offset not in lease.held[item.partition_id]:
            return QueueReason.NOT_DELIVERED, message_state
        return "ok", queue, queue.groups[lease.group], lease, partition, partition.groups[lease.group], offset

    def _offset_of(self, partition: Partition, item: AckItem) -> int | None:
        if item.offset is not None:
            return item.offset
        tid = item.transaction_id
        if tid.startswith(GENERATED_ID_PREFIX):
            digits = tid[len(GENERATED_ID_PREFIX):]
            return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else None
        return self.producer_ids.offset_of(partition, tid)

    @staticmethod
    def _completed(state: GroupState, offset: int) -> bool:
        return (offset < state.floor or offset in state.resolved) and offset not in state.dlq

    def _state_name(self, partition: Partition, state: GroupState, offset: int) -> str:
        if offset in state.dlq:
            return MessageState.DLQ
        if self._completed(state, offset):
            return MessageState.COMPLETED
        if offset >= partition.next_offset:
            return MessageState.UNKNOWN
        lease = state.lease
        if lease is not None and offset in lease.held.get(partition.id, ()):
            return MessageState.IN_FLIGHT
        return MessageState.PENDING

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
            count(self.stats.acked_by_queue, queue.name)
            released = not lease.held[partition.id]
            if ending is not None:
                ending.setdefault((lease.lease_id, partition.id), [queue, group, lease, False])
            elif released:
                self._lease_end(queue, group, lease, partition.id, now_ms, records)
        else:
            retry += 1
            dlq = item.status == "dlq" or (retry > queue.options["retryLimit"] and bool(queue.options["dlqAfterMaxRetries"]))
            error = item.error if item.error is not None else None
            self._message_state(queue, group.name, partition, offset, "dlq" if dlq else "pending", retry,
                                error if dlq else None, now_ms, records)
            if not dlq:
                count(self.stats.redelivered_failed, queue.name)
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
            count(self.stats.dlq_moves, queue.name)
            self.notices.append(("dlq_move", queue.name, group, partition.name, offset, retry, error))
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
                options = queue.options
                delay_ms = options["retryDelayMs"]
                if delay_ms:
                    # From what the record holds (the failure's time and count) and the options as
                    # they were then (queue_set records replay in order): replay holds it back alike.
                    state.retry_at[offset] = at_ms + retry_backoff_ms(delay_ms, options["retryDelayMaxMs"], retry)
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
            if queue.usage is not None:
                queue.usage.messages -= 1
                queue.usage.bytes -= size
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
            self.ended_leases.popitem(last=False)

    def _expire(self, queue: Queue, group: Group, lease: Lease, now_ms: int, records: list) -> None:
        """The lease's time passed: each message it delivered and that is still unresolved counts a
        delivery that ended without completion; the lease ends everywhere."""
        options = queue.options
        self.notices.append(("lease_expired", queue.name, group.name, lease.lease_id,
                             sum(len(offsets) for offsets in lease.held.values())))
        for partition_id, offsets in list(lease.held.items()):
            partition = queue.by_id.get(partition_id)
            if partition is None:
                continue
            state = partition.groups[group.name]
            for offset in list(offsets):
                retry = state.retries.get(offset, 0) + 1
                dlq = retry > options["retryLimit"] and bool(options["dlqAfterMaxRetries"])
                self._message_state(queue, group.name, partition, offset, "dlq" if dlq else "pending", retry,
                                    "lease_expired" if dlq else None, now_ms, records)
                if not dlq:
                    count(self.stats.redelivered_expired, queue.name)
        self._lease_end(queue, group, lease, 0, now_ms, records)

    def extend(self, lease_id: int, seconds: int | None, now_ms: int, records: list, prefix: str = "") -> dict:
        entry = self.leases.get(lease_id)
        if entry is None or entry[2].expires_at_ms <= now_ms or not entry[2].held or not is_own(entry[0].name, prefix):
            return {"leaseId": lease_id, "success": False, "reason": QueueReason.LEASE_LOST, "error": QueueReason.LEASE_LOST}
        queue, group, lease = entry
        seconds = seconds if seconds is not None else queue.options["leaseTimeSeconds"]
        expires_at_ms = max(lease.expires_at_ms, now_ms + seconds * 1000)
        if expires_at_ms != lease.expires_at_ms:
            version = self.versions.next()
            rec.lease_extend(records, version, queue.name, group.name, lease_id, expires_at_ms)
            self._apply_lease_extend(lease, expires_at_ms)
        return {"leaseId": lease_id, "success": True, "expiresAt": lease.expires_at_ms,
                "partitions": self._lease_partitions(queue, lease)}

    def extend_leases(self, live_after_ms: int, until_ms: int) -> None:
        """A new leader's epoch began (queen/core/state.py): every lease that ends after
        live_after_ms but before until_ms now ends at until_ms. No record of its own: the epoch
        record is replayed through here too."""
        for _, _, lease in self.leases.values():
            if live_after_ms < lease.expires_at_ms < until_ms:
                self._apply_lease_extend(lease, until_ms)

    def _apply_lease_extend(self, lease: Lease, expires_at_ms: int) -> None:
        lease.expires_at_ms = expires_at_ms
        self.lease_wheel.add(lease.lease_id, expires_at_ms)

    def release(self, lease_id: int, now_ms: int, records: list, prefix: str = "") -> dict:
        entry = self.leases.get(lease_id)
        if entry is None or entry[2].expires_at_ms <= now_ms or not entry[2].held or not is_own(entry[0].name, prefix):
            return {"leaseId": lease_id, "success": False, "reason": QueueReason.LEASE_LOST, "error": QueueReason.LEASE_LOST}
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
                out.append({"queue": queue.shown, "partition": partition.name, "partitionId": partition_id})
        return out

    def owns_lease(self, lease_id: int) -> bool:
        return lease_id in self.leases

    # ------------------------------------------------------------------------------------------
    # The ready heaps and waiters.

    def _requeue(self, queue: Queue, group: Group, partition: Partition, state: GroupState) -> None:
        """Put a partition in the group's ready heap if it may deliver (checked again when popped),
        keyed by when its head may be delivered. An entry already there with a key no later stays
        (a pop corrects it when it comes up); one with a later key is superseded by a new entry, or
        a pop would look at it only after every earlier key, too late (a floor brought down by a
        requeue, or a head held back by the retry backoff removed by retention)."""
        if state.lease is not None:
            return
        head = partition.messages.get(state.floor) if state.floor < partition.next_offset else None
        if head is None:
            state.ready_at_ms = None  # an entry left in the heap is dropped when it comes up
            return
        ready_at_ms = ready_at(head, state)
        if state.ready_at_ms is not None and state.ready_at_ms <= ready_at_ms:
            return
        heapq.heappush(group.ready, (ready_at_ms, partition.id))
        state.ready_at_ms = ready_at_ms

    # ------------------------------------------------------------------------------------------
    # Time.

    def tick(self, now_ms: int, records: list) -> None:
        """What time alone changes, looking only at what is due: leases that ran out, parked pops
        whose wait ends or whose awaited head (delayed, or held back by the retry backoff) may now
        be delivered, retention, producer ids to forget, timers to fire."""
        for lease_id in self.lease_wheel.advance(now_ms):
            entry = self.leases.get(lease_id)
            if entry is None:
                continue
            queue, group, lease = entry
            if lease.expires_at_ms > now_ms:
                self.lease_wheel.add(lease_id, lease.expires_at_ms)
                continue
            self._expire(queue, group, lease, now_ms, records)
        self.tick_parked(now_ms)
        for queue_name, partition_id in self.sweep_wheel.advance(now_ms):
            swept = self.queues.get(queue_name)
            partition = swept.by_id.get(partition_id) if swept is not None else None
            if swept is not None and partition is not None:
                self._sweep(swept, partition, now_ms, records)
        self.producer_ids.forget_due(self.queues, now_ms)
        self.timers.tick(now_ms, records)

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
            in_flight: set[int] = set()
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

    # ------------------------------------------------------------------------------------------
    # DLQ, deletion.

    def requeue(self, name: str, group: str, items: Iterable[tuple[int, int]], now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        results = []
        for index, (partition_id, offset) in enumerate(items):
            partition = queue.by_id.get(partition_id) if queue is not None else None
            state = partition.groups.get(group) if partition is not None else None
            if queue is None or partition is None or state is None or offset >= partition.next_offset \
                    or offset not in state.dlq:
                results.append({"index": index, "requeued": False, "reason": QueueReason.ABSENT})
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
            return {"deleted": False, "reason": QueueReason.ABSENT}
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
            self.producer_ids.drop(partition)
        self.shared.bytes -= queue.bytes
        if queue.usage is not None:
            queue.usage.messages -= queue.messages
            queue.usage.bytes -= queue.bytes
        self.shared.queues -= 1
        del self.queues[queue.name]
        self.timers.drop_queue(queue.name)

    def delete_group(self, name: str, group_name: str, now_ms: int, records: list) -> dict:
        queue = self.queues.get(name)
        if queue is None or group_name not in queue.groups:
            return {"deleted": False, "reason": QueueReason.ABSENT}
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
            self._apply_group_partition(queue, record, BitMap64.deserialize(record.resolved), 3)
        elif kind is rec.GroupPartition32:
            self._apply_group_partition(queue, record, BitMap64(BitMap.deserialize(record.resolved)), 2)
        elif kind is rec.PartitionState:
            partition = queue.by_id[record.partition_id]
            partition.next_offset = record.next_offset
            partition.removed_below = record.removed_below
        elif kind is rec.PartitionMessages:
            self._apply_messages(queue, queue.by_id[record.partition_id], record)
        elif kind in _TIMER_RECORDS:
            self.timers.replay(record)
        elif kind is rec.Dedupe:
            self.producer_ids.restore(queue, queue.by_id[record.partition_id], record.ids, record.entries)
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
        if queue.usage is not None:
            queue.usage.messages += len(offsets)
            queue.usage.bytes += size
        self.shared.bytes += size
        self._schedule_sweep(queue, partition, created_at(packed))
        self.dirty[queue.name] = None

    def _apply_group_partition(self, queue: Queue, record, resolved: BitMap64, stride: int) -> None:
        """stride: 3 for group_partition's retries, [offset, retry_count, retry_at_ms (0: none), ...];
        2 for group_partition_32's, [offset, retry_count, ...] (builds before the retry backoff:
        nothing is held back)."""
        partition = queue.by_id[record.partition_id]
        state = partition.groups[record.group]
        state.floor = record.floor
        state.resolved = resolved
        retries = record.retries
        state.retries = {retries[i]: retries[i + 1] for i in range(0, len(retries), stride)}
        if stride == 3:
            state.retry_at = {retries[i]: retries[i + 2] for i in range(0, len(retries), 3) if retries[i + 2]}
        dlq = record.dlq
        state.dlq = {dlq[i]: (dlq[i + 1], dlq[i + 2]) for i in range(0, len(dlq), 3)}
        # The group's join already put the partition in its ready heap when it had a head: that
        # entry stays when its key is no later, and is superseded otherwise (never two live entries,
        # which would let one pop take the partition twice).
        self._requeue(queue, queue.groups[record.group], partition, state)


def retry_backoff_ms(delay_ms: int, max_ms: int, retry: int) -> int:
    """How long a message is held back after its retry-th delivery that ended without completion:
    delay_ms doubled for each one before, at most max_ms. The shift is bounded (a delay of 1 ms
    shifted by 40 is past any max_ms) so a count of a million costs no big integer."""
    return min(delay_ms << min(retry - 1, 40), max_ms)


def _redelivered(retry_at: dict, offsets: list) -> None:
    """Offsets delivered again have served their backoff: they are held back no more."""
    for offset in offsets:
        retry_at.pop(offset, None)


_TIMER_RECORDS = (rec.TimerSet, rec.TimerCancel, rec.TimerFired, rec.PendingTimers, rec.TimerSchedule,
                  rec.TimerRearm, rec.PendingSchedules)
