"""A disk that fails under the writer: nothing that was not fsynced is acknowledged, and the server
refuses writes from then on instead of pretending.

A real in-process Server, driven over HTTP by blocking http.client calls in worker threads, with a
FaultyDisk that is armed after a few good commits so that the very next write or fsync fails.
"""

import http.client
import json
from functools import partial

import pytest
import trio

from queen.core import records as rec
from queen.testing import FaultyDisk
from queen.wal.frame import FILE_HEADER, FrameError, decode_frame


class RecordingDisk(FaultyDisk):
    """A FaultyDisk that also remembers how many bytes of each file a successful fsync covered."""

    def __init__(self):
        super().__init__()
        self.paths = {}
        self.written = {}
        self.synced_bytes = {}

    def create(self, path):
        fd = super().create(path)
        self.paths[fd] = path
        self.written[fd] = 0
        return fd

    def write(self, fd, data):
        super().write(fd, data)
        if fd in self.written:
            self.written[fd] += len(data)

    def fsync(self, fd):
        super().fsync(fd)
        if fd in self.paths:  # the file's size is allocated ahead: count what was written
            self.synced_bytes[self.paths[fd]] = self.written[fd]

    def synced_versions(self) -> set[int]:
        versions = set()
        for path, size in self.synced_bytes.items():
            with open(path, "rb") as f:
                data = f.read(size)
            offset = FILE_HEADER.size
            while offset < len(data):
                try:
                    items, _, _, offset = decode_frame(data, offset)
                except FrameError:
                    break
                versions.update(rec.version_of(record) for record in rec.decode(items))
        return versions


def request(port, method, path, body=None):
    """(status, headers, JSON document) of one request on its own connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


async def call_http(server, method, path, body=None):
    return await trio.to_thread.run_sync(partial(request, server.port, method, path, body))


def put_op(key, value):
    return {"op": "put", "ns": "app", "key": key, "value": value, "forever": True}


def write_calls(tag):
    """One of each kind of write call, on keys named after tag: (method, path, body, keys)."""
    return [
        ("POST", "/api/v1/kv", {"operations": [put_op(f"{tag}-batch{i}", [tag, i]) for i in range(64)]},
         [f"{tag}-batch{i}" for i in range(64)]),
        ("PUT", f"/api/v1/kv/app/{tag}-one", {"value": tag, "forever": True}, [f"{tag}-one"]),
        ("POST", f"/api/v1/kv/app/{tag}-counter/incr", {"by": 5, "forever": True}, [f"{tag}-counter"]),
    ]


def expected_values(method, path, body, answer):
    """{key: (value, version)} an acknowledged call promises."""
    if method == "POST" and path == "/api/v1/kv":
        return {op["key"]: (op["value"], result["version"]) for op, result in zip(body["operations"], answer["results"], strict=True)}
    if path.endswith("/incr"):
        return {path.split("/")[-2]: (answer["value"], answer["version"])}
    return {path.split("/")[-1]: (body["value"], answer["version"])}


def assert_not_durable(status, headers, answer):
    assert status == 503, answer
    assert answer["code"] == "not_durable"
    assert "retry-after" in {name.lower() for name in headers}


async def get_many(server, keys):
    status, _, answer = await call_http(server, "POST", "/api/v1/kv", {"operations": [{"op": "getMany", "ns": "app", "keys": keys}]})
    assert status == 200, answer
    return {item["key"]: item for item in answer["results"][0]["items"]}


@pytest.mark.parametrize("fault", ["fsync", "write"])
async def test_a_failed_write_or_fsync_answers_503_from_then_on_and_loses_nothing_acknowledged(
        fault, tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    disk = RecordingDisk()
    acknowledged = {}  # key -> (value, version)
    async with serve(data_dir, disk=disk) as server:
        for tag in ("good1", "good2"):
            for method, path, body, _ in write_calls(tag):
                status, _, answer = await call_http(server, method, path, body)
                assert status == 200, answer
                acknowledged.update(expected_values(method, path, body, answer))

        # Arm the fault: the next write (or fsync) of a frame fails.
        if fault == "fsync":
            disk.fail_fsync_after = armed = disk.fsyncs
        else:
            disk.fail_write_after = armed = disk.writes
        method, path, failed_body, failed_keys = write_calls("failed")[0]
        assert_not_durable(*await call_http(server, method, path, failed_body))
        # That call was applied and submitted, not refused up front: its frame hit the fault.
        assert (disk.fsyncs if fault == "fsync" else disk.writes) == armed + 1
        assert server.writer.failed is not None

        # Every later write is refused, whatever its route, and so is a read of what never became
        # durable (the failed call's rows are applied in memory but must stay invisible).
        later = write_calls("later") + [("DELETE", "/api/v1/kv/app/good1-one", None, [])]
        answers = [None] * len(later)

        async def send(i, method, path, body):
            answers[i] = await call_http(server, method, path, body)

        async with trio.open_nursery() as nursery:
            for i, (method, path, body, _) in enumerate(later):
                nursery.start_soon(send, i, method, path, body)
        for answer in answers:
            assert_not_durable(*answer)
        assert_not_durable(*await call_http(server, "GET", f"/api/v1/kv/app/{failed_keys[0]}"))
        status, _, health = await call_http(server, "GET", "/healthz")
        assert status == 503 and health["status"] == "failed"

        # Nothing was acknowledged that a successful fsync did not cover.
        assert {version for _, version in acknowledged.values()} <= disk.synced_versions()

    async with serve(data_dir) as server:  # the real Disk
        rows = await get_many(server, sorted(acknowledged) + failed_keys)
        for key, (value, version) in acknowledged.items():
            assert (rows[key]["found"], rows[key]["value"], rows[key]["version"]) == (True, value, version), key
        for key, value in ((op["key"], op["value"]) for op in failed_body["operations"]):
            if fault == "write":
                # The failing write put nothing in the file.
                assert not rows[key]["found"], key
            else:
                # The frame reached the file before its fsync failed; the call was answered 503
                # (not acknowledged), and such a write may or may not survive, as after a crash.
                assert not rows[key]["found"] or rows[key]["value"] == value, key
        status, _, answer = await call_http(server, "PUT", "/api/v1/kv/app/after", {"value": 1, "forever": True})
        assert status == 200
        assert answer["version"] > max(version for _, version in acknowledged.values())
        status, _, health = await call_http(server, "GET", "/healthz")
        assert status == 200 and health["status"] == "ok"
