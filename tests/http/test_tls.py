"""HTTPS: `queen serve --tls-cert/--tls-key` with throwaway certificates made by the openssl command
(a test CA, a server certificate for 127.0.0.1, a renewal, and a CA nobody trusts). Real server
processes for what a client sees; in-process servers, in MockClock's virtual time, for deadlines,
parked calls and reloads."""

import http.client
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import trio
import trio.testing

import queen_client
from queen.testing import HttpClient, ServerProcess, make_server_cert, make_test_ca, open_server
from tests import system_tools

pytestmark = pytest.mark.skipif(system_tools.find("openssl") is None,
                                reason=system_tools.missing_message("openssl", "the TLS tests (tests/http/test_tls.py)"))


@dataclass
class Pki:
    ca: str
    cert: str  # for 127.0.0.1, CN=queen-test-1, signed by ca
    key: str
    renewed_cert: str  # the same, CN=queen-test-2 and another serial and key
    renewed_key: str
    stranger_ca: str  # a CA that signed neither

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    directory = str(tmp_path_factory.mktemp("pki"))
    ca = make_test_ca(directory)
    cert, key = make_server_cert(directory, ca, "queen-test-1", serial=1)
    renewed_cert, renewed_key = make_server_cert(directory, ca, "queen-test-2", serial=2)
    stranger_ca, _ = make_test_ca(directory, "stranger")
    return Pki(ca[0], cert, key, renewed_cert, renewed_key, stranger_ca)


@pytest.fixture(scope="module")
def tls_server(pki, tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tls") / "data")
    with ServerProcess(data_dir, "--tls-cert", pki.cert, "--tls-key", pki.key, ca_file=pki.ca) as process:
        yield process


def common_name(peer_cert: dict) -> str:
    return dict(pair[0] for pair in peer_cert["subject"])["commonName"]


def https_connection(port: int, context: ssl.SSLContext) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)


# -- a real `queen serve` --------------------------------------------------------------------------


def test_queen_serve_answers_https_to_a_client_that_trusts_its_ca(tls_server, pki):
    assert tls_server.url.startswith("https://")
    assert "tls=on" in tls_server.log_text()
    connection = https_connection(tls_server.port, pki.client_context())
    try:
        for _ in range(2):  # keep-alive: the second request on the same connection
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 200 and b'"ok"' in response.read()
        assert common_name(connection.sock.getpeercert()) == "queen-test-1"
    finally:
        connection.close()
    assert tls_server.request("PUT", "/api/v1/kv/tls/stdlib", {"value": 1, "forever": True})[0] == 200


async def test_the_sdk_speaks_https_with_a_private_ca(tls_server, pki, monkeypatch):
    async with queen_client.Client(tls_server.url, ca_file=pki.ca) as client:
        written = await client.kv.put("tls", "sdk", {"n": 1}, forever=True)
        got = await client.kv.get("tls", "sdk")
        assert got.found and got.value == {"n": 1} and got.version == written.version
        orders = client.queue("tls-orders")
        assert (await orders.push({"order": 1})).status == "queued"
        delivery = await orders.pop(wait="5s")
        [message] = delivery.messages
        assert message.data == {"order": 1}
        assert (await message.ack()).success
    monkeypatch.setenv("QUEEN_CA_FILE", pki.ca)  # the same CA from the environment
    async with queen_client.Client(tls_server.url) as client:
        assert (await client.kv.get("tls", "sdk")).value == {"n": 1}


def test_plain_http_at_the_https_port_is_answered_400_and_the_server_goes_on(tls_server):
    connection = http.client.HTTPConnection("127.0.0.1", tls_server.port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert response.status == 400 and b"https://" in response.read()
    finally:
        connection.close()
    assert tls_server.request("GET", "/healthz")[0] == 200


def test_a_client_that_does_not_trust_the_ca_fails_verification(tls_server, pki):
    for context in (ssl.create_default_context(), ssl.create_default_context(cafile=pki.stranger_ca)):
        connection = https_connection(tls_server.port, context)
        with pytest.raises(ssl.SSLCertVerificationError):
            connection.request("GET", "/healthz")
        connection.close()
    with queen_client.SyncClient(tls_server.url, ca_file=pki.stranger_ca, retries_max=0) as client:
        with pytest.raises(queen_client.TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            client.kv.get("tls", "sdk")
    assert tls_server.request("GET", "/healthz")[0] == 200


def test_sighup_serves_a_renewed_certificate_to_new_connections(pki, tmp_path):
    cert, key = str(tmp_path / "server.pem"), str(tmp_path / "server.key")
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    with ServerProcess(str(tmp_path / "data"), "--tls-cert", cert, "--tls-key", key, ca_file=pki.ca) as server:
        old = https_connection(server.port, pki.client_context())
        old.request("GET", "/healthz")
        assert old.getresponse().read() and common_name(old.sock.getpeercert()) == "queen-test-1"

        shutil.copy(pki.renewed_cert, cert + ".new")
        shutil.copy(pki.renewed_key, key + ".new")
        os.replace(key + ".new", key)
        os.replace(cert + ".new", cert)
        server.process.send_signal(signal.SIGHUP)
        wait_for_log(server, "event=tls_reloaded")
        assert served_name(server, pki) == "queen-test-2"
        old.request("GET", "/healthz")  # an open connection goes on with what it started with
        assert old.getresponse().status == 200
        old.close()

        # A renewal gone wrong: the server keeps serving the certificate it has.
        with open(key, "w") as f:
            f.write("not a key\n")
        server.process.send_signal(signal.SIGHUP)
        wait_for_log(server, f"event=tls_reload_failed file={key}")
        assert served_name(server, pki) == "queen-test-2"
        assert server.stop() == 0


def served_name(server: ServerProcess, pki: Pki) -> str:
    connection = https_connection(server.port, pki.client_context())
    try:
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        return common_name(connection.sock.getpeercert())
    finally:
        connection.close()


def wait_for_log(server: ServerProcess, text: str, timeout_s: float = 20.0) -> None:
    """Poll the real process's log for a line it writes once it has acted; not a wait for time."""
    deadline = time.monotonic() + timeout_s
    while text not in server.log_text():
        assert time.monotonic() < deadline, f"no {text!r} in the server's log"
        time.sleep(0.02)


@pytest.mark.parametrize("bad_key", ["garbage", "another certificate's", "missing"])
def test_a_key_that_cannot_be_loaded_stops_the_start_with_one_log_line(pki, tmp_path, bad_key):
    key = str(tmp_path / "server.key")
    if bad_key == "garbage":
        with open(key, "w") as f:
            f.write("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
    elif bad_key == "another certificate's":
        shutil.copy(pki.renewed_key, key)
    done = subprocess.run([sys.executable, "-m", "queen", "serve", "--host", "127.0.0.1", "--port", "0",
                           "--data-dir", str(tmp_path / "data"), "--tls-cert", pki.cert, "--tls-key", key],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    failures = [line for line in done.stderr.splitlines() if "event=start_failed" in line]
    assert len(failures) == 1 and f"reason=tls file={key} " in failures[0], done.stderr
    assert "event=listening" not in done.stderr
    assert not (tmp_path / "data").exists(), "a refused start made the data directory"


def test_a_key_file_others_may_read_is_warned_about_at_start(pki, tmp_path, tls_server):
    key = str(tmp_path / "server.key")
    shutil.copy(pki.key, key)
    os.chmod(key, 0o640)
    with ServerProcess(str(tmp_path / "data"), "--tls-cert", pki.cert, "--tls-key", key, ca_file=pki.ca) as server:
        assert served_name(server, pki) == "queen-test-1"  # warned, and served
        warnings = [line for line in server.log_text().splitlines() if "event=tls_key_readable_by_others" in line]
    assert len(warnings) == 1 and "level=warning" in warnings[0], warnings
    assert f"file={key} " in warnings[0] and "mode=640 " in warnings[0] and "chmod 600" in warnings[0]
    assert "event=tls_key_readable_by_others" not in tls_server.log_text(), "a 0600 key is not warned about"


# -- in-process, in virtual time -------------------------------------------------------------------


def acquire(owner: str, **extra) -> dict:
    return {"op": "acquire", "name": "job", "ttlSeconds": 60, "owner": owner, **extra}


def request_bytes(body: bytes) -> bytes:
    return b"POST /api/v1/locks HTTP/1.1\r\nhost: q\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


PARKED_ACQUIRE = request_bytes(b'{"operations":[{"op":"acquire","name":"job","ttlSeconds":60,"owner":"w",'
                               b'"waitMs":30000}]}')


async def open_tls_stream(port: int, pki: Pki, https_compatible: bool = True) -> trio.SSLStream:
    """https_compatible=False: aclose() sends a close_notify before it closes the socket."""
    stream = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), pki.client_context(),
                            server_hostname="127.0.0.1", https_compatible=https_compatible)
    await stream.do_handshake()
    return stream


async def read_until_closed(stream) -> bytes:
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    return received


@pytest.mark.parametrize("stall", ["sends nothing", "sends half a hello"])
async def test_a_client_that_never_finishes_the_handshake_is_cut_off_and_blocks_nobody(
        pki, tmp_path, autojump_clock, stall):
    async with open_server(tmp_path / "d", tls_cert=pki.cert, tls_key=pki.key, request_read_timeout_s=5) as server:
        started = trio.current_time()
        stalled = await trio.open_tcp_stream("127.0.0.1", server.port)
        if stall == "sends half a hello":
            await stalled.send_all(b"\x16\x03\x01\x00\xc8\x01\x00")  # a record header promising 200 bytes
        client = HttpClient(server.port, ssl_context=pki.client_context())
        assert (await client.request("GET", "/healthz"))[0] == 200
        assert await read_until_closed(stalled) == b""  # cut off, with nothing to say
        assert 5 <= trio.current_time() - started <= 5.3  # the read deadline, kept by the reaper
        assert server.http.timeouts == 1
        await stalled.aclose()
        assert (await client.request("GET", "/healthz"))[0] == 200


async def test_error_answers_reach_a_tls_client(pki, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", tls_cert=pki.cert, tls_key=pki.key, request_read_timeout_s=5) as server:
        malformed = await open_tls_stream(server.port, pki)
        await malformed.send_all(b"GET /healthz HTTP/1.1\r\nhost: q\r\nno colon here\r\n\r\n")
        assert (await read_until_closed(malformed)).startswith(b"HTTP/1.1 400 ")
        stalled = await open_tls_stream(server.port, pki)
        await stalled.send_all(b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\n")
        answer = await read_until_closed(stalled)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in answer
        for stream in (malformed, stalled):
            await stream.aclose()


@pytest.mark.parametrize("hang_up", ["close_notify", "tcp close"])
async def test_a_parked_acquire_whose_tls_client_hung_up_is_not_handed_the_permit(pki, tmp_path, autojump_clock,
                                                                                hang_up):
    async with open_server(tmp_path / "d", tls_cert=pki.cert, tls_key=pki.key) as server:
        holder = HttpClient(server.port, ssl_context=pki.client_context())
        [held] = await holder.locks(acquire("h"))
        stream = await open_tls_stream(server.port, pki, https_compatible=hang_up != "close_notify")
        await stream.send_all(PARKED_ACQUIRE)
        await trio.testing.wait_all_tasks_blocked()
        if hang_up == "close_notify":
            await stream.aclose()
        else:
            await stream.transport_stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        await holder.locks({"op": "release", "name": "job", "slot": 0, "token": held["token"]})
        [state] = await holder.locks({"op": "get", "name": "job"})
        assert state["holders"] == []


async def test_a_request_pipelined_behind_a_parked_one_is_kept_and_answered_next(pki, tmp_path, autojump_clock):
    """What a TLS client sends while its call is parked is read (decrypted) and kept, as on a
    plain connection, and answered after the parked call."""
    async with open_server(tmp_path / "d", tls_cert=pki.cert, tls_key=pki.key) as server:
        holder = HttpClient(server.port, ssl_context=pki.client_context())
        [held] = await holder.locks(acquire("h"))
        stream = await open_tls_stream(server.port, pki)
        await stream.send_all(PARKED_ACQUIRE)
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nhost: q\r\nconnection: close\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        await holder.locks({"op": "release", "name": "job", "slot": 0, "token": held["token"]})
        answers = await read_until_closed(stream)
        first, second = answers.split(b"HTTP/1.1 ")[1:]
        assert first.startswith(b"200 ") and b'"acquired":true' in first
        assert second.startswith(b"200 ") and b'"ok"' in second
        await stream.aclose()


async def test_at_the_limit_the_longest_idle_tls_connection_makes_room(pki, tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", tls_cert=pki.cert, tls_key=pki.key, connections_max=2) as server:
        oldest = HttpClient(server.port, ssl_context=pki.client_context())
        newer = HttpClient(server.port, ssl_context=pki.client_context())
        assert (await oldest.request("GET", "/healthz"))[0] == 200
        await trio.sleep(1)
        assert (await newer.request("GET", "/healthz"))[0] == 200
        assert (await HttpClient(server.port, ssl_context=pki.client_context()).request("GET", "/healthz"))[0] == 200
        assert await oldest._stream.receive_some(10) == b""  # closed to make room
        assert (await newer.request("GET", "/healthz"))[0] == 200
        assert server.http.idle_closed == 1


async def test_reload_tls_serves_new_connections_the_new_certificate_and_keeps_the_old_on_failure(
        pki, tmp_path, autojump_clock, caplog):
    cert, key = str(tmp_path / "server.pem"), str(tmp_path / "server.key")
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    async with open_server(tmp_path / "d", tls_cert=cert, tls_key=key) as server:
        old = HttpClient(server.port, ssl_context=pki.client_context())
        assert (await old.request("GET", "/healthz"))[0] == 200
        assert common_name(old._stream.getpeercert()) == "queen-test-1"

        shutil.copy(pki.renewed_cert, cert)
        shutil.copy(pki.renewed_key, key)
        assert server.http.reload_tls() is True
        renewed = HttpClient(server.port, ssl_context=pki.client_context())
        assert (await renewed.request("GET", "/healthz"))[0] == 200
        assert common_name(renewed._stream.getpeercert()) == "queen-test-2"
        assert (await old.request("GET", "/healthz"))[0] == 200  # open connections keep theirs

        with open(key, "w") as f:
            f.write("not a key\n")
        assert server.http.reload_tls() is False
        assert f"event=tls_reload_failed file={key} " in caplog.text
        after = HttpClient(server.port, ssl_context=pki.client_context())
        assert (await after.request("GET", "/healthz"))[0] == 200
        assert common_name(after._stream.getpeercert()) == "queen-test-2"


def test_the_cli_speaks_https_with_a_ca_file_and_a_token(pki, tmp_path):
    """`queen kv` over https: --ca-file (or QUEEN_CA_FILE) trusts the private CA; without it the
    certificate is refused with one line, exit 69. With an auth file too: the token goes inside TLS."""
    from queen.auth import AuthFile

    path = str(tmp_path / "auth.json")
    auth_file = AuthFile.load(path, missing_ok=True)
    secret = auth_file.add("cli", "writer", "tls")
    auth_file.save()
    with ServerProcess(str(tmp_path / "data"), "--tls-cert", pki.cert, "--tls-key", pki.key, "--auth-file", path,
                       ca_file=pki.ca) as server:
        env = {**os.environ, "QUEEN_URL": server.url, "QUEEN_TOKEN": secret}
        env.pop("QUEEN_CA_FILE", None)

        def queen_cli(*args, extra=None):
            return subprocess.run([sys.executable, "-m", "queen", *args], env={**env, **(extra or {})},
                                  capture_output=True, text=True, timeout=60)

        untrusted = queen_cli("kv", "get", "app", "k")
        assert untrusted.returncode == 69 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
        assert len(untrusted.stderr.strip().splitlines()) == 1
        assert queen_cli("kv", "put", "app", "k", "42", "--forever", "--ca-file", pki.ca).returncode == 0
        got = queen_cli("kv", "get", "app", "k", "--json", extra={"QUEEN_CA_FILE": pki.ca})
        assert got.returncode == 0 and '"value": 42' in got.stdout
        assert secret.split("_", 2)[2] not in untrusted.stderr + got.stdout + got.stderr + server.log_text()
