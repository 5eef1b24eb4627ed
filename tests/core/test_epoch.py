"""The EPOCH record: a new leader's first record. Applying it (live, or replayed from the log)
extends every lease live at its clock floor to end no earlier than its grace; leases ending later,
leases already over, KV lifetimes and timers are left alone; replay reaches the same state."""

import pytest

from queen.core import records as rec
from queen.core.kv import parse_kv_op, unpack_row
from queen.core.limits import Limits
from queen.core.locks import parse_lock_op
from queen.core.state import BeginEpoch, Ops, State

from .queue_harness import T0, Queues

LIMITS = Limits()


def lock_ops(state, now, *raws):
    answers = []
    for raw in raws:
        op = parse_lock_op(raw, 0, LIMITS)
        applied = state.apply(Ops(0, [(object(), 0, op)]), now)
        answers.append((applied.answers[0][2], applied.records))
    return answers


def begin_epoch(state, now, floor, grace, epoch=2):
    applied = state.apply(BeginEpoch(epoch, "n2", state.versions.last, floor, grace, "me"), now)
    return applied


def permit(state, name, slot=0):
    return unpack_row(state.shards[0].kv.tables["queen-locks"].rows.get(f"{name}#{slot}"))


def test_a_lock_ending_before_the_grace_ends_at_the_grace_one_ending_later_and_kv_ttls_are_unchanged():
    state = State(1, T0)
    records = []
    for answer, produced in lock_ops(state, T0, {"op": "acquire", "name": "short", "ttlSeconds": 5, "owner": "a"},
                                     {"op": "acquire", "name": "long", "ttlSeconds": 60, "owner": "b"},
                                     {"op": "acquire", "name": "over", "ttlSeconds": 1, "owner": "c"}):
        assert answer["acquired"]
        records += produced
    put = parse_kv_op({"op": "put", "ns": "app", "key": "k", "value": 1, "ttlSeconds": 5}, 0, LIMITS)
    records += state.apply(Ops(0, [(object(), 0, put)]), T0).records
    short, long = permit(state, "short"), permit(state, "long")
    # The floor: time the old leader may have reached. "over" ended before it: not live, not extended.
    applied = begin_epoch(state, T0 + 2000, floor=T0 + 1500, grace=T0 + 20_000)
    records += applied.records
    [epoch] = rec.decode(applied.records)
    assert type(epoch) is rec.Epoch and epoch.first_version == applied.first_version == applied.last_version
    assert epoch.previous_version == applied.first_version - 1 and applied.answers == [("me", 0, epoch.version)]
    assert permit(state, "short").expires_at_ms == T0 + 20_000
    assert permit(state, "short")[:5] == short[:5], "token, fence and owner unchanged"
    assert permit(state, "long") == long
    assert permit(state, "over").expires_at_ms == T0 + 1000
    assert unpack_row(state.shards[0].kv.tables["app"].rows["k"]).expires_at_ms == T0 + 5000
    # The extended lock is still held after its old end, and free after the grace.
    [(held, _)] = lock_ops(state, T0 + 10_000, {"op": "acquire", "name": "short", "ttlSeconds": 5, "owner": "z"})
    assert not held["acquired"]
    [(free, _)] = lock_ops(state, T0 + 20_000, {"op": "acquire", "name": "short", "ttlSeconds": 5, "owner": "z"})
    assert free["acquired"]
    # Replay of the log so far (before the last two acquires) gives the same rows as live.
    replayed = State(1, T0)
    for record in rec.decode(records):
        replayed.replay(record)
    assert replayed.epochs == [(2, epoch.version, epoch.previous_version)]
    for name in ("long", "over"):
        assert permit(replayed, name) == permit(state, name)
    assert permit(replayed, "short").expires_at_ms == T0 + 20_000


def test_a_queue_lease_ending_before_the_grace_is_extended_and_replay_agrees():
    q = Queues()
    q.configure(leaseTimeSeconds=5)
    q.configure(queue="other", leaseTimeSeconds=600)
    q.push(1, partition="p")
    q.push(2, partition="p", queue="other")
    short = q.pop()
    long = q.pop(queue="other")
    assert short["expiresAt"] == T0 + 5000 and long["expiresAt"] == T0 + 600_000
    applied = q.state.apply(BeginEpoch(3, "n2", q.state.versions.last, T0 + 1000, T0 + 30_000, "me"), q.now)
    q.records += rec.decode(applied.records)
    leases = q.state.shards[0].queues.leases
    assert leases[short["leaseId"]][2].expires_at_ms == T0 + 30_000
    assert leases[long["leaseId"]][2].expires_at_ms == T0 + 600_000
    # The lease outlives its old end: acking after it still works; the other queue's is untouched.
    q.tick(10_000)
    assert q.ack(short["messages"][0])["success"]
    replayed = q.replayed()
    live = {lease_id: entry[2].expires_at_ms for lease_id, entry in leases.items()}
    assert {lease_id: entry[2].expires_at_ms for lease_id, entry in replayed.shards[0].queues.leases.items()} == live


@pytest.mark.parametrize("fields", [
    [5, "n", 10, 10, 0, 0],  # previous not below the version
    [0, "n", 10, 9, 0, 0],  # epoch 0 is no epoch
    [5, 7, 10, 9, 0, 0],  # node not a string
    [5, "n", 10, 9, -1, 0],
])
def test_a_malformed_epoch_record_is_refused(fields):
    with pytest.raises(rec.RecordError):
        rec.decode([int(rec.Kind.EPOCH), *fields])
