"""The HTTP API: routes to handlers, request documents to core operations, results to responses.

Everything a handler raises is a QueenError, mapped to an HTTP answer in connection.py. A request
is parsed and checked whole before anything is sent to a shard, so a rejected call changes nothing.
The public Queen MQ client's spellings go through queen/http/queen_mq.py on the way in and out.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote, urlencode

from queen import __version__
from queen.auth import ADMIN, OPEN, READ, SERVER, WRITE, Authenticator, Forbidden, require
from queen.core import tenants
from queen.core.kv import (
    LOCKS_NS,
    READ_OPS,
    check_fields,
    decode_cursor,
    encode_cursor,
    parse_kv_op,
    parse_kv_ops,
)
from queen.core.limits import Limits
from queen.core.locks import parse_lock_ops
from queen.core.queue_ops import (
    QUEUE_MODE_GROUP,
    Configure,
    LeaseCall,
    QueueAdmin,
    check_params,
    decode_dlq_cursor,
    group_name,
    page_limit,
    parse_ack,
    parse_acks,
    parse_configure,
    parse_extend,
    parse_next,
    parse_pop,
    parse_push,
    parse_requeue,
    query_number,
    queue_name,
    take_next,
    whole_number,
)
from queen.core.timer_ops import parse_timer_ops
from queen.errors import BadRequest, QueenError, Unavailable
from queen.histogram import RequestSeries
from queen.http import queen_mq
from queen.http.codec import CBOR, decode_body, encode_body
from queen.http.dashboard import load_assets
from queen.http.openapi import build_document
from queen.http.tenancy import AREAS, KV, QUEUES, Tenancy, audit
from queen.http.wire import Request, Response

# What every cluster node answers itself, leader or not (health and the dashboard's files too).
ANSWERED_BY_ANY_NODE = frozenset(("/metrics", "/api/v1/server", "/api/v1/cluster", "/api/v1/cluster/force-promote",
                                  "/api/v1/openapi.json"))


class NotFound(QueenError):
    http_status = 404


class MethodNotAllowed(QueenError):
    http_status = 405


# Answered inline by Api.handle, before any token is read: a health check needs none.
HEALTH_PATHS = ("/healthz", "/health")  # /health: the Queen MQ client's spelling
# A hand-off or an election is over a few hundred ms after etcd shows it, and Retry-After is
# whole seconds: a client told 1 s would wait most of a switchover out. A node that is not the
# leader says it to the millisecond in its refusal's details, which the SDK uses.
LEADER_RETRY_MS = 200


class Api:
    """The routes, as a table: method and path pattern to handler. Every handler takes the request,
    the path's captured parts and the query parameters, and returns the answer's document."""

    def __init__(self, router, limits: Limits, metrics=None, tenancy: Tenancy | None = None, backup=None,
                 server_info=None):
        self.router = router
        self.limits = limits
        self.metrics = metrics  # (tenant prefix or None for every tenant) -> the exposition text
        self.backup = backup  # async () -> (version, the backup file's bytes): queen/runtime/backup.py
        self.server_info = server_info  # async (operator: bool) -> /api/v1/server's document
        self.assets = load_assets()  # the dashboard's files, by path
        self.tenancy = tenancy if tenancy is not None else Tenancy(router)
        self.gate = Authenticator(None)  # replaced whole when the auth file is read again
        self.openapi = build_document(__version__, limits)  # GET /api/v1/openapi.json: static
        # A cluster node's coordinator (queen/cluster/coordinator.py), or None alone. A node that is
        # not the serving leader answers client routes with the way to the leader.
        self.cluster = None
        # Exact paths first (the hot ones are looked up in one dict), then patterns in order.
        # Each handler with the least a caller's role must have (queen/auth.py); a route whose
        # body may hold reads or writes (a KV batch, locks, timers, a transaction) asks for more
        # once it has seen them.
        self.exact: dict[str, dict[bytes, tuple]] = {
            "/api/v1/kv": {b"POST": (self._kv_batch, READ)},
            "/api/v1/locks": {b"POST": (self._locks, READ), b"GET": (self._list_locks, READ)},
            "/api/v1/transaction": {b"POST": (self._transaction, READ)},
            "/api/v1/timers": {b"POST": (self._timers, READ), b"GET": (self._list_timers, READ)},
            "/api/v1/configure": {b"POST": (self._configure, WRITE)},
            "/api/v1/push": {b"POST": (self._push, WRITE)},
            "/api/v1/ack": {b"POST": (self._ack, WRITE)},
            "/api/v1/ack/batch": {b"POST": (self._ack_batch, WRITE)},
            "/api/v1/dlq": {b"GET": (self._dlq, READ), b"DELETE": (self._dlq_purge, ADMIN)},
            "/api/v1/dlq/requeue": {b"POST": (self._dlq_requeue, WRITE)},
            "/api/v1/resources/queues": {b"GET": (self._queues, READ)},
            "/api/v1/tenant": {b"GET": (self._tenant, READ)},
            "/api/v1/tenants": {b"GET": (self._tenants, SERVER)},
            "/api/v1/admin/snapshot": {b"GET": (self._snapshot, SERVER)},
            "/api/v1/pause": {b"POST": (self._pause, ADMIN)},
            "/api/v1/resume": {b"POST": (self._pause, ADMIN)},
            "/api/v1/server": {b"GET": (self._server, READ)},
            "/api/v1/cluster": {b"GET": (self._cluster_status, READ)},
            "/api/v1/cluster/switchover": {b"POST": (self._switchover, SERVER)},
            "/api/v1/cluster/force-promote": {b"POST": (self._force_promote, SERVER)},
            "/metrics": {b"GET": (self._metrics, READ)},
            "/api/v1/openapi.json": {b"GET": (self._openapi, READ)},
        }
        self.patterns: list[tuple[re.Pattern, dict[bytes, tuple]]] = [
            (re.compile(r"/api/v1/kv/(.+)"), {b"GET": (self._kv_one_key, READ), b"PUT": (self._kv_one_key, WRITE),
                                              b"DELETE": (self._kv_one_key, WRITE),
                                              b"POST": (self._kv_one_key, WRITE)}),
            (re.compile(r"/api/v1/pop/queue/([^/]+)"), {b"GET": (self._pop, WRITE)}),
            (re.compile(r"/api/v1/pop/queue/([^/]+)/partition/([^/]+)"), {b"GET": (self._pop, WRITE)}),
            (re.compile(r"/api/v1/lease/([^/]+)/(extend|release)"), {b"POST": (self._lease, WRITE)}),
            (re.compile(r"/api/v1/resources/queues/([^/]+)"), {b"GET": (self._queue_info, READ),
                                                               b"DELETE": (self._queue_delete, ADMIN)}),
            (re.compile(r"/api/v1/resources/queues/([^/]+)/partitions"), {b"GET": (self._partitions, READ)}),
            (re.compile(r"/api/v1/consumer-groups/([^/]+)/queues/([^/]+)"), {b"DELETE": (self._group_delete, ADMIN)}),
            (re.compile(r"/api/v1/consumer-groups/([^/]+)"), {b"DELETE": (self._group_delete_everywhere, ADMIN)}),
            # The public Queen MQ client's timer routes: one key (its keys may hold '/'), one queue's page.
            (re.compile(r"/api/v1/timers/([^/]+)/(.+)"), {b"GET": (self._timer_one, READ),
                                                          b"DELETE": (self._timer_one, WRITE)}),
            (re.compile(r"/api/v1/timers/([^/]+)"), {b"GET": (self._timer_page, READ)}),
        ]
        # Each (route, method) counts its answers in a series of its own (/metrics), labelled by the
        # route's template, never the raw path: the labels stay as few as the routes.
        self.request_series: list[RequestSeries] = []
        self.exact = {path: self._counted(path, handlers) for path, handlers in self.exact.items()}
        self.patterns = [(pattern, self._counted(_TEMPLATES[pattern.pattern], handlers))
                         for pattern, handlers in self.patterns]
        self._health_series = {path: self._series(path, "GET") for path in ("/healthz", "/health")}
        self._kv_page_series = self._series("/api/v1/kv/{ns}", "GET")
        self._kv_incr_series = self._series("/api/v1/kv/{ns}/{key}/incr", "POST")
        self._dashboard_series = self._series("/dashboard/{file}", "GET")  # "/" included

    def _series(self, route: str, method: str) -> RequestSeries:
        series = RequestSeries(route, method)
        self.request_series.append(series)
        return series

    def _counted(self, route: str, handlers: dict[bytes, tuple]) -> dict[bytes, tuple]:
        """handlers, each (handler, level) given its series: (handler, level, series)."""
        return {method: (*entry, self._series(route, method.decode())) for method, entry in handlers.items()}

    async def handle(self, request: Request) -> Response:
        target = request.target.decode("latin-1")
        path, _, query = target.partition("?")
        method = request.method
        handlers = self.exact.get(path)
        parts: tuple = ()
        if handlers is None:
            if path in HEALTH_PATHS:
                _allow(method, b"GET")
                request.route = self._health_series[path]
                return self._health(request)
            if path == "/" or path.startswith("/dashboard/"):  # the dashboard's files: no data, no token
                _allow(method, b"GET")
                asset = self.assets.get(path)
                if asset is None:
                    raise NotFound("not_found", f"no dashboard file {path}", {"path": path[:200]})
                request.route = self._dashboard_series
                return asset
            for pattern, candidates in self.patterns:
                match = pattern.fullmatch(path)
                if match is not None:
                    handlers, parts = candidates, match.groups()
                    break
        # Who is calling comes before what exists: a caller without a valid token learns nothing,
        # not even which routes there are.
        gate = self.gate
        principal = OPEN if gate.open else gate.principal(request.authorization)
        request.principal = principal
        if handlers is None:
            raise NotFound("not_found", f"no route {path}", {"path": path[:200]})
        entry = handlers.get(method)
        if entry is None:
            names = sorted(m.decode() for m in handlers)
            raise MethodNotAllowed("method_not_allowed", f"{method.decode()} is not allowed here; use {' or '.join(names)}",
                                   {"allow": names})
        handler, level, request.route = entry
        if principal.level < level:
            raise Forbidden(principal, level)
        if "tenant" in query:
            query = self._read_as(request, level, query)
        cluster = self.cluster
        if cluster is not None and not cluster.serving and path not in ANSWERED_BY_ANY_NODE:
            return self._to_leader(request, cluster)
        document = await handler(request, parts, query)
        if type(document) is Response:  # /metrics: text, not a document
            return document
        return self._reply(request, document)

    def _read_as(self, request: Request, level: int, query: str) -> str:
        """The operator's read as one tenant (`?tenant=NAME`, the dashboard's tenant selector): for
        this request the caller is that tenant's reader, and the query goes on to the handler
        without the parameter. A tenancy boundary: anyone but the operator naming a tenant is
        refused, and so is a call that could write (a route a reader may not call, or not a GET)."""
        params = parse_qs(query, keep_blank_values=True)
        named = params.pop("tenant", None)
        if named is None:
            return query
        principal = request.principal
        if not principal.operator:
            raise QueenError("tenant_forbidden", "only the server's operator (an admin token of tenant *) may read as "
                             "a tenant (?tenant=); a tenant's own token reads its own data without it",
                             {"tenant": named[-1]}, http_status=403)
        if request.method != b"GET" or level != READ:
            raise QueenError("tenant_read_only", "?tenant= is taken on reads only (GET routes a reader may call); "
                             "write as the tenant with one of its own tokens", {"tenant": named[-1]},
                             http_status=403)
        tenant = named[-1]
        problem = tenants.name_problem(tenant)
        if problem or tenant == tenants.EVERY or len(set(named)) > 1:
            raise BadRequest("invalid_tenant", problem or "name one tenant, not '*' or several", {"tenant": tenant})
        if tenant not in self._known_tenants():
            raise NotFound("tenant_not_found", f"no tenant {tenant!r}: no token or setting in the auth file names it "
                           "and it holds nothing", {"tenant": tenant})
        request.principal = principal.reading_as(tenant)
        return urlencode(params, doseq=True)

    def _reply(self, request: Request, document, status: int = 200) -> Response:
        body, content_type = encode_body(document, request.accept.startswith(b"application/cbor"))
        return Response(status, body, content_type)

    def _health(self, request: Request) -> Response:
        """200 ok while this node can answer; 503 while it cannot: a failed log (until a restart),
        shutting down, or a cluster leader whose sync set is out of reach (until it is back: no
        restart, which would only start an election that cannot be won without the sync set)."""
        writer = self.router.writer
        failed = writer.failed
        if failed is not None:
            return self._reply(request, {"status": "failed", "reason": str(failed)}, 503)
        if self.router.draining:
            return self._reply(request, {"status": "shutting_down"}, 503)
        if writer.sync_refusal is not None:
            sync = writer.sync_refusal.details.get("sync", [])
            return self._reply(request, {"status": "sync_unavailable", "reason": (
                f"this leader's sync set ({', '.join(sync) or '-'}) is out of reach: writes are refused until it is "
                "back; do not restart this node for it")}, 503)
        return self._reply(request, {"status": "ok"})

    async def _openapi(self, request: Request, parts, query):
        """The API reference (queen/http/openapi.py), built at start."""
        check_params(_query(query), frozenset())
        return self.openapi

    # -- KV --------------------------------------------------------------------------------------

    async def _kv_batch(self, request: Request, parts, query):
        _no_params(query)
        document = decode_body(request.body, request.content_type)
        _check_batch_body(document)
        raw_ops = queen_mq.kv_ops(document.get("operations"), self.limits, request.body)
        ops = parse_kv_ops(raw_ops, self.limits, values_checked=self._values_checked(request))
        has_writes = any(op.op not in READ_OPS for op in ops)
        principal = request.principal
        if has_writes:
            require(principal, WRITE)
            self.tenancy.admit(principal, KV, len(ops), grows=sum(op.op in _KV_GROWS for op in ops))
        if principal.prefix:
            _own_kv(ops, principal.prefix)
        return {"results": queen_mq.kv_answers(await self.router.run_kv(ops, has_writes))}

    async def _kv_one_key(self, request: Request, parts, query: str):
        method = request.method
        ns_raw, slash, key_raw = parts[0].partition("/")
        ns = unquote(ns_raw)
        params = _query(query)
        if not slash or not key_raw:
            # GET /api/v1/kv/{ns}?prefix=&cursor=&limit= : one page of keys.
            _allow(method, b"GET")
            request.route = self._kv_page_series
            check_params(params, _KV_PAGE_PARAMS)
            raw = {"op": "getPrefix", "ns": ns, "prefix": params.get("prefix", "")}
            if "cursor" in params:
                raw["cursor"] = params["cursor"]
            if "limit" in params:
                raw["limit"] = whole_number(params["limit"], "limit", "invalid_limit", 1, self.limits.page_items_max)
            return await self._one(request, raw)
        # A parameter the route does not take is refused, never ignored: a misspelt ?expect= must not
        # turn a conditional delete into a blind one (and a PUT's expect goes in its body).
        check_params(params, _KV_DELETE_PARAMS if method == b"DELETE" else frozenset())
        if method == b"POST":
            if not key_raw.endswith("/incr"):
                raise MethodNotAllowed("method_not_allowed", "POST on a key is only .../incr", {"allow": ["GET", "PUT", "DELETE"]})
            request.route = self._kv_incr_series
            raw = self._body_object(request, required=False, allowed=_INCR_BODY)
            raw.update(op="incr", ns=ns, key=unquote(key_raw[:-len("/incr")]))
            return await self._one(request, raw)
        key = unquote(key_raw)
        if method == b"GET":
            return await self._one(request, {"op": "get", "ns": ns, "key": key})
        if method == b"PUT":
            raw = self._body_object(request, required=True, allowed=_PUT_BODY)
            if_absent = raw.pop("ifAbsent", False)
            if if_absent is not True and if_absent is not False:
                raise BadRequest("invalid_if_absent", "ifAbsent must be true or false")
            raw.update(op="putIfAbsent" if if_absent is True else "put", ns=ns, key=key)
            return await self._one(request, raw)
        if method == b"DELETE":
            raw = {"op": "delete", "ns": ns, "key": key}
            if "expect" in params:
                raw["expect"] = whole_number(params["expect"], "expect", "invalid_expect")
            return await self._one(request, raw)
        raise MethodNotAllowed("method_not_allowed", f"{method.decode()} is not allowed here", {"allow": ["GET", "PUT", "DELETE"]})

    # -- locks and transactions --------------------------------------------------------------------

    async def _locks(self, request: Request, parts, query):
        _no_params(query)
        document = decode_body(request.body, request.content_type)
        _check_batch_body(document)
        ops = parse_lock_ops(document.get("operations"), self.limits)
        principal = request.principal
        if any(op.op != "get" for op in ops):
            require(principal, WRITE)
            # Locks are KV rows: they count against its KV quota and rate, and a KV pause stops them.
            self.tenancy.admit(principal, KV, len(ops), grows=sum(op.op == "acquire" for op in ops))
        if principal.prefix:
            ns = principal.prefix + LOCKS_NS
            for op in ops:
                op.ns = ns
        results = await self.router.run_locks(ops, wait_gone=request.wait_gone, answer_now=request.answer_now)
        if principal.level >= ADMIN and principal is not OPEN:
            for op, result in zip(ops, results, strict=True):
                if op.op == "release" and op.owner is None and result.get("released"):
                    # By token alone, not as its owner: a stuck permit an admin freed by hand.
                    audit(request, "lock_force_release", lock=op.name, slot=op.slot, lock_token=op.token)
        return {"results": results}

    async def _list_locks(self, request: Request, parts, query: str):
        params = _query(query)
        check_params(params, _PAGE_PARAMS)
        prefix = params.get("prefix", "")
        if len(prefix.encode()) > self.limits.lock_name_bytes_max:
            raise BadRequest("invalid_prefix", f"prefix must be at most {self.limits.lock_name_bytes_max} bytes")
        return await self.router.list_permits(prefix, decode_cursor(params.get("cursor")), page_limit(params, self.limits),
                                              request.principal.prefix + LOCKS_NS)

    async def _transaction(self, request: Request, parts, query):
        _no_params(query)
        document = decode_body(request.body, request.content_type)
        raw_next = take_next(document)
        txn, spelling = queen_mq.parse_transaction_document(document, self.limits, self.router.now_ms())
        principal = request.principal
        pop = None if raw_next is None else self._next_pop(request, raw_next)
        if txn.writes():
            require(principal, WRITE)
            # A `next` pop counts as a second write of the call, and its operation, like a pop.
            extra = pop is not None
            operations = len(txn.kv) + len(txn.ack) + len(txn.push) + len(txn.timers) + extra
            if txn.kv:
                self.tenancy.admit(principal, KV, operations, grows=sum(op.op in _KV_GROWS for op in txn.kv),
                                   writes=1 + extra)
            if txn.ack or txn.push or txn.timers or extra:
                # One call, so its write is counted once: here only when it had no KV part.
                self.tenancy.admit(principal, QUEUES, operations,
                                   pushes=len(txn.push), timers=sum(op.op == "schedule" for op in txn.timers),
                                   rate=not txn.kv, writes=1 + extra)
        elif pop is not None:
            self.tenancy.admit(principal, QUEUES, 1)
        if principal.prefix:  # every name its own: a transaction cannot reach another tenant's
            prefix = principal.prefix
            _own_kv(txn.kv, prefix)
            for item in txn.ack:
                item.prefix = prefix
            for item in txn.push:
                item.queue = prefix + item.queue
            for op in txn.timers:
                op.queue = prefix + op.queue
            txn.prefix = prefix
        if pop is None:
            return queen_mq.transaction_answer(txn, spelling, await self.router.run_transaction(txn))
        if pop.queue is None or pop.group is None:
            if not txn.ack:
                if pop.queue is None:
                    raise BadRequest("next_queue_required", "next.queue is required when the transaction acks "
                                     "nothing (it is the acked message's queue otherwise)", {"section": "next"})
            else:
                self.router.next_defaults(pop, txn.ack[0], principal.prefix)
            if pop.group is None:
                pop.group = QUEUE_MODE_GROUP
        txn.next = pop
        answer = await self.router.run_transaction(txn, wait_gone=request.wait_gone, answer_now=request.answer_now)
        next_part = {"next": answer.pop("next"), **({"nextReason": answer.pop("nextReason")} if "nextReason" in answer else {})}
        return {**queen_mq.transaction_answer(txn, spelling, answer), **next_part}

    async def _timers(self, request: Request, parts, query):
        _no_params(query)
        document = decode_body(request.body, request.content_type)
        _check_batch_body(document)
        raw_ops, spelled = queen_mq.timer_ops(document.get("operations"))
        ops = parse_timer_ops(raw_ops, self.limits, self.router.now_ms())
        principal = request.principal
        if any(op.op != "get" for op in ops):
            require(principal, WRITE)
            self.tenancy.admit(principal, QUEUES, len(ops), timers=sum(op.op == "schedule" for op in ops))
        if principal.prefix:
            for op in ops:
                op.queue = principal.prefix + op.queue
        return {"results": queen_mq.timer_answers(ops, spelled, await self.router.timers(ops))}

    async def _list_timers(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, frozenset(("queue", "prefix", "cursor", "limit")))
        queue = queue_name(params.get("queue"), self.limits)
        prefix = params.get("prefix", "")
        if len(prefix.encode()) > self.limits.timer_key_bytes_max:
            raise BadRequest("invalid_prefix", f"prefix must be at most {self.limits.timer_key_bytes_max} bytes")
        after = decode_cursor(params.get("cursor"))
        return await self.router.list_timers(request.principal.prefix + queue, prefix, after,
                                             page_limit(params, self.limits))

    # -- queues -------------------------------------------------------------------------------------

    async def _configure(self, request: Request, parts, query):
        _no_params(query)
        document = queen_mq.configure_document(decode_body(request.body, request.content_type))
        queue, changes = parse_configure(document, self.limits)
        self.tenancy.admit(request.principal, QUEUES, 1)
        queue = request.principal.prefix + queue
        return await self.router.run_queue(queue, Configure(queue, changes))

    async def _push(self, request: Request, parts, query):
        _no_params(query)
        items = parse_push(queen_mq.push_document(decode_body(request.body, request.content_type)), self.limits)
        principal = request.principal
        self.tenancy.admit(principal, QUEUES, len(items), pushes=len(items))
        if principal.prefix:
            for item in items:
                item.queue = principal.prefix + item.queue
        return await self.router.push(items)

    async def _pop(self, request: Request, parts, query):
        queue = unquote(parts[0])
        partition = unquote(parts[1]) if len(parts) > 1 else None
        op = parse_pop(queue, partition, queen_mq.pop_params(_query(query), self.limits), self.limits)
        principal = request.principal
        self.tenancy.admit(principal, QUEUES, 1)
        if principal.prefix:
            op.queue = principal.prefix + op.queue
        return await self.router.run_queue(op.queue, op, wait_gone=request.wait_gone, answer_now=request.answer_now)

    async def _ack(self, request: Request, parts, query):
        _no_params(query)
        document = decode_body(request.body, request.content_type)
        raw_next = take_next(document)
        item = parse_ack(document, self.limits)
        item.prefix = request.principal.prefix
        if raw_next is not None:
            results, next_answer = await self._acks_then_pop(request, [item], raw_next)
            [result] = results
            result.pop("index", None)
            result["next"] = next_answer
            return result
        self.tenancy.admit(request.principal, QUEUES, 1)
        [result] = await self.router.ack([item])
        result.pop("index", None)
        return result

    async def _ack_batch(self, request: Request, parts, query):
        _no_params(query)
        document = decode_body(request.body, request.content_type)
        raw_next = take_next(document)
        items = parse_acks(document, self.limits)
        prefix = request.principal.prefix
        for item in items:
            item.prefix = prefix
        if raw_next is not None:  # the answer is then an object: the acks' results and the pop's answer
            results, next_answer = await self._acks_then_pop(request, items, raw_next)
            return {"results": results, "next": next_answer}
        self.tenancy.admit(request.principal, QUEUES, len(items))
        return await self.router.ack(items)

    async def _acks_then_pop(self, request: Request, items: list, raw_next) -> tuple[list, dict]:
        """Acks with `next`: the pop is admitted like one (its own write on the tenant's rate) and
        made on the state the acks left (queen/runtime/router.py, ack_next)."""
        op = self._next_pop(request, raw_next)
        self.tenancy.admit(request.principal, QUEUES, len(items) + 1, writes=2)
        self.router.next_defaults(op, items[0], request.principal.prefix)
        return await self.router.ack_next(items, op, wait_gone=request.wait_gone, answer_now=request.answer_now)

    def _next_pop(self, request: Request, raw_next):
        """A `next` pop of the caller's own queue (a pop needs WRITE)."""
        require(request.principal, WRITE)
        op = parse_next(raw_next, self.limits)
        if op.queue is not None:
            op.queue = request.principal.prefix + op.queue
        return op

    async def _lease(self, request: Request, parts, query):
        _no_params(query)
        lease_raw, action = parts
        document = decode_body(request.body, request.content_type) if request.body else None
        prefix = request.principal.prefix
        self.tenancy.admit(request.principal, QUEUES, 1)
        if action == "release":
            if document not in (None, {}):
                raise BadRequest("unknown_field", "release takes no fields: send {} or no body")
            lease_id, _ = parse_extend(lease_raw, None, self.limits)
            return await self.router.lease_call(LeaseCall("release", lease_id, prefix=prefix))
        lease_id, seconds = parse_extend(lease_raw, document, self.limits)
        return await self.router.lease_call(LeaseCall("extend", lease_id, seconds, prefix=prefix))

    async def _dlq(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, _DLQ_PARAMS)
        queue = queue_name(params.get("queue"), self.limits)
        group = params.get("consumerGroup")
        group = None if group is None else group_name(group, self.limits)
        partition = params.get("partition")
        skip = query_number(params, "offset", "invalid_offset", 0)
        queue = request.principal.prefix + queue
        op = QueueAdmin("dlq", queue, group=group, partition=partition, cursor=decode_dlq_cursor(params.get("cursor")), skip=skip,
                        limit=page_limit(params, self.limits))
        return await self.router.run_queue(queue, op)

    async def _dlq_purge(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, frozenset(("queue", "consumerGroup")))
        queue = queue_name(params.get("queue"), self.limits)
        group = params.get("consumerGroup")
        group = None if group is None else group_name(group, self.limits)
        self.tenancy.admit(request.principal, QUEUES, 1)
        result = await self.router.run_queue(request.principal.prefix + queue,
                                             QueueAdmin("purge", request.principal.prefix + queue, group=group))
        audit(request, "dlq_purge", queue=queue, group=group)
        return result

    async def _dlq_requeue(self, request: Request, parts, query):
        _no_params(query)
        queue, group, items = parse_requeue(decode_body(request.body, request.content_type), self.limits)
        self.tenancy.admit(request.principal, QUEUES, len(items))
        queue = request.principal.prefix + queue
        return await self.router.run_queue(queue, QueueAdmin("requeue", queue, group=group, items=items))

    async def _queues(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, frozenset(("prefix", "cursor", "limit")))
        after = decode_cursor(params.get("cursor"))
        return await self.router.list_queues(params.get("prefix", ""), after, page_limit(params, self.limits),
                                             request.principal.prefix)

    async def _queue_info(self, request: Request, parts, query):
        check_params(_query(query), frozenset())
        queue = request.principal.prefix + queue_name(unquote(parts[0]), self.limits)
        return await self.router.run_queue(queue, QueueAdmin("info", queue))

    async def _queue_delete(self, request: Request, parts, query):
        check_params(_query(query), frozenset())
        shown_name = queue_name(unquote(parts[0]), self.limits)
        queue = request.principal.prefix + shown_name
        self.tenancy.admit(request.principal, QUEUES, 1)
        result = await self.router.run_queue(queue, QueueAdmin("delete", queue))
        audit(request, "queue_delete", queue=shown_name)
        return result

    async def _partitions(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, frozenset(("consumerGroup", "prefix", "cursor", "limit")))
        queue = request.principal.prefix + queue_name(unquote(parts[0]), self.limits)
        group = params.get("consumerGroup")
        group = None if group is None else group_name(group, self.limits)
        after = decode_cursor(params.get("cursor"))
        page = await self.router.run_queue(queue, QueueAdmin(
            "partitions", queue, group=group, prefix=params.get("prefix", ""), cursor=after,
            limit=page_limit(params, self.limits)))
        return {"items": page["items"], "cursor": encode_cursor(page["after"]) if page["after"] is not None else None}

    async def _group_delete(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, frozenset(("deleteMetadata",)))
        group = group_name(unquote(parts[0]), self.limits)
        shown_name = queue_name(unquote(parts[1]), self.limits)
        queue = request.principal.prefix + shown_name
        self.tenancy.admit(request.principal, QUEUES, 1)
        result = await self.router.run_queue(queue, QueueAdmin("delete_group", queue, group=group))
        audit(request, "group_delete", queue=shown_name, group=group)
        return result

    async def _timer_one(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, frozenset(("txn",)))
        kind = "cancel" if request.method == b"DELETE" else "get"
        [op] = parse_timer_ops([{"op": kind, "queue": unquote(parts[0]), "key": unquote(parts[1])}], self.limits,
                               self.router.now_ms())
        if kind == "cancel":
            self.tenancy.admit(request.principal, QUEUES, 1)
        op.queue = request.principal.prefix + op.queue
        [result] = await self.router.timers([op])
        queen_mq.timer_answer(op, True, result)
        if kind == "cancel" and "txn" in params:
            result["txn"] = params["txn"]  # echoed on absent too: it may have fired, with this id
        return result

    async def _timer_page(self, request: Request, parts, query):
        """A queue's pending timers, as the Queen MQ client pages them: rows, truncated, nextAfter."""
        params = _query(query)
        check_params(params, frozenset(("after", "limit")))
        queue = request.principal.prefix + queue_name(unquote(parts[0]), self.limits)
        after = params.get("after") or None
        # The Queen MQ client's page size, held to ours rather than refused.
        limit = min(query_number(params, "limit", "invalid_limit", 100), self.limits.page_items_max)
        return queen_mq.timer_page(await self.router.list_timers(queue, "", after, max(1, limit)))

    async def _group_delete_everywhere(self, request: Request, parts, query):
        params = _query(query)
        check_params(params, frozenset(("deleteMetadata",)))
        group = group_name(unquote(parts[0]), self.limits)
        self.tenancy.admit(request.principal, QUEUES, 1)
        result = await self.router.delete_group_everywhere(group, request.principal.prefix)
        audit(request, "group_delete", queue="*", group=group)
        return result

    # -- the server --------------------------------------------------------------------------------

    async def _server(self, request: Request, parts, query):
        """Version and uptime for any caller; the log, fsync latency, connections and data
        directory only for the operator (they are the whole server's, not a tenant's)."""
        check_params(_query(query), frozenset())
        if self.server_info is None:
            return {"version": __version__}
        return await self.server_info(request.principal.operator)

    # -- high availability ---------------------------------------------------------------------------

    def _to_leader(self, request: Request, cluster) -> Response:
        """A node that is not the serving leader: 307 to the leader (same path and query; the
        method and body are kept by the client), or 503 while there is none to send it to."""
        advertise = cluster.leader_advertise
        if advertise:
            error = QueenError("not_leader", f"this node does not lead; the leader is at {advertise}",
                               {"leader": advertise, "epoch": cluster.epoch})
            body, content_type = encode_body(error.to_wire(), request.accept.startswith(b"application/cbor"))
            location = advertise.rstrip("/").encode() + request.target
            return Response(307, body, content_type, [(b"location", location)])
        if cluster.role in ("fenced", "promoting", "candidate"):
            detail = ""
            sync = cluster.sync if cluster.role == "promoting" else None
            if sync is not None and sync.members:
                # Strict mode with no caught-up follower to swap in waits for a member to come back.
                detail = (f"; its first record waits for the ack of its sync set ({', '.join(sorted(sync.members))})"
                          " before it serves")
            raise Unavailable("not_leader", f"this node is {cluster.role}: not serving{detail}; try again shortly",
                              {"role": cluster.role, "epoch": cluster.epoch, "retryAfterMs": LEADER_RETRY_MS})
        raise Unavailable("no_leader", "the cluster has no leader right now (an election, or this node cannot reach "
                          "etcd: see its log); try again shortly",
                          {"role": cluster.role, "epoch": cluster.epoch, "retryAfterMs": LEADER_RETRY_MS})

    async def _cluster_status(self, request: Request, parts, query):
        check_params(_query(query), frozenset())
        if self.cluster is None:
            return {"cluster": None, "node": None, "role": "single", "epoch": 0, "serving": True, "leader": None,
                    "sync": [], "degraded": False, "syncUnavailable": False,
                    "lastVersion": self.router.writer.durable_version, "followers": []}
        return self.cluster.status()

    def _cluster_call(self, request: Request, fields: frozenset, needs: str | None) -> dict:
        document = decode_body(request.body, request.content_type) if request.body else {}
        if type(document) is not dict:
            raise BadRequest("invalid_body", "the body must be an object")
        check_fields(document, fields, None, "body")
        for name in fields:
            value = document.get(name)
            if (value is None and name == needs) or (value is not None and (type(value) is not str or not value)):
                raise BadRequest("invalid_body", f"{name} must be a node's id")
        if self.cluster is None:
            raise QueenError("not_clustered", "this server runs alone (no --cluster)", http_status=409)
        return document

    async def _switchover(self, request: Request, parts, query):
        check_params(_query(query), frozenset())
        document = self._cluster_call(request, frozenset(("to",)), None)
        from queen.cluster.coordinator import NotPossible

        try:
            report = await self.cluster.switchover(document.get("to"))
        except NotPossible as refused:
            raise QueenError("switchover_refused", str(refused), http_status=409) from None
        audit(request, "cluster_switchover", to=report["to"], epoch=report["epoch"])
        return report

    async def _force_promote(self, request: Request, parts, query):
        check_params(_query(query), frozenset())
        document = self._cluster_call(request, frozenset(("node",)), "node")
        from queen.cluster.coordinator import NotPossible
        from queen.cluster.etcd import EtcdError, EtcdUnavailable

        try:
            report = await self.cluster.force_promote(document["node"])
        except NotPossible as refused:
            raise QueenError("force_promote_refused", str(refused), http_status=409) from None
        except (EtcdUnavailable, EtcdError) as error:
            raise Unavailable("etcd_unavailable", f"etcd did not take the change: {error}") from None
        audit(request, "cluster_force_promote", node=report["node"], old_leader=report["oldLeader"],
              may_be_lost=report["mayBeLost"])
        return report

    # -- tenants -------------------------------------------------------------------------------------

    async def _metrics(self, request: Request, parts, query):
        principal = request.principal
        tenant = None if principal.operator else (
            tenants.DEFAULT if principal.tenant == tenants.EVERY else principal.tenant)
        text = self.metrics(tenant) if self.metrics is not None else ""
        return Response(200, text.encode(), b"text/plain; version=0.0.4")

    def _tenant_view(self, tenant: str) -> dict:
        rules = self.tenancy.rules.get(tenant)
        usage = self.router.usage.of_tenant.get(tenant)
        limits = {}
        if rules is not None:
            limits = dict(rules.quotas)
            if rules.writes is not None:
                limits["writesPerSecond"] = rules.writes.rate
            if rules.operations is not None:
                limits["operationsPerSecond"] = rules.operations.rate
        paused = self.tenancy.paused.get(tenant, frozenset())
        return {"tenant": tenant, "usage": usage.wire() if usage is not None else None, "limits": limits,
                "paused": {area: area in paused for area in AREAS}, "pausedBy": dict(paused)}

    async def _tenant(self, request: Request, parts, query):
        """The caller: its token's name, role and tenant, and the tenant's usage, limits and pauses."""
        check_params(_query(query), frozenset())
        principal = request.principal
        tenant = tenants.DEFAULT if principal.tenant == tenants.EVERY else principal.tenant
        return {"token": principal.name, "role": principal.role,
                "tokenTenant": tenants.EVERY if principal.read_as else principal.tenant, **self._tenant_view(tenant)}

    async def _tenants(self, request: Request, parts, query):
        """The operator's view: every tenant the auth file or the data knows."""
        check_params(_query(query), frozenset())
        return {"items": [self._tenant_view(tenant) for tenant in sorted(self._known_tenants())]}

    async def _snapshot(self, request: Request, parts, query):
        """The whole state at one version, as a backup file (queen/runtime/backup.py) that
        `queen restore` turns into a data directory. The operator's: it holds every tenant."""
        check_params(_query(query), frozenset())
        if self.backup is None:
            raise NotFound("not_found", "this server takes no backups", {"path": "/api/v1/admin/snapshot"})
        version, data = await self.backup()
        audit(request, "snapshot", version=version, bytes=len(data))
        return Response(200, data, b"application/octet-stream", [(b"queen-snapshot-version", b"%d" % version)])

    def _known_tenants(self) -> set[str]:
        """The default tenant, those the auth file names, and any that holds something."""
        auth_file = self.gate.auth_file
        known = {tenants.DEFAULT, *self.tenancy.rules, *self.router.usage.of_tenant}
        known.update(tenant for tenant, areas in self.tenancy.paused.items() if areas)
        if auth_file is not None:
            known.update(token.tenant for token in auth_file.tokens if token.tenant != tenants.EVERY)
        return known

    async def _pause(self, request: Request, parts, query):
        """POST /api/v1/pause or /resume {"kv": true, "queues": true[, "tenant": t]}: writes of those
        areas answer 503 paused until resumed; reads go on. Only the operator names another tenant."""
        check_params(_query(query), frozenset())
        document = decode_body(request.body, request.content_type) if request.body else {}
        if type(document) is not dict:
            raise BadRequest("invalid_body", 'the body must be an object: {"kv": true, "queues": true}')
        check_fields(document, _PAUSE_BODY, None, "body")
        principal = request.principal
        pausing = request.target.startswith(b"/api/v1/pause")
        own = tenants.DEFAULT if principal.tenant == tenants.EVERY else principal.tenant
        tenant = document.get("tenant", own)
        if tenant != own:
            require(principal, SERVER)
            problem = tenants.name_problem(tenant) if isinstance(tenant, str) else "tenant must be a string"
            if problem or tenant == tenants.EVERY:
                raise BadRequest("invalid_tenant", problem or "name one tenant, not '*'")
            if tenant not in self._known_tenants():
                raise NotFound("tenant_not_found", f"no tenant {tenant!r}: no token or settings in the auth file name "
                               "it and it holds nothing", {"tenant": tenant})
        areas = {}
        for area in AREAS:
            value = document.get(area, False)
            if value is not True and value is not False:
                raise BadRequest("invalid_body", f"{area} must be true or false")
            if value:
                areas[area] = pausing
        if not areas:
            raise BadRequest("invalid_body", 'say what: {"kv": true} (locks included), {"queues": true}, or both')
        self.router.refuse_writes_if_unavailable()
        paused = await self.tenancy.set_paused(tenant, areas, "operator" if principal.operator else "admin")
        audit(request, "pause" if pausing else "resume", target_tenant=tenant,
              areas=",".join(sorted(areas)))
        return {"tenant": tenant, "paused": {area: area in paused for area in AREAS}}

    def _values_checked(self, request: Request) -> bool:
        """A JSON body decoded by orjson re-encodes to valid JSON, and (floats such as 1e2 can grow
        when re-encoded) a body of at most half the value limit cannot hold a value over it."""
        return not request.content_type.startswith(CBOR) and len(request.body) * 2 <= self.limits.value_bytes_max

    def _body_object(self, request: Request, required: bool, allowed: frozenset) -> dict:
        """The body of a one-key route: an object of the fields its op takes, less those the path gives."""
        if not request.body and not required:
            return {}
        document = decode_body(request.body, request.content_type)
        if type(document) is not dict:
            raise BadRequest("invalid_body", "the body must be an object")
        check_fields(document, allowed, None, "body")
        return document

    async def _one(self, request: Request, raw: dict):
        op = parse_kv_op(raw, None, self.limits)
        writes = op.op not in READ_OPS
        principal = request.principal
        if writes:
            self.tenancy.admit(principal, KV, 1, grows=op.op in _KV_GROWS)
        if principal.prefix:
            _own_kv([op], principal.prefix)
        return queen_mq.kv_answers(await self.router.run_kv([op], writes))[0]


# The label each pattern's requests are counted under (/metrics).
_TEMPLATES = {
    r"/api/v1/kv/(.+)": "/api/v1/kv/{ns}/{key}",
    r"/api/v1/pop/queue/([^/]+)": "/api/v1/pop/queue/{queue}",
    r"/api/v1/pop/queue/([^/]+)/partition/([^/]+)": "/api/v1/pop/queue/{queue}/partition/{partition}",
    r"/api/v1/lease/([^/]+)/(extend|release)": "/api/v1/lease/{lease}/{action}",
    r"/api/v1/resources/queues/([^/]+)": "/api/v1/resources/queues/{queue}",
    r"/api/v1/resources/queues/([^/]+)/partitions": "/api/v1/resources/queues/{queue}/partitions",
    r"/api/v1/consumer-groups/([^/]+)/queues/([^/]+)": "/api/v1/consumer-groups/{group}/queues/{queue}",
    r"/api/v1/consumer-groups/([^/]+)": "/api/v1/consumer-groups/{group}",
    r"/api/v1/timers/([^/]+)/(.+)": "/api/v1/timers/{queue}/{key}",
    r"/api/v1/timers/([^/]+)": "/api/v1/timers/{queue}",
}
_KV_GROWS = frozenset(("put", "putIfAbsent", "incr"))
_PAUSE_BODY = frozenset(("kv", "queues", "tenant"))


def _own_kv(ops, prefix: str) -> None:
    """The tenant's own namespaces: what its names are stored as (queen/core/tenants.py)."""
    for op in ops:
        op.ns = prefix + op.ns


_DLQ_PARAMS = frozenset(("queue", "consumerGroup", "partition", "cursor", "limit", "offset"))
_PUT_BODY = frozenset(("value", "ttlSeconds", "forever", "expect", "ifAbsent"))
_INCR_BODY = frozenset(("by", "max", "min", "ttlSeconds", "forever", "expect"))
_BATCH_BODY = frozenset(("operations",))


def _check_batch_body(document) -> None:
    if type(document) is not dict:
        raise BadRequest("invalid_body", 'the body must be an object: {"operations": [...]}')
    check_fields(document, _BATCH_BODY, None, "body")


def _allow(method: bytes, *allowed: bytes) -> None:
    if method not in allowed:
        names = [a.decode() for a in allowed]
        raise MethodNotAllowed("method_not_allowed", f"{method.decode()} is not allowed here; use {' or '.join(names)}",
                               {"allow": names})


_PAGE_PARAMS = frozenset(("prefix", "cursor", "limit"))
_KV_PAGE_PARAMS = _PAGE_PARAMS
_KV_DELETE_PARAMS = frozenset(("expect",))


def _no_params(query: str) -> None:
    """A route whose request is all in its body takes no query parameter: one sent is refused
    rather than ignored (a caller who put `?expect=` there meant something by it)."""
    if query:
        check_params(_query(query), frozenset())


def _query(query: str) -> dict[str, str]:
    return {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}

