"""The Queen MQ client's dialect at the edge (queen/http/queen_mq.py): its spellings become ours
before the core parses them, our answers get its names beside ours, and the core never sees either.
tests/compat runs the client itself; these pin each mapping on its own."""

import base64

import pytest

from queen.core.kv import parse_kv_op, parse_kv_ops
from queen.core.limits import Limits
from queen.core.queue_ops import parse_configure, parse_pop, parse_push
from queen.core.state import Transaction
from queen.core.timer_ops import parse_timer_ops
from queen.errors import BadRequest
from queen.http import queen_mq
from tests.core.queue_harness import T0, Queues

LIMITS = Limits()


def test_pop_wait_and_timeout_are_wait_ms_clamped_to_the_longest_wait():
    assert parse_pop("q", None, queen_mq.pop_params({"wait": "true", "timeout": "300000"}, LIMITS), LIMITS).wait_ms == 60_000
    assert parse_pop("q", None, queen_mq.pop_params({"wait": "true"}, LIMITS), LIMITS).wait_ms == 30_000
    assert parse_pop("q", None, queen_mq.pop_params({"timeout": "5000"}, LIMITS), LIMITS).wait_ms == 0
    assert parse_pop("q", None, queen_mq.pop_params({"autopilot": "true", "frames": "1"}, LIMITS), LIMITS).wait_ms == 0
    for params, code in (({"waitMs": "1", "wait": "true"}, "wait_conflict"), ({"wait": "yes"}, "invalid_wait_ms"),
                         ({"wait": "true", "timeout": "9" * 4400}, "invalid_wait_ms")):
        with pytest.raises(BadRequest) as caught:
            queen_mq.pop_params(params, LIMITS)
        assert caught.value.code == code


def test_configure_renames_its_options_and_passes_unimplemented_ones_only_when_they_ask_for_nothing():
    document = {"queue": "q", "namespace": None, "task": None,
                "options": {"leaseTime": 60, "delayedProcessing": 5, "retryDelay": 1000, "priority": 0,
                            "encryptionEnabled": False}}
    assert parse_configure(queen_mq.configure_document(document), LIMITS) == (
        "q", {"leaseTimeSeconds": 60, "delayedProcessingSeconds": 5, "retryDelayMs": 1000})
    for options, code in (({"priority": 5}, "unsupported_option"), ({"deadLetterQueue": "dead"}, "unsupported_option"),
                          ({"leaseTime": 5, "leaseTimeSeconds": 6}, "option_conflict"),
                          ({"retryDelay": 5, "retryDelayMs": 6}, "option_conflict"),
                          ({"retryDelay": -1}, "invalid_option"), ({"retryDelay": 1.5}, "invalid_option")):
        with pytest.raises(BadRequest) as caught:
            parse_configure(queen_mq.configure_document({"queue": "q", "options": options}), LIMITS)
        assert caught.value.code == code


def test_a_buffered_push_is_refused_by_name():
    with pytest.raises(BadRequest) as caught:
        parse_push(queen_mq.push_document({"items": [{"queue": "q", "payload": 1}], "bufferMs": 10}), LIMITS)
    assert caught.value.code == "unsupported_field" and caught.value.details["field"] == "bufferMs"


def test_kv_after_is_an_exclusive_cursor_and_delta_is_by():
    [page, incr] = parse_kv_ops(queen_mq.kv_ops([{"op": "getPrefix", "ns": "n", "after": "k1"},
                                                 {"op": "incr", "ns": "n", "key": "c", "delta": 5, "forever": True}],
                                                LIMITS), LIMITS)
    assert page.cursor == "k1" and incr.by == 5
    for raw, code in (({"op": "getPrefix", "ns": "n", "after": "a", "cursor": "YQ"}, "option_conflict"),
                      ({"op": "incr", "ns": "n", "key": "c", "delta": 1, "by": 1, "forever": True}, "option_conflict"),
                      ({"op": "getPrefix", "ns": "n", "after": 7}, "invalid_after"),
                      ({"op": "getPrefix", "ns": "n", "after": "x\u202e"}, "invalid_after"),
                      ({"op": "incr", "ns": "n", "key": "c", "delta": "x", "forever": True}, "invalid_by")):
        with pytest.raises(BadRequest) as caught:
            parse_kv_op(queen_mq.kv_ops([raw], LIMITS)[0], 0, LIMITS)
        assert caught.value.code == code, raw


def test_kv_answers_carry_its_names_beside_ours():
    results = queen_mq.kv_answers([
        {"items": [{"key": "a", "found": True, "value": 1}, {"key": "b", "found": False}]},
        {"items": [{"key": "a"}, {"key": "c"}], "cursor": "Yw"},
        {"applied": False, "reason": "version", "current": {"value": 2, "version": 4}}])
    assert results[0]["rows"] == [{"key": "a", "found": True, "value": 1}] and results[0]["missing"] == ["b"]
    assert results[1]["rows"] == results[1]["items"] and results[1]["truncated"] is True and results[1]["nextAfter"] == "c"
    assert results[2]["value"] == 2 and results[2]["version"] == 4 and results[2]["current"] == {"value": 2, "version": 4}


def test_timer_operations_in_its_spelling_become_ours_and_their_answers_echo_it():
    payload = base64.b64encode(b'{"orderId": 42}').decode()
    raw_ops, spelled = queen_mq.timer_ops([
        {"op": "reschedule", "queue": "q", "timerKey": "k", "txn": "t-1", "payload": payload, "delayMs": 1000},
        {"op": "cancel", "queue": "q", "key": "other"}])
    assert spelled == [True, False]
    ops = parse_timer_ops(raw_ops, LIMITS, T0)
    assert ops[0].op == "schedule" and ops[0].key == "k" and ops[0].transaction_id == "t-1"
    assert ops[0].payload == b'{"orderId":42}'
    results = queen_mq.timer_answers(ops, spelled, [
        {"scheduled": True, "at": T0 + 1000, "replaced": False}, {"cancelled": False, "reason": "absent"}])
    assert results[0] == {"scheduled": True, "at": T0 + 1000, "replaced": False, "ok": True, "status": "scheduled",
                          "timerKey": "k", "txn": "t-1", "deliverAt": T0 + 1000}
    assert results[1] == {"cancelled": False, "reason": "absent", "ok": False, "status": "absent"}
    for raw, code in (({"op": "schedule", "queue": "q", "timerKey": "k", "key": "k"}, "option_conflict"),
                      ({"op": "schedule", "queue": "q", "timerKey": "k", "payload": "not base64!"}, "invalid_payload"),
                      ({"op": "schedule", "queue": "q", "timerKey": "k", "payloadZstd": True}, "unsupported_field")):
        with pytest.raises(BadRequest) as caught:
            queen_mq.timer_ops([raw])
        assert caught.value.code == code


@pytest.mark.parametrize("document, code", [
    ({"operations": [{"type": "push"}]}, "invalid_operations"),  # a push needs its items
    ({"operations": [], "ack": []}, "unsupported_form"),  # the two forms mixed
    ({"operations": [{"type": "pop"}]}, "invalid_operations"),
    ({"operations": [], "requiredLeases": "x"}, "invalid_required_leases"),
    ({"operations": []}, "invalid_body"),
    ({"operations": [], "colour": 1}, "unknown_field"),
])
def test_a_bad_transaction_in_its_form_is_refused_whole(document, code):
    with pytest.raises(BadRequest) as caught:
        queen_mq.parse_transaction_document(document, LIMITS, T0)
    assert caught.value.code == code


def test_its_transaction_form_is_one_step_answered_flat_in_its_order():
    q = Queues()
    q.push("a", "b", partition="p")
    got = q.pop(batch=2)
    [first, second] = got["messages"]
    document = {"operations": [
        {"type": "push", "items": [{"queue": "out", "payload": 1}]},
        {"type": "ack", "partitionId": second["partitionId"], "transactionId": second["transactionId"]},
        {"type": "ack", "partitionId": first["partitionId"], "offset": first["offset"]}],
        "requiredLeases": [str(got["leaseId"])], "kv": [{"op": "incr", "ns": "n", "key": "c", "delta": 2, "forever": True}]}
    txn, spelling = queen_mq.parse_transaction_document(document, LIMITS, T0)
    assert txn.required_leases == [got["leaseId"]] and [item.lease_id for item in txn.ack] == [got["leaseId"]] * 2
    [(_, _, answer)] = q.step(Transaction(txn, "client"))
    assert answer["success"]
    answer = queen_mq.transaction_answer(txn, spelling, answer)
    assert [r.get("status") or r.get("success") for r in answer["results"][:3]] == ["queued", True, True]
    assert answer["results"][1]["offset"] == second["offset"] and answer["results"][3]["value"] == 2
