"""The server's one source of time.

Wall time is derived from a monotonic base taken at start, so a wall-clock jump on the host does
not shorten a live lease. The monotonic part is trio's clock, so tests that run under
`trio.testing.MockClock` drive every lease, TTL and tick in virtual time.
"""

from __future__ import annotations

import time

import trio


class Clock:
    """Milliseconds since the Unix epoch, advancing with trio's (possibly mocked) clock."""

    __slots__ = ("_wall_at_start_ms", "_monotonic_at_start_s")

    def __init__(self, wall_at_start_ms: int | None = None):
        if wall_at_start_ms is None:
            wall_at_start_ms = int(time.time() * 1000)
        self._wall_at_start_ms = wall_at_start_ms
        self._monotonic_at_start_s = trio.current_time()

    def now_ms(self) -> int:
        return self._wall_at_start_ms + int((trio.current_time() - self._monotonic_at_start_s) * 1000)

    def raise_to(self, floor_ms: int) -> None:
        """Never read below floor_ms from now on (a new cluster leader starts at the latest time its
        old leader showed): moves the wall base forward, never back."""
        behind = floor_ms - self.now_ms()
        if behind > 0:
            self._wall_at_start_ms += behind
