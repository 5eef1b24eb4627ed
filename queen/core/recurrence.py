"""The schedules of recurring timers: a 5-field cron expression read in an IANA time zone, or a
fixed period in ms; the next period after a moment; the packed form a pending recurring timer
keeps; and the transactionId that names a period's message.

Cron expressions are cronsim's (Debian cron's syntax and its DST rules, see the README's Timers
section): a daily job whose local time does not exist on a spring-forward day runs at the first
valid minute after the gap, and one whose local time happens twice on a fall-back day runs once,
at the first; a job whose minute or hour field starts with `*` runs by real elapsed time, so both
passes of a repeated hour count. Time zones are the standard library's zoneinfo, with the tzdata
package as its fallback database where the system has none.

Pure: no clock (every moment is passed in). A zone's rules are read from the time zone database
the first time the process uses it, and kept.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

EVERY_MS_MIN = 1_000  # a period shorter than a second is a busy loop, not a schedule
EVERY_MS_MAX = 365 * 86_400_000  # the timer horizon: a re-arm never sets a timer further ahead than a schedule may
CRON_BYTES_MAX = 256
TIMEZONE_BYTES_MAX = 64  # the longest IANA name is 32 bytes
# A period's message takes the transactionId "<stem>@<period ms>": "@" and up to 19 digits (INT64_MAX).
PERIOD_SUFFIX_BYTES = 20

# every_ms (0 for a cron schedule), the byte length of the time zone's name; then the name and the
# cron expression (UTF-8; both empty for a period). Snapshots store it as it is (pending_schedules):
# change it only with the format version.
_HEAD = struct.Struct(">qH")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Zones are immutable rules: each is read from the database once per process, however many fires
# use it (zoneinfo's own cache keeps only the last few strongly).
_ZONES: dict[str, ZoneInfo] = {}


def zone(name: str) -> ZoneInfo | None:
    """The IANA time zone `name`, or None when the database has no such zone. Not "localtime" (the
    host's own zone, which differs from machine to machine) nor the system's right/ copies (clocks
    that count leap seconds, which Unix time does not)."""
    found = _ZONES.get(name)
    if found is None:
        if name == "localtime" or name.startswith(("right/", "posix/")):
            return None
        try:
            found = _ZONES[name] = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # ValueError: not a zone key at all ("../x")
            return None
    return found


def cron_problem(expression: str) -> str | None:
    """What is wrong with a cron expression ("Bad minute", ...), or None."""
    if len(expression.split()) != 5:
        return "must have 5 fields: minute hour day-of-month month day-of-week"
    try:
        CronSim(expression, _EPOCH)
    except CronSimError as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - a parse cronsim did not foresee is still the caller's 400
        return f"cannot be read: {error!r}"
    return None


def next_cron_ms(expression: str, timezone_name: str, after_ms: int) -> int | None:
    """The first time strictly after after_ms (ms since the epoch) that the cron expression names
    in the zone; None when there is none in the next 50 years (or the zone is gone)."""
    tz = zone(timezone_name)
    if tz is None:
        return None
    try:
        moments = CronSim(expression, (_EPOCH + timedelta(milliseconds=after_ms)).astimezone(tz))
        # cronsim reads a job at a fixed local time in local wall time: started in the second pass
        # of a repeated hour, it names the first pass of that hour, already behind us. Skipping it
        # is the "repeated hour runs once" rule.
        for _ in range(4):
            at_ms = int(next(moments).timestamp()) * 1000
            if at_ms > after_ms:
                return at_ms
    except Exception:  # noqa: BLE001 - StopIteration, or anything else: a fire's tick must not fail on it
        pass
    return None


def next_every_ms(due_ms: int, every_ms: int, after_ms: int) -> int:
    """The first period of a timer due at due_ms with period every_ms strictly after after_ms: the
    periods keep the phase of the first one, whatever the fires' lateness."""
    if after_ms < due_ms:
        return due_ms
    return due_ms + ((after_ms - due_ms) // every_ms + 1) * every_ms


def pack_schedule(every_ms: int, cron: str | None, timezone_name: str | None) -> bytes:
    name = (timezone_name or "").encode()
    return _HEAD.pack(every_ms, len(name)) + name + (cron or "").encode()


def unpack_schedule(packed: bytes) -> tuple[int, str | None, str | None]:
    """(every_ms, cron, timezone): every_ms 0 for a cron schedule, cron and timezone None for a
    period."""
    every_ms, name_length = _HEAD.unpack_from(packed)
    if every_ms:
        return every_ms, None, None
    start = _HEAD.size + name_length
    return 0, packed[start:].decode(), packed[_HEAD.size:start].decode()


def next_period_ms(packed: bytes, due_ms: int, now_ms: int) -> int | None:
    """The period after a fire at now_ms of a recurring timer that was due at due_ms: the first
    after now, so a fire that covers missed periods is followed by the next one, not a burst."""
    every_ms, cron, timezone_name = unpack_schedule(packed)
    if every_ms:
        return next_every_ms(due_ms, every_ms, now_ms)
    return next_cron_ms(cron, timezone_name, now_ms)


def schedule_fields(packed: bytes) -> dict:
    """A schedule as answers show it: {"everyMs"} or {"cron", "timezone"}."""
    every_ms, cron, timezone_name = unpack_schedule(packed)
    return {"everyMs": every_ms} if every_ms else {"cron": cron, "timezone": timezone_name}


def period_id(stem: str, period_ms: int) -> str:
    """The transactionId of a recurring timer's message for the period due at period_ms: the
    partition's producer ids make a second message for the same period a duplicate."""
    return f"{stem}@{period_ms}"
