"""The data path of a cluster: the leader ships its log's frames to followers, and answers a client
only once every member of the sync set has fsynced them too.

Roles. A node is "none" (neither), "leader" of an epoch, or "follower" of one; the coordinator
(etcd) decides which, and calls promise / lead / follow / set_sync / step_down. On the leader,
after the WAL writer writes and fsyncs a batch locally, the same bytes (its ceiling and batch
frames; a segment_cut frame is each node's own) go to every connected follower, and the writer
releases answers only up to min(fsynced here, acked by every sync-set member). A follower appends
the bytes unchanged to its own segments (so recovery reads them as its own), fsyncs, applies the
records to its in-memory State (no replay is needed at promotion; its snapshots keep working) and
acks. A follower acks nothing of an epoch before its promise of that epoch is durable, and refuses
(and closes) any stream of a lower epoch than it promised: once a newer epoch exists, an older
leader can never complete another answer.

Reads (the read barrier). Every answer on the leader waits for durability (above); an answer
whose call wrote nothing new to ship (a read, or a write that changed nothing: the writer hands
these to read_barrier) also waits for a round trip that began after it arrived to be acked, in this
epoch, by every member of the sync set: Raft's ReadIndex with the sync set for a majority. A
deposed leader cannot get one (a node promises a newer epoch before it can lead it, and only a
sync-set member can), so it never answers a read with data a newer leader may have changed. Every
FRAME and PROBE the leader makes carries a round number, rising; a follower echoes the newest it
received in its ACKs. A read is released once every sync-set member echoed a round newer than the
newest made when it arrived. Frames flowing provide rounds; when none was made since the newest
waiting read, a PROBE goes out at once (not at the heartbeat's pace), one for all the reads that
arrived meanwhile, and none while the previous probe is still out (reads that arrived after it
was made wait for the next). With an empty sync set only the check that this node still leads
is left. A node that does not lead (or stepped down) answers reads 503 leader_lost.

The sync timeout. A write waits for its sync set (after its local fsync), and a read for its round
trip, at most sync_timeout_s (--sync-timeout). When a frame or a read has waited that long, or a
sync-set member has had no stream that long, the sync set is out of reach: every call still
waiting is answered 503 sync_unavailable (a write with details.applied "unknown": it is on this
node's disk and reaches the sync set when it is back, unless a failover cuts it), and until the
sync set is back new writes are refused up front (applied false) and reads at once. It is back
when every member is connected again, has acked everything this log held when the outage began and
echoed a round made since (probes go out meanwhile). Nothing is ever released without the sync
set's acks: the outage only stops calls from waiting for them.

A node whose log or memory may now differ from its leader's (it stepped down, its tail had to be
cut, or it installed a snapshot) raises RestartNeeded from follow(): its files are already made
right, and it must be started again (recovery rebuilds memory from them) before it follows.

The wire, on one TCP connection per follower, opened by the follower: each message is a u32
big-endian length, then a CBOR array whose first item says what it is.

    follower -> leader
      HELLO     [1, cluster, node, promised_epoch, last_epoch, last_version]
      ACK       [6, epoch, fsynced_version, round]  round: the newest round received (0: none)
      REFUSE    [7, reason]                      the leader's epoch is older than promised; closes
    leader -> follower (after HELLO, one of DIVERGE, SNAPSHOT, or frames)
      DIVERGE   [2, epoch, truncate_to]          cut your log after this version, then come back
      SNAPSHOT  [3, epoch, chunk, more, history] the newest snapshot file in chunks (more: false on
                                                 the last); history: the epoch-history it covers
      FRAME     [4, epoch, frames, last_version, commit_version, leader_time_ms, round]
                                                 whole frames, as written (catch-up then live);
                                                 acked once fsynced (at once if nothing was new)
      HEARTBEAT [5, epoch, leader_time_ms, commit_version]   every HEARTBEAT_S while idle
      PROBE     [8, epoch, round, leader_time_ms]  reads wait: acked at once
      REFUSE    [7, reason]                      not leading, or a newer epoch was promised

last_version is the highest version of a record in the log (not the ceiling); commit_version is
what the leader has released (Raft's commitIndex: information, never needed for safety).
"""

from __future__ import annotations

import logging
import math
import os
import struct
from collections import deque
from dataclasses import dataclass

import cbor2
import trio

from queen.cluster import epochs
from queen.cluster import faults as test_faults
from queen.core import records as rec
from queen.core.state import BeginEpoch, Drain
from queen.errors import Unavailable
from queen.runtime.steps import Call
from queen.wal.frame import FILE_HEADER, FrameError, decode_frame, read_frame_header
from queen.wal.segment import list_dir, segment_name, snapshot_name
from queen.wal.snapshot import SNAPSHOT_HEADER, rebase_snapshot

logger = logging.getLogger(__name__)

HELLO, DIVERGE, SNAPSHOT, FRAME, HEARTBEAT, ACK, REFUSE, PROBE = 1, 2, 3, 4, 5, 6, 7, 8
HEARTBEAT_S = 0.1
MESSAGE_BYTES_MAX = 300 << 20  # a frame holds at most 256 MiB (queen/wal/frame.py)
CHUNK_BYTES = 1 << 20  # catch-up frames and snapshot chunks per message
QUEUED_BYTES_MAX = 64 << 20  # a follower further behind than this is dropped; it catches up from disk
LATE_WRITE_S = 1.5  # test-only (ack_before_fsync): how long acked frames wait before being written
SYNC_WATCH_S = 0.05  # how often the leader looks for calls that waited too long: the bound's precision
SYNC_STALL_S = 1.0  # a look this much later than due is skipped (_watch_sync says why)
# sync_unavailable's retry hint: the sync set comes back with a follower that restarts, or catches
# up, in seconds, not with an election's few hundred ms.
SYNC_RETRY_MS = 1000
_LENGTH = struct.Struct(">I")
_ITEMS = {HELLO: 6, DIVERGE: 3, SNAPSHOT: 5, FRAME: 7, HEARTBEAT: 4, ACK: 4, REFUSE: 2, PROBE: 4}  # at least


class StreamEnded(Exception):
    """The leader's stream ended or was refused (reason in str)."""


class RestartNeeded(StreamEnded):
    """This node's files were made to match its leader's (a tail cut, a snapshot installed) or its
    memory may differ from them (it stepped down): start it again before it follows."""


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    node: str
    connected: bool
    acked_version: int  # highest version this follower has fsynced and acked
    lag_versions: int  # leader durable-local version - acked_version
    # It has (acked or said at HELLO) every version the log held when its stream began, and the
    # rest comes live: it may join the sync set. Lag 0 at some instant is no goal under steady
    # writes: each frame reopens it.
    caught_up: bool


def unwrap(error: BaseException) -> BaseException:
    """The one exception a nursery's group holds (trio wraps whatever a nursery raises)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def encode(message: list) -> bytes:
    body = cbor2.dumps(message)
    return _LENGTH.pack(len(body)) + body


class MessageReader:
    """Length-prefixed CBOR messages off a trio stream."""

    def __init__(self, stream):
        self.stream = stream
        self.buffer = bytearray()

    async def _fill(self, size: int) -> None:
        while len(self.buffer) < size:
            data = await self.stream.receive_some(max(65536, size - len(self.buffer)))
            if not data:
                raise StreamEnded("connection closed")
            self.buffer += data

    async def next(self) -> list:
        await self._fill(4)
        size = _LENGTH.unpack_from(self.buffer, 0)[0]
        if size > MESSAGE_BYTES_MAX:
            raise StreamEnded(f"message of {size} bytes")
        await self._fill(4 + size)
        body = bytes(self.buffer[4:4 + size])
        del self.buffer[:4 + size]
        message = cbor2.loads(body)
        if type(message) is not list or not message or type(message[0]) is not int:
            raise StreamEnded("not a replication message")
        if len(message) < _ITEMS.get(message[0], 1):
            raise StreamEnded(f"message {message[0]} is too short (a peer speaking an older protocol?)")
        return message


def sync_unavailable_error(members, timeout_s: float, applied) -> Unavailable:
    """What a leader answers while its sync set is out of reach (module docstring). applied:
    "unknown" for a call that waited and may have written (it is on this node's disk), False for
    one refused before anything was applied, or a read."""
    names = ", ".join(sorted(members)) or "-"
    if applied is False:
        what = "nothing of this call was applied; try again once the sync set is back"
    else:
        what = ("this call may have been applied: it is on the leader's disk, and reaches the sync set when it is "
                "back, unless a failover cuts it; its outcome is unknown")
    error = Unavailable("sync_unavailable", f"the leader's sync set ({names}) has not acknowledged for "
                        f"{timeout_s:g} s (--sync-timeout): {what}",
                        {"applied": applied, "sync": sorted(members), "syncTimeoutMs": int(timeout_s * 1000),
                         "retryAfterMs": SYNC_RETRY_MS})
    error.headers = [(b"retry-after", b"%d" % math.ceil(SYNC_RETRY_MS / 1000))]
    return error


def leader_lost(reason: str) -> Unavailable:
    """What a node that stopped leading answers the calls it had taken: 503 leader_lost, outcome
    unknown (a write may be on the new leader), unlike the routing's no_leader / not_leader, which
    refuse a call before anything is applied and may be retried as they are."""
    return Unavailable("leader_lost", f"this node no longer leads the cluster ({reason}); the outcome of this call "
                       "is unknown: it may be present on the new leader", {"reason": reason})


class _Link:
    """A connected follower, on the leader: what is queued to send it."""

    def __init__(self, node: str, stream):
        self.node = node
        self.stream = stream
        self.queue: deque = deque()  # (last_version, encoded FRAME message)
        self.queued_bytes = 0
        self.wake = trio.Event()
        self.live = False  # caught up from disk: sends what the writer ships as it comes
        self.closed = False
        self.goal = 0  # the log's last version when this stream began: reached, it is caught up
        self.acked = 0  # the highest version the follower has on this stream (HELLO, then its acks)


class Replicator:
    def __init__(self, *, node_id: str, data_dir: str, listen: tuple[str, int], state, writer, steps, clock, disk,
                 run_blocking, recovered, cluster: str = "", faults: test_faults.Faults = test_faults.NONE,
                 sync_timeout_s: float, sockets: list | None = None):
        """recovered: what recovery found (queen/wal/recovery.py, Recovered): the log's last
        version. run_blocking should be the writer's (its disk thread): a cut of the log then never
        runs beside a commit. Reads the two epoch files (tiny) here, at start. faults: the
        failover suite's deliberate bugs (queen/cluster/faults.py), none in production.
        sync_timeout_s: how long a call waits for the sync set at most (module docstring).
        sockets: the listening sockets to serve on, which the server bound before it touched the
        data directory and keeps across the node's restarts (serve leaves them open); without
        them serve binds `listen` itself, for its own lifetime."""
        self.node_id = node_id
        self.faults = faults
        self.cluster = cluster
        self.data_dir = data_dir
        self.listen = listen
        self.sockets = sockets
        self.state = state
        self.writer = writer
        self.steps = steps
        self.clock = clock
        self.disk = disk
        self.run_blocking = run_blocking
        self.role = "none"
        self.epoch = 0
        self.promised_epoch = epochs.read_promised(data_dir, disk)
        self.history = epochs.reconcile(epochs.read_history(data_dir, disk), state.epochs, recovered.last_version)
        self._history_written = len(self.history)
        self.log_last = recovered.last_version  # highest version in the durable log
        self._applied_last = recovered.last_version  # follower: highest version applied and queued
        self.leader_heard_at = 0.0
        self.clock_floor_ms = 0
        self.port: int | None = None
        self._sync: frozenset[str] = frozenset()
        self._acked: dict[str, int] = {}
        self._links: dict[str, _Link] = {}
        self._restart_needed = ""  # why this node must start again before it follows or leads
        self._promise_lock = trio.Lock()
        self._fsynced = 0  # follower: highest version fsynced in this stream
        self._ack_wanted = trio.Event()
        self._round_seen = 0  # follower: the newest round received in this stream
        self._late: deque = deque()  # test-only (ack_before_fsync): (due, frames, last, ceiling) acked, unwritten
        # The read barrier (module docstring), on the leader.
        self._round = 0  # the newest round number put on a FRAME or PROBE
        self._broadcast_round = 0  # the newest one shipped to every link (a catch-up's are not)
        self._round_acked: dict[str, int] = {}  # node -> the newest round it echoed in this epoch
        self._reads: deque = deque()  # (self._round when it arrived, version, waiter), in arrival order
        self._probe_round = 0  # the newest probe's
        self._probe_force = False  # a sync member's link is new: what was on its way to it is lost
        self._probe_wake = trio.Event()
        self.probes_sent = 0
        self._read_round_trip = not self.faults.no_read_barrier  # test-only switch (queen/cluster/faults.py)
        # The sync timeout (module docstring), on the leader once it serves.
        self.sync_timeout_s = sync_timeout_s
        self._serving = False  # lead() returned: calls are timed (the EPOCH record waits unbounded)
        self._shipped: deque = deque()  # (last_version, when shipped) of frames not known released
        self._absent_since: dict[str, float] = {}  # sync member -> since when it has had no stream
        self._unavailable_since: float | None = None  # the sync set is out of reach since then
        self._outage_goal = 0  # back once every member acked this (the log's last at the outage)...
        self._outage_round = 0  # ...and echoed a round at least this new
        writer.read_barrier = self._read_barrier
        steps.standby = True  # no ticks until this node leads

    # -- state ------------------------------------------------------------------------------------

    @property
    def sync_unavailable(self) -> bool:
        """Whether this leader's sync set is out of reach now (module docstring)."""
        return self._unavailable_since is not None

    def log_position(self) -> tuple[int, int]:
        """(last_epoch, last_version) of the local durable log."""
        return epochs.last_epoch(self.history), self.log_last

    async def promise(self, epoch: int) -> None:
        """Make promised_epoch >= epoch durable; from then on frames of lower epochs are refused
        and their streams closed."""
        async with self._promise_lock:
            if epoch <= self.promised_epoch:
                return
            await self.run_blocking(epochs.write_promised, self.data_dir, self.disk, epoch)
            self.promised_epoch = epoch
            for link in list(self._links.values()):  # a leader of an older epoch is deposed
                if self.epoch < epoch:
                    self._close_link(link)

    def set_sync(self, sync: frozenset[str]) -> None:
        """Answers from now on wait for these members' acks too (an empty set: this node's fsync
        alone, the degraded mode)."""
        self._sync = frozenset(sync) - {self.node_id}
        self._release()
        if self._reads:
            self._probe_force = True  # a new member may have had nothing on its way
            self._probe_wake.set()

    def followers(self) -> list[FollowerStatus]:
        local = self.writer.local_version
        nodes = sorted(set(self._acked) | set(self._links))
        links = self._links
        return [FollowerStatus(node, node in links, self._acked.get(node, 0), max(0, local - self._acked.get(node, 0)),
                               node in links and links[node].acked >= links[node].goal) for node in nodes]

    def step_down(self, reason: str) -> None:
        """Stop leading at once: answers not yet released get 503 leader_lost; nothing more is
        shipped or released. The node must be started again before it follows."""
        if self.role == "leader":
            logger.warning("event=stepped_down epoch=%d reason=%r", self.epoch, reason)
            self._restart_needed = f"stepped down from epoch {self.epoch}: memory may hold what the new leader lacks"
            # Parked pops would wait for ticks that no longer come (standby): answer them now.
            self.steps.run(Drain())
        self.role = "none"
        self.steps.standby = True
        self._serving = False
        self._end_outage()
        self.writer.replicate = None
        error = leader_lost(reason)
        self.writer.stop(error)
        reads, self._reads = self._reads, deque()
        for _, _, waiter, _ in reads:
            waiter.error = error
            waiter.done.set()
        for link in list(self._links.values()):
            self._close_link(link)

    # -- leading ------------------------------------------------------------------------------------

    async def lead(self, epoch: int, sync: frozenset[str], *, version_floor: int, grace_ms: int) -> None:
        """Become leader of `epoch` (promised first): versions go on above max(local last,
        version_floor); the EPOCH record is the first one written; returns once it is durable here
        and on every member of `sync`. Raises Unavailable(leader_lost) if stepped down meanwhile."""
        if self._restart_needed:
            raise RestartNeeded(self._restart_needed)
        await self.promise(epoch)
        if epoch != self.promised_epoch:
            raise leader_lost(f"epoch {self.promised_epoch} was promised")
        if epoch <= epochs.last_epoch(self.history):
            raise leader_lost(f"epoch {epoch} is not newer than this log's")
        self.role, self.epoch = "leader", epoch
        self._acked = {}
        self._round_acked = {}
        self._probe_round = 0
        self._shipped.clear()
        self._absent_since = {}
        self._end_outage()
        self._sync = frozenset(sync) - {self.node_id}
        writer, versions = self.writer, self.state.versions
        if self.faults.ignore_ceiling:  # test-only bug: on from the log's last record, reserved or not
            versions.last = max(self.log_last, self._applied_last)
            writer._last_version = versions.last
        else:
            versions.last = max(versions.last, writer.last_version, self.log_last, version_floor)
        writer.replicate = self._ship
        self.clock.raise_to(self.clock_floor_ms)
        now = self.clock.now_ms()
        first = versions.last + 1
        previous = max(self.log_last, self._applied_last)  # frames still being written come first
        entry = (epoch, first, previous)
        # The history first: a crash before the record leaves an entry past the log's end, which
        # the next start drops (epochs.reconcile).
        self.history.append(entry)
        await self._write_history()
        call = Call(1, 1)
        grace_until = 0 if self.faults.no_lease_grace else now + grace_ms  # 0: test-only bug, no lease extended
        # The grace covers every lease live when the old leader was last heard (the floor), not
        # only those live now: one that ran out while nobody led could not be renewed (C6, N10).
        # No old leader heard (bootstrap, a fresh node forced): those live now.
        live_after = self.clock_floor_ms or now
        self.steps.run(BeginEpoch(epoch, self.node_id, previous, live_after, grace_until, call))
        await call.result()
        logger.info("event=leading epoch=%d first_version=%d sync=%s", epoch, first, ",".join(sorted(self._sync)))
        self.steps.standby = False
        self._serving = True

    def _ship(self, data: bytes, last_version: int) -> None:
        """The writer's hook after each local fsync: the same bytes to every follower."""
        if last_version > self.log_last:
            self.log_last = last_version
        if self.role != "leader":
            return
        self._round += 1
        self._broadcast_round = self._round
        if self._serving:
            self._shipped.append((last_version, trio.current_time()))
        message = encode([FRAME, self.epoch, data, last_version, self.writer.durable_version, self.clock.now_ms(),
                          self._round])
        for link in list(self._links.values()):
            link.queue.append((last_version, message))
            link.queued_bytes += len(message)
            if link.queued_bytes > QUEUED_BYTES_MAX:
                logger.warning("event=follower_dropped node=%s reason=too_far_behind", link.node)
                self._close_link(link)
            elif not link.wake.is_set():
                link.wake.set()
        self._release()

    def _release(self) -> None:
        if self.role != "leader":
            return
        version = self.writer.local_version
        for node in self._sync:
            acked = self._acked.get(node, 0)
            if acked < version:
                version = acked
        self.writer.release(version)
        if self._reads:
            self._release_reads()

    # -- the read barrier (module docstring) ---------------------------------------------------------

    def _read_barrier(self, version: int, waiter) -> None:
        """The writer's when_durable for a call with nothing left to ship (version <= fsynced
        here). A call that wrote needs no more than durability: the frame of its records, made
        after it, is its round trip."""
        if self.role != "leader":
            failed = self.writer.failed
            waiter.error = failed if isinstance(failed, Unavailable) else leader_lost("this node does not lead")
            waiter.done.set()
            return
        if self._unavailable_since is not None:  # no round trip comes back: do not wait for one
            waiter.error = self._unavailable_for(waiter)
            waiter.done.set()
            return
        self._reads.append((self._round, version, waiter, trio.current_time()))
        self._release_reads()
        if self._reads and not self._probe_wake.is_set():
            self._probe_wake.set()

    def _sync_round(self) -> int:
        """The newest round every sync-set member echoed (no member: no round trip to wait for)."""
        if not self._sync or not self._read_round_trip:
            return self._round + 1
        return min(self._round_acked.get(node, 0) for node in self._sync)

    def _release_reads(self) -> None:
        """Answer the waiting reads whose version is durable and whose round trip is done; both
        rise in arrival order, so they go from the front."""
        reads, durable, acked = self._reads, self.writer.durable_version, self._sync_round()
        while reads:
            after, version, waiter, _ = reads[0]
            if version > durable or after >= acked:
                break
            reads.popleft()
            waiter.done.set()

    async def _probe_when_reads_wait(self) -> None:
        """Sends a PROBE when reads wait and nothing shipped since the newest of them will bring
        their round trip, at the next pass of the event loop after it arrived (so the reads of
        one pass share it), and not while the previous probe is still out (reads that came
        after it was made wait for the next, one for all of them)."""
        while True:
            await self._probe_wake.wait()
            self._probe_wake = trio.Event()
            if self.role != "leader" or not self._reads or not self._sync or not self._read_round_trip:
                continue
            newest = self._reads[-1][0]
            if self._probe_force or (self._broadcast_round <= newest and self._probe_round <= self._sync_round()):
                self._probe_force = False
                self._send_probe()

    def _send_probe(self) -> None:
        """A PROBE of a new round to every connected sync-set member: acked at once."""
        self._round += 1
        self._probe_round = self._broadcast_round = self._round
        self.probes_sent += 1
        message = encode([PROBE, self.epoch, self._round, self.clock.now_ms()])
        for node in self._sync:
            link = self._links.get(node)
            if link is not None:
                link.queue.append((0, message))
                link.queued_bytes += len(message)
                link.wake.set()

    # -- the sync timeout (module docstring) ---------------------------------------------------------

    async def _watch_sync(self) -> None:
        last = trio.current_time()
        while True:
            await trio.sleep(SYNC_WATCH_S)
            now = trio.current_time()
            late, last = now - last > SYNC_WATCH_S + SYNC_STALL_S, now
            # A tick this late says this loop stalled (a paused process, a long step): acks may be
            # waiting unread in the sockets; they are read before the next tick looks.
            if self.role == "leader" and self._serving and not late:
                self._check_sync(now)

    def _check_sync(self, now: float) -> None:
        """Declare the sync set out of reach when a frame or a read has waited sync_timeout_s for
        it, or a member has had no stream that long; while it is, answer whatever waits for it and
        look for its return."""
        durable, shipped, links = self.writer.durable_version, self._shipped, self._links
        while shipped and shipped[0][0] <= durable:
            shipped.popleft()
        absent = self._absent_since
        for node in list(absent):
            if node not in self._sync or node in links:
                del absent[node]
        for node in self._sync:
            if node not in links:
                absent.setdefault(node, now)
        if self._unavailable_since is None:
            waiting = [*absent.values()]
            if shipped:
                waiting.append(shipped[0][1])
            if self._reads:
                waiting.append(self._reads[0][3])
            if not waiting or now - min(waiting) < self.sync_timeout_s:
                return
            self._unavailable_since = now
            self._outage_goal = self.writer.local_version
            self._outage_round = self._round + 1
            self.writer.sync_refusal = sync_unavailable_error(self._sync, self.sync_timeout_s, False)
            logger.warning("event=sync_unavailable epoch=%d sync=%s waited_s=%.1f action=refusing_writes",
                           self.epoch, ",".join(sorted(self._sync)), now - min(waiting))
        elif all(node in links and self._acked.get(node, 0) >= self._outage_goal
                 and self._round_acked.get(node, 0) >= self._outage_round for node in self._sync):
            logger.info("event=sync_available epoch=%d sync=%s unavailable_s=%.1f", self.epoch,
                        ",".join(sorted(self._sync)), now - self._unavailable_since)
            self._end_outage()
            return
        # Out of reach: nothing that waits for the sync set waits any longer (writes admitted before
        # the refusal reach it here, once fsynced); a probe asks whether it is back.
        shipped.clear()
        for waiter in self.writer.take_held():
            waiter.error = self._unavailable_for(waiter)
            waiter.done.set()
        reads, self._reads = self._reads, deque()
        for _, _, waiter, _ in reads:
            waiter.error = self._unavailable_for(waiter)
            waiter.done.set()
        self._send_probe()

    def _unavailable_for(self, waiter) -> Unavailable:
        """sync_unavailable for a call that waited: unknown whether applied if it may have written."""
        return sync_unavailable_error(self._sync, self.sync_timeout_s, "unknown" if waiter.wrote else False)

    def _end_outage(self) -> None:
        self._unavailable_since = None
        self.writer.sync_refusal = None

    def _close_link(self, link: _Link) -> None:
        link.closed = True
        link.wake.set()
        if self._links.get(link.node) is link:
            del self._links[link.node]

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The replication listener, for the server's lifetime; accepts followers' HELLO only while
        leading (otherwise refuses)."""
        if self.sockets is not None:
            # Duplicates: trio.serve_listeners closes what it served on, and the server's own
            # sockets must outlive this run (the same listening socket, under another descriptor).
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock.dup())) for sock in self.sockets]
        else:
            listeners = await trio.open_tcp_listeners(self.listen[1], host=self.listen[0])
        self.port = listeners[0].socket.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._serve_one, listeners)
                nursery.start_soon(self._probe_when_reads_wait)
                nursery.start_soon(self._watch_sync)
                task_status.started(self.port)
        finally:
            for listener in listeners:
                await listener.aclose()

    async def _serve_one(self, stream) -> None:
        try:
            try:
                await self._serve_follower(stream)
            except BaseExceptionGroup as group:
                raise unwrap(group) from None
        except (StreamEnded, trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError,
                FrameError) as error:
            logger.info("event=follower_stream_ended reason=%r", str(error))
        finally:
            await stream.aclose()

    async def _serve_follower(self, stream) -> None:
        reader = MessageReader(stream)
        with trio.move_on_after(10) as timeout:
            hello = await reader.next()
        if timeout.cancelled_caught or hello[0] != HELLO or len(hello) != 6:
            raise StreamEnded("no HELLO")
        _, cluster, node, promised, last_epoch, last_version = hello
        epoch = self.epoch
        refusal = None
        if self.role != "leader":
            refusal = "not leading"
        elif cluster != self.cluster:
            refusal = f"cluster {cluster!r} is not {self.cluster!r}"
        elif promised > epoch or last_epoch > epoch:
            refusal = f"epoch {max(promised, last_epoch)} is newer than {epoch}"
        if refusal is not None:
            await stream.send_all(encode([REFUSE, refusal]))
            raise StreamEnded(f"refused {node}: {refusal}")
        end = epochs.end_of_epoch(self.history, last_epoch)
        if end is not None and end < last_version:
            logger.info("event=follower_diverged node=%s last_epoch=%d last_version=%d truncate_to=%d",
                        node, last_epoch, last_version, end)
            await stream.send_all(encode([DIVERGE, epoch, end]))
            return
        snapshot = await self.run_blocking(_newest_snapshot, self.data_dir, self.disk)
        if snapshot is not None and snapshot[0] > last_version:
            await self._send_snapshot(stream, node, snapshot)
            return
        link = _Link(node, stream)
        link.acked = last_version  # its log holds this leader's up to there (no DIVERGE above)
        old = self._links.get(node)
        if old is not None:
            self._close_link(old)
        self._links[node] = link
        if self._reads and node in self._sync:
            self._probe_force = True  # what was on its way to this node went with its old link
            self._probe_wake.set()
        upto = link.goal = self.log_last  # on disk; what is written after this comes through the queue
        logger.info("event=follower_joined node=%s epoch=%d from_version=%d", node, epoch, last_version)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive_acks, reader, link, nursery.cancel_scope)
                sent = await self._catch_up(link, last_version, upto)
                await self._send_live(link, sent)
                nursery.cancel_scope.cancel()
        finally:
            self._close_link(link)

    async def _catch_up(self, link: _Link, after: int, upto: int) -> int:
        """Send the frames on disk with versions in (after, upto]; the last version sent."""
        sent = after
        position = None
        while sent < upto and not link.closed:
            chunk, last, position = await self.run_blocking(_read_frames, self.data_dir, self.disk, sent, upto,
                                                            position)
            if not chunk:
                break
            self._round += 1
            await link.stream.send_all(encode([FRAME, self.epoch, chunk, last, self.writer.durable_version,
                                               self.clock.now_ms(), self._round]))
            sent = max(sent, last)
        return sent

    async def _send_live(self, link: _Link, sent: int) -> None:
        link.live = True
        while not link.closed and self.role == "leader":
            if not link.queue:
                with trio.move_on_after(HEARTBEAT_S):
                    await link.wake.wait()
                link.wake = trio.Event()
                if not link.queue and not link.closed:
                    await link.stream.send_all(encode([HEARTBEAT, self.epoch, self.clock.now_ms(),
                                                       self.writer.durable_version]))
                continue
            last, message = link.queue.popleft()
            link.queued_bytes -= len(message)
            if last and last <= sent:
                continue  # sent already from disk
            await link.stream.send_all(message)
            sent = max(sent, last)

    async def _receive_acks(self, reader: MessageReader, link: _Link, scope) -> None:
        try:
            while True:
                message = await reader.next()
                if message[0] == ACK and message[1] == self.epoch and self.role == "leader":
                    node = link.node
                    round_moved = message[3] > self._round_acked.get(node, 0)
                    if round_moved:
                        self._round_acked[node] = message[3]
                    if message[2] > link.acked:
                        link.acked = message[2]
                    if message[2] > self._acked.get(node, 0):
                        self._acked[node] = message[2]
                        self._release()
                    elif round_moved and self._reads:
                        self._release_reads()
                    if round_moved and self._reads:
                        self._probe_wake.set()  # the reads that came while the probe was out
                elif message[0] == REFUSE:
                    logger.warning("event=follower_refused node=%s epoch=%d reason=%r", link.node, self.epoch,
                                   message[1])
                    break
        except (StreamEnded, trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError):
            pass
        self._close_link(link)
        scope.cancel()

    async def _send_snapshot(self, stream, node: str, snapshot: tuple[int, str]) -> None:
        version, name = snapshot
        data = await self.run_blocking(self.disk.read_file, os.path.join(self.data_dir, name))
        history = [list(entry) for entry in self.history if entry[1] <= version]
        logger.info("event=follower_snapshot node=%s version=%d bytes=%d", node, version, len(data))
        for start in range(0, len(data), CHUNK_BYTES):
            more = start + CHUNK_BYTES < len(data)
            await stream.send_all(encode([SNAPSHOT, self.epoch, data[start:start + CHUNK_BYTES], more, history]))

    # -- following ------------------------------------------------------------------------------------

    async def follow(self, epoch: int, leader: str, address: tuple[str, int]) -> None:
        """Follow `leader` of `epoch` (promised first): connect, HELLO, cut or catch up, append and
        apply frames, fsync, ack; until cancelled. Raises StreamEnded when the stream ends or is
        refused, RestartNeeded when this node must start again first."""
        if self._restart_needed:
            raise RestartNeeded(self._restart_needed)
        if self.role == "leader":
            raise StreamEnded("leading: step down first")
        await self.promise(epoch)
        if epoch != self.promised_epoch:
            raise StreamEnded(f"epoch {epoch} is older than the promised {self.promised_epoch}")
        self.role, self.epoch = "follower", epoch
        self.steps.standby = True
        self._fsynced = self.log_last
        self._ack_wanted = trio.Event()
        self._round_seen = 0
        self.writer.replicate = self._appended
        try:
            stream = await trio.open_tcp_stream(*address)
        except OSError as error:
            self.role = "none"
            self.writer.replicate = None
            raise StreamEnded(f"cannot reach {leader} at {address[0]}:{address[1]}: {error}") from None
        try:
            last_epoch, last_version = self.log_position()
            await stream.send_all(encode([HELLO, self.cluster, self.node_id, self.promised_epoch, last_epoch,
                                          last_version]))
            reader = MessageReader(stream)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send_acks, stream, epoch)
                    if self.faults.ack_before_fsync:
                        nursery.start_soon(self._write_late)
                    await self._receive_from_leader(reader, stream)
            except BaseExceptionGroup as group:
                raise unwrap(group) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError, FrameError,
                rec.RecordError) as error:
            self.leader_heard_at = -math.inf  # as below
            raise StreamEnded(f"stream from {leader} ended: {error!r}") from None
        except StreamEnded:
            # The leader closed its stream or refused it (it stepped down, or died and the kernel
            # closed the socket): it serves nobody, so what was heard from it no longer holds
            # this node back from campaigning once etcd drops its key. A silent partition ends
            # no stream and keeps the rule.
            self.leader_heard_at = -math.inf
            raise
        finally:
            # Not if it leads now: only the test-only no_epoch_check lets a stream outlive the
            # following (the old leader's stays open through a campaign).
            following = self.role == "follower"
            if following:
                self.role = "none"
            while self._late:  # test-only bug's frames: written now, not lost by a live node
                _, data, last, ceiling = self._late.popleft()
                self.writer.submit_frames(data, last, ceiling)
            if following:
                self.writer.replicate = None
            await stream.aclose()

    async def _receive_from_leader(self, reader: MessageReader, stream) -> None:
        snapshot = bytearray()
        while True:
            message = await reader.next()
            kind = message[0]
            if kind == REFUSE:
                raise StreamEnded(f"refused by the leader: {message[1]}")
            if message[1] != self.promised_epoch and not self.faults.no_epoch_check:
                reason = f"epoch {message[1]} is not the promised {self.promised_epoch}"
                logger.warning("event=leader_refused reason=%r", reason)
                await stream.send_all(encode([REFUSE, reason]))
                raise StreamEnded(reason)
            if kind == FRAME:
                self._heard(message[5])
                if message[6] > self._round_seen:
                    self._round_seen = message[6]
                if not self._append(message[2]):
                    self._ack_wanted.set()  # nothing new to fsync: echo the round now
            elif kind == PROBE:
                self._heard(message[3])
                if message[2] > self._round_seen:
                    self._round_seen = message[2]
                self._ack_wanted.set()
            elif kind == HEARTBEAT:
                self._heard(message[2])
            elif kind == DIVERGE:
                await self._truncate(message[2])
            elif kind == SNAPSHOT:
                snapshot += message[2]
                if not message[3]:
                    await self._install_snapshot(bytes(snapshot), [tuple(entry) for entry in message[4]])
            else:
                raise StreamEnded(f"unexpected message {kind}")

    def _heard(self, leader_time_ms: int) -> None:
        self.leader_heard_at = trio.current_time()
        if leader_time_ms > self.clock_floor_ms:
            self.clock_floor_ms = leader_time_ms

    def _append(self, data: bytes) -> bool:
        """Apply the records of whole frames to memory and queue their bytes for the log, skipping
        frames already here (catch-up overlaps what the leader ships live). False if all were."""
        view = memoryview(data)
        offset, keep, ceiling, last, gap = 0, [], 0, 0, ""
        state = self.state
        while offset < len(data):
            items, first_version, last_version, end = decode_frame(view, offset)
            if first_version and first_version <= self._applied_last:
                offset = end
                continue
            records = rec.decode(items)
            if first_version and first_version > self._applied_last + 1 and not (
                    records and type(records[0]) is rec.Epoch and records[0].previous_version <= self._applied_last):
                # A hole: bytes went missing in transit (a proxy that dropped them, not TCP). Take
                # nothing past it (what came before is kept); the next stream catches up from the
                # leader's disk.
                gap = f"frame from version {first_version} after {self._applied_last}: a gap"
                break
            for record in records:
                kind = type(record)
                if kind is rec.Ceiling:
                    ceiling = max(ceiling, record.version_max)
                elif kind is rec.SegmentCut:
                    raise FrameError("a segment_cut frame in the stream")
                else:
                    if kind is rec.Epoch:
                        self.history.append((record.epoch, record.version, record.previous_version))
                        if record.clock_floor_ms > self.clock_floor_ms:
                            self.clock_floor_ms = record.clock_floor_ms
                    state.replay(record)
            if last_version:
                self._applied_last = last = last_version
            keep.append(view[offset:end])
            offset = end
        if keep:
            if last > state.versions.last:
                state.versions.last = last
            if self.faults.ack_before_fsync:  # test-only bug: acked now (below), written LATE_WRITE_S later
                self._late.append((trio.current_time() + LATE_WRITE_S, b"".join(keep), last, ceiling))
            else:
                self.writer.submit_frames(b"".join(keep), last, ceiling)
        if gap:
            raise StreamEnded(gap)
        if not keep:
            return False
        if self.faults.ack_before_fsync and last:  # test-only bug: acked on receipt, not yet on disk
            self._fsynced = max(self._fsynced, last)
            self._ack_wanted.set()
        return True

    async def _write_late(self) -> None:
        """Test-only (ack_before_fsync): hands acked frames to the writer LATE_WRITE_S after they
        came, in order, so a crash of this node inside that window loses writes it acked."""
        while True:
            await trio.sleep(0.05)
            now = trio.current_time()
            while self._late and self._late[0][0] <= now:
                _, data, last, ceiling = self._late.popleft()
                self.writer.submit_frames(data, last, ceiling)

    def _appended(self, data: bytes, last_version: int) -> None:
        """The writer's hook on a follower: these frames are fsynced here."""
        if last_version > self.log_last:
            self.log_last = last_version
        self.writer.release(last_version)
        self._fsynced = self.log_last
        self._ack_wanted.set()

    async def _send_acks(self, stream, epoch: int) -> None:
        """ACKs of this stream's epoch (the one followed; a node that leads follows nobody, but
        for the test-only no_epoch_check, which keeps the old leader's stream)."""
        acked, round_acked = -1, 0
        while True:
            await self._ack_wanted.wait()
            self._ack_wanted = trio.Event()
            if len(self.history) != self._history_written:
                await self._write_history()  # an epoch this log now holds, before it is acked
            if self._fsynced != acked or self._round_seen != round_acked:
                acked, round_acked = self._fsynced, self._round_seen
                await stream.send_all(encode([ACK, epoch, acked, round_acked]))

    async def _write_history(self) -> None:
        entries = list(self.history)
        await self.run_blocking(epochs.write_history, self.data_dir, self.disk, entries)
        self._history_written = len(entries)

    async def _truncate(self, truncate_to: int) -> None:
        logger.warning("event=log_diverged epoch=%d last_version=%d truncate_to=%d action=cut_and_restart",
                       self.epoch, self.log_last, truncate_to)
        self._restart_needed = f"the log was cut after version {truncate_to} to match the leader's"
        self.writer.stop(leader_lost("following"))
        await self.run_blocking(_cut_log, self.data_dir, self.disk, truncate_to)
        self.history = [entry for entry in self.history if entry[1] <= truncate_to]
        await self._write_history()
        raise RestartNeeded(self._restart_needed)

    async def _install_snapshot(self, data: bytes, history: list) -> None:
        version = SNAPSHOT_HEADER.unpack_from(data, 0)[2]
        logger.warning("event=snapshot_from_leader epoch=%d version=%d bytes=%d action=install_and_restart",
                       self.epoch, version, len(data))
        self._restart_needed = f"the leader's snapshot at version {version} was installed"
        self.writer.stop(leader_lost("following"))
        await self.run_blocking(_install_snapshot, self.data_dir, self.disk, data, version,
                                self.writer._segment_seq)
        self.history = history
        await self._write_history()
        raise RestartNeeded(self._restart_needed)


# -- blocking parts (run off the event loop) -------------------------------------------------------

def _newest_snapshot(data_dir: str, disk) -> tuple[int, str] | None:
    _, snapshots = list_dir(disk.list_dir(data_dir))
    if not snapshots:
        return None
    version = max(snapshots)
    return version, snapshots[version]


def _read_frames(data_dir: str, disk, after: int, upto: int, position):
    """Whole frames of the log with versions in (after, upto], up to about CHUNK_BYTES, and the
    ceiling frames among them, never a segment_cut: (bytes, their last version, where to go on).
    position: (segment, offset) returned by the previous call, None to start from the oldest."""
    segments, _ = list_dir(disk.list_dir(data_dir))
    out, last, size, pending = [], 0, 0, None
    seq, offset = position if position is not None else (min(segments, default=0), FILE_HEADER.size)
    for current in sorted(s for s in segments if s >= seq):
        data = disk.read_file(os.path.join(data_dir, segments[current]))
        offset = offset if current == seq else FILE_HEADER.size
        while True:
            header = read_frame_header(data, offset)
            if header is None or header.end > len(data):
                break
            if header.first_version > upto:
                return b"".join(out), last, (current, offset)
            if header.first_version == 0:
                try:
                    items = decode_frame(data, offset)[0]
                except FrameError:  # a frame being written right now: what follows comes live
                    return b"".join(out), last, (current, offset)
                # A ceiling frame goes with the batch frame written right after it.
                pending = data[offset:header.end] if items and items[0] == int(rec.Kind.CEILING) else None
            else:
                if header.first_version > after:
                    if pending is not None:
                        out.append(pending)
                    out.append(data[offset:header.end])
                    last = header.last_version
                    size += header.end - offset
                pending = None
            offset = header.end
            if size >= CHUNK_BYTES:
                return b"".join(out), last, (current, offset)
    return b"".join(out), last, (max(segments, default=seq), offset)


def _cut_log(data_dir: str, disk, truncate_to: int) -> None:
    """Cut the log after the last frame whose versions are at most truncate_to, from the newest
    segment back, so every state a crash can leave is a prefix of the log. A snapshot past the cut
    goes; if no snapshot is left to start from, the whole log goes (the leader's snapshot or whole
    log replaces it)."""
    segments, snapshots = list_dir(disk.list_dir(data_dir))
    if any(version > truncate_to for version in snapshots) and 1 not in segments:
        for name in [*segments.values(), *snapshots.values()]:
            disk.remove(os.path.join(data_dir, name))
        disk.fsync_dir(data_dir)
        return
    cut = None
    for seq in sorted(segments):
        data = disk.read_file(os.path.join(data_dir, segments[seq]))
        offset = FILE_HEADER.size
        while cut is None:
            header = read_frame_header(data, offset)
            if header is None or header.end > len(data):
                break
            if header.first_version > truncate_to:
                cut = (seq, offset)
            offset = header.end
        if cut is not None:
            break
    if cut is not None:
        for seq in sorted((s for s in segments if s >= cut[0]), reverse=True):
            disk.truncate(os.path.join(data_dir, segments[seq]), cut[1] if seq == cut[0] else FILE_HEADER.size)
    for version, name in snapshots.items():
        if version > truncate_to:
            disk.remove(os.path.join(data_dir, name))
    disk.fsync_dir(data_dir)


def _install_snapshot(data_dir: str, disk, data: bytes, version: int, current_segment: int) -> None:
    """Put the leader's snapshot in place of this node's log: a new empty segment after every one
    here, then the snapshot saying the log goes on in it (written atomically: from then on
    recovery starts from it and removes the older segments itself)."""
    segments, _ = list_dir(disk.list_dir(data_dir))
    first = max([*segments, current_segment]) + 1
    fd = disk.create(os.path.join(data_dir, segment_name(first)))
    try:
        from queen.wal.frame import file_header

        disk.write(fd, file_header())
        disk.fsync(fd)
    finally:
        disk.close(fd)
    disk.fsync_dir(data_dir)
    disk.write_file_atomically(os.path.join(data_dir, snapshot_name(version)), rebase_snapshot(data, first))
