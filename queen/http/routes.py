"""The HTTP API: routes to handlers, request documents to core operations, results to responses.

Everything a handler raises is a QueenError, mapped to an HTTP answer in connection.py. A request
is parsed and checked whole before anything is sent to a shard, so a rejected call changes nothing.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote

from queen.core.kv import READ_OPS, check_fields, decode_cursor, parse_kv_op, parse_kv_ops
from queen.core.limits import Limits
from queen.core.locks import parse_lock_ops
from queen.core.txn import LATER_SECTIONS, SECTIONS, check_transaction_ops
from queen.errors import BadRequest, QueenError
from queen.http.codec import CBOR, decode_body, encode_body
from queen.http.connection import Request, Response

API = "/api/v1/"
KV_PREFIX = "/api/v1/kv/"


class NotFound(QueenError):
    http_status = 404


class MethodNotAllowed(QueenError):
    http_status = 405


class Api:
    def __init__(self, router, limits: Limits, metrics=None):
        self.router = router
        self.limits = limits
        self.metrics = metrics

    async def handle(self, request: Request) -> Response:
        target = request.target.decode("latin-1")
        path, _, query = target.partition("?")
        method = request.method
        if path == "/api/v1/kv":
            _allow(method, b"POST")
            return self._reply(request, await self._kv_batch(request))
        if path.startswith(KV_PREFIX):
            return self._reply(request, await self._kv_one_key(request, method, path[len(KV_PREFIX):], query))
        if path == "/api/v1/locks":
            if method == b"GET":
                return self._reply(request, await self._list_locks(query))
            _allow(method, b"POST", b"GET")
            return self._reply(request, await self._locks(request))
        if path == "/api/v1/transaction":
            _allow(method, b"POST")
            return self._reply(request, await self._transaction(request))
        if path == "/healthz":
            _allow(method, b"GET")
            return self._health(request)
        if path == "/metrics":
            _allow(method, b"GET")
            text = self.metrics() if self.metrics is not None else ""
            return Response(200, text.encode(), b"text/plain; version=0.0.4")
        raise NotFound("not_found", f"no route {path}", {"path": path[:200]})

    def _reply(self, request: Request, document, status: int = 200) -> Response:
        body, content_type = encode_body(document, request.accept.startswith(b"application/cbor"))
        return Response(status, body, content_type)

    def _health(self, request: Request) -> Response:
        failed = self.router.writer.failed
        if failed is not None:
            return self._reply(request, {"status": "failed", "reason": str(failed)}, 503)
        if self.router.draining:
            return self._reply(request, {"status": "shutting_down"}, 503)
        return self._reply(request, {"status": "ok"})

    # -- KV --------------------------------------------------------------------------------------

    async def _kv_batch(self, request: Request):
        document = decode_body(request.body, request.content_type)
        _check_batch_body(document)
        ops = parse_kv_ops(document.get("operations"), self.limits, values_checked=self._values_checked(request))
        has_writes = any(op.op not in READ_OPS for op in ops)
        return {"results": await self.router.run_kv(ops, has_writes)}

    async def _kv_one_key(self, request: Request, method: bytes, rest: str, query: str):
        ns_raw, slash, key_raw = rest.partition("/")
        ns = unquote(ns_raw)
        params = _query(query)
        if not slash or not key_raw:
            # GET /api/v1/kv/{ns}?prefix=&cursor=&limit= : one page of keys.
            _allow(method, b"GET")
            raw = {"op": "getPrefix", "ns": ns, "prefix": params.get("prefix", "")}
            if "cursor" in params:
                raw["cursor"] = params["cursor"]
            if "limit" in params:
                raw["limit"] = _int_param(params, "limit")
            return await self._one(raw)
        if method == b"POST":
            if not key_raw.endswith("/incr"):
                raise MethodNotAllowed("method_not_allowed", "POST on a key is only .../incr", {"allow": ["GET", "PUT", "DELETE"]})
            raw = self._body_object(request, required=False, allowed=_INCR_BODY)
            raw.update(op="incr", ns=ns, key=unquote(key_raw[:-len("/incr")]))
            return await self._one(raw)
        key = unquote(key_raw)
        if method == b"GET":
            return await self._one({"op": "get", "ns": ns, "key": key})
        if method == b"PUT":
            raw = self._body_object(request, required=True, allowed=_PUT_BODY)
            if_absent = raw.pop("ifAbsent", False)
            if if_absent is not True and if_absent is not False:
                raise BadRequest("invalid_if_absent", "ifAbsent must be true or false")
            raw.update(op="putIfAbsent" if if_absent is True else "put", ns=ns, key=key)
            return await self._one(raw)
        if method == b"DELETE":
            raw = {"op": "delete", "ns": ns, "key": key}
            if "expect" in params:
                raw["expect"] = _int_param(params, "expect")
            return await self._one(raw)
        raise MethodNotAllowed("method_not_allowed", f"{method.decode()} is not allowed here", {"allow": ["GET", "PUT", "DELETE"]})

    # -- locks and transactions --------------------------------------------------------------------

    async def _locks(self, request: Request):
        document = decode_body(request.body, request.content_type)
        _check_batch_body(document)
        ops = parse_lock_ops(document.get("operations"), self.limits)
        return {"results": await self.router.run_locks(ops, wait_gone=request.wait_gone)}

    async def _list_locks(self, query: str):
        params = _query(query)
        prefix = params.get("prefix", "")
        if len(prefix.encode()) > self.limits.lock_name_bytes_max:
            raise BadRequest("invalid_prefix", f"prefix must be at most {self.limits.lock_name_bytes_max} bytes")
        limit = _int_param(params, "limit") if "limit" in params else 100
        if not 1 <= limit <= self.limits.page_items_max:
            raise BadRequest("invalid_limit", f"limit must be from 1 to {self.limits.page_items_max}")
        return await self.router.list_permits(prefix, decode_cursor(params.get("cursor")), limit)

    async def _transaction(self, request: Request):
        document = decode_body(request.body, request.content_type)
        if type(document) is not dict:
            raise BadRequest("invalid_body", 'the body must be an object: {"kv": [...]}')
        for section in document:
            if type(section) is not str:
                raise BadRequest("unknown_section", "section names are strings", {"section": section})
            if section in LATER_SECTIONS:
                raise BadRequest("unsupported_section", f"the {section} section is not available on this server yet",
                                 {"section": section})
            if section not in SECTIONS:
                raise BadRequest("unknown_section", f"unknown section {section!r}; a transaction has: {', '.join(SECTIONS)}",
                                 {"section": section})
        ops = parse_kv_ops(document.get("kv"), self.limits)
        check_transaction_ops(ops)
        return await self.router.run_transaction(ops)

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

    async def _one(self, raw: dict):
        op = parse_kv_op(raw, None, self.limits)
        return (await self.router.run_kv([op], op.op not in READ_OPS))[0]


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


def _query(query: str) -> dict[str, str]:
    return {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}


def _int_param(params: dict, name: str) -> int:
    raw = params[name]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19):
        raise BadRequest(f"invalid_{name}", f"{name} must be a whole number")
    return int(raw)
