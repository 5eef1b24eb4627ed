"""Timers in the SDK: `client.timers`, messages scheduled into a queue partition for later.

    async with queen.Client() as client:
        await client.timers.schedule("orders", "order-42:payment-timeout", {"orderId": 42},
                                     delay="15m", partition="customer-42")
        await client.timers.cancel("orders", "order-42:payment-timeout")   # paid in time

A timer is named by (queue, key): scheduling the same key again moves it. When it is due, the
server appends its payload to the queue partition as a message, exactly once, never before its
time; consumers pop it like any other message. `cancel` answers False when the timer is not
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

from queen.client.durations import seconds as seconds_of
from queen.client.kv import given


@dataclass(frozen=True, slots=True)
class TimerResult:
    """A schedule's answer: `scheduled`, its `at_ms` and `version` (a reschedule takes a new one)
    and whether it `replaced` a pending schedule of the key; or `reason` ("storage_full")."""

    scheduled: bool
    at_ms: int | None = None
    version: int | None = None
    replaced: bool = False
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.scheduled

    @classmethod
    def from_wire(cls, wire: dict) -> TimerResult:
        return cls(wire["scheduled"], wire.get("at"), wire.get("version"), wire.get("replaced", False), wire.get("reason"))


@dataclass(frozen=True, slots=True)
class Timer:
    """A pending timer. `payload` is None in listings (ask `get` for it)."""

    queue: str
    key: str
    at_ms: int
    partition: str
    version: int
    scheduled_at_ms: int
    transaction_id: str | None
    payload: object = None


def schedule_op(queue: str, key: str, payload, *, at=None, delay=None, partition: str | None = None,
                transaction_id: str | None = None, trace_id: str | None = None) -> dict:
    """The wire form of a schedule. at: a datetime or ms since the epoch; delay: "15m", a
    timedelta or seconds. Exactly one of them."""
    if (at is None) == (delay is None):
        raise TypeError("a timer needs at= (a datetime or ms since the epoch) or delay= (\"15m\", seconds), not both")
    op = {"op": "schedule", "queue": queue, "key": key, "payload": payload}
    if at is not None:
        op["at"] = int(at.timestamp() * 1000) if isinstance(at, datetime) else int(at)
    else:
        op["delayMs"] = int(round(seconds_of(delay, "delay") * 1000))
    return given(op, partition=partition, transactionId=transaction_id, traceId=trace_id)


class Timers:
    """`client.timers`."""

    def __init__(self, transport):
        self._transport = transport

    async def _one(self, op: dict, safe: bool) -> dict:
        answer = await self._transport.call("POST", "/api/v1/timers", {"operations": [op]}, safe=safe)
        return answer["results"][0]

    async def schedule(self, queue: str, key: str, payload, *, at=None, delay=None, partition: str | None = None,
                       transaction_id: str | None = None, trace_id: str | None = None) -> TimerResult:
        """Schedule (or move) the timer (queue, key): at `at` or after `delay`, `payload` goes to
        `partition` ("Default" when not given) of `queue`."""
        op = schedule_op(queue, key, payload, at=at, delay=delay, partition=partition, transaction_id=transaction_id,
                         trace_id=trace_id)
        return TimerResult.from_wire(await self._one(op, safe=False))

    async def cancel(self, queue: str, key: str) -> bool:
        """True when a pending timer was removed; False when none was pending (it may have fired)."""
        return (await self._one({"op": "cancel", "queue": queue, "key": key}, safe=False))["cancelled"]

    async def get(self, queue: str, key: str) -> Timer | None:
        wire = await self._one({"op": "get", "queue": queue, "key": key}, safe=True)
        if not wire["found"]:
            return None
        return Timer(queue, key, wire["at"], wire["partition"], wire["version"], wire["scheduledAt"],
                     wire.get("transactionId"), wire.get("payload"))

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
                yield Timer(item["queue"], item["key"], item["at"], item["partition"], item["version"],
                            item["scheduledAt"], item.get("transactionId"))
            cursor = page.get("cursor")
            if cursor is None:
                return
