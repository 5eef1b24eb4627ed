"""The server's log lines are logfmt (or JSON with --log-format json): a strict parser reads every
line a real server writes through a start, requests, a failed reload, an internal error's
traceback and a shutdown, and the values come back as they were."""

import json
import logging
import os
import signal
import sys
import time

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

