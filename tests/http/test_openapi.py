"""GET /api/v1/openapi.json describes every route of the route table, and the running server keeps
to it: schemathesis generates calls of every operation from the document and checks the answers
(no 5xx, a documented status and content type, a body its schema allows)."""

from __future__ import annotations

import re

import cbor2
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from queen import __version__
from queen.auth import AuthFile
from queen.core.limits import Limits
from queen.http.openapi import build_document
from queen.http.routes import HEALTH_PATHS, Api
from queen.testing import ServerProcess

DOCUMENT = build_document(__version__, Limits())
_EXAMPLES = 30  # calls per operation: about 30 s for the ~40 operations on a loaded 2-core machine


def _table_routes(api: Api) -> set[tuple[str, str]]:
    """(method, route key) of every route the server serves: exact paths, patterns' sources, and the
    health paths and dashboard files Api.handle answers inline."""
    routes = {(method.decode(), path) for path, handlers in api.exact.items() for method in handlers}
    routes |= {(method.decode(), pattern.pattern) for pattern, handlers in api.patterns for method in handlers}
    routes |= {("GET", path) for path in (*HEALTH_PATHS, *api.assets)}
    return routes


def _documented(document: dict) -> dict[tuple[str, str], list[str]]:
    """(method, route key) -> the documented paths it serves."""
    found: dict[tuple[str, str], list[str]] = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            found.setdefault((method.upper(), operation["x-queen-route"]), []).append(path)
    return found


def test_every_route_is_documented_and_nothing_else():
    api = Api(None, Limits())
    routes = _table_routes(api)
    documented = _documented(DOCUMENT)
    missing = sorted(routes - set(documented))
    assert not missing, ("routes with no entry in queen/http/openapi.py (add an Operation for each): "
                         + ", ".join(f"{method} {route}" for method, route in missing))
    stale = sorted(set(documented) - routes)
    assert not stale, ("documented but not in the route table: "
                       + ", ".join(f"{method} {route}" for method, route in stale))


def _dispatch(api: Api, path: str) -> str | None:
    """The route key Api.handle picks for a path: an exact path first, then the first pattern."""
    if path in api.exact or path in HEALTH_PATHS or path in api.assets:
        return path
    for pattern, _ in api.patterns:
        if pattern.fullmatch(path):
            return pattern.pattern
    return None


def test_each_documented_path_reaches_the_route_it_names():
    """A path template filled in with plain values is dispatched to the route its entry names: the
    document's paths are the ones a client must call."""
    api = Api(None, Limits())
    for path, item in DOCUMENT["paths"].items():
        sample = re.sub(r"\{leaseId\}", "7", path)
        sample = re.sub(r"\{[^}]+\}", "name-1", sample)
        for method, operation in item.items():
            assert _dispatch(api, sample) == operation["x-queen-route"], (method, path)


def test_every_operation_names_its_least_role_and_answers():
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            assert operation["x-queen-role"] in ("none", "reader", "writer", "admin", "operator"), (method, path)
            assert "200" in operation["responses"], (method, path)
            needs_token = operation["x-queen-role"] != "none"
            assert ("401" in operation["responses"]) == needs_token, (method, path)
            placeholders = set(re.findall(r"\{([^}]+)\}", path))
            in_path = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "path"}
            assert placeholders == in_path, (method, path)


def test_the_documents_roles_are_the_route_tables_levels():
    """x-queen-role says the level the route table asks of a caller before the handler runs."""
    from queen.auth import ADMIN, READ, SERVER, WRITE

    role_of = {READ: "reader", WRITE: "writer", ADMIN: "admin", SERVER: "operator"}
    api = Api(None, Limits())
    levels = {(m.decode(), path): level for path, hs in api.exact.items() for m, (_, level, _) in hs.items()}
    levels |= {(m.decode(), p.pattern): level for p, hs in api.patterns for m, (_, level, _) in hs.items()}
    for item in DOCUMENT["paths"].values():
        for method, operation in item.items():
            key = (method.upper(), operation["x-queen-route"])
            if key in levels:
                assert operation["x-queen-role"] == role_of[levels[key]], key


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(str(tmp_path_factory.mktemp("openapi") / "data")) as process:
        yield process


def test_the_server_serves_the_document(server):
    status, document = server.request("GET", "/api/v1/openapi.json")
    assert status == 200
    assert document == DOCUMENT
    assert document["info"]["version"] == __version__
    status, _ = server.request("GET", "/api/v1/openapi.json?x=1")
    assert status == 400


def _sample(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "name-1", path.replace("{leaseId}", "7"))


def test_tokens_get_the_documented_401_and_403(tmp_path):
    """With an auth file: no token answers 401 on every route but health; a reader's token answers
    403 on every route whose least role is above reader, and a documented status on every other."""
    auth_path = str(tmp_path / "auth.json")
    file = AuthFile.load(auth_path, missing_ok=True)
    reader = file.add("reader", "reader", "alpha")
    file.save()
    with ServerProcess(str(tmp_path / "data"), "--auth-file", auth_path) as secured:
        for path, item in DOCUMENT["paths"].items():
            for method, operation in item.items():
                documented = {int(status) for status in operation["responses"]}
                body = {} if "requestBody" in operation else None
                status, _ = secured.request(method.upper(), _sample(path), body)
                expected = 200 if operation["x-queen-role"] == "none" else 401
                assert status == expected, (method, path, status)
                status, _ = secured.request(method.upper(), _sample(path), body,
                                            headers={"authorization": f"Bearer {reader}"})
                assert status in documented, (method, path, status)
                if operation["x-queen-role"] in ("writer", "admin", "operator"):
                    assert status == 403, (method, path, status)  # the role is checked before the call is read


# -- the property test: the running server against its document ----------------------------------------

schema = schemathesis.openapi.from_dict(DOCUMENT)
# Explicit examples and fuzzing (positive and negative data), seeded. Not the coverage phase: its
# boundary cases per parameter, unbounded by max_examples, took the run from ~30 s to ~165 s.
schema.config.phases.update(phases=["examples", "fuzzing"])
schema.config.generation.update(max_examples=_EXAMPLES, deterministic=True)


@schemathesis.serializer("application/cbor")
def _cbor(ctx, value):
    return cbor2.dumps(value)


_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# How long a generated call may park (waitMs, Queen MQ's timeout): a parked pop or acquire answers
# as documented when its wait runs out, so a shorter wait tests the same and keeps the run short.
_WAIT_MS_CAP = 20


def _capped(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return min(value, _WAIT_MS_CAP)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return str(min(int(value), _WAIT_MS_CAP))
    return value


def _cap_waits(case) -> None:
    if isinstance(case.query, dict):
        for name in ("waitMs", "timeout"):
            if name in case.query:
                case.query[name] = _capped(case.query[name])
        if case.query.get("wait") == "true" and "timeout" not in case.query:
            case.query["timeout"] = _WAIT_MS_CAP  # else Queen MQ's default wait, 30 s
    if isinstance(case.body, dict):
        for op in case.body.get("operations") or ():
            if isinstance(op, dict) and "waitMs" in op:
                op["waitMs"] = _capped(op["waitMs"])


@schema.parametrize()
@settings(max_examples=_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_the_server_keeps_to_its_document(case, server):
    _cap_waits(case)
    try:
        case.call_and_validate(base_url=server.url, checks=_CHECKS, timeout=10)
    finally:
        if case.path in ("/api/v1/pause",):
            # A pause is a documented answer, but it would make every later write of the run answer
            # 503 paused: resume at once.
            status, _ = server.request("POST", "/api/v1/resume", {"kv": True, "queues": True})
            assert status == 200
