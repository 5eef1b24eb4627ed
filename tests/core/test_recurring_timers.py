"""Recurring timers, pure: cron schedules in a time zone and fixed periods, driven through a
simulated year with now_ms passed to each step. Every period is expected at a time computed here
independently of the code under test; the tick lands one ms before it (nothing may fire) and then
on it (exactly that period fires, its message naming it). Also moves, cancels, the one catch-up
fire after a long gap, replay and snapshots mid-period, and the refusals of bad schedules."""

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from queen.core import records as rec
from queen.core.limits import Limits
from queen.core.state import State, Tick
from queen.core.timer_ops import parse_timer_ops
from queen.errors import BadRequest
from tests.core.queue_harness import T0, Queues

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
YEAR_MS = 366 * 86_400_000
MINUTE_MS, HOUR_MS, DAY_MS = 60_000, 3_600_000, 86_400_000


def ms(moment: datetime) -> int:
    return int(moment.timestamp()) * 1000


def utc(*fields) -> int:
    return ms(datetime(*fields, tzinfo=UTC))


def appended(records) -> list:
    return [r for r in records if type(r) is rec.Append]


def period_of(message) -> tuple[str, int]:
    """(stem, period ms) of a recurring timer's message, from its transactionId <stem>@<period>."""
    stem, _, period = message.transaction_id.rpartition("@")
    return stem, int(period)


def tick_to(q: Queues, at_ms: int) -> list:
    """Tick once at at_ms; the messages that step appended."""
    before = len(q.records)
    q.tick(at_ms - q.now)
    return appended(q.records[before:])


def daily(hour: int, minute: int, tz: ZoneInfo, after_ms: int, until_ms: int) -> list[int]:
    """The documented rule, computed without cron: each local day at hour:minute; a time the clock
    skips (spring forward) at the first valid minute after it; a time it passes twice (fall back)
    once, at the first pass (fold=0)."""
    periods = []
    day = datetime.fromtimestamp(after_ms / 1000, tz).date() - timedelta(days=1)
    while True:
        local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
        while local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != local.replace(tzinfo=None):
            local += timedelta(minutes=1)  # in the gap: wall-clock minutes until one exists
        at = ms(local)
        if at > until_ms:
            return periods
        if at > after_ms:
            periods.append(at)
        day += timedelta(days=1)


def walk(q: Queues, expected: dict[int, set[str]], look_early=frozenset()) -> None:
    """Through every expected period in time order, ticking on it: exactly the keys expected fire,
    once each, each message naming its key and that period (a fire at any other time, early or
    late, would name another period or come at another tick). At the periods in look_early, a
    tick one ms before comes first, and nothing may fire at it."""
    for at in sorted(expected):
        if at in look_early:
            early = tick_to(q, at - 1)
            assert early == [], (at, [m.transaction_id for m in early])
        fired = tick_to(q, at)
        assert sorted(m.transaction_id for m in fired) == sorted(f"{key}@{at}" for key in expected[at]), at
        assert all(m.created_at_ms == at for m in fired)


def near(changes: list[int], periods, days: int = 2) -> set[int]:
    return {at for at in periods if any(abs(at - change) <= days * DAY_MS for change in changes)}


# The DST changes of the simulated year (T0 is 2023-11-14): Berlin 2024-03-31 01:00 UTC and
# 2024-10-27 01:00 UTC, New York 2024-03-10 07:00 UTC and 2024-11-03 06:00 UTC.
DST_CHANGES = [utc(2024, 3, 31, 1), utc(2024, 10, 27, 1), utc(2024, 3, 10, 7), utc(2024, 11, 3, 6)]


def test_a_simulated_year_of_daily_cron_and_period_timers_across_both_dst_changes_fires_each_period_once():
    q = Queues()
    # Retention takes the messages away, so the partitions' producer ids do not pile up for a year.
    q.configure(retentionSeconds=60, dedupWindowSeconds=60)
    end = T0 + YEAR_MS
    schedules = {
        "berlin-9": ({"cron": "0 9 * * *", "timezone": "Europe/Berlin"}, daily(9, 0, BERLIN, T0, end)),
        "berlin-230": ({"cron": "30 2 * * *", "timezone": "Europe/Berlin"}, daily(2, 30, BERLIN, T0, end)),
        "ny-9": ({"cron": "0 9 * * *", "timezone": "America/New_York"}, daily(9, 0, NEW_YORK, T0, end)),
        "ny-230": ({"cron": "30 2 * * *", "timezone": "America/New_York"}, daily(2, 30, NEW_YORK, T0, end)),
        "ny-130": ({"cron": "30 1 * * *", "timezone": "America/New_York"}, daily(1, 30, NEW_YORK, T0, end)),
        "every-7h": ({"everyMs": 7 * HOUR_MS + 13, "at": T0 + 5}, list(range(T0 + 5, end + 1, 7 * HOUR_MS + 13))),
    }
    for key, (schedule, periods) in schedules.items():
        answer = q.timer("schedule", key=key, partition=key, payload={"job": key}, **schedule)
        assert answer["scheduled"] is True and answer["at"] == periods[0], key
        assert {k: answer[k] for k in schedule if k != "at"} == {k: v for k, v in schedule.items() if k != "at"}
    # The DST days, spelled out.
    berlin_230, ny_230, ny_130 = (set(schedules[k][1]) for k in ("berlin-230", "ny-230", "ny-130"))
    assert utc(2024, 3, 31, 1, 0) in berlin_230  # 02:30 does not exist: 03:00 CEST, the first minute after
    assert utc(2024, 3, 31, 0, 30) not in berlin_230 and utc(2024, 3, 30, 1, 30) in berlin_230
    assert utc(2024, 10, 27, 0, 30) in berlin_230  # 02:30 happens twice: once, at the first (CEST)
    assert utc(2024, 10, 27, 1, 30) not in berlin_230
    assert utc(2024, 3, 10, 7, 0) in ny_230  # 03:00 EDT
    assert utc(2024, 11, 3, 5, 30) in ny_130 and utc(2024, 11, 3, 6, 30) not in ny_130  # 01:30 EDT only
    assert set(schedules["berlin-9"][1]) >= {utc(2024, 3, 30, 8), utc(2024, 3, 31, 7), utc(2024, 10, 27, 8)}
    assert all(len(periods) >= 365 for _, periods in schedules.values())
    expected: dict[int, set[str]] = {}
    for key, (_, periods) in schedules.items():
        for at in periods:
            expected.setdefault(at, set()).add(key)
    walk(q, expected, look_early=near(DST_CHANGES, expected))
    # Each still pending, due at its next period, its schedule shown.
    got = q.timer(key="berlin-230")
    assert got["found"] is True and got["cron"] == "30 2 * * *" and got["timezone"] == "Europe/Berlin"
    assert got["at"] == daily(2, 30, BERLIN, q.now, q.now + 2 * DAY_MS)[0]
    assert q.timer(key="every-7h")["everyMs"] == 7 * HOUR_MS + 13 and q.timer(key="every-7h")["at"] > q.now
    assert q.state.shards[0].queues.timers.count == len(schedules)


@pytest.mark.parametrize("zone, changes", [("Europe/Berlin", DST_CHANGES[:2]), ("America/New_York", DST_CHANGES[2:])])
def test_every_quarter_hour_across_both_dst_changes_runs_by_elapsed_time(zone, changes):
    """A wildcard minute runs by elapsed time: both passes of a repeated hour count, none of a
    skipped one exists. Both zones' offsets are whole hours, so their quarter hours are UTC's."""
    for change in changes:
        q = Queues()
        q.now = change - DAY_MS - 7
        q.timer("schedule", key="quarter", payload=1, cron="*/15 * * * *", timezone=zone)
        periods = range(change - DAY_MS, change + DAY_MS + 1, 15 * MINUTE_MS)
        walk(q, {at: {"quarter"} for at in periods}, look_early=set(periods))
        assert len(periods) == 2 * 96 + 1


def test_coarse_irregular_ticks_around_dst_changes_fire_late_by_at_most_a_tick_and_never_twice():
    """As a loaded server ticks: steps of 1 ms to 10 minutes (less than the shortest period), the
    messages compared with the expected periods afterwards."""
    import random

    rng = random.Random(5)
    for start in (utc(2024, 3, 30, 12), utc(2024, 10, 26, 12)):
        q = Queues()
        q.now = start
        q.timer("schedule", key="quarter", payload=1, cron="*/15 * * * *", timezone="Europe/Berlin")
        q.timer("schedule", key="daily", payload=2, cron="30 2 * * *", timezone="Europe/Berlin")
        q.timer("schedule", key="every", payload=3, everyMs=17 * MINUTE_MS + 1)
        end = start + DAY_MS  # the change comes about 13 hours in
        steps = {}
        while q.now < end:
            step = rng.randrange(1, 10 * MINUTE_MS)
            for message in tick_to(q, q.now + step):
                steps[message.transaction_id] = (message.created_at_ms, step)
        fired = [message for message in appended(q.records)]
        assert len({m.transaction_id for m in fired}) == len(fired)  # each period once
        for message in fired:
            _, period = period_of(message)
            created, step = steps[message.transaction_id]
            assert period <= created < period + step  # never early, late by less than the tick that fired it
        by_key = {key: sorted(period_of(m)[1] for m in fired if period_of(m)[0] == key)
                  for key in ("quarter", "daily", "every")}
        assert by_key["quarter"] == list(range(start + 15 * MINUTE_MS, by_key["quarter"][-1] + 1, 15 * MINUTE_MS))
        assert by_key["daily"] == daily(2, 30, BERLIN, start, end)[:len(by_key["daily"])] and len(by_key["daily"]) >= 1
        assert by_key["every"] == list(range(start + 17 * MINUTE_MS + 1, by_key["every"][-1] + 1, 17 * MINUTE_MS + 1))


@pytest.mark.parametrize("minutes_late", [0, 30, 75, 100])
def test_a_fixed_time_job_fires_once_in_a_repeated_hour_however_late_its_fire_or_its_schedule(minutes_late):
    """Berlin 2024-10-27: 02:00-03:00 local happens twice (00:00-01:00 UTC in CEST, then 01:00-02:00
    UTC in CET). A 02:30 job runs at the first pass only: a fire late into the second pass, or a
    schedule made during it, sets the next run a day later, never the first pass again (behind now)."""
    first_pass, next_day = utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)
    q = Queues()
    q.now = first_pass - HOUR_MS
    q.timer("schedule", key="late", cron="30 2 * * *", timezone="Europe/Berlin", payload=1)
    assert [m.transaction_id for m in tick_to(q, first_pass + minutes_late * MINUTE_MS)] == [f"late@{first_pass}"]
    assert q.timer(key="late")["at"] == next_day
    q.timer("schedule", key="now", cron="30 2 * * *", timezone="Europe/Berlin", payload=2)
    assert q.timer(key="now")["at"] == next_day
    assert tick_to(q, next_day - 1) == []


def test_a_fire_and_its_re_arm_are_one_step_and_the_message_names_its_period():
    q = Queues()
    q.timer("schedule", key="tick", at=T0 + 1_000, everyMs=5_000, payload="p", partition="p")
    q.timer("schedule", key="named", at=T0 + 1_000, everyMs=5_000, payload="n", partition="p", transactionId="report")
    before = len(q.records)
    assert {m.transaction_id for m in tick_to(q, T0 + 1_000)} == {f"tick@{T0 + 1_000}", f"report@{T0 + 1_000}"}
    step = [type(r) for r in q.records[before:]]
    assert [k for k in step if k is not rec.PartitionCreate] == [rec.TimerRearm, rec.Append] * 2  # no timer_fired
    assert q.timer(key="tick")["at"] == T0 + 6_000 and q.timer(key="named")["transactionId"] == "report"
    messages = q.pop(partition="p", batch=10, autoAck=True)["messages"]
    assert sorted(m["transactionId"] for m in messages) == sorted([f"tick@{T0 + 1_000}", f"report@{T0 + 1_000}"])


def test_missed_periods_after_a_long_gap_fire_once_then_the_next_period_after_now():
    q = Queues()
    q.timer("schedule", key="minutely", everyMs=MINUTE_MS, payload=1)
    q.timer("schedule", key="nine", cron="0 9 * * *", timezone="Europe/Berlin", payload=2)
    first_nine = daily(9, 0, BERLIN, T0, T0 + 2 * DAY_MS)[0]
    assert [m.transaction_id for m in tick_to(q, T0 + MINUTE_MS)] == [f"minutely@{T0 + MINUTE_MS}"]
    # Down for five days and a bit: one fire each, for the period it was due at, at the restart's first tick.
    restart = T0 + 5 * DAY_MS + 12_345
    fired = tick_to(q, restart)
    assert sorted(m.transaction_id for m in fired) == sorted([f"minutely@{T0 + 2 * MINUTE_MS}", f"nine@{first_nine}"])
    assert all(m.created_at_ms == restart for m in fired)
    # Then the first period after now, on the period's own phase: no burst of the missed ones.
    next_minute = T0 + (restart - T0) // MINUTE_MS * MINUTE_MS + MINUTE_MS
    assert q.timer(key="minutely")["at"] == next_minute
    assert q.timer(key="nine")["at"] == daily(9, 0, BERLIN, restart, restart + 2 * DAY_MS)[0]
    assert tick_to(q, next_minute - 1) == []
    assert [m.transaction_id for m in tick_to(q, next_minute)] == [f"minutely@{next_minute}"]


def test_moving_a_recurring_timer_replaces_its_schedule_and_a_cancel_ends_it():
    q = Queues()
    first = q.timer("schedule", key="job", everyMs=10_000, payload="every")
    assert tick_to(q, T0 + 10_000)[0].transaction_id == f"job@{T0 + 10_000}"
    # Moved to a cron schedule: the period timer never fires again.
    moved = q.timer("schedule", key="job", cron="*/5 * * * *", payload="cron")
    assert moved["replaced"] is True and moved["version"] > first["version"] and "everyMs" not in moved
    cron_at = moved["at"]
    assert cron_at % (5 * MINUTE_MS) == 0 and T0 + 10_000 < cron_at <= T0 + 10_000 + 5 * MINUTE_MS
    assert [tick_to(q, at) for at in range(T0 + 20_000, cron_at, 10_000)] == [[]] * len(range(T0 + 20_000, cron_at, 10_000))
    [message] = tick_to(q, cron_at)
    assert message.data == b'"cron"' and message.transaction_id == f"job@{cron_at}"
    # Moved to a one-shot timer: fires once, then is gone.
    q.timer("schedule", key="job", delayMs=1_000, payload="once")
    assert "cron" not in q.timer(key="job") and not q.state.shards[0].queues.timers.recurring
    [once] = tick_to(q, q.now + 1_000)
    assert once.data == b'"once"' and once.transaction_id is None
    assert tick_to(q, q.now + DAY_MS) == [] and q.timer(key="job")["found"] is False
    # A cancel ends a recurring timer: it never fires again.
    q.timer("schedule", key="job", everyMs=1_000, payload="again")
    assert len(tick_to(q, q.now + 1_000)) == 1
    cancelled = q.timer("cancel", key="job")
    assert cancelled["cancelled"] is True and cancelled["version"] == q.timer(key="job").get("version", cancelled["version"])
    assert tick_to(q, q.now + DAY_MS) == [] and q.timer(key="job")["found"] is False
    timers = q.state.shards[0].queues.timers
    assert timers.recurring == {} and timers.count == 0


def test_a_re_fire_of_a_period_that_already_fired_is_a_duplicate_not_a_second_message():
    """A client that repeats a schedule whose answer it lost, after the first period fired, sets
    the same first period again: its fire carries the same transactionId, known in the partition."""
    q = Queues()
    op = {"key": "report", "at": T0 + 1_000, "everyMs": HOUR_MS, "payload": "r", "partition": "p"}
    q.timer("schedule", **op)
    assert len(tick_to(q, T0 + 1_000)) == 1
    q.timer("schedule", **op)
    assert tick_to(q, T0 + 1_050) == []
    timers = q.state.shards[0].queues.timers
    assert timers.stats.fire_duplicates == 1 and q.timer(key="report")["at"] == T0 + 1_000 + HOUR_MS
    assert [m["transactionId"] for m in q.pop(partition="p", batch=10)["messages"]] == [f"report@{T0 + 1_000}"]


def test_a_crash_before_the_fire_step_was_written_fires_the_same_period_after_the_restart():
    q = Queues()
    q.timer("schedule", key="k", everyMs=MINUTE_MS, payload=1)
    written = len(q.records)
    [fired] = tick_to(q, T0 + MINUTE_MS + 20)
    # The fire's frame never reached the disk: the restart's state is the log before it.
    restarted = State(1, T0)
    for record in q.records[:written]:
        restarted.replay(record)
    again = [r for r in rec.decode(restarted.apply(Tick(), T0 + 5 * MINUTE_MS).records) if type(r) is rec.Append]
    assert [m.transaction_id for m in again] == [fired.transaction_id] == [f"k@{T0 + MINUTE_MS}"]


def recurring_state(state: State) -> tuple[dict, dict]:
    timers = state.shards[0].queues.timers
    return ({queue: dict(keys) for queue, keys in timers.pending.items()},
            {queue: dict(keys) for queue, keys in timers.recurring.items()})


def test_replay_and_snapshots_mid_period_rebuild_recurring_timers_which_then_fire_as_the_original():
    q = Queues()
    q.timer("schedule", key="berlin", cron="30 2 * * *", timezone="Europe/Berlin", payload=1, partition="a")
    q.timer("schedule", key="fast", everyMs=1_500, at=T0 + 100, payload=2, partition="b", transactionId="f")
    q.timer("schedule", key="gone", everyMs=2_000, payload=3)
    q.timer("schedule", key="once", delayMs=7_777, payload=4)
    q.timer("schedule", key="to-once", everyMs=1_000, payload=5)
    for at in range(T0 + 50, T0 + 20_000, 50):
        tick_to(q, at)
    q.timer("cancel", key="gone")
    q.timer("schedule", key="to-once", delayMs=DAY_MS, payload=6)
    tick_to(q, T0 + 20_020)  # mid-period for every one of them
    pending, recurring = recurring_state(q.state)
    assert set(recurring["orders"]) == {"berlin", "fast"} and set(pending["orders"]) == {"berlin", "fast", "to-once"}
    assert recurring_state(q.replayed()) == (pending, recurring)
    # A snapshot now, then more of the log on top of it: the state recovery rebuilds.
    sections = q.state.snapshot_capture()()
    in_snapshot = len(q.records)
    restored = State(1, T0)
    for record in rec.decode(sections["queues"]):
        restored.replay(record)
    assert recurring_state(restored) == (pending, recurring)
    assert rec.Kind.PENDING_SCHEDULES in {rec.Kind(k) for k in sections["queues"] if type(k) is int and k in (43, 46)}
    for at in range(T0 + 20_050, T0 + 30_000, 50):
        tick_to(q, at)
    for record in q.records[in_snapshot:]:
        restored.replay(record)
    assert recurring_state(restored) == recurring_state(q.state)
    # Both go on alike: the same periods, the same messages, across a DST change.
    later = utc(2024, 3, 31, 1, 0) + 10
    original = [(m.transaction_id, m.created_at_ms) for m in tick_to(q, later)]
    again = [(m.transaction_id, m.created_at_ms) for m in
             (r for r in rec.decode(restored.apply(Tick(), later).records) if type(r) is rec.Append)]
    assert sorted(original, key=str) == sorted(again, key=str)
    assert sorted(str(tid).rpartition("@")[0] for tid, _ in original) == ["", "berlin", "f"]  # to-once: no id


def test_deleting_a_queue_drops_its_recurring_timers():
    q = Queues()
    q.timer("schedule", key="a", everyMs=1_000, payload=1)
    q.timer("schedule", key="b", cron="* * * * *", payload=1)
    assert q.admin("delete")["timers"] == 2
    timers = q.state.shards[0].queues.timers
    assert timers.recurring == {} and tick_to(q, T0 + DAY_MS) == []
    assert recurring_state(q.replayed()) == ({}, {})


def test_list_and_get_show_the_schedule_and_the_next_time():
    q = Queues()
    q.timer("schedule", key="a-cron", cron="0 9 * * 1-5", timezone="America/New_York", payload=1)
    q.timer("schedule", key="b-every", everyMs=90_000, delayMs=5, payload=1)
    q.timer("schedule", key="c-once", delayMs=5, payload=1)
    page = q.state.shards[0].queues.timers.page("orders", "", None, 10)
    by_key = {item["key"]: item for item in page["items"]}
    assert by_key["a-cron"]["cron"] == "0 9 * * 1-5" and by_key["a-cron"]["timezone"] == "America/New_York"
    assert datetime.fromtimestamp(by_key["a-cron"]["at"] / 1000, NEW_YORK).hour == 9
    assert by_key["b-every"]["everyMs"] == 90_000 and by_key["b-every"]["at"] == T0 + 5
    assert not {"cron", "timezone", "everyMs"} & set(by_key["c-once"])
    got = q.timer(key="a-cron")
    assert got["cron"] == "0 9 * * 1-5" and got["at"] == by_key["a-cron"]["at"] and "everyMs" not in got
    assert datetime.fromtimestamp(got["at"] / 1000, NEW_YORK).date().weekday() < 5


def test_a_recurring_schedule_in_a_transaction_commits_with_the_step():
    q = Queues()
    answer, written = q.txn({"timers": [{"op": "schedule", "queue": "orders", "key": "nightly", "cron": "0 3 * * *",
                                         "timezone": "Europe/Berlin", "payload": "go"}]})
    assert answer["success"] is True and answer["timers"][0]["cron"] == "0 3 * * *"
    assert [type(r) for r in written if type(r) in (rec.TimerSet, rec.TimerSchedule)] == [rec.TimerSet,
                                                                                         rec.TimerSchedule]
    assert datetime.fromtimestamp(answer["timers"][0]["at"] / 1000, BERLIN).hour == 3


@pytest.mark.parametrize("fields, code", [
    ({"cron": "0 9 * *"}, "invalid_cron"),
    ({"cron": "0 0 9 * * *"}, "invalid_cron"),  # a seconds field: not a 5-field expression
    ({"cron": "61 * * * *"}, "invalid_cron"),
    ({"cron": "0 9 31 2 *"}, "invalid_cron"),
    ({"cron": "* * */20 * 1L"}, "invalid_cron"),  # well formed, but names no time at all
    ({"cron": 9}, "invalid_cron"),
    ({"cron": "0 9 * * *", "timezone": "Mars/Olympus_Mons"}, "unknown_timezone"),
    ({"cron": "0 9 * * *", "timezone": "../../etc/passwd"}, "unknown_timezone"),
    ({"cron": "0 9 * * *", "timezone": "localtime"}, "unknown_timezone"),  # the host's zone: not the same everywhere
    ({"cron": "0 9 * * *", "timezone": ""}, "invalid_timezone"),
    ({"cron": "0 9 * * *", "timezone": 1}, "invalid_timezone"),
    ({"cron": "0 9 * * *", "everyMs": 60_000}, "schedule_conflict"),
    ({"cron": "0 9 * * *", "delayMs": 5}, "schedule_conflict"),
    ({"cron": "0 9 * * *", "at": T0 + 5}, "schedule_conflict"),
    ({"everyMs": 60_000, "timezone": "UTC"}, "timezone_without_cron"),
    ({"delayMs": 5, "timezone": "UTC"}, "timezone_without_cron"),
    ({"everyMs": 999}, "invalid_every"),
    ({"everyMs": 365 * DAY_MS + 1}, "invalid_every"),
    ({"everyMs": 1_500.0}, "invalid_every"),
    ({"everyMs": "1m"}, "invalid_every"),
    ({"everyMs": 60_000, "at": T0 + 366 * DAY_MS}, "at_too_far"),
    ({"everyMs": 60_000, "at": T0, "delayMs": 5}, "at_conflict"),
    ({"everyMs": 60_000, "key": "k" * 237}, "period_id_too_long"),
    ({"everyMs": 60_000, "transactionId": "t" * 237}, "period_id_too_long"),
    ({"everyMs": 60_000, "key": "queen:7"}, "reserved_transaction_id"),
])
def test_bad_recurring_schedules_are_refused_whole(fields, code):
    op = {"op": "schedule", "queue": "q", "key": "k", "payload": 1, **fields}
    with pytest.raises(BadRequest) as caught:
        parse_timer_ops([{"op": "get", "queue": "q", "key": "fine"}, op], Limits(), T0)
    assert caught.value.code == code, caught.value
    assert caught.value.details.get("index") == 1


def test_the_edges_of_the_bounds_are_taken():
    ops = parse_timer_ops([
        {"op": "schedule", "queue": "q", "key": "a", "payload": 1, "everyMs": 1_000},
        {"op": "schedule", "queue": "q", "key": "b", "payload": 1, "everyMs": 365 * DAY_MS},
        {"op": "schedule", "queue": "q", "key": "c" * 236, "payload": 1, "everyMs": 1_000},
        {"op": "schedule", "queue": "q", "key": "queen:d", "payload": 1, "everyMs": 1_000, "transactionId": "d"},
        {"op": "schedule", "queue": "q", "key": "e", "payload": 1, "cron": "0 0 29 2 *"},  # leap days only
        {"op": "schedule", "queue": "q", "key": "f", "payload": 1, "cron": "0 9 * * MON#1", "timezone": "UTC"},
    ], Limits(), T0)
    assert [op.at_ms for op in ops[:3]] == [T0 + 1_000, T0 + 365 * DAY_MS, T0 + 1_000]
    assert ops[4].at_ms == utc(2024, 2, 29) and ops[4].timezone == "UTC"
    assert ops[5].at_ms == utc(2023, 12, 4, 9) and date(2023, 12, 4).weekday() == 0
