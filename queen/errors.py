"""The one exception family for operating errors, and the refusals that stop a start.

A QueenError is raised before any state changes and mapped to HTTP in exactly one place
(queen/http/wire.py, error_response). Normal outcomes (a held lock, a missed expect) are
results, never exceptions. Error codes are snake_case, always.
"""

from __future__ import annotations


class QueenError(Exception):
    http_status = 400

    def __init__(self, code: str, message: str, details: dict | None = None, http_status: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        if http_status is not None:
            self.http_status = http_status

    def to_wire(self) -> dict:
        """The refusal's body: `error` the human-readable message, `code` beside it, `details` an
        object, and `detail` the message again. A plain string `error` is what clients show as
        they are (the public JavaScript client builds `new Error(body.error)`); the public Python
        client reads `detail` and `code`."""
        return {"error": self.message, "code": self.code, "details": wire_safe(self.details), "detail": self.message}


class BadRequest(QueenError):
    http_status = 400


class Unavailable(QueenError):
    """The server cannot make things durable (failed disk) or is shutting down: 503."""

    http_status = 503


def wire_safe(value, depth: int = 0):
    """A copy of value that any wire format can carry: details often echo what the client sent, and
    what a client sends (a CBOR byte string, a bignum, a tag) must never make our answer itself
    unencodable. Strings and containers are kept short, anything else becomes its repr."""
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return value
    if kind is int:
        return value if -(1 << 63) <= value < (1 << 64) else f"<integer of {value.bit_length()} bits>"
    if kind is str:
        return value[:256]
    if depth < 4 and kind is dict:
        return {str(k)[:128]: wire_safe(v, depth + 1) for k, v in list(value.items())[:32]}
    if depth < 4 and kind in (list, tuple):
        return [wire_safe(v, depth + 1) for v in value[:32]]
    try:
        return repr(value)[:128]
    except Exception:  # noqa: BLE001 - a repr that fails still must not fail the answer
        return f"<{kind.__name__}>"


class RefusedToStart(Exception):
    """What is in the data directory must not be served by this build as it is; the message says
    what and what to do. Not a client error: the server does not start."""


class CorruptLog(RefusedToStart):
    """Recovery found damage it must not paper over: starting would drop acknowledged writes."""


class UnreadableFormat(RefusedToStart):
    """The data directory was written by another format version of Queen."""


class VersionsExhausted(RefusedToStart):
    """The log holds versions past VERSION_MAX (queen/core/kv.py), which this build never hands out
    nor serves: JSON clients would read such ids inexactly."""
