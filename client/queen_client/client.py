"""`queen_client.Client`: the async client, for asyncio and Trio alike (anyio picks the running one).

    async with queen_client.Client() as client:          # QUEEN_URL, or http://127.0.0.1:6632; QUEEN_TOKEN
        async with client.lock("nightly-report", ttl="30s").hold(wait="10s"):
            ...

Owns: the transport (keep-alive connections), `kv`, `locks`, the handles it made, and a task
group in which lock handles renew and queue consumers extend their leases in the background. Leaving `async with` releases every permit still
held and closes the connections. Without `async with`, KV calls and handles with
`auto_renew=False` work; call `aclose()` when done.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlencode

import anyio
import anyio.abc

from queen_client._http import DEFAULT_FAILOVER_TIMEOUT_S, Transport, parse_urls
from queen_client.durations import seconds
from queen_client.kv import Kv
from queen_client.locks import Lock, Locks, Semaphore
from queen_client.options import TTL, wire_names
from queen_client.queues import Queue
from queen_client.timers import Timers
from queen_client.txn import Transaction

DEFAULT_URL = "http://127.0.0.1:6632"


def default_url() -> str:
    return os.environ.get("QUEEN_URL") or DEFAULT_URL


def tls_context(url, ca_file: str | None) -> ssl.SSLContext | None:
    """For https URLs (one, or a list or a comma-separated string of a cluster's nodes): the
    system's trusted CAs, or only ca_file's (a private CA) when given."""
    if not any(item.startswith("https:") for item in parse_urls(url)):
        return None
    ca_file = ca_file or os.environ.get("QUEEN_CA_FILE") or None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot read the CA file {ca_file}: {error}") from None


class Client:
    def __init__(self, url: str | Sequence[str] | None = None, *, token: str | None = None, ca_file: str | None = None,
                 connections_max: int = 16, timeout_s: float = 10.0, retries_max: int = 5,
                 failover_timeout=DEFAULT_FAILOVER_TIMEOUT_S):
        """url: the broker, or a cluster's nodes (a list, or one string with commas; default:
        QUEEN_URL, which may list several too): calls go to the leader, found by following a
        follower's 307 and cached; a node that is not the leader, or unreachable, is passed over for
        the next one (see README, "Several nodes"). token: sent as `Authorization: Bearer` (default: QUEEN_TOKEN); ca_file: the CA that
        signed an https server's certificate, when not one the system trusts (default:
        QUEEN_CA_FILE); connections_max: open connections at most (more concurrent calls queue);
        timeout_s: per request attempt; retries_max: attempts after the first, for calls safe to
        repeat (and for any call refused by the tenant's write rate, after its Retry-After);
        failover_timeout ("15s", a timedelta or seconds; None or 0: off, retries_max then applies):
        how long a call rides through a failover (the leader unreachable, gone or changing), sent
        again on the new leader when it is safe to repeat or provably was not applied; any other
        call whose attempt has an unknown outcome raises OutcomeUnknown (see README, "Failover")."""
        self.url = url if isinstance(url, str) and url else ",".join(url) if url else default_url()
        self._transport = Transport(self.url, connections_max=connections_max, timeout_s=timeout_s,
                                    retries_max=retries_max, ssl_context=tls_context(self.url, ca_file),
                                    token=token if token is not None else os.environ.get("QUEEN_TOKEN"),
                                    failover_timeout_s=seconds(failover_timeout, "failover_timeout")
                                    if failover_timeout else None)
        self.kv = Kv(self._transport)
        self.locks = Locks(self)
        self.timers = Timers(self._transport)
        self._task_group: anyio.abc.TaskGroup | None = None
        self._held: dict[int, Lock] = {}

    def __repr__(self) -> str:
        return f"<queen_client.Client {self.url}>"

    @property
    def epoch(self) -> int | None:
        """The last X-Queen-Epoch a node answered with: the leader's term in a cluster (None on one
        node). It only grows across failovers; for logs and for stores that keep (epoch, fence)."""
        return self._transport.epoch

    @property
    def leader_url(self) -> str:
        """The node calls go to now: the leader as far as this client knows."""
        return self._transport.base_url

    async def __aenter__(self) -> Client:
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        return self

    async def __aexit__(self, *exc_info) -> bool:
        task_group, self._task_group = self._task_group, None
        try:
            for lock in list(self._held.values()):
                await lock.release_quietly()
            task_group.cancel_scope.cancel()
        finally:
            # The body's own exception is not passed in: it propagates as it is, never wrapped in
            # an ExceptionGroup with our renewers (which never raise).
            await task_group.__aexit__(None, None, None)
            await self._transport.aclose()
        return False

    async def aclose(self) -> None:
        await self._transport.aclose()

    # -- handles -----------------------------------------------------------------------------------

    @wire_names(**TTL)
    def lock(self, name: str, *, ttl, owner: str | None = None, auto_renew: bool = True) -> Lock:
        """A handle on lock `name` with lifetime `ttl` ("30s", a timedelta or seconds)."""
        return Lock(self, name, ttl=ttl, owner=owner, auto_renew=auto_renew)

    @wire_names(**TTL)
    def semaphore(self, name: str, n: int, *, ttl, owner: str | None = None, auto_renew: bool = True) -> Semaphore:
        """A handle on one of the `n` permits of `name`. Every holder of one name passes the same n."""
        return Semaphore(self, name, n, ttl=ttl, owner=owner, auto_renew=auto_renew)

    def queue(self, name: str) -> Queue:
        """The calls of queue `name`: push, pop, ack, consume, process, configure, dlq, ..."""
        return Queue(self, name)

    def transaction(self) -> Transaction:
        return Transaction(self._transport, self)

    async def queues(self, prefix: str = "") -> AsyncIterator[dict]:
        """Every queue whose name starts with `prefix`, in name order, with its counts (messages,
        pending, inFlight, dlq, partitions, timers, groups), page after page."""
        cursor = None
        while True:
            query = {"prefix": prefix, **({"cursor": cursor} if cursor else {})}
            page = await self._transport.call("GET", f"/api/v1/resources/queues?{urlencode(query)}", safe=True)
            for row in page["items"]:
                yield row
            cursor = page.get("cursor")
            if cursor is None:
                return

    def statistics(self) -> dict:
        transport = self._transport
        return {"requests": transport.requests, "retries": transport.retries, "held": len(self._held),
                "idle_connections": transport.idle_connections(), "redirects": transport.redirects}

    # -- for the handles -------------------------------------------------------------------------

    def _require_task_group(self) -> None:
        if self._task_group is None:
            raise RuntimeError("lock handles renew, and consumers extend their leases, in the background, in the "
                               "client's task group: use `async with queen_client.Client() as client:` (or make a lock "
                               "handle with auto_renew=False and call keep_alive() in your loop)")

    def _start(self, fn, *args) -> None:
        self._require_task_group()
        self._task_group.start_soon(fn, *args)

    def _remember(self, lock: Lock) -> None:
        self._held[id(lock)] = lock

    def _forget(self, lock: Lock) -> None:
        self._held.pop(id(lock), None)
