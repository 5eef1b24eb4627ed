"""`queen serve --port 0 --port-file FILE`: the server takes a free port itself and says which, in
its start line and in the port file (written whole once it listens, removed at a clean exit), so
nothing that starts a server has to pick a port first and hope it stays free."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from queen.cli.serve import EXIT_FAILED
from queen.runtime import port_file
from queen.testing import open_server, parse_logfmt


def wait_for_file(path: str, process: subprocess.Popen, timeout_s: float = 30.0) -> dict:
    """Poll for the port file the real process writes once it listens."""
    deadline = time.monotonic() + timeout_s
    while (ports := port_file.read(path)) is None:
        assert process.poll() is None, f"the server exited with {process.returncode}"
        assert time.monotonic() < deadline, f"no {path} within {timeout_s} s"
        time.sleep(0.02)  # polling a real process
    return ports


def test_port_zero_binds_a_free_port_named_in_the_port_file_and_the_start_line(tmp_path):
    path = str(tmp_path / "queen.port")
    log_path = tmp_path / "serve.log"
    env = dict(os.environ, QUEEN_PORT_FILE=path)  # the variable, as a unit file would set it
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "queen", "serve", "--port", "0", "--data-dir",
                                    str(tmp_path / "data")], stderr=log, env=env)
    try:
        ports = wait_for_file(path, process)
        assert list(ports) == ["port"] and 0 < ports["port"] <= 65535
        [start_line] = [parse_logfmt(line) for line in log_path.read_text().splitlines() if "event=listening" in line]
        assert int(start_line["port"]) == ports["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['port']}/healthz", timeout=10) as answer:
            assert answer.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    assert not os.path.exists(path), "a clean exit removes the port file"
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")], "no temporary file is left"


def test_the_file_is_one_line_of_json_replaced_whole(tmp_path):
    path = str(tmp_path / "p")
    with open(path, "w") as f:
        f.write("stale")
    port_file.write(path, 41234, 41235)
    with open(path, "rb") as f:
        assert f.read() == b'{"port": 41234, "replicationPort": 41235}\n'
    assert port_file.read(path) == {"port": 41234, "replicationPort": 41235}
    port_file.write(path, 41236)
    with open(path) as f:
        assert json.loads(f.read()) == {"port": 41236}
    assert os.listdir(tmp_path) == ["p"], "no temporary file is left beside it"
    port_file.remove(path)
    port_file.remove(path)  # twice is harmless
    assert port_file.read(path) is None


def test_a_port_file_that_cannot_be_written_refuses_the_start_before_the_data_dir_is_made(tmp_path):
    data_dir = tmp_path / "data"
    missing = tmp_path / "no-such-dir" / "queen.port"
    done = subprocess.run([sys.executable, "-m", "queen", "serve", "--port", "0", "--data-dir", str(data_dir),
                           "--port-file", str(missing)], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_FAILED, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "event=start_failed" in line]
    assert "reason=port_file" in line and f"file={missing}" in line and "Traceback" not in done.stderr
    assert not data_dir.exists()


async def test_an_in_process_server_writes_the_port_it_bound_and_removes_the_file_at_exit(tmp_path, autojump_clock):
    path = str(tmp_path / "queen.port")
    async with open_server(tmp_path / "data", port_file=path) as server:
        assert server.port != 0
        assert port_file.read(path) == {"port": server.port}
    assert port_file.read(path) is None
