"""Transactions: one step, all or nothing, in one log entry.

    await (client.transaction()
           .guard(lock)                                   # only while the lock is ours
           .ack(message)                                  # only while its lease is live
           .kv.put("orders", "42", {"state": "paid"}, forever=True)
           .queue("invoices").push([{"orderId": 42}], partition="customer-42")
           .cancel_timer("orders", "order-42:payment-timeout")
           .timer("orders", "order-42:review", {"orderId": 42}, delay="1d", partition="customer-42")
           .commit())

Sections on `POST /api/v1/transaction`: `kv` (the locks' guards first, then your operations),
`ack`, `push`, `timers`. Every precondition is judged before anything is applied: a guard whose
lock was taken over, an ack whose lease expired (the consumer was paused and its partition went to
another), a push beyond capacity. The first miss is the answer (`success` False, `reason`,
`failed_section`, `failed_index`), and nothing of the step exists. A lost lock is told
(on_lost("guard")) before commit() returns. A guard that missed only because the handle's own
renewal landed with its answer lost (the permit's row, `{"owner": ...}`, still names the handle's
owner) is no loss: the handle takes the row's token and the step is sent again.

A step is sent again through a failover (see queen_client/_http.py) when every part of it is safe
to repeat: reads, conditional KV writes (`expect`, putIfAbsent), acks and pushes (each with its
transactionId); not with timers or then_pop(). A step sent again after an attempt whose outcome
is unknown that then misses raises OutcomeUnknown: the miss may be its first attempt's doing.

A message acked in a transaction is settled by it whatever the outcome, so a consumer does not ack
it again: committed, it is done; not committed, it is left for redelivery when its lease ends (or
call message.fail() to have it back at once). Indexes count your operations per section, guards
not counted.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from queen_client.errors import LockLost
from queen_client.kv import CheckResult, Current, Item, WriteResult, conditional, write_op
from queen_client.lease import LostReason
from queen_client.options import GROUP, TTL, WAIT, wire_names
from queen_client.queues import AckResult, Delivery, Message, Push, PushResult, next_wire
from queen_client.timers import SCHEDULE, TimerResult, schedule_op

READ_OPS = frozenset(("get", "check"))
# A guard that lost to its own handle's renewal is sent again with the row's token; each attempt
# holds the handle's renewals off (_TokenGate), so one retry is what it takes: the bound is for safety.
OWN_RENEWAL_RETRIES = 3


def _failed(answer: dict) -> bool:
    return not answer.get("success")


@dataclass(frozen=True, slots=True)
class TxnResult:
    """`success`; when it failed, `reason` ("kv_precondition", "lease_lost", "not_delivered",
    "queue_full", "partition_limit", "storage_full"), `failed_section` and either `failed_lock`
    (the lock whose guard missed) or `failed_index` (which of your operations of that section
    missed, with its `failed_reason` and, for KV and acks, `current`). On success, one result per
    operation: `results` (KV), `acks`, `pushes`, `timers` (TimerResult for a schedule, a bool for a
    cancel: whether a pending timer was removed)."""

    success: bool
    reason: str | None = None
    failed_index: int | None = None
    failed_reason: str | None = None
    failed_lock: str | None = None
    current: object = None
    results: list = field(default_factory=list)
    failed_section: str | None = None
    acks: list = field(default_factory=list)
    pushes: list = field(default_factory=list)
    timers: list = field(default_factory=list)
    # With then_pop(): what the pop made in the same step got (a Delivery, maybe empty); None when
    # the transaction was refused (no pop was made) or asked for none.
    next: Delivery | None = None

    def __bool__(self) -> bool:
        return self.success


class TxnKv:
    """`transaction.kv`: each call adds one operation and returns the transaction, for chaining."""

    def __init__(self, txn: Transaction):
        self._txn = txn

    def get(self, ns: str, key: str) -> Transaction:
        return self._txn._add({"op": "get", "ns": ns, "key": key})

    def check(self, ns: str, key: str, expect: int, *, required: bool = True) -> Transaction:
        return self._txn._add({"op": "check", "ns": ns, "key": key, "expect": expect, "required": required})

    @wire_names(**TTL)
    def put(self, ns: str, key: str, value, *, ttl=None, forever: bool = False, expect: int | None = None) -> Transaction:
        return self._txn._add(write_op("put", ns, key, value=value, has_value=True, ttl=ttl, forever=forever, expect=expect))

    @wire_names(**TTL)
    def put_if_absent(self, ns: str, key: str, value, *, ttl=None, forever: bool = False) -> Transaction:
        return self._txn._add(write_op("putIfAbsent", ns, key, value=value, has_value=True, ttl=ttl, forever=forever))

    def delete(self, ns: str, key: str, *, expect: int | None = None) -> Transaction:
        return self._txn._add(write_op("delete", ns, key, expect=expect))

    @wire_names(**TTL)
    def incr(self, ns: str, key: str, by: int = 1, *, max: int | None = None, min: int | None = None,
             ttl=None, forever: bool = False, expect: int | None = None) -> Transaction:
        return self._txn._add(write_op("incr", ns, key, ttl=ttl, forever=forever, expect=expect, by=by, max=max, min=min))


class TxnQueue:
    """`transaction.queue(name)`: pushes into one queue, returning the transaction."""

    def __init__(self, txn, name: str):
        self._txn = txn
        self.name = name

    def push_many(self, items: Iterable, *, partition: str | None = None):
        """Append each item (a payload, or a `queen_client.Push`) as a message when the transaction
        commits, as `Queue.push_many` does. Each gets a transactionId (generated when not given): a
        duplicate answers "duplicate" and is not a failure."""
        return self.push(items, partition=partition)

    def push(self, items: Iterable, *, partition: str | None = None):
        """push_many under the Queen MQ client's name for it: a LIST of items, each one message
        (`.push([payload])` for one). Not `Queue.push(payload)`, which takes one payload (and
        refuses a list rather than guess)."""
        if isinstance(items, (str, bytes, bytearray, memoryview, dict)) or not isinstance(items, Iterable):
            raise TypeError("a transaction's push takes a list of items (payloads or queen_client.Push), each one "
                            "message: .push([payload]), or .push_many([a, b])")
        for item in items:
            if not isinstance(item, Push):
                item = Push(item, partition)
            entry = {"queue": self.name, "payload": item.payload, "transactionId": item.transaction_id or uuid.uuid4().hex}
            if item.partition or partition:
                entry["partition"] = item.partition or partition
            if item.trace_id is not None:
                entry["traceId"] = item.trace_id
            self._txn._sections["push"].append(entry)
        return self._txn


class Transaction:
    def __init__(self, transport, client=None):
        self._transport = transport
        self._client = client  # for then_pop(): its messages' queue handles
        self._next: dict | None = None
        self._sections: dict[str, list] = {"kv": [], "ack": [], "push": [], "timers": []}
        self._ops = self._sections["kv"]
        self._locks: list = []
        self._messages: list[Message] = []
        self.kv = TxnKv(self)

    def _add(self, op: dict) -> Transaction:
        self._ops.append(op)
        return self

    def guard(self, lock) -> Transaction:
        """Commit only while `lock` is still ours (its guard is checked in the same log entry)."""
        self._locks.append(lock)
        return self

    def ack(self, message: Message, status: str = "completed", *, error: str | None = None) -> Transaction:
        """Settle a delivered message in this step: committed only while the lease that delivered
        it is live, so a consumer that lost its partition cannot commit."""
        if message.lease_id is None:
            raise ValueError("this message came without a lease (auto_ack): there is nothing to ack")
        self._sections["ack"].append(message.ack_wire(status, error))
        self._messages.append(message)
        return self

    def queue(self, name: str) -> TxnQueue:
        return TxnQueue(self, name)

    @wire_names(**GROUP, **WAIT)
    def then_pop(self, queue: str, *, group: str | None = None, batch: int = 1, partitions: int = 1,
                 wait=None) -> Transaction:
        """Once committed, pop `queue` in the same step (one log entry, one fsync for the step and
        the next lease): the result's `next`. `wait` parks the answer until something comes (the
        step is durable first); a refused transaction pops nothing."""
        self._next = next_wire(queue, group=group, batch=batch, partitions=partitions, wait=wait)
        return self

    @wire_names(**SCHEDULE)
    def timer(self, queue: str, key: str, payload=None, *, at=None, delay=None, cron: str | None = None,
              timezone: str | None = None, every=None, partition: str | None = None,
              transaction_id: str | None = None, trace_id: str | None = None) -> Transaction:
        """Schedule (or move) the timer (queue, key) in this step: it exists exactly when the step
        committed. A recurring one with cron (and timezone) or every, as in `client.timers.schedule`."""
        self._sections["timers"].append(schedule_op(queue, key, payload, at=at, delay=delay, cron=cron,
                                                    timezone=timezone, every=every, partition=partition,
                                                    transaction_id=transaction_id, trace_id=trace_id))
        return self

    def cancel_timer(self, queue: str, key: str) -> Transaction:
        """Cancel the timer (queue, key) in this step; one not pending is not a failure."""
        self._sections["timers"].append({"op": "cancel", "queue": queue, "key": key})
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
            document = {name: ops for name, ops in self._sections.items() if ops}
            if guards:
                document["kv"] = guards + self._ops
            if not document:
                raise ValueError("an empty transaction: add a guard, an ack, a push, a KV operation or a timer")
            # Safe to send again when every part of it is: reads, conditional writes, acks, pushes
            # (each carries a transactionId). Not timers (a schedule sent again could bring back one
            # that fired), nor `next` (a pop sent again would take a second lease).
            safe = not self._sections["timers"] and all(op["op"] in READ_OPS or conditional(op) for op in self._ops)
            writes = bool(self._sections["ack"] or self._sections["push"] or
                          any(op["op"] not in READ_OPS for op in self._ops))
            timeout_s = None
            if self._next is not None:
                document["next"] = self._next
                safe = False
                timeout_s = self._transport.timeout_s + self._next.get("waitMs", 0) / 1000
            for _ in range(OWN_RENEWAL_RETRIES + 1):
                try:
                    # Sent again after an attempt whose outcome is unknown, a step that applied makes its
                    # own repeat miss (an expect, an ack whose lease it ended): not a miss to report.
                    answer = await self._transport.call("POST", "/api/v1/transaction", document, safe=safe,
                                                        timeout_s=timeout_s,
                                                        missed_if_echo=_failed if writes else None)
                finally:
                    for message in self._messages:
                        message.settled = True
                index = self._lost_to_own_renewal(answer, len(guards))
                if index is None:
                    break
                # Nothing of the step was applied: sent again with the token the row holds, it is the
                # same step.
                guards[index] = self._locks[index].guard
                document["kv"] = guards + self._ops
            result = self._result(answer, len(guards))
            if answer.get("next") is not None:
                queue = self._client.queue(self._next["queue"]) if self._client is not None else None
                delivery = queue._delivery(answer["next"]) if queue is not None else None
                result = dataclasses.replace(result, next=delivery)
            return result

    def _lost_to_own_renewal(self, answer: dict, guard_count: int) -> int | None:
        """The index of the guard that missed only because a renewal of its own handle moved the
        token (it landed, its answer was lost): the permit's row, `{"owner": ...}`, still names the
        handle's owner, at a later token the handle now takes. None for any other answer."""
        failed = answer.get("failed") or {}
        index = failed.get("index")
        if (answer.get("success") or failed.get("section") != "kv" or failed.get("reason") != "version"
                or type(index) is not int or not 0 <= index < guard_count):
            return None
        current = failed.get("current") or {}
        value = current.get("value")
        lock = self._locks[index]
        if type(value) is not dict or value.get("owner") != lock.owner:
            return None
        return index if lock._renewed_unseen(current.get("version", 0)) else None

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
            timers = [TimerResult.from_wire(w) if w["op"] == "schedule" else w["cancelled"]
                      for w in answer.get("timers", [])]
            return TxnResult(True, results=results, acks=[AckResult.from_wire(w) for w in answer.get("ack", [])],
                             pushes=[PushResult.from_wire(w) for w in answer.get("push", [])], timers=timers)
        failed = answer.get("failed") or {}
        section = failed.get("section")
        index = failed.get("index")
        current = failed.get("current")
        if section == "kv":
            current = Current(current.get("value"), current.get("version", 0)) if current else None
            if index is not None and index < guard_count:
                lock = self._locks[index]
                lock._lose(LostReason.GUARD)
                return TxnResult(False, answer.get("reason"), None, failed.get("reason"), lock.name, current,
                                 failed_section="kv")
            index = None if index is None else index - guard_count
        return TxnResult(False, answer.get("reason"), index, failed.get("reason"), None, current, failed_section=section)
