"""The sync timeout: a leader whose sync set stops acknowledging answers what waits for it 503
sync_unavailable once it has waited --sync-timeout, refuses new writes up front (nothing applied)
until the sync set is back, then answers as before, with nothing acknowledged lost. Real Servers
in one trio run on 127.0.0.1, roles driven through the Replicator's API
(tests/cluster/test_replication.py), no etcd. The bound runs on the server; the test only waits
for answers, with a deadline."""

from __future__ import annotations

import trio

from tests.cluster.test_read_barrier import AckHold, lead_through
from tests.cluster.test_replication import cluster_of, lead_with, put, rows, running, until

BOUND_S = 1.0  # the put after a stop races the absent-member rule by this much: ample
ANSWER_DEADLINE_S = 30  # far past the bound: what the old code never met (it held the call for good)


def details(body: dict) -> dict:
    return body.get("details") or body["error"]["details"]


async def answer(client, method: str, path: str, body=None):
    with trio.fail_after(ANSWER_DEADLINE_S):
        return await client.request(method, path, body)


async def test_a_write_its_dead_sync_follower_never_acks_answers_sync_unavailable_then_writes_wait_for_its_return(
        tmp_path):
    async with running() as nursery:
        n1, n2 = await cluster_of(nursery, tmp_path, sync_timeout_s=BOUND_S)
        await lead_with(n1, [n2], 1)
        client = n1.client()
        assert (await put(client, "acked", 1))[0] == 200
        await n2.stop()  # its stream ends: the sync set is out of reach
        started = trio.current_time()
        status, body = await answer(client, "PUT", "/api/v1/kv/app/unknown", {"value": 2, "forever": True})
        assert status == 503 and body["code"] == "sync_unavailable", body
        assert trio.current_time() - started >= BOUND_S  # it did wait for the sync set first
        assert details(body)["applied"] == "unknown"  # on n1's disk: it may survive, or be cut by a failover
        assert details(body)["retryAfterMs"] == 1000 and details(body)["sync"] == ["n2"]
        assert n1.replicator.sync_unavailable
        # Known now: a write is refused before anything is applied, a read at once.
        status, body = await answer(client, "PUT", "/api/v1/kv/app/refused", {"value": 3, "forever": True})
        assert status == 503 and body["code"] == "sync_unavailable" and details(body)["applied"] is False
        assert ("app", "refused") not in rows(n1)
        status, body = await answer(client, "GET", "/api/v1/kv/app/acked")
        assert status == 503 and body["code"] == "sync_unavailable" and details(body)["applied"] is False
        status, body = await answer(client, "GET", "/healthz")
        assert status == 503 and body["status"] == "sync_unavailable" and "n2" in body["reason"]
        # n2 comes back from its own disk and catches up: writes are answered again, no restart.
        await n2.start()
        n2.follow(1, n1)
        await until(lambda: not n1.replicator.sync_unavailable, "the sync set back")
        assert (await answer(client, "GET", "/healthz"))[0] == 200
        status, body = await put(client, "after", 4)
        assert status == 200, body
        assert n2.replicator.log_last >= body["version"]  # answered after n2's ack, as always
        await until(lambda: rows(n2) == rows(n1), "n2 to equal n1")
        present = rows(n2)
        assert ("app", "acked") in present and ("app", "after") in present
        assert ("app", "unknown") in present  # its outcome was unknown; here it reached n2 with the rest
        await n1.stop()
        await n2.stop()


async def test_a_sync_follower_that_stops_acking_but_stays_connected_times_out_writes_and_reads(tmp_path):
    # n2's acks are held in a proxy (a paused process, a one-way partition): its stream stays up.
    async with running() as nursery:
        n1, n2 = await cluster_of(nursery, tmp_path, sync_timeout_s=BOUND_S)
        hold = AckHold(nursery, n1.address)
        await lead_through(n1, n2, await hold.start())
        client, reader = n1.client(), n1.client()
        assert (await put(client, "k", 1))[0] == 200
        hold.hold()
        written, read = [], []

        async def write():
            written.append(await answer(client, "PUT", "/api/v1/kv/app/k", {"value": 2, "forever": True}))

        async def read_k():
            read.append(await answer(reader, "GET", "/api/v1/kv/app/other"))

        nursery.start_soon(write)
        await until(lambda: n1.server.writer.local_version > n1.server.writer.durable_version, "the local fsync")
        nursery.start_soon(read_k)  # behind the read barrier: its round trip never comes back
        await until(lambda: written and read, "both answers")
        status, body = written[0]
        assert status == 503 and body["code"] == "sync_unavailable" and details(body)["applied"] == "unknown"
        status, body = read[0]
        assert status == 503 and body["code"] == "sync_unavailable" and details(body)["applied"] is False
        assert n1.replicator.followers()[0].connected
        # The acks come through: everything n1 held when the outage began is acked, and a probe echoed.
        hold.release()
        await until(lambda: not n1.replicator.sync_unavailable, "the sync set back")
        status, body = await put(client, "k", 3)
        assert status == 200 and n2.replicator.log_last >= body["version"]
        status, body = await answer(reader, "GET", "/api/v1/kv/app/k")
        assert status == 200 and body["value"] == 3
        await n1.stop()
        await n2.stop()


async def test_an_idle_leader_whose_sync_follower_is_gone_says_so_and_refuses_writes_at_once(tmp_path):
    async with running() as nursery:
        n1, n2 = await cluster_of(nursery, tmp_path, sync_timeout_s=BOUND_S)
        await lead_with(n1, [n2], 1)
        await n2.stop()
        # No call waits, yet a member without a stream for the bound is out of reach.
        await until(lambda: n1.replicator.sync_unavailable, "the outage noticed")
        status, body = await answer(n1.client(), "POST", "/api/v1/kv/app/c/incr", {"forever": True})
        assert status == 503 and body["code"] == "sync_unavailable" and details(body)["applied"] is False
        assert ("app", "c") not in rows(n1)
        # An empty sync set (what degrade mode writes) waits for nobody: the outage ends.
        n1.replicator.set_sync(frozenset())
        await until(lambda: not n1.replicator.sync_unavailable, "the outage over")
        status, body = await answer(n1.client(), "POST", "/api/v1/kv/app/c/incr", {"forever": True})
        assert status == 200 and body["value"] == 1
        await n1.stop()
