"""Recovery: the newest valid snapshot, then every frame after it, in order.

Rules (after etcd's WAL repair): a torn or incomplete frame at the very end of the last segment is
what a crash mid-write leaves, so it is cut off with a warning. A damaged frame with any valid frame
after it, or a missing segment, is not something a crash leaves: recovery refuses (CorruptLog naming
the file and offset) rather than silently dropping acknowledged writes.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from queen.core.kv import EFFECT_PUT
from queen.errors import CorruptLog
from queen.wal.disk import Disk
from queen.wal.frame import (
    FILE_HEADER,
    FrameError,
    check_file_header,
    decode_frame,
    find_next_valid_frame,
)
from queen.wal.snapshot import SnapshotError, decode_snapshot

logger = logging.getLogger(__name__)

SEGMENT_RE = re.compile(r"^wal-(\d{16})\.seg$")
SNAPSHOT_RE = re.compile(r"^snapshot-(\d{20})\.snap$")


def segment_name(seq: int) -> str:
    return f"wal-{seq:016d}.seg"


def effect_version(effect) -> int:
    return effect[4] if effect[0] == EFFECT_PUT else effect[3]


@dataclass
class Recovered:
    last_version: int = 0
    next_segment: int = 1
    snapshot_version: int = 0
    snapshot_rows: int = 0
    segments: int = 0
    frames: int = 0
    records: int = 0
    truncated_bytes: int = 0


def list_dir(data_dir: str) -> tuple[dict[int, str], dict[int, str]]:
    segments, snapshots = {}, {}
    for name in os.listdir(data_dir):
        if match := SEGMENT_RE.match(name):
            segments[int(match.group(1))] = name
        elif match := SNAPSHOT_RE.match(name):
            snapshots[int(match.group(1))] = name
    return segments, snapshots


def recover(data_dir: str, apply_effect, disk: Disk | None = None) -> Recovered:
    """Rebuild state by calling apply_effect(effect) in version order. Blocking: run it in a thread."""
    disk = disk or Disk()
    for name in os.listdir(data_dir):
        if name.endswith(".tmp"):  # a snapshot whose rename never happened
            disk.remove(os.path.join(data_dir, name))
    segments, snapshots = list_dir(data_dir)
    result = Recovered()
    first_segment = 1
    for version in sorted(snapshots, reverse=True):
        path = os.path.join(data_dir, snapshots[version])
        try:
            with open(path, "rb") as f:
                snap_version, first_segment, effects = decode_snapshot(f.read())
        except SnapshotError as error:
            logger.warning("event=snapshot_skipped file=%s reason=%r", path, str(error))
            continue
        for effect in effects:
            apply_effect(effect)
        result.snapshot_version = result.last_version = snap_version
        result.snapshot_rows = len(effects)
        break
    else:
        first_segment = 1
    for seq in sorted(segments):
        if seq < first_segment:  # covered by the snapshot; its deletion was interrupted
            disk.remove(os.path.join(data_dir, segments[seq]))
            del segments[seq]
    order = sorted(segments)
    expected = first_segment if result.snapshot_version else (order[0] if order else 1)
    if not result.snapshot_version and order and order[0] != 1:
        raise CorruptLog(f"{segments[order[0]]} is the oldest segment but there is no snapshot covering the ones before it")
    for seq in order:
        if seq != expected:
            raise CorruptLog(f"segment {segment_name(expected)} is missing (found {segments[seq]} after it)")
        expected += 1
    result.next_segment = (order[-1] + 1) if order else first_segment
    for position, seq in enumerate(order):
        path = os.path.join(data_dir, segments[seq])
        last_segment = position == len(order) - 1
        if _replay_segment(path, last_segment, order[position + 1:], data_dir, segments, apply_effect, result, disk):
            # The torn last segment is gone: the writer must reuse its number, or the next
            # recovery would find a gap where it was and refuse to start.
            result.next_segment = seq
            continue
        result.segments += 1
    return result


def _replay_segment(path, last_segment, later, data_dir, segments, apply_effect, result, disk) -> bool:
    """Replay one segment; True if it was a torn header and has been removed."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < FILE_HEADER.size and last_segment:
        logger.warning("event=wal_header_torn file=%s bytes=%d action=removed", path, len(data))
        disk.remove(path)
        return True
    try:
        check_file_header(data)
    except FrameError as error:
        raise CorruptLog(f"{path}: {error}") from None
    offset = FILE_HEADER.size
    floor = result.snapshot_version
    while offset < len(data):
        try:
            records, _, next_offset = decode_frame(data, offset)
        except FrameError as error:
            _refuse_unless_torn_tail(path, offset, str(error), data, last_segment, later, data_dir, segments)
            logger.warning("event=wal_tail_truncated file=%s offset=%d dropped_bytes=%d reason=%r",
                           path, offset, len(data) - offset, str(error))
            result.truncated_bytes += len(data) - offset
            disk.truncate(path, offset)
            return False
        for effect in records:
            version = effect_version(effect)
            if version > floor:
                apply_effect(effect)
                if version > result.last_version:
                    result.last_version = version
        result.frames += 1
        result.records += len(records)
        offset = next_offset
    return False


def _refuse_unless_torn_tail(path, offset, reason, data, last_segment, later, data_dir, segments):
    if not last_segment:
        raise CorruptLog(f"{path} offset {offset}: damaged frame ({reason}) in a segment that is not the last")
    found = find_next_valid_frame(data, offset + 1)
    if found is not None:
        raise CorruptLog(f"{path} offset {offset}: damaged frame ({reason}) followed by a valid frame at offset {found}")
    for seq in later:  # defensive: last_segment means there are none
        raise CorruptLog(f"{path} offset {offset}: damaged frame ({reason}) followed by {segments[seq]}")
