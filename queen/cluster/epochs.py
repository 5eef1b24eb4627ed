"""A node's two small files about epochs, beside its log in the data directory:

    promised-epoch   the highest epoch this node has accepted: "<epoch>\n". Made durable before
                     the node acks anything of that epoch; from then on it refuses frames of any
                     lower epoch, so a deposed leader can never complete another answer.
    epoch-history    one line per epoch this node's log holds, oldest first:
                     "<epoch> <first_version> <previous_version>\n" (the epoch's EPOCH record: its
                     version, and the last version of the log before it). A rejoining node is
                     told where its log parts from the leader's by comparing it with the leader's.

Each is written whole to a temporary file, fsynced, renamed over the old one and the directory
fsynced (Disk.write_file_atomically), so after a crash it is the old file or the new one. Both are
read once at start. Every function here blocks: run it off the event loop.
"""

from __future__ import annotations

import os

from queen.wal.disk import Disk

PROMISED_EPOCH = "promised-epoch"
EPOCH_HISTORY = "epoch-history"

Entry = tuple[int, int, int]  # (epoch, first_version, previous_version)


class EpochFileError(Exception):
    pass


def read_promised(data_dir: str, disk: Disk) -> int:
    """The promised epoch, 0 when the file is absent (a node that never joined a cluster)."""
    try:
        text = disk.read_file(os.path.join(data_dir, PROMISED_EPOCH)).decode()
    except FileNotFoundError:
        return 0
    try:
        epoch = int(text.strip())
    except ValueError:
        raise EpochFileError(f"{os.path.join(data_dir, PROMISED_EPOCH)}: not an epoch: {text[:40]!r}") from None
    if epoch < 0:
        raise EpochFileError(f"{os.path.join(data_dir, PROMISED_EPOCH)}: a negative epoch")
    return epoch


def write_promised(data_dir: str, disk: Disk, epoch: int) -> None:
    disk.write_file_atomically(os.path.join(data_dir, PROMISED_EPOCH), f"{epoch}\n".encode())


def read_history(data_dir: str, disk: Disk) -> list[Entry]:
    path = os.path.join(data_dir, EPOCH_HISTORY)
    try:
        text = disk.read_file(path).decode()
    except FileNotFoundError:
        return []
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            epoch, first, previous = (int(field) for field in line.split())
        except ValueError:
            raise EpochFileError(f"{path} line {number}: not 'epoch first_version previous_version'") from None
        if entries and (epoch <= entries[-1][0] or first <= entries[-1][1]):
            raise EpochFileError(f"{path} line {number}: epochs and versions must rise")
        entries.append((epoch, first, previous))
    return entries


def write_history(data_dir: str, disk: Disk, entries: list[Entry]) -> None:
    text = "".join(f"{epoch} {first} {previous}\n" for epoch, first, previous in entries)
    disk.write_file_atomically(os.path.join(data_dir, EPOCH_HISTORY), text.encode())


def reconcile(entries: list[Entry], replayed: list[Entry], log_last_version: int) -> list[Entry]:
    """The history that matches the log as recovery found it: the file's entries and the EPOCH
    records replayed (a crash may fall between appending an EPOCH record and writing the file),
    without the entries past the log's end (a crash between cutting the log and the file)."""
    merged = {entry[0]: entry for entry in entries}
    for entry in replayed:
        merged[entry[0]] = entry
    return [merged[epoch] for epoch in sorted(merged) if merged[epoch][1] <= log_last_version]


def last_epoch(entries: list[Entry]) -> int:
    return entries[-1][0] if entries else 0


def end_of_epoch(entries: list[Entry], epoch: int) -> int | None:
    """The last version of `epoch` (or of the log before any later epoch) in the log these
    entries describe: the previous_version of the first later epoch; None when no later one
    exists (the epoch is the log's newest, so it runs to its end)."""
    for entry_epoch, _, previous in entries:
        if entry_epoch > epoch:
            return previous
    return None
