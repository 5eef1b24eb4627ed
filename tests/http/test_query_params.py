"""A query parameter a route does not take is refused (400 `unknown_field`, naming it), on every
route, never ignored: a misspelt `?expect=` on a one-key delete once made it a blind delete, and a
`?prefx=` listed the whole namespace. The walk takes every documented route (the OpenAPI document,
which tests/http/test_openapi.py holds to the route table); /metrics is left out (what a scraper
adds to its URL is its own business, and it only reads)."""

import pytest

from queen.http.openapi import operations
from queen.testing import HttpClient, open_server
from tests.http.test_error_envelope import PATH_VALUES, concrete

ANY_PARAMETER = frozenset({("GET", "/metrics")})


async def test_every_route_refuses_a_query_parameter_it_does_not_take(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        walked = 0
        for op in operations():
            if (op.method, op.path) in ANY_PARAMETER or op.role == "none":
                continue
            target = concrete(op.path) + "?nonsense=1"
            status, body = await client.request(op.method, target, b"{}" if op.body else None)
            assert (status, body["code"], body["details"].get("field")) == (400, "unknown_field", "nonsense"), (
                op.method, op.path, status, body)
            walked += 1
        assert walked >= 30
        await client.aclose()


@pytest.mark.parametrize("method, target, body", [
    ("DELETE", "/api/v1/kv/app/k?expct=1", None),  # the misspelt expect
    ("PUT", "/api/v1/kv/app/k?expect=1", b'{"value": 3, "ttlSeconds": 600}'),  # expect belongs in the body
    ("GET", "/api/v1/kv/app?prefx=a", None),
    ("GET", "/api/v1/locks?prefx=a", None),
])
async def test_a_misspelt_or_misplaced_parameter_changes_nothing(tmp_path, autojump_clock, method, target, body):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        status, put = await client.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True})
        assert status == 200 and put["version"] == 1
        status, refused = await client.request(method, target, body)
        assert status == 400 and refused["code"] == "unknown_field", refused
        status, read = await client.request("GET", "/api/v1/kv/app/k")
        assert (read["found"], read["value"], read["version"]) == (True, 1, 1)
        await client.aclose()


def test_the_walk_knows_every_path_parameter():
    named = {part[1:-1] for op in operations() for part in op.path.split("/") if part.startswith("{")}
    assert named <= set(PATH_VALUES), named - set(PATH_VALUES)
