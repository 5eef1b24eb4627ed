"""Snapshot layout and encoding. Pure: bytes in, records out. Set in stone like frame.py.

    header (44 bytes): b"QNSP"  u32 FORMAT_VERSION  u64 version  u64 ceiling  u64 first_segment  u32 crc32
                       u64 payload_bytes
    payload:           zstd( cbor( {section name: [flat records], ...} ) )

`version` is the global version counter at capture; every record of segments before
`first_segment` is covered by it, so those segments may be deleted once the snapshot is durable.
`ceiling` is the version ceiling durable when it was taken (queen/core/records.py, ceiling).
crc32 covers version, ceiling, first_segment and the payload. File name: queen/wal/segment.py.

Sections, each a flat array of records as queen/core/records.py defines them:

| section | records                                                           |
| ------- | ----------------------------------------------------------------- |
| kv      | put, one per live row of every namespace but queen-locks          |
| locks   | put, one per held lock permit (the rows of queen-locks)           |
| queues  | per queue: queue_set, its partitions and retained messages (append), its groups (group_join), each group's state per partition (group_partition), producer ids kept past their messages (dedupe), live leases (grant) |

Queues and timers will add sections of their own. A section this build does not know is refused
as written by a newer build, never skipped: skipping it would drop its state.
"""

from __future__ import annotations

import struct
import zlib

import cbor2
import zstandard

from queen.core import records as rec
from queen.wal.frame import FORMAT_VERSION

SNAPSHOT_MAGIC = b"QNSP"
SNAPSHOT_HEADER = struct.Struct("<4sIQQQIQ")
_CRC_FIELDS = struct.Struct("<QQQ")
SECTIONS = ("kv", "locks", "queues")


class SnapshotError(Exception):
    """The file is damaged (torn, flipped, not ours): recovery may fall back to an older snapshot."""


class SnapshotRefused(Exception):
    """A whole snapshot this build must not read: another format version, or a section it does not
    know. Recovery refuses to start rather than guess."""


class Snapshot:
    __slots__ = ("version", "ceiling", "first_segment", "records")

    def __init__(self, version: int, ceiling: int, first_segment: int, records: list):
        self.version = version
        self.ceiling = ceiling
        self.first_segment = first_segment
        self.records = records


def encode_snapshot(version: int, ceiling: int, first_segment: int, sections: dict[str, list]) -> bytes:
    assert set(sections) <= set(SECTIONS), "a section recovery could not read"
    payload = zstandard.ZstdCompressor(level=3).compress(cbor2.dumps(sections))
    crc = zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(version, ceiling, first_segment)))
    return SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, FORMAT_VERSION, version, ceiling, first_segment, crc,
                                len(payload)) + payload


def rebase_snapshot(data: bytes, first_segment: int) -> bytes:
    """The same snapshot saying the log goes on in segment first_segment (a cluster follower
    installs its leader's snapshot before its own segments' numbers)."""
    magic, fmt, version, ceiling, _, _, size = SNAPSHOT_HEADER.unpack_from(data, 0)
    payload = data[SNAPSHOT_HEADER.size:]
    crc = zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(version, ceiling, first_segment)))
    return SNAPSHOT_HEADER.pack(magic, fmt, version, ceiling, first_segment, crc, size) + payload


def decode_snapshot(data: bytes) -> Snapshot:
    """A whole, checked snapshot file, its sections' records decoded and in section order."""
    if len(data) < SNAPSHOT_HEADER.size:
        raise SnapshotError("shorter than its header")
    magic, fmt, version, ceiling, first_segment, crc, size = SNAPSHOT_HEADER.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotError("bad magic")
    payload = data[SNAPSHOT_HEADER.size:]
    if len(payload) != size:
        raise SnapshotError("payload length does not match the header")
    if zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(version, ceiling, first_segment))) != crc:
        # Checked before the format version: a format-1 header is shorter, so it fails here too,
        # and recovery tells format 1 apart by the segments' file headers.
        raise SnapshotError("checksum mismatch")
    if fmt != FORMAT_VERSION:
        raise SnapshotRefused(f"format version {fmt}, this build reads {FORMAT_VERSION}")
    try:
        sections = cbor2.loads(zstandard.ZstdDecompressor().decompress(payload))
    except Exception as error:  # noqa: BLE001 - any decoder failure means the same: damaged
        raise SnapshotError(f"undecodable payload: {error}") from None
    if type(sections) is not dict:
        raise SnapshotError("payload is not a map of sections")
    unknown = [name for name in sections if name not in SECTIONS]
    if unknown:
        raise SnapshotRefused(f"sections {unknown!r} are unknown to this build (written by a newer one?)")
    records = []
    for name in SECTIONS:
        try:
            records += rec.decode(sections.get(name, []))
        except rec.UnknownKind as error:
            raise SnapshotRefused(f"section {name}: {error}") from None
        except rec.RecordError as error:
            raise SnapshotError(f"section {name}: {error}") from None
    return Snapshot(version, ceiling, first_segment, records)
