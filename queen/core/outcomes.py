"""What the core answers besides a result: a refusal its state decided.

A `Refusal` stands in an operation's answer slot when the state refuses the whole call (too many
consumer groups: a 400; the server stopping while a pop was parked: a 503). Nothing of that
operation was applied. The runtime raises its error for the call; an HTTP client sees the error
envelope. It is a type, not a marker key in an answer dict, so no answer can be mistaken for one.

Pure: no I/O.
"""

from __future__ import annotations

from queen.errors import QueenError


class Refusal:
    __slots__ = ("error",)

    def __init__(self, error: QueenError):
        self.error = error

    def __repr__(self) -> str:
        return f"Refusal({self.error.code!r})"
