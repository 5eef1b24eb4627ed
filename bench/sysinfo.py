"""What the machine is, and how much CPU each process and each core used: read from /proc.

Owns: the machine description every report carries (CPU model, cores, kernel, Python, the file
system under the data directory: fsync on tmpfs is free, and a figure measured there says nothing
about durability), and CPU accounting by deltas of /proc/<pid>/stat (utime+stime of the whole
thread group, so the server's WAL worker threads count) and of /proc/stat per core (which also
sees the kernel's loopback and softirq work that no process is charged for).

Linux only, as the benchmark is.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads) and of every process under it, in seconds;
    None once it is gone. Children count because PostgreSQL serves each connection from a
    process of its own: live ones by their own counters, exited ones by the cutime + cstime their
    parent collected when it reaped them."""
    own = _stat_cpu_s(f"/proc/{pid}/stat", with_reaped=True)
    if own is None:
        return None
    return own + sum(_stat_cpu_s(f"/proc/{child}/stat", with_reaped=True) or 0.0 for child in _descendants(pid))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            parent = int(raw[raw.rindex(b")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def cores_busy_s() -> dict[str, tuple[float, float, float]]:
    """{cpuN: (busy seconds, total seconds, stolen seconds)} since boot, from /proc/stat. Busy
    includes steal: time the hypervisor gave to someone else is time this core did not serve."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *values = line.split()
            ticks = [int(v) for v in values]
            idle = ticks[3] + ticks[4]  # idle + iowait
            total = sum(ticks[:8])  # guest time is already inside user
            out[name] = ((total - idle) / CLOCK_TICKS_PER_S, total / CLOCK_TICKS_PER_S, ticks[7] / CLOCK_TICKS_PER_S)
    return out


def main_thread_cpu_s(pid: int) -> float | None:
    """CPU seconds of a process's main thread alone (its task whose tid is the pid). The rest of
    the process total is its other threads, live or exited: an exited thread's time stays in the
    process total, which is why the split is total minus main and not a sum over live threads."""
    return _stat_cpu_s(f"/proc/{pid}/task/{pid}/stat")


def _stat_cpu_s(path: str, with_reaped: bool = False) -> float | None:
    """utime + stime from a /proc stat file, in seconds (with_reaped: plus cutime + cstime, what
    its waited-for children used). The command name in field 2 may hold spaces; the fields after
    its closing parenthesis don't."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    if with_reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS_PER_S


class CpuSample:
    """CPU counters at one instant; `since(earlier)` gives use over the interval. `split_pid`, if
    given, also gets its CPU split by thread."""

    def __init__(self, pids: dict[str, list[int]], split_pid: int | None = None):
        self.at_s = time.monotonic()
        self.processes = {role: [process_cpu_s(pid) for pid in role_pids] for role, role_pids in pids.items()}
        self.split = (process_cpu_s(split_pid), main_thread_cpu_s(split_pid)) if split_pid is not None else None
        self.cores = cores_busy_s()

    def since(self, earlier: CpuSample) -> dict:
        """{"wall_s", "processes": {role: percent of one core}, "cores": {cpuN: busy percent}}."""
        wall_s = self.at_s - earlier.at_s
        processes = {}
        for role, now_values in self.processes.items():
            before = earlier.processes.get(role, [])
            used = sum(n - b for n, b in zip(now_values, before, strict=True) if n is not None and b is not None)
            processes[role] = round(100 * used / wall_s, 1)
        cores, steal = {}, {}
        for name, (busy, total, stolen) in self.cores.items():
            if name in earlier.cores:
                busy_before, total_before, stolen_before = earlier.cores[name]
                span = total - total_before
                cores[name] = round(100 * (busy - busy_before) / span, 1) if span > 0 else None
                steal[name] = round(100 * (stolen - stolen_before) / span, 1) if span > 0 else None
        threads = {}
        if self.split and earlier.split and None not in self.split + earlier.split:
            total = self.split[0] - earlier.split[0]
            main = self.split[1] - earlier.split[1]
            threads = {"main thread": round(100 * main / wall_s, 1), "other threads": round(100 * (total - main) / wall_s, 1)}
        return {"wall_s": round(wall_s, 3), "processes_pct_of_core": processes, "server_threads_pct_of_core": threads,
                "cores_busy_pct": cores, "cores_steal_pct": steal}


def filesystem_of(path: str) -> str:
    """The file system type holding path (longest matching mount point in /proc/mounts)."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount, fstype = parts[1], parts[2]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


def machine(data_dir: str | None = None) -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        memory_kib = int(f.readline().split()[1])
    description = {
        "cpu_model": model,
        "cpus_online": os.cpu_count(),
        "kernel": platform.release(),
        "memory_gib": round(memory_kib / (1 << 20), 1),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "packages": _package_versions(),
        "git_commit": _git_commit(),
    }
    if data_dir is not None:
        description["data_dir_filesystem"] = filesystem_of(data_dir)
    return description


def _package_versions() -> dict:
    from importlib import metadata
    versions = {}
    for name in ("trio", "h11", "orjson", "cbor2", "zstandard"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "queen"], capture_output=True, text=True,
                               timeout=5, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty-queen" if dirty.stdout.strip() else "")


def wait_quiet(busy_pct_max: float, timeout_s: float, window_s: float = 0.5) -> tuple[bool, float]:
    """Wait until all cores together are busy less than busy_pct_max (% of one core) over a
    window, or timeout_s passes: (quiet, seconds waited). On a shared machine a run that starts
    while another process is busy measures the neighbour as much as the server."""
    started = time.monotonic()
    while True:
        before = cores_busy_s()
        time.sleep(window_s)
        after = cores_busy_s()
        busy = sum(after[name][0] - before[name][0] for name in after if name in before)
        if 100 * busy / window_s < busy_pct_max:
            return True, round(time.monotonic() - started, 1)
        if time.monotonic() - started >= timeout_s:
            return False, round(time.monotonic() - started, 1)
