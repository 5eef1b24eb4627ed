"""One flipped bit anywhere in a golden log: every frame, every field of its header, a few places in
its payload, with recovery judging each as queen/wal/recovery.py's docstring says.

The golden log is a real segment: a whole in-process Server (one shard, so each call is one frame,
preceded by a ceiling frame whenever the writer renews its ceiling) on a ForgetfulDisk, shut down
cleanly. Each case flips one bit of a copy, puts it on a fresh ForgetfulDisk and runs recovery on
it, in two layouts: as a clean shutdown leaves a segment (cut back to its last frame) and as a
crash leaves it (followed by the zeros of the space the writer allocated ahead).

What each case must come to:
  - a flip in the last frame: the frame is whole, whatever the flip hit. Recovery cuts the segment
    at its start, keeps exactly its (damaged) bytes in `<segment>.cut-<offset>`, and logs one ERROR
    `wal_frame_damaged` naming the file and offset (it may have been acknowledged): never the
    WARNING `wal_tail_torn` of a torn write. That holds for a flip in the magic or the length too,
    even one that makes the frame seem to run past the end of the file: the frame still checks
    with that one bit flipped back, so recovery knows it is whole and where it ends. Every frame
    before it is replayed, and versions restart above every version the frame held, but never more
    than a ceiling block above the highest ceiling (a flipped high bit of `last_version` is not
    believed) and never past VERSION_MAX;
  - a flip in any frame before the last: recovery refuses (CorruptLog naming the file and the
    frame's offset) and changes nothing.
"""

import functools
import logging
import os

import pytest
import trio

from queen.core.kv import VERSION_MAX, parse_kv_ops
from queen.core.limits import Limits
from queen.core.locks import parse_lock_ops
from queen.core.queue_ops import parse_push
from queen.errors import CorruptLog
from queen.testing import ForgetfulDisk, open_server
from queen.wal.frame import FILE_HEADER, FRAME_HEADER, decode_frame
from queen.wal.recovery import recover
from queen.wal.segment import CEILING_BLOCK, quarantine_name, segment_name

LIMITS = Limits()
DATA_DIR = "/golden"
SEGMENT = os.path.join(DATA_DIR, segment_name(1))
ALLOCATED_AHEAD_BYTES = 4096

# (offset in the header, size in bytes, bits to flip): every field, its lowest and highest bits and
# some between; for the versions, the bits 53-62 a plausibility check must not let through.
HEADER_FIELDS = {
    "magic": (0, 4, [0, 9, 31]),
    "length": (4, 4, [0, 3, 8, 16, 27, 28, 31]),
    "crc": (8, 4, [0, 17, 31]),
    "first_version": (12, 8, [0, 20, 53, 63]),
    "last_version": (20, 8, [0, 5, 16, 17, 40, 53, 55, 61, 62, 63]),
    "item_count": (28, 4, [0, 7, 31]),
}
PAYLOAD_BITS = [0, 7]


def put(key, value):
    return {"op": "put", "ns": "app", "key": key, "value": value, "forever": True}


async def _write_golden(data_dir, disk):
    async with open_server(data_dir, disk=disk, shard_count=1) as server:
        router = server.router
        await router.run_kv(parse_kv_ops([put("a", 1), put("b", "two")], LIMITS), True)
        await router.run_locks(parse_lock_ops([{"op": "acquire", "name": "job", "ttlSeconds": 600,
                                                 "owner": "w1"}], LIMITS))
        await router.push(parse_push({"items": [{"queue": "q", "payload": {"n": 1}}]}, LIMITS))
        await router.run_transaction(parse_kv_ops([put("c", [1, 2]), put("a", 3)], LIMITS))
        # The last frame: one small put of a row that never expires. Its payload is stored raw and
        # ends with expires_at_ms = 0, a zero byte, like most frames of one small write.
        await router.run_kv(parse_kv_ops([put("last", 4)], LIMITS), True)


@functools.cache
def golden() -> bytes:
    disk = ForgetfulDisk()
    trio.run(_write_golden, DATA_DIR, disk)
    return disk.read_file(SEGMENT)


def frames(data: bytes) -> list[tuple[int, int, int]]:
    """[(start, end, last_version)] of every frame, the writer's ceiling frames included."""
    spans, offset = [], FILE_HEADER.size
    while offset < len(data):
        _, _, last_version, end = decode_frame(data, offset)
        spans.append((offset, end, last_version))
        offset = end
    return spans


def flipped(data: bytes, position: int, bit: int) -> bytes:
    damaged = bytearray(data)
    damaged[position + bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


def disk_holding(data: bytes) -> ForgetfulDisk:
    disk = ForgetfulDisk()
    fd = disk.create(SEGMENT)
    disk.write(fd, data)
    disk.fsync(fd)
    disk.close(fd)
    disk.fsync_dir(DATA_DIR)
    return disk


def flips_of(kind: str, start: int, end: int) -> list[tuple[str, int, int]]:
    """(name, byte position, bit) of every flip of this kind in the frame at start..end."""
    if kind == "payload":
        payload = start + FRAME_HEADER.size
        return [(f"payload byte {where} bit {bit}", position, bit)
                for where, position in (("first", payload), ("middle", (payload + end) // 2), ("last", end - 1))
                for bit in PAYLOAD_BITS]
    offset, size, bits = HEADER_FIELDS[kind]
    assert all(bit < size * 8 for bit in bits)
    return [(f"{kind} bit {bit}", start + offset, bit) for bit in bits]


def test_the_golden_log_has_what_the_suite_needs():
    data = golden()
    spans = frames(data)
    assert len(spans) >= 6 and spans[-1][1] == len(data)
    assert any(last == 0 for _, _, last in spans), "a ceiling frame"
    start, end, _ = spans[-1]
    # Most small frames end with a zero byte: recovery once took those zeros for the unwritten
    # space of a torn write, and logged such a damaged frame as torn.
    assert data[end - 1] == 0


@pytest.mark.parametrize("layout", ["closed", "allocated_ahead"])
@pytest.mark.parametrize("kind", [*HEADER_FIELDS, "payload"])
def test_one_flipped_bit_is_cut_and_logged_in_the_last_frame_and_refused_anywhere_before(kind, layout, caplog):
    data = golden()
    spans = frames(data)
    tail = bytes(ALLOCATED_AHEAD_BYTES) if layout == "allocated_ahead" else b""
    caplog.set_level(logging.INFO)
    ceiling_before_last = None
    for index, (start, end, frame_last) in enumerate(spans):
        for name, position, bit in flips_of(kind, start, end):
            case = f"frame {index} at {start}, {name}, {layout}"
            damaged = flipped(data, position, bit) + tail
            disk = disk_holding(damaged)
            caplog.clear()
            replayed = []
            if index < len(spans) - 1:
                with pytest.raises(CorruptLog) as refused:
                    recover(DATA_DIR, replayed.append, disk)
                assert SEGMENT in str(refused.value) and f"offset {start}" in str(refused.value), case
                assert disk.read_file(SEGMENT) == damaged, f"{case}: a refused start must change nothing"
                continue

            result = recover(DATA_DIR, replayed.append, disk)
            assert disk.read_file(SEGMENT) == data[:start], case
            assert disk.read_file(quarantine_name(SEGMENT, start)) == damaged[start:end], \
                f"{case}: the quarantine holds exactly the damaged frame"
            assert result.quarantined == [quarantine_name(SEGMENT, start)], case
            assert result.frames == len(spans) - 1, case
            lines = [r for r in caplog.records if "event=wal_" in r.getMessage()]
            assert len(lines) == 1, f"{case}: {[r.getMessage() for r in lines]}"
            [line] = lines
            message = line.getMessage()
            assert (line.levelno, "event=wal_frame_damaged") == (logging.ERROR, message.split(" ")[0]), \
                f"{case}: {message}"
            assert f"file={SEGMENT} offset={start} " in message, case
            # Versions restart above every version the frame held, and not far above the ceiling.
            believed_max = max(result.ceiling, result.last_version) + CEILING_BLOCK
            assert frame_last <= result.ceiling <= result.version_floor <= min(believed_max, VERSION_MAX), \
                f"{case}: floor {result.version_floor}"
            if ceiling_before_last is None:
                ceiling_before_last = result.ceiling
            assert result.ceiling == ceiling_before_last, case
            if kind == "last_version":
                claim = frame_last ^ (1 << bit)
                if claim > believed_max:
                    assert f"..{claim}" in message, case
                    assert result.version_floor < claim, case
