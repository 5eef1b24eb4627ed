"""The client's view of one permit: a small state machine, pure, with `now` passed in (seconds on
the event loop's clock), so every rule of loss is tested without sleeping.

Rules (a permit is gone when the broker says so, or when the lifetime passed on the client's own
clock without a renewal getting through):
  - A grant or a renewal answered to a request sent at `sent_at` makes the permit ours until
    `sent_at + ttl_s` on our clock, at the latest: the server wrote the lease after we sent, so its
    lease cannot end before that. This is the `deadline`.
  - At `deadline`, without a renewal that got through, the permit is LOST with reason "expired".
    An answer that arrives after the deadline does not bring it back: the permit may have been
    someone else's in between, and whoever read `token` meanwhile was told it was gone.
  - A renewal answered `lost` makes it LOST("renew") at once; a guarded transaction that found
    another holder, LOST("guard"). One that found the permit still ours at a later token (our own
    renewal landed, its answer lost) takes that token and keeps the deadline.
  - The token is reported only while HELD and before the deadline: never a token we may not hold.
  - Renewal is due a third of the lifetime after the request that last extended it.

Never: reads a clock, does I/O, or awaits.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    IDLE = "idle"
    HELD = "held"
    LOST = "lost"
    RELEASED = "released"


class LostReason(StrEnum):
    RENEW = "renew"
    EXPIRED = "expired"
    GUARD = "guard"


RENEW_FRACTION = 1 / 3


class Lease:
    __slots__ = ("ttl_s", "state", "slot", "token", "fence", "deadline", "renew_at", "lost_reason", "acquisitions")

    def __init__(self, ttl_s: float):
        assert ttl_s > 0
        self.ttl_s = ttl_s
        self.state = State.IDLE
        self.slot: int | None = None
        self.token: int | None = None
        self.fence: int | None = None
        self.deadline: float | None = None
        self.renew_at: float | None = None
        self.lost_reason: LostReason | None = None
        self.acquisitions = 0  # tells a renewal of an older acquisition from one of the current

    @staticmethod
    def needs_confirmation(sent_at: float, received_at: float, ttl_s: float) -> bool:
        """A grant that took longer than a third of the lifetime to arrive (a waiting acquire) says
        little about when the lease started: confirm it with a renewal before using it."""
        return received_at - sent_at > ttl_s * RENEW_FRACTION

    def granted(self, sent_at: float, slot: int, token: int, fence: int) -> None:
        self.state = State.HELD
        self.slot, self.token, self.fence = slot, token, fence
        self.deadline = sent_at + self.ttl_s
        self.renew_at = sent_at + self.ttl_s * RENEW_FRACTION
        self.lost_reason = None
        self.acquisitions += 1

    def renewed(self, sent_at: float, token: int, now: float) -> bool:
        """A renewal sent at `sent_at` was answered `renewed` at `now`. False if it came too late
        (the permit is then lost as "expired") or the permit is no longer held."""
        if self.expire_if_due(now) or self.state is not State.HELD:
            return False
        self.token = token
        self.deadline = max(self.deadline, sent_at + self.ttl_s)
        self.renew_at = max(self.renew_at, sent_at + self.ttl_s * RENEW_FRACTION)
        return True

    def renewed_unseen(self, token: int, now: float) -> bool:
        """The broker holds the permit for us at a later token (a renewal of ours landed and its
        answer was lost: the permit's row still names our owner). Take the token; the deadline stays
        where our own clock put it, since when that renewal was sent is not known. False if the
        permit is no longer held or the token is not a later one."""
        if self.expire_if_due(now) or self.state is not State.HELD or token <= self.token:
            return False
        self.token = token
        return True

    def lose(self, reason: LostReason) -> bool:
        """True the first time: the caller then tells everyone who listens."""
        if self.state is not State.HELD:
            return False
        self.state = State.LOST
        self.lost_reason = LostReason(reason)
        return True

    def expire_if_due(self, now: float) -> bool:
        """True if this call found the lifetime over (and made the permit LOST)."""
        if self.state is State.HELD and now >= self.deadline:
            return self.lose(LostReason.EXPIRED)
        return False

    def released(self) -> None:
        self.state = State.RELEASED

    def held_at(self, now: float) -> bool:
        return self.state is State.HELD and now < self.deadline

    def token_at(self, now: float) -> int | None:
        return self.token if self.held_at(now) else None

    def renew_due(self, now: float) -> bool:
        return self.state is State.HELD and now >= self.renew_at
