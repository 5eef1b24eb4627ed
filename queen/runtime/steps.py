"""Running a step: apply it to the state (queen/core/state.py), submit its records to the WAL
writer, and deliver its answers, all without an await in between.

Every caller that changes state goes through `StepRunner.run`: the shard actors for their batches,
the router for transactions, the ticker for ticks. So a parked request freed by any step is
answered by that step, and every answer is covered by durability the same way: a finished call
waits for the last version applied when it finished, whatever it read, so it can never show a
version, token or fence a crash could take back.
"""

from __future__ import annotations

import logging

import trio

from queen.clock import Clock
from queen.core.state import Ops, State, Transaction
from queen.errors import QueenError
from queen.wal.writer import WalWriter

logger = logging.getLogger(__name__)


def _internal() -> QueenError:
    return QueenError("internal", "the server failed to handle this request; see its log", http_status=500)


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
        try:
            applied = self.state.apply(step, self.clock.now_ms())
        except Exception as error:
            self._failed(step, error)
            return
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
        if applied.failures:
            self._failed_alone(step, applied.failures, last)

    def _failed_alone(self, step, failures: list, last: int) -> None:
        """Operations that raised before producing any record: each call is answered 500 (once the
        rest of it is durable, like any answer) and the server goes on."""
        for call, _position, error in failures:
            logger.error("event=operation_failed step=%s action=answered_500", type(step).__name__,
                         exc_info=(type(error), error, error.__traceback__))
            call.error = _internal()
            call.parts_left -= 1
            if not call.parts_left:
                self.writer.when_durable(last, call)

    def _failed(self, step, error: Exception) -> None:
        """A bug stopped a step half way. Memory may now hold what the log does not: take no more
        writes (503 until a restart rebuilds the state from the log), answer this step's calls 500,
        and go on serving reads and health checks."""
        logger.exception("event=step_failed step=%s action=refusing_writes hint='restart the server; "
                         "its state is rebuilt from the log'", type(step).__name__)
        self.writer.stop(error)
        internal = _internal()
        calls = []
        if type(step) is Ops:
            calls = [item[0] for item in step.items]
        elif type(step) is Transaction:
            calls = [step.reply_to]
        for call in calls:
            if isinstance(call, Call) and not call.done.is_set():
                call.error = internal
                call.done.set()
