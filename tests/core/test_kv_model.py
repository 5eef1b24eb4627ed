"""A Hypothesis stateful test of the KV state machine against a plain-dict model: versions,
expect, putIfAbsent, incr bounds and TTL expiry, with time injected. Replaying the effects into a
fresh state must reach the same rows."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from queen.core import records as rec
from queen.core.kv import KvState, VersionCounter, parse_kv_op
from queen.core.limits import Limits
from tests.core.test_kv import wire

T0 = 1_700_000_000_000
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)  # values a JSON client can send
KEYS = st.sampled_from(["a", "b", "c", "d"])
LIFETIMES = st.one_of(st.just(None), st.integers(1, 5))  # None = forever
EXPECTS = st.one_of(st.none(), st.integers(0, 12))


class KvModel(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.now_ms = T0
        self.state = KvState(VersionCounter(), T0)
        self.effects = []
        self.model = {}  # key -> (value, version, expires_at_ms or 0)
        self.version = 0
        self.limits = Limits()

    def _apply(self, raw):
        return wire(self.state.apply(parse_kv_op(raw, 0, self.limits), self.now_ms, self.effects))

    def _live(self, key):
        entry = self.model.get(key)
        if entry is not None and entry[2] and entry[2] <= self.now_ms:
            del self.model[key]
            return None
        return entry

    def _lifetime(self, ttl):
        return {"forever": True} if ttl is None else {"ttlSeconds": ttl}

    def _store(self, key, value, ttl):
        self.version += 1
        self.model[key] = (value, self.version, 0 if ttl is None else self.now_ms + ttl * 1000)

    @rule(key=KEYS, value=INT64, ttl=LIFETIMES, expect=EXPECTS)
    def put(self, key, value, ttl, expect):
        raw = {"op": "put", "ns": "n", "key": key, "value": value, **self._lifetime(ttl)}
        if expect is not None:
            raw["expect"] = expect
        result = self._apply(raw)
        live = self._live(key)
        current = live[1] if live else 0
        if expect is not None and expect != current:
            assert result == {"applied": False, "reason": "version",
                              "current": {"value": live[0] if live else None, "version": current}}
        else:
            self._store(key, value, ttl)
            assert result == {"applied": True, "version": self.version}

    @rule(key=KEYS, value=INT64, ttl=LIFETIMES)
    def put_if_absent(self, key, value, ttl):
        result = self._apply({"op": "putIfAbsent", "ns": "n", "key": key, "value": value, **self._lifetime(ttl)})
        if self._live(key):
            assert result["applied"] is False and result["reason"] == "exists"
        else:
            self._store(key, value, ttl)
            assert result == {"applied": True, "version": self.version}

    @rule(key=KEYS, expect=EXPECTS)
    def delete(self, key, expect):
        raw = {"op": "delete", "ns": "n", "key": key}
        if expect is not None:
            raw["expect"] = expect
        result = self._apply(raw)
        live = self._live(key)
        if live is None:
            assert result == {"applied": False, "reason": "absent"}
        elif expect is not None and expect != live[1]:
            assert result["reason"] == "version"
        else:
            self.version += 1
            del self.model[key]
            assert result == {"applied": True, "version": self.version}

    @rule(key=KEYS, by=st.integers(-3, 3), bound=st.one_of(st.none(), st.integers(-5, 5)), ttl=LIFETIMES)
    def incr(self, key, by, bound, ttl):
        raw = {"op": "incr", "ns": "n", "key": key, "by": by, **self._lifetime(ttl)}
        if bound is not None:
            raw["max" if by >= 0 else "min"] = bound
        result = self._apply(raw)
        live = self._live(key)
        current = live[0] if live else 0
        value = current + by
        past_bound = bound is not None and (value > bound if by >= 0 else value < bound)
        if past_bound or not -(1 << 63) <= value < (1 << 63):
            assert result["applied"] is False and result["reason"] == "limit" and result["value"] == current
        else:
            self._store(key, value, ttl)
            assert result == {"applied": True, "value": value, "version": self.version}

    @rule(ms=st.integers(0, 3000))
    def time_passes(self, ms):
        self.now_ms += ms

    @rule()
    def wheel_ticks(self):
        self.state.expire(self.now_ms)

    @invariant()
    def reads_match_the_model(self):
        for key in "abcd":
            got = self._apply({"op": "get", "ns": "n", "key": key})
            live = self._live(key)
            if live is None:
                assert got["found"] is False
            else:
                assert (got["value"], got["version"], got["expiresAt"]) == (live[0], live[1], live[2] or None)

    @invariant()
    def replay_reaches_the_same_rows(self):
        copy = KvState(VersionCounter(), T0)
        for record in rec.decode(self.effects):
            copy.replay(record)
        for key in "abcd":
            a = copy.live_view("n", key, self.now_ms)
            b = self.state.live_view("n", key, self.now_ms)
            assert (a and (a.value, a.version, a.expires_at_ms)) == (b and (b.value, b.version, b.expires_at_ms))


TestKvModel = KvModel.TestCase
TestKvModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
