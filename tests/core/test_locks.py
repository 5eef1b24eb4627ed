"""Locks and semaphores over KV rows, pure: now_ms is passed in. Everything goes through the one
entry point, State.apply, as the server does."""

import orjson
import pytest

from queen.core import records as rec
from queen.core.kv import LOCKS_NS, parse_kv_op, value_of
from queen.core.limits import Limits
from queen.core.locks import PLACE_KEPT_MS, parse_lock_op, parse_lock_ops
from queen.core.state import Abandon, Ops, State, Tick, Transaction
from queen.errors import BadRequest

T0 = 1_700_000_000_000
LIMITS = Limits()


class Shard:
    """One shard's state driven step by step; `answered` collects (reply_to, result) of parked
    acquires answered by later steps, in order."""

    def __init__(self):
        self.state = State(1, T0)
        self.records = []
        self.answered = []

    def step(self, step, now_ms):
        applied = self.state.apply(step, now_ms)
        self.records += rec.decode(applied.records)
        return applied.answers

    def lock(self, now_ms=T0, reply_to=None, **raw):
        """The op's own answer, or None if it was parked."""
        reply_to = reply_to if reply_to is not None else object()
        own = None
        for answered_to, _, result in self.step(Ops(0, [(reply_to, 0, parse_lock_op(raw, 0, LIMITS))]), now_ms):
            if answered_to is reply_to and own is None:
                own = result
            else:
                self.answered.append((answered_to, result))
        return own

    def tick(self, now_ms):
        self.answered += [(reply_to, result) for reply_to, _, result in self.step(Tick(), now_ms)]

    def abandon(self, reply_to, now_ms=T0, timed_out=False):
        self.answered += [(to, result) for to, _, result in self.step(Abandon(0, reply_to, timed_out), now_ms)]

    def acquire(self, name="job", owner=None, ttl=30, now_ms=T0, reply_to=None, **extra):
        raw = {"op": "acquire", "name": name, "ttlSeconds": ttl, **extra}
        if owner is not None:
            raw["owner"] = owner
        return self.lock(now_ms, reply_to, **raw)

    def renew(self, granted, owner=None, ttl=30, now_ms=T0, token=None):
        raw = {"op": "renew", "name": granted["name"], "slot": granted["slot"],
               "token": token or granted["token"], "ttlSeconds": ttl}
        if owner is not None:
            raw["owner"] = owner
        return self.lock(now_ms, **raw)

    def release(self, granted, owner=None, now_ms=T0, token=None):
        raw = {"op": "release", "name": granted["name"], "slot": granted["slot"], "token": token or granted["token"]}
        if owner is not None:
            raw["owner"] = owner
        return self.lock(now_ms, **raw)

    def guard_commits(self, granted_guard, now_ms=T0):
        ops = [parse_kv_op(granted_guard, 0, LIMITS, allow_reserved=True),
               parse_kv_op({"op": "put", "ns": "app", "key": "work", "value": 1, "ttlSeconds": 60}, 1, LIMITS)]
        [(_, _, answer)] = self.step(Transaction(ops, "txn"), now_ms)
        return answer["success"]


def test_acquire_answers_slot_token_fence_owner_expiry_and_guard():
    shard = Shard()
    got = shard.acquire(owner="cron-7")
    assert got["acquired"] is True and got["slot"] == 0 and got["owner"] == "cron-7"
    assert got["token"] == got["fence"] and got["expiresAt"] == T0 + 30_000
    assert got["guard"] == {"op": "check", "ns": LOCKS_NS, "key": "job#0", "expect": got["token"], "required": True}


def test_acquire_when_held_answers_reason_held_with_the_holder():
    shard = Shard()
    first = shard.acquire(owner="a")
    second = shard.acquire(owner="b")
    assert second["acquired"] is False and second["reason"] == "held"
    assert second["holders"] == [{"slot": 0, "owner": "a", "token": first["token"], "fence": first["fence"],
                                  "since": T0, "renewedAt": T0, "expiresAt": T0 + 30_000}]


def test_acquire_by_the_holding_owner_answers_the_same_permit_with_already():
    shard = Shard()
    first = shard.acquire(owner="a")
    again = shard.acquire(owner="a")
    assert again["already"] is True and again["token"] == first["token"] and again["slot"] == first["slot"]
    assert len(shard.records) == 1


def test_renew_answers_a_higher_token_same_fence_and_the_old_token_stops_working():
    shard = Shard()
    first = shard.acquire()
    renewed = shard.renew(first, now_ms=T0 + 10_000)
    assert renewed["renewed"] is True and renewed["token"] > first["token"]
    assert renewed["fence"] == first["fence"] and renewed["expiresAt"] == T0 + 40_000
    assert shard.renew(first)["reason"] == "lost"
    assert shard.release(first)["reason"] == "lost"
    assert shard.guard_commits(first["guard"]) is False
    assert shard.guard_commits(renewed["guard"]) is True


def test_renew_with_own_stale_token_is_carried_through_and_answers_the_current_token():
    shard = Shard()
    first = shard.acquire(owner="a")
    lost_answer = shard.renew(first, owner="a")
    retried = shard.renew(first, owner="a")  # the answer of the first renew never arrived
    assert retried["renewed"] is True and retried["token"] > lost_answer["token"]
    assert shard.renew(first, owner="intruder")["reason"] == "lost"


def test_after_expiry_the_next_holder_has_higher_token_and_fence():
    shard = Shard()
    first = shard.acquire(owner="a", ttl=1)
    renewed = shard.renew(first, owner="a", ttl=1, now_ms=T0 + 500)
    later = T0 + 500 + 1000
    second = shard.acquire(owner="b", now_ms=later)
    assert second["acquired"] is True
    assert second["token"] > renewed["token"] and second["fence"] > renewed["fence"]
    assert shard.renew(renewed, owner="a", now_ms=later)["reason"] == "lost"


def test_release_frees_and_the_next_holder_is_higher():
    shard = Shard()
    first = shard.acquire()
    assert shard.release(first) == {"name": "job", "released": True}
    assert shard.release(first)["reason"] == "absent"
    assert shard.acquire()["fence"] > first["fence"]


def test_semaphore_gives_n_slots_then_held_with_all_holders():
    shard = Shard()
    got = [shard.acquire(owner=f"w{i}", limit=3) for i in range(3)]
    assert sorted(g["slot"] for g in got) == [0, 1, 2]
    full = shard.acquire(owner="w3", limit=3)
    assert full["reason"] == "held" and [h["owner"] for h in full["holders"]] == ["w0", "w1", "w2"]
    shard.release(got[1])
    assert shard.acquire(owner="w3", limit=3)["slot"] == 1


def test_get_lists_holders_with_since_renewed_and_expiry():
    shard = Shard()
    first = shard.acquire(owner="a", limit=2)
    shard.acquire(owner="b", limit=2)
    shard.renew(first, owner="a", now_ms=T0 + 5000)
    holders = shard.lock(op="get", name="job", now_ms=T0 + 6000)["holders"]
    assert [(h["slot"], h["owner"], h["since"], h["renewedAt"]) for h in holders] == [(0, "a", T0, T0 + 5000), (1, "b", T0, T0)]


def test_operation_without_owner_works_but_its_retry_answers_held():
    shard = Shard()
    assert shard.acquire()["acquired"] is True
    assert shard.acquire()["reason"] == "held"


def test_waiters_are_served_first_come_first_served_on_release():
    shard = Shard()
    holder = shard.acquire(owner="h")
    for i in range(3):
        assert shard.acquire(owner=f"w{i}", ttl=5, waitMs=10_000, reply_to=f"ticket-{i}") is None  # parked
    shard.release(holder, now_ms=T0 + 100)
    assert [(t, r["owner"]) for t, r in shard.answered] == [("ticket-0", "w0")]


def test_waiter_gets_an_expired_permit_on_the_tick_and_late_ones_time_out():
    shard = Shard()
    shard.acquire(owner="h", ttl=1)
    for i, wait_ms in enumerate((5000, 500)):
        assert shard.acquire(owner=f"w{i}", ttl=5, waitMs=wait_ms, reply_to=i) is None
    shard.tick(T0 + 600)
    assert [(t, r["reason"]) for t, r in shard.answered] == [(1, "timeout")]
    shard.tick(T0 + 1050)
    assert shard.answered[-1][0] == 0 and shard.answered[-1][1]["owner"] == "w0"


def test_a_waiter_that_waited_the_longest_wait_keeps_its_place_for_its_owner_to_ask_again():
    """wait "forever" is a chain of the longest waits: between two of them the owner's place in
    line is kept, so a later waiter never overtakes it, and a permit that frees in the gap waits
    for it."""
    shard = Shard()
    holder = shard.acquire(owner="h")
    longest = LIMITS.wait_ms_max
    assert shard.acquire(owner="first", ttl=5, waitMs=longest, reply_to="first-1") is None
    assert shard.acquire(owner="second", ttl=5, waitMs=longest, reply_to="second-1", now_ms=T0 + 5000) is None
    shard.tick(T0 + longest)
    assert [(t, r["reason"]) for t, r in shard.answered] == [("first-1", "timeout")]
    shard.release(holder, now_ms=T0 + longest + 5)  # in the gap: the permit waits for "first"
    assert len(shard.answered) == 1
    assert shard.acquire(owner="newcomer", ttl=5, now_ms=T0 + longest + 6)["reason"] == "held"
    again = shard.acquire(owner="first", ttl=5, waitMs=longest, reply_to="first-2", now_ms=T0 + longest + 20)
    assert again["acquired"] and again["owner"] == "first"


def test_a_kept_place_not_taken_back_in_time_is_dropped_and_the_next_waiter_served():
    shard = Shard()
    holder = shard.acquire(owner="h")
    longest = LIMITS.wait_ms_max
    assert shard.acquire(owner="gone", ttl=5, waitMs=longest, reply_to="gone") is None
    assert shard.acquire(owner="next", ttl=5, waitMs=longest, reply_to="next", now_ms=T0 + 5000) is None
    shard.tick(T0 + longest)
    shard.release(holder, now_ms=T0 + longest + 5)
    shard.tick(T0 + longest + PLACE_KEPT_MS - 10)
    assert [t for t, _ in shard.answered] == ["gone"]  # the place still holds the permit back
    shard.tick(T0 + longest + PLACE_KEPT_MS + 10)
    assert [(t, r.get("owner")) for t, r in shard.answered] == [("gone", None), ("next", "next")]


def test_a_shorter_wait_keeps_no_place():
    shard = Shard()
    holder = shard.acquire(owner="h")
    assert shard.acquire(owner="brief", ttl=5, waitMs=1000, reply_to="brief") is None
    assert shard.acquire(owner="patient", ttl=5, waitMs=10_000, reply_to="patient") is None
    shard.tick(T0 + 1000)
    shard.release(holder, now_ms=T0 + 1005)
    assert [(t, r.get("owner")) for t, r in shard.answered] == [("brief", None), ("patient", "patient")]


def test_abandoned_waiter_is_answered_cancelled_and_never_served():
    shard = Shard()
    holder = shard.acquire(owner="h")
    assert shard.acquire(owner="gone", ttl=5, waitMs=5000, reply_to="t") is None
    shard.abandon("t")
    shard.release(holder)
    assert [(t, r["reason"]) for t, r in shard.answered] == [("t", "cancelled")]
    assert shard.lock(op="get", name="job")["holders"] == []


def test_a_waiter_answered_early_answers_as_its_timeout_would_with_the_holders():
    """At the connection limit the server needs a parked acquire's connection: it is answered as its
    wait running out would be, holders and all, and never served after."""
    shard = Shard()
    holder = shard.acquire(owner="h")
    assert shard.acquire(owner="early", ttl=5, waitMs=5000, reply_to="t") is None
    shard.abandon("t", timed_out=True)
    [(to, answer)] = shard.answered
    assert to == "t" and answer["reason"] == "timeout" and [h["owner"] for h in answer["holders"]] == ["h"]
    shard.release(holder)
    assert len(shard.answered) == 1


def test_a_permit_found_expired_by_a_read_goes_to_the_waiter_in_that_same_step():
    # No tick runs: the read that finds the permit expired must hand it on, or the waiter would
    # wait for its own timeout with a free permit in front of it.
    shard = Shard()
    shard.acquire(owner="h", ttl=1)
    assert shard.acquire(owner="w", ttl=5, waitMs=10_000, reply_to="w") is None
    holders = shard.lock(now_ms=T0 + 1001, op="get", name="job")["holders"]
    assert [(t, r["owner"]) for t, r in shard.answered] == [("w", "w")]
    assert [h["owner"] for h in holders] == []  # the read saw the permit free, before the hand-over


def test_waiters_of_several_names_freed_by_one_tick_are_served_in_the_order_their_permits_freed():
    orders = []
    for names in (["b", "a", "c"], ["c", "b", "a"]):
        shard = Shard()
        for i, name in enumerate(names):
            shard.acquire(name, owner="h", ttl=1 + i)
            assert shard.acquire(name, owner=f"w-{name}", ttl=5, waitMs=60_000, reply_to=name) is None
        shard.tick(T0 + 5000)
        orders.append(([t for t, _ in shard.answered], [r["token"] for _, r in shard.answered]))
    assert orders[0][0] == ["b", "a", "c"] and orders[1][0] == ["c", "b", "a"]
    assert orders[0][1] == sorted(orders[0][1])  # tokens handed out in that order


@pytest.mark.parametrize("raw, code", [
    ({"op": "acquire", "name": "", "ttlSeconds": 5}, "invalid_name"),
    ({"op": "acquire", "name": "x" * 257, "ttlSeconds": 5}, "invalid_name"),
    ({"op": "acquire", "name": "a#b", "ttlSeconds": 5}, "invalid_name"),
    ({"op": "acquire", "name": "a\nb", "ttlSeconds": 5}, "invalid_name"),
    ({"op": "acquire", "name": "a", "ttlSeconds": 5, "owner": "o" * 257}, "invalid_owner"),
    ({"op": "acquire", "name": "a"}, "ttl_required"),
    ({"op": "acquire", "name": "a", "ttlSeconds": 0}, "invalid_ttl"),
    ({"op": "acquire", "name": "a", "ttlSeconds": 7_776_001}, "invalid_ttl"),
    ({"op": "acquire", "name": "a", "ttlSeconds": "30"}, "invalid_ttl"),
    ({"op": "acquire", "name": "a", "forever": True}, "invalid_ttl"),
    ({"op": "acquire", "name": "a", "ttlSeconds": 5, "limit": 0}, "invalid_limit"),
    ({"op": "acquire", "name": "a", "ttlSeconds": 5, "limit": 1025}, "invalid_limit"),
    ({"op": "acquire", "name": "a", "ttlSeconds": 5, "waitMs": 60_001}, "invalid_wait_ms"),
    ({"op": "acquire", "name": "a", "ttlSeconds": 5, "wait": 100}, "unknown_field"),
    ({"op": {"x": 1}, "name": "a"}, "unknown_op"),
    ({"op": "release", "name": "a", "slot": 0, "token": 1, "ttlSeconds": 5}, "unknown_field"),
    ({"op": "renew", "name": "a", "ttlSeconds": 5}, "invalid_operation"),
    ({"op": "steal", "name": "a"}, "unknown_op"),
])
def test_bad_lock_operations_are_rejected_with_a_specific_code(raw, code):
    with pytest.raises(BadRequest) as caught:
        parse_lock_ops([raw], LIMITS)
    assert caught.value.code == code


def test_call_limits_on_count_names_and_slots():
    acquire = {"op": "acquire", "ttlSeconds": 5}
    with pytest.raises(BadRequest, match="at most 64"):
        parse_lock_ops([{**acquire, "name": f"n{i}"} for i in range(65)], LIMITS)
    with pytest.raises(BadRequest) as caught:
        parse_lock_ops([{**acquire, "name": "same"}, {**acquire, "name": "same"}], LIMITS)
    assert caught.value.code == "duplicate_name"
    with pytest.raises(BadRequest) as caught:
        parse_lock_ops([{**acquire, "name": f"n{i}", "limit": 1024} for i in range(5)], LIMITS)
    assert caught.value.code == "too_many_slots"
    assert len(parse_lock_ops([{**acquire, "name": f"n{i}", "limit": 1024} for i in range(4)], LIMITS)) == 4


def test_a_permit_that_expired_before_the_tick_goes_to_the_waiter_not_to_a_newcomer():
    shard = Shard()
    shard.acquire(owner="h", ttl=1)
    assert shard.acquire(owner="w", ttl=5, waitMs=10_000, reply_to="ticket") is None
    newcomer = shard.acquire(owner="n", now_ms=T0 + 1010)  # expired, and no tick has run yet
    assert newcomer["reason"] == "held" and [h["owner"] for h in newcomer["holders"]] == ["w"]
    assert [(t, r["owner"]) for t, r in shard.answered] == [("ticket", "w")]


# -- the permit's row ---------------------------------------------------------------------------------

def kv(shard, raw, now_ms=T0):
    """One KV operation on the shard (reads of queen-locks allowed, as the KV route allows them)."""
    [(_, _, answer)] = shard.step(Ops(0, [(object(), 0, parse_kv_op(raw, 0, LIMITS, allow_reserved=True))]), now_ms)
    return answer


def test_a_permits_row_holds_its_owner_as_an_object_with_the_token_as_version_and_the_lease_as_ttl():
    shard = Shard()
    got = shard.acquire(owner="cron-7")
    row = kv(shard, {"op": "get", "ns": LOCKS_NS, "key": "job#0"})
    assert value_of(row["value"]) == {"owner": "cron-7"}
    assert orjson.loads(orjson.dumps(row))["value"] == {"owner": "cron-7"}  # as a JSON answer shows it
    assert row["version"] == got["token"] and row["expiresAt"] == got["expiresAt"]
    [put] = shard.records
    assert put.value == "cron-7"  # the log carries the owner alone; replay makes the row's object


def test_an_acquire_without_an_owner_stores_a_null_owner_and_answers_it():
    shard = Shard()
    got = shard.acquire()
    assert got["owner"] is None
    assert value_of(kv(shard, {"op": "get", "ns": LOCKS_NS, "key": "job#0"})["value"]) == {"owner": None}
    assert shard.lock(op="get", name="job")["holders"][0]["owner"] is None
    assert shard.renew(got, owner="anyone")["renewed"] is True  # its token is its only capability


def test_an_owner_of_the_longest_length_acquires_and_every_reader_answers_it_whole():
    shard = Shard()
    owner = "ö" * 128  # 256 bytes of UTF-8, the limit
    got = shard.acquire(owner=owner, limit=2)
    assert got["acquired"] and got["owner"] == owner
    assert shard.acquire(owner=owner, limit=2)["already"] is True
    assert shard.lock(op="get", name="job")["holders"][0]["owner"] == owner
    assert value_of(kv(shard, {"op": "get", "ns": LOCKS_NS, "key": "job#0"})["value"]) == {"owner": owner}
    assert shard.renew(got, owner=owner)["renewed"] is True


def test_a_failed_guard_answers_the_rows_current_value_with_its_owner_and_its_version():
    shard = Shard()
    first = shard.acquire(owner="a")
    renewed = shard.renew(first, owner="a")
    ops = [parse_kv_op(first["guard"], 0, LIMITS, allow_reserved=True)]
    [(_, _, answer)] = shard.step(Transaction(ops, "txn"), T0)
    assert answer["reason"] == "kv_precondition" and answer["failed"]["reason"] == "version"
    assert answer["failed"]["current"] == {"value": {"owner": "a"}, "version": renewed["token"]}
    check = kv(shard, first["guard"])  # a check outside a transaction reports the same row
    assert check["applied"] is False and check["value"] == {"owner": "a"} and check["version"] == renewed["token"]


def test_a_log_of_owner_strings_as_older_builds_wrote_it_replays_into_permit_rows_holding_the_object():
    """A permit's put carries its owner (a string, or null), as every build's log holds it: replay
    makes the row's object, so every reader finds the owner and the same owner may renew and
    acquire again."""
    expires_at_ms = T0 + 30_000
    old = [rec.Put(LOCKS_NS, "job#0", "keeper", 7, 7, T0, T0, expires_at_ms),
           rec.Put(LOCKS_NS, "nobody#0", None, 8, 8, T0, T0, expires_at_ms),
           rec.Put("acme\x1f" + LOCKS_NS, "job#0", "tenant-keeper", 9, 9, T0, T0, expires_at_ms)]
    replays = []
    for _ in range(2):  # the same log, the same rows
        shard = Shard()
        shard.state.versions.last = 9
        for record in old:
            shard.state.replay(record)
        replays.append([dict(table.rows) for table in shard.state.shards[0].kv.tables.values()])
        assert value_of(kv(shard, {"op": "get", "ns": LOCKS_NS, "key": "job#0"})["value"]) == {"owner": "keeper"}
        assert value_of(kv(shard, {"op": "get", "ns": LOCKS_NS, "key": "nobody#0"})["value"]) == {"owner": None}
        assert shard.lock(op="get", name="job")["holders"][0]["owner"] == "keeper"
        assert shard.acquire(owner="keeper")["already"] is True
        renewed = shard.renew({"name": "job", "slot": 0, "token": 7}, owner="keeper", now_ms=T0 + 1000)
        assert renewed["renewed"] is True and renewed["fence"] == 7
        assert shard.records[-1].value == "keeper"  # the renew logs the owner, as the older build did
        tenant = parse_lock_op({"op": "get", "name": "job"}, 0, LIMITS)
        tenant.ns = "acme\x1f" + LOCKS_NS
        [(_, _, held)] = shard.step(Ops(0, [(object(), 0, tenant)]), T0)
        assert held["holders"][0]["owner"] == "tenant-keeper"
    assert replays[0] == replays[1]


def test_a_snapshot_carries_each_permits_owner_and_loads_back_into_the_same_rows():
    shard = Shard()
    shard.acquire(owner="cron-7")
    shard.acquire("other", limit=2)
    sections = shard.state.snapshot_capture()()
    assert sorted((r.key, r.value) for r in rec.decode(sections["locks"])) == [("job#0", "cron-7"), ("other#0", None)]
    restored = Shard()
    for record in rec.decode(sections["locks"]):
        restored.state.replay(record)
    rows = shard.state.shards[0].kv.tables[LOCKS_NS].rows
    assert restored.state.shards[0].kv.tables[LOCKS_NS].rows == rows
    assert value_of(kv(restored, {"op": "get", "ns": LOCKS_NS, "key": "other#0"})["value"]) == {"owner": None}
