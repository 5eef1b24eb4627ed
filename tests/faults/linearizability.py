"""A per-key linearizability checker for Queen's KV store.

The fault suite records what concurrent clients asked of a real server (one that gets killed
with SIGKILL and restarted) and what they were told; this module decides whether some order of
those operations, each taking effect at one instant between its invoke and its completion, is a
legal run of one register per key. It is the Wing-Gong search with Lowe's memoization, as
Knossos and Porcupine do it: operations ordered by invoke, a stack of tentative linearization
points, and a cache of (set of linearized operations, model state) pairs already explored.

API
---
``Op(process, kind, key, args, invoke, complete, result)``
    One client operation. ``invoke`` and ``complete`` are readings of one monotonic clock (int or
    float). ``complete=None`` means the outcome is unknown (the connection died, the server was
    killed): the operation may have taken effect at any instant after ``invoke``, even after a
    restart, or never; ``result`` is then ignored. Otherwise ``result`` is the server's answer.
    ``kind`` and ``args``, with the answers as Queen's KV state machine gives them:

    - ``get``, args ``{}``: ``{"found", "value", "version"}`` (version 0 when not found).
    - ``put``, args ``{"value", "expect"?}``: ``{"applied": True, "version"}``, or
      ``{"applied": False, "reason": "version", "current": {"value", "version"}}`` (the current
      row may also be given at the top level, as the server does too). ``expect`` 0 means
      "only if absent".
    - ``putIfAbsent``, args ``{"value"}``: ``{"applied": True, "version"}``, or
      ``{"applied": False, "reason": "exists", "current": {...}}``.
    - ``delete``, args ``{"expect"?}``: ``{"applied": True, "version"}`` (a delete takes a
      version too), ``{"applied": False, "reason": "absent"}`` or ``reason "version"``.
    - ``incr``, args ``{"by"?, "max"?, "min"?, "expect"?}``: ``{"applied": True, "value",
      "version"}`` or ``{"applied": False, "reason": "version" | "not_integer" | "limit", ...}``
      (``limit`` carries the current ``value`` and ``version`` at the top level).

    An operation that definitely did not take effect (a request the server refused, say) is
    better left out of the history; one that might have is an unknown outcome.

``check_key(ops, budget=...) -> Result``
    Checks the operations of one key (all ``op.key`` must be equal).
``check_history(ops, budget=...) -> dict[str, Result]``
    Splits a history by ``op.key`` and checks each key on its own (a register per key is
    linearizable iff the whole store is, for single-key operations).
``Result(ok, reason, witness, decided, explored)``
    ``ok`` True: ``witness`` is one linearization (the ops in the order they took effect; unknown
    ops that never took effect are absent from it). ``ok`` False: ``reason`` names the first
    operation that no order could fit, with the model state there, and ``witness`` is the longest
    legal prefix the search found. ``decided`` False means the search gave up after ``budget``
    explored configurations (then ``ok`` is False too, and ``reason`` says so).

The model
---------
The state of one key is ``(exists, value, version, pending)``: ``version`` is the last version
known for the key (the version of the current row, or of the delete that removed it, or 0), and
``pending`` counts the writes of unknown outcome linearized since then, each of which took a new
version nobody reported. So:

- every applied write must report a version larger than any before it on the key, and at least
  ``pending`` larger than the last known one (the unreported versions are distinct integers in
  between);
- a read, or a miss that reports the current row, must see exactly the current value and version
  (an absent key reads as version 0); when unreported versions are pending, the version it
  reports pins them (it must be at least ``version + pending``);
- conditional writes (``expect``, ``putIfAbsent``, a delete of an absent key, an incr past its
  bounds or on a non-integer) must agree with the state they were linearized against, both when
  they applied and when they missed;
- an incr's answered value must be the current integer (0 when absent) plus ``by``.

Values compare as JSON (so ``1``, ``1.0`` and ``true`` differ). Lifetimes (TTL expiry) are not
modelled: a row that expired reads as a lost write. Multi-key operations (transactions,
getMany, getPrefix) are out of scope; record their per-key effects as single-key ops if needed.

Cost: the search is exponential in the worst case; answered versions pin the order of writes,
which keeps it small in practice. Measured on random register histories with 8 clients: 500
ops with a few percent unknown outcomes check in about 10 ms, 2000 ops in about 50 ms, 500 ops
with 10-30% unknown outcomes in 0.1-1 s. Each unknown write stays open forever, so k unknown
writes on one key can multiply the configurations explored by up to 2**k, and proving a history
NOT linearizable explores everything before the bad operation: 500 ops with 10-20% unknown
writes and one bad read can take 10 s to minutes. ``budget`` (configurations explored per key,
about 200,000 a second) bounds that; past it the result is ``decided=False``. Keep the share of
unknown writes per key small (short histories per key, several keys) to stay decided.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

KINDS = frozenset({"get", "put", "putIfAbsent", "delete", "incr"})
DEFAULT_BUDGET = 1_000_000  # configurations per key: some 5 s of search


@dataclass
class Op:
    process: int
    kind: str
    key: str
    args: dict
    invoke: float
    complete: float | None  # None: the outcome is unknown
    result: dict | None


@dataclass
class Result:
    ok: bool
    reason: str | None = None
    witness: list | None = None
    decided: bool = True
    explored: int = 0
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# The model: state = (exists, frozen value, version, pending).

INITIAL = (False, None, 0, 0)


def _freeze(value) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return "repr:" + repr(value)


def _is_int(value) -> bool:
    return type(value) is int


def _see(state, value, version):
    """The state after someone observed the current row as (frozen value, version), value None
    and version 0 meaning absent; None if that is not what the state holds."""
    exists, current, known, pending = state
    if not exists:
        return state if value is None and version == 0 else None
    if value != current:
        return None
    if pending == 0:
        return state if version == known else None
    if version >= known + pending:
        return (True, current, version, 0)
    return None


def _expect(state, expect):
    """The state, pinned, if the current version can equal `expect`; None if it cannot."""
    exists, current, known, pending = state
    if not exists:
        return state if expect == 0 else None
    if pending == 0:
        return state if expect == known else None
    return (True, current, expect, 0) if expect >= known + pending else None


def _write(state, exists, value, version):
    """A write that reported `version`: it must be above every version the key has had."""
    _, _, known, pending = state
    if version > known + pending:
        return (exists, value, version, 0)
    return None


def _unknown_write(state, exists, value):
    return (exists, value, state[2], state[3] + 1)


class _Spec:
    """One op, prepared for the search: values frozen, the answer unpacked."""

    __slots__ = ("op", "kind", "known", "value", "expect", "by", "low", "high", "applied",
                 "reason", "seen_value", "seen_version", "new_version", "new_value", "found")

    def __init__(self, op: Op):
        if op.kind not in KINDS:
            raise ValueError(f"unsupported operation kind {op.kind!r}")
        if op.complete is not None and op.complete < op.invoke:
            raise ValueError(f"operation completes before it is invoked: {op!r}")
        args = op.args or {}
        self.op = op
        self.kind = op.kind
        self.known = op.complete is not None
        self.value = _freeze(args["value"]) if "value" in args else None
        if op.kind in ("put", "putIfAbsent") and "value" not in args:
            raise ValueError(f"{op.kind} without a value: {op!r}")
        self.expect = args.get("expect")
        self.by = args.get("by", 1)
        self.low = args.get("min")
        self.high = args.get("max")
        self.applied = self.reason = self.seen_value = self.seen_version = None
        self.new_version = self.new_value = self.found = None
        if not self.known:
            return
        result = op.result
        if result is None:
            raise ValueError(f"a completed operation without a result: {op!r}")
        if op.kind == "get":
            self.found = bool(result.get("found"))
            self.seen_value = _freeze(result.get("value")) if self.found else None
            self.seen_version = result.get("version", 0) if self.found else 0
            return
        self.applied = bool(result.get("applied"))
        if self.applied:
            if "version" not in result:
                raise ValueError(f"an applied write without its version: {op!r}")
            self.new_version = result["version"]
            if op.kind == "incr":
                self.new_value = result.get("value")
            return
        self.reason = result.get("reason")
        allowed = {"put": {"version"}, "putIfAbsent": {"exists"}, "delete": {"absent", "version"},
                   "incr": {"version", "not_integer", "limit"}}[op.kind]
        if self.reason not in allowed:
            raise ValueError(f"unsupported miss reason {self.reason!r} for {op.kind}: {op!r}")
        if self.reason != "absent":
            current = result.get("current") or result
            value = current.get("value")
            self.seen_version = current.get("version", 0) or 0
            # Version 0 is an absent key (an incr's "limit" miss reports its value as 0 then).
            self.seen_value = None if self.seen_version == 0 else _freeze(value)


def _incr_target(spec: _Spec, current):
    """The incremented integer, or None if the incr would miss for 'limit'."""
    target = current + spec.by
    if ((spec.high is not None and target > spec.high) or (spec.low is not None and target < spec.low)
            or not INT64_MIN <= target <= INT64_MAX):
        return None
    return target


def _step(state, spec: _Spec):
    """The state after `spec` takes effect in `state`, or None if it cannot take effect there with
    the answer it got. For an unknown outcome, only the applied effect is offered: one that missed
    changed nothing, the same as never having taken effect."""
    kind = spec.kind
    if not spec.known:
        if kind == "get":
            return None
        if spec.expect is not None:
            state = _expect(state, spec.expect)
            if state is None:
                return None
        exists = state[0]
        if kind == "put":
            return _unknown_write(state, True, spec.value)
        if kind == "putIfAbsent":
            return None if exists else _unknown_write(state, True, spec.value)
        if kind == "delete":
            return _unknown_write(state, False, None) if exists else None
        current = json.loads(state[1]) if exists else 0
        if not _is_int(current):
            return None
        target = _incr_target(spec, current)
        return None if target is None else _unknown_write(state, True, _freeze(target))

    if kind == "get":
        if spec.found:
            return _see(state, spec.seen_value, spec.seen_version)
        return None if state[0] else state

    if not spec.applied:
        reason = spec.reason
        if reason == "absent":  # delete of an absent key (checked before any expect)
            return None if state[0] else state
        seen = _see(state, spec.seen_value, spec.seen_version)
        if seen is None:
            return None
        if reason == "version":
            if kind == "delete" and not seen[0]:
                return None  # the server answers "absent" first
            return seen if spec.expect is not None and spec.expect != spec.seen_version else None
        if reason == "exists":
            return seen if seen[0] else None
        # incr misses: the expect (if any) held, and then the value was wrong or out of bounds
        if spec.expect is not None and spec.expect != spec.seen_version:
            return None
        current = json.loads(seen[1]) if seen[0] else 0
        if reason == "not_integer":
            return seen if seen[0] and not _is_int(current) else None
        if not _is_int(current):
            return None
        return seen if _incr_target(spec, current) is None else None

    if spec.expect is not None:
        state = _expect(state, spec.expect)
        if state is None:
            return None
    exists = state[0]
    if kind == "put":
        return _write(state, True, spec.value, spec.new_version)
    if kind == "putIfAbsent":
        return None if exists else _write(state, True, spec.value, spec.new_version)
    if kind == "delete":
        return _write(state, False, None, spec.new_version) if exists else None
    current = json.loads(state[1]) if exists else 0
    if not _is_int(current):
        return None
    target = _incr_target(spec, current)
    if target is None or (spec.new_value is not None and spec.new_value != target):
        return None
    return _write(state, True, _freeze(target), spec.new_version)


# --------------------------------------------------------------------------------------------
# The search.


def _describe(op: Op) -> str:
    done = "unknown" if op.complete is None else f"{op.complete}"
    return (f"process {op.process} {op.kind}({op.args}) on {op.key!r} invoked {op.invoke} "
            f"completed {done} -> {op.result if op.complete is not None else '?'}")


def _state_text(state) -> str:
    exists, value, version, pending = state
    text = f"value={value} version={version}" if exists else f"absent (last version {version})"
    return text + (f" +{pending} unreported write(s)" if pending else "")


def check_key(ops: list[Op], budget: int = DEFAULT_BUDGET) -> Result:
    """Whether the operations on one key are linearizable; see the module docstring."""
    keys = {op.key for op in ops}
    if len(keys) > 1:
        raise ValueError(f"check_key got several keys: {sorted(keys)!r}")
    # Reads of unknown outcome constrain nothing.
    specs = [_Spec(op) for op in ops if not (op.complete is None and op.kind == "get")]
    count = len(specs)
    # Events: at equal times calls come before returns, which treats the two ops as concurrent
    # (the permissive reading: a clock tie cannot order them).
    events = []
    for index, spec in enumerate(specs):
        events.append((spec.op.invoke, 0, index))
        if spec.known:
            events.append((spec.op.complete, 1, index))
    events.sort()
    size = len(events)
    head, tail = 0, size + 1
    nxt = list(range(1, size + 2)) + [tail]
    prv = [0] + list(range(0, size + 1))
    is_call = [False] * (size + 2)
    op_of = [-1] * (size + 2)
    match = [-1] * (size + 2)  # call node -> its return node
    call_node = [0] * count
    for node, (_, kind, index) in enumerate(events, start=1):
        op_of[node] = index
        if kind == 0:
            is_call[node] = True
            call_node[index] = node
        else:
            match[call_node[index]] = node

    def lift(node):
        nxt[prv[node]] = nxt[node]
        prv[nxt[node]] = prv[node]
        other = match[node]
        if other >= 0:
            nxt[prv[other]] = nxt[other]
            prv[nxt[other]] = prv[other]

    def unlift(node):
        other = match[node]
        if other >= 0:
            nxt[prv[other]] = other
            prv[nxt[other]] = other
        nxt[prv[node]] = node
        prv[nxt[node]] = node

    known_left = sum(1 for spec in specs if spec.known)
    state = INITIAL
    known_mask = unknown_mask = 0  # the linearized ops, by outcome
    stack: list[tuple[int, tuple]] = []
    cache = set()  # (known ops linearized, unknown ops linearized, state) explored
    explored = 0
    best_depth, best = -1, None
    entry = nxt[head]
    while True:
        if known_left == 0:
            witness = [specs[op_of[node]].op for node, _ in stack]
            return Result(True, None, witness, True, explored)
        if entry == tail or not is_call[entry]:
            if entry != tail and len(stack) > best_depth:
                best_depth = len(stack)
                best = ([specs[op_of[node]].op for node, _ in stack], op_of[entry], state)
            if not stack:
                break
            node, previous = stack.pop()
            index = op_of[node]
            if specs[index].known:
                known_mask &= ~(1 << index)
                known_left += 1
            else:
                unknown_mask &= ~(1 << index)
            unlift(node)
            state = previous
            entry = nxt[node]
            continue
        index = op_of[entry]
        after = _step(state, specs[index])
        if after is not None:
            known = specs[index].known
            new_known = known_mask | (1 << index) if known else known_mask
            new_unknown = unknown_mask if known else unknown_mask | (1 << index)
            memo = (new_known, new_unknown, after)
            if memo not in cache:
                explored += 1
                if explored > budget:
                    return Result(False, f"undecided: gave up after {budget} configurations",
                                  best[0] if best else None, False, explored)
                cache.add(memo)
                stack.append((entry, state))
                state, known_mask, unknown_mask = after, new_known, new_unknown
                if known:
                    known_left -= 1
                lift(entry)
                entry = nxt[head]
                continue
        entry = nxt[entry]

    prefix, blocked, at = best
    reason = (f"not linearizable: no order fits {_describe(specs[blocked].op)}; the longest legal "
              f"order found takes {len(prefix)} op(s) and leaves the key {_state_text(at)}")
    return Result(False, reason, prefix, True, explored)


def check_history(ops: list[Op], budget: int = DEFAULT_BUDGET) -> dict[str, Result]:
    """Each key's operations checked on their own, by key."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    return {key: check_key(key_ops, budget) for key, key_ops in by_key.items()}
