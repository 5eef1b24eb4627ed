"""No version, token, fence or id passes VERSION_MAX (2^53 - 1), the largest integer a JSON client
reads exactly.

Each test starts from a counter near the limit, constructed: a data directory whose log holds a row
and a ceiling record near it (as a server near the end of its versions leaves it, or an older build
that believed a damaged frame's claim), or a State built on a VersionCounter near it.
  - past VERSIONS_WRITABLE_MAX, every call that may write is refused whole, 507 versions_exhausted,
    before anything is applied; reads go on, across a restart too;
  - a step that takes a version past VERSION_MAX anyway (the router bypassed) reaches neither the
    log nor an answer;
  - the writer's ceiling stops at VERSION_MAX, so a server at the limit still starts;
  - a log whose versions are past VERSION_MAX is refused at start, naming why.
"""

import os
import subprocess
import sys
from functools import partial

import pytest
import trio

from queen.cli.serve import EXIT_DATA_REFUSED
from queen.config import Config
from queen.core import records as rec
from queen.core.kv import VERSION_MAX, VERSIONS_WRITABLE_MAX, VersionCounter, parse_kv_op
from queen.core.limits import Limits
from queen.core.state import Ops, State
from queen.errors import VersionsExhausted
from queen.runtime.server import Server
from queen.runtime.steps import Call, StepRunner
from queen.testing import ForgetfulDisk, HttpClient, open_server, run_inline
from queen.wal.frame import encode_frame, file_header
from queen.wal.recovery import recover
from queen.wal.segment import CEILING_BLOCK, segment_name
from queen.wal.writer import WalWriter

T0 = 1_700_000_000_000
LIMITS = Limits()


def write_log(data_dir, version: int, ceiling: int) -> None:
    """A log holding the row app/k = "before", written at `version`, after a ceiling record."""
    os.makedirs(data_dir, exist_ok=True)
    marker: list = []
    rec.ceiling(marker, ceiling)
    row: list = []
    rec.put(row, "app", "k", "before", version, version, T0, T0, 0)
    with open(os.path.join(data_dir, segment_name(1)), "wb") as f:
        f.write(file_header() + encode_frame(marker, 0, 0) + encode_frame(row, version, version))


# Every route that may write, each with a body it would otherwise accept.
WRITES = [
    ("PUT", "/api/v1/kv/app/k", {"value": "after", "forever": True}),
    ("DELETE", "/api/v1/kv/app/k", None),
    ("POST", "/api/v1/kv/app/n/incr", {"by": 1, "forever": True}),
    ("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "app", "key": "k"},
                                           {"op": "put", "ns": "app", "key": "x", "value": 1, "forever": True}]}),
    ("POST", "/api/v1/locks", {"operations": [{"op": "acquire", "name": "job", "ttlSeconds": 60, "owner": "w"}]}),
    ("POST", "/api/v1/transaction", {"kv": [{"op": "put", "ns": "app", "key": "t", "value": 1, "forever": True}]}),
    ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q", "key": "t", "delayMs": 1000,
                                                "payload": {}}]}),
    ("POST", "/api/v1/configure", {"queue": "q", "options": {"retryLimit": 2}}),
    ("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": {"n": 1}}]}),
    ("GET", "/api/v1/pop/queue/q", None),
    ("POST", "/api/v1/ack", {"partitionId": 1, "leaseId": 2, "offset": 0, "status": "completed"}),
    ("POST", "/api/v1/lease/2/extend", {"seconds": 30}),
]


async def test_past_the_writable_limit_every_write_is_refused_507_and_changes_nothing_and_reads_go_on(
        tmp_path, autojump_clock):
    data_dir = tmp_path / "data"
    write_log(data_dir, VERSIONS_WRITABLE_MAX - 3, VERSIONS_WRITABLE_MAX - 1)
    async with open_server(data_dir) as server:
        client = HttpClient(server.port)
        # Up to the limit writes go on; the one that takes a version past it is the last.
        for expected in (VERSIONS_WRITABLE_MAX, VERSIONS_WRITABLE_MAX + 1):
            status, body = await client.request("PUT", "/api/v1/kv/app/k", {"value": expected, "forever": True})
            assert (status, body["version"]) == (200, expected)
        durable, batches = server.writer.durable_version, server.writer.batches
        for method, path, body in WRITES:
            status, answer = await client.request(method, path, body)
            assert status == 507, (method, path, status, answer)
            assert answer["code"] == "versions_exhausted", (method, path)
            assert str(VERSION_MAX) in answer["error"] and "JSON" in answer["error"]
            assert answer["details"] == {"lastVersion": VERSIONS_WRITABLE_MAX + 1, "versionMax": VERSION_MAX}
        assert server.state.versions.last == VERSIONS_WRITABLE_MAX + 1, "a refusal takes no version"
        assert (server.writer.durable_version, server.writer.batches) == (durable, batches), "nor writes anything"
        status, row = await client.request("GET", "/api/v1/kv/app/k")
        assert (status, row["value"], row["version"]) == (200, VERSIONS_WRITABLE_MAX + 1, VERSIONS_WRITABLE_MAX + 1)
        assert (await client.request("GET", "/healthz"))[0] == 200
        await client.aclose()

    async with open_server(data_dir) as server:  # a restart changes none of it
        client = HttpClient(server.port)
        status, row = await client.request("GET", "/api/v1/kv/app/k")
        assert (status, row["value"]) == (200, VERSIONS_WRITABLE_MAX + 1)
        status, answer = await client.request("PUT", "/api/v1/kv/app/k", {"value": "again", "forever": True})
        assert (status, answer["code"]) == (507, "versions_exhausted")
        await client.aclose()


class StubWriter:
    def __init__(self):
        self.submitted = []
        self.stopped = None

    def submit(self, items, first_version, last_version):
        self.submitted.append((first_version, last_version))

    def when_durable(self, version, call):
        call.done.set()

    def stop(self, error):
        self.stopped = error


class FixedClock:
    def now_ms(self):
        return T0


def put_step(key):
    call = Call(1, 1)
    op = parse_kv_op({"op": "put", "ns": "app", "key": key, "value": 1, "forever": True}, 0, LIMITS)
    return call, Ops(0, [(call, 0, op)])


def test_a_step_that_takes_a_version_past_the_limit_reaches_neither_the_log_nor_an_answer():
    # The router refuses writes long before this; a step that gets by it anyway (here: sent
    # straight to the StepRunner) is the last line.
    writer = StubWriter()
    steps = StepRunner(State(1, T0, versions=VersionCounter(VERSION_MAX - 1)), writer, FixedClock())
    last_allowed, step = put_step("a")
    steps.run(step)
    assert last_allowed.error is None and last_allowed.results[0]["version"] == VERSION_MAX
    assert writer.submitted == [(VERSION_MAX, VERSION_MAX)] and writer.stopped is None

    past, step = put_step("b")
    steps.run(step)
    assert writer.submitted == [(VERSION_MAX, VERSION_MAX)], "nothing past the limit goes to the log"
    assert past.done.is_set() and past.results == [None], "no answer shows a version past it"
    assert (past.error.code, past.error.http_status) == ("versions_exhausted", 507)
    assert writer.stopped is past.error, "memory holds what the log does not: no more writes"


async def test_the_writers_ceiling_stops_at_the_limit_so_a_server_there_still_starts():
    disk = ForgetfulDisk()
    version = VERSION_MAX - 10
    writer = WalWriter("/data", disk=disk, next_segment=1, durable_version=version - 1, ceiling=version - 1,
                       segment_bytes_max=1 << 16, snapshot_wal_bytes=1 << 30, run_blocking=run_inline,
                       inline_allowed=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        row: list = []
        rec.put(row, "app", "k", 1, version, version, T0, T0, 0)
        writer.submit(row, version, version)
        waiter = Call(0, 0)
        writer.when_durable(version, waiter)
        await waiter.done.wait()
        writer.close()
    assert writer.ceiling == VERSION_MAX
    recovered = recover("/data", [].append, disk)
    assert (recovered.last_version, recovered.version_floor) == (version, VERSION_MAX)


async def test_a_log_whose_versions_went_past_the_limit_is_refused_at_start_naming_why(tmp_path):
    # What an older build left after believing a claim with bit 55 flipped: every later write
    # near 2^55.
    data_dir = tmp_path / "data"
    write_log(data_dir, (1 << 55) + 7, (1 << 55) + 7 + CEILING_BLOCK)
    before = sorted(os.listdir(data_dir))
    with pytest.raises(VersionsExhausted) as info:
        await Server(Config(port=0, data_dir=str(data_dir))).run()
    message = str(info.value)
    assert str((1 << 55) + 7) in message and str(VERSION_MAX) in message and "JSON" in message
    assert "queen kv list" in message and "empty directory" in message
    assert sorted(os.listdir(data_dir)) == sorted([*before, "LOCK"])


async def test_queen_serve_on_a_log_past_the_limit_exits_refused_saying_why_in_one_log_line(tmp_path):
    data_dir = tmp_path / "data"
    write_log(data_dir, (1 << 55) + 7, (1 << 55) + 7 + CEILING_BLOCK)
    process = await trio.to_thread.run_sync(partial(
        subprocess.run, [sys.executable, "-m", "queen", "serve", "--port", "0", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60))
    assert process.returncode == EXIT_DATA_REFUSED
    [line] = [line for line in process.stderr.splitlines() if "event=start_failed" in line]
    assert "reason=versions_exhausted" in line and str(VERSION_MAX) in line
