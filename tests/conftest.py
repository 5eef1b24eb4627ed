"""Fixtures shared by the runtime tests."""

from contextlib import asynccontextmanager

import pytest
import trio

from queen.config import Config
from queen.runtime.server import Server


@asynccontextmanager
async def _serve(data_dir, *, disk=None, **settings):
    """An in-process Server on data_dir and a free port, shut down (flushed) on exit."""
    server = Server(Config(port=0, data_dir=str(data_dir), **settings), disk=disk)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        try:
            yield server
        finally:
            server.request_shutdown()


@pytest.fixture
def serve():
    """`async with serve(tmp_path / "data", segment_bytes_max=...) as server:` runs a real Server
    (recovery, writer, actors, HTTP on server.port) inside the test's trio run.

    Unlike queen.testing.open_server, disk work runs in worker threads as in production, so the
    durability tests exercise the writer's real concurrency (commits overlapping snapshots and
    request handling). Worker threads look idle to autojump_clock, so pair this with the frozen
    mock_clock fixture instead: no tick or timeout then depends on the machine's speed."""
    return _serve
