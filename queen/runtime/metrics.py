"""/metrics: the Prometheus text of every component's statistics() snapshot. This module reads the
components only through those snapshots (and the state's row count), so a counter's home is its
component and its name and help text are here.

The text is written here rather than by prometheus_client: its observations cost several times
ours on the request path (queen/histogram.py has the figures). The tests parse every line of it
with prometheus_client's parser, and with `promtool check metrics` where promtool is installed.

Who sees what: a tenant's own token sees only its own series (its queues, timers, usage); the
server-wide ones (requests, the log, locks, the process, the build) are the operator's, or
everyone's on an open server.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from dataclasses import dataclass

from queen.core import tenants
from queen.core.locks import LockStatistics
from queen.core.queues.model import QueueStatistics
from queen.core.timers import TimerStatistics
from queen.histogram import TIMER_LATE_SECONDS, HistogramSnapshot, RequestSeries
from queen.http.connection import HttpStatistics
from queen.wal.writer import WalStatistics

_QUEUE_GAUGES = {
    "messages": "messages retained, DLQ entries included",
    "pending": "messages a group has yet to be delivered (its lag)",
    "in_flight": "messages delivered under a live lease",
    "dlq": "a group's DLQ entries",
    "oldest_pending_age_seconds": "how long ago the oldest message a group has not finished (pending or in flight) "
                                  "was pushed; 0 when none",
}


@dataclass(frozen=True, slots=True)
class ProcessStatistics:
    """The process as the kernel counts it, read at scrape time (process_statistics())."""
    cpu_seconds: float
    resident_bytes: int | None
    virtual_bytes: int | None
    open_fds: int | None
    max_fds: int
    start_time: float | None  # seconds since the epoch


def process_statistics() -> ProcessStatistics:
    """From /proc (Linux; memory and descriptors are left out elsewhere). These are files the
    kernel makes up on reading, not disk: a scrape reads them on the event loop, in well under a
    millisecond for a few thousand open descriptors."""
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if max_fds == resource.RLIM_INFINITY:
        max_fds = -1
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return ProcessStatistics(usage.ru_utime + usage.ru_stime, None, None, None, max_fds, None)
    ticks = _CLOCK_TICKS
    # fields[0] is the stat line's third field (state): utime is its 14th, so fields[11].
    return ProcessStatistics((int(fields[11]) + int(fields[12])) / ticks, int(fields[21]) * _PAGE_BYTES,
                             int(fields[20]), open_fds, max_fds, _boot_time() + int(fields[19]) / ticks)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_boot: list[float] = []


def _boot_time() -> float:
    if not _boot:
        try:
            with open("/proc/stat", "rb") as stat:
                _boot.append(float(next(line.split()[1] for line in stat if line.startswith(b"btime "))))
        except (OSError, StopIteration):
            _boot.append(time.time() - time.monotonic())
    return _boot[0]


def build_labels() -> str:
    from queen import __version__, _native

    compiled = "true" if _native.COMPILED else "false"  # the hot modules compiled by mypyc (queen/_native.py)
    return f'{{version="{_label(__version__)}",python="{_label(platform.python_version())}",compiled="{compiled}"}}'


def render(http: HttpStatistics, wal: WalStatistics, rows: int, queues: list[QueueStatistics],
           timers: list[TimerStatistics], tenant_rows: list[tuple] = (), tenant: str | None = None,
           locks: list[LockStatistics] = (), requests: list[RequestSeries] = (),
           process: ProcessStatistics | None = None) -> str:
    """queues and timers: one snapshot per shard; tenant_rows: (tenant, usage dict or None,
    {code: refused count}, paused areas) of each tenant. tenant: render only what is that
    tenant's (its queues, its timers, its usage), as a tenant's own token sees /metrics; None for
    everything. requests: every route's series; process: None leaves the process_* series out."""
    out = []

    def metric(name: str, kind: str, help_text: str, samples) -> None:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        if not isinstance(samples, list):
            samples = [("", samples)]
        out.extend(f"{name}{labels} {value}\n" for labels, value in samples)

    def queue_labels(stored: str, extra: str = "") -> str | None:
        """A queue's labels (with `tenant` for a named tenant's, when every tenant is shown), or
        None when the queue is not the viewer's."""
        owner = tenants.tenant_of(stored)
        if tenant is not None:
            return f'{{queue="{_label(tenants.shown(stored))}"{extra}}}' if owner == tenant else None
        named = f',tenant="{_label(owner)}"' if owner != tenants.DEFAULT else ""
        return f'{{queue="{_label(tenants.shown(stored))}"{named}{extra}}}'

    tenant_samples = [row for row in tenant_rows if tenant is None or row[0] == tenant]
    usage_samples = [(f'{{tenant="{_label(name)}",what="{what}"}}', value)
                     for name, usage, _, _ in tenant_samples if usage for what, value in usage.items()]
    refused_samples = [(f'{{tenant="{_label(name)}",code="{code}"}}', n)
                       for name, _, refused, _ in tenant_samples for code, n in sorted(refused.items())]
    paused_samples = [(f'{{tenant="{_label(name)}",area="{area}"}}', int(area in paused))
                      for name, _, _, paused in tenant_samples for area in ("kv", "queues")]
    if tenant is not None:
        _queue_metrics(metric, queues, timers, queue_labels)
        _tenant_metrics(metric, usage_samples, refused_samples, paused_samples)
        return "".join(out)

    metric("queen_build_info", "gauge", "always 1: the Queen version, the Python running it, and whether its core is compiled", [(build_labels(), 1)])
    if process is not None:
        _process_metrics(metric, process)
    metric("queen_requests_total", "counter", "HTTP requests answered", http.requests_total)
    metric("queen_http_request_duration_seconds", "histogram",
           "seconds from a request read whole to its answer ready, by route template, method and status "
           "(its _count: requests answered); route unmatched: no route takes that method and path",
           [row for series in requests for status, histogram in sorted(series.by_status.items())
            for row in histogram.snapshot().samples(
                f'route="{_label(series.route)}",method="{series.method}",status="{status}"')])
    metric("queen_connections", "gauge", "open HTTP connections", http.connections)
    metric("queen_connections_allowed", "gauge", "the connection limit in force (lowered to fit the open-file limit)",
           http.connections_allowed)
    metric("queen_connections_refused_total", "counter",
           "connections answered 503 at the limit, every connection busy with a request", http.connections_refused)
    metric("queen_connections_idle_closed_total", "counter",
           "idle keep-alive connections closed to make room for new ones", http.idle_closed)
    metric("queen_connections_parks_ended_total", "counter",
           "parked calls answered early (as their wait running out) to make room for new connections",
           http.parks_ended)
    metric("queen_connections_timed_out_total", "counter",
           "connections cut off: a request that did not arrive, or an answer not taken, in time", http.timeouts)
    metric("queen_wal_batches_total", "counter", "WAL frames written (one fsync each)", wal.batches)
    metric("queen_wal_records_total", "counter", "effect records written to the WAL", wal.records_written)
    metric("queen_wal_bytes_total", "counter", "bytes written to WAL segments", wal.bytes_written)
    metric("queen_wal_fsync_seconds_total", "counter", "time spent in write+fsync of WAL frames",
           round(wal.fsync_seconds_total, 6))
    metric("queen_wal_fsync_seconds", "histogram", "seconds each WAL frame's write + fsync took",
           wal.fsync_seconds.samples())
    metric("queen_wal_frame_bytes", "histogram", "bytes in each WAL frame written", wal.frame_bytes.samples())
    metric("queen_wal_bytes_since_snapshot", "gauge",
           "WAL bytes written since the last snapshot began: what a restart replays; it keeps growing when "
           "snapshots fail", wal.bytes_since_snapshot)
    metric("queen_wal_inline_commits_total", "counter",
           "frames written and fsynced on the event loop rather than the disk thread", wal.inline_commits)
    metric("queen_wal_failed", "gauge", "1 when a write or fsync failed and writes are refused", int(wal.failed))
    metric("queen_snapshots_total", "counter", "snapshots written", wal.snapshots_written)
    metric("queen_log_durable_version", "gauge",
           "the log position made durable last: the version of the newest record fsynced", wal.durable_version)
    metric("queen_log_version_ceiling", "gauge",
           "log versions up to this are reserved on disk; a restart continues above it", wal.ceiling)
    metric("queen_rows", "gauge", "rows held in memory (expired rows not yet freed included)", rows)
    metric("queen_lock_permits", "gauge", "lock and semaphore permits held (those expired and not yet freed "
           "included)", sum(s.permits for s in locks))
    metric("queen_lock_waiters", "gauge", "acquires parked now, waiting (waitMs) for a permit to be released",
           sum(s.waiters for s in locks))
    metric("queen_lock_acquires_total", "counter", "acquires answered, by result: granted, held (refused at "
           "once), timeout (its wait ran out), cancelled (its client left)",
           [(f'{{result="{result}"}}', sum(s.acquires[result] for s in locks))
            for result in ("granted", "held", "timeout", "cancelled")] if locks else [])
    metric("queen_lock_expiries_total", "counter", "permits freed because their lifetime ran out (a holder that "
           "did not renew)", sum(s.expired for s in locks))

    _queue_metrics(metric, queues, timers, queue_labels)
    _tenant_metrics(metric, usage_samples, refused_samples, paused_samples)
    metric("queen_push_total", "counter", "pushed items by result", [
        ('{result="queued"}', sum(s.pushed for s in queues)),
        ('{result="duplicate"}', sum(s.duplicates for s in queues)),
        ('{result="failed"}', sum(s.push_failed for s in queues))])
    metric("queen_pops_parked", "gauge", "pops waiting for a message now (consumers idle on an empty queue)",
           sum(s.pops_parked for s in queues))
    metric("queen_pop_wait_seconds", "summary", "how long parked pops waited before they were served", [
        ("_sum", sum(s.pop_wait_ms_total for s in queues) / 1000), ("_count", sum(s.pop_waits for s in queues))])

    fired = sum(t.fired for t in timers)
    metric("queen_timers_pending", "gauge", "timers scheduled and not yet fired or cancelled",
           sum(t.pending for t in timers))
    metric("queen_timers_fired_total", "counter",
           "timers fired (each removed and its message appended in one record)", fired)
    metric("queen_timer_fire_duplicates_total", "counter",
           "fires that appended nothing: their transactionId was already in the partition",
           sum(t.fire_duplicates for t in timers))
    metric("queen_timer_fire_late_seconds", "histogram",
           "seconds each timer fired after its due time (server clock; fire time minus due time)",
           HistogramSnapshot.merged(TIMER_LATE_SECONDS, [t.late for t in timers]).samples())
    metric("queen_timer_fire_late_seconds_max", "gauge", "the latest any timer fired since the start",
           max((t.late_ms_max for t in timers), default=0) / 1000)
    return "".join(out)


def _process_metrics(metric, process: ProcessStatistics) -> None:
    """The standard process_* series, named as every Prometheus client library names them."""
    metric("process_cpu_seconds_total", "counter", "user and system CPU time spent, in seconds",
           round(process.cpu_seconds, 3))
    if process.resident_bytes is not None:
        metric("process_resident_memory_bytes", "gauge", "resident memory size, in bytes", process.resident_bytes)
        metric("process_virtual_memory_bytes", "gauge", "virtual memory size, in bytes", process.virtual_bytes)
        metric("process_open_fds", "gauge", "open file descriptors", process.open_fds)
    metric("process_max_fds", "gauge", "the open-file limit (soft); -1: unlimited", process.max_fds)
    if process.start_time is not None:
        metric("process_start_time_seconds", "gauge", "when the process started, in seconds since the epoch",
               round(process.start_time, 2))


def _queue_metrics(metric, queues: list[QueueStatistics], timers: list[TimerStatistics], queue_labels) -> None:
    """The per-queue series, of the queues queue_labels gives labels for."""
    by_what: dict[str, list] = {what: [] for what in _QUEUE_GAUGES}
    for shard in queues:
        for queue, group, what, value in shard.gauges:
            labels = queue_labels(queue, f',group="{_label(group)}"' if group else "")
            if labels is not None:
                by_what[what].append((labels, value))
    for what, help_text in _QUEUE_GAUGES.items():
        metric(f"queen_queue_{what}", "gauge", help_text, by_what[what])
    redeliveries = []
    for cause in ("failed", "expired"):
        for shard in queues:
            counts = shard.redelivered_failed if cause == "failed" else shard.redelivered_expired
            redeliveries += [(labels, n) for queue, n in sorted(counts.items())
                             if (labels := queue_labels(queue, f',cause="{cause}"')) is not None]
    metric("queen_redeliveries_total", "counter", "deliveries that ended without completion and were returned, by "
           "queue and cause (a failed ack, or the lease expired)", redeliveries)
    metric("queen_dlq_moves_total", "counter", "messages moved to a DLQ, by queue",
           [(labels, n) for shard in queues for queue, n in sorted(shard.dlq_moves.items())
            if (labels := queue_labels(queue)) is not None])

    def by_queue(counts_of) -> list:
        return [(labels, n) for shard in queues for queue, n in sorted(counts_of(shard).items())
                if (labels := queue_labels(queue)) is not None]

    # Since the start: the counters the dashboard's push, pop and ack rates come from.
    metric("queen_queue_pushed_total", "counter", "messages appended to a queue (timer fires included)",
           by_queue(lambda shard: shard.pushed_by_queue))
    metric("queen_queue_popped_total", "counter", "messages delivered by pops",
           by_queue(lambda shard: shard.popped_by_queue))
    metric("queen_queue_acked_total", "counter", "messages completed: acked, or auto-acked as they were delivered",
           by_queue(lambda shard: shard.acked_by_queue))
    metric("queen_queue_timers_pending", "gauge", "timers scheduled into a queue and not yet fired or cancelled",
           [(labels, n) for shard in timers for queue, n in sorted(shard.pending_by_queue)
            if (labels := queue_labels(queue)) is not None])


def _tenant_metrics(metric, usage, refused, paused) -> None:
    metric("queen_tenant_usage", "gauge", "what a named tenant holds, against its quotas: keys (KV and lock rows), "
           "bytes, messages, timers", usage)
    metric("queen_tenant_refused_total", "counter", "writes refused by a tenant's rate (rate_limited) or quotas "
           "(quota_*)", refused)
    metric("queen_tenant_paused", "gauge", "1 while an admin has paused the tenant's kv or queues writes", paused)


def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


CLUSTER_ROLES = ("starting", "follower", "candidate", "promoting", "leader", "fenced")


def render_cluster(status: dict) -> str:
    """A cluster node's series (queen/cluster/coordinator.py's status document): its role, the
    epoch it leads or follows, whether the sync set is short or out of reach, and (on the leader)
    each follower's lag."""
    node = _label(status["node"])
    out = ["# HELP queen_cluster_role 1 for the role this node has now (leader, follower, ...)\n"
           "# TYPE queen_cluster_role gauge\n"]
    out.extend(f'queen_cluster_role{{node="{node}",role="{role}"}} {int(status["role"] == role)}\n'
               for role in CLUSTER_ROLES)
    out.append("# HELP queen_cluster_epoch the epoch this node leads or follows (0: none yet)\n"
               f"# TYPE queen_cluster_epoch gauge\nqueen_cluster_epoch{{node=\"{node}\"}} {status['epoch']}\n")
    out.append("# HELP queen_cluster_degraded 1 while the leader's sync set has fewer members than it wants: writes "
               "are acknowledged on fewer copies (a follower shows what etcd says)\n"
               f"# TYPE queen_cluster_degraded gauge\nqueen_cluster_degraded{{node=\"{node}\"}} "
               f"{int(status['degraded'])}\n")
    out.append("# HELP queen_cluster_sync_unavailable 1 while the leader's sync set is out of reach: writes answer 503 "
               "sync_unavailable (a follower shows what the leader announced)\n"
               "# TYPE queen_cluster_sync_unavailable gauge\n"
               f"queen_cluster_sync_unavailable{{node=\"{node}\"}} {int(status['syncUnavailable'])}\n")
    out.append("# HELP queen_cluster_follower_lag_versions versions the leader has that a follower has not acked\n"
               "# TYPE queen_cluster_follower_lag_versions gauge\n")
    out.extend(f'queen_cluster_follower_lag_versions{{follower="{_label(f["node"])}"}} {f["lagVersions"]}\n'
               for f in status["followers"])
    out.append("# HELP queen_cluster_follower_connected 1 while the follower's replication stream is up\n"
               "# TYPE queen_cluster_follower_connected gauge\n")
    out.extend(f'queen_cluster_follower_connected{{follower="{_label(f["node"])}"}} {int(f["connected"])}\n'
               for f in status["followers"])
    return "".join(out)
