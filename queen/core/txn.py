"""Transactions: several KV operations, possibly on several shards, applied all or nothing as one
step, so one submit and one frame.

Every precondition (expect, check, putIfAbsent, incr bounds) is evaluated against the state before
the transaction; the keys of one transaction are distinct, so that is also the state each write
sees. If any misses, nothing is written. Pure: the caller passes each op's KV state and now_ms.
"""

from __future__ import annotations

from queen.core.kv import KvOp, KvState
from queen.errors import BadRequest

TXN_OPS = frozenset(("get", "check", "put", "putIfAbsent", "delete", "incr"))
SECTIONS = ("kv",)
LATER_SECTIONS = ("push", "ack", "timers")


def check_transaction_ops(ops: list[KvOp]) -> None:
    seen = set()
    for index, op in enumerate(ops):
        if op.op not in TXN_OPS:
            raise BadRequest("not_in_transaction", f"{op.op} cannot be part of a transaction",
                             {"section": "kv", "index": index})
        if (op.ns, op.key) in seen:
            raise BadRequest("duplicate_key", "each operation of a transaction must name a different key",
                             {"section": "kv", "index": index, "ns": op.ns, "key": op.key})
        seen.add((op.ns, op.key))


def apply_transaction(ops: list[KvOp], states: list[KvState], now_ms: int, records: list) -> dict:
    """The answer; states[i] owns ops[i]'s key."""
    for index, (op, state) in enumerate(zip(ops, states, strict=True)):
        miss = state.precheck(op, now_ms)
        if miss is not None:
            current = miss.get("current") or {"version": miss.get("version", 0)}
            failed = {"section": "kv", "index": index, "op": op.op, "ns": op.ns, "key": op.key,
                      "reason": miss["reason"], "current": current}
            return {"success": False, "reason": "kv_precondition", "failed": failed}
    results = []
    for index, (op, state) in enumerate(zip(ops, states, strict=True)):
        result = state.apply(op, now_ms, records)
        result["index"] = index
        result["op"] = op.op
        results.append(result)
    return {"success": True, "kv": results}
