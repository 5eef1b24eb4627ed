"""The async client, under asyncio and under Trio, against a real `queen serve`; and its loss
detection in virtual time (Trio's MockClock) against an in-process server behind a proxy that can
stall the renewals.

Tests named `test_both_*` run once per backend (the `backend` parameter); the others run under
pytest-trio with the autojump clock."""

import os

import anyio
import anyio.abc
import pytest
import trio
import trio.testing

import queen_client
from queen.testing import HttpClient, open_server

from .conftest import paused


@pytest.fixture(params=["asyncio", "trio"])
def backend(request):
    return request.param


def run(backend, fn, *args):
    return anyio.run(fn, *args, backend=backend)


# -- KV ----------------------------------------------------------------------------------------------


def test_both_kv_round_trip_with_versions_and_conditions(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            kv = client.kv
            first = await kv.put(unique, "cart", {"items": 3}, ttl="7d")
            assert first.applied and first.version > 0
            item = await kv.get(unique, "cart")
            assert item.found and item.value == {"items": 3} and item.version == first.version
            assert item.expires_at_ms is not None and item.expires_at is not None
            missed = await kv.put(unique, "cart", {"items": 4}, ttl=60, expect=first.version - 1)
            assert not missed.applied and missed.reason == "version" and missed.current.version == first.version
            assert (await kv.put(unique, "cart", {"items": 4}, forever=True, expect=first.version)).applied
            assert (await kv.get(unique, "cart")).expires_at_ms is None
            exists = await kv.put_if_absent(unique, "cart", 1, ttl="1h")
            assert not exists and exists.reason == "exists"
            assert (await kv.check(unique, "cart", 0)).applied is False
            assert (await kv.check(unique, "nothing", 0)).applied is True
            absent = await kv.get(unique, "nothing")
            assert not absent.found and absent.version == 0 and absent.value is None
            assert (await kv.delete(unique, "cart")).applied
            gone = await kv.delete(unique, "cart")
            assert not gone.applied and gone.reason == "absent"

    run(backend, body)


def test_both_counters_stop_at_their_bounds(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            assert (await client.kv.incr(unique, "n", max=2, ttl=60)).value == 1
            assert (await client.kv.incr(unique, "n", max=2, ttl=60)).value == 2
            past = await client.kv.incr(unique, "n", max=2, ttl=60)
            assert not past.applied and past.reason == "limit" and past.value == 2
            assert (await client.kv.incr(unique, "n", by=-2, min=0, ttl=60)).value == 0
            assert (await client.kv.incr(unique, "n", by=-1, min=0, ttl=60)).reason == "limit"

    run(backend, body)


def test_both_get_prefix_walks_every_page_and_get_many_keeps_order(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            for i in range(7):
                await client.kv.put(unique, f"user:{i}", i, ttl=60)
            await client.kv.put(unique, "other", 0, ttl=60)
            keys = [item.key async for item in client.kv.get_prefix(unique, "user:", page_size=2)]
            assert keys == [f"user:{i}" for i in range(7)]
            items = await client.kv.get_many(unique, ["user:3", "missing", "user:1"])
            assert [(i.key, i.found, i.value) for i in items] == [("user:3", True, 3), ("missing", False, None), ("user:1", True, 1)]

    run(backend, body)


def test_both_errors_are_typed_and_carry_the_server_code(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            with pytest.raises(queen_client.BadRequestError) as rejected:
                await client.kv.put("queen-locks", "x", 1, ttl=60)
            assert rejected.value.code == "reserved_namespace" and rejected.value.status == 400
            with pytest.raises(ValueError, match="lifetime"):
                await client.kv.put(unique, "x", 1)
        async with queen_client.Client("http://127.0.0.1:1", retries_max=1) as nowhere:
            with pytest.raises(queen_client.TransportError):
                await nowhere.kv.get(unique, "x")

    run(backend, body)


def test_base_url_defaults_to_queen_url(monkeypatch):
    monkeypatch.setenv("QUEEN_URL", "http://queen.internal:7000")
    assert queen_client.Client().url == "http://queen.internal:7000"
    monkeypatch.delenv("QUEEN_URL")
    assert queen_client.Client().url == "http://127.0.0.1:6632"


# -- locks against a real server --------------------------------------------------------------------


def test_both_one_holder_at_a_time_and_release_frees_it(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            mine, theirs = client.lock(unique, ttl="30s"), client.lock(unique, ttl="30s")
            assert mine.owner != theirs.owner and mine.owner.count(":") >= 2
            assert await mine.acquire()
            assert mine.held and mine.token == mine.fence and mine.slot == 0
            assert mine.guard == {"op": "check", "ns": "queen-locks", "key": f"{unique}#0", "expect": mine.token, "required": True}
            assert not await theirs.acquire()
            reason, holders = theirs.refusal
            assert reason == "held" and holders[0].owner == mine.owner and theirs.token is None
            [holder] = await theirs.status()
            assert holder.owner == mine.owner and holder.since_ms <= holder.renewed_at_ms < holder.expires_at_ms
            assert await mine.release() is True
            assert mine.token is None and not mine.held
            assert await theirs.acquire() and theirs.fence > holder.fence

    run(backend, body)


def test_both_the_same_owner_is_the_same_holder(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            first = client.lock(unique, ttl=30, owner="cron-7")
            second = client.lock(unique, ttl=30, owner="cron-7")
            assert await first.acquire() and await second.acquire()
            assert first.token == second.token

    run(backend, body)


def test_both_a_semaphore_admits_n_holders_each_on_its_own_slot(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            permits = [client.semaphore(unique, 2, ttl="1m") for _ in range(3)]
            assert [await p.acquire() for p in permits] == [True, True, False]
            assert {permits[0].slot, permits[1].slot} == {0, 1}
            assert permits[2].refusal[0] == "held" and len(permits[2].refusal[1]) == 2
            await permits[0].release()
            assert await permits[2].acquire()

    run(backend, body)


def test_both_hold_runs_the_block_only_when_acquired_and_releases_after(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            ran = []
            async with client.lock(unique, ttl="30s").hold() as lock:
                ran.append(lock.token)
                with pytest.raises(queen_client.LockNotAcquired) as refused:
                    async with client.lock(unique, ttl="30s").hold():
                        ran.append("second")  # pragma: no cover - must not run
                assert refused.value.reason == "held"
            assert len(ran) == 1 and ran[0] is not None
            assert await client.locks.holders(unique) == []
            result = await client.lock(unique, ttl=30).run(anyio.sleep, 0, wait="1s")
            assert result.acquired

    run(backend, body)


def test_both_a_second_hold_on_one_handle_is_an_error_and_the_first_keeps_the_lock(backend, server, unique):
    """A handle holds once: nested (or concurrent) hold() on it would release the permit under the
    outer block when the inner one ends."""
    async def body():
        async with queen_client.Client(server.url) as client:
            lock = client.lock(unique, ttl="30s")
            async with lock.hold():
                token = lock.token
                with pytest.raises(RuntimeError, match="already running on this handle"):
                    async with lock.hold():
                        pass  # pragma: no cover - must not run
                assert lock.held and lock.token == token
                [holder] = await client.locks.holders(unique)
                assert holder.token == token
            assert await client.locks.holders(unique) == []

    run(backend, body)


def test_both_a_guarded_transaction_commits_only_while_the_lock_is_ours(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            lock = client.lock(unique, ttl="30s")
            reasons = []
            lock.on_lost(reasons.append)
            assert await lock.acquire()
            done = await client.transaction().guard(lock).kv.put(unique, "report", "v1", ttl="1d").kv.incr(unique, "runs", ttl="1d").commit()
            assert done.success and done.results[0].applied and done.results[1].value == 1
            # An admin releases the stuck lock by hand with the token the listing shows; someone else takes it.
            [listed] = [h async for h in client.locks.list(unique)]
            await client.locks.call({"op": "release", "name": unique, "slot": listed.slot, "token": listed.token})
            assert await client.lock(unique, ttl="30s").acquire()
            refused = await client.transaction().guard(lock).kv.put(unique, "report", "v2", ttl="1d").commit()
            assert not refused.success and refused.reason == "kv_precondition" and refused.failed_lock == unique
            assert reasons == ["guard"] and lock.lost_reason == "guard" and lock.token is None
            assert (await client.kv.get(unique, "report")).value == "v1"
            with pytest.raises(queen_client.LockLost):
                await client.transaction().guard(lock).kv.put(unique, "report", "v3", ttl="1d").commit()
            missed = await client.transaction().kv.put_if_absent(unique, "report", "x", ttl=60).commit()
            assert not missed and missed.failed_index == 0 and missed.failed_reason == "exists"

    run(backend, body)


def test_both_a_renewal_answered_lost_is_reported_at_once(backend, server, unique):
    async def body():
        async with queen_client.Client(server.url) as client:
            lock = client.lock(unique, ttl="30s")
            reasons = []
            lock.on_lost(reasons.append)
            assert await lock.acquire()
            assert await lock.renew() and lock.token > lock.fence
            [holder] = await client.locks.holders(unique)
            await client.locks.call({"op": "release", "name": unique, "slot": 0, "token": holder.token})
            assert await lock.renew() is False
            assert reasons == ["renew"] and await lock.wait_lost() == "renew" and lock.token is None

    run(backend, body)


def test_both_a_holder_of_a_paused_server_gives_up_within_its_lifetime(backend, server, unique):
    """A real lease of 1 s: the server is SIGSTOPped under a hold() body. The handle reports the loss
    no later than its deadline on its own clock, cancels the body, and never shows a token after."""
    async def body():
        async with queen_client.Client(server.url, timeout_s=5) as client:
            lock = client.lock(unique, ttl=1)
            seen, losses = [], []
            lock.on_lost(lambda reason: losses.append((reason, anyio.current_time())))
            with pytest.raises(queen_client.LockLost) as lost:
                async with lock.hold():
                    with paused(server):
                        stopped_at, deadline = anyio.current_time(), lock.deadline
                        while True:  # the body: sample the token until the handle cancels us
                            seen.append((anyio.current_time(), lock.token))
                            await anyio.sleep(0.01)
            assert lost.value.reason == "expired" and losses[0][0] == "expired"
            lost_at = losses[0][1]
            assert deadline <= stopped_at + 1.0
            assert lost_at <= lock._lease.deadline + 0.25  # scheduling slack of the loop only
            assert lock._lease.deadline <= stopped_at + 1.0
            assert all(token is None for at, token in seen if at >= lock._lease.deadline)
            assert any(token is not None for _, token in seen)

    run(backend, body)


# -- loss in virtual time -----------------------------------------------------------------------------


class StallingProxy:
    """A TCP proxy in front of the server; while `stalled`, bytes towards the server are held back,
    so requests (renewals) never arrive and never get an answer."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.stalled = False
        self._changed = trio.Event()

    def stall(self, stalled: bool = True) -> None:
        self.stalled = stalled
        self._changed.set()
        self._changed = trio.Event()

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, client_stream):
        server_stream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client_stream, server_stream, True, nursery.cancel_scope)
            nursery.start_soon(self._pump, server_stream, client_stream, False, nursery.cancel_scope)

    async def _pump(self, source, sink, towards_server, scope):
        try:
            while True:
                data = await source.receive_some(65536)
                if not data:
                    break
                while towards_server and self.stalled:
                    await self._changed.wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            scope.cancel()


async def test_stalled_renewals_cancel_the_hold_body_at_the_deadline_never_later(tmp_path, autojump_clock, nursery):
    async with open_server(tmp_path / "data", wall_at_start_ms=int(trio.current_time() * 1000)) as server:
        proxy = StallingProxy(server.port)
        await nursery.start(proxy.serve)
        admin = HttpClient(server.port)
        async with queen_client.Client(f"http://127.0.0.1:{proxy.port}") as client:
            lock = client.lock("report", ttl="30s")
            losses, seen = [], []
            lock.on_lost(lambda reason: losses.append((reason, trio.current_time())))

            async def watch():
                while True:
                    seen.append((trio.current_time(), lock.token))
                    await trio.sleep(0.05)

            nursery.start_soon(watch)
            with pytest.raises(queen_client.LockLost) as lost:
                async with lock.hold():
                    held_from = trio.current_time()
                    await trio.sleep(95)  # three renewals get through
                    renewed_token, fence = lock.token, lock.fence
                    proxy.stall()
                    stalled_at, deadline = trio.current_time(), lock.deadline
                    [answer] = await admin.locks({"op": "get", "name": "report"})
                    server_expires_at_s = answer["holders"][0]["expiresAt"] / 1000  # server clock = trio's here
                    await trio.sleep_forever()
            assert lost.value.reason == "expired"
            [(reason, lost_at)] = losses
            assert deadline <= stalled_at + 30 and lost_at == pytest.approx(deadline, abs=1e-6)
            assert renewed_token > fence  # renewals had gone through before the stall
            # The handle gives up first: its deadline is never later than the server's expiry.
            assert server_expires_at_s >= deadline
            await trio.sleep(1)  # let the watcher look again, after the loss
            before = [t for at, t in seen if held_from < at < deadline]
            after = [t for at, t in seen if at >= deadline]
            assert all(t is not None for t in before) and after and all(t is None for t in after)
            proxy.stall(False)


async def test_a_renewal_answered_lost_is_reported_long_before_the_deadline(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server, queen_client.Client(f"http://127.0.0.1:{server.port}") as client:
        admin = HttpClient(server.port)
        lock = client.lock("sync", ttl="30s")
        assert await lock.acquire()
        acquired_at = trio.current_time()
        [holder] = (await admin.locks({"op": "get", "name": "sync"}))[0]["holders"]
        await admin.locks({"op": "release", "name": "sync", "slot": 0, "token": holder["token"]})
        reason = await lock.wait_lost()
        assert reason == "renew"
        assert trio.current_time() - acquired_at == pytest.approx(10, abs=0.1)  # the first renewal, not the deadline


async def test_a_waiting_acquire_is_handed_the_lock_and_confirms_its_lease(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server, queen_client.Client(f"http://127.0.0.1:{server.port}") as client:
        holder, waiter = client.lock("gpu", ttl="3s"), client.lock("gpu", ttl="3s")
        assert await holder.acquire()
        results = []

        async def wait_for_it():
            results.append(await waiter.acquire(wait="100s"))  # longer than one server wait of 60 s
            results.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_it)
            await trio.sleep(70)
            assert holder.held  # renewed in the background all along
            released_at = trio.current_time()
            await holder.release()
        acquired, acquired_at = results
        assert acquired and acquired_at - released_at < 0.1
        # The grant came 70 s after the request: the handle renewed at once, so its lifetime
        # counts from a request it knows the time of.
        assert waiter.deadline == pytest.approx(acquired_at + 3, abs=0.1)
        assert waiter.token > waiter.fence


async def test_guarded_commits_racing_renewals_never_fail_on_our_own_renewal(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server, queen_client.Client(f"http://127.0.0.1:{server.port}") as client:
        lock = client.lock("ledger", ttl="3s")
        async with lock.hold():
            start, tokens = trio.current_time(), set()

            async def commit_often(offset):
                for i in range(80):  # 40 s of virtual time, a renewal every second
                    # wake exactly when a renewal is due, half of the time
                    await trio.sleep_until(start + i / 2 + offset)
                    result = await client.transaction().guard(lock).kv.put("ledger", f"row{offset}", i, ttl=60).commit()
                    assert result.success, result
                    tokens.add(lock.token)

            async with trio.open_nursery() as nursery:
                for offset in (0, 0.001, 0.002):
                    nursery.start_soon(commit_often, offset)
            assert len(tokens) > 30 and lock.held


async def test_keep_alive_renews_from_the_loop_when_no_background_task_may_run(tmp_path, autojump_clock):
    async with open_server(tmp_path / "data") as server:
        client = queen_client.Client(f"http://127.0.0.1:{server.port}")  # not entered: no task group
        lock = client.lock("batch", ttl="3s", auto_renew=False)
        with pytest.raises(RuntimeError, match="task group"):
            await client.lock("batch", ttl="3s").acquire()
        assert await lock.acquire()
        for _ in range(20):
            await trio.sleep(0.5)
            assert await lock.keep_alive()
        assert lock.token > lock.fence
        await trio.sleep(3)  # the loop stalls past the lifetime
        assert await lock.keep_alive() is False and lock.lost_reason == "expired"
        await client.aclose()


def test_the_server_never_imports_the_sdk():
    import subprocess
    import sys

    code = "import sys, queen.cli, queen.runtime.server; assert not any(m.startswith('queen_client') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))



# -- the retry policy, against a scripted server ---------------------------------------------------


class ScriptedServer:
    """Answers each request with the next scripted reply: ("close",) hangs up without answering,
    (status, code) answers that error, (200, body) answers it. Counts requests."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = 0

    async def serve(self, listener):
        await listener.serve(self._connection)

    async def _connection(self, stream):
        buffer = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        buffer += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
                while len(buffer) < length:
                    buffer += await stream.receive()
                buffer = buffer[length:]
                self.requests += 1
                reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
                if reply[0] == "close":
                    return
                status, payload = reply
                if status != 200:
                    payload = b'{"error":"scripted","code":"%s","details":{},"detail":"scripted"}' % payload.encode()
                await stream.send(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\nretry-after: 0\r\n\r\n%s"
                                  % (status, len(payload), payload))


GET_OK = b'{"results":[{"found":true,"value":1,"version":3,"expiresAt":null,"index":0,"op":"get"}]}'
PUT_OK = b'{"results":[{"applied":true,"version":4,"index":0,"op":"put"}]}'


def scripted(backend, replies, call):
    async def body():
        server = ScriptedServer(replies)
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener, anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve, listener)
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with queen_client.Client(f"http://127.0.0.1:{port}", retries_max=3) as client:
                try:
                    return await call(client), server.requests
                except queen_client.ClientError as error:
                    return error, server.requests
                finally:
                    tasks.cancel_scope.cancel()

    return anyio.run(body, backend=backend)


def test_both_reads_are_retried_through_503_and_broken_connections(backend):
    result, requests = scripted(backend, [(503, "not_durable"), ("close",), (200, GET_OK)], lambda c: c.kv.get("a", "b"))
    assert result.value == 1 and requests == 3


def test_both_writes_are_not_retried_when_they_might_have_applied(backend):
    error, requests = scripted(backend, [(503, "not_durable"), (200, PUT_OK)], lambda c: c.kv.put("a", "b", 1, ttl=5))
    assert isinstance(error, queen_client.UnavailableError) and error.code == "not_durable" and requests == 1
    error, requests = scripted(backend, [("close",), (200, PUT_OK)], lambda c: c.kv.put("a", "b", 1, ttl=5))
    assert isinstance(error, queen_client.TransportError) and requests == 1


def test_both_a_503_that_applied_nothing_is_retried_even_for_a_write(backend):
    result, requests = scripted(backend, [(503, "too_many_connections"), (200, PUT_OK)], lambda c: c.kv.put("a", "b", 1, ttl=5))
    assert result.applied and requests == 2


def test_both_retries_give_up_after_the_limit(backend):
    error, requests = scripted(backend, [(503, "shutting_down")], lambda c: c.kv.get("a", "b"))
    assert isinstance(error, queen_client.UnavailableError) and requests == 4  # the first try and 3 retries
