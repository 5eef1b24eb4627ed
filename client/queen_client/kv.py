"""The KV half of the SDK: typed results, and the calls of `client.kv`.

Results are small frozen objects with snake_case fields; the camelCase of the wire stops here.
Reads are safe to repeat, so they are retried on transport errors and 503 and ride a failover.
So are conditional writes (a put, delete or incr with `expect`, a putIfAbsent): sent again after
an attempt whose outcome is unknown, one that applies proves the first did not (its `expect`
would have missed); one that misses may be the first attempt's own doing, so it raises
OutcomeUnknown rather than report a miss. Other writes are not repeated (a repeated put takes a
new version, a repeated incr counts twice): OutcomeUnknown reaches the caller, who knows whether
repeating is right.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from queen_client.durations import lifetime_fields
from queen_client.options import TTL, wire_names

PAGE_ITEMS_MAX = 1000  # the server's limit on one getPrefix page


def _when(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True, slots=True)
class Item:
    """One key as read: `found`, its `value`, `version` (0 when absent) and `expires_at_ms` (None
    for forever, or when absent)."""

    key: str
    found: bool
    value: object = None
    version: int = 0
    expires_at_ms: int | None = None

    @property
    def expires_at(self) -> datetime | None:
        return _when(self.expires_at_ms)

    @classmethod
    def from_wire(cls, key: str, wire: dict) -> Item:
        return cls(key, wire.get("found", True), wire.get("value"), wire.get("version", 0), wire.get("expiresAt"))


@dataclass(frozen=True, slots=True)
class Current:
    """What the key held when a conditional write missed."""

    value: object
    version: int


@dataclass(frozen=True, slots=True)
class WriteResult:
    """`applied`, the key's new `version` when it did; otherwise `reason` ("version", "exists",
    "absent", "limit", "not_integer") and, where the server gives it, `current`. For incr, `value`
    is the counter after the call (or as it stands, past a bound)."""

    applied: bool
    version: int = 0
    reason: str | None = None
    current: Current | None = None
    value: object = None

    def __bool__(self) -> bool:
        return self.applied

    @classmethod
    def from_wire(cls, wire: dict) -> WriteResult:
        current = wire.get("current")
        return cls(wire["applied"], wire.get("version", 0), wire.get("reason"),
                   Current(current.get("value"), current.get("version", 0)) if current else None,
                   wire.get("value"))


@dataclass(frozen=True, slots=True)
class CheckResult:
    """`applied`: the key's version equals the expected one; `version`: what it is."""

    applied: bool
    version: int

    def __bool__(self) -> bool:
        return self.applied


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Item]
    cursor: str | None


def write_op(op: str, ns: str, key: str, *, value=None, has_value=False, ttl=None, forever=False,
             expect: int | None = None, by: int | None = None, max: int | None = None,
             min: int | None = None) -> dict:
    """The wire form of one write, shared by `client.kv` and transactions."""
    wire = {"op": op, "ns": ns, "key": key}
    if has_value:
        wire["value"] = value
    if op != "delete":
        wire.update(lifetime_fields(ttl, forever))
    return given(wire, expect=expect, by=by, max=max, min=min)


def given(wire: dict, **fields) -> dict:
    """wire with each of fields that is not None: the optional fields of a request."""
    for name, value in fields.items():
        if value is not None:
            wire[name] = value
    return wire


def conditional(op: dict) -> bool:
    """A KV write that applies only if the key is as expected: sent again, it cannot apply twice."""
    return op["op"] == "putIfAbsent" or "expect" in op


def _first_missed(answer: dict) -> bool:
    return not answer["results"][0]["applied"]


class Kv:
    """`client.kv`: every KV operation as one call."""

    def __init__(self, transport):
        self._transport = transport

    async def _one(self, op: dict, safe: bool) -> dict:
        answer = await self._transport.call("POST", "/api/v1/kv", {"operations": [op]}, safe=safe)
        return answer["results"][0]

    async def _write(self, op: dict) -> WriteResult:
        """A write; a conditional one is safe to repeat, and a miss of a repeat is not taken for one."""
        repeatable = conditional(op)
        answer = await self._transport.call("POST", "/api/v1/kv", {"operations": [op]}, safe=repeatable,
                                            missed_if_echo=_first_missed if repeatable else None)
        return WriteResult.from_wire(answer["results"][0])

    async def get(self, ns: str, key: str) -> Item:
        return Item.from_wire(key, await self._one({"op": "get", "ns": ns, "key": key}, safe=True))

    async def get_many(self, ns: str, keys: list[str]) -> list[Item]:
        result = await self._one({"op": "getMany", "ns": ns, "keys": list(keys)}, safe=True)
        return [Item.from_wire(item["key"], item) for item in result["items"]]

    async def get_prefix_page(self, ns: str, prefix: str = "", cursor: str | None = None,
                              limit: int = 100) -> Page:
        op = {"op": "getPrefix", "ns": ns, "prefix": prefix, "limit": limit}
        if cursor is not None:
            op["cursor"] = cursor
        result = await self._one(op, safe=True)
        return Page([Item.from_wire(item["key"], item) for item in result["items"]], result.get("cursor"))

    async def get_prefix(self, ns: str, prefix: str = "", *, page_size: int = PAGE_ITEMS_MAX) -> AsyncIterator[Item]:
        """Every live key of `ns` starting with `prefix`, in key order, page after page."""
        cursor = None
        while True:
            page = await self.get_prefix_page(ns, prefix, cursor, page_size)
            for item in page.items:
                yield item
            if page.cursor is None:
                return
            cursor = page.cursor

    @wire_names(**TTL)
    async def put(self, ns: str, key: str, value, *, ttl=None, forever: bool = False,
                  expect: int | None = None) -> WriteResult:
        """Write `value`; with `expect`, only if the key's version is that (0 = absent)."""
        return await self._write(write_op("put", ns, key, value=value, has_value=True, ttl=ttl, forever=forever,
                                          expect=expect))

    @wire_names(**TTL)
    async def put_if_absent(self, ns: str, key: str, value, *, ttl=None, forever: bool = False) -> WriteResult:
        return await self._write(write_op("putIfAbsent", ns, key, value=value, has_value=True, ttl=ttl,
                                          forever=forever))

    async def delete(self, ns: str, key: str, *, expect: int | None = None) -> WriteResult:
        return await self._write(write_op("delete", ns, key, expect=expect))

    @wire_names(**TTL)
    async def incr(self, ns: str, key: str, by: int = 1, *, max: int | None = None, min: int | None = None,
                   ttl=None, forever: bool = False, expect: int | None = None) -> WriteResult:
        """Add `by` to an integer (absent counts as 0); past `max`/`min` it does not apply
        (reason "limit", `value` the counter as it stands)."""
        return await self._write(write_op("incr", ns, key, ttl=ttl, forever=forever, expect=expect, by=by, max=max,
                                          min=min))

    async def check(self, ns: str, key: str, expect: int) -> CheckResult:
        """Whether the key's version is `expect` (0 = absent). Writes nothing."""
        result = await self._one({"op": "check", "ns": ns, "key": key, "expect": expect}, safe=True)
        return CheckResult(result["applied"], result.get("version", 0))
