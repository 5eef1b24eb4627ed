"""The KV state machine of one shard, and the parsing of KV operations from their wire form.

Owns: the rows of the keys that hash to this shard, their ordered key index per namespace, and a
timing wheel that frees expired rows. Invariants:
  - a row whose expires_at_ms has passed is absent for every operation, removed or not;
  - every write takes the next value of the one global VersionCounter (deletes included), so
    versions never go back, and records are produced in version order;
  - a miss (expect, exists, limit) writes nothing and consumes no version.
Never: reads a clock, touches disk, awaits. Results are wire dicts (camelCase) because building
them once here is cheaper per operation than building an internal object and converting it.
Durability of what an answer shows is not this module's business: every answer waits for the last
version applied before it (queen/core/state.py), whatever it read.
"""

from __future__ import annotations

import base64
import binascii
from typing import NoReturn

import orjson
from sortedcontainers import SortedList

from queen.core import names
from queen.core import records as rec
from queen.core.limits import INT64_MAX, INT64_MIN, Limits
from queen.core.outcomes import KvReason
from queen.core.tenants import SEPARATOR, Usage, UsageBook
from queen.core.values import json_default
from queen.core.wheel import TimingWheel
from queen.errors import BadRequest

RESERVED_NS_PREFIX = "queen-"
LOCKS_NS = "queen-locks"  # as a tenant names it; each tenant's is its own (queen/core/tenants.py)
_LOCKS_NS_OF_A_TENANT = SEPARATOR + LOCKS_NS


def is_locks_ns(ns: str) -> bool:
    """Whether a stored namespace holds lock permits: the default tenant's or another's."""
    return ns == LOCKS_NS or ns.endswith(_LOCKS_NS_OF_A_TENANT)
PAGE_ITEMS_DEFAULT = 100


# The largest integer a JSON client reads exactly (JavaScript's Number is an IEEE double). Every
# version, lock token, fence, lease, partition and message id is a value of the VersionCounter, so
# none may pass it: no step that takes one past it reaches the log or an answer
# (queen/runtime/steps.py), and recovery refuses a log whose versions went past it.
VERSION_MAX = (1 << 53) - 1
# Calls that write are refused once the counter is past this (queen/runtime/router.py). The 2^32
# versions left are for what still takes versions after that: calls already admitted, parked
# requests, the expiries and timers of what is in memory, and the ceiling block (2^16) each
# restart skips. At a million versions a second the limit is 285 years away: in practice only
# damage (or a build that believed a damaged frame's claim) gets there.
VERSIONS_WRITABLE_MAX = VERSION_MAX - (1 << 32)


class VersionCounter:
    """The one global version sequence. Shared by every shard; safe because all run on one thread.
    Its values stay at or below VERSION_MAX (checked once per step, not per value)."""

    __slots__ = ("last",)

    def __init__(self, last: int = 0):
        self.last = last

    def next(self) -> int:
        self.last += 1
        return self.last


class Row:
    """One key's current state. Immutable by convention: a write makes a new Row, so a shallow copy
    of a table is a consistent snapshot."""

    __slots__ = ("value", "version", "create_version", "created_at_ms", "updated_at_ms", "expires_at_ms")

    def __init__(self, value, version, create_version, created_at_ms, updated_at_ms, expires_at_ms):
        self.value = value
        self.version = version
        self.create_version = create_version
        self.created_at_ms = created_at_ms
        self.updated_at_ms = updated_at_ms
        self.expires_at_ms = expires_at_ms  # 0 means forever


class Table:
    """The rows of one namespace on one shard, with their keys in order for prefix pages.

    The order is kept lazily: inserts and removals are noted in two small sets and folded into the
    sorted index only when a page is read, so a key written and deleted between two pages (a lock
    acquired and released) never touches the index. When the notes outgrow a quarter of the index,
    it is dropped and rebuilt from the rows at the next page instead."""

    __slots__ = ("rows", "_sorted", "_added", "_removed", "usage")

    def __init__(self, usage: Usage | None = None):
        self.usage = usage  # its tenant's (keys and bytes held); None for the default tenant's
        self.rows: dict[str, Row] = {}
        self._sorted: SortedList | None = SortedList()
        self._added: set = set()
        self._removed: set = set()

    def note_insert(self, key: str) -> None:
        """key was just added to rows."""
        if self._sorted is None:
            return
        if key in self._removed:
            self._removed.discard(key)
        else:
            self._added.add(key)
            self._check_notes()

    def note_remove(self, key: str) -> None:
        """key was just removed from rows."""
        if self._sorted is None:
            return
        if key in self._added:
            self._added.discard(key)
        else:
            self._removed.add(key)
            self._check_notes()

    def _check_notes(self) -> None:
        assert self._sorted is not None  # only called while the index is kept
        if len(self._added) + len(self._removed) > 64 + len(self._sorted) // 4:
            self._sorted = None
            self._added.clear()
            self._removed.clear()

    def sorted_keys(self) -> SortedList:
        if self._sorted is None:
            self._sorted = SortedList(self.rows)
        elif self._added or self._removed:
            for key in self._removed:
                self._sorted.remove(key)
            self._sorted.update(self._added)
            self._added.clear()
            self._removed.clear()
        return self._sorted


# --------------------------------------------------------------------------------------------
# Parsing: wire dict -> KvOp, raising BadRequest before anything is applied.


class KvOp:
    __slots__ = ("op", "ns", "key", "value", "ttl_ms", "expect", "by", "max", "min", "keys",
                 "prefix", "cursor", "limit", "required", "detail", "keys_only")

    def __init__(self, op: str, ns: str, key: str | None = None):
        # A compiled build (queen/_native.py) checks each attribute's type when it is set.
        self.op = op
        self.ns = ns
        self.key = key  # None for getMany and getPrefix, which name no one key
        self.value: object = None  # a JSON value
        self.ttl_ms = 0  # 0 = forever, for writes
        self.expect: int | None = None
        self.by = 1
        self.max: int | None = None
        self.min: int | None = None
        self.keys: list[str] = []
        self.prefix = ""
        self.cursor: str | None = None
        self.limit = PAGE_ITEMS_DEFAULT
        self.required = True
        self.detail = False  # getPrefix: also each row's create version and times (lock listings)
        self.keys_only = False  # getPrefix: keys without values (keysOnly)


_LIFETIME = ("ttlSeconds", "forever")
FIELDS = {
    "get": frozenset(("op", "ns", "key")),
    "getMany": frozenset(("op", "ns", "keys")),
    "getPrefix": frozenset(("op", "ns", "prefix", "cursor", "limit", "keysOnly")),
    "check": frozenset(("op", "ns", "key", "expect", "required")),
    # A write takes required only as true: its precondition always decides its transaction.
    "put": frozenset(("op", "ns", "key", "value", "expect", "required", *_LIFETIME)),
    # expect is refused with its own message: putIfAbsent's condition is "absent".
    "putIfAbsent": frozenset(("op", "ns", "key", "value", "expect", "required", *_LIFETIME)),
    "delete": frozenset(("op", "ns", "key", "expect", "required")),
    "incr": frozenset(("op", "ns", "key", "by", "max", "min", "expect", "required", *_LIFETIME)),
}
READ_OPS = frozenset(("get", "getMany", "getPrefix", "check"))
WRITE_OPS = frozenset(("put", "putIfAbsent", "delete", "incr"))
KV_OPS = READ_OPS | WRITE_OPS
LIFETIME_OPS = frozenset(("put", "putIfAbsent", "incr"))


def fail(code: str, message: str, index, **details) -> NoReturn:
    if index is not None:
        details["index"] = index
    raise BadRequest(code, message, details)


def check_fields(raw: dict, allowed: frozenset, index, what: str = "operation") -> None:
    """400 unknown_field naming the first field of raw that allowed does not have: a misspelt
    `expect` must never turn a compare-and-set into a blind write."""
    if not raw.keys() <= allowed:
        field = next(name for name in raw if name not in allowed)
        fail("unknown_field", f"unknown field {field!r} in this {what}; it takes {', '.join(sorted(allowed))}",
             index, field=field)


def text(raw, field: str, bytes_max: int, index) -> str:
    """A namespace or key: a name (queen/core/names.py) of 1 to bytes_max UTF-8 bytes; 400
    invalid_<field> otherwise."""
    if type(raw) is str and raw.isprintable() and 0 < (len(raw) if raw.isascii() else len(raw.encode())) <= bytes_max:
        return raw  # names.name's fast path, inline: a batch parses two names an operation
    return names.name(raw, field, f"invalid_{field}", bytes_max, index)


def integer(raw, code: str, field: str, index, low=INT64_MIN, high=INT64_MAX) -> int:
    if type(raw) is not int or not low <= raw <= high:
        fail(code, f"{field} must be an integer from {low} to {high}", index)
    return raw


def parse_lifetime(raw: dict, index, ttl_seconds_max: int) -> int:
    """ttlSeconds or forever:true, exactly one; returns ttl_ms (0 = forever)."""
    ttl = raw.get("ttlSeconds")
    forever = raw.get("forever")
    if forever is not None and forever is not False and forever is not True:
        fail("invalid_forever", "forever must be true or false", index)
    if ttl is None:
        if forever is not True:
            fail("ttl_required", "every write names its lifetime: ttlSeconds (integer >= 1) or forever: true", index)
        return 0
    if forever is True:
        fail("ttl_conflict", "give ttlSeconds or forever: true, not both", index)
    if type(ttl) is not int or not 1 <= ttl <= ttl_seconds_max:
        fail("invalid_ttl", f"ttlSeconds must be an integer from 1 to {ttl_seconds_max}", index)
    return ttl * 1000


def check_value(value, limits: Limits, index):
    """The value's size as JSON (byte strings in their JSON form) within the limit."""
    try:
        size = len(orjson.dumps(value, default=json_default))
    except TypeError:
        fail("invalid_value", "value must be representable as JSON (or hold byte strings)", index)
    if size > limits.value_bytes_max:
        fail("value_too_large", f"value is {size} bytes encoded; the limit is {limits.value_bytes_max}", index,
             bytes=size, limit=limits.value_bytes_max)


def parse_kv_op(raw, index, limits: Limits, allow_reserved: bool = False, values_checked: bool = False) -> KvOp:
    """values_checked: the caller knows every value is JSON-representable and within the size
    limit (a small JSON body), so measuring each value again is skipped."""
    if type(raw) is not dict:
        fail("invalid_operation", "each operation must be an object", index)
    name = raw.get("op")
    if type(name) is not str or name not in KV_OPS:
        fail("unknown_op", f"op must be one of {', '.join(sorted(KV_OPS))}", index, op=name)
    if not FIELDS[name].issuperset(raw):
        check_fields(raw, FIELDS[name], index)
    ns = text(raw.get("ns"), "ns", limits.ns_bytes_max, index)
    if name == "getMany":
        keys = raw.get("keys")
        if type(keys) is not list or not 1 <= len(keys) <= limits.page_items_max:
            fail("invalid_keys", f"keys must be a list of 1 to {limits.page_items_max} keys", index)
        op = KvOp(name, ns)
        op.keys = [text(k, "key", limits.key_bytes_max, index) for k in keys]
        return op
    if name == "getPrefix":
        op = KvOp(name, ns)
        prefix = raw.get("prefix", "")
        if type(prefix) is not str or len(prefix.encode()) > limits.key_bytes_max:
            fail("invalid_prefix", f"prefix must be a string of at most {limits.key_bytes_max} bytes", index)
        op.prefix = prefix
        op.cursor = decode_cursor(raw.get("cursor"), index)
        keys_only = raw.get("keysOnly", False)
        if keys_only is not True and keys_only is not False:
            fail("invalid_keys_only", "keysOnly must be true or false", index)
        op.keys_only = keys_only
        op.limit = integer(raw.get("limit", PAGE_ITEMS_DEFAULT), "invalid_limit", "limit", index, 1, limits.page_items_max)
        return op
    op = KvOp(name, ns, text(raw.get("key"), "key", limits.key_bytes_max, index))
    if name in WRITE_OPS and not allow_reserved and ns.startswith(RESERVED_NS_PREFIX):
        fail("reserved_namespace", f"namespaces starting {RESERVED_NS_PREFIX!r} are written only through their own routes", index, ns=ns)
    if name == "get":
        return op
    expect = raw.get("expect")
    if expect is not None:
        op.expect = integer(expect, "invalid_expect", "expect", index, 0, INT64_MAX)
    if name == "check":
        if expect is None:
            fail("invalid_expect", "check needs expect (0 means the key is absent)", index)
        required = raw.get("required", True)
        if required is not True and required is not False:
            fail("invalid_required", "required must be true or false", index)
        op.required = required
        return op
    if raw.get("required", True) is not True:
        fail("unsupported_field", "required: false is not supported on a write: its precondition (expect, "
             "putIfAbsent, incr bounds) always decides the transaction it is in", index, field="required")
    if name in LIFETIME_OPS:
        op.ttl_ms = parse_lifetime(raw, index, limits.kv_ttl_seconds_max)
    if name == "put" or name == "putIfAbsent":
        if "value" not in raw:
            fail("value_required", f"{name} needs a value", index)
        op.value = raw["value"]
        if not values_checked:
            check_value(op.value, limits, index)
        if name == "putIfAbsent" and expect is not None:
            fail("invalid_expect", "putIfAbsent takes no expect; it applies only when the key is absent", index)
    elif name == "incr":
        by = raw.get("by")
        op.by = integer(1 if by is None else by, "invalid_by", "by", index)
        if raw.get("max") is not None:
            op.max = integer(raw["max"], "invalid_max", "max", index)
        if raw.get("min") is not None:
            op.min = integer(raw["min"], "invalid_min", "min", index)
    return op


def encode_cursor(key: str) -> str:
    """A page cursor is the last key returned, opaque and URL-safe."""
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(raw, index=None) -> str | None:
    if raw is None or raw == "":
        return None
    if type(raw) is not str:
        fail("invalid_cursor", "cursor must be the string a previous page returned", index)
    try:
        return base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):
        fail("invalid_cursor", "cursor must be the string a previous page returned", index)


def parse_kv_ops(raw_ops, limits: Limits, allow_reserved: bool = False, values_checked: bool = False) -> list[KvOp]:
    if type(raw_ops) is not list or not raw_ops:
        raise BadRequest("invalid_operations", "operations must be a non-empty list")
    if len(raw_ops) > limits.ops_per_call_max:
        raise BadRequest("too_many_operations", f"at most {limits.ops_per_call_max} operations per call",
                         {"count": len(raw_ops), "limit": limits.ops_per_call_max})
    return [parse_kv_op(raw, i, limits, allow_reserved, values_checked) for i, raw in enumerate(raw_ops)]


# --------------------------------------------------------------------------------------------
# The state machine.


def _item(row: Row | None) -> dict:
    if row is None:
        return {"found": False, "value": None, "version": 0, "expiresAt": None}
    return {"found": True, "value": row.value, "version": row.version, "expiresAt": row.expires_at_ms or None}


def _missed(reason: str, row: Row | None) -> dict:
    """A write's miss: the reason, and the current row under `current`."""
    if row is None:
        return {"applied": False, "reason": reason, "current": {"value": None, "version": 0}}
    return {"applied": False, "reason": reason, "current": {"value": row.value, "version": row.version}}


def _check_reason(row: Row | None, expect: int | None) -> str:
    if row is None:
        return KvReason.ABSENT
    return KvReason.EXISTS if expect == 0 else KvReason.VERSION


class KvState:
    """The rows of one shard. `freed_permits` collects, in order, the lock permits (ns, key) that
    stopped existing by expiry (found by a read or by the wheel), for the lock table to hand on to
    waiters in the same step."""

    __slots__ = ("tables", "versions", "wheel", "freed_permits", "_unscheduled", "_apply", "usage")

    def __init__(self, versions: VersionCounter, now_ms: int, usage: UsageBook | None = None):
        self.usage = usage if usage is not None else UsageBook()  # every shard's one book
        self.tables: dict[str, Table] = {}
        self.versions = versions
        self.wheel = TimingWheel(now_ms)
        self.freed_permits: list[tuple[str, str]] = []
        # Rows written with a lifetime since the last tick, filed in the wheel at that tick: a row
        # deleted before then (a lock released soon after it was acquired) never touches the wheel.
        self._unscheduled: list[tuple[str, str]] = []
        self._apply = {
            "get": self._get, "getMany": self._get_many, "getPrefix": self._get_prefix,
            "check": self._check, "put": self._put, "putIfAbsent": self._put,
            "delete": self._delete, "incr": self._incr,
        }

    # -- row access --------------------------------------------------------------------------

    def live_row(self, ns: str, key: str, now_ms: int) -> Row | None:
        table = self.tables.get(ns)
        if table is None:
            return None
        row = table.rows.get(key)
        if row is not None and row.expires_at_ms and row.expires_at_ms <= now_ms:
            self._drop(table, ns, key)
            if is_locks_ns(ns):
                self.freed_permits.append((ns, key))
            return None
        return row

    def _store(self, ns: str, key: str, row: Row, records: list) -> None:
        table = self.tables.get(ns)
        if table is None:
            table = self.tables[ns] = Table(self.usage.for_name(ns))
        rows = table.rows
        old = rows.get(key)
        if old is None:
            table.note_insert(key)
        if table.usage is not None:  # a named tenant's row: its keys and bytes held follow
            _count(table.usage, key, old, row)
        rows[key] = row
        if row.expires_at_ms:
            self._unscheduled.append((ns, key))
        rec.put(records, ns, key, row.value, row.version, row.create_version, row.created_at_ms,
                row.updated_at_ms, row.expires_at_ms)

    def _drop(self, table: Table, ns: str, key: str) -> None:
        row = table.rows.pop(key)
        if table.usage is not None:
            _count(table.usage, key, row, None)
        table.note_remove(key)
        self.wheel.remove((ns, key))
        if not table.rows:
            del self.tables[ns]

    def write(self, ns: str, key: str, value, ttl_ms: int, old: Row | None, now_ms: int, records: list) -> Row:
        """Store a new version of (ns, key); `old` is its live row or None."""
        version = self.versions.next()
        expires_at_ms = now_ms + ttl_ms if ttl_ms else 0
        if old is None:
            row = Row(value, version, version, now_ms, now_ms, expires_at_ms)
        else:
            row = Row(value, version, old.create_version, old.created_at_ms, now_ms, expires_at_ms)
        self._store(ns, key, row, records)
        return row

    def delete(self, ns: str, key: str, records: list) -> int:
        """Remove a live row; the delete takes a version so the counter survives in the WAL."""
        version = self.versions.next()
        self._drop(self.tables[ns], ns, key)
        rec.delete(records, ns, key, version)
        return version

    # -- operations ----------------------------------------------------------------------------

    def apply(self, op: KvOp, now_ms: int, records: list) -> dict:
        return self._apply[op.op](op, now_ms, records)

    def precheck(self, op: KvOp, now_ms: int) -> dict | None:
        """For transactions: the miss answer this op would give now, or None if it would apply."""
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        row = self.live_row(op.ns, key, now_ms)
        name = op.op
        if name == "get":
            return None
        if name == "check":
            version = row.version if row is not None else 0
            if version != op.expect and op.required:
                return {"applied": False, "reason": _check_reason(row, op.expect), "version": version,
                        "value": row.value if row is not None else None}
            return None
        if name == "putIfAbsent":
            return _missed(KvReason.EXISTS, row) if row is not None else None
        if op.expect is not None and (row.version if row is not None else 0) != op.expect:
            return _missed(KvReason.VERSION, row)
        if name == "incr":
            return self._incr_miss(op, row)
        return None

    def _get(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        row = self.live_row(op.ns, key, now_ms)
        item = _item(row)
        item["key"] = key
        if row is not None:
            item["updatedAt"] = row.updated_at_ms
        return item

    def _get_many(self, op: KvOp, now_ms: int, records: list) -> dict:
        items = []
        for key in op.keys:
            item = _item(self.live_row(op.ns, key, now_ms))
            item["key"] = key
            items.append(item)
        return {"items": items}

    def _get_prefix(self, op: KvOp, now_ms: int, records: list) -> dict:
        """One shard's part of a page: up to limit+1 live items after the cursor, in key order."""
        table = self.tables.get(op.ns)
        items: list[dict] = []
        if table is None:
            return {"items": items}
        prefix = op.prefix
        start = op.cursor if op.cursor is not None and op.cursor >= prefix else prefix
        keys = table.sorted_keys()
        position = keys.bisect_right(start) if op.cursor is not None and start == op.cursor else keys.bisect_left(start)
        wanted = op.limit + 1  # one more tells the router whether another page exists
        expired = []
        for key in keys.islice(position):
            if not key.startswith(prefix):
                break
            row = table.rows[key]
            if row.expires_at_ms and row.expires_at_ms <= now_ms:
                expired.append(key)
                continue
            if op.keys_only:
                item = {"key": key, "version": row.version, "expiresAt": row.expires_at_ms or None}
            else:
                item = {"key": key, "value": row.value, "version": row.version, "expiresAt": row.expires_at_ms or None}
            if op.detail:
                item["createVersion"] = row.create_version
                item["createdAt"] = row.created_at_ms
                item["updatedAt"] = row.updated_at_ms
            items.append(item)
            if len(items) >= wanted:
                break
        for key in expired:
            self.live_row(op.ns, key, now_ms)  # drops it, and hands a lock permit on
        return {"items": items}

    def _check(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        row = self.live_row(op.ns, key, now_ms)
        version = row.version if row is not None else 0
        if version == op.expect:
            return {"applied": True, "version": version}
        return {"applied": False, "version": version, "reason": _check_reason(row, op.expect),
                "value": row.value if row is not None else None}

    def _put(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        row = self.live_row(op.ns, key, now_ms)
        if op.op == "putIfAbsent":
            if row is not None:
                return _missed(KvReason.EXISTS, row)
        elif op.expect is not None and (row.version if row is not None else 0) != op.expect:
            return _missed(KvReason.VERSION, row)
        new = self.write(op.ns, key, op.value, op.ttl_ms, row, now_ms, records)
        return {"applied": True, "version": new.version}

    def _delete(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        row = self.live_row(op.ns, key, now_ms)
        if row is None:
            return {"applied": False, "reason": KvReason.ABSENT}
        if op.expect is not None and row.version != op.expect:
            return _missed(KvReason.VERSION, row)
        return {"applied": True, "version": self.delete(op.ns, key, records)}

    def _incr_miss(self, op, row) -> dict | None:
        current = row.value if row is not None else 0
        if type(current) is not int:
            return _missed(KvReason.NOT_INTEGER, row)
        value = current + op.by
        if ((op.max is not None and value > op.max) or (op.min is not None and value < op.min)
                or not INT64_MIN <= value <= INT64_MAX):
            return {"applied": False, "reason": KvReason.LIMIT, "value": current, "version": row.version if row else 0}
        return None

    def _incr(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        row = self.live_row(op.ns, key, now_ms)
        if op.expect is not None and (row.version if row is not None else 0) != op.expect:
            return _missed(KvReason.VERSION, row)
        miss = self._incr_miss(op, row)
        if miss is not None:
            return miss
        value = (row.value if row is not None else 0) + op.by
        new = self.write(op.ns, key, value, op.ttl_ms, row, now_ms, records)
        return {"applied": True, "value": value, "version": new.version}

    # -- time, recovery and snapshots ---------------------------------------------------------------

    def expire(self, now_ms: int) -> None:
        """Free the rows whose lifetime has passed. Writes nothing to the WAL: expiry is a function
        of the stored expires_at_ms, so replay reaches the same state."""
        wheel = self.wheel
        if self._unscheduled:
            unscheduled, self._unscheduled = self._unscheduled, []
            for item in unscheduled:
                table = self.tables.get(item[0])
                row = table.rows.get(item[1]) if table is not None else None
                if row is not None and row.expires_at_ms:
                    wheel.schedule(item, row.expires_at_ms)
        for item in wheel.advance(now_ms):
            ns, key = item
            table = self.tables.get(ns)
            row = table.rows.get(key) if table is not None else None
            if row is None or not row.expires_at_ms:
                continue  # deleted, or rewritten to live forever
            if row.expires_at_ms > now_ms:
                wheel.add(item, row.expires_at_ms)  # rewritten with a later expiry (see schedule)
                continue
            self.live_row(ns, key, now_ms)

    def replay(self, record) -> None:
        """Re-apply one typed record (queen/core/records.py) from the WAL or a snapshot."""
        if type(record) is rec.Put:
            ns, key = record.ns, record.key
            table = self.tables.get(ns)
            if table is None:
                table = self.tables[ns] = Table(self.usage.for_name(ns))
            old = table.rows.get(key)
            if old is None:
                table.note_insert(key)
            row = table.rows[key] = Row(record.value, record.version, record.create_version, record.created_at_ms,
                                        record.updated_at_ms, record.expires_at_ms)
            if table.usage is not None:
                _count(table.usage, key, old, row)
            if record.expires_at_ms:
                self.wheel.schedule((ns, key), record.expires_at_ms)
        elif type(record) is rec.Delete:
            table = self.tables.get(record.ns)
            if table is not None and record.key in table.rows:
                self._drop(table, record.ns, record.key)
        else:
            raise ValueError(f"not a KV record: {record!r}")

    def snapshot_copy(self) -> list:
        """A consistent copy of every row, cheap to take: rows are immutable, so shallow copies do."""
        return [(ns, dict(table.rows)) for ns, table in self.tables.items()]

    def row_count(self) -> int:
        return sum(len(t.rows) for t in self.tables.values())


def _count(usage: Usage, key: str, old: Row | None, new: Row | None) -> None:
    """A row of a named tenant replaced: its keys and bytes (key and value as JSON) follow."""
    if old is None:
        usage.keys += 1
    else:
        usage.bytes -= len(key) + _json_size(old.value)
    if new is None:
        usage.keys -= 1
    else:
        usage.bytes += len(key) + _json_size(new.value)


def _json_size(value) -> int:
    """Bytes of value as JSON; a plain ASCII string (a lock's owner) without encoding it."""
    if type(value) is str and value.isalnum() and value.isascii():
        return len(value) + 2
    return len(orjson.dumps(value, default=json_default))


def snapshot_records(copies: list, kv: list, locks: list) -> None:
    """Append a put record per row of snapshot_copy()'s copies: lock permits to `locks`, every
    other row to `kv`."""
    put = rec.put
    for ns, rows in copies:
        out = locks if is_locks_ns(ns) else kv
        for key, r in rows.items():
            put(out, ns, key, r.value, r.version, r.create_version, r.created_at_ms, r.updated_at_ms, r.expires_at_ms)
