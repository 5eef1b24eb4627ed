"""The only place that reads, writes, fsyncs, renames and deletes the server's log and snapshot files.

`Disk` is the seam for fault injection: queen/testing.py has a Disk whose write or fsync fails on
demand (FaultyDisk) and one that keeps unsynced bytes and directory entries apart and forgets them
on a simulated crash (ForgetfulDisk), so tests can check that nothing is acknowledged that was not
made durable. Every method blocks; the WAL writer calls them from its disk thread, or on the event
loop while fsyncs are fast (queen/wal/writer.py says why).

Composite operations (write_file_atomically) are written here in terms of the primitives, so a
test disk sees, and can crash at, each of their steps.
"""

from __future__ import annotations

import os


class Disk:
    # -- reading ------------------------------------------------------------------------------------

    def list_dir(self, path: str) -> list[str]:
        return os.listdir(path)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    # -- writing --------------------------------------------------------------------------------------

    def open_append(self, path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def create(self, path: str) -> int:
        """A new, empty file open for writing (an existing one is emptied)."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def allocate(self, fd: int, size: int) -> None:
        """Reserve size bytes for a file about to be written from its start, best effort. Writes
        into space reserved ahead then leave the file's size alone, so an fdatasync after each one
        flushes the data without a metadata update (bench/README.md, "Durability path")."""
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            pass  # a file system without it (tmpfs on old kernels, some network file systems)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def fsync(self, fd: int) -> None:
        # fdatasync: the data and the size, which is all a reader of an appended file needs.
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (files created, renamed or removed in it) durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def remove(self, path: str) -> None:
        os.remove(path)

    def truncate(self, path: str, size: int) -> None:
        """Cut a file to size, durably."""
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- composites -----------------------------------------------------------------------------------

    def write_file_atomically(self, path: str, data: bytes) -> None:
        """tmp file, fsync, rename, directory fsync: after a crash the file is either whole or absent."""
        tmp = path + ".tmp"
        fd = self.create(tmp)
        try:
            self.write(fd, data)
            self.fsync(fd)
        finally:
            self.close(fd)
        self.rename(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")


class DryDisk(Disk):
    """Reads the real files; every change is noted in `changes` instead of made: what recovery
    would do to a data directory, found without touching it (`queen check`)."""

    def __init__(self):
        self.changes: list[tuple[str, str]] = []  # (what, path)

    def fsync_dir(self, path: str) -> None:
        pass

    def rename(self, source: str, target: str) -> None:
        self.changes.append(("rename", f"{source} -> {target}"))

    def remove(self, path: str) -> None:
        self.changes.append(("remove", path))

    def truncate(self, path: str, size: int) -> None:
        self.changes.append(("truncate", f"{path} at {size}"))

    def write_file_atomically(self, path: str, data: bytes) -> None:
        self.changes.append(("write", f"{path} ({len(data)} bytes)"))
