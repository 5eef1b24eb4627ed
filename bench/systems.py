"""The systems a bench session compares, by the names its results use: their labels for people, what a
reader must know to weigh each, and which answer a write only after an fsync covers it. Read by the
report and the chart alike."""

from __future__ import annotations

SYSTEMS = ("queen", "redis-aof", "redis-mem", "etcd", "postgres", "nats")
PEER_LABELS = {"queen": "Queen", "redis-aof": "Redis AOF always", "redis-mem": "Redis no persistence",
               "etcd": "etcd", "postgres": "PostgreSQL 15", "nats": "NATS JetStream", "baseline": "HTTP-layer baseline"}
# What a reader must know to weigh a peer's figures; printed under the peers line.
PEER_NOTES = {
    "nats": "NATS JetStream (file storage) acknowledges a publish before any fsync: the packaged 2.9 has no "
            "per-write sync setting (`sync_interval`, with `always`, arrived in 2.10), so its file store is synced "
            "on its own timer and an acknowledged message can be lost by a power cut. Not durable in the sense the "
            "others are.",
    "postgres": "PostgreSQL 15: fsync on, synchronous_commit on (each statement is a transaction that answers "
                "after its WAL is fsynced; concurrent commits share fsyncs), shared_buffers 1 GB.",
}

# Systems that answer a write only after an fsync covers it.
DURABLE_SYSTEMS = frozenset(("queen", "redis-aof", "etcd", "postgres"))
