"""The retry backoff, pure: a delivery that ended without completion (a failed ack, or a lease that
ran out) holds its message back from its group for retryDelayMs, doubled for each earlier one, at
most retryDelayMaxMs; the partition's lane waits behind it; replay and snapshots hold it back alike.
Every step goes through State.apply with now_ms passed in; nothing sleeps."""

import pytest

from queen.core import records as rec
from queen.core.queue_ops import DEFAULT_OPTIONS
from queen.core.state import State
from tests.core.queue_harness import T0, Queues, dlq, partitions

GROUP = "__QUEUE_MODE__"


def messages(answer):
    return [(m["partition"], m["offset"], m["data"]) for m in answer["messages"]]


def held_until(q, partition="p", group=GROUP, state=None):
    """The partitions view's retryAt of one group in one partition."""
    table = (state or q.state).shards[0].queues
    page = partitions(table, "orders", group, "", None, 100, q.now)
    [item] = [item for item in page["items"] if item["partition"] == partition]
    [entry] = item["groups"]
    return entry["retryAt"]


def rebuilt(q, state: State) -> Queues:
    """A harness over a rebuilt state, at q's time."""
    copy = Queues()
    copy.state = state
    copy.now = q.now
    return copy


def from_snapshot(q) -> State:
    state = State(1, T0)
    for record in rec.decode(q.state.snapshot_capture()()["queues"]):
        state.replay(record)
    return state


def fail_once_more(q, expected_retry_count, **pop):
    """Pop the message (it must be there now), ack it failed; the time of the failure."""
    got = q.pop(**pop)
    assert got["success"], got
    [message] = got["messages"]
    assert message["retryCount"] == expected_retry_count
    assert q.ack(message, status="failed", error="boom")["success"]
    return q.now


def test_the_options_default_to_no_delay_and_show_in_queue_info():
    q = Queues()
    assert DEFAULT_OPTIONS["retryDelayMs"] == 0 and DEFAULT_OPTIONS["retryDelayMaxMs"] == 300_000
    q.push("m", partition="p")
    options = q.admin("info")["options"]
    assert options["retryDelayMs"] == 0 and options["retryDelayMaxMs"] == 300_000
    assert q.ack(q.pop()["messages"][0], status="failed")["success"]
    assert q.pop()["messages"][0]["retryCount"] == 1  # at once, as without the option


def test_each_failure_holds_the_message_back_twice_as_long_up_to_the_max():
    q = Queues()
    q.configure(retryDelayMs=200, retryDelayMaxMs=1_000, retryLimit=10)
    q.push("poison", partition="p")
    failed_at = fail_once_more(q, 0)
    for count, backoff_ms in enumerate([200, 400, 800, 1_000, 1_000], start=1):
        assert held_until(q) == failed_at + backoff_ms
        q.now = failed_at + backoff_ms - 1
        assert q.pop()["reason"] == "empty"
        assert q.pop(partition="p")["reason"] == "empty"
        q.now += 1
        failed_at = fail_once_more(q, count)
    q.now = failed_at + 1_000
    got = q.pop()
    state = q.state.shards[0].queues.queues["orders"].partitions["p"].groups[GROUP]
    assert state.retry_at == {}  # delivered again: held back no more, and nothing kept for it
    assert q.ack(got["messages"][0])["success"] and state.retries == {}


def test_a_lease_that_runs_out_counts_as_a_failure():
    q = Queues()
    q.configure(retryDelayMs=200, leaseTimeSeconds=1)
    q.push("slow", partition="p")
    q.pop()
    q.tick(1_000)  # the tick ends the lease: a failed delivery at T0 + 1000
    q.now += 199
    assert q.pop()["reason"] == "empty"
    q.now += 1
    got = q.pop()
    assert got["messages"][0]["retryCount"] == 1
    # Noticed by a pop instead of a tick, 50 ms after it ran out: held back from then.
    q.now = got["expiresAt"] + 50
    assert q.pop()["reason"] == "empty"
    assert held_until(q) == q.now + 400
    q.now += 400
    assert q.pop()["messages"][0]["retryCount"] == 2


def test_the_lane_waits_behind_a_message_held_back():
    q = Queues()
    q.configure(retryDelayMs=200)
    q.push("a", "b", "c", partition="p")
    got = q.pop(batch=3)
    # b failed while a was still unacked: a comes back at once, b is held back and c waits behind it.
    assert q.ack(got["messages"][1], status="failed")["success"]
    again = q.pop(batch=3)
    assert messages(again) == [("p", 0, "a")]
    assert q.ack(again["messages"][0])["success"]
    q.now += 199
    assert q.pop(batch=3)["reason"] == "empty"
    assert q.pop(partition="p", batch=3)["reason"] == "empty"
    q.now += 1
    last = q.pop(batch=3)
    assert messages(last) == [("p", 1, "b"), ("p", 2, "c")]
    assert [m["retryCount"] for m in last["messages"]] == [1, 0]


def test_other_groups_and_other_partitions_are_not_held_back():
    q = Queues()
    q.configure(retryDelayMs=10_000)
    q.push("m", partition="p")
    got = q.pop(consumerGroup="g1")
    assert q.ack(got["messages"][0], status="failed")["success"]
    assert messages(q.pop(consumerGroup="g2")) == [("p", 0, "m")]  # g2 never failed it
    q.now += 5
    q.push("n", partition="r")  # newer than p's head, which waits
    assert messages(q.pop(consumerGroup="g1")) == [("r", 0, "n")]
    assert held_until(q, "p", "g1") == T0 + 10_000 and held_until(q, "p", "g2") is None


def test_the_dlq_still_takes_it_past_the_retry_limit():
    q = Queues()
    q.configure(retryDelayMs=100, retryLimit=2)
    q.push("poison", partition="p")
    failed_at = fail_once_more(q, 0)
    for count, backoff_ms in ((1, 100), (2, 200)):
        q.now = failed_at + backoff_ms - 1
        assert q.pop()["reason"] == "empty"
        q.now += 1
        failed_at = fail_once_more(q, count)
    assert q.pop()["reason"] == "empty"
    page = q.admin("dlq", group=None, partition=None, cursor=None, skip=0, limit=10)
    assert page["total"] == 1 and page["messages"][0]["retryCount"] == 3 and page["messages"][0]["dlqAt"] == failed_at
    assert held_until(q) is None
    # Requeued, it starts afresh: delivered at once.
    assert q.admin("requeue", group=GROUP, items=[(page["messages"][0]["partitionId"], 0)])["results"][0]["requeued"]
    assert q.pop()["messages"][0]["retryCount"] == 0


def test_a_requeue_below_a_held_back_head_is_delivered_at_once():
    """The floor comes down to a requeued DLQ entry while the partition's entry in the ready heap is
    keyed by its held-back head: a new entry supersedes it, or the pop would stop at another
    partition's later head first."""
    q = Queues()
    q.configure(retryDelayMs=1_000, retryLimit=5)
    q.push("q0", partition="q")
    assert q.ack(q.pop(partition="q")["messages"][0], status="failed")["success"]  # q held until T0 + 1000
    q.push("p0", partition="p")
    assert q.ack(q.pop(partition="p")["messages"][0], status="dlq")["success"]
    q.push("p1", partition="p")
    q.now += 100
    assert q.ack(q.pop(partition="p")["messages"][0], status="failed")["success"]  # p held until T0 + 1100
    assert q.pop()["reason"] == "empty"
    partition_id = q.admin("dlq", group=None, partition=None, cursor=None, skip=0, limit=10)["messages"][0]["partitionId"]
    assert q.admin("requeue", group=GROUP, items=[(partition_id, 0)])["results"][0]["requeued"]
    assert messages(q.pop()) == [("p", 0, "p0")]


def test_retention_removing_a_held_back_head_frees_the_lane():
    """Retention removes a head the retry backoff holds back: the partition's entry in the ready
    heap, keyed by that head, is superseded, or the pop would stop at another partition's head
    held back less long."""
    q = Queues()
    q.configure(retryDelayMs=60_000, retentionSeconds=2)
    q.push("p0", partition="p")
    q.now += 1_000
    q.push("q0", partition="q")
    assert q.ack(q.pop(partition="q")["messages"][0], status="failed")["success"]  # q held until T0 + 61000
    q.now += 500
    assert q.ack(q.pop(partition="p")["messages"][0], status="failed")["success"]  # p held until T0 + 61500
    q.now += 100
    q.push("p1", partition="p")
    q.tick(300)
    assert q.pop()["reason"] == "empty"  # p1 waits behind p0
    q.tick(100)  # T0 + 2000: retention removes p0 (held back, not leased), not yet q0
    assert messages(q.pop()) == [("p", 1, "p1")]


@pytest.mark.parametrize("partition", [None, "p"])
def test_a_parked_pop_is_answered_when_the_retry_time_comes(partition):
    q = Queues()
    q.configure(retryDelayMs=200)
    q.push("m", partition="p")
    assert q.ack(q.pop()["messages"][0], status="failed")["success"]
    assert q.pop(partition=partition, waitMs=5_000, reply_to="w") is None
    q.tick(150)
    assert q.answered == []
    q.tick(50)
    [(to, answer)] = q.answered
    assert to == "w" and messages(answer) == [("p", 0, "m")] and answer["messages"][0]["retryCount"] == 1


@pytest.mark.parametrize("rebuild", ["replay", "snapshot"])
def test_replay_and_a_snapshot_hold_it_back_alike_mid_backoff(rebuild):
    q = Queues()
    q.configure(retryDelayMs=1_000, retryDelayMaxMs=1_500, leaseTimeSeconds=1)
    q.push("a", "b", partition="p")
    q.push("c", partition="r")
    failed_at = fail_once_more(q, 0, partition="p")
    q.now = failed_at + 1_000
    failed_at = fail_once_more(q, 1, partition="p")  # p held until failed_at + 1500 (capped)
    q.pop(partition="r")
    q.tick(1_000)  # r's lease runs out: r held until now + 1000
    expired_at = q.now
    # The options change after the failures: what they hold back stays as it was.
    q.configure(retryDelayMs=0)
    q.now = expired_at + 100
    copy = rebuilt(q, q.replayed() if rebuild == "replay" else from_snapshot(q))
    live, restored = q.state.shards[0].queues, copy.state.shards[0].queues
    assert partitions(restored, "orders", None, "", None, 100, q.now) == partitions(live, "orders", None, "", None, 100, q.now)
    assert held_until(copy, "p") == failed_at + 1_500 and held_until(copy, "r") == expired_at + 1_000
    for harness in (q, copy):
        harness.now = failed_at + 1_499
        assert harness.pop(batch=2)["reason"] == "empty"
        harness.now = failed_at + 1_500
        got = harness.pop(batch=2)
        assert messages(got) == [("p", 0, "a"), ("p", 1, "b")] and got["messages"][0]["retryCount"] == 2
        assert harness.ack(got["messages"][0], status="failed")["success"]
        assert harness.pop(partition="p")["messages"][0]["offset"] == 0  # retryDelayMs is 0 now: at once
        harness.now = expired_at + 999
        assert harness.pop(partition="r")["reason"] == "empty"
        harness.now = expired_at + 1_000
        assert messages(harness.pop(partition="r")) == [("r", 0, "c")]


def test_a_snapshot_of_an_earlier_build_holds_nothing_back():
    """Kind 27 (group_partition_32) has retry counts and no retry times: every message is due."""
    q = Queues()
    q.configure(retryDelayMs=60_000)
    q.push("m", partition="p")
    assert q.ack(q.pop()["messages"][0], status="failed")["success"]
    out = []
    for record in rec.decode(q.state.snapshot_capture()()["queues"]):
        if type(record) is rec.GroupPartition:
            assert record.retries == [0, 1, T0 + 60_000]
            out += (27, record.queue, record.group, record.partition_id, record.floor, b"\x3a\x30\x00\x00\x00\x00\x00\x00",
                    record.retries[:2], record.dlq)
        else:
            rec.encode(out, record)
    state = State(1, T0)
    for record in rec.decode(out):
        state.replay(record)
    copy = rebuilt(q, state)
    assert held_until(copy) is None
    assert copy.pop()["messages"][0]["retryCount"] == 1


def test_a_retry_count_of_a_million_costs_no_big_number():
    from queen.core.queues.table import retry_backoff_ms
    assert retry_backoff_ms(200, 300_000, 1) == 200 and retry_backoff_ms(200, 300_000, 3) == 800
    assert retry_backoff_ms(1, 86_400_000, 1_000_000) == 86_400_000
    assert retry_backoff_ms(500, 100, 1) == 100  # a max below the delay caps the first one too
    q = Queues()
    q.configure(retryDelayMs=5, retryDelayMaxMs=50, dlqAfterMaxRetries=False)
    q.push("m", partition="p")
    fail_once_more(q, 0)
    assert held_until(q) == T0 + 5
    assert dlq(q.state.shards[0].queues, "orders", None, None, None, 0, 10)["total"] == 0
