"""WAL frame and segment layout. What is on disk is set in stone: change FORMAT_VERSION to change it.

A segment file is a file header followed by frames:

    file header (12 bytes):  b"QNWL"  u32 FORMAT_VERSION  u32 reserved (0)
    frame header (24 bytes): b"QNF1"  u32 payload_bytes  u32 crc32  u64 first_version  u32 record_count
    frame payload:           zstd( cbor( [record, record, ...] ) )

All integers are little-endian. crc32 covers first_version, record_count and the payload, so a
flipped bit anywhere but the magic and length is caught, and a wrong length is caught by the
payload's CRC failing. A record is an effect (queen/core/kv.py EFFECT_*), never a request, so replay
is deterministic. One frame is written per commit batch, and a frame is all or nothing: the records
of one transaction are always in the same frame.

This module is pure: bytes in, records out; it raises FrameError for anything it cannot decode.
"""

from __future__ import annotations

import struct
import zlib

import cbor2
import zstandard

FORMAT_VERSION = 1
FILE_MAGIC = b"QNWL"
FRAME_MAGIC = b"QNF1"
FILE_HEADER = struct.Struct("<4sII")
FRAME_HEADER = struct.Struct("<4sIIQI")
_CRC_FIELDS = struct.Struct("<QI")
# A frame holds one commit batch; far above any batch the server forms, low enough that a garbage
# length cannot make recovery allocate gigabytes.
PAYLOAD_BYTES_MAX = 256 << 20
# Level 1: commit latency matters more than the last percent of disk.
_compressor = zstandard.ZstdCompressor(level=1)
_decompressor = zstandard.ZstdDecompressor()


class FrameError(Exception):
    pass


def file_header() -> bytes:
    return FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION, 0)


def check_file_header(data: bytes) -> None:
    if len(data) < FILE_HEADER.size:
        raise FrameError("segment shorter than its file header")
    magic, version, _ = FILE_HEADER.unpack_from(data, 0)
    if magic != FILE_MAGIC:
        raise FrameError("not a Queen WAL segment (bad file magic)")
    if version != FORMAT_VERSION:
        raise FrameError(f"segment format version {version}, this build reads {FORMAT_VERSION}")


def encode_frame(records: list, first_version: int) -> bytes:
    payload = _compressor.compress(cbor2.dumps(records))
    assert len(payload) <= PAYLOAD_BYTES_MAX, "a commit batch larger than a frame can hold"
    crc = zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(first_version, len(records))))
    return FRAME_HEADER.pack(FRAME_MAGIC, len(payload), crc, first_version, len(records)) + payload


def decode_frame(data: bytes | memoryview, offset: int) -> tuple[list, int, int]:
    """Decode the frame at offset: (records, first_version, offset of the next frame).

    Raises FrameError("incomplete") if the frame runs past the end of data, FrameError otherwise
    for anything damaged."""
    end_of_header = offset + FRAME_HEADER.size
    if end_of_header > len(data):
        raise FrameError("incomplete")
    magic, size, crc, first_version, count = FRAME_HEADER.unpack_from(data, offset)
    if magic != FRAME_MAGIC:
        raise FrameError("bad frame magic")
    if size > PAYLOAD_BYTES_MAX:
        raise FrameError("frame length out of range")
    end = end_of_header + size
    if end > len(data):
        raise FrameError("incomplete")
    payload = bytes(data[end_of_header:end])
    if zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(first_version, count))) != crc:
        raise FrameError("checksum mismatch")
    try:
        records = cbor2.loads(_decompressor.decompress(payload))
    except Exception as error:  # noqa: BLE001 - any decoder failure means the same: damaged
        raise FrameError(f"undecodable payload: {error}") from None
    if type(records) is not list or len(records) != count:
        raise FrameError("record count does not match the header")
    return records, first_version, end


def find_next_valid_frame(data: bytes, start: int) -> int | None:
    """Offset of the first decodable frame at or after start, or None. Used to tell a torn tail
    (nothing valid follows: safe to cut) from corruption in the middle (refuse to start)."""
    position = data.find(FRAME_MAGIC, start)
    while position != -1:
        try:
            decode_frame(data, position)
            return position
        except FrameError:
            position = data.find(FRAME_MAGIC, position + 1)
    return None
