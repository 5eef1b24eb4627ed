"""Power loss for a real server process: a Disk that journals what each fsync made durable, and
`lose_power`, which cuts the data directory back to that after the process was killed.

SIGKILL alone loses nothing the process wrote (the kernel keeps its page cache), so it cannot show
that the server waited for its fsyncs. Here the server process runs on a `JournalingDisk`, which
does every real disk operation and also appends to a journal file (outside the data directory,
with plain writes, which survive the SIGKILL) what became durable:

    S <path> <size>    an fsync of the file: its bytes up to size are durable
    C <path>           the file was created or emptied: nothing of it is durable yet
    R <source> <dest>  a rename: the durable bytes follow the file to its new name
    D <dir> <names>    a directory fsync: these entries are durable (JSON list)

After the kill, `lose_power` applies the most adversarial outcome POSIX allows: every file whose
directory entry was never made durable disappears, and every file keeps only its bytes up to its
last fsync (the rest become zeros, which recovery reads as the end of the log, as after a
preallocated tail). Entries removed since the last directory fsync stay removed (one of the two
outcomes a crash may leave). Torn writes inside a frame are the in-process ForgetfulDisk's job
(queen/testing.py); this is the process-level check that acknowledgements wait for durability.
"""

from __future__ import annotations

import json
import os
import time

from queen.wal.disk import Disk

# Files of the data directory that are not the server's log: left alone by lose_power.
NOT_LOGGED = {"LOCK"}
LATE_FSYNC_S = 1.0  # the late_fsync control: how long an fsync's bytes stay not durable


class JournalingDisk(Disk):
    def __init__(self, journal_path: str, data_dir: str, *, skip_dir_fsync: bool = False, late_fsync: bool = False):
        """skip_dir_fsync and late_fsync are negative controls (deliberate bugs): a directory fsync
        that does nothing, and an fsync that makes the file durable only LATE_FSYNC_S later (at the
        first fsync after that), so the writer answers before its data is on disk. A second, not
        one call: the server also fsyncs when no client waits (ticks, snapshots), and one such
        call after the last answered write, in a workload slowed by a busy machine, made the
        control miss."""
        self._journal = os.open(journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._paths: dict[int, str] = {}
        self._late: list[tuple[float, int, int]] = []  # (asked at, fd, size) fsyncs asked for, not yet done
        self.skip_dir_fsync = skip_dir_fsync
        self.late_fsync = late_fsync
        # What a previous lose_power left (or a first start) counts as durable.
        os.makedirs(data_dir, exist_ok=True)
        names = sorted(os.listdir(data_dir))
        for name in names:
            path = os.path.join(data_dir, name)
            if os.path.isfile(path):
                self._log("S", path, os.path.getsize(path))
        self._log("D", data_dir, json.dumps(names))

    def _log(self, *fields) -> None:
        os.write(self._journal, (" ".join(str(field) for field in fields) + "\n").encode())

    def open_append(self, path: str) -> int:
        fd = super().open_append(path)
        self._paths[fd] = path
        return fd

    def create(self, path: str) -> int:
        fd = super().create(path)
        self._paths[fd] = path
        self._log("C", path)
        return fd

    def fsync(self, fd: int) -> None:
        if self.late_fsync:
            # Claim durable only what calls a second ago covered; this call's bytes wait.
            now = time.monotonic()
            due = [entry for entry in self._late if now - entry[0] >= LATE_FSYNC_S]
            self._late = [entry for entry in self._late if now - entry[0] < LATE_FSYNC_S]
            for _, late_fd, size in due:
                self._sync(late_fd, size)
            self._late.append((now, fd, os.lseek(fd, 0, os.SEEK_CUR)))
            return
        self._sync(fd, os.lseek(fd, 0, os.SEEK_CUR))

    def _sync(self, fd: int, size: int) -> None:
        super().fsync(fd)
        self._log("S", self._paths[fd], size)

    def close(self, fd: int) -> None:
        for _, late_fd, size in [entry for entry in self._late if entry[1] == fd]:
            self._sync(late_fd, size)
        self._late = [entry for entry in self._late if entry[1] != fd]
        self._paths.pop(fd, None)
        super().close(fd)

    def fsync_dir(self, path: str) -> None:
        if self.skip_dir_fsync:
            return
        super().fsync_dir(path)
        self._log("D", path, json.dumps(sorted(os.listdir(path))))

    def rename(self, source: str, target: str) -> None:
        super().rename(source, target)
        self._log("R", source, target)

    def truncate(self, path: str, size: int) -> None:
        super().truncate(path, size)
        self._log("S", path, size)


def lose_power(data_dir: str, journal_path: str) -> dict:
    """Cut data_dir back to what the journal says was durable (the server must be dead), then
    remove the journal. Returns what was undone: files dropped, files cut back."""
    durable: dict[str, int] = {}
    entries: set[str] | None = None
    data_dir = os.path.normpath(data_dir)
    with open(journal_path) as journal:
        for line in journal:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "S":
                path, _, size = rest.rpartition(" ")
                durable[path] = int(size)
            elif kind == "C":
                durable[rest] = 0
            elif kind == "R":
                source, target = rest.split(" ")
                if source in durable:
                    durable[target] = durable.pop(source)
            elif kind == "D":
                path, _, names = rest.partition(" ")
                if os.path.normpath(path) == data_dir:
                    entries = set(json.loads(names))
    undone = {"files_dropped": 0, "files_cut": 0}
    for name in sorted(os.listdir(data_dir)):
        if name in NOT_LOGGED:
            continue
        path = os.path.join(data_dir, name)
        if entries is not None and name not in entries:
            os.remove(path)
            undone["files_dropped"] += 1
            continue
        keep = durable.get(path, 0)
        size = os.path.getsize(path)
        if size > keep:
            with open(path, "r+b") as f:
                # Zeros from the durable end on, the file's size unchanged: an allocated segment's tail.
                f.truncate(keep)
                f.truncate(size)
            undone["files_cut"] += 1
    os.remove(journal_path)
    return undone
