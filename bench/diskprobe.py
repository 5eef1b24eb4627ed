"""The physical limit of durable writes: how many fsyncs per second the data disk allows.

Owns: one measurement at the start of a session, in a temporary file under the data directory's
parent (the same file system the servers write to): write 4 KiB at the same offset and
fdatasync it, over and over, for a fixed time. A durable write costs at least one such fsync, so
the rate bounds any server that fsyncs per write; with group commit one fsync covers many writes,
and a durable figure divided by this rate says how many writes each fsync had to carry.

Never: leaves its file behind, or measures anywhere but under the directory it is given.
"""

from __future__ import annotations

import os
import tempfile
import time

from bench.histogram import Histogram

BLOCK = b"q" * 4096


def fsync_rate(directory: str, duration_s: float = 2.0) -> dict:
    """{"fsyncs_per_s", "mean_us", "p50_us", "p99_us", "duration_s", "directory"}: 4 KiB write +
    fdatasync in a loop for duration_s."""
    fd, path = tempfile.mkstemp(prefix="bench-fsync-", dir=directory)
    histogram = Histogram()
    try:
        os.write(fd, BLOCK)
        os.fsync(fd)  # the file's metadata once, so the loop measures data syncs only
        started = time.perf_counter_ns()
        deadline = started + int(duration_s * 1e9)
        count = 0
        now = started
        while now < deadline:
            os.pwrite(fd, BLOCK, 0)
            os.fdatasync(fd)
            after = time.perf_counter_ns()
            histogram.record(after - now)
            now = after
            count += 1
        elapsed_s = (now - started) / 1e9
    finally:
        os.close(fd)
        os.unlink(path)
    summary = histogram.summary_us()
    return {"fsyncs_per_s": round(count / elapsed_s, 1), "mean_us": summary["mean_us"], "p50_us": summary["p50_us"],
            "p99_us": summary["p99_us"], "duration_s": round(elapsed_s, 2), "directory": directory,
            "method": "4 KiB pwrite at offset 0 + fdatasync, in a loop"}
