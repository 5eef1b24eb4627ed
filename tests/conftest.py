"""Fixtures shared by the runtime tests."""

from functools import partial

import pytest

from queen.testing import open_server


@pytest.fixture
def serve():
    """`async with serve(tmp_path / "data", segment_bytes_max=...) as server:` runs a real Server
    (recovery, writer, actors, HTTP on server.port) inside the test's trio run.

    Unlike open_server's default, disk work runs on the production disk thread, so the durability
    tests exercise the writer's real concurrency (commits overlapping snapshots and request
    handling). That thread looks idle to autojump_clock, so pair this with the frozen mock_clock
    fixture instead: no tick or timeout then depends on the machine's speed."""
    return partial(open_server, disk_inline=False)
