"""Locks and semaphores across SIGKILL (promises P2 and P3): clients acquire, renew and release a
lock (one permit) and a semaphore (two) of a real `queen serve` while it is killed and restarted;
the grants, renewals and releases they were answered must never put more holders on a name than
it has permits while their leases are valid, and tokens and fences must never go back, also
across the restarts (tests/faults/checkers.py, check_leases). The same history with one grant
inside a holder's valid window (its release dropped) must be rejected.

Times are the wall clock in ms on both sides (one machine): the checker allows TOLERANCE_MS.
Clients wait on the real process (answers, restarts); nothing sleeps for time to pass.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

from queen.testing import ServerProcess
from tests.faults.checkers import Grant, Release, Renewal, check_leases
from tests.faults.killing import JsonClient, Target, kill_while_running

SEED = 20261201
CLIENTS = 4
ATTEMPTS_PER_CLIENT = 120
KILLS = 3
TTL_S = 2
TOLERANCE_MS = 20
LOCKS = {"l": 1, "s": 2}


def now_ms() -> int:
    return int(time.time() * 1000)


def run_client(target: Target, process: int, events: list, lock: threading.Lock) -> None:
    rng = random.Random(SEED * 17 + process)
    client = JsonClient(target, "/api/v1/locks")
    for attempt in range(ATTEMPTS_PER_CLIENT):
        name = rng.choice(sorted(LOCKS))
        owner = f"p{process}-{attempt}"  # a fresh owner per attempt: a lost grant is a holder nobody knows
        invoked = now_ms()
        got = client.call({"op": "acquire", "name": name, "ttlSeconds": TTL_S, "owner": owner, "limit": LOCKS[name],
                           "waitMs": 3000})  # parked on the server until a permit frees
        completed = now_ms()
        if got is None or not got.get("acquired"):
            continue
        slot, token = got["slot"], got["token"]
        mine = [Grant(name=name, slot=slot, owner=owner, token=token, fence=got["fence"], invoked_at=invoked,
                      completed_at=completed, expires_at=got["expiresAt"], already=bool(got.get("already")))]
        for _ in range(rng.randrange(0, 3)):
            invoked = now_ms()
            renewed = client.call({"op": "renew", "name": name, "slot": slot, "token": token, "ttlSeconds": TTL_S,
                                   "owner": owner})
            completed = now_ms()
            if renewed is None or not renewed.get("renewed"):
                break
            token = renewed["token"]
            mine.append(Renewal(name=name, slot=slot, owner=owner, token=token, fence=renewed["fence"],
                                invoked_at=invoked, completed_at=completed, expires_at=renewed["expiresAt"]))
        invoked = now_ms()
        released = client.call({"op": "release", "name": name, "slot": slot, "token": token, "owner": owner})
        answered = "unknown" if released is None else ("released" if released.get("released") else released["reason"])
        mine.append(Release(name=name, slot=slot, owner=owner, invoked_at=invoked, completed_at=now_ms(),
                            answered=answered))
        with lock:
            events.extend(mine)
    client.close()


def test_lock_and_semaphore_leases_across_sigkills(tmp_path):
    rng = random.Random(SEED)
    events: list = []
    lock = threading.Lock()
    target = Target(ServerProcess(str(tmp_path / "data")).start())
    threads = [threading.Thread(target=run_client, args=(target, p, events, lock), daemon=True) for p in range(CLIENTS)]
    kill_while_running(target, threads, lambda: len(events), KILLS, rng, (30, 90))
    grants = [e for e in events if type(e) is Grant]
    print(f"leases: {len(grants)} grants, {sum(type(e) is Renewal for e in events)} renewals, "
          f"{sum(type(e) is Release for e in events)} releases on {len(LOCKS)} names, {KILLS} SIGKILLs")
    assert len(grants) > 50
    for name, permits in LOCKS.items():
        mine = [e for e in events if e.name == name]
        assert check_leases(mine, permits, tolerance_ms=TOLERANCE_MS) == [], name

    # Negative control on the real history: drop one holder's release, so its lease stands until
    # the expiresAt it was told; the grants of that permit the server made inside it (as a server
    # that forgot the holder would), and an intruder 100 ms in, must be reported.
    holder = next(g for g in grants if g.name == "l" and g.expires_at - g.completed_at > 1_000)
    kept = [e for e in events if e.name == "l" and not (type(e) is Release and e.owner == holder.owner)]
    intruder = dataclasses.replace(holder, owner="intruder", token=holder.token + 10_000_000,
                                   fence=holder.token + 10_000_000, invoked_at=holder.completed_at + 99,
                                   completed_at=holder.completed_at + 100, expires_at=holder.completed_at + 2_100)
    violations = check_leases(kept + [intruder], 1, tolerance_ms=TOLERANCE_MS)
    assert any(v["kind"] in ("too_many_holders", "slot_handed_over") for v in violations), violations
