"""One shard actor: the task that batches operations for its shard.

It takes messages from its memory channel, drains whatever else is queued, and runs all of it as
one step (queen/runtime/steps.py): one `now_ms`, one submit, so the batch shares a frame and one
fsync. A message is a list of (call, position, op), or an Abandon step for a client that hung up
while its acquire was parked; both keep their order in the channel, so an abandon never overtakes
the acquire it is about.
"""

from __future__ import annotations

import trio

from queen.core.state import Ops
from queen.runtime.steps import StepRunner

# How many queued messages one wake-up applies before yielding, so one busy shard cannot hold the
# event loop for long.
DRAIN_MAX = 256


class ShardActor:
    def __init__(self, index: int, steps: StepRunner, queue_max: int = 4096):
        self.index = index
        self.steps = steps
        self.send_channel, self._receive_channel = trio.open_memory_channel(queue_max)
        self.messages_applied = 0

    def send_nowait(self, message) -> bool:
        """Queue a message without a scheduler pass (the caller waits for its answer anyway);
        False when the queue is full and the caller must await `send_channel.send`."""
        try:
            self.send_channel.send_nowait(message)
            return True
        except trio.WouldBlock:
            return False

    async def run(self) -> None:
        receive = self._receive_channel
        run_step = self.steps.run
        index = self.index
        while True:
            batch = [await receive.receive()]
            while len(batch) < DRAIN_MAX:
                try:
                    batch.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            self.messages_applied += len(batch)
            if len(batch) == 1 and type(batch[0]) is list:
                run_step(Ops(index, batch[0]))
                continue
            items: list = []
            abandons = []
            for message in batch:
                if type(message) is list:
                    items += message
                else:
                    abandons.append(message)
            if items:
                run_step(Ops(index, items))
            for step in abandons:
                run_step(step)

