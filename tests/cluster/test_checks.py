"""Each failover check on synthetic histories: one it accepts and one it must reject."""

from tests.cluster.harness import checks
from tests.cluster.harness.workers import LOCKS


class History:
    """Builds worker events: `call(worker, f, t_in, t_out, result, status="ok", epoch=None, **meta)`."""

    def __init__(self):
        self.events = []
        self.n = 0

    def call(self, w, f, t_in, t_out, result=None, status="ok", epoch=None, **meta):
        self.n += 1
        self.events.append({"w": w, "op": self.n, "type": "invoke", "t": t_in, "wall": 1_000_000 + t_in, "f": f,
                            **meta})
        if status is not None:
            self.events.append({"w": w, "op": self.n, "type": status, "t": t_out, "wall": 1_000_000 + t_out, "f": f,
                                "result": result, "epoch": epoch, **meta})
        return self

    def calls(self):
        return checks.calls_of(self.events)


def put(version, applied=True):
    return {"results": [{"applied": applied, "version": version}]}


def get(value, version):
    return {"results": [{"found": value is not None, "value": value, "version": version}]}


def kinds(violations):
    return {v["kind"] for v in violations}


# -- C1 ----------------------------------------------------------------------------------------


def test_c1_acked_write_must_survive():
    h = History().call("a", "put", 0, 5, put(7), key="r0", value="x", expect=0)
    assert checks.check_acked_writes(h.calls(), {"r0": {"value": "x", "version": 7}}) == []
    assert checks.check_acked_writes(h.calls(), {"r0": {"value": "y", "version": 9}}) == []  # superseded
    assert kinds(checks.check_acked_writes(h.calls(), {"r0": None})) == {"lost_write"}
    assert kinds(checks.check_acked_writes(h.calls(), {"r0": {"value": "old", "version": 3}})) == {"lost_write"}
    unknown = History().call("a", "put", 0, 5, status="info", key="r0", value="x", expect=0)
    assert checks.check_acked_writes(unknown.calls(), {"r0": None}) == []  # never acknowledged


def test_c1_an_increment_answered_twice_was_lost():
    def incr(value, version):
        return {"results": [{"applied": True, "value": value, "version": version}]}

    h = (History().call("a", "incr", 0, 5, incr(1, 3), key="c0", by=1)
         .call("a", "incr", 6, 9, incr(2, 4), key="c0", by=1))
    final = {"c0": {"value": 2, "version": 4}}
    assert checks.check_acked_writes(h.calls(), final) == []
    # The increment answered 2 at version 4 was rolled back; a later one (new epoch, higher
    # version) answered 2 again: the final row alone hides it.
    h.call("a", "incr", 20, 25, incr(2, 70_000), key="c0", by=1)
    assert kinds(checks.check_acked_writes(h.calls(), {"c0": {"value": 2, "version": 70_000}})) == {"lost_increment"}


def test_c1_queue_acked_push_must_be_delivered():
    pushed = History().call("a", "push", 0, 1, [{"status": "queued", "messageId": "m1"}], transaction_id="t1")
    message = {"transactionId": "t1", "messageId": "m1", "offset": 0, "partition": "p0", "retryCount": 0,
               "partitionId": 1, "data": {}, "createdAt": 0}
    delivered = History()
    delivered.events = list(pushed.events)
    delivered.n = pushed.n
    delivered.call("b", "pop", 2, 3, {"success": True, "leaseId": 5, "messages": [message]}, queue="hq")
    assert checks.check_queue(delivered.calls()) == []
    assert kinds(checks.check_queue(pushed.calls())) == {"lost"}


# -- C2 ----------------------------------------------------------------------------------------


def test_c2_registers_linearizable_or_not():
    good = (History().call("a", "put", 0, 10, put(5), key="r0", value="x", expect=0)
            .call("b", "get", 20, 30, get("x", 5), key="r0"))
    assert checks.check_registers(good.calls()) == []
    stale = (History().call("a", "put", 0, 10, put(5), key="r0", value="x", expect=0)
             .call("b", "get", 20, 30, get(None, 0), key="r0"))  # a zombie's stale read
    assert kinds(checks.check_registers(stale.calls())) == {"not_linearizable"}
    counters = (History().call("a", "incr", 0, 10, {"results": [{"applied": True, "value": 1, "version": 3}]},
                               key="c0", by=1, max=100)
                .call("b", "incr", 20, 30, {"results": [{"applied": True, "value": 1, "version": 4}]},
                      key="c0", by=1, max=100))
    assert kinds(checks.check_registers(counters.calls())) == {"not_linearizable"}  # an increment lost


# -- C3 ----------------------------------------------------------------------------------------


def test_c3_epochs_do_not_interleave():
    ok = (History().call("a", "put", 0, 10, put(5), epoch=1, key="r0", value="x", expect=0)
          .call("b", "put", 20, 30, put(1000), epoch=2, key="r1", value="y", expect=0))
    assert checks.check_epochs(ok.calls(), {1: 1, 2: 900}) == []
    late_version = History().call("a", "put", 0, 10, put(950), epoch=1, key="r0", value="x", expect=0)
    assert kinds(checks.check_epochs(late_version.calls(), {1: 1, 2: 900})) == {"version_from_later_epoch"}
    zombie = (History().call("b", "put", 0, 10, put(1000), epoch=2, key="r1", value="y", expect=0)
              .call("a", "get", 20, 30, get("old", 5), epoch=1, key="r0"))
    assert kinds(checks.check_epochs(zombie.calls(), {1: 1, 2: 900})) == {"answer_from_ended_epoch"}


# -- C4 ----------------------------------------------------------------------------------------


def grant(slot, token, fence, expires=None):
    return {"results": [{"acquired": True, "slot": slot, "token": token, "fence": fence, "expiresAt": expires}]}


def test_c4_versions_unique_and_fences_rising():
    ok = (History().call("a", "put", 0, 10, put(5), key="r0", value="x", expect=0)
          .call("b", "acquire", 20, 30, grant(0, 6, 6), name="L0", owner="b1")
          .call("c", "acquire", 40, 50, grant(0, 9, 9), name="L0", owner="c1"))
    assert checks.check_versions_unique(ok.calls()) == []
    reused = (History().call("a", "put", 0, 10, put(5), key="r0", value="x", expect=0)
              .call("b", "put", 20, 30, put(5), key="r1", value="y", expect=0))
    assert kinds(checks.check_versions_unique(reused.calls())) == {"version_reused"}
    back = (History().call("b", "acquire", 20, 30, grant(0, 9, 9), name="L0", owner="b1")
            .call("c", "acquire", 40, 50, grant(0, 6, 6), name="L0", owner="c1"))
    assert kinds(checks.check_versions_unique(back.calls())) == {"fence_not_rising"}


# -- C5 ----------------------------------------------------------------------------------------


def _holder(h, w, t, token, expires_in=3000, slot=0, name="L0", success=True):
    owner = f"{w}{t}"
    h.call(w, "acquire", t, t + 1, grant(slot, token, token, 1_000_000 + t + expires_in), name=name, owner=owner)
    h.call(w, "guarded", t + 2, t + 3, {"success": success}, name=name, slot=slot, owner=owner, fence=token, token=token)
    h.call(w, "release", t + 4, t + 5, {"results": [{"released": True}]}, name=name, slot=slot, owner=owner)
    return h


def test_c5_fenced_mutex():
    good = _holder(_holder(History(), "a", 0, 5), "b", 100, 8)
    store = [{"permit": "L0#0", "fence": 5, "accepted": True}, {"permit": "L0#0", "fence": 8, "accepted": True},
             {"permit": "L0#0", "fence": 5, "accepted": False}]
    assert checks.check_fenced_mutex(good.calls(), store, LOCKS) == []
    # Two holders of a lock at once, inside their leases.
    overlap = History()
    overlap.call("a", "acquire", 0, 1, grant(0, 5, 5, 1_003_000), name="L0", owner="a0")
    overlap.call("b", "acquire", 10, 11, grant(0, 8, 8, 1_003_010), name="L0", owner="b10")
    assert {"too_many_holders", "slot_handed_over"} <= kinds(checks.check_fenced_mutex(overlap.calls(), [], LOCKS))
    went_back = [{"permit": "L0#0", "fence": 8, "accepted": True}, {"permit": "L0#0", "fence": 5, "accepted": True}]
    assert kinds(checks.check_fenced_mutex(good.calls(), went_back, LOCKS)) == {"store_fence_went_back"}
    refused_early = _holder(History(), "a", 0, 5, success=False)
    assert kinds(checks.check_fenced_mutex(refused_early.calls(), [], LOCKS)) == {"guard_failed_inside_lease"}
    out_of_order = History()
    out_of_order.call("a", "guarded", 0, 1, {"success": True}, name="L0", slot=0, owner="a", fence=9, token=9)
    out_of_order.call("b", "guarded", 5, 6, {"success": True}, name="L0", slot=0, owner="b", fence=4, token=4)
    assert kinds(checks.check_fenced_mutex(out_of_order.calls(), [], LOCKS)) == {"guard_fence_went_back"}


# -- C6 ----------------------------------------------------------------------------------------


def test_c6_leases_not_shortened_by_failover():
    def history(other_at):
        h = History()
        h.call("a", "acquire", 0, 10, grant(0, 5, 5, 1_003_000), name="L0", owner="a0")  # told: until +3000
        h.call("b", "acquire", other_at, other_at + 10, grant(0, 9, 9, 1_009_000), name="L0", owner="b0")
        return h.calls()

    fault, floor = 1_001_000, 1_002_500  # the fault, and the clock floor of the EPOCH that ended it
    # The failover's EPOCH promised leases live at its floor until +4500: b at +4600 is fine...
    assert checks.check_leases_kept(history(4600), [(fault, floor, 1_004_500)]) == []
    # ...b at +3500 is inside the grace: the failover ended a's lease early.
    assert kinds(checks.check_leases_kept(history(3500), [(fault, floor, 1_004_500)])) == {"lease_shortened"}
    # Inside a's own expiresAt, whatever the grace.
    assert kinds(checks.check_leases_kept(history(2000), [(fault, floor, 1_001_500)])) == {"lease_shortened"}
    # A lease that had ended before the fault is not the failover's business.
    assert checks.check_leases_kept(history(3500), [(1_003_200, 1_004_000, 1_006_000)]) == []
    # Nor one live at the fault that ended before the promotion (the server extends only leases
    # live at the EPOCH's clock floor).
    assert checks.check_leases_kept(history(3500), [(fault, 1_003_100, 1_005_100)]) == []


def test_c6_grace_owed_even_when_the_record_lost_it():
    class Epoch:
        def __init__(self, epoch, floor, grace_until):
            self.epoch, self.clock_floor_ms, self.lease_grace_until_ms = epoch, floor, grace_until

    sound, lost = Epoch(2, 1_002_500, 1_004_500), Epoch(3, 1_010_000, 0)
    assert checks.lease_promises([sound, lost], 2000) == {2: (1_002_500, 1_004_500), 3: (1_010_000, 1_012_000)}


# -- C7 ----------------------------------------------------------------------------------------


def test_c7_timers_fire_once_never_early():
    def scheduled(h):
        return h.call("a", "schedule", 0, 1, {"results": [{"scheduled": True}]}, key="k", at=1_002_000, marker="k")

    def fired(h, created, message_id):
        return h.call("b", "pop", 0, 1, {"success": True, "messages": [
            {"data": {"m": "k"}, "createdAt": created, "messageId": message_id}]}, queue="ht")

    assert checks.check_timers_once(fired(scheduled(History()), 1_002_010, "x").calls()) == []
    assert kinds(checks.check_timers_once(fired(scheduled(History()), 1_001_000, "x").calls())) == {"early"}
    twice = fired(fired(scheduled(History()), 1_002_010, "x"), 1_002_020, "y")
    assert kinds(checks.check_timers_once(twice.calls())) == {"twice"}
    assert kinds(checks.check_timers_once(scheduled(History()).calls(), end_wall=1_010_000)) == {"never_fired"}


# -- C8 ----------------------------------------------------------------------------------------


def test_c8_failover_time():
    h = (History().call("a", "put", 0, 10, put(5), epoch=1, key="r0", value="x", expect=0)
         .call("a", "put", 100, 200, status="info", key="r0", value="y", expect=5)
         .call("a", "put", 300, 2600, put(900), epoch=2, key="r0", value="z", expect=5))
    assert checks.failover_time_ms(h.calls(), 50, 1) == 2550
    assert checks.failover_time_ms(h.calls(), 50, 2) is None  # no write answered by a later epoch


# -- C9 ----------------------------------------------------------------------------------------


def test_c9_convergence():
    from queen.core.records import Delete, Put

    def row(version, value):
        return Put("h", "r0", value, version, version, 0, 0, 0)

    a = [row(1, "x"), row(2, "y"), Delete("h", "r0", 3)]
    assert checks.check_convergence({"a": (a, 0), "b": (list(a), 0)}, 3) == []
    b = [row(1, "x"), row(2, "other"), Delete("h", "r0", 3)]
    found = checks.check_convergence({"a": (a, 0), "b": (b, 0)}, 3)
    assert kinds(found) == {"diverged"} and found[0]["first_difference"][0][0] == 2
    # Past the commit point a node may hold a tail the others lack (it is cut on rejoin).
    assert checks.check_convergence({"a": (a + [row(4, "tail")], 0), "b": (a, 0)}, 3) == []


def test_epoch_first_versions_reads_epoch_records():
    from typing import NamedTuple

    class Epoch(NamedTuple):
        epoch: int
        node: str
        first_version: int

    assert checks.epoch_first_versions([Epoch(7, "n1", 100), Epoch(9, "n2", 5000)]) == {7: 100, 9: 5000}
