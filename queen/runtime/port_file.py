"""The port file (`queen serve --port-file FILE`): where a server started on port 0 says which
ports it bound, for the script, test or service manager that started it.

Owns the file's one format, written here and read here: a JSON object on one line,
    {"port": 41234}                              a server alone
    {"port": 41234, "replicationPort": 41235}    a cluster node (--replication-listen)
each the port actually bound (never 0). It is written once the server listens, by a rename, so
a reader sees no file, the old one or the whole new one, never a half; a clean exit removes it.
A server killed outright leaves it behind: a reader that starts a server removes the old file
first and waits for the new one.

Nothing here touches a socket or the event loop: the server calls `write` off the loop.
"""

from __future__ import annotations

import json
import os


class PortFileError(Exception):
    """The port file cannot be written where it was asked for; `path` names it."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"cannot write {path}: {detail}")
        self.path = path
        self.detail = detail


def encode(port: int, replication_port: int | None = None) -> bytes:
    assert 0 < port <= 65535 and (replication_port is None or 0 < replication_port <= 65535), (port, replication_port)
    document = {"port": port} if replication_port is None else {"port": port, "replicationPort": replication_port}
    return json.dumps(document).encode() + b"\n"


def check_writable(path: str) -> None:
    """Before a start touches anything: the file's directory exists and may be written, so the
    write once listening cannot fail for want of it. Raises PortFileError."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise PortFileError(path, f"no directory {directory}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PortFileError(path, f"the directory {directory} may not be written")
    if os.path.isdir(path):
        raise PortFileError(path, "it is a directory")


def write(path: str, port: int, replication_port: int | None = None) -> None:
    """Replace the file at path by the one holding these ports, by a rename of a whole file.
    Not fsynced: it describes a running process, which a power loss ends anyway."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as file:
            file.write(encode(port, replication_port))
        os.replace(temporary, path)
    except OSError as error:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise PortFileError(path, error.strerror or str(error)) from None


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read(path: str) -> dict[str, int] | None:
    """{"port": N} or {"port": N, "replicationPort": M}; None while there is no file. A file
    that holds anything else raises ValueError (a rename never shows half of one)."""
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        return None
    document = json.loads(raw)
    if not isinstance(document, dict) or not isinstance(document.get("port"), int):
        raise ValueError(f"{path} is not a port file: {raw[:200]!r}")
    return document
