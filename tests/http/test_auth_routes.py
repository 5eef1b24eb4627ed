"""Every route and method of the API, for every kind of caller, against a real `queen serve
--auth-file`: who gets 401, who gets 403, and that everyone else gets an answer about their request.

The table ROWS holds one representative, valid request per route x method of queen/http/routes.py
(and, for the routes whose level depends on the body, one that only reads and one that writes);
test_the_table_covers_every_route_of_the_api fails when a route is added to the API without a row
here. Each row runs against the callers:

- no token, and a well-formed token that is not in the file: 401 with `WWW-Authenticate: Bearer
  realm="queen"` (error="invalid_token" for the second);
- a reader, a writer and an admin of tenant `acme`, an admin of another tenant and the operator
  (admin of `*`): 403 with error="insufficient_scope" below the row's level, otherwise an answer
  that is neither 401/403 nor 5xx.

Before each row, acme's admin seeds what the row names (a key, a lock, a queue with a leased
message, a DLQ entry, a consumer group, a timer). The admin of the other tenant (a tenant of its
own per row, so nothing of an earlier row is its) names exactly acme's things, ids included: it
must get the answer of a tenant for which they do not exist, and acme's things must be unchanged
after its call; the operator, whose names are the default tenant's, must leave them unchanged too.
A 401 or 403 must be the same answer whether or not the things named exist.
"""

from __future__ import annotations

import http.client
import json
from collections import namedtuple
from dataclasses import dataclass

import pytest

from queen.auth import ADMIN, READ, SERVER, WRITE, AuthFile
from queen.core.limits import Limits
from queen.http.routes import Api
from queen.testing import ServerProcess

Answer = namedtuple("Answer", "status headers body")
NO_SUCH_ID = 987_654_321_012


class Caller:
    """Requests with one Authorization header (None: none), on a fresh connection each."""

    def __init__(self, port: int, secret: str | None):
        self.port = port
        self.secret = secret

    def __call__(self, method: str, target: str, body=None) -> Answer:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"content-type": "application/json"}
        if self.secret is not None:
            headers["authorization"] = f"Bearer {self.secret}"
        try:
            connection.request(method, target, body=None if body is None else json.dumps(body).encode(),
                               headers=headers)
            response = connection.getresponse()
            raw = response.read()
            answer_headers = {name.lower(): value for name, value in response.getheaders()}
        finally:
            connection.close()
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = raw
        return Answer(response.status, answer_headers, decoded)


# -- what a row names ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Names:
    ns: str = "app"
    key: str = "k"
    kv_version: int = 1
    lock: str = "L"
    lock_token: int = NO_SUCH_ID
    queue: str = "orders"
    partition: str = "nopart"
    free_partition: str = "nopart"  # a partition holding a message nobody leased
    partition_id: int = NO_SUCH_ID
    lease_id: int = NO_SUCH_ID
    offset: int = 0
    dlq_partition_id: int = NO_SUCH_ID
    dlq_offset: int = 0
    group: str = "g"
    timer: str = "t"


# What a caller names when the things do not exist: for the existence oracle check.
ABSENT = Names(ns="nons", key="nokey", lock="nolock", queue="noqueue", partition="nopart", group="nogroup",
               timer="notimer")


def seed(admin: Caller, n: int) -> Names:
    """Acme's things, as acme's admin makes them before row n."""
    def ok(answer):
        assert answer.status == 200, answer
        return answer.body

    put = ok(admin("PUT", "/api/v1/kv/app/k", {"value": "acme-value", "forever": True}))
    [lock] = ok(admin("POST", "/api/v1/locks", {"operations": [
        {"op": "acquire", "name": "L", "ttlSeconds": 300, "owner": "seed"}]}))["results"]
    assert lock["acquired"] is True, lock
    ok(admin("POST", "/api/v1/push", {"items": [{"queue": "orders", "partition": f"p{n}", "payload": "work"},
                                                 {"queue": "orders", "partition": f"d{n}", "payload": "poison"},
                                                 {"queue": "orders", "partition": f"g{n}", "payload": "grouped"},
                                                 {"queue": "orders", "partition": f"f{n}", "payload": "free"}]}))
    got = ok(admin("GET", f"/api/v1/pop/queue/orders/partition/p{n}"))
    assert got["success"] is True, got
    poison = ok(admin("GET", f"/api/v1/pop/queue/orders/partition/d{n}"))["messages"][0]
    moved = ok(admin("POST", "/api/v1/ack", {"partitionId": poison["partitionId"], "leaseId": poison["leaseId"],
                                             "offset": poison["offset"], "status": "dlq"}))
    assert moved["dlq"] is True, moved
    assert ok(admin("GET", f"/api/v1/pop/queue/orders/partition/g{n}?consumerGroup=g"))["success"] is True
    [timer] = ok(admin("POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "orders", "key": "t", "delayMs": 3_600_000, "payload": "tick"}]}))["results"]
    assert timer["ok"] is True, timer
    message = got["messages"][0]
    return Names(kv_version=put["version"], lock_token=lock["token"], partition=f"p{n}", free_partition=f"f{n}",
                 partition_id=got["partitionId"], lease_id=got["leaseId"], offset=message["offset"],
                 dlq_partition_id=poison["partitionId"], dlq_offset=poison["offset"])


def acme_state(admin: Caller) -> list:
    """Everything of acme's that a row could touch, as acme's admin reads it."""
    reads = [("GET", "/api/v1/kv/app/k", None),
             ("POST", "/api/v1/locks", {"operations": [{"op": "get", "name": "L"}]}),
             ("GET", "/api/v1/resources/queues/orders", None),
             ("GET", "/api/v1/resources/queues/orders/partitions?limit=1000", None),
             ("GET", "/api/v1/dlq?queue=orders&limit=1000", None),
             ("GET", "/api/v1/timers/orders/t", None),
             ("GET", "/api/v1/resources/queues", None),
             ("GET", "/api/v1/tenant", None)]
    state = []
    for method, target, body in reads:
        answer = admin(method, target, body)
        assert answer.status == 200, (target, answer)
        state.append(answer.body)
    return state


# -- the table -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    route: str  # an exact path of Api.exact, or the pattern of one of Api.patterns
    method: str
    level: int
    request: object  # Names -> (target, body)
    absent: object = None  # the other tenant's answer body -> bool: what a tenant without these things gets
    undo: object = None  # (target, body) sent by the same caller after a 2xx, to put back what it changed
    status: int = 0  # what a caller with every right gets when not a 2xx: a cluster call on a server alone


def _ack(n: Names) -> dict:
    return {"partitionId": n.partition_id, "leaseId": n.lease_id, "offset": n.offset}


ROWS = [
    # KV
    Row("/api/v1/kv", "POST", READ, lambda n: ("/api/v1/kv", {"operations": [{"op": "get", "ns": n.ns, "key": n.key}]}),
        lambda b: b["results"][0]["found"] is False),
    Row("/api/v1/kv", "POST", WRITE, lambda n: ("/api/v1/kv", {"operations": [
        {"op": "put", "ns": n.ns, "key": n.key, "value": "written", "expect": n.kv_version, "forever": True}]}),
        lambda b: b["results"][0]["applied"] is False),
    Row(r"/api/v1/kv/(.+)", "GET", READ, lambda n: (f"/api/v1/kv/{n.ns}/{n.key}", None),
        lambda b: b["found"] is False),
    Row(r"/api/v1/kv/(.+)", "GET", READ, lambda n: (f"/api/v1/kv/{n.ns}?prefix=", None),
        lambda b: b["items"] == []),
    Row(r"/api/v1/kv/(.+)", "PUT", WRITE, lambda n: (f"/api/v1/kv/{n.ns}/{n.key}", {"value": "x", "ifAbsent": True,
                                                                                     "forever": True}),
        lambda b: b["applied"] is True),
    Row(r"/api/v1/kv/(.+)", "DELETE", WRITE, lambda n: (f"/api/v1/kv/{n.ns}/{n.key}", None),
        lambda b: b["applied"] is False),
    Row(r"/api/v1/kv/(.+)", "POST", WRITE, lambda n: (f"/api/v1/kv/{n.ns}/{n.key}/incr", {"by": 1, "forever": True}),
        lambda b: b["value"] == 1),
    # locks
    Row("/api/v1/locks", "POST", READ, lambda n: ("/api/v1/locks", {"operations": [{"op": "get", "name": n.lock}]}),
        lambda b: b["results"][0]["held"] is False),
    Row("/api/v1/locks", "POST", WRITE, lambda n: ("/api/v1/locks", {"operations": [
        {"op": "release", "name": n.lock, "token": n.lock_token}]}),
        lambda b: b["results"][0]["released"] is False and b["results"][0]["reason"] == "absent"),
    Row("/api/v1/locks", "POST", WRITE, lambda n: ("/api/v1/locks", {"operations": [
        {"op": "acquire", "name": n.lock, "ttlSeconds": 30, "owner": "seed"}]}),
        lambda b: b["results"][0]["acquired"] is True and "already" not in b["results"][0]),
    Row("/api/v1/locks", "GET", READ, lambda n: (f"/api/v1/locks?prefix={n.lock}", None),
        lambda b: b["items"] == []),
    # transactions
    Row("/api/v1/transaction", "POST", READ, lambda n: ("/api/v1/transaction", {"kv": [
        {"op": "check", "ns": n.ns, "key": n.key, "expect": n.kv_version}]}),
        lambda b: b["success"] is False),
    Row("/api/v1/transaction", "POST", WRITE, lambda n: ("/api/v1/transaction", {"kv": [
        {"op": "put", "ns": n.ns, "key": n.key, "value": "txn", "expect": n.kv_version, "forever": True}]}),
        lambda b: b["success"] is False),
    Row("/api/v1/transaction", "POST", WRITE, lambda n: ("/api/v1/transaction", {
        "ack": [_ack(n)], "push": [{"queue": n.queue, "partition": "next", "payload": "after"}]}),
        lambda b: b["success"] is False),
    # timers
    Row("/api/v1/timers", "POST", READ, lambda n: ("/api/v1/timers", {"operations": [
        {"op": "get", "queue": n.queue, "key": n.timer}]}),
        lambda b: b["results"][0]["found"] is False),
    Row("/api/v1/timers", "POST", WRITE, lambda n: ("/api/v1/timers", {"operations": [
        {"op": "cancel", "queue": n.queue, "key": n.timer}]}),
        lambda b: b["results"][0]["cancelled"] is False),
    Row("/api/v1/timers", "GET", READ, lambda n: (f"/api/v1/timers?queue={n.queue}", None),
        lambda b: b["items"] == []),
    Row(r"/api/v1/timers/([^/]+)/(.+)", "GET", READ, lambda n: (f"/api/v1/timers/{n.queue}/{n.timer}", None),
        lambda b: b["found"] is False),
    Row(r"/api/v1/timers/([^/]+)/(.+)", "DELETE", WRITE, lambda n: (f"/api/v1/timers/{n.queue}/{n.timer}", None),
        lambda b: b["status"] == "absent"),
    Row(r"/api/v1/timers/([^/]+)", "GET", READ, lambda n: (f"/api/v1/timers/{n.queue}", None),
        lambda b: b["rows"] == []),
    # queues
    Row("/api/v1/configure", "POST", WRITE, lambda n: ("/api/v1/configure", {"queue": n.queue,
                                                                           "options": {"retryLimit": 4}}),
        lambda b: b["created"] is True),
    Row("/api/v1/push", "POST", WRITE, lambda n: ("/api/v1/push", {"items": [
        {"queue": n.queue, "partition": n.partition, "payload": "more"}]}),
        lambda b: b[0]["status"] == "queued"),
    Row(r"/api/v1/pop/queue/([^/]+)", "GET", WRITE, lambda n: (f"/api/v1/pop/queue/{n.queue}?batch=10", None),
        lambda b: b["messages"] == []),
    Row(r"/api/v1/pop/queue/([^/]+)/partition/([^/]+)", "GET", WRITE,
        lambda n: (f"/api/v1/pop/queue/{n.queue}/partition/{n.free_partition}", None),
        lambda b: b["messages"] == []),
    Row("/api/v1/ack", "POST", WRITE, lambda n: ("/api/v1/ack", _ack(n)),
        lambda b: b["success"] is False),
    Row("/api/v1/ack/batch", "POST", WRITE, lambda n: ("/api/v1/ack/batch", {"acknowledgments": [_ack(n)]}),
        lambda b: b[0]["success"] is False),
    Row(r"/api/v1/lease/([^/]+)/(extend|release)", "POST", WRITE,
        lambda n: (f"/api/v1/lease/{n.lease_id}/extend", {"seconds": 60}),
        lambda b: b["success"] is False and b["reason"] == "lease_lost"),
    Row(r"/api/v1/lease/([^/]+)/(extend|release)", "POST", WRITE,
        lambda n: (f"/api/v1/lease/{n.lease_id}/release", {}),
        lambda b: b["success"] is False and b["reason"] == "lease_lost"),
    Row("/api/v1/dlq", "GET", READ, lambda n: (f"/api/v1/dlq?queue={n.queue}", None),
        lambda b: b["total"] == 0 and b["messages"] == []),
    Row("/api/v1/dlq", "DELETE", ADMIN, lambda n: (f"/api/v1/dlq?queue={n.queue}", None),
        lambda b: b["purged"] == 0),
    Row("/api/v1/dlq/requeue", "POST", WRITE, lambda n: ("/api/v1/dlq/requeue", {"queue": n.queue, "items": [
        {"partitionId": n.dlq_partition_id, "offset": n.dlq_offset}]}),
        lambda b: b["results"][0]["requeued"] is False),
    Row("/api/v1/resources/queues", "GET", READ, lambda n: ("/api/v1/resources/queues", None),
        lambda b: b["items"] == []),
    Row(r"/api/v1/resources/queues/([^/]+)", "GET", READ, lambda n: (f"/api/v1/resources/queues/{n.queue}", None),
        lambda b: b["found"] is False),
    Row(r"/api/v1/resources/queues/([^/]+)/partitions", "GET", READ,
        lambda n: (f"/api/v1/resources/queues/{n.queue}/partitions", None),
        lambda b: b["items"] == []),
    Row(r"/api/v1/consumer-groups/([^/]+)/queues/([^/]+)", "DELETE", ADMIN,
        lambda n: (f"/api/v1/consumer-groups/{n.group}/queues/{n.queue}", None),
        lambda b: b["deleted"] is False),
    Row(r"/api/v1/consumer-groups/([^/]+)", "DELETE", ADMIN, lambda n: (f"/api/v1/consumer-groups/{n.group}", None),
        lambda b: b["deleted"] is False and b["queues"] == []),
    Row(r"/api/v1/resources/queues/([^/]+)", "DELETE", ADMIN, lambda n: (f"/api/v1/resources/queues/{n.queue}", None),
        lambda b: b["deleted"] is False),
    # tenants and the server
    Row("/api/v1/tenant", "GET", READ, lambda n: ("/api/v1/tenant", None),
        lambda b: b["usage"] is None or b["usage"] == {"keys": 0, "bytes": 0, "messages": 0, "timers": 0}),
    Row("/api/v1/tenants", "GET", SERVER, lambda n: ("/api/v1/tenants", None)),
    Row("/api/v1/admin/snapshot", "GET", SERVER, lambda n: ("/api/v1/admin/snapshot", None)),
    Row("/api/v1/pause", "POST", ADMIN, lambda n: ("/api/v1/pause", {"kv": True, "queues": True}),
        lambda b: b["paused"] == {"kv": True, "queues": True},
        undo=("/api/v1/resume", {"kv": True, "queues": True})),
    Row("/api/v1/resume", "POST", ADMIN, lambda n: ("/api/v1/resume", {"kv": True, "queues": True}),
        lambda b: b["paused"] == {"kv": False, "queues": False}),
    # the cluster (this server runs alone: the status says so, the operator's calls answer 409)
    Row("/api/v1/cluster", "GET", READ, lambda n: ("/api/v1/cluster", None), lambda b: b["role"] == "single"),
    Row("/api/v1/cluster/switchover", "POST", SERVER, lambda n: ("/api/v1/cluster/switchover", {}), status=409),
    Row("/api/v1/cluster/force-promote", "POST", SERVER, lambda n: ("/api/v1/cluster/force-promote", {"node": "n2"}),
        status=409),
    Row("/api/v1/server", "GET", READ, lambda n: ("/api/v1/server", None),
        lambda b: set(b) == {"version", "startedAt", "uptimeSeconds"}),  # the server's own figures: operator only
    Row("/metrics", "GET", READ, lambda n: ("/metrics", None),
        lambda b: b'queue="orders"' not in b and b'tenant="acme"' not in b),
    # the API reference: the same document for every caller, naming no tenant's data
    Row("/api/v1/openapi.json", "GET", READ, lambda n: ("/api/v1/openapi.json", None),
        lambda b: "/api/v1/kv" in b["paths"]),
]

# The level of each caller (0: no valid token). The other tenant's admin is a tenant of its own per row.
CALLERS = {"none": 0, "bad": 0, "reader": READ, "writer": WRITE, "other-admin": ADMIN, "admin": ADMIN,
           "operator": SERVER}


def api_routes() -> set[tuple[str, str]]:
    api = Api(None, Limits())
    routes = {(path, method.decode()) for path, handlers in api.exact.items() for method in handlers}
    routes |= {(pattern.pattern, method.decode()) for pattern, handlers in api.patterns for method in handlers}
    return routes


def test_the_table_covers_every_route_of_the_api():
    table = {(row.route, row.method) for row in ROWS}
    assert api_routes() - table == set(), "routes without a row in ROWS: add one"
    assert table - api_routes() == set(), "rows of routes the API does not have"
    # And each row's request really goes to the route it is the row of.
    api = Api(None, Limits())
    for row in ROWS:
        target, _ = row.request(Names())
        path = target.partition("?")[0]
        if path in api.exact:
            assert row.route == path, row
        else:
            matched = next(pattern.pattern for pattern, _ in api.patterns if pattern.fullmatch(path))
            assert matched == row.route, (row, matched)


# -- the server ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    directory = tmp_path_factory.mktemp("auth-routes")
    path = str(directory / "auth.json")
    file = AuthFile.load(path, missing_ok=True)
    secrets = {"reader": file.add("acme-reader", "reader", "acme"), "writer": file.add("acme-writer", "writer", "acme"),
               "admin": file.add("acme-admin", "admin", "acme"), "operator": file.add("ops", "admin", "*")}
    others = [file.add(f"other{i}-admin", "admin", f"other{i}") for i in range(len(ROWS))]
    file.save()
    server = ServerProcess(str(directory / "data"), "--auth-file", path).start()
    try:
        yield server, secrets, others
    finally:
        server.stop()


def _challenge(answer: Answer) -> str:
    return answer.headers.get("www-authenticate", "")


def test_every_route_for_every_caller(world):
    server, secrets, others = world
    port = server.port
    admin = Caller(port, secrets["admin"])
    bad = Caller(port, "queen_abcdefghijkl_" + "x" * 43)
    seen = []
    for index, row in enumerate(ROWS):
        names = seed(admin, index)
        # The other tenant and the operator first, while acme's things are as seeded.
        callers = {"none": Caller(port, None), "bad": bad, "other-admin": Caller(port, others[index]),
                   "operator": Caller(port, secrets["operator"]), "reader": Caller(port, secrets["reader"]),
                   "writer": Caller(port, secrets["writer"]), "admin": admin}
        for who, caller in callers.items():
            target, body = row.request(names)
            where = f"{row.method} {target} as {who}"
            watch_acme = who in ("other-admin", "operator")
            before = acme_state(admin) if watch_acme else None
            answer = caller(row.method, target, body)
            seen.append((row.route, row.method, who, answer.status))
            if caller.secret is not None:
                assert caller.secret not in repr(answer.body) + repr(answer.headers), f"{where} shows the token"
            level = CALLERS[who]
            if level == 0:
                assert answer.status == 401, (where, answer)
                assert answer.body["code"] == "unauthenticated", (where, answer)
                assert _challenge(answer).startswith('Bearer realm="queen"'), (where, answer)
                if who == "bad":
                    assert 'error="invalid_token"' in _challenge(answer), (where, answer)
                else:
                    assert _challenge(answer) == 'Bearer realm="queen"', (where, answer)
            elif level < row.level:
                assert answer.status == 403, (where, answer)
                assert answer.body["code"] == "forbidden", (where, answer)
                assert _challenge(answer) == 'Bearer realm="queen", error="insufficient_scope"', (where, answer)
            else:
                assert answer.status not in (401, 403) and answer.status < 500, (where, answer)
                assert "www-authenticate" not in answer.headers, (where, answer)
                if who in ("admin", "operator", "other-admin"):
                    # A valid request by a caller with every right it needs: 2xx (or the row's status).
                    if row.status:
                        assert answer.status == row.status, (where, answer)
                    else:
                        assert 200 <= answer.status < 300, (where, answer)
                if who == "other-admin" and row.absent is not None:
                    assert row.absent(answer.body), (f"{where}: not the answer of a tenant without acme's things",
                                                     answer)
                if row.undo is not None and 200 <= answer.status < 300:
                    undone = caller("POST", *row.undo)
                    assert undone.status == 200, (where, undone)
            if answer.status in (401, 403):
                # No existence oracle: the same answer when nothing named exists.
                absent_target, absent_body = row.request(ABSENT)
                other = caller(row.method, absent_target, absent_body)
                assert (other.status, _challenge(other), other.body) == (answer.status, _challenge(answer),
                                                                         answer.body), where
            if watch_acme:
                assert acme_state(admin) == before, f"{where} changed acme's things"
    # Every cell was run: rows x callers.
    assert len(seen) == len(ROWS) * len(CALLERS)
    # No secret, valid or not, in a log line.
    log = server.log_text()
    for secret in [*secrets.values(), *others, bad.secret]:
        assert secret not in log and secret[len("queen_") + 13:] not in log  # nor its part after the id


def test_unknown_routes_and_methods_say_nothing_before_the_token(world):
    """Who is calling comes before what exists: a route that does not exist, or a method a route
    does not take, answers a caller without a valid token exactly as a real route does."""
    server, secrets, _ = world
    nobody = Caller(server.port, None)
    bad = Caller(server.port, "queen_abcdefghijkl_" + "y" * 43)
    for caller in (nobody, bad):
        real = caller("GET", "/api/v1/resources/queues")
        for method, target in (("GET", "/api/v1/no-such-route"), ("PATCH", "/api/v1/kv"),
                               ("GET", "/api/v1/resources/queues/orders/nothing")):
            answer = caller(method, target)
            assert (answer.status, _challenge(answer), answer.body) == (real.status, _challenge(real), real.body)
    assert Caller(server.port, secrets["reader"])("GET", "/api/v1/no-such-route").status == 404
    assert Caller(server.port, secrets["reader"])("PATCH", "/api/v1/kv").status == 405


def test_health_needs_no_token(world):
    server, _, _ = world
    for target in ("/healthz", "/health"):
        answer = Caller(server.port, None)("GET", target)
        assert answer.status == 200 and answer.body == {"status": "ok"}
        answer = Caller(server.port, "queen_abcdefghijkl_" + "z" * 43)("GET", target)
        assert answer.status == 200, "a bad token on a route that needs none is not refused"


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "bearer not-a-queen-token",
                                    "Token queen_abcdefghijkl_secret"])
def test_malformed_authorization_is_401(world, header):
    server, _, _ = world
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/api/v1/tenant", headers={"authorization": header})
        response = connection.getresponse()
        response.read()
        assert response.status == 401
        assert response.getheader("www-authenticate").startswith('Bearer realm="queen"')
    finally:
        connection.close()


def test_a_real_token_id_with_a_wrong_secret_is_an_invalid_token(world):
    server, secrets, _ = world
    token_id = secrets["admin"][len("queen_"):len("queen_") + 12]
    forged = Caller(server.port, f"queen_{token_id}_" + "A" * 43)
    unknown = Caller(server.port, "queen_abcdefghijkl_" + "A" * 43)
    first, second = forged("GET", "/api/v1/tenant"), unknown("GET", "/api/v1/tenant")
    assert first.status == 401 and 'error="invalid_token"' in _challenge(first)
    assert (first.status, _challenge(first), first.body) == (second.status, _challenge(second), second.body)


def test_names_are_never_a_route_to_another_tenant(world):
    """Sanity for the row table's premise: the same name, two tenants, two things."""
    server, secrets, others = world
    acme = Caller(server.port, secrets["writer"])
    other = Caller(server.port, others[0])
    assert acme("PUT", "/api/v1/kv/premise/k", {"value": "acme", "forever": True}).status == 200
    assert other("PUT", "/api/v1/kv/premise/k", {"value": "other", "forever": True}).status == 200
    assert acme("GET", "/api/v1/kv/premise/k").body["value"] == "acme"
    assert other("GET", "/api/v1/kv/premise/k").body["value"] == "other"

