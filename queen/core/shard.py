"""One shard's whole state: its KV rows, the lock operations and waiters over them, and its queues."""

from __future__ import annotations

from queen.core.kv import KvOp, KvState, VersionCounter
from queen.core.limits import Limits
from queen.core.locks import LockOp, LockTable
from queen.core.queues import QueueTable, Shared


class ShardState:
    __slots__ = ("kv", "locks", "queues")

    def __init__(self, versions: VersionCounter, now_ms: int, limits: Limits | None = None, shared: Shared | None = None):
        limits = limits or Limits()
        shared = shared or Shared()
        self.kv = KvState(versions, now_ms, shared.usage)
        self.locks = LockTable(self.kv, now_ms, limits.wait_ms_max)
        self.queues = QueueTable(versions, shared, limits, now_ms)

    def apply(self, op, now_ms: int, records: list, reply_to, position: int):
        """The op's answer, or None if it was parked (a waiting acquire or pop)."""
        kind = type(op)
        if kind is LockOp:
            return self.locks.apply(op, now_ms, records, reply_to, position)
        if kind is KvOp:
            return self.kv.apply(op, now_ms, records)
        return self.queues.apply(op, now_ms, records, reply_to, position)
