"""Servers for the SDK tests: one real `queen serve` subprocess per module, shared by its tests
(each test uses its own names), and a way to run one async test body under a chosen backend."""

import signal
import uuid
from contextlib import contextmanager

import pytest

from queen.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(str(tmp_path_factory.mktemp("queen") / "data")) as process:
        yield process


@pytest.fixture
def unique():
    """A fresh prefix per test, so tests sharing a server never see each other's keys and locks."""
    return "t" + uuid.uuid4().hex[:8]


@contextmanager
def paused(server: ServerProcess):
    """SIGSTOP the server (it holds its connections but answers nothing) and SIGCONT it after."""
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)
