"""A waiting acquire or pop watches for its client hanging up only while it is really parked: one
that is answered at once (a free lock, a queue with messages) starts no watcher, and one that
parks still has its watcher, so a client that hangs up is withdrawn (queen/runtime/router.py)."""

import trio

from queen.core.limits import Limits
from queen.core.locks import parse_lock_ops
from queen.core.queue_ops import parse_pop
from queen.testing import HttpClient, open_server


def acquire(name: str, owner: str, wait_ms: int):
    return parse_lock_ops([{"op": "acquire", "name": name, "owner": owner, "ttlSeconds": 60, "waitMs": wait_ms}],
                          Limits())


async def never_called():
    raise AssertionError("a hang-up watcher was started for a call answered at once")


async def test_a_call_answered_at_once_starts_no_watcher(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        router = server.router
        [result] = await router.run_locks(acquire("free", "a", 5000), wait_gone=never_called, answer_now=never_called)
        assert result["acquired"] is True
        status, _ = await HttpClient(server.port).request("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1}]})
        assert status == 200
        popped = await router.run_queue("q", parse_pop("q", None, {"waitMs": "5000"}, Limits()),
                                        wait_gone=never_called, answer_now=never_called)
        assert len(popped["messages"]) == 1


async def test_a_parked_acquire_is_withdrawn_when_its_client_hangs_up(tmp_path, autojump_clock):
    async with open_server(tmp_path / "d") as server:
        router = server.router
        [held] = await router.run_locks(acquire("busy", "a", 0))
        assert held["acquired"] is True
        gone = trio.Event()
        watched = []

        async def wait_gone():
            watched.append(True)
            await gone.wait()

        async def hang_up_soon():
            await trio.sleep(1)
            gone.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hang_up_soon)
            [result] = await router.run_locks(acquire("busy", "b", 60_000), wait_gone=wait_gone)
        assert watched == [True]
        assert result["acquired"] is False and result["reason"] == "cancelled", result
