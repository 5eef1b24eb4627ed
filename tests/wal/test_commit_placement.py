"""Where the writer commits: on the event loop while fsyncs are fast, in the disk thread once they
are slow, and away from the loop for a while after one fsync stalled it (queen/wal/writer.py)."""

import logging

from queen.wal.writer import INLINE_FSYNC_S_MAX, INLINE_STALL_S_MAX, THREAD_HOLD_S, WalWriter

T = 1000.0


def make_writer() -> WalWriter:
    return WalWriter("/nowhere", disk=None, next_segment=1, durable_version=0, ceiling=0, segment_bytes_max=1 << 20,
                     snapshot_wal_bytes=1 << 30)


def after_commit(writer: WalWriter, last_s: float, mean_s: float, now_s: float, alone: bool = False) -> bool:
    writer.fsync_last_s, writer._fsync_mean_s = last_s, mean_s
    writer._choose_where_to_commit(now_s, alone)
    return writer._inline


def test_fast_fsyncs_stay_on_the_loop():
    writer = make_writer()
    assert after_commit(writer, 0.0004, 0.0004, T) is True


def test_one_fsync_that_stalled_the_loop_moves_commits_to_the_thread_for_the_hold_whatever_the_mean():
    writer = make_writer()
    assert after_commit(writer, INLINE_STALL_S_MAX * 2, INLINE_FSYNC_S_MAX / 4, T) is False
    # Fast again at once: still in the thread until the hold is over.
    assert after_commit(writer, 0.0003, 0.0003, T + THREAD_HOLD_S - 0.01) is False
    assert after_commit(writer, 0.0003, 0.0003, T + THREAD_HOLD_S) is True


def test_a_slow_mean_moves_commits_and_only_a_mean_under_half_the_limit_brings_them_back():
    writer = make_writer()
    assert after_commit(writer, INLINE_FSYNC_S_MAX * 1.5, INLINE_FSYNC_S_MAX * 1.5, T) is False
    assert after_commit(writer, INLINE_FSYNC_S_MAX * 0.7, INLINE_FSYNC_S_MAX * 0.7, T + 2 * THREAD_HOLD_S) is False
    assert after_commit(writer, INLINE_FSYNC_S_MAX * 0.3, INLINE_FSYNC_S_MAX * 0.3, T + 2 * THREAD_HOLD_S) is True


def test_an_fsync_between_the_mean_limit_and_the_stall_limit_alone_does_not_move_commits():
    writer = make_writer()
    assert after_commit(writer, (INLINE_FSYNC_S_MAX + INLINE_STALL_S_MAX) / 2, INLINE_FSYNC_S_MAX / 2, T) is True


def test_a_lone_client_is_stalled_by_nobody_so_only_the_mean_moves_its_commits_and_no_hold_keeps_them():
    writer = make_writer()
    assert after_commit(writer, INLINE_STALL_S_MAX * 2, INLINE_FSYNC_S_MAX / 4, T, alone=True) is True
    assert after_commit(writer, INLINE_FSYNC_S_MAX * 3, INLINE_FSYNC_S_MAX * 1.5, T, alone=True) is False
    assert after_commit(writer, 0.0003, 0.0003, T + 0.01, alone=True) is True
    # Moved by a stall while others were connected, then alone: back as soon as the mean allows.
    assert after_commit(writer, INLINE_STALL_S_MAX * 2, INLINE_FSYNC_S_MAX / 4, T + 1) is False
    assert after_commit(writer, 0.0003, 0.0003, T + 1.01, alone=True) is True


def test_moving_commits_is_logged_at_debug_not_info(caplog):
    """It is tuning, not a lifecycle event: under a varying disk it flips back and forth, and at
    info it made most of a short session's lines."""
    caplog.set_level(logging.DEBUG, logger="queen.wal.writer")
    writer = make_writer()
    assert after_commit(writer, INLINE_STALL_S_MAX * 2, INLINE_FSYNC_S_MAX * 2, T) is False
    assert after_commit(writer, 0.0003, 0.0003, T + THREAD_HOLD_S) is True
    moves = [record for record in caplog.records if "event=wal_commits_" in record.getMessage()]
    assert [record.getMessage().split()[0] for record in moves] == ["event=wal_commits_to_thread",
                                                                      "event=wal_commits_inline"]
    assert {record.levelno for record in moves} == {logging.DEBUG}
