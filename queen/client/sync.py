"""`queen.SyncClient`: the blocking client, for scripts and cron jobs.

    with queen.SyncClient() as client:
        with client.lock("nightly-report", ttl="30s").hold():
            build_report()

It is the async Client running on an event loop in one background thread (asyncio, through an
anyio BlockingPortal): every call hops onto that loop, and handles renew there while your code
runs. So the sync client has the async one's behaviour exactly, and one implementation to test.

Loss in a `with lock.hold():` block: the block is interrupted by LockLost raised in the thread that
entered it (CPython's PyThreadState_SetAsyncExc), at its next Python instruction. A call blocked
in C (time.sleep, a socket read, waiting on a subprocess) sees it when that call returns; wait with
`lock.wait_lost(timeout)` instead of sleeping, and run subprocesses with `queen run-locked`.
The interruption is one-shot, and cannot land after the block has been left.

on_lost callbacks run on the client's loop thread.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from collections.abc import Callable, Iterator
from functools import partial

import anyio
from anyio.from_thread import BlockingPortal

from queen.client.client import Client
from queen.client.errors import LockLost, LockNotAcquired
from queen.client.kv import PAGE_ITEMS_MAX, CheckResult, Item, WriteResult
from queen.client.locks import Holder, Lock, RunResult
from queen.client.queues import AckResult, Delivery, Message, PushResult, Queue, _LeaseKeeper
from queen.client.timers import Timer, TimerResult
from queen.client.txn import Transaction, TxnResult, _TxnKv

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = [ctypes.c_ulong, ctypes.py_object]
_set_async_exc.restype = ctypes.c_int


class SyncClient:
    def __init__(self, url: str | None = None, *, connections_max: int = 16, timeout_s: float = 10.0,
                 retries_max: int = 5):
        self._settings = dict(url=url, connections_max=connections_max, timeout_s=timeout_s, retries_max=retries_max)
        self._portal: BlockingPortal | None = None
        self._client: Client | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run_loop, name="queen-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        self.url = self._client.url
        self.kv = SyncKv(self)
        self.locks = SyncLocks(self)
        self.timers = SyncTimers(self)
        atexit.register(self.close)  # a script that forgets close() still releases what it holds

    def __repr__(self) -> str:
        return f"<queen.SyncClient {self.url}>"

    def _run_loop(self) -> None:
        try:
            anyio.run(self._serve)
        except BaseException as error:  # reported to the constructor, or lost with the thread
            self._failure = error
            self._ready.set()

    async def _serve(self) -> None:
        async with BlockingPortal() as portal, Client(**self._settings) as client:
            self._portal, self._client = portal, client
            self._ready.set()
            await portal.sleep_until_stopped()

    def _call(self, fn, *args, **kwargs):
        if self._portal is None:
            raise RuntimeError("this SyncClient is closed")
        return self._portal.call(partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Release every permit still held and close the connections. Idempotent."""
        atexit.unregister(self.close)
        portal, self._portal = self._portal, None
        if portal is not None:
            portal.call(portal.stop)
            self._thread.join()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def lock(self, name: str, *, ttl, owner: str | None = None, auto_renew: bool = True) -> SyncLock:
        return SyncLock(self, self._call(lambda: self._client.lock(name, ttl=ttl, owner=owner, auto_renew=auto_renew)))

    def semaphore(self, name: str, n: int, *, ttl, owner: str | None = None, auto_renew: bool = True) -> SyncLock:
        return SyncLock(self, self._call(lambda: self._client.semaphore(name, n, ttl=ttl, owner=owner, auto_renew=auto_renew)))

    def queue(self, name: str) -> SyncQueue:
        return SyncQueue(self, self._call(lambda: self._client.queue(name)))

    def transaction(self) -> SyncTransaction:
        return SyncTransaction(self)

    def statistics(self) -> dict:
        return self._call(self._client.statistics)


class SyncKv:
    """`client.kv` of the SyncClient: the same calls as the async one, blocking."""

    def __init__(self, sync: SyncClient):
        self._sync = sync

    def _kv(self):
        return self._sync._client.kv

    def get(self, ns: str, key: str) -> Item:
        return self._sync._call(self._kv().get, ns, key)

    def get_many(self, ns: str, keys: list[str]) -> list[Item]:
        return self._sync._call(self._kv().get_many, ns, keys)

    def get_prefix(self, ns: str, prefix: str = "", *, page_size: int = PAGE_ITEMS_MAX) -> Iterator[Item]:
        cursor = None
        while True:
            page = self._sync._call(self._kv().get_prefix_page, ns, prefix, cursor, page_size)
            yield from page.items
            if page.cursor is None:
                return
            cursor = page.cursor

    def put(self, ns: str, key: str, value, *, ttl=None, forever: bool = False, expect: int | None = None) -> WriteResult:
        return self._sync._call(self._kv().put, ns, key, value, ttl=ttl, forever=forever, expect=expect)

    def put_if_absent(self, ns: str, key: str, value, *, ttl=None, forever: bool = False) -> WriteResult:
        return self._sync._call(self._kv().put_if_absent, ns, key, value, ttl=ttl, forever=forever)

    def delete(self, ns: str, key: str, *, expect: int | None = None) -> WriteResult:
        return self._sync._call(self._kv().delete, ns, key, expect=expect)

    def incr(self, ns: str, key: str, by: int = 1, *, max: int | None = None, min: int | None = None,
             ttl=None, forever: bool = False, expect: int | None = None) -> WriteResult:
        return self._sync._call(self._kv().incr, ns, key, by, max=max, min=min, ttl=ttl, forever=forever, expect=expect)

    def check(self, ns: str, key: str, expect: int) -> CheckResult:
        return self._sync._call(self._kv().check, ns, key, expect)


class SyncLocks:
    def __init__(self, sync: SyncClient):
        self._sync = sync

    def call(self, *operations: dict) -> list[dict]:
        return self._sync._call(self._sync._client.locks.call, *operations)

    def holders(self, name: str) -> list[Holder]:
        return self._sync._call(self._sync._client.locks.holders, name)

    def list(self, prefix: str = "") -> list[Holder]:
        async def collect():
            return [holder async for holder in self._sync._client.locks.list(prefix)]
        return self._sync._call(collect)


class _Interrupter:
    """Raises LockLost once in the thread that holds a `with lock.hold():` block."""

    def __init__(self, thread_id: int):
        self.thread_id = thread_id
        self.mutex = threading.Lock()
        self.armed = True
        self.fired = False

    def fire(self, reason) -> None:  # on the loop thread
        with self.mutex:
            if self.armed and not self.fired:
                self.fired = True
                _set_async_exc(self.thread_id, LockLost)

    def disarm(self) -> None:  # on the holding thread, first thing when the block ends
        while True:
            try:
                with self.mutex:
                    self.armed = False
                    if self.fired:
                        _set_async_exc(self.thread_id, ctypes.py_object())  # drop it if not yet raised
                return
            except LockLost:
                continue  # it landed here, on the way out: `fired` accounts for it


class _Hold:
    def __init__(self, lock: SyncLock, wait):
        self.lock = lock
        self.wait = wait
        self.interrupter: _Interrupter | None = None

    def __enter__(self) -> SyncLock:
        lock = self.lock
        if not lock.acquire(wait=self.wait):
            reason, holders = lock._lock.refusal
            raise LockNotAcquired(lock.name, reason, holders)
        interrupter = self.interrupter = _Interrupter(threading.get_ident())
        lock._sync._call(self._arm, interrupter)
        return lock

    def _arm(self, interrupter: _Interrupter) -> None:  # on the loop thread, so no loss slips between
        inner = self.lock._lock
        if inner.held:
            inner._callbacks.append(interrupter.fire)
        else:
            interrupter.fire(inner.lost_reason)

    def __exit__(self, exc_type, exc, tb):
        interrupter = self.interrupter
        interrupter.disarm()
        lock = self.lock
        inner = lock._lock
        try:
            inner._callbacks.remove(interrupter.fire)
        except ValueError:
            pass
        lost = interrupter.fired or lock.lost_reason is not None
        reason = lock.lost_reason
        lock._sync._call(inner._release_quietly)
        if lost and (exc_type is None or issubclass(exc_type, LockLost)):
            raise LockLost(lock.name, reason) from None
        return False


class SyncLock:
    """A lock or semaphore handle of the SyncClient: the async handle's calls, blocking."""

    def __init__(self, sync: SyncClient, lock: Lock):
        self._sync = sync
        self._lock = lock
        self.name = lock.name
        self.owner = lock.owner
        self.ttl_s = lock.ttl_s
        self.limit = lock.limit

    def __repr__(self) -> str:
        return repr(self._lock).replace("<", "<Sync", 1)

    def _read(self, attribute: str):
        return self._sync._call(lambda: getattr(self._lock, attribute))

    token = property(lambda self: self._read("token"), doc="the latest token while held, else None")
    fence = property(lambda self: self._read("fence"))
    slot = property(lambda self: self._read("slot"))
    guard = property(lambda self: self._read("guard"))
    held = property(lambda self: self._read("held"))
    lost_reason = property(lambda self: self._lock.lost_reason)
    refusal = property(lambda self: self._lock.refusal)

    def acquire(self, wait=None) -> bool:
        return self._sync._call(self._lock.acquire, wait)

    def release(self) -> bool:
        return self._sync._call(self._lock.release)

    def renew(self) -> bool:
        return self._sync._call(self._lock.renew)

    def keep_alive(self) -> bool:
        return self._sync._call(self._lock.keep_alive)

    def on_lost(self, callback: Callable[[str], object]) -> Callable[[str], object]:
        """callback(reason) on the client's loop thread when the lock is lost."""
        return self._lock.on_lost(callback)

    def wait_lost(self, timeout=None) -> str | None:
        """Block until the lock is lost (its reason) or `timeout` seconds pass (None)."""
        async def wait():
            with anyio.move_on_after(timeout):
                return await self._lock.wait_lost()
            return None
        return self._sync._call(wait)

    def hold(self, wait=None) -> _Hold:
        """`with lock.hold(wait="10s"):` runs the block only while the lock is ours; see the module
        docstring for how a loss interrupts it."""
        return _Hold(self, wait)

    def run(self, fn: Callable, *args, wait=None) -> RunResult:
        try:
            with self.hold(wait=wait):
                value = fn(*args)
        except LockNotAcquired as refused:
            return RunResult(False, None, refused.reason)
        return RunResult(True, value)

    def status(self) -> list[Holder]:
        return self._sync._call(self._lock.status)


class SyncTransaction:
    """The async Transaction's builder, committed with a blocking call."""

    def __init__(self, sync: SyncClient):
        self._sync = sync
        self._txn = Transaction(sync._client._transport)
        self.kv = _TxnKv(self)

    def _add(self, op: dict) -> SyncTransaction:
        self._txn._add(op)
        return self

    def guard(self, lock: SyncLock) -> SyncTransaction:
        self._txn.guard(lock._lock)
        return self

    def ack(self, message: Message, status: str = "completed", *, error: str | None = None) -> SyncTransaction:
        self._txn.ack(message, status, error=error)
        return self

    def queue(self, name: str) -> _SyncTxnQueue:
        return _SyncTxnQueue(self, name)

    def timer(self, queue: str, key: str, payload=None, *, at=None, delay=None, partition: str | None = None,
              transaction_id: str | None = None, trace_id: str | None = None) -> SyncTransaction:
        self._txn.timer(queue, key, payload, at=at, delay=delay, partition=partition, transaction_id=transaction_id,
                        trace_id=trace_id)
        return self

    def cancel_timer(self, queue: str, key: str) -> SyncTransaction:
        self._txn.cancel_timer(queue, key)
        return self

    def commit(self) -> TxnResult:
        return self._sync._call(self._txn.commit)


class _SyncTxnQueue:
    def __init__(self, txn: SyncTransaction, name: str):
        self._txn = txn
        self.name = name

    def push(self, items, *, partition: str | None = None) -> SyncTransaction:
        self._txn._txn.queue(self.name).push(items, partition=partition)
        return self._txn


class SyncTimers:
    """`client.timers` of the SyncClient: the same calls as the async one, blocking."""

    def __init__(self, sync: SyncClient):
        self._sync = sync

    def schedule(self, queue: str, key: str, payload, *, at=None, delay=None, partition: str | None = None,
                 transaction_id: str | None = None, trace_id: str | None = None) -> TimerResult:
        return self._sync._call(self._sync._client.timers.schedule, queue, key, payload, at=at, delay=delay,
                                partition=partition, transaction_id=transaction_id, trace_id=trace_id)

    def cancel(self, queue: str, key: str) -> bool:
        return self._sync._call(self._sync._client.timers.cancel, queue, key)

    def get(self, queue: str, key: str) -> Timer | None:
        return self._sync._call(self._sync._client.timers.get, queue, key)

    def list(self, queue: str, *, prefix: str = "", limit: int = 100) -> list[Timer]:
        async def collect():
            return [timer async for timer in self._sync._client.timers.list(queue, prefix=prefix, limit=limit)]
        return self._sync._call(collect)


class SyncQueue:
    """`client.queue(name)` of the SyncClient: the async queue's calls, blocking. `consume()` is a
    plain generator and `process()` a blocking loop; the lease is extended on the client's loop
    thread while your code handles the messages."""

    def __init__(self, sync: SyncClient, queue: Queue):
        self._sync = sync
        self._queue = queue
        self.name = queue.name

    def __repr__(self) -> str:
        return f"<queen.SyncQueue {self.name!r}>"

    def configure(self, **options) -> dict:
        return self._sync._call(self._queue.configure, **options)

    def push(self, payload, *, partition: str | None = None, transaction_id: str | None = None,
             trace_id: str | None = None) -> PushResult:
        return self._sync._call(self._queue.push, payload, partition=partition, transaction_id=transaction_id,
                                trace_id=trace_id)

    def push_many(self, items, *, partition: str | None = None) -> list[PushResult]:
        return self._sync._call(self._queue.push_many, list(items), partition=partition)

    def pop(self, *, group: str | None = None, batch: int = 1, partitions: int = 1, partition: str | None = None,
            wait=None, auto_ack: bool = False, mode: str = "all") -> Delivery:
        delivery = self._sync._call(self._queue.pop, group=group, batch=batch, partitions=partitions,
                                    partition=partition, wait=wait, auto_ack=auto_ack, mode=mode)
        for message in delivery.messages:
            message._queue = self
        return delivery

    def ack(self, message: Message, status: str = "completed", *, error: str | None = None) -> AckResult:
        return self._sync._call(self._queue.ack, message, status, error=error)

    def ack_many(self, messages: list[Message], status: str = "completed", *, error: str | None = None) -> list[AckResult]:
        return self._sync._call(self._queue.ack_many, messages, status, error=error)

    def extend(self, lease_id: int, seconds: int | None = None) -> bool:
        return self._sync._call(self._queue.extend, lease_id, seconds)

    def release(self, lease_id: int) -> bool:
        return self._sync._call(self._queue.release, lease_id)

    def info(self) -> dict:
        return self._sync._call(self._queue.info)

    def dlq(self, *, group: str | None = None) -> list[dict]:
        async def collect():
            return [entry async for entry in self._queue.dlq(group=group)]
        return self._sync._call(collect)

    def requeue(self, entries: list[dict], *, group: str | None = None) -> list[bool]:
        return self._sync._call(self._queue.requeue, entries, group=group)

    def purge_dlq(self, *, group: str | None = None) -> int:
        return self._sync._call(self._queue.purge_dlq, group=group)

    def delete(self) -> bool:
        return self._sync._call(self._queue.delete)

    def consume(self, *, group: str | None = None, batch: int = 1, partitions: int = 1, wait="30s", lease=None):
        """Every message, one at a time, forever; acked "completed" when the loop asks for the
        next one. Leaving the loop acks what was handled and releases the lease."""
        lease_s = self._sync._call(self._lease_time_s, lease)
        while True:
            delivery = self.pop(group=group, batch=batch, partitions=partitions, wait=wait)
            if not delivery.messages:
                continue
            keeper = self._keep(delivery, lease_s)
            handled, finished = [], False
            try:
                for message in delivery.messages:
                    yield message
                    if not message.settled:
                        handled.append(message)
                finished = True
            finally:
                self._close(keeper, delivery, handled, finished)

    def process(self, handler, *, group: str | None = None, batch: int = 1, partitions: int = 1, wait="30s",
                lease=None) -> None:
        """handler(message) for every message, forever: its return acks "completed", its exception
        "failed". Stop it with KeyboardInterrupt (or any exception raised around it)."""
        lease_s = self._sync._call(self._lease_time_s, lease)
        while True:
            delivery = self.pop(group=group, batch=batch, partitions=partitions, wait=wait)
            if not delivery.messages:
                continue
            keeper = self._keep(delivery, lease_s)
            handled, finished = [], False
            try:
                failed_partitions = set()
                for message in delivery.messages:
                    if message.partition_id in failed_partitions:
                        continue
                    try:
                        handler(message)
                    except Exception as error:  # noqa: BLE001 - the handler's failure is the message's
                        done = [m for m in handled if m.partition_id == message.partition_id]
                        handled = [m for m in handled if m.partition_id != message.partition_id]
                        if done:
                            self.ack_many(done)
                        self.ack(message, "failed", error=str(error)[:1024] or type(error).__name__)
                        failed_partitions.add(message.partition_id)
                        continue
                    if not message.settled:
                        handled.append(message)
                finished = True
            finally:
                self._close(keeper, delivery, handled, finished)

    async def _lease_time_s(self, lease) -> float:
        from queen.client.durations import seconds
        return seconds(lease) if lease is not None else await self._queue._lease_time_s()

    def _keep(self, delivery: Delivery, lease_s: float) -> _LeaseKeeper:
        keeper = _LeaseKeeper(self._queue, delivery.lease_id, lease_s)
        self._sync._call(lambda: self._sync._client._start(keeper.run))
        return keeper

    def _close(self, keeper: _LeaseKeeper, delivery: Delivery, handled: list, finished: bool) -> None:
        if self._sync._portal is None:
            return
        self._sync._call(keeper.stop)
        self._sync._call(self._queue._close_delivery, delivery, handled, finished)
