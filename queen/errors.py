"""The one exception family for operating errors.

A QueenError is raised before any state changes and mapped to HTTP in exactly one place
(queen/http/responses.py). Normal outcomes (a held lock, a missed expect) are results, never
exceptions.
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
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class BadRequest(QueenError):
    http_status = 400


class Unavailable(QueenError):
    """The server cannot make things durable (failed disk) or is shutting down: 503."""

    http_status = 503


class CorruptLog(Exception):
    """Recovery found damage it must not paper over (not a client error: the server refuses to start)."""
