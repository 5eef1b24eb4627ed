"""A flood of idle connections against a real `queen serve` under a tight open-file limit: the log
keeps its descriptors (segments are still cut and written), new clients are still served, and
nothing has to be restarted once the flood is over."""

import os
import socket

from queen.testing import ServerProcess

OPEN_FILES_MAX = 256
FLOOD = 400  # well past what the limit allows


def put(server, key, value):
    status, body = server.request("PUT", f"/api/v1/kv/app/{key}", {"value": value, "forever": True})
    assert status == 200 and body["applied"] is True, (status, body)
    return body["version"]


def test_a_connection_flood_past_the_open_file_limit_never_fails_the_log(tmp_path):
    # The default connections_max (1024) is far above what 256 descriptors allow; tiny segments
    # make the writer open new files while the flood holds every connection it can.
    server = ServerProcess(str(tmp_path / "data"), "--segment-bytes-max", "2048", open_files_max=OPEN_FILES_MAX)
    with server:
        assert "event=connections_capped" in server.log_text()
        flood = []
        try:
            for _ in range(FLOOD):
                flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            versions = [put(server, f"during{i}", os.urandom(300).hex()) for i in range(40)]  # each a fresh connection
        finally:
            for sock in flood:
                sock.close()
        versions += [put(server, f"after{i}", i) for i in range(5)]
        assert versions == sorted(versions)
        status, health = server.request("GET", "/healthz")
        assert (status, health) == (200, {"status": "ok"})
        log = server.log_text()
        assert "event=wal_failed" not in log
        assert log.count("event=segment_cut ") >= 3, "the writer must have opened new segments during the flood"
