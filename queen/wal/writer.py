"""The group-commit writer: one frame and one fsync per batch of whatever arrived meanwhile.

Shard actors `submit` effect records synchronously right after applying them, so the buffer is
always in version order and a version that exists in memory is always in the buffer, in the frame
being written, or durable. Callers then `when_durable(version, waiter)`; the waiter's `done` event is
set once the fsync covering that version returns (or with `error` set if it never will).

Encoding, write and fsync run in a worker thread (trio.to_thread) so the event loop keeps
serving requests and forming the next batch meanwhile.

On a write or fsync error the writer stops for good: nothing in that batch or after it is
acknowledged, and the file is never fsynced again as if the failed fsync had not happened (after a
failed fsync the kernel may have dropped the dirty pages; a retry that succeeds proves nothing).
"""

from __future__ import annotations

import logging
import os
import time

import trio

from queen.errors import Unavailable
from queen.wal.disk import Disk
from queen.wal.frame import encode_frame, file_header
from queen.wal.recovery import effect_version, list_dir, segment_name
from queen.wal.snapshot import encode_snapshot, snapshot_name

logger = logging.getLogger(__name__)


class WalWriter:
    def __init__(self, data_dir: str, *, disk: Disk, next_segment: int, durable_version: int,
                 segment_bytes_max: int, snapshot_wal_bytes: int, capture_state=None, run_blocking=None):
        self.data_dir = data_dir
        self.disk = disk
        # How blocking disk work runs: a worker thread in production. Tests under MockClock pass an
        # inline runner, since autojump would otherwise advance virtual time during every fsync.
        self._run_blocking = run_blocking or trio.to_thread.run_sync
        self.durable_version = durable_version
        self.failed: OSError | None = None
        self.segment_bytes_max = segment_bytes_max
        self.snapshot_wal_bytes = snapshot_wal_bytes
        # capture_state() -> [(ns, {key: Row})...] per shard, taken synchronously at a batch edge.
        self._capture_state = capture_state
        self._records: list = []
        self._waiters: list = []
        self._first_version = 0
        self._last_version = durable_version
        self._inflight_last = durable_version
        self._inflight_waiters: list = []
        self._work = trio.Event()
        self._closing = False
        self._segment_seq = next_segment
        self._fd: int | None = None
        self._segment_bytes = 0
        self._bytes_since_snapshot = 0
        self._snapshot_running = False
        self.batches = 0
        self.records_written = 0
        self.bytes_written = 0
        self.fsync_seconds_total = 0.0
        self.snapshots_written = 0

    # -- called by shard actors, synchronously -------------------------------------------------

    def submit(self, records: list) -> None:
        if self.failed is not None:
            return  # nothing will be written again; every waiter is answered 503 by when_durable
        if not self._records:
            self._first_version = effect_version(records[0])
        self._records.extend(records)
        self._last_version = effect_version(records[-1])
        if not self._work.is_set():
            self._work.set()

    def when_durable(self, version: int, waiter) -> None:
        """Set waiter.done once `version` is durable; with waiter.error if it never will be."""
        if version <= self.durable_version:
            waiter.done.set()
        elif self.failed is not None:
            waiter.error = _unavailable(self.failed)
            waiter.done.set()
        elif version <= self._inflight_last:
            self._inflight_waiters.append(waiter)
        else:
            assert version <= self._last_version, "waiting for a version nobody submitted"
            self._waiters.append(waiter)

    # -- the writer task ---------------------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self._run_blocking(self._open_segment)
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                if not self._records:
                    if self._closing:
                        break
                    await self._work.wait()
                    self._work = trio.Event()
                    continue
                records, waiters = self._records, self._waiters
                first, last = self._first_version, self._last_version
                self._records, self._waiters = [], []
                self._inflight_last, self._inflight_waiters = last, waiters
                captured = None
                if (self._capture_state is not None and not self._snapshot_running
                        and self._bytes_since_snapshot >= self.snapshot_wal_bytes):
                    captured = self._capture_state()  # state exactly at `last`: no await since
                    self._bytes_since_snapshot = 0
                try:
                    await self._run_blocking(self._commit, records, first, captured is not None)
                except OSError as error:
                    self._fail(error)
                    return
                self.durable_version = last
                for waiter in waiters:
                    waiter.done.set()
                if captured is not None:
                    self._snapshot_running = True
                    nursery.start_soon(self._write_snapshot, last, self._segment_seq, captured)
        await self._run_blocking(self._close_segment)

    def close(self) -> None:
        """Flush what is buffered, then let run() return."""
        self._closing = True
        self._work.set()

    def _fail(self, error: OSError) -> None:
        self.failed = error
        logger.error("event=wal_failed error=%r action=refusing_writes records_unacknowledged=%d",
                     str(error), len(self._records))
        unavailable = _unavailable(error)
        for waiter in self._inflight_waiters + self._waiters:
            waiter.error = unavailable
            waiter.done.set()
        self._inflight_waiters, self._waiters, self._records = [], [], []

    # -- blocking parts, in a worker thread --------------------------------------------------------

    def _open_segment(self) -> None:
        path = os.path.join(self.data_dir, segment_name(self._segment_seq))
        self._fd = self.disk.open_append(path)
        header = file_header()
        self.disk.write(self._fd, header)
        self.disk.fsync(self._fd)
        self.disk.fsync_dir(self.data_dir)
        self._segment_bytes = len(header)

    def _close_segment(self) -> None:
        if self._fd is not None:
            self.disk.close(self._fd)
            self._fd = None

    def _commit(self, records: list, first_version: int, roll: bool) -> None:
        frame = encode_frame(records, first_version)
        started = time.perf_counter()
        self.disk.write(self._fd, frame)
        self.disk.fsync(self._fd)
        self.fsync_seconds_total += time.perf_counter() - started
        self.batches += 1
        self.records_written += len(records)
        self.bytes_written += len(frame)
        self._segment_bytes += len(frame)
        self._bytes_since_snapshot += len(frame)
        if roll or self._segment_bytes >= self.segment_bytes_max:
            self._close_segment()
            self._segment_seq += 1
            self._open_segment()
            logger.info("event=segment_cut segment=%s", segment_name(self._segment_seq))

    async def _write_snapshot(self, version: int, first_segment: int, captured) -> None:
        try:
            removed = await self._run_blocking(self._snapshot_blocking, version, first_segment, captured)
        except OSError as error:
            # A failed snapshot loses nothing (the segments it would replace are kept); say so and
            # try again after the next threshold.
            logger.error("event=snapshot_failed version=%d error=%r", version, str(error))
        else:
            self.snapshots_written += 1
            logger.info("event=snapshot version=%d segments_removed=%d", version, removed)
        finally:
            self._snapshot_running = False

    def _snapshot_blocking(self, version: int, first_segment: int, captured) -> int:
        data = encode_snapshot(version, first_segment, captured)
        self.disk.write_file_atomically(os.path.join(self.data_dir, snapshot_name(version)), data)
        segments, snapshots = list_dir(self.data_dir)
        removed = 0
        for seq, name in segments.items():
            if seq < first_segment:
                self.disk.remove(os.path.join(self.data_dir, name))
                removed += 1
        for snap_version, name in snapshots.items():
            if snap_version < version:
                self.disk.remove(os.path.join(self.data_dir, name))
        return removed


def _unavailable(error: OSError) -> Unavailable:
    # Not "nothing was written": after a failed fsync the frame may still reach the disk, so the
    # outcome is unknown, as after a crash. A retry with the same owner/expect converges.
    return Unavailable("not_durable", "the server could not make this call durable; its outcome is unknown "
                       "(it may be present after a restart) and writes are refused until the server is restarted",
                       {"cause": str(error)})
