"""SIGTERM and Ctrl-C for every `process()` loop of the process: the first signal stops them all.

A process has one handler per signal. Loops that each installed their own (as they once did) left
every signal to the last one installed: one loop stopped, the others went on popping, and the
process never exited. `STOP_SIGNALS` owns the process's SIGTERM and SIGINT handlers while a loop
listens: each loop adds a callback, and every signal is told to every callback, in the main
thread, where Python runs signal handlers. A callback only hands the signal on (to its event loop,
or to its blocking loop's stop), never blocks on it.

Handlers can be installed from the main thread only. A loop in another thread (a SyncClient's
`process()` in a thread of yours) is told as well once they are in place: a SyncClient made in the
main thread puts them in place for its lifetime (`hold()`), and while no loop listens a signal
does what it did before (the previous handler, or the default action: SIGTERM still ends a
process that runs no loop). The previous handlers come back when the last listener leaves and
nothing holds them, from the main thread (elsewhere they stay, passing signals on, until then).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from functools import partial

import anyio

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def loop_scheduler() -> Callable[[Callable[[], object]], object]:
    """How to run a function soon on the running event loop from a signal handler or another
    thread, without blocking (asyncio's call_soon_threadsafe, Trio's run_sync_soon)."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # not asyncio: anyio runs on Trio, which is loaded then (not a dependency of ours)
        return sys.modules["trio"].lowlevel.current_trio_token().run_sync_soon


class StopSignals:
    def __init__(self) -> None:
        self._mutex = threading.Lock()  # never taken in the handler, which may interrupt its holder
        self._listeners: dict[int, Callable[[int], None]] = {}
        self._next_key = 0
        self._previous: dict[int, object] | None = None  # the handlers ours replaced, while in place
        self._holds = 0
        self._raise_pending: tuple[type[BaseException], Callable[[], bool]] | None = None

    @staticmethod
    def _in_main_thread() -> bool:
        return threading.current_thread() is threading.main_thread()

    def listen(self, callback: Callable[[int], None]) -> Callable[[], None] | None:
        """Call callback(signum), in the main thread, for every SIGTERM and SIGINT until the returned
        function is called. None when no handler can be in place: in another thread than the main
        one, while none is (see the module docstring)."""
        with self._mutex:
            if self._previous is None:
                if not self._in_main_thread():
                    return None
                self._install()
            key = self._next_key
            self._next_key += 1
            self._listeners[key] = callback

        def stop_listening() -> None:
            with self._mutex:
                self._listeners.pop(key, None)
                self._uninstall_if_idle()

        return stop_listening

    @contextmanager
    def receiver(self) -> Iterator[AsyncIterator[int] | None]:
        """For a loop on an event loop (in a task): the signals as an async iterator, as
        anyio.open_signal_receiver gives them, but heard by every loop of the process alike. None
        when none can be heard (see listen)."""
        heard: deque[int] = deque()
        woken = [anyio.Event()]
        schedule = loop_scheduler()

        def hear(signum: int) -> None:  # on the event loop, outside any task: nothing but native calls
            heard.append(signum)
            woken[0].set()

        stop_listening = self.listen(lambda signum: schedule(partial(hear, signum)))
        if stop_listening is None:
            yield None
            return

        async def signals() -> AsyncIterator[int]:
            while True:
                while heard:
                    yield heard.popleft()
                await woken[0].wait()
                woken[0] = anyio.Event()

        try:
            yield signals()
        finally:
            stop_listening()

    def hold(self) -> None:
        """Keep the handlers in place (from the main thread; elsewhere nothing happens) until release()."""
        if not self._in_main_thread():
            return
        with self._mutex:
            if self._previous is None:
                self._install()
            self._holds += 1

    def release(self) -> None:
        with self._mutex:
            if self._holds and self._in_main_thread():
                self._holds -= 1
                self._uninstall_if_idle()

    def raise_in_main_thread(self, exception: type[BaseException], wanted: Callable[[], bool]) -> bool:
        """Raise `exception` in the main thread now, even in a call blocked there (time.sleep, a
        read): a SIGINT of our own to it, whose handler raises, if wanted() still says so then, and
        is told to no listener. False when our handlers are not in place (the caller does without)."""
        if self._previous is None:
            return False
        self._raise_pending = (exception, wanted)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return True

    # -- under the mutex, in the main thread -------------------------------------------------------

    def _install(self) -> None:
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in SIGNALS}

    def _uninstall_if_idle(self) -> None:
        if self._previous is None or self._listeners or self._holds or not self._in_main_thread():
            return
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:  # unless the program put its own since
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = None

    # -- the handler: the main thread, between two of its bytecodes --------------------------------

    def _on_signal(self, signum: int, frame) -> None:
        pending, self._raise_pending = self._raise_pending, None
        if pending is not None and signum == signal.SIGINT:
            exception, wanted = pending
            if wanted():
                raise exception
            return
        listeners = list(self._listeners.values())
        if not listeners:
            self._pass_on(signum, frame)
            return
        raised = None
        for callback in listeners:  # every one is told, even if one raises (a blocking loop's cut)
            try:
                callback(signum)
            except BaseException as error:  # noqa: BLE001 - raised below, once all are told
                raised = raised or error
        if raised is not None:
            raise raised

    def _pass_on(self, signum: int, frame) -> None:
        """No loop listens: what the signal did before ours were in place."""
        previous = (self._previous or {}).get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default action (SIG_DFL, or a handler set outside Python)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


STOP_SIGNALS = StopSignals()  # the process's: one set of signal handlers per process
