"""The hashed timing wheel: an item comes due once, at the first tick at or after its time (never
before), whatever the gaps between advances; add replaces, schedule keeps the earlier, remove forgets."""

from hypothesis import given, settings
from hypothesis import strategies as st

from queen.core.wheel import TimingWheel

T0 = 1_700_000_000_000


def test_an_item_is_due_at_the_first_tick_at_or_after_its_time_and_only_once():
    wheel = TimingWheel(T0, tick_ms=50, slot_count=8)
    wheel.add("a", T0 + 120)
    assert wheel.advance(T0 + 100) == []
    assert wheel.advance(T0 + 150) == ["a"]
    assert wheel.advance(T0 + 400) == [] and len(wheel) == 0


def test_add_replaces_schedule_keeps_the_earlier_and_remove_forgets():
    wheel = TimingWheel(T0, tick_ms=50, slot_count=8)
    wheel.add("a", T0 + 100)
    wheel.add("a", T0 + 300)  # moved later
    wheel.schedule("b", T0 + 100)
    wheel.schedule("b", T0 + 300)  # kept at the earlier time
    wheel.add("c", T0 + 100)
    wheel.remove("c")
    assert wheel.advance(T0 + 100) == ["b"]
    assert wheel.advance(T0 + 300) == ["a"]


def test_an_item_more_than_a_revolution_ahead_waits_for_its_lap():
    wheel = TimingWheel(T0, tick_ms=50, slot_count=4)  # one revolution: 200 ms
    wheel.add("far", T0 + 1_000)
    for now in range(T0 + 50, T0 + 1_000, 50):
        assert wheel.advance(now) == [], now
    assert wheel.advance(T0 + 1_000) == ["far"]


def test_a_long_pause_finds_everything_due_at_once():
    wheel = TimingWheel(T0, tick_ms=50, slot_count=4)
    for n in range(10):
        wheel.add(n, T0 + 60 * n)
    assert sorted(wheel.advance(T0 + 10_000)) == list(range(10))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5_000), min_size=1, max_size=40), st.lists(st.integers(1, 700), min_size=1, max_size=60))
def test_nothing_comes_due_early_or_late_by_more_than_a_tick_or_twice(due_offsets, steps):
    wheel = TimingWheel(T0, tick_ms=50, slot_count=16)
    for item, offset in enumerate(due_offsets):
        wheel.add(item, T0 + offset)
    now, seen = T0, {}
    for step in steps + [6_000]:
        previous, now = now, now + step
        for item in wheel.advance(now):
            assert item not in seen
            seen[item] = now
            due = T0 + due_offsets[item]
            tick_at = max(-(-due // 50) * 50, T0 + 50)  # its tick: the first at or after due, never T0's own
            assert due <= now  # never early
            assert previous < tick_at <= now  # found by the first advance that reached its tick
    assert sorted(seen) == list(range(len(due_offsets)))
