"""A lone client's frame is committed in its own task (queen/wal/writer.py, unhold): still one
frame and one fsync before the answer, and only while nobody else is connected, so batching of
concurrent clients is left to the writer task."""

import http.client
import json
import socket
from functools import partial

import trio

from queen.wal import writer as writer_module
from tests.wal.test_writer_faults import RecordingDisk


def puts_on_one_connection(port, keys):
    """Put each key on one keep-alive connection; each answer's version."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    versions = []
    try:
        for key in keys:
            body = json.dumps({"value": key, "forever": True}).encode()
            connection.request("PUT", f"/api/v1/kv/app/{key}", body=body, headers={"content-type": "application/json"})
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200, answer
            versions.append(answer["version"])
    finally:
        connection.close()
    return versions


async def wait_for_connections(server, count):
    with trio.fail_after(30):
        while server.http.connections != count:
            await trio.to_thread.run_sync(lambda: None)  # a real round trip: the server's tasks run


async def test_a_lone_client_commits_its_own_frames_each_fsynced_before_its_answer(
        tmp_path, serve, mock_clock, monkeypatch):
    monkeypatch.setattr(writer_module, "INLINE_FSYNC_S_MAX", 1e9)  # a slow host must not move commits to the thread
    disk = RecordingDisk()
    async with serve(tmp_path / "data", disk=disk) as server:
        writer = server.writer
        before_frames, before_by_caller = writer.batches, writer.caller_commits
        keys = [f"k{i}" for i in range(5)]
        versions = await trio.to_thread.run_sync(partial(puts_on_one_connection, server.port, keys))
        assert writer.caller_commits - before_by_caller == len(keys)
        assert writer.batches - before_frames == len(keys)  # one frame each, as the writer task would
        assert set(versions) <= disk.synced_versions()


async def test_with_another_client_connected_the_writer_task_commits(tmp_path, serve, mock_clock, monkeypatch):
    monkeypatch.setattr(writer_module, "INLINE_FSYNC_S_MAX", 1e9)
    disk = RecordingDisk()
    async with serve(tmp_path / "data", disk=disk) as server:
        writer = server.writer
        other = socket.create_connection(("127.0.0.1", server.port))  # connected, idle
        try:
            await wait_for_connections(server, 1)
            # The put's own connection makes two: its frame is the writer task's to gather.
            before_frames, before_by_caller = writer.batches, writer.caller_commits
            versions = await trio.to_thread.run_sync(partial(puts_on_one_connection, server.port, ["a", "b"]))
            assert writer.caller_commits == before_by_caller
            assert writer.batches - before_frames == 2
            assert set(versions) <= disk.synced_versions()
        finally:
            other.close()
