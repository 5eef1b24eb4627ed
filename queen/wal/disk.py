"""The only place that writes, fsyncs, renames and deletes the server's files.

`Disk` is the seam for fault injection: tests pass a subclass whose write or fsync fails
(queen/testing.py FaultyDisk) and check that nothing is acknowledged that was not made durable.
Every method here blocks; callers run them through trio.to_thread, never on the event loop.
"""

from __future__ import annotations

import os


class Disk:
    def open_append(self, path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

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
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_file_atomically(self, path: str, data: bytes) -> None:
        """tmp file, fsync, rename, directory fsync: the file is either whole or absent."""
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.write(fd, data)
            self.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")

    def remove(self, path: str) -> None:
        os.remove(path)

    def truncate(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
