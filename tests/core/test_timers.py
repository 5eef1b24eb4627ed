"""Timers, pure: schedule, move, cancel, get, list, and the tick that fires them into their
partition; replay and snapshots. Time is now_ms passed to each step, advanced by hand in 50 ms
ticks as the server's ticker does; nothing sleeps."""

import gc
import random

import pytest

from queen.core import records as rec
from queen.core.limits import Limits
from queen.core.state import State, Tick
from queen.core.timer_ops import HORIZON_MS, parse_timer_ops
from queen.errors import BadRequest
from tests.core.queue_harness import T0, Queues

TICK_MS = 50


def run_until(q: Queues, at_ms: int) -> None:
    while q.now + TICK_MS <= at_ms:
        q.tick(TICK_MS)
    if q.now < at_ms:
        q.tick(at_ms - q.now)


def appended(records):
    return [r for r in records if type(r) is rec.Append]


def test_a_timer_fires_at_its_time_never_before_and_lands_in_its_partition():
    q = Queues()
    answer = q.timer("schedule", key="order-42:timeout", partition="customer-42", delayMs=1_000,
                     payload={"orderId": 42}, transactionId="timeout-42")
    assert answer["scheduled"] is True and answer["at"] == T0 + 1_000 and answer["replaced"] is False
    got = q.timer(key="order-42:timeout")
    assert got["found"] is True and got["partition"] == "customer-42" and got["payload"] == {"orderId": 42}
    assert got["version"] == answer["version"] and got["scheduledAt"] == T0 and got["transactionId"] == "timeout-42"
    run_until(q, T0 + 999)
    assert q.pop()["reason"] == "empty"  # one ms before: nothing
    q.tick(1)
    message = q.pop()["messages"][0]
    assert message["data"] == {"orderId": 42} and message["partition"] == "customer-42"
    assert message["transactionId"] == "timeout-42" and message["createdAt"] == T0 + 1_000
    assert q.timer(key="order-42:timeout") == {"index": 0, "op": "get", "queue": "orders", "key": "order-42:timeout",
                                               "found": False}
    assert q.timer("cancel", key="order-42:timeout")["reason"] == "absent"  # fired: gone


def test_a_fire_is_one_step_removing_the_timer_and_appending_its_message():
    q = Queues()
    q.timer("schedule", key="k", at=T0 + 100, payload=1)
    before = len(q.records)
    run_until(q, T0 + 100)
    fired = q.records[before:]
    kinds = [type(r) for r in fired]
    assert kinds.index(rec.TimerFired) < kinds.index(rec.Append)
    assert [type(r) for r in fired if type(r) in (rec.TimerFired, rec.Append)] == [rec.TimerFired, rec.Append]


def test_a_timer_due_in_the_past_fires_at_the_next_tick_at_most_one_tick_late():
    q = Queues()
    q.timer("schedule", key="past", at=T0 - 60_000, payload="x")
    q.tick(TICK_MS)
    assert q.pop()["messages"][0]["data"] == "x"


def test_moving_a_timer_fires_it_once_at_its_new_time():
    q = Queues()
    first = q.timer("schedule", key="k", at=T0 + 100, payload="old")
    moved = q.timer("schedule", key="k", at=T0 + 300, payload="new")
    assert moved["replaced"] is True and moved["version"] > first["version"]
    run_until(q, T0 + 299)
    assert q.pop()["reason"] == "empty"
    q.tick(1)
    got = q.pop(batch=10, autoAck=True)
    assert [m["data"] for m in got["messages"]] == ["new"]
    run_until(q, T0 + 5_000)
    assert q.pop(batch=10)["reason"] == "empty"
    # Moved earlier, too.
    q.timer("schedule", key="e", at=q.now + 10_000, payload="late")
    q.timer("schedule", key="e", at=q.now + 100, payload="early")
    run_until(q, q.now + 20_000)
    assert [m["data"] for m in q.pop(batch=10)["messages"]] == ["early"]


def test_a_cancelled_timer_never_fires_and_a_second_cancel_is_absent():
    q = Queues()
    scheduled = q.timer("schedule", key="k", at=T0 + 100, payload=1)
    cancelled = q.timer("cancel", key="k")
    assert cancelled["cancelled"] is True and cancelled["version"] == scheduled["version"]
    assert q.timer("cancel", key="k") == {"index": 0, "op": "cancel", "queue": "orders", "key": "k",
                                          "cancelled": False, "reason": "absent"}
    assert q.timer("cancel", key="never")["reason"] == "absent"
    run_until(q, T0 + 1_000)
    assert q.pop()["reason"] == "empty"


@pytest.mark.parametrize("cancel_first", [True, False])
def test_cancel_in_the_tick_of_the_fire_is_exactly_one_of_fired_or_cancelled(cancel_first):
    q = Queues()
    q.timer("schedule", key="k", at=T0 + TICK_MS, payload=1)
    q.now += TICK_MS  # the moment it is due: a cancel and the tick race
    if cancel_first:
        cancelled = q.timer("cancel", key="k")
        q.tick()
    else:
        q.tick()
        cancelled = q.timer("cancel", key="k")
    delivered = q.pop()
    assert cancelled["cancelled"] is cancel_first
    assert delivered["success"] is (not cancel_first)


def test_100k_pending_timers_fire_in_at_order_per_partition_none_early_none_twice():
    q = Queues()
    rng = random.Random(7)
    count, span_ms = 100_000, 120_000
    ats = {}
    for start in range(0, count, 1024):
        ops = []
        for n in range(start, min(start + 1024, count)):
            at = T0 + rng.randrange(span_ms)
            ats[f"t{n}"] = at
            ops.append({"op": "schedule", "key": f"t{n}", "at": at, "partition": f"p{n % 16}", "payload": at})
        q.timers(*ops)
    before = len(q.records)
    run_until(q, T0 + span_ms + TICK_MS)
    messages = appended(q.records[before:])
    assert len(messages) == count
    assert sorted(int(m.data) for m in messages) == sorted(ats.values())  # each timer exactly once
    last_at: dict[int, int] = {}
    for m in messages:
        at = int(m.data)
        assert at <= m.created_at_ms <= at + TICK_MS  # never early, at most one tick late
        assert at >= last_at.get(m.partition_id, 0)  # at order within each partition
        last_at[m.partition_id] = at
    assert q.state.shards[0].queues.timers.count == 0


def test_a_backlog_over_the_fire_budget_goes_on_at_the_next_tick_in_order():
    q = Queues(Limits(timer_fires_per_tick_max=3))
    q.timers(*({"op": "schedule", "key": f"k{n}", "at": T0 + 10 - n, "payload": n} for n in range(7)))
    q.tick(TICK_MS)
    assert [int(m.data) for m in appended(q.records)] == [6, 5, 4]  # the earliest first
    q.tick(TICK_MS)
    q.tick(TICK_MS)
    assert [int(m.data) for m in appended(q.records)] == [6, 5, 4, 3, 2, 1, 0]


def test_pending_timers_give_the_garbage_collector_nothing_to_walk():
    """A million pending timers must not make a full collection (tens of ms on the event loop)
    walk a million objects: every container that holds them is untracked."""
    q = Queues()
    q.timers(*({"op": "schedule", "key": f"k{n}", "delayMs": 1_000 * n, "partition": "p", "payload": {"n": n},
                "transactionId": f"id-{n}"} for n in range(100)))
    table = q.state.shards[0].queues.timers
    gc.collect()
    assert not gc.is_tracked(table.slots) and not gc.is_tracked(table.pending["orders"])
    assert not any(gc.is_tracked(entries) for entries in table.slots.values())


def test_a_fire_whose_producer_id_is_known_appends_nothing_and_is_counted():
    q = Queues()
    q.push({"payload": "pushed", "transactionId": "once"}, partition="p")
    q.timer("schedule", key="k", at=T0 + 10, partition="p", payload="timer", transactionId="once")
    run_until(q, T0 + 100)
    assert [m["data"] for m in q.pop(batch=10)["messages"]] == ["pushed"]
    timers = q.state.shards[0].queues.timers
    assert timers.stats.fire_duplicates == 1 and timers.count == 0


def test_fires_are_exempt_from_max_size():
    q = Queues()
    q.configure(maxSize=1)
    q.push("full")
    assert q.push("refused")[0]["reason"] == "queue_full"
    q.timer("schedule", key="k", at=T0 + 10, payload="fired")
    run_until(q, T0 + 100)
    assert [m["data"] for m in q.pop(batch=10)["messages"]] == ["full", "fired"]


def test_timers_max_bounds_pending_timers_but_a_move_still_fits():
    q = Queues(Limits(timers_max=2))
    for key in ("a", "b"):
        assert q.timer("schedule", key=key, delayMs=1_000, payload=1)["scheduled"] is True
    refused = q.timer("schedule", key="c", delayMs=1_000, payload=1)
    assert refused["scheduled"] is False and refused["reason"] == "storage_full"
    assert q.timer("schedule", key="a", delayMs=2_000, payload=2)["replaced"] is True
    assert q.timer("get", key="c")["found"] is False


def test_the_listing_is_by_key_with_prefix_and_pages():
    q = Queues()
    q.timers(*({"op": "schedule", "key": f"order-{n:02}", "delayMs": 1_000 * n, "payload": {"big": "x" * 10}}
               for n in range(12)), {"op": "schedule", "key": "other", "delayMs": 5, "payload": 0})
    table = q.state.shards[0].queues.timers
    page = table.page("orders", "order-", None, 5)
    assert [i["key"] for i in page["items"]] == [f"order-{n:02}" for n in range(5)] and page["after"] == "order-04"
    assert "payload" not in page["items"][0] and page["items"][1]["at"] == T0 + 1_000
    rest = table.page("orders", "order-", page["after"], 100)
    assert [i["key"] for i in rest["items"]] == [f"order-{n:02}" for n in range(5, 12)] and rest["after"] is None
    info = q.admin("info")
    assert info["timers"] == {"pending": 13, "nextAt": T0}


def test_deleting_a_queue_drops_its_timers():
    q = Queues()
    q.timers({"op": "schedule", "key": "a", "delayMs": 100, "payload": 1},
             {"op": "schedule", "key": "b", "delayMs": 100, "payload": 1})
    assert q.admin("delete")["timers"] == 2
    run_until(q, T0 + 1_000)
    assert q.admin("list", prefix="", after=None, limit=10) == []
    assert q.state.queues.timers == 0 and q.state.queues.bytes == 0  # their payloads no longer count
    assert q.state.shards[0].queues.timers.slots == {}  # nothing pending: the stale entries went too


def pending(state: State) -> dict:
    timers = state.shards[0].queues.timers
    return {queue: dict(keys) for queue, keys in timers.pending.items()}


def test_replay_and_snapshots_rebuild_the_pending_timers_and_they_still_fire():
    q = Queues()
    q.timers(*({"op": "schedule", "key": f"k{n}", "at": T0 + 100 * n, "partition": f"p{n % 3}",
                "payload": {"n": n}, **({"transactionId": f"id{n}"} if n % 2 else {})} for n in range(1, 30)))
    q.timer("cancel", key="k7")
    q.timer("schedule", key="k8", at=T0 + 50_000, payload="moved", traceId="trace-8")
    run_until(q, T0 + 1_000)  # some fired
    replayed = q.replayed()
    assert pending(replayed) == pending(q.state) and len(pending(q.state)["orders"]) == 20
    sections = q.state.snapshot_capture()()
    restored = State(1, T0)
    for record in rec.decode(sections["queues"]):
        restored.replay(record)
    assert pending(restored) == pending(q.state)
    # The restored timers fire, each once, and moved ones with what they were moved to.
    fired = rec.decode(restored.apply(Tick(), T0 + 60_000).records)
    assert sum(type(r) is rec.TimerFired for r in fired) == 20 and restored.shards[0].queues.timers.count == 0
    assert b'"moved"' in [r.data for r in fired if type(r) is rec.Append]


@pytest.mark.parametrize("op, code", [
    ({"op": "schedule", "key": "k", "payload": 1}, "at_required"),
    ({"op": "schedule", "key": "k", "payload": 1, "at": T0, "delayMs": 5}, "at_conflict"),
    ({"op": "schedule", "key": "k", "payload": 1, "at": T0 + HORIZON_MS + 1}, "at_too_far"),
    ({"op": "schedule", "key": "k", "payload": 1, "delayMs": -1}, "invalid_delay"),
    ({"op": "schedule", "key": "k", "payload": 1, "delayMs": 1.5}, "invalid_delay"),
    ({"op": "schedule", "key": "k", "payload": 1, "at": "soon"}, "invalid_at"),
    ({"op": "schedule", "key": "k", "delayMs": 5}, "payload_required"),
    ({"op": "schedule", "key": "", "payload": 1, "delayMs": 5}, "invalid_key"),
    ({"op": "schedule", "key": "k" * 1025, "payload": 1, "delayMs": 5}, "invalid_key"),
    ({"op": "schedule", "key": "k", "payload": 1, "delayMs": 5, "partition": ""}, "invalid_partition"),
    ({"op": "schedule", "key": "k", "payload": 1, "delayMs": 5, "transactionId": "queen:1"}, "reserved_transaction_id"),
    ({"op": "schedule", "key": "k", "payload": "x" * (256 << 10), "delayMs": 5}, "payload_too_large"),
    ({"op": "schedule", "key": "k", "payload": 1, "delayMs": 5, "colour": 1}, "unknown_field"),
    ({"op": "cancel", "key": "k", "payload": 1}, "unknown_field"),
    ({"op": "fire", "key": "k"}, "unknown_op"),
    ({"op": "get", "queue": "queen-x", "key": "k"}, "reserved_queue"),
])
def test_bad_timer_operations_are_refused_whole(op, code):
    with pytest.raises(BadRequest) as caught:
        parse_timer_ops([{"op": "get", "queue": "q", "key": "fine"}, {"queue": "q", **op}], Limits(), T0)
    assert caught.value.code == code
    assert caught.value.details.get("index") == 1


def test_one_key_twice_and_too_many_operations_are_refused():
    ops = [{"op": "get", "queue": "q", "key": "k"}, {"op": "cancel", "queue": "q", "key": "k"}]
    with pytest.raises(BadRequest) as caught:
        parse_timer_ops(ops, Limits(), T0)
    assert caught.value.code == "duplicate_timer"
    with pytest.raises(BadRequest) as caught:
        parse_timer_ops([{"op": "get", "queue": "q", "key": str(n)} for n in range(1025)], Limits(), T0)
    assert caught.value.code == "too_many_operations"
    assert len(parse_timer_ops([{"op": "get", "queue": "q", "key": "k"}, {"op": "get", "queue": "r", "key": "k"}],
                               Limits(), T0)) == 2
