"""The server's configuration: one frozen object, resolved once in queen/cli/serve.py, passed explicitly.

Every field carries its unit in its name, a default, and the reason for that default. The CLI
builds its flags and QUEEN_* environment variables from these fields, so `queen serve --help`
cannot drift from what the server actually reads.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from queen.core.limits import Limits

# The settings whose values are a fixed set: validate() checks them, and `queen serve` offers them
# as its flags' choices (in --help, and to tab completion).
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("logfmt", "json")
SYNC_MODES = ("strict", "degrade")
CHOICES = {"log_level": LOG_LEVELS, "log_format": LOG_FORMATS, "sync_mode": SYNC_MODES}


def _opt(default, help_text: str, metavar: str = ""):
    return field(default=default, metadata={"help": help_text, "metavar": metavar})


@dataclass(frozen=True, slots=True)
class Config:
    host: str = _opt("127.0.0.1", "address to listen on; loopback by default so nothing is exposed by accident", "ADDR")
    port: int = _opt(6632, "TCP port to listen on; 0 takes a free one, named in the start line (event=listening "
                     "port=N) and in --port-file", "PORT")
    port_file: str = _opt("", "once listening, write the bound ports here as one line of JSON, "
                          '{"port": N} (a cluster node adds "replicationPort": M), by a rename, so no reader sees '
                          "half of it; removed at a clean exit. What starts a server on port 0 reads it", "FILE")
    data_dir: str = _opt("./queen-data", "directory for the write-ahead log and snapshots", "DIR")
    shard_count: int = _opt(4, "shard actors; each owns the keys that hash to it (all slots of a lock share one)", "N")
    body_bytes_max: int = _opt(1 << 20, "largest request body accepted; larger answers 413", "BYTES")
    header_bytes_max: int = _opt(16 << 10, "largest request head (request line + headers); larger answers 431/400", "BYTES")
    request_read_timeout_s: float = _opt(10.0, "a request must arrive whole within this; a stalled client is cut off", "SECONDS")
    idle_timeout_s: float = _opt(60.0, "an idle keep-alive connection is closed after this", "SECONDS")
    send_timeout_s: float = _opt(10.0, "an answer must be taken by the client within this; one that does not read is cut off", "SECONDS")
    connections_max: int = _opt(1024, "concurrent connections (lowered at start to what the open-file limit allows); "
                                "at the limit a new one takes the place of the longest-idle keep-alive connection, "
                                "else of the call parked longest (answered as if its wait ran out), else gets 503", "N")
    ops_per_call_max: int = _opt(1024, "operations in one call: a KV batch, a transaction (all sections), a push, an ack batch, a timers call", "N")
    value_bytes_max: int = _opt(256 << 10, "largest KV value or message payload, measured as its JSON encoding", "BYTES")
    ns_bytes_max: int = _opt(128, "longest KV namespace", "BYTES")
    key_bytes_max: int = _opt(1024, "longest KV key (a lock permit's key is its name, '#' and its slot)", "BYTES")
    pop_bytes_max: int = _opt(4 << 20, "payload bytes one pop answers at most (it always holds at least one message)", "BYTES")
    partitions_per_queue_max: int = _opt(100_000, "partitions one queue may have; a push that would open one more is failed (partition_limit)", "N")
    queues_max: int = _opt(10_000, "queues the server holds; a push, pop or configure that would create one more answers storage_full", "N")
    queue_bytes_max: int = _opt(1 << 30, "payload bytes (and producer ids kept for dedupe) all queues retain; past it a push is failed (storage_full)", "BYTES")
    timers_max: int = _opt(10_000_000, "pending timers, all queues; a schedule past it answers storage_full", "N")
    segment_bytes_max: int = _opt(64 << 20, "a WAL segment file is allocated at this size when created, and a new one started once it is full", "BYTES")
    snapshot_wal_bytes: int = _opt(32 << 20, "take a snapshot once this many WAL bytes were written since the last one; then covered segments are deleted", "BYTES")
    shutdown_grace_s: float = _opt(10.0, "on SIGTERM/SIGINT, time allowed for in-flight requests before connections are cut", "SECONDS")
    log_level: str = _opt("info", "diagnostic log level on stderr: debug, info, warning, error", "LEVEL")
    log_format: str = _opt("logfmt", "log lines on stderr as logfmt or json, one per event, UTC timestamps", "FORMAT")
    access_log: bool = _opt(False, "one line per answered request on stderr, with the other logs (logger queen.access, "
                            "whatever --log-level says): method, route, status, duration_ms, bytes, request_id, "
                            "token, tenant, remote; off by default, as it is a line per call")
    auth_file: str = _opt("", "tokens, roles, tenants and their quotas (JSON; `queen auth add` writes it); re-read on "
                          "SIGHUP. Without it every caller may do everything, so the server only binds loopback "
                          "addresses unless --insecure is given", "FILE")
    insecure: bool = _opt(False, "listen on a non-loopback address without an auth file: anyone who reaches the port "
                          "may read, write and delete everything")
    tls_cert: str = _opt("", "serve HTTPS with this certificate chain (PEM); re-read on SIGHUP", "FILE")
    tls_key: str = _opt("", "the private key (PEM) of --tls-cert", "FILE")
    # High availability (README "High availability"): without --cluster none of these is used.
    cluster: str = _opt("", "run as a node of this cluster: a leader chosen through etcd, its log replicated to the "
                        "other nodes; without it the server runs alone, as always", "NAME")
    node_id: str = _opt("", "this node's name in the cluster, unique and stable across restarts (--node)", "ID")
    etcd: str = _opt("", "etcd client URLs, comma-separated (http://host:2379,...)", "URLS")
    advertise: str = _opt("", "the URL clients reach this node at; other nodes redirect clients to it (a port of 0 "
                          "stands for the one --port bound)", "URL")
    replication_listen: str = _opt("", "address followers connect to for the log (HOST:PORT; port 0 takes a free "
                                   "one, which the node advertises)", "HOST:PORT")
    leader_ttl_s: float = _opt(5.0, "the leader's etcd lease (--leader-ttl): a dead leader is replaced after about "
                               "this long; shorter fails over faster but costs more keepalives", "SECONDS")
    sync_mode: str = _opt("strict", "when a synchronous follower fails: strict stalls writes until it returns or a "
                          "caught-up follower takes its place (3 nodes); degrade goes on with the leader's copy alone "
                          "(2 nodes)", "MODE")
    lease_grace_s: float = _opt(0.0, "after a failover, live locks and queue leases last at least this long on the new "
                                "leader (--lease-grace); 0: the leader ttl", "SECONDS")
    # 5 s: well past a sync member's swap or drop (1 s without an ack), so a healthy cluster never
    # hits it, yet below the SDK's and the CLI's own 10 s timeout, so their client reads why (and
    # whether the write may have been applied) instead of timing out with no answer.
    sync_timeout_s: float = _opt(5.0, "the longest a write (or a read behind it) waits for the leader's sync set "
                                 "(--sync-timeout); then it answers 503 sync_unavailable, and new writes are refused "
                                 "at once until the sync set is back", "SECONDS")

    def replace(self, **changes) -> Config:
        return dataclasses.replace(self, **changes)

    def limits(self) -> Limits:
        return Limits(ns_bytes_max=self.ns_bytes_max, key_bytes_max=self.key_bytes_max,
                      value_bytes_max=self.value_bytes_max, ops_per_call_max=self.ops_per_call_max,
                      pop_bytes_max=self.pop_bytes_max, partitions_per_queue_max=self.partitions_per_queue_max,
                      queues_max=self.queues_max, queue_bytes_max=self.queue_bytes_max, timers_max=self.timers_max)


def config_fields():
    """(name, type, default, help, metavar) of every setting, in declaration order."""
    for f in dataclasses.fields(Config):
        yield f.name, f.type, f.default, f.metadata["help"], f.metadata["metavar"]


def validate(config: Config) -> list[str]:
    """Human sentences for every setting that cannot work; empty when the config is sound."""
    problems = []
    if not 0 <= config.port <= 65535:
        problems.append(f"port {config.port} is not between 0 and 65535")
    if not 1 <= config.shard_count <= 256:
        problems.append("shard count must be between 1 and 256")
    for name in ("body_bytes_max", "header_bytes_max", "connections_max", "segment_bytes_max", "snapshot_wal_bytes"):
        if getattr(config, name) < 1:
            problems.append(f"{name.replace('_', '-')} must be at least 1")
    problems += config.limits().problems()
    for name in ("request_read_timeout_s", "idle_timeout_s", "send_timeout_s", "shutdown_grace_s"):
        if getattr(config, name) <= 0:
            problems.append(f"{name.replace('_', '-')} must be above 0")
    if config.log_level.lower() not in LOG_LEVELS:
        problems.append(f"log level {config.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    if config.log_format not in LOG_FORMATS:
        problems.append(f"log format {config.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    if bool(config.tls_cert) != bool(config.tls_key):
        problems.append("--tls-cert and --tls-key go together: give both, or neither")
    if not config.auth_file and not config.insecure and not is_loopback(config.host):
        problems.append(f"refusing to listen on {config.host} without --auth-file: anyone who reaches the port could "
                        "read, write and delete everything; give --auth-file FILE (see `queen auth add`), or "
                        "--insecure to run open anyway")
    problems += cluster_problems(config)
    return problems


CLUSTER_FIELDS = ("node_id", "etcd", "advertise", "replication_listen")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def cluster_problems(config: Config) -> list[str]:
    if not config.cluster:
        given = [name for name in CLUSTER_FIELDS if getattr(config, name)]
        if given:
            flag = "node" if given[0] == "node_id" else given[0].replace("_", "-")
            return [f"--{flag} is for a cluster node: give --cluster NAME too"]
        return []
    problems = []
    if not _NAME.fullmatch(config.cluster):
        problems.append(f"cluster name {config.cluster!r}: 1 to 64 letters, digits, '_', '.', '-'")
    for name in CLUSTER_FIELDS:
        if not getattr(config, name):
            problems.append(f"--cluster needs --{'node' if name == 'node_id' else name.replace('_', '-')} too")
    if config.node_id and not _NAME.fullmatch(config.node_id):
        problems.append(f"node id {config.node_id!r}: 1 to 64 letters, digits, '_', '.', '-'")
    for url in filter(None, config.etcd.split(",")):
        parts = urlsplit(url.strip())
        if parts.scheme != "http" or not parts.hostname:
            problems.append(f"etcd URL {url!r}: give http://host:port")
    if config.advertise:
        parts = urlsplit(config.advertise)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            problems.append(f"advertise URL {config.advertise!r}: give http(s)://host:port, no path")
    if config.replication_listen and host_port(config.replication_listen) is None:
        problems.append(f"replication listen address {config.replication_listen!r}: give HOST:PORT")
    if not 1 <= config.leader_ttl_s <= 600:
        problems.append("leader ttl must be between 1 and 600 seconds (etcd leases count whole seconds)")
    if config.sync_mode not in SYNC_MODES:
        problems.append(f"sync mode {config.sync_mode!r} is not one of {', '.join(SYNC_MODES)}")
    if config.lease_grace_s < 0:
        problems.append("lease grace must not be negative")
    if not 0.1 <= config.sync_timeout_s <= 3600:
        problems.append("sync timeout must be between 0.1 and 3600 seconds")
    return problems


def host_port(text: str) -> tuple[str, int] | None:
    """("host", port) of HOST:PORT (an IPv6 host in brackets; port 0: any free one), or None."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return None
    return host.strip("[]"), int(port)


def with_port(address: str, port: int) -> str:
    """HOST:PORT or scheme://HOST:PORT as given, but with `port` for a port given as 0 (the one
    the system picked when the listener was bound)."""
    head, sep, given = address.rpartition(":")
    return f"{head}:{port}" if sep and given == "0" else address


def is_loopback(host: str) -> bool:
    """Whether host names only this machine: localhost, 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
