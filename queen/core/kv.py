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
import struct
from typing import NamedTuple, NoReturn

import orjson
from orjson import Fragment

from queen.core import names
from queen.core import records as rec
from queen.core.limits import INT64_MAX, INT64_MIN, Limits
from queen.core.outcomes import KvReason
from queen.core.sorted_keys import SortedKeys
from queen.core.tenants import SEPARATOR, Usage, UsageBook
from queen.core.values import decode_json_bytes, json_default
from queen.core.wheel import TimingWheel
from queen.errors import BadRequest

RESERVED_NS_PREFIX = "queen-"
LOCKS_NS = "queen-locks"  # as a tenant names it; each tenant's is its own (queen/core/tenants.py)
_LOCKS_NS_OF_A_TENANT = SEPARATOR + LOCKS_NS


def is_locks_ns(ns: str) -> bool:
    """Whether a stored namespace holds lock permits: the default tenant's or another's."""
    return ns == LOCKS_NS or ns.endswith(_LOCKS_NS_OF_A_TENANT)


def permit_json(owner: object) -> bytes:
    """What a lock permit's row holds, as stored: its owner (None when the acquire named none) in
    the object `{"owner": ...}`, so a client that reads the row (a failed guard's current value, a
    KV get) finds `value.owner`. The log keeps the owner alone (a permit's put carries it as its
    value, as every build wrote it); a write and replay alike store this encoding of it, so two
    permits have the same owner exactly when their stored values are equal bytes: the lock table
    compares owners without decoding."""
    return orjson.dumps({"owner": owner})


NO_OWNER_JSON = permit_json(None)


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


# A stored row is one bytes value: this head (version, create_version, created_at_ms,
# updated_at_ms, expires_at_ms; 0 means forever), then the value's JSON (byte strings in their
# JSON form, queen/core/values.py). Why bytes: a store may hold millions of rows, and CPython's
# cyclic GC walks every object it tracks on each full collection; as objects (with their values as
# dicts and lists) rows cost a 5-million-key store pauses of seconds. A dict of bytes is never
# tracked, so rows cost the collector nothing however many there are; what a key's usage counts
# (its value's JSON size) is the packed length, read without encoding anything.
# Rows are immutable: a write stores new bytes, so a shallow copy of a table is a snapshot.
_HEAD = struct.Struct("<qqqqq")
HEAD_BYTES = _HEAD.size
_head_of = _HEAD.unpack_from
_pack_head = _HEAD.pack
_EXPIRES_AT = 32
_expires_of = struct.Struct("<q").unpack_from
_loads = orjson.loads
_dumps = orjson.dumps
_BYTES_MARKER = b'"$bytes"'  # what queen/core/values.py's may_hold_bytes looks for


def encode_value(value) -> bytes:
    return _dumps(value, default=json_default)


def decode_value(packed: bytes):
    """A packed row's value. Lossless: no stored value holds a {"$bytes": ...} object, so every
    one in the JSON is a byte string."""
    raw = packed[HEAD_BYTES:]
    value = _loads(raw)
    return decode_json_bytes(value) if _BYTES_MARKER in raw else value


def shown_value(packed: bytes):
    """A packed row's value as an answer shows it: its stored JSON as it is, an orjson.Fragment that
    the answer's encoding splices in (byte strings are already in their JSON form there), so a read
    decodes nothing. A CBOR answer decodes it (queen/http/codec.py)."""
    return Fragment(packed[HEAD_BYTES:])


def value_of(shown):
    """The value behind what a read answered (shown_value's Fragment), for the server's own readers."""
    if type(shown) is not Fragment:
        return shown
    raw = _dumps(shown)
    value = _loads(raw)
    return decode_json_bytes(value) if _BYTES_MARKER in raw else value


# A packed row read out, for callers that want every field (lock permits). expires_at_ms 0 means
# forever. The call form, not a class body: mypyc's build of a NamedTuple class looks its field
# annotations up as names in the module and finds no `object` there.
Row = NamedTuple("Row", [  # noqa: UP014
    ("value", object), ("version", int), ("create_version", int), ("created_at_ms", int), ("updated_at_ms", int),
    ("expires_at_ms", int)])


def unpack_row(packed: bytes | None) -> Row | None:
    if packed is None:
        return None
    version, create_version, created_at_ms, updated_at_ms, expires_at_ms = _head_of(packed)
    return Row(decode_value(packed), version, create_version, created_at_ms, updated_at_ms, expires_at_ms)


def wheel_item(ns: str, key: str) -> str:
    """A row's entry in the TTL wheel: one string (a tuple would make the wheel's dicts tracked).
    No name holds a control character (queen/core/names.py), so the NUL splits it back."""
    return ns + "\0" + key


class Table:
    """The rows of one namespace on one shard, with their keys in order for prefix pages.

    The order is kept lazily: inserts and removals are noted in two small dicts (not sets: a dict of
    strings is untracked by the GC, a set never is) and folded into the sorted index only when a page
    is read, so a key written and deleted between two pages (a lock acquired and released) never
    touches the index. When the notes outgrow a quarter of the index, it is dropped and rebuilt
    from the rows at the next page instead."""

    __slots__ = ("rows", "_sorted", "_added", "_removed", "usage")

    def __init__(self, usage: Usage | None = None):
        self.usage = usage  # its tenant's (keys and bytes held); None for the default tenant's
        self.rows: dict[str, bytes] = {}  # key -> packed row
        self._sorted: SortedKeys | None = SortedKeys()
        self._added: dict[str, None] = {}
        self._removed: dict[str, None] = {}

    def note_insert(self, key: str) -> None:
        """key was just added to rows."""
        if self._sorted is None:
            return
        if key in self._removed:
            del self._removed[key]
        else:
            self._added[key] = None
            self._check_notes()

    def note_remove(self, key: str) -> None:
        """key was just removed from rows."""
        if self._sorted is None:
            return
        if key in self._added:
            del self._added[key]
        else:
            self._removed[key] = None
            self._check_notes()

    def _check_notes(self) -> None:
        assert self._sorted is not None  # only called while the index is kept
        if len(self._added) + len(self._removed) > 64 + len(self._sorted) // 4:
            self._sorted = None
            self._added.clear()
            self._removed.clear()

    def sorted_keys(self) -> SortedKeys:
        if self._sorted is None:
            self._sorted = SortedKeys(self.rows)
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


def _item(packed: bytes | None) -> dict:
    if packed is None:
        return {"found": False, "value": None, "version": 0, "expiresAt": None}
    version, _, _, _, expires_at_ms = _head_of(packed)
    return {"found": True, "value": shown_value(packed), "version": version, "expiresAt": expires_at_ms or None}


def _missed(reason: str, packed: bytes | None) -> dict:
    """A write's miss: the reason, and the current row under `current`."""
    if packed is None:
        return {"applied": False, "reason": reason, "current": {"value": None, "version": 0}}
    return {"applied": False, "reason": reason, "current": {"value": decode_value(packed), "version": _version(packed)}}


def _version(packed: bytes | None) -> int:
    """A packed row's version; 0 for no row (what expect compares with)."""
    return 0 if packed is None else _head_of(packed)[0]


def _check_reason(packed: bytes | None, expect: int | None) -> str:
    if packed is None:
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
        self.wheel = TimingWheel(now_ms)  # wheel_item(ns, key) -> expires_at_ms
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

    def live_row(self, ns: str, key: str, now_ms: int) -> bytes | None:
        """The packed row of (ns, key), or None when it is absent or its lifetime has passed."""
        table = self.tables.get(ns)
        if table is None:
            return None
        packed = table.rows.get(key)
        if packed is not None:
            expires_at_ms = _expires_of(packed, _EXPIRES_AT)[0]
            if expires_at_ms and expires_at_ms <= now_ms:
                self._drop(table, ns, key)
                if is_locks_ns(ns):
                    self.freed_permits.append((ns, key))
                return None
        return packed

    def live_view(self, ns: str, key: str, now_ms: int) -> Row | None:
        """live_row read out into its fields."""
        return unpack_row(self.live_row(ns, key, now_ms))

    def live_permit(self, ns: str, key: str, now_ms: int) -> Row | None:
        """live_row read out into its fields, its value left as the stored JSON (bytes): a lock
        permit's, compared as bytes (permit_json) and decoded only to be shown."""
        packed = self.live_row(ns, key, now_ms)
        if packed is None:
            return None
        version, create_version, created_at_ms, updated_at_ms, expires_at_ms = _head_of(packed)
        return Row(packed[HEAD_BYTES:], version, create_version, created_at_ms, updated_at_ms, expires_at_ms)

    def _store(self, ns: str, key: str, packed: bytes, expires_at_ms: int) -> None:
        table = self.tables.get(ns)
        if table is None:
            table = self.tables[ns] = Table(self.usage.for_name(ns))
        rows = table.rows
        old = rows.get(key)
        if old is None:
            table.note_insert(key)
        if table.usage is not None:  # a named tenant's row: its keys and bytes held follow
            _count(table.usage, key, old, packed)
        rows[key] = packed
        if expires_at_ms:
            self._unscheduled.append((ns, key))

    def _drop(self, table: Table, ns: str, key: str) -> None:
        packed = table.rows.pop(key)
        if table.usage is not None:
            _count(table.usage, key, packed, None)
        table.note_remove(key)
        self.wheel.remove(wheel_item(ns, key))
        if not table.rows:
            del self.tables[ns]

    def _write(self, ns: str, key: str, value: object, ttl_ms: int, old: bytes | None, now_ms: int,
               records: list) -> int:
        """Store a new version of (ns, key); `old` is its live packed row or None. Returns the new
        version. The head's fields are passed one by one, not as a tuple spread with *: in the
        compiled build (queen/_native.py) a spread builds a list and a tuple per call."""
        version = self.versions.next()
        if old is None:
            self._store_version(ns, key, value, ttl_ms, version, version, now_ms, now_ms, records)
        else:
            _, create_version, created_at_ms, _, _ = _head_of(old)
            self._store_version(ns, key, value, ttl_ms, version, create_version, created_at_ms, now_ms, records)
        return version

    def write(self, ns: str, key: str, logged: object, encoded: bytes, ttl_ms: int, old: Row | None, now_ms: int,
              records: list) -> Row:
        """Store a new version of (ns, key): its stored JSON `encoded` (the caller built it once),
        `logged` what its put record carries (for a lock permit, its owner: see permit_json); `old`
        is its live row (as live_view or live_permit read it) or None. The row answered holds
        `encoded`, as live_permit reads it."""
        version = self.versions.next()
        create_version = version if old is None else old.create_version
        created_at_ms = now_ms if old is None else old.created_at_ms
        expires_at_ms = self._store_version(ns, key, logged, ttl_ms, version, create_version, created_at_ms, now_ms,
                                            records, encoded)
        return Row(encoded, version, create_version, created_at_ms, now_ms, expires_at_ms)

    def _store_version(self, ns: str, key: str, value: object, ttl_ms: int, version: int, create_version: int,
             created_at_ms: int, now_ms: int, records: list, encoded: bytes | None = None) -> int:
        """Pack, store and log one row's new version (encoded: its stored JSON, when the caller has
        it; value is then what the put record carries); its expiry (0: none)."""
        expires_at_ms = now_ms + ttl_ms if ttl_ms else 0
        if encoded is None:
            encoded = _dumps(value, default=json_default)
        self._store(ns, key, _pack_head(version, create_version, created_at_ms, now_ms, expires_at_ms) + encoded,
                    expires_at_ms)
        rec.put(records, ns, key, value, version, create_version, created_at_ms, now_ms, expires_at_ms)
        return expires_at_ms

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
        packed = self.live_row(op.ns, key, now_ms)
        name = op.op
        if name == "get":
            return None
        if name == "check":
            version = _version(packed)
            if version != op.expect and op.required:
                return {"applied": False, "reason": _check_reason(packed, op.expect), "version": version,
                        "value": decode_value(packed) if packed is not None else None}
            return None
        if name == "putIfAbsent":
            return _missed(KvReason.EXISTS, packed) if packed is not None else None
        if op.expect is not None and _version(packed) != op.expect:
            return _missed(KvReason.VERSION, packed)
        if name == "incr":
            return self._incr_miss(op, packed)
        return None

    def _get(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        packed = self.live_row(op.ns, key, now_ms)
        if packed is None:
            return {"found": False, "value": None, "version": 0, "expiresAt": None, "key": key}
        version, _, _, updated_at_ms, expires_at_ms = _head_of(packed)
        return {"found": True, "value": shown_value(packed), "version": version, "expiresAt": expires_at_ms or None,
                "key": key, "updatedAt": updated_at_ms}

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
        keys = table.sorted_keys().iter_from(start, after=op.cursor is not None and start == op.cursor)
        wanted = op.limit + 1  # one more tells the router whether another page exists
        expired = []
        rows = table.rows
        for key in keys:
            if not key.startswith(prefix):
                break
            packed = rows[key]
            version, create_version, created_at_ms, updated_at_ms, expires_at_ms = _head_of(packed)
            if expires_at_ms and expires_at_ms <= now_ms:
                expired.append(key)
                continue
            if op.keys_only:
                item = {"key": key, "version": version, "expiresAt": expires_at_ms or None}
            else:
                item = {"key": key, "value": shown_value(packed), "version": version, "expiresAt": expires_at_ms or None}
            if op.detail:
                item["createVersion"] = create_version
                item["createdAt"] = created_at_ms
                item["updatedAt"] = updated_at_ms
            items.append(item)
            if len(items) >= wanted:
                break
        for key in expired:
            self.live_row(op.ns, key, now_ms)  # drops it, and hands a lock permit on
        return {"items": items}

    def _check(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        packed = self.live_row(op.ns, key, now_ms)
        version = _version(packed)
        if version == op.expect:
            return {"applied": True, "version": version}
        return {"applied": False, "version": version, "reason": _check_reason(packed, op.expect),
                "value": decode_value(packed) if packed is not None else None}

    def _put(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        packed = self.live_row(op.ns, key, now_ms)
        if op.op == "putIfAbsent":
            if packed is not None:
                return _missed(KvReason.EXISTS, packed)
        elif op.expect is not None and _version(packed) != op.expect:
            return _missed(KvReason.VERSION, packed)
        return {"applied": True, "version": self._write(op.ns, key, op.value, op.ttl_ms, packed, now_ms, records)}

    def _delete(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        packed = self.live_row(op.ns, key, now_ms)
        if packed is None:
            return {"applied": False, "reason": KvReason.ABSENT}
        if op.expect is not None and _version(packed) != op.expect:
            return _missed(KvReason.VERSION, packed)
        return {"applied": True, "version": self.delete(op.ns, key, records)}

    def _incr_miss(self, op, packed) -> dict | None:
        current = decode_value(packed) if packed is not None else 0
        if type(current) is not int:
            return _missed(KvReason.NOT_INTEGER, packed)
        value = current + op.by
        if ((op.max is not None and value > op.max) or (op.min is not None and value < op.min)
                or not INT64_MIN <= value <= INT64_MAX):
            return {"applied": False, "reason": KvReason.LIMIT, "value": current, "version": _version(packed)}
        return None

    def _incr(self, op: KvOp, now_ms: int, records: list) -> dict:
        key = op.key
        assert key is not None  # every op but getMany and getPrefix names one key
        packed = self.live_row(op.ns, key, now_ms)
        if op.expect is not None and _version(packed) != op.expect:
            return _missed(KvReason.VERSION, packed)
        miss = self._incr_miss(op, packed)
        if miss is not None:
            return miss
        value = (decode_value(packed) if packed is not None else 0) + op.by
        version = self._write(op.ns, key, value, op.ttl_ms, packed, now_ms, records)
        return {"applied": True, "value": value, "version": version}

    # -- time, recovery and snapshots ---------------------------------------------------------------

    def expire(self, now_ms: int) -> None:
        """Free the rows whose lifetime has passed. Writes nothing to the WAL: expiry is a function
        of the stored expires_at_ms, so replay reaches the same state."""
        wheel = self.wheel
        if self._unscheduled:
            unscheduled, self._unscheduled = self._unscheduled, []
            for ns, key in unscheduled:
                table = self.tables.get(ns)
                packed = table.rows.get(key) if table is not None else None
                if packed is not None:
                    expires_at_ms = _expires_of(packed, _EXPIRES_AT)[0]
                    if expires_at_ms:
                        wheel.schedule(wheel_item(ns, key), expires_at_ms)
        for item in wheel.advance(now_ms):
            ns, _, key = item.partition("\0")
            table = self.tables.get(ns)
            packed = table.rows.get(key) if table is not None else None
            if packed is None:
                continue  # deleted
            expires_at_ms = _expires_of(packed, _EXPIRES_AT)[0]
            if not expires_at_ms:
                continue  # rewritten to live forever
            if expires_at_ms > now_ms:
                wheel.add(item, expires_at_ms)  # rewritten with a later expiry (see schedule)
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
            # A permit's put carries its owner; its row holds the owner's object (permit_json).
            encoded = permit_json(record.value) if is_locks_ns(ns) else _dumps(record.value, default=json_default)
            packed = table.rows[key] = _pack_head(*record[3:]) + encoded
            if table.usage is not None:
                _count(table.usage, key, old, packed)
            if record.expires_at_ms:
                self.wheel.schedule(wheel_item(ns, key), record.expires_at_ms)
        elif type(record) is rec.Delete:
            table = self.tables.get(record.ns)
            if table is not None and record.key in table.rows:
                self._drop(table, record.ns, record.key)
        else:
            raise ValueError(f"not a KV record: {record!r}")

    def snapshot_copy(self) -> list:
        """A consistent copy of every row, cheap to take: rows are immutable bytes, so shallow copies do."""
        return [(ns, dict(table.rows)) for ns, table in self.tables.items()]

    def row_count(self) -> int:
        return sum(len(t.rows) for t in self.tables.values())


def _count(usage: Usage, key: str, old: bytes | None, new: bytes | None) -> None:
    """A row of a named tenant replaced: its keys and bytes (key and value as JSON) follow. A packed
    row holds its value's JSON after the head, so the size is its length."""
    if old is None:
        usage.keys += 1
    else:
        usage.bytes -= len(key) + len(old) - HEAD_BYTES
    if new is None:
        usage.keys -= 1
    else:
        usage.bytes += len(key) + len(new) - HEAD_BYTES


def snapshot_records(copies: list, kv: list, locks: list) -> None:
    """Append a put record per row of snapshot_copy()'s copies: lock permits to `locks` (each
    carrying its owner, as the log does), every other row to `kv`."""
    put = rec.put
    for ns, rows in copies:
        if is_locks_ns(ns):
            for key, packed in rows.items():
                put(locks, ns, key, _loads(packed[HEAD_BYTES:])["owner"], *_head_of(packed))
            continue
        for key, packed in rows.items():
            put(kv, ns, key, decode_value(packed), *_head_of(packed))
