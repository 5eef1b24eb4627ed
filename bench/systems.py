"""The systems a bench session compares, by the names its results use: their labels for people, what a
reader must know to weigh each, and which answer a write only after an fsync covers it. Read by the
report and the chart alike."""

from __future__ import annotations

SYSTEMS = ("queen", "redis-aof", "redis-mem", "etcd", "postgres", "nats")
PEER_LABELS = {"queen": "Queen", "redis-aof": "Redis AOF always", "redis-mem": "Redis no persistence",
               "etcd": "etcd", "postgres": "PostgreSQL 15", "nats": "NATS JetStream", "baseline": "HTTP-layer baseline",
               "queen-cluster2": "Queen, leader + sync standby"}
# Queen run as a cluster (bench/cluster.py): not a peer, so outside the Queen / peers table; the
# report sets each beside single-node Queen instead.
CLUSTER_SYSTEMS = ("queen-cluster2",)
# What a reader must know to weigh a peer's figures; printed under the peers line.
PEER_NOTES = {
    "nats": "NATS JetStream (file storage) acknowledges a publish before any fsync: the packaged 2.9 has no "
            "per-write sync setting (`sync_interval`, with `always`, arrived in 2.10), so its file store is synced "
            "on its own timer and an acknowledged message can be lost by a power cut. Not durable in the sense the "
            "others are.",
    "postgres": "PostgreSQL 15: fsync on, synchronous_commit on (each statement is a transaction that answers "
                "after its WAL is fsynced; concurrent commits share fsyncs), shared_buffers 1 GB.",
    "queen-cluster2": "Queen, leader + sync standby: two `queen serve --cluster` nodes and one etcd member on this "
                      "machine, all pinned to the server CPUs; the bench drives the leader, which answers a write "
                      "after its own fsync and the standby's (the standby appends, fsyncs and acks every frame).",
}

# Systems that answer a write only after an fsync covers it.
DURABLE_SYSTEMS = frozenset(("queen", "queen-cluster2", "redis-aof", "etcd", "postgres"))
