"""The KV state machine, pure: every call takes now_ms, nothing sleeps."""

import orjson
import pytest

from queen.core import records as rec
from queen.core.kv import KvState, VersionCounter, parse_kv_op, parse_kv_ops
from queen.core.limits import Limits
from queen.core.values import decode_json_bytes, json_default
from queen.errors import BadRequest

T0 = 1_700_000_000_000
LIMITS = Limits()


def make_state():
    return KvState(VersionCounter(), T0)


def wire(result):
    """A result as a client reads it: a read's value is the row's stored JSON (an orjson.Fragment),
    which the answer's encoding splices in; byte strings come back from their JSON form."""
    return decode_json_bytes(orjson.loads(orjson.dumps(result, default=json_default)))


def run(state, raw, now_ms=T0, effects=None):
    effects = [] if effects is None else effects
    return wire(state.apply(parse_kv_op(raw, 0, LIMITS), now_ms, effects))


def put(key, value, **extra):
    lifetime = {} if "forever" in extra or "ttlSeconds" in extra else {"ttlSeconds": 60}
    return {"op": "put", "ns": "app", "key": key, "value": value, **lifetime, **extra}


def test_put_then_get_returns_value_version_and_expiry():
    state = make_state()
    assert run(state, put("k", "v")) == {"applied": True, "version": 1}
    got = run(state, {"op": "get", "ns": "app", "key": "k"})
    assert got == {"found": True, "value": "v", "version": 1, "expiresAt": T0 + 60_000, "key": "k", "updatedAt": T0}


def test_every_write_takes_a_higher_version_across_keys_and_deletes():
    state = make_state()
    versions = [run(state, put("a", 1))["version"], run(state, put("b", 1))["version"],
                run(state, {"op": "delete", "ns": "app", "key": "a"})["version"], run(state, put("a", 2))["version"]]
    assert versions == sorted(versions) and len(set(versions)) == 4


def test_put_with_stale_expect_answers_version_and_current_value():
    state = make_state()
    run(state, put("k", "first"))
    run(state, put("k", "second"))
    miss = run(state, put("k", "third", expect=1))
    assert miss == {"applied": False, "reason": "version", "current": {"value": "second", "version": 2}}
    assert run(state, {"op": "get", "ns": "app", "key": "k"})["value"] == "second"


def test_expect_zero_means_absent():
    state = make_state()
    assert run(state, put("k", 1, expect=0))["applied"] is True
    assert run(state, put("k", 2, expect=0))["reason"] == "version"


def test_put_if_absent_one_of_two_wins():
    state = make_state()
    first = run(state, {"op": "putIfAbsent", "ns": "app", "key": "k", "value": "a", "ttlSeconds": 5})
    second = run(state, {"op": "putIfAbsent", "ns": "app", "key": "k", "value": "b", "ttlSeconds": 5})
    assert first["applied"] and not second["applied"]
    assert second["reason"] == "exists" and second["current"]["value"] == "a"


def test_expired_row_is_absent_the_moment_its_time_passes_without_the_wheel():
    state = make_state()
    run(state, put("k", "v", ttlSeconds=1))
    assert run(state, {"op": "get", "ns": "app", "key": "k"}, T0 + 999)["found"] is True
    assert run(state, {"op": "get", "ns": "app", "key": "k"}, T0 + 1000)["found"] is False
    assert run(state, {"op": "putIfAbsent", "ns": "app", "key": "k", "value": 2, "forever": True}, T0 + 1000)["applied"]


def test_wheel_frees_expired_rows_so_memory_follows_live_data():
    state = make_state()
    for i in range(100):
        run(state, put(f"k{i}", i, ttlSeconds=1 + i % 3))
    run(state, put("forever", 1, forever=True))
    assert state.row_count() == 101
    state.expire(T0 + 3050)
    assert state.row_count() == 1 and len(state.wheel) == 0


def test_rewriting_a_row_moves_its_wheel_entry():
    state = make_state()
    run(state, put("k", 1, ttlSeconds=1))
    run(state, put("k", 2, ttlSeconds=10))
    state.expire(T0 + 2000)
    assert state.row_count() == 1
    assert run(state, {"op": "get", "ns": "app", "key": "k"}, T0 + 2000)["value"] == 2


def test_incr_counts_from_zero_and_stops_at_max_with_reason_limit():
    state = make_state()
    op = {"op": "incr", "ns": "app", "key": "c", "max": 2, "ttlSeconds": 60}
    assert run(state, op)["value"] == 1
    assert run(state, op)["value"] == 2
    miss = run(state, op)
    assert miss["applied"] is False and miss["reason"] == "limit" and miss["value"] == 2


def test_incr_with_min_and_negative_by():
    state = make_state()
    op = {"op": "incr", "ns": "app", "key": "c", "by": -1, "min": -1, "forever": True}
    assert run(state, op)["value"] == -1
    assert run(state, op)["reason"] == "limit"


def test_incr_on_a_non_integer_answers_not_integer():
    state = make_state()
    run(state, put("c", "text"))
    assert run(state, {"op": "incr", "ns": "app", "key": "c", "forever": True})["reason"] == "not_integer"


def test_incr_keeps_the_create_version():
    state = make_state()
    op = {"op": "incr", "ns": "app", "key": "c", "forever": True}
    run(state, op)
    run(state, op)
    row = state.live_view("app", "c", T0)
    assert row.create_version == 1 and row.version == 2


def test_delete_absent_and_with_wrong_expect():
    state = make_state()
    assert run(state, {"op": "delete", "ns": "app", "key": "k"}) == {"applied": False, "reason": "absent"}
    run(state, put("k", 1))
    assert run(state, {"op": "delete", "ns": "app", "key": "k", "expect": 9})["reason"] == "version"
    assert run(state, {"op": "delete", "ns": "app", "key": "k", "expect": 1})["applied"] is True


def test_check_reports_without_writing():
    state = make_state()
    effects = []
    run(state, put("k", 1), effects=effects)
    assert run(state, {"op": "check", "ns": "app", "key": "k", "expect": 1}, effects=effects) == {"applied": True, "version": 1}
    assert run(state, {"op": "check", "ns": "app", "key": "k", "expect": 0}, effects=effects)["applied"] is False
    assert len(rec.decode(effects)) == 1


def test_get_prefix_pages_in_key_order_with_cursor():
    state = make_state()
    for i in range(25):
        run(state, put(f"p{i:03d}", i))
    run(state, put("q", 0))
    op = parse_kv_op({"op": "getPrefix", "ns": "app", "prefix": "p", "limit": 10}, 0, LIMITS)
    page = state.apply(op, T0, [])
    assert [item["key"] for item in page["items"]] == [f"p{i:03d}" for i in range(11)]  # limit + 1


def test_misses_write_nothing_and_take_no_version():
    state = make_state()
    effects = []
    run(state, put("k", 1), effects=effects)
    run(state, put("k", 2, expect=7), effects=effects)
    run(state, {"op": "putIfAbsent", "ns": "app", "key": "k", "value": 3, "forever": True}, effects=effects)
    assert len(rec.decode(effects)) == 1 and state.versions.last == 1


def test_replay_of_effects_rebuilds_the_same_rows():
    state = make_state()
    effects = []
    run(state, put("a", {"x": 1}), effects=effects)
    run(state, put("b", 2, forever=True), effects=effects)
    run(state, {"op": "delete", "ns": "app", "key": "a"}, effects=effects)
    run(state, {"op": "incr", "ns": "app", "key": "b", "forever": True}, effects=effects)
    copy = make_state()
    for record in rec.decode(effects):
        copy.replay(record)
    for key in ("a", "b"):
        assert run(copy, {"op": "get", "ns": "app", "key": key}) == run(state, {"op": "get", "ns": "app", "key": key})


@pytest.mark.parametrize("raw, code", [
    ({"op": "put", "ns": "app", "key": "k", "value": 1}, "ttl_required"),
    ({"op": "put", "ns": "app", "key": "k", "value": 1, "ttlSeconds": 5, "forever": True}, "ttl_conflict"),
    ({"op": "put", "ns": "app", "key": "k", "value": 1, "ttlSeconds": 0}, "invalid_ttl"),
    ({"op": "put", "ns": "app", "key": "k", "value": 1, "ttlSeconds": 1.5}, "invalid_ttl"),
    ({"op": "put", "ns": "app", "key": "k", "value": 1, "ttlSeconds": True}, "invalid_ttl"),
    ({"op": "incr", "ns": "app", "key": "k"}, "ttl_required"),
    ({"op": "put", "ns": "", "key": "k", "value": 1, "forever": True}, "invalid_ns"),
    ({"op": "put", "ns": "n" * 129, "key": "k", "value": 1, "forever": True}, "invalid_ns"),
    ({"op": "put", "ns": "app", "key": "k" * 1025, "value": 1, "forever": True}, "invalid_key"),
    ({"op": "put", "ns": "app", "key": "é" * 513, "value": 1, "forever": True}, "invalid_key"),
    ({"op": "put", "ns": "app", "key": "k", "value": "x" * (256 << 10), "forever": True}, "value_too_large"),
    ({"op": "put", "ns": "app", "key": "k", "forever": True}, "value_required"),
    ({"op": "put", "ns": "queen-locks", "key": "k", "value": 1, "forever": True}, "reserved_namespace"),
    ({"op": "put", "ns": "app", "key": "k", "value": 1, "forever": True, "expect": -1}, "invalid_expect"),
    ({"op": "check", "ns": "app", "key": "k"}, "invalid_expect"),
    ({"op": "getPrefix", "ns": "app", "limit": 1001}, "invalid_limit"),
    ({"op": "getPrefix", "ns": "app", "cursor": "!!"}, "invalid_cursor"),
    ({"op": "frobnicate", "ns": "app", "key": "k"}, "unknown_op"),
    ({"op": {"a": 1}, "ns": "app", "key": "k"}, "unknown_op"),
    ({"op": ["put"], "ns": "app", "key": "k"}, "unknown_op"),
    ({"op": b"put", "ns": "app", "key": "k"}, "unknown_op"),
    ({"op": "put", "ns": "app", "key": "k", "value": 1, "forever": True, "expct": 3}, "unknown_field"),
    ({"op": "get", "ns": "app", "key": "k", "value": 1}, "unknown_field"),
    ({"op": "incr", "ns": "app", "key": "k", "forever": True, "by": 1.5}, "invalid_by"),
    ("put", "invalid_operation"),
])
def test_bad_operations_are_rejected_with_a_specific_code(raw, code):
    with pytest.raises(BadRequest) as caught:
        parse_kv_op(raw, 3, LIMITS)
    assert caught.value.code == code
    assert caught.value.details.get("index") == 3


def test_a_misspelt_field_is_refused_by_name_not_ignored():
    # {"expct": 3} must not turn a compare-and-set into a blind write.
    with pytest.raises(BadRequest) as caught:
        parse_kv_op({"op": "put", "ns": "app", "key": "k", "value": 1, "forever": True, "expct": 3}, 0, LIMITS)
    assert caught.value.code == "unknown_field" and caught.value.details["field"] == "expct"


def test_namespace_and_key_sizes_follow_the_configured_limits():
    small = Limits(ns_bytes_max=4, key_bytes_max=300)
    parse_kv_op({"op": "get", "ns": "abcd", "key": "k" * 300}, 0, small)
    for raw, code in (({"op": "get", "ns": "abcde", "key": "k"}, "invalid_ns"),
                      ({"op": "get", "ns": "a", "key": "k" * 301}, "invalid_key")):
        with pytest.raises(BadRequest) as caught:
            parse_kv_op(raw, 0, small)
        assert caught.value.code == code


def test_byte_strings_are_values_and_count_in_their_json_form():
    state = make_state()
    assert run(state, put("b", b"\x00\xff" * 10))["applied"]
    assert run(state, {"op": "get", "ns": "app", "key": "b"})["value"] == b"\x00\xff" * 10
    tight = Limits(value_bytes_max=40)  # 30 bytes are 40 in base64, plus the {"$bytes":...} around them
    with pytest.raises(BadRequest) as caught:
        parse_kv_op(put("b", b"x" * 30), 0, tight)
    assert caught.value.code == "value_too_large"


def test_more_operations_than_the_limit_are_rejected_whole():
    with pytest.raises(BadRequest) as caught:
        parse_kv_ops([{"op": "get", "ns": "a", "key": "k"}] * 1025, LIMITS)
    assert caught.value.code == "too_many_operations"


def test_reserved_namespace_can_be_read():
    assert parse_kv_op({"op": "get", "ns": "queen-locks", "key": "x#0"}, 0, LIMITS).op == "get"


def test_stored_rows_index_and_wheel_are_not_tracked_by_the_cyclic_gc():
    """A store of millions of keys must cost a full collection nothing (bench/kv_fill.py): rows
    are bytes in an untracked dict, the ordered index holds tuples of keys, the TTL wheel strings."""
    import gc

    state = make_state()
    for i in range(3000):
        value = {"n": i, "tags": ["a", {"b": [1.5, None]}], "raw": b"\x00\xff"} if i % 3 else f"v{i}"
        run(state, put(f"k{i:05d}", value, **({"forever": True} if i % 2 else {"ttlSeconds": 60})))
    run(state, {"op": "getPrefix", "ns": "app", "prefix": "k", "limit": 5})  # builds the index
    for i in range(0, 3000, 7):
        run(state, {"op": "delete", "ns": "app", "key": f"k{i:05d}"})
    run(state, put("k99999", [1, 2]))  # a note the next page folds in
    state.expire(T0 + 100)
    gc.collect()
    table = state.tables["app"]
    assert not gc.is_tracked(table.rows)
    assert not any(gc.is_tracked(packed) for packed in table.rows.values())
    assert not gc.is_tracked(table._added) and not gc.is_tracked(table._removed)
    index = table.sorted_keys()
    gc.collect()
    assert len(index) == len(table.rows) and not any(gc.is_tracked(chunk) for chunk in index._chunks)
    assert len(state.wheel) > 0 and not gc.is_tracked(state.wheel._slot_of)
    assert not any(gc.is_tracked(slot) for slot in state.wheel._slots)


@pytest.mark.parametrize("value", [
    None, True, False, 0, -(1 << 63), (1 << 64) - 1, 1.5, -0.0, 1e300, "", "ünïcode ✓", "$bytes", b"", b"\x00\xff",
    [], {}, {"$bytes": "not alone", "x": b"in a map"}, [b"a", {"b": [b"c", None]}], {"z": 1, "a": 2},
])
def test_a_stored_value_reads_back_exactly_as_written(value):
    state = make_state()
    run(state, put("k", value))
    got = run(state, {"op": "get", "ns": "app", "key": "k"})["value"]
    assert got == value and type(got) is type(value) and repr(got) == repr(value)
    page = run(state, {"op": "getPrefix", "ns": "app", "prefix": ""})["items"][0]["value"]
    assert repr(page) == repr(value)
    effects = []
    run(state, put("k", value), effects=effects)
    copy = make_state()
    for record in rec.decode(effects):
        copy.replay(record)
    assert repr(copy.live_view("app", "k", T0).value) == repr(value)
