"""What every name a client gives may hold: KV namespaces and keys, queues, partitions, consumer
groups, producer transactionIds, lock names and owners, timer keys. One rule, checked here.

- Refused: the C0 controls (U+0000-U+001F), DEL (U+007F), the C1 controls (U+0080-U+009F, NEL
  among them) and the bidirectional embedding, override and isolate characters (U+202A-U+202E,
  U+2066-U+2069). A name is echoed in answers, listings, CLI output and log lines; a NUL, a line
  break or a right-to-left override there lets one client forge what an operator reads.
- Not normalised: a name is its exact UTF-8 bytes (like etcd and Redis keys), so "é" as one code
  point (NFC) and as "e" plus a combining accent (NFD) are two names. Normalising would make two
  byte strings the same name, which a client that compares bytes (a cache, a shard map, a fence
  check) could not know.

Pure: no I/O. Raises BadRequest with the caller's code (invalid_key, invalid_queue,
invalid_name...), the same code a name too long or not a string gets.
"""

from __future__ import annotations

import re

from queen.errors import BadRequest

# A regex search is about ten times cheaper than a loop over the name's characters.
_REFUSED = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
REFUSED_DESCRIPTION = "control characters (C0, DEL, C1) or bidirectional override and isolate characters"


def name(raw, field: str, code: str, bytes_max: int, index=None) -> str:
    """A name: a string of 1 to bytes_max UTF-8 bytes holding none of the refused characters;
    400 `code` otherwise."""
    if type(raw) is str and raw.isprintable():
        # Every refused character is unprintable (Cc or Cf), so a printable name needs no search;
        # isprintable costs half the regex's search on the names of a batch.
        size = len(raw) if raw.isascii() else len(raw.encode())
        if 0 < size <= bytes_max:
            return raw
    return _checked(raw, field, code, bytes_max, index)


def _checked(raw, field: str, code: str, bytes_max: int, index) -> str:
    if raw is None:
        _fail(code, f"{field} is required", index)
    if type(raw) is not str:
        _fail(code, f"{field} must be a string", index)
    size = len(raw) if raw.isascii() else len(raw.encode())
    if not 1 <= size <= bytes_max:
        _fail(code, f"{field} must be 1 to {bytes_max} bytes", index, bytes=size)
    found = _REFUSED.search(raw)
    if found is not None:
        _fail(code, f"{field} must not contain {REFUSED_DESCRIPTION}", index, character=f"U+{ord(found.group()):04X}")
    return raw


def _fail(code: str, message: str, index, **details):
    if index is not None:
        details["index"] = index
    raise BadRequest(code, message, details)
