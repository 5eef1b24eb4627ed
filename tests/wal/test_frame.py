"""The WAL frame codec (queen/wal/frame.py): round trips, damage detection, and the decoder's one
promise under fuzzing: it decodes, or it raises FrameError, never anything else. Frames carry a
flat array of records (queen/core/records.py); these tests build it with the records' encoders."""

import struct
import zlib

import cbor2
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from queen.core import records as rec
from queen.wal.frame import (
    FILE_HEADER,
    FORMAT_VERSION,
    FRAME_HEADER,
    FRAME_MAGIC,
    FormatVersionError,
    FrameError,
    check_file_header,
    decode_frame,
    encode_frame,
    file_header,
    find_next_valid_frame,
)


def put(key, value, version, expires_at_ms=0):
    items = []
    rec.put(items, "app", key, value, version, version, 1_700_000_000_000, 1_700_000_000_000, expires_at_ms)
    return items


def delete(key, version):
    items = []
    rec.delete(items, "app", key, version)
    return items


RECORDS = put("a", {"n": 1, "s": "x", "b": b"\x00\xff"}, 7) + put("b", [1, 2, None], 8, 1_700_000_060_000) + delete("a", 9)


def frame_with_payload(payload: bytes, first_version: int = 1, count: int = 1) -> bytes:
    """A frame whose header and CRC are right for an arbitrary payload, to reach the decompressor
    and the CBOR decoder with bytes the encoder would never produce."""
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<QQI", first_version, first_version, count)))
    return FRAME_HEADER.pack(FRAME_MAGIC, len(payload), crc, first_version, first_version, count) + payload


# -- round trips ---------------------------------------------------------------------------------


def test_encoded_frame_decodes_to_the_same_records_and_versions():
    data = encode_frame(RECORDS, 7, 9)
    items, first_version, last_version, next_offset = decode_frame(data, 0)
    assert items == RECORDS
    assert (first_version, last_version) == (7, 9)
    assert next_offset == len(data)
    assert rec.versions_of(rec.decode(items)) == (7, 9)


def test_frames_written_back_to_back_decode_in_order_from_their_offsets():
    frames = [encode_frame(put(f"k{i}", i, 10 + i), 10 + i, 10 + i) for i in range(5)]
    data = file_header() + b"".join(frames)
    offset, seen = FILE_HEADER.size, []
    while offset < len(data):
        items, first_version, _, offset = decode_frame(memoryview(data), offset)
        [record] = rec.decode(items)
        seen.append((first_version, record.value))
    assert seen == [(10 + i, i) for i in range(5)]
    assert offset == len(data)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10)
KEYS = st.text(min_size=1, max_size=20)
VERSIONS = st.integers(1, (1 << 63) - 1)
EFFECTS = st.one_of(st.builds(put, KEYS, JSON_VALUES | st.binary(max_size=20), VERSIONS), st.builds(delete, KEYS, VERSIONS))


@given(st.lists(EFFECTS, min_size=1, max_size=20), st.integers(1, (1 << 63) - 1), st.integers(0, 1 << 20))
def test_any_records_round_trip(records, first_version, span):
    items = [item for record in records for item in record]
    data = encode_frame(items, first_version, first_version + span)
    assert decode_frame(data, 0) == (items, first_version, first_version + span, len(data))
    assert len(rec.decode(items)) == len(records)


def test_file_header_is_accepted_and_damaged_headers_are_refused():
    check_file_header(file_header() + b"anything after it")
    with pytest.raises(FrameError, match="shorter"):
        check_file_header(file_header()[:-1])
    with pytest.raises(FrameError, match="magic"):
        check_file_header(b"XXXX" + file_header()[4:])
    with pytest.raises(FrameError, match="version"):
        check_file_header(FILE_HEADER.pack(b"QNWL", FORMAT_VERSION + 1, 0))
    with pytest.raises(FormatVersionError) as info:
        check_file_header(FILE_HEADER.pack(b"QNWL", 1, 0))
    assert info.value.version == 1


# -- damage --------------------------------------------------------------------------------------


def test_every_cut_short_of_the_end_answers_incomplete():
    data = encode_frame(RECORDS, 7, 9)
    for cut in range(len(data)):
        with pytest.raises(FrameError, match="incomplete"):
            decode_frame(data[:cut], 0)


def test_every_single_bit_flip_is_refused():
    # CRC32 catches every single-bit error in what it covers; the magic and the length are
    # checked on their own (a wrong length makes the CRC run over the wrong bytes).
    data = encode_frame(RECORDS, 7, 9)
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FrameError):
            decode_frame(bytes(damaged), 0)


def test_a_garbage_length_is_refused_without_reading_that_far():
    data = bytearray(encode_frame(RECORDS, 7, 9))
    struct.pack_into("<I", data, 4, 0xFFFFFFFF)
    with pytest.raises(FrameError, match="out of range"):
        decode_frame(bytes(data), 0)


def test_a_payload_with_a_right_crc_but_wrong_item_count_is_refused():
    payload = zstandard.ZstdCompressor().compress(cbor2.dumps(delete("a", 1)))
    with pytest.raises(FrameError, match="item count"):
        decode_frame(frame_with_payload(payload, count=2), 0)


def test_a_payload_with_a_right_crc_that_is_not_zstd_is_refused():
    with pytest.raises(FrameError, match="undecodable"):
        decode_frame(frame_with_payload(b"not zstd at all"), 0)


# -- fuzz: decodes, or raises FrameError, never anything else -----------------------------------


def decodes_or_frame_error(data: bytes, offset: int = 0) -> None:
    try:
        items, _, _, next_offset = decode_frame(data, offset)
    except FrameError:
        return
    assert type(items) is list
    assert offset + FRAME_HEADER.size <= next_offset <= len(data)


@settings(max_examples=500)
@given(st.binary(max_size=512), st.integers(0, 600))
def test_arbitrary_bytes_decode_or_raise_frame_error(data, offset):
    decodes_or_frame_error(data, offset)


@settings(max_examples=500)
@given(st.binary(max_size=256), st.integers(0, 1 << 16), st.integers(0, 64))
def test_arbitrary_bytes_behind_a_valid_magic_decode_or_raise_frame_error(tail, size, count):
    # Past the magic check, where a random buffer rarely gets.
    decodes_or_frame_error(FRAME_MAGIC + struct.pack("<IIQQI", size, 0, 1, 1, count) + tail)


@settings(max_examples=500)
@given(st.binary(max_size=256), st.integers(0, 64))
def test_arbitrary_payloads_with_a_right_crc_decode_or_raise_frame_error(payload, count):
    # Past the CRC check: the decompressor and the CBOR decoder see bytes we never wrote.
    decodes_or_frame_error(frame_with_payload(payload, count=count))


@settings(max_examples=500)
@given(st.binary(max_size=256), st.integers(0, 64))
def test_compressed_arbitrary_cbor_with_a_right_crc_decodes_or_raises_frame_error(raw, count):
    decodes_or_frame_error(frame_with_payload(zstandard.ZstdCompressor().compress(raw), count=count))


@settings(max_examples=1000)
@given(st.data())
def test_damaged_valid_frames_decode_or_raise_frame_error(data):
    frame = bytearray(encode_frame(RECORDS, 7, 9))
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        position = data.draw(st.integers(0, len(frame) - 1), label="position")
        frame[position] ^= data.draw(st.integers(1, 255), label="xor")
    cut = data.draw(st.integers(0, len(frame)), label="cut")
    extra = data.draw(st.binary(max_size=32), label="extra")
    decodes_or_frame_error(bytes(frame[:cut]) + extra)


# -- find_next_valid_frame -----------------------------------------------------------------------


def test_find_next_valid_frame_skips_garbage_and_false_magics():
    first = encode_frame(put("a", 1, 1), 1, 1)
    second = encode_frame(put("b", 2, 2), 2, 2)
    garbage = b"\x00junk" + FRAME_MAGIC + b"not a frame" + FRAME_MAGIC[:2]
    data = garbage + first + second
    assert find_next_valid_frame(data, 0) == len(garbage)
    assert find_next_valid_frame(data, len(garbage)) == len(garbage)
    assert find_next_valid_frame(data, len(garbage) + 1) == len(garbage) + len(first)


def test_find_next_valid_frame_passes_over_a_damaged_frame_to_the_valid_one_after_it():
    first = bytearray(encode_frame(put("a", 1, 1), 1, 1))
    first[-1] ^= 0xFF
    second = encode_frame(put("b", 2, 2), 2, 2)
    data = bytes(first) + second
    assert find_next_valid_frame(data, 0) == len(first)


def test_find_next_valid_frame_answers_none_when_only_a_torn_frame_follows():
    whole = encode_frame(put("a", 1, 1), 1, 1)
    torn = encode_frame(put("b", 2, 2), 2, 2)[:-1]
    assert find_next_valid_frame(whole + torn, 1) is None
    assert find_next_valid_frame(b"", 0) is None
    assert find_next_valid_frame(b"no magic here", 0) is None
