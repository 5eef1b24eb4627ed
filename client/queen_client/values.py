"""What the SDK sends and reads as JSON: documents in, bytes out, and back.

A value Queen stores is anything JSON can say, plus byte strings. JSON has no byte string, so the
SDK sends `bytes` (and `bytearray`, `memoryview`) as the server's lossless form, the object
`{"$bytes": "<standard base64>"}`, and turns that object back into `bytes` in every answer: a
payload pushed as bytes is popped as bytes. (Over CBOR the bytes could travel as they are; JSON
with this form costs the SDK nothing on answers without bytes, which are most.)

A date or a time (`datetime`, `date`, `time`) is refused with a TypeError naming where it is in
the request: JSON has no date, orjson would send a naive string, and a consumer reading the value
back could not tell it from any other string. Send a datetime as milliseconds since the epoch,
a date or a time as a string you format (its error says how).

Pure: no I/O. Raises TypeError (what cannot be sent, and where) and nothing else.
"""

from __future__ import annotations

import base64
import datetime

import orjson

BYTES_KEY = "$bytes"
_BYTES_MARKER = b'"$bytes"'
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1
_BYTES_TYPES = (bytes, bytearray, memoryview)


def _default(value):
    """orjson's fallback for what it does not encode itself (and for dates, passed through to here)."""
    if isinstance(value, _BYTES_TYPES):
        return {BYTES_KEY: base64.b64encode(value).decode()}
    raise TypeError


def encode(document) -> bytes:
    """The JSON body of a request. TypeError, naming the place, for what Queen cannot store."""
    try:
        return orjson.dumps(document, default=_default, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except orjson.JSONEncodeError as error:
        where, why = _first_unsendable(document, "body") or ("body", str(error))
        raise TypeError(f"{where}: {why}") from None


def _date_suggestion(value) -> str:
    """What to send instead of a datetime, a date or a time: each has its own ways (a date and a
    time have no .timestamp())."""
    if isinstance(value, datetime.datetime):  # first: a datetime is a date too
        return ("send milliseconds since the epoch, e.g. int(value.timestamp() * 1000), or a string you format "
                "yourself, e.g. value.isoformat()")
    if isinstance(value, datetime.date):
        return ("send it as a string, e.g. value.isoformat() ('2026-12-01'), or make it a datetime first and send "
                "milliseconds since the epoch")
    return ("send it as a string, e.g. value.isoformat() ('09:30:00'), or as seconds since midnight, e.g. "
            "value.hour * 3600 + value.minute * 60 + value.second")


def _first_unsendable(value, where: str) -> tuple[str, str] | None:
    """(where, why) of the first value in `value` that encode() refuses; only walked once it has."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return where, (f"a {type(value).__name__} has no JSON form in Queen (it would arrive as a string without "
                       f"its type): {_date_suggestion(value)}")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return where, f"keys must be strings, not {type(key).__name__} ({key!r})"
            found = _first_unsendable(item, f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _first_unsendable(item, f"{where}[{index}]")
            if found:
                return found
        return None
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX:
        return where, "integers must be from -2^63 to 2^64-1"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            return where, (f"the str is not text JSON can carry: it holds a lone surrogate ({value[error.start]!r} at "
                           f"index {error.start}), as bytes decoded with errors='surrogateescape' do (input that was "
                           "not UTF-8); decode the input with its real encoding, or send the bytes themselves")
        return None
    try:
        orjson.dumps(value, default=_default, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except orjson.JSONEncodeError:
        return where, f"a value of type {type(value).__name__} has no JSON form: Queen stores what JSON can say, plus bytes"
    return None


def decode(data: bytes):
    """An answer's document, every {"$bytes": base64} as the bytes it stands for."""
    document = orjson.loads(data)
    if _BYTES_MARKER in data:
        document = _with_bytes(document)
    return document


def _with_bytes(value):
    if type(value) is dict:
        if len(value) == 1 and type(value.get(BYTES_KEY)) is str:
            return base64.b64decode(value[BYTES_KEY])
        return {key: _with_bytes(item) for key, item in value.items()}
    if type(value) is list:
        return [_with_bytes(item) for item in value]
    return value
