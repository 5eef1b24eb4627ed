"""A small HTTP/1.1 client on h11 over anyio, so one implementation runs under asyncio and Trio.

Owns: pools of keep-alive connections to the nodes it was given (at most `connections_max` open at
once in all, so callers queue rather than open sockets without bound), one request/response cycle
per borrowed connection, which node is the leader as far as it knows, and the retry policy
(`Transport.call`): transport errors and 503 are retried with capped, jittered exponential backoff
only when the caller says the call is safe to repeat.

Several nodes (a cluster): calls go to the cached leader. A 307 (a follower naming the leader) is
followed once per call, method and body kept, and its target cached as the leader. A 503
`no_leader` / `not_leader` applied nothing, so any call is tried again, on the next node, after
its Retry-After. A connection error moves the cache to the next node; only a call safe to repeat
is then tried again there (for a write the outcome is unknown, as on one node).

Never: follows more than one redirect per call, speaks anything but JSON to Queen, or retries a
call it was not told is safe unless the server said nothing was applied. A connection whose cycle
was interrupted (error, timeout, cancellation) is closed, never reused, since its next answer
could belong to the interrupted request.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11
import orjson

from queen_client.errors import (
    ApiError,
    RateLimited,
    RequestTimeout,
    TransportError,
    UnavailableError,
    from_response,
)

logger = logging.getLogger(__name__)

RECEIVE_BYTES = 65536
# Backoff between retries: from 50 ms doubling to 2 s, full jitter, so a crowd of clients that
# lost the server at once does not come back in step.
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0
# 503 codes the server answers before reading or applying anything: repeating any call is safe.
NOTHING_APPLIED_503 = frozenset({"too_many_connections", "paused"})
# 503 codes of a cluster node that is not the serving leader (nothing applied): try the next node.
LEADER_REFUSALS = frozenset({"no_leader", "not_leader"})


def parse_urls(urls) -> list[str]:
    """A list of base URLs, or one string of them separated by commas: the list, each stripped of
    a trailing slash. ValueError when none is given or one does not look like http(s)://host:port."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    items = [item.strip().rstrip("/") for item in items if item and item.strip()]
    if not items:
        raise ValueError("no server URL given")
    for item in items:
        parts = urlsplit(item)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the base URL must look like http://host:port, not {item!r}")
    return items


def backoff_s(attempt: int) -> float:
    return random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (2 ** attempt)))


# A connection idle for longer than this is peeked at before reuse. The server closes idle ones
# after 60 s by default; peeking every time would cost a system call per request.
IDLE_PEEK_AFTER_S = 1.0


class _Connection:
    __slots__ = ("stream", "h11", "idle_since")

    def __init__(self, stream: anyio.abc.ByteStream):
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def looks_closed(self) -> bool:
        """Whether the server already hung up on this idle connection (its idle timeout): a peek
        that finds end-of-stream. Cheap, and it saves a write into a dead socket."""
        try:
            raw = self.stream.extra(anyio.abc.SocketAttribute.raw_socket)
        except (anyio.TypedAttributeLookupError, AttributeError):
            return False
        # asyncio hands out a wrapper without recv(): peek through a socket object on the same
        # descriptor, detached afterwards so it never closes it.
        peek = socket.socket(fileno=raw.fileno())
        try:
            return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        finally:
            peek.detach()


class _Endpoint:
    """One node: where it is, and its idle connections."""

    __slots__ = ("base_url", "host", "port", "prefix", "tls", "host_header", "idle")

    def __init__(self, base_url: str):
        parts = urlsplit(base_url)
        self.base_url = base_url
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.tls = parts.scheme == "https"
        self.host_header = parts.netloc.encode()
        self.idle: list[_Connection] = []


class Transport:
    """Keep-alive connections to one node, or to the nodes of a cluster (a list of base URLs, or
    one string of them separated by commas). Create it anywhere; use it from one event loop."""

    def __init__(self, base_url, *, connections_max: int = 16, timeout_s: float = 10.0,
                 retries_max: int = 5, ssl_context: ssl.SSLContext | None = None, token: str | None = None):
        self.endpoints = [_Endpoint(url) for url in parse_urls(base_url)]
        self._known = {endpoint.base_url: endpoint for endpoint in self.endpoints}
        self.leader = self.endpoints[0]  # where calls go: the node that answered last, or a 307 named
        self.epoch: int | None = None  # the last X-Queen-Epoch a node answered with (cluster mode)
        self.ssl_context = ssl_context
        # Sent on every request; kept out of every message and repr (it is a secret).
        self._authorization = None if not token else ("authorization", b"Bearer " + token.encode())
        self.timeout_s = timeout_s
        self.retries_max = retries_max
        self.connections_max = connections_max
        self._slots = anyio.Semaphore(connections_max)
        self.requests = 0  # statistics
        self.retries = 0
        self.redirects = 0

    @property
    def base_url(self) -> str:
        """The node calls go to now."""
        return self.leader.base_url

    def idle_connections(self) -> int:
        return sum(len(endpoint.idle) for endpoint in self._known.values())

    # -- one cycle ---------------------------------------------------------------------------------

    async def _open(self, endpoint: _Endpoint) -> _Connection:
        try:
            stream = await anyio.connect_tcp(endpoint.host, endpoint.port, tls=endpoint.tls,
                                             ssl_context=self.ssl_context)
        except OSError as error:
            raise TransportError(f"cannot connect to {endpoint.base_url}: {error}") from error
        return _Connection(stream)

    async def request(self, method: str, path: str, body: bytes | None = None,
                      timeout_s: float | None = None, endpoint: _Endpoint | None = None) -> tuple[int, dict, bytes]:
        """One request on a pooled connection to endpoint (default: the leader as far as we know):
        (status, lower-cased headers, body)."""
        endpoint = endpoint or self.leader
        async with self._slots:
            connection = None
            while endpoint.idle:
                candidate = endpoint.idle.pop()
                if anyio.current_time() - candidate.idle_since > IDLE_PEEK_AFTER_S and candidate.looks_closed():
                    await _close(candidate)
                    continue
                connection = candidate
                break
            self.requests += 1
            try:
                with anyio.fail_after(self.timeout_s if timeout_s is None else timeout_s):
                    if connection is None:
                        connection = await self._open(endpoint)
                    status, headers, data, reusable = await self._cycle(connection, endpoint, method, path, body)
            except TimeoutError:
                if connection is not None:
                    await _close(connection)
                raise RequestTimeout(f"{method} {path}: no answer from {endpoint.base_url} in time") from None
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
                    h11.ProtocolError) as error:
                if connection is not None:
                    await _close(connection)
                raise TransportError(f"{method} {path}: connection to {endpoint.base_url} failed: {error!r}") from error
            except BaseException:  # cancelled mid-cycle: the connection's state is unknown
                if connection is not None:
                    await _close(connection)
                raise
            if reusable:
                connection.idle_since = anyio.current_time()
                endpoint.idle.append(connection)
            else:
                await _close(connection)
            epoch = headers.get("x-queen-epoch")
            if epoch is not None and epoch.isdigit():
                self.epoch = int(epoch)
            return status, headers, data

    async def _cycle(self, connection: _Connection, endpoint: _Endpoint, method: str, path: str,
                     body: bytes | None):
        conn = connection.h11
        data = body or b""
        headers = [("host", endpoint.host_header), ("content-length", str(len(data)))]
        if self._authorization is not None:
            headers.append(self._authorization)
        if body is not None:
            headers.append(("content-type", "application/json"))
        out = conn.send(h11.Request(method=method, target=endpoint.prefix + path, headers=headers))
        out += conn.send(h11.Data(data=data)) if data else b""
        out += conn.send(h11.EndOfMessage())
        await connection.stream.send(out)
        status, response_headers, parts = 0, {}, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    chunk = await connection.stream.receive(RECEIVE_BYTES)
                except anyio.EndOfStream:
                    chunk = b""
                conn.receive_data(chunk)
            elif isinstance(event, h11.Response):
                status = event.status_code
                response_headers = {name.decode().lower(): value.decode("latin-1") for name, value in event.headers}
            elif isinstance(event, h11.Data):
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise anyio.EndOfStream()
        reusable = conn.our_state is h11.DONE and conn.their_state is h11.DONE
        if reusable:
            conn.start_next_cycle()
        return status, response_headers, b"".join(parts), reusable

    # -- calls with the retry policy ---------------------------------------------------------------

    async def call(self, method: str, path: str, document=None, *, safe: bool,
                   timeout_s: float | None = None, deadline: float | None = None):
        """The decoded JSON answer of a 2xx, or an exception of the ClientError family.

        safe: the call may be sent again with the same effect (a read, or a lock call carrying an
        owner); only then are transport errors and 503 retried. deadline: on the event loop's
        clock, no retry starts after it (the caller usually also wraps the call in a cancel scope)."""
        body = None if document is None else orjson.dumps(document)
        attempt = 0
        redirected = False
        while True:
            endpoint = self.leader
            try:
                status, headers, data = await self.request(method, path, body, timeout_s, endpoint)
                if status == 307 and not redirected:
                    # A follower named the leader: nothing was applied. Once per call.
                    target = self._redirect_target(headers.get("location"), path)
                    if target is not None:
                        redirected = True
                        self.redirects += 1
                        self.leader = endpoint = target
                        status, headers, data = await self.request(method, path, body, timeout_s, target)
            except TransportError as error:
                self._move_on(endpoint)
                if not safe or not self._may_retry(attempt, deadline, 0.0):
                    raise
                await self._pause(attempt, deadline, 0.0, why=(method, path, error))
                attempt += 1
                continue
            if 200 <= status < 300:
                return orjson.loads(data) if data else None
            if status == 307:  # a second redirect in one call: a refusal that applied nothing
                error: ApiError = UnavailableError(307, "not_leader", "redirected more than once",
                                                   {"location": headers.get("location")}, None)
            else:
                error = from_response(status, data, headers.get("retry-after"))
            if isinstance(error, UnavailableError) and error.code in LEADER_REFUSALS:
                # A node that is not the serving leader refused before applying anything: any call
                # may go again (below), on the next node, after the hint.
                self._move_on(endpoint)
            if isinstance(error, RateLimited) and error.code == "rate_limited":
                # Refused before anything was applied, and over once the bucket refills: wait as told.
                wait_s = error.retry_after_s or 0.0
                if self._may_retry(attempt, deadline, wait_s):
                    await self._pause(attempt, deadline, wait_s, exact=True, why=(method, path, error))
                    attempt += 1
                    continue
            elif isinstance(error, UnavailableError) and (safe or error.code in NOTHING_APPLIED_503
                                                          or error.code in LEADER_REFUSALS):
                hint = min(error.retry_after_s or 0.0, BACKOFF_MAX_S)
                if self._may_retry(attempt, deadline, hint):
                    await self._pause(attempt, deadline, hint, why=(method, path, error))
                    attempt += 1
                    continue
            raise error

    def _redirect_target(self, location: str | None, path: str) -> _Endpoint | None:
        """The node a 307's Location names (its base URL: the Location less the path we asked for)."""
        if not location:
            return None
        parts = urlsplit(location)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        base = location[:-len(path)] if location.endswith(path) else f"{parts.scheme}://{parts.netloc}"
        base = base.rstrip("/")
        endpoint = self._known.get(base)
        if endpoint is None:
            endpoint = self._known[base] = _Endpoint(base)
        return endpoint

    def _move_on(self, endpoint: _Endpoint) -> None:
        """The node failed us: calls go to the next configured one (unless another call moved on already)."""
        if self.leader is not endpoint:
            return
        index = self.endpoints.index(endpoint) + 1 if endpoint in self.endpoints else 0
        self.leader = self.endpoints[index % len(self.endpoints)]

    def _may_retry(self, attempt: int, deadline: float | None, hint_s: float) -> bool:
        if deadline is not None:
            return anyio.current_time() + hint_s < deadline
        return attempt < self.retries_max

    async def _pause(self, attempt: int, deadline: float | None, hint_s: float, exact: bool = False, *,
                     why: tuple[str, str, Exception]) -> None:
        """exact: wait the hint (and up to a tenth more, so a crowd does not come back in step),
        not the growing backoff: the server said when there will be room. Each retry is logged at
        warning: the call succeeds in the end, but a broker that keeps refusing is worth seeing."""
        self.retries += 1
        delay = hint_s * random.uniform(1.0, 1.1) if exact else max(hint_s, backoff_s(attempt))
        if deadline is not None:
            delay = max(0.0, min(delay, deadline - anyio.current_time()))
        method, path, error = why
        logger.warning("event=request_retry method=%s path=%s attempt=%d delay_s=%.2f error=%r", method,
                       path.split("?", 1)[0], attempt + 1, delay, str(error))
        await anyio.sleep(delay)

    async def aclose(self) -> None:
        for endpoint in self._known.values():
            idle, endpoint.idle = endpoint.idle, []
            for connection in idle:
                await _close(connection)


async def _close(connection: _Connection) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.aclose_forcefully(connection.stream)
