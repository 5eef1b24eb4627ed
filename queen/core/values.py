"""What a stored value may be, and how a byte string looks to a JSON client.

A value is anything JSON can say (null, true/false, numbers, strings, arrays, objects with string
keys) plus byte strings. Over CBOR, byte strings go in and come back as they are. JSON has no byte
string, so JSON answers show one as the object `{"$bytes": "<standard base64>"}`, and a JSON request
may send that object to mean the bytes. To keep that lossless, an object whose only key is
"$bytes" always means a byte string: over JSON its value must be base64, and over CBOR such an
object is refused (send a byte string instead).

Refused over CBOR, since a JSON reader could not get them back as they were sent: tags (dates,
UUIDs, decimals, bignums...), integers outside -2^63..2^64-1, NaN and infinities, undefined and
other simple values, and maps with keys that are not strings.

Pure: raises BadRequest (invalid_value, naming where in the body) and nothing else.
"""

from __future__ import annotations

import base64
import binascii
import math

from queen.errors import BadRequest

BYTES_KEY = "$bytes"
_JSON_MARKER = b'"$bytes"'
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1
_DEPTH_MAX = 128


def json_default(value):
    """orjson's fallback for what it cannot encode itself: byte strings, in their JSON form."""
    if type(value) is bytes:
        return {BYTES_KEY: base64.b64encode(value).decode()}
    raise TypeError(f"{type(value).__name__} is not a value Queen stores")


def may_hold_bytes(body: bytes) -> bool:
    """Whether a JSON body could hold the byte-string form at all (a cheap test on the raw bytes,
    so plain bodies skip the walk)."""
    return _JSON_MARKER in body


def decode_json_bytes(document):
    """document with every {"$bytes": base64} replaced by its bytes."""
    return _from_json(document, "body", 0)


def _from_json(value, where: str, depth: int):
    kind = type(value)
    if kind is dict:
        if len(value) == 1 and BYTES_KEY in value:
            text = value[BYTES_KEY]
            try:
                if type(text) is not str:
                    raise ValueError
                return base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise BadRequest("invalid_value", f'{where}: {{"$bytes": ...}} must hold standard base64 text',
                                 {"at": where}) from None
        if depth >= _DEPTH_MAX:
            raise BadRequest("invalid_value", f"{where}: nested deeper than {_DEPTH_MAX}", {"at": where})
        return {k: _from_json(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if kind is list:
        if depth >= _DEPTH_MAX:
            raise BadRequest("invalid_value", f"{where}: nested deeper than {_DEPTH_MAX}", {"at": where})
        return [_from_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    return value


def check_cbor(document) -> None:
    """Refuse what a CBOR body holds that a JSON reader could not get back as it was sent."""
    _check(document, "body", 0)


def _check(value, where: str, depth: int) -> None:
    kind = type(value)
    if kind is str or kind is bytes or kind is bool or value is None:
        return
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise BadRequest("invalid_value", f"{where}: integers must be from -2^63 to 2^64-1", {"at": where})
        return
    if kind is float:
        if not math.isfinite(value):
            raise BadRequest("invalid_value", f"{where}: NaN and infinities have no JSON form", {"at": where})
        return
    if depth >= _DEPTH_MAX:
        raise BadRequest("invalid_value", f"{where}: nested deeper than {_DEPTH_MAX}", {"at": where})
    if kind is list:
        for i, item in enumerate(value):
            _check(item, f"{where}[{i}]", depth + 1)
        return
    if kind is dict:
        if len(value) == 1 and BYTES_KEY in value:
            raise BadRequest("invalid_value", f'{where}: an object whose only key is "$bytes" is how JSON shows a '
                             "byte string; over CBOR send the byte string itself", {"at": where})
        for key, item in value.items():
            if type(key) is not str:
                raise BadRequest("invalid_value", f"{where}: map keys must be strings", {"at": where})
            _check(item, f"{where}.{key}", depth + 1)
        return
    raise BadRequest("invalid_value", f"{where}: a CBOR {kind.__name__} has no JSON form; Queen stores only what JSON "
                     "can say, plus byte strings", {"at": where, "type": kind.__name__})
