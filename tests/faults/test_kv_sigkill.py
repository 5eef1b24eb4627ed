"""KV linearizability across SIGKILL (promises P1 and P2 for KV): concurrent clients read, write,
compare-and-set and count on a few keys of a real `queen serve` while it is killed and
restarted; their history, with every answer and every outcome a kill left unknown, must be
linearizable per key (tests/faults/linearizability.py). The same recorded history with one read
made stale must be rejected, so the check is seen to bite on real histories.

Time: clients wait on the real process (answers, restarts); nothing sleeps for time to pass.
"""

from __future__ import annotations

import random
import threading
import time

from queen.testing import ServerProcess
from tests.faults.killing import JsonClient, Target, kill_while_running
from tests.faults.linearizability import Op, check_history

SEED = 20261130
CLIENTS = 4
OPS_PER_CLIENT = 150
KILLS = 3
REGISTERS = ("r0", "r1")
COUNTER = "c0"


class Recorder:
    """Every operation a client invoked, with its answer or an unknown outcome."""

    def __init__(self):
        self.ops: list[Op] = []
        self.lock = threading.Lock()
        self.last_version: dict[str, int] = {}

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)


def next_op(rng: random.Random, process: int, n: int, last_version: dict) -> tuple[str, str, dict, dict]:
    """(kind, key, args for the checker, the wire operation)."""
    if rng.random() < 0.25:
        if rng.random() < 0.5:
            return "get", COUNTER, {}, {"op": "get", "ns": "f", "key": COUNTER}
        return "incr", COUNTER, {"by": 1}, {"op": "incr", "ns": "f", "key": COUNTER, "by": 1, "forever": True}
    key = rng.choice(REGISTERS)
    roll = rng.random()
    value = f"p{process}-{n}"
    if roll < 0.45:
        return "get", key, {}, {"op": "get", "ns": "f", "key": key}
    if roll < 0.75:
        return "put", key, {"value": value}, {"op": "put", "ns": "f", "key": key, "value": value, "forever": True}
    if roll < 0.9:
        expect = last_version.get(key, 0)
        return ("put", key, {"value": value, "expect": expect},
                {"op": "put", "ns": "f", "key": key, "value": value, "expect": expect, "forever": True})
    return "delete", key, {}, {"op": "delete", "ns": "f", "key": key}


def client(target: Target, process: int, recorder: Recorder) -> None:
    rng = random.Random(SEED * 31 + process)
    seen: dict[str, int] = {}
    connection = JsonClient(target, "/api/v1/kv")
    for n in range(OPS_PER_CLIENT):
        kind, key, args, wire = next_op(rng, process, n, seen)
        invoke = time.monotonic()
        result = connection.call(wire)
        if result is None:  # unknown outcome (a read's is simply dropped: it changed nothing)
            if kind != "get":
                recorder.add(Op(process, kind, key, args, invoke, None, None))
            continue
        recorder.add(Op(process, kind, key, args, invoke, time.monotonic(), result))
        if "version" in result and result.get("found", result.get("applied", True)):
            seen[key] = result["version"]
    connection.close()


def test_kv_history_across_sigkills_is_linearizable(tmp_path):
    rng = random.Random(SEED)
    recorder = Recorder()
    target = Target(ServerProcess(str(tmp_path / "data")).start())
    threads = [threading.Thread(target=client, args=(target, p, recorder), daemon=True) for p in range(CLIENTS)]
    kill_while_running(target, threads, lambda: len(recorder.ops), KILLS, rng, (40, 120))
    ops = recorder.ops
    unknown = sum(op.complete is None for op in ops)
    results = check_history(ops)
    print(f"kv linearizability: {len(ops)} ops on {len(results)} keys, {unknown} of unknown outcome, {KILLS} SIGKILLs")
    assert len(ops) > CLIENTS * OPS_PER_CLIENT * 0.8
    for key, result in results.items():
        assert result.decided and result.ok, (key, result.reason)

    # The same history with one acknowledged read made stale must be rejected.
    reads = [i for i, op in enumerate(ops) if op.kind == "get" and op.key in REGISTERS and op.result
             and op.result.get("found") and op.result["version"] > 1]
    target = reads[len(reads) // 2]
    bad = ops[target]
    stale = Op(bad.process, bad.kind, bad.key, bad.args, bad.invoke, bad.complete,
               {**bad.result, "version": 1, "value": "never-written"})
    tampered = ops[:target] + [stale] + ops[target + 1:]
    assert not check_history([op for op in tampered if op.key == bad.key])[bad.key].ok
