"""WAL frame and segment layout. What is on disk is set in stone: change FORMAT_VERSION to change it.

A segment file is a file header followed by frames:

    file header (12 bytes):  b"QNWL"  u32 FORMAT_VERSION  u32 reserved (0)
    frame header (32 bytes): b"QNF2"  u32 payload_bytes  u32 crc32  u64 first_version  u64 last_version
                             u32 item_count
    frame payload:           zstd( cbor( [kind, field, ..., kind, field, ...] ) )

All integers are little-endian. The payload is one flat array of records as queen/core/records.py
defines them; item_count is that array's length. first_version and last_version are the versions
of the frame's first and last versioned records (0 and 0 when it has none, as a frame holding only
a ceiling). crc32 covers first_version, last_version, item_count and the payload, so a flipped bit
anywhere but the magic and the length is caught, and a wrong length by the payload's CRC failing.
A frame whose only damage is one flipped bit of its magic or its length still checks with that bit
flipped back (`checked_end`), so recovery can tell it whole and where it ends.
One frame is written per commit batch, and a frame is all or nothing: the records of one step
(a transaction across shards included) are always in the same frame.

Format history: 1 (queen 0.1.0) had a 24-byte frame header and one nested array per record; this
build refuses it (queen/wal/recovery.py says how to move the data over).

This module is pure: bytes in, items out; it raises FrameError for anything it cannot decode.
"""

from __future__ import annotations

import struct
import zlib

import cbor2
import zstandard

FORMAT_VERSION = 2
FILE_MAGIC = b"QNWL"
FRAME_MAGIC = b"QNF2"
FILE_HEADER = struct.Struct("<4sII")
FRAME_HEADER = struct.Struct("<4sIIQQI")
_CRC_FIELDS = struct.Struct("<QQI")
# A frame holds one commit batch; far above any batch the server forms, low enough that a garbage
# length cannot make recovery allocate gigabytes.
PAYLOAD_BYTES_MAX = 256 << 20
# Level 1: commit latency matters more than the last percent of disk.
_compressor = zstandard.ZstdCompressor(level=1)
_decompressor = zstandard.ZstdDecompressor()


class FrameError(Exception):
    pass


class FormatVersionError(FrameError):
    """A whole, well-formed header of another format version: not damage, another build's file."""

    def __init__(self, version: int):
        super().__init__(f"format version {version}, this build reads {FORMAT_VERSION}")
        self.version = version


def file_header() -> bytes:
    return FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION, 0)


def check_file_header(data: bytes) -> None:
    if len(data) < FILE_HEADER.size:
        raise FrameError("segment shorter than its file header")
    magic, version, _ = FILE_HEADER.unpack_from(data, 0)
    if magic != FILE_MAGIC:
        raise FrameError("not a Queen WAL segment (bad file magic)")
    if version != FORMAT_VERSION:
        raise FormatVersionError(version)


def encode_frame(items: list, first_version: int, last_version: int) -> bytes:
    payload = _compressor.compress(cbor2.dumps(items))
    assert len(payload) <= PAYLOAD_BYTES_MAX, "a commit batch larger than a frame can hold"
    assert 0 <= first_version <= last_version and (first_version == 0) == (last_version == 0)
    crc = zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(first_version, last_version, len(items))))
    return FRAME_HEADER.pack(FRAME_MAGIC, len(payload), crc, first_version, last_version, len(items)) + payload


class FrameHeader:
    """What a frame's header claims, read without checking the payload (recovery reports it for a
    frame it has to cut)."""

    __slots__ = ("payload_bytes", "first_version", "last_version", "item_count", "end")

    def __init__(self, payload_bytes, first_version, last_version, item_count, end):
        self.payload_bytes = payload_bytes
        self.first_version = first_version
        self.last_version = last_version
        self.item_count = item_count
        self.end = end


def read_frame_header(data: bytes | memoryview, offset: int, *, any_magic: bool = False) -> FrameHeader | None:
    """The header at offset if it lies whole in data and its magic is right (any_magic: whatever
    its magic), else None."""
    if offset + FRAME_HEADER.size > len(data):
        return None
    magic, size, _, first_version, last_version, count = FRAME_HEADER.unpack_from(data, offset)
    if magic != FRAME_MAGIC and not any_magic:
        return None
    return FrameHeader(size, first_version, last_version, count, offset + FRAME_HEADER.size + size)


def checked_end(data: bytes, offset: int) -> int | None:
    """Where the frame at offset ends if its checksum holds with its length as written or with any
    one bit of the length flipped, whatever its magic says; else None.

    For a frame that failed to decode: when this finds an end, the damage is in the magic or the
    length alone (the checksum vouches for everything else), so the frame is whole, ends there,
    and its header's versions are true. One pass over the data up to the farthest candidate end."""
    start = offset + FRAME_HEADER.size
    if start > len(data):
        return None
    _, size, crc, first_version, last_version, count = FRAME_HEADER.unpack_from(data, offset)
    lengths = {size} | {size ^ (1 << bit) for bit in range(32)}
    ends = sorted(start + length for length in lengths
                  if length <= PAYLOAD_BYTES_MAX and start + length <= len(data))
    view = memoryview(data)
    running = zlib.crc32(_CRC_FIELDS.pack(first_version, last_version, count))
    position = start
    for end in ends:
        running = zlib.crc32(view[position:end], running)
        position = end
        if running == crc:
            return end
    return None


def decode_frame(data: bytes | memoryview, offset: int) -> tuple[list, int, int, int]:
    """Decode the frame at offset: (items, first_version, last_version, offset of the next frame).

    Raises FrameError("incomplete") if the frame runs past the end of data, FrameError otherwise
    for anything damaged."""
    end_of_header = offset + FRAME_HEADER.size
    if end_of_header > len(data):
        raise FrameError("incomplete")
    magic, size, crc, first_version, last_version, count = FRAME_HEADER.unpack_from(data, offset)
    if magic != FRAME_MAGIC:
        raise FrameError("bad frame magic")
    if size > PAYLOAD_BYTES_MAX:
        raise FrameError("frame length out of range")
    end = end_of_header + size
    if end > len(data):
        raise FrameError("incomplete")
    payload = bytes(data[end_of_header:end])
    if zlib.crc32(payload, zlib.crc32(_CRC_FIELDS.pack(first_version, last_version, count))) != crc:
        raise FrameError("checksum mismatch")
    try:
        items = cbor2.loads(_decompressor.decompress(payload))
    except Exception as error:  # noqa: BLE001 - any decoder failure means the same: damaged
        raise FrameError(f"undecodable payload: {error}") from None
    if type(items) is not list or len(items) != count:
        raise FrameError("item count does not match the header")
    return items, first_version, last_version, end


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
