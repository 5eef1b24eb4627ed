"""Timers in the SDK: `client.timers`, messages scheduled into a queue partition for later.

    async with queen_client.Client() as client:
        await client.timers.schedule("orders", "order-42:payment-timeout", {"orderId": 42},
                                     delay="15m", partition="customer-42")
        await client.timers.cancel("orders", "order-42:payment-timeout")   # paid in time

A timer is named by (queue, key): scheduling the same key again moves it. When it is due, the
server appends its payload to the queue partition as a message, exactly once, never before its
time; consumers pop it like any other message.

A recurring timer fires once per period and stays pending, due at its next one:

        await client.timers.schedule("reports", "daily", {"report": "sales"}, cron="0 9 * * *",
                                     timezone="Europe/Berlin")
        await client.timers.schedule("health", "beat", None, every="30s")

Each period's message has the transactionId "<transaction_id or key>@<period ms>", so a consumer
can tell the periods apart, and the partition dedupes a second fire of the same period. `cancel` answers False when the timer is not
pending (never scheduled, cancelled, or already fired): a compensating handler should check the
entity's state rather than trust that the timer did not fire.

Schedules and cancels are not repeated after a lost answer (a repeat could move a timer that
already fired into a second fire); reads are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from queen_client.durations import seconds as seconds_of
from queen_client.kv import given
from queen_client.options import IDS, ms, wire_names

# A schedule's options as the wire spells them.
SCHEDULE = {**IDS, "delayMs": ("delay", ms), "everyMs": ("every", ms)}


@dataclass(frozen=True, slots=True)
class TimerResult:
    """A schedule's answer: `scheduled`, its (first) `at_ms` and `version` (a reschedule takes a
    new one) and whether it `replaced` a pending schedule of the key; or `reason`
    ("storage_full"). A recurring timer's answer has its `cron` and `timezone`, or `every_ms`."""

    scheduled: bool
    at_ms: int | None = None
    version: int | None = None
    replaced: bool = False
    reason: str | None = None
    cron: str | None = None
    timezone: str | None = None
    every_ms: int | None = None

    def __bool__(self) -> bool:
        return self.scheduled

    @classmethod
    def from_wire(cls, wire: dict) -> TimerResult:
        return cls(wire["scheduled"], wire.get("at"), wire.get("version"), wire.get("replaced", False), wire.get("reason"),
                   wire.get("cron"), wire.get("timezone"), wire.get("everyMs"))


@dataclass(frozen=True, slots=True)
class Timer:
    """A pending timer; a recurring one is due at its next period (`at_ms`) and has its `cron` and
    `timezone`, or `every_ms`. `payload` is None in listings (ask `get` for it)."""

    queue: str
    key: str
    at_ms: int
    partition: str
    version: int
    scheduled_at_ms: int
    transaction_id: str | None
    payload: object = None
    cron: str | None = None
    timezone: str | None = None
    every_ms: int | None = None

    @classmethod
    def from_wire(cls, queue: str, key: str, wire: dict) -> Timer:
        return cls(queue, key, wire["at"], wire["partition"], wire["version"], wire["scheduledAt"],
                   wire.get("transactionId"), wire.get("payload"), wire.get("cron"), wire.get("timezone"),
                   wire.get("everyMs"))


def schedule_op(queue: str, key: str, payload, *, at=None, delay=None, cron: str | None = None,
                timezone: str | None = None, every=None, partition: str | None = None,
                transaction_id: str | None = None, trace_id: str | None = None) -> dict:
    """The wire form of a schedule. at: a datetime or ms since the epoch; delay: "15m", a
    timedelta or seconds: exactly one of them for a one-shot timer. A recurring one gives cron
    (5 fields, read in timezone, an IANA name, "UTC" when not given) or every (a duration: the
    period), with at or delay for its first time if wanted (every only)."""
    if cron is not None and every is not None:
        raise TypeError("a recurring timer takes cron= or every=, not both")
    if timezone is not None and cron is None:
        raise TypeError("timezone= is the zone cron= is read in: give it with cron=")
    if cron is not None and (at is not None or delay is not None):
        raise TypeError("a cron schedule names its own times: give no at= or delay= with cron=")
    if at is not None and delay is not None or cron is None and every is None and at is None and delay is None:
        raise TypeError("a timer needs at= (a datetime or ms since the epoch) or delay= (\"15m\", seconds), not both, "
                        "or a schedule: cron= or every=")
    op = {"op": "schedule", "queue": queue, "key": key, "payload": payload}
    if at is not None:
        op["at"] = int(at.timestamp() * 1000) if isinstance(at, datetime) else int(at)
    elif delay is not None:
        op["delayMs"] = int(round(seconds_of(delay, "delay") * 1000))
    if every is not None:
        op["everyMs"] = int(round(seconds_of(every, "every") * 1000))
    return given(op, cron=cron, timezone=timezone, partition=partition, transactionId=transaction_id,
                 traceId=trace_id)


class Timers:
    """`client.timers`."""

    def __init__(self, transport):
        self._transport = transport

    async def _one(self, op: dict, safe: bool) -> dict:
        answer = await self._transport.call("POST", "/api/v1/timers", {"operations": [op]}, safe=safe)
        return answer["results"][0]

    @wire_names(**SCHEDULE)
    async def schedule(self, queue: str, key: str, payload, *, at=None, delay=None, cron: str | None = None,
                       timezone: str | None = None, every=None, partition: str | None = None,
                       transaction_id: str | None = None, trace_id: str | None = None) -> TimerResult:
        """Schedule (or move) the timer (queue, key): at `at` or after `delay`, `payload` goes to
        `partition` ("Default" when not given) of `queue`. Or a recurring timer, fired once per
        period: `cron` ("0 9 * * 1-5", read in `timezone`, default "UTC"), or `every` ("5m", a
        timedelta or seconds; the first period is `at`/`delay` if given, else one period from now)."""
        op = schedule_op(queue, key, payload, at=at, delay=delay, cron=cron, timezone=timezone, every=every,
                         partition=partition, transaction_id=transaction_id, trace_id=trace_id)
        return TimerResult.from_wire(await self._one(op, safe=False))

    async def cancel(self, queue: str, key: str) -> bool:
        """True when a pending timer was removed; False when none was pending (it may have fired)."""
        return (await self._one({"op": "cancel", "queue": queue, "key": key}, safe=False))["cancelled"]

    async def get(self, queue: str, key: str) -> Timer | None:
        wire = await self._one({"op": "get", "queue": queue, "key": key}, safe=True)
        if not wire["found"]:
            return None
        return Timer.from_wire(queue, key, wire)

    async def list(self, queue: str, *, prefix: str = "", limit: int = 100) -> AsyncIterator[Timer]:
        """Every pending timer of `queue` whose key starts with `prefix`, in key order (without
        payloads), fetched `limit` at a time."""
        cursor = None
        while True:
            params = {"queue": queue, "prefix": prefix, "limit": limit}
            if cursor is not None:
                params["cursor"] = cursor
            page = await self._transport.call("GET", f"/api/v1/timers?{urlencode(params)}", safe=True)
            for item in page["items"]:
                yield Timer.from_wire(item["queue"], item["key"], item)
            cursor = page.get("cursor")
            if cursor is None:
                return
