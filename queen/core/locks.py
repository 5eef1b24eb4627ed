"""Locks and semaphores as KV rows: parsing of lock operations, and the lock operations of one shard,
built on KvState and nothing else.

A permit is the row `queen-locks / <name>#<slot>`: its value the object `{"owner": <owner>}`
(kv.permit_json: a client reading the row finds `value.owner`; the log's put carries the owner
alone), its TTL the lease, its version the token, its create_version the fence (the token at
acquire, kept across renewals). The table reads permits with kv.live_permit: a Row whose value is
the stored JSON, compared to an operation's permit_json (built once per operation) to recognise
its owner, and decoded only to be shown.
acquire = putIfAbsent on the first free slot, renew = put with expect, release = delete with
expect. All slots of a name hash to one shard, so an acquire with a free permit never fails for
contention, and waiters of a name queue on that shard.

Waiting acquires are parked here with the caller's opaque (reply_to, position). A permit that frees
by any path (a release, the wheel, or a read that found it expired) goes to the longest-waiting
acquire of its name in the same step; answers for parked acquires collect in `resolved` for the
caller to deliver at once. Names are served in the order their permits freed, never in the order
of a set, so a seeded run replays exactly.

A wait has a ceiling (Limits.wait_ms_max). An acquire that waited that whole ceiling keeps its
place in line for PLACE_KEPT_MS after its timeout answer: the same owner asking again with a wait
within that time takes the place back, so a client that waits "forever" (by asking again every
time) is never overtaken by those who came after it. While its owner is away the place holds a
free permit back; a place not taken back in time is dropped.

Never: reads a clock, awaits, or knows what a reply_to is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import cast

import orjson

from queen.core import names
from queen.core.kv import (
    LOCKS_NS,
    NO_OWNER_JSON,
    KvState,
    Row,
    check_fields,
    fail,
    integer,
    is_locks_ns,
    permit_json,
)
from queen.core.limits import INT64_MAX, Limits
from queen.core.outcomes import LockReason
from queen.core.wheel import TimingWheel
from queen.errors import BadRequest

# How long a waiter that used its whole wait keeps its place for its owner to ask again.
PLACE_KEPT_MS = 2_000

LOCK_OPS = frozenset(("acquire", "renew", "release", "get"))
FIELDS = {
    "acquire": frozenset(("op", "name", "ttlSeconds", "owner", "limit", "waitMs", "forever")),
    "renew": frozenset(("op", "name", "slot", "token", "ttlSeconds", "owner", "forever")),
    "release": frozenset(("op", "name", "slot", "token", "owner")),
    "get": frozenset(("op", "name", "limit")),
}


class LockOp:
    __slots__ = ("op", "name", "ns", "ttl_ms", "owner", "limit", "wait_ms", "slot", "token", "encoded")

    def __init__(self, op: str, name: str):
        self.op = op
        self.name = name
        self.ns = LOCKS_NS  # where its permits are stored: the tenant's lock namespace
        self.ttl_ms = 0
        self.owner: str | None = None
        # Permits; for a get, None means every holder. A compiled build checks these types on
        # every assignment, so they say exactly what each field may hold.
        self.limit: int | None = 1
        self.wait_ms = 0
        self.slot: int | None = 0  # a renew or release may leave it out: the token's permit
        self.token = 0
        self.encoded: bytes | None = None  # permit_json(owner), once the table needed it (encoded_owner)


_TTL_OPS = frozenset(("acquire", "renew"))
_TOKEN_OPS = frozenset(("renew", "release"))


def parse_lock_op(raw, index, limits: Limits) -> LockOp:
    if type(raw) is not dict:
        fail("invalid_operation", "each operation must be an object", index)
    get = raw.get
    name = get("op")
    if type(name) is not str or name not in LOCK_OPS:
        fail("unknown_op", "op must be one of acquire, renew, release, get", index, op=name)
    if not FIELDS[name].issuperset(raw):
        check_fields(raw, FIELDS[name], index)
    lock_name = names.name(get("name"), "name", "invalid_name", limits.lock_name_bytes_max, index)
    if "#" in lock_name:  # it separates the name from the slot in a permit's key
        fail("invalid_name", "name must not contain '#'", index)
    op = LockOp(name, lock_name)
    owner = get("owner")
    if owner is not None:
        # A name too: shown to every other client in holders and listings, and compared byte for
        # byte to recognise a holder acquiring again.
        op.owner = names.name(owner, "owner", "invalid_owner", limits.lock_owner_bytes_max, index)
    if name in _TTL_OPS:
        ttl = get("ttlSeconds")
        ttl_max = limits.lock_ttl_seconds_max
        if get("forever") is not None:
            fail("invalid_ttl", "a lock has no forever: a lease nobody can take back from a dead holder is not a lease", index)
        if type(ttl) is not int or not 1 <= ttl <= ttl_max:
            if ttl is None:
                fail("ttl_required", f"ttlSeconds is required: an integer from 1 to {ttl_max}", index)
            fail("invalid_ttl", f"ttlSeconds must be an integer from 1 to {ttl_max}", index)
        op.ttl_ms = ttl * 1000
        if name == "acquire":
            limit = get("limit")
            if limit is not None:
                op.limit = integer(limit, "invalid_limit", "limit", index, 1, limits.lock_permits_max)
            wait_ms = get("waitMs")
            if wait_ms is not None:
                op.wait_ms = integer(wait_ms, "invalid_wait_ms", "waitMs", index, 0, limits.wait_ms_max)
    elif name == "get":
        limit = get("limit")  # None: every holder
        op.limit = None if limit is None else integer(limit, "invalid_limit", "limit", index, 1, limits.lock_permits_max)
    if name in _TOKEN_OPS:
        slot, token = get("slot"), get("token")
        if token is None:
            fail("invalid_operation", f"{name} needs the token from the acquire answer (and its slot)", index)
        if slot is None:
            op.slot = None  # left out: the permit this token is of
        else:
            op.slot = slot if type(slot) is int and 0 <= slot < limits.lock_permits_max else \
                integer(slot, "invalid_slot", "slot", index, 0, limits.lock_permits_max - 1)
        op.token = token if type(token) is int and 1 <= token <= INT64_MAX else integer(token, "invalid_token", "token", index, 1)
    return op


def parse_lock_ops(raw_ops, limits: Limits) -> list[LockOp]:
    if type(raw_ops) is not list or not raw_ops:
        raise BadRequest("invalid_operations", "operations must be a non-empty list")
    if len(raw_ops) > limits.lock_ops_per_call_max:
        raise BadRequest("too_many_operations", f"at most {limits.lock_ops_per_call_max} lock operations per call",
                         {"count": len(raw_ops), "limit": limits.lock_ops_per_call_max})
    ops = [parse_lock_op(raw, i, limits) for i, raw in enumerate(raw_ops)]
    seen = set()
    slots = 0
    for i, op in enumerate(ops):
        if op.name in seen:
            fail("duplicate_name", "each operation of a call must name a different lock", i, name=op.name)
        seen.add(op.name)
        if op.op == "acquire":
            slots += permits(op)
    if slots > limits.lock_slots_per_call_max:
        raise BadRequest("too_many_slots", f"the limits of one call's acquires add up to {slots}; "
                         f"at most {limits.lock_slots_per_call_max}", {"slots": slots, "limit": limits.lock_slots_per_call_max})
    return ops


def permits(op: LockOp) -> int:
    """An acquire's number of permits: only a get's limit may be None."""
    limit = op.limit
    assert limit is not None
    return limit


def permit_key(name: str, slot: int) -> str:
    return f"{name}#{slot}"


def guard(key: str, token: int) -> dict:
    return {"op": "check", "ns": LOCKS_NS, "key": key, "expect": token, "required": True}


def encoded_owner(op: LockOp) -> bytes:
    """The value a permit of op's owner holds, as stored: built once per operation."""
    encoded = op.encoded
    if encoded is None:
        encoded = op.encoded = permit_json(op.owner)
    return encoded


def owner_of(row: Row) -> str | None:
    """The owner a permit's row holds (its value as live_permit reads it: permit_json's bytes)."""
    return orjson.loads(cast(bytes, row.value))["owner"]


def holder(slot: int, row: Row) -> dict:
    return {"slot": slot, "owner": owner_of(row), "token": row.version, "fence": row.create_version,
            "since": row.created_at_ms, "renewedAt": row.updated_at_ms, "expiresAt": row.expires_at_ms}


class Waiter:
    """A parked acquire; with reply_to None, a place kept for op.owner (see the module docstring)."""

    __slots__ = ("op", "deadline_ms", "reply_to", "position")

    def __init__(self, op: LockOp, deadline_ms: int, reply_to, position: int):
        self.op = op
        self.deadline_ms = deadline_ms
        self.reply_to = reply_to
        self.position = position


@dataclass(frozen=True, slots=True)
class LockStatistics:
    permits: int  # permit rows held (those expired and not yet freed by a tick included)
    waiters: int  # acquires parked for a permit
    acquires: dict  # result -> count: granted, held, timeout, cancelled
    expired: int  # permits freed because their lifetime ran out


class LockTable:
    """The lock operations of one shard, over that shard's KvState."""

    __slots__ = ("kv", "waiters", "deadlines", "resolved", "wait_ms_max", "acquires", "expired")

    def __init__(self, kv: KvState, now_ms: int, wait_ms_max: int = Limits().wait_ms_max):
        self.acquires = dict.fromkeys(("granted", "held", "timeout", "cancelled"), 0)  # by result
        self.expired = 0
        self.kv = kv
        self.wait_ms_max = wait_ms_max
        self.waiters: dict[tuple[str, str], deque[Waiter]] = {}  # (ns, name) -> oldest first
        self.deadlines = TimingWheel(now_ms)  # Waiter -> deadline_ms, so a tick looks only at due ones
        # (reply_to, position, result) of parked acquires answered, for the caller to deliver.
        self.resolved: list = []

    def statistics(self) -> LockStatistics:
        permits = sum(len(table.rows) for ns, table in self.kv.tables.items() if is_locks_ns(ns))
        return LockStatistics(permits, sum(len(queue) for queue in self.waiters.values()), dict(self.acquires),
                              self.expired)

    def apply(self, op: LockOp, now_ms: int, records: list, reply_to=None, position: int = 0) -> dict | None:
        """The answer, or None when an acquire with waitMs was parked (answered later, in resolved)."""
        kind = op.op
        if kind == "acquire":
            if op.wait_ms > 0 and reply_to is not None and self._take_place_back(op, now_ms, reply_to, position):
                self.serve((op.ns, op.name), now_ms, records)  # its turn may have come while it was away
                return None
            result = self.acquire(op, now_ms, records)
            if not result["acquired"] and op.wait_ms > 0 and reply_to is not None:
                self.park(op, now_ms, reply_to, position)
                return None
            self.acquires["granted" if result["acquired"] else "held"] += 1
            return result
        if kind == "renew":
            return self.renew(op, now_ms, records)
        if kind == "release":
            return self.release(op, now_ms, records)
        return self.get(op, now_ms)

    def _rows(self, ns: str, name: str, limit: int, now_ms: int) -> list:
        live_permit = self.kv.live_permit
        return [live_permit(ns, permit_key(name, slot), now_ms) for slot in range(limit)]

    def acquire(self, op: LockOp, now_ms: int, records: list) -> dict:
        kv = self.kv
        name, ns = op.name, op.ns
        line = (ns, name)
        waiters = self.waiters
        if waiters and line in waiters:
            # A permit may have expired since the last tick: it belongs to the oldest waiter.
            self.serve(line, now_ms, records)
        owner = op.owner
        if op.limit == 1:  # the common case, without the lists
            key = name + "#0"
            row = kv.live_permit(ns, key, now_ms)
            if row is None:
                if line not in waiters:
                    row = kv.write(ns, key, owner, encoded_owner(op), op.ttl_ms, None, now_ms, records)
                    return self._granted(name, 0, key, row, owner)
            elif owner is not None and row.value == encoded_owner(op):
                return self._granted(name, 0, key, row, owner, already=True)
            return {"name": name, "acquired": False, "reason": LockReason.HELD,
                    "holders": [] if row is None else [holder(0, row)]}
        keys = [f"{name}#{slot}" for slot in range(permits(op))]
        live_permit = kv.live_permit
        rows = [live_permit(ns, key, now_ms) for key in keys]
        if owner is not None:
            mine = encoded_owner(op)
            for slot, row in enumerate(rows):
                if row is not None and row.value == mine:
                    return self._granted(name, slot, keys[slot], row, owner, already=True)
        if line not in waiters:  # first come first served: a free permit belongs to the oldest waiter
            for slot, row in enumerate(rows):
                if row is None:
                    row = kv.write(ns, keys[slot], owner, encoded_owner(op), op.ttl_ms, None, now_ms, records)
                    return self._granted(name, slot, keys[slot], row, owner)
        return {"name": name, "acquired": False, "reason": LockReason.HELD,
                "holders": [holder(slot, row) for slot, row in enumerate(rows) if row is not None]}

    @staticmethod
    def _granted(name: str, slot: int, key: str, row: Row, owner: str | None, already: bool = False) -> dict:
        """The answer to an acquire granted row; owner is the acquire's, the row's owner too."""
        version = row.version
        result = {"name": name, "acquired": True, "slot": slot, "token": version, "fence": row.create_version,
                  "owner": owner, "expiresAt": row.expires_at_ms, "guard": guard(key, version)}
        if already:
            result["already"] = True
        return result

    def park(self, op: LockOp, now_ms: int, reply_to, position: int) -> None:
        """Queue a held acquire until a permit frees or waitMs runs out."""
        line = (op.ns, op.name)
        queue = self.waiters.get(line)
        if queue is None:
            queue = self.waiters[line] = deque()
        waiter = Waiter(op, now_ms + op.wait_ms, reply_to, position)
        queue.append(waiter)
        self.deadlines.add(waiter, waiter.deadline_ms)

    def _take_place_back(self, op: LockOp, now_ms: int, reply_to, position: int) -> bool:
        """Park op in the place kept for its owner, if there is one."""
        queue = self.waiters.get((op.ns, op.name))
        if queue is None or op.owner is None:
            return False
        for index, kept in enumerate(queue):
            if kept.reply_to is None and kept.op.owner == op.owner:
                self.deadlines.remove(kept)
                waiter = queue[index] = Waiter(op, now_ms + op.wait_ms, reply_to, position)
                self.deadlines.add(waiter, waiter.deadline_ms)
                return True
        return False

    def abandon(self, reply_to, now_ms: int, timed_out: bool = False) -> None:
        """Answer and forget the waiters of reply_to: "cancelled" when their client is gone, so they
        are never handed a permit nobody would use until its lease ran out; or, timed_out, as their
        wait running out would."""
        for line in list(self.waiters):
            queue = self.waiters[line]
            gone = [w for w in queue if w.reply_to is reply_to]
            for waiter in gone:
                queue.remove(waiter)
                self.deadlines.remove(waiter)
                if timed_out:
                    self._time_out(waiter, now_ms)
                else:
                    self.acquires["cancelled"] += 1
                    self.resolved.append((reply_to, waiter.position, {"name": line[1], "acquired": False,
                                                                      "reason": LockReason.CANCELLED}))
            if not queue:
                del self.waiters[line]

    def serve(self, line: tuple[str, str], now_ms: int, records: list) -> None:
        """Hand free permits of the lock (ns, name) to its waiters, oldest first; answer the head if
        its wait ran out."""
        ns, name = line
        queue = self.waiters.get(line)
        while queue:
            waiter = queue[0]
            if waiter.deadline_ms <= now_ms:
                queue.popleft()
                self.deadlines.remove(waiter)
                kept = self._time_out(waiter, now_ms)
                if kept is not None:
                    queue.appendleft(kept)
                    self.deadlines.add(kept, kept.deadline_ms)
                continue
            rows = self._rows(ns, name, permits(waiter.op), now_ms)
            free = next((slot for slot, row in enumerate(rows) if row is None), None)
            if free is None or waiter.reply_to is None:
                break  # no permit, or the head's owner is away: its kept place holds the permit back
            queue.popleft()
            self.deadlines.remove(waiter)
            key = permit_key(name, free)
            owner = waiter.op.owner
            row = self.kv.write(ns, key, owner, encoded_owner(waiter.op), waiter.op.ttl_ms, None, now_ms, records)
            self.acquires["granted"] += 1
            self.resolved.append((waiter.reply_to, waiter.position, self._granted(name, free, key, row, owner)))
        if queue is not None and not queue:
            del self.waiters[line]

    def _time_out(self, waiter: Waiter, now_ms: int) -> Waiter | None:
        """Answer a waiter whose wait ran out; the place kept for its owner, if it keeps one (a
        kept place that ran out is just dropped)."""
        op = waiter.op
        if waiter.reply_to is None:
            return None
        rows = self._rows(op.ns, op.name, permits(op), now_ms)
        self.acquires["timeout"] += 1
        result = {"name": op.name, "acquired": False, "reason": LockReason.TIMEOUT,
                  "holders": [holder(slot, row) for slot, row in enumerate(rows) if row is not None]}
        self.resolved.append((waiter.reply_to, waiter.position, result))
        if op.owner is None or op.wait_ms < self.wait_ms_max:
            return None
        return Waiter(op, now_ms + PLACE_KEPT_MS, None, 0)

    def after_step(self, now_ms: int, records: list) -> None:
        """Hand the permits that freed during a step (kv.freed_permits) to their waiters."""
        freed = self.kv.freed_permits
        if not freed:
            return
        self.kv.freed_permits = []
        self.expired += len(freed)
        waiters = self.waiters
        for line in dict.fromkeys((ns, key.rpartition("#")[0]) for ns, key in freed):
            if line in waiters:
                self.serve(line, now_ms, records)

    def tick(self, now_ms: int, records: list) -> None:
        """Free expired rows, hand their permits on, and time out waits that ran out."""
        self.kv.expire(now_ms)
        self.after_step(now_ms, records)
        for waiter in self.deadlines.advance(now_ms):
            line = (waiter.op.ns, waiter.op.name)
            queue = self.waiters.get(line)
            if queue is None or waiter not in queue:
                continue
            index = queue.index(waiter)
            kept = self._time_out(waiter, now_ms)
            if kept is not None:
                queue[index] = kept
                self.deadlines.add(kept, kept.deadline_ms)
                continue
            del queue[index]
            if not queue:
                del self.waiters[line]
            else:
                self.serve(line, now_ms, records)  # a dropped place may have held a permit back
        self.after_step(now_ms, records)  # reading holders for a timeout may find expired permits

    def _slot_of(self, op: LockOp, now_ms: int) -> int:
        """op's slot; when it gave none, the slot of the permit its token (and owner) holds, or 0."""
        if op.slot is not None:
            return op.slot
        for slot, row in self._permits(op.ns, op.name, now_ms):
            if self._holds(op, row):
                return slot
        return 0

    def _permits(self, ns: str, name: str, now_ms: int) -> list:
        """(slot, row) of every live permit of the lock name, in slot order."""
        kv = self.kv
        table = kv.tables.get(ns)
        permits = []
        if table is not None:
            prefix = name + "#"
            for key in list(table.sorted_keys().irange(prefix, prefix + "\uffff")):
                row = kv.live_permit(ns, key, now_ms)
                if row is not None:
                    permits.append((int(key[len(prefix):]), row))
        permits.sort(key=lambda permit: permit[0])
        return permits

    def renew(self, op: LockOp, now_ms: int, records: list) -> dict:
        kv = self.kv
        slot = self._slot_of(op, now_ms)
        key = permit_key(op.name, slot)
        row = kv.live_permit(op.ns, key, now_ms)
        if row is None or not self._holds(op, row):
            return {"name": op.name, "renewed": False, "reason": LockReason.LOST}
        encoded = cast(bytes, row.value)  # the permit keeps its owner, and so its stored value
        # The owner for the log: op's when the row is of op's owner (known without decoding).
        owner = op.owner if op.owner is not None and encoded == encoded_owner(op) else owner_of(row)
        row = kv.write(op.ns, key, owner, encoded, op.ttl_ms, row, now_ms, records)
        return {"name": op.name, "renewed": True, "slot": slot, "token": row.version, "fence": row.create_version,
                "expiresAt": row.expires_at_ms, "guard": guard(key, row.version)}

    def release(self, op: LockOp, now_ms: int, records: list) -> dict:
        kv = self.kv
        key = permit_key(op.name, self._slot_of(op, now_ms))
        row = kv.live_permit(op.ns, key, now_ms)
        if row is None:
            return {"name": op.name, "released": False, "reason": LockReason.ABSENT}
        if not self._holds(op, row):
            return {"name": op.name, "released": False, "reason": LockReason.LOST}
        kv.delete(op.ns, key, records)
        line = (op.ns, op.name)
        if line in self.waiters:
            self.serve(line, now_ms, records)
        return {"name": op.name, "released": True}

    @staticmethod
    def _holds(op: LockOp, row: Row | None) -> bool:
        """The token is the capability. A stale token is accepted only from the holder's own owner
        (its earlier renew landed but the answer was lost): same owner, same holder."""
        if row is None:
            return False
        if op.owner is None:
            return row.version == op.token
        if row.value == encoded_owner(op):  # the same owner
            return row.version == op.token or row.create_version <= op.token < row.version
        return row.value == NO_OWNER_JSON and row.version == op.token  # no owner: the token alone; another: never

    def get(self, op: LockOp, now_ms: int) -> dict:
        holders = [holder(slot, row) for slot, row in self._permits(op.ns, op.name, now_ms)
                   if op.limit is None or slot < op.limit]
        return {"name": op.name, "held": bool(holders), "holders": holders}
