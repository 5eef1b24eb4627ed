"""One shard actor: the only task that touches its shard's state.

It takes messages from its memory channel, drains whatever else is queued, applies all of it with
one `now_ms`, submits the effects to the WAL writer in one piece (so they share a frame), and only
then hands each finished call to the writer to wait for durability.
"""

from __future__ import annotations

import trio

from queen.clock import Clock
from queen.core.kv import KvState
from queen.wal.writer import WalWriter

# Message kinds.
OPS = 0  # (OPS, call, [(position, op), ...]): apply ops, write results at positions
TICK = 1  # (TICK, None, None): let the timing wheel free expired rows
RUN = 2  # (RUN, call, fn): fn(state, now_ms, effects) -> None, for work spanning several ops

# How many queued messages one wake-up applies before yielding, so one busy shard cannot hold the
# event loop for long.
DRAIN_MAX = 256


class Call:
    """One request's operations on their way through shard actors and the WAL."""

    __slots__ = ("results", "parts_left", "wait_version", "done", "error")

    def __init__(self, slots: int, parts: int):
        self.results: list = [None] * slots
        self.parts_left = parts
        self.wait_version = 0
        self.done = trio.Event()
        self.error = None


class ShardActor:
    def __init__(self, index: int, state: KvState, writer: WalWriter, clock: Clock, queue_max: int = 4096):
        self.index = index
        self.state = state
        self.writer = writer
        self.clock = clock
        self.send_channel, self._receive_channel = trio.open_memory_channel(queue_max)
        self.messages_applied = 0

    async def run(self) -> None:
        receive = self._receive_channel
        state = self.state
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
                    state.wait_version = 0
                    results = call.results
                    for position, op in work:
                        results[position] = state.apply(op, now_ms, effects)
                elif kind == TICK:
                    state.expire(now_ms)
                    continue
                else:
                    state.wait_version = 0
                    work(state, now_ms, effects)
                if state.wait_version > call.wait_version:
                    call.wait_version = state.wait_version
                finished.append(call)
            self.messages_applied += len(batch)
            if effects:
                writer.submit(effects)
            for call in finished:
                call.parts_left -= 1
                if call.parts_left == 0:
                    writer.when_durable(call.wait_version, call)
