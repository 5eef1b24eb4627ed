"""Every kind of record the write-ahead log and the snapshots hold: one table, one encoder per kind,
one decoder for all. Nothing else in the code knows where a field sits.

A record is an effect, never a request: what changed, so replay reaches the same state whatever the
clock says then. On disk a frame's (or a snapshot section's) records are one flat CBOR array, each
record its kind number followed by its fields in the order below. Flat, because the CBOR encoder
spends about as much on opening a nested array as on three of its items (bench/README.md, "WAL
encoding"), and a frame holds hundreds of records.

| kind | name      | fields (in order)                                                                  | takes a version |
| ---- | --------- | ---------------------------------------------------------------------------------- | --------------- |
| 1    | put       | ns, key, value, version, create_version, created_at_ms, updated_at_ms, expires_at_ms | version         |
| 2    | delete    | ns, key, version                                                                   | version         |
| 3    | ceiling   | version_max                                                                        | no              |
| 4    | segment_cut | next_segment                                                                     | no              |

- put: the row (ns, key) now holds value at version; expires_at_ms 0 = forever. Lock permits are
  rows of the namespace `queen-locks` (their value is the owner).
- delete: the row (ns, key) is gone; the delete takes a version so the counter survives in the log.
- ceiling: no version up to version_max may be handed out again after a restart. The writer puts
  one on disk before any frame whose versions come near the last one, so a restart can always
  begin above every version an answer ever showed, even if recovery had to cut the frame that
  held it.
- segment_cut: the last record of a segment that was closed; the next one exists and is
  next_segment. A newest segment that went missing is noticed through it.

Versions are global, dense and rising: every versioned record takes the next one, in log order.
Kinds 16 and up are kept for queues and timers. A kind this build does not know is refused as
"written by a newer build": guessing at it could only lose data.

Pure: no I/O. Encoders append to a flat list (the frame's); `decode` turns a flat list back into
typed records and checks every field's type, raising RecordError for anything else.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

INT64_MAX = (1 << 63) - 1


class Kind(enum.IntEnum):
    PUT = 1
    DELETE = 2
    CEILING = 3
    SEGMENT_CUT = 4


class RecordError(Exception):
    pass


class UnknownKind(RecordError):
    """A record kind this build does not know: written by a newer build."""


class Put(NamedTuple):
    ns: str
    key: str
    value: object
    version: int
    create_version: int
    created_at_ms: int
    updated_at_ms: int
    expires_at_ms: int


class Delete(NamedTuple):
    ns: str
    key: str
    version: int


class Ceiling(NamedTuple):
    version_max: int


class SegmentCut(NamedTuple):
    next_segment: int


Record = Put | Delete | Ceiling | SegmentCut

_PUT, _DELETE, _CEILING, _SEGMENT_CUT = int(Kind.PUT), int(Kind.DELETE), int(Kind.CEILING), int(Kind.SEGMENT_CUT)


# -- encoders: append one record to a flat list ---------------------------------------------------

def put(out: list, ns: str, key: str, value, version: int, create_version: int, created_at_ms: int,
        updated_at_ms: int, expires_at_ms: int) -> None:
    out += (_PUT, ns, key, value, version, create_version, created_at_ms, updated_at_ms, expires_at_ms)


def delete(out: list, ns: str, key: str, version: int) -> None:
    out += (_DELETE, ns, key, version)


def ceiling(out: list, version_max: int) -> None:
    out += (_CEILING, version_max)


def segment_cut(out: list, next_segment: int) -> None:
    out += (_SEGMENT_CUT, next_segment)


def encode(out: list, record: Record) -> None:
    """Append a typed record (as `decode` gives them) to a flat list."""
    out.append(_KIND_OF[type(record)])
    out += record


_KIND_OF = {Put: _PUT, Delete: _DELETE, Ceiling: _CEILING, SegmentCut: _SEGMENT_CUT}


# -- decoding ---------------------------------------------------------------------------------------

def _version(raw) -> bool:
    return type(raw) is int and 0 < raw <= INT64_MAX


def _time(raw) -> bool:
    return type(raw) is int and 0 <= raw <= INT64_MAX


def _check_put(f) -> bool:
    return (type(f[0]) is str and type(f[1]) is str and _version(f[3]) and _version(f[4]) and f[4] <= f[3]
            and _time(f[5]) and _time(f[6]) and _time(f[7]))


def _check_delete(f) -> bool:
    return type(f[0]) is str and type(f[1]) is str and _version(f[2])


# kind -> (record type, field count, field check)
_SCHEMA = {
    _PUT: (Put, 8, _check_put),
    _DELETE: (Delete, 3, _check_delete),
    _CEILING: (Ceiling, 1, lambda f: _version(f[0])),
    _SEGMENT_CUT: (SegmentCut, 1, lambda f: type(f[0]) is int and 1 <= f[0] <= INT64_MAX),
}


def decode(flat) -> list[Record]:
    """The typed records of a flat list; RecordError if it is not a whole sequence of known,
    well-formed records."""
    if type(flat) is not list:
        raise RecordError("records must be an array")
    records = []
    position, end = 0, len(flat)
    new = tuple.__new__
    while position < end:
        kind = flat[position]
        spec = _SCHEMA.get(kind) if type(kind) is int else None
        if spec is None:
            raise UnknownKind(f"record kind {kind!r} at item {position} is unknown: written by a newer build of "
                              "Queen? This build will not guess at it")
        cls, count, check = spec
        fields = flat[position + 1:position + 1 + count]
        if len(fields) != count or not check(fields):
            raise RecordError(f"malformed {Kind(kind).name.lower()} record at item {position}")
        records.append(new(cls, fields))
        position += 1 + count
    return records


def version_of(record: Record) -> int:
    """The version a record took, or 0 for the kinds that take none."""
    kind = type(record)
    if kind is Put or kind is Delete:
        return record.version
    return 0


def versions_of(records: list[Record]) -> tuple[int, int]:
    """(first, last) version taken by a list of records; (0, 0) when none takes one. RecordError if
    they do not rise."""
    first = last = 0
    for record in records:
        version = version_of(record)
        if not version:
            continue
        if version <= last:
            raise RecordError(f"versions do not rise: {version} after {last}")
        if not first:
            first = version
        last = version
    return first, last
