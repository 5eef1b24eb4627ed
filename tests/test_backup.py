"""Online backup and restore, end to end with real servers and the real commands: a backup taken
while writes go on holds exactly the acknowledged writes up to its version; a restored directory
checks clean and serves that state, tenants included; damaged backups and non-empty directories are
refused; the backup route is the operator's alone and does not stall other requests.

`queen check` on clean, torn and damaged data directories is tests/wal/test_check.py's."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from queen.auth import AuthFile
from queen.http.connection import SEND_PIECE_BYTES
from queen.testing import ServerProcess, make_server_cert, make_test_ca
from queen.wal.backup import read_backup
from tests import system_tools
from tests.runtime.test_tenant_recovery import fill, view

ROUTE = "/api/v1/admin/snapshot"
_BACKUP_LINE = re.compile(r"^backup: version (\d+), (\d+) bytes, (.+)$")


def queen(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "queen", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def backup(server: ServerProcess, out, token: str | None = None) -> int:
    """`queen backup` into out; the version it reports."""
    done = queen("backup", "--url", server.url, str(out), env={"QUEEN_TOKEN": token or ""})
    assert done.returncode == 0, done.stderr
    match = _BACKUP_LINE.match(done.stdout.strip())
    assert match and match.group(3) == str(out) and int(match.group(2)) == os.path.getsize(out), done.stdout
    assert not os.path.exists(f"{out}.tmp")
    return int(match.group(1))


def restore(backup_file, data_dir) -> None:
    done = queen("restore", str(backup_file), "--data-dir", str(data_dir))
    assert done.returncode == 0 and done.stdout.startswith("restored: version"), (done.stdout, done.stderr)
    checked = queen("check", "--data-dir", str(data_dir))
    assert checked.returncode == 0 and checked.stdout.rstrip().endswith("clean"), checked.stdout


def ok(server: ServerProcess, method: str, path: str, body=None, headers=None):
    status, answer = server.request(method, path, body, headers)
    assert status == 200, (method, path, status, answer)
    return answer


class WriteLoad:
    """A thread writing until stopped, alternating KV puts of distinct keys and queue pushes, and
    recording each acknowledged write with the version the server answered."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self.puts: dict[str, int] = {}  # key -> version
        self.pushes: dict[int, str] = {}  # messageId (its version) -> payload
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def acknowledged(self) -> int:
        return len(self.puts) + len(self.pushes)

    def _run(self) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                if n % 2 == 0:
                    answer = ok(self.server, "PUT", f"/api/v1/kv/load/k{n}", {"value": n, "forever": True})
                    assert answer["applied"] is True
                    self.puts[f"k{n}"] = answer["version"]
                else:
                    [pushed] = ok(self.server, "POST", "/api/v1/push",
                                  {"items": [{"queue": "load", "partition": "p", "payload": f"m{n}"}]})
                    self.pushes[pushed["messageId"]] = f"m{n}"
                n += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while self.acknowledged() < count and self.error is None and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the load's progress, not waiting for time to pass
        assert self.error is None and self.acknowledged() >= count, (self.error, self.acknowledged())

    def __enter__(self) -> WriteLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def kv_versions(server: ServerProcess, ns: str) -> dict[str, int]:
    versions, cursor = {}, None
    while True:
        page = ok(server, "GET", f"/api/v1/kv/{ns}?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
        versions.update((item["key"], item["version"]) for item in page["items"])
        cursor = page.get("cursor")
        if not cursor:
            return versions


def queued(server: ServerProcess, queue: str) -> dict[int, str]:
    messages = {}
    while True:
        popped = ok(server, "GET", f"/api/v1/pop/queue/{queue}?batch=1000&autoAck=true")
        if not popped.get("messages"):
            return messages
        messages.update((m["messageId"], m["data"]) for m in popped["messages"])


def test_a_backup_taken_under_load_holds_exactly_the_writes_acknowledged_up_to_its_version(tmp_path):
    server = ServerProcess(str(tmp_path / "data")).start()
    try:
        with WriteLoad(server) as load:
            load.wait_for(100)
            version = backup(server, tmp_path / "state.qbk")
            load.wait_for(load.acknowledged() + 100)  # writes after the backup, which it must not hold
        assert load.error is None, load.error
    finally:
        server.stop()
    puts, pushes = load.puts, load.pushes
    assert any(v <= version for v in puts.values()) and any(v > version for v in puts.values())
    assert any(v <= version for v in pushes) and any(v > version for v in pushes)

    restore(tmp_path / "state.qbk", tmp_path / "restored")
    restored = ServerProcess(str(tmp_path / "restored")).start()
    try:
        assert kv_versions(restored, "load") == {key: v for key, v in puts.items() if v <= version}
        assert queued(restored, "load") == {v: payload for v, payload in pushes.items() if v <= version}
        # New versions continue above the backup's: a fencing token never goes back.
        assert ok(restored, "PUT", "/api/v1/kv/after/k", {"value": 1, "forever": True})["version"] > version
    finally:
        restored.stop()


def test_tenants_are_restored_and_only_the_operator_may_take_a_backup(tmp_path):
    path = str(tmp_path / "auth.json")
    file = AuthFile.load(path, missing_ok=True)
    alpha = file.add("alpha-admin", "admin", "alpha")
    reader = file.add("alpha-reader", "reader", "alpha")
    operator = file.add("ops", "admin", "*")
    file.save()
    server = ServerProcess(str(tmp_path / "data"), "--auth-file", path).start()
    try:
        fill(server, alpha, "alpha")
        before = view(server, alpha)
        for secret, status in ((alpha, 403), (reader, 403), (None, 401)):
            headers = {"authorization": f"Bearer {secret}"} if secret else {}
            got, answer = server.request("GET", ROUTE, headers=headers)
            assert got == status and answer["code"] in ("forbidden", "unauthenticated"), (got, answer)
        refused = queen("backup", "--url", server.url, str(tmp_path / "refused.qbk"), env={"QUEEN_TOKEN": alpha})
        assert refused.returncode == 65 and "403" in refused.stderr, refused.stderr
        assert not os.path.exists(tmp_path / "refused.qbk") and not os.path.exists(tmp_path / "refused.qbk.tmp")
        backup(server, tmp_path / "state.qbk", token=operator)
    finally:
        server.stop()
    restore(tmp_path / "state.qbk", tmp_path / "restored")
    restored = ServerProcess(str(tmp_path / "restored"), "--auth-file", path).start()
    try:
        assert view(restored, alpha) == before
    finally:
        restored.stop()


@pytest.fixture(scope="module")
def a_backup(tmp_path_factory):
    """A backup of a server holding a few keys, and its version."""
    directory = tmp_path_factory.mktemp("backup")
    with ServerProcess(str(directory / "data")) as server:
        for n in range(20):
            ok(server, "PUT", f"/api/v1/kv/app/k{n}", {"value": "v" * n, "forever": True})
        version = backup(server, directory / "state.qbk")
    with open(directory / "state.qbk", "rb") as f:
        return f.read(), version


def test_restore_refuses_a_directory_that_is_not_empty(tmp_path, a_backup):
    data, _ = a_backup
    (tmp_path / "state.qbk").write_bytes(data)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "something").write_text("mine")
    done = queen("restore", str(tmp_path / "state.qbk"), "--data-dir", str(tmp_path / "busy"))
    assert done.returncode == 2 and "not an empty directory" in done.stderr and not done.stdout
    assert len(done.stderr.strip().splitlines()) == 1
    assert os.listdir(tmp_path / "busy") == ["something"]
    (tmp_path / "empty").mkdir()  # an empty directory is taken
    restore(tmp_path / "state.qbk", tmp_path / "empty")


@pytest.mark.parametrize("damage", ["truncated", "cut-checksum", "flipped-header", "flipped-snapshot",
                                    "flipped-checksum"])
def test_restore_refuses_a_damaged_backup_and_creates_nothing(tmp_path, a_backup, damage):
    data, _ = a_backup
    read_backup(data)  # whole, it checks
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "cut-checksum":
        data = data[:-1]
    else:
        position = {"flipped-header": 8, "flipped-snapshot": len(data) // 2, "flipped-checksum": len(data) - 5}[damage]
        data = data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1:]
    (tmp_path / "state.qbk").write_bytes(data)
    done = queen("restore", str(tmp_path / "state.qbk"), "--data-dir", str(tmp_path / "restored"))
    assert done.returncode == 3 and "damaged" in done.stderr, (done.returncode, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "restored")
    checked = queen("check", "--backup", str(tmp_path / "state.qbk"))
    assert checked.returncode == 3, checked


def test_check_reads_a_whole_backup_as_clean(tmp_path, a_backup):
    data, version = a_backup
    (tmp_path / "state.qbk").write_bytes(data)
    checked = queen("check", "--backup", str(tmp_path / "state.qbk"))
    assert checked.returncode == 0 and f"version {version}," in checked.stdout, checked


def test_a_restored_directory_is_for_its_owner_only(tmp_path, a_backup):
    data, _ = a_backup
    (tmp_path / "state.qbk").write_bytes(data)
    restore(tmp_path / "state.qbk", tmp_path / "restored")
    assert os.stat(tmp_path / "restored").st_mode & 0o777 == 0o700
    for name in os.listdir(tmp_path / "restored"):
        assert os.stat(tmp_path / "restored" / name).st_mode & 0o077 == 0, name


def test_check_takes_a_data_dir_or_a_backup_not_both(tmp_path, a_backup):
    data, _ = a_backup
    (tmp_path / "state.qbk").write_bytes(data)
    done = queen("check", "--data-dir", str(tmp_path), "--backup", str(tmp_path / "state.qbk"))
    assert done.returncode == 2 and "not allowed with argument" in done.stderr, done


def test_a_backup_into_a_missing_directory_names_it(tmp_path):
    with ServerProcess(str(tmp_path / "data")) as server:
        done = queen("backup", "--url", server.url, str(tmp_path / "nowhere" / "state.qbk"))
    assert done.returncode == 2 and f"the directory {tmp_path / 'nowhere'} does not exist" in done.stderr, done
    assert not os.path.exists(tmp_path / "nowhere")


def test_a_backup_being_sent_does_not_stall_other_requests(tmp_path):
    """A backup of several megabytes, which the client stops reading part way: the server is then
    sending it, its socket full, and /healthz still answers; then the rest arrives whole."""
    with ServerProcess(str(tmp_path / "data")) as server:
        for n in range(120):
            value = os.urandom(100_000).hex()  # barely compressible: the backup is megabytes
            ok(server, "PUT", f"/api/v1/kv/big/k{n}", {"value": value, "forever": True})
        with socket.socket() as sock:
            # A small receive buffer (set before connecting, so the window is agreed on it): the
            # kernel's buffers cannot take the whole backup, so the server is still sending it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            sock.settimeout(60)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(f"GET {ROUTE} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
            assert server.request("GET", "/healthz") == (200, {"status": "ok"})  # while it is being made
            received = sock.recv(65536)
            while b"\r\n\r\n" not in received:
                received += sock.recv(65536)
            head, _, body = received.partition(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head).group(1))
            assert length > 10 * 1024 * 1024 and len(body) < length
            assert server.request("GET", "/healthz") == (200, {"status": "ok"})  # while it is being sent
            parts = [body]
            received = len(body)
            while received < length:
                piece = sock.recv(1 << 20)
                assert piece, "the backup was cut short"
                parts.append(piece)
                received += len(piece)
        version = int(re.search(rb"queen-snapshot-version: (\d+)", head).group(1))
        assert read_backup(b"".join(parts)).version == version == 120


def test_a_backup_over_https_arrives_whole(tmp_path):
    """Over TLS, with a backup long enough to go out in several pieces."""
    system_tools.require("openssl", "the backup over HTTPS (its throwaway certificates)")
    ca = make_test_ca(str(tmp_path))
    cert, key = make_server_cert(str(tmp_path), ca)
    with ServerProcess(str(tmp_path / "data"), "--tls-cert", cert, "--tls-key", key, ca_file=ca[0]) as server:
        for n in range(30):
            ok(server, "PUT", f"/api/v1/kv/big/k{n}", {"value": os.urandom(100_000).hex(), "forever": True})
        done = queen("backup", "--url", server.url, "--ca-file", ca[0], str(tmp_path / "state.qbk"))
        assert done.returncode == 0, done.stderr
        assert os.path.getsize(tmp_path / "state.qbk") > 2 * SEND_PIECE_BYTES
        untrusted = queen("backup", "--url", server.url, str(tmp_path / "untrusted.qbk"))
        assert untrusted.returncode == 69 and not os.path.exists(tmp_path / "untrusted.qbk"), untrusted.stderr
    restore(tmp_path / "state.qbk", tmp_path / "restored")
    with ServerProcess(str(tmp_path / "restored")) as restored:
        assert len(kv_versions(restored, "big")) == 30
