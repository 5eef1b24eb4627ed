"""Real-process faults the SIGKILL workloads do not cover: a disk that fills up or fails its fsync,
the wall clock stepped across a restart and while the server runs, and a client paused (SIGSTOP)
past its leases.

Promises checked, each named in the test that checks it:
  P1  no acknowledged write is lost (after a full disk, a failed write or fsync, and a restart);
  P4  a replaced holder's guarded transaction, or a consumer's ack under a lost lease, never commits;
  P5  timers never fire early (by the server's clock) and fire exactly once;
  P6  no lock or partition is handed over before its lease could have ended (clocks left alone);
  P7  bad input, here a write the disk cannot take, gets a 4xx/503 with a code and changes nothing.

Each server runs as its own process (tests/faults/sut.py, so that the test-only disk and clock
switches apply) and is stopped by the test, by its pid. Nothing sleeps for time to pass: the
tests wait on the real process (long polls, acquires with waitMs, answers).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime

import pytest

from queen.testing import ServerProcess
from tests.faults.workloads import OUTCOMES, REPO, Outcome

HOUR_MS = 3_600_000
# The wall clock of a server started with a clock offset, as its answers show it, within this of
# the host's clock plus the offset (the reading takes a round trip, and the host is shared).
CLOCK_SLACK_MS = 5_000
# Small segments: a small disk holds several, and segment cuts (new files) happen while it fills.
SEGMENT_ARGS = ("--segment-bytes-max", str(256 << 10), "--snapshot-wal-bytes", str(1 << 20))
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


class Api:
    """Requests to one server on fresh connections, counted for the suite's summary."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self.calls = 0

    def __call__(self, method: str, path: str, body=None, timeout_s: float = 30.0):
        self.calls += 1
        return self.server.request(method, path, body, timeout_s=timeout_s)

    def ok(self, method: str, path: str, body=None):
        status, answer = self(method, path, body)
        assert status == 200, (method, path, status, answer)
        return answer

    def lock(self, op: dict) -> dict:
        return self.ok("POST", "/api/v1/locks", {"operations": [op]})["results"][0]

    def timer(self, op: dict) -> dict:
        return self.ok("POST", "/api/v1/timers", {"operations": [op]})["results"][0]

    def server_now_ms(self) -> int:
        """The server's clock: a write's expiresAt less its lifetime."""
        self.ok("PUT", "/api/v1/kv/clock/probe", {"value": 0, "ttlSeconds": 60})
        return self.ok("GET", "/api/v1/kv/clock/probe")["expiresAt"] - 60_000


def sut(data_dir: str, *args: str, env: dict | None = None) -> ServerProcess:
    """A server under test (not started), with the fault suite's switches read from env."""
    return ServerProcess(data_dir, *args, module="tests.faults.sut", env={"PYTHONPATH": REPO, **(env or {})})


def host_now_ms() -> int:
    return int(time.time() * 1000)


def record(workload: str, ops: int, histories: int, promises: tuple, faults: dict, detail: str = "") -> None:
    OUTCOMES.append((Outcome(workload=workload, seed=0, ops=ops, histories=histories, faults=Counter(faults),
                             promises=promises, detail=detail), None))


# -- disk full, write and fsync errors -----------------------------------------------------------


class KvWriter:
    """Writes batches of fresh keys with incompressible values on one keep-alive connection, and
    keeps what was acknowledged (200) apart from what was refused (its outcome unknown)."""

    BATCH = 8
    VALUE_BYTES = 3000

    def __init__(self, server: ServerProcess):
        self.connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        self.acknowledged: dict[str, tuple[str, int]] = {}  # key -> (value, version)
        self.refused: dict[str, str] = {}  # key -> value
        self.calls = 0
        self.next_key = 0

    def request(self, method: str, path: str, body) -> tuple[int, dict]:
        self.calls += 1
        self.connection.request(method, path, json.dumps(body), {"content-type": "application/json"})
        response = self.connection.getresponse()
        return response.status, json.loads(response.read())

    def write_batch(self) -> tuple[int, dict]:
        batch = {}
        for _ in range(self.BATCH):
            batch[f"k{self.next_key:06d}"] = base64.b64encode(os.urandom(self.VALUE_BYTES)).decode()
            self.next_key += 1
        status, answer = self.request("POST", "/api/v1/kv", {"operations": [
            {"op": "put", "ns": "disk", "key": key, "value": value, "forever": True} for key, value in batch.items()]})
        if status == 200:
            for result, (key, value) in zip(answer["results"], batch.items(), strict=True):
                assert result["applied"] is True, result
                self.acknowledged[key] = (value, result["version"])
        else:
            self.refused.update(batch)
        return status, answer

    def until_refused(self, calls_max: int = 5000) -> dict:
        """Write until the server refuses; that refusal's answer."""
        for _ in range(calls_max):
            status, answer = self.write_batch()
            if status != 200:
                assert status == 503, (status, answer)  # never a 500: a full disk is not a bug
                return answer
        raise AssertionError(f"{calls_max} batches were all acknowledged: the disk never failed")

    def close(self) -> None:
        self.connection.close()


def assert_refusing_writes(writer: KvWriter, api: Api) -> None:
    """After a disk error every write, on any route, is refused with 503 not_durable and a message,
    and the process is alive and answering."""
    answers = [writer.write_batch() for _ in range(3)]
    answers.append(writer.request("PUT", "/api/v1/kv/disk/one-key", {"value": 1, "forever": True}))
    answers.append(writer.request("POST", "/api/v1/locks", {"operations": [
        {"op": "acquire", "name": "after-failure", "ttlSeconds": 5}]}))
    answers.append(writer.request("POST", "/api/v1/push", {"items": [{"queue": "after", "payload": 1}]}))
    for status, answer in answers:
        assert status == 503 and answer["code"] == "not_durable" and answer["error"], answer
    assert api.server.process.poll() is None
    status, health = api("GET", "/healthz")
    assert status == 503 and health["status"] == "failed", health
    assert api.server.metrics()["queen_wal_failed"] == 1
    # A read answers too, but not with data: every answer waits for the last version applied, and
    # the refused batch's versions were applied in memory and will never be durable.
    key, (value, _) = next(iter(writer.acknowledged.items()))
    status, got = api("GET", f"/api/v1/kv/disk/{key}")
    assert (status, got.get("value")) == (200, value) or (status, got["code"]) == (503, "not_durable"), got


def assert_nothing_acknowledged_lost(api: Api, acknowledged: dict, refused: dict) -> None:
    """Every acknowledged key with its value and version; a refused one absent or as it was sent."""
    keys = sorted(acknowledged) + sorted(refused)
    found = {}
    for start in range(0, len(keys), 64):
        answer = api.ok("POST", "/api/v1/kv", {"operations": [{"op": "getMany", "ns": "disk", "keys": keys[start:start + 64]}]})
        found.update({item["key"]: item for item in answer["results"][0]["items"]})
    lost = [key for key, (value, version) in acknowledged.items()
            if (found[key]["found"], found[key].get("value"), found[key].get("version")) != (True, value, version)]
    assert not lost, f"{len(lost)} acknowledged writes lost or changed, first {lost[:3]}"
    for key, value in refused.items():
        assert not found[key]["found"] or found[key]["value"] == value, key
    # And the restarted server writes again, above every version it acknowledged before.
    answer = api.ok("PUT", "/api/v1/kv/disk/after-restart", {"value": 1, "forever": True})
    assert answer["version"] > max(version for _, version in acknowledged.values())
    assert api("GET", "/healthz")[0] == 200


def test_p1_p7_a_full_tmpfs_refuses_writes_with_503_and_loses_nothing_acknowledged(tmp_path):
    """A real full disk: the data directory is a 4 MiB tmpfs. Segments are allocated ahead and a
    new one is cut every 256 KiB, so the disk fills in the middle of a segment or of a cut. Writes
    are then refused with 503 not_durable (never 500) and stay refused; the process stays up. With
    room again (remount at 64 MiB) and a restart after SIGKILL, every acknowledged write is there."""
    small = tmp_path / "small"
    small.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command on this machine: the tmpfs disk-full test needs one")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    # The data directory is the mount itself; the server's log file goes beside it, off the tmpfs.
    server = sut(str(small), *SEGMENT_ARGS)
    try:
        server.start()
        api = Api(server)
        writer = KvWriter(server)
        refusal = writer.until_refused()
        assert refusal["code"] == "not_durable" and "No space left" in refusal["details"]["cause"]
        assert len(writer.acknowledged) > 100, "the disk filled before anything could be written"
        assert_refusing_writes(writer, api)
        writer.close()
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        server.kill()
        server.start()
        assert_nothing_acknowledged_lost(api, writer.acknowledged, writer.refused)
        record("disk-full", api.calls + writer.calls, len(writer.acknowledged), ("P1", "P7"),
               {"disk_full": 1, "sigkill": 1}, detail="tmpfs of 4 MiB")
    finally:
        server.kill()
        if subprocess.run(["umount", str(small)]).returncode != 0:
            subprocess.run(["umount", "-l", str(small)])


@pytest.mark.parametrize("fault", ["write:40:ENOSPC", "fsync:40:EIO"])
def test_p1_p7_an_injected_write_or_fsync_error_refuses_writes_and_loses_nothing_acknowledged(tmp_path, fault):
    """The 41st write (ENOSPC) or fsync (EIO) of the log fails, and every one after it: the writes
    before are acknowledged, then writes are refused (503 not_durable) and stay refused. Restarted
    without the fault, the server has every acknowledged write; a refused one may or may not be
    there (after a failed fsync its frame may still have reached the file), but never changed."""
    data_dir = str(tmp_path / "data")
    server = sut(data_dir, *SEGMENT_ARGS, env={"QUEEN_FAULT_DISK": fault})
    try:
        server.start()
        api = Api(server)
        writer = KvWriter(server)
        refusal = writer.until_refused()
        assert refusal["code"] == "not_durable", refusal
        assert writer.acknowledged, "the first write already failed"
        assert_refusing_writes(writer, api)
        writer.close()
        server.kill()
        server = sut(data_dir, *SEGMENT_ARGS)  # the disk is healthy again
        server.start()
        api.server = server
        assert_nothing_acknowledged_lost(api, writer.acknowledged, writer.refused)
        record("disk-" + fault.split(":")[2].lower(), api.calls + writer.calls, len(writer.acknowledged),
               ("P1", "P7"), {fault.split(":")[0] + "_error": 1, "sigkill": 1}, detail=fault)
    finally:
        server.kill()


# -- the wall clock stepped across a restart -----------------------------------------------------


def test_p5_a_forward_clock_step_across_a_restart_counts_as_downtime(tmp_path):
    """The server restarts with its wall clock an hour ahead of where it was. Lease ends and timer
    times are wall-clock times on the server's clock, so this is decided behaviour: a forward step
    across a restart counts as downtime. A lock taken for 600 s before the restart is free after
    it, and a timer due in 30 minutes fires at once, once, and not before its time by the server's
    clock (its message's createdAt is not before its `at`)."""
    data_dir = str(tmp_path / "data")
    server = sut(data_dir).start()
    try:
        api = Api(server)
        held = api.lock({"op": "acquire", "name": "nightly", "ttlSeconds": 600, "owner": "before"})
        assert held["acquired"] is True
        timer = api.timer({"op": "schedule", "queue": "reminders", "key": "r1", "partition": "p",
                           "delayMs": 30 * 60_000, "payload": {"remind": 1}})
        server.kill()
        server = sut(data_dir, env={"QUEEN_FAULT_WALL_OFFSET_MS": str(HOUR_MS)}).start()
        api.server = server
        assert abs(api.server_now_ms() - host_now_ms() - HOUR_MS) < CLOCK_SLACK_MS, "the clock step did not apply"

        status = api.lock({"op": "get", "name": "nightly"})
        assert status["holders"] == [], status
        taken = api.lock({"op": "acquire", "name": "nightly", "ttlSeconds": 60, "owner": "after"})
        assert taken["acquired"] is True and taken["fence"] > held["fence"]
        assert taken["expiresAt"] - 60_000 >= held["expiresAt"]  # by the server's clock, its lease had ended

        started = time.monotonic()
        popped = api.ok("GET", "/api/v1/pop/queue/reminders/partition/p?waitMs=10000&autoAck=true")
        assert popped["success"] is True, popped
        assert time.monotonic() - started < 5, "a timer overdue at the start waited"
        [message] = popped["messages"]
        assert message["data"] == {"remind": 1}
        assert message["createdAt"] >= timer["at"], (message, timer)
        # Exactly once: the timer is gone and nothing more comes.
        assert api.timer({"op": "get", "queue": "reminders", "key": "r1"})["found"] is False
        again = api.ok("GET", "/api/v1/pop/queue/reminders/partition/p?waitMs=300")
        assert again["success"] is False, again
        record("clock-step-restart", api.calls, 2, ("P5",), {"sigkill": 1, "clock_step": 1}, detail="+1 h")
    finally:
        server.kill()


def test_p5_p6_a_backward_clock_step_across_a_restart_hands_over_nothing_early(tmp_path):
    """The server restarts with its wall clock an hour behind where it was: a lock taken for 600 s
    is still held with its expiresAt unchanged (a waiting acquire does not get it), and a timer due
    1 s after it was scheduled has not fired when a 1.5 s long poll returns, well past that second
    by the host's clock: on the server's clock its time has not come."""
    data_dir = str(tmp_path / "data")
    server = sut(data_dir).start()
    try:
        api = Api(server)
        held = api.lock({"op": "acquire", "name": "nightly", "ttlSeconds": 600, "owner": "before"})
        timer = api.timer({"op": "schedule", "queue": "reminders", "key": "r1", "partition": "p",
                           "delayMs": 1000, "payload": {"remind": 1}})
        server.kill()
        server = sut(data_dir, env={"QUEEN_FAULT_WALL_OFFSET_MS": str(-HOUR_MS)}).start()
        api.server = server
        assert abs(api.server_now_ms() - host_now_ms() + HOUR_MS) < CLOCK_SLACK_MS, "the clock step did not apply"

        [holder] = api.lock({"op": "get", "name": "nightly"})["holders"]
        assert (holder["owner"], holder["fence"], holder["expiresAt"]) == ("before", held["fence"], held["expiresAt"])
        waited = api.lock({"op": "acquire", "name": "nightly", "ttlSeconds": 60, "owner": "after", "waitMs": 500})
        assert waited["acquired"] is False and waited["reason"] == "timeout", waited

        popped = api.ok("GET", "/api/v1/pop/queue/reminders/partition/p?waitMs=1500")
        assert host_now_ms() > timer["at"] + 500  # by the host's clock the timer was due a while ago
        assert popped["success"] is False, popped
        pending = api.timer({"op": "get", "queue": "reminders", "key": "r1"})
        assert pending["found"] is True and pending["at"] == timer["at"]
        record("clock-step-restart", api.calls, 2, ("P5", "P6"), {"sigkill": 1, "clock_step": 1}, detail="-1 h")
    finally:
        server.kill()


# -- the wall clock stepped while the server runs (libfaketime) ----------------------------------


def last_segment_cut_wall(server: ServerProcess) -> datetime:
    """The wall-clock time (local) the server process logged its latest segment cut at."""
    lines = [line for line in server.log_text().splitlines() if "event=segment_cut " in line]
    return datetime.strptime(lines[-1].split(" level=")[0].removeprefix("ts="), "%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.parametrize("stepped_by", ["libfaketime", "sut"])
def test_p5_p6_wall_clock_steps_while_running_move_no_lease_and_no_timer(tmp_path, stepped_by):
    """The server runs with its wall clock stepped an hour ahead, then an hour behind the host's,
    with the monotonic clock left alone: under libfaketime (every clock_gettime of the process),
    and where that is not installed, by the test entry point's own step of Python's time.time. The server reads the wall clock once, at its
    start, and advances from there on the monotonic clock, so the steps move nothing it does:
    its answers' times stay on the host's clock, a 600 s lock stays held with the same expiresAt
    (a waiting acquire does not get it), a pending timer keeps its time, and a timer due in 1.5 s
    fires when it is due, not early, not an hour late. What the steps do move is the process's
    own wall clock, which its log lines' timestamps show: that is how the test knows the steps
    took effect (each forces a segment cut, which is logged)."""
    if stepped_by == "libfaketime" and not os.path.exists(FAKETIME):
        pytest.skip("libfaketime is not installed (Debian package faketime); the sut variant runs instead")
    stamp = tmp_path / "faketime"
    stamp.write_text("+0\n")
    env = {"LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"} if stepped_by == "libfaketime" else {
           "QUEEN_FAULT_WALL_STEP_FILE": str(stamp)}
    # 4 KiB segments: a 6 KiB write cuts one, and the cut is logged with the process's wall clock.
    server = sut(str(tmp_path / "data"), "--segment-bytes-max", "4096", env=env).start()
    try:
        api = Api(server)
        held = api.lock({"op": "acquire", "name": "nightly", "ttlSeconds": 600, "owner": "holder"})
        due = api.timer({"op": "schedule", "queue": "reminders", "key": "soon", "partition": "p",
                         "delayMs": 1500, "payload": "soon"})
        later = api.timer({"op": "schedule", "queue": "reminders", "key": "later", "partition": "p",
                           "delayMs": 600_000, "payload": "later"})
        for step, offset_ms in (("+1h", HOUR_MS), ("-1h", -HOUR_MS)):
            stamp.write_text(step + "\n")
            api.ok("PUT", "/api/v1/kv/clock/cut", {"value": base64.b64encode(os.urandom(6000)).decode(), "forever": True})
            logged = (last_segment_cut_wall(server) - datetime.now()).total_seconds() * 1000
            assert abs(logged - offset_ms) < CLOCK_SLACK_MS, f"libfaketime did not step the process's clock ({step})"

            assert abs(api.server_now_ms() - host_now_ms()) < CLOCK_SLACK_MS, step
            [holder] = api.lock({"op": "get", "name": "nightly"})["holders"]
            assert (holder["owner"], holder["expiresAt"]) == ("holder", held["expiresAt"]), (step, holder)
            waited = api.lock({"op": "acquire", "name": "nightly", "ttlSeconds": 60, "owner": "other", "waitMs": 300})
            assert waited["acquired"] is False and waited["reason"] == "timeout", (step, waited)
            pending = api.timer({"op": "get", "queue": "reminders", "key": "later"})
            assert pending["found"] is True and pending["at"] == later["at"], (step, pending)

        popped = api.ok("GET", "/api/v1/pop/queue/reminders/partition/p?waitMs=10000&autoAck=true")
        [message] = popped["messages"]
        assert message["data"] == "soon" and message["createdAt"] >= due["at"], (message, due)
        assert host_now_ms() >= due["at"]  # not early by the host's clock either: the two agree
        assert message["createdAt"] - due["at"] < CLOCK_SLACK_MS, "the timer fired late"
        again = api.ok("GET", "/api/v1/pop/queue/reminders/partition/p?waitMs=300")
        assert again["success"] is False, again  # once, and the later timer still waits
        record("clock-step-running", api.calls, 3, ("P5", "P6"), {"clock_step": 2}, detail=f"{stepped_by} +1 h, -1 h")
    finally:
        server.kill()


# -- a client paused past its leases ------------------------------------------------------------

PAUSED_CLIENT = '''
import http.client, json, sys

port = int(sys.argv[1])


def call(method, path, body=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, None if body is None else json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    answer = [response.status, json.loads(response.read())]
    connection.close()
    return answer


lock = call("POST", "/api/v1/locks", {"operations": [
    {"op": "acquire", "name": "report", "ttlSeconds": 1, "owner": "paused"}]})[1]["results"][0]
popped = call("GET", "/api/v1/pop/queue/jobs?waitMs=5000")[1]
ack = {"partitionId": popped["partitionId"], "leaseId": popped["leaseId"],
       "offset": popped["messages"][0]["offset"], "status": "completed"}
print(json.dumps({"lock": lock, "popped": popped, "ack": ack}), flush=True)
sys.stdin.readline()  # stopped here (SIGSTOP) past both leases; a line comes after SIGCONT


def put(key):
    return {"op": "put", "ns": "work", "key": key, "value": "from the paused client", "ttlSeconds": 600}


print(json.dumps({
    "guarded": call("POST", "/api/v1/transaction", {"kv": [lock["guard"], put("x")], "ack": [ack]}),
    "unguarded": call("POST", "/api/v1/transaction", {"kv": [put("y")], "ack": [ack]}),
    "ack": call("POST", "/api/v1/ack", ack),
}), flush=True)
'''


def test_p4_p6_a_client_stopped_past_its_leases_commits_nothing(tmp_path):
    """A client process takes a lock (1 s lease) and a message (1 s queue lease), then is stopped
    with SIGSTOP. Another client gets the lock (an acquire waiting on the server) and the message
    again (a long poll), each no earlier than the stopped one's lease ended by the server's clock
    (P6). Continued with SIGCONT, the stopped client commits its step: a transaction carrying its
    lock's guard and its ack fails kv_precondition, one with its ack and no guard fails
    lease_lost, and its ack alone answers lease_lost; nothing of them is written, and the message
    is still leased to the new consumer, whose ack goes through (P4)."""
    server = sut(str(tmp_path / "data")).start()
    script = tmp_path / "paused_client.py"
    script.write_text(PAUSED_CLIENT)
    child = None
    try:
        api = Api(server)
        api.ok("POST", "/api/v1/configure", {"queue": "jobs", "options": {"leaseTimeSeconds": 1}})
        api.ok("POST", "/api/v1/push", {"items": [{"queue": "jobs", "partition": "p", "payload": {"job": 1}}]})
        child = subprocess.Popen([sys.executable, str(script), str(server.port)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        paused = json.loads(child.stdout.readline())
        assert paused["lock"]["acquired"] is True and paused["popped"]["success"] is True, paused
        child.send_signal(signal.SIGSTOP)
        # The next consumer's lease is long enough to outlast the rest of the test.
        api.ok("POST", "/api/v1/configure", {"queue": "jobs", "options": {"leaseTimeSeconds": 60}})

        taken = api.lock({"op": "acquire", "name": "report", "ttlSeconds": 30, "owner": "successor", "waitMs": 5000})
        assert taken["acquired"] is True and taken["fence"] > paused["lock"]["fence"], taken
        assert taken["expiresAt"] - 30_000 >= paused["lock"]["expiresAt"]
        again = api.ok("GET", "/api/v1/pop/queue/jobs?waitMs=5000")
        assert again["success"] is True, again
        [message] = again["messages"]
        assert message["messageId"] == paused["popped"]["messages"][0]["messageId"] and message["retryCount"] == 1
        assert again["leaseId"] > paused["popped"]["leaseId"]
        assert again["expiresAt"] - 60_000 >= paused["popped"]["expiresAt"]

        child.send_signal(signal.SIGCONT)
        out, _ = child.communicate("go on\n", timeout=30)
        answers = json.loads(out.strip().splitlines()[-1])
        status, guarded = answers["guarded"]
        assert status == 200 and guarded["success"] is False and guarded["reason"] == "kv_precondition", guarded
        status, unguarded = answers["unguarded"]
        assert status == 200 and unguarded["success"] is False and unguarded["reason"] == "lease_lost", unguarded
        status, acked = answers["ack"]
        assert status == 200 and acked["success"] is False and acked["reason"] == "lease_lost", acked

        for key in ("x", "y"):
            assert api.ok("GET", f"/api/v1/kv/work/{key}")["found"] is False, key
        [holder] = api.lock({"op": "get", "name": "report"})["holders"]
        assert holder["owner"] == "successor"
        done = api.ok("POST", "/api/v1/ack", {"partitionId": again["partitionId"], "leaseId": again["leaseId"],
                                              "offset": message["offset"], "status": "completed"})
        assert done["success"] is True, done
        record("paused-client", api.calls + 5, 2, ("P4", "P6"), {"sigstop": 1})
    finally:
        if child is not None and child.poll() is None:
            child.kill()  # SIGKILL ends a stopped process too
            child.wait()
        server.kill()
