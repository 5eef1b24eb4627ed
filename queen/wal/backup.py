"""Backups: a snapshot (queen/wal/snapshot.py) wrapped with what a file handed around needs, and the
data directory a restore writes from one. The format is pure (bytes in, bytes out); the restore
writes through a Disk like the rest of the log.

    header:  b"QNBK"  u32 BACKUP_FORMAT  u64 version  u64 created_ms  u64 snapshot_bytes
             u16 server_version_bytes  server_version (UTF-8, e.g. "0.1.0")
    body:    a snapshot file, byte for byte as the data directory holds one, taken at `version`
    trailer: sha256 of header and body (32 bytes)

The trailer catches a backup cut short or changed anywhere, header included, before anything is
written; the snapshot's own crc32 is checked again when it is decoded.

A restored directory holds that snapshot and an empty segment, wal-...02.seg, the segment the
snapshot says the log goes on in (RESTORED_FIRST_SEGMENT). Not segment 1, so that a restore cut
short is a log recovery refuses, never an empty server: the segment is written first, and a
directory holding it without the snapshot lacks segment 1 (CorruptLog); the snapshot is renamed
into place last.
"""

from __future__ import annotations

import hashlib
import os
import struct

from queen.wal.disk import Disk
from queen.wal.frame import file_header
from queen.wal.segment import segment_name, snapshot_name
from queen.wal.snapshot import SnapshotError, SnapshotRefused, decode_snapshot

BACKUP_MAGIC = b"QNBK"
BACKUP_FORMAT = 1
BACKUP_HEADER = struct.Struct("<4sIQQQH")
TRAILER_BYTES = 32  # sha256
RESTORED_FIRST_SEGMENT = 2


class BackupDamaged(Exception):
    """Cut short, changed, or not a backup at all."""


class BackupRefused(Exception):
    """A whole backup this build must not read: another backup or log format."""


class Backup:
    __slots__ = ("version", "created_ms", "server_version", "snapshot")

    def __init__(self, version: int, created_ms: int, server_version: str, snapshot: bytes):
        self.version = version
        self.created_ms = created_ms
        self.server_version = server_version
        self.snapshot = snapshot  # the snapshot file's bytes


def encode_backup(snapshot: bytes, version: int, created_ms: int, server_version: str) -> bytes:
    name = server_version.encode()
    head = BACKUP_HEADER.pack(BACKUP_MAGIC, BACKUP_FORMAT, version, created_ms, len(snapshot), len(name)) + name
    digest = hashlib.sha256(head)
    digest.update(snapshot)
    return b"".join((head, snapshot, digest.digest()))


def read_backup(data: bytes) -> Backup:
    """A whole, checked backup: its checksum, its header and its snapshot, decoded all the way (so
    recovery will read it too). Raises BackupDamaged or BackupRefused."""
    if len(data) < BACKUP_HEADER.size + TRAILER_BYTES:
        raise BackupDamaged(f"{len(data)} bytes: shorter than a backup's header and checksum (cut short?)")
    magic, fmt, version, created_ms, snapshot_bytes, name_bytes = BACKUP_HEADER.unpack_from(data, 0)
    if magic != BACKUP_MAGIC:
        raise BackupDamaged("not a Queen backup (bad magic)")
    view = memoryview(data)
    if hashlib.sha256(view[:-TRAILER_BYTES]).digest() != data[-TRAILER_BYTES:]:
        raise BackupDamaged("checksum mismatch: the file was cut short or changed")
    if fmt != BACKUP_FORMAT:
        raise BackupRefused(f"backup format {fmt}, this build reads {BACKUP_FORMAT} (written by a newer build?)")
    start = BACKUP_HEADER.size + name_bytes
    if start + snapshot_bytes + TRAILER_BYTES != len(data):
        raise BackupDamaged("the snapshot's length does not match the header")
    server_version = bytes(view[BACKUP_HEADER.size:start]).decode(errors="replace")
    snapshot = bytes(view[start:start + snapshot_bytes])
    try:
        decoded = decode_snapshot(snapshot)
    except SnapshotRefused as error:
        raise BackupRefused(f"written by Queen {server_version}: {error}") from None
    except SnapshotError as error:
        raise BackupDamaged(f"its snapshot: {error}") from None
    if decoded.version != version or decoded.first_segment != RESTORED_FIRST_SEGMENT:
        raise BackupDamaged(f"its snapshot is at version {decoded.version} (segment {decoded.first_segment}), "
                            f"the header says {version}")
    return Backup(version, created_ms, server_version, snapshot)


def write_restored(data_dir: str, backup: Backup, disk: Disk | None = None) -> list[str]:
    """Write the data directory of a checked backup into data_dir (which exists and is empty), every
    file and the directory fsynced; the paths written. Order matters (module docstring)."""
    disk = disk or Disk()
    segment = os.path.join(data_dir, segment_name(RESTORED_FIRST_SEGMENT))
    fd = disk.create(segment)
    try:
        disk.write(fd, file_header())
        disk.fsync(fd)
    finally:
        disk.close(fd)
    disk.fsync_dir(data_dir)
    snapshot = os.path.join(data_dir, snapshot_name(backup.version))
    disk.write_file_atomically(snapshot, backup.snapshot)
    return [segment, snapshot]
