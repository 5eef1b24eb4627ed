"""`queen serve`'s exit statuses for the two refusals a restart cannot cure, each with its one log
line: a data directory another server holds (5) and a log recovery refuses (4, what `queen check`
answers for the same directory). A service manager stops retrying on these (ops/queen.service).
And a start on a port another process holds (1), which leaves the data directory as it was."""

import socket
import subprocess
import sys
from functools import partial

import pytest
import trio

from queen.cli import main
from queen.cli.check import EXIT_REFUSED
from queen.cli.serve import EXIT_DATA_DIR_IN_USE, EXIT_DATA_REFUSED, EXIT_FAILED, EXIT_USAGE
from queen.testing import ServerProcess
from tests.wal.test_recovery import flip_byte, frame_spans, segment_path, write_frames


def serve_once(data_dir) -> subprocess.CompletedProcess:
    # A real timeout: if the server wrongly started it would serve forever.
    return subprocess.run([sys.executable, "-m", "queen", "serve", "--port", "0", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60)


def start_failed_line(process: subprocess.CompletedProcess) -> str:
    [line] = [line for line in process.stderr.splitlines() if "event=start_failed" in line]
    assert "Traceback" not in process.stderr
    return line


def test_the_codes_are_distinct_and_clear_of_failure_and_usage():
    assert len({EXIT_FAILED, EXIT_USAGE, EXIT_DATA_REFUSED, EXIT_DATA_DIR_IN_USE}) == 4
    assert (EXIT_FAILED, EXIT_USAGE) == (1, 2)
    assert EXIT_DATA_REFUSED == EXIT_REFUSED


def test_a_second_server_on_the_same_data_dir_exits_in_use(tmp_path):
    data_dir = tmp_path / "data"
    first = ServerProcess(str(data_dir)).start()
    try:
        second = serve_once(data_dir)
        assert first.request("GET", "/healthz")[0] == 200  # the first is untouched
    finally:
        assert first.stop() == 0
    assert second.returncode == EXIT_DATA_DIR_IN_USE
    line = start_failed_line(second)
    assert "reason=data_dir_in_use" in line and str(data_dir) in line


async def test_a_damaged_frame_before_the_last_exits_refused_as_check_says(tmp_path, serve, capsys, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server)
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[1]
    flip_byte(path, (start + end) // 2)  # acknowledged, and a valid frame follows: not a torn tail

    assert main(["check", "--data-dir", str(data_dir)]) == EXIT_REFUSED
    capsys.readouterr()
    process = await trio.to_thread.run_sync(partial(serve_once, data_dir))
    assert process.returncode == EXIT_DATA_REFUSED
    line = start_failed_line(process)
    assert "reason=corrupt_log" in line and path in line and f"offset {start}" in line


def data_dir_contents(data_dir) -> dict | None:
    """{relative path: (size, bytes)} of every file under data_dir; None when it does not exist."""
    if not data_dir.exists():
        return None
    return {str(path.relative_to(data_dir)): (path.stat().st_size, path.read_bytes())
            for path in sorted(data_dir.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("before,busy", [("absent", "http"), ("in use before", "http"), ("absent", "replication")])
def test_a_start_on_a_busy_port_leaves_the_data_dir_as_it_found_it(tmp_path, before, busy):
    data_dir = tmp_path / "data"
    if before == "in use before":
        server = ServerProcess(str(data_dir)).start()
        assert server.request("PUT", "/api/v1/kv/app/k", {"value": 1, "forever": True})[0] == 200
        assert server.stop() == 0
    found = data_dir_contents(data_dir)
    with socket.socket() as holder:  # another process's listener on the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        if busy == "http":
            flags = ["--port", str(port)]
        else:  # a cluster node's replication port; refused before it ever dials etcd
            flags = ["--port", "0", "--cluster", "t", "--node", "n1", "--etcd", "http://127.0.0.1:9",
                     "--advertise", "http://127.0.0.1:0", "--replication-listen", f"127.0.0.1:{port}"]
        done = subprocess.run([sys.executable, "-m", "queen", "serve", *flags, "--data-dir", str(data_dir)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_FAILED, done.stderr
    line = start_failed_line(done)
    assert "reason=address_in_use" in line and f"port={port}" in line and "--port 0 picks a free" in line
    assert data_dir_contents(data_dir) == found, "the failed start changed the data directory"
