"""The queue half of the SDK: `client.queue("orders")`, its calls, typed results, and consumers.

    async with queen_client.Client() as client:
        orders = client.queue("orders")
        await orders.push({"orderId": 1}, partition="customer-42")
        async for message in orders.consume(group="emailer", batch=10):
            send_email(message.data)       # acked `completed` when the loop asks for the next one

A consumer holds its messages under a lease and extends it in the background, every third of its
lifetime, while they are being handled. In `consume()`, a message is acked `completed` once the
loop body is done with it (in one batch call per delivery), unless the body settled it itself
(`message.ack()`, `message.fail(error)`, `message.dead_letter(error)`). Leaving the loop (break,
an exception, cancellation) acks the messages the loop was done with and releases the lease, so
the current message and the rest of the delivery go to the next consumer, retry counts unchanged.
That happens when the generator is closed: wrap it in `contextlib.aclosing(...)` to close it as
the loop is left (otherwise the garbage collector closes it soon after). `process(handler)` runs a
handler per message: its return acks `completed`, its exception acks `failed` (the message comes
back with retryCount + 1, or goes to the DLQ past the queue's retryLimit).

Retries: pushes carry a transactionId (one is generated when you give none), so a push is safe to
send again and is; acks, extends and reads too. A pop is not (a lost answer is a lease nobody
uses: its messages come back when it expires).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

import anyio

from queen_client import consumer
from queen_client.durations import seconds as seconds_of
from queen_client.errors import Interrupted, say_interrupted
from queen_client.kv import given
from queen_client.options import GROUP, IDS, WAIT, queue_options, wire_names
from queen_client.stop_signals import STOP_SIGNALS

logger = logging.getLogger(__name__)

DEFAULT_GROUP = "__QUEUE_MODE__"
WAIT_MS_MAX = 60_000  # the server parks a pop at most this long


def _when(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True, slots=True)
class Push:
    """One item for `push_many`, when it needs more than a payload."""

    payload: object
    partition: str | None = None
    transaction_id: str | None = None
    trace_id: str | None = None


@dataclass(frozen=True, slots=True)
class PushResult:
    """`status` "queued" (appended), "duplicate" (its transactionId was known: the original's ids)
    or "failed" (`reason`: queue_full, partition_limit, storage_full; nothing appended)."""

    status: str
    queue: str
    partition: str
    transaction_id: str | None = None
    message_id: int | None = None
    offset: int | None = None
    partition_id: int | None = None
    created_at_ms: int | None = None
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.status != "failed"

    @classmethod
    def from_wire(cls, wire: dict) -> PushResult:
        return cls(wire["status"], wire["queue"], wire["partition"], wire.get("transactionId"), wire.get("messageId"),
                   wire.get("offset"), wire.get("partitionId"), wire.get("createdAt"), wire.get("reason"))


@dataclass(eq=False)
class Message:
    """A delivered message. `data` is what was pushed as payload; `retry_count` the deliveries of
    it to this group that ended without completion; `lease_id` the lease it came under (None with
    auto_ack). Settle it with ack(), fail() or dead_letter(), or let the consumer do it."""

    queue: str
    partition: str
    partition_id: int
    offset: int
    message_id: int
    transaction_id: str
    data: object
    created_at_ms: int
    retry_count: int
    trace_id: str | None
    lease_id: int | None
    consumer_group: str
    _queue: Queue | None = field(default=None, repr=False)
    settled: bool = field(default=False, repr=False)
    settled_as: str | None = field(default=None, repr=False)  # the status the handler acked it with

    @property
    def created_at(self) -> datetime:
        return _when(self.created_at_ms)

    @classmethod
    def from_wire(cls, wire: dict, queue: str, handle: Queue | None) -> Message:
        return cls(queue, wire["partition"], wire["partitionId"], wire["offset"], wire["messageId"],
                   wire["transactionId"], wire.get("data"), wire["createdAt"], wire.get("retryCount", 0),
                   wire.get("traceId"), wire.get("leaseId"), wire.get("consumerGroup", DEFAULT_GROUP), handle)

    def ack_wire(self, status: str = "completed", error: str | None = None) -> dict:
        wire = {"partitionId": self.partition_id, "leaseId": self.lease_id, "offset": self.offset, "status": status,
                "consumerGroup": self.consumer_group}
        if error is not None:
            wire["error"] = error
        return wire

    def ack(self):
        """Ack "completed" (await it from the async client; from the SyncClient it blocks)."""
        return self._settle("completed", None)

    def fail(self, error: str | None = None):
        """Back for redelivery with retry_count + 1 (or to the DLQ past the retry limit). Ends the
        lease on this message's partition, so its other messages come back too."""
        return self._settle("failed", error)

    def dead_letter(self, error: str | None = None):
        return self._settle("dlq", error)

    def _settle(self, status: str, error: str | None):
        self.settled = True
        self.settled_as = status
        return self._queue.ack(self, status, error=error)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one pop got: `messages` (empty with `reason` "empty", "lease_held" or "timeout"), under
    `lease_id` until `expires_at_ms`."""

    messages: list[Message]
    lease_id: int | None = None
    expires_at_ms: int | None = None
    partitions_claimed: int = 0
    reason: str | None = None

    def __bool__(self) -> bool:
        return bool(self.messages)

    @property
    def expires_at(self) -> datetime | None:
        return _when(self.expires_at_ms)


@dataclass(frozen=True, slots=True)
class AckResult:
    """`success`; `already` when the message was completed before; `lease_released` when this
    ended the lease on its partition; `dlq` when the message went to the DLQ; otherwise `reason`
    ("lease_lost": the lease is no longer live, so nothing changed; "not_delivered")."""

    success: bool
    already: bool = False
    lease_released: bool = False
    dlq: bool = False
    retry_count: int | None = None
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.success

    @classmethod
    def from_wire(cls, wire: dict) -> AckResult:
        return cls(wire["success"], wire.get("already", False), wire.get("leaseReleased", False), wire.get("dlq", False),
                   wire.get("retryCount"), wire.get("reason"))


def next_wire(queue: str, *, group: str | None = None, batch: int = 1, partitions: int = 1, wait=None) -> dict:
    """The `next` of an ack or a transaction: the pop to make in the same step once it applied."""
    wire = {"queue": queue, "batch": batch, "partitions": partitions}
    wait_ms = _wait_ms(wait)
    if wait_ms:
        wire["waitMs"] = wait_ms
    if group is not None:
        wire["consumerGroup"] = group
    return wire


def _wait_ms(wait) -> int:
    """A pop's wait in ms; above the broker's longest wait it is refused, never cut short in silence."""
    wait_ms = 0 if wait is None else int(seconds_of(wait, "wait") * 1000)
    if wait_ms > WAIT_MS_MAX:
        raise ValueError(f"wait {wait!r} is longer than a pop may wait ({WAIT_MS_MAX // 1000}s): consume() and "
                         "process() wait again for as long as they run")
    return wait_ms


class Queue:
    """`client.queue(name)`: every call on one queue."""

    def __init__(self, client, name: str):
        self._client = client
        self._transport = client._transport
        self.name = name

    def __repr__(self) -> str:
        return f"<queen_client.Queue {self.name!r}>"

    # -- producing ------------------------------------------------------------------------------

    async def configure(self, **options) -> dict:
        """Set options (lease_time_seconds=60, retry_limit=5, ..., or as the wire spells them:
        leaseTimeSeconds=60, retryLimit=5; the README lists them); those left out keep their value.
        Answers every effective option, as the wire spells them. A name that is no option raises
        TypeError ("did you mean ...") before anything is sent."""
        body = {"queue": self.name, "options": queue_options(options)}
        answer = await self._transport.call("POST", "/api/v1/configure", body, safe=True)
        return answer["options"]

    @wire_names(**IDS)
    async def push(self, payload, *, partition: str | None = None, transaction_id: str | None = None,
                   trace_id: str | None = None) -> PushResult:
        """Append one message. Without a transaction_id one is generated, so the call is safe to send
        again: a repeat answers "duplicate" with the first one's ids. A list (or tuple) payload is
        refused with a TypeError, before anything is sent: a transaction's `.queue(q).push([...])`
        and the Queen MQ client's `push([...])` take a list as several messages, so here it would
        silently be one. push_many(items) appends several; push_many([payload]) one list."""
        if isinstance(payload, (list, tuple)):
            raise TypeError("Queue.push() takes one payload, and a list here is ambiguous: push_many([a, b]) appends "
                            "each item as a message (as a transaction's .queue(q).push([a, b]) and the Queen MQ "
                            "client's push([...]) do); push_many([[a, b]]) appends one message whose payload is the "
                            "list")
        [result] = await self.push_many([Push(payload, partition, transaction_id, trace_id)])
        return result

    async def push_many(self, items: Iterable, *, partition: str | None = None) -> list[PushResult]:
        """Append several messages in one call: each item a payload, or a `queen_client.Push`. Results in
        order; items are independent (one's "failed" does not stop the others)."""
        wire = []
        for item in items:
            if not isinstance(item, Push):
                item = Push(item, partition)
            entry = {"queue": self.name, "payload": item.payload,
                     "transactionId": item.transaction_id or uuid.uuid4().hex}
            if item.partition or partition:
                entry["partition"] = item.partition or partition
            if item.trace_id is not None:
                entry["traceId"] = item.trace_id
            wire.append(entry)
        answer = await self._transport.call("POST", "/api/v1/push", {"items": wire}, safe=True)
        return [PushResult.from_wire(result) for result in answer]

    # -- consuming ------------------------------------------------------------------------------

    @wire_names(**GROUP, **WAIT, autoAck="auto_ack", subscriptionMode="mode")
    async def pop(self, *, group: str | None = None, batch: int = 1, partitions: int = 1, partition: str | None = None,
                  wait=None, auto_ack: bool = False, mode: str = "all") -> Delivery:
        """Take up to `batch` messages (from up to `partitions` partitions, or from `partition`)
        under one lease; `wait` ("20s", at most 60 s) parks the call until something comes.
        auto_ack: resolved at once, no lease (at most once)."""
        params = {"batch": batch, "partitions": partitions}
        wait_ms = _wait_ms(wait)
        if wait_ms:
            params["waitMs"] = wait_ms
        if group is not None:
            params["consumerGroup"] = group
        if auto_ack:
            params["autoAck"] = "true"
        if mode != "all":
            params["subscriptionMode"] = mode
        path = f"/api/v1/pop/queue/{quote(self.name, safe='')}"
        if partition is not None:
            path += f"/partition/{quote(partition, safe='')}"
        answer = await self._transport.call("GET", f"{path}?{urlencode(params)}", safe=False,
                                            timeout_s=self._transport.timeout_s + wait_ms / 1000)
        return self._delivery(answer)

    def _delivery(self, answer: dict) -> Delivery:
        """A pop's answer (or an ack's or a transaction's `next`, which is one) as a Delivery."""
        messages = [Message.from_wire(wire, self.name, self) for wire in answer.get("messages", [])]
        return Delivery(messages, answer.get("leaseId"), answer.get("expiresAt"), answer.get("partitionsClaimed", 0),
                        answer.get("reason"))

    async def ack(self, message: Message, status: str = "completed", *, error: str | None = None) -> AckResult:
        [result] = await self.ack_many([message], status, error=error)
        return result

    async def ack_many(self, messages: list[Message], status: str = "completed", *, error: str | None = None) -> list[AckResult]:
        """Ack several messages in one call, in order (each with `status`)."""
        if not messages:
            return []
        wire = [m.ack_wire(status, error) for m in messages]
        answer = await self._transport.call("POST", "/api/v1/ack/batch", {"acknowledgments": wire}, safe=True)
        for message in messages:
            message.settled = True
        return [AckResult.from_wire(result) for result in answer]

    @wire_names(leaseId="lease_id", partitionId="partition_id", **GROUP)
    async def ack_offset(self, lease_id: int, partition_id: int, offset: int, status: str = "completed", *,
                         error: str | None = None, group: str | None = None) -> AckResult:
        """Ack a message named by the ids a pop gave (a script's, or another process's, delivery)."""
        wire = given({"partitionId": partition_id, "leaseId": lease_id, "offset": offset, "status": status},
                     error=error, consumerGroup=group)
        return AckResult.from_wire(await self._transport.call("POST", "/api/v1/ack", wire, safe=True))

    @wire_names(leaseId="lease_id")
    async def extend(self, lease_id: int, seconds: int | None = None) -> bool:
        """Push the lease's end to now + seconds (the queue's lease time by default); False when the
        lease is no longer live."""
        body = {} if seconds is None else {"seconds": int(seconds)}
        answer = await self._transport.call("POST", f"/api/v1/lease/{lease_id}/extend", body, safe=True)
        return answer["success"]

    @wire_names(leaseId="lease_id")
    async def release(self, lease_id: int) -> bool:
        """End the lease now: its unacked messages go to the next consumer, retry_count unchanged."""
        answer = await self._transport.call("POST", f"/api/v1/lease/{lease_id}/release", {}, safe=True)
        return answer["success"]

    @wire_names(**GROUP, **WAIT)
    def consume(self, *, group: str | None = None, batch: int = 1, partitions: int = 1, wait="30s",
                lease=None) -> AsyncIterator[Message]:
        """Every message of the queue for `group`, one at a time, forever (see the module docstring
        for how they are acked and what leaving the loop does); a broker restart or a dropped
        connection is waited out (client/queen_client/consumer.py). Needs `async with queen_client.Client()`."""
        return self.deliveries(group=group, batch=batch, partitions=partitions, wait=wait, lease=lease)

    @wire_names(**GROUP, **WAIT)
    async def process(self, handler: Callable[[Message], object | Awaitable[object]], *, group: str | None = None,
                      batch: int = 1, partitions: int = 1, wait="30s", lease=None, grace="10s",
                      stop=None, handle_signals: bool = True) -> None:
        """Run handler(message) for every message: its return acks "completed", its exception
        acks "failed" with the error's text. Goes on through broker restarts and dropped
        connections. Stops gracefully when `stop` (an asyncio.Event, trio.Event or anyio.Event)
        is set, or on SIGTERM or Ctrl-C (handle_signals; every loop of the process stops on the
        first one, queen_client/stop_signals.py): no new pop, the
        running handler gets up to `grace` to finish, what finished is acked and the lease
        released, so the rest is delivered again at once with its retry count unchanged; a second
        signal cuts the grace short. Returns after a stop or SIGTERM; raises queen_client.Interrupted
        (exit 130, no traceback) after Ctrl-C. Cancelling the call stops it at once, with the
        same acks and release. Needs `async with queen_client.Client()`."""
        grace_s = seconds_of(grace, "grace")
        stopping = anyio.Event()
        signalled: list[int] = []
        handling = anyio.CancelScope()  # the running handler's: a stop gives it grace_s more
        handling.cancel()  # nothing runs yet

        def begin_stop(hard: bool) -> None:
            if stopping.is_set() or hard:
                handling.cancel()
            else:
                handling.deadline = min(handling.deadline, anyio.current_time() + grace_s)
            stopping.set()

        steps = self.deliveries(group=group, batch=batch, partitions=partitions, wait=wait, lease=lease,
                                stopping=stopping)
        # Every loop of the process hears every signal (queen_client/stop_signals.py).
        with STOP_SIGNALS.receiver() if handle_signals else contextlib.nullcontext() as received:
            async with anyio.create_task_group() as watchers:
                if stop is not None:
                    async def relay_stop() -> None:
                        await stop.wait()
                        begin_stop(False)

                    watchers.start_soon(relay_stop)
                if received is not None:
                    async def on_signals() -> None:
                        async for signum in received:
                            logger.info("event=consumer_stopping queue=%s signal=%s grace_s=%s", self.name,
                                        signal.Signals(signum).name, grace_s)
                            signalled.append(signum)
                            begin_stop(len(signalled) > 1)

                    watchers.start_soon(on_signals)
                try:
                    failure: Exception | None = None
                    while True:
                        try:
                            message = await steps.asend(failure)
                        except StopAsyncIteration:
                            break
                        handling = anyio.CancelScope(deadline=anyio.current_time() + grace_s if stopping.is_set()
                                                     else float("inf"))
                        failure = None
                        with handling:
                            try:
                                outcome = handler(message)
                                if inspect.isawaitable(outcome):
                                    await outcome
                            except Exception as error:  # noqa: BLE001 - the handler's failure is the message's
                                failure = error
                        if handling.cancelled_caught:
                            logger.warning("event=handler_cut queue=%s offset=%s partition=%s grace_s=%s", self.name,
                                           message.offset, message.partition, grace_s)
                            break  # not finished: released with the lease, delivered again unchanged
                finally:
                    with anyio.CancelScope(shield=True):
                        await steps.aclose()
                    watchers.cancel_scope.cancel()
        if signal.SIGINT in signalled:
            say_interrupted(self.name)
            raise Interrupted

    @wire_names(**GROUP, **WAIT)
    def deliveries(self, *, group: str | None = None, batch: int = 1, partitions: int = 1, wait="30s", lease=None,
                   stopping: anyio.Event | None = None) -> AsyncGenerator[Message, Exception | None]:
        """The one delivery loop behind consume() and process(), async and blocking alike
        (client/queen_client/consumer.py): yields each message and is sent back how handling it went."""
        return consumer.deliveries(self, group=group, batch=batch, partitions=partitions, wait=wait, lease=lease,
                                   stopping=stopping)

    def _next_wire(self, *, group: str | None, batch: int, partitions: int) -> dict:
        """The `next` a consumer's acks carry (queen_client/consumer.py): a pop of this queue."""
        return next_wire(self.name, group=group, batch=batch, partitions=partitions)

    async def _lease_time_s(self) -> float:
        info = await self.info()
        return float(info["options"]["leaseTimeSeconds"]) if info.get("found") else 300.0

    # -- the queue ------------------------------------------------------------------------------

    async def info(self) -> dict:
        """The queue's options, counts and groups (`found: False` if it does not exist)."""
        return await self._transport.call("GET", f"/api/v1/resources/queues/{quote(self.name, safe='')}", safe=True)

    @wire_names(**GROUP)
    async def dlq(self, *, group: str | None = None, limit: int = 100) -> AsyncIterator[dict]:
        """Every DLQ entry of the queue (of `group`), oldest move first."""
        cursor = None
        while True:
            params = {"queue": self.name, "limit": limit}
            if group is not None:
                params["consumerGroup"] = group
            if cursor is not None:
                params["cursor"] = cursor
            page = await self._transport.call("GET", f"/api/v1/dlq?{urlencode(params)}", safe=True)
            for entry in page["messages"]:
                yield entry
            cursor = page.get("cursor")
            if cursor is None:
                return

    @wire_names(**GROUP)
    async def requeue(self, entries: list[dict], *, group: str | None = None) -> list[bool]:
        """Put DLQ entries (as `dlq()` gives them) back to pending, first in their partitions."""
        body = {"queue": self.name, "consumerGroup": group or DEFAULT_GROUP,
                "items": [{"partitionId": e["partitionId"], "offset": e["offset"]} for e in entries]}
        answer = await self._transport.call("POST", "/api/v1/dlq/requeue", body, safe=True)
        return [result["requeued"] for result in answer["results"]]

    @wire_names(**GROUP)
    async def purge_dlq(self, *, group: str | None = None) -> int:
        params = {"queue": self.name, **({"consumerGroup": group} if group is not None else {})}
        answer = await self._transport.call("DELETE", f"/api/v1/dlq?{urlencode(params)}", safe=True)
        return answer["purged"]

    async def delete(self) -> bool:
        answer = await self._transport.call("DELETE", f"/api/v1/resources/queues/{quote(self.name, safe='')}", safe=True)
        return answer["deleted"]
