"""Transactions with every section, pure: kv + ack + push + timers judged against the state before
them and applied all or nothing as one step; the first miss in section order is the answer."""

import pytest

from queen.core import records as rec
from queen.core.limits import Limits
from queen.core.txn import parse_transaction
from queen.errors import BadRequest
from tests.core.queue_harness import T0, Queues, info

LEASE_MS = 300_000


def ack_of(message, **extra):
    return {"partitionId": message["partitionId"], "leaseId": message["leaseId"], "offset": message["offset"], **extra}


def popped(q: Queues, **params):
    got = q.pop(**params)
    assert got["success"], got
    return got


def step_document(message, order_state="paid"):
    return {
        "kv": [{"op": "put", "ns": "orders", "key": "42", "value": {"state": order_state}, "forever": True}],
        "ack": [ack_of(message)],
        "push": [{"queue": "invoices", "partition": "customer-42", "payload": {"orderId": 42},
                  "transactionId": "invoice-42"}],
        "timers": [{"op": "cancel", "queue": "orders", "key": "order-42:payment-timeout"},
                   {"op": "schedule", "queue": "orders", "key": "order-42:review", "partition": "customer-42",
                    "delayMs": 86_400_000, "payload": {"orderId": 42, "kind": "review"}}]}


def kv_get(q: Queues, key="42"):
    answer, _ = q.txn({"kv": [{"op": "get", "ns": "orders", "key": key}]})
    return answer["kv"][0]


def test_all_four_sections_commit_as_one_step_with_a_result_per_operation():
    q = Queues()
    q.timer("schedule", key="order-42:payment-timeout", delayMs=900_000, payload={"orderId": 42})
    q.push({"orderId": 42}, partition="customer-42")
    message = popped(q)["messages"][0]
    answer, records = q.txn(step_document(message))
    assert answer["success"] is True
    assert answer["kv"][0]["index"] == 0 and answer["kv"][0]["version"]
    assert answer["ack"] == [{"index": 0, "partitionId": message["partitionId"], "offset": 0,
                              "transactionId": "queen:0", "success": True, "leaseReleased": True, "dlq": False,
                              "retryCount": 0}]
    assert answer["push"][0]["status"] == "queued" and answer["push"][0]["createdAt"] == T0
    assert answer["timers"][0]["cancelled"] is True and answer["timers"][1]["scheduled"] is True
    assert [r["index"] for r in answer["timers"]] == [0, 1]
    kinds = {type(r) for r in records}
    assert {rec.Put, rec.MessageState, rec.Append, rec.TimerCancel, rec.TimerSet} <= kinds
    versions = [rec.version_of(r) for r in records if rec.version_of(r)]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    # Everything is there.
    assert kv_get(q)["value"] == {"state": "paid"}
    assert q.timer(key="order-42:review")["found"] and not q.timer(key="order-42:payment-timeout")["found"]
    assert popped(q, queue="invoices")["messages"][0]["data"] == {"orderId": 42}
    assert q.pop(batch=10)["reason"] == "empty"  # the ack took


def test_a_kv_miss_writes_nothing_of_any_section():
    q = Queues()
    q.push(1, partition="p")
    message = popped(q)["messages"][0]
    document = step_document(message)
    document["kv"].append({"op": "check", "ns": "queen-locks", "key": "billing#0", "expect": 7, "required": True})
    answer, records = q.txn(document)
    assert answer == {"success": False, "reason": "kv_precondition", "error": "kv_precondition", "failed": {
        "section": "kv", "index": 1, "op": "check", "ns": "queen-locks", "key": "billing#0",
        "reason": "absent", "current": {"value": None, "version": 0}}}
    assert records == []
    assert kv_get(q)["found"] is False and q.timer(key="order-42:review")["found"] is False
    assert q.pop(queue="invoices")["success"] is False


def test_the_paused_consumer_story_lease_lost_writes_nothing_and_the_new_owner_commits():
    q = Queues()
    q.push({"orderId": 42}, partition="customer-42")
    a = popped(q)["messages"][0]
    q.tick(LEASE_MS)  # A is paused past its lease
    b = popped(q)["messages"][0]
    assert b["offset"] == a["offset"] and b["leaseId"] != a["leaseId"]
    answer, records = q.txn(step_document(a, "paid by A"))
    assert answer["success"] is False and answer["reason"] == "lease_lost"
    assert answer["failed"]["section"] == "ack" and answer["failed"]["current"] == {"state": "inFlight"}
    assert records == [] and kv_get(q)["found"] is False
    answer, _ = q.txn(step_document(b, "paid by B"))
    assert answer["success"] is True and kv_get(q)["value"] == {"state": "paid by B"}
    # A retries: its message is completed now (by B), and its lease is still gone.
    answer, records = q.txn(step_document(a, "paid by A"))
    assert answer["reason"] == "lease_lost" and answer["failed"]["current"] == {"state": "completed"} and not records


def test_a_retried_step_under_its_live_lease_answers_already():
    q = Queues()
    q.push(1, 2, partition="p")
    got = popped(q, batch=2)
    first, _ = q.txn({"ack": [ack_of(got["messages"][0])]})
    assert first["success"] and first["ack"][0]["leaseReleased"] is False
    again, _ = q.txn({"ack": [ack_of(got["messages"][0])], "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]})
    assert again["success"] is True and again["ack"][0]["already"] is True


def test_an_ack_of_a_message_the_lease_did_not_deliver_is_not_delivered():
    q = Queues()
    q.push(1, 2, partition="p")
    got = popped(q, batch=1)
    answer, records = q.txn({"ack": [{**ack_of(got["messages"][0]), "offset": 1}]})
    assert answer["reason"] == "not_delivered" and answer["failed"]["current"] == {"state": "pending"}
    assert not records


def test_a_lease_ends_after_the_last_ack_of_the_transaction():
    q = Queues()
    q.configure(retryLimit=5)
    q.push("a", "b", "c", partition="p")
    got = popped(q, batch=3)
    m = got["messages"]
    answer, _ = q.txn({"ack": [ack_of(m[0], status="failed"), ack_of(m[1]), ack_of(m[2], status="failed")]})
    assert answer["success"] is True and [r["success"] for r in answer["ack"]] == [True, True, True]
    assert [r["leaseReleased"] for r in answer["ack"]] == [True, True, True]
    assert answer["ack"][0]["retryCount"] == 1 and answer["ack"][2]["retryCount"] == 1
    again = popped(q, batch=3)
    assert [x["data"] for x in again["messages"]] == ["a", "c"]  # b completed, a and c back


def test_capacity_counts_the_earlier_pushes_of_the_same_transaction():
    q = Queues()
    q.configure(queue="invoices", maxSize=2)
    q.push("there", queue="invoices")
    answer, records = q.txn({"push": [{"queue": "invoices", "payload": 1}, {"queue": "invoices", "payload": 2}],
                             "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]})
    assert answer["reason"] == "queue_full" and answer["failed"]["section"] == "push" and answer["failed"]["index"] == 1
    assert not records
    # A duplicate is not a failure and adds nothing, so it does not count.
    answer, _ = q.txn({"push": [{"queue": "invoices", "payload": 1, "transactionId": "x"},
                                {"queue": "invoices", "payload": 1, "transactionId": "x"}]})
    assert answer["success"] and [r["status"] for r in answer["push"]] == ["queued", "duplicate"]


def test_partition_limit_and_timer_storage_are_preconditions():
    q = Queues(Limits(partitions_per_queue_max=2, timers_max=1))
    answer, records = q.txn({"push": [{"queue": "q", "partition": p, "payload": 1} for p in ("a", "b", "c")]})
    assert answer["reason"] == "partition_limit" and answer["failed"]["index"] == 2 and not records
    answer, records = q.txn({"timers": [{"op": "schedule", "queue": "q", "key": k, "delayMs": 5, "payload": 1}
                                        for k in ("a", "b")]})
    assert answer["reason"] == "storage_full" and answer["failed"] == {
        "section": "timers", "index": 1, "reason": "storage_full", "queue": "q", "key": "b"}
    assert not records


def test_a_cancel_of_an_absent_timer_is_not_a_failure():
    q = Queues()
    answer, _ = q.txn({"timers": [{"op": "cancel", "queue": "orders", "key": "gone"}],
                       "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]})
    assert answer["success"] and answer["timers"][0] == {"index": 0, "op": "cancel", "queue": "orders", "key": "gone",
                                                         "cancelled": False, "reason": "absent"}


def test_the_first_miss_in_section_order_is_reported():
    q = Queues(Limits(timers_max=0))
    q.push(1, partition="p")
    stale = popped(q)["messages"][0]
    q.tick(LEASE_MS)
    answer, _ = q.txn({"timers": [{"op": "schedule", "queue": "q", "key": "k", "delayMs": 5, "payload": 1}],
                       "ack": [ack_of(stale)],
                       "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "expect": 3, "forever": True}]})
    assert answer["reason"] == "kv_precondition"
    answer, _ = q.txn({"timers": [{"op": "schedule", "queue": "q", "key": "k", "delayMs": 5, "payload": 1}],
                       "ack": [ack_of(stale)]})
    assert answer["reason"] == "lease_lost"


def test_a_transaction_replays_to_the_same_state():
    q = Queues()
    q.push({"orderId": 42}, partition="customer-42")
    message = popped(q)["messages"][0]
    q.txn(step_document(message))
    replayed = q.replayed()
    live, copy = q.state.shards[0], replayed.shards[0]
    assert info(copy.queues, "orders", q.now) == info(live.queues, "orders", q.now)
    assert info(copy.queues, "invoices", q.now) == info(live.queues, "invoices", q.now)
    assert copy.queues.timers.pending == live.queues.timers.pending
    assert copy.kv.live_view("orders", "42", q.now).value == {"state": "paid"}


@pytest.mark.parametrize("document, code", [
    ({"operations": [{"type": "push"}]}, "unknown_section"),  # another client's form is mapped before this
    ({"kv": [{"op": "get", "ns": "n", "key": "k"}], "pop": []}, "unknown_section"),
    ({}, "invalid_body"),
    ([], "invalid_body"),
    ({"timers": [{"op": "get", "queue": "q", "key": "k"}]}, "not_in_transaction"),
    ({"kv": [{"op": "getPrefix", "ns": "n", "prefix": ""}]}, "not_in_transaction"),
    ({"kv": [{"op": "get", "ns": "n", "key": "k"}, {"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]}, "duplicate_key"),
    ({"ack": [{"partitionId": 1, "leaseId": 2, "offset": 3}, {"partitionId": 1, "leaseId": 2, "offset": 3}]},
     "duplicate_ack"),
    ({"timers": [{"op": "cancel", "queue": "q", "key": "k"}, {"op": "cancel", "queue": "q", "key": "k"}]},
     "duplicate_timer"),
    ({"ack": [{"partitionId": 1, "offset": 3}]}, "invalid_lease_id"),
    ({"push": []}, "invalid_items"),
    ({"push": [{"queue": "q", "payload": 1}] * 600, "kv": [{"op": "get", "ns": "n", "key": str(n)} for n in range(500)]},
     "too_many_operations"),
])
def test_bad_transactions_are_refused_whole(document, code):
    with pytest.raises(BadRequest) as caught:
        parse_transaction(document, Limits(), T0)
    assert caught.value.code == code


@pytest.mark.parametrize("document, reason", [
    ({"kv": [{"op": "check", "ns": "n", "key": "k", "expect": 7}]}, "kv_precondition"),
    ({"ack": [{"partitionId": 999, "leaseId": 999, "offset": 0}]}, "lease_lost"),
])
def test_a_transaction_that_misses_carries_error_equal_to_reason_like_every_other_miss(document, reason):
    answer, records = Queues().txn(document)
    assert answer["success"] is False and answer["reason"] == reason and answer["error"] == reason
    assert not records
