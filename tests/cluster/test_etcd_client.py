"""The etcd gateway client against a real single-member etcd: round trips, txn compares, leases,
and failing over past an endpoint that does not answer."""

from __future__ import annotations

import pytest
import trio

from queen.cluster import etcd as e
from queen.cluster.etcd import EtcdClient, EtcdError, EtcdUnavailable, prefix_end
from queen.testing import free_port
from tests.cluster.etcd_single import etcd  # noqa: F401 - the fixture

pytestmark = pytest.mark.filterwarnings("default::ResourceWarning")


def test_prefix_end():
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


def test_endpoints_are_checked():
    with pytest.raises(ValueError):
        EtcdClient([])
    with pytest.raises(ValueError, match="TLS"):
        EtcdClient(["https://127.0.0.1:2379"])
    assert EtcdClient(["127.0.0.1:2379"]).endpoints == [("127.0.0.1", 2379)]


async def test_put_get_delete_round_trip(etcd):  # noqa: F811
    client = EtcdClient([etcd.url])
    revision = await client.put("/t/a", b"one")
    kv, read_at = await client.get("/t/a")
    assert kv.value == b"one" and kv.create_revision == revision == kv.mod_revision and read_at >= revision
    await client.put("/t/a", b"two")
    kv2, _ = await client.get("/t/a")
    assert kv2.value == b"two" and kv2.create_revision == revision and kv2.mod_revision > revision
    await client.put("/t/b", b"bee")
    found, _ = await client.get_prefix("/t/")
    assert [kv.key for kv in found] == [b"/t/a", b"/t/b"]
    assert await client.delete("/t/a") == 1
    assert (await client.get("/t/a"))[0] is None
    assert await client.delete("/t/a") == 0
    assert client.requests >= 7 and len(client._idle) == 1  # one kept-alive connection did it all
    await client.aclose()


async def test_txn_compares(etcd):  # noqa: F811
    client = EtcdClient([etcd.url])
    created = await client.txn([e.create_revision_is("/x", 0)], [e.put_op("/x", b"1")], [e.range_op("/x")])
    assert created.succeeded
    again = await client.txn([e.create_revision_is("/x", 0)], [e.put_op("/x", b"2")], [e.range_op("/x")])
    assert not again.succeeded and again.ranges[0][0].value == b"1"
    kv = again.ranges[0][0]
    assert kv.create_revision == created.revision  # a write txn's revision is the created key's
    stale = await client.txn([e.mod_revision_is("/x", kv.mod_revision - 1)], [e.put_op("/x", b"3")])
    assert not stale.succeeded
    fresh = await client.txn([e.mod_revision_is("/x", kv.mod_revision), e.value_is("/x", b"1")],
                             [e.put_op("/x", b"4"), e.range_op("/x")])
    assert fresh.succeeded and fresh.ranges[0][0].value == b"4"
    wrong_value = await client.txn([e.value_is("/x", b"1")], [e.delete_op("/x")])
    assert not wrong_value.succeeded and (await client.get("/x"))[0].value == b"4"
    await client.aclose()


async def test_leases(etcd):  # noqa: F811
    client = EtcdClient([etcd.url])
    lease = await client.lease_grant(5)
    await client.put("/leased", b"v", lease=lease)
    kv, _ = await client.get("/leased")
    assert kv.lease == lease
    assert await client.lease_keepalive(lease) >= 5
    await client.lease_revoke(lease)
    assert (await client.get("/leased"))[0] is None  # revoking took the key with it
    assert await client.lease_keepalive(lease) == 0  # gone
    await client.lease_revoke(lease)  # revoking again is harmless
    with pytest.raises(EtcdError) as refused:
        await client.put("/leased", b"v", lease=lease)
    assert refused.value.code == e.NOT_FOUND
    await client.aclose()


async def test_fails_over_past_a_dead_endpoint_and_reports_unavailable(etcd):  # noqa: F811
    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient([dead, etcd.url], timeout_s=0.5)
    await client.put("/f", b"1")
    assert client.failovers == 1 and client._preferred == 1
    assert (await client.get("/f"))[0].value == b"1"
    assert client.failovers == 1  # stays on the endpoint that answered
    await client.aclose()
    alone = EtcdClient([dead], timeout_s=0.5)
    with pytest.raises(EtcdUnavailable, match="unreachable"):
        await alone.get("/f")


async def test_a_silent_endpoint_times_out():
    """A listener that never answers (a blackhole): the call gives up after the timeout."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    client = EtcdClient([f"http://127.0.0.1:{listener.getsockname()[1]}"], timeout_s=0.3)
    started = trio.current_time()
    with pytest.raises(EtcdUnavailable, match="no answer within"):
        await client.get("/k")
    assert trio.current_time() - started < 5
    listener.close()


async def test_a_stopped_etcd_is_unavailable_and_a_restarted_one_serves_again(etcd):  # noqa: F811
    client = EtcdClient([etcd.url], timeout_s=0.5)
    await client.put("/r", b"1")
    etcd.stop()
    with pytest.raises(EtcdUnavailable):
        await client.get("/r")
    etcd.start()
    assert (await client.get("/r"))[0].value == b"1"  # a fresh connection after the dead one
    await client.aclose()
