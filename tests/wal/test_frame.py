"""The WAL frame codec (queen/wal/frame.py): round trips, damage detection, and the decoder's one
promise under fuzzing: it decodes, or it raises FrameError, never anything else."""

import struct
import zlib

import cbor2
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from queen.core.kv import EFFECT_DELETE, EFFECT_PUT
from queen.wal.frame import (
    FILE_HEADER,
    FORMAT_VERSION,
    FRAME_HEADER,
    FRAME_MAGIC,
    FrameError,
    check_file_header,
    decode_frame,
    encode_frame,
    file_header,
    find_next_valid_frame,
)


def put(key, value, version, expires_at_ms=0):
    return [EFFECT_PUT, "app", key, value, version, version, 1_700_000_000_000, 1_700_000_000_000, expires_at_ms]


def delete(key, version):
    return [EFFECT_DELETE, "app", key, version]


RECORDS = [put("a", {"n": 1, "s": "x"}, 7), put("b", [1, 2, None], 8, 1_700_000_060_000), delete("a", 9)]


def frame_with_payload(payload: bytes, first_version: int = 1, count: int = 1) -> bytes:
    """A frame whose header and CRC are right for an arbitrary payload, to reach the decompressor
    and the CBOR decoder with bytes the encoder would never produce."""
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<QI", first_version, count)))
    return FRAME_HEADER.pack(FRAME_MAGIC, len(payload), crc, first_version, count) + payload


# -- round trips ---------------------------------------------------------------------------------


def test_encoded_frame_decodes_to_the_same_records_and_first_version():
    data = encode_frame(RECORDS, 7)
    records, first_version, next_offset = decode_frame(data, 0)
    assert records == RECORDS
    assert first_version == 7
    assert next_offset == len(data)


def test_frames_written_back_to_back_decode_in_order_from_their_offsets():
    frames = [encode_frame([put(f"k{i}", i, 10 + i)], 10 + i) for i in range(5)]
    data = file_header() + b"".join(frames)
    offset, seen = FILE_HEADER.size, []
    while offset < len(data):
        records, first_version, offset = decode_frame(memoryview(data), offset)
        seen.append((first_version, records[0][3]))
    assert seen == [(10 + i, i) for i in range(5)]
    assert offset == len(data)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10)
KEYS = st.text(min_size=1, max_size=20)
VERSIONS = st.integers(1, (1 << 63) - 1)
EFFECTS = st.one_of(st.builds(put, KEYS, JSON_VALUES, VERSIONS), st.builds(delete, KEYS, VERSIONS))


@given(st.lists(EFFECTS, min_size=1, max_size=20), st.integers(0, (1 << 64) - 1))
def test_any_records_round_trip(records, first_version):
    data = encode_frame(records, first_version)
    assert decode_frame(data, 0) == (records, first_version, len(data))


def test_file_header_is_accepted_and_damaged_headers_are_refused():
    check_file_header(file_header() + b"anything after it")
    with pytest.raises(FrameError, match="shorter"):
        check_file_header(file_header()[:-1])
    with pytest.raises(FrameError, match="magic"):
        check_file_header(b"XXXX" + file_header()[4:])
    with pytest.raises(FrameError, match="version"):
        check_file_header(FILE_HEADER.pack(b"QNWL", FORMAT_VERSION + 1, 0))


# -- damage --------------------------------------------------------------------------------------


def test_every_cut_short_of_the_end_answers_incomplete():
    data = encode_frame(RECORDS, 7)
    for cut in range(len(data)):
        with pytest.raises(FrameError, match="incomplete"):
            decode_frame(data[:cut], 0)


def test_every_single_bit_flip_is_refused():
    # CRC32 catches every single-bit error in what it covers; the magic and the length are
    # checked on their own (a wrong length makes the CRC run over the wrong bytes).
    data = encode_frame(RECORDS, 7)
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FrameError):
            decode_frame(bytes(damaged), 0)


def test_a_garbage_length_is_refused_without_reading_that_far():
    data = bytearray(encode_frame(RECORDS, 7))
    struct.pack_into("<I", data, 4, 0xFFFFFFFF)
    with pytest.raises(FrameError, match="out of range"):
        decode_frame(bytes(data), 0)


def test_a_payload_with_a_right_crc_but_wrong_record_count_is_refused():
    payload = zstandard.ZstdCompressor().compress(cbor2.dumps([delete("a", 1)]))
    with pytest.raises(FrameError, match="record count"):
        decode_frame(frame_with_payload(payload, count=2), 0)


def test_a_payload_with_a_right_crc_that_is_not_zstd_is_refused():
    with pytest.raises(FrameError, match="undecodable"):
        decode_frame(frame_with_payload(b"not zstd at all"), 0)


# -- fuzz: decodes, or raises FrameError, never anything else -----------------------------------


def decodes_or_frame_error(data: bytes, offset: int = 0) -> None:
    try:
        records, _, next_offset = decode_frame(data, offset)
    except FrameError:
        return
    assert type(records) is list
    assert offset + FRAME_HEADER.size <= next_offset <= len(data)


@settings(max_examples=500)
@given(st.binary(max_size=512), st.integers(0, 600))
def test_arbitrary_bytes_decode_or_raise_frame_error(data, offset):
    decodes_or_frame_error(data, offset)


@settings(max_examples=500)
@given(st.binary(max_size=256), st.integers(0, 1 << 16), st.integers(0, 64))
def test_arbitrary_bytes_behind_a_valid_magic_decode_or_raise_frame_error(tail, size, count):
    # Past the magic check, where a random buffer rarely gets.
    decodes_or_frame_error(FRAME_MAGIC + struct.pack("<IIQI", size, 0, 1, count) + tail)


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
    frame = bytearray(encode_frame(RECORDS, 7))
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        position = data.draw(st.integers(0, len(frame) - 1), label="position")
        frame[position] ^= data.draw(st.integers(1, 255), label="xor")
    cut = data.draw(st.integers(0, len(frame)), label="cut")
    extra = data.draw(st.binary(max_size=32), label="extra")
    decodes_or_frame_error(bytes(frame[:cut]) + extra)


# -- find_next_valid_frame -----------------------------------------------------------------------


def test_find_next_valid_frame_skips_garbage_and_false_magics():
    first = encode_frame([put("a", 1, 1)], 1)
    second = encode_frame([put("b", 2, 2)], 2)
    garbage = b"\x00junk" + FRAME_MAGIC + b"not a frame" + FRAME_MAGIC[:2]
    data = garbage + first + second
    assert find_next_valid_frame(data, 0) == len(garbage)
    assert find_next_valid_frame(data, len(garbage)) == len(garbage)
    assert find_next_valid_frame(data, len(garbage) + 1) == len(garbage) + len(first)


def test_find_next_valid_frame_passes_over_a_damaged_frame_to_the_valid_one_after_it():
    first = bytearray(encode_frame([put("a", 1, 1)], 1))
    first[-1] ^= 0xFF
    second = encode_frame([put("b", 2, 2)], 2)
    data = bytes(first) + second
    assert find_next_valid_frame(data, 0) == len(first)


def test_find_next_valid_frame_answers_none_when_only_a_torn_frame_follows():
    whole = encode_frame([put("a", 1, 1)], 1)
    torn = encode_frame([put("b", 2, 2)], 2)[:-1]
    assert find_next_valid_frame(whole + torn, 1) is None
    assert find_next_valid_frame(b"", 0) is None
    assert find_next_valid_frame(b"no magic here", 0) is None
