"""The service manager's notify socket (systemd Type=notify): a real `queen serve` says READY=1 once
it listens (its MAINPID and where it listens beside it), RELOADING=1 then READY=1 around SIGHUP,
STOPPING=1 at SIGTERM; a socket that is missing, full or malformed never blocks nor stops it."""

import logging
import os
import signal
import socket
import tempfile

from queen.runtime.notify import Notifier
from queen.testing import ServerProcess


def abstract_receiver() -> tuple[socket.socket, str]:
    """A datagram socket bound to a fresh abstract name, and that name as NOTIFY_SOCKET spells it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + f"queen-notify-test-{os.getpid()}-{id(sock)}".encode())
    sock.settimeout(30)  # a deadline for a message a real process sends, generous for a busy machine
    return sock, "@" + sock.getsockname()[1:].decode()


def fields(sock: socket.socket) -> dict[str, str]:
    message = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in message.splitlines())


def test_an_abstract_name_is_reached_through_its_leading_nul():
    sock, name = abstract_receiver()
    with sock:
        Notifier(name).ready("listening on 127.0.0.1:1")
        got = fields(sock)
    assert got == {"READY": "1", "STATUS": "listening on 127.0.0.1:1", "MAINPID": str(os.getpid())}


def test_a_path_is_reached_as_a_file():
    with tempfile.TemporaryDirectory(prefix="qn", dir="/tmp") as directory:  # unix paths end at 108 bytes
        path = os.path.join(directory, "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(30)
            notifier = Notifier(path)
            notifier.reloading()
            notifier.stopping("stopping: 0 requests in flight")
            reloading, stopping = fields(sock), fields(sock)
    assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0
    assert stopping == {"STOPPING": "1", "STATUS": "stopping: 0 requests in flight"}


def test_without_notify_socket_nothing_is_sent():
    notifier = Notifier.from_environ({})
    notifier.ready("x")
    assert notifier.address is None and notifier.sent == 0


def test_a_missing_socket_is_logged_once_and_never_raises(caplog):
    notifier = Notifier("/nonexistent/queen-notify")
    with caplog.at_level(logging.WARNING, logger="queen.runtime.notify"):
        for _ in range(3):
            notifier.ready("x")
    warnings = [r.getMessage() for r in caplog.records if "event=notify_failed" in r.getMessage()]
    assert len(warnings) == 1 and "READY=1" in warnings[0] and notifier.sent == 0


def test_a_name_that_is_neither_path_nor_abstract_is_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger="queen.runtime.notify"):
        notifier = Notifier("vsock:2:9")
        notifier.ready("x")
        notifier.stopping("y")
    assert [r.getMessage() for r in caplog.records if "event=notify_failed" in r.getMessage()] == [
        "event=notify_failed detail=\"NOTIFY_SOCKET='vsock:2:9' is neither a path nor an abstract name (@...)\" "
        "action=not_notifying_the_service_manager"]


def test_a_manager_that_does_not_read_does_not_block_the_sender(caplog):
    sock, name = abstract_receiver()
    notifier = Notifier(name)
    with sock, caplog.at_level(logging.WARNING, logger="queen.runtime.notify"):
        # Nobody reads: the socket's queue fills, and a blocking send would hang here for good.
        for _ in range(5000):
            notifier.status("x" * 1000)
    assert 0 < notifier.sent < 5000
    assert len([r for r in caplog.records if "event=notify_failed" in r.getMessage()]) == 1


def test_queen_serve_tells_the_manager_ready_reloading_and_stopping(tmp_path):
    sock, name = abstract_receiver()
    server = ServerProcess(str(tmp_path / "data"), env={"NOTIFY_SOCKET": name})
    with sock:
        try:
            server.start()
            recovering = fields(sock)
            ready = fields(sock)
            # READY=1 means it answers: nothing else to wait for.
            assert server.request("GET", "/healthz")[0] == 200
            server.process.send_signal(signal.SIGHUP)
            reloading, reloaded = fields(sock), fields(sock)
            server.process.send_signal(signal.SIGTERM)
            stopping = fields(sock)
            assert server.process.wait(30) == 0
        finally:
            server.kill()
    assert recovering == {"STATUS": f"recovering {tmp_path / 'data'}"}
    assert ready == {"READY": "1", "STATUS": f"listening on 127.0.0.1:{server.port}", "MAINPID": str(server.process.pid)}
    assert reloading["RELOADING"] == "1" and "MONOTONIC_USEC" in reloading
    assert reloaded["READY"] == "1"
    assert stopping["STOPPING"] == "1"
