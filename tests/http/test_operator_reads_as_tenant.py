"""The operator reads one tenant's data with `?tenant=NAME` (the dashboard's tenant selector), against
a real `queen serve --auth-file`. A tenancy boundary, so: every other token naming a tenant, even
its own, is refused 403 `tenant_forbidden` and learns nothing; the operator sees exactly that
tenant's names and nothing of the default tenant's or another's; and the parameter never writes
(403 `tenant_read_only`, nothing changed), nor reaches the operator's server-wide routes.
"""

from __future__ import annotations

import pytest

from queen.auth import AuthFile
from queen.testing import ServerProcess, parse_metrics

# Every read route of a tenant's data, as the dashboard calls them.
READS = ("/api/v1/resources/queues", "/api/v1/resources/queues/orders", "/api/v1/resources/queues/orders/partitions",
         "/api/v1/kv/app/k", "/api/v1/kv/app", "/api/v1/locks", "/api/v1/dlq?queue=orders",
         "/api/v1/timers?queue=orders", "/api/v1/tenant", "/metrics")


class Caller:
    """(status, decoded body) of requests with one token."""

    def __init__(self, server: ServerProcess, secret: str):
        self.server = server
        self.headers = {"authorization": f"Bearer {secret}"}

    def __call__(self, method: str, target: str, body=None):
        return self.server.request(method, target, body, self.headers, timeout_s=15)

    def ok(self, method: str, target: str, body=None):
        status, answer = self(method, target, body)
        assert status == 200, (method, target, status, answer)
        return answer


def _with(target: str, tenant: str) -> str:
    return target + ("&" if "?" in target else "?") + "tenant=" + tenant


@pytest.fixture(scope="module")
def who(tmp_path_factory):
    """Tokens of tenants alpha and beta, the default tenant and the operator, on one server where
    each tenant holds a queue "orders" (alpha 2 messages, beta 3, default 1), a key app/k, a lock
    and a timer, all under the same names."""
    directory = tmp_path_factory.mktemp("read-as")
    path = str(directory / "auth.json")
    file = AuthFile.load(path, missing_ok=True)
    secrets = {"alpha": file.add("alpha-writer", "writer", "alpha"), "alpha-admin": file.add("alpha-admin", "admin", "alpha"),
               "beta": file.add("beta-writer", "writer", "beta"), "default": file.add("default-admin", "admin", "default"),
               "star-reader": file.add("star-reader", "reader", "*"), "operator": file.add("ops", "admin", "*")}
    file.save()
    server = ServerProcess(str(directory / "data"), "--auth-file", path).start()
    try:
        callers = {name: Caller(server, secret) for name, secret in secrets.items()}
        for name, messages in (("alpha", 2), ("beta", 3), ("default", 1)):
            caller = callers[name]
            caller.ok("POST", "/api/v1/push", {"items": [{"queue": "orders", "payload": {"of": name, "n": n}}
                                                         for n in range(messages)]})
            caller.ok("PUT", "/api/v1/kv/app/k", {"value": name, "forever": True})
            caller.ok("POST", "/api/v1/locks", {"operations": [{"op": "acquire", "name": "job", "owner": name,
                                                                "ttlSeconds": 600}]})
            caller.ok("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "orders",
                                                                 "key": f"{name}-timer", "delayMs": 3_600_000,
                                                                 "payload": name}]})
        yield callers
    finally:
        server.stop()


def test_no_token_but_the_operators_may_read_as_a_tenant_not_even_its_own(who):
    for name in ("alpha", "alpha-admin", "beta", "default", "star-reader"):
        for tenant in ("beta", "alpha", "default"):
            for target in READS:
                status, answer = who[name]("GET", _with(target, tenant))
                assert status == 403, (name, tenant, target, status, answer)
                assert answer["code"] == "tenant_forbidden", answer
                assert "operator" in answer["detail"] and "items" not in answer and "value" not in answer


def test_the_operator_sees_exactly_that_tenants_data(who):
    operator = who["operator"]
    for tenant, messages in (("alpha", 2), ("beta", 3)):
        [queue] = operator.ok("GET", _with("/api/v1/resources/queues", tenant))["items"]
        assert (queue["queue"], queue["messages"]) == ("orders", messages), queue
        assert operator.ok("GET", _with("/api/v1/resources/queues/orders", tenant))["messages"] == messages
        [partition] = operator.ok("GET", _with("/api/v1/resources/queues/orders/partitions", tenant))["items"]
        assert partition["messages"] == messages
        assert operator.ok("GET", _with("/api/v1/kv/app/k", tenant))["value"] == tenant
        [row] = operator.ok("GET", _with("/api/v1/kv/app", tenant))["items"]
        assert row["value"] == tenant
        [lock] = operator.ok("GET", _with("/api/v1/locks", tenant))["items"]
        assert (lock["name"], lock["owner"]) == ("job", tenant)
        [timer] = operator.ok("GET", _with("/api/v1/timers?queue=orders", tenant))["items"]
        assert timer["key"] == f"{tenant}-timer"
        assert operator.ok("GET", _with("/api/v1/dlq?queue=orders", tenant))["total"] == 0
        me = operator.ok("GET", _with("/api/v1/tenant", tenant))
        assert (me["token"], me["role"], me["tokenTenant"], me["tenant"]) == ("ops", "admin", "*", tenant), me
        assert me["usage"]["messages"] == messages
        # /metrics as that tenant's own token sees it: its queues, none of the server's series.
        metrics = parse_metrics(operator.ok("GET", _with("/metrics", tenant)).decode())
        assert metrics['queen_queue_messages{queue="orders"}'] == messages
        assert not any("tenant=" in name and f'tenant="{tenant}"' not in name for name in metrics), metrics
        assert "queen_requests_total" not in metrics and "queen_wal_batches_total" not in metrics
    # Without it, the operator's own names: the default tenant's.
    [queue] = operator.ok("GET", "/api/v1/resources/queues")["items"]
    assert queue["messages"] == 1
    assert operator.ok("GET", "/api/v1/kv/app/k")["value"] == "default"
    assert operator.ok("GET", _with("/api/v1/kv/app/k", "default"))["value"] == "default"
    # The server's own view stays the operator's only without the parameter.
    assert "dataDir" in operator.ok("GET", "/api/v1/server")
    assert "dataDir" not in operator.ok("GET", _with("/api/v1/server", "alpha"))


def test_reading_as_a_tenant_never_writes(who):
    operator, alpha = who["operator"], who["alpha"]
    before = alpha.ok("GET", "/api/v1/resources/queues/orders")
    for method, target, body in (
            ("POST", "/api/v1/push", {"items": [{"queue": "orders", "payload": "from the operator"}]}),
            ("GET", "/api/v1/pop/queue/orders?batch=10", None),  # a GET that writes: it takes a lease
            ("PUT", "/api/v1/kv/app/k", {"value": "operator", "forever": True}),
            ("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "app", "key": "k"}]}),
            ("POST", "/api/v1/locks", {"operations": [{"op": "acquire", "name": "job", "ttlSeconds": 60}]}),
            ("DELETE", "/api/v1/resources/queues/orders", None),
            ("DELETE", "/api/v1/dlq?queue=orders", None),
            ("POST", "/api/v1/pause", {"kv": True}),
            ("GET", "/api/v1/tenants", None),  # the operator's own, not a tenant's
            ("GET", "/api/v1/admin/snapshot", None)):
        status, answer = operator(method, _with(target, "alpha"), body)
        assert status == 403 and answer["code"] == "tenant_read_only", (method, target, status, answer)
    assert alpha.ok("GET", "/api/v1/resources/queues/orders") == before
    assert alpha.ok("GET", "/api/v1/kv/app/k")["value"] == "alpha"
    [lock] = alpha.ok("GET", "/api/v1/locks")["items"]
    assert lock["owner"] == "alpha"
    assert alpha.ok("GET", "/api/v1/tenant")["paused"] == {"kv": False, "queues": False}


def test_a_tenant_named_wrong_is_refused(who):
    operator = who["operator"]
    for tenant, status, code in (("Alpha!", 400, "invalid_tenant"), ("%2A", 400, "invalid_tenant"),
                                 ("", 400, "invalid_tenant"), ("nobody", 404, "tenant_not_found"),
                                 ("alpha&tenant=beta", 400, "invalid_tenant")):
        got, answer = operator("GET", _with("/api/v1/resources/queues", tenant))
        assert (got, answer["code"]) == (status, code), (tenant, got, answer)
    # Given twice with the same name is that name.
    [queue] = operator.ok("GET", "/api/v1/resources/queues?tenant=beta&tenant=beta")["items"]
    assert queue["messages"] == 3
    # The parameter is taken out before the route reads its own: they still work beside it.
    assert operator.ok("GET", "/api/v1/resources/queues?prefix=nothing&tenant=alpha")["items"] == []
    status, answer = operator("GET", "/api/v1/resources/queues?tenant=alpha&bogus=1")
    assert status == 400, answer
