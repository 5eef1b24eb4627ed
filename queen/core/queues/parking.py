"""Pops parked until something can be delivered to them (a pop with waitMs that found nothing):
per queue and group, oldest first, so parked waiters are served first come, first served; when
each gives up (its deadline); and when a message that a queue's waiters may be waiting for, delayed
or held back by the retry backoff, may be delivered.

It knows nothing of delivery: the queue table marks a queue dirty whenever a step may have made
something deliverable there (an append, an ack, a lease ending, a removal), and after the step
serves the dirty queues' waiters. Time makes something deliverable only through a head that is
delayed or held back by the retry backoff, so the table files a wake-up for its queue here instead
of looking at every waiting queue each tick.
"""

from __future__ import annotations

from collections import deque

from queen.core.queues.model import PopWaiter
from queen.core.wheel import TimingWheel


class ParkedPops:
    __slots__ = ("by_queue", "deadlines", "wakes", "served_total", "wait_ms_total")

    def __init__(self, now_ms: int):
        self.by_queue: dict[str, dict[str, deque[PopWaiter]]] = {}  # queue -> group -> oldest first
        self.deadlines = TimingWheel(now_ms)  # waiter -> when it gives up
        self.wakes = TimingWheel(now_ms)  # queue -> when a head held back there may be delivered
        self.served_total = 0
        self.wait_ms_total = 0

    def __len__(self) -> int:
        return len(self.deadlines)

    def park(self, waiter: PopWaiter) -> None:
        self.by_queue.setdefault(waiter.op.queue, {}).setdefault(waiter.op.group, deque()).append(waiter)
        self.deadlines.add(waiter, waiter.deadline_ms)

    def served(self, waiting: deque, now_ms: int) -> PopWaiter:
        """The first of `waiting` got its answer: it goes."""
        waiter = waiting.popleft()
        self.deadlines.remove(waiter)
        self.served_total += 1
        self.wait_ms_total += now_ms - waiter.parked_at_ms
        return waiter

    def prune(self, queue: str) -> None:
        """Forget the queue's groups that have nobody waiting any more."""
        groups = self.by_queue.get(queue)
        if groups is None:
            return
        for group in [group for group, waiting in groups.items() if not waiting]:
            del groups[group]
        if not groups:
            del self.by_queue[queue]

    def unpark(self, waiter: PopWaiter) -> bool:
        """Take a waiter out (it is answered elsewhere); False if it was no longer parked."""
        groups = self.by_queue.get(waiter.op.queue)
        waiting = groups.get(waiter.op.group) if groups is not None else None
        if waiting is None or waiter not in waiting:
            return False
        waiting.remove(waiter)
        self.deadlines.remove(waiter)
        self.prune(waiter.op.queue)
        return True

    def of(self, reply_to) -> list[PopWaiter]:
        return [waiter for groups in self.by_queue.values() for waiting in groups.values() for waiter in waiting
                if waiter.reply_to is reply_to]

    def everyone(self) -> list[PopWaiter]:
        return [waiter for groups in self.by_queue.values() for waiting in groups.values() for waiter in waiting]

    def timed_out(self, now_ms: int) -> list[PopWaiter]:
        """The waiters whose deadline has come, taken out."""
        gone = []
        for waiter in self.deadlines.advance(now_ms):
            groups = self.by_queue.get(waiter.op.queue)
            waiting = groups.get(waiter.op.group) if groups is not None else None
            if waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                self.prune(waiter.op.queue)
                gone.append(waiter)
        return gone

    def woken(self, now_ms: int) -> list[str]:
        """The queues with waiters whose awaited heads (delayed, or held back by the retry backoff)
        may now be delivered."""
        return [queue for queue in self.wakes.advance(now_ms) if queue in self.by_queue]
