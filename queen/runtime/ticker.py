"""The ticker: time's one way into the state. Every tick a Tick step runs (queen/core/state.py):
leases and TTL rows that expired, permits handed on, parked calls that time out, timers that fall
due. Applied directly through the step runner, never queued behind operations, and never dropped:
a tick that comes late (a busy loop, a paused process) catches up at once, and the state decides
by the clock's now_ms what is due, not by how many ticks ran.
"""

from __future__ import annotations

import trio

from queen.core.state import Tick
from queen.runtime.steps import StepRunner


async def tick_forever(steps: StepRunner, tick_ms: int) -> None:
    interval_s = tick_ms / 1000
    next_at = trio.current_time()
    while True:
        next_at = max(next_at + interval_s, trio.current_time())
        await trio.sleep_until(next_at)
        if not steps.standby:  # a cluster follower's time moves only with its leader's records
            steps.run(Tick())
