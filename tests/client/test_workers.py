"""Workers as a team deploys them: real worker processes (tests/client/worker.py, one on asyncio,
one on the blocking SyncClient) against a real `queen serve` that is SIGKILLed, SIGTERMed and
restarted under them, and workers SIGTERMed while they hold messages. Every wait here is on a real
process's visible effect (a line in a record file, an exit, the broker's counts)."""

import collections
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

import queen_client
from queen.testing import ServerProcess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_worker(flavour, server, queue, records, *args):
    """The worker's stderr goes to RECORDS.<flavour>.log (a pipe left unread could fill and stall it)."""
    log = open(f"{records}.{flavour}.log", "w")
    worker = subprocess.Popen([sys.executable, "-m", "tests.client.worker", flavour, server.url, queue, str(records),
                               *args], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                              stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    worker.log_path = log.name
    return worker


def stderr_of(worker) -> str:
    with open(worker.log_path) as f:
        return f.read()


def records_of(path) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines() if line.count(" ") == 2]


def wait_for(predicate, what: str, timeout_s: float = 120.0):
    """Poll a real process's visible effect; not a wait for time to pass."""
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.05)
    return result


def counts(client, queue) -> tuple[int, int]:
    """(pending, inFlight) of the queue's default group, as the broker reports them."""
    info = client.queue(queue).info()
    [group] = info["groups"] or [{"pending": info["messages"], "inFlight": 0}]
    return group["pending"], group["inFlight"]


def open_connections(server) -> int:
    """The broker's open client connections (GET /api/v1/server, answered in full without an auth file)."""
    with urllib.request.urlopen(server.url + "/api/v1/server", timeout=5) as answer:
        return json.load(answer)["connections"]["open"]


def assert_running(workers, when: str) -> None:
    for worker in workers:
        if worker.poll() is not None:
            raise AssertionError(f"a worker exited {when} with {worker.returncode}:\n{stderr_of(worker)}")


def stop_workers(workers) -> list[str]:
    errors = []
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.wait(timeout=60)
        stderr = stderr_of(worker)
        errors.append(stderr)
        assert worker.returncode == 0, stderr
        assert "Traceback" not in stderr, stderr
    return errors


def test_two_workers_complete_every_message_once_through_broker_crashes_and_a_restart(tmp_path):
    """2,000 messages, two workers (asyncio and sync), the broker SIGKILLed three times and
    SIGTERMed once while they work: no worker exits, every message is completed exactly once by
    the workers' own records, and the broker ends with nothing pending or in flight."""
    total = 2000
    records = tmp_path / "records"
    server = ServerProcess(str(tmp_path / "data")).start()
    workers = []
    try:
        with queen_client.SyncClient(server.url) as client:
            queue = client.queue("jobs")
            # A pop whose answer a crash swallowed leaves its lease to expire: 10 s, not 5 minutes.
            queue.configure(leaseTimeSeconds=10)
            before = open_connections(server)  # this client's, and the one asking
            for flavour in ("asyncio", "sync"):
                workers.append(start_worker(flavour, server, "jobs", records, "--batch", "5", "--lease", "10s"))
            # Both workers waiting on their pops before the first message goes in: on a loaded
            # machine one of them could otherwise start after the other had done everything.
            wait_for(lambda: open_connections(server) >= before + 2, "both workers connected")
            for first in range(0, total, 200):
                queue.push_many([queen_client.Push(i, f"p{i % 8}") for i in range(first, first + 200)])
            for step, (done, crash) in enumerate([(250, True), (650, True), (1050, True), (1450, False)]):
                wait_for(lambda done=done: len(records_of(records)) >= done, f"{done} completions")
                if crash:
                    server.kill()
                else:
                    assert server.stop() == 0
                assert_running(workers, f"at restart {step}")
                server.restart()
            # Done when the broker has nothing left: an orphaned lease (a pop whose answer the
            # crash swallowed) expires after its 10 s and its messages are handled then.
            wait_for(lambda: counts(client, "jobs") == (0, 0),
                     lambda: f"the broker to have nothing pending or in flight: {counts(client, 'jobs')}, "
                             f"{len(records_of(records))} completions")
            assert_running(workers, "at the end")
        stop_workers(workers)
        workers = []
        completions = collections.Counter(int(payload) for payload, _, _ in records_of(records))
        assert sorted(completions) == list(range(total)), "lost messages"
        assert [payload for payload, n in completions.items() if n > 1] == [], "completed twice"
        pids = {pid for _, _, pid in records_of(records)}
        assert len(pids) == 2, "both workers did their share"
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
        server.kill()


@pytest.mark.parametrize("flavour", ["asyncio", "sync"])
def test_sigterm_releases_what_a_worker_holds_to_the_next_at_once_with_retry_counts_unchanged(tmp_path, flavour):
    """A worker holding 50 messages over several partitions (one handler busy, the rest waiting)
    is SIGTERMed: it exits within its grace period, acks what it finished and releases the rest,
    which another worker receives within 1 s with the same retryCount."""
    records = tmp_path / "records"
    with ServerProcess(str(tmp_path / "data")) as server, queen_client.SyncClient(server.url) as client:
        queue = client.queue("held")
        queue.configure(leaseTimeSeconds=300)  # left to expire, the rest would come back in 5 minutes
        queue.push_many([queen_client.Push(i, f"p{i % 5}") for i in range(50)])
        worker = start_worker(flavour, server, "held", records, "--batch", "50", "--partitions", "5",
                              "--lease", "300s", "--grace", "2s", "--hold-after", "3")
        held = wait_for(lambda: [r for r in records_of(records) if r[1] == "held"], "a held handler", 60)
        assert len(records_of(records)) == 4  # three finished, one busy
        assert counts(client, "held") == (0, 50)
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        stderr = stderr_of(worker)
        exited_s = time.monotonic() - signalled
        assert worker.returncode == 0 and "Traceback" not in stderr, stderr
        assert exited_s < 2 + 5, exited_s  # the grace period, and the process's own start-up slack
        assert "event=handler_cut" in stderr  # the held handler outlived its grace and was cut
        finished = {int(payload) for payload, what, _ in records_of(records) if what != "held"}
        assert len(finished) == 3

        # Released at once: the next pop gets all 47 unfinished ones, retry counts unchanged.
        released_at = time.monotonic()
        again = []
        while len(again) < 47 and time.monotonic() - released_at < 1.0:
            again += queue.pop(batch=50, partitions=5, wait="1s").messages
        assert time.monotonic() - released_at < 1.0
        assert sorted(m.data for m in again) == sorted(set(range(50)) - finished)
        assert {m.retry_count for m in again} == {0}
        assert int(held[0][0]) in {m.data for m in again}
        for message in again:
            message.ack()


@pytest.mark.parametrize("flavour", ["asyncio", "trio", "sync"])
def test_one_sigterm_stops_every_loop_of_a_worker_each_releasing_what_it_holds(tmp_path, flavour):
    """A worker process running three process() loops (asyncio and Trio: at once on one event loop;
    sync: a thread each), each amid a batch under a 5-minute lease, is SIGTERMed once: every loop stops,
    the process exits 0, and what each loop did not finish is delivered again at once to another
    consumer, retry counts unchanged."""
    records = tmp_path / "records"
    names = [f"many.{i}" for i in range(3)]
    with ServerProcess(str(tmp_path / "data")) as server, queen_client.SyncClient(server.url) as client:
        for name in names:
            client.queue(name).configure(leaseTimeSeconds=300)  # left to expire: back in 5 minutes
            client.queue(name).push_many([f"{name}:{i}" for i in range(20)])
        worker = start_worker(flavour, server, "many", records, "--loops", "3", "--batch", "20", "--lease", "300s",
                              "--handle-s", "0.2")
        wait_for(lambda: {payload.split(":")[0] for payload, _, _ in records_of(records)} == set(names),
                 "every loop handling its batch", 60)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            raise AssertionError(f"the worker went on after SIGTERM:\n{stderr_of(worker)}") from None
        stderr = stderr_of(worker)
        assert worker.returncode == 0 and "Traceback" not in stderr, (worker.returncode, stderr)
        finished = collections.Counter(payload.split(":")[0] for payload, _, _ in records_of(records))
        for name in names:
            left = 20 - finished[name]
            assert counts(client, name) == (left, 0), name  # acked what it finished, released the rest
            again = client.queue(name).pop(batch=20, wait="1s").messages
            assert len(again) == left and {m.retry_count for m in again} == ({0} if left else set())


def test_a_sync_client_leaves_sigterm_and_ctrl_c_as_they_were_while_no_loop_runs():
    """A SyncClient made in the main thread holds the process's signal handlers (so loops in other
    threads hear them), but while none runs a signal does what it did before: Ctrl-C raises
    KeyboardInterrupt, SIGTERM ends the process; and close() puts the handlers back."""
    # What the signals did "before" is set here, not inherited: a CI runner may start the suite with
    # SIGINT ignored (a shell's background job), and a Ctrl-C that did nothing before does nothing.
    script = ("import signal, sys, time, queen_client\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
              "client = queen_client.SyncClient('http://127.0.0.1:9')\n"
              "try:\n"
              "    signal.raise_signal(signal.SIGINT)\n"
              "except KeyboardInterrupt:\n"
              "    print('KeyboardInterrupt', flush=True)\n"
              "client.close()\n"
              "print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)\n"
              "client = queen_client.SyncClient('http://127.0.0.1:9')\n"
              "print('waiting', flush=True)\n"
              "time.sleep(60)\n")
    worker = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        lines = [worker.stdout.readline() for _ in range(3)]
        if lines != ["KeyboardInterrupt\n", "True\n", "waiting\n"]:
            worker.kill()
            raise AssertionError((lines, worker.communicate(timeout=30)[1]))
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
    finally:
        worker.kill()
        worker.wait()
    assert worker.returncode == -signal.SIGTERM, (worker.returncode, stderr)


def test_an_idle_sync_worker_exits_on_ctrl_c_at_once_with_one_line(tmp_path):
    """Ctrl-C while a SyncClient worker waits in a parked pop (wait 30 s): it ends the pop and
    exits with 130 and one line, no traceback, long before the pop's wait would have run out."""
    script = ("import queen_client\n"
              "with queen_client.SyncClient(URL) as client:\n"
              "    client.queue('idle').push('first')\n"
              "    client.queue('idle').process(lambda m: print('handled', m.data, flush=True), wait='30s')\n")
    with ServerProcess(str(tmp_path / "data")) as server:
        worker = subprocess.Popen([sys.executable, "-c", f"URL = {server.url!r}\n{script}"], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert worker.stdout.readline() == "handled first\n"  # process() runs; its next pop parks
        interrupted = time.monotonic()
        worker.send_signal(signal.SIGINT)
        _, stderr = worker.communicate(timeout=30)
        exited_s = time.monotonic() - interrupted
        assert exited_s < 10, exited_s  # not the pop's 30 s
        assert worker.returncode == 130, (worker.returncode, stderr)
        assert stderr.splitlines() == ["queen: interrupted; the worker on 'idle' stopped, its leases released"]
