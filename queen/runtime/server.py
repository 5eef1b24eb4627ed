"""The server's wiring: recovery, shard actors, the WAL writer, the ticker and the HTTP listeners,
each in its nursery, and the order in which they stop.

Shutdown: stop accepting, let requests in flight finish (up to the grace period) while the writer
still commits, close the connections, flush and fsync what is buffered, then stop the actors.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import logging
import os
import time

import trio

from queen import __version__, _native
from queen.auth import Authenticator, AuthFile, AuthFileError
from queen.clock import Clock
from queen.config import Config, host_port, is_loopback, with_port
from queen.core.state import Drain, State
from queen.core.wheel import TICK_MS
from queen.histogram import answered
from queen.http.connection import HttpServer, bind_listeners, connection_budget, start_listening
from queen.http.routes import Api
from queen.http.tls import server_context
from queen.runtime import metrics, port_file
from queen.runtime.backup import take_backup
from queen.runtime.notify import Notifier
from queen.runtime.router import Router
from queen.runtime.shard_actor import ShardActor
from queen.runtime.steps import StepRunner
from queen.runtime.ticker import tick_forever
from queen.wal.disk import Disk
from queen.wal.disk_thread import DiskThread
from queen.wal.recovery import recover
from queen.wal.segment import list_dir
from queen.wal.writer import WalWriter

# The cyclic collector's youngest generation is collected once this many more container objects are
# alive than at its last collection. CPython's 700 is less than one 64-operation transaction holds
# while it is decoded and parsed (about 1,000 dicts, lists and operations): such a request ran a
# collection mid-way, which promoted everything it held, so every tenth ran a middle-generation
# collection (1-5 ms) and the promotions fed full ones (up to 40 ms with 16 clients). Request
# garbage is freed by reference counting, not by the collector, so at 20,000 a server at steady
# state collects only when cycles pile up, each pass a few ms at most (bench/README.md).
GC_YOUNG_THRESHOLD = 20_000


def settle_collector() -> None:
    """Once the server's modules are imported: they live as long as the process, so out of every
    collection (gc.freeze); and the young generation's threshold above."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])

logger = logging.getLogger(__name__)
audit_logger = logging.getLogger("queen.audit")


class DataDirBusy(Exception):
    pass


class AddressInUse(Exception):
    """Another process listens on host:port, which this server was told to bind."""

    def __init__(self, host: str, port: int):
        super().__init__(f"{host}:{port} is in use")
        self.host = host
        self.port = port


def bind_or_refuse(host: str, port: int) -> list:
    try:
        return bind_listeners(host, port)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise AddressInUse(host, port) from None
        raise


def close_all(listeners) -> None:
    for listener in listeners:
        listener.close()  # closing twice is harmless


class Server:
    def __init__(self, config: Config, *, disk: Disk | None = None, wall_at_start_ms: int | None = None,
                 run_blocking=None, notifier: Notifier | None = None):
        self.config = config
        self.notifier = notifier or Notifier(None)  # the service manager (systemd Type=notify), if any
        self.disk = disk or Disk()
        self.run_blocking = run_blocking  # see WalWriter: tests under MockClock run disk work inline
        self.wall_at_start_ms = wall_at_start_ms
        self.port: int | None = None
        self.router: Router | None = None
        self.state: State | None = None
        self.writer: WalWriter | None = None
        self.recovered = None
        self.http: HttpServer | None = None
        self.coordinator = None  # a cluster node's (queen/cluster/coordinator.py); None alone
        self._stop = trio.Event()
        self._lock_fd: int | None = None
        self._port_file_written = False
        self._listeners: list | None = None  # the HTTP sockets, kept across a cluster node's restarts
        self._replication_sockets: list | None = None  # a cluster node's, kept likewise
        self.replication_port: int | None = None  # the one bound (a cluster node's)
        self._restart_reason: str | None = None  # set by the coordinator: run again on the same data dir
        self._wake: trio.Event | None = None  # this run's: shutdown or restart asked
        self.restarts = 0
        self._faults = None  # a cluster node's test-only switches (queen/cluster/faults.py)  # in-process restarts of a cluster node (its memory rebuilt from its log)
        self._reloads: trio.MemorySendChannel | None = None
        self._backups = trio.Lock()
        self.started_at_ms = 0  # the server's clock when it started: its uptime's origin
        self.reloads_done = 0  # SIGHUPs handled, the failed ones included

    def request_shutdown(self) -> None:
        self._stop.set()
        if self._wake is not None:
            self._wake.set()

    def request_restart(self, reason: str) -> None:
        """A cluster node whose log was made to match its leader's (a diverged tail cut, a
        snapshot installed), or whose memory may hold what the leader lacks (it stepped down):
        stop this run and start again on the same data dir, so that recovery rebuilds memory from
        the corrected log. The process, its data dir lock and its HTTP sockets stay."""
        if self._restart_reason is None and not self._stop.is_set():
            self._restart_reason = reason
            if self._wake is not None:
                self._wake.set()

    def reload(self) -> None:
        """Read the auth file (and the TLS certificate) again, as SIGHUP asks; done in the server's
        own task, between requests. A file that cannot be used leaves what is in force."""
        if self._reloads is not None:
            self._reloads.send_nowait(None)

    def _read_auth_file(self) -> AuthFile | None:
        path = self.config.auth_file
        if not path:
            return None
        auth_file = AuthFile.load(path)
        mode = os.stat(path).st_mode & 0o777
        if mode & 0o077:
            logger.warning("event=auth_file_readable_by_others file=%s mode=%o hint='chmod 600 it: it holds no "
                           "secrets, but who may do what is nobody else's business'", path, mode)
        return auth_file

    async def _apply_auth(self, auth_file: AuthFile | None, api: Api) -> None:
        before = api.gate.auth_file
        api.gate = Authenticator(auth_file)
        api.tenancy.configure(auth_file.tenant_settings if auth_file is not None else {})
        await api.tenancy.load_pauses(sorted(_tenant_names(auth_file) - set(api.tenancy.paused)))
        if auth_file is not None and before is not None:  # a reload: what changed
            old = {token.id: token for token in before.tokens}
            new = {token.id: token for token in auth_file.tokens}
            for token_id in sorted(new.keys() - old.keys()):
                token = new[token_id]
                audit_logger.info("event=audit action=token_added token=%r role=%s tenant=%s", token.name, token.role,
                                  token.tenant)
            for token_id in sorted(old.keys() - new.keys()):
                audit_logger.info("event=audit action=token_removed token=%r", old[token_id].name)

    async def _reload_forever(self, receive, api: Api) -> None:
        async for _ in receive:
            self.notifier.reloading()
            try:
                auth_file = self._read_auth_file()
            except AuthFileError as error:
                logger.error("event=reload_failed reason=auth_file detail=%r action=kept_the_one_in_force", str(error))
            else:
                await self._apply_auth(auth_file, api)
                logger.info("event=reloaded auth=%s tokens=%d", "on" if auth_file else "off",
                            len(auth_file.tokens) if auth_file else 0)
            if self.config.tls_cert:
                self.http.reload_tls()
            self.reloads_done += 1
            self._notify_ready()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        # Whatever can refuse the start is tried before the data directory is touched, so that a
        # failed start (a port in use, an unusable auth file, certificate or port file) leaves it
        # as it found it: absent if it was, otherwise unchanged.
        auth_file, tls_context = self._read_auth_file(), self._tls_context()
        if config.port_file:
            port_file.check_writable(config.port_file)
        try:
            self._bind()
            os.makedirs(config.data_dir, mode=0o700, exist_ok=True)  # the data is the tenants': no one else reads it
            self._lock_data_dir()
            try:
                while True:
                    self._restart_reason = None
                    await self._run(task_status, auth_file, tls_context)
                    if self._restart_reason is None or self._stop.is_set():
                        break
                    self.restarts += 1
                    logger.warning("event=restarting reason=%r restarts=%d detail='memory is rebuilt from the log on "
                                   "disk'", self._restart_reason, self.restarts)
                    task_status = trio.TASK_STATUS_IGNORED  # started once, by the first run
                    auth_file, tls_context = self._read_auth_file(), self._tls_context()  # read again, as at a start
            finally:
                os.close(self._lock_fd)
                if config.port_file and self._port_file_written:
                    port_file.remove(config.port_file)
        finally:
            close_all(self._listeners or ())
            close_all(self._replication_sockets or ())

    def _bind(self) -> None:
        """Bind the HTTP port and a cluster node's replication port (port 0: a free one), without
        listening yet: clients are refused, as before, until recovery is done. Kept across a
        cluster node's restarts, so its ports never change while the process lives."""
        config = self.config
        self._listeners = bind_or_refuse(config.host, config.port)
        self.port = self._listeners[0].getsockname()[1]
        if config.cluster:
            host, port = host_port(config.replication_listen)
            self._replication_sockets = bind_or_refuse(host, port)
            self.replication_port = self._replication_sockets[0].getsockname()[1]

    def _tls_context(self):
        """The HTTPS context of --tls-cert/--tls-key, or None. A certificate that cannot be used
        stops the start at once (TlsSetupError, naming the file)."""
        config = self.config
        return server_context(config.tls_cert, config.tls_key) if config.tls_cert else None

    def _lock_data_dir(self) -> None:
        path = os.path.join(self.config.data_dir, "LOCK")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DataDirBusy(f"another queen serve is using {os.path.abspath(self.config.data_dir)}") from None
            raise
        self._lock_fd = fd

    async def _run(self, task_status, auth_file: AuthFile | None, tls_context) -> None:
        config = self.config
        if auth_file is None and not is_loopback(config.host):
            logger.warning("event=insecure host=%s detail='no auth file: anyone who reaches the port may read, write "
                           "and delete everything'", config.host)
        wall_at_start_ms = self.wall_at_start_ms
        if config.cluster:
            self._read_cluster_faults()
            if self._faults.wall_offset_ms:  # test-only: a skewed host clock (N7)
                wall_at_start_ms = (wall_at_start_ms or int(time.time() * 1000)) + self._faults.wall_offset_ms
        clock = Clock(wall_at_start_ms)
        self.started_at_ms = clock.now_ms()
        count = config.shard_count
        state = self.state = State(count, clock.now_ms(), limits=config.limits())

        started = time.perf_counter()
        self.notifier.status(f"recovering {os.path.abspath(config.data_dir)}")
        recovered = await trio.to_thread.run_sync(recover, config.data_dir, state.replay, self.disk)
        state.versions.last = recovered.version_floor
        self.recovered = recovered  # a cluster's replicator starts from the log's last version
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
        api = Api(router, config.limits(), metrics=self.metrics_text, backup=self.backup, server_info=self.server_info)
        send_reload, receive_reload = trio.open_memory_channel(8)
        http = self.http = HttpServer(api, config,
                                      connections_allowed=connection_budget(config.connections_max),
                                      tls_context=tls_context)
        # One connection open: no other request can join its frame, so it commits in its own task.
        # Not with none: then the calls are the server's own (or a test's), perhaps many at once.
        writer.alone = lambda: http.connections == 1

        replicator = None
        if config.cluster:  # only a cluster node loads the cluster modules
            replicator, self.coordinator = self._cluster_node(state, writer, steps, clock,
                                                              self.run_blocking or disk_thread.run_sync, recovered)
            api.cluster = self.coordinator
        writer_done = trio.Event()

        async def run_writer(task_status=trio.TASK_STATUS_IGNORED):
            try:
                await writer.run(task_status=task_status)
            finally:
                writer_done.set()

        async with trio.open_nursery() as core:
            await core.start(run_writer)
            core.start_soon(tick_forever, steps, TICK_MS)
            if replicator is not None:
                start_listening(self._replication_sockets)
                await core.start(replicator.serve)
            # Pauses are read from the log: after recovery (from memory: tenancy.load_pauses).
            await self._apply_auth(auth_file, api)
            if replicator is not None:
                core.start_soon(self.coordinator.run)  # answers 503 no_leader until it knows the leader
            self._reloads = send_reload
            core.start_soon(self._reload_forever, receive_reload, api)
            listeners = self._listeners  # a restart keeps them: clients wait in the backlog meanwhile
            start_listening(listeners)
            wake = self._wake = trio.Event()
            if self._stop.is_set() or self._restart_reason is not None:
                wake.set()
            restart = False
            try:
                async with trio.open_nursery() as connections:
                    async with trio.open_nursery() as accept:
                        accept.start_soon(http.serve, listeners, connections)
                        logger.info("event=listening host=%s port=%d tls=%s auth=%s data_dir=%s shards=%d "
                                    "connections_max=%d compiled=%s" + (" replication_port=%d" if config.cluster else ""),
                                    config.host, self.port, "on" if tls_context else "off",
                                    "on" if auth_file is not None else "off", os.path.abspath(config.data_dir), count,
                                    http.connections_allowed, "true" if _native.COMPILED else "false",
                                    *((self.replication_port,) if config.cluster else ()))
                        if config.port_file and not self._port_file_written:  # once: a restart keeps the ports
                            await (self.run_blocking or trio.to_thread.run_sync)(
                                port_file.write, config.port_file, self.port, self.replication_port)
                            self._port_file_written = True
                        task_status.started(self)
                        self._notify_ready()
                        await wake.wait()
                        restart = self._restart_reason is not None and not self._stop.is_set()
                        logger.info("event=%s connections=%d requests_in_flight=%d",
                                    "restart_started" if restart else "shutdown_started", http.connections,
                                    http.requests_in_flight)
                        if not restart:
                            self.notifier.stopping(f"stopping: {http.requests_in_flight} requests in flight")
                        router.draining = http.draining = True
                        steps.run(Drain())  # parked pops answer 503 now, not at the end of their wait
                        accept.cancel_scope.cancel()
                    if not restart:
                        close_all(listeners)  # no new connections while the last requests finish
                    # A restarting node serves no client (it does not lead): little to wait for.
                    with trio.move_on_after(min(config.shutdown_grace_s, 1.0) if restart else config.shutdown_grace_s):
                        await http.wait_no_requests()
                    connections.cancel_scope.cancel()
                if self.coordinator is not None:
                    with trio.move_on_after(2):
                        await self.coordinator.resign()  # the others need not wait for the lease
            finally:
                self._wake = None
                if not restart:
                    close_all(listeners)  # a cancelled run (a crash under test) closes them too
            writer.close()
            await writer_done.wait()
            core.cancel_scope.cancel()
        if disk_thread is not None:
            disk_thread.close()
        logger.info("event=shutdown_complete durable_version=%d", writer.durable_version)

    def _cluster_node(self, state, writer, steps, clock, run_blocking, recovered):
        from queen.cluster.coordinator import Coordinator, Settings
        from queen.cluster.etcd import EtcdClient
        from queen.cluster.replication import Replicator

        config = self.config
        self._read_cluster_faults()
        replicator = Replicator(node_id=config.node_id, data_dir=config.data_dir,
                                listen=host_port(config.replication_listen), state=state, writer=writer, steps=steps,
                                clock=clock, disk=self.disk, run_blocking=run_blocking, recovered=recovered,
                                cluster=config.cluster, faults=self._faults, sync_timeout_s=config.sync_timeout_s,
                                sockets=self._replication_sockets)
        # What the node publishes (its leader and members/ documents) names the ports it bound,
        # never a 0 it was given.
        settings = Settings(config.cluster, config.node_id, with_port(config.advertise.rstrip("/"), self.port),
                            with_port(config.replication_listen, self.replication_port),
                            leader_ttl_s=config.leader_ttl_s, sync_mode=config.sync_mode,
                            lease_grace_s=config.lease_grace_s)
        etcd = EtcdClient([url.strip() for url in config.etcd.split(",") if url.strip()],
                          timeout_s=min(1.0, config.leader_ttl_s / 4))
        return replicator, Coordinator(settings, etcd, replicator, writer, faults=self._faults,
                                       restart=self.request_restart, on_leading=self._now_leading)

    async def _now_leading(self) -> None:
        """Before a new leader serves: tenant pauses set on the old leader reached this node as
        replicated rows, which its bookkeeping loaded at start has not seen: read them all again."""
        api = self.http.app
        await api.tenancy.load_pauses(sorted(_tenant_names(api.gate.auth_file)))

    def _read_cluster_faults(self) -> None:
        """A cluster node's test-only switches, read once per process (a restart keeps them)."""
        if self._faults is None:
            from queen.cluster import faults

            self._faults = faults.read(os.environ)

    def _notify_ready(self) -> None:
        if not self._stop.is_set():  # once stopping, the manager is told nothing else
            self.notifier.ready(f"listening on {self.config.host}:{self.port}")

    async def backup(self) -> tuple[int, bytes]:
        """GET /api/v1/admin/snapshot: (V, a backup of the whole state at version V). One encoded at
        a time: an encode holds the state's records and their encoding at once, as a checkpoint does."""
        async with self._backups:
            return await take_backup(self.state, self.writer, self.router.now_ms(), __version__)

    async def server_info(self, operator: bool) -> dict:
        """GET /api/v1/server: version and uptime; for the operator also the log's size on disk,
        recent fsync latency, connections and the data directory."""
        now_ms = self.router.now_ms()
        document = {"version": __version__, "startedAt": self.started_at_ms,
                    "uptimeSeconds": round((now_ms - self.started_at_ms) / 1000, 3)}
        if not operator:
            return document
        wal, http = self.writer.statistics(), self.http.statistics()
        series = [*self.http.app.request_series, self.http.unmatched]
        run_blocking = self.run_blocking or trio.to_thread.run_sync  # a directory listing: off the loop
        log_bytes, segments, snapshots = await run_blocking(_log_on_disk, self.config.data_dir)
        document.update(
            dataDir=os.path.abspath(self.config.data_dir),
            log={"bytes": log_bytes, "segments": segments, "snapshots": snapshots,
                 "durableVersion": wal.durable_version, "failed": wal.failed},
            fsync={"lastMs": round(wal.fsync_last_seconds * 1000, 3),
                   "recentMs": round(wal.fsync_recent_seconds * 1000, 3),
                   "meanMs": round(wal.fsync_seconds_total * 1000 / wal.batches, 3) if wal.batches else 0.0,
                   "frames": wal.batches},
            connections={"open": http.connections, "max": http.connections_allowed},
            requestsTotal=http.requests_total, clientErrorsTotal=answered(series, 400, 500),
            serverErrorsTotal=answered(series, 500, 600))
        return document

    def metrics_text(self, tenant: str | None = None) -> str:
        """Every series, or (tenant) only that tenant's."""
        text = self._metrics_text(tenant)
        if self.coordinator is not None and tenant is None:
            text += metrics.render_cluster(self.coordinator.status())
        return text

    def _metrics_text(self, tenant: str | None) -> str:
        now_ms = self.router.now_ms()
        shards = self.state.shards
        tenancy = self.http.app.tenancy
        usage = self.router.usage.of_tenant
        names = sorted({*usage, *tenancy.rules, *tenancy.paused, *(t for t, _ in tenancy.refused)})
        tenant_rows = [(name, usage[name].wire() if name in usage else None,
                        {code: n for (t, code), n in tenancy.refused.items() if t == name},
                        tenancy.paused.get(name, frozenset())) for name in names]
        return metrics.render(self.http.statistics(), self.writer.statistics(), self.state.row_count(),
                              [shard.queues.statistics(now_ms) for shard in shards],
                              [shard.queues.timers.statistics() for shard in shards], tenant_rows, tenant,
                              [shard.locks.statistics() for shard in shards],
                              [*self.http.app.request_series, self.http.unmatched],
                              metrics.process_statistics() if tenant is None else None)


def _tenant_names(auth_file: AuthFile | None) -> set[str]:
    """Every tenant the auth file knows, and the default one."""
    if auth_file is None:
        return {"default"}
    return {"default"} | {token.tenant for token in auth_file.tokens} | set(auth_file.tenant_settings)


def _log_on_disk(data_dir: str) -> tuple[int, int, int]:
    """(bytes, segments, snapshots) of the log's files: segments are allocated whole when created,
    so their size is what they take on disk."""
    segments, snapshots = list_dir(os.listdir(data_dir))
    total = 0
    for name in [*segments.values(), *snapshots.values()]:
        try:
            total += os.stat(os.path.join(data_dir, name)).st_size
        except FileNotFoundError:  # a snapshot replaced it meanwhile
            pass
    return total, len(segments), len(snapshots)
