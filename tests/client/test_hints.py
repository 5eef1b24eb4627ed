"""What a failed connection tells the user, in the SDK and in the `queen` command: the URL it tried
and what to do. Nothing listening: is a server running (`queen serve`). A certificate the client
does not trust: give the CA (`ca_file=` or QUEEN_CA_FILE in the SDK, `--ca-file` in the command).
The TLS cases use a throwaway CA made by the openssl command and a real `queen serve` over HTTPS."""

import os
import subprocess
import sys

import pytest

import queen_client
from queen.testing import ServerProcess, free_port, make_server_cert, make_test_ca
from tests import system_tools

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_openssl = pytest.mark.skipif(system_tools.find("openssl") is None,
                                   reason=system_tools.missing_message("openssl", "the TLS hint tests (a test CA)"))


def queen(*args: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in ("QUEEN_URL", "QUEEN_CA_FILE")}
    return subprocess.run([sys.executable, "-m", "queen", *args], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.fixture(scope="module")
def https_server(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("pki"))
    ca = make_test_ca(directory)
    cert, key = make_server_cert(directory, ca)
    with ServerProcess(os.path.join(directory, "data"), "--tls-cert", cert, "--tls-key", key,
                       ca_file=ca[0]) as server:
        yield server


def test_the_sdk_says_where_it_could_not_connect_and_that_a_server_must_run_there():
    url = f"http://127.0.0.1:{free_port()}"
    with queen_client.SyncClient(url, failover_timeout=None, retries_max=0) as client:
        with pytest.raises(queen_client.CannotConnect) as caught:
            client.kv.get("ns", "k")
    message = str(caught.value)
    assert caught.value.url == url and url in message and "Connection refused" in message
    assert "`queen serve`" in message and not caught.value.certificate


def test_the_command_says_where_it_could_not_connect_and_that_a_server_must_run_there():
    url = f"http://127.0.0.1:{free_port()}"
    done = queen("kv", "get", "ns", "k", "--url", url)
    assert done.returncode == 69
    assert done.stderr.startswith(f"queen: cannot connect to {url}: Connection refused; "), done.stderr
    assert "`queen serve`" in done.stderr and "--url" in done.stderr


@needs_openssl
def test_the_sdk_hints_at_ca_file_when_it_does_not_trust_the_certificate(https_server, monkeypatch):
    monkeypatch.delenv("QUEEN_CA_FILE", raising=False)
    with queen_client.SyncClient(https_server.url) as client:  # the system's CAs only
        with pytest.raises(queen_client.CannotConnect) as caught:
            client.kv.get("ns", "k")
        attempts = client.statistics()["requests"]
    message = str(caught.value)
    assert caught.value.certificate and "CERTIFICATE_VERIFY_FAILED" in message
    assert "ca_file=" in message and "QUEEN_CA_FILE" in message
    assert attempts == 1  # raised at once, failover or not: waiting would not make it trusted


@needs_openssl
def test_the_command_hints_at_its_ca_file_flag_when_it_does_not_trust_the_certificate(https_server):
    done = queen("kv", "get", "ns", "k", "--url", https_server.url)
    assert done.returncode == 69
    assert f"cannot connect to {https_server.url}" in done.stderr and "CERTIFICATE_VERIFY_FAILED" in done.stderr
    assert "--ca-file FILE or QUEEN_CA_FILE" in done.stderr and "ca_file=" not in done.stderr, done.stderr
    trusted = queen("kv", "get", "ns", "k", "--url", https_server.url, "--ca-file", https_server.ca_file)
    assert trusted.returncode == 1 and "cannot connect" not in trusted.stderr, trusted.stderr  # not found


@pytest.fixture(scope="module")
def localhost_only_server(tmp_path_factory):
    """A server over HTTPS whose certificate names localhost only: 127.0.0.1 is not in it."""
    directory = str(tmp_path_factory.mktemp("pki-localhost"))
    ca = make_test_ca(directory)
    cert, key = make_server_cert(directory, ca, alt_names="DNS:localhost")
    with ServerProcess(os.path.join(directory, "data"), "--tls-cert", cert, "--tls-key", key,
                       ca_file=ca[0]) as server:
        yield server


@needs_openssl
def test_an_address_the_certificate_does_not_list_is_told_to_use_a_name_it_lists(localhost_only_server):
    server = localhost_only_server
    assert "://127.0.0.1:" in server.url
    with queen_client.SyncClient(server.url, ca_file=server.ca_file) as client:
        with pytest.raises(queen_client.CannotConnect) as caught:
            client.kv.get("ns", "k")
    message = str(caught.value)
    assert "IP address mismatch" in message and "use a name the certificate lists in the URL" in message
    assert "ca_file" not in message  # the CA was given: it is not what is wrong
    done = queen("kv", "get", "ns", "k", "--url", server.url, "--ca-file", server.ca_file)
    assert done.returncode == 69 and "IP address mismatch" in done.stderr
    assert done.stderr.rstrip().endswith("use a name the certificate lists in --url"), done.stderr
    assert "--ca-file" not in done.stderr
    by_name = queen("kv", "get", "ns", "k", "--url", server.url.replace("127.0.0.1", "localhost"),
                    "--ca-file", server.ca_file)
    assert by_name.returncode == 1 and "cannot connect" not in by_name.stderr, by_name.stderr  # not found


def test_the_backup_and_cluster_commands_hint_at_queen_serve_too(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    backup = queen("backup", str(tmp_path / "x.qbk"), "--url", url)
    switchover = queen("cluster", "switchover", "--url", url)
    for done in (backup, switchover):
        assert done.returncode == 69 and url in done.stderr and "`queen serve`" in done.stderr, done.stderr


@needs_openssl
def test_the_backup_command_hints_at_its_ca_file_flag(https_server, tmp_path):
    done = queen("backup", str(tmp_path / "x.qbk"), "--url", https_server.url)
    assert done.returncode == 69 and "--ca-file FILE or QUEEN_CA_FILE" in done.stderr, done.stderr
