"""One shard's whole state: its KV rows, and the lock operations and waiters over them."""

from __future__ import annotations

from queen.core.kv import KvState, VersionCounter
from queen.core.locks import LockOp, LockTable


class ShardState:
    __slots__ = ("kv", "locks")

    def __init__(self, versions: VersionCounter, now_ms: int):
        self.kv = KvState(versions, now_ms)
        self.locks = LockTable(self.kv, now_ms)

    def apply(self, op, now_ms: int, records: list, reply_to, position: int) -> dict | None:
        """The op's answer, or None if it was parked (a waiting acquire)."""
        if type(op) is LockOp:
            return self.locks.apply(op, now_ms, records, reply_to, position)
        return self.kv.apply(op, now_ms, records)
