"""`queen check`: a data directory read as recovery would, offline, changing nothing; the exit
status tells clean, a torn tail recovery would tidy, a damaged frame, and a log recovery refuses
apart, and a directory a server runs on is refused."""

import hashlib
import os

from queen.cli import main
from tests.wal.test_recovery import FRAMES, flip_byte, frame_spans, segment_path, write_frames


def fingerprint(data_dir) -> dict:
    """Every file's name, size and hash: what `check` must not change."""
    out = {}
    for name in sorted(os.listdir(data_dir)):
        with open(os.path.join(data_dir, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def check(data_dir, capsys) -> tuple[int, str]:
    status = main(["check", "--data-dir", str(data_dir)])
    return status, capsys.readouterr().out


async def written(tmp_path, serve):
    data_dir = tmp_path / "data"
    async with serve(data_dir, shard_count=1) as server:
        await write_frames(server)
    return data_dir


async def test_a_clean_directory_is_clean(tmp_path, serve, capsys, mock_clock):
    data_dir = await written(tmp_path, serve)
    before = fingerprint(data_dir)
    status, out = check(data_dir, capsys)
    assert status == 0 and out.rstrip().endswith("clean") and f"rows={FRAMES + 1}" in out
    assert fingerprint(data_dir) == before


async def test_a_torn_tail_is_what_recovery_would_tidy_and_nothing_is_changed(tmp_path, serve, capsys, mock_clock):
    data_dir = await written(tmp_path, serve)
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[-1]
    os.truncate(path, end - 1)
    before = fingerprint(data_dir)
    status, out = check(data_dir, capsys)
    assert status == 1, out
    assert "wal_tail_torn" in out and f"would truncate: {path} at {start}" in out
    assert fingerprint(data_dir) == before


async def test_a_damaged_last_frame_may_have_been_acknowledged(tmp_path, serve, capsys, mock_clock):
    data_dir = await written(tmp_path, serve)
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[-1]
    flip_byte(path, (start + end) // 2)
    before = fingerprint(data_dir)
    status, out = check(data_dir, capsys)
    assert status == 3 and "wal_frame_damaged" in out and "damaged:" in out, out
    assert fingerprint(data_dir) == before


async def test_damage_before_the_last_frame_is_a_log_recovery_refuses(tmp_path, serve, capsys, mock_clock):
    data_dir = await written(tmp_path, serve)
    path = segment_path(data_dir, 1)
    start, end = frame_spans(path)[1]
    flip_byte(path, (start + end) // 2)
    status, out = check(data_dir, capsys)
    assert status == 4 and out.startswith("refused:"), out


async def test_a_directory_a_server_runs_on_is_refused(tmp_path, serve, capsys, mock_clock):
    data_dir = tmp_path / "data"
    async with serve(data_dir):
        status = main(["check", "--data-dir", str(data_dir)])
    assert status == 2 and "a server is running" in capsys.readouterr().err


def test_a_missing_directory_is_a_usage_error(tmp_path, capsys):
    assert main(["check", "--data-dir", str(tmp_path / "nowhere")]) == 2

