"""Snapshot layout and encoding. Pure: bytes in, rows out. Set in stone like frame.py.

    header (36 bytes): b"QNSP"  u32 FORMAT_VERSION  u64 version  u64 first_segment  u32 crc32  u64 payload_bytes
    payload:           zstd( cbor( [[ns, key, value, version, create_version, created_at_ms,
                                     updated_at_ms, expires_at_ms], ...] ) )

`version` is the global version counter at capture; every record of segments before
`first_segment` is covered by it, so those segments may be deleted once the snapshot is durable.
crc32 covers version, first_segment and the payload. File name: snapshot-<version, 20 digits>.snap.
"""

from __future__ import annotations

import struct
import zlib

import cbor2
import zstandard

from queen.core.kv import EFFECT_PUT
from queen.wal.frame import FORMAT_VERSION

SNAPSHOT_MAGIC = b"QNSP"
SNAPSHOT_HEADER = struct.Struct("<4sIQQIQ")
_CRC_FIELDS = struct.Struct("<QQ")


class SnapshotError(Exception):
    pass


def snapshot_name(version: int) -> str:
    return f"snapshot-{version:020d}.snap"


def encode_snapshot(version: int, first_segment: int, tables) -> bytes:
    """tables: [(ns, {key: Row})] as KvState.rows_for_snapshot returns them."""
    rows = [[ns, key, r.value, r.version, r.create_version, r.created_at_ms, r.updated_at_ms, r.expires_at_ms]
            for copies in tables for ns, table in copies for key, r in table.items()]
    payload = zstandard.ZstdCompressor(level=3).compress(cbor2.dumps(rows))
    crc = zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(version, first_segment)))
    return SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, FORMAT_VERSION, version, first_segment, crc, len(payload)) + payload


def read_snapshot_header(data: bytes) -> tuple[int, int]:
    if len(data) < SNAPSHOT_HEADER.size:
        raise SnapshotError("shorter than its header")
    magic, fmt, version, first_segment, crc, size = SNAPSHOT_HEADER.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotError("bad magic")
    if fmt != FORMAT_VERSION:
        raise SnapshotError(f"format version {fmt}, this build reads {FORMAT_VERSION}")
    payload = data[SNAPSHOT_HEADER.size:]
    if len(payload) != size:
        raise SnapshotError("payload length does not match the header")
    if zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(version, first_segment))) != crc:
        raise SnapshotError("checksum mismatch")
    return version, first_segment


def decode_snapshot(data: bytes) -> tuple[int, int, list]:
    """(version, first_segment, put effects) of a whole, checked snapshot file."""
    version, first_segment = read_snapshot_header(data)
    try:
        rows = cbor2.loads(zstandard.ZstdDecompressor().decompress(data[SNAPSHOT_HEADER.size:]))
    except Exception as error:  # noqa: BLE001 - any decoder failure means the same: damaged
        raise SnapshotError(f"undecodable payload: {error}") from None
    return version, first_segment, [(EFFECT_PUT, *row) for row in rows]
