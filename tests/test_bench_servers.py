"""bench/servers.py's processes: a peer given a port that another process took before it bound it
is started again on a fresh one; Queen and the baseline bind port 0 and are found through their
port file."""

from __future__ import annotations

import os
import socket
import sys

from bench.servers import Launch, ServerProcess, baseline_server, free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A stand-in peer: listens on the port it is given, as Redis or etcd would, and fails as they do
# when it is taken (Python says "Address already in use" too). It tells whoever connects its pid,
# so that its health check cannot mistake the port's other holder for it.
PEER = ("import os, signal, socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "while True:\n    c, _ = s.accept(); c.sendall(str(os.getpid()).encode()); c.close()")


def _answers_as(pid: int, port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.settimeout(2)
        return sock.recv(32) == str(pid).encode()


def test_a_peer_whose_port_was_taken_is_started_again_on_a_fresh_one(tmp_path):
    log_path = str(tmp_path / "peer.log")
    with socket.socket() as holder:  # another process's, taken between the pick and the peer's bind
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = [taken]

        def launch() -> Launch:
            port = ports.pop(0) if ports else free_port()
            return Launch([sys.executable, "-c", PEER, str(port)], port)

        peer = ServerProcess("peer", launch, log_path, None, health=lambda port: _answers_as(peer.process.pid, port))
        peer.start()
        try:
            assert peer.port != taken and peer.process.poll() is None and _answers_as(peer.process.pid, peer.port)
        finally:
            peer.stop()
    assert peer.exit_code == 0
    with open(log_path) as log:
        assert "address already in use" in log.read().lower()  # the first attempt's


def test_the_baseline_binds_port_zero_and_is_found_through_its_port_file(tmp_path):
    server = baseline_server(str(tmp_path / "baseline.log"), None, REPO_ROOT)
    assert server.port is None  # nothing picked beforehand
    server.start()
    try:
        assert server.get("/anything")[0] == 200
        assert "--port-file" in server.argv and server.argv[server.argv.index("--port") + 1] == "0"
    finally:
        server.stop()
    assert server.exit_code == 0 and not os.path.exists(server.port_file_path)
