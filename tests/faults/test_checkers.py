"""The history checkers' own tests: a valid history passes, and every kind of violation each checker
knows is reported for a history built to show it (the checkers' negative controls)."""

import dataclasses
import random

import pytest

from tests.faults.checkers import (
    LATE_FIRE_MS,
    Ack,
    Add,
    Cancel,
    Delivery,
    Grant,
    Loss,
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
    check_leases,
    check_recurring,
    check_set_full,
    check_timers,
    check_total_queue,
    check_transactions,
)


def kinds(violations: list[dict]) -> list[str]:
    return sorted(violation["kind"] for violation in violations)


# ---------------------------------------------------------------------------------------------
# Leases


def grant(owner, token, fence=None, *, at, expires, name="L", slot=0, already=False, took=2):
    return Grant(name=name, slot=slot, owner=owner, token=token, fence=token if fence is None else fence,
                 invoked_at=at, completed_at=at + took, expires_at=expires, already=already)


def renew(owner, token, fence, *, at, expires, name="L", slot=0, took=2):
    return Renewal(name=name, slot=slot, owner=owner, token=token, fence=fence,
                   invoked_at=at, completed_at=at + took, expires_at=expires)


def release(owner, *, at, name="L", slot=0, answered="released"):
    return Release(name=name, slot=slot, owner=owner, invoked_at=at, completed_at=at + 2, answered=answered)


def valid_lock_history():
    return [
        grant("a", 10, at=0, expires=1000),
        renew("a", 11, 10, at=500, expires=1500),
        renew("a", 12, 10, at=1000, expires=2000),
        grant("a", 12, 10, at=1100, expires=2000, already=True),
        release("a", at=1200),
        grant("b", 13, at=1201, expires=3000),  # right after a's release was invoked
        Loss(name="L", slot=0, owner="b", at=3100),  # b paused past its lease
        grant("c", 14, at=3000, expires=4000),  # invoked before b noticed, granted after b's expiry
        renew("c", 15, 14, at=3500, expires=4500),
        # after a restart: tokens keep rising, a new holder after c's lease ran out
        grant("a", 20, at=4600, expires=6000),
        grant("b", 21, at=7000, expires=8000),  # a's lease ended without a release
    ]


def test_valid_lock_history_passes():
    assert check_leases(valid_lock_history(), 1) == []


def test_valid_semaphore_history_passes():
    events = [
        grant("a", 10, at=0, expires=1000, slot=0),
        grant("b", 11, at=5, expires=1000, slot=1),
        renew("a", 12, 10, at=500, expires=1500, slot=0),
        renew("b", 13, 11, at=500, expires=1500, slot=1),
        release("b", at=600, slot=1),
        grant("c", 14, at=601, expires=2000, slot=1),
        grant("d", 15, at=1600, expires=2500, slot=0),
    ]
    assert check_leases(events, 2) == []


def test_concurrent_answers_may_come_in_any_order():
    # two renewals in flight at once may answer tokens in either order
    events = [
        grant("a", 10, at=0, expires=1000, slot=0),
        grant("b", 11, at=0, expires=1000, slot=1),
        renew("a", 13, 10, at=100, expires=1100, slot=0, took=50),
        renew("b", 12, 11, at=100, expires=1100, slot=1, took=10),
    ]
    assert check_leases(events, 2) == []


def test_two_holders_of_a_one_permit_lock():
    events = [
        grant("a", 10, at=0, expires=1000),
        grant("b", 11, at=500, expires=1500),  # a's lease still valid until 1000
    ]
    assert kinds(check_leases(events, 1)) == ["slot_handed_over", "too_many_holders"]


def test_renewal_extends_the_window_that_counts():
    events = [
        grant("a", 10, at=0, expires=1000),
        renew("a", 11, 10, at=900, expires=1900),
        grant("b", 12, at=1200, expires=2500),  # after a's first expiry, before the renewed one
    ]
    assert kinds(check_leases(events, 1)) == ["slot_handed_over", "too_many_holders"]


def test_overlap_within_tolerance_passes():
    events = [grant("a", 10, at=0, expires=1000), grant("b", 11, at=990, expires=2000)]
    assert check_leases(events, 1, tolerance_ms=20) == []
    assert kinds(check_leases(events, 1)) == ["slot_handed_over", "too_many_holders"]


def test_too_many_holders_of_a_semaphore_on_distinct_slots():
    events = [
        grant("a", 10, at=0, expires=1000, slot=0),
        grant("b", 11, at=0, expires=1000, slot=1),
        grant("c", 12, at=100, expires=1000, slot=2),
    ]
    assert kinds(check_leases(events, 2)) == ["too_many_holders"]
    assert check_leases(events, 3) == []


def test_a_loss_does_not_excuse_a_handover_before_expiry():
    events = [
        grant("a", 10, at=0, expires=1000),
        Loss(name="L", slot=0, owner="a", at=300),  # the server said lost long before expiresAt
        grant("b", 11, at=400, expires=2000),
    ]
    assert kinds(check_leases(events, 1)) == ["slot_handed_over", "too_many_holders"]


def test_token_goes_back_after_a_restart():
    events = [
        grant("a", 10, at=0, expires=1000),
        renew("a", 11, 10, at=500, expires=1500),
        # SIGKILL, restart: the server forgot token 11 and hands out 11 again after a's expiry
        grant("b", 11, at=2000, expires=3000),
    ]
    violations = check_leases(events, 1)
    assert kinds(violations) == ["token_not_rising"]
    assert violations[0]["earlier"]["token"] == 11 and violations[0]["later"]["owner"] == "b"


def test_token_repeated_by_a_renewal():
    events = [grant("a", 10, at=0, expires=1000), renew("a", 10, 10, at=500, expires=1500)]
    assert kinds(check_leases(events, 1)) == ["token_not_rising"]


def test_fence_goes_back_on_a_slot():
    events = [
        grant("a", 10, at=0, expires=1000),
        grant("b", 12, 9, at=2000, expires=3000),
    ]
    assert kinds(check_leases(events, 1)) == ["fence_went_back"]


def test_fence_changes_during_renewals():
    events = [
        grant("a", 10, at=0, expires=1000),
        renew("a", 11, 10, at=400, expires=1400),
        renew("a", 12, 11, at=800, expires=1800),  # fence moved up: the holding changed under a
    ]
    violations = check_leases(events, 1)
    assert kinds(violations) == ["fence_changed"]
    assert violations[0]["answer"]["token"] == 12


def test_renewal_without_a_grant():
    events = [renew("a", 11, 10, at=400, expires=1400)]
    assert kinds(check_leases(events, 1)) == ["renewal_without_grant"]


# ---------------------------------------------------------------------------------------------
# Queues


def push(tid, status="queued", mid=None):
    return Push(transaction_id=tid, status=status, message_id=mid if mid is not None else f"m-{tid}")


def delivery(tid, *, at, lease, retry=0, mid=None, offset=0, group=""):
    return Delivery(transaction_id=tid, message_id=mid if mid is not None else f"m-{tid}", offset=offset,
                    partition="p", retry_count=retry, lease_id=lease, at=at, group=group)


def ack(tid, *, at, lease, status="completed", answer="success", group=""):
    return Ack(transaction_id=tid, lease_id=lease, status=status, answer=answer, at=at, group=group)


def valid_queue_history():
    pushes = [push("t1"), push("t2", "duplicate"), push("t3"), push("t4", "unknown", None),
              push("t5", "unknown", None)]
    deliveries = [
        delivery("t1", at=10, lease="L1", offset=0),
        delivery("t2", at=10, lease="L1", offset=1),
        delivery("t3", at=10, lease="L1", offset=2),
        delivery("t1", at=200, lease="L2", retry=1, offset=0),  # L1 expired, t1 came back
        delivery("t3", at=300, lease="L3", retry=1, offset=2),  # failed ack
        delivery("t4", at=300, lease="L3", offset=3),  # the unanswered push landed
    ]
    acks = [
        ack("t2", at=20, lease="L1"),
        ack("t3", at=20, lease="L1", status="failed"),
        ack("t1", at=210, lease="L1", answer="lease_lost"),
        ack("t1", at=220, lease="L2"),
        ack("t1", at=230, lease="L2", answer="already"),
        ack("t3", at=310, lease="L3"),
        ack("t4", at=310, lease="L3"),
    ]
    return pushes, deliveries, acks


def test_valid_queue_history_passes():
    pushes, deliveries, acks = valid_queue_history()
    assert check_total_queue(pushes, deliveries, acks, check_retries=True) == []


def test_lost_queued_push():
    pushes, deliveries, acks = valid_queue_history()
    pushes.append(push("t6"))
    violations = check_total_queue(pushes, deliveries, acks)
    assert kinds(violations) == ["lost"]
    assert violations[0]["push"]["transaction_id"] == "t6"
    assert check_total_queue(pushes, deliveries, acks, drained=False) == []


def test_lost_duplicate_answered_push():
    violations = check_total_queue([push("t1", "duplicate")], [], [])
    assert kinds(violations) == ["lost"]


def test_lost_for_one_group_of_two():
    pushes = [push("t1")]
    deliveries = [delivery("t1", at=10, lease="L1", group="g1")]
    assert kinds(check_total_queue(pushes, deliveries, [], groups=["g1", "g2"])) == ["lost"]


def test_duplicated_message():
    pushes, deliveries, acks = valid_queue_history()
    deliveries.append(delivery("t2", at=400, lease="L4", mid="m-other", offset=7))
    violations = check_total_queue(pushes, deliveries, acks)
    assert kinds(violations) == ["delivered_after_completed", "duplicated"]
    duplicated = next(v for v in violations if v["kind"] == "duplicated")
    assert duplicated["message_ids"] == ["m-other", "m-t2"]


def test_duplicated_between_push_answers():
    pushes = [push("t1", mid="m1"), push("t1", "duplicate", mid="m2")]
    deliveries = [delivery("t1", at=10, lease="L1", mid="m1")]
    assert kinds(check_total_queue(pushes, deliveries, [])) == ["duplicated"]


def test_delivered_after_completed_ack():
    pushes, deliveries, acks = valid_queue_history()
    deliveries.append(delivery("t4", at=500, lease="L5", retry=1, offset=3))
    violations = check_total_queue(pushes, deliveries, acks)
    assert kinds(violations) == ["delivered_after_completed"]
    assert violations[0]["ack"]["at"] == 310


def test_unknown_or_lost_completion_allows_redelivery():
    pushes = [push("t1")]
    deliveries = [delivery("t1", at=10, lease="L1"), delivery("t1", at=100, lease="L2", retry=1)]
    for answer in ("unknown", "lease_lost", "already"):
        acks = [ack("t1", at=20, lease="L1", answer=answer)]
        assert check_total_queue(pushes, deliveries, acks) == []


def test_retry_count_not_rising():
    pushes = [push("t1")]
    deliveries = [delivery("t1", at=10, lease="L1"), delivery("t1", at=100, lease="L2", retry=0)]
    acks = [ack("t1", at=20, lease="L1", status="failed")]
    assert check_total_queue(pushes, deliveries, acks) == []  # off unless asked for
    assert kinds(check_total_queue(pushes, deliveries, acks, check_retries=True)) == ["retry_not_rising"]


# ---------------------------------------------------------------------------------------------
# Timers


def schedule(key, version, at, *, answered="scheduled", invoked=0, took=5):
    return Schedule(queue="timers", key=key, version=version, at=at, marker=f"{key}@{version}",
                    answered=answered, invoked_at=invoked, completed_at=invoked + took)


def fire(key, version, created, mid=None):
    return TimerDelivery(marker=f"{key}@{version}", created_at=created,
                         message_id=mid if mid is not None else f"m-{key}-{version}")


def valid_timer_history():
    schedules = [
        schedule("a", 1, 1000),
        schedule("b", 1, 1000),
        schedule("b", 2, 2000, invoked=500),  # moved later
        schedule("c", 1, 1500),
        schedule("d", 1, 1200),
        schedule("e", 1, 800),
        schedule("e", 2, 900, answered="unknown", invoked=100),  # may have moved it: neither need fire
        schedule("f", 1, 9000),  # due after the end
        schedule("g", 1, 700, answered="unknown"),  # never answered, never fired: fine
    ]
    cancels = [
        Cancel(key="c", version=1, answered="cancelled", invoked_at=600),
        Cancel(key="d", version=1, answered="absent", invoked_at=1300),  # after it fired
    ]
    deliveries = [
        fire("a", 1, 1000),
        fire("a", 1, 1000),  # redelivery of one message: same id
        fire("b", 2, 2010),
        fire("d", 1, 1201),
    ]
    return schedules, cancels, deliveries


def test_valid_timer_history_passes():
    schedules, cancels, deliveries = valid_timer_history()
    assert check_timers(schedules, cancels, deliveries, end_ms=5000) == []


def test_early_timer():
    schedules, cancels, deliveries = valid_timer_history()
    deliveries[0] = fire("a", 1, 990)
    deliveries[1] = fire("a", 1, 990)
    assert kinds(check_timers(schedules, cancels, deliveries, end_ms=5000)) == ["early", "early"]
    assert check_timers(schedules, cancels, deliveries, end_ms=5000, tolerance_ms=10) == []


def test_timer_delivered_twice():
    schedules, cancels, deliveries = valid_timer_history()
    deliveries.append(fire("a", 1, 1800, mid="m-second"))
    violations = check_timers(schedules, cancels, deliveries, end_ms=5000)
    assert kinds(violations) == ["twice"]
    assert {d["message_id"] for d in violations[0]["deliveries"]} == {"m-a-1", "m-second"}


def test_cancelled_timer_fired():
    schedules, cancels, deliveries = valid_timer_history()
    deliveries.append(fire("c", 1, 1500))
    violations = check_timers(schedules, cancels, deliveries, end_ms=5000)
    assert kinds(violations) == ["fired_after_cancel"]


def test_never_fired():
    schedules, cancels, deliveries = valid_timer_history()
    del deliveries[2]  # b's second version never came
    violations = check_timers(schedules, cancels, deliveries, end_ms=5000)
    assert kinds(violations) == ["never_fired"]
    assert violations[0]["schedule"]["marker"] == "b@2"
    assert check_timers(schedules, cancels, deliveries, end_ms=None) == []
    assert check_timers(schedules, cancels, deliveries, end_ms=2000 + 5, tolerance_ms=10) == []


def test_a_lost_autoack_pop_excuses_only_the_timers_it_could_have_taken():
    schedules = [schedule("a", 1, 1000), schedule("b", 1, 9000)]
    # The server died under a pop sent at 1100 (the pop before it was sent at 900): it may have
    # taken a, due at 1000; b was due long after it.
    lost = (LostPop(after=900, until=1150),)
    assert [v["schedule"]["marker"] for v in check_timers(schedules, [], [], end_ms=10_000, lost_pops=lost)] == ["b@1"]
    # A pop that failed before a was due, or long after what the pop before it took, excuses nothing.
    for pop in (LostPop(after=100, until=900), LostPop(after=1000 + LATE_FIRE_MS + 1, until=8000)):
        assert kinds(check_timers(schedules, [], [], end_ms=10_000, lost_pops=(pop,))) == ["never_fired", "never_fired"]


def test_absent_cancel_does_not_excuse_a_timer_that_never_fired():
    schedules = [schedule("a", 1, 1000)]
    cancels = [Cancel(key="a", version=1, answered="absent", invoked_at=500)]
    assert kinds(check_timers(schedules, cancels, [], end_ms=5000)) == ["never_fired"]
    cancels = [Cancel(key="a", version=1, answered="unknown", invoked_at=500)]
    assert check_timers(schedules, cancels, [], end_ms=5000) == []


def test_moved_timer_fires_old_version():
    schedules, cancels, deliveries = valid_timer_history()
    deliveries.append(fire("b", 1, 1000))  # b was moved to version 2 at 505
    violations = check_timers(schedules, cancels, deliveries, end_ms=5000)
    assert kinds(violations) == ["moved_fired_old"]
    assert violations[0]["moved_to"]["version"] == 2


def test_old_version_may_fire_before_the_move():
    schedules = [schedule("a", 1, 100), schedule("a", 2, 2000, invoked=150)]
    deliveries = [fire("a", 1, 100), fire("a", 2, 2000)]
    assert check_timers(schedules, [], deliveries, end_ms=5000) == []


def test_unexplained_delivery():
    assert kinds(check_timers([], [], [fire("zz", 1, 10)])) == ["unexplained"]


# ---------------------------------------------------------------------------------------------
# Generated lease histories: a model server answers overlapping clients; what it answers keeps
# every promise, so the checker must find nothing (no false alarms), and moving one grant into
# its slot's previous lease must be found.


def model_lease_history(rng: random.Random, n_permits: int) -> list:
    ttl = 100
    slots: dict[int, tuple[str, int, int, int]] = {}  # slot -> owner, token, fence, expires
    busy_until: dict[str, int] = {}
    token = 0
    now = 0
    events: list = []
    owners = [f"o{i}" for i in range(n_permits + 2)]
    for _ in range(200):
        now += rng.randint(1, 40)  # the server's action, in order
        owner = rng.choice(owners)
        invoked = now - rng.randint(0, 10)
        if invoked <= busy_until.get(owner, -1):
            continue  # one operation of an owner at a time
        completed = now + rng.randint(0, 10)
        held = [s for s, h in slots.items() if h[0] == owner and h[3] > now]
        if held:
            slot = held[0]
            _, _, fence, _ = slots[slot]
            if rng.random() < 0.3:
                del slots[slot]
                events.append(Release(name="L", slot=slot, owner=owner, invoked_at=invoked,
                                      completed_at=completed))
            elif rng.random() < 0.8:
                token += 1
                slots[slot] = (owner, token, fence, now + ttl)
                events.append(Renewal(name="L", slot=slot, owner=owner, token=token, fence=fence,
                                      invoked_at=invoked, completed_at=completed, expires_at=now + ttl))
            else:
                continue  # the owner pauses and lets its lease run out
        else:
            free = [s for s in range(n_permits) if s not in slots or slots[s][3] <= now]
            if not free:
                continue
            token += 1
            slots[free[0]] = (owner, token, token, now + ttl)
            events.append(Grant(name="L", slot=free[0], owner=owner, token=token, fence=token,
                                invoked_at=invoked, completed_at=completed, expires_at=now + ttl))
        busy_until[owner] = completed
    return events


@pytest.mark.parametrize("n_permits", [1, 3])
def test_model_histories_pass_and_a_moved_grant_is_caught(n_permits):
    rng = random.Random(n_permits)
    for _ in range(30):
        events = model_lease_history(rng, n_permits)
        assert check_leases(events, n_permits) == []
        # a grant answered right after the previous grant of its slot, under its lease (and that
        # lease not released: its release may have been what freed the slot right then)
        grants = [e for e in events if isinstance(e, Grant)]
        pairs = [(a, b) for a, b in zip(grants, grants[1:], strict=False)
                 if a.slot == b.slot and a.owner != b.owner]
        if not pairs:
            continue
        first, second = pairs[0]
        early = dataclasses.replace(second, invoked_at=first.completed_at, completed_at=first.completed_at + 1)
        broken = [early if e is second else e for e in events
                  if not (isinstance(e, Release) and e.owner == first.owner)]
        assert "slot_handed_over" in kinds(check_leases(broken, n_permits))


# -- set-full ---------------------------------------------------------------------------------------


def test_set_full_accepts_appends_seen_by_later_reads_and_refused_ones_absent():
    adds = [Add(element="a", answered="added", invoked_at=0, completed_at=10),
            Add(element="b", answered="refused", invoked_at=5, completed_at=12),
            Add(element="c", answered="unknown", invoked_at=20, completed_at=30)]
    reads = [Read(elements=(), invoked_at=0, completed_at=5),  # before a's step completed
             Read(elements=("a",), invoked_at=11, completed_at=12),
             Read(elements=("a", "c"), invoked_at=40, completed_at=41)]
    assert check_set_full(adds, reads) == []


def test_set_full_rejects_an_acknowledged_append_missing_from_a_later_read():
    adds = [Add(element="a", answered="added", invoked_at=0, completed_at=10),
            Add(element="b", answered="added", invoked_at=1, completed_at=11)]  # two holders at once
    violations = check_set_full(adds, [Read(elements=("b",), invoked_at=20, completed_at=21)])
    assert [v["kind"] for v in violations] == ["lost"] and violations[0]["add"]["element"] == "a"


def test_set_full_rejects_a_refused_append_that_was_written_and_one_written_twice():
    adds = [Add(element="a", answered="refused", invoked_at=0, completed_at=10),
            Add(element="b", answered="added", invoked_at=11, completed_at=12)]
    kinds = {v["kind"] for v in check_set_full(adds, [Read(elements=("a", "b", "b", "z"), invoked_at=20,
                                                                completed_at=21)])}
    assert kinds == {"unexpected", "twice"}


def test_a_renewal_answered_in_the_same_ms_as_its_grant_sets_the_window_even_when_it_is_shorter():
    events = [Grant(name="s", slot=1, owner="a", token=19, fence=19, invoked_at=1000, completed_at=1000,
                    expires_at=4000),
              Renewal(name="s", slot=1, owner="a", token=20, fence=19, invoked_at=1000, completed_at=1000,
                      expires_at=2000),
              Grant(name="s", slot=1, owner="b", token=30, fence=30, invoked_at=2500, completed_at=2500,
                    expires_at=5000)]
    assert check_leases(events, 2) == []
    # and the window does end at the renewal's expiresAt: a grant inside it is still caught
    inside = [*events[:2], dataclasses.replace(events[2], invoked_at=1500, completed_at=1500)]
    assert check_leases(inside, 2)


# -- transactions ---------------------------------------------------------------------------------

def _txn_state(applied: list[bool], **changes) -> TxnState:
    """What the server would hold after the steps marked applied, all or nothing each."""
    sent = len(applied)
    fields = dict(rows={n: f"v{n}" if done else None for n, done in enumerate(applied)}, source_count=sent + 2,
                  source_left=frozenset({f"src-{n}" for n, done in enumerate(applied) if not done}
                                        | {f"src-{sent}", f"src-{sent + 1}"}),
                  outbox=tuple(f"push-{n}" for n, done in enumerate(applied) if done),
                  pending=frozenset(f"t-{n}" for n, done in enumerate(applied)
                                    if done and not (n + 1 < sent and applied[n + 1])))
    fields.update(changes)
    return TxnState(**fields)


STEPS = [Step(n=0, answered="success"), Step(n=1, answered="unknown"), Step(n=2, answered="success"),
         Step(n=3, answered="unknown")]


def test_transactions_all_or_nothing_with_unknown_outcomes_either_way_pass():
    assert check_transactions(STEPS, _txn_state([True, False, True, True])) == []
    assert check_transactions(STEPS, _txn_state([True, True, True, False])) == []


def test_a_transaction_with_one_section_missing_is_partial():
    state = _txn_state([True, False, True, True])
    for changed in ({"outbox": ("push-0", "push-3")}, {"source_left": state.source_left | {"src-2"}},
                    {"pending": frozenset({"t-0", "t-2", "t-3"})}, {"source_left": state.source_left - {"src-4"}}):
        violations = check_transactions(STEPS, _txn_state([True, False, True, True], **changed))
        assert [v["kind"] for v in violations] == ["partial"], (changed, violations)


def test_an_acknowledged_transaction_lost_and_a_message_pushed_twice_are_caught():
    violations = check_transactions(STEPS, _txn_state([True, False, False, True]))
    assert {"kind": "lost", "n": 2} in violations
    twice = check_transactions(STEPS, _txn_state([True, False, True, True], outbox=("push-0", "push-2", "push-2",
                                                                                    "push-3")))
    assert [v["kind"] for v in twice] == ["twice"]
    refused = check_transactions([Step(n=0, answered="lease_lost")], _txn_state([True]))
    assert [v["kind"] for v in refused] == ["applied_after_miss"]


# -- recurring timers ------------------------------------------------------------------------------

EVERY = Recurrence(key="r", at=1_000, every=100, cancelled_at=2_000)


def period(p, created=None, mid=None):
    return PeriodDelivery(key="r", period=p, created_at=p + 5 if created is None else created,
                          message_id=str(p if mid is None else mid))


def recurring_kinds(deliveries, recurrence=EVERY):
    return sorted({v["kind"] for v in check_recurring([recurrence], deliveries, margin_ms=100)})


def test_valid_recurring_history_passes_with_a_catch_up_fire_and_a_redelivery():
    chain = [period(p) for p in range(1_000, 1_400, 100)]
    chain.append(period(1_400, created=1_777))  # down from 1_400 to 1_777: one fire for 1_400 to 1_700
    chain += [period(p) for p in range(1_800, 2_000, 100)]
    chain.append(period(1_800))  # the same message again (its ack was lost)
    assert check_recurring([EVERY], chain, margin_ms=100) == []


def test_recurring_violations_are_reported():
    ok = [period(p) for p in range(1_000, 2_000, 100)]
    assert recurring_kinds([d for d in ok if d.period != 1_300]) == ["skipped"]
    assert recurring_kinds([d for d in ok if d.period != 1_000]) == ["skipped"]  # the first period, too
    assert recurring_kinds([period(1_000, created=1_250), *(d for d in ok if d.period > 1_000)]) == ["extra"]  # a burst
    assert recurring_kinds(ok + [period(1_300, mid="again")]) == ["twice"]
    assert recurring_kinds([period(1_000, created=990), *ok[1:]]) == ["early"]
    assert recurring_kinds(ok + [period(2_000), period(2_100)]) == ["fired_after_cancel"]
    assert recurring_kinds(ok[:5]) == ["never_fired"]
    assert recurring_kinds(ok + [period(1_050)]) == ["extra", "off_period"]
    assert recurring_kinds([PeriodDelivery(key="x", period=1, created_at=1, message_id="1")]) == ["never_fired",
                                                                                                  "unexplained"]
