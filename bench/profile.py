"""Where the server's CPU goes: py-spy attached to the server during a run, summarized by layer.

Owns: starting `py-spy record --format raw --threads` on the server's pid (pinned with the
generator, so it does not steal the server's core), and folding its samples into layers of the
Queen stack. Each sample is charged to the innermost frame that a rule below recognizes, so time
in a library called from a layer (orjson from the codec, zstd from the frame encoder, the stdlib
from anywhere) counts for the layer that called it.

The event loop (MainThread) and the worker threads are folded apart. py-spy leaves out most
samples of blocked threads (the event loop in epoll_wait), but not all: it reports trio's idle
worker threads, parked on a lock waiting for a job, as running (those samples are dropped, by
their innermost frame, IDLE_FRAMES), and it counts a worker as running while it is in
fdatasync or waits to get the GIL back from the busy event loop. So the event loop's table is a
split of its CPU (which /proc says is nearly all of a core), while the workers' table is a split
of their sampled time, of which /proc's CPU figure for them is the true CPU part.

py-spy stops the process for each sample (its default, which gives whole stacks); at 100 Hz the
pauses cost a few percent, which is why a profiled run is a separate run and labelled so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

RATE_HZ = 100

# (path fragment, function names or None for any, layer). Checked in order for each frame, from
# the innermost frame outwards; the first frame that matches any rule names the layer.
_PARSE_FUNCTIONS = frozenset(("parse_kv_ops", "parse_kv_op", "_text", "_int", "parse_lifetime", "check_value",
                              "_fail", "decode_cursor", "<listcomp>", "parse_kv_ops.<locals>.<listcomp>"))
RULES = (
    ("queen/wal/frame.py", None, "WAL encode (cbor2 + zstd + crc)"),
    ("queen/wal/disk.py", None, "WAL write (os.write)"),
    ("queen/wal/", None, "WAL writer (group commit)"),
    ("queen/core/kv.py", _PARSE_FUNCTIONS, "op parsing + validation"),
    ("queen/core/", None, "core apply (KvState, wheel)"),
    ("queen/runtime/shard_actor.py", None, "shard step"),
    ("queen/runtime/router.py", None, "routing (router)"),
    ("queen/http/codec.py", None, "JSON decode + encode (orjson)"),
    ("queen/http/routes.py", None, "API dispatch (routes)"),
    ("queen/http/connection.py", {"parse_simple_request"}, "HTTP parse, plain requests (queen)"),
    ("h11/", None, "HTTP parse, other shapes (h11)"),
    ("queen/http/connection.py", None, "HTTP connection loop (queen)"),
    ("trio/_core/_io_epoll.py", None, "trio I/O (epoll registration)"),
    ("trio/_socket.py", None, "socket send/recv (trio + syscalls)"),
    ("trio/_highlevel_socket.py", None, "socket send/recv (trio + syscalls)"),
    ("trio/_threads.py", None, "trio to_thread (hand-off)"),
    ("trio/_core/_thread_cache.py", None, "trio to_thread (hand-off)"),
    ("trio/_core/_entry_queue.py", None, "trio to_thread (hand-off)"),
    ("trio/_channel.py", None, "trio channels + events"),
    ("trio/_sync.py", None, "trio channels + events"),
    ("trio/", None, "trio scheduling (run loop, tasks)"),
    ("queen/", None, "queen, other"),
)


# Innermost frames of a thread that waits, not runs: dropped.
IDLE_FRAMES = (("trio/_core/_thread_cache.py", "WorkerThread._work"),)
# Innermost frames of a worker inside write/fdatasync: kernel work and waiting for the device,
# then for the GIL; /proc says how much of it is CPU.
OFF_CPU_FRAMES = (("queen/wal/disk.py", "Disk.fsync"), ("queen/wal/disk.py", "Disk.fsync_dir"),
                  ("queen/wal/disk.py", "Disk.write"))
FSYNC_LAYER = "WAL write + fdatasync (in the syscall, then waiting for the GIL)"
# A worker handing its result back: one send() on trio's wakeup socket, then waiting for the GIL
# that the busy event loop holds.
WAKEUP_FRAMES = (("trio/_core/_wakeup_socketpair.py", "WakeupSocketpair.wakeup_thread_and_signal_safe"),)
WAKEUP_LAYER = "waking the event loop (send on trio's wakeup socket, then waiting for the GIL)"


# Inclusive shares (the frame anywhere on the stack) of the stages a request passes through; they
# overlap by design (a stage contains the ones it calls), so they do not add up to 100.
STAGES = (
    ("queen/http/connection.py", "parse_simple_request", "parse plain request (without h11)"),
    ("queen/http/connection.py", "HttpServer._read_request", "read + parse request (h11 events)"),
    ("queen/http/connection.py", "HttpServer._send", "build + send response (h11)"),
    ("queen/http/routes.py", "Api.handle", "API handler incl. waiting hand-offs"),
    ("queen/http/codec.py", "decode_body", "orjson.loads of the body"),
    ("queen/http/codec.py", "encode_body", "orjson.dumps of the answer"),
    ("queen/core/kv.py", "parse_kv_ops", "parse + validate ops"),
    ("queen/runtime/router.py", "Router.run_kv", "router (split, send, reassemble)"),
    ("queen/runtime/shard_actor.py", "ShardActor.apply", "shard step (in the requesting task)"),
    ("queen/core/kv.py", "KvState.apply", "core apply"),
    ("queen/wal/writer.py", "WalWriter.run", "WAL writer task (event loop side)"),
    ("queen/wal/writer.py", "WalWriter._commit", "WAL commit in worker (encode+write)"),
    ("queen/wal/frame.py", "encode_frame", "WAL frame encode (cbor2+zstd+crc)"),
    ("trio/_threads.py", "to_thread_run_sync", "trio.to_thread_run_sync (loop side)"),
)


# Samples whose innermost frame is trio's run loop itself: scheduling between task steps.
RUN_LOOP_STAGE = "trio run loop itself (between task steps)"


def _frame_parts(frame: str) -> tuple[str, str]:
    """("Class.function", "path") of a py-spy frame "Class.function (path:line)"."""
    function, _, where = frame.rpartition(" (")
    return function, where.rsplit(":", 1)[0]


def _matches(frame: str, table) -> bool:
    function, path = _frame_parts(frame)
    return any(fragment in path and function == name for fragment, name in table)


def py_spy_path() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.path.exists(beside) else shutil.which("py-spy")


class Profiler:
    def __init__(self, pid: int, duration_s: float, out_path: str, cpus: list[int] | None):
        self.pid = pid
        self.duration_s = duration_s
        self.out_path = out_path
        self.cpus = cpus
        self.process: subprocess.Popen | None = None
        self.log_path = out_path + ".log"

    def start(self) -> None:
        binary = py_spy_path()
        if binary is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        cpus = self.cpus
        argv = [binary, "record", "--pid", str(self.pid), "--rate", str(RATE_HZ), "--duration",
                str(max(1, round(self.duration_s))), "--format", "raw", "--threads", "-o", self.out_path]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def finish(self) -> dict:
        try:
            self.process.wait(timeout=self.duration_s + 30)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            self.process.wait(timeout=10)
        if not os.path.exists(self.out_path):
            with open(self.log_path, errors="replace") as f:
                return {"error": f"py-spy wrote nothing: {f.read()[-500:]}"}
        summary = summarize(self.out_path)
        summary["raw_path"] = os.path.basename(self.out_path)
        summary["rate_hz"] = RATE_HZ
        return summary


def layer_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        function, path = _frame_parts(frame)
        for fragment, functions, layer in RULES:
            if fragment in path and (functions is None or function in functions):
                return layer
    return "other (stdlib, interpreter)"


def summarize(raw_path: str, top_n: int = 25) -> dict:
    """Fold py-spy raw output ("thread (tid): name;frame;...;frame count" lines) into shares, kept
    apart for the event-loop thread and for the worker threads: their true CPU differs (from
    /proc: the loop runs flat out, the workers mostly sit in the kernel), so one table over both
    would mean nothing."""
    loop = _Fold()
    workers = _Fold()
    idle = 0
    with open(raw_path, errors="replace") as f:
        for line in f:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            try:
                count = int(count_text)
            except ValueError:
                continue
            parts = stack.split(";")
            is_loop = parts[0].startswith("thread (") and parts[0].partition("): ")[2] == "MainThread"
            frames = parts[1:] if parts[0].startswith("thread (") else parts
            if frames and _matches(frames[-1], IDLE_FRAMES):
                idle += count
                continue
            (loop if is_loop else workers).add(frames, count, top_n)
    return {"event_loop": loop.result(top_n), "workers": {**workers.result(top_n), "idle_samples_dropped": idle}}


class _Fold:
    def __init__(self):
        self.total = 0
        self.layers: dict[str, int] = {}
        self.functions: dict[str, int] = {}  # self time of the innermost frame
        self.stages: dict[str, int] = {}

    def add(self, frames: list[str], count: int, top_n: int) -> None:
        self.total += count
        if frames and _matches(frames[-1], OFF_CPU_FRAMES):
            layer = FSYNC_LAYER
        elif frames and _matches(frames[-1], WAKEUP_FRAMES):
            layer = WAKEUP_LAYER
        else:
            layer = layer_of(frames)
        self.layers[layer] = self.layers.get(layer, 0) + count
        if frames:
            self.functions[frames[-1]] = self.functions.get(frames[-1], 0) + count
        seen = set()
        for frame in frames:
            function, path = _frame_parts(frame)
            for fragment, name, stage in STAGES:
                if function == name and fragment in path and stage not in seen:
                    seen.add(stage)
                    self.stages[stage] = self.stages.get(stage, 0) + count
        if frames and _frame_parts(frames[-1])[0] == "unrolled_run":
            self.stages[RUN_LOOP_STAGE] = self.stages.get(RUN_LOOP_STAGE, 0) + count

    def result(self, top_n: int) -> dict:
        total = self.total

        def shares(counts: dict, limit: int | None = None) -> list[dict]:
            ordered = sorted(counts.items(), key=lambda item: -item[1])[:limit]
            return [{"name": name, "samples": count, "pct": round(100 * count / total, 1)} for name, count in ordered]

        return {"samples": total, "layers": shares(self.layers), "stages_inclusive": shares(self.stages),
                "top_functions_self": shares(self.functions, top_n)}
