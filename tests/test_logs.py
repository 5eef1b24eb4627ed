"""The server's log lines are logfmt (or JSON with --log-format json): a strict parser reads every
line a real server writes through a start, requests, a failed reload, an internal error's
traceback and a shutdown, and the values come back as they were."""

import http.client
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter

import pytest

from queen.auth import AuthFile
from queen.logs import LineFormatter
from queen.testing import ServerProcess, parse_logfmt


def record(message, *args, exc_info=None):
    return logging.LogRecord("queen.test", logging.ERROR, __file__, 1, message, args, exc_info)


@pytest.mark.parametrize("kind", ["logfmt", "json"])
def test_values_with_spaces_quotes_newlines_and_equals_come_back_whole(kind):
    formatter = LineFormatter(kind)
    awkward = 'a "quoted" word=x\nsecond line \\ and é'
    try:
        raise ValueError("boom\nwith two lines")
    except ValueError:
        exc_info = sys.exc_info()
    lines = [formatter.format(record("event=probe detail=%r n=%d hint='say \"no\"' path=%s", awkward, 7, "/a b/c")),
             formatter.format(record("event=failed", exc_info=exc_info)),
             formatter.format(record("a foreign message, not pairs: %d%% done", 50))]
    for line in lines:
        assert "\n" not in line
    parse = json.loads if kind == "json" else parse_logfmt
    first, failed, foreign = (parse(line) for line in lines)
    assert first["detail"] == awkward and first["n"] == "7" and first["hint"] == 'say "no"'
    assert first["path"] == "/a b/c" and first["event"] == "probe" and first["logger"] == "queen.test"
    assert failed["exc"].startswith("Traceback") and "boom\nwith two lines" in failed["exc"]
    assert foreign["msg"] == "a foreign message, not pairs: 50% done"


@pytest.mark.parametrize("kind", ["logfmt", "json"])
def test_every_line_of_a_real_server_parses(tmp_path, kind):
    path = str(tmp_path / "auth.json")
    auth_file = AuthFile.load(path, missing_ok=True)
    secret = auth_file.add("ops", "admin", "*")
    auth_file.save()
    headers = {"authorization": f"Bearer {secret}"}
    with ServerProcess(str(tmp_path / "data"), "--auth-file", path, "--log-format", kind, "--log-level", "debug",
                       "--access-log") as server:
        assert server.request("PUT", "/api/v1/kv/app/k", {"value": "two words", "forever": True}, headers)[0] == 200
        assert server.request("DELETE", "/api/v1/resources/queues/q%20x", None, headers)[0] in (200, 400, 404)
        assert server.request("POST", "/api/v1/pause", {"kv": True}, headers)[0] == 200
        assert server.request("POST", "/api/v1/resume", {"kv": True}, headers)[0] == 200
        with open(path, "w") as f:
            f.write("{not json")
        server.process.send_signal(signal.SIGHUP)  # fails: an error line with a quoted detail
        deadline = time.monotonic() + 20
        while "reload_failed" not in server.log_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)  # waiting on the real process, not on time to pass
        assert server.stop() == 0
        lines = [line for line in server.log_text().splitlines() if line]
    parse = json.loads if kind == "json" else parse_logfmt
    parsed = [parse(line) for line in lines]
    events = {fields.get("event") for fields in parsed}
    assert {"recovered", "listening", "audit", "access", "reload_failed", "shutdown_complete"} <= events
    [failed] = [fields for fields in parsed if fields.get("event") == "reload_failed"]
    assert failed["level"] == "error" and "auth file" in failed["detail"]
    assert all(fields["ts"].endswith("Z") for fields in parsed)
    assert os.path.getsize(server.stderr_path) > 0


# What a server says at info: its lifecycle and what an operator did. How the WAL tunes itself
# (where it commits) is debug: it changes with the disk's mood, not with anything done to it.
LIFECYCLE_EVENTS = {"recovered", "listening", "signal", "shutdown_started", "shutdown_complete", "segment_cut",
                    "snapshot", "audit", "reloaded"}
WAL_TUNING_EVENTS = {"wal_commits_to_thread", "wal_commits_inline"}


def test_a_short_session_s_info_lines_are_lifecycle_events_not_wal_tuning(tmp_path):
    # Small segments and snapshots, so that cutting one and taking one are in the session.
    with ServerProcess(str(tmp_path / "data"), "--segment-bytes-max", "65536", "--snapshot-wal-bytes", "65536") as server:
        def writes(worker: int):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            for n in range(100):  # several writers at once: group commits, fsyncs of every length
                value = json.dumps(os.urandom(256).hex())  # does not compress: the log grows
                body = f'{{"value": {value}, "forever": true}}'.encode()
                connection.request("PUT", f"/api/v1/kv/app/w{worker}-{n}", body=body)
                assert connection.getresponse().read()
            connection.close()

        workers = [threading.Thread(target=writes, args=(worker,)) for worker in range(6)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert server.stop() == 0
    info = Counter(fields.get("event") for fields in map(parse_logfmt, server.log_text().splitlines())
                   if fields["level"] == "info")
    assert not WAL_TUNING_EVENTS & set(info), info
    assert set(info) <= LIFECYCLE_EVENTS, info
    assert {"recovered", "listening", "segment_cut", "snapshot", "shutdown_complete"} <= set(info), info
