"""No answer shows what a crash could take back: every version, token and fence in an answer is at
most the version that answer waited to be durable, whatever path produced it (a read of a row
written by a frame still in flight, a miss showing the current row, a parked acquire answered by a
later step, a page across shards, a transaction).

Random KV, lock and transaction calls and ticks go through the runtime's StepRunner (the one path
every answer takes) over a two-shard State; a stand-in writer records the version each call waits
for instead of writing anything."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from queen.core.kv import parse_kv_op
from queen.core.limits import Limits
from queen.core.locks import parse_lock_op
from queen.core.placement import shard_of
from queen.core.state import Ops, State, Tick, Transaction
from queen.runtime.steps import Call, StepRunner

T0 = 1_700_000_000_000
LIMITS = Limits()
SHARDS = 2
KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
OWNERS = st.sampled_from(["o1", "o2", "o3"])
SHOWN = ("version", "token", "fence", "createVersion")


class RecordingWriter:
    def __init__(self):
        self.waited = {}  # call -> version it waits for
        self.last_submitted = 0

    def submit(self, items, first_version, last_version):
        assert first_version > self.last_submitted
        self.last_submitted = last_version

    def when_durable(self, version, call):
        self.waited[call] = version


class FixedClock:
    def __init__(self):
        self.now = T0

    def now_ms(self):
        return self.now


def versions_shown(document):
    if isinstance(document, dict):
        for key, value in document.items():
            if key in SHOWN and type(value) is int:
                yield value
            yield from versions_shown(value)
    elif isinstance(document, list):
        for item in document:
            yield from versions_shown(item)


class Answers(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.clock = FixedClock()
        self.state = State(SHARDS, T0)
        self.writer = RecordingWriter()
        self.steps = StepRunner(self.state, self.writer, self.clock)
        self.calls = []
        self.granted = {}  # owner -> last lock answer

    def _ops(self, op, name_for_shard):
        call = Call(1, 1)
        shard = shard_of(*name_for_shard, SHARDS)
        self.steps.run(Ops(shard, [(call, 0, op)]))
        self.calls.append(call)
        return call

    def _kv(self, raw):
        op = parse_kv_op(raw, 0, LIMITS, allow_reserved=raw["ns"] == "queen-locks")
        if op.op == "getPrefix":
            for shard in range(SHARDS):  # one part per shard, as the router sends it
                call = Call(1, 1)
                self.steps.run(Ops(shard, [(call, 0, op)]))
                self.calls.append(call)
            return
        self._ops(op, (raw["ns"], raw.get("key") or raw["keys"][0]))

    def _lock(self, raw):
        return self._ops(parse_lock_op(raw, 0, LIMITS), ("queen-locks", raw["name"]))

    @rule(key=KEYS, value=st.integers(0, 9), ttl=st.sampled_from([1, 5, None]))
    def put(self, key, value, ttl):
        lifetime = {"forever": True} if ttl is None else {"ttlSeconds": ttl}
        self._kv({"op": "put", "ns": "app", "key": key, "value": value, **lifetime})

    @rule(key=KEYS, expect=st.integers(0, 30))
    def put_expecting(self, key, expect):
        self._kv({"op": "put", "ns": "app", "key": key, "value": 0, "forever": True, "expect": expect})

    @rule(key=KEYS)
    def delete(self, key):
        self._kv({"op": "delete", "ns": "app", "key": key})

    @rule(key=KEYS)
    def incr(self, key):
        self._kv({"op": "incr", "ns": "app", "key": key, "max": 3, "forever": True})

    @rule(key=KEYS)
    def get(self, key):
        self._kv({"op": "get", "ns": "app", "key": key})

    @rule(keys=st.lists(KEYS, min_size=1, max_size=3))
    def get_many(self, keys):
        self._kv({"op": "getMany", "ns": "app", "keys": keys})

    @rule()
    def page(self):
        self._kv({"op": "getPrefix", "ns": "app", "prefix": ""})
        self._kv({"op": "getPrefix", "ns": "queen-locks", "prefix": ""})

    @rule(key=KEYS, expect=st.integers(0, 30))
    def check(self, key, expect):
        self._kv({"op": "check", "ns": "app", "key": key, "expect": expect})

    @rule(owner=OWNERS, wait=st.sampled_from([None, 500, 3000]), limit=st.sampled_from([1, 2]))
    def acquire(self, owner, wait, limit):
        raw = {"op": "acquire", "name": "job", "ttlSeconds": 2, "owner": owner, "limit": limit}
        if wait is not None:
            raw["waitMs"] = wait
        self.granted[owner] = self._lock(raw)

    @rule(owner=OWNERS, release=st.booleans())
    def renew_or_release(self, owner, release):
        call = self.granted.get(owner)
        if call is None or call.results[0] is None or not call.results[0].get("acquired", call.results[0].get("renewed")):
            return
        answer = call.results[0]
        raw = {"op": "release" if release else "renew", "name": "job", "slot": answer["slot"], "token": answer["token"],
               "owner": owner}
        if not release:
            raw["ttlSeconds"] = 2
        self.granted[owner] = self._lock(raw)

    @rule()
    def lock_get(self):
        self._lock({"op": "get", "name": "job"})

    @rule(keys=st.lists(KEYS, min_size=1, max_size=3, unique=True), guard=st.sampled_from([None, "o1", "o2"]))
    def transaction(self, keys, guard):
        raw = [{"op": "put", "ns": "app", "key": key, "value": 1, "forever": True} for key in keys]
        granted = self.granted.get(guard)
        if granted is not None and granted.results[0] and "guard" in granted.results[0]:
            raw.insert(0, granted.results[0]["guard"])
        ops = [parse_kv_op(r, i, LIMITS, allow_reserved=True) for i, r in enumerate(raw)]
        call = Call(1, 1)
        self.steps.run(Transaction(ops, call))
        self.calls.append(call)

    @rule(ms=st.integers(0, 2500))
    def time_passes(self, ms):
        self.clock.now += ms
        self.steps.run(Tick())

    @invariant()
    def every_answer_shows_only_what_it_waited_for(self):
        for call in self.calls:
            if call.parts_left:
                continue  # parked: not answered yet
            waited = self.writer.waited[call]
            for version in versions_shown(call.results):
                assert version <= waited, (call.results, waited)


TestAnswers = Answers.TestCase
TestAnswers.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)
