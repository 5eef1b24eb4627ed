"""A queue shard driven step by step through State.apply, as the server drives it, for the pure
tests: now_ms is passed in, records are decoded and kept, parked pops answered later are collected,
and answers are seen as a JSON client sees them."""

import orjson

from queen.core import records as rec
from queen.core.limits import Limits
from queen.core.queue_ops import (
    Acks,
    Configure,
    LeaseCall,
    Push,
    QueueAdmin,
    parse_ack_item,
    parse_configure,
    parse_pop,
    parse_push,
)
from queen.core.queues import views
from queen.core.state import Abandon, Ops, State, Tick, Transaction
from queen.core.timer_ops import Timers, parse_timer_ops
from queen.core.txn import parse_transaction
from queen.core.values import json_default

T0 = 1_700_000_000_000


def wire(document):
    """document as a JSON client reads it (a message's payload is kept encoded, as a Fragment); an
    error answer (an exception, or a Refusal) as it is."""
    try:
        return orjson.loads(orjson.dumps(document, default=json_default))
    except TypeError:
        return document


class Queues:
    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.state = State(1, T0, limits=self.limits)
        self.now = T0
        self.records = []
        self.answered = []  # (reply_to, answer) of parked pops answered by later steps

    def step(self, step):
        applied = self.state.apply(step, self.now)
        self.records += rec.decode(applied.records)
        return [(to, position, wire(answer)) for to, position, answer in applied.answers]

    def call(self, op, reply_to=None):
        reply_to = reply_to if reply_to is not None else object()
        own = None
        for to, _, answer in self.step(Ops(0, [(reply_to, 0, op)])):
            if to is reply_to and own is None:
                own = answer
            else:
                self.answered.append((to, answer))
        return own

    def configure(self, queue="orders", **options):
        return self.call(Configure(*parse_configure({"queue": queue, "options": options}, self.limits)))

    def push(self, *items, queue="orders", partition=None):
        raw = []
        for item in items:
            if not isinstance(item, dict) or "payload" not in item:
                item = {"payload": item}
            raw.append({"queue": queue, **({"partition": partition} if partition else {}), **item})
        return self.call(Push(parse_push({"items": raw}, self.limits)))

    def pop(self, queue="orders", partition=None, reply_to=None, **params):
        params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}
        return self.call(parse_pop(queue, partition, params, self.limits), reply_to)

    def ack(self, message, status="completed", **extra):
        raw = {"partitionId": message["partitionId"], "leaseId": message["leaseId"], "offset": message["offset"],
               "status": status, **extra}
        [result] = self.call(Acks([parse_ack_item(raw, 0, self.limits, None)]))
        return result

    def extend(self, lease_id, seconds=None):
        return self.call(LeaseCall("extend", lease_id, seconds))

    def release(self, lease_id):
        return self.call(LeaseCall("release", lease_id))

    def admin(self, kind, queue="orders", **args):
        return self.call(QueueAdmin(kind, queue, **args))

    def timers(self, *ops, queue="orders"):
        """Timer operations, each a dict (queue defaults to "orders"); their results."""
        parsed = parse_timer_ops([{"queue": queue, **op} for op in ops], self.limits, self.now)
        return self.call(Timers(parsed))

    def timer(self, op="get", **fields):
        [result] = self.timers({"op": op, **fields})
        return result

    def txn(self, document):
        """A transaction; its answer and the records it wrote."""
        before = len(self.records)
        reply_to = object()
        answer = None
        for to, _, result in self.step(Transaction(parse_transaction(document, self.limits, self.now), reply_to)):
            if to is reply_to:
                answer = result
            else:
                self.answered.append((to, result))
        return answer, self.records[before:]

    def tick(self, ms=0):
        self.now += ms
        self.answered += [(to, answer) for to, _, answer in self.step(Tick())]

    def abandon(self, reply_to):
        self.answered += [(to, answer) for to, _, answer in self.step(Abandon(0, reply_to))]

    def replayed(self) -> State:
        """A fresh state rebuilt from every record so far."""
        copy = State(1, T0, limits=self.limits)
        for record in self.records:
            copy.replay(record)
        return copy


def info(table, name, now_ms):
    """The admin's view of one queue of a shard's table."""
    return views.queue_info(table.queues, table.timers, name, now_ms)


def partitions(table, name, group, prefix, after, limit, now_ms):
    return views.partitions_page(table.queues, name, group, prefix, after, limit, now_ms)


def dlq(table, name, group, partition, cursor, skip, limit):
    return views.dlq_page(table.queues, name, group, partition, cursor, skip, limit)
