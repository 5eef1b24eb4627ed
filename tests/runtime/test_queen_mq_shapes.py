"""The public Queen MQ client's spellings and answer fields, over HTTP in-process: what
tests/compat runs through the client itself, checked here on the wire, so it holds even where the
package registry cannot be reached. Our own shapes are asserted beside them: both are served."""

import base64
import json

from queen.testing import HttpClient, open_server


async def post(client, path, body, status=200):
    code, answer = await client.request("POST", path, body)
    assert code == status, answer
    return answer


async def kv(client, *operations):
    return (await post(client, "/api/v1/kv", {"operations": list(operations)}))["results"]


async def test_errors_health_and_kv_in_both_spellings(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        refused = await post(c, "/api/v1/kv", {"operations": [{"op": "get", "ns": "n"}]}, status=400)
        assert refused["code"] == "invalid_key" and refused["detail"] == refused["error"] and refused["detail"]
        code, health = await c.request("GET", "/health")
        assert (code, health) == (200, {"status": "ok"})
        [first, second] = await kv(c, {"op": "incr", "ns": "n", "key": "c", "delta": 5, "forever": True},
                                   {"op": "incr", "ns": "n", "key": "d", "by": 2, "forever": True})
        assert first["value"] == 5 and second["value"] == 2
        both = await post(c, "/api/v1/kv", {"operations": [{"op": "incr", "ns": "n", "key": "c", "by": 1, "delta": 1,
                                                            "forever": True}]}, status=400)
        assert both["code"] == "option_conflict"
        [got] = await kv(c, {"op": "get", "ns": "n", "key": "c"})
        assert got["key"] == "c" and got["value"] == 5 and got["updatedAt"]
        [miss] = await kv(c, {"op": "put", "ns": "n", "key": "c", "value": 1, "expect": 99, "forever": True})
        assert miss["current"] == {"value": 5, "version": got["version"]}  # ours
        assert (miss["value"], miss["version"]) == (5, got["version"])  # theirs
        [check] = await kv(c, {"op": "check", "ns": "n", "key": "c", "expect": 0})
        assert check == {"applied": False, "version": got["version"], "reason": "exists", "value": 5,
                         "index": 0, "op": "check"}
        [many] = await kv(c, {"op": "getMany", "ns": "n", "keys": ["c", "nope"]})
        assert [i["key"] for i in many["items"]] == ["c", "nope"]
        assert [r["key"] for r in many["rows"]] == ["c"] and many["missing"] == ["nope"]
        for n in range(3):
            await kv(c, {"op": "put", "ns": "p", "key": f"k{n}", "value": n, "forever": True})
        [page] = await kv(c, {"op": "getPrefix", "ns": "p", "prefix": "k", "after": "k0", "limit": 1, "keysOnly": True})
        assert [r["key"] for r in page["rows"]] == ["k1"] and "value" not in page["rows"][0]
        assert page["truncated"] is True and page["nextAfter"] == "k1" and page["items"] == page["rows"]
        [ours] = await kv(c, {"op": "getPrefix", "ns": "p", "prefix": "k", "cursor": page["cursor"]})
        assert [i["key"] for i in ours["items"]] == ["k2"] and ours["cursor"] is None and ours["truncated"] is False


async def test_locks_get_held_and_renew_without_a_slot(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        [got] = await c.locks({"op": "acquire", "name": "l", "ttlSeconds": 30, "owner": "a", "limit": 2},)
        [other] = await c.locks({"op": "acquire", "name": "l", "ttlSeconds": 30, "owner": "b", "limit": 2})
        [renewed] = await c.locks({"op": "renew", "name": "l", "token": other["token"], "ttlSeconds": 30})
        assert renewed["renewed"] is True and renewed["slot"] == other["slot"] == 1
        [held] = await c.locks({"op": "get", "name": "l"})
        assert held["held"] is True and len(held["holders"]) == 2
        [released] = await c.locks({"op": "release", "name": "l", "token": got["token"]})
        [gone] = await c.locks({"op": "release", "name": "l", "token": renewed["token"]})
        assert released["released"] is True and gone["released"] is True
        [empty] = await c.locks({"op": "get", "name": "l"})
        assert empty["held"] is False and empty["holders"] == []


async def test_timers_in_the_timer_key_spelling_and_the_path_routes(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        payload = base64.b64encode(json.dumps({"n": 1}).encode()).decode()
        op = {"op": "schedule", "queue": "t", "timerKey": "a/b", "payload": payload, "delayMs": 60_000, "txn": "x1"}
        [first] = (await post(c, "/api/v1/timers", {"operations": [op]}))["results"]
        assert first["ok"] is True and first["status"] == "scheduled" and first["timerKey"] == "a/b"
        assert first["txn"] == "x1" and first["deliverAt"] == first["at"]
        [moved] = (await post(c, "/api/v1/timers", {"operations": [{**op, "op": "reschedule"}]}))["results"]
        assert moved["status"] == "rescheduled" and moved["replaced"] is True
        code, peek = await c.request("GET", "/api/v1/timers/t/a/b")
        assert code == 200 and peek["found"] is True and peek["payload"] == {"n": 1} and peek["transactionId"] == "x1"
        code, page = await c.request("GET", "/api/v1/timers/t?limit=10")
        assert [row["timerKey"] for row in page["rows"]] == ["a/b"] and page["truncated"] is False
        code, cancelled = await c.request("DELETE", "/api/v1/timers/t/a/b?txn=x1")
        assert cancelled["ok"] is True and cancelled["status"] == "cancelled"
        code, absent = await c.request("DELETE", "/api/v1/timers/t/a/b?txn=x1")
        assert absent["status"] == "absent" and absent["txn"] == "x1"
        refused = await post(c, "/api/v1/timers", {"operations": [{**op, "payloadZstd": True}]}, status=400)
        assert refused["code"] == "unsupported_field"
        refused = await post(c, "/api/v1/timers", {"operations": [{**op, "payload": "not base64!"}]}, status=400)
        assert refused["code"] == "invalid_payload"


async def test_the_operations_form_of_a_transaction_is_one_step_with_flat_results(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        await post(c, "/api/v1/push", {"items": [{"queue": "q", "partition": "p", "payload": n} for n in range(2)]})
        code, got = await c.request("GET", "/api/v1/pop/queue/q?batch=2")
        [m0, m1] = got["messages"]
        step = {"operations": [
            {"type": "ack", "transactionId": m0["transactionId"], "partitionId": str(m0["partitionId"]),
             "status": "completed", "consumerGroup": None},  # no leaseId: the one required lease is lent
            {"type": "push", "items": [{"queue": "next", "payload": "a"}, {"queue": "next", "payload": "b"}]},
            {"type": "ack", "transactionId": m1["transactionId"], "partitionId": m1["partitionId"],
             "leaseId": str(got["leaseId"])}],
            "requiredLeases": [str(got["leaseId"])],
            "kv": [{"op": "putIfAbsent", "ns": "n", "key": "once", "value": 1, "forever": True, "required": True}]}
        answer = await post(c, "/api/v1/transaction", step)
        assert answer["success"] is True and len(answer["results"]) == 5
        assert [r.get("status") for r in answer["results"][1:3]] == ["queued", "queued"]
        assert answer["results"][0]["success"] and answer["results"][3]["success"] and answer["results"][4]["applied"]
        again = await post(c, "/api/v1/transaction", {"operations": [], "requiredLeases": [], "kv": step["kv"]})
        assert again["success"] is False and again["reason"] == "kv_precondition" and again["failedIndex"] == 0
        assert again["kvReason"] == "exists" and again["value"] == 1 and again["error"] == "kv_precondition"
        lost = await post(c, "/api/v1/transaction", {"operations": step["operations"][:1],
                                                     "requiredLeases": step["requiredLeases"]})
        assert lost["success"] is False and lost["error"] == "lease_lost" and lost["failedIndex"] == 0
        [lock] = await c.locks({"op": "acquire", "name": "g", "ttlSeconds": 30, "owner": "me"})
        guard = {**lock["guard"], "expect": lock["token"] + 1}  # a token this holder no longer has
        missed = await post(c, "/api/v1/transaction", {"operations": [], "requiredLeases": [], "kv": [guard]})
        assert (missed["failedIndex"], missed["kvReason"], missed["value"], missed["version"]) == (
            0, "version", "me", lock["token"])
        mixed = await post(c, "/api/v1/transaction", {"operations": [], "ack": []}, status=400)
        assert mixed["code"] == "unsupported_form"


async def test_a_consumer_group_is_deleted_from_every_queue(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        c = HttpClient(server.port)
        for queue in ("a", "b"):
            await post(c, "/api/v1/push", {"items": [{"queue": queue, "payload": 1}]})
            await c.request("GET", f"/api/v1/pop/queue/{queue}?consumerGroup=g")
        code, answer = await c.request("DELETE", "/api/v1/consumer-groups/g?deleteMetadata=true")
        assert code == 200 and answer == {"deleted": True, "consumerGroup": "g", "queues": ["a", "b"]}
        code, info = await c.request("GET", "/api/v1/resources/queues/a")
        assert info["groups"] == []
        code, again = await c.request("DELETE", "/api/v1/consumer-groups/g")
        assert again == {"deleted": False, "consumerGroup": "g", "queues": []}
