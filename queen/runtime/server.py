"""The server's wiring: recovery, shard actors, the WAL writer, the ticker and the HTTP listeners,
each in its nursery, and the order in which they stop.

Shutdown: stop accepting, let requests in flight finish (up to the grace period) while the writer
still commits, close the connections, flush and fsync what is buffered, then stop the actors.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time

import trio

from queen.clock import Clock
from queen.config import Config
from queen.core.queues import views as queue_views
from queen.core.state import Drain, State
from queen.core.wheel import TICK_MS
from queen.http.connection import HttpServer, connection_budget, open_listeners
from queen.http.routes import Api
from queen.runtime.router import Router, tick_forever
from queen.runtime.shard_actor import ShardActor
from queen.runtime.steps import StepRunner
from queen.wal.disk import Disk
from queen.wal.disk_thread import DiskThread
from queen.wal.recovery import recover
from queen.wal.writer import WalWriter

logger = logging.getLogger(__name__)

def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class DataDirBusy(Exception):
    pass


class Server:
    def __init__(self, config: Config, *, disk: Disk | None = None, wall_at_start_ms: int | None = None,
                 run_blocking=None):
        self.config = config
        self.disk = disk or Disk()
        self.run_blocking = run_blocking  # see WalWriter: tests under MockClock run disk work inline
        self.wall_at_start_ms = wall_at_start_ms
        self.port: int | None = None
        self.router: Router | None = None
        self.state: State | None = None
        self.writer: WalWriter | None = None
        self.http: HttpServer | None = None
        self._stop = trio.Event()
        self._lock_fd: int | None = None

    def request_shutdown(self) -> None:
        self._stop.set()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        os.makedirs(config.data_dir, exist_ok=True)
        self._lock_data_dir()
        try:
            await self._run(task_status)
        finally:
            os.close(self._lock_fd)

    def _lock_data_dir(self) -> None:
        path = os.path.join(self.config.data_dir, "LOCK")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DataDirBusy(f"another queen serve is using {os.path.abspath(self.config.data_dir)}") from None
            raise
        self._lock_fd = fd

    async def _run(self, task_status) -> None:
        config = self.config
        clock = Clock(self.wall_at_start_ms)
        count = config.shard_count
        state = self.state = State(count, clock.now_ms(), limits=config.limits())

        started = time.perf_counter()
        recovered = await trio.to_thread.run_sync(recover, config.data_dir, state.replay, self.disk)
        state.versions.last = recovered.version_floor
        logger.info("event=recovered snapshot_version=%d snapshot_records=%d segments=%d frames=%d records=%d "
                    "truncated_bytes=%d quarantined=%d last_version=%d ceiling=%d versions_from=%d rows=%d seconds=%.3f",
                    recovered.snapshot_version, recovered.snapshot_records, recovered.segments, recovered.frames,
                    recovered.records, recovered.truncated_bytes, len(recovered.quarantined), recovered.last_version,
                    recovered.ceiling, recovered.version_floor + 1, state.row_count(), time.perf_counter() - started)

        disk_thread = None
        if self.run_blocking is None:
            disk_thread = DiskThread()
        writer = self.writer = WalWriter(
            config.data_dir, disk=self.disk, next_segment=recovered.next_segment,
            durable_version=recovered.version_floor, ceiling=recovered.ceiling,
            segment_bytes_max=config.segment_bytes_max, snapshot_wal_bytes=config.snapshot_wal_bytes,
            capture_state=state.snapshot_capture, run_blocking=self.run_blocking or disk_thread.run_sync,
            inline_allowed=self.run_blocking is None)
        steps = StepRunner(state, writer, clock)
        actors = [ShardActor(i, steps) for i in range(count)]
        router = self.router = Router(actors, steps)
        http = self.http = HttpServer(Api(router, config.limits(), metrics=self.metrics_text), config,
                                      connections_allowed=connection_budget(config.connections_max))

        writer_done = trio.Event()

        async def run_writer(task_status=trio.TASK_STATUS_IGNORED):
            try:
                await writer.run(task_status=task_status)
            finally:
                writer_done.set()

        async with trio.open_nursery() as core:
            await core.start(run_writer)
            for actor in actors:
                core.start_soon(actor.run)
            core.start_soon(tick_forever, steps, TICK_MS)
            listeners = open_listeners(config.host, config.port)
            self.port = listeners[0].getsockname()[1]
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accept:
                    accept.start_soon(http.serve, listeners, connections)
                    logger.info("event=listening host=%s port=%d data_dir=%s shards=%d connections_max=%d",
                                config.host, self.port, os.path.abspath(config.data_dir), count,
                                http.connections_allowed)
                    task_status.started(self)
                    await self._stop.wait()
                    logger.info("event=shutdown_started connections=%d requests_in_flight=%d",
                                http.connections, http.requests_in_flight)
                    router.draining = http.draining = True
                    steps.run(Drain())  # parked pops answer 503 now, not at the end of their wait
                    accept.cancel_scope.cancel()
                for listener in listeners:
                    listener.close()
                with trio.move_on_after(config.shutdown_grace_s):
                    await http.wait_no_requests()
                connections.cancel_scope.cancel()
            writer.close()
            await writer_done.wait()
            core.cancel_scope.cancel()
        if disk_thread is not None:
            disk_thread.close()
        logger.info("event=shutdown_complete durable_version=%d", writer.durable_version)

    def metrics_text(self) -> str:
        writer, http = self.writer, self.http
        rows = self.state.row_count()
        lines = [
            ("queen_requests_total", "counter", "HTTP requests answered", http.requests_total),
            ("queen_connections", "gauge", "open HTTP connections", http.connections),
            ("queen_connections_allowed", "gauge", "the connection limit in force (lowered to fit the open-file limit)", http.connections_allowed),
            ("queen_connections_refused_total", "counter", "connections answered 503 at the limit with none idle", http.connections_refused),
            ("queen_connections_idle_closed_total", "counter", "idle keep-alive connections closed to make room for new ones", http.idle_closed),
            ("queen_connections_timed_out_total", "counter", "connections cut off: a request that did not arrive, or an answer not taken, in time", http.timeouts),
            ("queen_wal_batches_total", "counter", "WAL frames written (one fsync each)", writer.batches),
            ("queen_wal_records_total", "counter", "effect records written to the WAL", writer.records_written),
            ("queen_wal_bytes_total", "counter", "bytes written to WAL segments", writer.bytes_written),
            ("queen_wal_fsync_seconds_total", "counter", "time spent in write+fsync of WAL frames", round(writer.fsync_seconds_total, 6)),
            ("queen_wal_inline_commits_total", "counter", "frames written and fsynced on the event loop rather than the disk thread", writer.inline_commits),
            ("queen_wal_failed", "gauge", "1 when a write or fsync failed and writes are refused", int(writer.failed is not None)),
            ("queen_snapshots_total", "counter", "snapshots written", writer.snapshots_written),
            ("queen_version", "gauge", "the last durable version", writer.durable_version),
            ("queen_version_ceiling", "gauge", "versions up to this are reserved on disk; a restart continues above it", writer.ceiling),
            ("queen_rows", "gauge", "rows held in memory (expired rows not yet freed included)", rows),
        ]
        out = []
        for name, kind, help_text, value in lines:
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name} {value}\n")
        out.append(self._queue_metrics())
        return "".join(out)

    def _queue_metrics(self) -> str:
        now_ms = self.router.steps.clock.now_ms()
        tables = [shard.queues for shard in self.state.shards]
        stats = [table.stats for table in tables]
        gauges = {"messages": [], "pending": [], "in_flight": [], "dlq": []}
        for table in tables:
            for queue, group, what, value in queue_views.gauges(table.queues, now_ms):
                labels = f'queue="{_label(queue)}"' + (f',group="{_label(group)}"' if group else "")
                gauges[what].append(f"queen_queue_{what}{{{labels}}} {value}\n")
        helps = {"messages": "messages retained, DLQ entries included", "pending": "messages a group has yet to be "
                 "delivered (its lag)", "in_flight": "messages delivered under a live lease", "dlq": "a group's DLQ entries"}
        out = []
        for what, rows in gauges.items():
            out.append(f"# HELP queen_queue_{what} {helps[what]}\n# TYPE queen_queue_{what} gauge\n")
            out += rows
        pushed = sum(s.pushed for s in stats)
        duplicates = sum(s.duplicates for s in stats)
        failed = sum(s.push_failed for s in stats)
        out.append("# HELP queen_push_total pushed items by result\n# TYPE queen_push_total counter\n"
                   f'queen_push_total{{result="queued"}} {pushed}\nqueen_push_total{{result="duplicate"}} {duplicates}\n'
                   f'queen_push_total{{result="failed"}} {failed}\n')
        out.append("# HELP queen_redeliveries_total deliveries that ended without completion and were returned\n"
                   "# TYPE queen_redeliveries_total counter\n"
                   f'queen_redeliveries_total{{cause="failed"}} {sum(s.redelivered_failed for s in stats)}\n'
                   f'queen_redeliveries_total{{cause="expired"}} {sum(s.redelivered_expired for s in stats)}\n')
        out.append("# HELP queen_dlq_moves_total messages moved to a DLQ\n# TYPE queen_dlq_moves_total counter\n"
                   f"queen_dlq_moves_total {sum(s.dlq_moves for s in stats)}\n")
        out.append("# HELP queen_pop_wait_seconds how long parked pops waited before they were served\n"
                   "# TYPE queen_pop_wait_seconds summary\n"
                   f"queen_pop_wait_seconds_sum {sum(t.parked.wait_ms_total for t in tables) / 1000}\n"
                   f"queen_pop_wait_seconds_count {sum(t.parked.served_total for t in tables)}\n")
        timers = [table.timers.stats for table in tables]
        fired = sum(t.fired for t in timers)
        out.append("# HELP queen_timers_pending timers scheduled and not yet fired or cancelled\n"
                   f"# TYPE queen_timers_pending gauge\nqueen_timers_pending {self.state.queues.timers}\n"
                   "# HELP queen_timers_fired_total timers fired (each removed and its message appended in one record)\n"
                   f"# TYPE queen_timers_fired_total counter\nqueen_timers_fired_total {fired}\n"
                   "# HELP queen_timer_fire_duplicates_total fires that appended nothing: their transactionId was "
                   "already in the partition\n# TYPE queen_timer_fire_duplicates_total counter\n"
                   f"queen_timer_fire_duplicates_total {sum(t.fire_duplicates for t in timers)}\n"
                   "# HELP queen_timer_fire_late_seconds how long after its time each timer fired (server clock)\n"
                   "# TYPE queen_timer_fire_late_seconds summary\n"
                   f"queen_timer_fire_late_seconds_sum {sum(t.late_ms_total for t in timers) / 1000}\n"
                   f"queen_timer_fire_late_seconds_count {fired}\n"
                   "# HELP queen_timer_fire_late_seconds_max the latest any timer fired since the start\n"
                   "# TYPE queen_timer_fire_late_seconds_max gauge\n"
                   f"queen_timer_fire_late_seconds_max {max((t.late_ms_max for t in timers), default=0) / 1000}\n")
        return "".join(out)
