"""The truth test: a real `queen serve`, several clients writing at once, SIGKILL at random moments.

After every restart:
  - every acknowledged write is there, unless a later write to the same key superseded it, and
    a later write is either acknowledged or was in flight when the kill came (an in-flight write
    may or may not have survived: both are correct);
  - every version handed out after the restart is higher than every version handed out before.

Bookkeeping. Values are unique strings, so a value read back names the one write that made it.
Per key and per round (the time between two restarts), the model keeps the acknowledged writes
with their versions and the unacknowledged ones (in flight at the kill). The row read after the
restart must be the highest acknowledged version with its value, or carry a higher version and a
value from an unacknowledged write. Counters work the same way on numbers: above the highest
acknowledged (version, value), only unacknowledged increments may have landed, so the value
can exceed it by at most their count. What a restart reads becomes the next round's baseline.

The seed is printed (pytest shows it on failure); set QUEEN_CRASH_SEED to replay a run's choices
(thread timing still varies, which is the point of running it often).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time

from queen.testing import ServerProcess

KILLS = 8
WORKERS = 4
NS = "crash"
PUT_KEYS = [f"p{i}" for i in range(32)]
COUNTERS = [f"c{i}" for i in range(8)]
BATCH_OPS = 64
# Small segments and snapshot thresholds, so kills also land in segment cuts and snapshots.
SERVER_ARGS = ("--segment-bytes-max", "65536", "--snapshot-wal-bytes", "131072")


class Attempt:
    """One request: its ops as ("put", key, value) or ("incr", key, by), and once answered 200,
    one (version, value) per op. An attempt left unanswered was in flight at the kill."""

    __slots__ = ("ops", "answers")

    def __init__(self, ops):
        self.ops = ops
        self.answers = None


class Worker(threading.Thread):
    """One client on one keep-alive connection, writing until the server goes away."""

    def __init__(self, port: int, rng: random.Random, tag: str):
        super().__init__(daemon=True)
        self.port = port
        self.rng = rng
        self.tag = tag
        self.attempts: list[Attempt] = []
        self.unexpected: list[str] = []

    def next_request(self, seq: int):
        rng = self.rng
        choice = rng.random()
        if choice < 0.5:
            ops, wire = [], []
            for i in range(BATCH_OPS):
                if rng.random() < 0.75:
                    key, value = rng.choice(PUT_KEYS), f"{self.tag}.{seq}.{i}"
                    ops.append(("put", key, value))
                    wire.append({"op": "put", "ns": NS, "key": key, "value": value, "forever": True})
                else:
                    key = rng.choice(COUNTERS)
                    ops.append(("incr", key, 1))
                    wire.append({"op": "incr", "ns": NS, "key": key, "forever": True})
            return ops, "POST", "/api/v1/kv", {"operations": wire}
        if choice < 0.8:
            key, value = rng.choice(PUT_KEYS), f"{self.tag}.{seq}"
            return [("put", key, value)], "PUT", f"/api/v1/kv/{NS}/{key}", {"value": value, "forever": True}
        key = rng.choice(COUNTERS)
        return [("incr", key, 1)], "POST", f"/api/v1/kv/{NS}/{key}/incr", {"forever": True}

    def run(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            for seq in range(1_000_000):
                ops, method, path, body = self.next_request(seq)
                attempt = Attempt(ops)
                self.attempts.append(attempt)  # in flight from here until answered
                try:
                    connection.request(method, path, body=json.dumps(body).encode(),
                                       headers={"content-type": "application/json"})
                    response = connection.getresponse()
                    raw = response.read()
                except (OSError, http.client.HTTPException):
                    return  # the server was killed; this attempt stays unanswered
                if response.status != 200:
                    self.unexpected.append(f"{method} {path} answered {response.status}: {raw[:300]!r}")
                    return
                document = json.loads(raw)
                results = document["results"] if path == "/api/v1/kv" else [document]
                if not all(result["applied"] for result in results):
                    self.unexpected.append(f"{method} {path} not applied: {raw[:300]!r}")
                    return
                attempt.answers = [(result["version"], op[2] if op[0] == "put" else result["value"])
                                   for op, result in zip(ops, results, strict=True)]
        finally:
            connection.close()


class Model:
    """What the durable state may be, and every version handed out so far."""

    def __init__(self):
        self.rows: dict[str, tuple[int, object]] = {}  # key -> (version, value) read after a restart
        self.versions_handed_out: set[int] = set()
        self.highest_before_restart = 0
        self.acknowledged_total = 0
        self.in_flight_total = 0

    def check_round(self, attempts: list[Attempt], observed: dict[str, dict], context: str) -> None:
        acknowledged: dict[str, list] = {}
        unacknowledged: dict[str, list] = {}
        round_versions = []
        for attempt in attempts:
            if attempt.answers is None:
                self.in_flight_total += 1
                for op in attempt.ops:
                    unacknowledged.setdefault(op[1], []).append(op)
                continue
            self.acknowledged_total += 1
            for op, (version, value) in zip(attempt.ops, attempt.answers, strict=True):
                acknowledged.setdefault(op[1], []).append((version, value))
                round_versions.append(version)

        # Versions: fresh, and above everything handed out before the restart that began this round.
        assert len(set(round_versions)) == len(round_versions), f"a version was handed out twice; {context}"
        assert not self.versions_handed_out & set(round_versions), f"a version was handed out again after a restart; {context}"
        if round_versions:
            assert min(round_versions) > self.highest_before_restart, (
                f"version {min(round_versions)} handed out after a restart is not above "
                f"{self.highest_before_restart} handed out before it; {context}")
        self.versions_handed_out.update(round_versions)

        for key in PUT_KEYS + COUNTERS:
            base = max(acknowledged.get(key, []), default=self.rows.get(key, (0, None)))
            row = observed[key]
            pending = unacknowledged.get(key, [])
            where = f"key {key}: read {row}, highest acknowledged (version, value) {base}, in flight {pending}; {context}"
            if not row["found"]:
                assert base[0] == 0, f"an acknowledged write is missing: {where}"
                continue
            assert row["version"] >= base[0], f"an acknowledged write was lost (version went back): {where}"
            if row["version"] == base[0]:
                assert row["value"] == base[1], f"the acknowledged version holds another value: {where}"
            elif key in COUNTERS:
                landed = row["value"] - (base[1] or 0)
                assert 1 <= landed <= len(pending), f"counter moved by more than the increments in flight: {where}"
            else:
                assert row["value"] in {op[2] for op in pending}, f"value above the acknowledged one is not from an in-flight write: {where}"
            self.rows[key] = (row["version"], row["value"])

        self.highest_before_restart = max([self.highest_before_restart, *round_versions,
                                           *(version for version, _ in self.rows.values())])


def read_all(server: ServerProcess) -> dict[str, dict]:
    status, document = server.request("POST", "/api/v1/kv", {"operations": [
        {"op": "getMany", "ns": NS, "keys": PUT_KEYS + COUNTERS}]})
    assert status == 200, document
    return {item["key"]: item for item in document["results"][0]["items"]}


def test_acknowledged_writes_survive_sigkill_and_versions_keep_rising(tmp_path):
    seed = int(os.environ.get("QUEEN_CRASH_SEED", random.randrange(1 << 32)))
    print(f"QUEEN_CRASH_SEED={seed}")
    rng = random.Random(seed)
    model = Model()
    server = ServerProcess(str(tmp_path / "data"), *SERVER_ARGS).start()
    try:
        for round_no in range(KILLS):
            context = f"seed {seed}, round {round_no}"
            workers = [Worker(server.port, random.Random(rng.random()), f"r{round_no}w{w}") for w in range(WORKERS)]
            for worker in workers:
                worker.start()
            time.sleep(rng.uniform(0.05, 0.6))  # the random moment of the crash: the point of this test
            server.kill()
            for worker in workers:
                worker.join(30)
                assert not worker.is_alive(), f"a client hung after the kill; {context}"
                assert not worker.unexpected, f"{worker.unexpected}; {context}"

            server = ServerProcess(server.data_dir, *SERVER_ARGS).start()
            attempts = [attempt for worker in workers for attempt in worker.attempts]
            model.check_round(attempts, read_all(server), context)

        # One clean write after the last restart, then a clean shutdown.
        status, answer = server.request("PUT", f"/api/v1/kv/{NS}/after", {"value": "after", "forever": True})
        assert status == 200 and answer["version"] > model.highest_before_restart, f"{answer}; seed {seed}"
        assert server.stop() == 0, "SIGTERM must shut down cleanly"
    finally:
        server.kill()
    # The test means something only if the kills caught writes both answered and in flight.
    assert model.acknowledged_total >= 100, f"only {model.acknowledged_total} acknowledged calls; seed {seed}"
    assert model.in_flight_total >= 1, f"no kill caught a write in flight; seed {seed}"
