"""The API reference, `GET /api/v1/openapi.json`: an OpenAPI 3.1 document of every route.

One `Operation` entry per (method, path) a client calls, each naming the route table key it is
served by (`route`: an exact path of `Api.exact`, or a pattern's source of `Api.patterns`), so
tests/http/test_openapi.py can hold the document to the live table: a route added without an entry
here fails that test by name. Adding a route is one entry in OPERATIONS (and its schemas, if new).

Schemas say what a well-formed call holds and what a 200 answer always has; answers may carry more
fields (the public Queen MQ client's spellings among them), so response objects stay open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from queen.core.limits import Limits

JSON_AND_CBOR = ("application/json", "application/cbor")

# -- schema helpers ---------------------------------------------------------------------------------


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(needs: tuple = (), /, closed: bool = True, **properties) -> dict:
    """An object schema: `needs` the required fields (positional, as a field may be named "required");
    closed: a request document whose unknown fields the server refuses."""
    schema: dict = {"type": "object", "properties": properties}
    if needs:
        schema["required"] = list(needs)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _name(max_bytes: int, what: str) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": max_bytes,
            "description": f"{what}: 1 to {max_bytes} UTF-8 bytes, no control or bidi override characters"}


def _int(low: int | None = None, high: int | None = None, description: str | None = None) -> dict:
    schema: dict = {"type": "integer"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    if description:
        schema["description"] = description
    return schema


_ANY = {"description": "any JSON value; {\"$bytes\": base64} is a byte string (over CBOR, the bytes themselves)"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}
_CURSOR = {"type": ["string", "null"], "description": "pass back for the next page; null on the last page"}


def _schemas(limits: Limits) -> dict:
    """components/schemas: request documents with the server's limits, and the answers' shapes."""
    ns = _name(limits.ns_bytes_max, "namespace")
    key = _name(limits.key_bytes_max, "key")
    queue = _name(limits.queue_name_bytes_max, "queue")
    partition = _name(limits.partition_name_bytes_max, "partition")
    group = _name(limits.group_name_bytes_max, "consumer group")
    lock = _name(limits.lock_name_bytes_max, "lock name, without '#'")
    owner = _name(limits.lock_owner_bytes_max, "owner")
    timer_key = _name(limits.timer_key_bytes_max, "timer key")
    txn_id = _name(limits.transaction_id_bytes_max, "transactionId, not starting 'queen:'")
    trace_id = {"type": "string", "maxLength": limits.trace_id_bytes_max}
    version = _int(0, description="a version seen earlier; 0 means absent")
    ttl = _int(1, limits.kv_ttl_seconds_max, "seconds; give ttlSeconds or forever")
    wait = _int(0, limits.wait_ms_max, "park the call this long at most")
    ident = _int(1, description="an id an earlier answer gave")

    kv_ops = {
        "get": _obj(("op", "ns", "key"), op={"const": "get"}, ns=ns, key=key),
        "getMany": _obj(("op", "ns", "keys"), op={"const": "getMany"}, ns=ns,
                        keys={"type": "array", "items": key, "minItems": 1}),
        "getPrefix": _obj(("op", "ns"), op={"const": "getPrefix"}, ns=ns, prefix={"type": "string"},
                          cursor=_STR, limit=_int(1, limits.page_items_max), keysOnly=_BOOL),
        "check": _obj(("op", "ns", "key", "expect"), op={"const": "check"}, ns=ns, key=key, expect=version,
                      required=_BOOL),
        "put": _obj(("op", "ns", "key", "value"), op={"const": "put"}, ns=ns, key=key, value=_ANY, expect=version,
                    required=_BOOL, ttlSeconds=ttl, forever=_BOOL),
        "putIfAbsent": _obj(("op", "ns", "key", "value"), op={"const": "putIfAbsent"}, ns=ns, key=key, value=_ANY,
                            expect=version, required=_BOOL, ttlSeconds=ttl, forever=_BOOL),
        "delete": _obj(("op", "ns", "key"), op={"const": "delete"}, ns=ns, key=key, expect=version, required=_BOOL),
        "incr": _obj(("op", "ns", "key"), op={"const": "incr"}, ns=ns, key=key, by=_int(), max=_int(), min=_int(),
                     expect=version, required=_BOOL, ttlSeconds=ttl, forever=_BOOL),
    }
    lock_ttl = _int(1, limits.lock_ttl_seconds_max)
    lock_ops = {
        "acquire": _obj(("op", "name", "ttlSeconds"), op={"const": "acquire"}, name=lock, ttlSeconds=lock_ttl,
                        owner=owner, limit=_int(1, limits.lock_permits_max, "permits of a semaphore"), waitMs=wait),
        "renew": _obj(("op", "name", "slot", "token", "ttlSeconds"), op={"const": "renew"}, name=lock,
                      slot=_int(0), token=_int(1), ttlSeconds=lock_ttl, owner=owner),
        "release": _obj(("op", "name", "slot", "token"), op={"const": "release"}, name=lock, slot=_int(0),
                        token=_int(1), owner=owner),
        "get": _obj(("op", "name"), op={"const": "get"}, name=lock, limit=_int(1, limits.lock_permits_max)),
    }
    schedule = _obj(("op", "queue", "key"), op={"const": "schedule"}, queue=queue, key=timer_key,
                    at=_int(0, description="ms since the epoch"), delayMs=_int(0, 31_536_000_000),
                    partition=partition, payload=_ANY, transactionId=txn_id, traceId=trace_id,
                    cron={"type": "string", "maxLength": 256, "description": "5-field cron expression"},
                    timezone={"type": "string", "maxLength": 64, "description": "IANA zone, only with cron"},
                    everyMs=_int(1000, 31_536_000_000))
    timer_ops = {
        "schedule": schedule,
        "cancel": _obj(("op", "queue", "key"), op={"const": "cancel"}, queue=queue, key=timer_key),
        "get": _obj(("op", "queue", "key"), op={"const": "get"}, queue=queue, key=timer_key),
    }
    push_item = _obj(("queue", "payload"), queue=queue, partition=partition, payload=_ANY, transactionId=txn_id,
                     traceId=trace_id)
    ack_status = {"enum": ["completed", "failed", "dlq"]}
    ack = _obj(("partitionId", "leaseId"), partitionId=ident, leaseId=ident, offset=_int(0), transactionId=txn_id,
               status=ack_status, error={"type": "string", "maxLength": limits.ack_error_bytes_max},
               consumerGroup=group)
    options = _obj(leaseTimeSeconds=_int(1, limits.lease_seconds_max), retryLimit=_int(0, 1000),
                   dlqAfterMaxRetries=_BOOL, retryDelayMs=_int(0, 86_400_000), retryDelayMaxMs=_int(1, 86_400_000),
                   delayedProcessingSeconds=_int(0, 604_800), retentionSeconds=_int(0, 31_536_000),
                   completedRetentionSeconds=_int(0, 31_536_000), dedupWindowSeconds=_int(1, 604_800),
                   maxSize=_int(0, 100_000_000), closed=False)
    options["description"] = ("each optional; the Queen MQ client's spellings (leaseTime, retryDelay, "
                              "delayedProcessing, ...) are accepted too")
    result = _obj(("index", "op"), closed=False, index=_int(0), op=_STR)
    holder = _obj(closed=False, slot=_int(0), owner=_NULLABLE_STR, token=_int(1), fence=_int(1), since=_int(),
                  renewedAt=_int(), expiresAt=_NULLABLE_INT)
    tenant_view = _obj(("tenant", "limits", "paused", "pausedBy"), closed=False, tenant=_STR,
                       usage={"type": ["object", "null"]}, limits={"type": "object"},
                       paused=_obj(("kv", "queues"), kv=_BOOL, queues=_BOOL), pausedBy={"type": "object"})
    queue_totals = _obj(("pushed", "popped", "acked", "failed"), closed=False,
                        pushed=_int(0, description="appended, timer fires included"),
                        popped=_int(0, description="delivered"),
                        acked=_int(0, description="completed: acked, or auto-acked as delivered"),
                        failed=_int(0, description="deliveries ended by a failed ack, an expired lease or the DLQ"))
    queue_totals["description"] = ("the queue's messages since this server started (a restart or a new leader counts "
                                   "from 0): counters, whose rates are its throughput")
    return {
        "Error": {"description": "Every refusal, on every route.", **_obj(
            ("error", "code", "details", "detail"),
            error={"type": "string", "description": "what went wrong, in words a person reads"},
            code={"type": "string", "pattern": "^[a-z0-9_]+$", "description": "snake_case, for programs"},
            details={"type": "object", "description": "what the refusal is about (a field, a limit)"},
            detail={"type": "string", "description": "the message again, where the public Queen MQ client reads it"})},
        "Health": _obj(("status",), closed=False, status={"enum": ["ok", "failed", "shutting_down",
                                                                              "sync_unavailable"]},
                       reason=_STR),
        "KvOperation": {"oneOf": list(kv_ops.values())},
        "KvBatch": _obj(("operations",), operations={"type": "array", "minItems": 1,
                                                     "maxItems": limits.ops_per_call_max,
                                                     "items": _ref("KvOperation")}),
        "KvPut": _obj(("value",), value=_ANY, ttlSeconds=ttl, forever=_BOOL, expect=version, ifAbsent=_BOOL),
        "KvIncr": _obj(by=_int(), max=_int(), min=_int(), ttlSeconds=ttl, forever=_BOOL, expect=version),
        "KvResult": result,
        "KvResults": _obj(("results",), closed=False, results={"type": "array", "items": _ref("KvResult")}),
        "KvPage": _obj(("items", "cursor"), closed=False, items={"type": "array", "items": {"type": "object"}},
                       cursor=_CURSOR),
        "LockOperation": {"oneOf": list(lock_ops.values())},
        "LockBatch": _obj(("operations",), operations={"type": "array", "minItems": 1,
                                                       "maxItems": limits.lock_ops_per_call_max,
                                                       "items": _ref("LockOperation")}),
        "LockResults": _obj(("results",), closed=False, results={"type": "array", "items": result}),
        "PermitPage": _obj(("items", "cursor"), closed=False, cursor=_CURSOR, items={"type": "array", "items": {
            "allOf": [holder, _obj(("name",), closed=False, name=_STR)]}}),
        "TimerOperation": {"oneOf": list(timer_ops.values())},
        "TimerBatch": _obj(("operations",), operations={"type": "array", "minItems": 1,
                                                        "maxItems": limits.ops_per_call_max,
                                                        "items": _ref("TimerOperation")}),
        "TimerResult": _obj(("op", "queue", "key"), closed=False, index=_int(0), op=_STR, queue=_STR, key=_STR),
        "TimerResults": _obj(("results",), closed=False, results={"type": "array", "items": _ref("TimerResult")}),
        "TimerPage": _obj(("items", "cursor"), closed=False, cursor=_CURSOR, items={"type": "array", "items": {
            "type": "object"}}),
        "QueenMqTimerPage": _obj(("rows", "truncated", "nextAfter"), closed=False,
                                 rows={"type": "array", "items": {"type": "object"}}, truncated=_BOOL,
                                 nextAfter=_NULLABLE_STR),
        "Transaction": _obj(
            closed=False,
            kv={"type": "array", "minItems": 1, "items": _ref("KvOperation")},
            ack={"type": "array", "minItems": 1, "items": ack},
            push={"type": "array", "minItems": 1, "items": push_item},
            timers={"type": "array", "minItems": 1, "items": {"oneOf": [schedule, timer_ops["cancel"]]}},
            next=_ref("Next")),
        "TransactionAnswer": _obj(("success",), closed=False, success=_BOOL, reason=_STR,
                                  next={"oneOf": [_ref("Pop"), {"type": "null"}]}, nextReason=_STR,
                                  failed=_obj(("section", "index", "reason"), closed=False, section=_STR,
                                              index=_int(0), reason=_STR)),
        "Configure": _obj(("queue",), queue=queue, options=options),
        "Configured": _obj(("configured", "queue", "options"), closed=False, configured=_BOOL, queue=_STR,
                           created=_BOOL, options={"type": "object"}),
        "Push": _obj(("items",), items={"type": "array", "minItems": 1, "maxItems": limits.ops_per_call_max,
                                        "items": push_item}),
        "PushResults": {"type": "array", "items": _obj(("index", "status"), closed=False, index=_int(0),
                                                        status={"enum": ["queued", "duplicate", "failed"]})},
        "Pop": _obj(("success", "messages"), closed=False, success=_BOOL, reason=_STR, queue=_STR,
                    consumerGroup=_STR, leaseId=_NULLABLE_INT, partitionId=ident,
                    messages={"type": "array", "items": _obj(("offset", "data"), closed=False, offset=_int(0),
                                                              data=_ANY, retryCount=_int(0))}),
        # `next` on an ack or a transaction: the pop to make in the same step once it applied; the
        # answer's `next` is that pop's answer, as GET /api/v1/pop/queue/{queue} gives it.
        "Next": _obj(queue=queue, partition=partition, consumerGroup=group, batch=_int(1, limits.pop_batch_max),
                     partitions=_int(1, limits.pop_partitions_max), waitMs=wait,
                     subscriptionMode={"enum": ["all", "new"]}),
        "Ack": {**ack, "properties": {**ack["properties"], "next": _ref("Next")}},
        "AckBatch": _obj(("acknowledgments",), consumerGroup=group, next=_ref("Next"),
                         acknowledgments={"type": "array", "minItems": 1, "maxItems": limits.ops_per_call_max,
                                          "items": ack}),
        "AckResult": _obj(("success",), closed=False, success=_BOOL, reason=_STR, already=_BOOL,
                          leaseReleased=_BOOL, next=_ref("Pop")),
        "AckResults": {"oneOf": [{"type": "array", "items": _ref("AckResult")},
                                 _obj(("results", "next"), closed=False, next=_ref("Pop"),
                                      results={"type": "array", "items": _ref("AckResult")})]},
        "Extend": _obj(seconds=_int(1, limits.lease_seconds_max)),
        "Release": _obj(),
        "LeaseAnswer": _obj(("leaseId", "success"), closed=False, leaseId=_int(), success=_BOOL, reason=_STR),
        "DlqPage": _obj(("messages", "cursor"), closed=False, messages={"type": "array", "items": {"type": "object"}},
                        total=_int(0), cursor=_CURSOR),
        "Purged": _obj(("purged",), closed=False, purged=_int(0)),
        "Requeue": _obj(("queue", "items"), queue=queue, consumerGroup=group,
                        items={"type": "array", "minItems": 1, "maxItems": limits.ops_per_call_max,
                               "items": _obj(("partitionId", "offset"), partitionId=ident, offset=_int(0))}),
        "Requeued": _obj(("results",), closed=False, results={"type": "array", "items": {"type": "object"}}),
        "QueuePage": _obj(("items", "cursor"), closed=False, cursor=_CURSOR, items={"type": "array", "items": _obj(
            ("queue", "consumers", "totals"), closed=False, queue=_STR, partitions=_int(0), messages=_int(0),
            inFlight=_int(0, description="delivered under a live lease, not yet acked"),
            consumers=_int(0, description="its groups' live leases and parked pops"), totals=_ref("QueueTotals"))}),
        "QueueTotals": queue_totals,
        "QueueInfo": _obj(("found", "queue"), closed=False, found=_BOOL, queue=_STR, options={"type": "object"},
                          totals=_ref("QueueTotals"), groups={"type": "array", "items": _obj(
                              ("consumerGroup", "inFlight", "leases", "parkedPops", "consumers"), closed=False,
                              consumerGroup=_STR, inFlight=_int(0), leases=_int(0, description="live leases holding "
                                                                                                 "messages"),
                              parkedPops=_int(0, description="pops parked now, waiting for a message"),
                              consumers=_int(0, description="leases + parkedPops"))}),
        "PartitionPage": _obj(("items", "cursor"), closed=False, cursor=_CURSOR, items={"type": "array", "items": _obj(
            ("partition", "partitionId"), closed=False, partition=_STR, partitionId=ident)}),
        "Deleted": _obj(("deleted",), closed=False, deleted=_BOOL, reason=_STR),
        "Pause": _obj(kv=_BOOL, queues=_BOOL, tenant={"type": "string", "description": "operator only"}),
        "Paused": _obj(("tenant", "paused"), closed=False, tenant=_STR, paused=_obj(("kv", "queues"), kv=_BOOL,
                                                                                   queues=_BOOL)),
        "TenantView": tenant_view,
        "Caller": {"allOf": [tenant_view, _obj(("token", "role", "tokenTenant"), closed=False, token=_STR,
                                               role=_STR, tokenTenant=_STR)]},
        "Tenants": _obj(("items",), closed=False, items={"type": "array", "items": _ref("TenantView")}),
        "OpenApi": _obj(("openapi", "paths"), closed=False, openapi=_STR, paths={"type": "object"}),
        # Version and uptime for any token; the operator's view adds the rest.
        "ServerInfo": _obj(("version", "startedAt", "uptimeSeconds"), closed=False, version=_STR,
                           startedAt=_int(0), uptimeSeconds={"type": "number", "minimum": 0}, dataDir=_STR,
                           log={"type": "object"}, fsync={"type": "object"}, connections={"type": "object"},
                           requestsTotal=_int(0), clientErrorsTotal=_int(0, description="answers 4xx since the start"),
                           serverErrorsTotal=_int(0, description="answers 5xx since the start")),
        "ClusterStatus": _obj(("cluster", "node", "role", "epoch", "serving", "leader", "sync", "degraded",
                               "syncUnavailable", "lastVersion", "followers"), closed=False, cluster=_NULLABLE_STR,
                              node=_NULLABLE_STR, serving=_BOOL, syncUnavailable=_BOOL,
                              role={"enum": ["single", "starting", "follower", "candidate", "promoting", "leader",
                                             "fenced"]},
                              epoch=_int(0), leader={"type": ["object", "null"]}, sync={"type": "array",
                                                                                         "items": _STR},
                              degraded=_BOOL, lastVersion=_int(0), followers={"type": "array", "items": _obj(
                                  ("node", "connected", "ackedVersion", "lagVersions"), closed=False, node=_STR,
                                  connected=_BOOL, ackedVersion=_int(0), lagVersions=_int())}),
        "Switchover": _obj(to={"type": "string", "minLength": 1, "description": "the node to hand over to; "
                                                                               "default: the most caught-up follower"}),
        "Switched": _obj(("from", "to", "epoch", "lastVersion"), closed=False, epoch=_int(0), lastVersion=_int(0),
                         **{"from": _STR, "to": _STR}),
        "ForcePromote": _obj(("node",), node={"type": "string", "minLength": 1}),
        "ForcePromoted": _obj(("node", "syncEpoch", "oldLeader", "nodeLastVersion", "oldLeaderLastVersion",
                               "mayBeLost"), closed=False, node=_STR, syncEpoch=_int(0), oldLeader=_NULLABLE_STR,
                              nodeLastVersion=_NULLABLE_INT, oldLeaderLastVersion=_NULLABLE_INT,
                              mayBeLost=_NULLABLE_INT),
    }


# -- the operations -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "path" or "query"
    schema: dict
    description: str = ""


@dataclass(frozen=True)
class Operation:
    """One documented (method, path). route: the key of the route table entry that serves it."""

    method: str
    path: str
    route: str
    role: str  # reader, writer, admin, operator, or "none" (no token needed)
    summary: str
    answer: str | None  # components/schemas name of the 200 answer; None: not a document, `media`
    params: tuple[Param, ...] = ()
    body: str | None = None  # components/schemas name of the JSON (or CBOR) body
    body_required: bool = True
    # Statuses beside those every route can answer (see _COMMON): 403 for a route a lesser token
    # may not call, 404, 429 for calls counted against a tenant's rate or quotas, 503/507 for writes.
    statuses: tuple[int, ...] = ()
    description: str = ""
    tags: tuple[str, ...] = field(default=())
    media: str = "text/plain"  # the 200 answer's content type when it is not a document


def _path(name: str, schema: dict, description: str = "") -> Param:
    return Param(name, "path", schema, description)


def _query(name: str, schema: dict, description: str = "") -> Param:
    return Param(name, "query", schema, description)


# A write: refused by a tenant's rate or quota (429), its pause or a failed disk (503), versions
# running out (507); a forbidden role (403).
_WRITE = (403, 429, 503, 507)


def _operations(limits: Limits) -> list[Operation]:
    ns = _path("ns", {"type": "string", "minLength": 1, "maxLength": limits.ns_bytes_max}, "namespace")
    key = _path("key", {"type": "string", "minLength": 1, "maxLength": limits.key_bytes_max},
                "key (may hold '/'; percent-encode other reserved characters)")
    queue = _path("queue", {"type": "string", "minLength": 1, "maxLength": limits.queue_name_bytes_max}, "queue")
    partition = _path("partition", {"type": "string", "minLength": 1, "maxLength": limits.partition_name_bytes_max})
    group = _path("group", {"type": "string", "minLength": 1, "maxLength": limits.group_name_bytes_max})
    lease = _path("leaseId", {"type": "integer", "minimum": 1}, "a pop's leaseId")
    timer_key = _path("key", {"type": "string", "minLength": 1, "maxLength": limits.timer_key_bytes_max})
    limit = _query("limit", _int(1, limits.page_items_max), "page size, default 100")
    cursor = _query("cursor", _STR, "the cursor of the previous page")
    prefix = _query("prefix", _STR, "only names starting so")
    q_queue = _query("queue", {"type": "string", "minLength": 1, "maxLength": limits.queue_name_bytes_max})
    q_group = _query("consumerGroup", {"type": "string", "minLength": 1, "maxLength": limits.group_name_bytes_max})
    wait = _int(0, limits.wait_ms_max)
    pop_params = (
        _query("batch", _int(1, limits.pop_batch_max), "messages at most, default 1"),
        _query("partitions", _int(1, limits.pop_partitions_max), "partitions claimed under one lease, default 1"),
        _query("waitMs", wait, "park until a message can be delivered, at most this long"),
        q_group,
        _query("autoAck", {"enum": ["true", "false"]}, "resolve the messages as they are delivered (at most once)"),
        _query("subscriptionMode", {"enum": ["all", "new"]}),
        _query("wait", {"enum": ["true", "false"]}, "the Queen MQ client's spelling: with timeout, for waitMs"),
        _query("timeout", _int(0, 9_999_999_999_999_999_999), "ms; Queen MQ's, held to waitMs' limit"),
    )
    delete_metadata = _query("deleteMetadata", _STR, "the Queen MQ client's; ignored")
    return [
        Operation("GET", "/healthz", "/healthz", "none", "Liveness and readiness: 200 ok, 503 failed disk, "
                  "shutting down, or a cluster leader's sync set out of reach (sync_unavailable: it clears by "
                  "itself)", "Health", statuses=(503,)),
        Operation("GET", "/health", "/health", "none", "The Queen MQ client's spelling of /healthz", "Health",
                  statuses=(503,)),
        Operation("GET", "/api/v1/openapi.json", "/api/v1/openapi.json", "reader", "This document", "OpenApi"),
        Operation("GET", "/metrics", "/metrics", "reader", "Prometheus text exposition (the operator's: every "
                  "tenant; others: their own)", None),
        # KV
        Operation("POST", "/api/v1/kv", "/api/v1/kv", "reader", "A batch of KV operations, one result each",
                  "KvResults", body="KvBatch", statuses=_WRITE,
                  description="Writes (put, putIfAbsent, delete, incr) need a writer token."),
        Operation("GET", "/api/v1/kv/{ns}", "/api/v1/kv/(.+)", "reader", "One page of a namespace's keys",
                  "KvPage", (ns, prefix, cursor, limit)),
        Operation("GET", "/api/v1/kv/{ns}/{key}", "/api/v1/kv/(.+)", "reader", "Read one key", "KvResult",
                  (ns, key)),
        Operation("PUT", "/api/v1/kv/{ns}/{key}", "/api/v1/kv/(.+)", "writer", "Write one key (ifAbsent: only "
                  "if absent; expect: only at that version)", "KvResult", (ns, key), body="KvPut",
                  statuses=_WRITE),
        Operation("DELETE", "/api/v1/kv/{ns}/{key}", "/api/v1/kv/(.+)", "writer", "Delete one key", "KvResult",
                  (ns, key, _query("expect", _int(0), "only at this version")), statuses=_WRITE),
        Operation("POST", "/api/v1/kv/{ns}/{key}/incr", "/api/v1/kv/(.+)", "writer", "Add to a counter",
                  "KvResult", (ns, key), body="KvIncr", body_required=False, statuses=_WRITE),
        # Locks and transactions
        Operation("POST", "/api/v1/locks", "/api/v1/locks", "reader", "Acquire, renew, release or look at locks",
                  "LockResults", body="LockBatch", statuses=_WRITE,
                  description="Anything but get needs a writer token."),
        Operation("GET", "/api/v1/locks", "/api/v1/locks", "reader", "Every held permit, page by page",
                  "PermitPage", (prefix, cursor, limit)),
        Operation("POST", "/api/v1/transaction", "/api/v1/transaction", "reader", "One step: kv, ack, push and "
                  "timers sections as one log record, all or nothing", "TransactionAnswer", body="Transaction",
                  statuses=_WRITE, description="A step that writes needs a writer token. The Queen MQ client's "
                  "{\"operations\": [...]} form is accepted too."),
        # Timers
        Operation("POST", "/api/v1/timers", "/api/v1/timers", "reader", "Schedule, cancel or get timers",
                  "TimerResults", body="TimerBatch", statuses=_WRITE,
                  description="schedule and cancel need a writer token."),
        Operation("GET", "/api/v1/timers", "/api/v1/timers", "reader", "A queue's pending timers in key order",
                  "TimerPage", (Param("queue", "query", {"type": "string", "minLength": 1,
                                                         "maxLength": limits.queue_name_bytes_max}),
                                prefix, cursor, limit)),
        Operation("GET", "/api/v1/timers/{queue}", "/api/v1/timers/([^/]+)", "reader",
                  "The Queen MQ client's page of a queue's timers", "QueenMqTimerPage",
                  (queue, _query("after", _STR, "the nextAfter of the previous page"),
                   _query("limit", _int(0), "held to the page limit"))),
        Operation("GET", "/api/v1/timers/{queue}/{key}", "/api/v1/timers/([^/]+)/(.+)", "reader", "One timer",
                  "TimerResult", (queue, timer_key, _query("txn", _STR))),
        Operation("DELETE", "/api/v1/timers/{queue}/{key}", "/api/v1/timers/([^/]+)/(.+)", "writer",
                  "Cancel one timer", "TimerResult", (queue, timer_key, _query("txn", _STR, "echoed back")),
                  statuses=_WRITE),
        # Queues
        Operation("POST", "/api/v1/configure", "/api/v1/configure", "writer", "Create a queue or change its "
                  "options", "Configured", body="Configure", statuses=_WRITE),
        Operation("POST", "/api/v1/push", "/api/v1/push", "writer", "Push messages, one result each",
                  "PushResults", body="Push", statuses=_WRITE),
        Operation("GET", "/api/v1/pop/queue/{queue}", "/api/v1/pop/queue/([^/]+)", "writer",
                  "Pop from the ready partition whose oldest message is oldest", "Pop", (queue, *pop_params),
                  statuses=_WRITE),
        Operation("GET", "/api/v1/pop/queue/{queue}/partition/{partition}",
                  "/api/v1/pop/queue/([^/]+)/partition/([^/]+)", "writer", "Pop from one partition", "Pop",
                  (queue, partition, *pop_params), statuses=_WRITE),
        Operation("POST", "/api/v1/ack", "/api/v1/ack", "writer", "Settle one message", "AckResult",
                  body="Ack", statuses=_WRITE),
        Operation("POST", "/api/v1/ack/batch", "/api/v1/ack/batch", "writer", "Settle messages, one result each",
                  "AckResults", body="AckBatch", statuses=_WRITE),
        Operation("POST", "/api/v1/lease/{leaseId}/extend", "/api/v1/lease/([^/]+)/(extend|release)", "writer",
                  "Extend a lease ({} : by the queue's lease time)", "LeaseAnswer", (lease,), body="Extend",
                  body_required=False, statuses=_WRITE),
        Operation("POST", "/api/v1/lease/{leaseId}/release", "/api/v1/lease/([^/]+)/(extend|release)", "writer",
                  "End a lease now", "LeaseAnswer", (lease,), body="Release", body_required=False,
                  statuses=_WRITE),
        Operation("GET", "/api/v1/dlq", "/api/v1/dlq", "reader", "Dead letters, page by page", "DlqPage",
                  (q_queue, q_group, _query("partition", _STR), cursor, limit,
                   _query("offset", _int(0), "skip this many"))),
        Operation("DELETE", "/api/v1/dlq", "/api/v1/dlq", "admin", "Purge a queue's dead letters", "Purged",
                  (q_queue, q_group), statuses=_WRITE),
        Operation("POST", "/api/v1/dlq/requeue", "/api/v1/dlq/requeue", "writer", "Dead letters back to pending",
                  "Requeued", body="Requeue", statuses=_WRITE),
        Operation("GET", "/api/v1/resources/queues", "/api/v1/resources/queues", "reader",
                  "Every queue with its counts", "QueuePage", (prefix, cursor, limit)),
        Operation("GET", "/api/v1/resources/queues/{queue}", "/api/v1/resources/queues/([^/]+)", "reader",
                  "One queue: options, counts, groups (found: false when absent)", "QueueInfo", (queue,)),
        Operation("DELETE", "/api/v1/resources/queues/{queue}", "/api/v1/resources/queues/([^/]+)", "admin",
                  "Delete a queue, its messages and timers", "Deleted", (queue,), statuses=_WRITE),
        Operation("GET", "/api/v1/resources/queues/{queue}/partitions", "/api/v1/resources/queues/([^/]+)/partitions",
                  "reader", "A queue's partitions with each group's place", "PartitionPage",
                  (queue, q_group, prefix, cursor, limit)),
        Operation("DELETE", "/api/v1/consumer-groups/{group}/queues/{queue}",
                  "/api/v1/consumer-groups/([^/]+)/queues/([^/]+)", "admin", "Drop a group from a queue",
                  "Deleted", (group, queue, delete_metadata), statuses=_WRITE),
        Operation("DELETE", "/api/v1/consumer-groups/{group}", "/api/v1/consumer-groups/([^/]+)", "admin",
                  "Drop a group from every queue", "Deleted", (group, delete_metadata), statuses=_WRITE),
        # Tenants
        Operation("GET", "/api/v1/tenant", "/api/v1/tenant", "reader", "The caller's token, role and tenant, "
                  "with the tenant's usage, limits and pauses", "Caller"),
        Operation("GET", "/api/v1/tenants", "/api/v1/tenants", "operator", "Every tenant known", "Tenants",
                  statuses=(403,)),
        Operation("POST", "/api/v1/pause", "/api/v1/pause", "admin", "Pause a tenant's kv and/or queues writes",
                  "Paused", body="Pause", body_required=False, statuses=(403, 404, 503, 507),
                  description="Only the operator names another tenant (404 when no one knows it)."),
        Operation("POST", "/api/v1/resume", "/api/v1/resume", "admin", "Resume a tenant's writes", "Paused",
                  body="Pause", body_required=False, statuses=(403, 404, 503, 507)),
        Operation("GET", "/api/v1/server", "/api/v1/server", "reader", "Version and uptime; for the operator "
                  "also the log's size, fsync latency and connections", "ServerInfo"),
        # High availability
        Operation("GET", "/api/v1/cluster", "/api/v1/cluster", "reader", "This node's view of its cluster: role, "
                  "epoch, leader, sync set, followers' lag (role single without --cluster)", "ClusterStatus",
                  description="Answered by every node itself, leader or not."),
        Operation("POST", "/api/v1/cluster/switchover", "/api/v1/cluster/switchover", "operator",
                  "Hand leadership to a caught-up follower (planned; about a second)", "Switched",
                  body="Switchover", body_required=False, statuses=(403, 409),
                  description="A follower redirects it to the leader (307). 409: not a cluster, or no "
                              "follower can take over now."),
        Operation("POST", "/api/v1/cluster/force-promote", "/api/v1/cluster/force-promote", "operator",
                  "Make a node leader though no sync member is left: possibly lossy", "ForcePromoted",
                  body="ForcePromote", statuses=(403, 409),
                  description="Acknowledged writes the node never received are lost; the answer reports the "
                              "node's last version against the last one the old leader announced. Stop or "
                              "isolate the old leader first. Answered by any node."),
        Operation("GET", "/api/v1/admin/snapshot", "/api/v1/admin/snapshot", "operator",
                  "The whole state at one log version, as a backup file (queen backup)", None, statuses=(403,),
                  media="application/octet-stream",
                  description="The version is in the Queen-Snapshot-Version header; every write acknowledged "
                              "before the call is in it."),
        # The dashboard: a page and its files, holding no data (everything comes from the API).
        *(Operation("GET", path, path, "none", summary, None, media=media) for path, summary, media in (
            ("/", "The dashboard", "text/html"),
            ("/dashboard/index.html", "The dashboard", "text/html"),
            ("/dashboard/app.js", "The dashboard's script", "text/javascript"),
            ("/dashboard/app.css", "The dashboard's style sheet", "text/css"))),
    ]


# -- the document ---------------------------------------------------------------------------------------

# What any route may answer: a malformed call or HTTP framing (400), a body over the limit (413, also
# on a route that takes none), a head over the limit (431), a request that does not arrive in time
# (408), every connection busy (503 too_many_connections).
_COMMON = (400, 408, 413, 431, 503)
_REASONS = {400: "Bad request: the call is malformed or breaks a limit; nothing was applied",
            401: "No token, or one that is not valid",
            403: "The token's role may not make this call (with ?tenant=: only the operator reads as a tenant, "
                 "and only on reads)",
            404: "Not found",
            409: "Not possible now (a cluster change): the message says why",
            408: "The request did not arrive in time",
            413: "The request body is over the limit",
            429: "The tenant's rate or quota is spent (Retry-After)",
            431: "The request head is over the limit",
            503: "Unavailable (Retry-After): a failed disk, shutting down, every connection busy, or paused",
            507: "Versions exhausted: writes refused"}
_ROLE_TEXT = {"none": "No token needed.", "reader": "Least role: reader.", "writer": "Least role: writer.",
              "admin": "Least role: admin (of the tenant).", "operator": "Least role: operator (an admin of tenant *)."}


def _json_content(schema: dict) -> dict:
    return {media: {"schema": schema} for media in JSON_AND_CBOR}


# Every GET a reader may call reads a tenant's data: the operator names which (queen/http/routes.py,
# Api._read_as); any other token naming one is refused, and so is a route that may write.
_READ_AS = Param("tenant", "query", {"type": "string", "minLength": 1, "maxLength": 32},
                 "the operator only: read as this tenant (its names, read rights only). Any other token: 403 "
                 "tenant_forbidden; a route that writes: 403 tenant_read_only; no such tenant: 404 tenant_not_found")


def _reads_as_tenant(op: Operation) -> bool:
    return op.method == "GET" and op.role == "reader"


def _operation_object(op: Operation) -> dict:
    description = " ".join(part for part in (_ROLE_TEXT[op.role], op.description) if part)
    params = (*op.params, _READ_AS) if _reads_as_tenant(op) else op.params
    document: dict = {"summary": op.summary, "description": description, "x-queen-role": op.role,
                      "x-queen-route": op.route,
                      "operationId": (op.method.lower() + op.path.replace("{", "").replace("}", "")
                                      .replace("/", "_").replace(".", "_").replace("-", "_"))}
    if params:
        document["parameters"] = [
            {"name": p.name, "in": p.where, "required": p.where == "path", "schema": p.schema,
             **({"description": p.description} if p.description else {})} for p in params]
    if op.body is not None:
        document["requestBody"] = {
            "required": op.body_required,
            "description": "JSON, or CBOR with Content-Type: application/cbor (byte strings as they are)",
            "content": _json_content(_ref(op.body))}
    if op.answer is None:
        ok = {"description": "OK", "content": {op.media: {"schema": {"type": "string"}}}}
    else:
        ok = {"description": "OK (CBOR when the request's Accept starts application/cbor)",
              "content": _json_content(_ref(op.answer))}
    ok["headers"] = _REQUEST_ID_HEADER
    statuses = set(_COMMON) | set(op.statuses)
    if _reads_as_tenant(op):
        statuses |= {403, 404}
    if op.role != "none":
        statuses.add(401)
        document["security"] = [{"bearerAuth": []}]
    else:
        document["security"] = []
    responses = {"200": ok}
    for status in sorted(statuses):
        responses[str(status)] = {"$ref": f"#/components/responses/Error{status}"}
    document["responses"] = responses
    return document


_REQUEST_ID_HEADER = {"X-Request-Id": {"$ref": "#/components/headers/RequestId"}}


def build_document(version: str, limits: Limits | None = None) -> dict:
    """The whole document. Static for a running server: built once at its start."""
    limits = limits if limits is not None else Limits()
    paths: dict[str, dict] = {}
    for op in _operations(limits):
        paths.setdefault(op.path, {})[op.method.lower()] = _operation_object(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Queen",
            "version": version,
            "description": "A single-process coordination broker: durable KV, leased locks with fencing "
                           "tokens, timers and queues. Every refusal answers {\"error\": \"<message>\", "
                           "\"code\", \"details\", \"detail\"}; every answer carries X-Request-Id. Without an "
                           "auth file every caller is the operator.",
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(limits),
            "responses": {f"Error{status}": {"description": reason, "content": _json_content(_ref("Error")),
                                             "headers": _REQUEST_ID_HEADER}
                          for status, reason in _REASONS.items()},
            "headers": {"RequestId": {
                "description": "on every answer: the request's own X-Request-Id when it sent one of 1 to 128 "
                               "characters of A-Z a-z 0-9 . _ : -, else one the server made; log lines about the "
                               "request carry it as request_id",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}}},
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer",
                                               "description": "queen_<id>_<secret>, from `queen auth add`"}},
        },
        "security": [{"bearerAuth": []}],
    }


def operations(limits: Limits | None = None) -> list[Operation]:
    """The documented operations, for tests that hold them to the route table."""
    return _operations(limits if limits is not None else Limits())
