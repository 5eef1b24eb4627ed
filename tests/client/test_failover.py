"""The SDK rides through a failover: against fake nodes (tests/client/fake_node.py) in virtual time
(Trio's MockClock: the SDK's waits between attempts take no real time), a call safe to repeat is
sent again until the new leader answers it, within `failover_timeout`; a call that provably was
not applied is sent again whatever it is; any other call whose attempt has an unknown outcome
raises one OutcomeUnknown, sent once."""

import json

import pytest
import trio

import queen_client
from queen.testing import free_port
from queen_client.errors import CannotConnect, OutcomeUnknown, UnavailableError

from .fake_node import DROP, FakeNode, error_body, kv_leader


def refusing(code: str, details: dict | None = None):
    return lambda method, target, body: (503, {"retry-after": "1"}, error_body(code, "refused", details))


def leader_after(until: float, then, before=None):
    """A node that refuses as `before` does (no_leader) until `until` on the (virtual) clock, then
    answers as `then`."""
    before = before or refusing("no_leader", {"retryAfterMs": 200})
    return lambda method, target, body: (before if trio.current_time() < until else then)(method, target, body)


def dropping_once(then, apply=None):
    """Reads the first request and dies under it (DROP), after passing it to `apply` (the first
    attempt applied, its answer lost); answers as `then` afterwards."""
    calls = []

    def answer(method, target, body):
        calls.append(target)
        if len(calls) == 1:
            if apply is not None:
                apply(method, target, body)
            return DROP
        return then(method, target, body)
    return answer


def queue_leader(epoch: int, pushed: dict):
    """A leader's push (deduplicated by transactionId, as the partition does), pop and transaction."""
    headers = {"x-queen-epoch": str(epoch)}

    def push(item) -> dict:
        tid = item["transactionId"]
        status = "duplicate" if tid in pushed else "queued"
        pushed.setdefault(tid, len(pushed))
        return {"status": status, "queue": item["queue"], "partition": "Default", "transactionId": tid,
                "offset": pushed[tid], "messageId": pushed[tid] + 1}

    def answer(method, target, body):
        if target == "/api/v1/push":
            return 200, headers, [push(item) for item in json.loads(body)["items"]]
        if target.startswith("/api/v1/pop/"):
            return 200, headers, {"messages": [], "reason": "empty"}
        if target == "/api/v1/transaction":
            document = json.loads(body)
            return 200, headers, {"success": True, "push": [push(item) for item in document.get("push", [])],
                                  "kv": [{"applied": True, "version": 7} for _ in document.get("kv", [])]}
        return 404, {}, error_body("not_found", target)
    return answer


async def nodes(nursery, *answers) -> list[FakeNode]:
    started = []
    for answer in answers:
        node = FakeNode(answer)
        await node.serve(nursery)
        started.append(node)
    return started


async def test_safe_calls_ride_a_failover_to_the_new_leader_and_each_applies_once(autojump_clock):
    store: dict = {}
    async with trio.open_nursery() as nursery:
        old, new = await nodes(nursery, kv_leader(1, store), None)
        new.answer = leader_after(trio.current_time() + 5.0, kv_leader(2, store))
        async with queen_client.Client([old.url, new.url]) as client:
            written = await client.kv.put("ns", "k", 0, forever=True)
            assert client.epoch == 1
            old.kill()  # the leader dies; the other node has no leader for 5 s, then takes over
            version = written.version
            for n in range(1, 20):  # compare-and-set writes and reads, safe to repeat
                result = await client.kv.put("ns", "k", n, forever=True, expect=version)
                assert result.applied, result
                version = result.version
                assert (await client.kv.get("ns", "k")).value == n
            assert client.epoch == 2 and client.leader_url == new.url
        # Each write applied once (one version each), though most were sent several times.
        assert store["k"] == (19, written.version + 19)
        assert sum(json.loads(body)["operations"][0]["op"] == "put" for _, _, body in new.seen) > 19
        nursery.cancel_scope.cancel()


async def test_a_write_that_provably_was_not_applied_is_sent_again_whatever_it_is(autojump_clock):
    # A plain put (not safe to repeat): refused connections and refusals that applied nothing
    # (no leader; sync set out of reach with applied false) send it again.
    store: dict = {}
    async with trio.open_nursery() as nursery:
        [alive] = await nodes(nursery, None)
        until = trio.current_time() + 3.0
        alive.answer = leader_after(until, kv_leader(3, store),
                                    before=refusing("sync_unavailable", {"applied": False, "retryAfterMs": 100}))
        dead = f"http://127.0.0.1:{free_port()}"
        async with queen_client.Client([dead, alive.url]) as client:
            assert (await client.kv.put("ns", "k", "v", forever=True)).applied
            assert trio.current_time() >= until
        assert store["k"][0] == "v" and len(alive.seen) >= 2
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("death", ["dropped", "leader_lost", "sync_unavailable"])
async def test_an_unsafe_write_whose_outcome_is_unknown_raises_outcome_unknown_and_is_sent_once(autojump_clock, death):
    store: dict = {}
    answers = {"dropped": lambda method, target, body: DROP, "leader_lost": refusing("leader_lost"),
               "sync_unavailable": refusing("sync_unavailable", {"applied": "unknown"})}
    async with trio.open_nursery() as nursery:
        dying, lead = await nodes(nursery, answers[death], kv_leader(2, store))
        async with queen_client.Client([dying.url, lead.url]) as client:
            with pytest.raises(OutcomeUnknown) as caught:
                await client.kv.incr("ns", "counter", forever=True)
        assert isinstance(caught.value, queen_client.ClientError) and caught.value.method == "POST"
        assert "outcome is unknown" in str(caught.value)
        if death != "dropped":
            assert isinstance(caught.value.cause, UnavailableError) and caught.value.cause.code == death
        assert len(dying.seen) == 1 and lead.seen == []  # sent once, never repeated
        nursery.cancel_scope.cancel()


async def test_a_conditional_write_sent_again_applies_once_when_its_first_attempt_was_lost(autojump_clock):
    store = {"k": ("old", 5)}
    async with trio.open_nursery() as nursery:
        dying, lead = await nodes(nursery, dropping_once(None), kv_leader(2, store))
        async with queen_client.Client([dying.url, lead.url]) as client:
            result = await client.kv.put("ns", "k", "new", forever=True, expect=5)
        assert result.applied and store["k"][0] == "new"
        assert dying.seen[0][2] == lead.seen[0][2]  # the same request, sent again
        nursery.cancel_scope.cancel()


async def test_a_conditional_write_whose_repeat_misses_raises_outcome_unknown_not_a_miss(autojump_clock):
    # The first attempt applied (replicated to the new leader) and its answer was lost: the repeat
    # finds its own write and misses. That miss may be the first attempt's doing: unknown, not "version".
    store = {"k": ("old", 5)}
    new_leader = kv_leader(2, store)
    async with trio.open_nursery() as nursery:
        dying, lead = await nodes(nursery, dropping_once(None, apply=new_leader), new_leader)
        async with queen_client.Client([dying.url, lead.url]) as client:
            with pytest.raises(OutcomeUnknown):
                await client.kv.put("ns", "k", "new", forever=True, expect=5)
            # A miss with no attempt of unknown outcome before it is an answer, as ever.
            missed = await client.kv.put("ns", "k", "newer", forever=True, expect=5)
            assert not missed.applied and missed.reason == "version"
        assert store["k"][0] == "new"
        nursery.cancel_scope.cancel()


async def test_a_conditional_write_given_up_after_an_attempt_of_unknown_outcome_is_unknown(autojump_clock):
    # Sent, the connection broke; then no node answers until the failover timeout: the first attempt
    # may have applied, so the call's outcome is what is raised, not "cannot connect".
    async with trio.open_nursery() as nursery:
        [dying] = await nodes(nursery, None)

        def die(method, target, body):
            dying.kill()
            return DROP

        dying.answer = die
        async with queen_client.Client([dying.url], failover_timeout="3s") as client:
            with pytest.raises(OutcomeUnknown) as caught:
                await client.kv.put("ns", "k", "new", forever=True, expect=5)
            assert isinstance(caught.value.cause, queen_client.TransportError)
            with pytest.raises(CannotConnect):  # a read: nothing to be unknown about
                await client.kv.get("ns", "k")
        nursery.cancel_scope.cancel()


async def test_a_push_is_sent_again_with_its_transaction_id_and_not_appended_twice(autojump_clock):
    pushed: dict = {}
    new_leader = queue_leader(2, pushed)
    async with trio.open_nursery() as nursery:
        dying, lead = await nodes(nursery, dropping_once(None, apply=new_leader), new_leader)
        async with queen_client.Client([dying.url, lead.url]) as client:
            result = await client.queue("orders").push({"orderId": 1})
        assert result.status == "duplicate" and len(pushed) == 1  # the first attempt's append, once
        assert dying.seen[0][2] == lead.seen[0][2]
        nursery.cancel_scope.cancel()


async def test_a_pop_in_flight_when_the_leader_dies_raises_outcome_unknown(autojump_clock):
    async with trio.open_nursery() as nursery:
        dying, lead = await nodes(nursery, lambda method, target, body: DROP, queue_leader(2, {}))
        async with queen_client.Client([dying.url, lead.url]) as client:
            with pytest.raises(OutcomeUnknown):  # a pop sent again would take a second lease
                await client.queue("orders").pop()
        assert len(dying.seen) == 1 and lead.seen == []
        nursery.cancel_scope.cancel()


async def test_a_transaction_is_sent_again_only_when_every_part_of_it_is_safe(autojump_clock):
    pushed: dict = {}
    new_leader = queue_leader(2, pushed)
    async with trio.open_nursery() as nursery:
        dying, lead = await nodes(nursery, dropping_once(None), new_leader)
        async with queen_client.Client([dying.url, lead.url]) as client:
            step = await (client.transaction().kv.put_if_absent("cron", "2026-01-01", "done", ttl="7d")
                          .queue("reports").push([{"report": 1}]).commit())
            assert step.success and len(lead.seen) == 1
        dying.answer = lambda method, target, body: DROP
        async with queen_client.Client([dying.url, lead.url]) as client:
            with pytest.raises(OutcomeUnknown):  # a timer is not safe to schedule twice
                await client.transaction().kv.put_if_absent("cron", "x", 1, ttl="7d").timer(
                    "reports", "remind", {}, delay="1h").commit()
        assert len(lead.seen) == 1
        nursery.cancel_scope.cancel()


async def test_a_transaction_whose_repeat_fails_raises_outcome_unknown(autojump_clock):
    failed = lambda method, target, body: (200, {}, {"success": False, "reason": "kv_precondition",  # noqa: E731
                                                     "failed": {"section": "kv", "index": 0, "reason": "exists"}})
    async with trio.open_nursery() as nursery:
        dying, lead = await nodes(nursery, lambda method, target, body: DROP, failed)
        async with queen_client.Client([dying.url, lead.url]) as client:
            with pytest.raises(OutcomeUnknown):
                await client.transaction().kv.put_if_absent("cron", "2026-01-01", "done", ttl="7d").commit()
            lead_only = await client.transaction().kv.put_if_absent("cron", "2026-01-01", "done", ttl="7d").commit()
            assert not lead_only.success  # answered at the first attempt: a miss, as ever
        nursery.cancel_scope.cancel()


async def test_a_failover_that_never_ends_gives_up_at_the_failover_timeout_without_a_busy_loop(autojump_clock):
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    async with queen_client.Client(dead, failover_timeout="10s") as client:
        started = trio.current_time()
        with pytest.raises(CannotConnect) as caught:
            await client.kv.put("ns", "k", "v", forever=True)
        given_up_after_s = trio.current_time() - started
        attempts = client.statistics()["requests"]
    assert 8.0 <= given_up_after_s <= 10.5
    assert 10 <= attempts <= 60  # backoff doubling from 50 ms to 2 s with jitter: no busy loop
    assert "queen serve" in str(caught.value) and caught.value.url in dead


async def test_a_stopping_consumer_gives_its_lease_back_for_no_longer_than_it_says(autojump_clock):
    # A release rides a failover for up to failover_timeout; a stopping consumer gives up sooner.
    from queen_client.consumer import RELEASE_GIVE_UP_S, Reconnect, steadily

    async with queen_client.Client(f"http://127.0.0.1:{free_port()}") as client:
        started = trio.current_time()
        with pytest.raises(TimeoutError):
            await steadily(lambda: client.queue("orders").release(7), Reconnect("orders"), RELEASE_GIVE_UP_S)
        assert trio.current_time() - started == pytest.approx(RELEASE_GIVE_UP_S)


async def test_the_waits_follow_the_servers_hint(autojump_clock):
    async with trio.open_nursery() as nursery:
        [refuser] = await nodes(nursery, refusing("no_leader", {"retryAfterMs": 500}))
        async with queen_client.Client([refuser.url], failover_timeout="5s") as client:
            with pytest.raises(UnavailableError):
                await client.kv.get("ns", "k")
        # At least 500 ms between attempts (up to a tenth more, or the growing backoff), for 5 s.
        assert 5 <= len(refuser.seen) <= 11
        nursery.cancel_scope.cancel()


async def test_the_sync_client_has_the_failover_timeout_too():
    with pytest.raises(CannotConnect):
        with queen_client.SyncClient(f"http://127.0.0.1:{free_port()}", failover_timeout=0) as client:
            assert client.leader_url.startswith("http://127.0.0.1:") and client.epoch is None
            client.kv.get("ns", "k")


# -- a real cluster: SIGKILL of the leader -------------------------------------------------------

def _cluster_ready() -> str | None:
    """Why the real failover test cannot run here, or None."""
    from tests.cluster.harness.etcd import ETCD, etcd_installed
    from tests.cluster.harness.nodes import cluster_supported

    if not etcd_installed():
        return f"needs etcd ({ETCD} missing; apt-get install etcd-server, or QUEEN_TEST_ETCD=/path/to/etcd)"
    if not cluster_supported():
        return "needs `queen serve --cluster` (not in this build)"
    return None


def _parked_pops(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("queen_pops_parked "):
                return int(float(line.split()[1]))
    return 0


def _poll(predicate, what: str, timeout_s: float = 60.0):
    """Poll real processes' visible state until predicate() holds; not a wait for time to pass."""
    import time

    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


def test_safe_calls_ride_a_sigkill_of_the_leader_with_no_error_each_applied_once(tmp_path):
    """3 nodes (strict: an acknowledged write survives the leader), a SyncClient given all three.
    One thread loops over calls safe to repeat (a push with its transactionId, an owner's lock
    acquire and release, reads) while the leader is SIGKILLed under it; another has a pop parked on
    the leader. The loop sees no error and goes on on the new leader; every push is in the queue
    once; every acquire had a fence above the one before; the parked pop raises OutcomeUnknown."""
    import threading

    reason = _cluster_ready()
    if reason:
        pytest.skip(reason)
    from tests.cluster.harness.etcd import EtcdCluster
    from tests.cluster.harness.nodes import QueenCluster

    work = str(tmp_path)
    with EtcdCluster(work, 1) as etcd, QueenCluster(work, etcd, 3, leader_ttl_s=2.0) as cluster:
        old_leader = cluster.wait_leader()
        # 30 s, not the 15 s default: the election takes the 2 s lease and more on a busy machine.
        with queen_client.SyncClient(cluster.urls, failover_timeout="30s") as client:
            jobs = client.queue("jobs")
            done: list[int] = []  # iterations of the loop, each of them whole
            fences: list[int] = []
            errors: list[BaseException] = []
            stop = threading.Event()

            def safe_loop() -> None:
                try:
                    i = 0
                    while not stop.is_set():
                        pushed = jobs.push(f"job-{i}", transaction_id=f"job-{i}")
                        assert pushed.status in ("queued", "duplicate"), pushed
                        taken = client.locks.acquire("failover-lock", ttl="30s", owner="the-loop")
                        assert taken.ok, taken
                        fences.append(taken.fence)
                        client.locks.release("failover-lock", slot=taken.slot, token=taken.token, owner="the-loop")
                        assert not client.kv.get("h", "nothing").found
                        done.append(i)
                        i += 1
                except BaseException as error:  # noqa: BLE001 - the assertion below shows it
                    errors.append(error)

            parked: list[BaseException] = []

            def parked_pop() -> None:
                try:
                    client.queue("idle").pop(wait="30s")
                except BaseException as error:  # noqa: BLE001 - what the test checks
                    parked.append(error)

            loop = threading.Thread(target=safe_loop)
            popper = threading.Thread(target=parked_pop)
            loop.start()
            popper.start()
            try:
                _poll(lambda: len(done) >= 20 or errors, "20 loop iterations before the kill")
                _poll(lambda: _parked_pops(cluster.nodes[old_leader].direct_url) >= 1, "the pop parked on the leader")
                epoch_before = client.epoch
                cluster.kill(old_leader)
                new_leader = cluster.wait_leader(other_than=old_leader)
                at_failover = len(done)
                _poll(lambda: errors or (client.epoch > epoch_before and len(done) >= at_failover + 20),
                      "20 loop iterations on the new leader", timeout_s=120)
            finally:
                stop.set()
                loop.join(timeout=120)
                popper.join(timeout=120)
            assert errors == [], errors
            assert len(parked) == 1 and isinstance(parked[0], queen_client.OutcomeUnknown), parked
            assert client.leader_url == cluster.nodes[new_leader].url

            # Each push appended once: every job, none twice, none lost.
            payloads = []
            while delivery := jobs.pop(batch=1000, auto_ack=True).messages:
                payloads += [message.data for message in delivery]
            assert sorted(payloads) == sorted(f"job-{i}" for i in done)  # the stop ends the loop between iterations
            assert all(a < b for a, b in zip(fences, fences[1:], strict=False)), fences
