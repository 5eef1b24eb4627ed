"""Client worker processes for the failover tests: each a bounded workload against a list of node
URLs, logging one JSON line per event to its own file.

A worker is a process (`python -m tests.cluster.harness.workers ...`), so a test can SIGSTOP it (a
client paused across a failover, N10) and so its clients truly run beside the servers. Every call
is logged as `invoke`, then one of `ok` (answered 2xx), `fail` (definitely not applied: a 4xx, or
a refusal that applied nothing after the worker gave up following the leader) or `info` (outcome
unknown: the connection broke or timed out on a write). Each line carries `t` (time.monotonic()
in ms, one clock for every process of the machine), `wall` (ms since the epoch: lease ends and
timer times are the server's wall clock), the answering node and its `X-Queen-Epoch`, and the
whole answer, so every version, token and fence is in the log.

Workloads (`--kind`):
  W1  CAS registers: keys h/r0..r4; get, and put with expect (the last version this worker saw).
  W2  locks: two locks (limit 1) and a 2-permit semaphore, ttl 3 s (--lock-ttl-s); a holder writes
      (fence, owner) to the fenced store (tests/cluster/harness/workers.FencedStore), then runs a
      guarded transaction (guard on its token + put work/<permit>), then releases.
  W3  counters: incr with max on keys h/c0..c1.
  W4  queue hq: push with transactionId, pop, ack; timers on queue ht at now + 1-3 s; at the end
      it drains both (until every timer it scheduled is due and two pops come back empty).
  R1  reads only: get on W1's registers and W3's counters, from one node (`--pinned`), until
      stopped (SIGTERM: it ends after the call under way) or --ops run out.

Leader following, as the SDK does it: the worker keeps the node that last answered; a 307 is
followed once (method and body kept); a 503 no_leader / not_leader (nothing applied) is retried on
the next node after its Retry-After, within the call's deadline; a connection error moves to the
next node, and on a write it ends the call as `info`.

Pinned (`--pinned`, one URL): a client stuck on one side of a partition with that node. It follows
nobody: a redirect or a refusal is a `fail`, a broken or timed-out read a `fail` after a short
pause (the node is not asked again at once).
"""

from __future__ import annotations

import argparse
import fcntl
import http.client
import json
import math
import os
import random
import signal
import sys
import time
from urllib.parse import urlsplit

REGISTERS = [f"r{i}" for i in range(5)]
COUNTERS = ["c0", "c1"]
LOCKS = {"L0": 1, "L1": 1, "S": 2}
LOCK_TTL_S = 3
QUEUE, TIMER_QUEUE = "hq", "ht"
KV_NS = "h"
REFUSALS = ("no_leader", "not_leader")
STOP_AT = float("inf")  # time.monotonic() after which a workload starts no new operation
PACE_S = 0.0  # mean pause before each operation: spreads a workload over the fault and the failover
CALL_DEADLINE_S = 8.0
REQUEST_TIMEOUT_S = 3.0


def mono_ms() -> float:
    return time.monotonic() * 1000


def wall_ms() -> int:
    return int(time.time() * 1000)


class Unknown(Exception):
    """The call's outcome is unknown (a write whose connection broke or timed out)."""


class Refused(Exception):
    """The call was definitely not applied: (status, body)."""

    def __init__(self, status: int, body):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class Nodes:
    """A blocking JSON client over a list of node URLs that follows the leader."""

    def __init__(self, urls: list[str], rng: random.Random, pinned: bool = False):
        self.urls = list(urls)
        self.pinned = pinned  # one node, never another (module docstring)
        self.current = rng.randrange(len(self.urls))
        self.connections: dict[str, http.client.HTTPConnection] = {}
        self.epoch: int | None = None
        self.node: str | None = None
        self.backoff_s = 0.0  # after transport errors on writes: doubles up to 1 s, reset by an answer

    def _connection(self, base: str) -> http.client.HTTPConnection:
        connection = self.connections.get(base)
        if connection is None:
            parts = urlsplit(base)
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=REQUEST_TIMEOUT_S)
            self.connections[base] = connection
        return connection

    def _drop(self, base: str) -> None:
        connection = self.connections.pop(base, None)
        if connection is not None:
            connection.close()

    def _once(self, base: str, method: str, path: str, body: bytes | None):
        connection = self._connection(base)
        try:
            connection.request(method, path, body, {"content-type": "application/json"})
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self._drop(base)
            raise
        epoch = response.getheader("x-queen-epoch")
        if epoch is not None and epoch.isdigit():
            self.epoch = int(epoch)
        return response.status, response.getheader("location"), response.getheader("retry-after"), data

    def call(self, method: str, path: str, document=None, *, write: bool):
        """The decoded 2xx answer; Refused (nothing applied) or Unknown (a write that may have applied)."""
        body = None if document is None else json.dumps(document).encode()
        deadline = time.monotonic() + CALL_DEADLINE_S
        while True:
            base = self.urls[self.current]
            try:
                status, location, retry_after, data = self._once(base, method, path, body)
                if status == 307 and location and not self.pinned:
                    target = location[:-len(path)] if location.endswith(path) else base
                    status, location, retry_after, data = self._once(target, method, path, body)
                    if target in self.urls:
                        self.current = self.urls.index(target)
                    base = target
            except (OSError, http.client.HTTPException) as error:
                self.current = (self.current + 1) % len(self.urls)
                if write:
                    # A client backs off after a transport error, as the SDK would: no busy loop of
                    # outcome-unknown writes through an outage (each one multiplies what the
                    # linearizability checker must search).
                    self.backoff_s = min(1.0, max(0.05, self.backoff_s * 2))
                    time.sleep(self.backoff_s)
                    raise Unknown(repr(error)) from None
                if self.pinned:
                    time.sleep(0.05)  # not at once at a node that is down or restarting
                if self.pinned or time.monotonic() >= deadline:
                    raise Refused(0, repr(error)) from None
                continue
            self.node = base
            self.backoff_s = 0.0
            try:
                answer = json.loads(data) if data else None
            except ValueError:
                answer = data.decode(errors="replace")
            if 200 <= status < 300:
                return answer
            code = answer.get("code") if isinstance(answer, dict) else None
            if (status == 307 or (status == 503 and code in REFUSALS)) and not self.pinned:
                self.current = (self.current + 1) % len(self.urls)
                precise_ms = answer.get("details", {}).get("retryAfterMs") if code else None
                wait = min(precise_ms / 1000 if isinstance(precise_ms, int) else float(retry_after or 0.1), 1.0)
                if time.monotonic() + wait < deadline:
                    time.sleep(wait)  # the server said when to come back (Retry-After)
                    continue
                raise Refused(status, answer)
            if status == 503 and write:
                raise Unknown(f"503 {code}")  # not_durable and the like: may have applied
            raise Refused(status, answer)

    def close(self) -> None:
        for base in list(self.connections):
            self._drop(base)


class Log:
    def __init__(self, path: str, worker: str):
        self.file = open(path, "a", buffering=1)
        self.worker = worker
        self.n = 0

    def write(self, **fields) -> None:
        self.file.write(json.dumps({"w": self.worker, "t": mono_ms(), "wall": wall_ms(), **fields}) + "\n")

    def run(self, nodes: Nodes, f: str, method: str, path: str, document=None, *, write: bool, **meta):
        """Log the invoke, make the call, log its outcome; the answer, or None when not ok."""
        if PACE_S:
            time.sleep(random.uniform(0, 2 * PACE_S))
        self.n += 1
        op = self.n
        self.write(op=op, type="invoke", f=f, body=document, path=path, **meta)
        try:
            answer = nodes.call(method, path, document, write=write)
        except Unknown as error:
            self.write(op=op, type="info", f=f, error=str(error), node=nodes.node, epoch=nodes.epoch, **meta)
            return None
        except Refused as error:
            self.write(op=op, type="fail", f=f, status=error.status, error=error.body, node=nodes.node,
                       epoch=nodes.epoch, **meta)
            return None
        self.write(op=op, type="ok", f=f, result=answer, node=nodes.node, epoch=nodes.epoch, **meta)
        return answer


class FencedStore:
    """The external resource a lock protects, kept by the harness: per permit, a file holding the
    highest fence it accepted. A write with a lower fence is refused. Shared by every worker
    process through flock; each decision is appended to a log the checkers read."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def write(self, permit: str, fence: int, owner: str) -> bool:
        path = os.path.join(self.directory, f"{permit}.fence")
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read().strip()
            highest = int(text) if text else 0
            accepted = fence >= highest
            if accepted:
                f.seek(0)
                f.truncate()
                f.write(str(fence))
            with open(os.path.join(self.directory, "store.jsonl"), "a") as log:
                log.write(json.dumps({"permit": permit, "fence": fence, "owner": owner, "accepted": accepted,
                                      "highest": highest, "t": mono_ms()}) + "\n")
            return accepted


def kv_op(op: dict) -> dict:
    return {"operations": [op]}


def run_w1(nodes: Nodes, log: Log, rng: random.Random, ops: int) -> None:
    seen: dict[str, int] = {}
    for n in range(ops):
        if time.monotonic() > STOP_AT:
            break
        key = rng.choice(REGISTERS)
        if rng.random() < 0.5:
            answer = log.run(nodes, "get", "POST", "/api/v1/kv", kv_op({"op": "get", "ns": KV_NS, "key": key}),
                             write=False, key=key)
            if answer is not None:
                row = answer["results"][0]
                seen[key] = row.get("version", 0) if row.get("found") else 0
        else:
            value = f"{log.worker}-{n}"
            expect = seen.get(key, 0)
            answer = log.run(nodes, "put", "POST", "/api/v1/kv",
                             kv_op({"op": "put", "ns": KV_NS, "key": key, "value": value, "expect": expect,
                                    "forever": True}), write=True, key=key, value=value, expect=expect)
            if answer is not None:
                row = answer["results"][0]
                seen[key] = row["version"] if row.get("applied") else row.get("current", {}).get("version", 0)


def run_r1(nodes: Nodes, log: Log, rng: random.Random, ops: int) -> None:
    for _ in range(ops):
        if time.monotonic() > STOP_AT:
            break
        key = rng.choice(REGISTERS + COUNTERS)
        log.run(nodes, "get", "POST", "/api/v1/kv", kv_op({"op": "get", "ns": KV_NS, "key": key}), write=False,
                key=key)


def run_w2(nodes: Nodes, log: Log, rng: random.Random, ops: int, store: FencedStore, hold_s: float,
           ttl_s: int = LOCK_TTL_S, names: list[str] | None = None) -> None:
    for n in range(ops):
        if time.monotonic() > STOP_AT:
            break
        name = rng.choice(names or sorted(LOCKS))
        owner = f"{log.worker}-{n}"
        acquire = {"op": "acquire", "name": name, "owner": owner, "ttlSeconds": ttl_s, "waitMs": 1000}
        if LOCKS[name] != 1:
            acquire["limit"] = LOCKS[name]
        answer = log.run(nodes, "acquire", "POST", "/api/v1/locks", {"operations": [acquire]}, write=True,
                         name=name, owner=owner)
        if answer is None or not answer["results"][0].get("acquired"):
            continue
        grant = answer["results"][0]
        slot, token, fence = grant["slot"], grant["token"], grant["fence"]
        permit = f"{name}#{slot}"
        if hold_s:
            time.sleep(hold_s)  # a holder doing its work (the test may SIGSTOP it here)
        accepted = store.write(permit, fence, owner)
        log.write(op=0, type="store", name=name, slot=slot, owner=owner, fence=fence, accepted=accepted)
        guard = {"op": "check", "ns": "queen-locks", "key": permit, "expect": token}
        log.run(nodes, "guarded", "POST", "/api/v1/transaction",
                {"kv": [guard, {"op": "put", "ns": KV_NS, "key": f"work/{permit}", "value": owner, "forever": True}]},
                write=True, name=name, slot=slot, owner=owner, fence=fence, token=token)
        log.run(nodes, "release", "POST", "/api/v1/locks",
                {"operations": [{"op": "release", "name": name, "slot": slot, "token": token, "owner": owner}]},
                write=True, name=name, slot=slot, owner=owner)


def run_w3(nodes: Nodes, log: Log, rng: random.Random, ops: int) -> None:
    for _ in range(ops):
        if time.monotonic() > STOP_AT:
            break
        key = rng.choice(COUNTERS)
        log.run(nodes, "incr", "POST", "/api/v1/kv",
                kv_op({"op": "incr", "ns": KV_NS, "key": key, "by": 1, "max": 1_000_000, "forever": True}),
                write=True, key=key, by=1, max=1_000_000)


DRAIN_RETRY_S = 0.1  # W4's drain, after a pop that got no answer


def _pop(nodes: Nodes, log: Log, queue: str, wait_ms: int, auto_ack: bool) -> dict | None:
    query = f"batch=10&waitMs={wait_ms}" + ("&autoAck=true&partitions=3" if auto_ack else "")
    return log.run(nodes, "pop", "GET", f"/api/v1/pop/queue/{queue}?{query}", write=True, queue=queue)


def _consume(nodes: Nodes, log: Log, wait_ms: int) -> bool:
    answer = _pop(nodes, log, QUEUE, wait_ms, False)
    if answer is None or not answer.get("success") or not answer.get("messages"):
        return False
    for message in answer["messages"]:
        log.run(nodes, "ack", "POST", "/api/v1/ack", {"partitionId": message["partitionId"],
                                                       "leaseId": answer["leaseId"], "offset": message["offset"],
                                                       "status": "completed"},
                write=True, transaction_id=message.get("transactionId"), lease_id=answer["leaseId"])
    return True


def run_w4(nodes: Nodes, log: Log, rng: random.Random, ops: int) -> None:
    log.run(nodes, "configure", "POST", "/api/v1/configure",
            {"queue": QUEUE, "options": {"leaseTimeSeconds": 2, "retryLimit": 1000}}, write=True)
    latest_at = 0
    for n in range(ops):
        if time.monotonic() > STOP_AT:
            break
        roll = rng.random()
        if roll < 0.4:
            transaction_id = f"{log.worker}-m{n}"
            log.run(nodes, "push", "POST", "/api/v1/push",
                    {"items": [{"queue": QUEUE, "partition": f"p{n % 3}", "payload": {"n": n},
                                "transactionId": transaction_id}]},
                    write=True, transaction_id=transaction_id)
        elif roll < 0.7:
            _consume(nodes, log, 100)
        else:
            key = f"{log.worker}-t{n}"
            at = wall_ms() + rng.randrange(1000, 3000)
            latest_at = max(latest_at, at)
            log.run(nodes, "schedule", "POST", "/api/v1/timers",
                    {"operations": [{"op": "schedule", "queue": TIMER_QUEUE, "key": key, "at": at,
                                     "partition": f"p{n % 3}", "payload": {"m": key}}]},
                    write=True, key=key, at=at, marker=key)
    # Drain: until every timer scheduled here is due, then two empty pops of each queue.
    # Bounded by time, not by a count of pops: during a failover every call fails fast (a dead
    # leader's proxy resets the connection), and a counted loop would end before the new leader
    # serves, leaving delivered-but-unanswered messages undrained (a false "lost").
    empty = 0
    while time.monotonic() < STOP_AT + 30:
        timers = _pop(nodes, log, TIMER_QUEUE, 200, True)
        fired = bool(timers and timers.get("messages"))
        consumed = _consume(nodes, log, 200)
        if timers is None:
            time.sleep(DRAIN_RETRY_S)  # polling real nodes: between leaders, ask again shortly, not at once
            empty = 0
            continue
        if wall_ms() > latest_at + 200 and not fired and not consumed:
            empty += 1
            if empty == 2:
                break
        else:
            empty = 0


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class WorkerProcess:
    """A worker, started from the test: `WorkerProcess("W1", urls, work_dir, "w1-0").start()`."""

    def __init__(self, kind: str, urls: list[str], work_dir: str, name: str, *, ops: int = 50, seed: int = 0,
                 hold_s: float = 0.0, lock_ttl_s: int = LOCK_TTL_S, deadline_s: float = 90.0,
                 locks: tuple = (), pinned: bool = False, pace_ms: float | None = None):
        self.kind, self.name = kind, name
        self.log_path = os.path.join(work_dir, f"{name}.jsonl")
        self.argv = [sys.executable, "-m", "tests.cluster.harness.workers", "--kind", kind, "--urls", ",".join(urls),
                     "--ops", str(ops), "--seed", str(seed), "--name", name, "--log", self.log_path,
                     "--store", os.path.join(work_dir, "fenced-store"), "--hold-s", str(hold_s),
                     "--lock-ttl-s", str(lock_ttl_s), "--deadline-s", str(deadline_s),
                     "--locks", ",".join(locks)]
        if pinned:
            self.argv.append("--pinned")
        if pace_ms is not None:
            self.argv += ["--pace-ms", str(pace_ms)]
        self.process = None

    def start(self) -> WorkerProcess:
        import subprocess

        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.log_path + ".err", "ab") as err:
            self.process = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Ask it to end after the call under way (SIGTERM); wait() then sees it exit 0."""
        self.process.send_signal(signal.SIGTERM)

    def events(self) -> list[dict]:
        return read_log(self.log_path)

    def wait(self, timeout_s: float = 120.0) -> int:
        code = self.process.wait(timeout_s)
        assert code == 0, f"worker {self.name} exited {code}: {open(self.log_path + '.err').read()[-2000:]}"
        return code

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def read_log(path: str) -> list[dict]:
    """A worker's events; a last line cut by a kill is left out."""
    events = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("W1", "W2", "W3", "W4", "R1"), required=True)
    parser.add_argument("--urls", required=True, help="comma-separated node URLs")
    parser.add_argument("--ops", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--store", help="the fenced store's directory (W2)")
    parser.add_argument("--hold-s", type=float, default=0.0, help="W2: how long a holder works before writing")
    parser.add_argument("--lock-ttl-s", type=int, default=LOCK_TTL_S, help="W2: the locks' ttlSeconds")
    parser.add_argument("--locks", default="", help="W2: the lock names it takes (comma-separated; default all)")
    parser.add_argument("--deadline-s", type=float, default=90.0,
                        help="no new operation starts after this long (a stalled cluster must not hold a test)")
    parser.add_argument("--pace-ms", type=float, default=80.0,
                        help="mean pause before each operation (0: as fast as answers come); without it a "
                             "workload is over in half a second, before the fault strikes")
    parser.add_argument("--pinned", action="store_true",
                        help="ask only the one node in --urls: follow no redirect, retry no refusal")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    global STOP_AT, PACE_S
    STOP_AT = time.monotonic() + args.deadline_s
    PACE_S = args.pace_ms / 1000

    def stop(*_) -> None:  # SIGTERM: no new operation (the one under way ends as it would)
        global STOP_AT
        STOP_AT = -math.inf

    signal.signal(signal.SIGTERM, stop)
    nodes = Nodes(args.urls.split(","), rng, pinned=args.pinned)
    log = Log(args.log, args.name)
    log.write(op=0, type="start", kind=args.kind, pid=os.getpid())
    try:
        if args.kind == "W1":
            run_w1(nodes, log, rng, args.ops)
        elif args.kind == "W2":
            run_w2(nodes, log, rng, args.ops, FencedStore(args.store), args.hold_s, args.lock_ttl_s,
                   [name for name in args.locks.split(",") if name])
        elif args.kind == "W3":
            run_w3(nodes, log, rng, args.ops)
        elif args.kind == "W4":
            run_w4(nodes, log, rng, args.ops)
        else:
            run_r1(nodes, log, rng, args.ops)
    finally:
        log.write(op=0, type="end")
        nodes.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
