"""Tenants against a real `queen serve --auth-file`: two tenants, alpha and beta, name the same
keys, locks, queues and timers, and each sees and changes only its own. Ids (lease ids, partition
ids, lock tokens) are global numbers, so beta is handed alpha's and must get what a tenant gets
for an id it holds nothing under. The default tenant (names written before tokens existed, or by a
`--tenant default` token) is a tenant like the others, and the operator (admin of `*`) sees every
tenant only in /metrics and /api/v1/tenants.
"""

from __future__ import annotations

import pytest

from queen.auth import AuthFile
from queen.testing import ServerProcess, parse_metrics


class Caller:
    """(status, decoded body) of requests with one token (None: none)."""

    def __init__(self, server: ServerProcess, secret: str | None):
        self.server = server
        self.headers = {} if secret is None else {"authorization": f"Bearer {secret}"}

    def __call__(self, method: str, target: str, body=None):
        return self.server.request(method, target, body, self.headers, timeout_s=15)

    def ok(self, method: str, target: str, body=None):
        status, answer = self(method, target, body)
        assert status == 200, (method, target, status, answer)
        return answer

    def push(self, queue: str, *payloads, partition: str = "p"):
        return self.ok("POST", "/api/v1/push", {"items": [{"queue": queue, "partition": partition, "payload": payload}
                                                         for payload in payloads]})

    def pop(self, queue: str, query: str = ""):
        return self.ok("GET", f"/api/v1/pop/queue/{queue}" + (f"?{query}" if query else ""))

    def lock(self, *operations):
        return self.ok("POST", "/api/v1/locks", {"operations": list(operations)})["results"]


def write_auth_file(path: str) -> dict[str, str]:
    file = AuthFile.load(path, missing_ok=True)
    secrets = {"a": file.add("alpha-writer", "writer", "alpha"), "a-admin": file.add("alpha-admin", "admin", "alpha"),
               "b": file.add("beta-writer", "writer", "beta"), "b-admin": file.add("beta-admin", "admin", "beta"),
               "default": file.add("default-admin", "admin", "default"), "operator": file.add("ops", "admin", "*")}
    file.save()
    return secrets


@pytest.fixture(scope="module")
def who(tmp_path_factory):
    """{name: Caller} on one server for the module; each test uses names of its own."""
    directory = tmp_path_factory.mktemp("isolation")
    secrets = write_auth_file(str(directory / "auth.json"))
    server = ServerProcess(str(directory / "data"), "--auth-file", str(directory / "auth.json")).start()
    try:
        yield {name: Caller(server, secret) for name, secret in secrets.items()}
    finally:
        server.stop()


def without(answer: dict, *fields) -> dict:
    return {name: value for name, value in answer.items() if name not in fields}


# -- KV --------------------------------------------------------------------------------------------


def test_kv_put_get_list_delete_and_cas_stay_in_their_tenant(who):
    a, b, default = who["a"], who["b"], who["default"]
    put = a.ok("PUT", "/api/v1/kv/kvt/shared", {"value": "alpha's", "forever": True})
    a.ok("PUT", "/api/v1/kv/kvt/only-alpha", {"value": 1, "forever": True})
    assert b.ok("GET", "/api/v1/kv/kvt/shared")["found"] is False
    assert b.ok("GET", "/api/v1/kv/kvt/only-alpha") == without(b.ok("GET", "/api/v1/kv/kvt/nothing"), "key") | {
        "key": "only-alpha"}
    # The same names, beta's own things.
    b_put = b.ok("PUT", "/api/v1/kv/kvt/shared", {"value": "beta's", "forever": True})
    assert b_put["applied"] is True
    assert a.ok("GET", "/api/v1/kv/kvt/shared")["value"] == "alpha's"
    assert b.ok("GET", "/api/v1/kv/kvt/shared")["value"] == "beta's"
    # Listings, one-key route and batch, show each only its own, names as written.
    assert [item["key"] for item in b.ok("GET", "/api/v1/kv/kvt?prefix=")["items"]] == ["shared"]
    assert [item["key"] for item in a.ok("GET", "/api/v1/kv/kvt?prefix=")["items"]] == ["only-alpha", "shared"]
    [page] = b.ok("POST", "/api/v1/kv", {"operations": [{"op": "getPrefix", "ns": "kvt", "prefix": ""}]})["results"]
    assert [item["key"] for item in page["items"]] == ["shared"]
    assert default.ok("GET", "/api/v1/kv/kvt?prefix=")["items"] == []
    assert who["operator"].ok("GET", "/api/v1/kv/kvt?prefix=")["items"] == []
    # CAS with alpha's version: beta's row has its own version, so nothing of alpha's moves.
    stale = b.ok("PUT", "/api/v1/kv/kvt/shared", {"value": "cas", "forever": True, "expect": put["version"]})
    assert stale["applied"] is False and stale["reason"] == "version"
    cas = b.ok("PUT", "/api/v1/kv/kvt/only-alpha", {"value": "cas", "forever": True, "expect": put["version"]})
    assert cas["applied"] is False
    [check] = b.ok("POST", "/api/v1/kv", {"operations": [
        {"op": "check", "ns": "kvt", "key": "only-alpha", "expect": put["version"]}]})["results"]
    assert (check["applied"], check["reason"], check["value"]) == (False, "absent", None)  # nothing of alpha's shown
    # putIfAbsent of a name only alpha has: absent for beta, so beta's own new key.
    assert b.ok("PUT", "/api/v1/kv/kvt/only-alpha", {"value": "b", "ifAbsent": True, "forever": True})["applied"]
    assert b.ok("POST", "/api/v1/kv/kvt/counter/incr", {"by": 5, "forever": True})["value"] == 5
    assert a.ok("POST", "/api/v1/kv/kvt/counter/incr", {"by": 1, "forever": True})["value"] == 1
    # Deletes: beta deletes its own, alpha's stay.
    assert b.ok("DELETE", "/api/v1/kv/kvt/shared")["applied"] is True
    assert b.ok("DELETE", "/api/v1/kv/kvt/shared")["applied"] is False
    [deleted] = b.ok("POST", "/api/v1/kv", {"operations": [{"op": "delete", "ns": "kvt", "key": "only-alpha",
                                                            "expect": put["version"]}]})["results"]
    assert deleted["applied"] is False
    shared = a.ok("GET", "/api/v1/kv/kvt/shared")
    assert shared["value"] == "alpha's" and shared["version"] == put["version"]
    assert a.ok("GET", "/api/v1/kv/kvt/only-alpha")["value"] == 1


# -- locks -----------------------------------------------------------------------------------------


def test_locks_of_the_same_name_are_independent_and_others_tokens_do_nothing(who):
    a, b = who["a"], who["b"]
    [mine] = a.lock({"op": "acquire", "name": "job", "ttlSeconds": 60, "owner": "worker-a"})
    assert mine["acquired"] is True
    [theirs] = b.lock({"op": "acquire", "name": "job", "ttlSeconds": 60, "owner": "worker-b"})
    assert theirs["acquired"] is True and "already" not in theirs and theirs["token"] != mine["token"]
    [only] = a.lock({"op": "acquire", "name": "only-alpha", "ttlSeconds": 60, "owner": "worker-a"})
    # Listings: each its own holders only.
    assert [(item["name"], item["owner"]) for item in b.ok("GET", "/api/v1/locks?prefix=")["items"]
            if item["name"] in ("job", "only-alpha")] == [("job", "worker-b")]
    assert [(item["name"], item["owner"]) for item in a.ok("GET", "/api/v1/locks?prefix=")["items"]
            if item["name"] in ("job", "only-alpha")] == [("job", "worker-a"), ("only-alpha", "worker-a")]
    [seen] = b.lock({"op": "get", "name": "only-alpha"})
    assert seen["held"] is False and seen["holders"] == []
    # Beta with alpha's token and owner: a lock beta does not hold.
    release = {"op": "release", "name": "only-alpha", "token": only["token"], "owner": "worker-a"}
    [refused] = b.lock(release)
    [nothing] = b.lock({**release, "name": "never-held"})
    assert refused == {**nothing, "name": "only-alpha"} and refused["released"] is False
    [renewed] = b.lock({"op": "renew", "name": "only-alpha", "token": only["token"], "owner": "worker-a",
                        "ttlSeconds": 60})
    assert renewed["renewed"] is False
    # On its own lock of the same name, alpha's token is not beta's holder's.
    [wrong] = b.lock({"op": "release", "name": "job", "token": mine["token"], "owner": "worker-a"})
    assert wrong["released"] is False
    # A transaction of beta guarded by alpha's permit: beta has no such permit.
    status, answer = b("POST", "/api/v1/transaction", {"kv": [
        only["guard"], {"op": "put", "ns": "locked", "key": "k", "value": 1, "forever": True}]})
    assert status == 200 and answer["success"] is False
    assert b.ok("GET", "/api/v1/kv/locked/k")["found"] is False
    # Both of alpha's locks are held as before.
    [held] = a.lock({"op": "get", "name": "only-alpha"})
    assert held["held"] is True and held["holders"][0]["token"] == only["token"]
    [held] = a.lock({"op": "get", "name": "job"})
    assert held["holders"][0]["owner"] == "worker-a" and held["holders"][0]["token"] == mine["token"]
    # Alpha's admin takes a lock away by its token, read from the holders; beta's stays.
    [taken] = who["a-admin"].lock({"op": "release", "name": "job", "token": held["holders"][0]["token"]})
    assert taken["released"] is True
    assert a.lock({"op": "get", "name": "job"})[0]["held"] is False
    [still] = b.lock({"op": "get", "name": "job"})
    assert still["held"] is True and still["holders"][0]["owner"] == "worker-b"


# -- queues ----------------------------------------------------------------------------------------


def _ack_of(message, **extra):
    return {"partitionId": message["partitionId"], "leaseId": message["leaseId"], "offset": message["offset"], **extra}


def test_queues_leases_and_partitions_stay_in_their_tenant(who):
    a, b = who["a"], who["b"]
    a.push("orders", "m1")
    a.push("orders", "m2", partition="q")
    # The views first (a pop makes the popping tenant's own queue): nobody else sees alpha's queue.
    assert [item["queue"] for item in a.ok("GET", "/api/v1/resources/queues")["items"]].count("orders") == 1
    for other in (b, who["default"], who["operator"]):
        assert "orders" not in [item["queue"] for item in other.ok("GET", "/api/v1/resources/queues")["items"]]
        assert other.ok("GET", "/api/v1/resources/queues/orders") == {"found": False, "queue": "orders"}
        assert other.ok("GET", "/api/v1/resources/queues/orders/partitions")["items"] == []
    # Pops: nothing of alpha's.
    for other in (b, who["default"], who["operator"]):
        assert other.pop("orders", "batch=10&partitions=10")["messages"] == []
        assert other.ok("GET", "/api/v1/pop/queue/orders/partition/p")["messages"] == []
    got = a.pop("orders", "partitions=1")
    [message] = got["messages"]
    # Beta acks, extends and releases alpha's lease and partition: answered as ids it holds nothing under.
    phantom = {"partitionId": 10**12, "leaseId": 10**12 + 1, "offset": message["offset"]}
    answer = b.ok("POST", "/api/v1/ack", _ack_of(message))
    assert answer["success"] is False and answer["reason"] == "lease_lost"
    assert without(answer, "partitionId") == without(b.ok("POST", "/api/v1/ack", phantom), "partitionId")
    [batch] = b.ok("POST", "/api/v1/ack/batch", {"acknowledgments": [_ack_of(message, status="completed")]})
    assert batch["success"] is False and batch["reason"] == "lease_lost"
    for status in ("failed", "dlq"):
        assert b.ok("POST", "/api/v1/ack", _ack_of(message, status=status, error="b"))["success"] is False
    for action, body in (("extend", {"seconds": 600}), ("release", {})):
        answer = b.ok("POST", f"/api/v1/lease/{got['leaseId']}/{action}", body)
        assert answer["success"] is False and answer["reason"] == "lease_lost", answer
        phantom_answer = b.ok("POST", f"/api/v1/lease/{10**12}/{action}", body)
        assert without(answer, "leaseId") == without(phantom_answer, "leaseId")
    # Beta's own partition of the same names has ids of its own: beta's pops got nothing of alpha's.
    partitions = b.ok("GET", "/api/v1/resources/queues/orders/partitions")["items"]
    assert message["partitionId"] not in [item["partitionId"] for item in partitions]
    assert all(item["messages"] == 0 for item in partitions)
    # Alpha's lease is untouched: alpha extends it, releases it, gets the message again, acks it.
    assert a.ok("POST", f"/api/v1/lease/{got['leaseId']}/extend", {"seconds": 60})["success"] is True
    assert a.ok("POST", f"/api/v1/lease/{got['leaseId']}/release", {})["success"] is True
    again = a.ok("GET", f"/api/v1/pop/queue/orders/partition/{message['partition']}")
    assert [(m["data"], m["offset"]) for m in again["messages"]] == [(message["data"], message["offset"])]
    assert a.ok("POST", "/api/v1/ack", _ack_of(again["messages"][0]))["success"] is True
    info = a.ok("GET", "/api/v1/resources/queues/orders")
    assert info["found"] is True and info["partitions"] == 2
    # Beta's own queue of the same name is its own.
    b.push("orders", "beta-1")
    assert [item["messages"] for item in b.ok("GET", "/api/v1/resources/queues")["items"]
            if item["queue"] == "orders"] == [1]
    assert [m["data"] for m in b.pop("orders")["messages"]] == ["beta-1"]
    assert a.ok("GET", "/api/v1/resources/queues/orders") == info
    remaining = a.pop("orders")["messages"]
    assert [m["data"] for m in remaining] == [({"m1", "m2"} - {message["data"]}).pop()]


def test_dlq_groups_and_deletes_never_reach_another_tenant(who):
    a, b_admin = who["a"], who["b-admin"]
    a_admin = who["a-admin"]
    a.push("jobs", "poison", partition="d")
    [poison] = a.pop("jobs")["messages"]
    assert a.ok("POST", "/api/v1/ack", _ack_of(poison, status="dlq", error="bad"))["dlq"] is True
    a.push("jobs", "grouped", partition="g")
    assert a.pop("jobs", "consumerGroup=mailer&partitions=2")["success"] is True
    before = a.ok("GET", "/api/v1/resources/queues/jobs")
    dlq_before = a.ok("GET", "/api/v1/dlq?queue=jobs")
    assert dlq_before["total"] == 1
    # Beta's admin: DLQ view, purge, requeue, group deletes and queue delete, all of nothing.
    empty = b_admin.ok("GET", "/api/v1/dlq?queue=jobs")
    assert empty["total"] == 0 and empty["messages"] == []
    assert b_admin.ok("DELETE", "/api/v1/dlq?queue=jobs") == {"purged": 0}
    requeued = b_admin.ok("POST", "/api/v1/dlq/requeue", {"queue": "jobs", "items": [
        {"partitionId": poison["partitionId"], "offset": poison["offset"]}]})
    assert requeued["results"][0]["requeued"] is False
    assert b_admin.ok("DELETE", "/api/v1/consumer-groups/mailer/queues/jobs")["deleted"] is False
    everywhere = b_admin.ok("DELETE", "/api/v1/consumer-groups/mailer")
    assert everywhere["deleted"] is False and everywhere["queues"] == []
    assert b_admin.ok("DELETE", "/api/v1/resources/queues/jobs")["deleted"] is False
    # The operator's group delete everywhere is the default tenant's: alpha's group stays.
    assert who["operator"].ok("DELETE", "/api/v1/consumer-groups/mailer")["queues"] == []
    assert who["default"].ok("DELETE", "/api/v1/dlq?queue=jobs") == {"purged": 0}
    after = a.ok("GET", "/api/v1/resources/queues/jobs")
    assert after == before
    assert a.ok("GET", "/api/v1/dlq?queue=jobs") == dlq_before
    assert "mailer" in [group["consumerGroup"] for group in after["groups"]]
    # Alpha's admin does each for real.
    assert a_admin.ok("POST", "/api/v1/dlq/requeue", {"queue": "jobs", "items": [
        {"partitionId": poison["partitionId"], "offset": poison["offset"]}]})["results"][0]["requeued"] is True
    assert a_admin.ok("DELETE", "/api/v1/consumer-groups/mailer")["queues"] == ["jobs"]
    assert a_admin.ok("DELETE", "/api/v1/resources/queues/jobs")["deleted"] is True


# -- timers ----------------------------------------------------------------------------------------


def test_timers_are_seen_cancelled_and_fired_only_in_their_tenant(who):
    a, b = who["a"], who["b"]
    [scheduled] = a.ok("POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "ticks", "key": "later", "delayMs": 3_600_000, "payload": "later"}]})["results"]
    assert scheduled["ok"] is True
    assert b.ok("GET", "/api/v1/timers?queue=ticks")["items"] == []
    assert b.ok("GET", "/api/v1/timers/ticks")["rows"] == []
    assert b.ok("GET", "/api/v1/timers/ticks/later")["found"] is False
    assert b.ok("DELETE", "/api/v1/timers/ticks/later")["status"] == "absent"
    [cancel] = b.ok("POST", "/api/v1/timers", {"operations": [{"op": "cancel", "queue": "ticks", "key": "later"}]})[
        "results"]
    assert cancel["cancelled"] is False
    assert [item["key"] for item in a.ok("GET", "/api/v1/timers?queue=ticks")["items"]] == ["later"]
    assert a.ok("GET", "/api/v1/timers/ticks/later")["found"] is True
    # One that fires: into alpha's queue, the only place it can land.
    a.ok("POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "ticks", "key": "soon", "delayMs": 50, "payload": "ding", "partition": "p"}]})
    fired = a.pop("ticks", "waitMs=10000")  # the server answers when the timer has fired
    assert [m["data"] for m in fired["messages"]] == ["ding"]
    assert b.pop("ticks")["messages"] == []
    info = b.ok("GET", "/api/v1/resources/queues/ticks")  # beta's pop made beta's own, empty, queue
    assert info["found"] is False or (info["messages"] == 0 and info["timers"]["pending"] == 0), info
    assert a.ok("GET", "/api/v1/resources/queues/ticks")["timers"]["pending"] == 1  # "later"
    a.ok("POST", "/api/v1/ack", _ack_of(fired["messages"][0]))


# -- transactions ----------------------------------------------------------------------------------


def test_a_transaction_cannot_name_another_tenants_lease_partition_or_keys(who):
    a, b = who["a"], who["b"]
    put = a.ok("PUT", "/api/v1/kv/txn/balance", {"value": 100, "forever": True})
    a.push("payments", "pay-1")
    got = a.pop("payments")
    [message] = got["messages"]
    attempts = [
        {"ack": [_ack_of(message)], "push": [{"queue": "stolen", "payload": 1}]},
        {"ack": [_ack_of(message, status="failed")], "kv": [{"op": "put", "ns": "txn", "key": "x", "value": 1,
                                                            "forever": True}]},
        {"operations": [{"type": "ack", "partitionId": message["partitionId"], "offset": message["offset"],
                         "transactionId": message["transactionId"]},
                        {"type": "push", "items": [{"queue": "stolen", "payload": 2}]}],
         "requiredLeases": [got["leaseId"]]},
        {"operations": [{"type": "push", "items": [{"queue": "stolen", "payload": 3}]}],
         "requiredLeases": [got["leaseId"]]},
        {"kv": [{"op": "check", "ns": "txn", "key": "balance", "expect": put["version"]},
                {"op": "put", "ns": "txn", "key": "x", "value": 2, "forever": True}]},
    ]
    for document in attempts:
        status, answer = b("POST", "/api/v1/transaction", document)
        assert status == 200 and answer["success"] is False, (document, answer)
    # What beta learns of alpha's message is what it learns of one that does not exist.
    phantom = {"partitionId": 10**12, "leaseId": 10**12 + 1, "offset": message["offset"]}
    [first, second] = [b.ok("POST", "/api/v1/transaction", {"ack": [ack], "push": [{"queue": "stolen", "payload": 1}]})
                       for ack in (_ack_of(message), phantom)]
    for answer in (first, second):
        answer["failed"].pop("partitionId")
        answer["failed"].pop("leaseId")
    assert first == second and first["reason"] == "lease_lost"
    # Nothing of any of them happened: beta has no key x and no queue stolen; alpha's lease is live.
    assert b.ok("GET", "/api/v1/kv/txn/x")["found"] is False
    assert b.ok("GET", "/api/v1/resources/queues/stolen")["found"] is False
    assert a.ok("GET", "/api/v1/resources/queues/stolen")["found"] is False
    # Beta's own writes of the same names are beta's: alpha's balance stays.
    assert b.ok("POST", "/api/v1/transaction", {"kv": [{"op": "put", "ns": "txn", "key": "balance", "value": 0,
                                                        "forever": True}]})["success"] is True
    balance = a.ok("GET", "/api/v1/kv/txn/balance")
    assert (balance["value"], balance["version"]) == (100, put["version"])
    assert b.ok("GET", "/api/v1/kv/txn/balance")["value"] == 0
    done = a.ok("POST", "/api/v1/transaction", {"ack": [_ack_of(message)], "push": [{"queue": "paid", "payload": 1}]})
    assert done["success"] is True
    assert b.ok("GET", "/api/v1/resources/queues/paid")["found"] is False


# -- metrics and the operator's views --------------------------------------------------------------


def test_metrics_show_a_tenant_its_own_queues_and_the_operator_every_tenant(who):
    a, b = who["a"], who["b"]
    a.push("metrics-alpha-only", 1, 2)
    b.push("metrics-beta-only", 1)
    who["default"].push("metrics-default-only", 1)

    def text(caller):
        status, body = caller("GET", "/metrics")
        assert status == 200
        return body.decode()

    beta = text(b)
    assert 'queue="metrics-beta-only"' in beta
    assert "metrics-alpha-only" not in beta and "metrics-default-only" not in beta
    assert 'tenant="alpha"' not in beta and 'tenant="default"' not in beta
    alpha = parse_metrics(text(a))
    assert alpha['queen_queue_messages{queue="metrics-alpha-only"}'] == 2
    assert not any("metrics-beta-only" in name for name in alpha)
    default = text(who["default"])
    assert "metrics-default-only" in default and "metrics-alpha-only" not in default
    assert "metrics-beta-only" not in default
    operator = parse_metrics(text(who["operator"]))
    assert operator['queen_queue_messages{queue="metrics-alpha-only",tenant="alpha"}'] == 2
    assert operator['queen_queue_messages{queue="metrics-beta-only",tenant="beta"}'] == 1
    assert operator['queen_queue_messages{queue="metrics-default-only"}'] == 1
    assert any(name.startswith('queen_tenant_usage{tenant="alpha"') for name in operator)
    assert any(name.startswith('queen_tenant_usage{tenant="beta"') for name in operator)


def test_only_the_operator_lists_tenants(who):
    for name in ("a", "a-admin", "b-admin", "default"):
        status, answer = who[name]("GET", "/api/v1/tenants")
        assert status == 403 and answer["code"] == "forbidden", name
    listing = who["operator"].ok("GET", "/api/v1/tenants")
    assert {"alpha", "beta", "default"} <= {item["tenant"] for item in listing["items"]}
    # Each tenant's own view is of itself.
    assert who["a"].ok("GET", "/api/v1/tenant")["tenant"] == "alpha"
    assert who["b-admin"].ok("GET", "/api/v1/tenant")["tenant"] == "beta"
    assert who["default"].ok("GET", "/api/v1/tenant")["tenant"] == "default"
    assert who["operator"].ok("GET", "/api/v1/tenant")["tenant"] == "default"


def test_pausing_a_tenant_pauses_only_that_tenant(who):
    a, b, b_admin = who["a"], who["b"], who["b-admin"]
    assert b_admin.ok("POST", "/api/v1/pause", {"kv": True}) == {"tenant": "beta",
                                                                 "paused": {"kv": True, "queues": False}}
    try:
        status, answer = b("PUT", "/api/v1/kv/paused/k", {"value": 1, "forever": True})
        assert status == 503 and answer["code"] == "paused"
        assert a.ok("PUT", "/api/v1/kv/paused/k", {"value": 1, "forever": True})["applied"] is True
        status, _ = b_admin("POST", "/api/v1/resume", {"kv": True, "tenant": "alpha"})
        assert status == 403  # only the operator names another tenant
    finally:
        b_admin.ok("POST", "/api/v1/resume", {"kv": True})
    assert b.ok("PUT", "/api/v1/kv/paused/k", {"value": 1, "forever": True})["applied"] is True


# -- the default tenant: data from before the auth file ----------------------------------------------


def test_data_written_before_auth_is_the_default_tenants(tmp_path):
    data_dir = str(tmp_path / "data")
    with ServerProcess(data_dir) as server:  # no auth file: every caller is the operator
        open_caller = Caller(server, None)
        open_caller.ok("PUT", "/api/v1/kv/legacy/k", {"value": "before auth", "forever": True})
        [lock] = open_caller.lock({"op": "acquire", "name": "legacy-lock", "ttlSeconds": 600, "owner": "old"})
        assert lock["acquired"] is True
        open_caller.push("legacy-queue", "old message")
    path = str(tmp_path / "auth.json")
    secrets = write_auth_file(path)
    with ServerProcess(data_dir, "--auth-file", path) as server:
        default, a = Caller(server, secrets["default"]), Caller(server, secrets["a"])
        assert Caller(server, None)("GET", "/api/v1/kv/legacy/k")[0] == 401
        # The default tenant's token reads it all, as before.
        assert default.ok("GET", "/api/v1/kv/legacy/k")["value"] == "before auth"
        [held] = default.lock({"op": "get", "name": "legacy-lock"})
        assert held["held"] is True and held["holders"][0]["token"] == lock["token"]
        assert [item["name"] for item in default.ok("GET", "/api/v1/locks")["items"]] == ["legacy-lock"]
        assert [item["queue"] for item in default.ok("GET", "/api/v1/resources/queues")["items"]] == ["legacy-queue"]
        # Tenant alpha sees none of it, and its writes of the same names are its own.
        assert a.ok("GET", "/api/v1/kv/legacy/k")["found"] is False
        assert a.ok("GET", "/api/v1/kv/legacy?prefix=")["items"] == []
        assert a.lock({"op": "get", "name": "legacy-lock"})[0]["held"] is False
        assert a.ok("GET", "/api/v1/locks")["items"] == []
        assert a.ok("GET", "/api/v1/resources/queues")["items"] == []
        assert a.ok("GET", "/api/v1/resources/queues/legacy-queue")["found"] is False
        assert a.pop("legacy-queue")["messages"] == []
        assert a.lock({"op": "acquire", "name": "legacy-lock", "ttlSeconds": 60, "owner": "alpha"})[0]["acquired"]
        a.ok("PUT", "/api/v1/kv/legacy/k", {"value": "alpha's", "forever": True})
        assert default.ok("GET", "/api/v1/kv/legacy/k")["value"] == "before auth"
        # Alpha's queue of the same name does not show in the default tenant's listing.
        a.push("legacy-queue", "alpha message")
        assert [item["queue"] for item in default.ok("GET", "/api/v1/resources/queues")["items"]] == ["legacy-queue"]
        assert [item["messages"] for item in default.ok("GET", "/api/v1/resources/queues")["items"]] == [1]
        assert [m["data"] for m in default.pop("legacy-queue")["messages"]] == ["old message"]
        assert [m["data"] for m in a.pop("legacy-queue")["messages"]] == ["alpha message"]
        # The operator's names are the default tenant's too.
        assert Caller(server, secrets["operator"]).ok("GET", "/api/v1/kv/legacy/k")["value"] == "before auth"


# -- no name spells another tenant's -----------------------------------------------------------------

# Stored names are `<tenant>\x1f<name>` and the default tenant's carry no prefix, so a default-tenant
# caller naming `alpha\x1f...` would name alpha's things, were the separator allowed in a name.
SPELLED = [
    ("GET", "/api/v1/kv/alpha%1Fspelled/k", None),
    ("GET", "/api/v1/kv/alpha%1Fspelled?prefix=", None),
    ("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "alpha\x1fspelled", "key": "k"}]}),
    ("PUT", "/api/v1/kv/alpha%1Fspelled/k", {"value": "overwritten", "forever": True}),
    ("GET", "/api/v1/pop/queue/alpha%1Fspelled-q", None),
    ("GET", "/api/v1/resources/queues/alpha%1Fspelled-q", None),
    ("GET", "/api/v1/resources/queues/alpha%1Fspelled-q/partitions", None),
    ("DELETE", "/api/v1/resources/queues/alpha%1Fspelled-q", None),
    ("GET", "/api/v1/dlq?queue=alpha%1Fspelled-q", None),
    ("GET", "/api/v1/timers?queue=alpha%1Fspelled-q", None),
    ("GET", "/api/v1/timers/alpha%1Fspelled-q/t", None),
    ("DELETE", "/api/v1/timers/alpha%1Fspelled-q/t", None),
    ("POST", "/api/v1/push", {"items": [{"queue": "alpha\x1fspelled-q", "payload": "forged"}]}),
    ("POST", "/api/v1/transaction", {"push": [{"queue": "alpha\x1fspelled-q", "payload": "forged"}]}),
    ("POST", "/api/v1/configure", {"queue": "alpha\x1fspelled-q", "options": {"retryLimit": 1}}),
    ("DELETE", "/api/v1/consumer-groups/g/queues/alpha%1Fspelled-q", None),
]


def test_no_caller_can_spell_another_tenants_names(who):
    a = who["a"]
    a.ok("PUT", "/api/v1/kv/spelled/k", {"value": "alpha's", "forever": True})
    a.push("spelled-q", "alpha's message")
    a.ok("POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "spelled-q", "key": "t", "delayMs": 3_600_000, "payload": 1}]})
    info = a.ok("GET", "/api/v1/resources/queues/spelled-q")
    for name in ("default", "operator", "b-admin"):
        for method, target, body in SPELLED:
            status, answer = who[name](method, target, body)
            assert status == 400 and answer["code"] in ("invalid_ns", "invalid_queue"), (name, target, answer)
        # Listing prefixes are filters inside the caller's own names.
        status, page = who[name]("GET", "/api/v1/resources/queues?prefix=alpha%1F")
        assert status == 200 and page["items"] == []
    assert a.ok("GET", "/api/v1/kv/spelled/k")["value"] == "alpha's"
    assert a.ok("GET", "/api/v1/resources/queues/spelled-q") == info


# -- a pause stops every write of its area ---------------------------------------------------------------

@pytest.mark.parametrize("write", ["extend", "release", "requeue", "purge", "group-delete", "group-delete-everywhere",
                                   "queue-delete"])
def test_a_queues_pause_answers_503_to_every_queue_write(who, write):
    """README: a pause of {"queues": true} makes "that tenant's writes answer 503 paused ...; reads
    go on". The queue writes of an admin (deletes and purges) and a lease's release are writes too."""
    a, a_admin, operator = who["a"], who["a-admin"], who["operator"]
    queue = f"paused-{write}"
    a.push(queue, "one", "two", partition="p")
    a.push(queue, "poison", partition="d")
    [poison] = a.ok("GET", f"/api/v1/pop/queue/{queue}/partition/d")["messages"]
    a.ok("POST", "/api/v1/ack", _ack_of(poison, status="dlq"))
    group = f"group-{write}"  # its own: a delete everywhere touches no other test's
    leased = a.ok("GET", f"/api/v1/pop/queue/{queue}/partition/p?consumerGroup={group}")
    calls = {
        "extend": ("POST", f"/api/v1/lease/{leased['leaseId']}/extend", {}),
        "release": ("POST", f"/api/v1/lease/{leased['leaseId']}/release", {}),
        "requeue": ("POST", "/api/v1/dlq/requeue", {"queue": queue, "items": [
            {"partitionId": poison["partitionId"], "offset": poison["offset"]}]}),
        "purge": ("DELETE", f"/api/v1/dlq?queue={queue}", None),
        "group-delete": ("DELETE", f"/api/v1/consumer-groups/{group}/queues/{queue}", None),
        "group-delete-everywhere": ("DELETE", f"/api/v1/consumer-groups/{group}", None),
        "queue-delete": ("DELETE", f"/api/v1/resources/queues/{queue}", None),
    }
    before = a.ok("GET", f"/api/v1/resources/queues/{queue}")
    operator.ok("POST", "/api/v1/pause", {"queues": True, "tenant": "alpha"})
    try:
        status, answer = a_admin(*calls[write])
        after = a.ok("GET", f"/api/v1/resources/queues/{queue}")
    finally:
        operator.ok("POST", "/api/v1/resume", {"queues": True, "tenant": "alpha"})
    assert (status, answer["code"] if status != 200 else answer) == (503, "paused")
    assert after == before
