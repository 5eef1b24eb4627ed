"""Locks and semaphores as KV rows (DESIGN.md §4): parsing of lock operations, and the lock
operations of one shard, built on KvState and nothing else.

A permit is the row `queen-locks / <name>#<slot>`: its value is the owner, its TTL the lease, its
version the token, its create_version the fence (the token at acquire, kept across renewals).
acquire = putIfAbsent on the first free slot, renew = put with expect, release = delete with
expect. All slots of a name hash to one shard, so an acquire with a free permit never fails for
contention, and waiters of a name queue on that shard.

Waiting acquires are parked here with an opaque ticket from the caller; when a permit of their
name frees (release, or expiry found by the wheel) the longest-waiting one is served at once, in
the same batch. Resolved tickets are collected in `resolved` for the actor to answer.

Never: reads a clock, awaits, or knows what a ticket is.
"""

from __future__ import annotations

import re
from collections import deque

from queen.core.kv import LOCKS_NS, KvState, Row, _fail, _int
from queen.errors import BadRequest

NAME_BYTES_MAX = 256
OWNER_BYTES_MAX = 256
TTL_SECONDS_MAX = 90 * 86400  # a lock that outlives 90 days is a config row, not a lease
PERMITS_MAX = 1024
OPS_PER_CALL_MAX = 64
SLOTS_PER_CALL_MAX = 4096
WAIT_MS_MAX = 60_000
LOCK_OPS = frozenset(("acquire", "renew", "release", "get"))


class LockOp:
    __slots__ = ("op", "name", "ttl_ms", "owner", "limit", "wait_ms", "slot", "token")

    def __init__(self, op: str, name: str):
        self.op = op
        self.name = name
        self.ttl_ms = 0
        self.owner = None
        self.limit = 1
        self.wait_ms = 0
        self.slot = 0
        self.token = 0


# C0 and C1 control characters; a regex search is ten times cheaper than a loop over the name.
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")
_TTL_OPS = frozenset(("acquire", "renew"))
_TOKEN_OPS = frozenset(("renew", "release"))


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def parse_lock_op(raw, index) -> LockOp:
    if type(raw) is not dict:
        _fail("invalid_operation", "each operation must be an object", index)
    get = raw.get
    name = get("op")
    if name not in LOCK_OPS:
        _fail("unknown_op", "op must be one of acquire, renew, release, get", index, op=name)
    lock_name = get("name")
    if type(lock_name) is not str:
        _fail("invalid_name", "name must be a string", index)
    size = _utf8_size(lock_name)
    if not 1 <= size <= NAME_BYTES_MAX:
        _fail("invalid_name", f"name must be 1 to {NAME_BYTES_MAX} bytes", index, bytes=size)
    if "#" in lock_name:
        _fail("invalid_name", "name must not contain '#'", index)
    if _CONTROL_CHARACTER.search(lock_name) is not None:
        _fail("invalid_name", "name must not contain control characters", index)
    op = LockOp(name, lock_name)
    owner = get("owner")
    if owner is not None:
        if type(owner) is not str or not 1 <= _utf8_size(owner) <= OWNER_BYTES_MAX:
            _fail("invalid_owner", f"owner must be a string of 1 to {OWNER_BYTES_MAX} bytes", index)
        op.owner = owner
    if name in _TTL_OPS:
        ttl = get("ttlSeconds")
        if type(ttl) is not int or not 1 <= ttl <= TTL_SECONDS_MAX or get("forever") is not None:
            if get("forever") is not None:
                _fail("invalid_ttl", "a lock has no forever: a lease nobody can take back from a dead holder is not a lease", index)
            if ttl is None:
                _fail("ttl_required", f"ttlSeconds is required: an integer from 1 to {TTL_SECONDS_MAX}", index)
            _fail("invalid_ttl", f"ttlSeconds must be an integer from 1 to {TTL_SECONDS_MAX}", index)
        op.ttl_ms = ttl * 1000
        if name == "acquire":
            limit = get("limit")
            if limit is not None:
                op.limit = _int(limit, "limit", index, 1, PERMITS_MAX)
            wait_ms = get("waitMs")
            if wait_ms is not None:
                op.wait_ms = _int(wait_ms, "waitMs", index, 0, WAIT_MS_MAX)
    elif name == "get":
        limit = get("limit")
        op.limit = None if limit is None else _int(limit, "limit", index, 1, PERMITS_MAX)  # None: every holder
    if name in _TOKEN_OPS:
        slot, token = get("slot"), get("token")
        if slot is None or token is None:
            _fail("invalid_operation", f"{name} needs slot and token from the acquire answer", index)
        op.slot = _int(slot, "slot", index, 0, PERMITS_MAX - 1)
        op.token = _int(token, "token", index, 1)
    return op


def parse_lock_ops(raw_ops) -> list[LockOp]:
    if type(raw_ops) is not list or not raw_ops:
        raise BadRequest("invalid_operations", "operations must be a non-empty list")
    if len(raw_ops) > OPS_PER_CALL_MAX:
        raise BadRequest("too_many_operations", f"at most {OPS_PER_CALL_MAX} lock operations per call",
                         {"count": len(raw_ops), "limit": OPS_PER_CALL_MAX})
    ops = [parse_lock_op(raw, i) for i, raw in enumerate(raw_ops)]
    seen = set()
    slots = 0
    for i, op in enumerate(ops):
        if op.name in seen:
            _fail("duplicate_name", "each operation of a call must name a different lock", i, name=op.name)
        seen.add(op.name)
        if op.op == "acquire":
            slots += op.limit
    if slots > SLOTS_PER_CALL_MAX:
        raise BadRequest("too_many_slots", f"the limits of one call's acquires add up to {slots}; at most {SLOTS_PER_CALL_MAX}",
                         {"slots": slots, "limit": SLOTS_PER_CALL_MAX})
    return ops


def permit_key(name: str, slot: int) -> str:
    return f"{name}#{slot}"


def guard(name: str, slot: int, token: int) -> dict:
    return {"op": "check", "ns": LOCKS_NS, "key": permit_key(name, slot), "expect": token, "required": True}


def holder(slot: int, row: Row) -> dict:
    return {"slot": slot, "owner": row.value, "token": row.version, "fence": row.create_version,
            "since": row.created_at_ms, "renewedAt": row.updated_at_ms, "expiresAt": row.expires_at_ms}


class Waiter:
    __slots__ = ("op", "deadline_ms", "ticket")

    def __init__(self, op: LockOp, deadline_ms: int, ticket):
        self.op = op
        self.deadline_ms = deadline_ms
        self.ticket = ticket


class LockTable:
    """The lock operations of one shard, over that shard's KvState."""

    __slots__ = ("kv", "waiters", "resolved")

    def __init__(self, kv: KvState):
        self.kv = kv
        self.waiters: dict[str, deque[Waiter]] = {}
        # (ticket, result, version the answer depends on), for the actor to deliver.
        self.resolved: list = []

    def apply(self, op: LockOp, now_ms: int, effects: list) -> dict:
        if op.op == "acquire":
            return self.acquire(op, now_ms, effects)
        if op.op == "renew":
            return self.renew(op, now_ms, effects)
        if op.op == "release":
            return self.release(op, now_ms, effects)
        return self.get(op, now_ms)

    def _rows(self, name: str, limit: int, now_ms: int) -> list:
        live_row = self.kv.live_row
        return [live_row(LOCKS_NS, permit_key(name, slot), now_ms) for slot in range(limit)]

    def acquire(self, op: LockOp, now_ms: int, effects: list) -> dict:
        kv = self.kv
        name = op.name
        if name in self.waiters:
            # A permit may have expired since the last tick: it belongs to the oldest waiter.
            self.serve_waiters(name, now_ms, effects)
        keys = [f"{name}#{slot}" for slot in range(op.limit)]
        live_row = kv.live_row
        rows = [live_row(LOCKS_NS, key, now_ms) for key in keys]
        owner = op.owner
        if owner is not None:
            for slot, row in enumerate(rows):
                if row is not None and row.value == owner:
                    kv.observe(row)
                    return self._granted(name, slot, keys[slot], row, already=True)
        if name not in self.waiters:  # first come first served: a free permit belongs to the oldest waiter
            for slot, row in enumerate(rows):
                if row is None:
                    row = kv.write(LOCKS_NS, keys[slot], owner, op.ttl_ms, None, now_ms, effects)
                    return self._granted(name, slot, keys[slot], row)
        for row in rows:
            kv.observe(row)
        return {"name": name, "acquired": False, "reason": "held",
                "holders": [holder(slot, row) for slot, row in enumerate(rows) if row is not None]}

    @staticmethod
    def _granted(name: str, slot: int, key: str, row: Row, already: bool = False) -> dict:
        version = row.version
        result = {"name": name, "acquired": True, "slot": slot, "token": version, "fence": row.create_version,
                  "owner": row.value, "expiresAt": row.expires_at_ms,
                  "guard": {"op": "check", "ns": LOCKS_NS, "key": key, "expect": version, "required": True}}
        if already:
            result["already"] = True
        return result

    def park(self, op: LockOp, now_ms: int, ticket) -> None:
        """Queue a held acquire until a permit frees or waitMs runs out."""
        queue = self.waiters.get(op.name)
        if queue is None:
            queue = self.waiters[op.name] = deque()
        queue.append(Waiter(op, now_ms + op.wait_ms, ticket))

    def abandon(self, matches, now_ms: int) -> None:
        """Answer and forget the waiters whose ticket `matches`: their client is gone, so they must
        not be handed a permit nobody would use until its lease ran out."""
        for name in list(self.waiters):
            queue = self.waiters[name]
            for waiter in [w for w in queue if matches(w.ticket)]:
                queue.remove(waiter)
                self.resolved.append((waiter.ticket, {"name": name, "acquired": False, "reason": "cancelled"}, 0))
            if not queue:
                del self.waiters[name]

    def serve_waiters(self, name: str, now_ms: int, effects: list) -> None:
        queue = self.waiters.get(name)
        while queue:
            waiter = queue[0]
            kv = self.kv
            if waiter.deadline_ms <= now_ms:
                queue.popleft()
                kv.wait_version = 0
                result = self._held_answer(waiter.op, now_ms, "timeout")
                self.resolved.append((waiter.ticket, result, kv.wait_version))
                continue
            rows = self._rows(name, waiter.op.limit, now_ms)
            free = next((slot for slot, row in enumerate(rows) if row is None), None)
            if free is None:
                break
            queue.popleft()
            key = permit_key(name, free)
            row = kv.write(LOCKS_NS, key, waiter.op.owner, waiter.op.ttl_ms, None, now_ms, effects)
            self.resolved.append((waiter.ticket, self._granted(name, free, key, row), row.version))
        if queue is not None and not queue:
            del self.waiters[name]

    def _held_answer(self, op: LockOp, now_ms: int, reason: str) -> dict:
        rows = self._rows(op.name, op.limit, now_ms)
        for row in rows:
            self.kv.observe(row)
        return {"name": op.name, "acquired": False, "reason": reason,
                "holders": [holder(slot, row) for slot, row in enumerate(rows) if row is not None]}

    def on_tick(self, freed_keys: list, now_ms: int, effects: list) -> None:
        """After the wheel freed rows: hand freed permits to waiters, and time out the rest."""
        names = {key.partition("#")[0] for ns, key in freed_keys if ns == LOCKS_NS}
        names.update(name for name, queue in self.waiters.items() if any(w.deadline_ms <= now_ms for w in queue))
        for name in names:
            if name in self.waiters:
                self.serve_waiters(name, now_ms, effects)
                self._expire_waiting(name, now_ms)

    def _expire_waiting(self, name: str, now_ms: int) -> None:
        """Time out waiters behind the head whose wait ran out (the head is handled by serving)."""
        queue = self.waiters.get(name)
        if not queue:
            return
        keep = deque()
        for waiter in queue:
            if waiter.deadline_ms <= now_ms:
                self.kv.wait_version = 0
                self.resolved.append((waiter.ticket, self._held_answer(waiter.op, now_ms, "timeout"), self.kv.wait_version))
            else:
                keep.append(waiter)
        if keep:
            self.waiters[name] = keep
        else:
            del self.waiters[name]

    def renew(self, op: LockOp, now_ms: int, effects: list) -> dict:
        kv = self.kv
        key = permit_key(op.name, op.slot)
        row = kv.live_row(LOCKS_NS, key, now_ms)
        if not self._holds(op, row):
            kv.observe(row)
            return {"name": op.name, "renewed": False, "reason": "lost"}
        row = kv.write(LOCKS_NS, key, row.value, op.ttl_ms, row, now_ms, effects)
        return {"name": op.name, "renewed": True, "slot": op.slot, "token": row.version, "fence": row.create_version,
                "expiresAt": row.expires_at_ms, "guard": guard(op.name, op.slot, row.version)}

    def release(self, op: LockOp, now_ms: int, effects: list) -> dict:
        kv = self.kv
        key = permit_key(op.name, op.slot)
        row = kv.live_row(LOCKS_NS, key, now_ms)
        if row is None:
            kv.observe(None)
            return {"name": op.name, "released": False, "reason": "absent"}
        if not self._holds(op, row):
            kv.observe(row)
            return {"name": op.name, "released": False, "reason": "lost"}
        kv.delete(LOCKS_NS, key, effects)
        if op.name in self.waiters:
            self.serve_waiters(op.name, now_ms, effects)
        return {"name": op.name, "released": True}

    @staticmethod
    def _holds(op: LockOp, row: Row | None) -> bool:
        """The token is the capability. A stale token is accepted only from the holder's own owner
        (its earlier renew landed but the answer was lost): same owner, same holder."""
        if row is None:
            return False
        if op.owner is not None and row.value is not None and row.value != op.owner:
            return False
        if row.version == op.token:
            return True
        return op.owner is not None and row.value == op.owner and row.create_version <= op.token < row.version

    def get(self, op: LockOp, now_ms: int) -> dict:
        kv = self.kv
        table = kv.tables.get(LOCKS_NS)
        holders = []
        if table is not None:
            prefix = op.name + "#"
            for key in list(table.keys.irange(prefix, prefix + "\uffff")):
                slot = int(key[len(prefix):])
                if op.limit is not None and slot >= op.limit:
                    continue
                row = kv.live_row(LOCKS_NS, key, now_ms)
                kv.observe(row)
                if row is not None:
                    holders.append(holder(slot, row))
        holders.sort(key=lambda h: h["slot"])
        if kv.last_delete_version > kv.wait_version:
            kv.wait_version = kv.last_delete_version
        return {"name": op.name, "holders": holders}
