"""One shard's whole state: its KV rows and the lock operations and waiters over them."""

from __future__ import annotations

from queen.core.kv import KvState, VersionCounter
from queen.core.locks import LockOp, LockTable


class ShardState:
    __slots__ = ("kv", "locks")

    def __init__(self, versions: VersionCounter, now_ms: int):
        self.kv = KvState(versions, now_ms)
        self.locks = LockTable(self.kv)

    def apply(self, op, now_ms: int, effects: list) -> dict:
        if type(op) is LockOp:
            return self.locks.apply(op, now_ms, effects)
        return self.kv.apply(op, now_ms, effects)

    def tick(self, now_ms: int, effects: list) -> None:
        self.locks.on_tick(self.kv.expire(now_ms), now_ms, effects)
