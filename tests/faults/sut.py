"""The server under test: `python -m tests.faults.sut serve ...` is `queen serve ...` with the fault
suite's test-only switches, read from the environment. Nothing here is part of the product; the
product's code has no switch of its own.

QUEEN_FAULT_JOURNAL=<path>
    Run on a JournalingDisk (tests/faults/power.py), so that `lose_power` can drop what no fsync
    covered after the process is killed.
QUEEN_FAULT_DISK=<op>:<n>:<errno name>
    The n+1-th `write` or `fsync` of the log (and every one after it) fails with that errno, as a
    dying or full disk does: e.g. fsync:40:EIO, write:100:ENOSPC.
QUEEN_FAULT_KILL_AT=<point>:<n>
    A named failpoint: the process SIGKILLs itself just after the n-th disk operation of that
    kind since it started (n from 1), from the thread doing it. Points: write (a log write, before
    its fsync), fsync (durable, before any answer goes out), create (a new segment or snapshot
    file, before its directory fsync), rename (a snapshot put in place, before the directory
    fsync), fsync_dir (just after a directory fsync). A point may be reached during recovery,
    before the server listens.
QUEEN_FAULT_WALL_OFFSET_MS=<ms>
    The server starts with its wall clock this far from the host's: a clock step across a restart.
QUEEN_FAULT_WALL_STEP_FILE=<path>
    The process's wall clock (time.time, time.time_ns) runs this far from the host's, read from
    the file at every call: "+1h", "-1h", "+0" (hours with h, else seconds): a clock stepped while
    the server runs, for machines without libfaketime. The monotonic clock is left alone.
QUEEN_FAULT_CONTROL=<name>
    A deliberate bug, so the suite can show it catches it (a negative control):
      ack_before_fsync  an fsync makes the data durable only a second later: answers go out first
      skip_dir_fsync    directory fsyncs do nothing: a new segment's name may not survive power loss
      reuse_version     after a restart, versions start 1,000 below the last one in the log
      lease_early       locks and semaphores see their leases end one tick (50 ms) early
      double_grant      a pop takes partitions whose lease is still live from their holder
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time

CONTROLS = ("ack_before_fsync", "skip_dir_fsync", "reuse_version", "lease_early", "double_grant")
PATCHES_COMPILED = ("lease_early", "double_grant")  # controls whose patch lands in a module of queen/_native.py


def _disk_class(base):
    """base with QUEEN_FAULT_DISK's failure added, or base itself."""
    spec = os.environ.get("QUEEN_FAULT_DISK")
    if not spec:
        return base
    op, count, name = spec.split(":")
    assert op in ("write", "fsync"), spec
    code, allowed = getattr(errno, name), int(count)

    class FailingDisk(base):
        calls = 0

        def _maybe_fail(self):
            FailingDisk.calls += 1
            if FailingDisk.calls > allowed:
                raise OSError(code, os.strerror(code))

    if op == "write":
        def write(self, fd, data):
            self._maybe_fail()
            base.write(self, fd, data)
        FailingDisk.write = write
    else:
        def fsync(self, fd):
            self._maybe_fail()
            base.fsync(self, fd)
        FailingDisk.fsync = fsync
    return FailingDisk


FAILPOINTS = ("write", "fsync", "create", "rename", "fsync_dir")


def _killing_class(base):
    """base with QUEEN_FAULT_KILL_AT's failpoint added, or base itself."""
    spec = os.environ.get("QUEEN_FAULT_KILL_AT")
    if not spec:
        return base
    point, count = spec.split(":")
    assert point in FAILPOINTS, spec
    original, at = getattr(base, point), int(count)
    reached = 0

    def then_die(self, *args):
        nonlocal reached
        result = original(self, *args)
        reached += 1
        if reached == at:
            os.write(2, _log_line(f"event=failpoint point={point} n={at}").encode())
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return type("KillingDisk", (base,), {point: then_die})


def _step_wall_clock(step_file: str) -> None:
    import time

    real_time, real_time_ns = time.time, time.time_ns

    def offset_s() -> float:
        with open(step_file) as f:
            text = f.read().strip()
        return float(text[:-1]) * 3600 if text.endswith("h") else float(text)

    time.time = lambda: real_time() + offset_s()
    time.time_ns = lambda: real_time_ns() + int(offset_s() * 1e9)


def install(argv: list[str]) -> None:
    control = os.environ.get("QUEEN_FAULT_CONTROL", "")
    assert control in CONTROLS + ("",), f"unknown control {control!r}"
    if control in PATCHES_COMPILED:
        # Its bug is a patch on a class of the compiled core (queen/_native.py), whose compiled
        # callers call each other directly and would never see it: run the .py files instead.
        assert "queen._native" not in sys.modules, "the build was chosen before the control"
        os.environ["QUEEN_PURE"] = "1"
    journal = os.environ.get("QUEEN_FAULT_JOURNAL")
    data_dir = argv[argv.index("--data-dir") + 1] if "--data-dir" in argv else "queen-data"

    import queen.runtime.server as server_module
    from queen.wal.disk import Disk
    from tests.faults.power import JournalingDisk

    if journal:
        disk_class = _killing_class(_disk_class(JournalingDisk))
        server_module.Disk = lambda: disk_class(journal, data_dir, skip_dir_fsync=control == "skip_dir_fsync",
                                                late_fsync=control == "ack_before_fsync")
    else:
        assert control not in ("skip_dir_fsync", "ack_before_fsync"), "these controls need QUEEN_FAULT_JOURNAL"
        server_module.Disk = _killing_class(_disk_class(Disk))

    offset_ms = int(os.environ.get("QUEEN_FAULT_WALL_OFFSET_MS", "0"))
    if offset_ms:
        import time

        from queen import clock

        original_init = clock.Clock.__init__

        def init(self, wall_at_start_ms=None):
            if wall_at_start_ms is None:
                wall_at_start_ms = int(time.time() * 1000) + offset_ms
            original_init(self, wall_at_start_ms)

        clock.Clock.__init__ = init

    step_file = os.environ.get("QUEEN_FAULT_WALL_STEP_FILE")
    if step_file:
        _step_wall_clock(step_file)

    if control == "reuse_version":
        from queen.wal import recovery

        recovery.Recovered.version_floor = property(lambda self: max(0, self.last_version - 1000))
    elif control == "lease_early":
        from queen.core import kv
        from queen.core.kv import LOCKS_NS
        from queen.core.wheel import TICK_MS

        live_row, expire = kv.KvState.live_row, kv.KvState.expire

        def early_live_row(self, ns, key, now_ms):
            return live_row(self, ns, key, now_ms + TICK_MS if ns == LOCKS_NS else now_ms)

        kv.KvState.live_row = early_live_row
        kv.KvState.expire = lambda self, now_ms: expire(self, now_ms + TICK_MS)
    elif control == "double_grant":
        from queen.core import queues

        deliver = queues.QueueTable._deliver

        def take_live_partitions(self, queue, group, op, now_ms, records):
            for lease in group.leases.values():
                if lease.expires_at_ms > now_ms:
                    lease.expires_at_ms = now_ms  # the bug: a live lease counts as run out
            return deliver(self, queue, group, op, now_ms, records)

        queues.QueueTable._deliver = take_live_partitions
    if control:
        print(_log_line(f"event=negative_control control={control}"), end="", file=sys.stderr)


def _log_line(pairs: str) -> str:
    """A warning line in the server's own logfmt shape, so its log stays one format throughout."""
    now = time.time()
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    return f"ts={ts} level=warning logger=tests.faults.sut {pairs}\n"


def main() -> int:
    argv = sys.argv[1:]
    install(argv)
    from queen.cli import main as queen_main

    return queen_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
