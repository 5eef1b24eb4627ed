"""Lock and semaphore handles (renewing, and knowing you lost; run() as a with-lock helper).

A handle is one holder: it mints its owner once (`host:pid:random`, overridable), acquires, renews
in the background every third of the lifetime, reports loss (callbacks, an event, and cancelling
`hold()` blocks), and releases. The rules of loss live in lease.py, a pure state machine; this
module feeds it the event loop's clock (`anyio.current_time()`, so Trio's MockClock drives it)
and the broker's answers.

Invariants:
  - `token`/`guard` read the lease at the moment they are read: never a token we may not hold.
  - A guarded commit and a renewal of the same handle never overlap (`_TokenGate`): a renewal
    changes the token, and a commit that straddled one would fail on our own renewal and be taken
    for a loss.
  - Every lock call carries the owner, so each is safe to send again and the transport retries it.
Never: blocks the event loop, or raises out of the background renewer (its failures are losses).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from queen_client.durations import seconds, ttl_seconds
from queen_client.errors import ApiError, ClientError, LockLost, LockNotAcquired
from queen_client.lease import Lease, LostReason, State
from queen_client.options import TTL, WAIT, wire_names

logger = logging.getLogger(__name__)

LOCKS_PATH = "/api/v1/locks"
LOCKS_NS = "queen-locks"
WAIT_MS_MAX = 60_000  # the server parks an acquire at most this long; longer waits ask again
# Releasing on the way out of hold() or after a loss is a courtesy to the next holder (the lease
# would end anyway): never wait on it longer than this.
RELEASE_GIVE_UP_S = 5.0


def mint_owner() -> str:
    """host:pid:random, unique per handle; what makes this handle's calls safe to repeat."""
    return f"{socket.gethostname()[:200]}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class Holder:
    """One held permit as the broker reports it; times in ms since the epoch, server clock."""

    name: str
    slot: int
    owner: str | None
    token: int
    fence: int
    since_ms: int
    renewed_at_ms: int
    expires_at_ms: int

    @classmethod
    def from_wire(cls, name: str, wire: dict) -> Holder:
        return cls(name, wire["slot"], wire.get("owner"), wire["token"], wire["fence"], wire["since"],
                   wire["renewedAt"], wire["expiresAt"])


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `lock.run(fn)` did: `acquired`, and fn's `value` when it ran; otherwise the broker's
    `reason` ("held", "timeout")."""

    acquired: bool
    value: object = None
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.acquired


class _TokenGate:
    """Guarded commits share the gate; a renewal takes it alone. A renewal that waits bars new
    commits, so a stream of commits cannot starve the renewal that keeps the lock alive."""

    def __init__(self):
        self._commits = 0
        self._renewing = False
        self._renewal_waiting = False
        self._changed = anyio.Event()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @asynccontextmanager
    async def commit(self):
        while self._renewing or self._renewal_waiting:
            await self._changed.wait()
        self._commits += 1
        try:
            yield
        finally:
            self._commits -= 1
            self._signal()

    @asynccontextmanager
    async def renewal(self):
        self._renewal_waiting = True
        try:
            while self._commits or self._renewing:
                await self._changed.wait()
        finally:
            self._renewal_waiting = False
            self._signal()
        self._renewing = True
        try:
            yield
        finally:
            self._renewing = False
            self._signal()


class Lock:
    """`client.lock(name, ttl="30s")`: one holder of a lock (or of one permit of a semaphore).

    acquire(wait=None) -> bool, release() -> bool, hold(wait=None) (async with), run(fn, wait=),
    keep_alive() -> bool, on_lost(callback), wait_lost(); token, fence, slot, guard, held."""

    def __init__(self, client, name: str, *, ttl, limit: int = 1, owner: str | None = None,
                 auto_renew: bool = True):
        self._client = client
        self.name = name
        self.limit = limit
        self.ttl_s = ttl_seconds(ttl)
        self.owner = owner if owner is not None else mint_owner()
        self.auto_renew = auto_renew
        self._lease = Lease(self.ttl_s)
        self._callbacks: list[Callable] = []
        self._lost_event = anyio.Event()
        self._hold_scopes: list[anyio.CancelScope] = []
        self._renew_scope: anyio.CancelScope | None = None
        self._gate = _TokenGate()
        self.refusal: tuple[str, list[Holder]] | None = None  # reason and holders of the last refused acquire

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self._lease.state} owner={self.owner!r}>"

    # -- what the holder reads -------------------------------------------------------------------

    def _now(self) -> float:
        now = anyio.current_time()
        if self._lease.expire_if_due(now):
            self._after_loss()
        return now

    @property
    def held(self) -> bool:
        return self._lease.held_at(self._now())

    @property
    def token(self) -> int | None:
        """The latest token while the permit is ours, else None. Read it when you send it."""
        return self._lease.token_at(self._now())

    @property
    def fence(self) -> int | None:
        """The token at acquire; stays the same across renewals. None when not held."""
        return self._lease.fence if self.held else None

    @property
    def slot(self) -> int | None:
        return self._lease.slot if self.held else None

    @property
    def guard(self) -> dict | None:
        """The check a transaction carries to commit only while the permit is ours."""
        token = self.token
        if token is None:
            return None
        return {"op": "check", "ns": LOCKS_NS, "key": f"{self.name}#{self._lease.slot}", "expect": token, "required": True}

    @property
    def lost_reason(self) -> str | None:
        return self._lease.lost_reason

    @property
    def deadline(self) -> float | None:
        """Until when (event loop clock) the permit is ours at the latest, unless renewed."""
        return self._lease.deadline if self._lease.state is State.HELD else None

    def _renewed_unseen(self, token: int) -> bool:
        """A guarded commit found the permit still ours at a later token: take it (see Lease)."""
        return self._lease.renewed_unseen(token, self._now())

    # -- loss --------------------------------------------------------------------------------------

    def on_lost(self, callback: Callable[[str], object]) -> Callable[[str], object]:
        """Call `callback(reason)` when the lock is lost ("renew", "expired" or "guard"). Runs on the
        event loop: keep it short. Usable as a decorator."""
        self._callbacks.append(callback)
        return callback

    def remove_on_lost(self, callback: Callable[[str], object]) -> None:
        """Stop calling a callback given to on_lost (fine if it never was, or was called)."""
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    async def wait_lost(self) -> str:
        """Return the reason once the current acquisition is lost."""
        event = self._lost_event
        await event.wait()
        return self._lease.lost_reason

    def _lose(self, reason: LostReason) -> None:
        if self._lease.lose(reason):
            self._after_loss()

    def _after_loss(self) -> None:
        reason = self._lease.lost_reason
        self._client._forget(self)
        for scope in self._hold_scopes:
            scope.cancel()
        if self._renew_scope is not None and reason != LostReason.EXPIRED:
            self._renew_scope.cancel()
        self._lost_event.set()
        for callback in list(self._callbacks):
            try:
                callback(reason)
            except Exception:  # a broken callback must not stop the other holders' renewals
                logger.exception("event=on_lost_callback_failed name=%s", self.name)
        logger.warning("event=lock_lost name=%s owner=%s reason=%s", self.name, self.owner, reason)

    # -- acquire and release -----------------------------------------------------------------------

    def _op(self, op: str, **fields) -> dict:
        return {"op": op, "name": self.name, "owner": self.owner, **fields}

    async def _call(self, op: dict, *, timeout_s: float | None = None, deadline: float | None = None) -> dict:
        answer = await self._client._transport.call("POST", LOCKS_PATH, {"operations": [op]}, safe=True,
                                                    timeout_s=timeout_s, deadline=deadline)
        return answer["results"][0]

    async def acquire(self, wait=None) -> bool:
        """Take a permit; with `wait` ("10s", a timedelta, seconds, or "forever"), wait up to that
        long for one (the broker hands freed permits to waiters first come, first served; past its
        longest wait, 60 s, the call is made again). True if we hold it."""
        if self.held:
            return True
        if self.auto_renew:
            self._client._require_task_group()
        wait_s = math.inf if wait == "forever" else seconds(wait, "wait") if wait is not None else 0.0
        give_up_at = anyio.current_time() + wait_s
        transport = self._client._transport
        while True:
            wait_ms = int(min(max(0.0, give_up_at - anyio.current_time()) * 1000, WAIT_MS_MAX))
            op = self._op("acquire", ttlSeconds=self.ttl_s)
            if self.limit != 1:
                op["limit"] = self.limit
            if wait_ms:
                op["waitMs"] = wait_ms
            sent_at = anyio.current_time()
            try:
                result = await self._call(op, timeout_s=transport.timeout_s + wait_ms / 1000)
            except BaseException:
                if wait_ms:
                    await self._abandon()
                raise
            if result["acquired"]:
                if await self._take(result, sent_at):
                    return True
            else:
                self.refusal = (result["reason"], [Holder.from_wire(self.name, h) for h in result.get("holders", [])])
                if result["reason"] != "timeout" or anyio.current_time() >= give_up_at:
                    return False

    async def _take(self, result: dict, sent_at: float) -> bool:
        lease = self._lease
        if Lease.needs_confirmation(sent_at, anyio.current_time(), self.ttl_s):
            # A waiting acquire: the lease began somewhere during the wait. Renew at once, so the
            # lifetime we count is one we know the start of.
            sent_at = anyio.current_time()
            renewal = await self._call(self._op("renew", slot=result["slot"], token=result["token"], ttlSeconds=self.ttl_s))
            if not renewal["renewed"]:
                self.refusal = ("lost", [])
                return False
            result = {**result, "token": renewal["token"]}
        lease.granted(sent_at, result["slot"], result["token"], result["fence"])
        self._lost_event = anyio.Event()
        self._client._remember(self)
        if self.auto_renew:
            self._client._start(self._maintain, lease.acquisitions)
        return True

    async def _abandon(self) -> None:
        """A waiting acquire was interrupted; the broker may have granted it just before. Ask as the
        same owner (answers `already` if we got it) and release, so nobody waits for our lease."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_GIVE_UP_S):
            try:
                result = await self._call(self._op("acquire", ttlSeconds=self.ttl_s, limit=self.limit))
                if result["acquired"]:
                    await self._call(self._op("release", slot=result["slot"], token=result["token"]))
            except ClientError:
                pass  # the lease ends by itself; this was a courtesy

    async def release(self) -> bool:
        """Give the permit back. True if it was ours and is now free; False if it was no longer
        ours (lost, released already, or taken by someone else after our lease ended)."""
        lease = self._lease
        if self._renew_scope is not None:
            self._renew_scope.cancel()
        if lease.state in (State.IDLE, State.RELEASED):
            return False
        slot, token = lease.slot, lease.token
        lease.released()
        self._client._forget(self)
        result = await self._call(self._op("release", slot=slot, token=token))
        return bool(result["released"])

    async def release_quietly(self) -> None:
        """release(), bounded in time and shielded from cancellation, logging a failure instead of
        raising it: for leaving a block or closing a client."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(min(self.ttl_s, RELEASE_GIVE_UP_S)):
            try:
                await self.release()
            except ClientError as error:
                logger.warning("event=release_failed name=%s error=%r", self.name, error)

    # -- renewal ---------------------------------------------------------------------------------

    async def _maintain(self, acquisition: int) -> None:
        """The background renewer of one acquisition: renew every third of the lifetime until
        released or lost."""
        lease = self._lease
        scope = self._renew_scope = anyio.CancelScope()
        with scope:
            while lease.state is State.HELD and lease.acquisitions == acquisition:
                await anyio.sleep_until(lease.renew_at)
                if lease.state is not State.HELD or lease.acquisitions != acquisition:
                    break
                await self._renew()
        if self._renew_scope is scope:
            self._renew_scope = None
        if lease.state is State.LOST and lease.lost_reason == LostReason.EXPIRED and lease.acquisitions == acquisition:
            # Our last renewal may have landed with its answer lost: free the permit if it is.
            await self.release_quietly()

    async def _renew(self) -> None:
        """Renew until it gets through or the lifetime passes on our clock."""
        lease = self._lease
        acquisition = lease.acquisitions
        with anyio.CancelScope(deadline=lease.deadline) as deadline_scope:
            while True:
                async with self._gate.renewal():
                    if lease.state is not State.HELD or lease.acquisitions != acquisition:
                        return
                    sent_at = anyio.current_time()
                    try:
                        result = await self._call(self._op("renew", slot=lease.slot, token=lease.token, ttlSeconds=self.ttl_s),
                                                  deadline=lease.deadline)
                    except ApiError as error:  # refused whole (not 503): keep trying until the deadline
                        logger.warning("event=renew_refused name=%s error=%r", self.name, error)
                        result = None
                    except ClientError as error:
                        logger.warning("event=renew_failed name=%s error=%r", self.name, error)
                        result = None
                if result is None:
                    await anyio.sleep(min(1.0, self.ttl_s / 10))
                    continue
                if lease.acquisitions != acquisition:
                    return
                if result["renewed"]:
                    if not lease.renewed(sent_at, result["token"], anyio.current_time()) and lease.state is State.LOST:
                        self._after_loss()
                else:
                    self._lose(LostReason.RENEW)
                return
        if deadline_scope.cancelled_caught and lease.acquisitions == acquisition:
            self._lose(LostReason.EXPIRED)

    async def renew(self) -> bool:
        """Renew now, whatever the rhythm (say, before a long step). False if the lock is lost: a
        renewal answered "lost" is reported at once (on_lost("renew"))."""
        self._now()
        if self._lease.state is not State.HELD:
            return False
        await self._renew()
        return self.held

    async def keep_alive(self) -> bool:
        """For loops that cannot run a background renewer (`auto_renew=False`): renew if a third of
        the lifetime has passed since the last renewal; False once the lock is lost."""
        now = self._now()
        if self._lease.state is not State.HELD:
            return False
        if self._renew_scope is None and self._lease.renew_due(now):
            await self._renew()
        return self.held

    # -- structured forms --------------------------------------------------------------------------

    @asynccontextmanager
    async def hold(self, wait=None) -> AsyncIterator[Lock]:
        """`async with lock.hold(wait="10s"):` runs the block only while the lock is ours: it raises
        LockNotAcquired if the lock could not be taken, cancels the block and raises LockLost if the
        lock is lost, and releases when the block ends."""
        self._client._require_task_group()
        if not self.auto_renew:
            raise RuntimeError("hold() renews in the background; this handle was made with auto_renew=False")
        if self._hold_scopes:
            # Not reentrant: the inner block's end would release the permit under the outer one.
            raise RuntimeError(f"hold() is already running on this handle of {self.name!r} (nested, or in another "
                               "task); a handle holds once: make another handle for another holder")
        if not await self.acquire(wait=wait):
            reason, holders = self.refusal
            raise LockNotAcquired(self.name, reason, holders)
        scope = anyio.CancelScope()
        self._hold_scopes.append(scope)
        try:
            with scope:
                yield self
        finally:
            self._hold_scopes.remove(scope)
            await self.release_quietly()
        if scope.cancel_called:  # only a loss cancels it
            raise LockLost(self.name, self._lease.lost_reason)

    async def run(self, fn: Callable[..., Awaitable], *args, wait=None) -> RunResult:
        """Run `await fn(*args)` while holding the lock (a with-lock helper): RunResult(acquired=False,
        reason=...) if it could not be taken; LockLost if it was lost while fn ran."""
        try:
            async with self.hold(wait=wait):
                value = await fn(*args)
        except LockNotAcquired as refused:
            return RunResult(False, None, refused.reason)
        return RunResult(True, value)

    async def status(self) -> list[Holder]:
        """Who holds this lock now (any owner), with since / renewed / expiry times."""
        return await self._client.locks.holders(self.name)


class Semaphore(Lock):
    """`client.semaphore(name, n, ttl=...)`: a handle on one of n permits; `slot` says which."""

    def __init__(self, client, name: str, n: int, *, ttl, owner: str | None = None, auto_renew: bool = True):
        super().__init__(client, name, ttl=ttl, limit=n, owner=owner, auto_renew=auto_renew)


@dataclass(frozen=True, slots=True)
class LockAnswer:
    """The broker's answer to one lock call made without a handle (`client.locks.acquire`, `renew`,
    `release`): `ok` when it was done, with the permit's slot, token, fence, owner and expiry;
    otherwise the `reason` ("held", "timeout", "lost", "absent") and, for an acquire, the holders.
    `wire` is the answer as the broker sent it."""

    ok: bool
    name: str
    slot: int | None
    token: int | None
    fence: int | None
    owner: str | None
    expires_at_ms: int | None
    reason: str | None
    holders: list[Holder]
    wire: dict

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def from_wire(cls, name: str, done: str, wire: dict) -> LockAnswer:
        return cls(bool(wire.get(done)), name, wire.get("slot"), wire.get("token"), wire.get("fence"),
                   wire.get("owner"), wire.get("expiresAt"), wire.get("reason"),
                   [Holder.from_wire(name, h) for h in wire.get("holders", ())], wire)


class Locks:
    """`client.locks`: lock calls without a handle, for admin work and scripts (the CLI): nothing is
    renewed or released for you. A handle (`client.lock(...)`) is what a program holding a lock
    wants."""

    def __init__(self, client):
        self._client = client

    @wire_names(**TTL, **WAIT)
    async def acquire(self, name: str, *, ttl, owner: str | None = None, limit: int = 1,
                      wait=None) -> LockAnswer:
        """Take a permit of `name` (one of `limit`) for `ttl`; `wait` ("10s", at most 60 s: one call
        waits at most that long on the broker; a lock handle waits longer by asking again) parks the
        call until one frees. The owner (generated when not given) makes the call safe to retry."""
        op = {"op": "acquire", "name": name, "ttlSeconds": ttl_seconds(ttl), "owner": owner or mint_owner()}
        if limit != 1:
            op["limit"] = limit
        if wait is not None:
            wait_ms = int(seconds(wait, "wait") * 1000)
            if wait_ms > WAIT_MS_MAX:
                raise ValueError(f"wait {wait!r} is longer than one call may wait ({WAIT_MS_MAX // 1000}s); "
                                 "a lock handle (client.lock(...).acquire(wait=...)) waits longer")
            op["waitMs"] = wait_ms
        [result] = await self.call(op)
        return LockAnswer.from_wire(name, "acquired", result)

    @wire_names(**TTL)
    async def renew(self, name: str, *, slot: int, token: int, ttl, owner: str | None = None) -> LockAnswer:
        """Extend a held permit by `ttl` from now; the answer carries the new token."""
        op = {"op": "renew", "name": name, "slot": slot, "token": token, "ttlSeconds": ttl_seconds(ttl)}
        [result] = await self.call(_with_owner(op, owner))
        return LockAnswer.from_wire(name, "renewed", result)

    async def release(self, name: str, *, slot: int, token: int, owner: str | None = None) -> LockAnswer:
        """Give a permit back, named by the token of its latest answer (a stuck one: the token the
        listing shows)."""
        op = {"op": "release", "name": name, "slot": slot, "token": token}
        [result] = await self.call(_with_owner(op, owner))
        return LockAnswer.from_wire(name, "released", result)

    async def call(self, *operations: dict) -> list[dict]:
        """Raw lock operations, answered in order (safe to retry only when each carries an owner)."""
        safe = all(op.get("owner") is not None or op.get("op") == "get" for op in operations)
        answer = await self._client._transport.call("POST", LOCKS_PATH, {"operations": list(operations)}, safe=safe)
        return answer["results"]

    async def holders(self, name: str) -> list[Holder]:
        [result] = await self.call({"op": "get", "name": name})
        return [Holder.from_wire(name, h) for h in result["holders"]]

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[Holder]:
        """Every held permit whose name starts with `prefix`, page after page."""
        from urllib.parse import urlencode

        cursor = None
        while True:
            query = {"prefix": prefix, "limit": page_size}
            if cursor:
                query["cursor"] = cursor
            page = await self._client._transport.call("GET", f"{LOCKS_PATH}?{urlencode(query)}", safe=True)
            for item in page["items"]:
                yield Holder.from_wire(item["name"], item)
            cursor = page.get("cursor")
            if not cursor:
                return


def _with_owner(op: dict, owner: str | None) -> dict:
    if owner is not None:
        op["owner"] = owner
    return op
