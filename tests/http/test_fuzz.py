"""Seeded fuzzing of every route in both wire formats: random and mutated requests never get a 5xx,
never end the server, and never touch what was written before.

Each request starts from a valid template of its route, then some of its fields are replaced by
values of every kind either format can carry (byte strings, bignums, tags, NaN, deep nesting,
huge strings), dropped, misspelt or joined by unknown ones, and sometimes its encoded body is
damaged byte by byte. A failing case prints its seed and index; FUZZ_SEED reruns one seed."""

import json
import os
import random

import cbor2
import pytest

from queen.auth import AuthFile
from queen.testing import HttpClient, open_server

REQUESTS = 5000
SEED = int(os.environ.get("FUZZ_SEED", "20261130"))

def routes(known):
    """Every route with a template of its body; `known` holds ids the server really gave (partitions
    and leases of messages popped and never acked), so acks and lease calls reach past the lookup."""
    return [
        ("POST", "/api/v1/kv", lambda r: {"operations": [kv_op(r) for _ in range(r.randrange(1, 4))]}),
        ("POST", "/api/v1/locks", lambda r: {"operations": [lock_op(r, i) for i in range(r.randrange(1, 3))]}),
        ("POST", "/api/v1/transaction", lambda r: {"kv": [kv_op(r, txn=True) for _ in range(r.randrange(1, 3))]}),
        ("POST", "/api/v1/transaction", lambda r: {
            "ack": [ack_item(r, known)], "push": [push_item(r)], "timers": [timer_op(r, txn=True)]}),
        ("POST", "/api/v1/transaction", lambda r: {
            "operations": [{"type": "ack", **ack_item(r, known)}, {"type": "push", "items": [push_item(r)]}],
            "requiredLeases": [r.choice(known["leases"])]}),
        ("POST", "/api/v1/timers", lambda r: {"operations": [timer_op(r) for _ in range(r.randrange(1, 3))]}),
        ("GET", "/api/v1/timers?queue=orders&prefix={key}&limit={number}&cursor={key}", None),
        ("GET", "/api/v1/timers/orders/{key}", None),
        ("PUT", "/api/v1/kv/app/{key}", lambda r: {"value": value(r), "ttlSeconds": r.randrange(1, 100)}),
        ("POST", "/api/v1/kv/app/{key}/incr", lambda r: {"by": r.randrange(-5, 5), "forever": True}),
        ("GET", "/api/v1/kv/app/{key}", None),
        ("DELETE", "/api/v1/kv/app/{key}?expect={number}", None),
        ("GET", "/api/v1/kv/app?prefix={key}&limit={number}&cursor={key}", None),
        ("GET", "/api/v1/locks?prefix={key}&limit={number}", None),
        ("GET", "/healthz", None),
        ("GET", "/metrics", None),
        ("PATCH", "/api/v1/kv", lambda r: {}),
        ("GET", "/api/v1/{key}", None),
        ("POST", "/api/v1/configure", lambda r: {"queue": r.choice(["orders", "q2"]), "options": {
            r.choice(["leaseTimeSeconds", "leaseTime", "retryLimit", "maxSize", "priority", "colour"]): r.randrange(0, 100)}}),
        ("POST", "/api/v1/push", lambda r: {"items": [push_item(r) for _ in range(r.randrange(1, 4))]}),
        ("GET", "/api/v1/pop/queue/orders?batch={number}&waitMs={number}&consumerGroup={key}&autoAck=true", None),
        ("GET", "/api/v1/pop/queue/{key}/partition/{key}?partitions={number}&wait=true&timeout={number}", None),
        ("POST", "/api/v1/ack", lambda r: ack_item(r, known)),
        ("POST", "/api/v1/ack/batch", lambda r: {"consumerGroup": None,
                                                 "acknowledgments": [ack_item(r, known) for _ in range(2)]}),
        ("POST", "/api/v1/lease/{lease}/extend", lambda r: {"seconds": r.randrange(0, 100)}),
        ("POST", "/api/v1/lease/{lease}/release", lambda r: {}),
        ("GET", "/api/v1/dlq?queue={key}&limit={number}&cursor={key}&offset={number}", None),
        ("POST", "/api/v1/dlq/requeue", lambda r: {"queue": "orders", "items": [
            {"partitionId": r.choice(known["partitions"] + [r.randrange(1, 9)]), "offset": r.randrange(0, 4)}]}),
        ("DELETE", "/api/v1/dlq?queue={key}", None),
        ("GET", "/api/v1/resources/queues?prefix={key}&limit={number}", None),
        ("GET", "/api/v1/resources/queues/{key}/partitions?consumerGroup={key}&limit={number}", None),
        ("DELETE", "/api/v1/consumer-groups/{key}/queues/{key}", None),
        ("GET", "/api/v1/tenant", None),
        ("GET", "/api/v1/tenants", None),
        # Not /pause: a pause (correctly) answers every later write 503, which this test counts as a fault.
        ("POST", "/api/v1/resume", lambda r: {"kv": True, "queues": r.choice([True, False]),
                                              "tenant": r.choice(["default", "fuzz", "nobody"])}),
    ]


def push_item(r):
    return {"queue": r.choice(["orders", "q2", "queen-x"]), "partition": r.choice(["p", "p2", None]),
            "payload": value(r), "transactionId": r.choice([None, "t1", "t2", "queen:3"])}


def ack_item(r, known):
    partition = r.choice(known["partitions"]) if r.random() < 0.7 else r.randrange(1, 40)
    lease = r.choice(known["leases"]) if r.random() < 0.7 else r.randrange(1, 60)
    item = {"partitionId": partition, "leaseId": lease, "status": r.choice(["completed", "failed", "dlq", "retry"])}
    if r.random() < 0.8:
        item["offset"] = r.randrange(0, 4)
    else:
        item["transactionId"] = f"queen:{r.choice(BOUNDARY_INTS + [0, 1, 2])}"
    return item


def timer_op(r, txn=False):
    op = r.choice(["schedule", "cancel"] + ([] if txn else ["get"]))
    raw = {"op": op, "queue": "orders", "key": key(r)}
    if op == "schedule":
        raw["partition"] = r.choice(["p", "p2"])
        raw["payload"] = value(r)
        roll = r.random()
        if roll < 0.15:  # recurring, on a cron schedule in a zone
            raw["cron"] = r.choice(["*/5 * * * *", "0 9 * * 1-5", "30 2 * * *", "61 * * * *", "* * */20 * 1L"])
            raw["timezone"] = r.choice(["UTC", "Europe/Berlin", "America/New_York", "Mars/Base", "localtime"])
        else:
            raw["delayMs"] = r.randrange(0, 10_000)
            if roll < 0.3:  # recurring, with a fixed period from its first time
                raw["everyMs"] = r.randrange(1_000, 100_000)
    return raw


def key(r):
    return r.choice(["a", "b", "c", "k/1", "é", "lock-a", "x" * r.choice([1, 300])])


def value(r):
    return r.choice([1, "text", None, True, {"n": [1, 2]}, [], 3.5])


def kv_op(r, txn=False):
    op = r.choice(["get", "put", "putIfAbsent", "delete", "incr", "check"] + ([] if txn else ["getMany", "getPrefix"]))
    raw = {"op": op, "ns": r.choice(["app", "fuzz", "queen-locks"])}
    if op == "getMany":
        raw["keys"] = [key(r) for _ in range(r.randrange(1, 4))]
    elif op == "getPrefix":
        raw["prefix"] = key(r)[:1]
    else:
        raw["key"] = key(r)
    if op in ("put", "putIfAbsent"):
        raw["value"] = value(r)
    if op in ("put", "putIfAbsent", "incr"):
        raw["ttlSeconds" if r.random() < 0.5 else "forever"] = r.randrange(1, 60) if r.random() < 0.5 else True
    if op in ("check",) or (op in ("put", "delete") and r.random() < 0.3):
        raw["expect"] = r.randrange(0, 50)
    return raw


def lock_op(r, i):
    op = r.choice(["acquire", "renew", "release", "get"])
    raw = {"op": op, "name": f"lock-{i}-{r.randrange(3)}"}
    if op in ("acquire", "renew"):
        raw["ttlSeconds"] = r.randrange(1, 30)
    if op == "acquire" and r.random() < 0.2:
        raw["waitMs"] = r.randrange(0, 200)
    if op in ("renew", "release"):
        raw["slot"], raw["token"] = 0, r.randrange(1, 100)
    if r.random() < 0.5:
        raw["owner"] = f"o{r.randrange(3)}"
    return raw


ODD_VALUES = [
    None, True, False, 0, -1, 1 << 63, (1 << 64) + 1, -(1 << 70), 1e308, float("nan"), float("-inf"), "",
    "x" * 70_000, "\x00\x1f\u2028", b"", b"\xff\x00", [], {}, [[[[[]]]]], {"op": "put"}, {"$bytes": "AA=="},
    {"$bytes": 7}, cbor2.CBORTag(1, 0), cbor2.CBORTag(37, b"\x00" * 16), cbor2.CBORTag(999, "x"),
    cbor2.undefined, {1: 2}, {"a": b"\x00"}, frozenset({1}), 12.0,
]
JSON_SAFE = [v for v in ODD_VALUES if isinstance(v, (type(None), bool, int, str, list, dict))
             and not (isinstance(v, int) and not -(1 << 63) <= v < (1 << 64))
             and not (isinstance(v, dict) and any(not isinstance(k, str) or isinstance(x, bytes) for k, x in v.items()))]


def mutate(r, document, odd):
    """Replace, drop or misspell fields anywhere in the document, or add unknown ones."""
    if isinstance(document, list):
        return [mutate(r, item, odd) for item in document]
    if not isinstance(document, dict):
        return r.choice(odd) if r.random() < 0.2 else document
    out = {}
    for name, item in document.items():
        roll = r.random()
        if roll < 0.08:
            continue
        if roll < 0.16:
            out[name[:-1] + "x"] = item
        elif roll < 0.30:
            out[name] = r.choice(odd)
        else:
            out[name] = mutate(r, item, odd)
    if r.random() < 0.1:
        out[r.choice(["extra", "expct", "Op", ""])] = r.choice(odd)
    return out


def encode(r, document, as_cbor):
    try:
        body = cbor2.dumps(document) if as_cbor else json.dumps(document, allow_nan=False).encode()
    except (TypeError, ValueError):
        body = cbor2.dumps(document) if as_cbor else b'{"operations": [}'
    if r.random() < 0.1:  # damage the encoded bytes
        body = bytearray(body)
        for _ in range(r.randrange(1, 4)):
            if body:
                body[r.randrange(len(body))] = r.randrange(256)
        body = bytes(body[:r.randrange(len(body) + 1)] if r.random() < 0.3 else body)
    return body


# Integers at the edges of what stores them: a 32-bit bitmap, a JSON double, a signed and an
# unsigned 64-bit field; with their neighbours and negatives.
BOUNDARY_INTS = sorted({sign * (edge + step) for edge in (1 << 31, 1 << 32, 1 << 53, 1 << 63, 1 << 64)
                        for step in (-1, 0, 1) for sign in (1, -1)})


def at_boundaries(r, document):
    """Every integer field (not a bool) of the document, anywhere, replaced by a boundary integer
    half of the time."""
    if isinstance(document, list):
        return [at_boundaries(r, item) for item in document]
    if isinstance(document, dict):
        return {name: at_boundaries(r, item) for name, item in document.items()}
    if type(document) is int and r.random() < 0.5:
        return r.choice(BOUNDARY_INTS)
    return document


def fill(path, r, known, numbers):
    path = path.replace("{lease}", str(r.choice(known["leases"] + [r.choice(numbers)])))
    return path.replace("{key}", r.choice(["k", "%2F", "%ZZ", "%00", "x" * 2000, "%C3%A9", "%FF"])).replace(
        "{number}", r.choice(numbers))


ODD_NUMBERS = ["1", "0", "-1", "99999999999999999999999", "abc", ""]
BOUNDARY_NUMBERS = [str(n) for n in BOUNDARY_INTS] + ["1", "0"]


async def open_fuzz_target(client: HttpClient) -> dict:
    """Something to harm (a row, a held lock) and something to reach (messages popped under leases
    and never acked, on two partitions); what was written, and the ids the server gave."""
    status, row = await client.request("PUT", "/api/v1/kv/sacred/kept", {"value": {"n": 1}, "forever": True})
    assert status == 200
    [held] = await client.locks({"op": "acquire", "name": "sacred-lock", "ttlSeconds": 3600, "owner": "keeper"})
    status, _ = await client.request("POST", "/api/v1/push", {"items": [
        {"queue": "orders", "partition": partition, "payload": n} for partition in ("p", "p2") for n in range(3)]})
    assert status == 200
    known = {"partitions": [], "leases": [], "row": row, "lock": held}
    for partition in ("p", "p2"):
        status, popped = await client.request("GET", f"/api/v1/pop/queue/orders/partition/{partition}?batch=2")
        assert status == 200 and popped["messages"], popped
        known["partitions"].append(popped["messages"][0]["partitionId"])
        known["leases"].append(popped["leaseId"])
    return known


async def fuzz(client: HttpClient, seed: int, known: dict, odd: bool) -> dict:
    """REQUESTS requests from the route templates: with odd values of every kind (odd) or with
    integers at the boundaries on every numeric field. Not one may get a 5xx. The statuses seen."""
    r = random.Random(seed)
    statuses: dict[int, int] = {}
    table = routes(known)
    for index in range(REQUESTS):
        method, path, template = r.choice(table)
        as_cbor = r.random() < 0.5
        headers = {"content-type": "application/cbor" if as_cbor else r.choice(["application/json", "text/plain"])}
        if r.random() < 0.3:
            headers["accept"] = "application/cbor"
        body = None
        if template is not None:
            document = template(r)
            if odd:
                body = encode(r, mutate(r, document, ODD_VALUES if as_cbor else JSON_SAFE), as_cbor)
            else:
                document = at_boundaries(r, document)
                body = cbor2.dumps(document) if as_cbor else json.dumps(document).encode()
        target = fill(path, r, known, ODD_NUMBERS if odd else BOUNDARY_NUMBERS)
        status, answer = await client.request(method, target, body, headers)
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, f"seed {seed} request {index}: {method} {target[:200]} -> {status} {answer!r:.300}"
    return statuses


async def assert_unharmed(client: HttpClient, known: dict) -> None:
    status, after = await client.request("GET", "/api/v1/kv/sacred/kept")
    assert (status, after["value"], after["version"]) == (200, {"n": 1}, known["row"]["version"])
    [still] = await client.locks({"op": "get", "name": "sacred-lock"})
    assert [(h["owner"], h["token"]) for h in still["holders"]] == [("keeper", known["lock"]["token"])]
    status, health = await client.request("GET", "/healthz")
    assert status == 200, health


async def test_fuzzed_requests_in_json_and_cbor_never_get_a_5xx_or_harm_earlier_data(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        known = await open_fuzz_target(client)
        statuses = await fuzz(client, SEED, known, odd=True)
        print(f"fuzz seed {SEED}: {REQUESTS} requests, statuses {dict(sorted(statuses.items()))}")
        assert sum(statuses.values()) == REQUESTS and statuses.get(400, 0) > REQUESTS // 4, statuses
        await assert_unharmed(client, known)


async def test_boundary_integers_on_every_numeric_field_never_get_a_5xx_or_fail_the_server(tmp_path, autojump_clock):
    """2^31, 2^32, 2^53, 2^63, 2^64 and their neighbours, positive and negative, in every integer
    field of every route's body and query, over JSON and CBOR, against real partitions and live
    leases: the server answers each, and is healthy after."""
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        known = await open_fuzz_target(client)
        statuses = await fuzz(client, SEED + 1, known, odd=False)
        print(f"boundary fuzz seed {SEED + 1}: {REQUESTS} requests, statuses {dict(sorted(statuses.items()))}")
        assert statuses.get(200, 0) > REQUESTS // 10 and statuses.get(400, 0) > REQUESTS // 10, statuses
        await assert_unharmed(client, known)


class TokenClient:
    """An HttpClient that sends a token with every request."""

    def __init__(self, client: HttpClient, secret: str):
        self.client = client
        self.authorization = {"authorization": f"Bearer {secret}"}

    async def request(self, method, path, body=None, headers=None):
        return await self.client.request(method, path, body, {**(headers or {}), **self.authorization})

    async def locks(self, *operations):
        status, body = await self.request("POST", "/api/v1/locks", {"operations": list(operations)})
        assert status == 200, body
        return body["results"]


@pytest.mark.parametrize("odd", [True, False], ids=["odd-values", "boundary-integers"])
async def test_fuzzing_with_a_tenant_token_never_gets_a_5xx_and_stays_in_the_tenant(tmp_path, autojump_clock, odd):
    """The same fuzz with auth on, as a writer of a named tenant (every name stored under its
    prefix); the default tenant's row, written by the operator, is neither reached nor harmed."""
    path = str(tmp_path / "auth.json")
    auth_file = AuthFile.load(path, missing_ok=True)
    writer, operator = auth_file.add("fuzz", "writer", "fuzz"), auth_file.add("ops", "admin", "*")
    auth_file.save()
    async with open_server(tmp_path / "d", auth_file=path) as server:
        admin = TokenClient(HttpClient(server.port), operator)
        outside = await open_fuzz_target(admin)
        client = TokenClient(HttpClient(server.port), writer)
        known = await open_fuzz_target(client)
        # The tenant's ids and the operator's both within reach: the fuzzer names either.
        known["leases"] += outside["leases"]
        known["partitions"] += outside["partitions"]
        statuses = await fuzz(client, SEED + 2 + odd, known, odd=odd)
        assert sum(statuses.values()) == REQUESTS and 401 not in statuses, statuses
        await assert_unharmed(client, {**known, "leases": known["leases"][:2]})
        await assert_unharmed(admin, outside)
        status, view = await client.request("GET", "/api/v1/tenant")
        assert status == 200 and view["tenant"] == "fuzz"
