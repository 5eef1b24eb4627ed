"""The read barrier: a leader answers a read only after a round trip, begun after the read
arrived, was acked by every sync-set member in its epoch. Real Servers in one trio run on
127.0.0.1, roles driven through the Replicator's API (tests/cluster/test_replication.py), no
etcd. A small proxy on the follower's replication link holds its acks when a test needs them held.
No sleeps for time to pass: conditions are polled with a deadline."""

from __future__ import annotations

import trio

from queen.core.kv import KvOp
from tests.cluster.test_replication import cluster_of, get, lead_with, passes, put, running, until


class AckHold:
    """A TCP proxy between a follower and its leader's replication listener; while held, what the
    follower sends (its ACKs) is not read, so it waits in the kernel's buffers; release() lets it
    through, in order."""

    def __init__(self, nursery, upstream: tuple[str, int]):
        self.nursery = nursery
        self.upstream = upstream
        self.open = trio.Event()
        self.open.set()

    async def start(self) -> tuple[str, int]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        await self.nursery.start(trio.serve_listeners, self._pair, listeners)
        return "127.0.0.1", listeners[0].socket.getsockname()[1]

    def hold(self) -> None:
        self.open = trio.Event()

    def release(self) -> None:
        self.open.set()

    async def _pair(self, down) -> None:
        up = await trio.open_tcp_stream(*self.upstream)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pipe, up, down, False, nursery.cancel_scope)
            nursery.start_soon(self._pipe, down, up, True, nursery.cancel_scope)
        await up.aclose()
        await down.aclose()

    async def _pipe(self, source, target, gated: bool, scope) -> None:
        try:
            while True:
                data = await source.receive_some(65536)
                if not data:
                    break
                while gated and not self.open.is_set():  # held after this was read: keep it until released
                    await self.open.wait()
                await target.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()


def follow_through(node, epoch: int, leader, address) -> None:
    """node follows leader of epoch, dialling `address` (a proxy) instead of the leader's own."""
    async def run():
        try:
            await node.replicator.promise(epoch)
            await node.replicator.follow(epoch, leader.name, address)
        except Exception as error:  # StreamEnded, or the test's end
            node.follow_error = error
        finally:
            node.following = False

    node.follow_error, node.following = None, True
    node.inner.start_soon(run)


async def lead_through(n1, n2, address):
    """n1 leads epoch 1 with n2 in its sync set, n2 following through `address`."""
    await n1.replicator.promise(1)
    done = trio.Event()

    async def lead():
        await n1.replicator.lead(1, frozenset({"n2"}), version_floor=0, grace_ms=1000)
        done.set()

    n1.inner.start_soon(lead)
    await until(lambda: n1.replicator.role == "leader", "the leader role")
    follow_through(n2, 1, n1, address)
    await done.wait()


def answered_later(nursery, client, key: str, out: list) -> None:
    async def read():
        out.append(await client.request("GET", f"/api/v1/kv/app/{key}"))

    nursery.start_soon(read)


async def test_a_read_waits_for_the_sync_followers_ack_and_an_empty_sync_set_releases_it(tmp_path):
    async with running() as nursery:
        n1, n2 = await cluster_of(nursery, tmp_path)
        proxy = AckHold(nursery, n1.address)
        address = await proxy.start()
        await lead_through(n1, n2, address)
        client = n1.client()
        status, written = await put(client, "a", 1)
        assert status == 200
        assert (await get(client, "a"))["version"] == written["version"]
        # n2's acks are held: a read of durable data waits for its round trip.
        proxy.hold()
        probes = n1.replicator.probes_sent
        out: list = []
        answered_later(nursery, n1.client(), "a", out)
        await until(lambda: n1.replicator.probes_sent > probes, "the probe")
        await passes()
        assert out == [], "a read was answered before the sync follower acked a round trip begun after it"
        assert n1.server.writer.durable_version >= written["version"], "(a) alone would have answered it"
        proxy.release()
        await until(lambda: out, "the answer once n2's ack got through")
        assert out[0][0] == 200 and out[0][1]["version"] == written["version"]
        # Held again; this time the sync set empties (degraded): the local check alone is left.
        proxy.hold()
        out.clear()
        answered_later(nursery, n1.client(), "a", out)
        await until(lambda: n1.replicator.probes_sent > probes + 1, "the second probe")
        await passes()
        assert out == []
        n1.replicator.set_sync(frozenset())
        await until(lambda: out, "the degraded answer")
        assert out[0][0] == 200
        # With no sync member no probe is sent at all.
        probes = n1.replicator.probes_sent
        assert (await get(n1.client(), "a"))["version"] == written["version"]
        assert n1.replicator.probes_sent == probes
        proxy.release()
        await n1.stop()
        await n2.stop()


async def test_a_zombie_leader_never_answers_a_read_ok(tmp_path):
    async with running() as nursery:
        n1, n2 = await cluster_of(nursery, tmp_path)
        await lead_with(n1, [n2], 1)
        client = n1.client()
        assert (await put(client, "a", 1))[0] == 200
        # n2 promised epoch 2 (it may lead it now, and change "a"): n1 is deposed, not told so.
        await n2.replicator.promise(2)
        out: list = []
        answered_later(nursery, n1.client(), "a", out)
        await until(lambda: not n2.following, "n2 to refuse n1's epoch-1 stream")
        await passes()
        assert out == [] or out[0][0] == 503, f"the deposed leader answered a read: {out}"
        n1.replicator.step_down("epoch 2 exists")
        await until(lambda: out, "the answer")
        assert out[0][0] == 503 and out[0][1]["code"] == "leader_lost"
        # A read after the step-down is refused at once.
        status, body = await n1.client().request("GET", "/api/v1/kv/app/a")
        assert status == 503 and body["code"] == "leader_lost"
        await n1.stop()
        await n2.stop()


async def test_without_the_barrier_the_zombie_answers_the_read(tmp_path, monkeypatch):
    # The negative control: with the round trip switched off, the same zombie answers 200, which
    # is what the test above would catch.
    monkeypatch.setenv("QUEEN_TEST_NO_READ_BARRIER", "1")
    async with running() as nursery:
        n1, n2 = await cluster_of(nursery, tmp_path)
        await lead_with(n1, [n2], 1)
        client = n1.client()
        assert (await put(client, "a", 1))[0] == 200
        await n2.replicator.promise(2)
        status, body = await n1.client().request("GET", "/api/v1/kv/app/a")
        assert status == 200 and body["value"] == 1, "the switch should have let the zombie answer"
        assert n1.replicator.probes_sent == 0
        await n1.stop()
        await n2.stop()


async def test_a_read_after_an_acked_write_sees_it(tmp_path):
    async with running() as nursery:
        n1, n2, n3 = await cluster_of(nursery, tmp_path, names=("n1", "n2", "n3"))
        await lead_with(n1, [n2, n3], 1)
        writer, reader = n1.client(), n1.client()
        for i in range(30):
            status, written = await put(writer, f"k{i % 3}", i)
            assert status == 200
            seen = await get(reader, f"k{i % 3}")
            assert seen["value"] == i and seen["version"] == written["version"]
        # getMany and a lock's holders are reads too.
        status, body = await reader.request("POST", "/api/v1/kv", {"operations": [
            {"op": "getMany", "ns": "app", "keys": ["k0", "k1", "k2"]}]})
        assert status == 200 and [item["value"] for item in body["results"][0]["items"]] == [27, 28, 29]
        status, body = await writer.request("POST", "/api/v1/locks", {"operations": [
            {"op": "acquire", "name": "job", "ttlSeconds": 60, "owner": "me"}]})
        assert status == 200 and body["results"][0]["acquired"]
        status, body = await reader.request("POST", "/api/v1/locks", {"operations": [{"op": "get", "name": "job"}]})
        assert status == 200 and [h["owner"] for h in body["results"][0]["holders"]] == ["me"]
        assert n1.replicator.probes_sent >= 1
        await n1.stop()
        await n2.stop()
        await n3.stop()


async def test_concurrent_reads_share_one_probe_and_frames_count_as_rounds(tmp_path):
    async with running() as nursery:
        n1, n2 = await cluster_of(nursery, tmp_path)
        proxy = AckHold(nursery, n1.address)
        address = await proxy.start()
        await lead_through(n1, n2, address)
        assert (await put(n1.client(), "a", 1))[0] == 200
        router, replicator = n1.server.router, n1.server.router.steps.writer.read_barrier.__self__
        assert replicator is n1.replicator
        # 20 reads arriving in one pass of the event loop: one probe.
        probes = replicator.probes_sent
        answers: list = []

        async def read():
            answers.append(await router.run_kv([KvOp("get", "app", "a")], has_writes=False))

        async with trio.open_nursery() as burst:
            for _ in range(20):
                burst.start_soon(read)
        assert len(answers) == 20 and replicator.probes_sent == probes + 1
        # A probe out (its ack held): reads arriving meanwhile wait for the next round, and a frame
        # shipped after them, once acked, is that round: no second probe.
        proxy.hold()
        probes = replicator.probes_sent
        first: list = []
        answered_later(nursery, n1.client(), "a", first)
        await until(lambda: replicator.probes_sent == probes + 1, "the first probe")
        later: list = []
        for _ in range(10):
            answered_later(nursery, n1.client(), "a", later)
        await until(lambda: len(replicator._reads) == 11, "the ten later reads to wait")
        await passes()
        assert replicator.probes_sent == probes + 1, "a read that came while a probe was out probed again"
        written: list = []
        nursery.start_soon(lambda: _put_into(n1.client(), written))
        await until(lambda: n1.server.writer.local_version > n1.server.writer.durable_version, "the frame shipped")
        assert first == [] and later == [] and written == []
        proxy.release()
        await until(lambda: len(first) == 1 and len(later) == 10 and written, "every answer")
        assert all(status == 200 for status, _ in first + later) and written[0][0] == 200
        assert replicator.probes_sent == probes + 1, "the frame's ack should have been the later reads' round"
        await n1.stop()
        await n2.stop()


async def _put_into(client, out: list) -> None:
    out.append(await put(client, "b", 2))
