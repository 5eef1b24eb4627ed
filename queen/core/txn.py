"""Transactions: one step that reads and changes KV rows, acks messages, pushes messages and
schedules or cancels timers, all or nothing, so one submit and one frame.

Sections, judged and applied in this order: `kv`, `ack`, `push`, `timers`. Every precondition is
judged against the state before the transaction (the KV keys of one transaction are distinct, each
message is acked once, each timer named once, and the capacity a push or schedule needs counts
what the earlier ones of the same transaction add). If any misses, nothing is written and the first
miss is the answer. Only then is everything applied; nothing applied can fail after its check
passed, so a transaction that began to apply completes.

An ack fences the consumer: one whose lease has expired (a paused process, a partition handed to
another consumer) cannot commit its step, whatever else the step holds.

Pure: the caller passes the state each operation falls on, and now_ms.
"""

from __future__ import annotations

from collections.abc import Sequence

from queen.core.kv import KvOp, KvState, parse_kv_ops
from queen.core.limits import Limits
from queen.core.outcomes import QueueReason, TxnReason
from queen.core.queue_ops import AckItem, PopOp, PushItem, parse_acks, parse_push
from queen.core.queues import Growth
from queen.core.tenants import shown
from queen.core.timer_ops import TimerOp, parse_timer_ops
from queen.errors import BadRequest

TXN_OPS = frozenset(("get", "check", "put", "putIfAbsent", "delete", "incr"))
SECTIONS = ("kv", "ack", "push", "timers")
_READ_ONLY = frozenset(("get", "check"))


class TransactionOps:
    """A parsed transaction: each section's operations (empty when not sent)."""

    __slots__ = ("kv", "ack", "push", "timers", "required_leases", "prefix", "next")

    def __init__(self, kv: list[KvOp], ack: Sequence[AckItem] = (), push: Sequence[PushItem] = (),
                 timers: Sequence[TimerOp] = ()):
        self.kv = kv
        self.ack = list(ack)
        self.push = list(push)
        self.timers = list(timers)
        # Leases that must be live when the transaction is judged (a miss: lease_lost), besides
        # those its acks name.
        self.required_leases: list[int] = []
        self.prefix = ""  # the tenant's name prefix (queen/core/tenants.py): leases of others are lost to it
        # A pop (`next`) made in the same step once the transaction committed, on the state it left;
        # none when it was refused. Answered at position 1 of the step's reply_to.
        self.next: PopOp | None = None

    def writes(self) -> bool:
        return bool(self.ack or self.push or self.timers) or any(op.op not in _READ_ONLY for op in self.kv)

    def sections(self) -> list[str]:
        return [section for section in SECTIONS if getattr(self, section)]


def parse_transaction(document, limits: Limits, now_ms: int) -> TransactionOps:
    if type(document) is not dict:
        raise BadRequest("invalid_body", 'the body must be an object of sections: {"kv": [...], "ack": [...], '
                         '"push": [...], "timers": [...]}')
    for section in document:
        if section not in SECTIONS:
            raise BadRequest("unknown_section", f"unknown section {str(section)[:50]!r}; a transaction has "
                             f"{', '.join(SECTIONS)}", {"section": str(section)[:50]})
    if not document:
        raise BadRequest("invalid_body", "a transaction needs at least one operation in one of its sections: "
                         f"{', '.join(SECTIONS)}")
    kv: list[KvOp] = []
    if "kv" in document:
        try:
            kv = parse_kv_ops(document["kv"], limits)
        except BadRequest as error:
            error.details.setdefault("section", "kv")
            raise
        check_transaction_ops(kv)
    txn = TransactionOps(
        kv,
        parse_acks(document["ack"], limits, "ack") if "ack" in document else (),
        parse_push(document["push"], limits, "push") if "push" in document else (),
        parse_timer_ops(document["timers"], limits, now_ms, "timers") if "timers" in document else ())
    count = len(txn.kv) + len(txn.ack) + len(txn.push) + len(txn.timers)
    if count > limits.ops_per_call_max:
        raise BadRequest("too_many_operations", f"at most {limits.ops_per_call_max} operations in all sections of a "
                         "transaction", {"count": count, "limit": limits.ops_per_call_max})
    return txn


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


def apply_transaction(txn: TransactionOps, kv_states: list[KvState], ack_tables: list, push_tables: list,
                      timer_tables: list, now_ms: int, records: list, lease_checks: Sequence[bool] = ()) -> dict:
    """The answer. kv_states[i] owns txn.kv[i]'s key; the *_tables are the QueueTables that own
    each ack's partition, each push's queue and each timer's queue; lease_checks[i] says whether
    txn.required_leases[i] is live."""
    miss = _first_miss(txn, kv_states, ack_tables, push_tables, timer_tables, lease_checks, now_ms)
    if miss is not None:
        reason = miss.pop("top")
        return {"success": False, "reason": reason, "error": reason, "failed": miss}
    answer: dict = {"success": True}
    if txn.kv:
        results = []
        for index, (op, state) in enumerate(zip(txn.kv, kv_states, strict=True)):
            result = state.apply(op, now_ms, records)
            result["index"] = index
            result["op"] = op.op
            results.append(result)
        answer["kv"] = results
    if txn.ack:
        acked: list = [None] * len(txn.ack)
        by_table: dict[int, tuple] = {}
        for item, table in zip(txn.ack, ack_tables, strict=True):
            by_table.setdefault(id(table), (table, []))[1].append(item)
        for table, items in by_table.values():
            for result in table.ack_together(items, now_ms, records):
                acked[result["index"]] = result
        answer["ack"] = acked
    if txn.push:
        answer["push"] = [table.push_one(item, now_ms, records, exempt=True)
                          for item, table in zip(txn.push, push_tables, strict=True)]
    if txn.timers:
        answer["timers"] = [table.timers.apply_checked(op, now_ms, records)
                            for op, table in zip(txn.timers, timer_tables, strict=True)]
    return answer


def _first_miss(txn: TransactionOps, kv_states, ack_tables, push_tables, timer_tables, lease_checks,
                now_ms: int) -> dict | None:
    """The first precondition that misses, in section order, as the answer's `failed` (with the
    top-level reason under "top"); None when every one holds. Changes nothing."""
    for index, (op, state) in enumerate(zip(txn.kv, kv_states, strict=True)):
        miss = state.precheck(op, now_ms)
        if miss is not None:
            current = miss.get("current") or {"value": miss.get("value"), "version": miss.get("version", 0)}
            return {"top": TxnReason.KV_PRECONDITION, "section": "kv", "index": index, "op": op.op, "ns": shown(op.ns), "key": op.key,
                    "reason": miss["reason"], "current": current}
    for index, (item, table) in enumerate(zip(txn.ack, ack_tables, strict=True)):
        miss = table.check_ack(item, now_ms, in_transaction=True)
        if miss is not None:
            reason, current = miss
            return {"top": reason, "section": "ack", "index": index, "reason": reason,
                    "partitionId": item.partition_id, "leaseId": item.lease_id, "current": current}
    for index, (lease_id, live) in enumerate(zip(txn.required_leases, lease_checks, strict=True)):
        if not live:
            return {"top": QueueReason.LEASE_LOST, "section": "requiredLeases", "index": index, "reason": QueueReason.LEASE_LOST,
                    "leaseId": lease_id}
    growth = Growth()
    for index, (pushed, table) in enumerate(zip(txn.push, push_tables, strict=True)):
        reason = table.check_push(pushed, now_ms, growth)
        if reason is not None:
            return {"top": reason, "section": "push", "index": index, "reason": reason, "queue": shown(pushed.queue),
                    "partition": pushed.partition}
    for index, (timer, table) in enumerate(zip(txn.timers, timer_tables, strict=True)):
        if timer.op == "schedule":
            reason = table.timers.check_schedule(timer, growth)
            if reason is not None:
                return {"top": reason, "section": "timers", "index": index, "reason": reason, "queue": shown(timer.queue),
                        "key": timer.key}
    return None
