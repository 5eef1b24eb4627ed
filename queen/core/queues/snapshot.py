"""Snapshots of one shard's queues: a copy cheap enough to take at a batch edge on the event loop,
and the records that rebuild it (queen/core/records.py encodes them), built from the copy off the
loop. Replay of those records is the table's (queen/core/queues/table.py), as for the log's.
"""

from __future__ import annotations

from queen.core import records as rec
from queen.core.packing import int_array
from queen.core.queues.model import Queue
from queen.core.timers import TimerTable


def snapshot_copy(queues: dict[str, Queue], timers: TimerTable) -> list:
    """A consistent copy of every queue: messages are immutable bytes, so a shallow copy of each
    partition's dict does; mutable group states are copied."""
    copies = []
    for queue in queues.values():
        partitions = []
        for partition in queue.partitions.values():
            states = [(name, state.floor, state.resolved.copy(), dict(state.retries), dict(state.retry_at),
                       dict(state.dlq)) for name, state in partition.groups.items()]
            partitions.append((partition.id, partition.name, partition.created_at_ms, dict(partition.messages),
                               states, dict(partition.dedupe), partition.next_offset, partition.removed_below))
        groups = [(g.join_version, g.name, g.mode, g.joined_at_ms) for g in queue.groups.values()]
        leases = [(lease.lease_id, g.name, lease.acquired_at_ms, lease.expires_at_ms,
                   [[pid, list(offsets)] for pid, offsets in lease.held.items()])
                  for g in queue.groups.values() for lease in g.leases.values() if lease.held]
        copies.append((queue.version, queue.name, queue.created_at_ms, dict(queue.options), partitions, groups, leases,
                       timers.snapshot_copy(queue.name)))
    return copies


def snapshot_records(copies: list, out: list) -> None:
    """The records that rebuild the queues of snapshot_copy()'s copies, in an order replay accepts."""
    for version, name, created_at_ms, options, partitions, groups, leases, timers in copies:
        rec.queue_set(out, version, name, created_at_ms, options)
        TimerTable.snapshot_records(name, timers, out)
        for partition_id, partition_name, partition_created, messages, _, dedupe, next_offset, removed_below in partitions:
            rec.partition(out, partition_id, name, partition_name, partition_created)
            if messages:
                rec.partition_messages(out, name, partition_id, int_array("q", messages.keys()),
                                       int_array("I", map(len, messages.values())), b"".join(messages.values()))
            if dedupe:
                rec.dedupe(out, name, partition_id, list(dedupe), b"".join(dedupe.values()))
            rec.partition_state(out, name, partition_id, next_offset, removed_below)
        for join_version, group, mode, joined_at_ms in groups:
            rec.group_join(out, join_version, name, group, mode, joined_at_ms)
        for partition_id, _, _, _, states, _, _, _ in partitions:
            for group, floor, resolved, retries, retry_at, dlq in states:
                # Every offset held back by the retry backoff has a retry count: one triple each.
                rec.group_partition(out, name, group, partition_id, floor, resolved.serialize(),
                                    [x for offset, count in retries.items() for x in (offset, count, retry_at.get(offset, 0))],
                                    [x for offset, (error, at_ms) in dlq.items() for x in (offset, error, at_ms)])
        for lease_id, group, acquired_at_ms, expires_at_ms, deliveries in leases:
            rec.grant(out, lease_id, name, group, acquired_at_ms, expires_at_ms, False, deliveries)
