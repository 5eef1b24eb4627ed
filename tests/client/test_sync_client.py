"""The blocking SyncClient against a real `queen serve`: the async client on a background loop,
so these tests check the hop between threads and the one thing only it has, interrupting a
`with lock.hold():` block in the thread that entered it."""

import threading
import time

import pytest

import queen_client

from .conftest import paused


@pytest.fixture
def client(server):
    with queen_client.SyncClient(server.url) as sync:
        yield sync


def test_kv_calls_block_and_answer_typed_results(client, unique):
    put = client.kv.put(unique, "config", {"retries": 3}, ttl="7d")
    assert put.applied and put.version > 0
    assert client.kv.get(unique, "config").value == {"retries": 3}
    assert not client.kv.put_if_absent(unique, "config", {}, forever=True)
    assert client.kv.incr(unique, "hits", by=5, max=5, ttl=60).value == 5
    assert client.kv.incr(unique, "hits", max=5, ttl=60).reason == "limit"
    for i in range(5):
        client.kv.put(unique, f"job:{i}", i, ttl=60)
    assert [item.value for item in client.kv.get_prefix(unique, "job:", page_size=2)] == [0, 1, 2, 3, 4]
    assert [i.found for i in client.kv.get_many(unique, ["job:1", "nope"])] == [True, False]
    assert client.kv.check(unique, "nope", 0).applied
    assert client.kv.delete(unique, "config").applied
    with pytest.raises(queen_client.BadRequestError) as rejected:
        client.kv.put(unique, "", 1, ttl=60)
    assert rejected.value.code == "invalid_key"


def test_a_lock_is_held_by_one_handle_and_released_on_close(server, unique):
    with queen_client.SyncClient(server.url) as first, queen_client.SyncClient(server.url) as second:
        mine = first.lock(unique, ttl="30s")
        assert mine.acquire() and mine.held and mine.token == mine.fence
        assert not second.lock(unique, ttl="30s").acquire()
        with pytest.raises(queen_client.LockNotAcquired):
            with second.lock(unique, ttl="30s").hold():
                pass  # pragma: no cover - must not run
        first.close()  # still holding: closing releases it
        assert second.lock(unique, ttl="30s").acquire(wait="5s")
        with pytest.raises(RuntimeError, match="closed"):
            first.kv.get(unique, "x")


def test_hold_and_run_release_when_the_block_ends(client, unique):
    with client.lock(unique, ttl="30s").hold(wait="1s") as lock:
        token = lock.token
        assert token is not None and [h.owner for h in lock.status()] == [lock.owner]
    assert client.locks.holders(unique) == []
    assert client.lock(unique, ttl=30).run(lambda: "done").value == "done"
    sem = [client.semaphore(unique + "s", 2, ttl=30) for _ in range(3)]
    assert [s.acquire() for s in sem] == [True, True, False]


def test_a_guarded_transaction_fails_once_the_lock_changed_hands(client, unique):
    lock = client.lock(unique, ttl="30s")
    assert lock.acquire()
    assert client.transaction().guard(lock).kv.put(unique, "out", 1, ttl=60).commit().success
    [holder] = client.locks.holders(unique)
    client.locks.call({"op": "release", "name": unique, "slot": 0, "token": holder.token})
    assert client.lock(unique, ttl="30s").acquire()
    result = client.transaction().guard(lock).kv.put(unique, "out", 2, ttl=60).commit()
    assert not result.success and result.failed_lock == unique and lock.lost_reason == "guard"


def test_a_renewal_answered_lost_is_reported_at_once(client, unique):
    lock = client.lock(unique, ttl="30s")
    reasons = []
    lock.on_lost(reasons.append)
    assert lock.acquire()
    [holder] = client.locks.holders(unique)
    client.locks.call({"op": "release", "name": unique, "slot": 0, "token": holder.token})
    assert lock.renew() is False
    assert reasons == ["renew"] and lock.wait_lost(timeout=1) == "renew" and lock.token is None


def test_a_paused_server_interrupts_the_hold_block_within_the_lifetime(server, client, unique):
    """A real lease of 1 s; the block runs Python in small steps, as a job loop does."""
    lock = client.lock(unique, ttl=1)
    steps_after_loss = []
    with pytest.raises(queen_client.LockLost) as lost:
        with lock.hold():
            with paused(server):
                stopped_at = time.monotonic()
                while True:
                    if lock.lost_reason is not None:
                        steps_after_loss.append(time.monotonic())
                    time.sleep(0.005)
    assert lost.value.reason == "expired"
    interrupted_at = time.monotonic()
    assert interrupted_at - stopped_at < 1.0 + 0.5  # the lifetime, plus the release's courtesy wait
    assert len(steps_after_loss) <= 3  # interrupted at the next instruction, not at some later check
    assert lock.token is None


def test_the_interruption_lands_in_the_thread_that_entered_the_block(server, client, unique):
    lock = client.lock(unique, ttl=1)
    outcome = []

    def worker():
        try:
            with lock.hold():
                with paused(server):
                    while True:
                        time.sleep(0.005)
        except queen_client.LockLost as error:
            outcome.append(error.reason)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=10)
    assert outcome == ["expired"]


def test_the_sync_client_knows_the_leader_and_its_epoch_as_the_async_one_does(server):
    with queen_client.SyncClient(server.url) as client:
        assert client.leader_url == server.url and client.epoch is None  # one node: no epoch
        lock = client.lock("sync-deadline", ttl="30s")
        assert lock.deadline is None and lock.acquire()
        assert time.monotonic() < lock.deadline <= time.monotonic() + 30
        lock.release()
