"""Locks and semaphores over KV rows, pure: now_ms is passed in."""

import pytest

from queen.core.kv import LOCKS_NS, Limits, VersionCounter, parse_kv_op
from queen.core.locks import parse_lock_op, parse_lock_ops
from queen.core.shard import ShardState
from queen.core.txn import apply_transaction
from queen.errors import BadRequest

T0 = 1_700_000_000_000


class Shard:
    def __init__(self):
        self.state = ShardState(VersionCounter(), T0)
        self.effects = []

    def lock(self, now_ms=T0, **raw):
        return self.state.apply(parse_lock_op(raw, 0), now_ms, self.effects)

    def acquire(self, name="job", owner=None, ttl=30, now_ms=T0, **extra):
        raw = {"op": "acquire", "name": name, "ttlSeconds": ttl, **extra}
        if owner is not None:
            raw["owner"] = owner
        return self.lock(now_ms, **raw)

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
        ops = [parse_kv_op(granted_guard, 0, Limits(), allow_reserved=True),
               parse_kv_op({"op": "put", "ns": "app", "key": "work", "value": 1, "ttlSeconds": 60}, 1, Limits())]
        answer, _ = apply_transaction(ops, [self.state.kv, self.state.kv], now_ms, self.effects)
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
    assert len(shard.effects) == 1


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
    locks = shard.state.locks
    holder = shard.acquire(owner="h")
    for i in range(3):
        waiting = parse_lock_op({"op": "acquire", "name": "job", "ttlSeconds": 5, "owner": f"w{i}", "waitMs": 10_000}, 0)
        assert shard.state.locks.acquire(waiting, T0, shard.effects)["reason"] == "held"
        locks.park(waiting, T0, f"ticket-{i}")
    shard.release(holder, now_ms=T0 + 100)
    assert [(t, r["owner"]) for t, r, _ in locks.resolved] == [("ticket-0", "w0")]


def test_waiter_gets_an_expired_permit_on_the_tick_and_late_ones_time_out():
    shard = Shard()
    locks = shard.state.locks
    shard.acquire(owner="h", ttl=1)
    for i, wait_ms in enumerate((5000, 500)):
        op = parse_lock_op({"op": "acquire", "name": "job", "ttlSeconds": 5, "owner": f"w{i}", "waitMs": wait_ms}, 0)
        locks.park(op, T0, i)
    shard.state.tick(T0 + 600, shard.effects)
    assert [(t, r["reason"]) for t, r, _ in locks.resolved] == [(1, "timeout")]
    shard.state.tick(T0 + 1050, shard.effects)
    assert locks.resolved[-1][0] == 0 and locks.resolved[-1][1]["owner"] == "w0"


def test_abandoned_waiter_is_answered_cancelled_and_never_served():
    shard = Shard()
    locks = shard.state.locks
    holder = shard.acquire(owner="h")
    op = parse_lock_op({"op": "acquire", "name": "job", "ttlSeconds": 5, "owner": "gone", "waitMs": 5000}, 0)
    locks.park(op, T0, "t")
    locks.abandon(lambda ticket: ticket == "t", T0)
    shard.release(holder)
    assert [(t, r["reason"]) for t, r, _ in locks.resolved] == [("t", "cancelled")]
    assert shard.lock(op="get", name="job")["holders"] == []


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
    ({"op": "acquire", "name": "a", "ttlSeconds": 5, "waitMs": 60_001}, "invalid_waitMs"),
    ({"op": "renew", "name": "a", "ttlSeconds": 5}, "invalid_operation"),
    ({"op": "steal", "name": "a"}, "unknown_op"),
])
def test_bad_lock_operations_are_rejected_with_a_specific_code(raw, code):
    with pytest.raises(BadRequest) as caught:
        parse_lock_ops([raw])
    assert caught.value.code == code


def test_call_limits_on_count_names_and_slots():
    acquire = {"op": "acquire", "ttlSeconds": 5}
    with pytest.raises(BadRequest, match="at most 64"):
        parse_lock_ops([{**acquire, "name": f"n{i}"} for i in range(65)])
    with pytest.raises(BadRequest) as caught:
        parse_lock_ops([{**acquire, "name": "same"}, {**acquire, "name": "same"}])
    assert caught.value.code == "duplicate_name"
    with pytest.raises(BadRequest) as caught:
        parse_lock_ops([{**acquire, "name": f"n{i}", "limit": 1024} for i in range(5)])
    assert caught.value.code == "too_many_slots"
    assert len(parse_lock_ops([{**acquire, "name": f"n{i}", "limit": 1024} for i in range(4)])) == 4


def test_a_permit_that_expired_before_the_tick_goes_to_the_waiter_not_to_a_newcomer():
    shard = Shard()
    locks = shard.state.locks
    shard.acquire(owner="h", ttl=1)
    waiting = parse_lock_op({"op": "acquire", "name": "job", "ttlSeconds": 5, "owner": "w", "waitMs": 10_000}, 0)
    locks.park(waiting, T0, "ticket")
    newcomer = shard.acquire(owner="n", now_ms=T0 + 1010)  # expired, and no tick has run yet
    assert newcomer["reason"] == "held" and [h["owner"] for h in newcomer["holders"]] == ["w"]
    assert [(t, r["owner"]) for t, r, _ in locks.resolved] == [("ticket", "w")]
