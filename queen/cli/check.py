"""`queen check --data-dir DIR`: what recovery would find in a data directory, without starting a
server and without changing a byte (refused while a server runs on it: its log would move on while
this reads). Exit status: 0 clean; 1 a torn tail or leftovers recovery would tidy
(never acknowledged: nothing lost); 3 damaged (a frame that may have been acknowledged would be
cut and quarantined); 4 recovery would refuse to start (a corrupt log, another format, versions
exhausted); 2 usage or in use.

`queen check --backup FILE` checks a backup file (`queen backup`) instead: 0 whole, 3 damaged (cut
short, changed), 4 another format, 2 unreadable."""

from __future__ import annotations

import fcntl
import logging
import os
import sys

EXIT_CLEAN, EXIT_TIDIED, EXIT_USAGE, EXIT_DAMAGED, EXIT_REFUSED = 0, 1, 2, 3, 4


def server_dependencies_missing(command: str, missing: ModuleNotFoundError) -> int:
    """One line instead of a traceback when a server command runs where only part of Queen is
    installed (the package without its dependencies, e.g. `pip install --no-deps`): exit 2."""
    if (missing.name or "").partition(".")[0] in ("queen", "queen_client"):
        raise missing  # a module of our own is gone: a broken install, not a missing dependency
    print(f"queen {command}: the server's dependencies are not installed (no module {missing.name!r}); install "
          "the server distribution with them, from a checkout of Queen: pip install ./client .", file=sys.stderr)
    return 2


def add_parser(commands) -> None:
    check = commands.add_parser(
        "check", help="verify a data directory offline, as recovery would, changing nothing",
        description="Read a data directory as recovery would, without starting a server and without changing a "
                    "byte; refused while a server runs on it. Exit status: 0 clean, 1 a torn tail or leftovers "
                    "recovery would tidy (nothing acknowledged is lost), 3 damaged (a frame that may have been "
                    "acknowledged would be cut), 4 recovery would refuse to start, 2 usage or in use.")
    what = check.add_mutually_exclusive_group()
    what.add_argument("--data-dir", default=os.environ.get("QUEEN_DATA_DIR", "./queen-data"), metavar="DIR",
                      help="the data directory [env QUEEN_DATA_DIR] (default: ./queen-data)")
    what.add_argument("--backup", metavar="FILE",
                      help="check a backup file instead (`queen backup`): 0 whole, 3 damaged, 4 another format")
    check.set_defaults(run=run)


class _Findings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.events: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append((record.levelno, record.getMessage()))


def run(args) -> int:
    if args.backup is not None:
        return _check_backup(args.backup)
    if not os.path.isdir(args.data_dir):
        print(f"queen: {args.data_dir} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    lock_path = os.path.join(args.data_dir, "LOCK")
    if os.path.exists(lock_path):
        with open(lock_path, "rb") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"queen: a server is running on {args.data_dir}; stop it first (its log moves on while "
                      "this reads)", file=sys.stderr)
                return EXIT_USAGE
            return _check(args.data_dir)
    return _check(args.data_dir)


def _check_backup(path: str) -> int:
    from queen.cli.backup import read_checked
    from queen.cli.output import iso

    status, backup = read_checked(path)
    if backup is not None:
        print(f"backup: version {backup.version}, taken {iso(backup.created_ms)} by Queen {backup.server_version}, "
              f"{len(backup.snapshot)} bytes of snapshot: clean")
    return status


def _check(data_dir: str) -> int:
    try:
        from queen.core.state import State
        from queen.errors import CorruptLog, RefusedToStart
        from queen.wal.disk import DryDisk
        from queen.wal.recovery import recover
    except ModuleNotFoundError as missing:
        return server_dependencies_missing("check", missing)

    disk, findings = DryDisk(), _Findings()
    wal_logger = logging.getLogger("queen.wal")
    wal_logger.addHandler(findings)
    wal_logger.propagate = False  # the findings are printed below, once
    try:
        state = State(1, 0)
        recovered = recover(data_dir, state.replay, disk)
    except (CorruptLog, RefusedToStart) as error:
        print(f"refused: recovery would not start: {error}")
        return EXIT_REFUSED
    finally:
        wal_logger.removeHandler(findings)
        wal_logger.propagate = True
    print(f"recovered: snapshot_version={recovered.snapshot_version} segments={recovered.segments} "
          f"frames={recovered.frames} records={recovered.records} last_version={recovered.last_version} "
          f"rows={state.row_count()}")
    for level, message in findings.events:
        print(f"{logging.getLevelName(level).lower()}: {message}")
    for what, path in disk.changes:
        print(f"would {what}: {path}")
    if any(level >= logging.ERROR for level, _ in findings.events):
        print("damaged: a frame that may have been acknowledged would be cut and quarantined")
        return EXIT_DAMAGED
    if disk.changes:
        print("tidy: recovery would cut a torn tail or remove leftovers; nothing acknowledged is lost")
        return EXIT_TIDIED
    print("clean")
    return EXIT_CLEAN
