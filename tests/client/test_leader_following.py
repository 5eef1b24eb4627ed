"""The SDK against a cluster's nodes: tiny fake nodes (trio + h11) answer as a follower would (307 to
the leader, 503 no_leader / not_leader with Retry-After) or as the leader (200, X-Queen-Epoch)."""

import json
import os
import subprocess
import sys

import pytest
import trio

import queen_client
from queen.testing import free_port
from queen_client.errors import OutcomeUnknown, UnavailableError

from .fake_node import DROP, FakeNode, error_body


def leader(epoch: int):
    def answer(method, target, body):
        if target.startswith("/api/v1/kv"):
            op = json.loads(body)["operations"][0]
            if op["op"] == "get":
                return 200, {"x-queen-epoch": str(epoch)}, {"results": [{"found": True, "value": "v", "version": 3,
                                                                          "key": op["key"]}]}
            return 200, {"x-queen-epoch": str(epoch)}, {"results": [{"applied": True, "version": 9}]}
        return 404, {}, error_body("not_found", target)
    return answer


def redirect_to(node: FakeNode, epoch: int = 7):
    return lambda method, target, body: (307, {"location": node.url + target, "x-queen-epoch": str(epoch)}, None)


def refusing(code: str, retry_after: str = "0", details: dict | None = None):
    return lambda method, target, body: (503, {"retry-after": retry_after}, error_body(code, "not the leader", details))


async def test_a_307_is_followed_once_with_method_and_body_and_the_leader_cached():
    async with trio.open_nursery() as nursery:
        lead = FakeNode(leader(epoch=7))
        await lead.serve(nursery)
        follower = FakeNode(redirect_to(lead))
        await follower.serve(nursery)
        async with queen_client.Client([follower.url]) as client:
            result = await client.kv.put("ns", "k", "value", forever=True)
            assert result.applied and result.version == 9
            assert client.epoch == 7 and client.leader_url == lead.url
            await client.kv.get("ns", "k")
        assert len(follower.seen) == 1  # the second call went straight to the cached leader
        (method, target, body), second = lead.seen
        assert method == "POST" and target == "/api/v1/kv" and json.loads(body)["operations"][0]["value"] == "value"
        assert body == follower.seen[0][2] and second[0] == "POST"
        nursery.cancel_scope.cancel()


async def test_a_redirect_loop_is_followed_once_per_attempt_until_the_failover_timeout(autojump_clock):
    async with trio.open_nursery() as nursery:
        a, b = FakeNode(None), FakeNode(None)
        await a.serve(nursery)
        await b.serve(nursery)
        a.answer, b.answer = redirect_to(b), redirect_to(a)  # a loop: followers that disagree
        async with queen_client.Client([a.url], failover_timeout="5s") as client:
            started = trio.current_time()
            with pytest.raises(UnavailableError) as caught:
                await client.kv.put("ns", "k", "value", forever=True)
            given_up_after_s = trio.current_time() - started
            attempts = client.statistics()["retries"] + 1
        assert caught.value.code == "not_leader"
        assert 4.0 <= given_up_after_s <= 5.0 + 1e-6  # the failover timeout, not the retries (no answer ever came)
        # Each attempt: one request and one redirect; never a chain.
        assert len(a.seen) + len(b.seen) == 2 * attempts
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("code", ["no_leader", "not_leader"])
async def test_a_write_refused_by_a_node_that_is_not_the_leader_goes_to_the_next_node(code):
    async with trio.open_nursery() as nursery:
        refuser, lead = FakeNode(refusing(code)), FakeNode(leader(epoch=4))
        await refuser.serve(nursery)
        await lead.serve(nursery)
        async with queen_client.Client(f"{refuser.url},{lead.url}") as client:
            result = await client.kv.put("ns", "k", "value", forever=True)  # a write: retried, as nothing was applied
            assert result.applied and client.leader_url == lead.url and client.epoch == 4
        assert len(refuser.seen) == 1 and len(lead.seen) == 1
        nursery.cancel_scope.cancel()


async def test_a_refusal_is_retried_after_its_millisecond_hint_not_the_whole_second(monkeypatch):
    # Retry-After is whole seconds; a node that is not the leader says 200 ms in its details, and
    # waiting the second out would be most of a switchover.
    slept: list[float] = []

    async def record(delay):
        slept.append(delay)
        await trio.lowlevel.checkpoint()

    monkeypatch.setattr(queen_client._http.anyio, "sleep", record)
    async with trio.open_nursery() as nursery:
        refuser, lead = FakeNode(refusing("no_leader", "1", {"retryAfterMs": 200})), FakeNode(leader(epoch=4))
        await refuser.serve(nursery)
        await lead.serve(nursery)
        async with queen_client.Client(f"{refuser.url},{lead.url}") as client:
            result = await client.kv.put("ns", "k", "value", forever=True)
            assert result.applied
        assert len(slept) == 1 and 0.2 <= slept[0] < 0.5, slept
        nursery.cancel_scope.cancel()


async def test_without_a_failover_timeout_an_election_that_never_ends_gives_up_after_the_retries():
    async with trio.open_nursery() as nursery:
        a, b = FakeNode(refusing("no_leader")), FakeNode(refusing("no_leader"))
        await a.serve(nursery)
        await b.serve(nursery)
        async with queen_client.Client([a.url, b.url], retries_max=3, failover_timeout=None) as client:
            with pytest.raises(UnavailableError) as caught:
                await client.kv.put("ns", "k", "value", forever=True)
        assert caught.value.code == "no_leader"
        assert len(a.seen) + len(b.seen) == 4  # the first attempt and three retries, alternating
        assert abs(len(a.seen) - len(b.seen)) <= 1
        nursery.cancel_scope.cancel()


async def test_a_refused_connection_moves_any_call_on_since_nothing_was_sent():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with trio.open_nursery() as nursery:
        lead = FakeNode(leader(epoch=2))
        await lead.serve(nursery)
        async with queen_client.Client([dead, lead.url]) as client:
            item = await client.kv.get("ns", "k")  # a read
            assert item.value == "v" and client.leader_url == lead.url
        async with queen_client.Client([dead, lead.url]) as client:
            assert (await client.kv.put("ns", "k", "value", forever=True)).applied  # a write too
            assert client.leader_url == lead.url
        assert [seen[0] for seen in lead.seen] == ["POST", "POST"]
        nursery.cancel_scope.cancel()


async def test_a_connection_broken_under_a_call_moves_reads_on_but_leaves_a_write_unknown():
    async with trio.open_nursery() as nursery:
        dying, lead = FakeNode(lambda method, target, body: DROP), FakeNode(leader(epoch=2))
        await dying.serve(nursery)
        await lead.serve(nursery)
        async with queen_client.Client([dying.url, lead.url]) as client:
            item = await client.kv.get("ns", "k")  # a read: tried again on the next node
            assert item.value == "v" and client.leader_url == lead.url
        async with queen_client.Client([dying.url, lead.url]) as client:
            with pytest.raises(OutcomeUnknown) as caught:  # a write: its outcome is unknown, never repeated
                await client.kv.put("ns", "k", "value", forever=True)
            assert caught.value.method == "POST" and isinstance(caught.value.cause, queen_client.TransportError)
            assert client.leader_url == lead.url  # the next call goes to the next node
            assert (await client.kv.put("ns", "k", "value", forever=True)).applied
        assert [seen[0] for seen in dying.seen] == ["POST", "POST"]  # the read, and the write once
        assert [seen[0] for seen in lead.seen] == ["POST", "POST"]
        nursery.cancel_scope.cancel()


def test_urls_as_a_list_a_comma_string_or_queen_url(monkeypatch):
    assert queen_client.Client(["http://a:1", "http://b:2/"])._transport.endpoints[1].base_url == "http://b:2"
    assert [e.port for e in queen_client.Client("http://a:1, http://b:2")._transport.endpoints] == [1, 2]
    monkeypatch.setenv("QUEEN_URL", "http://a:1,http://b:2,http://c:3")
    assert len(queen_client.Client()._transport.endpoints) == 3
    with pytest.raises(ValueError):
        queen_client.Client("http://a:1,ftp://b")


def test_the_cli_takes_a_list_of_urls(tmp_path):
    from queen.testing import ServerProcess

    dead = f"http://127.0.0.1:{free_port()}"
    with ServerProcess(str(tmp_path / "data")) as server:
        env = dict(os.environ, QUEEN_URL="")
        put = subprocess.run([sys.executable, "-m", "queen", "kv", "put", "ns", "k", "1", "--forever", "--url",
                              f"{server.url},{dead}"], capture_output=True, text=True, env=env, timeout=60)
        assert put.returncode == 0, put.stderr
        got = subprocess.run([sys.executable, "-m", "queen", "kv", "get", "ns", "k", "--url", f"{dead},{server.url}"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert got.returncode == 0, got.stderr
        assert "1" in got.stdout
