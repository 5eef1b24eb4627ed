"""The model of one shard's queues: plain classes with slots, no behaviour beyond small reads.

  - A Queue has partitions (by name and by id), consumer groups, and its counts.
  - A Partition is an ordered lane of messages with dense offsets; a message is retained until
    every group has resolved it (or retention removes it).
  - A GroupState is one group's state in one partition: an ack floor (the lowest unresolved
    offset), the resolved offsets above it, retry counts, the retry times of messages held back
    by the queue's retry backoff, its DLQ entries there, at most one lease.
  - A Lease (its id is the version of the pop that granted it) holds partitions for one group
    until expires_at_ms; it is live while now < expires_at_ms and it still holds the partition.
  - A Group keeps a heap of partitions that may be ready, keyed by when their head may be
    delivered (its available_at, or its retry time if later: oldest head first, then partition
    id), checked lazily when popped, so a pop costs what it delivers, not the number of
    partitions. A GroupState remembers the key of its live entry there: an entry with another key
    was superseded (by one with an earlier key) and is dropped when it comes up.

Only queen/core/queues/table.py changes these; everything else reads them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pyroaring import BitMap64

from queen.core.limits import Limits
from queen.core.queue_ops import PopOp
from queen.core.tenants import Usage, UsageBook, shown


class GroupState:
    """One group's state in one partition."""

    __slots__ = ("floor", "resolved", "retries", "retry_at", "dlq", "lease", "ready_at_ms")

    def __init__(self, floor: int):
        self.floor = floor  # the lowest offset not resolved
        # Resolved offsets above the floor. 64-bit: a partition passes 2^32 offsets in about five
        # days at 10,000 messages a second.
        self.resolved = BitMap64()
        self.retries: dict[int, int] = {}  # offset -> deliveries that ended without completion
        # offset -> when it may be delivered again, for messages held back by the retry backoff and
        # not redelivered since; empty on a queue without a retry delay, so delivery checks no more.
        self.retry_at: dict[int, int] = {}
        self.dlq: dict[int, tuple] = {}  # offset -> (error, dlq_at_ms); resolved, and kept
        self.lease: Lease | None = None
        self.ready_at_ms: int | None = None  # the key of this partition's live entry in the group's ready heap

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

    def __init__(self, lease_id: int, group: str, acquired_at_ms: int, expires_at_ms: int) -> None:
        self.lease_id = lease_id
        self.group = group
        self.acquired_at_ms = acquired_at_ms
        self.expires_at_ms = expires_at_ms
        self.held: dict[int, list[int]] = {}  # partition id -> offsets delivered and not yet resolved


class Group:
    __slots__ = ("name", "mode", "joined_at_ms", "join_version", "leases", "ready")

    def __init__(self, name: str, mode: str, joined_at_ms: int, join_version: int) -> None:
        self.name = name
        self.mode = mode
        self.joined_at_ms = joined_at_ms
        self.join_version = join_version
        self.leases: dict[int, Lease] = {}
        self.ready: list = []  # heap of (when the head may be delivered, partition id)


class Queue:
    __slots__ = ("name", "created_at_ms", "options", "partitions", "by_id", "groups", "messages", "bytes",
                 "dedupe_due", "version", "usage", "shown")

    def __init__(self, name: str, created_at_ms: int, options: dict, version: int, usage: Usage | None = None) -> None:
        self.name = name
        self.shown = shown(name)  # as its tenant wrote it, for answers
        self.usage = usage  # its tenant's, counted with messages and bytes; None for the default tenant
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

    __slots__ = ("queues", "bytes", "timers", "partition_queue", "lease_queue", "usage")

    def __init__(self) -> None:
        self.usage = UsageBook()  # per tenant, KV rows' included: the one object every shard shares
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


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    """One shard's queue counters and gauges, as /metrics reads them."""

    pushed: int
    duplicates: int
    push_failed: int
    redelivered_failed: dict  # queue -> deliveries that ended in a failed ack and were returned
    redelivered_expired: dict  # queue -> deliveries whose lease expired and were returned
    dlq_moves: dict  # queue -> messages moved to its DLQ
    pushed_by_queue: dict  # queue -> messages appended (timer fires included)
    popped_by_queue: dict  # queue -> messages delivered
    acked_by_queue: dict  # queue -> messages completed (acked, or auto-acked as delivered)
    pop_waits: int  # parked pops served
    pop_wait_ms_total: int  # how long they waited in all
    pops_parked: int  # pops waiting now
    gauges: tuple  # (queue, group, what, value): see queen/core/queues/views.py gauges()


class QueueStats:
    __slots__ = ("pushed", "duplicates", "push_failed", "redelivered_failed", "redelivered_expired", "dlq_moves",
                 "pushed_by_queue", "popped_by_queue", "acked_by_queue")

    def __init__(self) -> None:
        self.pushed = self.duplicates = self.push_failed = 0
        # queue -> count, since the start (a restarted server counts from 0, as Prometheus expects)
        self.redelivered_failed: dict[str, int] = {}
        self.redelivered_expired: dict[str, int] = {}
        self.dlq_moves: dict[str, int] = {}
        # queue -> messages pushed, popped and acked: what the dashboard's rates are made of
        self.pushed_by_queue: dict[str, int] = {}
        self.popped_by_queue: dict[str, int] = {}
        self.acked_by_queue: dict[str, int] = {}


def count(counter: dict, key: str, by: int = 1) -> None:
    counter[key] = counter.get(key, 0) + by


class Growth:
    """What the earlier pushes and schedules of one transaction will add, so the capacity check of
    each later one counts them (every check is judged before anything is applied)."""

    __slots__ = ("bytes", "timers", "queues", "messages", "partitions", "ids")

    def __init__(self) -> None:
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
