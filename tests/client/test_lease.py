"""The client's loss rules as a pure state machine: `now` is passed in, nothing sleeps."""

import pytest

from queen_client.durations import lifetime_fields, seconds, ttl_seconds
from queen_client.lease import Lease, LostReason, State

TTL_S = 30.0


def held(sent_at=100.0):
    lease = Lease(TTL_S)
    lease.granted(sent_at, slot=0, token=7, fence=7)
    return lease


def test_a_grant_is_ours_until_the_send_time_plus_the_lifetime():
    lease = held(sent_at=100.0)
    assert lease.token_at(129.999) == 7
    assert lease.token_at(130.0) is None  # the lifetime counts from when the request was sent


def test_renewal_is_due_a_third_of_the_lifetime_after_the_request_that_extended_it():
    lease = held(sent_at=100.0)
    assert not lease.renew_due(109.9)
    assert lease.renew_due(110.0)
    assert lease.renewed(sent_at=110.0, token=9, now=110.5)
    assert lease.token == 9 and lease.deadline == 140.0
    assert not lease.renew_due(119.9) and lease.renew_due(120.0)


def test_passing_the_deadline_without_a_renewal_loses_the_lease_as_expired():
    lease = held(sent_at=100.0)
    assert lease.expire_if_due(129.0) is False and lease.state is State.HELD
    assert lease.expire_if_due(130.0) is True
    assert lease.state is State.LOST and lease.lost_reason == LostReason.EXPIRED
    assert lease.expire_if_due(131.0) is False  # reported once


def test_a_renewal_answered_after_the_deadline_does_not_bring_the_lease_back():
    lease = held(sent_at=100.0)
    assert lease.renewed(sent_at=125.0, token=9, now=130.5) is False
    assert lease.state is State.LOST and lease.lost_reason == LostReason.EXPIRED
    assert lease.token_at(131.0) is None


def test_a_late_answer_to_an_early_request_never_moves_the_deadline_back():
    lease = held(sent_at=100.0)
    assert lease.renewed(sent_at=115.0, token=9, now=116.0)
    assert lease.renewed(sent_at=110.0, token=10, now=117.0)  # an older request answered later
    assert lease.deadline == 145.0


def test_a_renewal_answered_lost_loses_it_at_once_with_reason_renew():
    lease = held()
    assert lease.lose(LostReason.RENEW) is True
    assert lease.lose(LostReason.GUARD) is False  # the first reason stands
    assert lease.lost_reason == LostReason.RENEW and lease.token_at(100.0) is None


def test_a_renewal_seen_only_in_the_permits_row_takes_its_token_and_keeps_the_deadline():
    lease = held(sent_at=100.0)
    assert lease.renewed_unseen(token=9, now=105.0)
    assert lease.token_at(105.0) == 9 and lease.deadline == 130.0 and lease.renew_at == 110.0
    assert not lease.renewed_unseen(token=9, now=106.0) and not lease.renewed_unseen(token=8, now=106.0)
    assert not lease.renewed_unseen(token=11, now=130.0)  # past the deadline: lost, not taken back
    assert lease.state is State.LOST and lease.lost_reason == LostReason.EXPIRED and lease.token == 9


def test_a_released_lease_reports_no_token_and_cannot_be_lost():
    lease = held()
    lease.released()
    assert lease.token_at(101.0) is None and lease.lose(LostReason.RENEW) is False


def test_each_grant_counts_as_a_new_acquisition():
    lease = held()
    lease.lose(LostReason.RENEW)
    lease.granted(200.0, slot=1, token=20, fence=20)
    assert lease.acquisitions == 2 and lease.state is State.HELD and lease.lost_reason is None


def test_a_grant_that_took_longer_than_a_third_of_the_lifetime_needs_confirming():
    assert not Lease.needs_confirmation(100.0, 110.0, TTL_S)
    assert Lease.needs_confirmation(100.0, 110.1, TTL_S)


@pytest.mark.parametrize(("text", "expected"), [
    ("30s", 30.0), ("500ms", 0.5), ("5m", 300.0), ("2h", 7200.0), ("7d", 604800.0), ("1h30m", 5400.0),
    ("45", 45.0), (12, 12.0), (1.5, 1.5),
])
def test_durations_read_as_people_write_them(text, expected):
    assert seconds(text) == expected


@pytest.mark.parametrize("bad", ["", "30x", "s", "-1s", "1s2", "nan"])
def test_durations_that_are_not_durations_are_refused(bad):
    with pytest.raises(ValueError):
        seconds(bad)


def test_lifetimes_round_up_to_whole_seconds_and_name_exactly_one_form():
    from datetime import timedelta

    assert ttl_seconds("1.5s") == 2 and ttl_seconds("500ms") == 1 and ttl_seconds(timedelta(days=7)) == 604800
    assert lifetime_fields("30s", False) == {"ttlSeconds": 30}
    assert lifetime_fields(None, True) == {"forever": True}
    with pytest.raises(ValueError, match="not both"):
        lifetime_fields("30s", True)
    with pytest.raises(ValueError, match="names its lifetime"):
        lifetime_fields(None, False)
    with pytest.raises(ValueError):
        ttl_seconds(0)
