"""The public Queen MQ client's dialect, in one place: its request spellings turned into ours before
the core parses them, and our answers given its names beside ours after the core made them. The
core and the runtime speak one language; tests/compat runs the client itself against a server.

Requests (each mapping keyed on a spelling only the client uses, so it is never ambiguous):
  - pop: `wait=true&timeout=MS` is waitMs (30 s when timeout is left out); `autopilot`, `frames`
    and `conflation` ask for nothing Queen does and are dropped.
  - configure: its option names (`leaseTime`, `delayedProcessing`, `retryDelay` in milliseconds) are
    ours (`retryDelay` is retryDelayMs: the retry backoff, held by the server); options Queen does not
    implement pass only at the value that asks for nothing (its client sends them on every
    create), so a migrated configuration never looks honoured when it is not; `namespace` and
    `task` pass when null.
  - push: `bufferMs` and `bufferMax` are refused by name: Queen answers a push once it is durable.
  - KV: getPrefix's `after` (a plain key, exclusive) is our cursor; incr's `delta` is our `by`.
  - timers: `timerKey` is key, `txn` is transactionId, `reschedule` is schedule, and the payload is
    base64 of its JSON bytes (bytes that are not JSON stay bytes); `payloadZstd` is refused.
  - transactions: `{"operations": [{"type": "ack"|"push", ...}], "requiredLeases": [...], "kv"?,
    "timers"?}` is our sections: its acks in order the ack section, its pushes' items in order the
    push section; each required lease must be live, and an ack naming no lease borrows the one
    required lease when there is exactly one (so every ack stays fenced). Still one step.
Answers:
  - KV: a write's miss also carries the current value and version at the top level; getMany also
    `rows` (found) and `missing` (keys); getPrefix also `rows`, `truncated` and `nextAfter`.
  - timers: `ok` and `status` on every result; an operation sent in its spelling echoes `timerKey`,
    `txn` and `deliverAt`. Its own routes: one timer by path, and a queue's page as `rows`.
  - transactions in its form: `results` flat in its order (its acks and pushed items, then kv, then
    timers) and, on a miss, `failedIndex` in that order, `kvReason`, the key's `value` and `version`.
"""

from __future__ import annotations

import base64
import binascii

import orjson

from queen.core.kv import encode_cursor, fail, text
from queen.core.limits import Limits
from queen.core.queue_ops import OPTIONS, identifier, query_number
from queen.core.txn import SECTIONS, TransactionOps, parse_transaction
from queen.errors import BadRequest

# -- pop, configure, push ---------------------------------------------------------------------------

_POP_IGNORED = frozenset(("autopilot", "frames", "conflation"))
# The client's long-poll timeout when it gives none; ours ends at the longest wait a pop may have.
_POP_TIMEOUT_DEFAULT_MS = 30_000


def pop_params(params: dict, limits: Limits) -> dict:
    """A pop's query parameters in ours: waitMs for wait/timeout, without what asks for nothing."""
    if not (_POP_IGNORED.intersection(params) or "wait" in params or "timeout" in params):
        return params
    params = {name: value for name, value in params.items() if name not in _POP_IGNORED}
    if "wait" not in params and "timeout" not in params:
        return params
    if "waitMs" in params:
        raise BadRequest("wait_conflict", "give waitMs, or Queen MQ's wait=true&timeout=, not both")
    waiting = params.pop("wait", "false")
    if waiting not in ("true", "false"):
        raise BadRequest("invalid_wait_ms", "wait must be true or false")
    timeout_ms = query_number(params, "timeout", "invalid_wait_ms", _POP_TIMEOUT_DEFAULT_MS)
    params.pop("timeout", None)
    params["waitMs"] = str(min(timeout_ms, limits.wait_ms_max) if waiting == "true" else 0)
    return params


_OPTION_NAMES = {"leaseTime": "leaseTimeSeconds", "delayedProcessing": "delayedProcessingSeconds",
                 "retryDelay": "retryDelayMs"}
# Options Queen does not implement, and the value at which each asks for nothing (None: no such
# value, always refused).
_OPTIONS_OFF = {"priority": 0, "windowBuffer": 0, "encryptionEnabled": False, "retentionEnabled": False,
                "maxWaitTimeSeconds": 0, "deadLetterQueue": None, "ttl": None}


def configure_document(document):
    """A configure body in ours: its option names renamed, its unimplemented options dropped when
    they ask for nothing (refused otherwise), its null namespace and task dropped."""
    if type(document) is not dict:
        return document
    document = {name: value for name, value in document.items()
                if not (name in ("namespace", "task") and value is None)}
    options = document.get("options")
    if type(options) is not dict:
        return document
    ours = {}
    for option, value in options.items():
        if option in _OPTIONS_OFF and value is not None:
            off = _OPTIONS_OFF[option]
            if off is not None and value == off and type(value) is type(off):
                continue
            raise BadRequest("unsupported_option", f"{option} is not supported by Queen" + (
                f" (only {orjson.dumps(off).decode()}, which asks for nothing)" if off is not None else ""),
                {"option": option, "supported": sorted(OPTIONS)})
        name = _OPTION_NAMES.get(option, option)
        if name in ours:
            raise BadRequest("option_conflict", f"{name} is given twice (also as {option})", {"option": name})
        ours[name] = value
    document["options"] = ours
    return document


def push_document(document):
    if type(document) is dict:
        for field in ("bufferMs", "bufferMax"):
            if field in document:
                raise BadRequest("unsupported_field", f"{field} is not supported: Queen answers a push only once it is "
                                 "durable, never from a buffer", {"field": field})
    return document


# -- KV -------------------------------------------------------------------------------------------------

def kv_ops(raw_ops, limits: Limits, body: bytes | None = None):
    """KV operations in ours: getPrefix's `after` as a cursor, incr's `delta` as `by`. With the
    request's body, a search of its bytes for either word (JSON and CBOR both carry field names as
    plain UTF-8) spares a batch that has neither the look at each operation."""
    if type(raw_ops) is not list or (body is not None and b"after" not in body and b"delta" not in body):
        return raw_ops
    return [_kv_op(raw, index, limits) if type(raw) is dict and ("after" in raw or "delta" in raw) else raw
            for index, raw in enumerate(raw_ops)]


def _kv_op(raw: dict, index: int, limits: Limits) -> dict:
    raw = dict(raw)
    if "after" in raw:
        after = raw.pop("after")
        if after is not None:
            if raw.get("cursor") is not None:
                fail("option_conflict", "give cursor or after, not both", index)
            raw["cursor"] = encode_cursor(text(after, "after", limits.key_bytes_max, index)) if after != "" else None
    if "delta" in raw:
        delta = raw.pop("delta")
        if delta is not None:
            if raw.get("by") is not None:
                fail("option_conflict", "give by or delta (the same thing), not both", index)
            raw["by"] = delta
    return raw


def kv_answers(results: list[dict]) -> list[dict]:
    """Our KV results with the client's names beside ours. Told apart by their fields alone (a
    write's miss has `current`, a page `items` and `cursor`, getMany `items`), so a batch of
    writes that applied costs two dict lookups a result."""
    for result in results:
        if "current" in result:
            current = result["current"]
            result["value"] = current["value"]
            result["version"] = current["version"]
        elif "items" in result:
            items = result["items"]
            if "cursor" in result:
                more = result["cursor"] is not None
                result["rows"] = items
                result["truncated"] = more
                result["nextAfter"] = items[-1]["key"] if more else None
            else:
                result["rows"] = [item for item in items if item["found"]]
                result["missing"] = [item["key"] for item in items if not item["found"]]
    return results


# -- timers ---------------------------------------------------------------------------------------------

def timer_ops(raw_ops) -> tuple[object, list[bool]]:
    """Timer operations in ours, and which came in the client's spelling (their answers echo it)."""
    if type(raw_ops) is not list:
        return raw_ops, []
    spelled = [type(raw) is dict and "timerKey" in raw for raw in raw_ops]
    if not any(spelled):
        return raw_ops, spelled
    return [_timer_op(raw, index) if theirs else raw
            for index, (raw, theirs) in enumerate(zip(raw_ops, spelled, strict=True))], spelled


def _timer_op(raw: dict, index: int) -> dict:
    for theirs, ours in (("timerKey", "key"), ("txn", "transactionId")):
        if theirs in raw and ours in raw:
            fail("option_conflict", f"give {theirs} or {ours}, not both", index)
    raw = {("key" if name == "timerKey" else "transactionId" if name == "txn" else name): value
           for name, value in raw.items()}
    zstd = raw.pop("payloadZstd", False)
    if zstd is not False:
        fail("unsupported_field", "payloadZstd is not supported: send the payload uncompressed", index, field="payloadZstd")
    if raw.get("op") == "reschedule":
        raw["op"] = "schedule"
    if "payload" in raw:
        encoded = raw["payload"]
        try:
            data = base64.b64decode(encoded, validate=True) if type(encoded) is str else None
        except (binascii.Error, ValueError):
            data = None
        if data is None:
            fail("invalid_payload", "under the timerKey spelling, payload is base64 of the payload's JSON bytes", index)
        try:
            raw["payload"] = orjson.loads(data)
        except orjson.JSONDecodeError:
            raw["payload"] = data
    return raw


def timer_answers(ops, spelled: list[bool], results: list[dict]) -> list[dict]:
    """`ok` and `status` on every result, and its names echoed where it spelled the operation."""
    for op, theirs, result in zip(ops, spelled or [False] * len(ops), results, strict=True):
        timer_answer(op, theirs, result)
    return results


def timer_answer(op, theirs: bool, result: dict) -> dict:
    if op.op == "schedule":
        ok = result["scheduled"]
        result["ok"] = ok
        result["status"] = ("rescheduled" if result["replaced"] else "scheduled") if ok else result["reason"]
    elif op.op == "cancel":
        result["ok"] = result["cancelled"]
        result["status"] = "cancelled" if result["cancelled"] else "absent"
    else:
        result["ok"] = result["found"]
    if theirs:
        result["timerKey"] = op.key
        if op.op == "schedule":
            result["txn"] = op.transaction_id
            result["deliverAt"] = result.get("at")
    return result


def timer_page(page: dict) -> dict:
    """A queue's pending timers as the client pages them: rows, truncated, nextAfter."""
    rows = page["items"]
    for row in rows:
        row["timerKey"] = row["key"]
    more = page["cursor"] is not None
    return {"rows": rows, "truncated": more, "nextAfter": rows[-1]["key"] if more else None}


# -- transactions ---------------------------------------------------------------------------------------

class Spelling:
    """What a transaction's answer needs of how it was asked: the client's flat order of its acks
    and pushed items (None: our sections form), and which timer operations it spelled."""

    __slots__ = ("order", "timers_spelled")

    def __init__(self, order: list | None, timers_spelled: list[bool]):
        self.order = order
        self.timers_spelled = timers_spelled


_FORM_FIELDS = frozenset(("operations", "requiredLeases", "kv", "timers"))


def parse_transaction_document(document, limits: Limits, now_ms: int) -> tuple[TransactionOps, Spelling]:
    """A transaction body, in either form, parsed by the core once it is in ours."""
    if type(document) is not dict:
        return parse_transaction(document, limits, now_ms), Spelling(None, [])
    order = None
    leases: list[int] = []
    if "operations" in document:
        document, order, leases = _sections_of(document, limits)
    else:
        document = dict(document)
    if "kv" in document:
        document["kv"] = kv_ops(document["kv"], limits)
    spelled: list[bool] = []
    if "timers" in document:
        document["timers"], spelled = timer_ops(document["timers"])
    txn = parse_transaction(document, limits, now_ms)
    txn.required_leases = leases
    return txn, Spelling(order, spelled)


def _sections_of(document: dict, limits: Limits) -> tuple[dict, list, list[int]]:
    for field in document:
        if field not in _FORM_FIELDS:
            if field in SECTIONS:
                raise BadRequest("unsupported_form", f"the operations form takes no {field} section: send the "
                                 "acks and pushes as operations, or use the sections alone", {"section": field})
            raise BadRequest("unknown_field", f"unknown field {str(field)[:50]!r} in a transaction of operations",
                             {"field": str(field)[:50]})
    raw_ops, raw_leases = document.get("operations"), document.get("requiredLeases")
    if type(raw_ops) is not list:
        raise BadRequest("invalid_operations", "operations must be a list")
    if raw_leases is None:
        raw_leases = []
    if type(raw_leases) is not list or len(raw_leases) > limits.ops_per_call_max:
        raise BadRequest("invalid_required_leases", "requiredLeases must be a list of lease ids")
    leases = list(dict.fromkeys(identifier(lease, "invalid_lease_id", "requiredLeases") for lease in raw_leases))
    acks: list[dict] = []
    pushes: list[dict] = []
    order = []
    for index, raw in enumerate(raw_ops):
        if type(raw) is not dict or raw.get("type") not in ("ack", "push"):
            raise BadRequest("invalid_operations", 'each operation is {"type": "ack", ...} or {"type": "push", '
                             '"items": [...]}', {"index": index})
        body = {name: value for name, value in raw.items() if name != "type" and value is not None}
        if raw["type"] == "ack":
            if "leaseId" not in body and len(leases) == 1:
                body["leaseId"] = leases[0]
            order.append(("ack", len(acks)))
            acks.append(body)
        else:
            items = body.pop("items", None)
            if body or type(items) is not list or not items:
                raise BadRequest("invalid_operations", 'a push operation is {"type": "push", "items": [...]}',
                                 {"index": index})
            for item in items:
                order.append(("push", len(pushes)))
                pushes.append(item)
    sections = {name: ops for name, ops in (("ack", acks), ("push", pushes)) if ops}
    for name in ("kv", "timers"):
        if document.get(name):
            sections[name] = document[name]
    if not sections:
        raise BadRequest("invalid_body", "a transaction needs at least one operation")
    return sections, order, leases


def transaction_answer(txn: TransactionOps, spelling: Spelling, answer: dict) -> dict:
    if answer["success"] and "timers" in answer:
        timer_answers(txn.timers, spelling.timers_spelled, answer["timers"])
    order = spelling.order
    if order is None:
        return answer
    if answer["success"]:
        flat = [answer[section][index] for section, index in order]
        for section in ("kv", "timers"):
            flat += answer.get(section, [])
        answer["results"] = flat
        return answer
    failed = answer["failed"]
    section, index = failed.get("section"), failed.get("index")
    position = None
    if section in ("ack", "push"):
        position = order.index((section, index))
    elif section == "kv":
        position = len(order) + index
    elif section == "timers":
        position = len(order) + len(txn.kv) + index
    answer["failedIndex"] = position
    if section == "kv":
        current = failed.get("current") or {}
        answer["kvReason"] = failed["reason"]
        answer["value"] = current.get("value")
        answer["version"] = current.get("version", 0)
    return answer
