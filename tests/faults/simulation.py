"""A deterministic simulation of Queen under power loss: the whole server in one process under
trio's MockClock, seeded random clients, crashes and restarts, every history checked.

One seed decides everything. `random.Random(seed)` picks which clients act at each step, their
operations and arguments, how much virtual time passes between steps, and when the machine loses
power; trio's scheduler is seeded with it too (as trio's own scheduler-determinism test does), so
the tasks interleave the same way on every run of a seed. A seed therefore replays the same
history, request for request and answer for answer, which `SimReport.digest` pins.

The machine: a `Server` (queen/runtime/server.py) on a `ForgetfulDisk` (queen/testing.py), which
keeps what was fsynced apart from what was only written. Requests go straight to
`server.http._handle`, no sockets (the server's own listeners are never connected to). Clients,
each with one request at a time, several of them in flight together:

- 4 KV clients on two registers and a counter: get, put, putIfAbsent, compare-and-set, delete,
  incr;
- 3 lock clients on a lock "l" (1 permit) and a semaphore "s" (2 permits): acquire (sometimes
  parked with waitMs), renew, release, acquire again as the holder, or walk away;
- a queue producer (unique transactionIds, some batches sent again, as after a lost answer) and 2
  consumers that pop, ack completed or failed, or walk away from their lease.

Power loss, at seeded steps: either the disk dies at one of its next mutating operations
(`crash_at`: that write lands in part and nothing after it happens, as when the power goes in
the middle of a commit, a segment cut or a snapshot), or the power goes a seeded number of
scheduler passes into the requests just sent; and sometimes it goes again during the restart's
recovery. An answer the server had not handed back by then never arrives: that request's outcome
is unknown (`complete=None` for the KV checker; a grant nobody heard of is left out, since it
can only keep others waiting). The disk keeps only what was synced (`crash()`), and the server
starts again on it, its wall clock going on from where the last one stopped. A last power loss
comes after the last step; then every lease runs out, the queue is drained and every key is
read once more.

What the server promises, and what is checked: it answers only once the answer is durable, so
every answered write, grant, renewal, push, pop and ack holds across the crashes. The KV history
is linearizable per key (tests/faults/linearizability.py); the lock, the semaphore and each
queue partition never have more holders than permits within the leases they were told, and
tokens and fences only rise (check_leases); the queue loses no acknowledged push, duplicates
none, and delivers nothing after its completed ack (check_total_queue). A server that will not
start again after a crash, or answers anything but 200 or 503 (not durable: unknown), is a
violation too.

Replay one seed (--trace prints every request and answer), or run a range:

    python -m tests.faults.simulation --seed 17
    python -m tests.faults.simulation --seeds 0-99

The exit status is 1 when any seed has a violation; each is printed with its evidence.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field

import trio
import trio.testing

from queen.config import Config
from queen.http.wire import Request
from queen.runtime.server import Server
from queen.testing import Crash, ForgetfulDisk, run_inline
from tests.faults.checkers import (
    Ack,
    Delivery,
    Grant,
    Loss,
    Push,
    Release,
    Renewal,
    ack_answer,
    check_leases,
    check_total_queue,
    partition_grant,
    partition_release,
    pop_deliveries,
)
from tests.faults.linearizability import Op, check_history

STEPS = 400
CRASHES = 4
WALL_AT_START_MS = 1_800_000_000_000
# Small segments and snapshots, so power goes during segment cuts and snapshots too.
SERVER_SETTINGS = {"segment_bytes_max": 4096, "snapshot_wal_bytes": 12_000, "shard_count": 2}
KV_CLIENTS = 4
REGISTERS = ("r0", "r1")
COUNTER = "c0"
LOCK_CLIENTS = 3
PERMITS = {"l": 1, "s": 2}
QUEUE = "q"
QUEUE_LEASE_S = 2
QUEUE_CONSUMERS = 2
# Virtual seconds between two steps: mostly none or little, so requests overlap; now and then
# long enough for leases to run out.
PAUSES_S = (0, 0, 0, 0, 0.001, 0.003, 0.01, 0.05, 0.2, 0.6, 1.5, 3.0)
BURSTS = (1, 1, 1, 2, 3, 5)  # requests started together at one step
DOWNTIMES_S = (0, 0.01, 0.5, 2.5)


@dataclass
class SimReport:
    seed: int
    ops: int = 0  # requests sent
    unknown: int = 0  # of them, answers that never arrived
    crashes: int = 0  # power losses
    restarts: int = 0  # server starts after the first
    histories: dict = field(default_factory=dict)  # kind -> histories checked
    events: Counter = field(default_factory=Counter)  # what happened: grants, deliveries, snapshots...
    violations: list = field(default_factory=list)
    digest: str = ""  # of every request and answer, in order
    trace: list = field(default_factory=list, repr=False)  # what the digest is of

    def summary(self) -> str:
        histories = ", ".join(f"{n} {kind}" for kind, n in sorted(self.histories.items()))
        events = ", ".join(f"{n} {kind}" for kind, n in sorted(self.events.items()))
        return (f"seed={self.seed}: {self.ops} ops ({self.unknown} unknown), {self.crashes} crashes, "
                f"{self.restarts} restarts; histories: {histories}; {len(self.violations)} violations; "
                f"digest {self.digest}\n  events: {events}")


def run_seed(seed: int, *, steps: int = STEPS, crashes: int = CRASHES, control: str = "") -> SimReport:
    """Run one seed and check its histories. `crashes` power losses are planned among the steps,
    and one more comes after the last. `control`: a deliberate bug to run with (CONTROLS), to see
    the simulation catch it."""
    sim = Simulation(seed, steps, crashes, CONTROLS[control])
    with tempfile.TemporaryDirectory(prefix="queen-sim-") as data_dir, seeded_trio_scheduler(seed):
        # The data directory only holds the server's LOCK file: the log lives on the ForgetfulDisk,
        # whose paths are keys of its own.
        sim.data_dir = data_dir
        trio.run(sim.main, clock=trio.testing.MockClock(autojump_threshold=0))
    return sim.check()


def crash_only(error: BaseException) -> bool:
    """True if error is the simulated power loss (Crash), alone or in (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return error.split(Crash)[1] is None
    return isinstance(error, Crash)


@contextlib.contextmanager
def seeded_trio_scheduler(seed: int):
    """Make trio run tasks in an order that depends on `seed` alone (as trio's own test of this
    does): each batch of runnable tasks is sorted by creation, then shuffled by a seeded random."""
    from trio._core import _run

    state, allowed = _run._r.getstate(), _run._ALLOW_DETERMINISTIC_SCHEDULING
    _run._ALLOW_DETERMINISTIC_SCHEDULING = True
    _run._r.seed(seed)
    try:
        yield
    finally:
        _run._ALLOW_DETERMINISTIC_SCHEDULING = allowed
        _run._r.setstate(state)


@dataclass
class Flight:
    """One request: when it was sent and when its answer came (None: it never did), on the
    logical clock (`invoke`, `complete`: for the KV and queue checkers) and on the server's wall
    clock in ms (for the lease checker, which compares with the server's expiresAt)."""
    life: int
    invoke: int
    invoked_ms: int
    complete: int | None = None
    completed_ms: int | None = None


class FsyncDoesNothing(ForgetfulDisk):
    """A negative control: a disk whose fsync returns without making anything durable, so a power
    loss takes back what the server had acknowledged."""

    def fsync(self, fd: int) -> None:
        if self._tick():
            raise Crash()


CONTROLS = {"": ForgetfulDisk, "fsync_does_nothing": FsyncDoesNothing}


class Simulation:
    """One seed's run: the machine (server and disk), the clients, and what they recorded."""

    def __init__(self, seed: int, steps: int, crashes: int, disk_class=ForgetfulDisk):
        self.seed = seed
        self.steps = steps
        self.crashes_planned = crashes
        self.rng = random.Random(seed)
        self.disk = disk_class(seed=self.rng.randrange(1 << 32))
        self.data_dir = ""
        self.world: trio.Nursery | None = None
        self.report = SimReport(seed)
        self.server: Server | None = None
        self.machine: trio.Nursery | None = None  # the server and the requests in flight
        self.machine_stopped: trio.Event | None = None
        self.life = 0  # which power-on period this is; a request remembers the one it started in
        self.powered = False
        self.wall_ms = WALL_AT_START_MS  # the server's clock when it last went down
        self.down_at_s = 0.0
        self.seq = 0  # a logical clock: every invoke and completion takes the next tick
        self.log: list = []  # every request and its answer, and every power loss, for the digest
        self.kv_ops: list[Op] = []
        self.lease_events: list = []  # Grant/Renewal/Release/Loss of locks and partition leases
        self.pushes: list[Push] = []
        self.deliveries: list[Delivery] = []
        self.acks: list[Ack] = []
        self.clients = ([KvClient(p) for p in range(KV_CLIENTS)]
                        + [LockClient(p) for p in range(LOCK_CLIENTS)]
                        + [Producer()] + [Consumer(f"c{p}") for p in range(QUEUE_CONSUMERS)])

    # -- the machine -----------------------------------------------------------------------------

    async def main(self) -> None:
        async with trio.open_nursery() as world:
            self.world = world
            await self.power_on()
            if self.powered:
                # Short queue leases, so walked-away ones run out within the run; retries without
                # end, so no message leaves for the dead-letter queue unseen.
                await self.call(None, "POST", "/api/v1/configure",
                                {"queue": QUEUE, "options": {"leaseTimeSeconds": QUEUE_LEASE_S, "retryLimit": 1000}})
                await self.run_steps()
            if self.powered:  # not when a restart failed: nothing more to learn then
                await self.finish()
            world.cancel_scope.cancel()

    async def run_steps(self) -> None:
        """Each step starts a few clients' next requests, then lets virtual time pass; the
        planned steps take the power away."""
        plan = sorted(self.rng.sample(range(1, self.steps), min(self.crashes_planned, self.steps - 1)))
        armed_at = None
        for step in range(self.steps):
            cut_after = None
            if plan and step == plan[0]:
                plan.pop(0)
                if self.rng.random() < 0.6:
                    # Die at one of the next mutating disk ops: mid-commit, mid-cut or mid-snapshot.
                    self.disk.crash_at = self.disk.ops + self.rng.randrange(1, 40)
                    armed_at = step
                else:
                    # Cut the power this many scheduler passes into this step's requests.
                    cut_after = self.rng.randrange(12)
            if self.disk.dead or (armed_at is not None and step - armed_at > 40):
                armed_at = None
                await self.power_loss()  # the disk died, or the armed op never came: cut now
            if not self.powered:
                return
            for _ in range(self.rng.choice(BURSTS)):
                idle = [client for client in self.clients if not client.busy]
                if not idle:
                    break
                client = self.rng.choice(idle)
                request = client.plan(self.rng)
                if request is not None:
                    client.busy = True  # now, not when the task first runs: it is this client's turn
                    self.machine.start_soon(self.run_request, client, request)
            if cut_after is None:
                await trio.sleep(self.rng.choice(PAUSES_S))
            else:
                for _ in range(cut_after):
                    await trio.lowlevel.checkpoint()
                armed_at = None
                await self.power_loss()

    async def power_on(self) -> None:
        """Start the server on what the disk kept; again after each crash during recovery. A
        server that does not start for any other reason is a violation, and the machine stays off."""
        while True:
            self.life += 1
            self.wall_ms += int((trio.current_time() - self.down_at_s) * 1000)
            self.down_at_s = trio.current_time()
            self.server = Server(Config(host="127.0.0.1", port=0, data_dir=self.data_dir, **SERVER_SETTINGS),
                                 disk=self.disk, wall_at_start_ms=self.wall_ms, run_blocking=run_inline)
            try:
                await self.world.start(self._machine)
            except Exception as error:
                if not crash_only(error):
                    self.report.violations.append({"kind": "restart_failed", "life": self.life, "error": repr(error)})
                    return
                self.lost_power("in recovery")
                continue
            self.powered = True
            self.disk.crash_at = None  # a crash armed for the recovery that it did not reach
            if self.life > 1:
                self.report.restarts += 1
            return

    async def _machine(self, task_status) -> None:
        """The server and the requests in flight, until the power goes (this nursery is cancelled)."""
        self.machine_stopped = stopped = trio.Event()
        started = False
        try:
            async with trio.open_nursery() as machine:
                await machine.start(self.server.run)
                self.machine, started = machine, True
                task_status.started()
        except Exception as error:
            # A Crash out of a running server is the power loss it ran into: the driver sees the
            # dead disk. Anything else, or any failure to start, is for the caller.
            if not started or not crash_only(error):
                raise
        finally:
            stopped.set()

    async def power_loss(self) -> None:
        """The power goes: nothing more is answered, the disk keeps what was synced, and the
        server starts again on it (after a seeded downtime, maybe dying again in recovery)."""
        self.powered = False
        self.wall_ms = self.now_ms()
        self.down_at_s = trio.current_time()
        self.report.events["snapshots"] += self.server.writer.snapshots_written
        self.machine.cancel_scope.cancel()
        await self.machine_stopped.wait()
        self.lost_power("at a disk op" if self.disk.dead else "between disk ops")
        await trio.sleep(self.rng.choice(DOWNTIMES_S))
        if self.rng.random() < 0.15:
            self.disk.crash_at = self.disk.ops + self.rng.randrange(1, 12)
        await self.power_on()

    def lost_power(self, when: str) -> None:
        """when: "at a disk op" (the disk died), "between disk ops", or "in recovery"."""
        self.disk.crash()
        self.report.crashes += 1
        self.report.events[f"crashes {when}"] += 1
        self.log.append(("power_loss", when, self.seq, self.disk.ops))

    def now_ms(self) -> int:
        """The server's wall clock (the same one its expiresAt values come from)."""
        return self.server.router.steps.clock.now_ms()

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    # -- requests ------------------------------------------------------------------------------------

    async def run_request(self, client, request) -> None:
        try:
            await self.call(client, *request)
        finally:
            client.busy = False

    async def call(self, client, method: str, target: str, body=None):
        """One request through the server's HTTP layer, told to the client (if any) as it ends: the
        answer's document, or None when the outcome is unknown (the power went before the answer
        was out, or the server answered 503 not_durable)."""
        name = client.name if client is not None else "setup"
        data = b"" if body is None else json.dumps(body, sort_keys=True).encode()
        flight = Flight(life=self.life, invoke=self.tick(), invoked_ms=self.now_ms())
        self.report.ops += 1
        self.log.append(("invoke", name, flight.invoke, method, target, data.decode()))
        document = None
        try:
            response = await self.server.http._handle(
                Request(method.encode(), target.encode(), b"application/json", b"application/json", data))
            if flight.life == self.life and self.powered and not self.disk.dead:
                flight.complete, flight.completed_ms = self.tick(), self.now_ms()
                self.log.append(("answer", name, flight.complete, response.status, response.body.decode()))
                document = self.read_answer(name, method, target, body, response)
        finally:  # also when cancelled by the power loss: the answer never came
            if document is None:
                self.report.unknown += 1
                self.log.append(("unknown", name, self.seq))
                flight.complete = flight.completed_ms = None
            if client is not None:
                client.answered(self, document, flight)
        return document

    def read_answer(self, name: str, method: str, target: str, body, response):
        """The answer's document; None for a 503 (not durable: the outcome is unknown, as after a
        crash) and for anything but a 200, which is also a violation."""
        document = json.loads(response.body)
        if response.status == 200:
            return document
        if response.status != 503:
            self.report.violations.append({"kind": "unexpected_answer", "client": name, "method": method,
                                           "target": target, "body": body, "status": response.status,
                                           "answer": document})
        return None

    # -- the end --------------------------------------------------------------------------------------

    async def finish(self) -> None:
        """A last power loss, then (with nothing in flight and every lease run out) drain the
        queue and read every key once more, so what the last crash lost shows."""
        await self.power_loss()
        if not self.powered:
            return
        await trio.sleep(max(QUEUE_LEASE_S, 3) + 1)
        drain = Consumer("drain")
        for _ in range(1000):
            request = drain.plan(self.rng, finishing=True)
            if request is None:
                break
            await self.call(drain, *request)
        reader = KvClient(KV_CLIENTS)
        for key in (*REGISTERS, COUNTER):
            await self.call(reader, *reader.read(key))
        self.kv_ops += reader.ops
        self.report.events["snapshots"] += self.server.writer.snapshots_written

    def check(self) -> SimReport:
        """Hand each history to its checker; the report counts them and keeps the violations."""
        report = self.report
        report.digest = hashlib.sha256(json.dumps(self.log).encode()).hexdigest()
        report.trace = self.log
        self.kv_ops += [op for client in self.clients if isinstance(client, KvClient) for op in client.ops]
        counts = report.events
        counts["disk ops"] = self.disk.ops
        counts["kv ops"] = len(self.kv_ops)
        for event in self.lease_events:
            counts[f"{type(event).__name__} ({'lock' if event.name in PERMITS else 'partition'})"] += 1
        counts["pushes"], counts["deliveries"], counts["acks"] = len(self.pushes), len(self.deliveries), len(self.acks)

        for key, result in sorted(check_history(self.kv_ops).items()):
            report.histories["kv key"] = report.histories.get("kv key", 0) + 1
            if not result.ok:
                report.violations.append({"kind": "not_linearizable", "key": key, "reason": result.reason,
                                          "decided": result.decided,
                                          "history": [vars(op) for op in self.kv_ops if op.key == key]})
        for name in sorted({event.name for event in self.lease_events}):
            kind = "lock name" if name in PERMITS else "partition lease"
            report.histories[kind] = report.histories.get(kind, 0) + 1
            permits = PERMITS.get(name, 1)  # a queue partition has one consumer (of a group) at a time
            report.violations += check_leases([event for event in self.lease_events if event.name == name],
                                              permits, tolerance_ms=0)
        if self.powered:  # drained only when the last restart came up
            # Not check_retries: a failed ack ends its lease on the partition, and the lease's other
            # messages come back with their retryCount unchanged, as the README says.
            report.violations += check_total_queue(self.pushes, self.deliveries, self.acks, drained=True)
            report.histories["queue"] = 1
        return report


# -- clients ------------------------------------------------------------------------------------------


class Client:
    """One request at a time: `plan` decides the next one synchronously (with the driver's random),
    `answered` is told its answer (None: unknown) and records it for the checkers."""

    def __init__(self, name: str):
        self.name = name
        self.busy = False


class KvClient(Client):
    def __init__(self, number: int):
        super().__init__(f"kv{number}")
        self.process = number
        self.count = 0
        self.seen: dict[str, int] = {}  # the last version this client saw per key, for expect
        self.ops: list[Op] = []
        self.next_wire = None

    def plan(self, rng: random.Random):
        self.count += 1
        value = f"{self.name}-{self.count}"
        if rng.random() < 0.25:
            if rng.random() < 0.5:
                wire = ("get", COUNTER, {}, {"op": "get", "ns": "f", "key": COUNTER})
            else:
                wire = ("incr", COUNTER, {"by": 1}, {"op": "incr", "ns": "f", "key": COUNTER, "by": 1, "forever": True})
        else:
            key = rng.choice(REGISTERS)
            roll = rng.random()
            if roll < 0.4:
                wire = ("get", key, {}, {"op": "get", "ns": "f", "key": key})
            elif roll < 0.7:
                wire = ("put", key, {"value": value}, {"op": "put", "ns": "f", "key": key, "value": value, "forever": True})
            elif roll < 0.8:
                wire = ("putIfAbsent", key, {"value": value},
                        {"op": "putIfAbsent", "ns": "f", "key": key, "value": value, "forever": True})
            elif roll < 0.92:
                expect = self.seen.get(key, 0)
                wire = ("put", key, {"value": value, "expect": expect},
                        {"op": "put", "ns": "f", "key": key, "value": value, "expect": expect, "forever": True})
            else:
                wire = ("delete", key, {}, {"op": "delete", "ns": "f", "key": key})
        self.next_wire = wire
        return "POST", "/api/v1/kv", {"operations": [wire[3]]}

    def read(self, key: str):
        """A plain read of key, for the last look at every key."""
        self.next_wire = ("get", key, {}, {"op": "get", "ns": "f", "key": key})
        return "POST", "/api/v1/kv", {"operations": [self.next_wire[3]]}

    def answered(self, sim, document, flight: Flight):
        kind, key, args, _wire = self.next_wire
        if document is None:
            if kind != "get":  # an unknown read changed nothing: left out
                self.ops.append(Op(self.process, kind, key, args, flight.invoke, None, None))
            return
        result = document["results"][0]
        self.ops.append(Op(self.process, kind, key, args, flight.invoke, flight.complete, result))
        if "version" in result and result.get("found", result.get("applied", True)):
            self.seen[key] = result["version"]
        elif "current" in result:  # a compare-and-set that missed: try the version it was told next
            self.seen[key] = result["current"]["version"]


class LockClient(Client):
    """Acquires the lock or the semaphore under a fresh owner each time, then renews, releases,
    acquires again as the holder, or walks away (its lease runs out).

    A holding keeps the lifetime it was acquired with, so a renew never shortens the lease: the
    holder may then go on relying on the last expiresAt it was told even when a renew's answer is
    lost (a lost renew that shortened the lease would have ended the lease unbeknown to it)."""

    def __init__(self, number: int):
        super().__init__(f"lock{number}")
        self.attempt = 0
        self.holding: dict | None = None  # name, slot, token, owner, ttl; doubtful after an unknown answer
        self.pending = None

    def plan(self, rng: random.Random):
        holding = self.holding
        if holding is None:
            self.attempt += 1
            name = rng.choice(sorted(PERMITS))
            op = {"op": "acquire", "name": name, "ttlSeconds": rng.choice((1, 2, 3)),
                  "owner": f"{self.name}-{self.attempt}", "limit": PERMITS[name]}
            if rng.random() < 0.4:
                op["waitMs"] = rng.choice((100, 1000, 3000))  # parked on the server until a permit frees
        else:
            roll = rng.random()
            if holding.get("doubtful") or roll < 0.35:
                op = {"op": "release", "name": holding["name"], "slot": holding["slot"], "token": holding["token"],
                      "owner": holding["owner"]}
            elif roll < 0.8:
                op = {"op": "renew", "name": holding["name"], "slot": holding["slot"], "token": holding["token"],
                      "ttlSeconds": holding["ttl"], "owner": holding["owner"]}
            elif roll < 0.9:
                op = {"op": "acquire", "name": holding["name"], "ttlSeconds": holding["ttl"],
                      "owner": holding["owner"], "limit": PERMITS[holding["name"]]}
            else:
                self.holding = None  # walks away: its lease stands until it runs out
                return None
        self.pending = op
        return "POST", "/api/v1/locks", {"operations": [op]}

    def answered(self, sim, document, flight: Flight):
        op, holding = self.pending, self.holding
        invoked_ms, completed_ms = flight.invoked_ms, flight.completed_ms
        result = None if document is None else document["results"][0]
        kind = op["op"]
        if kind == "acquire":
            if result is None:
                if holding is not None:
                    holding["doubtful"] = True  # it may have been a new grant: stop relying on it
                return  # a grant nobody heard of is left out: it only keeps others waiting
            if not result.get("acquired"):
                return
            already = bool(result.get("already"))
            if already and PERMITS[op["name"]] > 1:
                # The holder's own token again, which on a semaphore may be below the tokens other
                # slots were granted since: check_leases would call that a token going back. It
                # extends nothing (same row, same expiresAt), so the holding loses nothing by it.
                holding["token"] = result["token"]
                return
            sim.lease_events.append(Grant(name=op["name"], slot=result["slot"], owner=op["owner"],
                                          token=result["token"], fence=result["fence"], invoked_at=invoked_ms,
                                          completed_at=completed_ms, expires_at=result["expiresAt"], already=already))
            self.holding = {"name": op["name"], "slot": result["slot"], "token": result["token"], "owner": op["owner"],
                            "ttl": op["ttlSeconds"]}
        elif kind == "renew":
            if result is None:
                holding["doubtful"] = True  # its lease may have moved on: release it next
            elif result.get("renewed"):
                sim.lease_events.append(Renewal(name=op["name"], slot=op["slot"], owner=op["owner"],
                                                token=result["token"], fence=result["fence"], invoked_at=invoked_ms,
                                                completed_at=completed_ms, expires_at=result["expiresAt"]))
                holding["token"] = result["token"]
            else:
                sim.lease_events.append(Loss(name=op["name"], slot=op["slot"], owner=op["owner"], at=completed_ms))
                self.holding = None
        else:
            # The holder stops relying on its lease when it asks to release it, whatever the answer.
            answered = "unknown" if result is None else ("released" if result.get("released") else result["reason"])
            sim.lease_events.append(Release(name=op["name"], slot=op["slot"], owner=op["owner"],
                                            invoked_at=invoked_ms, completed_at=completed_ms or invoked_ms,
                                            answered=answered))
            self.holding = None


class Producer(Client):
    """Pushes batches of unique transactionIds over three partitions; sometimes sends a batch
    again (a producer retrying after a lost answer), which must not make a second message."""

    def __init__(self):
        super().__init__("producer")
        self.count = 0
        self.sent: list[list[dict]] = []
        self.pending = None

    def plan(self, rng: random.Random):
        if self.sent and rng.random() < 0.15:
            items = rng.choice(self.sent)
        else:
            items = []
            for _ in range(rng.randrange(1, 4)):
                self.count += 1
                items.append({"queue": QUEUE, "partition": f"p{rng.randrange(3)}", "payload": {"n": self.count},
                              "transactionId": f"t{self.count}"})
            self.sent.append(items)
        self.pending = items
        return "POST", "/api/v1/push", {"items": items}

    def answered(self, sim, document, flight: Flight):
        for n, item in enumerate(self.pending):
            if document is None:
                sim.pushes.append(Push(transaction_id=item["transactionId"], status="unknown"))
            else:
                sim.pushes.append(Push(transaction_id=item["transactionId"], status=document[n]["status"],
                                       message_id=str(document[n].get("messageId"))))


class Consumer(Client):
    """Pops a few messages under one lease, then acks them one by one (completed, or failed,
    which ends the lease), or walks away from the rest."""

    def __init__(self, name: str):
        super().__init__(name)
        self.lease: dict | None = None  # leaseId, partition, messages left to ack
        self.pending = None
        self.empty = False

    def plan(self, rng: random.Random, finishing: bool = False):
        lease = self.lease
        if lease is None:
            if finishing and self.empty:
                return None
            wait = "" if finishing or rng.random() < 0.6 else f"&waitMs={rng.choice((200, 1500))}"
            self.pending = ("pop", None, None)
            return "GET", f"/api/v1/pop/queue/{QUEUE}?batch={3 if not finishing else 50}{wait}", None
        roll = 0.5 if finishing else rng.random()
        if roll < 0.05:
            self.lease = None  # walks away: the lease runs out and the rest comes back
            return self.plan(rng)
        message = lease["messages"].pop(0)
        status = "failed" if roll < 0.15 else "completed"
        self.pending = ("ack", message, status)
        return "POST", "/api/v1/ack", {"partitionId": message["partitionId"], "leaseId": lease["leaseId"],
                                       "offset": message["offset"], "status": status}

    def answered(self, sim, document, flight: Flight):
        kind, message, status = self.pending
        if kind == "pop":
            if document is None or not document["success"]:
                self.empty = document is not None and document.get("reason") == "empty"
                return
            lease_id = document["leaseId"]
            name = f"{QUEUE}/{document['partition']}"
            sim.lease_events.append(partition_grant(name, document, flight.invoked_ms, flight.completed_ms))
            sim.deliveries += pop_deliveries(document, flight.invoke)
            self.lease = {"leaseId": lease_id, "name": name, "messages": list(document["messages"])}
            return
        lease = self.lease
        answer = ack_answer(document)
        sim.acks.append(Ack(transaction_id=message["transactionId"], lease_id=str(lease["leaseId"]), status=status,
                            answer=answer, at=flight.complete or flight.invoke))
        if document is None or status == "failed" or answer != "success" or not lease["messages"]:
            # The lease ends here (a failed ack, the last message, or an answer that says it is gone):
            # the consumer stops relying on it from this ack's invoke.
            sim.lease_events.append(partition_release(lease["name"], lease["leaseId"], flight.invoked_ms,
                                                      flight.completed_ms or flight.invoked_ms, answer))
            self.lease = None


# -- the command ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.simulation",
                                     description="Replay seeds of the deterministic power-loss simulation of Queen.")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="replay one seed")
    which.add_argument("--seeds", help="a range of seeds, A-B (both included)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"client steps per seed (default {STEPS})")
    parser.add_argument("--crashes", type=int, default=CRASHES,
                        help=f"power losses planned per seed, besides the last (default {CRASHES})")
    parser.add_argument("--control", choices=sorted(name for name in CONTROLS if name), default="",
                        help="run with a deliberate bug, to see it caught")
    parser.add_argument("--trace", action="store_true", help="print every request and answer, and the power losses")
    parser.add_argument("--full", action="store_true", help="print violations whole (by default cut at 4,000 characters)")
    parser.add_argument("--log", action="store_true", help="show the server's log (by default silenced: each "
                        "crash logs a failed write)")
    args = parser.parse_args(argv)
    if not args.log:
        logging.getLogger("queen").setLevel(logging.CRITICAL)
    if args.seed is not None:
        seeds = [args.seed]
    else:
        first, _, last = args.seeds.partition("-")
        seeds = range(int(first), int(last or first) + 1)
    failed = []
    for seed in seeds:
        report = run_seed(seed, steps=args.steps, crashes=args.crashes, control=args.control)
        if args.trace:
            for entry in report.trace:
                print("  " + " ".join(map(str, entry)))
        print(report.summary())
        for violation in report.violations:
            text = json.dumps(violation, default=str)
            print("  violation:", text if args.full else text[:4000])
        if report.violations:
            failed.append(seed)
    if failed:
        print(f"seeds with violations: {' '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
