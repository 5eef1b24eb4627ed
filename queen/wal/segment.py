"""The data directory's files, by name: log segments, snapshots and the quarantine copies of cut
tails; and the block of versions the writer keeps reserved ahead of use, which recovery relies on.
The writer and recovery both read this module, so neither imports the other.

    wal-<seq, 16 digits>.seg                a segment of the log (queen/wal/frame.py: its layout)
    snapshot-<version, 20 digits>.snap      a snapshot (queen/wal/snapshot.py)
    <segment>.cut-<offset>                  a damaged or torn tail recovery cut, kept as it was
"""

from __future__ import annotations

import re

SEGMENT_RE = re.compile(r"^wal-(\d{16})\.seg$")
SNAPSHOT_RE = re.compile(r"^snapshot-(\d{20})\.snap$")
# Versions the writer reserves ahead of use: its ceiling record is renewed to CEILING_BLOCK past the
# last version of a batch whenever a batch comes within half a block of the ceiling. So a restart
# skips at most this many versions, and recovery believes a cut frame's claim at most this far past
# what it replayed.
CEILING_BLOCK = 1 << 16


def segment_name(seq: int) -> str:
    return f"wal-{seq:016d}.seg"


def snapshot_name(version: int) -> str:
    return f"snapshot-{version:020d}.snap"


def quarantine_name(segment: str, offset: int) -> str:
    return f"{segment}.cut-{offset}"


def list_dir(names: list[str]) -> tuple[dict[int, str], dict[int, str]]:
    """The segments (by sequence number) and snapshots (by version) among a directory's names."""
    segments, snapshots = {}, {}
    for name in names:
        if match := SEGMENT_RE.match(name):
            segments[int(match.group(1))] = name
        elif match := SNAPSHOT_RE.match(name):
            snapshots[int(match.group(1))] = name
    return segments, snapshots
