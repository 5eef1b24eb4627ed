"""A tenant's quotas, write rate and pauses through the whole server in-process, time driven by
trio's MockClock: each quota answers 429 with Retry-After at its limit, the rate holds within 10%
over five seconds, a pause answers 503 to writes and not to reads and holds across a restart."""

import json

import pytest

from queen.auth import AuthFile
from queen.testing import HttpClient, open_server


def auth_file(tmp_path, settings: dict) -> tuple[str, dict]:
    """An auth file with a writer and an admin of tenant `acme` (its settings as given) and the
    server's operator: (path, {role: authorization header})."""
    path = str(tmp_path / "auth.json")
    file = AuthFile.load(path, missing_ok=True)
    secrets = {"writer": file.add("acme-writer", "writer", "acme"), "admin": file.add("acme-admin", "admin", "acme"),
               "reader": file.add("acme-reader", "reader", "acme"), "operator": file.add("ops", "admin", "*"),
               "other": file.add("zeta-writer", "writer", "zeta")}
    file.tenant_settings = {"acme": settings} if settings else {}
    file.save()
    return path, {role: {"authorization": f"Bearer {secret}"} for role, secret in secrets.items()}


async def reloaded(server) -> None:
    """SIGHUP's effect, and wait until the server has handled it."""
    import trio

    done = server.reloads_done
    server.reload()
    while server.reloads_done == done:
        await trio.sleep(0.01)


async def put(client, headers, key, value=1):
    return await client.request("PUT", f"/api/v1/kv/app/{key}", {"value": value, "forever": True}, headers)


def assert_429(answer, code):
    status, body = answer
    assert status == 429, answer
    assert body["code"] == code, body
    assert body["details"]["retryAfterSeconds"] >= 1


async def test_keys_quota_counts_lock_permits_and_refuses_at_the_limit(tmp_path, autojump_clock):
    path, who = auth_file(tmp_path, {"keysMax": 3})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        assert (await put(client, who["writer"], "a"))[0] == 200
        status, body = await client.request("POST", "/api/v1/locks", {"operations": [
            {"op": "acquire", "name": "job", "ttlSeconds": 30, "owner": "w1"}]}, who["writer"])
        assert status == 200 and body["results"][0]["acquired"] is True
        assert (await put(client, who["writer"], "b"))[0] == 200
        assert_429(await put(client, who["writer"], "c"), "quota_keys")
        status, body = await client.request("POST", "/api/v1/locks", {"operations": [
            {"op": "acquire", "name": "job2", "ttlSeconds": 30, "owner": "w1"}]}, who["writer"])
        assert status == 429 and body["code"] == "quota_keys"
        # Nothing of a refused call was applied; reads and deletes go on, and free room.
        assert (await client.request("GET", "/api/v1/kv/app/c", None, who["writer"]))[1]["found"] is False
        assert (await client.request("DELETE", "/api/v1/kv/app/a", None, who["writer"]))[0] == 200
        assert (await put(client, who["writer"], "c"))[0] == 200
        status, view = await client.request("GET", "/api/v1/tenant", None, who["reader"])
        assert view["usage"]["keys"] == 3 and view["limits"] == {"keysMax": 3}
        # Another tenant, and the operator's default names, are not held to acme's quota.
        assert (await put(client, who["other"], "x"))[0] == 200
        assert (await put(client, who["operator"], "x"))[0] == 200


async def test_bytes_quota_counts_kv_messages_and_timers(tmp_path, autojump_clock):
    path, who = auth_file(tmp_path, {"bytesMax": 100})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        assert (await put(client, who["writer"], "k", "x" * 40))[0] == 200  # 1 + 42 bytes
        status, _ = await client.request("POST", "/api/v1/push", {"items": [
            {"queue": "q", "payload": "y" * 40}]}, who["writer"])
        assert status == 200
        status, view = await client.request("GET", "/api/v1/tenant", None, who["writer"])
        assert view["usage"]["bytes"] == 43 + 42
        status, body = await client.request("POST", "/api/v1/timers", {"operations": [
            {"op": "schedule", "queue": "q", "key": "t", "delayMs": 60_000, "payload": "z" * 20}]}, who["writer"])
        assert status == 200 and body["results"][0]["status"] in ("scheduled", "moved"), body
        # At 107 of 100 bytes, nothing that adds bytes is taken: KV, pushes or timers.
        assert_429(await put(client, who["writer"], "k2"), "quota_bytes")
        assert_429(await client.request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1}]},
                                        who["writer"]), "quota_bytes")


async def test_message_and_timer_quotas(tmp_path, autojump_clock):
    path, who = auth_file(tmp_path, {"messagesMax": 2, "timersMax": 1})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        status, _ = await client.request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1},
                                                                            {"queue": "q", "payload": 2}]}, who["writer"])
        assert status == 200
        answer = await client.request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 3}]}, who["writer"])
        assert_429(answer, "quota_messages")
        assert answer[1]["details"]["limit"] == 2
        schedule = {"op": "schedule", "queue": "q", "key": "t1", "delayMs": 60_000, "payload": 1}
        assert (await client.request("POST", "/api/v1/timers", {"operations": [schedule]}, who["writer"]))[0] == 200
        answer = await client.request("POST", "/api/v1/timers", {"operations": [{**schedule, "key": "t2"}]},
                                      who["writer"])
        assert_429(answer, "quota_timers")
        # A transaction that would push past the quota is refused whole.
        status, body = await client.request("POST", "/api/v1/transaction", {
            "kv": [{"op": "put", "ns": "app", "key": "t", "value": 1, "forever": True}],
            "push": [{"queue": "q", "payload": 4}]}, who["writer"])
        assert status == 429 and body["code"] == "quota_messages"
        assert (await client.request("GET", "/api/v1/kv/app/t", None, who["writer"]))[1]["found"] is False
        # Consuming frees room: pop and ack both, and the next push is taken.
        status, popped = await client.request("GET", "/api/v1/pop/queue/q?batch=2", None, who["writer"])
        acks = [{"partitionId": m["partitionId"], "leaseId": m["leaseId"], "transactionId": m["transactionId"],
                 "status": "completed"} for m in popped["messages"]]
        status, _ = await client.request("POST", "/api/v1/ack/batch", {"acknowledgments": acks}, who["writer"])
        assert status == 200
        assert (await client.request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 5}]},
                                     who["writer"]))[0] == 200


@pytest.mark.parametrize("setting, per_call", [("writesPerSecond", 1), ("operationsPerSecond", 4)])
async def test_the_write_rate_holds_within_ten_percent_over_five_seconds(tmp_path, autojump_clock, setting, per_call):
    import trio

    rate = 200
    path, who = auth_file(tmp_path, {setting: rate})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        taken = refused = 0
        started = trio.current_time()
        body = {"operations": [{"op": "put", "ns": "app", "key": f"k{i}", "value": 1, "forever": True}
                               for i in range(per_call)]}
        while trio.current_time() - started < 5.0:
            status, answer = await client.request("POST", "/api/v1/kv", body, who["writer"])
            if status == 200:
                taken += per_call
            else:
                assert status == 429 and answer["code"] == "rate_limited", answer
                refused += 1
                await trio.sleep(0.001)  # a client backing off; virtual time
        expected = rate * 5
        assert refused > 0
        assert abs(taken - expected) <= expected * 0.10, (taken, expected)
        # Reads are never rate limited.
        assert (await client.request("GET", "/api/v1/kv/app/k0", None, who["writer"]))[0] == 200


async def test_a_pause_refuses_writes_not_reads_and_holds_across_a_restart(tmp_path, autojump_clock):
    path, who = auth_file(tmp_path, {})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        assert (await put(client, who["writer"], "k"))[0] == 200
        assert (await client.request("POST", "/api/v1/pause", {"kv": True}, who["writer"]))[0] == 403
        status, body = await client.request("POST", "/api/v1/pause", {"kv": True}, who["admin"])
        assert status == 200 and body == {"tenant": "acme", "paused": {"kv": True, "queues": False}}
        # Only the operator names another tenant.
        assert (await client.request("POST", "/api/v1/pause", {"kv": True, "tenant": "zeta"}, who["admin"]))[0] == 403
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        status, body = await put(client, who["writer"], "k", 2)
        assert status == 503 and body["code"] == "paused"
        status, body = await client.request("POST", "/api/v1/locks", {"operations": [
            {"op": "acquire", "name": "job", "ttlSeconds": 30, "owner": "w"}]}, who["writer"])
        assert status == 503 and body["code"] == "paused"  # locks are KV: paused with it
        assert (await client.request("GET", "/api/v1/kv/app/k", None, who["reader"]))[1]["value"] == 1
        assert (await client.request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1}]},
                                     who["writer"]))[0] == 200  # queues were not paused
        assert (await put(client, who["other"], "k"))[0] == 200  # nor another tenant
        status, body = await client.request("POST", "/api/v1/resume", {"kv": True}, who["operator"] | {})
        assert status == 200  # the operator's own (default) tenant: acme stays paused
        assert (await put(client, who["writer"], "k", 2))[0] == 503
        status, body = await client.request("POST", "/api/v1/resume", {"kv": True, "tenant": "acme"}, who["operator"])
        assert status == 200 and body["paused"] == {"kv": False, "queues": False}
        assert (await put(client, who["writer"], "k", 2))[0] == 200
        status, body = await client.request("POST", "/api/v1/pause", {"queues": True}, who["admin"])
        assert status == 200
        status, body = await client.request("GET", "/api/v1/pop/queue/q", None, who["writer"])
        assert status == 503 and body["code"] == "paused"
        status, metrics = await client.request("GET", "/metrics", None, who["reader"])
        assert 'queen_tenant_paused{tenant="acme",area="queues"} 1' in metrics.decode()


async def test_an_auth_file_that_cannot_be_used_is_kept_out_on_reload(tmp_path, autojump_clock):
    path, who = auth_file(tmp_path, {})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        assert (await put(client, who["writer"], "k"))[0] == 200
        with open(path) as f:
            document = json.load(f)
        document["tokens"][0]["role"] = "root"
        with open(path, "w") as f:
            json.dump(document, f)
        await reloaded(server)
        assert (await put(client, who["writer"], "k"))[0] == 200  # the old file is still in force
        file = AuthFile.load(str(tmp_path / "fresh.json"), missing_ok=True)
        secret = file.add("new", "writer", "acme")
        file.path = path
        file.save()
        await reloaded(server)
        assert (await put(client, who["writer"], "k"))[0] == 401  # removed tokens stop at once
        assert (await put(client, {"authorization": f"Bearer {secret}"}, "k"))[0] == 200


async def test_the_sdk_waits_as_retry_after_says_and_gives_up_on_a_quota(tmp_path, autojump_clock):
    import trio

    import queen_client

    path, who = auth_file(tmp_path, {"writesPerSecond": 1, "messagesMax": 3})
    secret = who["writer"]["authorization"].removeprefix("Bearer ")
    async with open_server(tmp_path / "data", auth_file=path) as server:
        async with queen_client.Client(f"http://127.0.0.1:{server.port}", token=secret) as client:
            started = trio.current_time()
            for n in range(3):
                await client.kv.put("app", f"k{n}", n, forever=True)  # a bucket of one: one a second
            assert trio.current_time() - started >= 2.0
            assert client.statistics()["retries"] >= 2
            queue = client.queue("q")
            await queue.push_many([1, 2, 3])
            with pytest.raises(queen_client.RateLimited) as refused:
                await queue.push(4)
            assert refused.value.code == "quota_messages" and refused.value.retry_after_s >= 1


async def test_an_operators_pause_is_lifted_only_by_the_operator(tmp_path, autojump_clock):
    path, who = auth_file(tmp_path, {})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        status, _ = await client.request("POST", "/api/v1/pause", {"kv": True, "tenant": "acme"}, who["operator"])
        assert status == 200
        status, body = await client.request("POST", "/api/v1/resume", {"kv": True}, who["admin"])
        assert status == 403 and "operator" in body["error"]
        assert (await put(client, who["writer"], "k"))[0] == 503
        status, view = await client.request("GET", "/api/v1/tenant", None, who["reader"])
        assert view["pausedBy"] == {"kv": "operator"}
        # The tenant's own pause of its queues it may lift; the operator's kv pause stays.
        assert (await client.request("POST", "/api/v1/pause", {"queues": True}, who["admin"]))[0] == 200
        assert (await client.request("POST", "/api/v1/resume", {"queues": True}, who["admin"]))[0] == 200
        assert (await client.request("POST", "/api/v1/resume", {"kv": True, "tenant": "acme"}, who["operator"]))[0] == 200
        assert (await put(client, who["writer"], "k"))[0] == 200
        # A tenant nobody names and that holds nothing is a typo, not a tenant to pause.
        status, body = await client.request("POST", "/api/v1/pause", {"kv": True, "tenant": "acne"}, who["operator"])
        assert status == 404 and body["code"] == "tenant_not_found"


async def test_two_authorization_headers_are_refused_and_a_failed_step_shows_names_as_written(tmp_path,
                                                                                             autojump_clock):
    path, who = auth_file(tmp_path, {})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        # Whichever of two a proxy checked, we would take the other: neither is taken.
        head = (b"PUT /api/v1/kv/app/k HTTP/1.1\r\nhost: q\r\ncontent-type: application/json\r\n"
                + b"authorization: " + who["reader"]["authorization"].encode() + b"\r\n"
                + b"authorization: " + who["writer"]["authorization"].encode() + b"\r\n")
        body = b'{"value": 1, "forever": true}'
        stream = await trio_open(server.port)
        await stream.send_all(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        answer = await stream.receive_some(65536)
        await stream.aclose()
        assert answer.startswith(b"HTTP/1.1 400") and b"two Authorization headers" in answer
        assert (await client.request("GET", "/api/v1/kv/app/k", None, who["reader"]))[1]["found"] is False
        status, answer = await client.request("POST", "/api/v1/transaction", {"kv": [
            {"op": "put", "ns": "orders", "key": "o1", "value": 1, "forever": True, "expect": 7}]}, who["writer"])
        assert status == 200 and answer["success"] is False
        assert answer["failed"]["ns"] == "orders"


async def trio_open(port):
    import trio

    return await trio.open_tcp_stream("127.0.0.1", port)


async def test_a_new_leader_reads_the_pauses_its_rows_hold_before_it_serves(tmp_path, autojump_clock):
    # A follower's bookkeeping of pauses is what it read at start; a pause set on the leader reaches
    # it as a replicated row only. What the coordinator awaits before a promoted node serves
    # (Server._now_leading) must read every tenant's row again.
    path, who = auth_file(tmp_path, {})
    async with open_server(tmp_path / "data", auth_file=path) as server:
        client = HttpClient(server.port)
        assert (await client.request("POST", "/api/v1/pause", {"kv": True}, who["admin"]))[0] == 200
        tenancy = server.http.app.tenancy
        tenancy.paused.clear()  # as on a follower that started before the pause
        tenancy._refresh()
        assert (await put(client, who["writer"], "k"))[0] == 200
        await server._now_leading()
        status, body = await put(client, who["writer"], "k", 2)
        assert status == 503 and body["code"] == "paused"
