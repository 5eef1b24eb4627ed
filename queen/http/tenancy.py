"""What each tenant may still do: its write rate, its quotas and whether an admin paused it.

Checked at the edge, when a call arrives and before any of it reaches a shard, so a refused call
changes nothing. Rates are token buckets on the event loop's clock (so tests drive them with
trio's MockClock). Quotas compare against what the tenant holds now (queen/core/tenants.py's
Usage, kept exact by the shards): calls in flight at the same moment may together pass a quota by
their own size, never more. A pause is a KV row in the tenant's own reserved namespace, written
through the log like any other, so it holds across restarts and snapshots; the edge keeps a copy.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import trio

from queen.auth import QUOTAS
from queen.core import tenants
from queen.core.kv import KvOp, value_of
from queen.errors import QueenError, Unavailable

logger = logging.getLogger("queen.audit")

KV, QUEUES = "kv", "queues"  # what a pause stops; locks are KV rows, timers belong to queues
AREAS = (KV, QUEUES)
PAUSE_KEY = "paused"
OPERATOR, ADMIN = "operator", "admin"  # who paused an area
PAUSED_RETRY_AFTER_S = 5
QUOTA_RETRY_AFTER_S = 30  # a quota frees only when something is deleted or consumed

class TooManyRequests(QueenError):
    """429: over a rate or a quota; `code` says which, Retry-After when to try again."""

    http_status = 429

    def __init__(self, code: str, message: str, retry_after_s: int, details: dict):
        super().__init__(code, message, {**details, "retryAfterSeconds": retry_after_s})
        self.headers = [(b"retry-after", b"%d" % retry_after_s)]


class Forbidden(QueenError):
    http_status = 403

    def __init__(self, message: str):
        super().__init__("forbidden", message)


class Paused(Unavailable):
    def __init__(self, tenant: str, area: str, by: str):
        who = "the server's operator" if by == OPERATOR else "an admin of the tenant"
        super().__init__("paused", f"{who} paused the {area} writes of tenant {tenant!r}; reads go on",
                         {"tenant": tenant, "area": area, "pausedBy": by})
        self.headers = [(b"retry-after", b"%d" % PAUSED_RETRY_AFTER_S)]


class Bucket:
    """A token bucket: `rate` per second, holding at most a tenth of a second's worth (at least
    one), so what passes over any few seconds stays within a few percent of the rate."""

    __slots__ = ("rate", "capacity", "tokens", "stamp")

    def __init__(self, rate: int, now: float):
        self.rate = rate
        self.capacity = max(1.0, rate / 10)
        self.tokens = self.capacity
        self.stamp = now

    def wait_s(self, count: int, now: float) -> float:
        """0 when count tokens were taken; else how long until they could be (none taken)."""
        tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        # A call bigger than the bucket passes once the bucket is full, and leaves it in debt.
        need = min(count, self.capacity)
        if tokens >= need:
            self.tokens = tokens - count
            return 0.0
        self.tokens = tokens
        return (need - tokens) / self.rate


@dataclass(slots=True)
class Rules:
    quotas: dict  # setting name -> limit
    writes: Bucket | None
    operations: Bucket | None


class Tenancy:
    """Every tenant's rules and pauses, and the checks a write passes before it is sent on."""

    def __init__(self, router, clock=trio.current_time):
        self.router = router
        self.clock = clock
        self.rules: dict[str, Rules] = {}
        # tenant -> {area: who paused it, "operator" or "admin"}: only the operator lifts its own.
        self.paused: dict[str, dict[str, str]] = {}
        self.active = False  # any rule or pause at all: when not, a write pays one attribute read
        self.refused = {}  # (tenant, code) -> count, for /metrics

    def configure(self, settings: dict[str, dict]) -> None:
        """The auth file's tenant settings, at start or on SIGHUP: buckets of unchanged rates keep
        their state, so a reload does not hand out a fresh burst."""
        now = self.clock()
        rules = {}
        for tenant, values in settings.items():
            old = self.rules.get(tenant)
            rules[tenant] = Rules(
                {name: values[name] for name in QUOTAS if name in values},
                _bucket(values.get("writesPerSecond"), old.writes if old else None, now),
                _bucket(values.get("operationsPerSecond"), old.operations if old else None, now))
        self.rules = rules
        self._refresh()

    def _refresh(self) -> None:
        self.active = bool(self.rules) or any(self.paused.values())

    # -- the check --------------------------------------------------------------------------------

    def admit(self, principal, area: str, operations: int, *, grows: int = 0, pushes: int = 0, timers: int = 0,
              rate: bool = True, writes: int = 1) -> None:
        """Raise if the principal's tenant may not write now: paused (503), over its write rate or
        over a quota (429). grows: operations that may add a KV key; pushes and timers: messages
        and timers the call may add; rate: False when this call's rate was taken already (a
        transaction's second area); writes: what the call counts on the write rate (2 for one that
        also pops: an ack or transaction with `next`)."""
        if not self.active:
            return
        tenant = tenants.DEFAULT if principal.tenant == tenants.EVERY else principal.tenant
        paused = self.paused.get(tenant)
        if paused and area in paused:
            raise Paused(tenant, area, paused[area])
        rules = self.rules.get(tenant)
        if rules is None:
            return
        quotas = rules.quotas
        if quotas:
            usage = self.router.usage.of_tenant.get(tenant)
            if usage is not None:
                if area == KV:
                    self._quota(tenant, quotas, "keysMax", usage.keys + grows, grows, "quota_keys", "KV keys")
                    self._quota(tenant, quotas, "bytesMax", usage.bytes, grows, "quota_bytes", "bytes")
                else:
                    self._quota(tenant, quotas, "messagesMax", usage.messages + pushes, pushes, "quota_messages",
                                "messages")
                    self._quota(tenant, quotas, "timersMax", usage.timers + timers, timers, "quota_timers", "timers")
                    self._quota(tenant, quotas, "bytesMax", usage.bytes, pushes + timers, "quota_bytes", "bytes")
        if not rate:
            return
        now = self.clock()
        wait = 0.0
        if rules.writes is not None:
            wait = rules.writes.wait_s(writes, now)
        if not wait and rules.operations is not None:
            wait = rules.operations.wait_s(operations, now)
            if wait and rules.writes is not None:
                rules.writes.tokens += writes  # the call did not pass: give its writes back
        if wait:
            self._count(tenant, "rate_limited")
            # Retry-After is whole seconds; the details say it to the millisecond, which the SDK uses.
            raise TooManyRequests("rate_limited", f"tenant {tenant!r} is over its write rate; try again in "
                                  f"{wait:.3f}s", max(1, math.ceil(wait)),
                                  {"tenant": tenant, "retryAfterMs": math.ceil(wait * 1000)})

    def _quota(self, tenant: str, quotas: dict, name: str, would_hold: int, adds: int, code: str, what: str) -> None:
        limit = quotas.get(name)
        if limit is None or not adds:
            return
        # Bytes are known only once written: at or past the quota, nothing more that adds is taken.
        over = would_hold >= limit if name == "bytesMax" else would_hold > limit
        if over:
            self._count(tenant, code)
            raise TooManyRequests(code, f"tenant {tenant!r} is at its quota of {limit} {what} ({name}); delete or "
                                  "consume something first", QUOTA_RETRY_AFTER_S,
                                  {"tenant": tenant, "quota": name, "limit": limit})

    def _count(self, tenant: str, code: str) -> None:
        self.refused[tenant, code] = self.refused.get((tenant, code), 0) + 1

    # -- pauses -------------------------------------------------------------------------------------

    async def load_pauses(self, names) -> None:
        """Read the pause rows of the tenants named (at start, and for tenants new on a reload)."""
        for tenant in names:
            if tenant == tenants.EVERY:
                continue
            op = KvOp("get", tenants.prefix_of(tenant) + tenants.SETTINGS_NS, PAUSE_KEY)
            # From memory: a follower (or a node not yet leading) answers no read through the
            # router, and pauses are bookkeeping, not a client's read.
            [row] = await self.router.run_kv([op], False, from_memory=True)
            value = value_of(row["value"]) if row["found"] else None
            value = value if isinstance(value, dict) else {}
            self.paused[tenant] = {area: value[area] for area in AREAS if value.get(area) in (OPERATOR, ADMIN)}
        self._refresh()

    async def set_paused(self, tenant: str, areas: dict[str, bool], by: str) -> dict[str, str]:
        """Pause or resume areas of a tenant, durably, as `by` ("operator" or "admin"); the areas
        paused afterwards. A tenant's admin cannot lift a pause the operator set."""
        paused = dict(self.paused.get(tenant, {}))
        for area, on in areas.items():
            if not on and paused.get(area) == OPERATOR and by != OPERATOR:
                raise Forbidden(f"the server's operator paused the {area} writes of tenant {tenant!r}; only the "
                                "operator resumes them")
        for area, on in areas.items():
            if on:
                paused[area] = OPERATOR if OPERATOR in (by, paused.get(area)) else ADMIN
            else:
                paused.pop(area, None)
        op = KvOp("put", tenants.prefix_of(tenant) + tenants.SETTINGS_NS, PAUSE_KEY)
        op.value = {area: paused.get(area, False) for area in AREAS}
        [result] = await self.router.run_kv([op], True)
        if not result.get("applied"):
            raise Unavailable("not_durable", "the pause could not be written; try again")
        self.paused[tenant] = paused
        self._refresh()
        return paused


def _bucket(rate: int | None, old: Bucket | None, now: float) -> Bucket | None:
    if rate is None:
        return None
    if old is not None and old.rate == rate:
        return old
    return Bucket(rate, now)


def audit(request, action: str, **fields) -> None:
    """One info line per admin action of a request (queen/http/wire.py's Request), naming its token
    (never its secret) and its request id, which the answer's X-Request-Id carries too."""
    principal = request.principal
    fields = {name: value for name, value in fields.items() if value is not None}
    logger.info("event=audit action=%s token=%r role=%s tenant=%s" + "".join(f" {name}=%r" for name in fields)
                + " request_id=%s", action, principal.name, principal.role, principal.tenant, *fields.values(),
                request.request_id.decode())
