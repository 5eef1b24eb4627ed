"""The public Queen MQ Python client against a Queen that needs tokens: a representative subset of
tests/compat/qmq_checks.py run by a client given a token (`Queen(url=..., bearer_token=...)`, which
the client sends as `Authorization: Bearer <token>` on every request), and what the client meets
without one, with a bad one, with a reader's, and with another tenant's.

Run with the interpreter of a venv that has `queen-mq` installed (see qmq_checks.py), with
QUEEN_URL, QUEEN_TOKEN (an admin of a tenant), QUEEN_READER_TOKEN (a reader of the same tenant)
and QUEEN_OTHER_TOKEN (an admin of another tenant) set. Prints one JSON object: {"passed":
[names], "failed": {name: why}}; tests/compat/test_queen_mq_client_token.py judges it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
import uuid

import qmq_checks  # the checks themselves, in this directory

from queen import Queen  # the public client, not this repository's package

URL = os.environ["QUEEN_URL"]
TOKEN = os.environ["QUEEN_TOKEN"]
READER_TOKEN = os.environ["QUEEN_READER_TOKEN"]
OTHER_TOKEN = os.environ["QUEEN_OTHER_TOKEN"]
RUN = uuid.uuid4().hex[:8]

SUBSET = (
    "kv_put_get", "kv_get_absent", "kv_put_forever_and_expect", "kv_put_if_absent_and_once", "kv_delete",
    "kv_incr_delta", "kv_check", "kv_get_many", "kv_list_all", "kv_get_prefix_keys_only",
    "locks_acquire_renew_release", "locks_get_held", "lock_handle_and_semaphore", "lock_loss_is_seen",
    "txn_kv_only", "txn_guard", "txn_ack_push_kv_timer", "txn_lost_lease_raises_and_writes_nothing",
    "queue_create_and_delete", "queue_push_duplicate_and_pop", "queue_ack_and_stale_ack",
    "queue_batch_ack_reports_lost_items", "queue_renew", "queue_consume_with_group", "queue_dlq",
    "delete_consumer_group", "timers_schedule_peek_list_cancel", "timer_fires_its_payload", "admin_reads",
)


def status_of(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


async def refused(call) -> BaseException:
    try:
        await call
    except Exception as error:  # noqa: BLE001 - the refusal is what is checked
        return error
    raise AssertionError("the call was not refused")


def client(token: str | None) -> Queen:
    # No retries: a refusal is an answer, not a fault to retry.
    return Queen(url=URL, bearer_token=token, retry_attempts=1)


async def without_a_token(_):
    anonymous = client(None)
    try:
        error = await refused(anonymous.kv.put(f"t{RUN}", "k", 1, forever=True))
        assert status_of(error) == 401 and getattr(error, "code", None) == "unauthenticated", error
        error = await refused(anonymous.queue(f"t{RUN}-q").push([{"data": 1}]))
        assert status_of(error) == 401, error
        assert (await anonymous.admin.health()).get("status") == "ok"  # /health needs no token
    finally:
        await anonymous.close()


async def with_a_bad_token(_):
    forged = client("queen_abcdefghijkl_" + "x" * 43)
    try:
        error = await refused(forged.kv.get(f"t{RUN}", "k"))
        assert status_of(error) == 401, error
        assert 'error="invalid_token"' in error.response.headers.get("www-authenticate", ""), error
    finally:
        await forged.close()


async def with_a_readers_token(writer):
    ns = f"t{RUN}-read"
    await writer.kv.put(ns, "k", "written by the admin", forever=True)
    reader = client(READER_TOKEN)
    try:
        assert (await reader.kv.get(ns, "k")).get("value") == "written by the admin"
        error = await refused(reader.kv.put(ns, "k", "by the reader", forever=True))
        assert status_of(error) == 403 and getattr(error, "code", None) == "forbidden", error
        error = await refused(reader.locks.acquire(f"t{RUN}-lock", ttl_seconds=30, owner="r"))
        assert status_of(error) == 403, error
        assert (await writer.kv.get(ns, "k")).get("value") == "written by the admin"
    finally:
        await reader.close()


async def another_tenant_sees_nothing(writer):
    ns, queue = f"t{RUN}-mine", f"t{RUN}-mine-q"
    await writer.kv.put(ns, "k", "mine", forever=True)
    await writer.queue(queue).partition("p").push([{"data": "mine"}])
    other = client(OTHER_TOKEN)
    try:
        assert not await other.kv.get(ns, "k")
        # Listed before its pop, which makes the other tenant a queue of that name of its own.
        assert queue not in [row.get("queue") for row in (await other.admin.list_queues()).get("items")]
        assert not (await other.admin.get_queue(queue)).get("found")
        assert await other.queue(queue).batch(5).wait(False).pop() == []
        await other.kv.put(ns, "k", "theirs", forever=True)
    finally:
        await other.close()
    assert (await writer.kv.get(ns, "k")).get("value") == "mine"
    assert [m.get("data") for m in await writer.queue(queue).batch(5).wait(False).pop()] == ["mine"]


async def main() -> None:
    by_name = {fn.__name__: fn for fn in qmq_checks.CHECKS}
    missing = [name for name in SUBSET if name not in by_name]
    checks = [by_name[name] for name in SUBSET if name in by_name]
    checks += [without_a_token, with_a_bad_token, with_a_readers_token, another_tenant_sees_nothing]
    passed, failed = [], {name: "no such check in qmq_checks.py" for name in missing}
    writer = client(TOKEN)
    try:
        for fn in checks:
            try:
                await asyncio.wait_for(fn(writer), 30)
            except Exception as error:  # noqa: BLE001 - every failure is a finding
                where = traceback.extract_tb(error.__traceback__)[-1]
                failed[fn.__name__] = f"{type(error).__name__}: {error}"[:400] + f" (line {where.lineno}: {where.line})"
            else:
                passed.append(fn.__name__)
    finally:
        await writer.close()
    json.dump({"passed": passed, "failed": failed}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
