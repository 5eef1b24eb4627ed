"""Placement: which shard owns what. The one place that says it; the router, transactions and
replay all ask here.

  - A KV row's shard is a stable hash of (ns, key); for lock rows (`queen-locks / name#slot`) only
    the name counts, so every slot of one lock lives on one shard and an acquire with a free permit
    never fails for contention.
  - Everything of one queue lives on one shard: its partitions, groups, leases and timers. An ack
    or a lease call names only ids, so the queue they belong to is looked up in the queues' Shared
    maps; an id nobody knows goes to shard 0, where it is judged unknown (lease_lost) like any.

Hashes are crc32 (stable across runs and builds), never the salted built-in hash(). Pure.
"""

from __future__ import annotations

import zlib

from queen.core.kv import LOCKS_NS, is_locks_ns
from queen.core.queues import Shared

_ns_seeds: dict[str, int] = {}
_NS_SEEDS_MAX = 4096  # namespaces are few; past this, hash without the cache rather than grow it
_LOCKS_SEED = zlib.crc32(LOCKS_NS.encode() + b"\x00")
_QUEUES_SEED = zlib.crc32(b"queen-queues\x00")


def shard_of(ns: str, key: str, shard_count: int) -> int:
    """crc32 of ns, NUL, key: stable across runs, and cheap with the namespace's part computed once.
    A lock permit's key is placed by its lock's name, so all slots of a lock share a shard."""
    if is_locks_ns(ns):
        key = key.partition("#")[0]
    return zlib.crc32(key.encode(), _seed_of(ns)) % shard_count


def shard_of_lock(ns: str, name: str, shard_count: int) -> int:
    """shard_of(ns, name + "#" + any slot) for a lock namespace, without building the key."""
    seed = _LOCKS_SEED if ns == LOCKS_NS else _ns_seeds.get(ns) or _seed_of(ns)
    return zlib.crc32(name.encode(), seed) % shard_count


def _seed_of(ns: str) -> int:
    seed = _ns_seeds.get(ns)
    if seed is None:
        seed = zlib.crc32(ns.encode() + b"\x00")
        if len(_ns_seeds) < _NS_SEEDS_MAX:
            _ns_seeds[ns] = seed
    return seed


def shard_of_queue(name: str, shard_count: int) -> int:
    return zlib.crc32(name.encode(), _QUEUES_SEED) % shard_count


def shard_of_partition(shared: Shared, partition_id: int, shard_count: int) -> int:
    queue = shared.partition_queue.get(partition_id)
    return shard_of_queue(queue, shard_count) if queue is not None else 0


def shard_of_lease(shared: Shared, lease_id: int, shard_count: int) -> int:
    queue = shared.lease_queue.get(lease_id)
    return shard_of_queue(queue, shard_count) if queue is not None else 0
