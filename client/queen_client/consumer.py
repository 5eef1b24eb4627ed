"""Consumers: the one delivery loop behind `consume()` and `process()`, async and blocking alike,
and what makes a worker deployable.

- It rides through a broker restart or a dropped connection: pops, acks, releases and lease
  extensions that fail for a reason that heals (the broker unreachable, restarting, a 503, a 5xx)
  are tried again with capped exponential backoff and full jitter, and the loop goes on popping.
  An error that cannot heal (a 400: the call itself is wrong) ends the loop with that error.
- Nothing is lost or completed twice: an ack whose answer was lost is sent again under the same
  lease (an answer `already` is success); when the lease was lost meanwhile (it expired while the
  broker was away, or a paused worker outlived it) the messages it held go to another consumer,
  the rest of this delivery is not handled here, and the ack's `lease_lost` is logged, as a lock
  handle reports its loss.
- It stops gracefully on `stopping` (a stop() of the worker, SIGTERM or Ctrl-C): no new pop, the
  running handler finishes (within the grace period `process()` keeps), what finished is acked,
  and the lease is released, so every message not finished goes to the next consumer at once,
  its retry count unchanged.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncGenerator

import anyio

from queen_client.durations import seconds as seconds_of
from queen_client.errors import ApiError, TransportError, UnavailableError

logger = logging.getLogger(__name__)

# Waits between attempts while the broker is away: from 100 ms doubling to 5 s, full jitter, so the
# workers of a fleet that lost the broker together do not come back in step.
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0
# How long a stopping consumer keeps trying to give its lease back before leaving it to expire.
RELEASE_GIVE_UP_S = 5.0


def heals(error: BaseException) -> bool:
    """Whether waiting can make the call succeed: the broker unreachable or restarting, a 503, a
    5xx. A 4xx will be refused again however long one waits."""
    return isinstance(error, (TransportError, UnavailableError)) or (
        isinstance(error, ApiError) and error.status >= 500)


class Reconnect:
    """Capped exponential backoff with full jitter, reset by the first call that gets through."""

    __slots__ = ("what", "attempt")

    def __init__(self, what: str):
        self.what = what
        self.attempt = 0

    async def wait(self, error: BaseException) -> None:
        delay_s = random.uniform(0, min(RECONNECT_MAX_S, RECONNECT_FIRST_S * 2 ** self.attempt))
        log = logger.warning if self.attempt == 0 else logger.debug
        log("event=consumer_waiting_for_broker queue=%s attempt=%d delay_s=%.2f error=%r", self.what,
            self.attempt + 1, delay_s, str(error))
        self.attempt += 1
        await anyio.sleep(delay_s)

    def reset(self) -> None:
        if self.attempt:
            logger.info("event=consumer_reconnected queue=%s attempts=%d", self.what, self.attempt)
        self.attempt = 0


async def steadily(call, reconnect: Reconnect, give_up_s: float | None = None):
    """call()'s answer, waiting out errors that heal (for at most give_up_s, then the last error,
    or TimeoutError when a call itself, riding out a failover, outlasts it)."""
    deadline = None if give_up_s is None else anyio.current_time() + give_up_s
    while True:
        try:
            if deadline is None:
                answer = await call()
            else:
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    answer = await call()
        except Exception as error:  # noqa: BLE001 - sorted just below: healing or not
            if not heals(error) or (deadline is not None and anyio.current_time() >= deadline):
                raise
            await reconnect.wait(error)
            continue
        reconnect.reset()
        return answer


async def _unless_stopped(call, stopping: anyio.Event | None):
    """call()'s answer, or None the moment `stopping` is set (call() is cancelled then): a parked
    pop whose client hangs up is never handed anything by the broker, and a stopping worker does
    not wait on a broker it cannot reach."""
    if stopping is None:
        return await call()
    if stopping.is_set():
        return None
    answer = failure = None
    async with anyio.create_task_group() as tasks:
        async def called() -> None:
            nonlocal answer, failure
            try:
                answer = await call()
            except Exception as error:  # noqa: BLE001 - raised below, outside the task group's wrapping
                failure = error
            tasks.cancel_scope.cancel()

        tasks.start_soon(called)
        await stopping.wait()
        tasks.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return answer


async def deliveries(queue, *, group: str | None, batch: int, partitions: int, wait, lease,
                     stopping: anyio.Event | None = None) -> AsyncGenerator:
    """Pops, yields each message and is sent back how handling it went (None: done, acked
    "completed" with the next pop's batch unless it was settled; an exception: acked "failed" at
    once with what its partition completed before it, and the rest of that partition skipped: its
    lease ended with the failure, so it comes back). Ends when `stopping` is set (after the message
    being handled, if any) or on an error that cannot heal. Closing it, or its end, acks what was
    done and releases the lease."""
    queue._client._require_task_group()
    reconnect = Reconnect(queue.name)
    if lease is not None:
        lease_s = seconds_of(lease)
    else:
        lease_s = await _unless_stopped(lambda: steadily(queue._lease_time_s, reconnect), stopping)
        if lease_s is None:
            return  # stopped while the broker could not be reached
    # The final ack of a delivery asks for the next one in the same step (`next`, never parked:
    # waitMs 0, so a stop is never held up by it); what it brings is handled before popping again.
    follow = queue._next_wire(group=group, batch=batch, partitions=partitions)
    delivery = None
    while stopping is None or not stopping.is_set():
        if delivery is None or not delivery.messages:
            try:
                delivery = await _unless_stopped(lambda: queue.pop(group=group, batch=batch, partitions=partitions,
                                                                    wait=wait), stopping)
            except Exception as error:  # noqa: BLE001 - waited out when it heals, raised when not
                if not heals(error):
                    raise
                await _unless_stopped(lambda e=error: reconnect.wait(e), stopping)
                continue
            reconnect.reset()
            if delivery is None:
                return  # stopping
            if not delivery.messages:
                continue
        keeper = LeaseKeeper(queue, delivery.lease_id, lease_s)
        queue._client._start(keeper.run)
        handled = []
        finished = False
        try:
            failed_partitions: set[int] = set()
            for message in delivery.messages:
                if keeper.lost or (stopping is not None and stopping.is_set()):
                    break
                if message.partition_id in failed_partitions:
                    continue
                failure = yield message
                if failure is None:
                    if not message.settled:
                        handled.append(message)
                    elif message.settled_as in ("failed", "dlq"):
                        failed_partitions.add(message.partition_id)  # that ack ended its partition's lease
                    continue
                done = [m for m in handled if m.partition_id == message.partition_id]
                handled = [m for m in handled if m.partition_id != message.partition_id]
                wire = [m.ack_wire() for m in done]
                wire.append(message.ack_wire("failed", failure_text(failure)))
                await _acked(queue, wire, reconnect)
                failed_partitions.add(message.partition_id)
            finished = not keeper.lost and not (stopping is not None and stopping.is_set())
        finally:
            keeper.stop()
            with anyio.CancelScope(shield=True):
                # A stopping consumer takes no new lease: its last ack goes without `next`.
                delivery = await settle(queue, delivery, handled, finished, reconnect,
                                        follow if finished and not (stopping is not None and stopping.is_set()) else None,
                                        stopping)


def failure_text(failure: BaseException) -> str:
    """A handler's failure as its failed ack's error (the broker keeps 1 KiB of it, with the DLQ
    entry): the error itself, out of the exception groups of one that a nursery in the handler
    wraps it in ("Exceptions from Trio nursery (1 sub-exception)" names nothing)."""
    while isinstance(failure, BaseExceptionGroup) and len(failure.exceptions) == 1:
        failure = failure.exceptions[0]
    return str(failure)[:1024] or type(failure).__name__


class LeaseKeeper:
    """Extends a delivery's lease every third of its lifetime until stopped; `lost` once the broker
    says the lease is gone (its messages are another consumer's now)."""

    def __init__(self, queue, lease_id: int | None, lease_s: float):
        self.queue = queue
        self.lease_id = lease_id
        self.lease_s = max(1.0, lease_s)
        self.lost = False
        self._stopped = anyio.Event()

    def stop(self) -> None:
        self._stopped.set()

    async def run(self) -> None:
        if self.lease_id is None:
            return
        while True:
            with anyio.move_on_after(self.lease_s / 3):
                await self._stopped.wait()
                return
            try:
                if not await self.queue.extend(self.lease_id, int(round(self.lease_s))):
                    self.lost = True
                    logger.warning("event=lease_lost queue=%s lease_id=%s", self.queue.name, self.lease_id)
                    return
            except Exception:  # noqa: BLE001 - try again at the next third; the lease may still hold
                continue


async def _acked(queue, wire: list[dict], reconnect: Reconnect, follow: dict | None = None):
    """Send acks until they are answered: acks are fenced by their lease, so sending one again is
    safe (a completed one answers `already`). One refused for its lease is logged, not raised.
    With `follow`, the acks carry it as `next` once: the Delivery its pop made (None when it made
    none). That attempt is not repeated (a pop sent again would take a second lease): if it fails,
    or the broker predates `next`, the acks go again without it and the caller pops."""
    delivery = None
    answers = None
    if follow is not None:
        try:
            answer = await queue._transport.call("POST", "/api/v1/ack/batch", {"acknowledgments": wire, "next": follow},
                                                 safe=False)
        except Exception as error:  # noqa: BLE001 - a broker without `next`, or one that heals: sent again below
            if not (heals(error) or _next_unknown(error)):
                raise
        else:
            answers = answer["results"]
            if answer.get("next") is not None:
                delivery = queue._delivery(answer["next"])
    if answers is None:
        answers = await steadily(lambda: queue._transport.call("POST", "/api/v1/ack/batch", {"acknowledgments": wire},
                                                               safe=True), reconnect)
    for sent, answer in zip(wire, answers, strict=False):
        if not answer.get("success"):
            logger.warning("event=ack_refused queue=%s partition_id=%s offset=%s lease_id=%s reason=%s", queue.name,
                           sent["partitionId"], sent["offset"], sent["leaseId"], answer.get("reason"))
    return delivery


def _next_unknown(error: BaseException) -> bool:
    """A broker that predates `next` refuses the field whole (nothing was applied)."""
    return isinstance(error, ApiError) and error.status == 400 and error.details.get("field") == "next"


async def settle(queue, delivery, handled: list, finished: bool, reconnect: Reconnect, follow: dict | None = None,
                 stopping: anyio.Event | None = None):
    """Ack what was handled; when the loop was left early, give the rest of the lease back, so it
    is delivered again at once with its retry count unchanged. Given up on errors that cannot heal
    (the lease then expires on its own, as it would if this process had died). With `follow`, the
    ack asks for the next delivery (`next`): returned, or None; one that arrives after a stop began
    is given back at once, like the rest of a lease a stopping consumer holds."""
    following = None
    try:
        if handled:
            following = await _acked(queue, [m.ack_wire() for m in handled], reconnect, follow)
            for message in handled:
                message.settled = True
        if not finished and delivery.lease_id is not None:
            await steadily(lambda: queue.release(delivery.lease_id), reconnect, RELEASE_GIVE_UP_S)
    except Exception as error:  # noqa: BLE001 - nothing more to do here: the broker keeps the lease
        logger.warning("event=settle_failed queue=%s lease_id=%s error=%r", queue.name, delivery.lease_id, str(error))
    if following is not None and following.messages and stopping is not None and stopping.is_set():
        lease_id = following.lease_id
        try:
            await steadily(lambda: queue.release(lease_id), reconnect, RELEASE_GIVE_UP_S)
        except Exception as error:  # noqa: BLE001 - as above: it expires on its own
            logger.warning("event=settle_failed queue=%s lease_id=%s error=%r", queue.name, lease_id, str(error))
        return None
    return following
