"""The `queen` command as a worker and in a shell: `queen queue consume -- CMD` against a real
server, Ctrl-C on a waiting command, a reader that stops reading (`| head`), and waits longer than
one call may wait. Every wait here is on a real process (a line written, an exit)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import queen_client as sdk
from queen.testing import ServerProcess

QUEEN = [sys.executable, "-m", "queen"]
# Reads its message, notes "<payload> <retry count>", and fails every third payload with a last
# stderr line the ack carries as its error.
EVERY_THIRD_FAILS = r'''
read n
echo "$n $QUEEN_RETRY_COUNT $QUEEN_PARTITION $QUEEN_LEASE_ID" >> "$RUNS"
if [ $((n % 3)) -eq 0 ]; then
    echo "some detail" >&2
    echo "multiple of three: $n" >&2
    exit 1
fi
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(str(tmp_path_factory.mktemp("queen") / "data")) as process:
        yield process


def queen(server, *args, env=None, **popen):
    return subprocess.Popen([*QUEEN, *args], env=dict(os.environ, QUEEN_URL=server.url, **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def wait_for(predicate, what: str, timeout_s: float = 60.0):
    """Poll a real process's visible effect; not a wait for time to pass."""
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return result


def connections(server) -> int:
    """Open connections to the broker, the one asking included."""
    return server.metrics()["queen_connections"]


def runs_of(path) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def test_consume_runs_the_command_once_per_message_acks_by_exit_status_and_stops_on_sigterm(server, tmp_path):
    runs = tmp_path / "runs"
    with sdk.SyncClient(server.url) as client:
        work = client.queue("cli-work")
        work.configure(retryLimit=1, leaseTimeSeconds=30)
        work.push_many([sdk.Push(n, f"p{n % 3}") for n in range(1, 10)])
        worker = queen(server, "queue", "consume", "cli-work", "--concurrency", "2", "--", "sh", "-c",
                       EVERY_THIRD_FAILS, env={"RUNS": str(runs)})
        # 3, 6 and 9 fail on their first delivery and again on their one retry, then go to the DLQ.
        dlq = wait_for(lambda: len(entries := work.dlq()) == 3 and entries, "three DLQ entries")
        assert sorted(entry["data"] for entry in dlq) == [3, 6, 9]
        assert {entry["error"] for entry in dlq} == {f"multiple of three: {n}" for n in (3, 6, 9)}
        info = work.info()
        assert [(g["pending"], g["inFlight"]) for g in info["groups"]] == [(0, 0)]
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    seen = runs_of(runs)
    done = sorted(int(n) for n, retry, _, _ in seen if int(n) % 3)
    assert done == [1, 2, 4, 5, 7, 8]  # each exactly once, on its first delivery
    assert sorted((int(n), int(retry)) for n, retry, _, _ in seen if int(n) % 3 == 0) == [
        (3, 0), (3, 1), (6, 0), (6, 1), (9, 0), (9, 1)]
    assert all(lease.isdigit() for _, _, _, lease in seen)


def test_consume_sends_a_message_to_the_dlq_on_the_chosen_exit_code(server, tmp_path):
    with sdk.SyncClient(server.url) as client:
        poison = client.queue("cli-poison")
        poison.push("bad")
        worker = queen(server, "queue", "consume", "cli-poison", "--dlq-exit-code", "9", "--", "sh", "-c",
                       "cat >/dev/null; echo 'cannot parse' >&2; exit 9")
        [entry] = wait_for(lambda: poison.dlq(), "the DLQ entry")
        assert entry["data"] == "bad" and entry["error"] == "cannot parse" and entry["retryCount"] == 1  # one delivery, failed
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
        assert worker.returncode == 0


def test_consume_gives_a_byte_payload_to_the_command_as_its_bytes(server, tmp_path):
    payload = b"\x89PNG\r\n\x1a\n\x00\xff"
    with sdk.SyncClient(server.url) as client:
        binary = client.queue("cli-bincons")
        binary.configure(retryLimit=0)  # a failed delivery goes to the DLQ at once
        binary.push(payload)
        binary.push({"logo": payload})
        worker = queen(server, "queue", "consume", "cli-bincons", "--", "sh", "-c", 'cat > "$OUT/$QUEEN_OFFSET"',
                       env={"OUT": str(tmp_path)})
        wait_for(lambda: [(g["pending"], g["inFlight"]) for g in binary.info()["groups"]] == [(0, 0)],
                 "both messages to be settled")
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert binary.dlq() == [], err
    assert (tmp_path / "0").read_bytes() == payload
    assert json.loads((tmp_path / "1").read_bytes()) == {"logo": {"$bytes": "iVBORw0KGgoA/w=="}}  # as JSON, the wire's form


def test_consume_says_on_stderr_why_it_could_not_run_the_command_and_the_dlq_entry_names_it(server):
    with sdk.SyncClient(server.url) as client:
        missing = client.queue("cli-nocmd")
        missing.configure(retryLimit=0)
        missing.push("job")
        worker = queen(server, "queue", "consume", "cli-nocmd", "--", "/nonexistent/queen-test-command")
        [entry] = wait_for(lambda: missing.dlq(), "the DLQ entry")
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert entry["error"].startswith("queen queue consume: FileNotFoundError: ") and "/nonexistent" in entry["error"]
    assert f"{entry['error']} (message cli-nocmd/Default offset 0, acked failed)" in err.splitlines(), err


def test_sigterm_lets_a_running_command_finish_within_the_grace_and_acks_it(server, tmp_path):
    started, gate = tmp_path / "started", tmp_path / "gate"
    with sdk.SyncClient(server.url) as client:
        slow = client.queue("cli-slow")
        slow.push("job")
        script = f'cat >/dev/null; touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done'
        worker = queen(server, "queue", "consume", "cli-slow", "--grace", "30s", "--", "sh", "-c", script)
        wait_for(started.exists, "the command to start")
        worker.send_signal(signal.SIGTERM)
        gate.touch()  # the command finishes inside its grace period: acked completed, not released
        _, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert "SIGTERM: stopping" in err
        info = slow.info()
        assert [(g["pending"], g["inFlight"]) for g in info["groups"]] == [(0, 0)]  # acked completed
        assert slow.dlq() == []


def test_sigterm_stops_a_worker_that_cannot_reach_the_broker(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err_file:
        worker = subprocess.Popen([*QUEEN, "queue", "consume", "nowhere", "--", "true"],
                                  env=dict(os.environ, QUEEN_URL=url), stdout=subprocess.DEVNULL, stderr=err_file)
        try:
            # Its first call (the queue's lease time) is failing and being retried.
            wait_for(lambda: "consumer_waiting_for_broker" in err_path.read_text(), "the worker to wait for the broker")
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    err = err_path.read_text()
    assert worker.returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [
    ["queue", "pop", "cli-idle", "--wait", "forever"],
    ["queue", "consume", "cli-idle", "--", "true"],
    ["lock", "acquire", "cli-held", "--ttl", "1m", "--wait", "forever"],
])
def test_ctrl_c_on_a_waiting_command_exits_130_with_one_line(server, command):
    with sdk.SyncClient(server.url) as client:
        client.locks.acquire("cli-held", ttl="5m", owner="someone-else")
        before = connections(server)
        waiting = queen(server, *command, start_new_session=True)
        wait_for(lambda: connections(server) > before, "the command's waiting call")
        interrupted = time.monotonic()
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
    assert time.monotonic() - interrupted < 10  # not the broker's 60 s wait
    assert waiting.returncode == 130, err
    assert err.splitlines() == ["queen: interrupted"], err


def test_a_reader_that_stops_reading_ends_the_command_quietly(server):
    with sdk.SyncClient(server.url) as client:
        client.queue("cli-many").push_many(["x" * 2000 for _ in range(200)])
    reader = queen(server, "queue", "pop", "cli-many", "--batch", "200", "--auto-ack")
    reader.stdout.readline()
    reader.stdout.close()  # `| head -1`
    reader.wait(timeout=30)
    err = reader.stderr.read()
    reader.stderr.close()
    assert reader.returncode == 141 and err == "", err


@pytest.mark.parametrize("command", [
    ["queue", "pop", "cli-idle", "--wait", "2m"],
    ["lock", "acquire", "cli-held", "--ttl", "1m", "--wait", "90s"],
])
def test_a_wait_longer_than_one_call_may_wait_is_a_usage_error_not_cut_short(server, command):
    refused = queen(server, *command)
    out, err = refused.communicate(timeout=30)
    assert refused.returncode == 2, err
    assert "at most 60s" in err and "forever" in err


def test_pop_wait_forever_waits_past_the_brokers_longest_wait_for_a_message(server):
    """Stated with the JSON answer: a pop asked again after each empty 60 s wait. Here the message
    comes early; what is checked is that 'forever' is taken and answered with the message."""
    before = connections(server)
    waiting = queen(server, "queue", "pop", "cli-later", "--wait", "forever", "--json")
    wait_for(lambda: connections(server) > before, "the pop's connection")
    with sdk.SyncClient(server.url) as client:
        client.queue("cli-later").push({"n": 1})
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert [m["data"] for m in json.loads(out)["messages"]] == [{"n": 1}]
