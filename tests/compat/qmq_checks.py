"""The public Queen MQ Python client (`queen-mq` from PyPI), unchanged, against a running Queen.

Run with the interpreter of a venv that has `queen-mq` installed (its import name is also
`queen`, so it can never share a venv with this project), with QUEEN_URL set:

    /path/to/venv/bin/python tests/compat/qmq_checks.py

Prints one JSON object: {"passed": [names], "failed": {name: why}}. Every check is one call (or
a short sequence) of the client's documented API with a yes/no outcome; none reaches around the
client to the wire (one times a lock handle's own renewal by running it inside the client's
transport, on a transaction's way out). tests/compat/test_queen_mq_client.py runs it and judges
the result.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
import uuid

from queen import Queen  # the public client, not this repository's package

URL = os.environ["QUEEN_URL"]
RUN = uuid.uuid4().hex[:8]
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def name(kind: str) -> str:
    return f"c{RUN}-{kind}"


# -- KV ---------------------------------------------------------------------------------------------


@check
async def kv_put_get(client):
    ns = name("kv")
    put = await client.kv.put(ns, "a", {"n": 1}, ttl_seconds=60)
    got = await client.kv.get(ns, "a")
    assert put and put.get("applied") is True and put.get("version")
    assert got and got.get("value") == {"n": 1} and got.get("version") == put.get("version")
    assert got.get("key") == "a" and got.get("expiresAt") and got.get("updatedAt")


@check
async def kv_get_absent(client):
    got = await client.kv.get(name("kv"), "nothing")
    assert not got and got.get("found") is False


@check
async def kv_put_forever_and_expect(client):
    ns = name("kv")
    first = await client.kv.put(ns, "cas", 1, forever=True)
    ok = await client.kv.put(ns, "cas", 2, forever=True, expect=first["version"])
    stale = await client.kv.put(ns, "cas", 3, forever=True, expect=first["version"])
    assert ok and not stale and stale.get("reason") == "version"
    assert stale.get("version") == ok["version"] and stale.get("value") == 2  # the current row, at top level


@check
async def kv_put_if_absent_and_once(client):
    ns = name("kv")
    assert await client.kv.once(ns, "gate", ttl_seconds=60) is True
    assert await client.kv.once(ns, "gate", ttl_seconds=60) is False
    again = await client.kv.put_if_absent(ns, "gate", 1, ttl_seconds=60)
    assert not again and again.get("reason") == "exists"


@check
async def kv_delete(client):
    ns = name("kv")
    await client.kv.put(ns, "d", 1, forever=True)
    assert await client.kv.delete(ns, "d")
    gone = await client.kv.delete(ns, "d")
    assert not gone and gone.get("reason") == "absent"


@check
async def kv_incr_delta(client):
    ns = name("kv")
    await client.kv.incr(ns, "n", delta=5, ttl_seconds=60)
    second = await client.kv.incr(ns, "n", delta=5, ttl_seconds=60)
    assert second.get("value") == 10


@check
async def kv_incr_max(client):
    ns = name("kv")
    results = [await client.kv.incr(ns, "m", max=2, ttl_seconds=60) for _ in range(3)]
    assert [bool(r) for r in results] == [True, True, False]


@check
async def kv_check(client):
    ns = name("kv")
    put = await client.kv.put(ns, "c", "v", forever=True)
    assert await client.kv.check(ns, "c", expect=put["version"])
    miss = await client.kv.check(ns, "c", expect=put["version"] + 1000)
    assert not miss and miss.get("reason") == "version" and miss.get("value") == "v"


@check
async def kv_get_many(client):
    ns = name("kv")
    await client.kv.put(ns, "m1", 1, forever=True)
    page = await client.kv.get_many(ns, ["m1", "missing"])
    assert [row.get("key") for row in page.get("rows")] == ["m1"] and page.get("missing") == ["missing"]


@check
async def kv_list_all(client):
    ns = name("kvlist")
    for n in range(5):
        await client.kv.put(ns, f"p{n}", n, forever=True)
    rows = await client.kv.list_all(ns, "p", limit=2)
    assert [row.get("key") for row in rows] == [f"p{n}" for n in range(5)]


@check
async def kv_get_prefix_keys_only(client):
    ns = name("kvkeys")
    for n in range(3):
        await client.kv.put(ns, f"k{n}", {"big": n}, forever=True)
    page = await client.kv.get_prefix(ns, "k", after="k0", keys_only=True)
    assert [row.get("key") for row in page.get("rows")] == ["k1", "k2"] and page.get("truncated") is False


@check
async def kv_error_code(client):
    from queen import KvError
    try:
        await client.kv.put(name("kv"), "k", 1, ttl_seconds=400_000_000)  # past the 10-year limit
    except KvError as error:
        assert isinstance(error.code, str) and error.code, error
        return
    raise AssertionError("a ttl past the limit was not refused")


# -- locks ------------------------------------------------------------------------------------------


@check
async def locks_acquire_renew_release(client):
    lock_name = name("lock")
    got = await client.locks.acquire(lock_name, ttl_seconds=30, owner="a")
    assert got and got.get("token")
    renewed = await client.locks.renew(lock_name, token=got["token"], ttl_seconds=30, owner="a")
    assert renewed and renewed["token"] != got["token"]
    assert await client.locks.release(lock_name, token=renewed["token"])


@check
async def locks_get_held(client):
    lock_name = name("lock-get")
    got = await client.locks.acquire(lock_name, ttl_seconds=30, owner="a")
    held = await client.locks.get(lock_name)
    assert held and held.get("held") is True and held.get("holders")
    await client.locks.release(lock_name, token=got["token"])
    assert not await client.locks.get(lock_name)


@check
async def lock_handle_and_semaphore(client):
    lock = client.lock(name("handle"), ttl_seconds=30)
    assert await lock.acquire() is True and lock.held
    other = client.lock(name("handle"), ttl_seconds=30)
    assert await other.acquire() is False
    assert await lock.release() is True
    permits = [client.semaphore(name("sem"), 2, ttl_seconds=30) for _ in range(3)]
    outcomes = [await permit.acquire() for permit in permits]
    assert outcomes == [True, True, False]
    for permit in permits[:2]:
        await permit.release()


@check
async def lock_run(client):
    lock = client.lock(name("run"), ttl_seconds=30)

    async def work(held):
        return "done"

    result = await lock.run(work)
    assert result and result.get("value") == "done"


@check
async def lock_loss_is_seen(client):
    lock_name = name("loss")
    lock = client.lock(lock_name, ttl_seconds=30)
    lost = []
    lock.on_lost(lost.append)
    assert await lock.acquire()
    await client.locks.release(lock_name, token=lock.token)  # an operator takes it away
    assert await lock.renew() is False and lost == ["renew"] and not lock.held


@check
async def txn_guard_of_a_taken_lock_commits_nothing(client):
    lock_name, ns = name("taken"), name("txn")
    lock = client.lock(lock_name, ttl_seconds=30)
    lost = []
    lock.on_lost(lost.append)
    assert await lock.acquire()
    await client.locks.release(lock_name, token=lock.token)  # an operator frees it ...
    other = client.lock(lock_name, ttl_seconds=30)
    assert await other.acquire()  # ... and another holder takes it
    result = await client.transaction().guard(lock).kv.put(ns, "zombie", 1, ttl_seconds=60).commit()
    assert not result and result.get("reason") == "kv_precondition" and lost == ["guard"]
    assert not await client.kv.get(ns, "zombie")
    await other.release()


@check
async def lock_error_code(client):
    from queen import LockError
    try:
        await client.locks.acquire(name("long"), ttl_seconds=10_000_000)  # past the 90-day limit
    except LockError as error:
        assert isinstance(error.code, str) and error.code, error
        return
    raise AssertionError("a lifetime past the limit was not refused")


# -- transactions -----------------------------------------------------------------------------------


@check
async def txn_kv_only(client):
    ns = name("txn")
    result = await client.transaction().kv.put(ns, "k", 1, ttl_seconds=60).commit()
    assert result and (await client.kv.get(ns, "k")).get("value") == 1


@check
async def txn_once_twice(client):
    ns = name("txn")
    assert await client.transaction().once(ns, "marker", ttl_seconds=60).commit()
    again = await client.transaction().once(ns, "marker", ttl_seconds=60).commit()
    assert not again and again.get("reason") == "kv_precondition" and again.get("kvReason") == "exists"
    assert again.get("failedIndex") == 0


@check
async def txn_guard(client):
    lock = client.lock(name("guard"), ttl_seconds=30)
    assert await lock.acquire()
    ns = name("txn")
    result = await client.transaction().guard(lock).kv.put(ns, "guarded", 1, ttl_seconds=60).commit()
    assert result
    await lock.release()


@check
async def txn_guard_lost_to_the_handles_own_renewal_commits_on_retry(client):
    # The client reads the failed guard's row value as {"owner": ...}: its own owner there means
    # its own renewal moved the token, so it sends the bundle again with the new one. The renewal
    # is made to land exactly between the body's build and its judgement by running it first
    # inside the client's own transport, on the transaction's way out (once).
    lock = client.lock(name("own-renewal"), ttl_seconds=30)
    lost = []
    lock.on_lost(lost.append)
    assert await lock.acquire()
    stale_token = lock.token
    http = client._http_client
    post = http.post
    renewed_first = []

    async def renew_then_post(path, body=None, *args, **kwargs):
        if path == "/api/v1/transaction" and not renewed_first:
            renewed_first.append(await lock.renew())
        return await post(path, body, *args, **kwargs)

    http.post = renew_then_post
    try:
        ns = name("txn")
        result = await client.transaction().guard(lock).kv.put(ns, "after-renewal", 1, ttl_seconds=60).commit()
    finally:
        del http.post
    assert renewed_first == [True] and lock.token != stale_token
    assert result, result
    assert lost == [] and lock.held
    assert (await client.kv.get(ns, "after-renewal")).get("value") == 1
    await lock.release()


@check
async def txn_ack_push_kv_timer(client):
    queue, target, ns = name("tq"), name("tq-next"), name("txn")
    await client.queue(queue).partition("p").push([{"data": {"order": 1}}])
    [message] = await client.queue(queue).partition("p").batch(1).wait(False).pop()
    result = await (client.transaction()
                    .ack(message)
                    .queue(target).partition("b").push([{"data": {"next": 1}}])
                    .kv.put(ns, "order-1", {"state": "paid"}, ttl_seconds=60)
                    .timer(queue).key("order-1:review").payload({"review": 1}).after_ms(60_000).schedule()
                    .commit())
    assert result and isinstance(result.get("results"), list) and len(result["results"]) == 4
    popped = await client.queue(target).partition("b").batch(5).wait(False).pop()
    assert [m.get("data") for m in popped] == [{"next": 1}]
    assert (await client.kv.get(ns, "order-1")).get("value") == {"state": "paid"}
    assert await client.timers.peek(queue, "order-1:review")


@check
async def txn_lost_lease_raises_and_writes_nothing(client):
    queue, target = name("tq-lost"), name("tq-lost-next")
    await client.queue(queue).partition("p").push([{"data": 1}])
    [message] = await client.queue(queue).partition("p").batch(1).wait(False).pop()
    await client.ack(message)  # the lease ends with its last message
    stale = dict(message)
    try:
        await client.transaction().ack(stale).queue(target).push([{"data": "never"}]).commit()
    except Exception as error:  # noqa: BLE001 - the client raises a bare Exception with the reason
        assert "lease" in str(error), error
    else:
        raise AssertionError("a step under a lost lease committed")
    assert await client.queue(target).batch(5).wait(False).pop() == []


# -- queues -----------------------------------------------------------------------------------------


@check
async def queue_create_and_delete(client):
    queue = name("create")
    await client.queue(queue).config({"lease_time": 30, "retry_limit": 1}).create()
    await client.queue(queue).delete()


@check
async def queue_push_duplicate_and_pop(client):
    queue = name("push")
    duplicates = []

    async def on_duplicate(items, error=None):
        duplicates.append(items)

    first = await client.queue(queue).partition("p").push([{"data": 1}, {"data": 2, "transactionId": "t-2"}])
    await client.queue(queue).partition("p").push([{"data": 2, "transactionId": "t-2"}]).on_duplicate(on_duplicate)
    assert [item.get("status") for item in first] == ["queued", "queued"] and duplicates
    popped = await client.queue(queue).pop()  # no batch: the client sends autopilot=true
    assert popped and popped[0].get("data") == 1


@check
async def queue_push_full_calls_on_error(client):
    queue = name("full")
    await client.queue(queue).config({"max_size": 1}).create()
    errors = []

    async def on_error(items, error=None):
        errors.append(error)

    await client.queue(queue).push([{"data": 1}])
    await client.queue(queue).push([{"data": 2}]).on_error(on_error)
    assert errors


@check
async def queue_ack_and_stale_ack(client):
    queue = name("ack")
    await client.queue(queue).partition("p").push([{"data": 1}, {"data": 2}])
    messages = await client.queue(queue).partition("p").batch(2).wait(False).pop()
    assert (await client.ack(messages[0])).get("success") is True
    stale = {**messages[1], "leaseId": str(int(messages[1]["leaseId"]) + 999_999)}
    assert (await client.ack(stale)).get("success") is False
    assert (await client.ack(messages[1])).get("success") is True


@check
async def queue_batch_ack_reports_lost_items(client):
    queue = name("batch")
    await client.queue(queue).partition("p").push([{"data": 1}])
    [message] = await client.queue(queue).partition("p").batch(1).wait(False).pop()
    dead = {**message, "leaseId": str(int(message["leaseId"]) + 999_999)}  # not the lease that delivered it
    result = await client.ack([dead], "failed")
    assert result.get("success") is False
    assert (await client.ack([message])).get("success") is True


@check
async def queue_renew(client):
    queue = name("renew")
    await client.queue(queue).partition("p").push([{"data": 1}])
    [message] = await client.queue(queue).partition("p").batch(1).wait(False).pop()
    renewed = await client.renew(message)
    assert renewed.get("success") is True
    await client.ack(message)
    assert (await client.renew(message)).get("success") is False


@check
async def queue_long_poll_waits(client):
    queue = name("poll")
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await client.queue(queue).batch(1).wait(True).timeout_millis(600).pop()
    assert got == [] and loop.time() - started >= 0.4


@check
async def queue_consume_with_group(client):
    queue = name("consume")
    # Consumed messages are kept a minute, so a group that starts reading later still finds them.
    await client.queue(queue).config({"completed_retention_seconds": 60}).create()
    await client.queue(queue).partition("p").push([{"data": n} for n in range(3)])
    seen = []

    async def handler(message):
        seen.append(message.get("data"))

    await client.queue(queue).group("g1").limit(3).batch(1).wait(True).timeout_millis(1000).consume(handler)
    other = []

    async def second(message):
        other.append(message.get("data"))

    await client.queue(queue).group("g2").limit(3).batch(3).each().wait(True).timeout_millis(1000).consume(second)
    assert sorted(seen) == [0, 1, 2] and sorted(other) == [0, 1, 2]


@check
async def queue_dlq(client):
    queue = name("dlq")
    await client.queue(queue).config({"retry_limit": 0}).create()
    await client.queue(queue).partition("p").push([{"data": "bad"}])
    [message] = await client.queue(queue).partition("p").batch(1).wait(False).pop()
    await client.ack(message, False, {"error": "boom"})
    dlq = await client.queue(queue).dlq().limit(10).get()
    assert dlq.get("total") == 1 and dlq.get("messages")[0].get("data") == "bad"


@check
async def delete_consumer_group(client):
    queue = name("groups")
    await client.queue(queue).partition("p").push([{"data": 1}])
    await client.queue(queue).group("gone").batch(1).wait(False).pop()
    await client.delete_consumer_group("gone")


# -- timers -----------------------------------------------------------------------------------------


@check
async def timers_schedule_peek_list_cancel(client):
    queue = name("timers")
    scheduled = await client.timer(queue).key("k1").payload({"n": 1}).after_ms(60_000).schedule()
    assert scheduled and scheduled.get("status") == "scheduled"
    moved = await client.timer(queue).key("k1").payload({"n": 2}).after_ms(90_000).reschedule()
    assert moved and moved.get("status") == "rescheduled"
    peeked = await client.timers.peek(queue, "k1")
    assert peeked and peeked.get("found") is True
    await client.timer(queue).key("k2").payload({"n": 3}).after_ms(60_000).schedule()
    rows = await client.timers.list_all(queue, limit=1)
    assert [row.get("timerKey") or row.get("key") for row in rows] == ["k1", "k2"]
    cancelled = await client.timer(queue).key("k2").cancel()
    absent = await client.timer(queue).key("k2").cancel()
    assert cancelled and cancelled.get("status") == "cancelled"
    assert not absent and absent.get("status") == "absent"


@check
async def timer_fires_its_payload(client):
    queue = name("fire")
    await client.timer(queue).key("soon").payload({"ding": True}).after_ms(100).partition("p").schedule()
    got = await client.queue(queue).partition("p").batch(1).wait(True).timeout_millis(5000).pop()
    assert [m.get("data") for m in got] == [{"ding": True}]


@check
async def timer_error_code(client):
    from queen import TimerError
    try:
        await client.timers.batch([{"op": "schedule", "queue": name("t"), "timerKey": "k", "payload": "e30=",
                                    "delayMs": 5, "txn": "x", "payloadZstd": True}])
    except TimerError as error:
        assert isinstance(error.code, str) and error.code, error
        return
    raise AssertionError("payloadZstd was not refused")


# -- admin ------------------------------------------------------------------------------------------


@check
async def admin_reads(client):
    admin = client.admin
    queue = name("admin")
    await client.queue(queue).partition("p").push([{"data": 1}])
    health = await admin.health()
    assert health and health.get("status") == "ok"
    queues = await admin.list_queues()
    assert queue in [row.get("queue") for row in queues.get("items")]
    detail = await admin.get_queue(queue)
    assert detail.get("found") is True and detail.get("messages") == 1


async def main() -> None:
    passed, failed = [], {}
    client = Queen(url=URL)
    try:
        for fn in CHECKS:
            try:
                await asyncio.wait_for(fn(client), 30)
            except Exception as error:  # noqa: BLE001 - every failure is a finding
                failed[fn.__name__] = f"{type(error).__name__}: {error}"[:400] or traceback.format_exc()[-400:]
            else:
                passed.append(fn.__name__)
    finally:
        await client.close()
    json.dump({"passed": passed, "failed": failed}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
