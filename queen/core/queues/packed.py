"""The packed layouts of a retained message and of a producer id's dedupe entry: one bytes value
each, in plain dicts keyed by offset and by producer id.

Why bytes: a queue may hold millions of messages, and Python's cyclic GC walks every object it
tracks and every entry of every container it tracks on each full collection: with messages as
objects (or tuples, or payloads as dicts) collections paused the server for 100-400 ms at 600,000
messages. A dict of bytes is never tracked, so it costs the collector nothing however large it
grows. The payload is kept as its JSON encoding and reaches an answer as an orjson.Fragment,
written out as is.

Snapshots store both layouts as they are (records partition_messages and dedupe), so they are
part of the on-disk format: change them only with the format version.

Pure: struct packing only.
"""

from __future__ import annotations

import struct

# A message. head: message_id, created_at_ms, available_at_ms, bytes of the producer id (-1: none,
# then it is queen:<offset>), bytes of the trace id (-1: none); then the two ids (UTF-8), then the
# payload.
_HEAD = struct.Struct("<qqqii")
_CREATED = struct.Struct("<q")
_AVAILABLE_AT = 16
_ID_LENGTHS = struct.Struct("<ii")
_ID_LENGTHS_AT = 24

# A producer id known in a partition: offset, message_id, created_at_ms, until_ms.
DEDUPE_ENTRY = struct.Struct("<qqqq")
# What a dedupe entry is counted as, besides its id, against the storage limit.
DEDUPE_ENTRY_BYTES = 64


def pack_message(message_id: int, tid: str | None, data: bytes, trace_id: str | None, created_at_ms: int,
                 available_at_ms: int) -> bytes:
    tid_raw = b"" if tid is None else tid.encode()
    trace_raw = b"" if trace_id is None else trace_id.encode()
    head = _HEAD.pack(message_id, created_at_ms, available_at_ms, -1 if tid is None else len(tid_raw),
                      -1 if trace_id is None else len(trace_raw))
    return head + tid_raw + trace_raw + data


def unpack_message(packed: bytes) -> tuple:
    """(message_id, transaction_id, data, trace_id, created_at_ms, available_at_ms)"""
    message_id, created_at_ms, available_at_ms, tid_length, trace_length = _HEAD.unpack_from(packed)
    position = _HEAD.size
    tid = trace_id = None
    if tid_length >= 0:
        tid = packed[position:position + tid_length].decode()
        position += tid_length
    if trace_length >= 0:
        trace_id = packed[position:position + trace_length].decode()
        position += trace_length
    return message_id, tid, packed[position:], trace_id, created_at_ms, available_at_ms


def created_at(packed: bytes) -> int:
    return _CREATED.unpack_from(packed, 8)[0]


def available_at(packed: bytes) -> int:
    return _CREATED.unpack_from(packed, _AVAILABLE_AT)[0]


def payload_bytes(packed: bytes) -> int:
    """The payload's size (what the limits count), without unpacking the message."""
    tid_length, trace_length = _ID_LENGTHS.unpack_from(packed, _ID_LENGTHS_AT)
    return len(packed) - _HEAD.size - max(tid_length, 0) - max(trace_length, 0)


def transaction_id_of(packed: bytes) -> str | None:
    tid_length = _ID_LENGTHS.unpack_from(packed, _ID_LENGTHS_AT)[0]
    return None if tid_length < 0 else packed[_HEAD.size:_HEAD.size + tid_length].decode()


def dedupe_cost(tid: str | None) -> int:
    """What keeping a producer id counts against the storage limit."""
    return 0 if tid is None else len(tid) + DEDUPE_ENTRY_BYTES
