"""The client half of the `queen` command against a real server: kv and lock subcommands, and
`queen run-locked` as a flock(1) across processes. Every wait here is on a real process (a command
starting or ending, a server dying) or on a real lease of 1 s."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from queen.testing import ServerProcess

QUEEN = [sys.executable, "-m", "queen"]
EXIT_HELD = 75


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(str(tmp_path_factory.mktemp("queen") / "data")) as process:
        yield process


def queen(server, *args, stdin=None):
    env = dict(os.environ, QUEEN_URL=server.url)
    return subprocess.run([*QUEEN, *args], env=env, capture_output=True, text=True, input=stdin, timeout=60)


def start(server, *args, env=None):
    return subprocess.Popen([*QUEEN, *args], env=dict(os.environ, QUEEN_URL=server.url, **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout_s=20.0):
    """Poll a real process's visible effect (a file, an exit); not a wait for time to pass."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for a process"
        time.sleep(0.02)


def lines(path):
    return open(path).read().split() if os.path.exists(path) else []


# -- kv --------------------------------------------------------------------------------------------


def test_kv_commands_print_for_people_and_json_for_scripts(server):
    assert queen(server, "kv", "put", "cli", "greeting", "hello", "--ttl", "1h").returncode == 0
    got = queen(server, "kv", "get", "cli", "greeting")
    assert got.returncode == 0 and got.stdout == "hello\n"
    item = json.loads(queen(server, "kv", "get", "cli", "greeting", "--json").stdout)
    assert item["found"] and item["value"] == "hello" and item["expiresAt"] > 0
    missing = queen(server, "kv", "get", "cli", "nope")
    assert missing.returncode == 1 and "not found" in missing.stderr
    put = json.loads(queen(server, "kv", "put", "cli", "config", '{"retries": 3}', "--forever", "--json").stdout)
    assert put["applied"] and json.loads(queen(server, "kv", "get", "cli", "config").stdout) == {"retries": 3}
    stale = queen(server, "kv", "put", "cli", "config", "4", "--forever", "--expect", str(put["version"] - 1))
    assert stale.returncode == 1 and "version" in stale.stderr
    assert queen(server, "kv", "put", "cli", "raw", "-", "--string", "--ttl", "60", stdin="42").returncode == 0
    assert json.loads(queen(server, "kv", "get", "cli", "raw", "--json").stdout)["value"] == "42"
    assert queen(server, "kv", "incr", "cli", "n", "--max", "2", "--by", "2", "--ttl", "1m").stdout == "2\n"
    assert queen(server, "kv", "incr", "cli", "n", "--max", "2", "--ttl", "1m").returncode == 1
    listed = [json.loads(line) for line in queen(server, "kv", "list", "cli", "--json").stdout.splitlines()]
    assert [entry["key"] for entry in listed] == ["config", "greeting", "n", "raw"]
    assert queen(server, "kv", "list", "cli", "--prefix", "g").stdout.startswith("greeting\t")
    assert queen(server, "kv", "delete", "cli", "greeting").returncode == 0
    assert queen(server, "kv", "delete", "cli", "greeting").returncode == 1


def test_a_value_that_begins_like_json_but_is_not_is_refused_unless_string(server):
    for argv in (("kv", "put", "typo", "typo", '{"a":', "--ttl", "1m"),
                 ("queue", "push", "typo-jobs", '["a", "b"'),
                 ("timer", "schedule", "typo-jobs", "t", '"unterminated', "--in", "1h")):
        refused = queen(server, *argv)
        assert refused.returncode == 2 and "begins like JSON" in refused.stderr and "--string" in refused.stderr, argv
    assert queen(server, "kv", "put", "typo", "typo", "-", "--ttl", "1m", stdin='{"a":').returncode == 2
    assert queen(server, "kv", "get", "typo", "typo").returncode == 1  # nothing was written
    assert queen(server, "queue", "pop", "typo-jobs").returncode == 1
    assert queen(server, "timer", "get", "typo-jobs", "t").returncode == 1
    assert queen(server, "kv", "put", "typo", "typo", '{"a":', "--ttl", "1m", "--string").returncode == 0
    assert json.loads(queen(server, "kv", "get", "typo", "typo", "--json").stdout)["value"] == '{"a":'
    for text in ("hello world", "1.2.3", "2026-12-01"):  # text that does not begin like JSON stays a string
        assert queen(server, "kv", "put", "typo", "text", text, "--ttl", "1m").returncode == 0
        assert json.loads(queen(server, "kv", "get", "typo", "text", "--json").stdout)["value"] == text


def test_errors_have_their_own_exit_codes(server):
    rejected = queen(server, "kv", "put", "queen-locks", "x", "1", "--ttl", "60")
    assert rejected.returncode == 65 and "reserved_namespace" in rejected.stderr
    assert queen(server, "kv", "put", "cli", "x", "1").returncode == 2  # no lifetime: usage
    unreachable = queen(server, "kv", "put", "cli", "x", "1", "--ttl", "5", "--url", "http://127.0.0.1:1")
    assert unreachable.returncode == 69


# -- lock ------------------------------------------------------------------------------------------


def test_lock_commands_acquire_renew_release_and_show_status(server):
    acquired = json.loads(queen(server, "lock", "acquire", "nightly", "--ttl", "30s", "--owner", "cron-7", "--json").stdout)
    assert acquired["acquired"] and acquired["owner"] == "cron-7"
    held = queen(server, "lock", "acquire", "nightly", "--ttl", "30s")
    assert held.returncode == EXIT_HELD and "cron-7" in held.stderr
    renewed = json.loads(queen(server, "lock", "renew", "nightly", "--token", str(acquired["token"]), "--ttl", "30s", "--json").stdout)
    assert renewed["renewed"] and renewed["token"] > acquired["token"]
    status = json.loads(queen(server, "lock", "status", "nightly", "--json").stdout)
    [holder] = status["holders"]
    assert status["held"] and holder["owner"] == "cron-7" and holder["token"] == renewed["token"]
    assert holder["fence"] == acquired["token"]
    assert holder["since"] <= holder["renewedAt"] < holder["expiresAt"]
    human = queen(server, "lock", "status", "nightly").stdout
    assert "owner cron-7" in human and "since " in human and "renewed " in human and "expires " in human
    stale = queen(server, "lock", "release", "nightly", "--token", str(acquired["token"]))
    assert stale.returncode == 1 and "lost" in stale.stderr
    assert queen(server, "lock", "release", "nightly", "--token", str(renewed["token"])).returncode == 0
    assert json.loads(queen(server, "lock", "status", "nightly", "--json").stdout) == {"name": "nightly", "held": False, "holders": []}


# -- run-locked ------------------------------------------------------------------------------------


JOB = textwrap.dedent("""
    import os, sys, time
    log, gate = sys.argv[1], sys.argv[2]
    me = os.environ["QUEEN_LOCK_FENCE"]
    with open(log, "a") as f: f.write(f"start:{me}\\n")
    while not os.path.exists(gate): time.sleep(0.01)
    with open(log, "a") as f: f.write(f"end:{me}\\n")
""")


def test_run_locked_exports_the_lock_and_exits_with_the_commands_status(server):
    done = queen(server, "run-locked", "env-job", "--ttl", "30s", "--", sys.executable, "-c",
                 "import os, sys; print(os.environ['QUEEN_LOCK_TOKEN'], os.environ['QUEEN_LOCK_FENCE']); sys.exit(3)")
    token, fence = done.stdout.split()
    assert done.returncode == 3 and token == fence and int(token) > 0
    killed = queen(server, "run-locked", "env-job", "--ttl", "30s", "--", sys.executable, "-c",
                   "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == 128 + signal.SIGKILL
    assert json.loads(queen(server, "lock", "status", "env-job", "--json").stdout)["holders"] == []  # released


def test_two_run_locked_started_together_run_the_command_once_the_other_exits_75(server, tmp_path):
    log, gate = tmp_path / "log", tmp_path / "gate"
    job = ["run-locked", "together", "--ttl", "30s", "--", sys.executable, "-c", JOB, str(log), str(gate)]
    first, second = start(server, *job), start(server, *job)
    wait_for(lambda: first.poll() is not None or second.poll() is not None)
    loser, winner = (first, second) if first.poll() is not None else (second, first)
    assert loser.returncode == EXIT_HELD and "held" in loser.stderr.read()
    wait_for(lambda: len(lines(log)) == 1)  # the winner's command started, and only it
    gate.touch()
    assert winner.wait(20) == 0
    assert [line.split(":")[0] for line in lines(log)] == ["start", "end"]


def test_run_locked_with_wait_runs_after_the_holder_never_alongside(server, tmp_path):
    log, gate = tmp_path / "log", tmp_path / "gate"
    job = ["run-locked", "queued", "--ttl", "30s", "--wait", "30s", "--", sys.executable, "-c", JOB, str(log), str(gate)]
    first, second = start(server, *job), start(server, *job)
    wait_for(lambda: len(lines(log)) >= 1)
    assert first.poll() is None and second.poll() is None  # one runs, the other waits its turn
    gate.touch()
    assert first.wait(20) == 0 and second.wait(20) == 0
    entries = lines(log)
    assert [e.split(":")[0] for e in entries] == ["start", "end", "start", "end"]
    assert entries[0].split(":")[1] == entries[1].split(":")[1] != entries[2].split(":")[1]


def test_killing_the_server_stops_the_command_within_the_lifetime(tmp_path):
    """A real lease of 1 s: the server is SIGKILLed under a running command; run-locked must stop
    the command (SIGTERM) within the lifetime, on its own clock."""
    started, terminated = tmp_path / "started", tmp_path / "terminated"
    child = textwrap.dedent(f"""
        import signal, sys, time
        def stop(signum, frame):
            open({str(terminated)!r}, "w").write(repr(time.time()))
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open({str(started)!r}, "w").write("up")
        while True: time.sleep(0.01)
    """)
    with ServerProcess(str(tmp_path / "data")) as dying:
        runner = start(dying, "run-locked", "doomed", "--ttl", "1s", "--", sys.executable, "-c", child)
        wait_for(started.exists)
        killed_at = time.time()
        dying.kill()
        status = runner.wait(20)
    stopped_at = float(terminated.read_text())
    assert stopped_at - killed_at <= 1.0 + 0.5  # the lifetime, plus process scheduling
    assert status == 1  # the command exited 0 after losing the lock: not reported as success
    assert "lost the lock 'doomed' (expired)" in runner.stderr.read()


CRON = textwrap.dedent("""
    import os, sys
    import queen_client

    period, log = sys.argv[1], sys.argv[2]
    with queen_client.SyncClient() as client:
        lock = client.lock("nightly-report", ttl="30s")
        try:
            with lock.hold():
                if client.kv.get("cron", f"nightly-report:{period}").found:
                    sys.exit(0)  # another replica already ran this period
                with open(log, "a") as f:
                    f.write(f"{period}:{os.getpid()}\\n")
                client.transaction().guard(lock).kv.put("cron", f"nightly-report:{period}", "done", ttl="7d").commit()
        except queen_client.LockNotAcquired:
            pass  # another replica is running it right now
""")


def test_three_cron_replicas_produce_exactly_one_run_per_period(server, tmp_path):
    script, log = tmp_path / "cron.py", tmp_path / "runs"
    script.write_text(CRON)
    periods = ["2026-11-27", "2026-11-28", "2026-11-29"]
    for period in periods:  # the test is the cron daemon of three machines, firing each period
        env = dict(os.environ, QUEEN_URL=server.url)
        replicas = [subprocess.Popen([sys.executable, str(script), period, str(log)], env=env) for _ in range(3)]
        assert [r.wait(60) for r in replicas] == [0, 0, 0]
    runs = [line.split(":")[0] for line in lines(log)]
    assert sorted(runs) == periods


# -- queues ------------------------------------------------------------------------------------------


def test_queue_commands_configure_push_pop_ack_list_and_dlq(server):
    configured = queen(server, "queue", "configure", "cli-orders", "--lease-time", "1m", "--retry-limit", "0", "--json")
    assert configured.returncode == 0 and json.loads(configured.stdout)["options"]["leaseTimeSeconds"] == 60
    assert json.loads(configured.stdout)["options"]["dlqAfterMaxRetries"] is True  # a boolean, not 1
    assert "dlqAfterMaxRetries true" in queen(server, "queue", "configure", "cli-orders").stdout.splitlines()
    pushed = queen(server, "queue", "push", "cli-orders", '{"orderId": 1}', "--partition", "c-42", "--transaction-id", "o-1")
    assert pushed.returncode == 0 and pushed.stdout.startswith("queued c-42 offset 0")
    again = queen(server, "queue", "push", "cli-orders", '{"orderId": 1}', "--partition", "c-42", "--transaction-id", "o-1")
    assert again.stdout.startswith("duplicate c-42 offset 0")
    popped = queen(server, "queue", "pop", "cli-orders", "--json")
    delivery = json.loads(popped.stdout)
    assert popped.returncode == 0 and delivery["messages"][0]["data"] == {"orderId": 1}
    message = delivery["messages"][0]
    assert queen(server, "queue", "pop", "cli-orders").returncode == 1  # leased: nothing to deliver
    failed = queen(server, "queue", "ack", "cli-orders", "--lease", str(delivery["leaseId"]),
                   "--partition-id", str(message["partitionId"]), "--offset", "0", "--status", "failed", "--error", "nope")
    assert failed.returncode == 0 and failed.stdout.strip() == "moved to the DLQ"  # retry limit 0
    lost = queen(server, "queue", "ack", "cli-orders", "--lease", str(delivery["leaseId"]),
                 "--partition-id", str(message["partitionId"]), "--offset", "0")
    assert lost.returncode == 1 and "lease_lost" in lost.stderr
    listed = [json.loads(line) for line in queen(server, "queue", "list", "--prefix", "cli-", "--json").stdout.splitlines()]
    assert [(row["queue"], row["dlq"]) for row in listed] == [("cli-orders", 1)]
    dlq = queen(server, "queue", "dlq", "cli-orders")
    assert dlq.returncode == 0 and "\tnope\t" in dlq.stdout
    assert queen(server, "queue", "dlq", "cli-orders", "--requeue").stdout.strip() == "requeued 1"
    assert json.loads(queen(server, "queue", "pop", "cli-orders", "--auto-ack", "--json").stdout)["messages"][0]["offset"] == 0
    assert queen(server, "queue", "push", "queen-reserved", "1").returncode == 65


def test_queue_pop_puts_the_lease_on_stderr_for_people_and_only_json_on_stdout_with_json(server):
    for partition in ("a", "b"):
        assert queen(server, "queue", "push", "pop-jobs", f'"{partition}"', "--partition", partition).returncode == 0
    scripted = queen(server, "queue", "pop", "pop-jobs", "--json")
    assert scripted.returncode == 0 and scripted.stderr == ""
    delivery = json.loads(scripted.stdout)
    assert delivery["leaseId"] > 0 and [m["data"] for m in delivery["messages"]] in (["a"], ["b"])
    person = queen(server, "queue", "pop", "pop-jobs")
    assert person.returncode == 0 and person.stdout.count("\n") == 1
    assert person.stderr.startswith("lease ") and "queen queue ack pop-jobs --lease " in person.stderr
    empty = queen(server, "queue", "pop", "pop-jobs", "--json")
    assert (empty.returncode, empty.stderr, json.loads(empty.stdout)["messages"]) == (1, "", [])
    helptext = " ".join(queen(server, "queue", "pop", "--help").stdout.split())
    assert "on stderr the lease id" in helptext and "With --json: one JSON object on stdout" in helptext
    assert "nothing on stderr but warnings and errors" in helptext


def test_a_pop_that_delivers_nothing_says_why(server):
    """The broker answers "empty" alike for a queue with nothing pending and for one whose pending
    messages sit in a partition another consumer holds; the command tells the two apart."""
    assert queen(server, "queue", "push", "cli-held-q", "1", "--partition", "p").returncode == 0
    assert queen(server, "queue", "push", "cli-held-q", "2", "--partition", "p").returncode == 0
    assert queen(server, "queue", "pop", "cli-held-q").returncode == 0  # takes offset 0; offset 1 waits behind it
    held = queen(server, "queue", "pop", "cli-held-q")
    assert held.returncode == 1
    assert held.stderr == ("queen: nothing to deliver now: 1 message(s) pending for group __QUEUE_MODE__, none of "
                           "them deliverable now: they are in partitions leased to other consumers (1 in flight) or "
                           "wait out a delay or a retry backoff\n")
    named = queen(server, "queue", "pop", "cli-held-q", "--partition", "p")
    assert named.returncode == 1 and "partition p is leased to another consumer of group __QUEUE_MODE__" in named.stderr
    nothing = queen(server, "queue", "pop", "cli-empty-q")
    assert nothing.returncode == 1
    assert nothing.stderr == "queen: nothing to deliver now: no message is pending for group __QUEUE_MODE__\n"
    scripted = queen(server, "queue", "pop", "cli-held-q", "--json")  # a script reads the reason itself
    assert scripted.returncode == 1 and scripted.stderr == "" and json.loads(scripted.stdout)["reason"] == "empty"


def test_timer_commands_schedule_move_get_list_cancel_and_fire(server):
    scheduled = queen(server, "timer", "schedule", "cli-timers", "order-42:timeout", '{"orderId": 42}', "--in", "15m",
                      "--partition", "c-42")
    assert scheduled.returncode == 0 and scheduled.stdout.startswith("scheduled cli-timers/order-42:timeout at ")
    moved = queen(server, "timer", "schedule", "cli-timers", "order-42:timeout", '{"orderId": 42}',
                  "--at", "2099-01-01T00:00:00Z", "--json")
    assert moved.returncode == 65 and "at_too_far" in moved.stderr  # more than 365 days ahead: refused
    moved = queen(server, "timer", "schedule", "cli-timers", "order-42:timeout", "later", "--in", "1h", "--json")
    assert moved.returncode == 0 and json.loads(moved.stdout)["replaced"] is True
    got = queen(server, "timer", "get", "cli-timers", "order-42:timeout")
    assert got.returncode == 0 and got.stdout.splitlines()[1] == "later" and "\tpartition Default" in got.stdout
    queen(server, "timer", "schedule", "cli-timers", "other", "1", "--in", "2h")
    listed = [json.loads(line) for line in queen(server, "timer", "list", "cli-timers", "--json").stdout.splitlines()]
    assert [row["key"] for row in listed] == ["order-42:timeout", "other"] and "payload" not in listed[0]
    assert queen(server, "timer", "list", "cli-timers", "--prefix", "oth").stdout.startswith("other\tat ")
    assert queen(server, "timer", "cancel", "cli-timers", "other").returncode == 0
    gone = queen(server, "timer", "cancel", "cli-timers", "other")
    assert gone.returncode == 1 and "not pending" in gone.stderr
    assert queen(server, "timer", "get", "cli-timers", "other").returncode == 1
    assert queen(server, "timer", "schedule", "cli-timers", "k", "1", "--at", "2026-12-01T09:00:00").returncode == 2
    assert queen(server, "timer", "schedule", "cli-timers", "k", "1").returncode == 2  # --in or --at is required
    too_far = queen(server, "timer", "schedule", "cli-timers", "k", "1", "--in", "366d")
    assert too_far.returncode == 2 and "--in 366d" in too_far.stderr
    fired = queen(server, "timer", "schedule", "cli-timers", "now", "ding", "--in", "0s", "--partition", "p")
    assert fired.returncode == 0
    popped = queen(server, "queue", "pop", "cli-timers", "--partition", "p", "--wait", "5s", "--auto-ack")
    assert popped.returncode == 0 and popped.stdout.split("\t")[2].strip() == "ding"


def test_timer_schedule_recurring_with_cron_or_every(server):
    daily = queen(server, "timer", "schedule", "cli-recurring", "daily", '{"report": 1}', "--cron", "0 9 * * 1-5",
                  "--timezone", "Europe/Berlin")
    assert daily.returncode == 0 and daily.stdout.rstrip().endswith(", then cron 0 9 * * 1-5 (Europe/Berlin)")
    beat = queen(server, "timer", "schedule", "cli-recurring", "beat", "1", "--every", "30s", "--in", "5m", "--json")
    assert beat.returncode == 0 and json.loads(beat.stdout)["everyMs"] == 30_000
    got = queen(server, "timer", "get", "cli-recurring", "daily")
    assert got.returncode == 0 and got.stdout.splitlines()[0].endswith("\tcron 0 9 * * 1-5 (Europe/Berlin)")
    listed = [json.loads(line) for line in queen(server, "timer", "list", "cli-recurring", "--json").stdout.splitlines()]
    assert [(row["key"], row.get("everyMs"), row.get("cron")) for row in listed] == [
        ("beat", 30_000, None), ("daily", None, "0 9 * * 1-5")]
    assert queen(server, "timer", "list", "cli-recurring").stdout.splitlines()[0].endswith("\tevery 30s")
    for usage in (("--cron", "* * * * *", "--in", "1m"), ("--every", "1m", "--timezone", "UTC"), ("--every", "500ms"),
                  ("--cron", "* * * * *", "--every", "1m")):
        assert queen(server, "timer", "schedule", "cli-recurring", "k", "1", *usage).returncode == 2, usage
    for refused, code in ((("--cron", "0 9 *"), "invalid_cron"),
                          (("--cron", "0 9 * * *", "--timezone", "Europe/Atlantis"), "unknown_timezone")):
        answer = queen(server, "timer", "schedule", "cli-recurring", "k", "1", *refused)
        assert answer.returncode == 65 and code in answer.stderr, answer.stderr


@pytest.mark.parametrize("inner, status", [
    (KeyboardInterrupt(), 130),  # a Ctrl-C that lands while a nursery's task opens the connection
    ("bad-request", 65),
    (ValueError("--wait 2m: too long"), 2),
])
def test_an_error_a_nursery_wrapped_in_a_group_gets_its_own_exit_status(inner, status, capsys):
    import argparse

    from queen.cli.output import run
    from queen_client.errors import BadRequestError

    if inner == "bad-request":
        inner = BadRequestError(400, "invalid_ttl", "ttlSeconds must be a whole number")

    async def handler(args):
        raise BaseExceptionGroup("from a nursery", [BaseExceptionGroup("nested", [inner])])

    assert run(argparse.Namespace(handler=handler)) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err


def test_a_group_of_several_errors_is_not_hidden():
    import argparse

    from queen.cli.output import run

    async def handler(args):
        raise ExceptionGroup("two tasks failed", [ValueError("a"), RuntimeError("b")])

    with pytest.raises(ExceptionGroup):
        run(argparse.Namespace(handler=handler))
