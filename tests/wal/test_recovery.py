"""Recovery against real files: what a crash can leave is repaired, what it cannot is refused, and
what an older build wrote is read.

Each test writes a WAL with a real in-process Server, damages the files the way a crash or a bad
disk would, and starts a Server on them again. The writes run on one shard, so each sequential
call is exactly one frame (its ops are applied and submitted together, and the call waits for its
fsync before the next is sent); with several shards a call's parts may land in separate frames.
"""

import logging
import os
import re
import struct
import subprocess
import sys
import zlib
from functools import partial

import cbor2
import pytest
import trio
import zstandard

from queen.cli.serve import EXIT_DATA_REFUSED
from queen.config import Config
from queen.core import records as rec
from queen.core.kv import READ_OPS, is_locks_ns, parse_kv_ops, value_of
from queen.core.limits import Limits
from queen.core.locks import parse_lock_ops
from queen.errors import CorruptLog, UnreadableFormat
from queen.runtime.server import Server
from queen.wal.frame import FILE_HEADER, FORMAT_VERSION, FRAME_HEADER, decode_frame, encode_frame
from queen.wal.segment import CEILING_BLOCK, list_dir, segment_name, snapshot_name
from queen.wal.snapshot import SNAPSHOT_HEADER, decode_snapshot, encode_snapshot

LIMITS = Limits()
FRAMES = 5


def put(key, value, ns="app"):
    return {"op": "put", "ns": ns, "key": key, "value": value, "forever": True}


async def call(server, *ops):
    parsed = parse_kv_ops(list(ops), LIMITS)
    return await server.router.run_kv(parsed, any(op.op not in READ_OPS for op in parsed))


async def read(server, keys, ns="app"):
    [result] = await call(server, {"op": "getMany", "ns": ns, "keys": list(keys)})
    # A read's value is its row's stored JSON, spliced into the answer: decoded here.
    return {item["key"]: {**item, "value": value_of(item["value"])} for item in result["items"]}


async def write_frames(server, count=FRAMES):
    """`count` calls, one frame each: call i puts k<i> = i and last = i. Returns, per call, the
    version each of its two keys got."""
    versions = []
    for i in range(count):
        k, last = await call(server, put(f"k{i}", i), put("last", i))
        versions.append({f"k{i}": k["version"], "last": last["version"]})
    return versions


def frame_spans(path):
    """[(start, end)] of every frame in a segment file that holds versioned records (the writer's
    own ceiling frames left out)."""
    with open(path, "rb") as f:
        data = f.read()
    spans, offset = [], FILE_HEADER.size
    data = data.rstrip(b"\0")  # the space the writer allocated ahead
    while offset < len(data):
        _, first_version, _, end = decode_frame(data, offset)
        if first_version:
            spans.append((offset, end))
        offset = end
    return spans


def segments_in(data_dir):
    return list_dir(os.listdir(data_dir))[0]


def snapshots_in(data_dir):
    return list_dir(os.listdir(data_dir))[1]


def segment_path(data_dir, seq):
    return os.path.join(str(data_dir), segment_name(seq))


def messages(caplog, event):
    return [r.getMessage() for r in caplog.records if f"event={event}" in r.getMessage()]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


async def refused(data_dir):
    """The CorruptLog an in-process Server raises when it refuses to start on data_dir."""
    with pytest.raises(CorruptLog) as info:
        await Server(Config(port=0, data_dir=str(data_dir))).run()
    return str(info.value)


# -- a torn tail is cut off ----------------------------------------------------------------------

CUTS = {
    "inside the magic": lambda start, end: start + 2,
    "inside the header": lambda start, end: start + FRAME_HEADER.size - 1,
    "right after the header": lambda start, end: start + FRAME_HEADER.size,
    "inside the payload": lambda start, end: (start + FRAME_HEADER.size + end) // 2,
    "one byte short": lambda start, end: end - 1,
}


@pytest.mark.parametrize("where", list(CUTS))
async def test_a_torn_last_frame_is_cut_off_with_a_warning_kept_in_quarantine_and_every_frame_before_it_kept(
        where, tmp_path, serve, caplog, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        versions = await write_frames(server)
    path = segment_path(data_dir, 1)
    spans = frame_spans(path)
    assert len(spans) == FRAMES
    start, end = spans[-1]
    os.truncate(path, CUTS[where](start, end))
    torn = read_bytes(path)[start:]

    caplog.set_level(logging.INFO)
    async with serve(data_dir) as server:
        [warning] = messages(caplog, "wal_tail_torn")
        assert path in warning and f"offset={start}" in warning
        assert read_bytes(f"{path}.cut-{start}") == torn.rstrip(b"\0")  # all but zeros, which say nothing
        rows = await read(server, [f"k{i}" for i in range(FRAMES)] + ["last"])
        for i in range(FRAMES - 1):
            assert (rows[f"k{i}"]["value"], rows[f"k{i}"]["version"]) == (i, versions[i][f"k{i}"])
        assert not rows[f"k{FRAMES - 1}"]["found"]
        assert (rows["last"]["value"], rows["last"]["version"]) == (FRAMES - 2, versions[-2]["last"])
        assert os.path.getsize(path) == start
        [after] = await call(server, put("after", 1))
        assert after["version"] > max(versions[-2].values())

    caplog.clear()
    async with serve(data_dir) as server:
        assert messages(caplog, "wal_tail_torn") == []
        assert "truncated_bytes=0 " in messages(caplog, "recovered")[0]
        rows = await read(server, ["k0", f"k{FRAMES - 2}", "last", "after"])
        assert [rows[k]["value"] for k in ("k0", f"k{FRAMES - 2}", "last", "after")] == [0, FRAMES - 2, FRAMES - 2, 1]
    assert os.path.getsize(path) == start


@pytest.mark.parametrize("size", [0, 5, FILE_HEADER.size - 1])
async def test_a_last_segment_torn_inside_its_file_header_is_removed_and_later_restarts_are_clean(
        size, tmp_path, serve, caplog, mock_clock):
    # What a crash between creating a segment and writing its header leaves behind.
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        versions = await write_frames(server, 2)
    with open(segment_path(data_dir, 2), "wb") as f:
        f.write(b"QNWL\x01\x00\x00\x00\x00\x00\x00"[:size])

    caplog.set_level(logging.INFO)
    async with serve(data_dir) as server:
        assert len(messages(caplog, "wal_header_torn")) == 1
        [after] = await call(server, put("after", "x"))
        assert after["version"] > max(versions[-1].values())
    async with serve(data_dir) as server:
        rows = await read(server, ["k0", "k1", "after"])
        assert [rows[k]["value"] for k in ("k0", "k1", "after")] == [0, 1, "x"]


async def test_an_interrupted_snapshot_file_is_ignored_and_removed(tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server, 2)
    tmp = data_dir / "snapshot-00000000000000000099.snap.tmp"
    tmp.write_bytes(b"QNSP half written")
    async with serve(data_dir) as server:
        rows = await read(server, ["k0", "k1"])
        assert [rows["k0"]["value"], rows["k1"]["value"]] == [0, 1]
    assert not tmp.exists()


# -- damage a crash cannot explain is refused ----------------------------------------------------

DAMAGE = {
    "magic": lambda start, end: start,
    "length": lambda start, end: start + 4,
    "crc": lambda start, end: start + 8,
    "first version": lambda start, end: start + 12,
    "payload": lambda start, end: (start + FRAME_HEADER.size + end) // 2,
}


@pytest.mark.parametrize("field", list(DAMAGE))
async def test_a_damaged_middle_frame_refuses_to_start_naming_the_file_and_offset(
        field, tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server)
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[2]
    flip_byte(path, DAMAGE[field](start, end))
    before = read_bytes(path)

    message = await refused(data_dir)
    assert path in message and f"offset {start}" in message
    assert read_bytes(path) == before, "a refused start must not repair (truncate) anything"


async def test_a_damaged_last_frame_of_a_segment_that_is_not_the_last_refuses_to_start(
        tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    for _ in range(2):  # every start opens a new segment
        async with serve(data_dir, shard_count=1) as server:
            await write_frames(server, 2)
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[-1]
    flip_byte(path, end - 1)

    message = await refused(data_dir)
    assert path in message and f"offset {start}" in message


async def serve_subprocess_on_a_damaged_middle_frame(data_dir, serve):
    """(completed `queen serve` process, damaged file, offset of the damaged frame)."""
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server)
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[1]
    flip_byte(path, end - 3)
    # A thread with a real timeout: if the server wrongly started it would serve forever.
    process = await trio.to_thread.run_sync(partial(
        subprocess.run, [sys.executable, "-m", "queen", "serve", "--port", "0", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60))
    return process, path, start


async def test_queen_serve_on_a_damaged_middle_frame_exits_non_zero_naming_the_file_and_offset(
        tmp_path, serve, mock_clock):
    process, path, start = await serve_subprocess_on_a_damaged_middle_frame(tmp_path / "data", serve)
    assert process.returncode != 0
    assert path in process.stderr and f"offset {start}" in process.stderr


async def test_queen_serve_on_a_damaged_middle_frame_exits_refused_saying_why_in_one_log_line(tmp_path, serve, mock_clock):
    process, path, start = await serve_subprocess_on_a_damaged_middle_frame(tmp_path / "data", serve)
    assert process.returncode == EXIT_DATA_REFUSED
    [line] = [line for line in process.stderr.splitlines() if "event=start_failed" in line]
    assert "reason=corrupt_log" in line and path in line and f"offset {start}" in line
    assert "Traceback" not in process.stderr


@pytest.mark.parametrize("missing", [1, 2])
async def test_a_missing_segment_refuses_to_start(missing, tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    for _ in range(3):
        async with serve(data_dir, shard_count=1) as server:
            await write_frames(server, 2)
    assert sorted(segments_in(data_dir)) == [1, 2, 3]
    os.remove(segment_path(data_dir, missing))

    message = await refused(data_dir)
    assert segment_name(missing) in message or segment_name(missing + 1) in message
    assert sorted(segments_in(data_dir)) == [s for s in (1, 2, 3) if s != missing]


# -- snapshots keep the disk bounded -------------------------------------------------------------

KEYS = 100
VERSIONS_TOTAL = 200_000
OPS_PER_CALL = 100
TASKS = 8
SNAPSHOT_WAL_BYTES = 16 << 10
SEGMENT_BYTES_MAX = 8 << 10


def dir_bytes(data_dir):
    total = 0
    for entry in os.scandir(data_dir):
        try:
            total += entry.stat().st_size if entry.name != "LOCK" else 0
        except FileNotFoundError:
            pass  # removed meanwhile by the snapshot thread
    return total


async def test_snapshots_delete_old_segments_and_a_restart_keeps_latest_values_and_versions(
        tmp_path, serve, caplog, mock_clock):
    data_dir = tmp_path / "data"
    latest = {}  # key -> (version, value) of the highest acknowledged version
    peak_bytes = 0
    calls_per_task = VERSIONS_TOTAL // (OPS_PER_CALL * TASKS)

    async def writer(server, task):
        nonlocal peak_bytes
        for n in range(calls_per_task):
            # Every call writes each key once, starting at a different key, so that shards and
            # batches interleave the keys differently.
            ops = [put(f"key{(n + task + i) % KEYS}", f"{task}-{n}") for i in range(OPS_PER_CALL)]
            for op, result in zip(ops, await call(server, *ops), strict=True):
                assert result["applied"]
                if result["version"] > latest.get(op["key"], (0, None))[0]:
                    latest[op["key"]] = (result["version"], op["value"])
            peak_bytes = max(peak_bytes, dir_bytes(data_dir))

    async with serve(data_dir, snapshot_wal_bytes=SNAPSHOT_WAL_BYTES, segment_bytes_max=SEGMENT_BYTES_MAX) as server:
        async with trio.open_nursery() as nursery:
            for task in range(TASKS):
                nursery.start_soon(writer, server, task)
        wal_bytes_written = server.writer.bytes_written
        assert server.writer.snapshots_written > 0
    highest = max(version for version, _ in latest.values())
    assert highest >= VERSIONS_TOTAL and len(latest) == KEYS

    # The bound. At any moment the directory holds the newest snapshot (100 small rows: under
    # 1 KiB), the one it replaces until the new one is durable, and the segments written since the
    # newest snapshot was captured. A capture happens at the first batch edge after
    # SNAPSHOT_WAL_BYTES were written (later only while the previous snapshot is still being
    # written), so the segments hold about that threshold plus the frames of a few batches (each
    # at most TASKS * OPS_PER_CALL records, about 2 KiB compressed here). 4x the threshold covers
    # that with room for a slow snapshot thread; it measures about 1.5x. The run writes over 10x
    # the bound, so a leak of old segments or snapshots cannot hide under it.
    bound = 4 * SNAPSHOT_WAL_BYTES
    assert peak_bytes <= bound, f"data dir peaked at {peak_bytes} bytes"
    assert dir_bytes(data_dir) <= bound
    assert wal_bytes_written >= 10 * bound, "the test must write far more than the bound to mean anything"
    segments, snapshots = segments_in(data_dir), snapshots_in(data_dir)
    assert len(snapshots) == 1
    assert min(segments) > 1

    caplog.set_level(logging.INFO)
    async with serve(data_dir, snapshot_wal_bytes=SNAPSHOT_WAL_BYTES, segment_bytes_max=SEGMENT_BYTES_MAX) as server:
        [recovered] = messages(caplog, "recovered")
        assert int(re.search(r"snapshot_version=(\d+)", recovered).group(1)) > 0
        rows = await read(server, latest)
        for key, (version, value) in latest.items():
            assert (rows[key]["value"], rows[key]["version"]) == (value, version), key
        [after] = await call(server, put("key0", "after"))
        assert after["version"] > highest


# -- the newest frame damaged, not torn ---------------------------------------------------------


async def acquire(server, owner):
    ops = parse_lock_ops([{"op": "acquire", "name": "job", "ttlSeconds": 600, "owner": owner}], LIMITS)
    [result] = await server.router.run_locks(ops)
    return result


async def test_a_flipped_bit_in_the_last_whole_frame_is_quarantined_loudly_and_its_fence_never_reissued(
        tmp_path, serve, caplog, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server, 3)
        first = await acquire(server, "a")  # the last frame: an acknowledged grant
    assert first["acquired"]
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[-1]
    damaged_frame = read_bytes(path)[start:end]
    flip_byte(path, (start + FRAME_HEADER.size + end) // 2)

    caplog.set_level(logging.INFO)
    async with serve(data_dir) as server:
        [error] = [r for r in caplog.records if "event=wal_frame_damaged" in r.getMessage()]
        assert error.levelno == logging.ERROR
        message = error.getMessage()
        assert f"offset={start}" in message and f"claimed_versions={first['token']}..{first['token']}" in message
        kept = read_bytes(f"{path}.cut-{start}")
        assert len(kept) == len(damaged_frame) and kept != damaged_frame  # the damaged bytes, kept
        second = await acquire(server, "b")  # the grant is gone with its frame...
        assert second["acquired"]
        assert second["fence"] > first["fence"] and second["token"] > first["token"]  # ...its fence is not reused


@pytest.mark.parametrize("bit", [53, 55, 61])
async def test_a_flipped_high_bit_in_the_last_frames_claimed_version_is_not_believed(
        bit, tmp_path, serve, caplog, mock_clock):
    # Believed, it would move every later version, token, fence and id past 2^53 for good, where
    # JSON clients read them inexactly.
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server, 3)
        first = await acquire(server, "a")  # the last frame: its one version is the grant's token
    path = segment_path(data_dir, 1)
    start, _ = frame_spans(path)[-1]
    last_version_at = start + FRAME_HEADER.size - 12  # u64 last_version, then u32 item_count
    with open(path, "r+b") as f:
        f.seek(last_version_at + bit // 8)
        byte = f.read(1)[0]
        f.seek(last_version_at + bit // 8)
        f.write(bytes([byte ^ (1 << bit % 8)]))
    claimed = first["token"] ^ (1 << bit)

    caplog.set_level(logging.INFO)
    async with serve(data_dir) as server:
        [error] = [r for r in caplog.records if "event=wal_frame_damaged" in r.getMessage()]
        assert error.levelno == logging.ERROR
        assert f"claims_not_believed={first['token']}..{claimed} " in error.getMessage()
        second = await acquire(server, "b")
        assert first["token"] < second["token"] < first["token"] + 2 * CEILING_BLOCK
        assert second["fence"] > first["fence"]


async def test_a_missing_newest_segment_is_noticed_through_the_record_that_closed_the_one_before(
        tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1, segment_bytes_max=256) as server:
        await write_frames(server, 6)  # enough for several cuts within this run
    newest = max(segments_in(data_dir))
    os.remove(segment_path(data_dir, newest))
    message = await refused(data_dir)
    assert segment_name(newest) in message and "missing" in message


async def test_a_missing_segment_a_snapshot_begins_with_is_noticed(tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1, snapshot_wal_bytes=1) as server:
        await write_frames(server, 3)
    assert snapshots_in(data_dir)
    for seq in segments_in(data_dir):
        os.remove(segment_path(data_dir, seq))
    message = await refused(data_dir)
    assert "missing" in message and "snapshot" in message


async def test_a_directory_written_by_format_1_is_refused_with_how_to_carry_the_data_over(tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / segment_name(1)).write_bytes(FILE_HEADER.pack(b"QNWL", 1, 0) + b"QNF1" + b"\0" * 40)
    with pytest.raises(UnreadableFormat) as info:
        await Server(Config(port=0, data_dir=str(data_dir))).run()
    message = str(info.value)
    assert "format 1" in message and "queen kv list" in message and "empty" in message
    assert sorted(os.listdir(data_dir)) == ["LOCK", segment_name(1)]  # nothing changed


async def test_a_record_kind_this_build_does_not_know_is_refused_as_a_newer_builds(tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server, 2)
    with open(segment_path(data_dir, 1), "ab") as f:
        f.write(encode_frame([99, "from the future"], 0, 0))  # whole and checksummed: not damage
    message = await refused(data_dir)
    assert "newer build" in message


async def test_a_snapshot_with_a_section_this_build_does_not_know_is_refused(tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1, snapshot_wal_bytes=1) as server:
        await write_frames(server, 3)
    [version] = snapshots_in(data_dir)
    path = data_dir / snapshot_name(version)
    kept = decode_snapshot(path.read_bytes())
    # A whole, checksummed snapshot from a build that also keeps queues.
    payload = zstandard.ZstdCompressor().compress(cbor2.dumps({"kv": [], "queues": [7]}))
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<QQQ", version, kept.ceiling, kept.first_segment)))
    path.write_bytes(SNAPSHOT_HEADER.pack(b"QNSP", FORMAT_VERSION, version, kept.ceiling, kept.first_segment, crc,
                                          len(payload)) + payload)
    with pytest.raises(UnreadableFormat) as info:
        await Server(Config(port=0, data_dir=str(data_dir))).run()
    assert "queues" in str(info.value) and "newer" in str(info.value)


def test_a_pop_after_recovery_from_a_snapshot_gives_each_message_once(tmp_path):
    """Found by a crash run: after recovery from a snapshot, a pop over several partitions gave the
    same messages twice in one answer (the partition was in its group's ready heap twice)."""
    import http.client
    import json
    import time

    from queen.testing import ServerProcess

    def call(server, method, path, body=None):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request(method, path, None if body is None else json.dumps(body))
        answer = json.loads(connection.getresponse().read())
        connection.close()
        return answer

    server = ServerProcess(str(tmp_path / "data"), "--snapshot-wal-bytes", "4096").start()
    try:
        call(server, "POST", "/api/v1/push", {"items": [{"queue": "q", "partition": "a", "payload": n} for n in range(3)]})
        call(server, "GET", "/api/v1/pop/queue/q/partition/b")  # the group joins; partition a is untouched
        for n in range(16):  # incompressible bytes, so the WAL passes the snapshot threshold
            call(server, "PUT", f"/api/v1/kv/pad/k{n}", {"value": os.urandom(600).hex(), "forever": True})
        for _ in range(500):  # waiting on the real server's snapshot, not on time to pass
            if snapshots_in(server.data_dir):
                break
            time.sleep(0.02)
        assert snapshots_in(server.data_dir), "no snapshot was written"
        server.kill()
        server.start()
        answer = call(server, "GET", "/api/v1/pop/queue/q?batch=10&partitions=2")
    finally:
        server.stop()
    assert [m["offset"] for m in answer["messages"]] == [0, 1, 2], answer["messages"]


# -- data written by an older build --------------------------------------------------------------


def with_owner_strings(records):
    """The flat records as builds before the permit object wrote them: a permit's put carrying its
    owner. (This build writes them so too; rewriting keeps the test true if that ever changes.)"""
    flat = []
    for record in records:
        if type(record) is rec.Put and is_locks_ns(record.ns) and type(record.value) is dict:
            record = record._replace(value=record.value["owner"])
        rec.encode(flat, record)
    return flat


def rewrite_segments_as_an_older_build(data_dir) -> int:
    """Every frame of every segment re-encoded with owner strings; how many permit puts they hold."""
    changed = 0
    for seq in segments_in(data_dir):
        path = segment_path(data_dir, seq)
        data = read_bytes(path)
        out, offset = [data[:FILE_HEADER.size]], FILE_HEADER.size
        while offset + FRAME_HEADER.size <= len(data) and data[offset:offset + 4] != b"\0\0\0\0":
            items, first_version, last_version, offset = decode_frame(data, offset)
            records = rec.decode(items)
            changed += sum(type(r) is rec.Put and is_locks_ns(r.ns) for r in records)
            out.append(encode_frame(with_owner_strings(records), first_version, last_version))
        out.append(data[offset:])  # the space allocated ahead
        with open(path, "wb") as f:
            f.write(b"".join(out))
    return changed


def rewrite_snapshots_as_an_older_build(data_dir) -> int:
    """Every snapshot re-encoded with owner strings; how many permits the newest holds."""
    permits = 0
    for version in sorted(snapshots_in(data_dir)):
        path = data_dir / snapshot_name(version)
        kept = decode_snapshot(path.read_bytes())
        sections = {"kv": [], "locks": [], "queues": []}
        for record in kept.records:
            section = "queues" if type(record) in rec.QUEUE_RECORDS else "locks" if is_locks_ns(record.ns) else "kv"
            sections[section].append(record)
        path.write_bytes(encode_snapshot(version, kept.ceiling, kept.first_segment,
                                         {name: with_owner_strings(records) for name, records in sections.items()}))
        permits = len(sections["locks"])
    return permits


@pytest.mark.parametrize("where", ["wal", "snapshot"])
async def test_permit_rows_an_older_build_wrote_with_the_owner_as_value_recover_as_the_object(
        where, tmp_path, serve, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1, snapshot_wal_bytes=1 if where == "snapshot" else 64 << 20) as server:
        held = await acquire(server, "keeper")
        [ownerless] = await server.router.run_locks(parse_lock_ops(
            [{"op": "acquire", "name": "anyone", "ttlSeconds": 600}], LIMITS))
        await write_frames(server, 3)
        for _ in range(1000):  # with snapshot_wal_bytes=1, frames until a snapshot taken after the grants is durable
            if where == "wal" or max(snapshots_in(data_dir), default=0) > ownerless["token"]:
                break
            await write_frames(server, 1)
    if where == "snapshot":
        assert rewrite_snapshots_as_an_older_build(data_dir) == 2  # the permits are in the newest snapshot
    rewritten = rewrite_segments_as_an_older_build(data_dir)
    assert where == "snapshot" or rewritten == 2  # the permits are in the log

    async with serve(data_dir, shard_count=1) as server:
        [row, nobody] = (await call(server, {"op": "getMany", "ns": "queen-locks", "keys": ["job#0", "anyone#0"]}))[0]["items"]
        assert value_of(row["value"]) == {"owner": "keeper"} and row["version"] == held["token"]
        assert value_of(nobody["value"]) == {"owner": None} and nobody["version"] == ownerless["token"]
        [got] = await server.router.run_locks(parse_lock_ops([{"op": "get", "name": "job"}], LIMITS))
        assert [(h["owner"], h["token"]) for h in got["holders"]] == [("keeper", held["token"])]
        again = await acquire(server, "keeper")
        assert again["already"] is True and again["token"] == held["token"]
        [renewed] = await server.router.run_locks(parse_lock_ops([{"op": "renew", "name": "job", "slot": 0, "token":
                                                                  held["token"], "ttlSeconds": 600, "owner": "keeper"}], LIMITS))
        assert renewed["renewed"] is True and renewed["fence"] == held["fence"]
        [[row]] = [r["items"] for r in await call(server, {"op": "getMany", "ns": "queen-locks", "keys": ["job#0"]})]
        assert value_of(row["value"]) == {"owner": "keeper"} and row["version"] == renewed["token"]
