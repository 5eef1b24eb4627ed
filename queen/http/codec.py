"""Request and response bodies: JSON by default, CBOR when the client asks for it (DESIGN.md §2)."""

from __future__ import annotations

import cbor2
import orjson

from queen.errors import BadRequest

JSON = b"application/json"
CBOR = b"application/cbor"


def decode_body(body: bytes, content_type: bytes):
    if not body:
        raise BadRequest("invalid_body", "the request needs a body")
    if content_type.startswith(CBOR):
        try:
            return cbor2.loads(body)
        except Exception:  # noqa: BLE001 - any decoder failure is the client's malformed body
            raise BadRequest("invalid_cbor", "the body is not valid CBOR") from None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest("invalid_json", f"the body is not valid JSON: {error}") from None


def encode_body(document, wants_cbor: bool) -> tuple[bytes, bytes]:
    """(body, content type)."""
    if wants_cbor:
        return cbor2.dumps(document), CBOR
    return orjson.dumps(document), JSON
