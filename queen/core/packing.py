"""Arrays of fixed-size integers as little-endian bytes, built and read by C loops: how snapshots
carry a million offsets or lengths without a Python step per item."""

from __future__ import annotations

import sys
from array import array


def int_array(code: str, values) -> bytes:
    """values as a little-endian array ('q': int64, 'I': uint32)."""
    packed = array(code, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def read_int_array(code: str, raw: bytes) -> array:
    values = array(code)
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values
