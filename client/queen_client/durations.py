"""Durations as people write them: "30s", "1m30s", "7d", "250ms", a `timedelta`, or seconds as a
number. Pure: no clock, no I/O.

The wire wants whole seconds for lifetimes (`ttlSeconds`), so a lifetime is rounded up: a caller
who asked for 1.5 s gets 2 s, never less than asked.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def seconds(value, what: str = "duration") -> float:
    """A duration in seconds (float, >= 0)."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, bool):
        raise TypeError(f"{what} must be a duration such as '30s', a timedelta or seconds, not a bool")
    elif isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            result = float(text)
        else:
            position, result = 0, 0.0
            for match in _PART.finditer(text):
                if match.start() != position:
                    break
                result += float(match.group(1)) * _UNITS_S[match.group(2)]
                position = match.end()
            if position != len(text) or not text:
                raise ValueError(f"{what} {value!r} is not a duration such as '500ms', '30s', '5m', '2h', '7d' or '1h30m'")
    else:
        raise TypeError(f"{what} must be a duration such as '30s', a timedelta or seconds, not {type(value).__name__}")
    if not math.isfinite(result) or result < 0:
        raise ValueError(f"{what} must be a finite duration of at least 0, not {value!r}")
    return result


def ttl_seconds(value, what: str = "ttl") -> int:
    """A lifetime as the wire's whole seconds, rounded up, at least 1."""
    result = seconds(value, what)
    if result <= 0:
        raise ValueError(f"{what} must be above 0")
    return max(1, math.ceil(result - 1e-9))


def lifetime_fields(ttl, forever: bool) -> dict:
    """The wire fields of a write's lifetime: exactly one of ttl and forever=True."""
    if forever and ttl is not None:
        raise ValueError("give ttl or forever=True, not both")
    if forever:
        return {"forever": True}
    if ttl is None:
        raise ValueError("every write names its lifetime: ttl='30s' (or a timedelta, or seconds) or forever=True")
    return {"ttlSeconds": ttl_seconds(ttl)}
