"""`queen serve --access-log` (QUEEN_ACCESS_LOG=1): one line per answered request on stderr, with the
other log lines (logger queen.access), whatever --log-level says; off by default."""

import http.client
import json
import logging

import pytest

from queen.auth import AuthFile
from queen.cli.serve import setup_logging
from queen.testing import ServerProcess, parse_log_line


def call(server: ServerProcess, method: str, target: str, body: bytes | None = None, headers: dict | None = None):
    """(status, x-request-id, body bytes, the client's port) of one request on a fresh connection."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.connect()
        client_port = connection.sock.getsockname()[1]
        connection.request(method, target, body=body, headers={"content-type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, response.getheader("x-request-id"), response.read(), client_port
    finally:
        connection.close()


def access_lines(server: ServerProcess) -> list[dict]:
    return [fields for fields in map(parse_log_line, server.log_text().splitlines())
            if fields.get("logger") == "queen.access"]


def test_without_the_flag_nothing_is_logged_per_request(tmp_path):
    with ServerProcess(str(tmp_path / "data")) as server:
        for _ in range(3):
            assert call(server, "GET", "/healthz")[0] == 200
        assert call(server, "GET", "/nothing")[0] == 404
    assert access_lines(server) == []
    assert "event=access" not in server.log_text()


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_every_answer_is_one_line_with_route_status_time_bytes_request_id_caller_and_address(tmp_path, how):
    path = str(tmp_path / "auth.json")
    auth_file = AuthFile.load(path, missing_ok=True)
    secret = auth_file.add("deployer", "writer", "acme")
    auth_file.save()
    token = {"authorization": f"Bearer {secret}"}
    args = ["--auth-file", path]
    env = None
    if how == "flag":
        args.append("--access-log")
    else:
        env = {"QUEEN_ACCESS_LOG": "1"}
    with ServerProcess(str(tmp_path / "data"), *args, env=env) as server:
        calls = [
            call(server, "PUT", "/api/v1/kv/app/k", b'{"value": 1, "forever": true}', {**token, "x-request-id": "r-1"}),
            call(server, "GET", "/api/v1/kv/app?prefix=k", None, token),  # the route is its template, no query
            call(server, "POST", "/api/v1/kv", b'{"nonsense": 1}', token),
            call(server, "GET", "/api/v1/nothing/here", None, token),
            call(server, "GET", "/healthz"),
            call(server, "GET", "/api/v1/kv/app/k"),  # no token: 401
        ]
        assert server.stop() == 0
    lines = access_lines(server)
    assert len(lines) == len(calls), lines
    expected = [("PUT", "/api/v1/kv/{ns}/{key}", 200, "deployer", "acme"),
                ("GET", "/api/v1/kv/{ns}", 200, "deployer", "acme"),
                ("POST", "/api/v1/kv", 400, "deployer", "acme"),
                ("GET", "/api/v1/nothing/here", 404, "deployer", "acme"),
                ("GET", "/healthz", 200, "-", "-"),
                ("GET", "/api/v1/kv/app/k", 401, "-", "-")]  # refused before its route was looked up: the path
    for line, (status, request_id, body, client_port), want in zip(lines, calls, expected, strict=True):
        assert (line["method"], line["route"], int(line["status"]), line["token"], line["tenant"]) == want, line
        assert int(line["status"]) == status and line["request_id"] == request_id, (line, request_id)
        assert int(line["bytes"]) == len(body) and float(line["duration_ms"]) >= 0, line
        assert line["remote"] == f"127.0.0.1:{client_port}" and line["event"] == "access", line
        assert line["level"] == "info", line
    assert lines[0]["request_id"] == "r-1"
    assert secret not in server.log_text()


def test_the_access_log_shows_whatever_the_log_level():
    """(With --log-level warning a server prints no listening line for ServerProcess to find its
    port by, so this is the logging setup alone.)"""
    access = logging.getLogger("queen.access")
    assert access.level == logging.NOTSET
    try:
        setup_logging("warning", "logfmt", access_log=False)
        assert access.level == logging.NOTSET  # off: it follows the level like any logger
        setup_logging("warning", "logfmt", access_log=True)
        assert access.level == logging.INFO and access.isEnabledFor(logging.INFO)
    finally:
        access.setLevel(logging.NOTSET)


def test_a_refusal_before_a_request_was_read_is_logged_too_and_json_lines_parse(tmp_path):
    with ServerProcess(str(tmp_path / "data"), "--access-log", "--log-format", "json") as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.connect()
        connection.sock.sendall(b"GET /healthz HTTP/1.1\nhost: q\n\n")  # a bare LF: 400 bad_http
        response = http.client.HTTPResponse(connection.sock)
        response.begin()
        body = response.read()
        connection.close()
        assert response.status == 400 and json.loads(body)["code"] == "bad_http"
        request_id = response.getheader("x-request-id")
    [line] = access_lines(server)
    assert (line["method"], line["route"], line["status"], line["request_id"]) == ("-", "-", "400", request_id)
    assert line["bytes"] == str(len(body))
