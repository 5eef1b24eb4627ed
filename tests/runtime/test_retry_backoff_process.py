"""The retry backoff on a real `queen serve`, measured on the server's own clock: each failed
delivery holds the message back retryDelayMs, doubled each time, and a SIGKILL and restart in the
middle of a backoff (replaying the log, or loading a snapshot) keeps holding it back until its
time. The test waits on the server's answers (long polls), never on time to pass.

Times: a pop's answer gives the lease's expiresAt, so the server's clock at the delivery is
expiresAt - leaseTimeSeconds; the partitions view gives the retry time it holds (retryAt), so the
server's clock at the failure is retryAt - the backoff, which must fall between our own clock's
readings around the ack (the server and the test read the same machine's clock).
"""

import os
import time

import pytest

from queen.testing import ServerProcess
from queen.wal.segment import list_dir

RETRY_DELAY_MS = 300
RESTART_DELAY_MS = 6_000
LEASE_S = 60
# How late a delivery may come after its retry time on a busy machine (the tick is 50 ms).
LATE_MS = 1_500
# How far the server's clock and ours may disagree (both read this machine's wall clock).
SKEW_MS = 50


def configure(server, **options):
    call(server, "POST", "/api/v1/configure", {"queue": "backoff", "options": {"leaseTimeSeconds": LEASE_S, **options}})


def call(server, method, path, body=None):
    status, answer = server.request(method, path, body)
    assert status == 200, (status, answer)
    return answer


def pop_delivered(server, expected_retry_count):
    """Wait for the message; (the server's clock at the delivery, the message)."""
    got = call(server, "GET", "/api/v1/pop/queue/backoff?waitMs=10000")
    assert got["success"], got
    [message] = got["messages"]
    assert message["retryCount"] == expected_retry_count
    return got["expiresAt"] - LEASE_S * 1000, message


def retry_at(server):
    page = call(server, "GET", "/api/v1/resources/queues/backoff/partitions")
    return page["items"][0]["groups"][0]["retryAt"]


def fail(server, message):
    """Ack it failed; our clock's readings (ms) just before and just after."""
    sent_ms = time.time() * 1000
    result = call(server, "POST", "/api/v1/ack", {"partitionId": message["partitionId"], "leaseId": message["leaseId"],
                                                   "offset": message["offset"], "status": "failed", "error": "boom"})
    assert result["success"], result
    return sent_ms, time.time() * 1000


def fail_and_check_the_hold(server, message, delivered_ms, backoff_ms):
    """Ack it failed: the retry time the server holds is the failure's time plus the backoff, and
    the failure came after the delivery and between our clock's readings around the ack."""
    sent_ms, answered_ms = fail(server, message)
    held_ms = retry_at(server)
    assert held_ms is not None, "not held back"
    failed_at_ms = held_ms - backoff_ms
    assert delivered_ms <= failed_at_ms and sent_ms - SKEW_MS <= failed_at_ms <= answered_ms + SKEW_MS, \
        (delivered_ms, sent_ms, failed_at_ms, answered_ms)
    return held_ms


def snapshots_written(server) -> float:
    return server.metrics().get("queen_snapshots_total", 0)


def wait_for_a_snapshot_taken_after_now(server):
    """A snapshot finished now may have been taken before the last write: wait for the next one's
    end, nudging the server with writes (each may start one)."""
    first = snapshots_written(server) + 2
    for n in range(500):  # waiting on the real server's snapshots, not on time to pass
        if snapshots_written(server) >= first:
            return
        call(server, "PUT", f"/api/v1/kv/nudge/k{n}", {"value": n, "forever": True})
        time.sleep(0.01)
    raise AssertionError("no snapshot was written")


def test_failed_deliveries_are_held_back_twice_as_long_each_time_on_the_server_clock(tmp_path):
    with ServerProcess(str(tmp_path / "data")) as server:
        configure(server, retryDelayMs=RETRY_DELAY_MS, retryDelayMaxMs=2_000, retryLimit=4)
        call(server, "POST", "/api/v1/push", {"items": [{"queue": "backoff", "partition": "p", "payload": "poison"}]})
        delivered_ms, message = pop_delivered(server, 0)
        for count, backoff_ms in enumerate([300, 600, 1_200, 2_000], start=1):  # the last one capped
            held_ms = fail_and_check_the_hold(server, message, delivered_ms, backoff_ms)
            assert call(server, "GET", "/api/v1/pop/queue/backoff")["reason"] == "empty"
            delivered_ms, message = pop_delivered(server, count)
            assert held_ms <= delivered_ms <= held_ms + LATE_MS, (count, held_ms, delivered_ms)
        # The fifth failure passes retryLimit 4: the DLQ takes it, at once, as without a backoff.
        sent_ms, answered_ms = fail(server, message)
        page = call(server, "GET", "/api/v1/dlq?queue=backoff")
        assert page["total"] == 1 and page["messages"][0]["retryCount"] == 5
        assert sent_ms - SKEW_MS <= page["messages"][0]["dlqAt"] <= answered_ms + SKEW_MS
        assert retry_at(server) is None
        assert call(server, "GET", "/api/v1/pop/queue/backoff")["reason"] == "empty"


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["from-log", "from-snapshot"])
def test_a_sigkill_in_the_middle_of_a_backoff_does_not_shorten_it(tmp_path, from_snapshot):
    """Held back 6 s: a restart here takes up to about 2.5 s under load, and the rest must be
    left to judge."""
    data_dir = str(tmp_path / "data")
    server = ServerProcess(data_dir, *(["--snapshot-wal-bytes", "1"] if from_snapshot else [])).start()
    try:
        configure(server, retryDelayMs=RESTART_DELAY_MS, retryLimit=4)
        call(server, "POST", "/api/v1/push", {"items": [{"queue": "backoff", "partition": "p", "payload": "poison"}]})
        delivered_ms, message = pop_delivered(server, 0)
        held_ms = fail_and_check_the_hold(server, message, delivered_ms, RESTART_DELAY_MS)
        if from_snapshot:
            wait_for_a_snapshot_taken_after_now(server)
        server.kill()
        server.start()
        if from_snapshot:
            assert list_dir(os.listdir(data_dir))[1], "no snapshot to restart from"
        early = call(server, "GET", "/api/v1/pop/queue/backoff")
        assert time.time() * 1000 < held_ms - SKEW_MS, "the restart outlasted the backoff: nothing left to judge"
        assert early["success"] is False, f"delivered {held_ms - early['expiresAt'] + LEASE_S * 1000} ms early"
        assert retry_at(server) == held_ms
        delivered_ms, message = pop_delivered(server, 1)
        assert held_ms <= delivered_ms <= held_ms + LATE_MS, (held_ms, delivered_ms)
    finally:
        server.stop()
