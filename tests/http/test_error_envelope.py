"""Every refusal, on every route and at the connection level, has one body:
`{"error": "<message>", "code": "<snake_case>", "details": {...}, "detail": "<message>"}`.

A plain string `error` is what clients show as it is: the public JavaScript client builds
`new Error(body.error)`, which for an object reads `[object Object]`. The walk takes every
documented route (the OpenAPI document, which tests/http/test_openapi.py holds to the route table)
and refuses it several ways: its own bad request, a method it does not take, no token, a token
below its role."""

import json
import re

import orjson
import pytest
import trio
import trio.testing

from queen.auth import AuthFile
from queen.core.limits import Limits
from queen.errors import QueenError
from queen.http.openapi import operations
from queen.http.routes import Api
from queen.http.wire import INTERNAL, INTERNAL_BODY, Request
from queen.testing import open_server

CODE = re.compile(r"[a-z0-9_]+")


def assert_envelope(body, where) -> dict:
    """The refusal's document, checked: nothing more, nothing less than the four fields."""
    document = json.loads(body) if isinstance(body, bytes) else body
    assert isinstance(document, dict) and set(document) == {"error", "code", "details", "detail"}, (where, document)
    assert type(document["error"]) is str and document["error"], (where, document)
    assert document["detail"] == document["error"], (where, document)
    assert type(document["code"]) is str and CODE.fullmatch(document["code"]), (where, document)
    assert type(document["details"]) is dict, (where, document)
    return document


def js_error_message(body: dict) -> str:
    """What the public JavaScript client shows for a refusal: `new Error(body.error).message`, with
    JavaScript's String() of the value (an object turns into "[object Object]")."""
    value = body.get("error")
    if isinstance(value, dict):
        return "[object Object]"
    return "" if value is None else str(value)


async def exchange(port: int, data: bytes) -> tuple[int, dict, bytes]:
    """One request's raw bytes out; (status, headers, body) of the one answer back."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    received = b""
    with trio.move_on_after(30):
        while True:
            head, sep, body = received.partition(b"\r\n\r\n")
            if sep:
                lines = head.split(b"\r\n")
                headers = {k.strip().lower().decode(): v.strip().decode()
                           for k, _, v in (line.partition(b":") for line in lines[1:])}
                if len(body) >= int(headers.get("content-length", "0")):
                    break
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            received += chunk
    await stream.aclose()
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.strip().lower().decode(): v.strip().decode() for k, _, v in (line.partition(b":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body[:int(headers.get("content-length", "0"))]


def request(method: str, target: str, body: bytes | None = None, token: str | None = None) -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
    if token is not None:
        head += f"authorization: Bearer {token}\r\n"
    data = body or b""
    return (head + f"content-length: {len(data)}\r\nconnection: close\r\n\r\n").encode() + data


PATH_VALUES = {"ns": "app", "key": "k", "queue": "q", "partition": "p", "leaseId": "1", "group": "g"}


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda match: PATH_VALUES.get(match.group(1), "x"), path)


ROLE_LEVEL = {"none": 0, "reader": 1, "writer": 2, "admin": 3, "operator": 4}


@pytest.fixture
def tokens(tmp_path):
    path = str(tmp_path / "auth.json")
    auth_file = AuthFile.load(path, missing_ok=True)
    secrets = {"operator": auth_file.add("ops", "admin", "*"), "reader": auth_file.add("look", "reader", "acme")}
    auth_file.save()
    return path, secrets


async def test_every_route_refuses_with_a_string_error_code_details_and_detail(tmp_path, tokens, autojump_clock):
    auth_path, secrets = tokens
    operator, reader = secrets["operator"], secrets["reader"]
    seen: dict[tuple[str, str], list[int]] = {}
    async with open_server(tmp_path / "d", auth_file=auth_path) as server:
        for op in operations():
            target = concrete(op.path)
            where = (op.method, op.path)
            tries = []
            if op.body is not None:
                tries.append(("malformed body", request(op.method, target, b"{", operator)))
            else:
                tries.append(("unknown parameter", request(op.method, target + "?nonsense=1", None, operator)))
            tries.append(("a method it does not take", request("PATCH", target, None, operator)))
            if op.role != "none":
                tries.append(("no token", request(op.method, target, None)))
            if ROLE_LEVEL[op.role] > ROLE_LEVEL["reader"]:
                tries.append(("a reader's token", request(op.method, target, None, reader)))
            for what, data in tries:
                status, headers, body = await exchange(server.port, data)
                if status < 400 and what == "unknown parameter":
                    continue  # a route that reads no parameters takes any: the other tries refuse it
                assert 400 <= status < 500, (where, what, status, body)
                document = assert_envelope(body, (where, what))
                assert headers["content-type"] == "application/json", (where, what)
                seen.setdefault(where, []).append(status)
                if what == "no token":
                    assert (status, document["code"]) == (401, "unauthenticated"), (where, document)
                elif what == "a reader's token":
                    assert (status, document["code"]) == (403, "forbidden"), (where, document)
                elif what == "a method it does not take":
                    assert (status, document["code"]) == (405, "method_not_allowed"), (where, document)
                    assert op.method in document["details"]["allow"], (where, document)
                elif what == "malformed body":
                    assert (status, document["code"]) == (400, "invalid_json"), (where, document)
    assert {(op.method, op.path) for op in operations()} <= set(seen)
    assert {400, 401, 403, 405} <= {status for statuses in seen.values() for status in statuses}


async def test_a_route_that_does_not_exist_answers_404_in_the_envelope(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        for target in ("/nothing/here", "/api/v1/nothing", "/dashboard/nothing.js"):
            status, _, body = await exchange(server.port, request("GET", target))
            assert status == 404 and assert_envelope(body, target)["code"] == "not_found", (target, body)


CONNECTION_REFUSALS = {
    "a bare LF": (b"GET /healthz HTTP/1.1\nhost: q\n\n", 400, "bad_http"),
    "a folded header": (b"GET /healthz HTTP/1.1\r\nhost: q\r\nx-a: 1\r\n  2\r\n\r\n", 400, "bad_http"),
    "two framings": (b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
                     400, "bad_http"),
    "malformed HTTP": (b"GET /healthz HTTP/1.1\r\nhost: q\r\nno colon here\r\n\r\n", 400, "bad_http"),
    "a body over the limit": (b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ncontent-length: 99999999\r\n\r\n",
                              413, "body_too_large"),
    "a chunk over the limit": (b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\ntransfer-encoding: chunked\r\n\r\nffffffff\r\n",
                               413, "body_too_large"),
    "a head over the limit": (b"GET /healthz HTTP/1.1\r\nhost: q\r\nx-big: " + b"a" * 20_000 + b"\r\n\r\n",
                              431, "head_too_large"),
}


@pytest.mark.parametrize("what", list(CONNECTION_REFUSALS))
async def test_refusals_of_the_http_layer_have_the_envelope(what, tmp_path, autojump_clock):
    data, expected_status, expected_code = CONNECTION_REFUSALS[what]
    async with open_server(tmp_path / "d") as server:
        status, _, body = await exchange(server.port, data)
        assert (status, assert_envelope(body, what)["code"]) == (expected_status, expected_code), body


async def test_a_stalled_request_and_a_full_server_answer_in_the_envelope(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d", connections_max=1, request_read_timeout_s=5) as server:
        stalled = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stalled.send_all(b"POST /api/v1/kv HTTP/1.1\r\nhost: q\r\n")  # busy: not idle, not parked
        await trio.testing.wait_all_tasks_blocked()
        status, _, body = await exchange(server.port, request("GET", "/healthz"))
        assert (status, assert_envelope(body, "full")["code"]) == (503, "too_many_connections")
        received = b""
        while chunk := await stalled.receive_some(65536):  # the reaper answers it in virtual time
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and assert_envelope(body, "stalled")["code"] == "request_timeout"
        await stalled.aclose()


async def test_a_failing_handler_answers_500_in_the_envelope(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        real = server.http.app.handle

        async def failing(request):
            if request.target == b"/boom":
                raise RuntimeError("a bug")
            return await real(request)

        server.http.app.handle = failing
        status, _, body = await exchange(server.port, request("GET", "/boom"))
        assert (status, assert_envelope(body, "500")["code"]) == (500, "internal")


def test_the_fixed_last_resort_body_is_the_internal_error_s_envelope():
    assert INTERNAL_BODY.endswith(b"}\n")
    assert orjson.loads(INTERNAL_BODY) == INTERNAL.to_wire()
    assert_envelope(INTERNAL_BODY, "INTERNAL_BODY")


def test_details_are_always_an_object_and_the_message_is_the_error():
    wire = QueenError("some_code", "what went wrong").to_wire()
    assert wire == {"error": "what went wrong", "code": "some_code", "details": {}, "detail": "what went wrong"}


class NotServing:
    """A cluster node that does not lead (queen/cluster/coordinator.py's face to the routes)."""

    serving = False
    epoch = 7
    sync = None

    def __init__(self, leader_advertise: str | None, role: str = "follower"):
        self.leader_advertise = leader_advertise
        self.role = role


class _Router:
    class writer:  # noqa: N801 - stands for the router's writer
        durable_version = 0
        failed = None

    draining = False


@pytest.mark.parametrize("cluster,status,code", [
    (NotServing("http://leader:6632"), 307, "not_leader"),
    (NotServing(None, "fenced"), 503, "not_leader"),
    (NotServing(None, "follower"), 503, "no_leader"),
])
async def test_a_node_that_does_not_lead_answers_in_the_envelope(cluster, status, code):
    api = Api(_Router(), Limits())
    api.cluster = cluster
    try:
        answer = await api.handle(Request(b"GET", b"/api/v1/kv/app/k", b"", b"", b""))
        got_status, body = answer.status, answer.body
    except QueenError as refused:
        got_status, body = refused.http_status, orjson.dumps(refused.to_wire())
    assert (got_status, assert_envelope(body, code)["code"]) == (status, code)
    assert assert_envelope(body, code)["details"]["epoch"] == 7


async def test_a_javascript_client_shows_the_refusal_s_message_not_object_object(tmp_path, autojump_clock):
    """The public JavaScript client: `if (!response.ok) throw new Error(body.error)`."""
    async with open_server(tmp_path / "d") as server:
        refusals = [
            request("POST", "/api/v1/kv", b'{"operations": [{"op": "get", "ns": "app"}]}'),  # no key
            request("PUT", "/api/v1/kv/app/k", b'{"value": 1}'),  # no lifetime
            request("GET", "/api/v1/nothing"),
        ]
        for data in refusals:
            status, _, raw = await exchange(server.port, data)
            body = json.loads(raw)
            assert status >= 400 and type(body["error"]) is str, body
            message = js_error_message(body)
            assert message != "[object Object]" and message == body["detail"] and len(message) > 10, body
