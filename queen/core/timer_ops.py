"""Timer requests from their wire form: `POST /api/v1/timers` operations (schedule, cancel, get)
and the same schedule and cancel inside a transaction. Everything is checked here, before anything
is applied: a request that breaks a rule is refused whole with a 400 and a snake_case code.

A timer is named by (queue, key). `at` is absolute ms since the epoch on the server's clock;
`delayMs` is turned into `at` with the `now_ms` the caller passes (the moment the server read the
request), so the horizon check and the stored time agree. A recurring timer gives `cron` (with
`timezone`) or `everyMs` instead; its first time is computed here, from the same now_ms
(queen/core/recurrence.py).

Pure: no I/O, no clock. Raises BadRequest.
"""

from __future__ import annotations

from queen.core import recurrence
from queen.core.kv import check_fields, fail
from queen.core.limits import Limits
from queen.core.names import name
from queen.core.queue_ops import (
    DEFAULT_PARTITION,
    GENERATED_ID_PREFIX,
    _where,
    encode_payload,
    producer_id,
    queue_name,
)
from queen.errors import BadRequest

TIMER_OPS = ("schedule", "cancel", "get")
IN_TRANSACTION = ("schedule", "cancel")
# The furthest ahead a timer may be set: a timer is state held in memory and in every snapshot, and
# a year is past any reminder a workflow means; further out is a calendar, not a timer.
HORIZON_MS = 365 * 86_400_000
DELAY_MS_MAX = 31_536_000_000

_FIELDS = {
    "schedule": frozenset(("op", "queue", "key", "at", "delayMs", "partition", "payload", "transactionId", "traceId",
                           "cron", "timezone", "everyMs")),
    "cancel": frozenset(("op", "queue", "key")),
    "get": frozenset(("op", "queue", "key")),
}


class TimerOp:
    """One operation. For a schedule: at_ms (its first time, for a recurring one), partition,
    payload (its JSON encoding), transaction_id, trace_id; and for a recurring timer every_ms
    (0: none) or cron and timezone (None: none)."""

    __slots__ = ("index", "op", "queue", "key", "at_ms", "partition", "payload", "transaction_id", "trace_id",
                 "every_ms", "cron", "timezone")

    def __init__(self, index, op, queue, key, at_ms=0, partition=None, payload=b"", transaction_id=None, trace_id=None,
                 every_ms=0, cron=None, timezone=None):
        self.index = index
        self.op = op
        self.queue = queue
        self.key = key
        self.at_ms = at_ms
        self.partition = partition
        self.payload = payload
        self.transaction_id = transaction_id
        self.trace_id = trace_id
        self.every_ms = every_ms
        self.cron = cron
        self.timezone = timezone


class Timers:
    """The timer operations of one call that fall on one shard, answered one result each."""

    __slots__ = ("ops",)

    def __init__(self, ops: list[TimerOp]):
        self.ops = ops


class TimerList:
    """A page of one queue's pending timers, in key order."""

    __slots__ = ("queue", "prefix", "after", "limit")

    def __init__(self, queue: str, prefix: str, after: str | None, limit: int):
        self.queue = queue
        self.prefix = prefix
        self.after = after
        self.limit = limit


def parse_timers(document, limits: Limits, now_ms: int) -> list[TimerOp]:
    if type(document) is not dict:
        raise BadRequest("invalid_body", 'the body must be an object: {"operations": [...]}')
    check_fields(document, frozenset(("operations",)), None, "body")
    return parse_timer_ops(document.get("operations"), limits, now_ms)


def parse_timer_ops(raw_ops, limits: Limits, now_ms: int, section: str | None = None) -> list[TimerOp]:
    """section: "timers" inside a transaction (no get there; errors name the section)."""
    if type(raw_ops) is not list or not raw_ops:
        raise BadRequest("invalid_operations", "operations must be a non-empty list", _where(section))
    if len(raw_ops) > limits.ops_per_call_max:
        raise BadRequest("too_many_operations", f"at most {limits.ops_per_call_max} operations per call",
                         {"count": len(raw_ops), "limit": limits.ops_per_call_max, **_where(section)})
    ops, seen = [], set()
    for index, raw in enumerate(raw_ops):
        try:
            op = parse_timer_op(raw, index, limits, now_ms, section is not None)
            if (op.queue, op.key) in seen:
                fail("duplicate_timer", "each (queue, key) at most once per call", index, queue=op.queue, key=op.key)
        except BadRequest as error:
            error.details.update(_where(section))
            raise
        seen.add((op.queue, op.key))
        ops.append(op)
    return ops


def parse_timer_op(raw, index: int, limits: Limits, now_ms: int, in_transaction: bool = False) -> TimerOp:
    if type(raw) is not dict:
        fail("invalid_operations", "each operation must be an object", index)
    return _parse_timer_op(raw, index, limits, now_ms, in_transaction)


def _parse_timer_op(raw: dict, index: int, limits: Limits, now_ms: int, in_transaction: bool) -> TimerOp:
    kind = raw.get("op")
    allowed = IN_TRANSACTION if in_transaction else TIMER_OPS
    if kind not in allowed:
        if in_transaction and kind == "get":
            fail("not_in_transaction", "a timer get cannot be part of a transaction", index)
        fail("unknown_op", f"op must be one of {', '.join(allowed)}", index, op=str(kind)[:50])
    check_fields(raw, _FIELDS[kind], index)
    queue = queue_name(raw.get("queue"), limits, index)
    key = name(raw.get("key"), "key", "invalid_key", limits.timer_key_bytes_max, index)
    if kind != "schedule":
        return TimerOp(index, kind, queue, key)
    at_ms, every_ms, cron, timezone = _when(raw, index, now_ms)
    partition = raw.get("partition")
    partition = DEFAULT_PARTITION if partition is None else name(
        partition, "partition", "invalid_partition", limits.partition_name_bytes_max, index)
    if "payload" not in raw:
        fail("payload_required", "a schedule needs a payload (null is a payload)", index)
    payload = encode_payload(raw["payload"], limits, index)
    transaction_id = producer_id(raw.get("transactionId"), limits, index)
    trace = raw.get("traceId")
    if trace is not None and (type(trace) is not str or len(trace.encode()) > limits.trace_id_bytes_max):
        fail("invalid_trace_id", f"traceId must be a string of at most {limits.trace_id_bytes_max} bytes", index)
    if every_ms or cron is not None:
        _check_period_stem(key, transaction_id, limits, index)
    return TimerOp(index, kind, queue, key, at_ms, partition, payload, transaction_id, trace, every_ms, cron, timezone)


def _when(raw: dict, index: int, now_ms: int) -> tuple[int, int, str | None, str | None]:
    """(at_ms, every_ms, cron, timezone) of a schedule: its (first) time and its recurrence."""
    cron, every_ms, timezone = raw.get("cron"), raw.get("everyMs"), raw.get("timezone")
    if cron is not None and every_ms is not None:
        fail("schedule_conflict", "give cron or everyMs, not both", index)
    if timezone is not None and cron is None:
        fail("timezone_without_cron", "timezone is the zone a cron expression is read in: give it with cron", index)
    if cron is None and every_ms is None:
        return _at(raw, index, now_ms), 0, None, None
    if every_ms is not None:
        if type(every_ms) is not int or not recurrence.EVERY_MS_MIN <= every_ms <= recurrence.EVERY_MS_MAX:
            fail("invalid_every", f"everyMs must be an integer from {recurrence.EVERY_MS_MIN} to "
                                  f"{recurrence.EVERY_MS_MAX} (365 days)", index)
        has_first = raw.get("at") is not None or raw.get("delayMs") is not None
        # The first period: at or delayMs when given, else one period from now.
        return _at(raw, index, now_ms) if has_first else now_ms + every_ms, every_ms, None, None
    if raw.get("at") is not None or raw.get("delayMs") is not None:
        fail("schedule_conflict", "a cron schedule names its own times: give no at or delayMs with cron", index)
    timezone = "UTC" if timezone is None else timezone
    if type(timezone) is not str or not timezone or len(timezone.encode()) > recurrence.TIMEZONE_BYTES_MAX:
        fail("invalid_timezone", f"timezone must be an IANA time zone name (Europe/Berlin) of at most "
                                 f"{recurrence.TIMEZONE_BYTES_MAX} bytes", index)
    if recurrence.zone(timezone) is None:
        fail("unknown_timezone", f"no time zone {timezone!r} in the time zone database: give an IANA name such as "
                                 "Europe/Berlin or UTC", index, timezone=timezone)
    if type(cron) is not str or len(cron.encode()) > recurrence.CRON_BYTES_MAX:
        fail("invalid_cron", f"cron must be a string of at most {recurrence.CRON_BYTES_MAX} bytes", index)
    problem = recurrence.cron_problem(cron)
    if problem is not None:
        fail("invalid_cron", f"cron {cron!r}: {problem}", index, cron=cron)
    at_ms = recurrence.next_cron_ms(cron, timezone, now_ms)
    if at_ms is None:
        fail("invalid_cron", f"cron {cron!r} names no time in the next 50 years", index, cron=cron)
    return at_ms, 0, cron, timezone


def _check_period_stem(key: str, transaction_id: str | None, limits: Limits, index: int) -> None:
    """A recurring timer's messages take the transactionId <transactionId or key>@<period ms>: it
    must be one a producer could send (not too long, not the server's own prefix)."""
    stem = key if transaction_id is None else transaction_id
    room = limits.transaction_id_bytes_max - recurrence.PERIOD_SUFFIX_BYTES
    if len(stem.encode()) > room:
        fail("period_id_too_long", f"a recurring timer's messages take the transactionId <transactionId or key>@<period "
                                   f"ms>: give a transactionId (or key) of at most {room} bytes", index)
    if stem.startswith(GENERATED_ID_PREFIX):
        fail("reserved_transaction_id", f"a recurring timer's messages take the transactionId <key>@<period ms>, "
                                        f"and those starting {GENERATED_ID_PREFIX!r} are the server's: give a "
                                        "transactionId", index)


def _at(raw: dict, index: int, now_ms: int) -> int:
    has_at, has_delay = raw.get("at") is not None, raw.get("delayMs") is not None
    if has_at == has_delay:
        if has_at:
            fail("at_conflict", "give at or delayMs, not both", index)
        fail("at_required", "a schedule needs at (ms since the epoch) or delayMs", index)
    if has_delay:
        delay = raw["delayMs"]
        if type(delay) is not int or not 0 <= delay <= DELAY_MS_MAX:
            fail("invalid_delay", f"delayMs must be an integer from 0 to {DELAY_MS_MAX}", index)
        at_ms = now_ms + delay
    else:
        at_ms = raw["at"]
        if type(at_ms) is not int or at_ms < 0:
            fail("invalid_at", "at must be a non-negative integer: ms since the epoch", index)
    if at_ms > now_ms + HORIZON_MS:
        fail("at_too_far", "a timer may be set at most 365 days ahead", index, at=at_ms, latest=now_ms + HORIZON_MS)
    return at_ms
