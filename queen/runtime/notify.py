"""Telling a service manager how the server is doing, by systemd's notify protocol: one datagram of
`KEY=value` lines to the unix socket named by NOTIFY_SOCKET. `Type=notify` then counts the service
as started only once it listens, after recovery, instead of as soon as the process exists.

Written here rather than taken from a library: it is one sendto. It never blocks and never raises:
a service manager that does not read must not stall or stop the broker, so a failure is logged once
(at warning) and later messages are dropped the same way, quietly.
"""

from __future__ import annotations

import logging
import os
import socket
import time

logger = logging.getLogger(__name__)


class Notifier:
    def __init__(self, address: str | None):
        """address: NOTIFY_SOCKET's value; None or empty when no service manager listens."""
        self.address = _socket_address(address) if address else None
        self.sent = 0  # messages the socket took
        self._warned = False
        if address and self.address is None:
            self._warn_once(f"NOTIFY_SOCKET={address!r} is neither a path nor an abstract name (@...)")

    @classmethod
    def from_environ(cls, environ=os.environ) -> Notifier:
        return cls(environ.get("NOTIFY_SOCKET"))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def reloading(self) -> None:
        # MONOTONIC_USEC lets a manager (Type=notify-reload) match this to the reload it asked for.
        self.send("RELOADING=1", "STATUS=reloading", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def send(self, *fields: str) -> None:
        if self.address is None:
            return
        message = "\n".join(field.replace("\n", " ") for field in fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
                sock.sendto(message, self.address)
        except OSError as error:
            self._warn_once(f"sending {fields[0]} failed: {error}")
        else:
            self.sent += 1

    def _warn_once(self, detail: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("event=notify_failed detail=%r action=not_notifying_the_service_manager", detail)


def _socket_address(value: str) -> str | bytes | None:
    if value.startswith("/"):
        return value
    if value.startswith("@"):  # Linux abstract namespace: a leading NUL byte, not a file
        return b"\0" + value[1:].encode()
    return None
