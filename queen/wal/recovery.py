"""Recovery: the newest valid snapshot, then every frame after it, in order, through the Disk.

Rules (after etcd's WAL repair):
  - A damaged or incomplete frame at the very end of the last segment is what a crash mid-write
    leaves, or what a bad disk does to the newest bytes. Whatever is cut is first kept in a
    quarantine file beside the segment (`<segment>.cut-<offset>`), and logged: at warning level
    for an incomplete frame (a torn write, never acknowledged), at error level for a frame that is
    whole but does not check (it may have been acknowledged), with the versions its header claims.
  - A damaged frame with any valid frame after it, a missing segment, or a log that says a segment
    was started that is not there (a segment_cut record naming it, or a snapshot that begins with
    it): not something a crash leaves. Recovery refuses (CorruptLog naming the file and offset)
    rather than silently dropping acknowledged writes.
  - Versions never go back: the counter restarts above the highest of the last version replayed,
    the highest ceiling record (which the writer keeps ahead of every version it writes), and any
    plausible version a cut frame's header claims. So no token, fence or id an answer ever showed
    is handed out again, even when the frame that held it had to be cut.
  - A directory written by another format version is refused whole (UnreadableFormat), with what
    to do about it.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

from queen.core import records as rec
from queen.errors import CorruptLog, UnreadableFormat
from queen.wal.disk import Disk
from queen.wal.frame import (
    FILE_HEADER,
    FRAME_MAGIC,
    FormatVersionError,
    FrameError,
    check_file_header,
    decode_frame,
    find_next_valid_frame,
    read_frame_header,
)
from queen.wal.snapshot import SnapshotError, SnapshotRefused, decode_snapshot

logger = logging.getLogger(__name__)

SEGMENT_RE = re.compile(r"^wal-(\d{16})\.seg$")
SNAPSHOT_RE = re.compile(r"^snapshot-(\d{20})\.snap$")
# A version a damaged header claims is believed only below this: a flipped high bit must not push
# the counter to the end of its range. The ceiling records cover every honest claim anyway.
CLAIM_PLAUSIBLE_MAX = 1 << 62
# Format versions are small numbers; a header with a larger one is torn, not from another build.
FORMAT_VERSION_PLAUSIBLE_MAX = 1 << 16

FORMAT_1_HELP = (
    "it was written by format 1 of the log (Queen 0.1.0); this build reads format 2 and has changed nothing. "
    "To carry the data over: start Queen 0.1.0 on this directory, copy the keys out "
    "(`queen kv list NS --json` for each namespace), stop it, move the directory aside, start this build on "
    "an empty one and write the keys back. Locks are leases: let them be acquired again.")


def segment_name(seq: int) -> str:
    return f"wal-{seq:016d}.seg"


def quarantine_name(segment: str, offset: int) -> str:
    return f"{segment}.cut-{offset}"


@dataclass
class Recovered:
    apply_count: int = 0  # records applied to the state
    last_version: int = 0  # highest version replayed
    ceiling: int = 0  # highest ceiling record found
    claimed_version: int = 0  # highest plausible version a cut frame's header claimed
    next_segment: int = 1
    snapshot_version: int = 0
    snapshot_records: int = 0
    segments: int = 0
    frames: int = 0
    records: int = 0
    truncated_bytes: int = 0
    quarantined: list[str] = field(default_factory=list)

    @property
    def version_floor(self) -> int:
        """Versions handed out from now on are above this."""
        return max(self.last_version, self.ceiling, self.claimed_version)


def list_dir(names: list[str]) -> tuple[dict[int, str], dict[int, str]]:
    segments, snapshots = {}, {}
    for name in names:
        if match := SEGMENT_RE.match(name):
            segments[int(match.group(1))] = name
        elif match := SNAPSHOT_RE.match(name):
            snapshots[int(match.group(1))] = name
    return segments, snapshots


def recover(data_dir: str, apply, disk: Disk | None = None) -> Recovered:
    """Rebuild state by calling apply(record) for each typed record in log order. Blocking: run it
    in a thread."""
    disk = disk or Disk()
    names = disk.list_dir(data_dir)
    for name in names:
        if name.endswith(".tmp"):  # an atomic write whose rename never happened
            disk.remove(os.path.join(data_dir, name))
    segments, snapshots = list_dir(names)
    result = Recovered()
    _refuse_other_formats(data_dir, segments, disk)
    first_segment = _load_snapshot(data_dir, snapshots, apply, result, disk)
    for seq in sorted(segments):
        if seq < first_segment:  # covered by the snapshot; its deletion was interrupted
            disk.remove(os.path.join(data_dir, segments.pop(seq)))
    order = sorted(segments)
    if result.snapshot_version:
        expected = first_segment
        if not order:
            raise CorruptLog(f"{segment_name(first_segment)} is missing: the snapshot at version "
                             f"{result.snapshot_version} says the log goes on in it")
    else:
        expected = 1
    for seq in order:
        if seq != expected:
            raise CorruptLog(f"segment {segment_name(expected)} is missing (found {segments[seq]} after it)")
        expected += 1
    result.next_segment = (order[-1] + 1) if order else first_segment
    # The segment a segment_cut record (or the snapshot) says the log goes on in: its header was
    # durable before anything named it.
    announced = first_segment if result.snapshot_version else None
    for position, seq in enumerate(order):
        path = os.path.join(data_dir, segments[seq])
        later = [os.path.join(data_dir, segments[later_seq]) for later_seq in order[position + 1:]]
        announced, removed = _replay_segment(path, later, announced == seq, apply, result, disk)
        if announced is not None and announced != seq + 1:
            raise CorruptLog(f"{path} ends by naming {segment_name(announced)} as the next segment, not {segment_name(seq + 1)}")
        if removed:
            # Its header was torn, so nothing in it was ever acknowledged: the writer reuses its
            # number, or the next recovery would find a gap where it was.
            result.next_segment = seq
            continue
        result.segments += 1
    if announced is not None:
        raise CorruptLog(f"{segment_name(announced)} is missing: {segments[order[-1]]} ends by saying the log "
                         "goes on in it")
    return result


def _refuse_other_formats(data_dir: str, segments: dict[int, str], disk: Disk) -> None:
    for seq in sorted(segments):
        path = os.path.join(data_dir, segments[seq])
        try:
            check_file_header(disk.read_file(path)[:FILE_HEADER.size])
        except FormatVersionError as error:
            if error.version == 1:
                raise UnreadableFormat(f"{os.path.abspath(data_dir)}: {FORMAT_1_HELP}") from None
            if error.version < FORMAT_VERSION_PLAUSIBLE_MAX:
                raise UnreadableFormat(f"{path}: {error}; it was written by a newer build of Queen") from None
            # Garbage where the version goes: a header torn by a crash, which replay handles.
        except FrameError:
            pass  # damage; replay decides whether it is a torn header or refuses
        return  # the oldest segment speaks for the directory


def _load_snapshot(data_dir: str, snapshots: dict[int, str], apply, result: Recovered, disk: Disk) -> int:
    """Apply the newest snapshot that reads whole; its first segment (1 without one)."""
    for version in sorted(snapshots, reverse=True):
        path = os.path.join(data_dir, snapshots[version])
        data = disk.read_file(path)
        try:
            snapshot = decode_snapshot(data)
        except SnapshotRefused as error:
            raise UnreadableFormat(f"{path}: {error}") from None
        except SnapshotError as error:
            if data[:4] == b"QNSP" and data[4:8] == (1).to_bytes(4, "little"):
                raise UnreadableFormat(f"{os.path.abspath(data_dir)}: {FORMAT_1_HELP}") from None
            logger.warning("event=snapshot_skipped file=%s reason=%r", path, str(error))
            continue
        for record in snapshot.records:
            apply(record)
        result.apply_count += len(snapshot.records)
        result.snapshot_version = result.last_version = snapshot.version
        result.ceiling = snapshot.ceiling
        result.snapshot_records = len(snapshot.records)
        return snapshot.first_segment
    return 1


def _replay_segment(path: str, later: list[str], announced: bool, apply, result: Recovered,
                    disk: Disk) -> tuple[int | None, bool]:
    """Replay one segment (later: the paths of the segments after it; announced: the log named it
    before). Returns the next segment its segment_cut record announces or None, and whether it was
    a torn header and has been set aside."""
    data = disk.read_file(path)
    try:
        check_file_header(data)
    except FrameError as error:
        # A segment is created (header, fsync, directory fsync) before anything names it or goes
        # into it, so a crash during its creation leaves the newest segment with a torn header,
        # unnamed and holding no frame. Anything else is damage.
        if later or announced or find_next_valid_frame(data, 0) is not None:
            raise CorruptLog(f"{path}: {error}") from None
        target = quarantine_name(path, 0)
        logger.warning("event=wal_header_torn file=%s bytes=%d action=quarantined quarantine=%s", path, len(data), target)
        disk.rename(path, target)
        disk.fsync_dir(os.path.dirname(path) or ".")
        result.quarantined.append(target)
        return None, True
    offset = FILE_HEADER.size
    announced = None
    while offset < len(data):
        try:
            items, first_version, last_version, next_offset = decode_frame(data, offset)
        except FrameError as error:
            if data.count(0, offset) == len(data) - offset:
                # Zeros where the next frame would go: the space the writer allocated ahead, the
                # clean end of the log. Given back, so a segment left behind holds no more.
                disk.truncate(path, offset)
                return announced, False
            _refuse_unless_tail(path, offset, str(error), data, later, disk)
            _quarantine_tail(path, offset, str(error), data, result, disk)
            return announced, False
        try:
            records = rec.decode(items)
            first, last = rec.versions_of(records)
        except rec.RecordError as error:
            # The checksum held, so this is no damage: another build wrote it, or a bug did.
            raise CorruptLog(f"{path} offset {offset}: a frame this build cannot read: {error}") from None
        if (first, last) != (first_version, last_version) or (first and first <= result.last_version):
            raise CorruptLog(f"{path} offset {offset}: the frame's versions {first}..{last} do not match its header "
                             f"({first_version}..{last_version}) or do not follow version {result.last_version}")
        if announced is not None:
            raise CorruptLog(f"{path} offset {offset}: a frame after the record that closed this segment")
        for record in records:
            kind = type(record)
            if kind is rec.Ceiling:
                result.ceiling = max(result.ceiling, record.version_max)
            elif kind is rec.SegmentCut:
                announced = record.next_segment
            else:
                apply(record)
                result.apply_count += 1
        if last > result.last_version:
            result.last_version = last
        result.frames += 1
        result.records += len(records)
        offset = next_offset
    return announced, False


def _refuse_unless_tail(path: str, offset: int, reason: str, data: bytes, later: list[str], disk: Disk) -> None:
    """Damage is a tail a crash may leave only at the end of the log: in the last segment, or in
    the one before a segment that holds no frame yet (a crash while writing the record that closed
    this one: the next is created first, so it exists, still empty)."""
    for later_path in later:
        if find_next_valid_frame(disk.read_file(later_path), 0) is not None:
            raise CorruptLog(f"{path} offset {offset}: damaged frame ({reason}) in a segment that is not the last")
    found = find_next_valid_frame(data, offset + 1)
    if found is not None:
        raise CorruptLog(f"{path} offset {offset}: damaged frame ({reason}) followed by a valid frame at offset {found}")


def _quarantine_tail(path: str, offset: int, reason: str, data: bytes, result: Recovered, disk: Disk) -> None:
    """Keep the bytes past offset beside the segment (less the zeros of space allocated ahead), note
    the versions their headers claim, then cut the segment there."""
    cut = data[offset:].rstrip(b"\0")
    header = read_frame_header(data, offset)
    # A whole frame that does not check may have been acknowledged. A torn write into space
    # allocated ahead also reaches its end, but the end is still zeros.
    whole = header is not None and header.end <= offset + len(cut)
    claims = []
    position = 0
    while (position := cut.find(FRAME_MAGIC, position)) != -1:
        claimed = read_frame_header(cut, position)
        if claimed is not None and claimed.first_version <= claimed.last_version < CLAIM_PLAUSIBLE_MAX:
            claims.append((claimed.first_version, claimed.last_version))
            result.claimed_version = max(result.claimed_version, claimed.last_version)
        position += 1
    target = quarantine_name(path, offset)
    disk.write_file_atomically(target, cut)
    result.quarantined.append(target)
    claimed_text = ",".join(f"{first}..{last}" for first, last in claims) or "none"
    if whole:
        # A frame that is all there but does not check may have been acknowledged: say so loudly.
        logger.error("event=wal_frame_damaged file=%s offset=%d bytes=%d reason=%r claimed_versions=%s "
                     "quarantine=%s action=cut_and_restart_above_ceiling", path, offset, len(cut), reason,
                     claimed_text, target)
    else:
        logger.warning("event=wal_tail_torn file=%s offset=%d bytes=%d reason=%r claimed_versions=%s quarantine=%s",
                       path, offset, len(cut), reason, claimed_text, target)
    result.truncated_bytes += len(cut)
    disk.truncate(path, offset)
