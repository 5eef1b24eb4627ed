"""The linearizability checker accepts legal histories and rejects the anomalies a fault suite
hunts for: lost acknowledged writes, stale reads, stale compare-and-set, versions going back,
reads of values nobody wrote, increments applied twice, and unknown writes that flip-flop."""

import random
import time

import pytest

from tests.faults.linearizability import Op, check_history, check_key

UNKNOWN = None


def op(process, kind, args, invoke, complete, result=None, key="k"):
    return Op(process, kind, key, dict(args), invoke, complete, result)


def get(process, invoke, complete, value=None, version=0, found=None, key="k"):
    found = value is not None if found is None else found
    return op(process, "get", {}, invoke, complete,
              {"found": found, "value": value if found else None, "version": version if found else 0}, key)


def put(process, value, invoke, complete, version=None, expect=None, key="k"):
    args = {"value": value} if expect is None else {"value": value, "expect": expect}
    result = None if complete is UNKNOWN else {"applied": True, "version": version}
    return op(process, "put", args, invoke, complete, result, key)


def put_missed(process, value, expect, invoke, complete, current_value, current_version, key="k"):
    current = {"value": current_value, "version": current_version}
    return op(process, "put", {"value": value, "expect": expect}, invoke, complete,
              {"applied": False, "reason": "version", "current": current, **current}, key)


def incr(process, by, invoke, complete, value=None, version=None, key="k"):
    result = None if complete is UNKNOWN else {"applied": True, "value": value, "version": version}
    return op(process, "incr", {"by": by}, invoke, complete, result, key)


def ok(ops):
    result = check_key(ops)
    assert result.decided
    return result.ok


# --------------------------------------------------------------------------------------------
# Legal histories.


def test_empty_history_and_reads_of_an_absent_key():
    assert ok([])
    assert ok([get(1, 0, 1), get(2, 0.5, 2)])


def test_sequential_history_of_every_kind():
    ops = [
        put(1, "a", 0, 1, version=3),
        get(1, 2, 3, "a", 3),
        put(1, "b", 4, 5, version=7, expect=3),
        put_missed(1, "c", 3, 6, 7, "b", 7),
        op(1, "putIfAbsent", {"value": "d"}, 8, 9, {"applied": False, "reason": "exists",
                                                   "current": {"value": "b", "version": 7}}),
        op(1, "delete", {"expect": 7}, 10, 11, {"applied": True, "version": 9}),
        op(1, "delete", {}, 12, 13, {"applied": False, "reason": "absent"}),
        get(1, 14, 15),
        incr(1, 5, 16, 17, value=5, version=12),
        op(1, "incr", {"by": 10, "max": 12}, 18, 19,
           {"applied": False, "reason": "limit", "value": 5, "version": 12}),
        incr(1, -2, 20, 21, value=3, version=13),
        op(1, "putIfAbsent", {"value": "e"}, 22, 23, {"applied": False, "reason": "exists",
                                                     "current": {"value": 3, "version": 13}}),
        put(1, {"nested": [1, 2]}, 24, 25, version=20),
        op(1, "incr", {"by": 1}, 26, 27, {"applied": False, "reason": "not_integer",
                                          "current": {"value": {"nested": [1, 2]}, "version": 20}}),
        get(1, 28, 29, {"nested": [1, 2]}, 20),
    ]
    result = check_key(ops)
    assert result.ok, result.reason
    assert result.witness == ops


def test_concurrent_writes_may_take_effect_in_either_order():
    # b's put overlaps a's; the reads pin the order: a (version 1) then b (version 2).
    ops = [
        put(1, "a", 0, 10, version=1),
        put(2, "b", 1, 5, version=2),
        get(3, 2, 3, "a", 1),
        get(3, 11, 12, "b", 2),
    ]
    assert ok(ops)
    # A read overlapping a write may see the old row or the new one, and two overlapping reads
    # may see them in either order of completion.
    assert ok([put(1, "a", 0, 1, version=1), put(1, "b", 2, 6, version=2), get(2, 3, 7, "a", 1)])
    assert ok([put(1, "a", 0, 1, version=1), put(1, "b", 2, 6, version=2), get(2, 3, 7, "b", 2)])
    assert ok([put(1, "a", 0, 1, version=1), put(1, "b", 2, 6, version=2),
               get(2, 3, 4, "b", 2), get(3, 3, 7, "a", 1)])


def test_unknown_writes_are_optional_and_may_land_late():
    # Never visible: fine.
    assert ok([put(1, "a", 0, 1, version=1), put(2, "x", 2, UNKNOWN), get(3, 10, 11, "a", 1)])
    # Visible only long after the client gave up on it (applied after a restart): fine; its
    # version is pinned by the first read and must be above every earlier one.
    assert ok([put(1, "a", 0, 1, version=4), put(2, "x", 2, UNKNOWN), get(3, 10, 11, "a", 4),
               get(3, 12, 13, "x", 9), get(3, 14, 15, "x", 9)])
    assert not ok([put(1, "a", 0, 1, version=4), put(2, "x", 2, UNKNOWN), get(3, 12, 13, "x", 3)])
    # Two unknown writes need two versions above the last known one.
    assert ok([put(1, "a", 0, 1, version=4), put(2, "x", 2, UNKNOWN), put(3, "y", 2, UNKNOWN),
               get(4, 5, 6, "x", 5), get(4, 7, 8, "y", 6)])
    # An unknown delete the key was seen absent after takes a version too.
    deleted = [put(1, "a", 0, 1, version=4), op(2, "delete", {}, 2, UNKNOWN, None), get(4, 3, 4),
               put(3, "y", 3, UNKNOWN)]
    assert not ok(deleted + [get(4, 5, 6, "y", 5)])
    assert ok(deleted + [get(4, 5, 6, "y", 6)])
    assert ok(deleted[:2] + [put(3, "y", 3, UNKNOWN), get(4, 5, 6, "y", 5)])  # the delete never ran
    # A known write after an unknown one still needs a larger version than the pinned one.
    assert not ok([put(2, "x", 0, UNKNOWN), get(3, 1, 2, "x", 9), put(1, "b", 3, 4, version=8)])
    # Unknown reads constrain nothing.
    assert ok([op(1, "get", {}, 0, UNKNOWN, None), put(2, "a", 1, 2, version=1)])


def test_unknown_increment_may_count_once():
    assert ok([incr(1, 1, 0, 1, 1, 1), incr(2, 1, 2, UNKNOWN), get(3, 5, 6, 2, 2)])
    assert ok([incr(1, 1, 0, 1, 1, 1), incr(2, 1, 2, UNKNOWN), get(3, 5, 6, 1, 1)])
    assert not ok([incr(1, 1, 0, 1, 1, 1), incr(2, 1, 2, UNKNOWN), get(3, 5, 6, 3, 3)])


# --------------------------------------------------------------------------------------------
# Known anomalies are rejected.


def test_lost_acknowledged_write():
    result = check_key([put(1, "a", 0, 1, version=1), get(2, 2, 3)])
    assert not result.ok and result.decided
    assert "get" in result.reason
    assert not ok([put(1, "a", 0, 1, version=1), put(1, "b", 2, 3, version=2), get(2, 4, 5, "a", 1)])


def test_stale_read():
    # b overwrote a before the read began; a concurrent read may still see a, this one may not.
    assert not ok([put(1, "a", 0, 1, version=1), put(1, "b", 2, 3, version=2),
                   get(2, 2.5, 9, "b", 2), get(3, 4, 5, "a", 1)])
    # A read that sees the new value, then a later read that sees the old one.
    assert not ok([put(1, "a", 0, 1, version=1), put(1, "b", 2, 10, version=2),
                   get(2, 3, 4, "b", 2), get(3, 5, 6, "a", 1)])


def test_compare_and_set_from_a_stale_expect():
    assert not ok([put(1, "a", 0, 1, version=1), put(1, "b", 2, 3, version=2),
                   put(2, "c", 4, 5, version=3, expect=1)])
    # A miss must report the real current row, and the expect must really differ.
    assert not ok([put(1, "a", 0, 1, version=1), put_missed(2, "c", 1, 2, 3, "a", 1)])
    assert not ok([put(1, "a", 0, 1, version=1), put_missed(2, "c", 7, 2, 3, "z", 1)])
    assert ok([put(1, "a", 0, 1, version=1), put_missed(2, "c", 7, 2, 3, "a", 1)])
    # putIfAbsent on a present key, delete of a present key answered "absent".
    assert not ok([put(1, "a", 0, 1, version=1),
                   op(2, "putIfAbsent", {"value": "b"}, 2, 3, {"applied": True, "version": 2})])
    assert not ok([put(1, "a", 0, 1, version=1),
                   op(2, "delete", {}, 2, 3, {"applied": False, "reason": "absent"})])


def test_version_that_goes_back():
    assert not ok([put(1, "a", 0, 1, version=5), put(1, "b", 2, 3, version=3)])
    assert not ok([put(1, "a", 0, 1, version=5), put(1, "b", 2, 3, version=5)])
    assert not ok([put(1, "a", 0, 1, version=5), get(2, 2, 3, "a", 4)])
    # Deletes take versions too: a put after a delete must be above the delete's.
    assert not ok([put(1, "a", 0, 1, version=5), op(1, "delete", {}, 2, 3, {"applied": True, "version": 8}),
                   put(1, "b", 4, 5, version=7)])


def test_read_of_a_value_never_written():
    assert not ok([put(1, "a", 0, 1, version=1), get(2, 0, 5, "zzz", 1)])
    assert not ok([get(2, 0, 5, "zzz", 1)])
    # Same value with the wrong version, or JSON-different values, are different rows too.
    assert not ok([put(1, 1, 0, 1, version=1), get(2, 2, 3, True, 1)])
    assert not ok([put(1, 1, 0, 1, version=1), get(2, 2, 3, 1.0, 1)])


def test_double_applied_increment():
    assert not ok([incr(1, 1, 0, 1, 1, 1), incr(2, 1, 2, 3, 2, 2), get(3, 4, 5, 3, 3)])
    assert not ok([incr(1, 1, 0, 1, 1, 1), incr(2, 1, 2, 3, 3, 2)])
    assert ok([incr(1, 1, 0, 1, 1, 1), incr(2, 1, 2, 3, 2, 2), get(3, 4, 5, 2, 2)])


def test_unknown_write_that_flip_flops():
    base = [put(1, "a", 0, 1, version=1), put(2, "x", 2, UNKNOWN)]
    assert ok(base + [get(3, 3, 4, "x", 5), get(3, 7, 8, "x", 5)])
    assert not ok(base + [get(3, 3, 4, "x", 5), get(3, 5, 6, "a", 1), get(3, 7, 8, "x", 5)])
    # Visible, then gone: also a flip (nothing else wrote a).
    assert not ok(base + [get(3, 3, 4, "x", 5), get(3, 5, 6, "a", 1)])


def test_failure_reports_the_stuck_operation_and_a_legal_prefix():
    ops = [put(1, "a", 0, 1, version=1), get(2, 2, 3, "a", 1), get(2, 4, 5, "q", 1)]
    result = check_key(ops)
    assert not result.ok
    assert result.witness == ops[:2]
    assert "'q'" in result.reason and "process 2" in result.reason


def test_history_is_checked_per_key():
    ops = [put(1, "a", 0, 1, version=1, key="x"), put(1, "b", 2, 3, version=2, key="y"),
           get(2, 4, 5, "a", 1, key="x"), get(2, 4, 5, "a", 1, key="y")]
    results = check_history(ops)
    assert results["x"].ok and not results["y"].ok
    with pytest.raises(ValueError):
        check_key(ops)


def test_budget_makes_the_search_give_up_rather_than_run_away():
    ops = [put(p, f"v{p}", 0, UNKNOWN) for p in range(12)] + [get(99, 1, 2, "nope", 1)]
    result = check_key(ops, budget=100)
    assert not result.ok and not result.decided and "undecided" in result.reason


# --------------------------------------------------------------------------------------------
# Randomized: a real register driven by overlapping clients gives legal histories.


class Register:
    """The server's answers for one key, applied in linearization order."""

    def __init__(self, rng):
        self.rng = rng
        self.row = None  # (value, version)
        self.version = 0

    def next_version(self):
        self.version += self.rng.randint(1, 3)  # other keys take versions too
        return self.version

    def current(self):
        value, version = self.row if self.row else (None, 0)
        return {"value": value, "version": version}

    def missed(self, reason):
        current = self.current()
        return {"applied": False, "reason": reason, "current": current, **current}

    def apply(self, kind, args):
        row_version = self.row[1] if self.row else 0
        if kind == "get":
            found = self.row is not None
            return {"found": found, **self.current()}
        if kind == "putIfAbsent" and self.row is not None:
            return self.missed("exists")
        if kind == "delete" and self.row is None:
            return {"applied": False, "reason": "absent"}
        if args.get("expect") is not None and args["expect"] != row_version:
            return self.missed("version")
        if kind == "delete":
            self.row = None
            return {"applied": True, "version": self.next_version()}
        if kind == "incr":
            current = self.row[0] if self.row else 0
            if type(current) is not int:
                return self.missed("not_integer")
            if args.get("max") is not None and current + args["by"] > args["max"]:
                return {"applied": False, "reason": "limit", "value": current, "version": row_version}
            value = current + args["by"]
            self.row = (value, self.next_version())
            return {"applied": True, "value": value, "version": self.row[1]}
        self.row = (args["value"], self.next_version())
        return {"applied": True, "version": self.row[1]}


def simulate(seed, count, processes=6, counter=False, unknown_rate=0.05):
    """A history of `count` ops by `processes` clients, each op taking effect at a random instant
    inside its interval (an unknown one: anywhere after its invoke, or never)."""
    rng = random.Random(seed)
    register = Register(rng)
    clocks = [rng.random() for _ in range(processes)]
    planned = []
    for number in range(count):
        process = rng.randrange(processes)
        invoke = clocks[process] + rng.random()
        complete = invoke + rng.expovariate(1.0)
        clocks[process] = complete
        roll = rng.random()
        if counter:
            kind, args = ("get", {}) if roll < 0.4 else ("incr", {"by": rng.randint(-1, 3), "max": 40})
        elif roll < 0.4:
            kind, args = "get", {}
        elif roll < 0.65:
            kind, args = "put", {"value": f"v{number}"}
        elif roll < 0.8:
            kind, args = "put", {"value": f"v{number}", "expect": "?"}
        elif roll < 0.9:
            kind, args = "putIfAbsent", {"value": f"v{number}"}
        else:
            kind, args = "delete", {} if rng.random() < 0.5 else {"expect": "?"}
        unknown = rng.random() < unknown_rate
        if unknown:
            point = invoke + rng.random() * 3 if rng.random() < 0.6 else None
        else:
            point = rng.uniform(invoke, complete)
        planned.append([point, process, kind, args, invoke, None if unknown else complete])
    results = {}
    for index, (point, _, kind, args, _, _) in sorted(enumerate(planned), key=lambda item: item[1][0] or 0):
        if args.get("expect") == "?":  # an expect that is right half the time
            version = register.current()["version"]
            args["expect"] = version if rng.random() < 0.5 else max(0, version - rng.randint(1, 4))
        if point is None:
            continue
        results[index] = register.apply(kind, args)
    ops = []
    for index, (_, process, kind, args, invoke, complete) in enumerate(planned):
        ops.append(Op(process, kind, "k", args, invoke, complete,
                      results.get(index) if complete is not None else None))
    return ops


def concurrency(ops):
    events = sorted([(o.invoke, 1) for o in ops] + [(o.complete if o.complete is not None else float("inf"), -1) for o in ops],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("seed", range(40))
def test_random_register_histories_are_linearizable(seed):
    ops = simulate(seed, 120, counter=seed % 4 == 3)
    result = check_key(ops)
    assert result.ok, result.reason
    applied_known = [o for o in ops if o.complete is not None]
    assert set(map(id, applied_known)) <= set(map(id, result.witness))


@pytest.mark.parametrize("seed", range(40))
def test_a_random_history_with_one_wrong_read_is_rejected(seed):
    ops = simulate(seed, 120)
    rng = random.Random(seed)
    reads = [o for o in ops if o.kind == "get" and o.complete is not None and o.result["found"]]
    target = rng.choice(reads)
    if seed % 2:
        target.result = {**target.result, "value": "never-written"}
    else:
        # Another acknowledged write's value under this read's version: a row that never existed.
        others = [o for o in ops if o.kind in ("put", "putIfAbsent") and o.complete is not None
                  and o.result["applied"] and o.args["value"] != target.result["value"]]
        target.result = {**target.result, "value": rng.choice(others).args["value"]}
    result = check_key(ops)
    assert not result.ok and result.decided


def test_a_long_history_with_eight_clients_is_fast():
    ops = simulate(1234, 500, processes=8, unknown_rate=0.02)
    assert concurrency([o for o in ops if o.complete is not None]) <= 8
    started = time.monotonic()
    result = check_key(ops)
    assert result.ok, result.reason
    assert time.monotonic() - started < 2
