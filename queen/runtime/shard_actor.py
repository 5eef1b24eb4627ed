"""One shard's door to the step runner: a message for the shard runs as a step at once.

A message is a list of (call, position, op), or an Abandon step for a client that hung up while its
acquire was parked. It is applied in the caller's own task, synchronously (queen/runtime/steps.py:
apply, submit to the WAL, deliver answers, no await between), as transactions and ticks already
are. Messages keep their order because each is applied the moment it is sent, so an abandon never
overtakes the acquire it is about. What batching the old actor task did (one step for whatever
had queued) the WAL writer does anyway: steps submitted while a frame is being gathered share it
and its fsync. Running the step here saves the task switch into an actor task and back for every
request (bench/README.md, "What one request costs").
"""

from __future__ import annotations

from queen.core.state import Ops
from queen.runtime.steps import StepRunner


class ShardActor:
    __slots__ = ("index", "steps", "messages_applied")

    def __init__(self, index: int, steps: StepRunner):
        self.index = index
        self.steps = steps
        self.messages_applied = 0

    def apply(self, message) -> None:
        """Run one message as a step now."""
        self.messages_applied += 1
        if type(message) is list:
            self.steps.run(Ops(self.index, message))
        else:
            self.steps.run(message)
