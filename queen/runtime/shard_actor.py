"""One shard actor: the only task that applies operations to its shard's state.

It takes messages from its memory channel, drains whatever else is queued, applies all of it with
one `now_ms`, submits the effects to the WAL writer in one piece (so they share a frame), and only
then hands each finished call to the writer to wait for durability. Waiting lock acquires stay
parked in the state until a permit frees or their wait runs out; they finish their call then.
"""

from __future__ import annotations

import trio

from queen.clock import Clock
from queen.core.shard import ShardState
from queen.wal.writer import WalWriter

# Message kinds.
OPS = 0  # (OPS, call, [(position, op), ...]): apply ops, write results at positions
TICK = 1  # (TICK, None, None): free expired rows, hand freed permits to waiters, time waits out
WAIT = 2  # (WAIT, call, (position, op)): a lock acquire that may park until a permit frees
ABANDON = 3  # (ABANDON, call, None): the client of call is gone; answer its parked acquires now

# How many queued messages one wake-up applies before yielding, so one busy shard cannot hold the
# event loop for long.
DRAIN_MAX = 256


class Call:
    """One request's operations on their way through shard actors and the WAL. `parts_left` counts
    the messages (and parked acquires) that still have to finish."""

    __slots__ = ("results", "parts_left", "wait_version", "done", "error")

    def __init__(self, slots: int, parts: int):
        self.results: list = [None] * slots
        self.parts_left = parts
        self.wait_version = 0
        self.done = trio.Event()
        self.error = None


class ShardActor:
    def __init__(self, index: int, state: ShardState, writer: WalWriter, clock: Clock, queue_max: int = 4096):
        self.index = index
        self.state = state
        self.writer = writer
        self.clock = clock
        self.send_channel, self._receive_channel = trio.open_memory_channel(queue_max)
        self.messages_applied = 0

    async def run(self) -> None:
        receive = self._receive_channel
        state = self.state
        kv = state.kv
        locks = state.locks
        writer = self.writer
        while True:
            batch = [await receive.receive()]
            while len(batch) < DRAIN_MAX:
                try:
                    batch.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            now_ms = self.clock.now_ms()
            effects: list = []
            finished = []
            for kind, call, work in batch:
                if kind == OPS:
                    kv.wait_version = 0
                    results = call.results
                    for position, op in work:
                        results[position] = state.apply(op, now_ms, effects)
                elif kind == TICK:
                    state.tick(now_ms, effects)
                    continue
                elif kind == WAIT:
                    kv.wait_version = 0
                    position, op = work
                    result = locks.acquire(op, now_ms, effects)
                    if not result["acquired"] and op.wait_ms > 0:
                        locks.park(op, now_ms, (call, position))
                        continue
                    call.results[position] = result
                else:  # ABANDON
                    locks.abandon(lambda ticket, call=call: ticket[0] is call, now_ms)
                    continue
                if kv.wait_version > call.wait_version:
                    call.wait_version = kv.wait_version
                finished.append(call)
            if locks.resolved:
                for (call, position), result, version in locks.resolved:
                    call.results[position] = result
                    if version > call.wait_version:
                        call.wait_version = version
                    finished.append(call)
                locks.resolved = []
            self.messages_applied += len(batch)
            if effects:
                writer.submit(effects)
            for call in finished:
                call.parts_left -= 1
                if call.parts_left == 0:
                    writer.when_durable(call.wait_version, call)
