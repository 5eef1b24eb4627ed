"""Request and response bodies: JSON by default, CBOR when the client asks for it.

Byte strings: kept as they are over CBOR; in JSON they take the form queen/core/values.py
documents. Every other value a CBOR body may hold that JSON could not give back is refused here,
before anything reads the document.
"""

from __future__ import annotations

import cbor2
import orjson

from queen.core.values import check_cbor, decode_json_bytes, json_default, may_hold_bytes
from queen.errors import BadRequest

JSON = b"application/json"
CBOR = b"application/cbor"


def decode_body(body: bytes, content_type: bytes):
    if not body:
        raise BadRequest("invalid_body", "the request needs a body")
    if content_type.startswith(CBOR):
        try:
            document = cbor2.loads(body)
        except Exception:  # noqa: BLE001 - any decoder failure is the client's malformed body
            raise BadRequest("invalid_cbor", "the body is not valid CBOR") from None
        check_cbor(document)
        return document
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest("invalid_json", f"the body is not valid JSON: {error}") from None
    if may_hold_bytes(body):
        document = decode_json_bytes(document)
    return document


def _cbor_default(encoder, value) -> None:
    """A stored value kept as its JSON encoding (an orjson.Fragment: a queue message's payload, a KV
    row's value), opaque to cbor2: decoded here, byte strings restored."""
    if type(value) is not orjson.Fragment:
        raise cbor2.CBOREncodeError(f"cannot encode {type(value).__name__}")
    raw = orjson.dumps(value)
    plain = orjson.loads(raw)
    encoder.encode(decode_json_bytes(plain) if may_hold_bytes(raw) else plain)


def encode_body(document, wants_cbor: bool) -> tuple[bytes, bytes]:
    """(body, content type). A JSON document ends with a newline, so answers printed one after
    another (curl in a shell) do not run together; CBOR is framed by itself."""
    if wants_cbor:
        return cbor2.dumps(document, default=_cbor_default), CBOR
    return orjson.dumps(document, default=json_default, option=orjson.OPT_APPEND_NEWLINE), JSON
