"""Running a step: apply it to the state (queen/core/state.py), submit its records to the WAL
writer, and deliver its answers, all without an await in between.

Every caller that changes state goes through `StepRunner.run`: the shard actors for their batches,
the router for transactions, the ticker for ticks. So a parked request freed by any step is
answered by that step, and every answer is covered by durability the same way: a finished call
waits for the last version applied when it finished, whatever it read, so it can never show a
version, token or fence a crash could take back.
"""

from __future__ import annotations

import trio

from queen.clock import Clock
from queen.core.state import State
from queen.wal.writer import WalWriter


class Call:
    """One request's operations on their way through steps and the WAL: `parts_left` counts the
    answers it still waits for (one per operation sent to a shard, parked ones included)."""

    __slots__ = ("results", "parts_left", "done", "error")

    def __init__(self, slots: int, parts: int):
        self.results: list = [None] * slots
        self.parts_left = parts
        self.done = trio.Event()
        self.error = None


class StepRunner:
    __slots__ = ("state", "writer", "clock", "steps_applied")

    def __init__(self, state: State, writer: WalWriter, clock: Clock):
        self.state = state
        self.writer = writer
        self.clock = clock
        self.steps_applied = 0

    def run(self, step) -> None:
        applied = self.state.apply(step, self.clock.now_ms())
        self.steps_applied += 1
        writer = self.writer
        if applied.last_version:
            writer.submit(applied.records, applied.first_version, applied.last_version)
        last = self.state.versions.last
        for call, position, result in applied.answers:
            call.results[position] = result
            call.parts_left -= 1
            if not call.parts_left:
                writer.when_durable(last, call)
