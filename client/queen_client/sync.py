"""`queen_client.SyncClient`: the blocking client, for scripts and cron jobs.

    with queen_client.SyncClient() as client:
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
import concurrent.futures
import ctypes
import functools
import logging
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import anyio
from anyio.from_thread import BlockingPortal

from queen_client._http import DEFAULT_FAILOVER_TIMEOUT_S
from queen_client.client import Client
from queen_client.errors import Interrupted, LockLost, LockNotAcquired, say_interrupted
from queen_client.kv import PAGE_ITEMS_MAX, Item, Kv
from queen_client.locks import Holder, Lock, Locks, RunResult
from queen_client.options import GROUP, TTL, WAIT, wire_names
from queen_client.queues import Delivery, Message, Queue
from queen_client.stop_signals import STOP_SIGNALS
from queen_client.timers import SCHEDULE, Timer, Timers
from queen_client.txn import TxnKv, TxnResult

logger = logging.getLogger(__name__)


def _blocking(async_method):
    """The blocking twin of an async method of a wrapped handle (`self._inner`): the same name,
    signature and docstring, so a call written once in the async client is here too; it runs on the
    client's loop thread and blocks until it is done."""
    name = async_method.__name__

    @functools.wraps(async_method)
    def method(self, *args, **kwargs):
        return self._sync._call(getattr(self._inner, name), *args, **kwargs)

    return method


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = [ctypes.c_ulong, ctypes.py_object]
_set_async_exc.restype = ctypes.c_int


class SyncClient:
    def __init__(self, url: str | Sequence[str] | None = None, *, token: str | None = None, ca_file: str | None = None,
                 connections_max: int = 16, timeout_s: float = 10.0, retries_max: int = 5,
                 failover_timeout=DEFAULT_FAILOVER_TIMEOUT_S):
        """As queen_client.Client's."""
        self._settings = dict(url=url, token=token, ca_file=ca_file, connections_max=connections_max,
                              timeout_s=timeout_s, retries_max=retries_max, failover_timeout=failover_timeout)
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
        # Made in the main thread, it puts the process's SIGTERM/SIGINT handlers in place, so that
        # process() loops in other threads hear them too (queen_client/stop_signals.py).
        self._holds_signals = threading.current_thread() is threading.main_thread()
        if self._holds_signals:
            STOP_SIGNALS.hold()
        atexit.register(self.close)  # a script that forgets close() still releases what it holds

    def __repr__(self) -> str:
        return f"<queen_client.SyncClient {self.url}>"

    @property
    def epoch(self) -> int | None:
        """As Client.epoch: the last X-Queen-Epoch a node answered with (None on one node)."""
        return self._client.epoch

    @property
    def leader_url(self) -> str:
        """As Client.leader_url: the node calls go to now."""
        return self._client.leader_url

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
            portal.call(portal.stop, True)  # calls in flight (a parked pop) are cancelled, not awaited
            self._thread.join()
        if self._holds_signals:
            self._holds_signals = False
            STOP_SIGNALS.release()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @wire_names(**TTL)
    def lock(self, name: str, *, ttl, owner: str | None = None, auto_renew: bool = True) -> SyncLock:
        return SyncLock(self, self._call(lambda: self._client.lock(name, ttl=ttl, owner=owner, auto_renew=auto_renew)))

    @wire_names(**TTL)
    def semaphore(self, name: str, n: int, *, ttl, owner: str | None = None, auto_renew: bool = True) -> SyncLock:
        return SyncLock(self, self._call(lambda: self._client.semaphore(name, n, ttl=ttl, owner=owner, auto_renew=auto_renew)))

    def queue(self, name: str) -> SyncQueue:
        return SyncQueue(self, self._call(lambda: self._client.queue(name)))

    def transaction(self) -> SyncTransaction:
        return SyncTransaction(self)

    def statistics(self) -> dict:
        return self._call(self._client.statistics)

    def queues(self, prefix: str = "") -> list[dict]:
        async def collect():
            return [row async for row in self._client.queues(prefix)]
        return self._call(collect)


class SyncKv:
    """`client.kv` of the SyncClient: the same calls as the async one, blocking."""

    def __init__(self, sync: SyncClient):
        self._sync = sync
        self._inner = sync._client.kv

    get = _blocking(Kv.get)
    get_many = _blocking(Kv.get_many)
    get_prefix_page = _blocking(Kv.get_prefix_page)
    put = _blocking(Kv.put)
    put_if_absent = _blocking(Kv.put_if_absent)
    delete = _blocking(Kv.delete)
    incr = _blocking(Kv.incr)
    check = _blocking(Kv.check)

    def get_prefix(self, ns: str, prefix: str = "", *, page_size: int = PAGE_ITEMS_MAX) -> Iterator[Item]:
        """Every live key under prefix, in key order, a page per call as the loop goes."""
        cursor = None
        while True:
            page = self.get_prefix_page(ns, prefix, cursor, page_size)
            yield from page.items
            if page.cursor is None:
                return
            cursor = page.cursor


class SyncLocks:
    def __init__(self, sync: SyncClient):
        self._sync = sync
        self._inner = sync._client.locks

    call = _blocking(Locks.call)
    holders = _blocking(Locks.holders)
    acquire = _blocking(Locks.acquire)
    renew = _blocking(Locks.renew)
    release = _blocking(Locks.release)

    def list(self, prefix: str = "", *, page_size: int = 1000) -> list[Holder]:
        async def collect():
            return [holder async for holder in self._inner.list(prefix, page_size=page_size)]
        return self._sync._call(collect)


class _Interrupter:
    """Raises `exception` once in a thread while it is armed: LockLost in the thread that holds a
    `with lock.hold():` block, a cut in a handler that outlived its grace."""

    def __init__(self, thread_id: int, exception: type[BaseException] = LockLost):
        self.thread_id = thread_id
        self.exception = exception
        # Re-entrant: a signal handler in the interrupted thread may take it while that thread holds it.
        self.mutex = threading.RLock()
        self.armed = True
        self.fired = False

    def fire(self, reason) -> None:  # on another thread
        with self.mutex:
            if self.armed and not self.fired:
                self.fired = True
                _set_async_exc(self.thread_id, self.exception)

    def fire_here(self) -> bool:
        """For raising it oneself, in the thread (a signal handler there): True once, while armed."""
        with self.mutex:
            if self.armed and not self.fired:
                self.fired = True
                return True
            return False

    def disarm(self) -> None:  # on the interrupted thread, first thing when the block ends
        while True:
            try:
                with self.mutex:
                    self.armed = False
                    if self.fired:
                        _set_async_exc(self.thread_id, ctypes.py_object())  # drop it if not yet raised
                return
            except self.exception:
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
            inner.on_lost(interrupter.fire)
        else:
            interrupter.fire(inner.lost_reason)

    def __exit__(self, exc_type, exc, tb):
        interrupter = self.interrupter
        interrupter.disarm()
        lock = self.lock
        inner = lock._lock
        inner.remove_on_lost(interrupter.fire)
        lost = interrupter.fired or lock.lost_reason is not None
        reason = lock.lost_reason
        lock._sync._call(inner.release_quietly)
        if lost and (exc_type is None or issubclass(exc_type, LockLost)):
            raise LockLost(lock.name, reason) from None
        return False


class SyncLock:
    """A lock or semaphore handle of the SyncClient: the async handle's calls, blocking."""

    def __init__(self, sync: SyncClient, lock: Lock):
        self._sync = sync
        self._lock = self._inner = lock
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
    deadline = property(lambda self: self._read("deadline"),
                        doc="until when the permit is ours at the latest unless renewed, on time.monotonic() (the "
                            "clock of the client's asyncio loop)")
    lost_reason = property(lambda self: self._lock.lost_reason)
    refusal = property(lambda self: self._lock.refusal)

    acquire = _blocking(Lock.acquire)
    release = _blocking(Lock.release)
    renew = _blocking(Lock.renew)
    keep_alive = _blocking(Lock.keep_alive)
    status = _blocking(Lock.status)
    release_quietly = _blocking(Lock.release_quietly)

    def remove_on_lost(self, callback: Callable[[str], object]) -> None:
        self._lock.remove_on_lost(callback)

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



class SyncTransaction:
    """The async Transaction's builder, committed with a blocking call."""

    def __init__(self, sync: SyncClient):
        self._sync = sync
        self._txn = sync._client.transaction()
        self.kv = TxnKv(self)

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

    @wire_names(**GROUP, **WAIT)
    def then_pop(self, queue: str, *, group: str | None = None, batch: int = 1, partitions: int = 1,
                 wait=None) -> SyncTransaction:
        self._txn.then_pop(queue, group=group, batch=batch, partitions=partitions, wait=wait)
        return self

    @wire_names(**SCHEDULE)
    def timer(self, queue: str, key: str, payload=None, *, at=None, delay=None, cron: str | None = None,
              timezone: str | None = None, every=None, partition: str | None = None,
              transaction_id: str | None = None, trace_id: str | None = None) -> SyncTransaction:
        self._txn.timer(queue, key, payload, at=at, delay=delay, cron=cron, timezone=timezone, every=every,
                        partition=partition, transaction_id=transaction_id, trace_id=trace_id)
        return self

    def cancel_timer(self, queue: str, key: str) -> SyncTransaction:
        self._txn.cancel_timer(queue, key)
        return self

    def commit(self) -> TxnResult:
        result = self._sync._call(self._txn.commit)
        if result.next is not None:
            handle = self._sync.queue(self._txn._next["queue"])
            for message in result.next.messages:
                message._queue = handle  # so message.ack() blocks too
        return result


class _SyncTxnQueue:
    def __init__(self, txn: SyncTransaction, name: str):
        self._txn = txn
        self.name = name

    def push_many(self, items, *, partition: str | None = None) -> SyncTransaction:
        self._txn._txn.queue(self.name).push_many(items, partition=partition)
        return self._txn

    def push(self, items, *, partition: str | None = None) -> SyncTransaction:
        self._txn._txn.queue(self.name).push(items, partition=partition)
        return self._txn


class SyncTimers:
    """`client.timers` of the SyncClient: the same calls as the async one, blocking."""

    def __init__(self, sync: SyncClient):
        self._sync = sync
        self._inner = sync._client.timers

    schedule = _blocking(Timers.schedule)
    cancel = _blocking(Timers.cancel)
    get = _blocking(Timers.get)

    def list(self, queue: str, *, prefix: str = "", limit: int = 100) -> list[Timer]:
        async def collect():
            return [timer async for timer in self._inner.list(queue, prefix=prefix, limit=limit)]
        return self._sync._call(collect)


class SyncQueue:
    """`client.queue(name)` of the SyncClient: the async queue's calls, blocking. `consume()` is a
    plain generator and `process()` a blocking loop, both driving the async queue's one delivery
    loop (`Queue.deliveries`) from your thread; the lease is extended on the client's loop thread
    while your code handles the messages."""

    def __init__(self, sync: SyncClient, queue: Queue):
        self._sync = sync
        self._queue = self._inner = queue
        self.name = queue.name

    def __repr__(self) -> str:
        return f"<queen_client.SyncQueue {self.name!r}>"

    configure = _blocking(Queue.configure)
    push = _blocking(Queue.push)
    ack = _blocking(Queue.ack)
    ack_many = _blocking(Queue.ack_many)
    ack_offset = _blocking(Queue.ack_offset)
    extend = _blocking(Queue.extend)
    release = _blocking(Queue.release)
    info = _blocking(Queue.info)
    requeue = _blocking(Queue.requeue)
    purge_dlq = _blocking(Queue.purge_dlq)
    delete = _blocking(Queue.delete)

    @functools.wraps(Queue.push_many)
    def push_many(self, items, *, partition: str | None = None):
        return self._sync._call(self._queue.push_many, list(items), partition=partition)  # read here, not there

    @functools.wraps(Queue.pop)
    def pop(self, *args, **kwargs) -> Delivery:
        delivery = self._sync._call(self._queue.pop, *args, **kwargs)
        for message in delivery.messages:
            message._queue = self  # so message.ack() blocks too
        return delivery

    @wire_names(**GROUP)
    def dlq(self, *, group: str | None = None, limit: int = 100) -> list[dict]:
        async def collect():
            return [entry async for entry in self._queue.dlq(group=group, limit=limit)]
        return self._sync._call(collect)

    @wire_names(**GROUP, **WAIT)
    def consume(self, *, group: str | None = None, batch: int = 1, partitions: int = 1, wait="30s",
                lease=None) -> Iterator[Message]:
        """Every message, one at a time, forever; acked "completed" when the loop asks for the
        next one. Broker restarts are waited out. Leaving the loop acks what was handled and
        releases the lease."""
        steps = self._queue.deliveries(group=group, batch=batch, partitions=partitions, wait=wait, lease=lease)
        try:
            while (message := self._next(steps, None)) is not None:
                yield message
        finally:
            self._close(steps)

    @wire_names(**GROUP, **WAIT)
    def process(self, handler, *, group: str | None = None, batch: int = 1, partitions: int = 1, wait="30s",
                lease=None, grace="10s", stop: threading.Event | None = None, handle_signals: bool = True) -> None:
        """handler(message) for every message: its return acks "completed", its exception
        "failed". Goes on through broker restarts. Stops gracefully when `stop` is set, or on
        SIGTERM or Ctrl-C (handle_signals; every loop of the process stops on the first one, in
        any thread, when the SyncClient was made in the main thread or a loop runs there): no new
        pop, the running handler gets up to `grace` to finish (then it is interrupted: at once in
        the main thread, at its next Python instruction in another), what finished is acked and
        the lease released, so the rest is delivered again at once with its retry count unchanged;
        a second signal cuts the grace short. Returns after a stop or SIGTERM; raises
        queen_client.Interrupted (exit 130, no traceback) after Ctrl-C."""
        from queen_client.durations import seconds

        stopping = self._sync._call(anyio.Event)
        steps = self._queue.deliveries(group=group, batch=batch, partitions=partitions, wait=wait, lease=lease,
                                       stopping=stopping)
        stopper = _Stopper(self._sync, stopping, seconds(grace, "grace"))
        stop_listening = STOP_SIGNALS.listen(stopper.on_signal) if handle_signals else None
        if stop is not None:
            threading.Thread(target=lambda: stop.wait() and stopper.begin(), name="queen-stop", daemon=True).start()
        failure: Exception | None = None
        try:
            while (message := self._next(steps, failure)) is not None:
                try:
                    stopper.handling_starts()
                    handler(message)
                    failure = None
                except Exception as error:  # noqa: BLE001 - the handler's failure is the message's
                    failure = error
                except _HandlerCut:
                    logger.warning("event=handler_cut queue=%s offset=%s partition=%s grace_s=%s", self._queue.name,
                                   message.offset, message.partition, stopper.grace_s)
                    break  # not finished: released with the lease, delivered again unchanged
                finally:
                    stopper.handling_ends()
        finally:
            if stop_listening is not None:
                stop_listening()
            stopper.done()
            self._close(steps)
        if signal.SIGINT in stopper.signals:
            say_interrupted(self._queue.name)
            raise Interrupted

    def _next(self, steps, failure: Exception | None) -> Message | None:
        """The next message (None once the loop ended), waited for on the client's loop; an
        interrupt while waiting cancels the wait there (the loop then acks and releases)."""
        future = self._sync._portal.start_task_soon(steps.asend, failure)
        try:
            message = future.result()
        except StopAsyncIteration:
            return None
        except BaseException:
            future.cancel()
            concurrent.futures.wait([future])
            raise
        message._queue = self
        return message

    def _close(self, steps) -> None:
        if self._sync._portal is not None:
            self._sync._call(steps.aclose)


class _HandlerCut(BaseException):
    """Raised in the handler's thread when a stop's grace period has passed."""


class _Stopper:
    """A blocking process()'s stop: told of SIGTERM and SIGINT by STOP_SIGNALS (in the main thread),
    it sets the loop's `stopping` event, and cuts a handler that outlives the grace period or meets
    a second signal: raised in its thread, once, never after the handler returned (_Interrupter)."""

    def __init__(self, sync: SyncClient, stopping, grace_s: float):
        self.sync = sync
        self.stopping = stopping
        self.grace_s = grace_s
        self.signals: list[int] = []
        self.thread_id = threading.get_ident()
        self.in_main_thread = threading.current_thread() is threading.main_thread()
        self.cut: _Interrupter | None = None  # the running handler's, while one runs
        self.grace_over = False
        self.timer: threading.Timer | None = None

    def handling_starts(self) -> None:
        self.cut = _Interrupter(self.thread_id, _HandlerCut)
        if self.grace_over:
            self._cut_now()

    def handling_ends(self) -> None:
        cut, self.cut = self.cut, None
        cut.disarm()

    def on_signal(self, signum: int) -> None:  # in the main thread, in STOP_SIGNALS' handler
        self.signals.append(signum)
        if len(self.signals) > 1:
            self._cut_now()  # a second signal: no more grace
        self.begin()

    def begin(self) -> None:
        portal = self.sync._portal
        if portal is None or self.timer is not None:
            return
        portal.start_task_soon(self._set_stopping)
        self.timer = threading.Timer(self.grace_s, self._grace_is_over)
        self.timer.daemon = True
        self.timer.start()

    async def _set_stopping(self) -> None:
        self.stopping.set()

    def _grace_is_over(self) -> None:  # on the timer's thread
        self.grace_over = True
        self._cut_now()

    def _cut_now(self) -> None:
        cut = self.cut
        if cut is None:
            return
        if threading.get_ident() == self.thread_id:  # the main thread's own loop, told of a signal
            if cut.fire_here():
                raise _HandlerCut
        elif not (self.in_main_thread and STOP_SIGNALS.raise_in_main_thread(_HandlerCut, cut.fire_here)):
            # The handler's thread: at its next Python instruction (a call blocked in C sees it when
            # it returns). In the main thread a signal of our own wakes a blocked call too.
            cut.fire(None)

    def done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
