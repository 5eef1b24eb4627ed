"""Transactions, first form: `client.transaction().guard(lock).kv.put(...).commit()`
on `POST /api/v1/transaction`, answering `success` and `reason`.

The guards of the locks go first in the `kv` section, read when the transaction is sent (the
latest token: read lock.token when you send it). A guard that misses means the lock is no
longer ours: the handle is told (on_lost("guard")) before commit() returns. Operations are indexed
as you added them, guards not counted.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from queen.client.errors import LockLost
from queen.client.kv import CheckResult, Current, Item, WriteResult, write_op
from queen.client.lease import LostReason

READ_OPS = frozenset(("get", "check"))


@dataclass(frozen=True, slots=True)
class TxnResult:
    """`success`; when it failed, `reason` ("kv_precondition"), and either `failed_lock` (the name
    of the lock whose guard missed) or `failed_index` (which of your operations missed, with its
    `failed_reason` and the key's `current`). `results`, on success, one per operation."""

    success: bool
    reason: str | None = None
    failed_index: int | None = None
    failed_reason: str | None = None
    failed_lock: str | None = None
    current: Current | None = None
    results: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.success


class _TxnKv:
    """`transaction.kv`: each call adds one operation and returns the transaction, for chaining."""

    def __init__(self, txn: Transaction):
        self._txn = txn

    def get(self, ns: str, key: str) -> Transaction:
        return self._txn._add({"op": "get", "ns": ns, "key": key})

    def check(self, ns: str, key: str, expect: int, *, required: bool = True) -> Transaction:
        return self._txn._add({"op": "check", "ns": ns, "key": key, "expect": expect, "required": required})

    def put(self, ns: str, key: str, value, *, ttl=None, forever: bool = False, expect: int | None = None) -> Transaction:
        return self._txn._add(write_op("put", ns, key, value=value, has_value=True, ttl=ttl, forever=forever, expect=expect))

    def put_if_absent(self, ns: str, key: str, value, *, ttl=None, forever: bool = False) -> Transaction:
        return self._txn._add(write_op("putIfAbsent", ns, key, value=value, has_value=True, ttl=ttl, forever=forever))

    def delete(self, ns: str, key: str, *, expect: int | None = None) -> Transaction:
        return self._txn._add(write_op("delete", ns, key, expect=expect))

    def incr(self, ns: str, key: str, by: int = 1, *, max: int | None = None, min: int | None = None,
             ttl=None, forever: bool = False, expect: int | None = None) -> Transaction:
        return self._txn._add(write_op("incr", ns, key, ttl=ttl, forever=forever, expect=expect, by=by, max=max, min=min))


class Transaction:
    def __init__(self, transport):
        self._transport = transport
        self._ops: list[dict] = []
        self._locks: list = []
        self.kv = _TxnKv(self)

    def _add(self, op: dict) -> Transaction:
        self._ops.append(op)
        return self

    def guard(self, lock) -> Transaction:
        """Commit only while `lock` is still ours (its guard is checked in the same log entry)."""
        self._locks.append(lock)
        return self

    async def commit(self) -> TxnResult:
        """Apply every operation, or none. Raises LockLost without sending anything if a guarded
        lock is already known to be lost."""
        async with AsyncExitStack() as stack:
            guards = []
            for lock in self._locks:
                await stack.enter_async_context(lock._gate.commit())
                guard = lock.guard
                if guard is None:
                    raise LockLost(lock.name, lock.lost_reason or "not held")
                guards.append(guard)
            safe = all(op["op"] in READ_OPS for op in self._ops)
            answer = await self._transport.call("POST", "/api/v1/transaction", {"kv": guards + self._ops}, safe=safe)
            return self._result(answer, len(guards))

    def _result(self, answer: dict, guard_count: int) -> TxnResult:
        if answer.get("success"):
            results = []
            for op, wire in zip(self._ops, answer.get("kv", [])[guard_count:], strict=False):
                if op["op"] == "get":
                    results.append(Item.from_wire(op["key"], wire))
                elif op["op"] == "check":
                    results.append(CheckResult(wire["applied"], wire.get("version", 0)))
                else:
                    results.append(WriteResult.from_wire(wire))
            return TxnResult(True, results=results)
        failed = answer.get("failed") or {}
        index = failed.get("index")
        current = failed.get("current")
        current = Current(current.get("value"), current.get("version", 0)) if current else None
        if failed.get("section") == "kv" and index is not None and index < guard_count:
            lock = self._locks[index]
            lock._lose(LostReason.GUARD)
            return TxnResult(False, answer.get("reason"), None, failed.get("reason"), lock.name, current)
        return TxnResult(False, answer.get("reason"), None if index is None else index - guard_count,
                         failed.get("reason"), None, current)
