"""A small etcd v3 client for trio, over etcd's JSON gateway (plain HTTP/1.1, h11).

Why the gateway and not gRPC: the gateway is part of every etcd 3.x server, so nothing new is
installed, and the few calls the coordinator makes (a read, a txn, a lease keepalive every second)
cost nothing worth a gRPC stack. Keys and values travel base64-encoded, numbers as strings.

Owns: a few keep-alive connections (one per request in flight, reused), the endpoint list and
failing over along it on connection errors and timeouts, and turning etcd's answers into plain
values. Every way the cluster can be out of reach (refused, reset, timed out, an etcd without a
leader) raises EtcdUnavailable; a request etcd understood and refused (a lease that no longer
exists) raises EtcdError with etcd's gRPC code.

Leader changes are noticed by the caller polling one txn of ranges (coordinator.py says why).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

# gRPC codes etcd answers that mean "not now" rather than "no": an election, a deadline.
_UNAVAILABLE_CODES = frozenset((4, 14))  # DEADLINE_EXCEEDED, UNAVAILABLE
NOT_FOUND = 5  # a lease that expired or was revoked
_BODY_BYTES_MAX = 8 << 20


class EtcdUnavailable(Exception):
    """No endpoint answered in time, or etcd itself cannot serve now (no quorum, election)."""


class EtcdError(Exception):
    """etcd understood the request and refused it (code: its gRPC status code)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the txn (a write txn's own revision)
    ranges: list[list[KeyValue]]  # the kvs of each range request of the branch taken, in order


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _key(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


# -- txn building blocks: plain dicts in the gateway's JSON form ------------------------------------

def create_revision_is(key: bytes | str, revision: int, result: str = "EQUAL") -> dict:
    """A compare on the key's create_revision; 0 means the key does not exist."""
    return {"target": "CREATE", "key": _b64(_key(key)), "result": result, "createRevision": str(revision)}


def mod_revision_is(key: bytes | str, revision: int, result: str = "EQUAL") -> dict:
    return {"target": "MOD", "key": _b64(_key(key)), "result": result, "modRevision": str(revision)}


def value_is(key: bytes | str, value: bytes, result: str = "EQUAL") -> dict:
    return {"target": "VALUE", "key": _b64(_key(key)), "result": result, "value": _b64(value)}


def put_op(key: bytes | str, value: bytes, lease: int = 0) -> dict:
    request = {"key": _b64(_key(key)), "value": _b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"requestPut": request}


def delete_op(key: bytes | str) -> dict:
    return {"requestDeleteRange": {"key": _b64(_key(key))}}


def range_op(key: bytes | str, prefix: bool = False) -> dict:
    key = _key(key)
    request = {"key": _b64(key)}
    if prefix:
        request["range_end"] = _b64(prefix_end(key))
    return {"requestRange": request}


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with prefix."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _kv(raw: dict) -> KeyValue:
    return KeyValue(base64.b64decode(raw.get("key", "")), base64.b64decode(raw.get("value", "")),
                    int(raw.get("create_revision", 0)), int(raw.get("mod_revision", 0)), int(raw.get("version", 0)),
                    int(raw.get("lease", 0)))


def _revision(answer: dict) -> int:
    return int(answer.get("header", {}).get("revision", 0))


# -- the connection --------------------------------------------------------------------------------

class _Connection:
    __slots__ = ("endpoint", "stream", "h11")

    def __init__(self, endpoint: int, stream: trio.SocketStream):
        self.endpoint = endpoint
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)


class EtcdClient:
    """endpoints: "http://host:port" URLs of the etcd members (client URLs). timeout_s bounds one
    attempt at one endpoint; a call tries each endpoint once, starting with the last that worked."""

    def __init__(self, endpoints: list[str], *, timeout_s: float = 1.0, prefix: str = "/v3"):
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        self.endpoints = []
        for url in endpoints:
            parts = urlsplit(url if "://" in url else "http://" + url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"etcd endpoint {url!r}: give http://host:port (TLS to etcd is not supported)")
            self.endpoints.append((parts.hostname, parts.port or 2379))
        self.timeout_s = timeout_s
        self.prefix = prefix  # etcd 3.4 answers /v3 (and /v3beta); 3.3 only /v3beta
        self._preferred = 0
        self._idle: list[_Connection] = []
        self.requests = 0
        self.failovers = 0

    # -- the calls ---------------------------------------------------------------------------------

    async def get(self, key: bytes | str) -> tuple[KeyValue | None, int]:
        """(the key, or None; the store's revision at the read). Linearizable."""
        answer = await self.call("/kv/range", {"key": _b64(_key(key))})
        kvs = answer.get("kvs") or []
        return (_kv(kvs[0]) if kvs else None), _revision(answer)

    async def get_prefix(self, prefix: bytes | str) -> tuple[list[KeyValue], int]:
        prefix = _key(prefix)
        answer = await self.call("/kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        return [_kv(raw) for raw in answer.get("kvs") or []], _revision(answer)

    async def put(self, key: bytes | str, value: bytes, lease: int = 0) -> int:
        """The revision of the put."""
        return _revision(await self.call("/kv/put", put_op(key, value, lease)["requestPut"]))

    async def delete(self, key: bytes | str) -> int:
        """How many keys were deleted (0 or 1)."""
        answer = await self.call("/kv/deleterange", {"key": _b64(_key(key))})
        return int(answer.get("deleted", 0))

    async def txn(self, compares: list[dict], success: list[dict], failure: list[dict] = ()) -> TxnResult:
        answer = await self.call("/kv/txn", {"compare": list(compares), "success": list(success),
                                             "failure": list(failure)})
        ranges = []
        for response in answer.get("responses") or []:
            found = response.get("response_range")
            if found is not None:
                ranges.append([_kv(raw) for raw in found.get("kvs") or []])
        return TxnResult(bool(answer.get("succeeded", False)), _revision(answer), ranges)

    async def lease_grant(self, ttl_s: int) -> int:
        """A new lease's id."""
        answer = await self.call("/lease/grant", {"TTL": str(int(ttl_s))})
        if answer.get("error"):
            raise EtcdError(0, str(answer["error"]))
        return int(answer["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """Renew the lease once; the TTL it has again, 0 when it no longer exists (expired or
        revoked). The gateway streams one answer per request sent; we send one and read to the end."""
        answer = await self.call("/lease/keepalive", {"ID": str(lease)})
        result = answer.get("result", answer)
        return int(result.get("TTL", 0))

    async def lease_revoke(self, lease: int) -> None:
        try:
            await self.call("/lease/revoke", {"ID": str(lease)})
        except EtcdError as error:
            if error.code != NOT_FOUND:  # already gone: what revoking wants
                raise

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await _close(connection)

    # -- transport ---------------------------------------------------------------------------------

    async def call(self, path: str, document: dict) -> dict:
        """POST document to prefix+path at each endpoint in turn; etcd's answer as a dict."""
        body = json.dumps(document).encode()
        count = len(self.endpoints)
        failures = []
        for attempt in range(count):
            index = (self._preferred + attempt) % count
            self.requests += 1
            try:
                status, data = await self._attempt(index, self.prefix + path, body)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError,
                    _TimedOut, ValueError) as error:
                failures.append(f"{self._name(index)}: {type(error).__name__} {error}".strip())
                continue
            try:
                answer = _decode(data)
            except ValueError:
                failures.append(f"{self._name(index)}: an answer that is not JSON (HTTP {status})")
                continue
            error = answer.get("error") if isinstance(answer.get("error"), str) else None
            code = int(answer.get("code", 0) or 0)
            if status >= 500 and (code in _UNAVAILABLE_CODES or not code):
                failures.append(f"{self._name(index)}: {error or f'HTTP {status}'}")
                continue
            if index != self._preferred:
                self.failovers += 1
                self._preferred = index
            if error is not None or status != 200:
                raise EtcdError(code, error or f"HTTP {status}")
            return answer
        raise EtcdUnavailable("etcd unreachable: " + "; ".join(failures))

    def _name(self, index: int) -> str:
        host, port = self.endpoints[index]
        return f"{host}:{port}"

    async def _attempt(self, index: int, target: str, body: bytes) -> tuple[int, bytes]:
        connection = None
        for candidate in self._idle:
            if candidate.endpoint == index:
                connection = candidate
                self._idle.remove(candidate)
                break
        if connection is not None:
            try:
                return await self._attempt_on(connection, target, body)
            except (OSError, trio.BrokenResourceError, h11.ProtocolError):
                pass  # a kept-alive connection etcd had closed meanwhile: one fresh try
        return await self._attempt_on(None, target, body, index)

    async def _attempt_on(self, connection: _Connection | None, target: str, body: bytes,
                          index: int = 0) -> tuple[int, bytes]:
        try:
            with trio.move_on_after(self.timeout_s) as scope:
                if connection is None:
                    host, port = self.endpoints[index]
                    connection = _Connection(index, await trio.open_tcp_stream(host, port))
                result = await self._exchange(connection, target, body)
            if scope.cancelled_caught:
                raise _TimedOut(f"no answer within {self.timeout_s} s")
        except BaseException:
            if connection is not None:
                await _close(connection)
            raise
        if connection.h11.our_state is h11.DONE and connection.h11.their_state is h11.DONE:
            connection.h11.start_next_cycle()
            self._idle.append(connection)
        else:
            await _close(connection)
        return result

    async def _exchange(self, connection: _Connection, target: str, body: bytes) -> tuple[int, bytes]:
        conn = connection.h11
        host, port = self.endpoints[connection.endpoint]
        request = h11.Request(method="POST", target=target, headers=[
            ("host", f"{host}:{port}"), ("content-type", "application/json"), ("content-length", str(len(body)))])
        await connection.stream.send_all(conn.send(request) + conn.send(h11.Data(data=body))
                                         + conn.send(h11.EndOfMessage()))
        status = 0
        parts = []
        size = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await connection.stream.receive_some(65536)
                conn.receive_data(data)  # b"": the peer closed; h11 then reports it
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > _BODY_BYTES_MAX:
                    raise ValueError("answer too large")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, b"".join(parts)
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("etcd closed the connection")


class _TimedOut(Exception):
    pass


async def _close(connection: _Connection) -> None:
    with trio.CancelScope(shield=True):
        try:
            await connection.stream.aclose()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _decode(data: bytes) -> dict:
    """An answer: one JSON object, or (a streamed call such as keepalive) one per line, of which
    the first is taken."""
    text = data.strip()
    if not text:
        return {}
    try:
        answer = json.loads(text)
    except ValueError:
        answer = json.loads(text.splitlines()[0])
    if not isinstance(answer, dict):
        raise ValueError("not an object")
    return answer
