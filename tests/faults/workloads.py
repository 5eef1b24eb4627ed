"""The fault suite's workloads: concurrent clients of a real server that is crashed (SIGKILL, or
SIGKILL and power loss) and restarted under them, each history handed to its checker.

Each workload is `run_<name>(work_dir, seed, kills, control="", scale=1.0) -> Outcome`: it starts
its own server (tests/faults/sut.py) in work_dir, drives it, stops it, and checks. Everything
random comes from `seed`; the moments of the crashes depend on the real process too, so a seed
replays the same workload and the same crash plan, not the same interleaving.

- kv: reads, writes, compare-and-set and counters on a few keys; linearizable per key (P1, P2).
- locks: a lock and a 2-permit semaphore; holders renew, release, or walk away and let the lease
  run out; each holder appends itself to a list under its lock's guard. Never more holders than
  permits inside the leases they were told, tokens and fences rising (P2, P3, P6), and no
  guarded append lost or taken twice (set-full, P4).
- queues: producers push unique transactionIds, retrying some; consumers pop, ack completed or
  failed, or walk away from their lease. Nothing acknowledged lost, no duplicate, nothing
  delivered after its completion, and no partition leased to two consumers at once (P1, P6).
- timers: keys scheduled, moved and cancelled; the timer queue consumed. Never early, exactly
  once, never after a cancel or a move (P1, P5).
- recurring: timers firing once per period (everyMs) into their partitions, consumed with leases
  and acks. Each period's message exactly once (named by its period, deduplicated by the
  partition), never early, none skipped but those a downtime merges into one catch-up fire, and
  none after the cancel (P1, P5).
- transactions: a chain of steps, each putting a row, acking a held message, pushing a message,
  scheduling a timer and cancelling the previous step's: every step all or nothing, every
  acknowledged one there (P1, P10).

Times are the wall clock in ms on both sides (one machine); checkers allow TOLERANCE_MS. Nothing
sleeps for time to pass: clients wait on the real process (answers, long polls, restarts).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from queen.auth import AuthFile
from queen.testing import ServerProcess
from tests.faults.checkers import (
    Ack,
    Add,
    Cancel,
    Delivery,
    Grant,
    LostPop,
    PeriodDelivery,
    Push,
    Read,
    Recurrence,
    Release,
    Renewal,
    Schedule,
    Step,
    TimerDelivery,
    TxnState,
    ack_answer,
    check_leases,
    check_recurring,
    check_set_full,
    check_timers,
    check_total_queue,
    check_transactions,
    partition_grant,
    partition_release,
    pop_deliveries,
)
from tests.faults.killing import JsonClient, Target, kill_while_running
from tests.faults.linearizability import Op, check_history

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE_MS = 10
# Small segments and frequent snapshots, so runs cross segment cuts (new files, directory fsyncs)
# and snapshot rewrites, not only appends.
SERVER_ARGS = ("--segment-bytes-max", str(256 << 10), "--snapshot-wal-bytes", str(128 << 10))
# Set (to anything) to run every workload against a server with an auth file, its clients with a token.
AUTH_VARIABLE = "QUEEN_FAULTS_WITH_AUTH"
AUTH_SECRETS: dict[str, str] = {}  # auth file -> the clients' secret


@dataclass
class Outcome:
    """What one run of a workload did and found."""

    workload: str
    seed: int
    control: str = ""
    ops: int = 0
    histories: int = 0
    faults: Counter = field(default_factory=Counter)
    violations: list = field(default_factory=list)
    promises: tuple = ()
    detail: str = ""

    def summary(self) -> str:
        faults = ", ".join(f"{n} {kind}" for kind, n in sorted(self.faults.items())) or "no crash"
        return (f"{self.workload} seed={self.seed}{' control=' + self.control if self.control else ''}: "
                f"{self.ops} ops, {self.histories} histories, {faults}, {len(self.violations)} violations "
                f"[{' '.join(self.promises)}] {self.detail}").rstrip()


# The runs of this process, (outcome, caught): caught is None for a workload run, True or False
# for a negative control. The pytest summary (tests/faults/conftest.py) prints them.
OUTCOMES: list = []


def now_ms() -> int:
    return int(time.time() * 1000)


def start_target(work_dir: str, control: str = "", power: bool = True, env: dict | None = None) -> Target:
    """A server under test in work_dir/data, its power-loss journal in work_dir/journal."""
    os.makedirs(work_dir, exist_ok=True)
    journal = os.path.join(work_dir, "journal") if power else None
    server_env = {"PYTHONPATH": REPO, "QUEEN_FAULT_CONTROL": control, **(env or {})}
    if journal:
        server_env["QUEEN_FAULT_JOURNAL"] = journal
    args, headers = list(SERVER_ARGS), {}
    if os.environ.get(AUTH_VARIABLE):
        # Every client a writer of a named tenant: its names are stored under the tenant's prefix,
        # so the promises are checked through the tenant's names as well.
        path = os.path.join(work_dir, "auth.json")
        auth_file = AuthFile.load(path, missing_ok=True)
        if not auth_file.tokens:
            AUTH_SECRETS[path] = auth_file.add("faults", "writer", "faults")
            auth_file.save()
        args += ["--auth-file", path]
        headers = {"authorization": f"Bearer {AUTH_SECRETS[path]}"}
    server = ServerProcess(os.path.join(work_dir, "data"), *args, env=server_env, module="tests.faults.sut")
    target = Target(server.start(), journal)
    target.headers = headers
    return target


class Clients:
    """Client threads whose exceptions are kept (a thread's assert must fail the run, not vanish)."""

    def __init__(self):
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def add(self, fn, *args) -> None:
        def run():
            try:
                fn(*args)
            except BaseException as error:  # noqa: BLE001 - reported as a violation
                self.errors.append(f"{fn.__name__}: {error!r}")

        self.threads.append(threading.Thread(target=run, daemon=True))


def _finish(outcome: Outcome, target: Target, clients: Clients) -> Outcome:
    outcome.faults.update(target.faults)
    outcome.violations += target.unexpected_exits
    outcome.violations += [{"kind": "client_error", "error": error} for error in clients.errors]
    return outcome


# -- KV ------------------------------------------------------------------------------------------

REGISTERS = ("r0", "r1", "r2")
COUNTER = "c0"


def _kv_op(rng: random.Random, process: int, n: int, seen: dict) -> tuple[str, str, dict, dict]:
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
        expect = seen.get(key, 0)
        return ("put", key, {"value": value, "expect": expect},
                {"op": "put", "ns": "f", "key": key, "value": value, "expect": expect, "forever": True})
    return "delete", key, {}, {"op": "delete", "ns": "f", "key": key}


def run_kv(work_dir: str, seed: int, kills: int = 3, control: str = "", scale: float = 1.0,
        power_loss_share: float = 0.5, failpoint_share: float = 0.4) -> Outcome:
    rng = random.Random(seed)
    ops: list[Op] = []
    lock = threading.Lock()
    per_client = int(150 * scale)

    def client(target: Target, process: int) -> None:
        crng = random.Random(seed * 31 + process)
        seen: dict[str, int] = {}
        connection = JsonClient(target, "/api/v1/kv")
        for n in range(per_client):
            kind, key, args, wire = _kv_op(crng, process, n, seen)
            invoke = time.monotonic()
            result = connection.call(wire)
            if result is None:  # unknown outcome (a read's is simply dropped: it changed nothing)
                if kind != "get":
                    with lock:
                        ops.append(Op(process, kind, key, args, invoke, None, None))
                continue
            with lock:
                ops.append(Op(process, kind, key, args, invoke, time.monotonic(), result))
            if "version" in result and result.get("found", result.get("applied", True)):
                seen[key] = result["version"]
        connection.close()

    target = start_target(work_dir, control)
    clients = Clients()
    for process in range(4):
        clients.add(client, target, process)
    kill_while_running(target, clients.threads, lambda: len(ops), kills, rng, (40, 120),
                       power_loss_share, failpoint_share)
    outcome = Outcome("kv", seed, control, ops=len(ops), promises=("P1", "P2"))
    for key, result in check_history(ops).items():
        outcome.histories += 1
        if not (result.ok and result.decided):
            outcome.violations.append({"kind": "not_linearizable", "key": key, "reason": result.reason})
    outcome.detail = f"({sum(op.complete is None for op in ops)} of unknown outcome)"
    return _finish(outcome, target, clients)


# -- locks and semaphores ------------------------------------------------------------------------

LOCKS = {"l": 1, "s": 2}


def run_locks(work_dir: str, seed: int, kills: int = 3, control: str = "", scale: float = 1.0,
        power_loss_share: float = 0.5, failpoint_share: float = 0.4) -> Outcome:
    rng = random.Random(seed)
    events: list = []
    # One list per permit (name#slot): a permit's holders follow each other, a semaphore's two
    # permits may be held at once.
    lists = [f"{name}#{slot}" for name, permits in LOCKS.items() for slot in range(permits)]
    adds: dict[str, list] = {key: [] for key in lists}
    reads: dict[str, list] = {key: [] for key in lists}
    lock = threading.Lock()
    attempts = int(60 * scale)

    def client(target: Target, process: int) -> None:
        crng = random.Random(seed * 17 + process)
        locks = JsonClient(target, "/api/v1/locks")
        kv = JsonClient(target)
        for attempt in range(attempts):
            name = crng.choice(sorted(LOCKS))
            owner = f"p{process}-{attempt}"  # a fresh owner per attempt: a lost grant is a holder nobody knows
            walk_away = crng.random() < 0.15
            ttl_s = 1 if walk_away else 2
            invoked = now_ms()
            got = locks.call({"op": "acquire", "name": name, "ttlSeconds": ttl_s, "owner": owner,
                              "limit": LOCKS[name], "waitMs": 3000})  # parked on the server until a permit frees
            completed = now_ms()
            if got is None or not got.get("acquired"):
                continue
            slot, token = got["slot"], got["token"]
            mine = [Grant(name=name, slot=slot, owner=owner, token=token, fence=got["fence"], invoked_at=invoked,
                          completed_at=completed, expires_at=got["expiresAt"], already=bool(got.get("already")))]
            if walk_away:  # holds its lease to the end without a word: the next holder waits for expiry
                with lock:
                    events.extend(mine)
                continue
            for _ in range(crng.randrange(0, 3)):
                invoked = now_ms()
                renewed = locks.call({"op": "renew", "name": name, "slot": slot, "token": token, "ttlSeconds": ttl_s,
                                      "owner": owner})
                completed = now_ms()
                if renewed is None or not renewed.get("renewed"):
                    break
                token = renewed["token"]
                mine.append(Renewal(name=name, slot=slot, owner=owner, token=token, fence=renewed["fence"],
                                    invoked_at=invoked, completed_at=completed, expires_at=renewed["expiresAt"]))
            # Read-modify-write of the name's list, the write under the guard of the latest token.
            permit = f"{name}#{slot}"
            key = f"members-{permit}"
            invoked = now_ms()
            read = kv.request("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "f", "key": key}]})
            if read is not None:
                row = read["results"][0]
                members = row["value"] if row.get("found") else []
                reads[permit].append(Read(elements=tuple(members), invoked_at=invoked, completed_at=now_ms()))
                guard = {"op": "check", "ns": "queen-locks", "key": permit, "expect": token}
                invoked = now_ms()
                step = kv.request("POST", "/api/v1/transaction", {"kv": [
                    guard, {"op": "put", "ns": "f", "key": key, "value": [*members, owner], "forever": True}]})
                answered = "unknown" if step is None else "added" if step["success"] else "refused"
                with lock:
                    adds[permit].append(Add(element=owner, answered=answered, invoked_at=invoked, completed_at=now_ms()))
            invoked = now_ms()
            released = locks.call({"op": "release", "name": name, "slot": slot, "token": token, "owner": owner})
            answered = "unknown" if released is None else ("released" if released.get("released") else released["reason"])
            mine.append(Release(name=name, slot=slot, owner=owner, invoked_at=invoked, completed_at=now_ms(),
                                answered=answered))
            with lock:
                events.extend(mine)
        locks.close()
        kv.close()

    target = start_target(work_dir, control)
    clients = Clients()
    for process in range(4):
        clients.add(client, target, process)
    kill_while_running(target, clients.threads, lambda: len(events), kills, rng, (20, 60),
                       power_loss_share, failpoint_share)
    # A last read of each list, after everything: every append answered "added" must be in it.
    final = JsonClient(target)
    target.restart()
    for permit in lists:
        invoked = now_ms()
        row = final.request("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "f", "key": f"members-{permit}"}]})
        row = row["results"][0]
        reads[permit].append(Read(elements=tuple(row["value"] if row.get("found") else ()), invoked_at=invoked,
                                completed_at=now_ms()))
    final.close()
    target.server.stop()
    grants = sum(type(e) is Grant for e in events)
    outcome = Outcome("locks", seed, control, ops=len(events) + sum(map(len, adds.values())),
                      promises=("P2", "P3", "P4", "P6"))
    for name, permits in LOCKS.items():
        outcome.histories += 1
        outcome.violations += check_leases([e for e in events if e.name == name], permits, tolerance_ms=TOLERANCE_MS)
    for permit in lists:
        outcome.histories += 1
        outcome.violations += check_set_full(adds[permit], reads[permit])
    outcome.detail = f"({grants} grants, {sum(a.answered == 'added' for v in adds.values() for a in v)} guarded appends)"
    return _finish(outcome, target, clients)


# -- queues --------------------------------------------------------------------------------------

QUEUE = "fq"


def run_queues(work_dir: str, seed: int, kills: int = 3, control: str = "", scale: float = 1.0,
        power_loss_share: float = 0.5, failpoint_share: float = 0.4) -> Outcome:
    rng = random.Random(seed)
    pushes: list[Push] = []
    deliveries: list[Delivery] = []
    acks: list[Ack] = []
    leases: list = []  # Grant/Release per partition lease, judged by check_leases
    lock = threading.Lock()
    produced = threading.Event()
    batches = int(30 * scale)

    def producer(target: Target) -> None:
        prng = random.Random(seed * 13)
        client = JsonClient(target)
        for b in range(batches):
            items = [{"queue": QUEUE, "partition": f"p{n % 3}", "payload": {"n": n},
                      "transactionId": f"m-{b * 10 + n}"} for n in range(10)]
            for _ in range(2 if prng.random() < 0.2 else 1):  # a producer that retries after a lost answer
                answer = client.request("POST", "/api/v1/push", {"items": items})
                with lock:
                    for n, item in enumerate(items):
                        if answer is None:
                            pushes.append(Push(transaction_id=item["transactionId"], status="unknown"))
                        else:
                            pushes.append(Push(transaction_id=item["transactionId"], status=answer[n]["status"],
                                               message_id=str(answer[n]["messageId"])))
        produced.set()
        client.close()

    def consume_once(client: JsonClient, crng: random.Random, wait_ms: int) -> bool:
        """One pop and its acks; False when the pop found nothing (or the server went away)."""
        invoked = now_ms()
        answer = client.request("GET", f"/api/v1/pop/queue/{QUEUE}?batch=5&waitMs={wait_ms}",
                                timeout_s=10 + wait_ms / 1000)
        completed = now_ms()
        if answer is None or not answer["success"]:
            return False
        lease_id = answer["leaseId"]
        partition = answer["partition"]
        record = [partition_grant(partition, answer, invoked, completed)]
        got = pop_deliveries(answer, invoked)
        done: list[Ack] = []
        for n, message in enumerate(answer["messages"]):
            roll = crng.random()
            if roll < 0.08:
                break  # walks away: the rest stays leased until the lease runs out
            status = "failed" if roll < 0.16 else "completed"
            invoked = now_ms()
            result = client.request("POST", "/api/v1/ack", {"partitionId": message["partitionId"],
                                                             "leaseId": lease_id, "offset": message["offset"],
                                                             "status": status})
            answer_text = ack_answer(result)
            done.append(Ack(transaction_id=message["transactionId"], lease_id=str(lease_id), status=status,
                            answer=answer_text, at=now_ms()))
            last = n == len(answer["messages"]) - 1
            if result is None or status == "failed" or last or answer_text != "success":
                # The lease ends here (a failed ack, the last message, or a lost answer: stop relying on it).
                record.append(partition_release(partition, lease_id, invoked, now_ms(), answer_text))
                break
        with lock:
            deliveries.extend(got)
            acks.extend(done)
            leases.extend(record)
        return True

    def consumer(target: Target, process: int) -> None:
        crng = random.Random(seed * 7 + process)
        client = JsonClient(target)
        while not produced.is_set():
            consume_once(client, crng, 200)
        client.close()

    target = start_target(work_dir, control)
    with_queue = JsonClient(target)
    assert with_queue.request("POST", "/api/v1/configure", {"queue": QUEUE, "options": {
        "leaseTimeSeconds": 1, "retryLimit": 1000}})["configured"]
    clients = Clients()
    clients.add(producer, target)
    for process in range(2):
        clients.add(consumer, target, process)
    kill_while_running(target, clients.threads, lambda: len(deliveries) + len(pushes), kills, rng, (40, 160),
                       power_loss_share, failpoint_share)
    # Drain: pop until two long polls in a row (each longer than a lease) find nothing: every
    # message is then resolved (an ack whose answer a crash lost may have completed it unseen).
    target.restart()
    drng = random.Random(seed * 3)
    wanted = {p.transaction_id for p in pushes if p.status in ("queued", "duplicate")}
    empty = 0
    for _ in range(400):
        empty = 0 if consume_once(with_queue, drng, 1500) else empty + 1
        if empty == 2:
            break
    with_queue.close()
    target.server.stop()
    outcome = Outcome("queues", seed, control, ops=len(pushes) + len(deliveries) + len(acks), promises=("P1", "P6"))
    outcome.histories = 1 + len({g.name for g in leases})
    outcome.violations += check_total_queue(pushes, deliveries, acks, drained=True)
    for partition in sorted({g.name for g in leases}):
        outcome.violations += check_leases([e for e in leases if e.name == partition], 1, tolerance_ms=TOLERANCE_MS)
    outcome.detail = (f"({len(wanted)} acknowledged pushes, {len(deliveries)} deliveries, "
                      f"{sum(type(e) is Grant for e in leases)} partition leases)")
    return _finish(outcome, target, clients)


# -- timers --------------------------------------------------------------------------------------

TIMER_QUEUE = "ft"


def run_timers(work_dir: str, seed: int, kills: int = 3, control: str = "", scale: float = 1.0,
        power_loss_share: float = 0.5, failpoint_share: float = 0.4) -> Outcome:
    rng = random.Random(seed)
    schedules: list[Schedule] = []
    cancels: list[Cancel] = []
    fired: list[TimerDelivery] = []
    lock = threading.Lock()
    scheduled = threading.Event()
    steps = int(80 * scale)
    latest_at = [0]
    lost_pops: list[LostPop] = []
    answered_pop = [0]  # when the last pop that was answered was sent

    def scheduler(target: Target, process: int) -> None:
        srng = random.Random(seed * 11 + process)
        client = JsonClient(target, "/api/v1/timers")
        version: Counter = Counter()
        for n in range(steps):
            key = f"k{process}-{srng.randrange(30)}"
            if srng.random() < 0.25 and version[key]:
                invoked = now_ms()
                result = client.call({"op": "cancel", "queue": TIMER_QUEUE, "key": key})
                answered = "unknown" if result is None else "cancelled" if result["cancelled"] else "absent"
                with lock:
                    cancels.append(Cancel(key=key, version=version[key], answered=answered, invoked_at=invoked))
                continue
            version[key] += 1
            marker = f"{key}.{version[key]}"
            at = now_ms() + srng.randrange(20, 1500)
            latest_at[0] = max(latest_at[0], at)
            invoked = now_ms()
            result = client.call({"op": "schedule", "queue": TIMER_QUEUE, "key": key, "at": at,
                                  "partition": f"p{n % 3}", "payload": {"m": marker}})
            answered = "unknown" if result is None else "scheduled" if result["scheduled"] else result["reason"]
            with lock:
                schedules.append(Schedule(queue=TIMER_QUEUE, key=key, version=version[key], at=at, marker=marker,
                                          answered=answered, invoked_at=invoked, completed_at=now_ms()))
        client.close()

    def consume_once(client: JsonClient, wait_ms: int) -> bool:
        invoked = now_ms()
        answer = client.request("GET", f"/api/v1/pop/queue/{TIMER_QUEUE}?batch=50&partitions=3&autoAck=true"
                                f"&waitMs={wait_ms}", timeout_s=10 + wait_ms / 1000)
        if answer is None:  # no answer: it may have taken (and acked) what the queue held
            lost_pops.append(LostPop(after=answered_pop[0], until=now_ms()))
            return False
        answered_pop[0] = invoked
        if not answer["success"]:
            return False
        with lock:
            fired.extend(TimerDelivery(marker=m["data"]["m"], created_at=m["createdAt"], message_id=m["messageId"])
                         for m in answer["messages"])
        return True

    def consumer(target: Target) -> None:
        client = JsonClient(target)
        while not scheduled.is_set():
            consume_once(client, 200)
        client.close()

    def schedulers_then_done(target: Target) -> None:
        inner = Clients()
        for process in range(2):
            inner.add(scheduler, target, process)
        for thread in inner.threads:
            thread.start()
        for thread in inner.threads:
            thread.join()
        scheduled.set()
        if inner.errors:
            raise AssertionError(inner.errors)

    target = start_target(work_dir, control)
    clients = Clients()
    clients.add(schedulers_then_done, target)
    clients.add(consumer, target)
    kill_while_running(target, clients.threads, lambda: len(schedules) + len(cancels) + len(fired), kills, rng, (20, 80),
                       power_loss_share, failpoint_share)
    target.restart()
    client = JsonClient(target)
    # Drained when the server says no timer due by the last `at` is still pending (each fired into
    # the queue) and a poll then comes back empty. Judged on the server's own state, not on how soon
    # a busy machine runs its ticks: a failed request is never taken for an empty queue.
    end_ms = 0
    for _ in range(400):
        if now_ms() <= latest_at[0]:
            consume_once(client, 200)
            continue
        info = client.request("GET", f"/api/v1/resources/queues/{TIMER_QUEUE}")
        next_at = None if info is None else info["timers"]["nextAt"]
        if info is None or (next_at is not None and next_at <= latest_at[0]):
            consume_once(client, 200)
            continue
        answer = client.request("GET", f"/api/v1/pop/queue/{TIMER_QUEUE}?batch=50&partitions=3&autoAck=true")
        if answer is not None and not answer["messages"]:
            end_ms = latest_at[0] + 1  # every schedule due by then has fired and been taken
            break
        if answer is not None:
            with lock:
                fired.extend(TimerDelivery(marker=m["data"]["m"], created_at=m["createdAt"], message_id=m["messageId"])
                             for m in answer["messages"])
    client.close()
    target.server.stop()
    outcome = Outcome("timers", seed, control, ops=len(schedules) + len(cancels) + len(fired), histories=1,
                      promises=("P1", "P5"))
    outcome.violations += check_timers(schedules, cancels, fired, end_ms=end_ms, tolerance_ms=TOLERANCE_MS,
                                       lost_pops=tuple(lost_pops))
    if not end_ms:
        outcome.violations.append({"kind": "not_drained", "latest_at": latest_at[0]})
    outcome.detail = (f"({len(schedules)} schedules, {len(cancels)} cancels, {len(fired)} fired, "
                      f"{len(lost_pops)} pops unanswered)")
    return _finish(outcome, target, clients)


# -- recurring timers ----------------------------------------------------------------------------

RECURRING_QUEUE = "fr"
RECURRING_KEYS = 10
RECURRING_PERIOD_MS = 1_000  # the shortest period a recurring timer takes
# The last restart's clock is this far ahead: to the server, a downtime of several periods, so every
# run has catch-up fires (a crash's own downtime may be shorter than a period).
RECURRING_DOWNTIME_MS = 5_000


def run_recurring(work_dir: str, seed: int, kills: int = 3, control: str = "", scale: float = 1.0,
                  power_loss_share: float = 0.5, failpoint_share: float = 0.4) -> Outcome:
    """Recurring timers, each in its own partition, their phases spread over the period, fire
    while a consumer pops (under 1 s leases) and acks; the server is crashed `kills` times, then
    stopped and started once more with its clock RECURRING_DOWNTIME_MS ahead (a downtime of
    several periods, to the server), the timers cancelled and the queue drained. Times in the
    history are the server's: the cancels' are moved by that offset."""
    rng = random.Random(seed)
    deliveries: list[PeriodDelivery] = []
    calls = Counter()  # the clients' requests, by kind
    lock = threading.Lock()
    target = start_target(work_dir, control)
    setup = JsonClient(target)
    assert setup.request("POST", "/api/v1/configure", {"queue": RECURRING_QUEUE, "options": {
        "leaseTimeSeconds": 1}})["configured"]
    timers = JsonClient(target, "/api/v1/timers")
    first = now_ms() + 300
    starts = {}
    for n in range(RECURRING_KEYS):
        key = f"r{n}"
        at = first + n * RECURRING_PERIOD_MS // RECURRING_KEYS
        answer = timers.call({"op": "schedule", "queue": RECURRING_QUEUE, "key": key, "partition": key, "at": at,
                              "everyMs": RECURRING_PERIOD_MS, "payload": {"key": key}})
        assert answer["scheduled"] and answer["at"] == at and answer["everyMs"] == RECURRING_PERIOD_MS, answer
        starts[key] = at
    settle = max(RECURRING_KEYS, int(60 * scale))  # deliveries after the last crash before the consumer stops

    def consume_once(client: JsonClient, wait_ms: int) -> bool | None:
        """One pop and an ack of each of its messages; False when it found nothing, None when the
        request failed (the server went away: a lease taken runs out and its messages come again,
        under the same messageIds)."""
        answer = client.request("GET", f"/api/v1/pop/queue/{RECURRING_QUEUE}?batch=50&partitions={RECURRING_KEYS}"
                                f"&waitMs={wait_ms}", timeout_s=10 + wait_ms / 1000)
        calls["pop"] += 1
        if answer is None:
            return None
        if not answer["success"]:
            return False
        got = []
        for m in answer["messages"]:
            key, _, period = m["transactionId"].rpartition("@")
            got.append(PeriodDelivery(key=key, period=int(period), created_at=m["createdAt"],
                                      message_id=str(m["messageId"])))
        with lock:
            deliveries.extend(got)
        for m in answer["messages"]:
            calls["ack"] += 1
            if client.request("POST", "/api/v1/ack", {"partitionId": m["partitionId"], "leaseId": answer["leaseId"],
                                                       "offset": m["offset"]}) is None:
                break  # the server went away: stop relying on the lease
        return True

    def consumer(target: Target) -> None:
        client = JsonClient(target)
        after_crashes = None
        while after_crashes is None or len(deliveries) < after_crashes + settle:
            if after_crashes is None and sum(target.faults.values()) >= kills:
                after_crashes = len(deliveries)
            consume_once(client, 500)
        client.close()

    clients = Clients()
    clients.add(consumer, target)
    kill_while_running(target, clients.threads, lambda: len(deliveries), kills, rng, (RECURRING_KEYS, 3 * RECURRING_KEYS),
                       power_loss_share, failpoint_share)
    target.env = {**target.env, "QUEEN_FAULT_WALL_OFFSET_MS": str(RECURRING_DOWNTIME_MS)}
    restarted_at = now_ms() + RECURRING_DOWNTIME_MS  # on the restarted server's clock
    target.restart()  # after the stop at the end of the kill loop: a downtime of five periods
    client = JsonClient(target)
    # Until every key's catch-up fire has come (any message is not enough: one left from before the
    # restart would let a cancel race the first tick); a fire that never comes is the checker's to
    # report, so the wait is bounded.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not set(starts) <= {
            d.key for d in deliveries if d.created_at >= restarted_at}:
        consume_once(client, 2 * RECURRING_PERIOD_MS)
    cancelled_at = {}
    for key in starts:
        while True:
            invoked = now_ms()
            answer = timers.call({"op": "cancel", "queue": RECURRING_QUEUE, "key": key})
            if answer is not None:
                assert answer["cancelled"], answer  # a recurring timer is pending until cancelled
                cancelled_at[key] = invoked + RECURRING_DOWNTIME_MS  # on the server's clock
                break
    # Drained: a pop that waited past the last lease's end found nothing (a failed one proves nothing).
    while consume_once(client, 1_500) is not False:
        pass
    client.close()
    timers.close()
    setup.close()
    target.server.stop()
    recurrences = [Recurrence(key=key, at=at, every=RECURRING_PERIOD_MS, cancelled_at=cancelled_at[key])
                   for key, at in starts.items()]
    outcome = Outcome("recurring", seed, control, ops=2 * RECURRING_KEYS + calls["pop"] + calls["ack"],
                      histories=RECURRING_KEYS, promises=("P1", "P5"))
    outcome.violations += check_recurring(recurrences, deliveries, tolerance_ms=TOLERANCE_MS,
                                          margin_ms=RECURRING_PERIOD_MS)
    periods = {(d.key, d.period) for d in deliveries}
    merged = sum(1 for d in deliveries if d.created_at - d.period >= RECURRING_PERIOD_MS)
    outcome.detail = f"({len(periods)} periods, {merged} catch-up fires)"
    return _finish(outcome, target, clients)


# -- transactions --------------------------------------------------------------------------------

SOURCE, OUTBOX, LATER = "src", "outbox", "later"  # queues a step acks from, pushes to, schedules in
OUT_PARTITIONS = 4


def _step(n: int, lease_id: int, message: dict) -> dict:
    return {
        "kv": [{"op": "put", "ns": "txn", "key": f"k{n}", "value": f"v{n}", "forever": True}],
        "ack": [{"partitionId": message["partitionId"], "leaseId": lease_id, "offset": message["offset"]}],
        "push": [{"queue": OUTBOX, "partition": f"o{n % OUT_PARTITIONS}", "payload": {"n": n},
                  "transactionId": f"push-{n}"}],
        "timers": [{"op": "schedule", "queue": LATER, "key": f"t-{n}", "delayMs": 3_600_000, "payload": {"n": n}},
                   {"op": "cancel", "queue": LATER, "key": f"t-{n - 1}"}],
    }


def _drain(client: JsonClient, queue: str, partitions: list[str]) -> list[str]:
    """The transactionIds of every message of the partitions."""
    got = []
    for partition in partitions:
        answer = client.request("GET", f"/api/v1/pop/queue/{queue}/partition/{partition}?batch=1000&autoAck=true")
        got += [m["transactionId"] for m in answer["messages"]] if answer["success"] else []
    return got


def run_transactions(work_dir: str, seed: int, kills: int = 3, control: str = "", scale: float = 1.0,
                     power_loss_share: float = 0.5, failpoint_share: float = 0.4) -> Outcome:
    rng = random.Random(seed)
    count = max(50, min(1000, int(600 * scale)))  # source messages, one step each
    steps: list[Step] = []
    target = start_target(work_dir, control)
    setup = JsonClient(target)
    # One lease holds every source message for the whole run; crashes do not end it.
    assert setup.request("POST", "/api/v1/configure", {"queue": SOURCE, "options": {
        "leaseTimeSeconds": 3600}})["configured"]
    assert setup.request("POST", "/api/v1/push", {"items": [
        {"queue": SOURCE, "partition": "a", "payload": n, "transactionId": f"src-{n}"} for n in range(count)]})
    held = setup.request("GET", f"/api/v1/pop/queue/{SOURCE}?batch={count}")
    lease_id, messages = held["leaseId"], held["messages"]
    assert [m["transactionId"] for m in messages] == [f"src-{n}" for n in range(count)]
    setup.close()

    def chain(target: Target) -> None:
        client = JsonClient(target)
        for n in range(count):
            answer = client.request("POST", "/api/v1/transaction", _step(n, lease_id, messages[n]))
            steps.append(Step(n=n, answered="unknown" if answer is None else
                              "success" if answer["success"] else answer["reason"]))
        client.close()

    clients = Clients()
    clients.add(chain, target)
    kill_while_running(target, clients.threads, lambda: len(steps), kills, rng, (20, 80), power_loss_share,
                       failpoint_share)
    target.restart()
    client = JsonClient(target)
    rows = client.request("POST", "/api/v1/kv", {"operations": [
        {"op": "get", "ns": "txn", "key": f"k{n}"} for n in range(len(steps))]})["results"]
    timers = client.request("GET", f"/api/v1/timers?queue={LATER}&limit=1000")
    assert timers["cursor"] is None  # at most one per step is pending
    assert client.request("POST", f"/api/v1/lease/{lease_id}/release", {})["success"]
    state = TxnState(rows={n: row["value"] if row["found"] else None for n, row in enumerate(rows)},
                     source_count=count, source_left=frozenset(_drain(client, SOURCE, ["a"])),
                     outbox=tuple(_drain(client, OUTBOX, [f"o{n}" for n in range(OUT_PARTITIONS)])),
                     pending=frozenset(item["key"] for item in timers["items"]))
    client.close()
    target.server.stop()
    outcome = Outcome("transactions", seed, control, ops=len(steps), histories=1, promises=("P1", "P10"))
    outcome.violations += check_transactions(steps, state)
    unknown = sum(step.answered == "unknown" for step in steps)
    outcome.detail = f"({sum(v is not None for v in state.rows.values())} of {len(steps)} steps applied, {unknown} unknown)"
    return _finish(outcome, target, clients)


WORKLOADS = {"kv": run_kv, "locks": run_locks, "queues": run_queues, "timers": run_timers,
             "recurring": run_recurring, "transactions": run_transactions}
