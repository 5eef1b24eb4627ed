"""One long-lived thread for the WAL's blocking disk work.

trio.to_thread.run_sync costs, per call, a trip through trio's thread cache and the naming of the
thread (two prctl calls); at several hundred commits a second on a core the event loop already
saturates, that showed up in profiles. A single dedicated thread also keeps frames in order by
construction. The event loop hands it a job and parks the calling task; the thread reschedules that
task through the trio token when the job is done.
"""

from __future__ import annotations

import queue
import threading

import outcome
import trio


class DiskThread:
    def __init__(self, name: str = "queen-wal-disk"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, token, task = job
            result = outcome.capture(fn, *args)
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    async def run_sync(self, fn, *args):
        """Run fn(*args) on the disk thread. Not cancellable: a write or fsync under way is finished
        and its outcome delivered, so the caller never loses track of what reached the disk."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._jobs.put((fn, args, trio.lowlevel.current_trio_token(), trio.lowlevel.current_task()))
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
