"""A small HTTP/1.1 client on h11 over anyio, so one implementation runs under asyncio and Trio.

Owns: pools of keep-alive connections to the nodes it was given (at most `connections_max` open at
once in all, so callers queue rather than open sockets without bound), one request/response cycle
per borrowed connection, which node is the leader as far as it knows, and the retry policy
(`Transport.call`).

The retry policy, by what the failure says about the call:
  - Nothing was applied (no connection could be made; a 503 `no_leader`, `not_leader`,
    `shutting_down`, `too_many_connections`, `paused`, `sync_unavailable` with `details.applied`
    false; a 307 loop; a 429 `rate_limited`): any call goes again.
  - The outcome is unknown (sent, then the connection broke or timed out; a 503 `leader_lost`, or
    `sync_unavailable` with `details.applied` "unknown"): a call safe to repeat goes again; any
    other raises OutcomeUnknown. Other 503s (`not_durable`...) go again only when safe, and are
    raised as they are otherwise.
  - A failover (the leader unreachable, gone, or changing: the connection errors and the leader
    codes above, `shutting_down` and `sync_unavailable` included) is retried until
    `failover_timeout_s` after the call began; anything else `retries_max` times. The waits follow
    the server's hint (`details.retryAfterMs`, else Retry-After) and otherwise back off from 50 ms
    doubling to 2 s with full jitter, so a crowd of clients does not come back in step.

Several nodes (a cluster): calls go to the cached leader. A 307 (a follower naming the leader) is
followed once per attempt, method and body kept, and its target cached as the leader. A node that
refuses as not the leader, stopped leading, or cannot be reached moves the cache to the next node.

Never: follows more than one redirect per attempt, speaks anything but JSON to Queen, or sends a
call again after an attempt with an unknown outcome unless the caller said it is safe. A connection
whose cycle was interrupted (error, timeout, cancellation) is closed, never reused, since its next
answer could belong to the interrupted request.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import ssl
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11

from queen_client import values
from queen_client.errors import (
    ApiError,
    CannotConnect,
    ClientError,
    OutcomeUnknown,
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
BACKOFF_DOUBLINGS_MAX = 16  # past this the cap holds anyway; keeps 2 ** attempt small
DEFAULT_FAILOVER_TIMEOUT_S = 15.0  # an election (a 2-10 s leader lease) and a margin to find the new leader


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a 503 says about the call: whether `nothing_applied`; whether it is a `failover` (the
    leader gone or changing: retried until the failover timeout); whether the node `moves_on`
    (it does not lead: the next call goes to the next node)."""

    nothing_applied: bool
    failover: bool
    moves_on: bool


OTHER_503 = Refusal(nothing_applied=False, failover=False, moves_on=False)  # not_durable, etcd_unavailable...
REFUSALS_503 = {
    "too_many_connections": Refusal(nothing_applied=True, failover=False, moves_on=False),
    "paused": Refusal(nothing_applied=True, failover=False, moves_on=False),
    "shutting_down": Refusal(nothing_applied=True, failover=True, moves_on=True),
    "no_leader": Refusal(nothing_applied=True, failover=True, moves_on=True),
    "not_leader": Refusal(nothing_applied=True, failover=True, moves_on=True),
    # The node stopped leading while it held the call: it may be on the new leader.
    "leader_lost": Refusal(nothing_applied=False, failover=True, moves_on=True),
}
SYNC_UNAVAILABLE = "sync_unavailable"  # the leader's sync set is out of reach; details.applied says the rest


def refusal_of(error: UnavailableError) -> Refusal:
    if error.code == SYNC_UNAVAILABLE:
        return Refusal(nothing_applied=error.details.get("applied") is False, failover=True, moves_on=False)
    return REFUSALS_503.get(error.code, OTHER_503)


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
    return random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (2 ** min(attempt, BACKOFF_DOUBLINGS_MAX))))


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
                 retries_max: int = 5, ssl_context: ssl.SSLContext | None = None, token: str | None = None,
                 failover_timeout_s: float | None = DEFAULT_FAILOVER_TIMEOUT_S):
        self.endpoints = [_Endpoint(url) for url in parse_urls(base_url)]
        self._known = {endpoint.base_url: endpoint for endpoint in self.endpoints}
        self.leader = self.endpoints[0]  # where calls go: the node that answered last, or a 307 named
        self.epoch: int | None = None  # the last X-Queen-Epoch a node answered with (cluster mode)
        self.ssl_context = ssl_context
        # Sent on every request; kept out of every message and repr (it is a secret).
        self._authorization = None if not token else ("authorization", b"Bearer " + token.encode())
        self.timeout_s = timeout_s
        self.retries_max = retries_max
        self.failover_timeout_s = failover_timeout_s  # None or 0: a failover gets retries_max retries too
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
        """A new connection (TLS included): CannotConnect when there is none, since then nothing
        of the call was sent."""
        try:
            stream = await anyio.connect_tcp(endpoint.host, endpoint.port, tls=endpoint.tls,
                                             ssl_context=self.ssl_context)
        except ssl.SSLCertVerificationError as error:
            raise CannotConnect(endpoint.base_url, str(error), certificate=True) from error
        except (OSError, anyio.BrokenResourceError, anyio.EndOfStream) as error:
            raise CannotConnect(endpoint.base_url, _why_not_connected(error)) from error
        return _Connection(stream)

    async def request(self, method: str, path: str, body: bytes | None = None,
                      timeout_s: float | None = None, endpoint: _Endpoint | None = None, *,
                      peek: bool = False) -> tuple[int, dict, bytes]:
        """One request on a pooled connection to endpoint (default: the leader as far as we know):
        (status, lower-cased headers, body). peek: check every idle connection before reusing it,
        not only those idle for a while: for a call that is not safe to repeat, a write into a
        connection the server already closed (it died, say) would leave its outcome unknown."""
        endpoint = endpoint or self.leader
        async with self._slots:
            connection = None
            while endpoint.idle:
                candidate = endpoint.idle.pop()
                if ((peek or anyio.current_time() - candidate.idle_since > IDLE_PEEK_AFTER_S)
                        and candidate.looks_closed()):
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
                if connection is None:  # no connection in time: nothing was sent
                    raise CannotConnect(endpoint.base_url, "no connection in time") from None
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
                   timeout_s: float | None = None, deadline: float | None = None,
                   missed_if_echo=None):
        """The decoded answer of a 2xx, or an exception of the ClientError family.

        safe: the call may be sent again with the same effect (a read, a lock call carrying an
        owner, a push whose items carry a transactionId, an ack, a conditional write); only then
        is it sent again after an attempt whose outcome is unknown. Otherwise such an attempt
        raises OutcomeUnknown. A call that provably was not applied (no connection; a refusal that
        applied nothing) is sent again whatever it is.
        missed_if_echo: for a conditional write, a test of its answer: true when it did not apply,
        which, after an attempt whose outcome is unknown, may be that attempt's own doing (its
        `expect` no longer holds because it applied), so OutcomeUnknown is raised instead.
        deadline: on the event loop's clock, no retry starts after it (the caller usually also wraps
        the call in a cancel scope). Without one, a failover (see the module docstring) is retried
        until failover_timeout_s from the first attempt, anything else retries_max times."""
        body = None if document is None else values.encode(document)
        failover_until = None if not self.failover_timeout_s else anyio.current_time() + self.failover_timeout_s
        attempt = 0
        unknown: ClientError | None = None  # what left an earlier attempt's outcome unknown

        def give_up(error: ClientError) -> NoReturn:
            if unknown is not None and missed_if_echo is not None:
                # A conditional write whose earlier attempt may have applied: its outcome, not the last error.
                raise OutcomeUnknown(method, path, unknown) from error
            raise error

        while True:
            endpoint = self.leader
            try:
                status, headers, data = await self.request(method, path, body, timeout_s, endpoint, peek=not safe)
                if status == 307:
                    # A follower named the leader: nothing was applied. Once per attempt.
                    target = self._redirect_target(headers.get("location"), path)
                    if target is not None:
                        self.redirects += 1
                        self.leader = endpoint = target
                        status, headers, data = await self.request(method, path, body, timeout_s, target,
                                                                   peek=not safe)
            except CannotConnect as error:
                self._move_on(endpoint)
                if error.certificate or not await self._retry(attempt, deadline, failover_until, 0.0,
                                                              why=(method, path, error)):
                    give_up(error)
                attempt += 1
                continue
            except TransportError as error:  # sent, and no whole answer came
                self._move_on(endpoint)
                if not safe:
                    raise OutcomeUnknown(method, path, error) from error
                unknown = error
                if not await self._retry(attempt, deadline, failover_until, 0.0, why=(method, path, error)):
                    give_up(error)
                attempt += 1
                continue
            if 200 <= status < 300:
                answer = values.decode(data) if data else None
                if unknown is not None and missed_if_echo is not None and missed_if_echo(answer):
                    raise OutcomeUnknown(method, path, unknown)
                return answer
            if status == 307:  # a second redirect in one attempt: a refusal that applied nothing
                error: ApiError = UnavailableError(307, "not_leader", "redirected more than once",
                                                   {"location": headers.get("location")}, None)
            else:
                error = from_response(status, data, headers.get("retry-after"))
            if isinstance(error, RateLimited) and error.code == "rate_limited":
                # Refused before anything was applied, and over once the bucket refills: wait as told.
                wait_s = error.retry_after_s or 0.0
                if await self._retry(attempt, deadline, None, wait_s, exact=True, why=(method, path, error)):
                    attempt += 1
                    continue
                give_up(error)
            if not isinstance(error, UnavailableError):
                give_up(error)
            refusal = refusal_of(error)
            if refusal.moves_on:
                self._move_on(endpoint)
            if not refusal.nothing_applied:
                if not safe:
                    raise OutcomeUnknown(method, path, error) if refusal.failover else error
                unknown = error
            hint = min(error.retry_after_s or 0.0, BACKOFF_MAX_S)
            if not await self._retry(attempt, deadline, failover_until if refusal.failover else None, hint,
                                     why=(method, path, error)):
                give_up(error)
            attempt += 1

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

    async def _retry(self, attempt: int, deadline: float | None, failover_until: float | None, hint_s: float,
                     exact: bool = False, *, why: tuple[str, str, Exception]) -> bool:
        """Wait before attempt + 1, or False when there is to be none: past the caller's deadline,
        past failover_until (a failover: the leader gone, or changing), else after retries_max.

        exact: wait the hint (and up to a tenth more, so a crowd does not come back in step),
        not the growing backoff: the server said when there will be room. Each retry is logged at
        warning: the call succeeds in the end, but a broker that keeps refusing is worth seeing."""
        until = deadline if deadline is not None else failover_until
        now = anyio.current_time()
        if until is not None and now + hint_s >= until or until is None and attempt >= self.retries_max:
            return False
        self.retries += 1
        delay = hint_s * random.uniform(1.0, 1.1) if exact else max(hint_s, backoff_s(attempt))
        if until is not None:
            delay = max(0.0, min(delay, until - now))
        method, path, error = why
        logger.warning("event=request_retry method=%s path=%s attempt=%d delay_s=%.2f error=%r", method,
                       path.split("?", 1)[0], attempt + 1, delay, str(error))
        await anyio.sleep(delay)
        return True

    async def aclose(self) -> None:
        for endpoint in self._known.values():
            idle, endpoint.idle = endpoint.idle, []
            for connection in idle:
                await _close(connection)


def _why_not_connected(error: BaseException) -> str:
    """The reason a connection failed, in words ("Connection refused"): anyio says "All connection
    attempts failed" and keeps each attempt's error as the cause."""
    seen = error
    while seen is not None:
        if isinstance(seen, BaseExceptionGroup):
            seen = seen.exceptions[0]
            continue
        if isinstance(seen, socket.gaierror):
            return seen.strerror or str(seen)
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)  # the same words under asyncio and Trio
        seen = seen.__cause__
    return str(error) or type(error).__name__


async def _close(connection: _Connection) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.aclose_forcefully(connection.stream)
