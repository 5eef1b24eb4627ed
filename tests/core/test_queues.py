"""Queues, pure: push, pop under a partition lease, ack, redelivery, DLQ, groups, waiting, replay.
Every step goes through State.apply with now_ms passed in; nothing sleeps."""

import pytest

from queen.core import records as rec
from queen.core.limits import Limits
from queen.core.outcomes import Refusal
from queen.core.queue_ops import DEFAULT_OPTIONS, parse_ack_item, parse_pop, parse_push
from queen.core.state import State
from queen.errors import BadRequest
from tests.core.queue_harness import T0, Queues, dlq, info, partitions, wire


def messages(answer):
    return [(m["partition"], m["offset"], m["data"]) for m in answer["messages"]]


def test_push_answers_ids_offsets_and_generated_transaction_ids_in_order():
    q = Queues()
    results = q.push({"payload": {"n": 1}, "transactionId": "order-1"}, {"n": 2}, partition="customer-42")
    assert [r["status"] for r in results] == ["queued", "queued"]
    assert [r["offset"] for r in results] == [0, 1]
    assert results[0]["transactionId"] == "order-1" and results[1]["transactionId"] == "queen:1"
    assert results[0]["partitionId"] == results[1]["partitionId"] and results[1]["messageId"] > results[0]["messageId"]
    assert results[0]["createdAt"] == T0


def test_a_pop_delivers_a_partition_in_offset_order_under_one_lease():
    q = Queues()
    q.push(*range(5), partition="p")
    got = q.pop(batch=3)
    assert got["success"] and messages(got) == [("p", 0, 0), ("p", 1, 1), ("p", 2, 2)]
    assert got["leaseId"] and got["expiresAt"] == T0 + 300_000 and got["partitionsClaimed"] == 1
    assert all(m["leaseId"] == got["leaseId"] and m["retryCount"] == 0 for m in got["messages"])
    # One live lease per (partition, group): the rest waits for this consumer.
    assert q.pop()["reason"] == "empty"
    assert q.pop(partition="p")["reason"] == "lease_held"
    for m in got["messages"]:
        assert q.ack(m)["success"]
    assert messages(q.pop(batch=10)) == [("p", 3, 3), ("p", 4, 4)]


def test_the_last_ack_of_a_lease_releases_the_partition_at_once():
    q = Queues()
    q.push("a", "b", partition="p")
    got = q.pop(batch=2)
    first = q.ack(got["messages"][0])
    assert first["success"] and first["leaseReleased"] is False
    last = q.ack(got["messages"][1])
    assert last["leaseReleased"] is True
    q.push("c", partition="p")
    assert messages(q.pop()) == [("p", 2, "c")]


def test_a_failed_ack_ends_the_lease_and_the_lane_is_redelivered_from_the_failed_message():
    q = Queues()
    q.push("a", "b", "c", partition="p")
    got = q.pop(batch=3)
    assert q.ack(got["messages"][0])["success"]
    failed = q.ack(got["messages"][1], status="failed", error="boom")
    assert failed == {**failed, "success": True, "leaseReleased": True, "retryCount": 1, "dlq": False}
    # The lease is gone on that partition: acking its other message is lease_lost.
    assert q.ack(got["messages"][2])["reason"] == "lease_lost"
    again = q.pop(batch=3)
    assert messages(again) == [("p", 1, "b"), ("p", 2, "c")]
    assert [m["retryCount"] for m in again["messages"]] == [1, 0]


def test_lease_expiry_redelivers_with_a_higher_retry_count_and_the_limit_sends_it_to_the_dlq():
    q = Queues()
    q.configure(leaseTimeSeconds=10, retryLimit=2)
    q.push("poison", partition="p")
    counts = []
    for _ in range(3):
        got = q.pop()
        counts.append(got["messages"][0]["retryCount"])
        q.tick(10_000)  # the lease runs out
    assert counts == [0, 1, 2]  # delivered 1 + retryLimit times
    assert q.pop()["reason"] == "empty"
    dlq = q.admin("dlq", group=None, partition=None, cursor=None, skip=0, limit=10)
    assert dlq["total"] == 1 and dlq["messages"][0]["error"] == "lease_expired" and dlq["messages"][0]["retryCount"] == 3


def test_a_pop_after_expiry_takes_the_partition_before_the_tick_and_records_the_expiry():
    q = Queues()
    q.configure(leaseTimeSeconds=5)
    q.push("m", partition="p")
    first = q.pop()
    q.now += 5_000  # no tick yet
    second = q.pop()
    assert second["leaseId"] > first["leaseId"] and second["messages"][0]["retryCount"] == 1
    assert q.ack(first["messages"][0])["reason"] == "lease_lost"
    assert q.ack(second["messages"][0])["success"]


def test_dlq_ack_requeue_and_purge():
    q = Queues()
    q.push("a", "b", partition="p")
    got = q.pop(batch=2)
    moved = q.ack(got["messages"][0], status="dlq", error="bad payload")
    assert moved["dlq"] is True and moved["leaseReleased"] is True
    listing = q.admin("dlq", group=None, partition=None, cursor=None, skip=0, limit=10)
    [entry] = listing["messages"]
    assert (entry["offset"], entry["error"], entry["data"]) == (0, "bad payload", "a")
    # Requeued, the entry is the lowest unresolved offset again: delivered before "b".
    assert q.admin("requeue", group="__QUEUE_MODE__", items=[(entry["partitionId"], 0)])["results"][0]["requeued"]
    again = q.pop(batch=2)
    assert messages(again) == [("p", 0, "a"), ("p", 1, "b")] and again["messages"][0]["retryCount"] == 0
    q.ack(again["messages"][0], status="dlq")
    assert q.ack(again["messages"][1])["reason"] == "lease_lost"  # the dlq ack ended the lease
    q.ack(q.pop()["messages"][0])
    assert q.admin("purge", group=None)["purged"] == 1
    assert q.admin("info")["messages"] == 0


def test_delayed_messages_are_never_delivered_early_and_hold_their_lane():
    q = Queues()
    q.configure(delayedProcessingSeconds=30)
    q.push("late", partition="p")
    q.now += 29_999
    assert q.pop()["reason"] == "empty"
    q.now += 1
    assert messages(q.pop()) == [("p", 0, "late")]


def test_groups_read_independently_and_new_groups_skip_what_was_there():
    q = Queues()
    q.push("m0", partition="p")
    a = q.pop(consumerGroup="a")
    b = q.pop(consumerGroup="b", subscriptionMode="new")
    assert messages(a) == [("p", 0, "m0")] and b["reason"] == "empty"
    q.push("m1", partition="p")
    assert messages(q.pop(consumerGroup="b")) == [("p", 1, "m1")]
    # Both groups hold the partition at once, each under its own lease.
    assert q.ack(a["messages"][0])["success"]


def test_the_wildcard_pop_takes_the_oldest_head_first_and_claims_up_to_n_partitions():
    q = Queues()
    q.push("x0", partition="x")
    q.now += 10
    q.push("y0", partition="y")
    q.now += 10
    q.push("z0", partition="z")
    got = q.pop(batch=10, partitions=2)
    assert messages(got) == [("x", 0, "x0"), ("y", 0, "y0")] and got["partitionsClaimed"] == 2
    assert messages(q.pop()) == [("z", 0, "z0")]


def test_transaction_ids_make_a_push_idempotent_in_its_partition():
    q = Queues()
    first = q.push({"payload": 1, "transactionId": "t"}, {"payload": 2, "transactionId": "t"}, partition="p")
    assert [r["status"] for r in first] == ["queued", "duplicate"]
    assert first[1]["messageId"] == first[0]["messageId"] and first[1]["offset"] == 0
    got = q.pop()
    q.ack(got["messages"][0])  # consumed and removed...
    assert q.push({"payload": 3, "transactionId": "t"}, partition="p")[0]["status"] == "duplicate"  # ...still known
    q.now += 900_000
    q.tick()
    assert q.push({"payload": 4, "transactionId": "t"}, partition="p")[0]["status"] == "queued"  # the window ended
    assert q.push({"payload": 5, "transactionId": "t"}, partition="other")[0]["status"] == "queued"  # per partition


def test_producer_ids_are_forgotten_after_their_window_but_not_while_their_message_is_retained():
    q = Queues()
    q.configure(dedupWindowSeconds=1)
    q.push(*[{"payload": i, "transactionId": f"t{i}"} for i in range(3)], partition="p")
    table = q.state.shards[0].queues
    partition = table.queues["orders"].partitions["p"]
    for message in q.pop(batch=2)["messages"]:
        q.ack(message)  # t0 and t1 consumed and removed; t2 still retained
    q.now += 1000
    q.tick()
    assert list(partition.dedupe) == ["t2"]
    assert q.push({"payload": 9, "transactionId": "t2"}, partition="p")[0]["status"] == "duplicate"
    q.ack(q.pop()["messages"][0])
    q.now += 60_000  # looked at again a minute later, its message gone
    q.tick()
    assert partition.dedupe == {} and table.shared.bytes == 0


def test_a_backlog_of_producer_ids_is_forgotten_a_budget_per_tick():
    q = Queues(Limits(producer_ids_per_tick_max=2))
    q.configure(dedupWindowSeconds=1)
    q.push(*[{"payload": i, "transactionId": f"t{i}"} for i in range(5)], partition="p")
    q.pop(batch=5, autoAck=True)
    partition = q.state.shards[0].queues.queues["orders"].partitions["p"]
    q.now += 1000
    left = []
    for _ in range(3):
        q.tick(50)
        left.append(len(partition.dedupe))
    assert left == [3, 1, 0]


def test_capacity_answers_failed_with_a_reason_and_appends_nothing():
    q = Queues(Limits(partitions_per_queue_max=1, queue_bytes_max=100))
    q.configure(maxSize=2)
    assert [r["status"] for r in q.push("a", "b", "c", partition="p")] == ["queued", "queued", "failed"]
    assert q.push("d", partition="p")[0]["reason"] == "queue_full"
    q.configure(maxSize=0)
    assert q.push("e", partition="q")[0]["reason"] == "partition_limit"
    assert q.push("x" * 100, partition="p")[0]["reason"] == "storage_full"
    assert q.admin("info")["messages"] == 2


def test_auto_ack_delivers_once_and_keeps_no_lease():
    q = Queues()
    q.push("a", "b", partition="p")
    got = q.pop(batch=1, autoAck=True)
    assert got["leaseId"] is None and messages(got) == [("p", 0, "a")]
    assert messages(q.pop(batch=5, autoAck=True)) == [("p", 1, "b")]
    assert q.pop()["reason"] == "empty" and q.admin("info")["messages"] == 0


def test_acks_say_already_lease_lost_and_not_delivered():
    q = Queues()
    q.push("a", "b", partition="p")
    got = q.pop(batch=1)
    message = got["messages"][0]
    assert q.ack(message)["success"]
    assert q.ack(message)["already"] is True  # a retried ack after the lease auto-released
    other = q.pop()
    assert q.ack({**other["messages"][0], "offset": 5})["reason"] == "not_delivered"
    assert q.ack({**other["messages"][0], "leaseId": got["leaseId"]})["reason"] == "lease_lost"
    by_tid = q.ack({**other["messages"][0], "offset": None}, transactionId="queen:1")
    assert by_tid["success"] and by_tid["offset"] == 1


def test_extend_never_shortens_and_release_returns_messages_unchanged():
    q = Queues()
    q.push("a", partition="p")
    got = q.pop()
    longer = q.extend(got["leaseId"], 600)
    assert longer["success"] and longer["expiresAt"] == T0 + 600_000
    assert q.extend(got["leaseId"], 1)["expiresAt"] == T0 + 600_000
    released = q.release(got["leaseId"])
    assert released["success"] and released["partitions"][0]["partition"] == "p"
    assert q.release(got["leaseId"])["reason"] == "lease_lost"
    assert q.pop()["messages"][0]["retryCount"] == 0


def test_a_parked_pop_is_handed_a_push_at_once_and_oldest_waiter_first():
    q = Queues()
    assert q.pop(waitMs=10_000, reply_to="w1") is None
    assert q.pop(waitMs=10_000, reply_to="w2") is None
    q.push("a", partition="p")
    assert [(to, messages(answer)) for to, answer in q.answered] == [("w1", [("p", 0, "a")])]
    q.push("b", partition="other")
    assert [to for to, _ in q.answered] == ["w1", "w2"]


def test_a_parked_pop_gets_an_expired_lease_within_a_tick_and_times_out_when_nothing_comes():
    q = Queues()
    q.configure(leaseTimeSeconds=1)
    q.push("a", partition="p")
    q.pop()
    assert q.pop(waitMs=5_000, reply_to="w") is None
    q.tick(1_000)
    [(to, answer)] = q.answered
    assert to == "w" and answer["messages"][0]["retryCount"] == 1
    assert q.pop(waitMs=500, reply_to="late") is None
    q.tick(500)
    assert q.answered[-1] == ("late", {**q.answered[-1][1], "reason": "timeout"})


@pytest.mark.parametrize("partition", [None, "p"])
def test_a_parked_pop_gets_a_delayed_message_within_a_tick_of_its_time(partition):
    """Nothing but time makes a delayed message deliverable: the tick wakes the pops parked on its
    queue when it comes, and looks at no other waiting queue."""
    q = Queues()
    q.configure(delayedProcessingSeconds=1)
    q.push("late", partition="p")
    assert q.pop(partition=partition, waitMs=5_000, reply_to="w") is None
    for idle in range(50):  # waiting queues with nothing due cost a tick nothing
        assert q.pop(queue=f"idle-{idle}", waitMs=5_000, reply_to=f"idle-{idle}") is None
    table = q.state.shards[0].queues
    assert len(table.parked.wakes) == 1
    q.tick(950)
    assert q.answered == []
    q.tick(50)
    [(to, answer)] = q.answered
    assert to == "w" and messages(answer) == [("p", 0, "late")]
    assert len(table.parked.wakes) == 0


def test_a_hung_up_waiter_is_never_handed_anything():
    q = Queues()
    assert q.pop(waitMs=10_000, reply_to="gone") is None
    q.abandon("gone")
    q.push("a", partition="p")
    assert [(to, answer["reason"]) for to, answer in q.answered] == [("gone", "cancelled")]
    assert messages(q.pop()) == [("p", 0, "a")]


def test_too_many_groups_is_refused():
    q = Queues(Limits(groups_per_queue_max=2))
    q.pop(consumerGroup="a")
    q.pop(consumerGroup="b")
    refused = q.pop(consumerGroup="c")
    assert type(refused) is Refusal and refused.error.code == "too_many_groups"


def test_deleting_a_group_ends_its_leases_and_a_queue_deletion_drops_everything():
    q = Queues()
    q.push("a", partition="p")
    got = q.pop(consumerGroup="g")
    assert q.admin("delete_group", group="g") == {"deleted": True}
    assert q.ack(got["messages"][0])["reason"] == "lease_lost"
    assert messages(q.pop(consumerGroup="g")) == [("p", 0, "a")]  # joins afresh
    assert q.admin("delete")["deleted"] is True
    assert q.admin("info")["found"] is False


def test_replay_of_the_records_rebuilds_the_same_queues():
    q = Queues()
    q.configure(retryLimit=1, leaseTimeSeconds=5)
    q.push({"payload": 1, "transactionId": "t1"}, 2, 3, partition="p")
    q.push(4, 5, partition="r")
    a = q.pop(batch=2)
    q.ack(a["messages"][0])
    q.ack(a["messages"][1], status="failed")
    b = q.pop(batch=5, consumerGroup="other", subscriptionMode="all")
    q.tick(5_000)  # b's lease expires
    c = q.pop(batch=1, partitions=2)
    q.extend(c["leaseId"], 100)
    replayed = q.replayed()
    live = q.state.shards[0].queues
    copy = replayed.shards[0].queues
    assert info(copy, "orders", q.now) == info(live, "orders", q.now)
    assert partitions(copy, "orders", None, "", None, 100, q.now) == partitions(live, "orders", None, "", None, 100, q.now)
    assert b["success"] and replayed.versions.last == 0  # replay never takes versions


def test_dlq_after_max_retries_is_a_boolean_in_every_answer_and_after_replay():
    """Compiled, the option's default came out of an int-typed table as 1, and every answer showed
    `"dlqAfterMaxRetries": 1` (a configure that set true on such a queue compared equal, so it
    stayed 1). A queue_set that such a build wrote is read back as a boolean."""
    assert DEFAULT_OPTIONS["dlqAfterMaxRetries"] is True
    q = Queues()
    assert q.configure(retryLimit=2)["options"]["dlqAfterMaxRetries"] is True
    assert q.configure(queue="strict", dlqAfterMaxRetries=False)["options"]["dlqAfterMaxRetries"] is False
    written_by_a_compiled_build = []
    rec.queue_set(written_by_a_compiled_build, 1, "old", T0, {**DEFAULT_OPTIONS, "dlqAfterMaxRetries": 1})
    for record in rec.decode(written_by_a_compiled_build):
        q.state.replay(record)
    assert info(q.state.shards[0].queues, "old", q.now)["options"]["dlqAfterMaxRetries"] is True
    assert q.configure(queue="old", dlqAfterMaxRetries=True)["options"]["dlqAfterMaxRetries"] is True


def test_a_snapshot_rebuilds_the_same_queues():
    q = Queues()
    q.push({"payload": 1, "transactionId": "t1"}, 2, 3, partition="p")
    got = q.pop(batch=2)
    q.ack(got["messages"][0], status="dlq", error="e")
    q.pop(consumerGroup="g", batch=3)
    sections = q.state.snapshot_capture()()
    copy = State(1, T0)
    for record in rec.decode(sections["queues"]):
        copy.replay(record)
    live, restored = q.state.shards[0].queues, copy.shards[0].queues
    assert info(restored, "orders", q.now) == info(live, "orders", q.now)
    assert partitions(restored, "orders", None, "", None, 100, q.now) == partitions(live, "orders", None, "", None, 100, q.now)
    assert wire(dlq(restored, "orders", None, None, None, 0, 10)) == wire(dlq(live, "orders", None, None, None, 0, 10))
    # The dedupe window survives too.
    assert restored.push(parse_push({"items": [{"queue": "orders", "partition": "p", "payload": 9, "transactionId": "t1"}]},
                                    Limits()), q.now, [])[0]["status"] == "duplicate"


def test_a_snapshot_restores_each_ready_partition_once():
    """The group's join puts a partition in its ready heap, and so did the snapshot's group state
    after it: one pop over several partitions then took the same messages twice."""
    q = Queues()
    q.push(0, 1, 2, partition="a")
    q.pop(partition="b")  # the group joins; partition a is untouched
    copy = State(1, T0)
    for record in rec.decode(q.state.snapshot_capture()()["queues"]):
        copy.replay(record)
    answer = wire(copy.shards[0].queues.pop(parse_pop("orders", None, {"batch": "10", "partitions": "2"}, Limits()),
                                            q.now, [], None, 0))
    assert [m["offset"] for m in answer["messages"]] == [0, 1, 2]


@pytest.mark.parametrize("raw, code", [
    ({"items": []}, "invalid_items"),
    ({"items": [{"payload": 1}]}, "invalid_queue"),
    ({"items": [{"queue": "queen-x", "payload": 1}]}, "reserved_queue"),
    ({"items": [{"queue": "q"}]}, "payload_required"),
    ({"items": [{"queue": "q", "payload": 1, "transactionId": "queen:1"}]}, "reserved_transaction_id"),
    ({"items": [{"queue": "q", "payload": 1, "partition": ""}]}, "invalid_partition"),
    ({"items": [{"queue": "q", "payload": 1, "traceId": "t" * 129}]}, "invalid_trace_id"),
    ({"items": [{"queue": "q", "payload": "x" * (256 << 10)}]}, "payload_too_large"),
    ({"items": [{"queue": "q", "payload": 1, "priority": 1}]}, "unknown_field"),
    ({"items": [{"queue": "q", "payload": 1}], "bufferMs": 10}, "unknown_field"),
])
def test_bad_pushes_are_refused_whole(raw, code):
    with pytest.raises(BadRequest) as caught:
        parse_push(raw, Limits())
    assert caught.value.code == code


@pytest.mark.parametrize("params, code", [
    ({"batch": "0"}, "invalid_batch"),
    ({"batch": "1001"}, "invalid_batch"),
    ({"partitions": "65"}, "invalid_partitions"),
    ({"waitMs": "60001"}, "invalid_wait_ms"),
    ({"wait": "true"}, "unknown_field"),  # another client's spelling is mapped before this
    ({"consumerGroup": "__mine"}, "reserved_consumer_group"),
    ({"autoAck": "yes"}, "invalid_auto_ack"),
    ({"subscriptionMode": "latest"}, "invalid_subscription_mode"),
    ({"namespace": "x"}, "unknown_field"),
])
def test_bad_pops_are_refused(params, code):
    with pytest.raises(BadRequest) as caught:
        parse_pop("orders", None, params, Limits())
    assert caught.value.code == code


@pytest.mark.parametrize("raw, code", [
    ({"partitionId": 1, "offset": 0}, "invalid_lease_id"),
    ({"partitionId": 1, "leaseId": "x", "offset": 0}, "invalid_lease_id"),
    ({"leaseId": 1, "offset": 0}, "invalid_partition_id"),
    ({"partitionId": 1, "leaseId": 2}, "message_ref_required"),
    ({"partitionId": 1, "leaseId": 2, "offset": -1}, "invalid_offset"),
    ({"partitionId": 1, "leaseId": 2, "offset": 0, "status": "retry"}, "invalid_status"),
    ({"partitionId": 1, "leaseId": 2, "offset": 0, "error": "e" * 1025}, "invalid_error"),
])
def test_bad_acks_are_refused(raw, code):
    with pytest.raises(BadRequest) as caught:
        parse_ack_item(raw, 0, Limits(), None)
    assert caught.value.code == code


def test_decimal_string_ids_are_accepted():
    item = parse_ack_item({"partitionId": "17", "leaseId": "905", "offset": 0, "error": None, "consumerGroup": None},
                          0, Limits(), None)
    assert (item.partition_id, item.lease_id, item.group) == (17, 905, None)


# -- offsets from requests, and partitions past 2^32 offsets ---------------------------------------

def test_an_ack_at_or_past_the_next_offset_is_not_delivered_and_touches_nothing():
    """Offsets up to 2^63-1 pass parsing; one past what the partition ever held must be judged
    against the partition before it reaches the resolved-offsets bitmap (a 32-bit one once failed
    the whole server on 2^32)."""
    q = Queues()
    q.push("a", "b", partition="p")
    got = q.pop(batch=1)
    message = got["messages"][0]
    for offset in (2, 2**31, 2**32, 2**32 + 1, 2**53 - 1, 2**63 - 1):
        answer = q.ack({**message, "offset": offset})
        assert answer["success"] is False and answer["reason"] == "not_delivered", offset
    for tid in ("queen:2", "queen:4294967296", "queen:999999999999999999"):
        answer = q.ack({**message, "offset": None}, transactionId=tid)
        assert answer["reason"] == "not_delivered", tid
    answer, records = q.txn({"ack": [{"partitionId": message["partitionId"], "leaseId": got["leaseId"],
                                      "offset": 2**32}]})
    assert answer["success"] is False and answer["reason"] == "not_delivered" and records == []
    assert q.ack(message)["success"]  # the lease and the message are untouched


def _partition_starting_at(q, next_offset):
    """A partition whose offsets start at next_offset, as a snapshot of a long-lived one restores it."""
    out = []
    rec.queue_set(out, 1, "orders", T0, dict(DEFAULT_OPTIONS))
    rec.partition(out, 2, "orders", "p", T0)
    rec.encode(out, rec.PartitionState("orders", 2, next_offset, next_offset))
    for record in rec.decode(out):
        q.state.replay(record)
        q.records.append(record)
    q.state.versions.last = 2


def test_a_partition_keeps_exact_offsets_across_2_to_the_32():
    q = Queues()
    _partition_starting_at(q, 2**32 - 2)
    pushed = q.push(*range(4), partition="p")
    assert [r["offset"] for r in pushed] == [2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1]
    got = q.pop(batch=4)
    assert [m["offset"] for m in got["messages"]] == [2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1]
    # Out of order, so offsets past 2^32 sit in the resolved set above the floor.
    for m in (got["messages"][3], got["messages"][2]):
        assert q.ack(m)["success"]
    assert q.ack(got["messages"][3])["already"] is True
    assert q.ack(got["messages"][1], status="failed")["success"]
    again = q.pop(batch=4)
    assert [m["offset"] for m in again["messages"]] == [2**32 - 2, 2**32 - 1]
    sections = q.state.snapshot_capture()()
    restored = State(1, T0)
    for record in rec.decode(sections["queues"]):
        restored.replay(record)
    live = q.state.shards[0].queues
    assert partitions(restored.shards[0].queues, "orders", None, "", None, 100, q.now) == \
        partitions(live, "orders", None, "", None, 100, q.now)
    for m in again["messages"]:
        assert q.ack(m)["success"]
    q.push("next", partition="p")
    assert [m["offset"] for m in q.pop()["messages"]] == [2**32 + 2]
    assert partitions(q.replayed().shards[0].queues, "orders", None, "", None, 100, q.now) == \
        partitions(live, "orders", None, "", None, 100, q.now)


def test_a_snapshot_of_an_earlier_build_with_a_32_bit_resolved_set_still_restores():
    from pyroaring import BitMap
    q = Queues()
    q.push(*range(4), partition="p")
    got = q.pop(batch=4)
    for m in got["messages"][2:]:
        q.ack(m)
    partition_id = got["messages"][0]["partitionId"]
    out = []
    for record in rec.decode(q.state.snapshot_capture()()["queues"]):
        if type(record) is rec.GroupPartition:
            # what builds before 64-bit offsets wrote: kind 27, a 32-bit roaring bitmap
            out += (27, record.queue, record.group, record.partition_id, record.floor,
                    BitMap([2, 3]).serialize(), record.retries, record.dlq)
        else:
            rec.encode(out, record)
    restored = State(1, T0)
    for record in rec.decode(out):
        restored.replay(record)
    state = restored.shards[0].queues.queues["orders"].by_id[partition_id].groups["__QUEUE_MODE__"]
    assert state.floor == 0 and list(state.resolved) == [2, 3]


def test_the_queue_views_count_pushes_pops_acks_and_failures_and_each_groups_consumers():
    """The listing and a queue's info carry the counters the dashboard's rates come from, and per
    group its consumers: live leases and parked pops."""
    q = Queues()
    q.configure(retryLimit=0)
    q.push("a", "b", "c", "d", partition="p1")
    q.push("e", partition="p2")
    got = q.pop(batch=2, partition="p1")  # the default group holds p1 under one lease
    audit = q.pop(batch=10, partitions=2, consumerGroup="audit", autoAck=True)  # delivered and completed at once
    assert len(audit["messages"]) == 5
    assert q.ack(got["messages"][0])["success"]
    assert q.ack(got["messages"][1], status="failed")["dlq"] is True  # retryLimit 0: failed is the DLQ
    held = q.pop(batch=1, partition="p1")  # in flight, under a live lease
    assert q.pop(consumerGroup="late", subscriptionMode="new", waitMs=5_000, reply_to="waiting") is None

    [summary] = q.admin("list", prefix="", after=None, limit=10)
    assert summary["totals"] == {"pushed": 5, "popped": 5 + 2 + 1, "acked": 5 + 1, "failed": 1}, summary
    assert summary["inFlight"] == 1 and summary["consumers"] == 2  # the live lease, the parked pop
    shown = q.admin("info")
    assert shown["totals"] == summary["totals"]
    groups = {group["consumerGroup"]: group for group in shown["groups"]}
    default = groups["__QUEUE_MODE__"]
    assert (default["inFlight"], default["leases"], default["parkedPops"], default["consumers"]) == (1, 1, 0, 1)
    assert (groups["audit"]["inFlight"], groups["audit"]["consumers"]) == (0, 0)  # autoAck holds no lease
    assert (groups["late"]["parkedPops"], groups["late"]["consumers"]) == (1, 1)

    # A lease that runs out is no consumer any more, and its message counts as failed once.
    q.tick(300_000)
    [summary] = q.admin("list", prefix="", after=None, limit=10)
    assert summary["consumers"] == 0 and summary["inFlight"] == 0 and summary["totals"]["failed"] == 2, summary
    assert held["messages"]
    # The counters are this server's since it started, not state: a replay rebuilds the views of
    # the state alone, equal to the live table's.
    live, copy = q.state.shards[0].queues, q.replayed().shards[0].queues
    assert info(copy, "orders", q.now) == info(live, "orders", q.now)
    assert "totals" not in info(live, "orders", q.now)
