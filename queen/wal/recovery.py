"""Recovery: the newest valid snapshot, then every frame after it, in order, through the Disk.

Rules (after etcd's WAL repair):
  - A damaged or incomplete frame at the very end of the last segment is what a crash mid-write
    leaves, or what a bad disk does to the newest bytes. Whatever is cut is first kept in a
    quarantine file beside the segment (`<segment>.cut-<offset>`), and logged with the versions
    its header claims:
      - at error level `wal_frame_damaged` for a frame that is whole but does not check: it may
        have been acknowledged. Whole means its header's end lies within the file, or the frame
        checks with one bit of its magic or its length flipped back (then that was the damage, and
        the checksum says where the frame ends). Its bytes are kept exactly, then whatever follows
        them less the zeros of the space the writer allocated ahead.
      - at warning level `wal_tail_torn` for an incomplete frame, one that runs past the end of
        the file: a torn write, never acknowledged. Its bytes are kept, less trailing zeros.
    A write torn by a power loss inside the space allocated ahead ends inside those zeros, and
    cannot be told from a whole frame whose tail was zeroed: it is logged at error level, loud
    rather than silent about a possible loss. A flip in the length together with other damage
    can make a whole frame look incomplete, and is logged as torn.
  - A damaged frame with any valid frame after it, a missing segment, or a log that says a segment
    was started that is not there (a segment_cut record naming it, or a snapshot that begins with
    it): not something a crash leaves. Recovery refuses (CorruptLog naming the file and offset)
    rather than silently dropping acknowledged writes.
  - Versions never go back: the counter restarts above the highest of the last version replayed,
    the highest ceiling record (which the writer keeps ahead of every version it writes), and any
    believable version a cut frame's header claims. So no token, fence or id an answer ever showed
    is handed out again, even when the frame that held it had to be cut. A claim is believed up
    to CEILING_BLOCK above the highest ceiling and last version replayed (`_claims_believed_max`
    says why), never past VERSION_MAX: a flipped high bit must not move every later id for good.
  - No version past VERSION_MAX (2^53 - 1, queen/core/kv.py): a log whose versions went past it
    (written by an older build) is refused (VersionsExhausted), with what to do about it.
  - A directory written by another format version is refused whole (UnreadableFormat), with what
    to do about it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from queen.core import records as rec
from queen.core.kv import VERSION_MAX
from queen.errors import CorruptLog, UnreadableFormat, VersionsExhausted
from queen.wal.disk import Disk
from queen.wal.frame import (
    FILE_HEADER,
    FRAME_HEADER,
    FRAME_MAGIC,
    PAYLOAD_BYTES_MAX,
    FormatVersionError,
    FrameError,
    check_file_header,
    checked_end,
    decode_frame,
    find_next_valid_frame,
    read_frame_header,
)
from queen.wal.segment import CEILING_BLOCK, list_dir, quarantine_name, segment_name
from queen.wal.snapshot import SnapshotError, SnapshotRefused, decode_snapshot

logger = logging.getLogger(__name__)

# Format versions are small numbers; a header with a larger one is torn, not from another build.
FORMAT_VERSION_PLAUSIBLE_MAX = 1 << 16

FORMAT_1_HELP = (
    "it was written by format 1 of the log (Queen 0.1.0); this build reads format 2 and has changed nothing. "
    "To carry the data over: start Queen 0.1.0 on this directory, copy the keys out "
    "(`queen kv list NS --json` for each namespace), stop it, move the directory aside, start this build on "
    "an empty one and write the keys back. Locks are leases: let them be acquired again.")


@dataclass
class Recovered:
    apply_count: int = 0  # records applied to the state
    last_version: int = 0  # highest version replayed
    ceiling: int = 0  # highest ceiling record found
    claimed_version: int = 0  # highest version a cut frame's header claimed that was believed
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
    if result.version_floor > VERSION_MAX:
        raise VersionsExhausted(
            f"{os.path.abspath(data_dir)}: the log holds versions up to {result.last_version} and a ceiling of "
            f"{result.ceiling}, past {VERSION_MAX} (2^53 - 1), the largest id a JSON client reads exactly; this "
            "build hands out and serves no id past it. Only an older build writes such versions (one that believed "
            "the version a damaged frame's header claimed, a high bit flipped). To carry the data over: copy the keys "
            "out with that build (`queen kv list NS --json` for each namespace), stop it, move the directory "
            "aside, and write the keys into an empty directory with this one. Locks are leases: let them be "
            "acquired again.")
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
    """Keep the bytes past offset beside the segment, note the versions their headers claim, then
    cut the segment there. A whole frame is kept exactly, then whatever follows it less the zeros
    of the space allocated ahead; an incomplete one less its trailing zeros (they say nothing:
    unwritten space or its own, and it was never acknowledged)."""
    end = checked_end(data, offset)
    vouched = end is not None  # the damage was in the magic or the length; the rest checks
    if vouched:
        if data[offset:offset + len(FRAME_MAGIC)] != FRAME_MAGIC:
            reason += "; the rest of the frame checks: its magic is damaged"
        elif end != read_frame_header(data, offset).end:
            reason += f"; the frame checks with a length of {end - offset - FRAME_HEADER.size}: its length is damaged"
    else:
        header = read_frame_header(data, offset)
        # Judged by the end its header claims, not by the data less its trailing zeros: a frame's
        # own last bytes are often zeros (a record ending with a 0 field, stored raw).
        if header is not None and header.payload_bytes <= PAYLOAD_BYTES_MAX and header.end <= len(data):
            end = header.end
    whole = end is not None
    cut = data[offset:end] + data[end:].rstrip(b"\0") if whole else data[offset:].rstrip(b"\0")
    believed_max = _claims_believed_max(result)
    believed, not_believed = [], []
    for position in _header_positions(cut, vouched):
        claimed = read_frame_header(data, offset + position, any_magic=True)
        if claimed is None:
            continue
        claim = (claimed.first_version, claimed.last_version)
        if claimed.last_version <= believed_max:
            believed.append(claim)
            result.claimed_version = max(result.claimed_version, claimed.last_version)
        else:
            not_believed.append(claim)
    target = quarantine_name(path, offset)
    disk.write_file_atomically(target, cut)
    result.quarantined.append(target)
    claims = (f"claimed_versions={_versions_text(believed)} claims_not_believed={_versions_text(not_believed)} "
              f"claims_believed_max={believed_max}")
    if whole:
        # A frame that is all there but does not check may have been acknowledged: say so loudly.
        logger.error("event=wal_frame_damaged file=%s offset=%d bytes=%d reason=%r %s quarantine=%s "
                     "action=cut_and_restart_above_ceiling", path, offset, len(cut), reason, claims, target)
    else:
        logger.warning("event=wal_tail_torn file=%s offset=%d bytes=%d reason=%r %s quarantine=%s",
                       path, offset, len(cut), reason, claims, target)
    result.truncated_bytes += len(cut)
    disk.truncate(path, offset)


def _claims_believed_max(result: Recovered) -> int:
    """The highest version a cut frame's header is believed to claim.

    The writer puts a ceiling at or above a frame's last version on disk before the frame: in an
    earlier frame, the snapshot, or a ceiling frame written just before it in the same write (a
    fresh log's first write too). With only the cut frame damaged, that ceiling is replayed, so an
    honest claim is at most result.ceiling. A block more covers a tail where that ceiling frame was
    cut along with the batch's frame after it (damage across both): the batch began at most one
    version past the old ceiling, so its claim is within a block of it if it took at most a block
    of versions. Believing a wrong claim up to there costs at most a block of skipped versions, as
    any restart does. The last version replayed counts too, for a log with no ceiling record.
    Never past VERSION_MAX: this build hands out no version above it."""
    return min(max(result.ceiling, result.last_version) + CEILING_BLOCK, VERSION_MAX)


def _header_positions(cut: bytes, vouched: bool) -> list[int]:
    """Where frame headers start in the cut bytes: wherever the frame magic is, and at 0 when the
    checksum vouched for a frame whose magic is damaged."""
    positions = [0] if vouched else []
    position = 0
    while (position := cut.find(FRAME_MAGIC, position)) != -1:
        if position not in positions:
            positions.append(position)
        position += 1
    return positions


def _versions_text(claims: list[tuple[int, int]]) -> str:
    return ",".join(f"{first}..{last}" for first, last in claims) or "none"
