"""A single-member etcd for tests: started on free loopback ports with its own data directory,
stopped by its pid. Tests that need it skip with one loud line when etcd is not installed.

etcd 3.4 cannot serve its JSON gateway from port 0 (tests/cluster/harness/etcd.py says why), so
the ports are picked beforehand, and a start that lost one to another process is done again on
fresh ports, up to BIND_ATTEMPTS times."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from queen.testing import free_port
from tests import system_tools
from tests.cluster.harness.etcd import BIND_ATTEMPTS, log_size, lost_its_port


def require_etcd() -> str:
    return system_tools.require("etcd", "the single-member etcd tests")


class EtcdProcess:
    def __init__(self, data_dir: str, name: str = "solo"):
        self.binary = require_etcd()
        self.data_dir = data_dir
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen | None = None
        self.output_path = os.path.join(os.path.dirname(data_dir) or ".", f"{name}-etcd-output")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = 20.0) -> EtcdProcess:
        for _ in range(BIND_ATTEMPTS):
            if self._start_once(timeout_s):
                return self
            self.client_port, self.peer_port = free_port(), free_port()
        raise RuntimeError(f"etcd lost a port to another process {BIND_ATTEMPTS} times in a row; see {self.output_path}")

    def _start_once(self, timeout_s: float) -> bool:
        """True once etcd answers; False when it exited because a port was taken (it has then
        written nothing to its data directory)."""
        peer = f"http://127.0.0.1:{self.peer_port}"
        offset = log_size(self.output_path)
        output = open(self.output_path, "ab")
        self.process = subprocess.Popen(
            [self.binary, "--name", self.name, "--data-dir", self.data_dir,
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"{self.name}={peer}", "--heartbeat-interval", "100",
             "--election-timeout", "1000", "--log-level", "warn"],
            stdout=output, stderr=subprocess.STDOUT)
        output.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if lost_its_port(self.output_path, offset):
                    return False
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self.output_path}")
            try:
                request = urllib.request.Request(self.url + "/v3/kv/range", data=json.dumps({"key": "AA=="}).encode(),
                                                 method="POST")
                with urllib.request.urlopen(request, timeout=1) as answer:
                    if answer.status == 200:
                        return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)  # polling for the process to come up, not waiting for time to pass
        self.stop()
        raise RuntimeError(f"etcd did not answer within {timeout_s} s; see {self.output_path}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture
def etcd(tmp_path):
    with EtcdProcess(str(tmp_path / "etcd-data")) as process:
        yield process


@pytest.fixture(scope="module")
def etcd_module(tmp_path_factory):
    with EtcdProcess(str(tmp_path_factory.mktemp("etcd") / "etcd-data")) as process:
        yield process
