"""Running a step: apply it to the state (queen/core/state.py), submit its records to the WAL
writer, and deliver its answers, all without an await in between.

Every caller that changes state goes through `StepRunner.run`: the shard actors for calls' parts,
the router for transactions, the ticker for ticks. So a parked request freed by any step is
answered by that step, and every answer is covered by durability the same way: a finished call
waits for the last version applied when it finished, whatever it read, so it can never show a
version, token or fence a crash could take back.

It is also the last gate before a version reaches the log or an answer: a step that took a version
past VERSION_MAX (queen/core/kv.py) goes no further (one comparison per step). The router refuses
calls that write long before that (VERSIONS_WRITABLE_MAX), so this only catches what got by it.
"""

from __future__ import annotations

import logging

import trio

from queen.clock import Clock
from queen.core.kv import VERSION_MAX
from queen.core.state import Ops, State, Transaction
from queen.errors import QueenError
from queen.wal.writer import WalWriter

logger = logging.getLogger(__name__)


def _internal() -> QueenError:
    return QueenError("internal", "the server failed to handle this request; see its log", http_status=500)


def versions_exhausted(last_version: int) -> QueenError:
    """The refusal once the versions run out. 507 Insufficient Storage, not 503: the server cannot
    store what the call would write, and that does not pass with time, where a 503 tells clients to
    try again (the SDK retries it, for calls safe to repeat)."""
    return QueenError(
        "versions_exhausted",
        f"this data directory has used up its versions: every version, lock token, fence and id comes from one "
        f"counter, now at {last_version}, and none may pass {VERSION_MAX} (2^53 - 1, the largest integer a JSON "
        "client reads exactly). Writes are refused for good; reads still work. Move the data to a new data "
        "directory (copy it out, e.g. `queen kv list NS --json`, and write it back there); versions start again "
        "from 1 there, so its tokens and fences are not to be compared with these.",
        {"lastVersion": last_version, "versionMax": VERSION_MAX}, http_status=507)


def log_notices(notices: list) -> None:
    """Log what the queues reported: a move to a DLQ at info (someone should look at it), a lease
    that expired at debug (it is routine when a consumer dies, and retried on its own)."""
    for notice in notices:
        if notice[0] == "dlq_move":
            _, queue, group, partition, offset, retry_count, error = notice
            logger.info("event=dlq_move queue=%s group=%s partition=%s offset=%d retry_count=%d error=%r", queue, group,
                        partition, offset, retry_count, error)
        elif logger.isEnabledFor(logging.DEBUG):
            _, queue, group, lease_id, messages = notice
            logger.debug("event=lease_expired queue=%s group=%s lease_id=%d messages=%d", queue, group, lease_id,
                         messages)


class Done:
    """A call's trio.Event, for its one waiter (the request's task), without the parking lot. And a
    call already done when its task asks (a read whose versions are durable) goes on at once rather
    than through a pass of the scheduler: the request's task yields anyway when it next reads its
    socket."""

    __slots__ = ("_set", "_task")

    def __init__(self):
        self._set = False
        self._task = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            task = self._task
            if task is not None:
                self._task = None
                trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        if self._set:
            return
        assert self._task is None, "a call has one waiter"
        self._task = trio.lowlevel.current_task()

        def abort(_):
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


class Call:
    """One request's operations on their way through steps and the WAL: `parts_left` counts the
    answers it still waits for (one per operation sent to a shard, parked ones included). `wrote`:
    a step that wrote something answered one of them (perhaps another call's records: it errs on
    the side of "may have written"), so a call that fails while it waits for durability can say
    whether it may have been applied (a cluster's sync_unavailable)."""

    __slots__ = ("results", "parts_left", "done", "error", "wrote")

    def __init__(self, slots: int, parts: int):
        self.results: list = [None] * slots
        self.parts_left = parts
        self.done = Done()
        self.error = None
        self.wrote = False

    async def result(self) -> list:
        """Every part's answer once all are in and durable; the call's error raised instead if it
        has one (a 503 when the log cannot be written, a 500 for an operation that failed)."""
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.results


class StepRunner:
    __slots__ = ("state", "writer", "clock", "steps_applied", "standby")

    def __init__(self, state: State, writer: WalWriter, clock: Clock):
        self.state = state
        self.writer = writer
        self.clock = clock
        self.steps_applied = 0
        # A cluster node that does not lead: its state changes only by its leader's records, so
        # the ticker runs no step (queen/runtime/ticker.py). Never set on a single node.
        self.standby = False

    def run(self, step) -> None:
        try:
            applied = self.state.apply(step, self.clock.now_ms())
        except Exception as error:
            self._failed(step, error)
            return
        if applied.last_version > VERSION_MAX:
            self._past_version_max(step, applied)
            return
        self.steps_applied += 1
        writer = self.writer
        if applied.last_version:
            writer.submit(applied.records, applied.first_version, applied.last_version)
        last = self.state.versions.last
        wrote = applied.last_version != 0
        for call, position, result in applied.answers:
            call.results[position] = result
            call.parts_left -= 1
            if wrote:
                call.wrote = True
            if not call.parts_left:
                writer.when_durable(last, call)
        if applied.failures:
            self._failed_alone(step, applied.failures, last)
        if applied.notices:
            log_notices(applied.notices)

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

    def _past_version_max(self, step, applied) -> None:
        """A step took versions past VERSION_MAX: what got by the router's refusal (calls admitted
        before it, parked requests, expiries, timers) used up the versions kept for it. Its records
        never reach the log and no answer shows its versions; but memory now holds what the log
        does not, so, as after a step that failed half way, no more writes until a restart (which
        rebuilds the state from the log, below the limit, and refuses writes from the start)."""
        error = versions_exhausted(applied.last_version)
        logger.error("event=versions_exhausted step=%s first_version=%d last_version=%d version_max=%d "
                     "action=refusing_writes", type(step).__name__, applied.first_version, applied.last_version,
                     VERSION_MAX)
        self.writer.stop(error)
        calls = [answer[0] for answer in applied.answers] + [failure[0] for failure in applied.failures or ()]
        if type(step) is Ops:
            calls += [item[0] for item in step.items]
        elif type(step) is Transaction:
            calls.append(step.reply_to)
        for call in calls:
            if isinstance(call, Call) and not call.done.is_set():
                call.error = error
                call.done.set()

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
