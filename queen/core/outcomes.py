"""What the core answers besides a result: a refusal its state decided, and the reasons a normal
miss carries (`StrEnum`s, one per area: the wire string is the value).

A `Refusal` stands in an operation's answer slot when the state refuses the whole call (too many
consumer groups: a 400; the server stopping while a pop was parked: a 503). Nothing of that
operation was applied. The runtime raises its error for the call; an HTTP client sees the error
envelope. It is a type, not a marker key in an answer dict, so no answer can be mistaken for one.

Pure: no I/O.
"""

from __future__ import annotations

from enum import StrEnum

from queen.errors import QueenError


class Refusal:
    __slots__ = ("error",)

    def __init__(self, error: QueenError):
        self.error = error

    def __repr__(self) -> str:
        return f"Refusal({self.error.code!r})"


class KvReason(StrEnum):
    """Why a KV write or check did not apply."""

    VERSION = "version"  # the key's version is not the expected one
    EXISTS = "exists"  # putIfAbsent (or expect 0) on a key that exists
    ABSENT = "absent"  # the key does not exist
    LIMIT = "limit"  # incr past its max or min
    NOT_INTEGER = "not_integer"  # incr on a value that is not an integer


class LockReason(StrEnum):
    HELD = "held"  # every permit has a live holder
    TIMEOUT = "timeout"  # waitMs ran out (or the server needed the connection)
    LOST = "lost"  # the token is no longer the permit's: it expired or changed hands
    ABSENT = "absent"  # nothing held to release
    CANCELLED = "cancelled"  # the waiting client hung up


class QueueReason(StrEnum):
    EMPTY = "empty"  # nothing to deliver now
    LEASE_HELD = "lease_held"  # the partition is leased to another consumer of the group
    LEASE_LOST = "lease_lost"  # the lease named is not live (or never was, or is of another group)
    NOT_DELIVERED = "not_delivered"  # the lease named did not deliver that message
    STORAGE_FULL = "storage_full"
    QUEUE_FULL = "queue_full"  # the queue holds maxSize messages
    PARTITION_LIMIT = "partition_limit"
    TIMEOUT = "timeout"  # a parked pop's wait ran out
    CANCELLED = "cancelled"  # a parked pop's client hung up
    ABSENT = "absent"  # no such queue, group or DLQ entry


class TxnReason(StrEnum):
    KV_PRECONDITION = "kv_precondition"  # a kv section's check, expect or bound missed


class MessageState(StrEnum):
    """Where a message stands for a group, as a transaction's miss reports it."""

    PENDING = "pending"
    IN_FLIGHT = "inFlight"
    COMPLETED = "completed"
    DLQ = "dlq"
    UNKNOWN = "unknown"  # no such partition or offset
