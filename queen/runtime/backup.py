"""Online backups: the whole state at one version V, as a backup file (queen/wal/backup.py).

Taken as the writer takes its own snapshots: every shard's state is copied on the event loop with
no await between the copies and reading V, so all shards are at V (steps are applied whole between
awaits); the copies share the live state's immutable rows and messages, so this copies the tables'
dicts, not the data. The records are then built, encoded and compressed in a worker thread, not
the WAL's disk thread, whose commits must not wait behind a large encode.

The backup is one bytes object, answered with its Content-Length and sent a piece at a time
(queen/http/connection.py), rather than spooled to a temp file or streamed as it is encoded: the
snapshot is one zstd frame that records its content size (queen/wal/snapshot.py reads it in one
call), so the encode holds the records and their CBOR in memory whatever we do, as the writer's
checkpoints do. What stays while the client reads is the compressed copy, a fraction of the state;
a temp file would free that during a slow download, but would write the whole state to disk once
more and leave a file behind in the data directory after a crash.

Handed out only once V is durable: a backup never holds a write a crash could still take back.
Every write acknowledged before the request arrived was durable then, so it is at or below V.
"""

from __future__ import annotations

import trio

from queen.runtime.steps import Call
from queen.wal.backup import RESTORED_FIRST_SEGMENT, encode_backup
from queen.wal.snapshot import encode_snapshot


async def take_backup(state, writer, created_ms: int, server_version: str) -> tuple[int, bytes]:
    """(V, the backup file's bytes). Raises Unavailable (503) if V can never be made durable."""
    sections = state.snapshot_capture()
    version = state.versions.last  # no await since the copies: they are exactly at this version
    durable = Call(0, 0)
    writer.when_durable(version, durable)
    await durable.result()
    # Durable: the writer put a ceiling at or above V on disk first. The restored server hands out
    # versions above it, as any restart does.
    ceiling = writer.ceiling

    def encode() -> bytes:
        snapshot = encode_snapshot(version, ceiling, RESTORED_FIRST_SEGMENT, sections())
        return encode_backup(snapshot, version, created_ms, server_version)

    return version, await trio.to_thread.run_sync(encode)
