"""Tokens from the shell and the SDK against a real `queen serve --auth-file`: `queen auth
add|list|remove`, the SDK's and the CLI's token (QUEEN_TOKEN, --auth-token), SIGHUP, the refusal to
listen open on a non-loopback address, and no secret in any log line, metric or error answer."""

import json
import os
import signal
import subprocess
import sys

import anyio
import pytest

import queen_client
from queen.testing import ServerProcess

QUEEN = [sys.executable, "-m", "queen"]


def run(*args, env=None, stdin=None):
    return subprocess.run([*QUEEN, *args], env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          input=stdin, timeout=60)


def add_token(path, name, role, tenant):
    done = run("auth", "add", name, "--role", role, "--tenant", tenant, "--auth-file", path)
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert secret.startswith("queen_") and len(secret) > 50
    assert secret not in done.stderr
    return secret


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A server with an auth file: (server, auth file path, {name: secret})."""
    directory = tmp_path_factory.mktemp("auth")
    path = str(directory / "auth.json")
    secrets = {"writer": add_token(path, "acme-writer", "writer", "acme"),
               "reader": add_token(path, "acme-reader", "reader", "acme"),
               "operator": add_token(path, "ops", "admin", "*")}
    with ServerProcess(str(directory / "data"), "--auth-file", path) as server:
        yield server, path, secrets


def test_the_auth_file_holds_no_secret_and_list_shows_none(secured):
    server, path, secrets = secured
    text = open(path).read()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    listing = run("auth", "list", "--auth-file", path, "--json")
    assert listing.returncode == 0
    rows = [json.loads(line) for line in listing.stdout.splitlines()]
    assert {(row["name"], row["role"], row["tenant"]) for row in rows} == {
        ("acme-writer", "writer", "acme"), ("acme-reader", "reader", "acme"), ("ops", "admin", "*")}
    for secret in secrets.values():
        hidden = secret.split("_", 2)[2]
        assert hidden not in text and hidden not in listing.stdout


def test_the_cli_sends_the_token_from_the_variable_or_the_flag(secured):
    server, _, secrets = secured
    env = {"QUEEN_URL": server.url}
    refused = run("kv", "put", "app", "k", "1", "--forever", env=env)
    assert refused.returncode == 65 and "unauthenticated" in refused.stderr
    assert secrets["writer"] not in refused.stderr
    done = run("kv", "put", "app", "k", "1", "--forever", env={**env, "QUEEN_TOKEN": secrets["writer"]})
    assert done.returncode == 0, done.stderr
    got = run("kv", "get", "app", "k", "--json", "--auth-token", secrets["reader"], env=env)
    assert got.returncode == 0 and json.loads(got.stdout)["value"] == 1
    forbidden = run("kv", "put", "app", "k", "2", "--forever", "--auth-token", secrets["reader"], env=env)
    assert forbidden.returncode == 65 and "forbidden" in forbidden.stderr
    # The operator's names are the default tenant's: acme's k is not among them.
    other = run("kv", "get", "app", "k", "--auth-token", secrets["operator"], env=env)
    assert other.returncode == 1


def test_the_sdk_takes_a_token_and_raises_auth_errors(secured):
    server, _, secrets = secured

    async def main():
        async with queen_client.Client(server.url, token=secrets["writer"]) as client:
            await client.kv.put("app", "sdk", {"n": 1}, forever=True)
            assert (await client.kv.get("app", "sdk")).value == {"n": 1}
        async with queen_client.Client(server.url, token=secrets["reader"]) as client:
            with pytest.raises(queen_client.AuthError) as refused:
                await client.kv.put("app", "sdk", 2, forever=True)
            assert refused.value.status == 403 and refused.value.code == "forbidden"
        async with queen_client.Client(server.url, token="queen_aaaaaaaaaaaa_not-a-real-secret") as client:
            with pytest.raises(queen_client.AuthError) as refused:
                await client.kv.get("app", "sdk")
            assert refused.value.status == 401

    anyio.run(main)


def test_a_removed_token_stops_working_at_sighup(secured, tmp_path):
    server, path, _ = secured
    secret = add_token(path, "short-lived", "writer", "acme")
    reloads = server.log_text().count("event=reloaded")
    server.process.send_signal(signal.SIGHUP)
    wait_for_log(server, "event=reloaded", reloads + 1)
    env = {"QUEEN_URL": server.url, "QUEEN_TOKEN": secret}
    assert run("kv", "put", "app", "t", "1", "--forever", env=env).returncode == 0
    removed = run("auth", "remove", "short-lived", "--auth-file", path)
    assert removed.returncode == 0
    assert run("auth", "remove", "short-lived", "--auth-file", path).returncode == 1
    server.process.send_signal(signal.SIGHUP)
    wait_for_log(server, "event=reloaded", reloads + 2)
    assert run("kv", "put", "app", "t", "1", "--forever", env=env).returncode == 65
    log = server.log_text()
    assert "action=token_added token=short-lived" in log and "action=token_removed token=short-lived" in log


def wait_for_log(server, text, count, timeout_s=20.0):
    """Poll the real process's log; not a wait for time to pass."""
    import time

    deadline = time.monotonic() + timeout_s
    while server.log_text().count(text) < count:
        assert time.monotonic() < deadline, server.log_text()[-2000:]
        time.sleep(0.02)


def test_no_secret_in_logs_metrics_or_error_answers(secured):
    """Every secret of the run, valid or a near miss, sent in every way a client might: none comes
    back in an answer, a metric or a log line (debug level included, on a server of its own)."""
    server, path, secrets = secured
    near_misses = [secret[:-1] + ("A" if secret[-1] != "A" else "B") for secret in secrets.values()]
    answers = []
    for secret in [*secrets.values(), *near_misses, "queen_zzzzzzzzzzzz_" + "x" * 43]:
        for header in (f"Bearer {secret}", f"bearer  {secret}", f"Basic {secret}", secret):
            for method, target, body in (("GET", "/api/v1/kv/app/k", None), ("PUT", "/api/v1/kv/app/k", {"value": 1}),
                                         ("POST", "/api/v1/pause", {"kv": True}), ("GET", "/metrics", None),
                                         ("DELETE", "/api/v1/resources/queues/q", None), ("GET", "/nowhere", None)):
                status, answer = server.request(method, target, body, headers={"authorization": header})
                answers.append(answer if isinstance(answer, bytes) else json.dumps(answer).encode())
    metrics = server.request("GET", "/metrics", headers={"authorization": f"Bearer {secrets['operator']}"})[1]
    seen = b"".join(answers) + (metrics if isinstance(metrics, bytes) else json.dumps(metrics).encode())
    seen += server.log_text().encode()
    for secret in [*secrets.values(), *near_misses]:
        hidden = secret.split("_", 2)[2].encode()
        assert hidden not in seen


def test_a_non_loopback_bind_without_an_auth_file_refuses_naming_insecure(tmp_path):
    done = run("serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 2
    assert "--insecure" in done.stderr and "--auth-file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists()


def test_a_bad_auth_file_refuses_to_start_with_one_line(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text('{"tokens": [{"name": "x"}]}')
    done = run("serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "--auth-file", str(path))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "level=error" in line]
    assert len(errors) == 1 and "reason=auth_file" in errors[0] and "Traceback" not in done.stderr
