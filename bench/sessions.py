"""Per-connection request builders: what a generator connection sends next, and what the answer it
got means.

Owns: one `Session` per connection. The generator asks `request()` for the bytes to send, frames
the answer with `take(buf)`, and hands it to `answer(status, body, tally, counting)`, which checks
it, counts the workload's units (pairs, renewals, hand-overs, ops) into `tally.units` when the
answer landed inside the measured window, and decides the next request. Stateless workloads keep
the pre-encoded fast path (`RingSession`: a ring of ready bytes, one needle count per answer);
lock cycles, renewals, CAS and guarded transactions need the previous answer (the release needs
the slot and token the acquire gave), so their sessions read it.

Two wire protocols: HTTP/1.1 for Queen and the baseline, RESP for Redis (a request of N ops is N
pipelined commands in one write, and its answer is N replies). etcd is driven by the Go loader
in bench/peers/peerload, which implements the same workloads with clientv3.

Names, keys and owners carry the run's `tag`, so a lock still held when one run ends (the drain
sends no release) never meets the next run: it expires by its TTL on its own.

Never: opens a socket, reads a clock or hides an error; every unexpected answer is counted by kind
with a sample (`tally.error`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

# Lock leases far longer than a run, so no permit expires under a holder mid-run (expiry would
# turn a release into "lost" and measure the wheel, not the lock path).
LOCK_TTL_S = 60
LOCK_TTL_MS = LOCK_TTL_S * 1000
# How long a waiting acquire (hot lock, semaphore) may park: well past any hand-over queue of 64.
WAIT_MS = 10_000
SEMAPHORE_PERMITS = 8
KV_NS = "bench"
KV_TTL_S = 3600
VALUE = "v" * 32


@dataclass(frozen=True)
class Context:
    """What a session knows about its place in the run; plain data, built in the generator process."""
    host: str
    port: int
    ops: int
    connection: int
    connections: int
    keys_total: int
    tag: str  # unique per run


# -- framing -------------------------------------------------------------------------------------


class ResponseError(Exception):
    """The bytes on the wire are not an answer this client can read; the connection is dropped."""


def take_response(buf: bytearray):
    """If buf starts with a whole HTTP/1.1 response: (bytes it spans, status, connection-close,
    body as a memoryview). None while it is incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 65536:
            raise ResponseError("response head over 64 KiB")
        return None
    head = bytes(buf[:end]).lower()
    if not head.startswith(b"http/1.1 "):
        raise ResponseError(f"not an HTTP/1.1 status line: {head[:40]!r}")
    status = int(head[9:12])
    start = head.find(b"\r\ncontent-length:")
    if start < 0:
        raise ResponseError("response without content-length")
    stop = head.find(b"\r\n", start + 2)
    length = int(head[start + 17: stop if stop >= 0 else len(head)])
    total = end + 4 + length
    if len(buf) < total:
        return None
    close = b"\r\nconnection: close" in head
    return total, status, close, memoryview(buf)[end + 4: total]


class RespError(str):
    """A RESP error reply (`-ERR ...`), kept as its text."""


def _resp_one(buf, pos: int):
    """(value, next position) of the RESP reply at pos, or None while incomplete."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return None
    kind = buf[pos]
    if kind == 43:  # '+'
        return bytes(buf[pos + 1:end]), end + 2
    if kind == 58:  # ':'
        return int(buf[pos + 1:end]), end + 2
    if kind == 36:  # '$'
        length = int(buf[pos + 1:end])
        if length < 0:
            return None, end + 2
        stop = end + 2 + length
        if len(buf) < stop + 2:
            return None
        return bytes(buf[end + 2:stop]), stop + 2
    if kind == 45:  # '-'
        return RespError(bytes(buf[pos + 1:end]).decode("utf-8", "replace")), end + 2
    if kind == 42:  # '*'
        count = int(buf[pos + 1:end])
        position, items = end + 2, []
        for _ in range(max(0, count)):
            one = _resp_one(buf, position)
            if one is None:
                return None
            item, position = one
            items.append(item)
        return (items if count >= 0 else None), position
    raise ResponseError(f"not a RESP reply: {bytes(buf[pos:pos + 40])!r}")


def take_replies(buf: bytearray, count: int):
    """If buf holds `count` whole RESP replies: (bytes they span, 200, False, [replies])."""
    position, replies = 0, []
    for _ in range(count):
        one = _resp_one(buf, position)
        if one is None:
            return None
        reply, position = one
        replies.append(reply)
    return position, 200, False, replies


def resp_command(*parts) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


# `authorization: Bearer <token>` and CRLF when the Queen under test has an auth file, else empty:
# part of every Queen request built while it is set (a generator process sets it from its plan, the
# bench around its own calls to such a server: authorized()).
AUTH_HEADER = b""


class authorized:
    """`with authorized(token):` requests built inside carry the token (None: none)."""

    def __init__(self, token: str | None):
        self.header = b"authorization: Bearer %s\r\n" % token.encode() if token else b""

    def __enter__(self):
        global AUTH_HEADER
        self.saved, AUTH_HEADER = AUTH_HEADER, self.header

    def __exit__(self, *exc):
        global AUTH_HEADER
        AUTH_HEADER = self.saved


def http_post(host: str, port: int, path: str, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
            % (path.encode(), host.encode(), port, len(body), AUTH_HEADER)) + body


# -- base ----------------------------------------------------------------------------------------


class Session:
    """One connection's conversation. Subclasses set `replies` (RESP) or keep HTTP framing."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def take(self, buf: bytearray):
        return take_response(buf)

    def request(self) -> bytes:
        raise NotImplementedError

    def answer(self, status: int, body, tally, counting: bool) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """The connection was dropped and reopened: start the conversation again."""

    def owes_release(self) -> bool:
        """True while the next request gives back what this session holds (a release): the
        generator still sends it after the window closes, so a parked waiter is handed the lock
        and the drain ends instead of waiting out waitMs."""
        return False


class Chain(Session):
    """A conversation that opens with one fixed request (`first`) and goes on with whatever the
    last answer made due (`next`, None when nothing is); a reconnect starts it again. HTTP
    sessions subclass it; RESP ones list it after RedisSession, which owns their framing."""

    first: bytes = b""
    next: bytes | None = None

    def reset(self) -> None:
        self.next = None

    def request(self) -> bytes:
        return self.first if self.next is None else self.next


def _count(tally, unit: str, n: int) -> None:
    tally.units[unit] = tally.units.get(unit, 0) + n


def _sample(body) -> str:
    if isinstance(body, list):
        return repr(body[:4])[:300]
    return bytes(body[:300]).decode("utf-8", "replace")


class RingSession(Session):
    """Pre-encoded requests cycled in order; each answer must be 200 and hold `needle` once per op.
    `ring` is built by the workload (bench/workloads.py) before the run starts."""

    unit = "ops"

    def __init__(self, ctx: Context, ring: list[bytes], needle: bytes | None, unit: str = "ops"):
        super().__init__(ctx)
        self.ring = ring
        self.position = 0
        self.needle = needle
        self.unit = unit

    def request(self) -> bytes:
        request = self.ring[self.position]
        self.position = (self.position + 1) % len(self.ring)
        return request

    def answer(self, status, body, tally, counting) -> None:
        ops = self.ctx.ops
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
        elif self.needle is not None and bytes(body).count(self.needle) != ops:
            tally.error("bad_body", _sample(body))
        elif counting:
            _count(tally, self.unit, ops)


# -- key and name layout -------------------------------------------------------------------------


def key_name(index: int) -> str:
    return f"k{index:05d}"


def key_groups(ctx: Context, groups_max: int = 1024) -> list[list[str]]:
    """Connection i of C walks its own stretch of the key space, `ops` keys per request, wrapping;
    so connections touch disjoint keys and a request never repeats one."""
    stretch = max(1, ctx.keys_total // ctx.connections)
    first = ctx.connection * ctx.keys_total // ctx.connections
    count = min(groups_max, -(-stretch // ctx.ops))
    return [[key_name((first + (g * ctx.ops + i) % stretch) % ctx.keys_total) for i in range(ctx.ops)]
            for g in range(count)]


def lock_name_groups(ctx: Context, groups: int = 16) -> list[list[str]]:
    """Distinct lock names per connection: `groups` sets of `ops` names, visited in turn."""
    return [[f"{ctx.tag}-c{ctx.connection}-{g}-{i}" for i in range(ctx.ops)] for g in range(groups)]


def owner_of(ctx: Context) -> str:
    return f"{ctx.tag}-o{ctx.connection}"


# -- Queen ---------------------------------------------------------------------------------------


def _locks_request(ctx: Context, body: bytes) -> bytes:
    return http_post(ctx.host, ctx.port, "/api/v1/locks", body)


def _acquire_body(names: list[str], owner: str, limit: int = 1, wait_ms: int = 0) -> bytes:
    ops = []
    for name in names:
        op = {"op": "acquire", "name": name, "ttlSeconds": LOCK_TTL_S, "owner": owner}
        if limit != 1:
            op["limit"] = limit
        if wait_ms:
            op["waitMs"] = wait_ms
        ops.append(op)
    return orjson.dumps({"operations": ops})


def _release_body(held: list[tuple[str, int, int]], owner: str) -> bytes:
    return orjson.dumps({"operations": [{"op": "release", "name": name, "slot": slot, "token": token, "owner": owner}
                                        for name, slot, token in held]})


def _results(body, tally) -> list | None:
    try:
        return orjson.loads(body)["results"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        tally.error("bad_body", _sample(body))
        return None


class QueenLockCycle(Session):
    """Acquire `ops` distinct free locks in one call, then release them all in the next, with the
    slot and token each acquire answered. A pair = one acquire + one release; counted when the
    release answer says released."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.owner = owner_of(ctx)
        self.acquires = [_locks_request(ctx, _acquire_body(names, self.owner)) for names in lock_name_groups(ctx)]
        self.position = 0
        self.next = None  # the release request when one is due

    def reset(self) -> None:
        self.next = None  # re-acquiring with the same owner answers already:true, then we release

    def owes_release(self) -> bool:
        return self.next is not None

    def request(self) -> bytes:
        if self.next is not None:
            return self.next
        request = self.acquires[self.position]
        self.position = (self.position + 1) % len(self.acquires)
        return request

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            self.next = None
            return
        if self.next is None:  # an acquire answer
            results = _results(body, tally)
            if results is None:
                return
            held = [(r["name"], r["slot"], r["token"]) for r in results if r.get("acquired")]
            if len(held) != len(results):
                tally.error("not_acquired", _sample(body))
            if counting:
                _count(tally, "acquired", len(held))
            self.next = _locks_request(self.ctx, _release_body(held, self.owner)) if held else None
        else:
            released = bytes(body).count(b'"released":true')
            expected = self.next.count(b'"op":"release"')
            if released != expected:
                tally.error("not_released", _sample(body))
            if counting:
                _count(tally, "pairs", released)
            self.next = None


class QueenLockRenew(Chain):
    """Acquire `ops` locks once, then renew them over and over, each renew with the token the last
    answer gave (the token changes at every renew)."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.owner = owner_of(ctx)
        self.names = lock_name_groups(ctx, 1)[0]
        self.first = _locks_request(ctx, _acquire_body(self.names, self.owner))  # then renewals

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            self.next = None
            return
        results = _results(body, tally)
        if results is None:
            self.next = None
            return
        renewing = self.next is not None
        flag = "renewed" if renewing else "acquired"
        held = [(r["name"], r["slot"], r["token"]) for r in results if r.get(flag)]
        if len(held) != len(results):
            tally.error("not_renewed" if renewing else "not_acquired", _sample(body))
            self.next = None
            return
        if renewing and counting:
            _count(tally, "renewals", len(held))
        self.next = _locks_request(self.ctx, orjson.dumps({"operations": [
            {"op": "renew", "name": name, "slot": slot, "token": token, "ttlSeconds": LOCK_TTL_S, "owner": self.owner}
            for name, slot, token in held]}))


class QueenContended(Chain):
    """Every connection wants the same name (a lock, or a semaphore of `limit` permits): acquire;
    when it is granted, release it and start again; when it is held (no waitMs) ask again at
    once. `answers` counts acquire answers, `acquired` the grants (hand-overs), `pairs` the
    releases."""

    limit = 1
    wait_ms = 0
    name = "hot"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.owner = owner_of(ctx)
        self.first = _locks_request(ctx, _acquire_body([f"{ctx.tag}-{self.name}"], self.owner, self.limit, self.wait_ms))

    def owes_release(self) -> bool:
        return self.next is not None

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            self.next = None
            return
        if self.next is None:
            results = _results(body, tally)
            if results is None:
                return
            result = results[0]
            if counting:
                _count(tally, "answers", 1)
            if result.get("acquired"):
                if counting:
                    _count(tally, "acquired", 1)
                self.next = _locks_request(self.ctx, _release_body([(result["name"], result["slot"], result["token"])],
                                                                   self.owner))
            elif result.get("reason") == "timeout":
                if counting:
                    _count(tally, "timeouts", 1)
            elif result.get("reason") != "held":
                tally.error("bad_body", _sample(body))
        else:
            if b'"released":true' not in bytes(body):
                tally.error("not_released", _sample(body))
            elif counting:
                _count(tally, "pairs", 1)
            self.next = None


class QueenHotWait(QueenContended):
    wait_ms = WAIT_MS


class QueenSemaphore(QueenContended):
    limit = SEMAPHORE_PERMITS
    name = "sem"


class QueenSemaphoreWait(QueenSemaphore):
    wait_ms = WAIT_MS


class QueenKvCas(Chain):
    """Compare-and-set on the connection's own `ops` keys: each put carries `expect` = the version
    the last answer gave, so every one must apply. The first request is a plain put that learns
    the versions (not counted)."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.keys = [f"{ctx.tag}-cas-{ctx.connection}-{i}" for i in range(ctx.ops)]
        self.first = self._put(None)

    def _put(self, versions):
        ops = []
        for i, key in enumerate(self.keys):
            op = {"op": "put", "ns": KV_NS, "key": key, "value": VALUE, "ttlSeconds": KV_TTL_S}
            if versions is not None:
                op["expect"] = versions[i]
            ops.append(op)
        return http_post(self.ctx.host, self.ctx.port, "/api/v1/kv", orjson.dumps({"operations": ops}))

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            self.next = None
            return
        results = _results(body, tally)
        if results is None or not all(r.get("applied") for r in results):
            if results is not None:
                tally.error("cas_missed", _sample(body))
            self.next = None
            return
        if self.next is not None and counting:
            _count(tally, "ops", len(results))
        self.next = self._put([r["version"] for r in results])


class QueenGuardedTxn(Session):
    """Take a lock once, then commit transactions `{"kv": [guard, put x ops]}` under it: the guard
    is the acquire answer's, as is. Every transaction must succeed."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.owner = owner_of(ctx)
        self.acquire = _locks_request(ctx, _acquire_body([f"{ctx.tag}-txn-{ctx.connection}"], self.owner))
        self.groups = key_groups(ctx, 64)
        self.ring = None
        self.position = 0

    def reset(self) -> None:
        self.ring = None

    def request(self) -> bytes:
        if self.ring is None:
            return self.acquire
        request = self.ring[self.position]
        self.position = (self.position + 1) % len(self.ring)
        return request

    def answer(self, status, body, tally, counting) -> None:
        if status != 200:
            tally.error(f"http_{status}", _sample(body))
            return
        if self.ring is None:
            results = _results(body, tally)
            if results is None or not results[0].get("acquired"):
                tally.error("not_acquired", _sample(body))
                return
            guard = results[0]["guard"]
            self.ring = [http_post(self.ctx.host, self.ctx.port, "/api/v1/transaction", orjson.dumps({"kv": [guard] + [
                {"op": "put", "ns": KV_NS, "key": key, "value": VALUE, "ttlSeconds": KV_TTL_S} for key in keys]}))
                for keys in self.groups]
            return
        if b'"success":true' not in bytes(body):
            tally.error("txn_failed", _sample(body))
        elif counting:
            _count(tally, "txns", 1)
            _count(tally, "ops", self.ctx.ops)


# -- Redis ---------------------------------------------------------------------------------------

# The usual Redis lock recipe: SET name owner NX PX ttl to take it; a script that deletes it only
# while it still holds our owner to release it, and one that extends the expiry the same way.
RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
RENEW_LUA = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
             "else return 0 end")
# A semaphore of N permits as N lock keys: take the first free one, or answer -1 at once.
SEMAPHORE_LUA = ("for i = 0, tonumber(ARGV[2]) - 1 do "
                 "if redis.call('set', KEYS[1] .. '#' .. i, ARGV[1], 'NX', 'PX', ARGV[3]) then return i end end "
                 "return -1")
# CAS by value (Redis keeps no versions): set only while the key holds what we last wrote.
CAS_LUA = ("if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) "
           "return 1 else return 0 end")
# A guarded write: put only while the lock still holds our owner.
GUARDED_LUA = ("if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
               "for i = 2, #KEYS do redis.call('set', KEYS[i], ARGV[2], 'PX', ARGV[3]) end return 1")
SCRIPTS = {"release": RELEASE_LUA, "renew": RENEW_LUA, "semaphore": SEMAPHORE_LUA, "cas": CAS_LUA,
           "guarded": GUARDED_LUA}
SHA = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in SCRIPTS.items()}


def redis_setup_commands() -> list[bytes]:
    """SCRIPT LOAD of every script, sent once per server before the runs (EVALSHA needs them)."""
    return [resp_command("SCRIPT", "LOAD", text) for text in SCRIPTS.values()]


class RedisSession(Session):
    def take(self, buf):
        return take_replies(buf, self.replies)

    replies = 1


def _redis_errors(replies, tally) -> bool:
    for reply in replies:
        if isinstance(reply, RespError):
            tally.error("redis_error", str(reply)[:300])
            return True
    return False


class RedisRing(RedisSession):
    """Stateless pipelines: `ops` commands per write, each reply checked by `ok`."""

    def __init__(self, ctx: Context, ring: list[bytes], ok, unit: str = "ops"):
        super().__init__(ctx)
        self.ring = ring
        self.position = 0
        self.ok = ok
        self.unit = unit
        self.replies = ctx.ops

    def request(self) -> bytes:
        request = self.ring[self.position]
        self.position = (self.position + 1) % len(self.ring)
        return request

    def answer(self, status, replies, tally, counting) -> None:
        if _redis_errors(replies, tally):
            return
        if not all(self.ok(reply) for reply in replies):
            tally.error("bad_reply", _sample(replies))
        elif counting:
            _count(tally, self.unit, len(replies))


class RedisLockCycle(RedisSession):
    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.owner = owner_of(ctx).encode()
        self.groups = lock_name_groups(ctx)
        self.acquires = [b"".join(resp_command("SET", n, self.owner, "NX", "PX", LOCK_TTL_MS) for n in names)
                         for names in self.groups]
        self.releases = [b"".join(resp_command("EVALSHA", SHA["release"], 1, n, self.owner) for n in names)
                         for names in self.groups]
        self.replies = ctx.ops
        self.position = 0
        self.releasing = False

    def reset(self) -> None:
        self.releasing = False

    def owes_release(self) -> bool:
        return self.releasing

    def request(self) -> bytes:
        return self.releases[self.position] if self.releasing else self.acquires[self.position]

    def answer(self, status, replies, tally, counting) -> None:
        if _redis_errors(replies, tally):
            self.releasing = False
            return
        if not self.releasing:
            granted = sum(1 for reply in replies if reply == b"OK")
            if granted != len(replies):
                tally.error("not_acquired", _sample(replies))
            if counting:
                _count(tally, "acquired", granted)
            self.releasing = True
        else:
            released = sum(1 for reply in replies if reply == 1)
            if released != len(replies):
                tally.error("not_released", _sample(replies))
            if counting:
                _count(tally, "pairs", released)
            self.releasing = False
            self.position = (self.position + 1) % len(self.acquires)


class RedisLockRenew(RedisSession):
    def __init__(self, ctx: Context):
        super().__init__(ctx)
        owner = owner_of(ctx).encode()
        names = lock_name_groups(ctx, 1)[0]
        self.acquire = b"".join(resp_command("SET", n, owner, "NX", "PX", LOCK_TTL_MS) for n in names)
        self.renew = b"".join(resp_command("EVALSHA", SHA["renew"], 1, n, owner, LOCK_TTL_MS) for n in names)
        self.replies = ctx.ops
        self.held = False

    def reset(self) -> None:
        self.held = False

    def request(self) -> bytes:
        return self.renew if self.held else self.acquire

    def answer(self, status, replies, tally, counting) -> None:
        if _redis_errors(replies, tally):
            return
        expected = 1 if self.held else b"OK"
        if any(reply != expected for reply in replies):
            tally.error("not_renewed" if self.held else "not_acquired", _sample(replies))
            self.held = False
            return
        if self.held and counting:
            _count(tally, "renewals", len(replies))
        self.held = True


class RedisContended(RedisSession, Chain):
    """The hot lock (SET NX) or the semaphore (a script over N permit keys), fail-fast: Redis has
    no waiting acquire, so a refused client asks again at once."""

    semaphore = False

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.owner = owner_of(ctx).encode()
        if self.semaphore:
            self.key = f"{ctx.tag}-sem"
            self.first = resp_command("EVALSHA", SHA["semaphore"], 1, self.key, self.owner, SEMAPHORE_PERMITS, LOCK_TTL_MS)
        else:
            self.key = f"{ctx.tag}-hot"
            self.first = resp_command("SET", self.key, self.owner, "NX", "PX", LOCK_TTL_MS)

    def owes_release(self) -> bool:
        return self.next is not None

    def answer(self, status, replies, tally, counting) -> None:
        if _redis_errors(replies, tally):
            self.next = None
            return
        reply = replies[0]
        if self.next is None:
            if counting:
                _count(tally, "answers", 1)
            granted = reply == b"OK" if not self.semaphore else (isinstance(reply, int) and reply >= 0)
            if granted:
                if counting:
                    _count(tally, "acquired", 1)
                key = self.key if not self.semaphore else f"{self.key}#{reply}"
                self.next = resp_command("EVALSHA", SHA["release"], 1, key, self.owner)
            elif reply not in (None, -1):
                tally.error("bad_reply", _sample(replies))
        else:
            if reply != 1:
                tally.error("not_released", _sample(replies))
            elif counting:
                _count(tally, "pairs", 1)
            self.next = None


class RedisSemaphore(RedisContended):
    semaphore = True


class RedisKvCas(RedisSession):
    """CAS by value on the connection's own keys: each write names the value it expects to find
    (the one it wrote last, a counter), since Redis keeps no versions."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.keys = [f"{ctx.tag}-cas-{ctx.connection}-{i}" for i in range(ctx.ops)]
        self.replies = ctx.ops
        self.generation = 0
        self.started = False

    def reset(self) -> None:
        self.started = False

    def request(self) -> bytes:
        if not self.started:
            return b"".join(resp_command("SET", k, "v0", "PX", KV_TTL_S * 1000) for k in self.keys)
        old, new = f"v{self.generation}", f"v{self.generation + 1}"
        return b"".join(resp_command("EVALSHA", SHA["cas"], 1, k, old, new, KV_TTL_S * 1000) for k in self.keys)

    def answer(self, status, replies, tally, counting) -> None:
        if _redis_errors(replies, tally):
            self.started = False
            return
        if not self.started:
            self.started, self.generation = True, 0
            return
        if any(reply != 1 for reply in replies):
            tally.error("cas_missed", _sample(replies))
            self.started = False
            return
        if counting:
            _count(tally, "ops", len(replies))
        self.generation += 1


class RedisGuardedTxn(RedisSession):
    """Take a lock once, then write `ops` keys in one script that first checks the lock is ours."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        owner = owner_of(ctx).encode()
        lock = f"{ctx.tag}-txn-{ctx.connection}"
        self.acquire = resp_command("SET", lock, owner, "NX", "PX", LOCK_TTL_MS)
        self.ring = [resp_command("EVALSHA", SHA["guarded"], 1 + len(keys), lock, *keys, owner, VALUE, KV_TTL_S * 1000)
                     for keys in key_groups(ctx, 64)]
        self.position = 0
        self.held = False

    def reset(self) -> None:
        self.held = False

    def request(self) -> bytes:
        if not self.held:
            return self.acquire
        request = self.ring[self.position]
        self.position = (self.position + 1) % len(self.ring)
        return request

    def answer(self, status, replies, tally, counting) -> None:
        if _redis_errors(replies, tally):
            return
        if not self.held:
            if replies[0] != b"OK":
                tally.error("not_acquired", _sample(replies))
            else:
                self.held = True
            return
        if replies[0] != 1:
            tally.error("txn_failed", _sample(replies))
        elif counting:
            _count(tally, "txns", 1)
            _count(tally, "ops", self.ctx.ops)
