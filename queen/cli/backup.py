"""`queen backup` and `queen restore`: a running server's whole state at one version, copied into
a file (GET /api/v1/admin/snapshot, an operator's call), and a data directory made from such a file,
which `queen serve --data-dir DIR` recovers to exactly that version.

Exit status of `queen backup`: 0 written; 2 usage (OUT cannot be written); 65 the server refused
(401, 403: an operator's token is needed); 69 unreachable, 503, or an answer cut short or damaged
(nothing is left at OUT). Of `queen restore`: 0 restored; 2 usage (DIR exists and is not empty, the
file cannot be read); 3 the backup is damaged (cut short, changed); 4 a backup this build must not
read (another format). DIR is created, or touched, only once the backup has checked whole.

Plain blocking HTTP (the standard library's), not the SDK: one long download written to a file as
it arrives, which the SDK's JSON calls do not do.
"""

from __future__ import annotations

import os
import sys

EXIT_OK, EXIT_USAGE, EXIT_DAMAGED, EXIT_REFUSED = 0, 2, 3, 4
EXIT_REJECTED, EXIT_UNAVAILABLE = 65, 69
DEFAULT_URL = "http://127.0.0.1:6632"
ROUTE = "/api/v1/admin/snapshot"
READ_BYTES = 1 << 20


def add_parser(commands) -> None:
    backup = commands.add_parser(
        "backup", help="copy a running server's whole state into a file",
        description="Copy a running server's whole state, at one version V, into OUT (written whole or not at "
                    "all: OUT.tmp, fsync, rename). Every write acknowledged before the command started is in it. "
                    "Needs the operator's token (an admin of tenant '*') when the server has an auth file. Exit "
                    "status: 0 written, 2 usage, 65 refused by the server, 69 unreachable or the download was "
                    "cut short or damaged.")
    backup.add_argument("out", metavar="OUT", help="the backup file to write")
    backup.add_argument("--url", default=None, metavar="URL",
                        help=f"the broker [env QUEEN_URL] (default: {DEFAULT_URL})")
    # Not --token: in `queen lock renew|release` that is the lock's fencing token.
    backup.add_argument("--auth-token", default=None, metavar="SECRET", dest="auth_token",
                        help="the operator's API token (prefer the variable: a flag shows in `ps`) [env QUEEN_TOKEN]")
    backup.add_argument("--ca-file", default=None, metavar="FILE",
                        help="the CA that signed an https server's certificate [env QUEEN_CA_FILE] (default: the "
                             "system's)")
    backup.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="for the server to start answering, and for each read after (default: 60)")
    backup.set_defaults(run=run_backup)
    restore = commands.add_parser(
        "restore", help="make a data directory from a backup file",
        description="Check a backup file whole, then write a data directory from it that `queen serve --data-dir "
                    "DIR` recovers to exactly the backup's version. DIR must not exist or be empty. Exit status: 0 "
                    "restored, 2 usage (DIR not empty, FILE unreadable), 3 the backup is damaged, 4 a backup this "
                    "build must not read.")
    restore.add_argument("backup", metavar="FILE", help="a file `queen backup` wrote")
    restore.add_argument("--data-dir", required=True, metavar="DIR", help="the data directory to create")
    restore.set_defaults(run=run_restore)


def _fail(code: int, message: str) -> int:
    print(f"queen: {message}", file=sys.stderr)
    return code


# -- backup ---------------------------------------------------------------------------------------------


class _Failed(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def run_backup(args) -> int:
    out = args.out
    tmp = out + ".tmp"
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        return _fail(EXIT_USAGE, f"cannot write {out}: the directory {folder} does not exist")
    try:
        version, size = _download(args, tmp)
        _check_downloaded(tmp, version)
        os.rename(tmp, out)
        _fsync_dir(os.path.dirname(os.path.abspath(out)))
    except _Failed as failed:
        _remove_quietly(tmp)
        return _fail(failed.code, str(failed))
    except OSError as error:
        _remove_quietly(tmp)
        return _fail(EXIT_USAGE, f"cannot write {out}: {error}")
    print(f"backup: version {version}, {size} bytes, {out}")
    return EXIT_OK


def _download(args, tmp: str) -> tuple[int, int]:
    """Write the server's answer into tmp as it arrives, then fsync it: (V, bytes)."""
    import http.client
    import json
    import ssl
    from urllib.parse import urlsplit

    url = args.url or os.environ.get("QUEEN_URL") or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Failed(EXIT_USAGE, f"the URL must look like http://host:port, not {url!r}")
    if parts.scheme == "https":
        ca_file = args.ca_file or os.environ.get("QUEEN_CA_FILE") or None
        try:
            context = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as error:
            raise _Failed(EXIT_USAGE, f"cannot read the CA file {ca_file}: {error}") from None
        connection = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=args.timeout,
                                                 context=context)
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=args.timeout)
    token = args.auth_token if args.auth_token is not None else os.environ.get("QUEEN_TOKEN")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        try:
            connection.request("GET", parts.path.rstrip("/") + ROUTE, headers=headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            raise _Failed(EXIT_UNAVAILABLE, f"cannot reach {url}: {error}") from None
        if response.status != 200:
            raw = response.read()
            try:
                document = json.loads(raw)
                detail = f"{document['code']}: {document['detail']}"
            except (ValueError, KeyError, TypeError):
                detail = raw[:200].decode(errors="replace")
            code = EXIT_REJECTED if 400 <= response.status < 500 else EXIT_UNAVAILABLE
            raise _Failed(code, f"the server answered {response.status}: {detail}")
        try:
            version = int(response.getheader("queen-snapshot-version", ""))
        except ValueError:
            raise _Failed(EXIT_UNAVAILABLE, f"{url} answered without a Queen-Snapshot-Version: not a Queen "
                                            "server?") from None
        # The backup holds every tenant's data: readable by its owner only.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        size = 0
        try:
            while True:
                try:
                    piece = response.read(READ_BYTES)
                except (OSError, http.client.HTTPException) as error:
                    raise _Failed(EXIT_UNAVAILABLE, f"the download was cut short after {size} bytes: "
                                                    f"{error!r}") from None
                if not piece:
                    break
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view):]
                size += len(piece)
            os.fsync(fd)
        finally:
            os.close(fd)
        return version, size
    finally:
        connection.close()


def _check_downloaded(path: str, version: int) -> None:
    from queen.wal.backup import BackupDamaged, BackupRefused, read_backup

    with open(path, "rb") as f:
        data = f.read()
    try:
        backup = read_backup(data)
    except (BackupDamaged, BackupRefused) as error:
        raise _Failed(EXIT_UNAVAILABLE, f"the backup received does not check: {error}") from None
    if backup.version != version:
        raise _Failed(EXIT_UNAVAILABLE, f"the backup received is at version {backup.version}, the server said "
                                        f"{version}")


# -- restore and check -----------------------------------------------------------------------------------


def read_checked(path: str):
    """(exit status, the checked Backup or None): what `restore` and `check --backup` share; a
    failure is printed (one line)."""
    from queen.wal.backup import BackupDamaged, BackupRefused, read_backup

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        return _fail(EXIT_USAGE, f"cannot read {path}: {error}"), None
    try:
        return EXIT_OK, read_backup(data)
    except BackupDamaged as error:
        return _fail(EXIT_DAMAGED, f"{path} is damaged: {error}"), None
    except BackupRefused as error:
        return _fail(EXIT_REFUSED, f"{path} cannot be restored by this build: {error}"), None


def run_restore(args) -> int:
    from queen.cli.output import iso
    from queen.wal.backup import write_restored

    data_dir = args.data_dir
    if os.path.lexists(data_dir) and not (os.path.isdir(data_dir) and not os.listdir(data_dir)):
        return _fail(EXIT_USAGE, f"{data_dir} exists and is not an empty directory; restore writes only into a new "
                                 "or empty one")
    status, backup = read_checked(args.backup)
    if backup is None:
        return status
    try:
        if not os.path.isdir(data_dir):
            os.makedirs(data_dir, mode=0o700)
            _fsync_dir(os.path.dirname(os.path.abspath(data_dir)))
        write_restored(data_dir, backup)
    except OSError as error:
        return _fail(EXIT_USAGE, f"cannot write {data_dir}: {error}")
    print(f"restored: version {backup.version} (taken {iso(backup.created_ms)} by Queen {backup.server_version}) "
          f"into {data_dir}; start it with `queen serve --data-dir {data_dir}`")
    return EXIT_OK


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
