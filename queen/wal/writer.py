"""The group-commit writer: one frame and one fsync per batch of whatever arrived meanwhile.

Steps `submit` their records synchronously right after they are applied, so the buffer is always in
version order and a version that exists in memory is in the buffer, in the frame being written, or
durable. Callers then `when_durable(version, waiter)`; the waiter's `done` event is set once the
fsync covering that version returns (or with `error` set if it never will).

Where the disk work runs: encoding, write and fsync of a frame run on the event loop while fsyncs
are fast, and in the disk thread once they are slow (bench/README.md, "Durability path"). A thread
hand-off per frame costs more CPU than a fast fsync blocks the loop; a slow disk must not stall
every connection. Snapshots always go to the thread.

Replication (queen/cluster/replication.py), off on a single node: `replicate`, when set, is called
on the event loop after every local write + fsync with the exact bytes written (the ceiling and
batch frames; a segment_cut frame is each node's own and is not passed) and their highest
version. Waiters are then released only by `release(version)`, which the replicator calls once the
sync set has acked: `durable_version` is min(fsynced here, acked by the sync set). A follower
appends its leader's frames with `submit_frames`, unchanged, in the same segments. The version
ceiling may be capped (`ceiling_allowed`, raised by the cluster's coordinator after reserving
versions in etcd): a batch whose last version is above it waits, unwritten and unanswered, and
`ceiling_wanted` is set whenever a renewal is cut short by the cap. On a cluster's node,
`read_barrier` takes the waiters with nothing left to ship (version <= fsynced here: a read, or a
write that changed nothing): the leader answers them only after a round trip to its sync set.
When the sync set stays out of reach, the replicator answers the held waiters itself
(`take_held`) and sets `sync_refusal`, which the router raises for every new write until it is
cleared (nothing is applied then).

Who commits: the writer task, woken by a submit. Except for a lone client on a single node: a caller
that brackets its steps with hold()/unhold() (the router) and finds, on unhold, the writer idle,
committing inline, nothing to replicate and nobody else connected (`alone`, wired by the server),
commits the frame itself, in its own task: the same frame, fsync and answers, without waking the
writer and being woken back (two passes of trio's run loop a request). With more clients the
writer gathers them as before.

Invariants:
  - versions rise across submits (asserted);
  - no waiter is released before its version is fsynced here and, while `replicate` is set,
    acked by the sync set (`release`);
  - before a frame goes to disk, a ceiling record at or above its last version is on disk in an
    earlier frame or the snapshot; the writer renews the ceiling CEILING_BLOCK ahead (never past
    VERSION_MAX, which no version passes), in a small frame written just before the batch's (same
    write, same fsync), whenever a batch comes within half a block of it. Recovery restarts
    versions above the highest ceiling, so even a cut frame's versions are never handed out twice;
  - a segment is allocated at its full size when created, so the fdatasync after each frame
    flushes data without growing the file (recovery reads the zeros after the last frame as the
    end of the log);
  - a segment is cut by creating the next one (header, fsync, directory fsync) and only then
    writing a segment_cut record into the old one, so the log never names a segment the disk may
    not have. Running out of descriptors while cutting is not a failure: the log goes on in the
    current segment and the cut is tried again at the next commit.

On a write or fsync error (or `stop`: a step that failed, a leader stepping down) the writer stops for good: nothing in that batch or after it is
acknowledged, and the file is never fsynced again as if the failed fsync had not happened (after a
failed fsync the kernel may have dropped the dirty pages; a retry that succeeds proves nothing).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass

import trio

from queen.core import records as rec
from queen.core.kv import VERSION_MAX
from queen.errors import QueenError, Unavailable
from queen.histogram import FRAME_BYTES, FSYNC_SECONDS, Histogram, HistogramSnapshot
from queen.wal.disk import Disk
from queen.wal.frame import encode_frame, file_header
from queen.wal.segment import CEILING_BLOCK, list_dir, segment_name, snapshot_name
from queen.wal.snapshot import encode_snapshot

logger = logging.getLogger(__name__)

# A frame's write + fsync runs on the event loop while the mean of recent ones is under
# INLINE_FSYNC_S_MAX, in the disk thread once it goes over, and back on the loop under half of it.
# Measured on an ext4 disk doing 6,000 fdatasyncs/s: inline at 0.3-0.5 ms per commit still costs
# 20% less CPU per request than the thread's hand-offs, and serves more requests per second.
INLINE_FSYNC_S_MAX = 0.002
# But an inline commit stalls every connection for as long as its fsync takes: with other clients
# connected, one that took longer than INLINE_STALL_S_MAX moves commits to the thread at once,
# whatever the mean, and they stay there at least THREAD_HOLD_S. On a disk whose fsyncs jitter
# (0.3 ms, then 10), the mean alone flipped back and forth several times a second and each flip
# back stalled the loop again (bench/README.md, "queue-latency"). A lone client (`alone`) waits for
# that fsync anyway and nobody else is stalled: for it the mean alone decides, as the CPU prefers.
INLINE_STALL_S_MAX = 0.005
THREAD_HOLD_S = 5.0
_EWMA_WEIGHT = 0.2
# How many passes of the run loop a commit waits, at most, for work under way to join its frame.
GATHER_PASSES_MAX = 4


@dataclass(frozen=True, slots=True)
class WalStatistics:
    batches: int  # frames written, one fsync each
    records_written: int
    bytes_written: int
    fsync_seconds_total: float  # write + fsync of frames
    inline_commits: int  # frames written on the event loop rather than the disk thread
    snapshots_written: int
    failed: bool  # a write or fsync failed (or a step did): writes are refused until a restart
    durable_version: int
    ceiling: int
    fsync_seconds: HistogramSnapshot  # each frame's write + fsync
    frame_bytes: HistogramSnapshot  # each frame's size
    bytes_since_snapshot: int  # log written since the last snapshot began: what recovery replays
    fsync_last_seconds: float = 0.0  # write + fsync of the last frame
    fsync_recent_seconds: float = 0.0  # their moving mean, recent frames weighing most


class WalWriter:
    def __init__(self, data_dir: str, *, disk: Disk, next_segment: int, durable_version: int, ceiling: int,
                 segment_bytes_max: int, snapshot_wal_bytes: int, capture_state=None, run_blocking=None,
                 inline_allowed: bool = True):
        self.data_dir = data_dir
        self.disk = disk
        # How blocking disk work runs off the loop: the disk thread in production. Tests under
        # MockClock pass an inline runner, since autojump would otherwise advance virtual time
        # during every fsync.
        self._run_blocking = run_blocking or trio.to_thread.run_sync
        self._inline_allowed = inline_allowed
        self._inline = inline_allowed
        self._fsync_mean_s = 0.0
        self._thread_since_s = 0.0  # when commits last moved to the thread (time.monotonic)
        self.fsync_last_s = 0.0
        self.durable_version = durable_version
        self.ceiling = ceiling  # the highest ceiling on disk
        self.failed: Exception | None = None  # a write or fsync error, or a step that failed
        self.segment_bytes_max = segment_bytes_max
        self.snapshot_wal_bytes = snapshot_wal_bytes
        # capture_state() -> a function that, run in the disk thread, returns the snapshot's
        # sections; taken synchronously at a batch edge, so the state is exactly at that batch.
        self._capture_state = capture_state
        self._items: list = []
        self._waiters: list = []
        self._first_version = 0
        self._last_version = durable_version
        self._inflight_last = durable_version
        self._inflight_waiters: list = []
        self._work = trio.Event()
        self._closing = False
        self._idle = False  # the writer task is parked, waiting for work
        self._holds = 0  # callers between hold() and unhold(): their submits wake nobody yet
        self._wake_owed = False  # something was submitted under a hold
        self._stopped = False  # a write or fsync failed: the writer task ends
        self._nursery: trio.Nursery | None = None  # the writer's, for snapshots
        # () -> bool: whether the caller releasing a hold is the only client, so no other request can
        # join its frame (the server: one connection open). None: the writer task always commits.
        self.alone = None
        self._segment_seq = next_segment
        self._fd: int | None = None
        self._segment_bytes = 0
        self._cut_wanted = False
        self._bytes_since_snapshot = 0
        self._snapshot_running = False
        self.batches = 0
        self.records_written = 0
        self.bytes_written = 0
        self.fsync_seconds_total = 0.0
        self.snapshots_written = 0
        self.inline_commits = 0
        self.caller_commits = 0  # of those, frames a lone client committed in its own task (unhold)
        # Observed in _commit, where the fsync is timed anyway; it runs in the disk thread too, but
        # only one commit runs at a time and /metrics reads a copy.
        self.fsync_histogram = Histogram(FSYNC_SECONDS)
        self.frame_histogram = Histogram(FRAME_BYTES)
        # Replication (module docstring). None on a single node: answers go at the local fsync.
        self.replicate = None
        self.local_version = durable_version  # the highest version fsynced here
        self._held: deque = deque()  # (last version, waiters) fsynced here, not yet released
        self._raw: list[bytes] = []  # frames another node wrote, to append unchanged
        self._raw_last = 0
        self._raw_ceiling = 0
        self._ceiling_allowed = VERSION_MAX
        self._ceiling_raised = trio.Event()
        self.ceiling_wanted = trio.Event()
        self.read_barrier = None  # a cluster's (module docstring); None on a single node
        # A cluster leader's, while its sync set is out of reach: new writes are refused with it
        # before anything is applied (queen/runtime/router.py), /healthz reports it.
        self.sync_refusal: QueenError | None = None

    @property
    def ceiling_allowed(self) -> int:
        """The highest version a ceiling record may reach (VERSION_MAX on a single node). A batch
        whose last version is above it waits, unwritten and unanswered, until it is raised."""
        return self._ceiling_allowed

    @ceiling_allowed.setter
    def ceiling_allowed(self, value: int) -> None:
        self._ceiling_allowed = min(value, VERSION_MAX)
        self._ceiling_raised.set()
        self._ceiling_raised = trio.Event()
        if self.ceiling_wanted.is_set() and self._last_version + CEILING_BLOCK <= self._ceiling_allowed:
            self.ceiling_wanted = trio.Event()

    @property
    def last_version(self) -> int:
        """The highest version submitted (or appended, or recovered: at least the log's ceiling)."""
        return self._last_version

    def statistics(self) -> WalStatistics:
        return WalStatistics(self.batches, self.records_written, self.bytes_written, self.fsync_seconds_total,
                             self.inline_commits, self.snapshots_written, self.failed is not None,
                             self.durable_version, self.ceiling, self.fsync_histogram.snapshot(),
                             self.frame_histogram.snapshot(), self._bytes_since_snapshot, self.fsync_last_s,
                             self._fsync_mean_s)

    # -- called by whoever applied a step, synchronously --------------------------------------------

    def submit(self, items: list, first_version: int, last_version: int) -> None:
        """Queue a step's records (a flat list, queen/core/records.py) for the next frame. They took
        the versions first_version..last_version, all above any submitted before."""
        assert first_version > self._last_version or self.failed is not None, "versions must rise across submits"
        if self.failed is not None:
            return  # nothing will be written again; every waiter is answered 503 by when_durable
        if not self._items:
            self._first_version = first_version
        self._items += items
        self._last_version = last_version
        if self._holds:
            self._wake_owed = True
        elif not self._work.is_set():
            self._work.set()

    def hold(self) -> None:
        """Submits from now until the matching unhold() wake the writer only at that unhold, which
        may commit them in the caller's task instead. Always pair with unhold() (try/finally)."""
        self._holds += 1

    def unhold(self) -> None:
        """End a hold: commit what was submitted under it here when the caller is alone, the node
        single (nothing to replicate or wait for) and the writer idle and committing inline; else wake
        the writer, as a submit would have."""
        self._holds -= 1
        if self._holds or not self._wake_owed:
            return
        self._wake_owed = False
        if self._idle and self._inline and self._items and self.failed is None and not self._closing \
                and self.replicate is None and self._ceiling_allowed == VERSION_MAX \
                and self.alone is not None and self.alone():
            self.caller_commits += 1
            self._commit_here()
        elif not self._work.is_set():
            self._work.set()

    def submit_frames(self, data: bytes, last_version: int, ceiling: int) -> None:
        """Queue frames another node wrote (a follower's leader), to be appended as they are; the
        records in them were applied already (as a step's are before submit). last_version: their
        highest version (0 for none); ceiling: their highest ceiling record (0 for none)."""
        if self.failed is not None:
            return
        self._raw.append(data)
        if last_version > self._raw_last:
            self._raw_last = last_version
            if last_version > self._last_version:
                self._last_version = last_version
        if ceiling > self._raw_ceiling:
            self._raw_ceiling = ceiling
        if not self._work.is_set():
            self._work.set()

    def release(self, version: int) -> None:
        """While `replicate` is set: answers up to `version` (at most what is fsynced here) may go."""
        version = min(version, self.local_version)
        if version <= self.durable_version:
            return
        self.durable_version = version
        held = self._held
        while held and held[0][0] <= version:
            for waiter in held.popleft()[1]:
                waiter.done.set()

    def take_held(self) -> list:
        """While `replicate` is set: the waiters of frames fsynced here that the sync set has not
        acked yet, taken out for the replicator to answer otherwise (its sync set is out of
        reach); release() sets none of them later. Their versions stay unreleased
        (durable_version) until the sync set acks them."""
        waiters = [waiter for _, bucket in self._held for waiter in bucket]
        self._held.clear()
        return waiters

    def when_durable(self, version: int, waiter) -> None:
        """Set waiter.done once `version` is durable; with waiter.error if it never will be."""
        if version <= self.durable_version and self.read_barrier is None:
            waiter.done.set()
        elif self.read_barrier is not None and version <= self.local_version:
            self.read_barrier(version, waiter)
        elif self.failed is not None:
            failed = self.failed
            waiter.error = failed if isinstance(failed, QueenError) else _unavailable(failed)
            waiter.done.set()
        elif version <= self._inflight_last:
            self._inflight_waiters.append(waiter)
        else:
            assert version <= self._last_version, "waiting for a version nobody submitted"
            self._waiters.append(waiter)

    # -- the writer task ----------------------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._fd = await self._run_blocking(self._create_segment, self._segment_seq)
        self._segment_bytes = len(file_header())
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                if self._stopped:
                    return
                if not self._items and not self._raw:
                    if self._closing:
                        break
                    self._idle = True
                    try:
                        await self._work.wait()
                    finally:
                        self._idle = False
                    self._work = trio.Event()
                    continue
                await self._gather()
                if self._items and self._last_version + CEILING_BLOCK > self._ceiling_allowed:
                    self.ceiling_wanted.set()
                    while self._last_version > self._ceiling_allowed and self.failed is None:
                        await self._ceiling_raised.wait()  # submits meanwhile join this batch
                    if self.failed is not None:
                        continue  # stopped meanwhile: its waiters were answered
                if self._inline:
                    self._commit_here()
                    continue
                items, waiters, first, last, raw, captured = self._take_batch()
                try:
                    data = await self._run_blocking(self._commit, items, first, last, raw)
                except OSError as error:
                    self._fail(error)
                    return
                self._finish_batch(data, items, waiters, last, captured)
        await self._run_blocking(self._close_segment)

    def _take_batch(self) -> tuple:
        """What is buffered, as the next frame: (items, waiters, first, last, raw frames, captured
        state)."""
        items, waiters, raw = self._items, self._waiters, self._raw
        first, last = self._first_version, self._last_version
        self._items, self._waiters, self._raw = [], [], []
        self._inflight_last, self._inflight_waiters = last, waiters
        captured = None
        if (self._capture_state is not None and not self._snapshot_running
                and self._bytes_since_snapshot >= self.snapshot_wal_bytes):
            captured = self._capture_state()  # state exactly at what this batch writes: no await since
            self._cut_wanted = True
        return items, waiters, first, last, raw, captured

    def _commit_here(self) -> None:
        """Commit what is buffered on the event loop, in the calling task (the writer's, or a lone
        client's: unhold()), and answer its waiters (or hand them to replication)."""
        items, waiters, first, last, raw, captured = self._take_batch()
        self.inline_commits += 1
        try:
            data = self._commit(items, first, last, raw)
        except Exception as error:
            # A disk error; or a bug (say, a record that does not encode), which in a lone
            # client's task must not leave the batch's versions out of the log while later frames
            # go on: either way nothing more is written or acknowledged.
            if not isinstance(error, OSError):
                logger.exception("event=commit_failed action=refusing_writes")
            self._fail(error)
            self._stopped = True
            self._work.set()  # the writer task ends, as after a failure of its own commit
            return
        self._finish_batch(data, items, waiters, last, captured)

    def _finish_batch(self, data: bytes, items: list, waiters: list, last: int, captured) -> None:
        """A frame is on disk here: answer its waiters (on a cluster's leader, once the sync set has
        it too: replicate), start a snapshot if one was captured."""
        written = last if items else self._raw_last
        if written > self.local_version:
            self.local_version = written
        if self.replicate is None:
            self.durable_version = last
            for waiter in waiters:
                waiter.done.set()
        else:
            self._held.append((last, waiters))
            self.replicate(data, written)
        if captured is not None:
            if self._cut_wanted:  # the new segment could not be opened: snapshot later
                self._bytes_since_snapshot = self.snapshot_wal_bytes
            else:
                self._bytes_since_snapshot = 0
                self._snapshot_running = True
                assert self._nursery is not None
                self._nursery.start_soon(self._write_snapshot, written, self.ceiling, self._segment_seq, captured)
        if self._inline_allowed:
            self._choose_where_to_commit(time.monotonic(), self.alone is not None and self.alone())

    async def _gather(self) -> None:
        """Let work already under way join this frame: while other tasks are ready to run (each
        pass of the run loop also reads the sockets that became ready), step aside, a few times
        at most. One fsync then covers more requests; a request waits at most those passes."""
        for _ in range(GATHER_PASSES_MAX):
            if trio.lowlevel.current_statistics().tasks_runnable == 0:
                return
            await trio.lowlevel.cancel_shielded_checkpoint()

    def close(self) -> None:
        """Flush what is buffered, then let run() return."""
        self._closing = True
        self._work.set()

    def _choose_where_to_commit(self, now_s: float, alone: bool) -> None:
        """After each commit: inline or in the thread from now on (the constants above say why);
        `alone`: one client connected, whom a stalled loop costs nothing."""
        if self._inline:
            if self._fsync_mean_s > INLINE_FSYNC_S_MAX or (self.fsync_last_s > INLINE_STALL_S_MAX and not alone):
                self._inline = False
                self._thread_since_s = now_s if not alone else now_s - THREAD_HOLD_S
                logger.debug("event=wal_commits_to_thread fsync_mean_ms=%.3f fsync_last_ms=%.3f",
                            self._fsync_mean_s * 1000, self.fsync_last_s * 1000)
        elif self._fsync_mean_s < INLINE_FSYNC_S_MAX / 2 and (alone or now_s - self._thread_since_s >= THREAD_HOLD_S):
            self._inline = True
            logger.debug("event=wal_commits_inline fsync_mean_ms=%.3f", self._fsync_mean_s * 1000)

    def stop(self, error: Exception) -> None:
        """Take no more writes: what is in memory can no longer be trusted to match the log (or
        this node no longer leads). Waiters get `error` itself when it is a QueenError (a leader
        stepping down answers 503 not_leader), else 503 not_durable."""
        if self.failed is None:
            self._fail(error)
        self._work.set()

    def _fail(self, error: Exception) -> None:
        self.failed = error
        logger.error("event=wal_failed error=%r action=refusing_writes records_unacknowledged=%d",
                     str(error), len(self._items))
        unavailable = error if isinstance(error, QueenError) else _unavailable(error)
        held = [waiter for _, bucket in self._held for waiter in bucket]
        for waiter in held + self._inflight_waiters + self._waiters:
            if not waiter.done.is_set():
                waiter.error = unavailable
                waiter.done.set()
        self._inflight_waiters, self._waiters, self._items, self._raw = [], [], [], []
        self._held.clear()
        self._ceiling_raised.set()  # a batch waiting for ceiling gives up

    # -- blocking parts -------------------------------------------------------------------------------

    def _create_segment(self, seq: int) -> int:
        """A new segment file whose header and directory entry are durable; its fd."""
        path = os.path.join(self.data_dir, segment_name(seq))
        fd = self.disk.create(path)
        try:
            self.disk.allocate(fd, self.segment_bytes_max)
            self.disk.write(fd, file_header())
            self.disk.fsync(fd)
            self.disk.fsync_dir(self.data_dir)
        except BaseException:
            self.disk.close(fd)
            raise
        return fd

    def _close_segment(self) -> None:
        """At shutdown: close the segment and give back the space allocated ahead of its end."""
        if self._fd is not None:
            self.disk.close(self._fd)
            self._fd = None
            try:
                self.disk.truncate(os.path.join(self.data_dir, segment_name(self._segment_seq)), self._segment_bytes)
            except FileNotFoundError:
                pass  # a cluster follower set its whole log aside to fetch its leader's (stopped first)

    def _commit(self, items: list, first_version: int, last_version: int, raw: list[bytes]) -> bytes:
        """Write and fsync a batch: raw frames as they are, then the frame of items (after a
        ceiling frame when the ceiling needs renewing). Returns the bytes written."""
        data = b"".join(raw) if raw else b""
        ceiling = max(self.ceiling, self._raw_ceiling) if raw else self.ceiling
        if items:
            cap = self._ceiling_allowed  # at most VERSION_MAX
            if last_version > ceiling - CEILING_BLOCK // 2 and ceiling < cap:
                # Never past VERSION_MAX: no version goes past it (queen/runtime/steps.py), and recovery
                # refuses a log whose ceiling does. Never past what the cluster reserved either.
                ceiling = min(last_version + CEILING_BLOCK, cap)
                marker: list = []
                rec.ceiling(marker, ceiling)
                data += encode_frame(marker, 0, 0)
            data += encode_frame(items, first_version, last_version)
        started = time.perf_counter()
        self.disk.write(self._fd, data)
        self.disk.fsync(self._fd)
        elapsed = time.perf_counter() - started
        self.ceiling = ceiling
        self.fsync_last_s = elapsed
        self._fsync_mean_s += (elapsed - self._fsync_mean_s) * _EWMA_WEIGHT
        self.fsync_seconds_total += elapsed
        self.fsync_histogram.observe(elapsed)
        self.frame_histogram.observe(len(data))
        self.batches += 1
        self.records_written += last_version - first_version + 1 if items and last_version else 0
        self.bytes_written += len(data)
        self._segment_bytes += len(data)
        self._bytes_since_snapshot += len(data)
        if self._cut_wanted or self._segment_bytes >= self.segment_bytes_max:
            self._cut_segment()
        return data

    def _cut_segment(self) -> None:
        next_seq = self._segment_seq + 1
        try:
            fd = self._create_segment(next_seq)
        except OSError as error:
            # Out of descriptors, say: not a reason to stop logging. The current segment stays
            # open and the cut is tried again after the next commit.
            self._cut_wanted = True
            logger.warning("event=segment_cut_postponed segment=%s error=%r", segment_name(next_seq), str(error))
            return
        marker: list = []
        rec.segment_cut(marker, next_seq)
        frame = encode_frame(marker, 0, 0)
        self.disk.write(self._fd, frame)
        self.disk.fsync(self._fd)
        self.disk.close(self._fd)
        self._fd, self._segment_seq, self._segment_bytes = fd, next_seq, len(file_header())
        self._cut_wanted = False
        logger.info("event=segment_cut segment=%s", segment_name(next_seq))

    async def _write_snapshot(self, version: int, ceiling: int, first_segment: int, captured) -> None:
        try:
            removed = await self._run_blocking(self._snapshot_blocking, version, ceiling, first_segment, captured)
        except OSError as error:
            # A failed snapshot loses nothing (the segments it would replace are kept); say so and
            # try again after the next threshold.
            logger.error("event=snapshot_failed version=%d error=%r", version, str(error))
        else:
            self.snapshots_written += 1
            logger.info("event=snapshot version=%d segments_removed=%d", version, removed)
        finally:
            self._snapshot_running = False

    def _snapshot_blocking(self, version: int, ceiling: int, first_segment: int, captured) -> int:
        data = encode_snapshot(version, ceiling, first_segment, captured())
        self.disk.write_file_atomically(os.path.join(self.data_dir, snapshot_name(version)), data)
        segments, snapshots = list_dir(self.disk.list_dir(self.data_dir))
        removed = 0
        for seq, name in segments.items():
            if seq < first_segment:
                self.disk.remove(os.path.join(self.data_dir, name))
                removed += 1
        for snap_version, name in snapshots.items():
            if snap_version < version:
                self.disk.remove(os.path.join(self.data_dir, name))
        return removed


def _unavailable(error: Exception) -> Unavailable:
    # Not "nothing was written": after a failed fsync the frame may still reach the disk, so the
    # outcome is unknown, as after a crash. A retry with the same owner/expect converges.
    return Unavailable("not_durable", "the server could not make this call durable; its outcome is unknown "
                       "(it may be present after a restart) and writes are refused until the server is restarted",
                       {"cause": str(error)})
