"""The admin reads of one shard's queues, as the HTTP API answers them: queue summaries for the
listing, one queue's info, a page of its partitions, a page of its DLQ, and the gauges /metrics
shows. Functions over the model (queen/core/queues/model.py) and the shard's timers; they read and
never change anything.

The listing and a queue's info also show what is not state: the counters of messages pushed,
popped, acked and failed since this server started (`totals`, from the table's QueueStats) and the
pops parked on each group (ParkedPops). A replay rebuilds neither, so those callers that compare a
replayed table's views with the live one's pass neither and get the state alone.
"""

from __future__ import annotations

import base64

import orjson
from orjson import Fragment

from queen.core.queue_ops import GENERATED_ID_PREFIX
from queen.core.queues.model import Group, GroupState, Partition, Queue, QueueStats
from queen.core.queues.packed import created_at, unpack_message
from queen.core.queues.parking import ParkedPops
from queen.core.tenants import is_own, shown
from queen.core.timers import TimerTable


def counts(partition: Partition, state: GroupState, now_ms: int) -> tuple[int, int, int]:
    """(pending, inFlight, dlq) of one group in one partition."""
    lease = state.lease
    in_flight = len(lease.held.get(partition.id, ())) if lease is not None and lease.expires_at_ms > now_ms else 0
    unresolved = state.unresolved(partition.next_offset)
    return unresolved - in_flight, in_flight, len(state.dlq)


def group_counts(queue: Queue, group: str | None, now_ms: int) -> tuple[int, int, int]:
    """(pending, inFlight, dlq) of one group (None: every group) across the queue's partitions."""
    pending = in_flight = dlq = 0
    for partition in queue.partitions.values():
        states = partition.groups.values() if group is None else (partition.groups[group],)
        for state in states:
            p, f, d = counts(partition, state, now_ms)
            pending += p
            in_flight += f
            dlq += d
    return pending, in_flight, dlq


def live_leases(group: Group, now_ms: int) -> int:
    """The group's leases that hold messages and have not run out: consumers at work."""
    return sum(1 for lease in group.leases.values() if lease.expires_at_ms > now_ms and lease.held)


def parked_pops(parked: ParkedPops, queue: str, group: str) -> int:
    """The group's pops parked on the queue now (waitMs): consumers waiting for a message."""
    groups = parked.by_queue.get(queue)
    waiting = groups.get(group) if groups is not None else None
    return len(waiting) if waiting is not None else 0


def totals(stats: QueueStats, queue: str) -> dict:
    """The queue's messages since this server started (live steps: a restart or a new leader counts
    from 0): pushed (timer fires included), popped (delivered), acked (completed, auto-acked ones
    included) and failed (deliveries that ended in a failed ack, an expired lease or the DLQ).
    Counters: their rates are the queue's throughput."""
    return {"pushed": stats.pushed_by_queue.get(queue, 0), "popped": stats.popped_by_queue.get(queue, 0),
            "acked": stats.acked_by_queue.get(queue, 0),
            "failed": stats.redelivered_failed.get(queue, 0) + stats.redelivered_expired.get(queue, 0)
            + stats.dlq_moves.get(queue, 0)}


def queue_summaries(queues: dict[str, Queue], timers: TimerTable, tenant: str, prefix: str, after: str | None,
                    limit: int, now_ms: int, stats: QueueStats | None = None,
                    parked: ParkedPops | None = None) -> list[dict]:
    """This shard's part of a page of the tenant's queue listing (`tenant`: its name prefix, as
    queen/core/tenants.py makes it): up to limit+1 queues after `after`, names as the tenant
    wrote them. With stats and parked (the module docstring says why they are apart): each queue's
    totals and consumers (live leases and parked pops of all its groups)."""
    start = tenant + prefix
    after = None if after is None else tenant + after
    names = sorted(name for name in queues if name.startswith(start) and (after is None or name > after)
                   and is_own(name, tenant))
    out = []
    for name in names[:limit + 1]:
        queue = queues[name]
        pending, in_flight, dlq = group_counts(queue, None, now_ms)
        summary = {"queue": shown(name), "createdAt": queue.created_at_ms, "partitions": len(queue.partitions),
                   "messages": queue.messages, "pending": pending, "inFlight": in_flight, "dlq": dlq,
                   "timers": len(timers.pending.get(name, ())), "groups": sorted(queue.groups),
                   "oldestPendingAt": oldest_unfinished_at(queue, None)}
        if stats is not None and parked is not None:
            summary["consumers"] = sum(live_leases(group, now_ms) + parked_pops(parked, name, group.name)
                                       for group in queue.groups.values())
            summary["totals"] = totals(stats, name)
        out.append(summary)
    return out


def queue_info(queues: dict[str, Queue], timers: TimerTable, name: str, now_ms: int,
               stats: QueueStats | None = None, parked: ParkedPops | None = None) -> dict:
    """One queue: its options and counts, and each group's. With stats and parked (the module
    docstring says why they are apart): the queue's totals, and each group's parked pops and
    consumers (its live leases and parked pops)."""
    queue = queues.get(name)
    if queue is None:
        return {"found": False, "queue": shown(name)}
    groups = []
    for group in queue.groups.values():
        pending, in_flight, dlq = group_counts(queue, group.name, now_ms)
        leases = live_leases(group, now_ms)
        view = {"consumerGroup": group.name, "subscriptionMode": group.mode, "joinedAt": group.joined_at_ms,
                "pending": pending, "inFlight": in_flight, "dlq": dlq, "leases": leases,
                "oldestPendingAt": oldest_unfinished_at(queue, group.name)}
        if parked is not None:
            waiting = parked_pops(parked, name, group.name)
            view["parkedPops"] = waiting
            view["consumers"] = leases + waiting
        groups.append(view)
    info = {"found": True, "queue": shown(name), "createdAt": queue.created_at_ms, "options": dict(queue.options),
            "partitions": len(queue.partitions), "messages": queue.messages, "bytes": queue.bytes,
            "timers": timers.summary(name), "groups": groups}
    if stats is not None:
        info["totals"] = totals(stats, name)
    return info


def partitions_page(queues: dict[str, Queue], name: str, group: str | None, prefix: str, after: str | None,
                    limit: int, now_ms: int) -> dict:
    queue = queues.get(name)
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
            pending, in_flight, dlq = counts(partition, state, now_ms)
            lease = state.lease
            live = lease is not None and lease.expires_at_ms > now_ms
            groups.append({"consumerGroup": group_name, "ackFloor": state.floor, "pending": pending,
                           "inFlight": in_flight, "dlq": dlq,
                           "lease": {"leaseId": lease.lease_id, "acquiredAt": lease.acquired_at_ms,
                                     "expiresAt": lease.expires_at_ms} if live else None,
                           "retryAt": retry_at(state, now_ms)})
        items.append({"partition": partition.name, "partitionId": partition.id, "createdAt": partition.created_at_ms,
                      "firstOffset": partition.first_offset(), "nextOffset": partition.next_offset,
                      "messages": len(partition.messages), "groups": groups})
    return {"items": items, "after": names[limit - 1] if len(names) > limit else None}


def retry_at(state: GroupState, now_ms: int) -> int | None:
    """When the first of the group's messages in the partition that the retry backoff holds back
    may be delivered again (None: it holds none back). The lane waits for it when it reaches it."""
    return min((at_ms for at_ms in state.retry_at.values() if at_ms > now_ms), default=None)


def dlq_page(queues: dict[str, Queue], name: str, group: str | None, partition_name: str | None,
             cursor: tuple | None, skip: int, limit: int) -> dict:
    """A page of the queue's DLQ entries, oldest first (then partition, offset, group)."""
    queue = queues.get(name)
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
        messages.append({"queue": shown(name), "partition": partition.name, "partitionId": partition_id,
                         "consumerGroup": group_name, "messageId": message_id, "offset": offset,
                         "transactionId": tid if tid is not None else f"{GENERATED_ID_PREFIX}{offset}",
                         "data": Fragment(data) if packed else None, "createdAt": created_at_ms,
                         "retryCount": state.retries.get(offset, 0), "error": error, "dlqAt": at_ms})
    next_cursor = _encode_dlq_cursor(page[-1][:4]) if len(entries) > limit else None
    return {"messages": messages, "total": total, "cursor": next_cursor}


def gauges(queues: dict[str, Queue], now_ms: int) -> list[tuple[str, str, str, int | float]]:
    """(queue, group, what, value) gauges: messages (group ""); per group pending, in_flight, dlq,
    and oldest_pending_age_seconds: how long ago the oldest message the group has not finished
    (pending or in flight) was pushed, 0 when there is none."""
    out = []
    for queue in queues.values():
        out.append((queue.name, "", "messages", queue.messages))
        for group in queue.groups.values():
            pending, in_flight, dlq = group_counts(queue, group.name, now_ms)
            out += [(queue.name, group.name, "pending", pending), (queue.name, group.name, "in_flight", in_flight),
                    (queue.name, group.name, "dlq", dlq),
                    (queue.name, group.name, "oldest_pending_age_seconds",
                     _oldest_unfinished_age_ms(queue, group.name, now_ms) / 1000)]
    return out


def _oldest_unfinished_age_ms(queue: Queue, group: str, now_ms: int) -> int:
    oldest = oldest_unfinished_at(queue, group)
    return 0 if oldest is None else max(0, now_ms - oldest)


def oldest_unfinished_at(queue: Queue, group: str | None) -> int | None:
    """When the oldest message the group (None: any group) has not finished, pending or in flight,
    was pushed; None when there is none. A queue no group reads yet: its oldest message."""
    oldest = None
    for partition in queue.partitions.values():
        if group is None and not partition.groups:
            packed = partition.messages.get(partition.first_offset())
            if packed is not None and (oldest is None or created_at(packed) < oldest):
                oldest = created_at(packed)
        states = partition.groups.values() if group is None else (partition.groups[group],)
        for state in states:
            if state.unresolved(partition.next_offset) > 0:
                packed = partition.messages.get(state.floor)  # the floor is the lowest offset not resolved
                if packed is not None and (oldest is None or created_at(packed) < oldest):
                    oldest = created_at(packed)
    return oldest


def _encode_dlq_cursor(key: tuple) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).decode().rstrip("=")
