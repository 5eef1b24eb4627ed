"""The dashboard's files and GET /api/v1/server against a real `queen serve --auth-file`: the page
and its assets need no token and name nothing outside the server; the server's own figures (log,
fsync, connections, data directory) are the operator's alone; an open server shows them to all."""

from __future__ import annotations

import http.client
import os

import pytest

from queen import __version__
from queen.auth import AuthFile
from queen.testing import HttpClient, ServerProcess

BAD = "queen_abcdefghijkl_" + "x" * 43
ASSETS = {"/": "text/html; charset=utf-8", "/dashboard/index.html": "text/html; charset=utf-8",
          "/dashboard/app.js": "text/javascript; charset=utf-8", "/dashboard/app.css": "text/css; charset=utf-8"}
PUBLIC = {"version", "startedAt", "uptimeSeconds"}


def _get(port: int, target: str, secret: str | None = None, method: str = "GET"):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, target, headers={"authorization": f"Bearer {secret}"} if secret else {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dashboard")
    path = str(directory / "auth.json")
    file = AuthFile.load(path, missing_ok=True)
    secrets = {"reader": file.add("acme-reader", "reader", "acme"), "admin": file.add("acme-admin", "admin", "acme"),
               "operator": file.add("ops", "admin", "*")}
    file.save()
    server = ServerProcess(str(directory / "data"), "--auth-file", path).start()
    try:
        yield server, secrets
    finally:
        server.stop()


def test_the_page_and_its_assets_need_no_token(world):
    server, _ = world
    for target, content_type in ASSETS.items():
        for secret in (None, BAD):  # a bad token on a route that needs none is not refused
            status, headers, body = _get(server.port, target, secret)
            assert status == 200, (target, status, body[:200])
            assert headers["content-type"] == content_type, target
            assert headers["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
            assert "script-src 'self'" in headers["content-security-policy"]
            # Offline: nothing fetched from anywhere else (no CDN, no web fonts).
            assert b"http://" not in body and b"https://" not in body and b"@import" not in body, target
    _, _, page = _get(server.port, "/")
    assert b'<script src="/dashboard/app.js"' in page and b'href="/dashboard/app.css"' in page
    # Server text goes in as text: the script never writes markup.
    _, _, script = _get(server.port, "/dashboard/app.js")
    assert b"innerHTML" not in script and b"insertAdjacentHTML" not in script and b"document.write" not in script


def test_unknown_dashboard_files_are_404_and_only_get_is_allowed(world):
    server, secrets = world
    for secret in (None, secrets["reader"]):
        status, _, body = _get(server.port, "/dashboard/nope.js", secret)
        assert status == 404 and b'"not_found"' in body
        status, _, body = _get(server.port, "/dashboard/../auth.json", secret)
        assert status == 404
    status, headers, _ = _get(server.port, "/", None, method="POST")
    assert status == 405
    # Anything else still needs a token: the dashboard's paths open no other door.
    assert _get(server.port, "/api/v1/server")[0] == 401
    assert _get(server.port, "/api/v1/tenant")[0] == 401


def test_server_route_shows_a_tenant_version_and_uptime_only(world):
    server, secrets = world
    for who in ("reader", "admin"):
        status, body = server.request("GET", "/api/v1/server", headers={"authorization": f"Bearer {secrets[who]}"})
        assert status == 200, body
        assert set(body) == PUBLIC, (who, body)
        assert body["version"] == __version__
        assert body["uptimeSeconds"] >= 0
    status, body = server.request("GET", "/api/v1/server?x=1", headers={"authorization": f"Bearer {secrets['reader']}"})
    assert status == 400, body


def test_server_route_shows_the_operator_the_log_fsync_and_connections(world):
    server, secrets = world
    auth = {"authorization": f"Bearer {secrets['operator']}"}
    status, _ = server.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True}, headers=auth)
    assert status == 200
    status, first = server.request("GET", "/api/v1/server", headers=auth)
    assert status == 200, first
    assert PUBLIC < set(first)
    assert first["dataDir"] == os.path.abspath(server.data_dir)
    log = first["log"]
    assert log["segments"] >= 1 and log["bytes"] > 0 and log["failed"] is False and log["durableVersion"] >= 1
    fsync = first["fsync"]
    assert fsync["frames"] >= 1 and fsync["meanMs"] > 0 and fsync["lastMs"] >= 0 and fsync["recentMs"] >= 0
    assert first["connections"]["open"] >= 1 and first["connections"]["max"] >= first["connections"]["open"]
    assert first["requestsTotal"] >= 2
    status, second = server.request("GET", "/api/v1/server", headers=auth)
    assert second["startedAt"] == first["startedAt"] and second["uptimeSeconds"] >= first["uptimeSeconds"]
    assert second["requestsTotal"] > first["requestsTotal"]


def test_server_route_counts_the_operator_its_client_and_server_errors(world):
    """The counters the dashboard's error rates come from: answers 4xx and 5xx since the start."""
    server, secrets = world
    auth = {"authorization": f"Bearer {secrets['operator']}"}
    status, first = server.request("GET", "/api/v1/server", headers=auth)
    assert status == 200 and first["serverErrorsTotal"] == 0, first
    assert server.request("GET", "/api/v1/nope", headers=auth)[0] == 404
    assert server.request("GET", "/api/v1/server?x=1", headers=auth)[0] == 400
    assert server.request("GET", "/api/v1/server")[0] == 401
    status, second = server.request("GET", "/api/v1/server", headers=auth)
    assert second["clientErrorsTotal"] == first["clientErrorsTotal"] + 3, (first, second)
    assert second["serverErrorsTotal"] == 0


def test_a_single_node_says_it_is_single_at_epoch_0_and_serving(world):
    server, secrets = world
    status, body = server.request("GET", "/api/v1/cluster", headers={"authorization": f"Bearer {secrets['reader']}"})
    assert status == 200, body
    assert (body["role"], body["epoch"], body["serving"], body["degraded"]) == ("single", 0, True, False), body


def test_queue_listing_says_when_the_oldest_unfinished_message_was_pushed(world):
    server, secrets = world
    auth = {"authorization": f"Bearer {secrets['admin']}"}
    status, pushed = server.request("POST", "/api/v1/push", {"items": [{"queue": "aging", "payload": 1},
                                                                      {"queue": "aging", "payload": 2}]}, headers=auth)
    assert status == 200, pushed
    oldest = min(item["createdAt"] for item in pushed)

    def listed():
        status, body = server.request("GET", "/api/v1/resources/queues?prefix=aging", headers=auth)
        assert status == 200, body
        [queue] = body["items"]
        return queue["oldestPendingAt"]

    assert listed() == oldest  # nobody reads it yet: its oldest message
    status, popped = server.request("GET", "/api/v1/pop/queue/aging?batch=2", headers=auth)
    assert status == 200 and len(popped["messages"]) == 2, popped
    assert listed() == oldest  # in flight is unfinished too
    status, info = server.request("GET", "/api/v1/resources/queues/aging", headers=auth)
    assert info["groups"][0]["oldestPendingAt"] == oldest
    for message in popped["messages"]:
        status, acked = server.request("POST", "/api/v1/ack", {"partitionId": message["partitionId"], "leaseId":
                                                              message["leaseId"], "offset": message["offset"]},
                                       headers=auth)
        assert status == 200, acked
    assert listed() is None


async def test_an_open_server_shows_everyone_the_whole_server(serve, tmp_path, mock_clock):
    async with serve(tmp_path / "data") as server:
        status, body = await HttpClient(server.port).request("GET", "/api/v1/server")
        assert status == 200, body
        assert body["dataDir"] == os.path.abspath(tmp_path / "data") and "log" in body and "fsync" in body
