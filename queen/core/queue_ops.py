"""Queue requests from their wire form: configure, push, pop, ack, lease extend and release, DLQ
requeue, and the listings' parameters. Everything is checked here, before anything is applied: a
request that breaks a rule is refused whole with a 400 and a snake_case code.

These parse our own spellings only: another client's dialect is mapped to them in the HTTP layer
before it gets here.

Pure: no I/O, no clock. Raises BadRequest.
"""

from __future__ import annotations

import base64
import binascii
import difflib
from typing import Any

import orjson

from queen.core.kv import check_fields, fail
from queen.core.limits import INT64_MAX, Limits
from queen.core.names import name
from queen.core.values import json_default
from queen.errors import BadRequest

DEFAULT_PARTITION = "Default"
QUEUE_MODE_GROUP = "__QUEUE_MODE__"
RESERVED_QUEUE_PREFIX = "queen-"
GENERATED_ID_PREFIX = "queen:"
STATUSES = ("completed", "failed", "dlq")
MODES = ("all", "new")

# name -> (default, low, high); dlqAfterMaxRetries is a boolean (no bounds). The default is typed
# Any, not inferred: compiled, an int-typed default is unboxed to a machine integer and True comes
# back out as 1, which the answers then showed as `"dlqAfterMaxRetries": 1`.
OPTIONS: dict[str, tuple[Any, int | None, int | None]] = {
    "leaseTimeSeconds": (300, 1, 86_400),
    "retryLimit": (3, 0, 1_000),
    "dlqAfterMaxRetries": (True, None, None),
    # A delivery that ended without completion holds its message back retryDelayMs, doubled for
    # each earlier one, at most retryDelayMaxMs (0: redelivered at once).
    "retryDelayMs": (0, 0, 86_400_000),
    "retryDelayMaxMs": (300_000, 1, 86_400_000),
    "delayedProcessingSeconds": (0, 0, 604_800),
    "retentionSeconds": (0, 0, 31_536_000),
    "completedRetentionSeconds": (0, 0, 31_536_000),
    "dedupWindowSeconds": (900, 1, 604_800),
    "maxSize": (1_000_000, 0, 100_000_000),
}
DEFAULT_OPTIONS: dict[str, Any] = {name: spec[0] for name, spec in OPTIONS.items()}


def queue_name(raw, limits: Limits, index=None) -> str:
    queue = name(raw, "queue", "invalid_queue", limits.queue_name_bytes_max, index)
    if queue.startswith(RESERVED_QUEUE_PREFIX):
        fail("reserved_queue", f"queue names starting {RESERVED_QUEUE_PREFIX!r} are the server's", index, queue=queue)
    return queue


def group_name(raw, limits: Limits, index=None) -> str:
    if raw is None:
        return QUEUE_MODE_GROUP
    group = name(raw, "consumerGroup", "invalid_consumer_group", limits.group_name_bytes_max, index)
    if group.startswith("__") and group != QUEUE_MODE_GROUP:
        fail("reserved_consumer_group", f"group names starting '__' are reserved (but {QUEUE_MODE_GROUP})", index)
    return group


def producer_id(raw, limits: Limits, index=None) -> str | None:
    """A producer's transactionId (None when absent)."""
    if raw is None:
        return None
    tid = name(raw, "transactionId", "invalid_transaction_id", limits.transaction_id_bytes_max, index)
    if tid.startswith(GENERATED_ID_PREFIX):
        fail("reserved_transaction_id", f"transactionIds starting {GENERATED_ID_PREFIX!r} are the server's", index)
    return tid


# The longest decimal number any parameter may be written with: INT64_MAX has 19 digits. The length
# is checked before int() reads a number: int() of a long digit string takes time quadratic in its
# length, and past 4,300 digits Python refuses it with a ValueError (which would answer 500).
NUMBER_DIGITS_MAX = 19


def whole_number(raw: str, field: str, code: str, low: int = 0, high: int = INT64_MAX) -> int:
    """A whole number written in decimal in a query string or a path (ASCII digits, at most
    NUMBER_DIGITS_MAX of them), from low to high; 400 `code` otherwise."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= NUMBER_DIGITS_MAX) or not low <= int(raw) <= high:
        raise BadRequest(code, f"{field} must be a whole number from {low} to {high}", {"field": field})
    return int(raw)


def query_number(params: dict, field: str, code: str, default: int, low: int = 0, high: int = INT64_MAX) -> int:
    """The query parameter `field` as a whole_number, or default when it is absent."""
    raw = params.get(field)
    return default if raw is None else whole_number(raw, field, code, low, high)


def identifier(raw, code: str, field: str, index=None) -> int:
    """An id (partitionId, leaseId): a positive integer, or its decimal string."""
    if type(raw) is str and raw.isascii() and raw.isdigit() and len(raw) <= NUMBER_DIGITS_MAX:
        raw = int(raw)
    if type(raw) is not int or not 1 <= raw <= INT64_MAX:
        fail(code, f"{field} must be a positive integer (the id an earlier answer gave)", index)
    return raw


# -- configure --------------------------------------------------------------------------------------

def parse_configure(document, limits: Limits) -> tuple[str, dict]:
    """(queue, {canonical option: value}) of a configure call."""
    if type(document) is not dict:
        raise BadRequest("invalid_body", 'the body must be an object: {"queue": ..., "options": {...}}')
    check_fields(document, frozenset(("queue", "options")), None, "body")
    queue = queue_name(document.get("queue"), limits)
    raw = document.get("options")
    if raw is None:
        return queue, {}
    if type(raw) is not dict:
        raise BadRequest("invalid_option", "options must be an object")
    changes = {}
    for option, value in raw.items():
        if value is None:
            continue
        if option not in OPTIONS:
            close = difflib.get_close_matches(option, OPTIONS, 1) if type(option) is str else []
            hint = f"; did you mean {close[0]!r}?" if close else f"; the options are {', '.join(sorted(OPTIONS))}"
            raise BadRequest("unknown_option", f"unknown option {option!r}{hint}",
                             {"option": option, "supported": sorted(OPTIONS)})
        _, low, high = OPTIONS[option]
        if low is None:
            if type(value) is not bool:
                raise BadRequest("invalid_option", f"{option} must be true or false", {"option": option})
        elif type(value) is not int or high is None or not low <= value <= high:
            raise BadRequest("invalid_option", f"{option} must be an integer from {low} to {high}",
                             {"option": option, "min": low, "max": high})
        changes[option] = value
    return queue, changes


# -- push -------------------------------------------------------------------------------------------

class PushItem:
    __slots__ = ("index", "queue", "partition", "payload", "transaction_id", "trace_id", "size")

    def __init__(self, index, queue, partition, payload, transaction_id, trace_id, size):
        self.index = index
        self.queue = queue
        self.partition = partition
        self.payload = payload  # its JSON encoding (bytes)
        self.transaction_id = transaction_id
        self.trace_id = trace_id
        self.size = size  # len(payload): what it costs to keep and deliver


_PUSH_FIELDS = frozenset(("items",))
_ITEM_FIELDS = frozenset(("queue", "partition", "payload", "transactionId", "traceId"))


def parse_push(document, limits: Limits, section: str | None = None) -> list[PushItem]:
    if section is None:
        if type(document) is not dict:
            raise BadRequest("invalid_body", 'the body must be an object: {"items": [...]}')
        check_fields(document, _PUSH_FIELDS, None, "body")
        raw_items = document.get("items")
    else:
        raw_items = document
    if type(raw_items) is not list or not raw_items:
        raise BadRequest("invalid_items", "items must be a non-empty list", _where(section))
    if len(raw_items) > limits.ops_per_call_max:
        raise BadRequest("too_many_items", f"at most {limits.ops_per_call_max} items per call",
                         {"count": len(raw_items), "limit": limits.ops_per_call_max, **_where(section)})
    return [parse_push_item(raw, index, limits, section) for index, raw in enumerate(raw_items)]


def parse_push_item(raw, index: int, limits: Limits, section: str | None = None) -> PushItem:
    try:
        if type(raw) is not dict:
            fail("invalid_items", "each item must be an object", index)
        if not _ITEM_FIELDS.issuperset(raw):
            check_fields(raw, _ITEM_FIELDS, index, "item")
        queue = queue_name(raw.get("queue"), limits, index)
        partition = raw.get("partition")
        partition = DEFAULT_PARTITION if partition is None else name(
            partition, "partition", "invalid_partition", limits.partition_name_bytes_max, index)
        if "payload" not in raw:
            fail("payload_required", "each item needs a payload (null is a payload)", index)
        payload = encode_payload(raw["payload"], limits, index)
        transaction_id = producer_id(raw.get("transactionId"), limits, index)
        trace = raw.get("traceId")
        if trace is not None and (type(trace) is not str or len(trace.encode()) > limits.trace_id_bytes_max):
            fail("invalid_trace_id", f"traceId must be a string of at most {limits.trace_id_bytes_max} bytes", index)
    except BadRequest as error:
        error.details.update(_where(section))
        raise
    return PushItem(index, queue, partition, payload, transaction_id, trace, len(payload))


def encode_payload(payload, limits: Limits, index) -> bytes:
    """The payload's JSON encoding: what a queue keeps, logs and delivers (byte strings in their
    JSON form, turned back into bytes for a CBOR client)."""
    try:
        encoded = orjson.dumps(payload, default=json_default)
    except TypeError:
        fail("invalid_items", "payload must be representable as JSON (or hold byte strings)", index)
    if len(encoded) > limits.value_bytes_max:
        fail("payload_too_large", f"payload is {len(encoded)} bytes encoded; the limit is {limits.value_bytes_max}",
             index, bytes=len(encoded), limit=limits.value_bytes_max)
    return encoded


def _where(section: str | None) -> dict:
    return {"section": section} if section is not None else {}


# -- pop ----------------------------------------------------------------------------------------------

class PopOp:
    __slots__ = ("queue", "partition", "group", "batch", "partitions", "wait_ms", "auto_ack", "mode", "after")

    def __init__(self, queue, partition, group, batch, partitions, wait_ms, auto_ack, mode, after=False):
        self.queue = queue
        self.partition = partition  # None: any partition (the wildcard route)
        self.group = group
        self.batch = batch
        self.partitions = partitions
        self.wait_ms = wait_ms
        self.auto_ack = auto_ack
        self.mode = mode
        # A `next` pop, applied in the step of the ack or transaction it rides: the parked pops
        # that step made deliverable are served first, as they would be before any later pop.
        self.after = after


_POP_PARAMS = frozenset(("batch", "partitions", "waitMs", "consumerGroup", "autoAck", "subscriptionMode"))


def _flag(params: dict, field: str, code: str) -> bool:
    raw = params.get(field)
    if raw is None:
        return False
    if raw not in ("true", "false"):
        raise BadRequest(code, f"{field} must be true or false")
    return raw == "true"


def parse_pop(queue_raw: str, partition_raw: str | None, params: dict, limits: Limits) -> PopOp:
    for field in params:
        if field not in _POP_PARAMS:
            raise BadRequest("unknown_field", f"unknown parameter {field!r}; pop takes {', '.join(sorted(_POP_PARAMS))}",
                             {"field": field})
    queue = queue_name(queue_raw, limits)
    partition = None if partition_raw is None else name(partition_raw, "partition", "invalid_partition",
                                                        limits.partition_name_bytes_max)
    batch = query_number(params, "batch", "invalid_batch", 1, 1, limits.pop_batch_max)
    partitions = query_number(params, "partitions", "invalid_partitions", 1, 1, limits.pop_partitions_max)
    wait_ms = query_number(params, "waitMs", "invalid_wait_ms", 0, 0, limits.wait_ms_max)
    group = group_name(params.get("consumerGroup"), limits)
    auto_ack = _flag(params, "autoAck", "invalid_auto_ack")
    mode = params.get("subscriptionMode", "all")
    if mode not in MODES:
        raise BadRequest("invalid_subscription_mode", "subscriptionMode must be all or new")
    return PopOp(queue, partition, group, batch, partitions, wait_ms, auto_ack, mode)


# -- next: the pop an ack or a transaction asks for -------------------------------------------------

_NEXT_FIELDS = frozenset(("queue", "partition", "consumerGroup", "batch", "partitions", "waitMs", "subscriptionMode"))


def take_next(document) -> object:
    """The `next` field of an ack or transaction body, taken out of it (None when absent), so the
    rest is parsed exactly as a body without it."""
    if type(document) is dict and "next" in document:
        return document.pop("next")
    return None


def parse_next(raw, limits: Limits) -> PopOp:
    """`next`: {queue?, partition?, consumerGroup?, batch?, partitions?, waitMs?, subscriptionMode?},
    checked as the pop route checks its parameters. queue and group stay None when not given (the
    caller fills them from the acked message)."""
    if type(raw) is not dict:
        raise BadRequest("invalid_next", 'next must be an object: {"queue": ..., "batch": N, "waitMs": W}')
    try:
        check_fields(raw, _NEXT_FIELDS, None, "next")
    except BadRequest as error:
        error.details["section"] = "next"
        raise
    queue = raw.get("queue")
    queue = None if queue is None else queue_name(queue, limits)
    partition = raw.get("partition")
    partition = None if partition is None else name(partition, "partition", "invalid_partition",
                                                    limits.partition_name_bytes_max)
    group = raw.get("consumerGroup")
    group = None if group is None else group_name(group, limits)
    batch = _next_number(raw, "batch", "invalid_batch", 1, limits.pop_batch_max)
    partitions = _next_number(raw, "partitions", "invalid_partitions", 1, limits.pop_partitions_max)
    wait_ms = _next_number(raw, "waitMs", "invalid_wait_ms", 0, limits.wait_ms_max)
    mode = raw.get("subscriptionMode", "all")
    if mode not in MODES:
        raise BadRequest("invalid_subscription_mode", "subscriptionMode must be all or new", {"section": "next"})
    return PopOp(queue, partition, group, batch, partitions, wait_ms, False, mode, after=True)


def _next_number(raw: dict, field: str, code: str, low: int, high: int) -> int:
    value = raw.get(field)
    if value is None:
        return 1 if low == 1 else 0
    if type(value) is not int or not low <= value <= high:
        raise BadRequest(code, f"next.{field} must be a whole number from {low} to {high}",
                         {"field": field, "section": "next"})
    return value


# -- ack ------------------------------------------------------------------------------------------

class AckItem:
    __slots__ = ("index", "partition_id", "lease_id", "transaction_id", "offset", "status", "error", "group", "prefix")

    def __init__(self, index, partition_id, lease_id, transaction_id, offset, status, error, group):
        self.index = index
        self.partition_id = partition_id
        self.lease_id = lease_id
        self.transaction_id = transaction_id
        self.offset = offset
        self.status = status
        self.error = error
        self.group = group  # None: whatever group the lease is of
        # The acking tenant's name prefix (queen/core/tenants.py): ids are global, so a partition of
        # another tenant's queue is answered as one this tenant holds no lease on.
        self.prefix = ""


_ACK_FIELDS = frozenset(("partitionId", "leaseId", "transactionId", "offset", "status", "error", "consumerGroup"))
_ACK_BATCH_FIELDS = frozenset(("acknowledgments", "consumerGroup"))


def parse_ack(document, limits: Limits) -> AckItem:
    if type(document) is not dict:
        raise BadRequest("invalid_body", "the body must be an object: one acknowledgment")
    return parse_ack_item(document, None, limits, None)


def parse_acks(document, limits: Limits, section: str | None = None) -> list[AckItem]:
    group = None
    if section is None:
        if type(document) is not dict:
            raise BadRequest("invalid_body", 'the body must be an object: {"acknowledgments": [...]}')
        check_fields(document, _ACK_BATCH_FIELDS, None, "body")
        raw_group = document.get("consumerGroup")
        group = None if raw_group is None else group_name(raw_group, limits)
        raw_items = document.get("acknowledgments")
    else:
        raw_items = document
    if type(raw_items) is not list or not raw_items:
        raise BadRequest("invalid_acknowledgments", "acknowledgments must be a non-empty list", _where(section))
    if len(raw_items) > limits.ops_per_call_max:
        raise BadRequest("too_many_acknowledgments", f"at most {limits.ops_per_call_max} acknowledgments per call",
                         {"count": len(raw_items), "limit": limits.ops_per_call_max, **_where(section)})
    items = [parse_ack_item(raw, index, limits, group, section) for index, raw in enumerate(raw_items)]
    seen = set()
    for item in items:
        ref = (item.partition_id, item.offset if item.offset is not None else item.transaction_id)
        if ref in seen:
            raise BadRequest("duplicate_ack", "each message at most once per call", {"index": item.index, **_where(section)})
        seen.add(ref)
    return items


def parse_ack_item(raw, index, limits: Limits, group: str | None, section: str | None = None) -> AckItem:
    try:
        if type(raw) is not dict:
            fail("invalid_acknowledgments", "each acknowledgment must be an object", index)
        if not _ACK_FIELDS.issuperset(raw):
            check_fields(raw, _ACK_FIELDS, index, "acknowledgment")
        partition_id = identifier(raw.get("partitionId"), "invalid_partition_id", "partitionId", index)
        if raw.get("leaseId") is None:
            fail("invalid_lease_id", "leaseId is required: an ack is fenced by the lease that delivered the message", index)
        lease_id = identifier(raw["leaseId"], "invalid_lease_id", "leaseId", index)
        offset = raw.get("offset")
        if offset is not None and (type(offset) is not int or not 0 <= offset <= INT64_MAX):
            fail("invalid_offset", "offset must be a whole number", index)
        tid = raw.get("transactionId")
        if tid is not None:
            tid = name(tid, "transactionId", "invalid_transaction_id", limits.transaction_id_bytes_max, index)
        if offset is None and tid is None:
            fail("message_ref_required", "name the message: offset or transactionId", index)
        status = raw.get("status")
        if status is None:
            status = "completed"
        elif status not in STATUSES:
            fail("invalid_status", "status must be completed, failed or dlq (release a lease with /lease/{id}/release)", index)
        error = raw.get("error")
        if error is not None and (type(error) is not str or len(error.encode()) > limits.ack_error_bytes_max):
            fail("invalid_error", f"error must be a string of at most {limits.ack_error_bytes_max} bytes", index)
        item_group = raw.get("consumerGroup")
        item_group = group if item_group is None else group_name(item_group, limits, index)
    except BadRequest as error_:
        error_.details.update(_where(section))
        raise
    return AckItem(index if index is not None else 0, partition_id, lease_id, tid, offset, status, error, item_group)


# -- leases, DLQ ------------------------------------------------------------------------------------

def parse_extend(lease_raw: str, document, limits: Limits) -> tuple[int, int | None]:
    lease_id = identifier(lease_raw, "invalid_lease_id", "leaseId")
    if document is None:
        return lease_id, None
    if type(document) is not dict:
        raise BadRequest("invalid_body", 'the body must be an object: {"seconds": N} or {}')
    check_fields(document, frozenset(("seconds",)), None, "body")
    seconds = document.get("seconds")
    if seconds is None:
        return lease_id, None
    if type(seconds) is not int or not 1 <= seconds <= limits.lease_seconds_max:
        raise BadRequest("invalid_seconds", f"seconds must be an integer from 1 to {limits.lease_seconds_max}")
    return lease_id, seconds


_REQUEUE_FIELDS = frozenset(("queue", "consumerGroup", "items"))
_REQUEUE_ITEM_FIELDS = frozenset(("partitionId", "offset"))


def parse_requeue(document, limits: Limits) -> tuple[str, str, list[tuple[int, int]]]:
    if type(document) is not dict:
        raise BadRequest("invalid_body", 'the body must be an object: {"queue", "consumerGroup", "items"}')
    check_fields(document, _REQUEUE_FIELDS, None, "body")
    queue = queue_name(document.get("queue"), limits)
    group = group_name(document.get("consumerGroup"), limits)
    raw_items = document.get("items")
    if type(raw_items) is not list or not raw_items:
        raise BadRequest("invalid_items", "items must be a non-empty list of {partitionId, offset}")
    if len(raw_items) > limits.ops_per_call_max:
        raise BadRequest("too_many_items", f"at most {limits.ops_per_call_max} items per call")
    items = []
    for index, raw in enumerate(raw_items):
        if type(raw) is not dict:
            fail("invalid_items", "each item must be an object", index)
        check_fields(raw, _REQUEUE_ITEM_FIELDS, index, "item")
        offset = raw.get("offset")
        if type(offset) is not int or not 0 <= offset <= INT64_MAX:
            fail("invalid_offset", "offset must be a whole number", index)
        items.append((identifier(raw.get("partitionId"), "invalid_partition_id", "partitionId", index), offset))
    return queue, group, items


def decode_dlq_cursor(raw: str | None) -> tuple | None:
    """A DLQ page cursor: where the last page ended (move time, partition, offset, group)."""
    if raw is None or raw == "":
        return None
    try:
        key = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        key = None
    if (type(key) is not list or len(key) != 4 or not all(type(x) is int for x in key[:3]) or type(key[3]) is not str):
        raise BadRequest("invalid_cursor", "cursor must be the string a previous page returned")
    return tuple(key)


def page_limit(params: dict, limits: Limits) -> int:
    return query_number(params, "limit", "invalid_limit", 100, 1, limits.page_items_max)


def check_params(params: dict, allowed: frozenset) -> None:
    for field in params:
        if field not in allowed:
            takes = f"takes {', '.join(sorted(allowed))}" if allowed else "takes no query parameter"
            raise BadRequest("unknown_field", f"unknown parameter {field!r}; this route {takes}", {"field": field})



# -- operations as the shard sees them ----------------------------------------------------------------
# Each is one part of a call on the shard of its queue (acks and lease calls: of the queue their id
# belongs to); the shard's QueueTable.apply answers it.

class Push:
    __slots__ = ("items",)

    def __init__(self, items: list[PushItem]):
        self.items = items


class Acks:
    __slots__ = ("items",)

    def __init__(self, items: list[AckItem]):
        self.items = items


class Configure:
    __slots__ = ("queue", "changes")

    def __init__(self, queue: str, changes: dict):
        self.queue = queue
        self.changes = changes


class LeaseCall:
    """extend (seconds: None for the queue's lease time) or release, by the tenant of `prefix`
    (queen/core/tenants.py): a lease of another tenant's queue is lost to it."""

    __slots__ = ("kind", "lease_id", "seconds", "prefix")

    def __init__(self, kind: str, lease_id: int, seconds: int | None = None, prefix: str = ""):
        self.kind = kind
        self.lease_id = lease_id
        self.seconds = seconds
        self.prefix = prefix


class QueueAdmin:
    """The admin calls on one queue: dlq, requeue, purge, delete, delete_group, info, partitions;
    and list (one shard's part of the queue listing)."""

    __slots__ = ("kind", "queue", "args")

    def __init__(self, kind: str, queue: str | None, **args):
        self.kind = kind
        self.queue = queue
        self.args = args


QUEUE_OPS = (Push, PopOp, Acks, Configure, LeaseCall, QueueAdmin)
WRITES = (Push, PopOp, Acks, Configure, LeaseCall)
